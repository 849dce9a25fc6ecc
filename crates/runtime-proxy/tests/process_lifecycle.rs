//! The proxy as an operator runs it: start before the runtime, drain on SIGTERM, refuse what it
//! cannot do, explain its flags.

use std::process::Command;
use std::time::Duration;

use k8s_cri::v1 as cri;
use prost::Message;
use test_support::containerd::Containerd;
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

#[tokio::test]
async fn backend_started_after_the_proxy() {
    // The proxy starts while no runtime listens at its backend path; the real containerd socket
    // then appears there (as a symlink), and the next call reaches it.
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let late = dir.path().join("containerd.sock");
    let proxy = ProxyProcess::start(BIN, &late, &[]);
    let mut rt = runtime_client(proxy.socket());

    let err = rt.version(cri::VersionRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains(&late.display().to_string()), "{}", err.message());

    std::os::unix::fs::symlink(&env.socket, &late).unwrap();
    let v = rt.version(cri::VersionRequest::default()).await.expect("Version once containerd is there").into_inner();
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_api_version, "v1");
}

#[tokio::test]
async fn sigterm_drains_in_flight_calls_and_removes_the_socket() {
    let reply = cri::VersionResponse { runtime_name: "slow".into(), ..Default::default() };
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: grpc_frame(&reply.encode_to_vec()),
        trailers: vec![("grpc-status".into(), "0".into())],
        delay: Duration::from_millis(800),
    })
    .await;
    let mut proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let socket = proxy.socket().to_owned();
    let mut rt = runtime_client(&socket);
    let in_flight = tokio::spawn(async move { rt.version(cri::VersionRequest::default()).await });
    // (counting only Version calls: the proxy's start-up store recovery calls the backend too)
    let versions = || fake.calls_to("/runtime.v1.RuntimeService/Version").len();
    assert!(test_support::wait_until(Duration::from_secs(5), || async { versions() == 1 }).await);

    proxy.signal(libc::SIGTERM);
    assert!(
        test_support::wait_until(Duration::from_secs(2), || async { !socket.exists() }).await,
        "socket removed as soon as shutdown starts"
    );
    let answer = in_flight.await.unwrap().expect("in-flight call completes during the drain");
    assert_eq!(answer.into_inner().runtime_name, "slow");
    let code = tokio::task::spawn_blocking(move || proxy.wait_exit(Duration::from_secs(5))).await.unwrap();
    assert_eq!(code, Some(0), "clean exit after the drain");
}

/// Docker mode starts without dockerd and answers in Docker's error shape, naming the socket.
#[test]
fn docker_mode_serves_while_dockerd_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("p.sock");
    let dockerd = dir.path().join("no-dockerd.sock");
    let mut proxy =
        ProxyProcess::spawn(BIN, &socket, &dockerd, &["--backend-runtime-mode", "Docker"], dir.path().join("log"));
    proxy.wait_ready();
    use std::io::{Read, Write};
    let mut conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    conn.write_all(b"GET /v1.41/version HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n").unwrap();
    let mut answer = String::new();
    conn.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(
        answer.contains(r#"{"message":"runtime-proxy: dockerd unix://"#) && answer.contains("no-dockerd.sock"),
        "{answer}"
    );
    proxy.signal(libc::SIGTERM);
    assert_eq!(proxy.wait_exit(Duration::from_secs(5)), Some(0));
    assert!(!socket.exists(), "socket removed on exit");
}

