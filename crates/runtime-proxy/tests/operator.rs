//! What an operator or a service manager can do to a running proxy, with the real binary and no
//! runtime needed: every signal (docs/operations.md, "Signals"), every kind of entry in the hook
//! config directory ("Config directory entries"), every numeric and duration flag at its edges
//! ("Flags at their edges").

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use prost::Message;
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

fn registration(endpoint: &str) -> String {
    format!(
        r#"{{"remote-endpoint": "{endpoint}", "failure-policy": "Ignore", "runtime-hooks": ["PreCreateContainer"]}}"#
    )
}

fn alive(proxy: &mut ProxyProcess) -> bool {
    proxy.wait_exit(Duration::from_millis(1)).is_none()
}

/// SIGUSR1, SIGUSR2 and SIGPIPE leave the proxy serving (one line each for the first two);
/// SIGHUP rescans the hook config directory at once — here a change inotify cannot see (a
/// registration's symlinked target outside the directory rewritten), which would otherwise wait
/// for the 30 s rescan — and logs what is registered; SIGQUIT stops it gracefully: exit 0,
/// socket removed.
#[test]
fn sighup_rescans_other_signals_do_not_kill_sigquit_drains() {
    let dir = tempfile::tempdir().unwrap();
    let (hooks, elsewhere) = (dir.path().join("hookserver.d"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&hooks).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("target.json"), registration("/run/first.sock")).unwrap();
    symlink(elsewhere.join("target.json"), hooks.join("linked.json")).unwrap();
    let mut proxy =
        ProxyProcess::start(BIN, &dir.path().join("no-runtime.sock"), &["--hook-config-dir", hooks.to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "linked.json", "/run/first.sock"], 0), "{}", proxy.log());

    std::fs::write(elsewhere.join("target.json"), registration("/run/second.sock")).unwrap();
    for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE] {
        proxy.signal(sig);
    }
    assert!(proxy.wait_log(&["SIGUSR1 ignored"], 0) && proxy.wait_log(&["SIGUSR2 ignored"], 0), "{}", proxy.log());
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(&mut proxy), "USR1, USR2, PIPE: still running\n{}", proxy.log());
    assert_eq!(
        proxy.count_log(&["hook server updated"]),
        0,
        "inotify does not see the target's change:\n{}",
        proxy.log()
    );
    assert!(std::os::unix::net::UnixStream::connect(proxy.socket()).is_ok(), "still serving");

    proxy.signal(libc::SIGHUP);
    assert!(proxy.wait_log(&["reloading: rescanning the hook config directory", "SIGHUP"], 0), "{}", proxy.log());
    assert!(proxy.wait_log(&["hook server updated", "linked.json", "/run/second.sock"], 0), "{}", proxy.log());
    assert!(
        proxy.wait_log(&["reloaded: hook config directory rescanned", "servers=linked.json"], 0),
        "{}",
        proxy.log()
    );
    assert!(alive(&mut proxy), "SIGHUP never stops it");

    let socket = proxy.socket().to_owned();
    proxy.signal(libc::SIGQUIT);
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0), "SIGQUIT: a graceful stop\n{}", proxy.log());
    assert!(!socket.exists(), "socket removed");
    let log = proxy.log();
    assert!(log.contains("shutting down gracefully") && log.contains("signal=\"SIGQUIT\""), "{log}");
}

