//! Proxy mode end to end: real containerd, the real runtime-proxy, the runtime-hooks binary
//! registered in the proxy's hook config directory; pods run through the proxy the way kubelet
//! runs them, and the policies show up in the real cgroup files.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use test_support::containerd::{Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

struct Setup {
    env: Containerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
    hooks: Hooks,
}

/// runtime-proxy with a fresh hook config dir, and runtime-hooks registered in it with `extra`
/// flags; returns once the proxy has taken up the registration.
fn setup(extra: &[&str]) -> Setup {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-proxy").tempdir().unwrap();
    let conf = dir.path().join("hookserver.d");
    std::fs::create_dir(&conf).unwrap();
    let proxy_bin = test_support::workspace_binary("runtime-proxy");
    let proxy =
        ProxyProcess::start(proxy_bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
    let socket = dir.path().join("runtime-hooks.sock");
    let mut args = vec!["--listen", socket.to_str().unwrap(), "--hook-config-dir", conf.to_str().unwrap()];
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "proxy did not take up runtime-hooks.json\nproxy:\n{}\nhooks:\n{}",
        proxy.log(),
        hooks.log()
    );
    Setup { env, dir, proxy, hooks }
}

#[tokio::test]
async fn be_pod_gets_batch_resources_in_its_real_cgroup() {
    let s = setup(&[]);
    let registration: serde_json::Value =
        serde_json::from_slice(&std::fs::read(s.dir.path().join("hookserver.d/runtime-hooks.json")).unwrap()).unwrap();
    assert_eq!(
        registration["runtime-hooks"],
        serde_json::json!(["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"])
    );
    assert_eq!(registration["failure-policy"], "Ignore");

    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, BE_SPEC)]);
    let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    precreate_pod_cgroup(&parent);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod through the proxy");

    // Container level: from the hook answer, applied by the proxy before containerd created it.
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "batch-cpu request 500 → 500 × 1024 / 1000");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_period_us"), "100000");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000", "batch-cpu limit 1000 → 1000 × 100000 / 1000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728", "batch-memory limit 128Mi");
    // Pod level: written by runtime-hooks itself at PreRunPodSandbox.
    assert_eq!(cgroup("cpu", &parent, "cpu.shares"), "512");
    assert_eq!(cgroup("cpu", &parent, "cpu.cfs_quota_us"), "100000");
    assert_eq!(cgroup("memory", &parent, "memory.limit_in_bytes"), "134217728");

    // PreUpdateContainerResources: kubelet re-sends BestEffort values; the policy holds.
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() }),
        ..Default::default()
    })
    .await
    .expect("update");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");

    // GroupIdentity: this kernel has no cpu.bvt_warp_ns; one clear line, nothing failed. The
    // second pod's cgroup is not pre-created (no kubelet): the pod still runs, with a warning.
    let second = {
        let (sandbox, container) = pod_configs(&s.env, &[(QOS, "LS")], &[]);
        Pod::start(&mut rt, sandbox, container).await.expect("second pod")
    };
    let log = s.hooks.log();
    let bvt_lines: Vec<&str> = log.lines().filter(|l| l.contains("cpu.bvt_warp_ns") && l.contains("skipped")).collect();
    assert_eq!(bvt_lines.len(), 1, "exactly one line about the missing kernel file:\n{log}");
    assert!(!log.contains("plugin-failure-policy"), "no plugin failed:\n{log}");
    assert!(log.contains("does not exist yet"), "missing pod cgroup reported:\n{log}");
    assert!(log.contains("PreCreateContainer") && log.contains("cpu_shares=512"), "the change is logged:\n{log}");

    pod.remove(&mut rt).await;
    second.remove(&mut rt).await;
}