/// Listening on the backend socket would make the proxy call itself and every call hang; it is
/// refused at start, however the path is spelled (here: through a symlinked directory).
#[test]
fn listening_on_the_backend_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend = dir.path().join("run/containerd.sock");
    std::fs::create_dir(dir.path().join("run")).unwrap();
    let _live = std::os::unix::net::UnixListener::bind(&backend).unwrap();
    std::os::unix::fs::symlink(dir.path().join("run"), dir.path().join("alias")).unwrap();
    for (flag, listen) in [
        ("--remote-runtime-service-endpoint", backend.clone()),
        ("--remote-image-service-endpoint", dir.path().join("alias/containerd.sock")),
    ] {
        let out = Command::new(BIN)
            .arg("--koord-runtimeproxy-endpoint")
            .arg(&listen)
            .arg(flag)
            .arg(format!("unix://{}", backend.display()))
            .args(["--metrics-addr", "127.0.0.1:0"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("are the same socket") && stderr.contains(flag), "{stderr}");
        assert_eq!(stderr.matches("are the same socket").count(), 1, "said once: {stderr}");
        assert!(
            stderr.trim_end().lines().last().is_some_and(|l| l.contains("ERROR") && l.contains("are the same socket")),
            "last: {stderr}"
        );
    }
    assert!(std::os::unix::net::UnixStream::connect(&backend).is_ok(), "the backend's socket was left alone");
}

/// Endpoint flags: a relative path or a path too long for a socket address exits at once with
/// the reason, and creates nothing.
#[test]
fn unusable_endpoint_flags_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let long = dir.path().join(format!("{}/p.sock", "d".repeat(110)));
    for (flag, value, reason) in [
        ("--koord-runtimeproxy-endpoint", "unix:tmp/x.sock".to_owned(), "must be absolute"),
        ("--remote-runtime-service-endpoint", "unix://run/containerd.sock".to_owned(), "must be absolute"),
        ("--koord-runtimeproxy-endpoint", long.display().to_string(), "at most 107"),
    ] {
        let out = Command::new(BIN).current_dir(dir.path()).arg(flag).arg(&value).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(reason), "{flag} {value}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no directory created");
}

#[test]
fn help_explains_every_flag() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--koord-runtimeproxy-endpoint",
        "--remote-runtime-service-endpoint",
        "--remote-image-service-endpoint",
        "--backend-runtime-mode",
        "--runtime-hook-server-key",
        "--runtime-hook-server-val",
        "--hook-config-dir",
        "--frontend",
        "--nri-socket",
        "--nri-plugin-name",
        "--nri-plugin-index",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
}

