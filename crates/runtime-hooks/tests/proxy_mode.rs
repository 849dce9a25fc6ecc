//! Proxy mode end to end: real containerd, the real runtime-proxy, the runtime-hooks binary
//! registered in the proxy's hook config directory; pods run through the proxy the way kubelet
//! runs them, and the policies show up in the real cgroup files.

mod common;

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
    let proxy = ProxyProcess::start(proxy_bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
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
    assert_eq!(registration["runtime-hooks"], serde_json::json!(["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"]));
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
async fn lsr_pod_gets_its_cpuset_and_be_pod_the_shared_pool() {
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "LSR")], &[(STATUS, r#"{"cpuset": "1"}"#)]);
    container.linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_quota = 50_000;
    let lsr = Pod::start(&mut rt, sandbox, container).await.expect("LSR pod");
    assert_eq!(lsr.cgroup_file("cpuset", "cpuset.cpus"), "1");
    assert_eq!(lsr.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1", "bound CPUs: CFS quota unset");

    // A BE container for which kubelet asked for a cpuset is moved to the shared pool.
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE")], &[]);
    container.linux.as_mut().unwrap().resources.as_mut().unwrap().cpuset_cpus = "0".into();
    let be = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");
    let all = cgroup("cpuset", "", "cpuset.cpus");
    assert_eq!(be.cgroup_file("cpuset", "cpuset.cpus"), all, "cleared: the parent's CPUs");
    lsr.remove(&mut rt).await;
    be.remove(&mut rt).await;
}

#[tokio::test]
async fn plugin_failures_follow_the_policies() {
    // Fail here and in the registration: a broken annotation refuses the pod, naming the cause.
    let s = setup(&["--plugin-failure-policy", "Fail", "--failure-policy", "Fail"]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) =
        pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, r#"{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}"#)]);
    let err = Pod::start(&mut rt, sandbox, container).await.expect_err("refused");
    for part in ["BatchResource", "PreRunPodSandbox", SPEC, "lots"] {
        assert!(err.message().contains(part), "{part:?} missing from {:?}", err.message());
    }

    // Ignore: the same pod runs, unchanged by BatchResource; the failure is logged.
    let s = setup(&[]);
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE")], &[(SPEC, "{not json")]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("runs under Ignore");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    assert!(s.hooks.wait_log(&["BatchResource", SPEC, "plugin-failure-policy Ignore"], 0, Duration::from_secs(2)), "{}", s.hooks.log());
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
        hook_api::v1alpha1::PodSandboxHookRequest { cgroup_parent: "/kubepods/podx".into(), ..Default::default() }.encode_to_vec();
    for authority in [None, Some(path.as_bytes()), Some(encoded.as_bytes()), Some(b"localhost".as_slice())] {
        let what = authority.map(String::from_utf8_lossy);
        let answer =
            handmade_call(&socket, authority, "/runtime.v1alpha1.RuntimeHookService/PostStopPodSandboxHook", &request).await.unwrap();
        let HandmadeAnswer::Answered(body) = answer else { panic!("authority {what:?}: {answer:?}\n{}", s.hooks.log()) };
        let resp = hook_api::v1alpha1::PodSandboxHookResponse::decode(body.get(5..).unwrap_or_default()).expect("hook answer");
        assert_eq!(resp.cgroup_parent, "/kubepods/podx", "authority {what:?}: the echoed request");
    }
}