#[tokio::test]
async fn lsr_pod_gets_its_cpuset_and_a_besteffort_pod_is_cleared() {
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "LSR")], &[(STATUS, r#"{"cpuset": "1"}"#)]);
    container.linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_quota = 50_000;
    let lsr = Pod::start(&mut rt, sandbox, container).await.expect("LSR pod");
    assert_eq!(lsr.cgroup_file("cpuset", "cpuset.cpus"), "1");
    assert_eq!(lsr.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1", "bound CPUs: CFS quota unset");

    // A BE container (BestEffort, as kubelet makes BE pods) for which kubelet asked for a cpuset
    // is cleared: it runs on its parent's CPUs.
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE")], &[]);
    let sandbox = besteffort(sandbox);
    container.linux.as_mut().unwrap().resources.as_mut().unwrap().cpuset_cpus = "0".into();
    let be = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");
    let all = cgroup("cpuset", "", "cpuset.cpus");
    assert_eq!(be.cgroup_file("cpuset", "cpuset.cpus"), all, "cleared: the parent's CPUs");
    lsr.remove(&mut rt).await;
    be.remove(&mut rt).await;
}

/// A cpuset written with spaces (`" 0 - 1 "`) reaches runc in the kernel's form (`0-1`); before,
/// it went through verbatim and runc failed StartContainer writing `cpuset.cpus` (EINVAL). An
/// invalid list is the CPUSet plugin's failure, under the plugin failure policy (Ignore: the pod
/// runs on kubelet's cpuset, and the log names the annotation and the value).
#[tokio::test]
async fn lsr_cpuset_with_spaces_is_normalized_and_a_bad_one_is_a_plugin_failure() {
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "LSR")], &[(STATUS, r#"{"cpuset": " 0 - 1 "}"#)]);
    let lsr =
        Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("LSR pod: {e:?}\n{}", s.hooks.log()));
    assert_eq!(lsr.cgroup_file("cpuset", "cpuset.cpus"), "0-1");
    assert_eq!(lsr.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1");
    assert!(
        s.hooks.log().contains(r#"cpuset_cpus="0-1""#) || s.hooks.log().contains("cpuset_cpus=0-1"),
        "{}",
        s.hooks.log()
    );

    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "LSR")], &[(STATUS, r#"{"cpuset": "0,,1"}"#)]);
    let bad = Pod::start(&mut rt, sandbox, container)
        .await
        .unwrap_or_else(|e| panic!("runs under Ignore: {e:?}\n{}", s.hooks.log()));
    assert_eq!(
        bad.cgroup_file("cpuset", "cpuset.cpus"),
        cgroup("cpuset", "", "cpuset.cpus"),
        "kubelet's (none): all CPUs"
    );
    assert!(
        s.hooks.wait_log(
            &["CPUSet", STATUS, "\"0,,1\"", "empty element", "plugin-failure-policy Ignore"],
            0,
            Duration::from_secs(2)
        ),
        "{}",
        s.hooks.log()
    );
    lsr.remove(&mut rt).await;
    bad.remove(&mut rt).await;
}

#[tokio::test]
async fn plugin_failures_follow_the_policies() {
    // Fail here and in the registration: a broken entry refuses its container (the pod's sums
    // leave it out), naming the cause.
    let s = setup(&["--plugin-failure-policy", "Fail", "--failure-policy", "Fail"]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(
        &s.env,
        &[(QOS, "BE")],
        &[(SPEC, r#"{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}"#)],
    );
    let err = Pod::start(&mut rt, sandbox, container).await.expect_err("refused");
    for part in ["BatchResource", "PreCreateContainer", SPEC, "lots", "\"main\""] {
        assert!(err.message().contains(part), "{part:?} missing from {:?}", err.message());
    }

    // Ignore: the same pod runs, unchanged by BatchResource; the failure is logged.
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, "{not json")]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("runs under Ignore");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    assert!(
        s.hooks.wait_log(&["BatchResource", SPEC, "plugin-failure-policy Ignore"], 0, Duration::from_secs(2)),
        "{}",
        s.hooks.log()
    );
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn rule_change_is_reapplied_to_running_pods() {
    let env = Containerd::from_env();
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_dir.path().join("rules.yaml");
    std::fs::write(&rules, "cpu:\n  cfsPeriodUs: 100000\n").unwrap();
    let selector = format!("test={}", test_support::containerd::unique("rule"));
    let s = setup(&[
        "--rules",
        rules.to_str().unwrap(),
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "0s",
        "--selector",
        &selector,
    ]);
    let mut rt = runtime_client(s.proxy.socket());
    let (k, v) = selector.split_once('=').unwrap();
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE"), (k, v)], &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");

    // A new CFS period: the reconciler re-applies it at once (no interval is running).
    let tmp = rules_dir.path().join(".rules.tmp");
    std::fs::write(&tmp, "cpu:\n  cfsPeriodUs: 50000\n").unwrap();
    std::fs::rename(&tmp, &rules).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || pod.cgroup_file("cpu", "cpu.cfs_period_us") == "50000"
            && pod.cgroup_file("cpu", "cpu.cfs_quota_us") == "50000"),
        "period {} quota {}\n{}",
        pod.cgroup_file("cpu", "cpu.cfs_period_us"),
        pod.cgroup_file("cpu", "cpu.cfs_quota_us"),
        s.hooks.log()
    );
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512");
    let log = s.hooks.log();
    assert!(log.contains("rules changed"), "{log}");
    assert!(
        log.lines().any(|l| l.contains("drift corrected")
            && l.contains("cpu.cfs_quota_us")
            && l.contains("old=100000")
            && l.contains("new=50000")),
        "{log}"
    );
    // A pod created now gets the new period straight from the hook.
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE"), (k, v)], &[(SPEC, BE_SPEC)]);
    let later = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    assert_eq!(later.cgroup_file("cpu", "cpu.cfs_quota_us"), "50000");
    pod.remove(&mut rt).await;
    later.remove(&mut rt).await;
}

#[tokio::test]
async fn registration_is_removed_on_shutdown() {
    let mut s = setup(&[]);
    let file = s.dir.path().join("hookserver.d/runtime-hooks.json");
    assert!(file.exists());
    assert_eq!(s.hooks.terminate(), Some(0), "{}", s.hooks.log());
    assert!(!file.exists(), "registration removed");
    assert!(!s.dir.path().join("runtime-hooks.sock").exists(), "socket removed");
    assert!(s.proxy.wait_log(&["hook server removed", "file=runtime-hooks.json"], 0), "{}", s.proxy.log());
}

fn registered_endpoint(file: &Path) -> Option<String> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    json["remote-endpoint"].as_str().map(str::to_owned)
}

/// The proxy's last word on `runtime-hooks.json`: the line of its last add, update or removal.
fn proxy_view(proxy: &ProxyProcess) -> String {
    let log = proxy.log();
    let last = log.lines().rev().find(|l| l.contains("file=runtime-hooks.json") && l.contains("hook server "));
    last.unwrap_or_default().to_owned()
}

/// A deleted registration file is written again within about a second, and the proxy takes the
/// server up again; before, it stayed deleted until the server restarted.
#[tokio::test]
async fn a_deleted_registration_comes_back() {
    let s = setup(&[]);
    let file = s.dir.path().join("hookserver.d/runtime-hooks.json");
    let ours = s.dir.path().join("runtime-hooks.sock").display().to_string();
    std::fs::remove_file(&file).unwrap();
    assert!(s.proxy.wait_log(&["hook server removed", "file=runtime-hooks.json"], 0), "{}", s.proxy.log());
    let gone = std::time::Instant::now();
    assert!(
        eventually(Duration::from_secs(3), || registered_endpoint(&file).as_deref() == Some(ours.as_str())),
        "{}",
        s.hooks.log()
    );
    assert!(gone.elapsed() < Duration::from_millis(2500), "back after {:?}", gone.elapsed());
    assert_eq!(s.hooks.count(&["registration file was removed; registered again", "WARN"]), 1, "{}", s.hooks.log());
    assert!(s.proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 1), "{}", s.proxy.log());
    // And it still works: a BE pod gets its batch resources.
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512");
    pod.remove(&mut rt).await;
}