/// Starts the proxy on a fake runtime with `klog` (koord's klog flags) and no `RUST_LOG`, makes
/// one CRI call, stops it with SIGTERM (exit 0 asserted); its log.
async fn serve_once_with(klog: &[&str]) -> String {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("p.sock");
    let log = dir.path().join("proxy.log");
    let mut child = Command::new(BIN)
        .arg("--koord-runtimeproxy-endpoint")
        .arg(&socket)
        .arg("--remote-runtime-service-endpoint")
        .arg(fake.socket())
        .args(["--metrics-addr", "127.0.0.1:0", "--hook-config-dir"])
        .arg(dir.path().join("hooks"))
        .args(klog)
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    assert!(
        test_support::wait_until(Duration::from_secs(10), || async {
            std::os::unix::net::UnixStream::connect(&socket).is_ok()
        })
        .await,
        "{klog:?}: not serving:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    runtime_client(&socket).version(cri::VersionRequest::default()).await.expect("Version");
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{klog:?}:\n{text}");
    // The version first, a line saying it stopped last.
    let (first, last) = (text.lines().next().unwrap_or_default(), text.lines().last().unwrap_or_default());
    let starting = format!("runtime-proxy {} (git ", env!("CARGO_PKG_VERSION"));
    assert!(first.contains("INFO") && first.contains(&starting) && first.contains(") starting"), "first line:\n{text}");
    assert!(last.contains("INFO") && last.ends_with("runtime-proxy stopped"), "last line:\n{text}");
    text
}

/// The one deprecation notice of `text` (a proxy's log).
fn klog_notice(text: &str) -> &str {
    let notices: Vec<&str> = text.lines().filter(|l| l.contains("deprecated klog flags")).collect();
    assert_eq!(notices.len(), 1, "one notice:\n{text}");
    notices[0]
}

/// koord-runtime-proxy's klog flags, as its units pass them, are accepted (they were refused
/// with exit 2, so a migrated unit restart-looped), named in one deprecation notice; `--v=4`
/// (without `RUST_LOG`) logs each CRI call at debug level.
#[tokio::test]
async fn koords_klog_flags_are_accepted_with_one_notice() {
    let text = serve_once_with(&[
        "--v=4",
        "--logtostderr",
        "--alsologtostderr",
        "--log-dir=/var/log/koord",
        "--log_file",
        "/x.log",
        "--skip_headers",
    ])
    .await;
    let notice = klog_notice(&text);
    for part in [
        "--v=4 sets the log level info,runtime_proxy=debug",
        "--logtostderr is ignored",
        "--alsologtostderr is ignored",
        "--log-dir=/var/log/koord is ignored",
        "--log-file=/x.log is ignored",
        "--skip-headers is ignored",
    ] {
        assert!(notice.contains(part), "{part:?} missing from {notice}");
    }
    assert!(
        text.lines().any(|l| l.contains("DEBUG") && l.contains("CRI call")),
        "--v=4: a debug line per call:\n{text}"
    );
}

/// koord's other spellings, as pflag reads them: `-v=4` and `-v 4` (the short form of a
/// one-letter flag), a bool flag's value as the next argument (`--logtostderr false`). They
/// stopped the proxy at start ("unexpected argument '-v'").
#[tokio::test]
async fn koords_short_v_and_separate_bool_values_are_accepted() {
    for (klog, bool_part) in [
        (&["-v=4", "--logtostderr", "false"][..], "--logtostderr=false is ignored"),
        (&["-v", "4", "--alsologtostderr", "true"][..], "--alsologtostderr is ignored"),
    ] {
        let text = serve_once_with(klog).await;
        let notice = klog_notice(&text);
        assert!(
            notice.contains("--v=4 sets the log level info,runtime_proxy=debug") && notice.contains(bool_part),
            "{klog:?}: {notice}"
        );
        assert!(
            text.lines().any(|l| l.contains("DEBUG") && l.contains("CRI call")),
            "{klog:?}: a debug line per call:\n{text}"
        );
    }
}

/// A mistyped flag gets the flag meant: `--backend-runtime-endpoint` is the runtime's endpoint
/// (clap suggested `--backend-runtime-mode`, spelled most alike).
#[test]
fn a_mistyped_flag_suggests_the_flag_sharing_its_words() {
    for (typed, meant) in [
        ("--backend-runtime-endpoint", "--remote-runtime-service-endpoint"),
        ("--image-service-endpoint", "--remote-image-service-endpoint"),
        ("--hook-config-dri", "--hook-config-dir"),
    ] {
        let out = Command::new(BIN).args([typed, "/run/x.sock"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{typed}: {stderr}");
        assert!(stderr.contains(&format!("unexpected argument '{typed}'")), "{typed}: {stderr}");
        assert!(stderr.contains(&format!("similar argument exists: '{meant}'")), "{typed}: {stderr}");
        assert!(!stderr.contains("--backend-runtime-mode"), "{typed}: {stderr}");
    }
}

/// Limits of 0 started fine and then refused every pod: refused at start, exit 2, naming the
/// flag, before anything is created.
#[test]
fn zero_limits_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, zero) in [
        ("--max-request-bytes", "0"),
        ("--max-concurrent-streams", "0"),
        ("--max-hook-answer-bytes", "0"),
        ("--request-idle-timeout", "0s"),
    ] {
        let out = Command::new(BIN)
            .arg("--koord-runtimeproxy-endpoint")
            .arg(dir.path().join("run/p.sock"))
            .args([flag, zero, "--metrics-addr", "127.0.0.1:0"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {zero}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag) && stderr.contains("0 would"), "{flag}: {stderr}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created");
}

/// A registration whose failure policy is misspelt (`failure_policy`) is taken as Fail: with its
/// server down, the pod is refused (it used to be Ignore: the pod started without the hook).
/// Unknown keys are a WARN naming the key and the key it may mean, counted in
/// `runtime_proxy_hook_config_warnings`; a registration naming the proxy's own socket is
/// rejected, saying so.
#[tokio::test]
async fn registrations_that_would_weaken_policy() {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hookserver.d");
    std::fs::create_dir(&hooks).unwrap();
    let socket = dir.path().join("run/p.sock");
    let dead = dir.path().join("dead-hook.sock");
    let write = |name: &str, json: String| std::fs::write(hooks.join(name), json).unwrap();
    write(
        "typo.json",
        format!(
            r#"{{"remote-endpoint":"{}","failure_policy":"Fail","timeout_ms":100,"runtime-hooks":["PreRunPodSandbox"]}}"#,
            dead.display()
        ),
    );
    write(
        "loop.json",
        format!(r#"{{"remote-endpoint":"unix://{}","runtime-hooks":["PreCreateContainer"]}}"#, socket.display()),
    );
    let mut proxy = ProxyProcess::spawn(
        BIN,
        &socket,
        fake.socket(),
        &["--hook-config-dir", hooks.to_str().unwrap()],
        dir.path().join("proxy.log"),
    );
    proxy.wait_ready();

    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "p".into(),
            uid: "u".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        ..Default::default()
    };
    let err = runtime_client(&socket)
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() })
        .await
        .expect_err("the Fail server is down: the pod is refused");
    assert!(err.message().contains("typo.json") && err.message().contains("failure-policy Fail"), "{err:?}");

    let log = proxy.log();
    for part in [
        r#"key "failure_policy" is not "failure-policy"; the failure policy cannot be read, so Fail is used"#,
        r#"unknown key "timeout_ms" ignored; did you mean "timeout-ms"?"#,
        "is the proxy's own socket (--koord-runtimeproxy-endpoint)",
    ] {
        assert!(log.lines().any(|l| l.contains("WARN") && l.contains(part)), "{part:?} not logged at WARN:\n{log}");
    }
    let (_, metrics) = proxy.admin_get("/metrics");
    for line in
        ["runtime_proxy_hook_config_warnings 1", "runtime_proxy_hook_config_rejected 1", "runtime_proxy_hook_servers 1"]
    {
        assert!(metrics.lines().any(|l| l == line), "{line} missing:\n{metrics}");
    }
}

