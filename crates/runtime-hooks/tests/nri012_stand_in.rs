//! runtime-hooks' NRI mode against a runtime speaking NRI 0.12 (containerd 2.3 LTS, 2.4), which
//! we cannot run here: the protocol-level stand-in of `test_support::nri_runtime`, with a cgroup
//! v1 tree in a temp directory (`--unchecked-cgroup-root`). No containerd needed. Against the real
//! 1.7 and 2.1 (NRI before 0.12): `nri_mode`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use nri_plugin::proto::api::{self as nri, Event};
use test_support::nri_runtime::{container, pod, pod_level, Delivered, NriRuntime, LIFECYCLE};

const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#;

/// A BE pod's directory in the tree, with the runtime's 2 shares.
fn be_pod(dir: &Path) -> (nri::PodSandbox, std::path::PathBuf) {
    let pod_dir = dir.join("cgroup/cpu/kubepods/besteffort/pod1");
    std::fs::create_dir_all(&pod_dir).unwrap();
    std::fs::write(pod_dir.join("cpu.shares"), "2").unwrap();
    let mut p = pod("s1", &[(QOS, "BE")], "/kubepods/besteffort/pod1");
    p.annotations.push(nri::BytesEntry { key: SPEC.as_bytes().to_vec(), value: BE_SPEC.as_bytes().to_vec() });
    (p, pod_dir)
}

/// NRI 0.12: each event runtime-hooks subscribes to (the default plugins: RunPodSandbox,
/// CreateContainer, UpdateContainer, StopContainer, the remove events and the pod resize's
/// PostUpdatePodSandbox) comes as its own call and is answered — none `UNIMPLEMENTED`, none over
/// the deprecated StateChange. The BE pod gets its batch shares at RunPodSandbox and again after
/// the resize overwrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_its_own_call_and_a_resize_rewrites_the_pod_values() {
    let dir = tempfile::Builder::new().prefix("rh-nri012").tempdir().unwrap();
    let runtime = NriRuntime::v0_12().unwrap();
    let hooks = start_nri_v1(runtime.socket(), dir.path(), "info,runtime_hooks=debug,nri_plugin=debug");
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
    let (p, pod_dir) = be_pod(dir.path());
    let c = container("c1", &p);
    let shares = || std::fs::read_to_string(pod_dir.join("cpu.shares")).unwrap();
    let mut delivered = Vec::new();
    for event in LIFECYCLE {
        if event == Event::PostUpdatePodSandbox {
            assert_eq!(shares(), "512", "RunPodSandbox wrote the batch shares\n{}", hooks.log());
            // The runtime applied the pod's new resources to its cgroup.
            std::fs::write(pod_dir.join("cpu.shares"), "1024").unwrap();
        }
        match plugin.deliver(event, &p, (!pod_level(event)).then_some(&c)).await.unwrap() {
            Ok(Delivered::Answered(method, _)) => delivered.push(method),
            Ok(Delivered::NotSubscribed) => {}
            Err(status) => panic!("{event:?} refused: {status:?}\n{}", hooks.log()),
        }
        if event == Event::PostUpdatePodSandbox {
            assert_eq!(shares(), "512", "written again after the resize\n{}", hooks.log());
        }
    }
    assert_eq!(
        delivered,
        [
            "RunPodSandbox",
            "CreateContainer",
            "PostUpdatePodSandbox",
            "UpdateContainer",
            "StopContainer",
            "RemoveContainer",
            "RemovePodSandbox"
        ],
        "{}",
        hooks.log()
    );
    assert!(plugin.unimplemented().is_empty(), "{:?}", plugin.calls);
    assert!(plugin.deprecated.is_empty(), "{:?}", plugin.deprecated);
    assert_eq!(hooks.log().matches("protocol level 0.12").count(), 1, "{}", hooks.log());
}

/// A runtime before NRI 0.12 (as containerd 1.7 and 2.1): the mask leaves out the pod update
/// event it does not know (or the registration would fail), and RunPodSandbox over StateChange
/// still writes the BE pod's shares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_runtime_gets_state_change_and_a_mask_it_knows() {
    let dir = tempfile::Builder::new().prefix("rh-nri012").tempdir().unwrap();
    let runtime = NriRuntime::before_0_12().unwrap();
    let hooks = start_nri_v1(runtime.socket(), dir.path(), "info,runtime_hooks=debug,nri_plugin=debug");
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
    assert!(!plugin.subscribed(Event::PostUpdatePodSandbox));
    let (p, pod_dir) = be_pod(dir.path());
    match plugin.deliver(Event::RunPodSandbox, &p, None).await.unwrap() {
        Ok(Delivered::Answered(method, _)) => assert_eq!(method, "StateChange"),
        other => panic!("{other:?}\n{}", hooks.log()),
    }
    assert_eq!(std::fs::read_to_string(pod_dir.join("cpu.shares")).unwrap(), "512", "{}", hooks.log());
    // The level is logged once the first call that only one level makes has been answered.
    assert!(hooks.wait_log(&["protocol level before 0.12"], 0, Duration::from_secs(5)), "{}", hooks.log());
}
