//! The NRI front end (`--frontend nri`) against a runtime speaking NRI 0.12 (containerd 2.3 LTS,
//! 2.4), which we cannot run here: the protocol-level stand-in of `test_support::nri_runtime`.
//! No containerd needed. Against the real 1.7 and 2.1 (NRI before 0.12): `nri_frontend`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use test_support::hooks::{register, KillOnDrop, TestHook};
use test_support::nri_runtime::{container, pod, pod_level, Delivered, NriRuntime, LIFECYCLE};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// runtime-proxy as an NRI plugin of `runtime`'s socket with `dir` as its hook config dir.
fn start_proxy(runtime: &NriRuntime, dir: &std::path::Path) -> KillOnDrop {
    let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
    let child = Command::new(BIN)
        .args(["--frontend", "nri", "--nri-socket"])
        .arg(runtime.socket())
        .args(["--nri-plugin-name", "runtime-proxy-test", "--nri-plugin-index", "20", "--hook-config-dir"])
        .arg(dir)
        .args([
            "--metrics-addr",
            &test_support::free_loopback_addr(),
            "--debug-addr",
            &test_support::free_loopback_addr(),
        ])
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .env("RUST_LOG", "info,runtime_proxy=debug,nri_plugin=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start runtime-proxy");
    KillOnDrop(child)
}

/// NRI 0.12: every event the front end subscribes to comes as its own call and is answered —
/// none `UNIMPLEMENTED`, none over the deprecated StateChange — and each reaches the hook
/// server's stage, in the pod's order; the log names the protocol level once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_its_own_call_on_nri_0_12() {
    let dir = tempfile::Builder::new().prefix("rp-nri012").tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    let stages = [
        "PreRunPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
        "PostStopPodSandbox",
    ];
    register(dir.path(), "echo.json", hook.socket(), "Fail", &stages, json!({}));
    let runtime = NriRuntime::v0_12().unwrap();
    let _proxy = start_proxy(&runtime, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let p = pod("s1", &[], "/kubepods/pod1");
    let c = container("c1", &p);
    let mut delivered = Vec::new();
    for event in LIFECYCLE {
        match plugin.deliver(event, &p, (!pod_level(event)).then_some(&c)).await.unwrap() {
            Ok(Delivered::Answered(method, _)) => delivered.push(method),
            Ok(Delivered::NotSubscribed) => {}
            Err(status) => panic!("{event:?} refused: {status:?}\n{}", log()),
        }
    }
    assert_eq!(
        delivered,
        [
            "RunPodSandbox",
            "CreateContainer",
            "StartContainer",
            "PostStartContainer",
            "UpdateContainer",
            "StopContainer",
            "RemoveContainer",
            "StopPodSandbox",
            "RemovePodSandbox"
        ],
        "the front end's nine events, each its own call"
    );
    assert!(plugin.unimplemented().is_empty(), "{:?}", plugin.calls);
    assert!(plugin.deprecated.is_empty(), "{:?}", plugin.deprecated);
    let start = Instant::now();
    while hook.seen().len() < stages.len() && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen: Vec<String> = hook.seen().iter().map(|s| s.stage().to_owned()).collect();
    assert_eq!(seen, stages, "{}", log());
    assert_eq!(log().matches("protocol level 0.12").count(), 1, "{}", log());
    assert_eq!(plugin.registered.nri_version, "v0.12.0");
}