/// Two instances with the same --hook-name: each takeover is a warning naming both endpoints,
/// and when one exits the other stays registered (before, the second overwrote the file and the
/// first never took it back; whichever exited first deleted the file for good).
#[tokio::test]
async fn same_hook_name_twice_never_leaves_the_survivor_unregistered() {
    let mut s = setup(&[]);
    let conf = s.dir.path().join("hookserver.d");
    let file = conf.join("runtime-hooks.json");
    let (a, b) = (s.dir.path().join("runtime-hooks.sock"), s.dir.path().join("b.sock"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let mut second =
        Hooks::start(&["--listen", b, "--hook-config-dir", conf.to_str().unwrap()], s.dir.path().join("b.log"));
    let takeover = "named another endpoint";
    // B takes it from A at start; A takes it back within a second, and so on, loudly.
    let (a_ours, a_theirs, b_ours, b_theirs) =
        (format!("ours={a}"), format!("theirs={b}"), format!("ours={b}"), format!("theirs={a}"));
    assert!(second.wait_log(&[takeover, "WARN", &b_ours, &b_theirs], 0, Duration::from_secs(5)), "{}", second.log());
    assert!(s.hooks.wait_log(&[takeover, "WARN", &a_ours, &a_theirs], 0, Duration::from_secs(3)), "{}", s.hooks.log());
    assert!(second.wait_log(&[takeover, "WARN", &b_ours, &b_theirs], 1, Duration::from_secs(3)), "{}", second.log());

    // The first exits: whatever the file said at that moment, the second is registered after.
    assert_eq!(s.hooks.terminate(), Some(0), "{}", s.hooks.log());
    assert!(
        eventually(Duration::from_secs(3), || registered_endpoint(&file).as_deref() == Some(b)),
        "{}",
        second.log()
    );
    for _ in 0..15 {
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(registered_endpoint(&file).as_deref(), Some(b), "stays registered\n{}", second.log());
    }
    assert!(
        eventually(Duration::from_secs(2), || proxy_view(&s.proxy).contains(&format!("endpoint={b}"))),
        "the proxy calls the survivor: {}",
        s.proxy.log()
    );
    // The survivor's exit removes its own file.
    assert_eq!(second.terminate(), Some(0), "{}", second.log());
    assert!(!file.exists(), "{}", second.log());
    assert!(s.proxy.wait_log(&["hook server removed", "file=runtime-hooks.json"], 0), "{}", s.proxy.log());
}

/// `--hook-name` is a plain file name: `../../etc/evil` is refused at start with exit code 2,
/// before anything is written (before, it registered `<dir>/../../etc/evil.json`).
#[test]
fn hook_name_with_a_path_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("a/b/hookserver.d");
    let etc = dir.path().join("a/etc"); // where `../../etc/evil` would land
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let socket = dir.path().join("x.sock");
    let empty = |d: &Path| std::fs::read_dir(d).unwrap().count() == 0;
    for bad in ["../../etc/evil", "..", "", ".hidden"] {
        let mut child = std::process::Command::new(HOOKS_BIN)
            .args([
                "--hook-name",
                bad,
                "--hook-config-dir",
                conf.to_str().unwrap(),
                "--listen",
                socket.to_str().unwrap(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let exited = eventually(Duration::from_secs(5), || child.try_wait().ok().flatten().is_some());
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(exited, "{bad:?}: still running");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {stderr}");
        assert!(stderr.contains("--hook-name") && stderr.contains("hook name"), "{bad:?}: {stderr}");
        assert!(empty(&etc) && empty(&conf) && !socket.exists(), "{bad:?}: nothing written");
    }
}

/// runtime-hooks' gRPC server accepts clients that put the socket path in `:authority` (raw or
/// percent-encoded, as grpc-go and gRPC C-core clients do), not only `localhost`.
#[tokio::test]
async fn hook_server_accepts_any_authority() {
    use prost::Message;
    use test_support::raw::{handmade_call, HandmadeAnswer};
    let s = setup(&[]);
    let socket = s.dir.path().join("runtime-hooks.sock");
    let path = socket.display().to_string();
    let encoded = path.trim_start_matches('/').replace('/', "%2F");
    let request =
        hook_api::v1alpha1::PodSandboxHookRequest { cgroup_parent: "/kubepods/podx".into(), ..Default::default() }
            .encode_to_vec();
    for authority in [None, Some(path.as_bytes()), Some(encoded.as_bytes()), Some(b"localhost".as_slice())] {
        let what = authority.map(String::from_utf8_lossy);
        let answer =
            handmade_call(&socket, authority, "/runtime.v1alpha1.RuntimeHookService/PostStopPodSandboxHook", &request)
                .await
                .unwrap();
        let HandmadeAnswer::Answered(body) = answer else {
            panic!("authority {what:?}: {answer:?}\n{}", s.hooks.log())
        };
        let resp =
            hook_api::v1alpha1::PodSandboxHookResponse::decode(body.get(5..).unwrap_or_default()).expect("hook answer");
        assert_eq!(resp.cgroup_parent, "/kubepods/podx", "authority {what:?}: the echoed request");
    }
}

/// What a pod author writes switches no policy off through the proxy either: annotations
/// claiming `LSR` and CPU 1 on a pod without the label leave its container's CFS quota and
/// CPUs as kubelet asked.
#[tokio::test]
async fn an_annotation_claiming_lsr_buys_nothing() {
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, mut container) = pod_configs(&s.env, &[], &[(QOS, "LSR"), (STATUS, r#"{"cpuset": "1"}"#)]);
    let limited =
        cri::LinuxContainerResources { cpu_shares: 512, cpu_period: 100_000, cpu_quota: 50_000, ..Default::default() };
    container.linux.as_mut().unwrap().resources = Some(limited);
    let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "50000", "{}", s.hooks.log());
    assert_eq!(pod.cgroup_file("cpuset", "cpuset.cpus"), cgroup("cpuset", "", "cpuset.cpus"), "not pinned to CPU 1");
    pod.remove(&mut rt).await;
}

/// A container whose CreateContainer is over 4 MiB (kubelet's copy of a preStop handler of
/// `<`s, each JSON-escaped to six bytes) gets its BE values through the proxy.
#[tokio::test]
async fn a_container_with_a_six_mb_request_gets_its_values() {
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, BE_SPEC)]);
    let handler = format!(r#"{{"exec":{{"command":["sh","-c","{}"]}}}}"#, r"\u003c".repeat(1_000_000));
    container.annotations.insert("io.kubernetes.container.preStopHandler".into(), handler);
    let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "proxy:\n{}\nhooks:\n{}", s.proxy.log(), s.hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728");
    pod.remove(&mut rt).await;
}

/// A BE pod whose annotation and env value are not UTF-8, through the real proxy (sent raw, as
/// prost cannot encode them): it gets its values, and its env reaches the container as it does
/// without the proxy (containerd writes the OCI spec as JSON, so the process sees U+FFFD for
/// each byte that is not UTF-8: the hooks change nothing of it).
#[tokio::test]
async fn a_pod_with_bytes_that_are_not_utf8_gets_its_values() {
    let s = setup(&[]);
    let configs = || {
        let (mut sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, BE_SPEC)]);
        sandbox.annotations.insert("note".into(), ANNOTATION_BYTES.into());
        container.envs.push(cri::KeyValue { key: "TOKEN".into(), value: ENV_BYTES.into() });
        (sandbox, container)
    };
    let (sandbox, container) = configs();
    let pod = start_pod_with_bytes(s.proxy.socket(), sandbox, container).await;
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "proxy:\n{}\nhooks:\n{}", s.proxy.log(), s.hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728");
    let (sandbox, container) = configs();
    let direct = start_pod_with_bytes(&s.env.socket, sandbox, container).await;
    assert_eq!(direct.cgroup_file("cpu", "cpu.shares"), "2", "no hooks without the proxy");
    let mut rt = runtime_client(&s.env.socket);
    let mut token = Vec::new();
    for id in [&pod.container_id, &direct.container_id] {
        let cmd = vec!["sh".into(), "-c".into(), "printf %s \"$TOKEN\"".into()];
        let exec =
            rt.exec_sync(cri::ExecSyncRequest { container_id: id.clone(), cmd, timeout: 5 }).await.expect("ExecSync");
        token.push(exec.into_inner().stdout);
    }
    assert_eq!(token[0], token[1], "the env as containerd gives it without the proxy");
    assert_eq!(token[0], "\u{fffd}\u{fffd}bin\u{fffd}\u{fffd}!".as_bytes(), "containerd's JSON spec: U+FFFD per byte");
    pod.remove(&mut rt).await;
    direct.remove(&mut rt).await;
}

/// CPUNormalization (gate on): with the Node's ratio 1.5, an LS container's CFS quota of
/// 200000 µs becomes ⌈200000 ÷ 1.5⌉ = 133334 µs in its real cgroup; an LSR one keeps its own.
#[tokio::test]
async fn cpu_normalization_scales_an_ls_container_quota() {
    let rules_dir = tempfile::tempdir().unwrap();
    let rules = rules_dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  annotations:\n    node.koordinator.sh/cpu-normalization-ratio: \"1.5\"\n",
    )
    .unwrap();
    let s = setup(&["--rules", rules.to_str().unwrap(), "--feature-gates", "CPUNormalization=true"]);
    let mut rt = runtime_client(s.proxy.socket());
    let limited =
        cri::LinuxContainerResources { cpu_shares: 512, cpu_period: 100_000, cpu_quota: 200_000, ..Default::default() };
    for (class, want) in [("LS", "133334"), ("LSR", "200000")] {
        let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, class)], &[]);
        container.linux.as_mut().unwrap().resources = Some(limited.clone());
        let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
        assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), want, "{class}\n{}", s.hooks.log());
        pod.remove(&mut rt).await;
    }
}