/// `--metrics-addr` as operators write it: `localhost:PORT` serves on loopback, `off` serves no
/// admin endpoint while CRI calls go on; a host name the proxy would have to resolve is refused
/// at start (exit 2) naming the forms.
// Multi-threaded: the fake backend must answer the proxy's health checks while this test's
// thread blocks in `admin_get`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_addr_forms_and_off() {
    let backend = FakeBackend::start(Behaviour::ok(
        &cri::VersionResponse { runtime_name: "fake".into(), ..Default::default() }.encode_to_vec(),
    ))
    .await;
    let local = ProxyProcess::start(BIN, backend.socket(), &["--metrics-addr", "localhost:0"]);
    let (code, body) = local.admin_get("/healthz");
    assert_eq!((code, body.trim()), (200, "ok"), "{}", local.log());
    assert!(local.log().contains("admin endpoint listening on 127.0.0.1:"), "{}", local.log());

    let off = ProxyProcess::start(BIN, backend.socket(), &["--metrics-addr", "off"]);
    let v = runtime_client(off.socket())
        .version(cri::VersionRequest::default())
        .await
        .expect("CRI served without the admin endpoint");
    assert_eq!(v.into_inner().runtime_name, "fake");
    assert!(
        off.log().contains("admin endpoint off") && !off.log().contains("admin endpoint listening"),
        "{}",
        off.log()
    );

    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["--koord-runtimeproxy-endpoint", dir.path().join("p.sock").to_str().unwrap()])
        .args(["--remote-runtime-service-endpoint", backend.socket().to_str().unwrap()])
        .args(["--metrics-addr", "metrics.example:9318"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("localhost:PORT") && stderr.contains(":PORT or off"), "{stderr}");
    assert!(!dir.path().join("p.sock").exists());
}