/// A second SIGTERM while a call is in flight stops the proxy at once (exit 0) instead of
/// waiting out `--drain-timeout`.
#[tokio::test]
async fn a_second_sigterm_cuts_the_drain() {
    let reply = cri::VersionResponse { runtime_name: "slow".into(), ..Default::default() };
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: grpc_frame(&reply.encode_to_vec()),
        trailers: vec![("grpc-status".into(), "0".into())],
        delay: Duration::from_secs(60),
    })
    .await;
    let mut proxy = ProxyProcess::start(BIN, fake.socket(), &["--drain-timeout", "2m"]);
    let socket = proxy.socket().to_owned();
    let mut rt = runtime_client(&socket);
    let in_flight = tokio::spawn(async move { rt.version(cri::VersionRequest::default()).await });
    let versions = || fake.calls_to("/runtime.v1.RuntimeService/Version").len();
    assert!(test_support::wait_until(Duration::from_secs(5), || async { versions() == 1 }).await);

    proxy.signal(libc::SIGTERM);
    assert!(test_support::wait_until(Duration::from_secs(2), || async { !socket.exists() }).await, "draining");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(alive(&mut proxy), "the first SIGTERM waits for the call in flight");
    let start = Instant::now();
    proxy.signal(libc::SIGTERM);
    let code = tokio::task::spawn_blocking(move || {
        let code = proxy.wait_exit(Duration::from_secs(5));
        (code, proxy.log())
    })
    .await
    .unwrap();
    assert_eq!(code.0, Some(0), "{}", code.1);
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(code.1.contains("SIGTERM while shutting down: stopping at once"), "{}", code.1);
    assert!(in_flight.await.unwrap().is_err(), "the call in flight was cut");
}

/// A proxy run as root but without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (`setpriv`), so a
/// registration of mode 0000 cannot be read, as for a proxy that is not root.
fn without_dac_override(dir: &Path) -> Option<PathBuf> {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists())?;
    let script = dir.join("proxy-without-dac-override");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec {setpriv} --bounding-set=-dac_override,-dac_read_search {BIN} \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(script)
}