/// GPUEnvInject and RDMADeviceInject through the proxy: the GPUs the scheduler allocated reach
/// the container as `NVIDIA_VISIBLE_DEVICES` (read inside it); the RDMA devices, which the
/// runtime.v1alpha1 answer cannot carry, are logged once as not expressible and the container
/// has no `/dev/infiniband`. A device-allocated annotation that is not JSON fails both plugins
/// under Ignore: that container starts, without the env, and the log names the annotation.
#[tokio::test]
async fn gpu_allocation_becomes_nvidia_visible_devices_and_rdma_is_logged_not_applied() {
    let host = tempfile::Builder::new().prefix("rh-rdma").tempdir().unwrap();
    fake_rdma_host(host.path());
    let root = host.path().to_str().unwrap();
    let s = setup(&["--feature-gates", "GPUEnvInject=true,RDMADeviceInject=true", "--device-host-root", root]);
    let mut rt = runtime_client(s.proxy.socket());
    let alloc = r#"{"gpu": [{"minor": 2, "resources": {"koordinator.sh/gpu-core": 100}}, {"minor": 0}], "rdma": [{"minor": 0, "id": "0000:09:00.0"}]}"#;
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "LS")], &[(DEVICE_ALLOCATED, alloc)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
    let seen =
        exec(&mut rt, &pod.container_id, "printf %s \"$NVIDIA_VISIBLE_DEVICES\"; ls /dev/infiniband 2>/dev/null").await;
    assert_eq!(seen, "2,0", "the env inside the container, and no /dev/infiniband\n{}", s.hooks.log());
    let log = s.hooks.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("not expressible in proxy mode")).collect();
    assert_eq!(lines.len(), 1, "one line per call:\n{log}");
    for part in [
        "device /dev/infiniband/rdma_cm c 10:58 mode 0666",
        "device /dev/infiniband/uverbs0 c 231:192",
        "PreCreateContainer",
    ] {
        assert!(lines[0].contains(part), "{part:?} in {}", lines[0]);
    }
    assert!(!log.contains("plugin-failure-policy"), "no plugin failed:\n{log}");

    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "LS")], &[(DEVICE_ALLOCATED, "{\"gpu\": [{\"minor\": 0}")]);
    let bad = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
    assert_eq!(exec(&mut rt, &bad.container_id, "printf %s \"${NVIDIA_VISIBLE_DEVICES-unset}\"").await, "unset");
    let log = s.hooks.log();
    for plugin in ["plugin GPUEnvInject failed", "plugin RDMADeviceInject failed"] {
        let line = log.lines().find(|l| l.contains(plugin)).unwrap_or_else(|| panic!("{plugin:?} in\n{log}"));
        assert!(line.contains(DEVICE_ALLOCATED) && line.contains("EOF") && line.contains("Ignore"), "{line}");
    }
    pod.remove(&mut rt).await;
    bad.remove(&mut rt).await;
}