/// Every kind of entry the hook config directory can hold, with the real binary: the proxy
/// starts and serves (no entry blocks the scan: a FIFO is never opened), each rejected file is
/// one WARN naming it and why, counted in `runtime_proxy_hook_config_rejected`, each name that
/// is no registration one INFO line, and rescans (SIGHUP) repeat none of them. A half-written
/// file is taken up once it is complete.
#[test]
fn every_kind_of_config_dir_entry() {
    let dir = tempfile::tempdir().unwrap();
    let (d, elsewhere) = (dir.path().join("hookserver.d"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    let write = |name: &str, text: &str| std::fs::write(d.join(name), text).unwrap();
    write("plain.json", &registration("/run/plain.sock"));
    std::fs::write(elsewhere.join("target.json"), registration("/run/linked.sock")).unwrap();
    symlink(elsewhere.join("target.json"), d.join("linked.json")).unwrap();
    std::fs::create_dir(d.join("subdir.json")).unwrap();
    symlink(elsewhere.join("gone.json"), d.join("dangling.json")).unwrap();
    let fifo = std::ffi::CString::new(d.join("fifo.json").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let _socket = std::os::unix::net::UnixListener::bind(d.join("socket.json")).unwrap();
    symlink("/dev/null", d.join("device.json")).unwrap();
    std::fs::File::create(d.join("huge.json")).unwrap().set_len(64 << 20).unwrap();
    write("empty.json", "");
    write("partial.json", r#"{"remote-endpoint": "/run/part"#);
    write("secret.json", &registration("/run/secret.sock"));
    std::fs::set_permissions(d.join("secret.json"), std::fs::Permissions::from_mode(0o000)).unwrap();
    for name in ["README", "koordlet.json~", "koordlet.json.bak", ".koordlet.json.swp", ".hidden.json"] {
        write(name, &registration("/run/ignored.sock"));
    }
    symlink("root@node.42:1700000000", d.join(".#koordlet.json")).unwrap();

    let binary = without_dac_override(dir.path());
    let binary_str = binary.as_ref().map(|p| p.to_str().unwrap().to_owned()).unwrap_or_else(|| BIN.to_owned());
    let mut proxy = ProxyProcess::spawn(
        &binary_str,
        &dir.path().join("run/p.sock"),
        &dir.path().join("no-runtime.sock"),
        &["--hook-config-dir", d.to_str().unwrap()],
        dir.path().join("proxy.log"),
    );
    proxy.wait_ready(); // the scan before serving did not block on the FIFO
    let rejected = [
        ("subdir.json", "not a regular file (a directory)"),
        ("dangling.json", "dangling symlink to"),
        ("fifo.json", "not a regular file (a FIFO)"),
        ("socket.json", "not a regular file (a socket)"),
        ("device.json", "not a regular file (a character device)"),
        ("huge.json", "file larger than 1048576 bytes"),
        ("empty.json", "empty file"),
        ("partial.json", "invalid JSON"),
    ];
    let unreadable = binary.is_some();
    for (name, why) in rejected.iter().chain(unreadable.then_some(&("secret.json", "cannot read: Permission denied"))) {
        assert!(
            proxy.wait_log(&["hook server config rejected", &format!("file={name}"), why], 0),
            "{name}: {why}\n{}",
            proxy.log()
        );
    }
    assert!(
        proxy.wait_log(&["hook server added", "plain.json"], 0)
            && proxy.wait_log(&["hook server added", "linked.json"], 0)
    );
    for name in ["README", "koordlet.json~", "koordlet.json.bak"] {
        assert!(proxy.wait_log(&["not a registration file", &format!("file={name}")], 0), "{name}\n{}", proxy.log());
    }
    let (_, metrics) = proxy.admin_get("/metrics");
    let count = rejected.len() + usize::from(unreadable);
    assert!(metrics.contains(&format!("runtime_proxy_hook_config_rejected {count}\n")), "{count} rejected:\n{metrics}");

    // Rescans (SIGHUP, twice) log none of it again.
    for n in 0..2 {
        proxy.signal(libc::SIGHUP);
        assert!(proxy.wait_log(&["reloaded: hook config directory rescanned"], n), "{}", proxy.log());
    }
    let log = proxy.log();
    for (name, _) in rejected {
        assert_eq!(
            proxy.count_log(&["hook server config rejected", &format!("file={name} ")]),
            1,
            "{name} once:\n{log}"
        );
    }
    assert_eq!(proxy.count_log(&["not a registration file"]), 3, "once each:\n{log}");
    for hidden in [".koordlet.json.swp", ".hidden.json", ".#koordlet.json"] {
        assert_eq!(proxy.count_log(&["INFO", hidden]), 0, "hidden entries at debug only:\n{log}");
        assert_eq!(proxy.count_log(&["WARN", hidden]), 0, "{log}");
    }

    // The half-written file completed: taken up (inotify), no longer rejected.
    write("partial.json", &registration("/run/partial.sock"));
    assert!(proxy.wait_log(&["hook server config valid again", "partial.json"], 0), "{}", proxy.log());
    assert!(proxy.wait_log(&["hook server added", "partial.json", "/run/partial.sock"], 0));
    proxy.signal(libc::SIGTERM);
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0));
}

/// What one edge value must do: start cleanly (and stop on SIGTERM with exit 0), or be refused
/// at start with exit 2 and a message containing the text.
enum Expect {
    Starts,
    Refused(&'static str),
}

/// Every numeric and duration flag at 0, 1, its largest value, beyond it, negative, and in
/// forms it does not take: refused at start (exit 2, the flag and the reason named) or a clean
/// start, as docs/operations.md's "Flags at their edges" says.
#[test]
fn flags_at_their_edges() {
    use Expect::*;
    let max = u64::MAX.to_string();
    let beyond = "18446744073709551616";
    let u32_max = u32::MAX.to_string();
    let cases: Vec<(&str, String, Expect)> = vec![
        ("--max-request-bytes", "0".into(), Refused("0 would refuse every call")),
        ("--max-request-bytes", "1".into(), Starts),
        ("--max-request-bytes", max.clone(), Starts),
        ("--max-request-bytes", beyond.into(), Refused("is not a whole number from 0 to 18446744073709551615")),
        ("--max-request-bytes", "-1".into(), Refused("is not a whole number")),
        ("--max-request-bytes", "1.5".into(), Refused("is not a whole number")),
        ("--max-concurrent-streams", "0".into(), Refused("0 would refuse every call")),
        ("--max-concurrent-streams", "1".into(), Starts),
        ("--max-concurrent-streams", u32_max.clone(), Starts),
        ("--max-concurrent-streams", "4294967296".into(), Refused("from 0 to 4294967295")),
        ("--max-hook-answer-bytes", "0".into(), Refused("0 would refuse every call")),
        ("--max-hook-answer-bytes", "1".into(), Starts),
        ("--max-hook-answer-bytes", max.clone(), Starts),
        ("--max-hook-answer-bytes", beyond.into(), Refused("from 0 to")),
        ("--max-hook-added-entries", "0".into(), Starts),
        ("--max-hook-added-entries", max.clone(), Starts),
        ("--max-hook-added-entries", beyond.into(), Refused("from 0 to")),
        ("--max-hook-added-entries", "-1".into(), Refused("is not a whole number")),
        ("--max-hook-entry-bytes", "0".into(), Refused("0 would refuse every call")),
        ("--max-hook-entry-bytes", "1".into(), Starts),
        ("--max-hook-entry-bytes", max.clone(), Starts),
        ("--request-idle-timeout", "0".into(), Refused("0 would time out every intercepted request")),
        ("--request-idle-timeout", "0s".into(), Refused("0 would time out every intercepted request")),
        ("--request-idle-timeout", "1ms".into(), Starts),
        ("--request-idle-timeout", format!("{max}s"), Starts),
        ("--request-idle-timeout", format!("{beyond}s"), Refused("too large")),
        ("--request-idle-timeout", format!("{}h", u64::MAX / 60), Refused("too large")),
        ("--request-idle-timeout", "-1s".into(), Refused("invalid duration")),
        ("--request-idle-timeout", "1.5s".into(), Refused("not a whole number")),
        ("--request-idle-timeout", "30".into(), Refused("no unit")),
        ("--drain-timeout", "0".into(), Starts),
        ("--drain-timeout", "1ms".into(), Starts),
        ("--drain-timeout", "1h".into(), Starts),
        ("--drain-timeout", format!("{max}s"), Starts),
        ("--drain-timeout", format!("{beyond}ms"), Refused("too large")),
        ("--drain-timeout", "1d".into(), Refused("is not ms, s, m or h")),
        ("--metrics-addr", ":0".into(), Starts),
        ("--metrics-addr", "off".into(), Starts),
        ("--metrics-addr", ":65536".into(), Refused("is not a number from 0 to 65535")),
        ("--metrics-addr", "localhost:-1".into(), Refused("is not a number from 0 to 65535")),
        ("--v", "0".into(), Starts),
        ("--v", u32_max.clone(), Starts),
        ("--v", "4294967296".into(), Refused("--v")),
        ("--v", "-1".into(), Refused("--v")),
        ("--runtime-hook-server-namespaces", "".into(), Starts),
    ];
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hookserver.d");
    let mut failures = Vec::new();
    for (i, (flag, value, expect)) in cases.iter().enumerate() {
        let socket = dir.path().join(format!("run/p{i}.sock"));
        let arg = format!("{flag}={value}");
        let mut args = vec!["--hook-config-dir", hooks.to_str().unwrap()];
        if *flag == "--metrics-addr" {
            args.extend([*flag, value.as_str()]); // spelt apart: the test harness looks for the flag
        } else {
            args.extend(["--metrics-addr", "off", &arg]);
        }
        match expect {
            Refused(why) => {
                let out = Command::new(BIN)
                    .arg("--koord-runtimeproxy-endpoint")
                    .arg(&socket)
                    .args(&args)
                    .stdin(Stdio::null())
                    .output()
                    .unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                if out.status.code() != Some(2) || !stderr.contains(why) || !stderr.contains(flag) {
                    failures.push(format!("{arg}: want exit 2 with {why:?}, got {:?}:\n{stderr}", out.status.code()));
                }
                if socket.exists() {
                    failures.push(format!("{arg}: refused, yet the socket was created"));
                }
            }
            Starts => {
                let log = dir.path().join(format!("proxy{i}.log"));
                let mut proxy = ProxyProcess::spawn(BIN, &socket, &dir.path().join("no-runtime.sock"), &args, log);
                proxy.wait_ready();
                proxy.signal(libc::SIGTERM);
                let code = proxy.wait_exit(Duration::from_secs(10));
                if code != Some(0) {
                    failures.push(format!("{arg}: want a clean start and stop, got exit {code:?}:\n{}", proxy.log()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