/// runtime-hooks killed (an OOM kill leaves its registration behind; the registration is
/// `Ignore`): a BE pod created through the proxy meanwhile runs with kubelet's BestEffort values,
/// no batch limits. runtime-hooks started again in proxy mode with `--runtime-endpoint` (as the
/// packages and the DaemonSet run it): its reconcile pass at start gives the pod and its
/// container their BE values, with no interval and no rule change to trigger it.
#[tokio::test]
async fn pods_created_while_hooks_were_down_are_corrected_at_start() {
    let env = Containerd::from_env();
    let selector = format!("test={}", test_support::containerd::unique("down"));
    let mut s = setup(&["--selector", &selector]);
    // SAFETY: kill(2) on our own child, as the OOM killer would.
    unsafe { libc::kill(s.hooks.pid(), libc::SIGKILL) };
    assert!(eventually(Duration::from_secs(5), || !Path::new(&format!("/proc/{}/stat", s.hooks.pid())).exists()
        || std::fs::read_to_string(format!("/proc/{}/stat", s.hooks.pid())).is_ok_and(|st| st.contains(") Z "))));
    assert!(s.dir.path().join("hookserver.d/runtime-hooks.json").exists(), "a killed server leaves its registration");

    let mut rt = runtime_client(s.proxy.socket());
    let (k, v) = selector.split_once('=').unwrap();
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE"), (k, v)], &[(SPEC, BE_SPEC)]);
    let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    precreate_pod_cgroup(&parent);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("the pod runs: the registration is Ignore");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2", "kubelet's BestEffort shares, no hook answered");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1");
    assert_ne!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728");
    assert_ne!(cgroup("memory", &parent, "memory.limit_in_bytes"), "134217728");

    let conf = s.dir.path().join("hookserver.d");
    let socket = s.dir.path().join("runtime-hooks.sock");
    let args = [
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        conf.to_str().unwrap(),
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "0s",
        "--selector",
        &selector,
    ];
    s.hooks = Hooks::start(&args, s.dir.path().join("hooks-again.log"));
    let corrected = || {
        pod.cgroup_file("cpu", "cpu.shares") == "512"
            && pod.cgroup_file("cpu", "cpu.cfs_quota_us") == "100000"
            && pod.cgroup_file("memory", "memory.limit_in_bytes") == "134217728"
            && cgroup("cpu", &parent, "cpu.shares") == "512"
            && cgroup("memory", &parent, "memory.limit_in_bytes") == "134217728"
    };
    assert!(
        eventually(Duration::from_secs(10), corrected),
        "container: shares {} quota {} memory {}; pod: shares {} memory {}\n{}",
        pod.cgroup_file("cpu", "cpu.shares"),
        pod.cgroup_file("cpu", "cpu.cfs_quota_us"),
        pod.cgroup_file("memory", "memory.limit_in_bytes"),
        cgroup("cpu", &parent, "cpu.shares"),
        cgroup("memory", &parent, "memory.limit_in_bytes"),
        s.hooks.log()
    );
    let log = s.hooks.log();
    assert!(
        log.lines().any(|l| l.contains("reconciled") && l.contains("reason=\"start\"") || l.contains("reason=start")),
        "{log}"
    );
    assert!(log.lines().any(|l| l.contains("drift corrected") && l.contains("memory.limit_in_bytes")), "{log}");
    pod.remove(&mut rt).await;
}
