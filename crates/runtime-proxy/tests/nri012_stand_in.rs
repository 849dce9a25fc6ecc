//! The NRI front end (`--frontend nri`) against a runtime speaking NRI 0.12 (containerd 2.3 LTS,
//! 2.4), which we cannot run here: the protocol-level stand-in of `test_support::nri_runtime`.
//! No containerd needed. Against the real 1.7 and 2.1 (NRI before 0.12): `nri_frontend`. The
//! stand-in records the plugin's event mask: the front end subscribes only to the events its hook
//! servers' stages need, and registers again when a registry change alters that set.

use std::time::{Duration, Instant};

use nri_plugin::proto::api::{self as nri, Event};
use serde_json::json;
use test_support::hooks::{register, start_nri_front, KillOnDrop, TestHook};
use test_support::nri_runtime::{container, pod, pod_level, Delivered, NriRuntime, Plugin, LIFECYCLE};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// runtime-proxy as an NRI plugin of `runtime`'s socket with `dir` as its hook config dir.
fn start_proxy(runtime: &NriRuntime, dir: &std::path::Path) -> KillOnDrop {
    let (metrics, debug) = (test_support::free_loopback_addr(), test_support::free_loopback_addr());
    let extra = ["--metrics-addr", &metrics, "--debug-addr", &debug];
    start_nri_front(BIN, runtime.socket(), dir, &extra, "info,runtime_proxy=debug,nri_plugin=debug")
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

/// The events of `plugin`'s mask, in a pod's life order.
fn subscribed(plugin: &Plugin) -> Vec<Event> {
    LIFECYCLE.into_iter().filter(|&e| plugin.subscribed(e)).collect()
}

/// Waits up to 10 s for `f`.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(10) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// One PreCreateContainer server: the front end subscribes to CreateContainer and the two remove
/// events (the store forgets there), nothing else. A server added at PostStopContainer makes it
/// register again with StopContainer added (one INFO line naming both sets), and that server is
/// called at the next container stop; removing it registers again without StopContainer.
/// Fails without the per-stage subscription (all nine events at once, no re-registration).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribes_to_what_the_servers_need_and_again_when_that_changes() {
    let dir = tempfile::Builder::new().prefix("rp-nrisub").tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "create.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let runtime = NriRuntime::v0_12().unwrap();
    let _proxy = start_proxy(&runtime, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let (p, c) = (pod("s1", &[], "/kubepods/pod1"), container("c1", &pod("s1", &[], "/kubepods/pod1")));

    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    let create_only = [Event::CreateContainer, Event::RemoveContainer, Event::RemovePodSandbox];
    assert_eq!(subscribed(&plugin), create_only, "{}", log());
    match plugin.deliver(Event::CreateContainer, &p, Some(&c)).await.unwrap() {
        Ok(Delivered::Answered(..)) => {}
        other => panic!("CreateContainer: {other:?}\n{}", log()),
    }
    assert_eq!(hook.seen().iter().map(|s| s.stage().to_owned()).collect::<Vec<_>>(), ["PreCreateContainer"]);

    let stop_hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "stop.json", stop_hook.socket(), "Ignore", &["PostStopContainer"], json!({}));
    let mut plugin =
        runtime.accept(vec![p.clone()], vec![c.clone()]).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert_eq!(
        subscribed(&plugin),
        [Event::CreateContainer, Event::StopContainer, Event::RemoveContainer, Event::RemovePodSandbox],
        "{}",
        log()
    );
    let line = concat!(
        "old=RemovePodSandbox,CreateContainer,RemoveContainer ",
        "new=RemovePodSandbox,CreateContainer,StopContainer,RemoveContainer"
    );
    assert!(eventually(|| log().contains(line)).await, "one line names the old and the new set:\n{}", log());
    match plugin.deliver(Event::StopContainer, &p, Some(&c)).await.unwrap() {
        Ok(Delivered::Answered(..)) => {}
        other => panic!("StopContainer: {other:?}\n{}", log()),
    }
    assert!(
        eventually(|| stop_hook.seen().iter().any(|s| s.stage() == "PostStopContainer")).await,
        "the new server is called at the next stop:\n{}",
        log()
    );

    std::fs::remove_file(dir.path().join("stop.json")).unwrap();
    let plugin = runtime.accept(vec![p.clone()], vec![c.clone()]).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert_eq!(subscribed(&plugin), create_only, "{}", log());
    assert!(eventually(|| log().matches("the plugin needs other events").count() == 2).await, "{}", log());
}

/// PreStartContainer's resources wait in the front end for the container to run
/// (PostStartContainer); when a registry change makes it register again in between, they are not
/// lost: the container runs by the next Synchronize, so they go out with `UpdateContainers` right
/// after it. Fails when a reconnect drops what is pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_start_resources_survive_the_re_registration() {
    let dir = tempfile::Builder::new().prefix("rp-nrisub").tempdir().unwrap();
    let hook = TestHook::echoing(|stage, resp| {
        if stage == "PreStartContainer" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 444;
        }
    })
    .await;
    register(dir.path(), "start.json", hook.socket(), "Fail", &["PreStartContainer"], json!({}));
    let runtime = NriRuntime::v0_12().unwrap();
    let _proxy = start_proxy(&runtime, dir.path());
    let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let p = pod("s1", &[], "/kubepods/pod1");
    let mut c = container("c1", &p);
    c.state = nri::ContainerState::ContainerCreated as i32;

    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert!(plugin.subscribed(Event::StartContainer) && plugin.subscribed(Event::PostStartContainer));
    match plugin.deliver(Event::StartContainer, &p, Some(&c)).await.unwrap() {
        Ok(Delivered::Answered(..)) => {}
        other => panic!("StartContainer: {other:?}\n{}", log()),
    }
    assert_eq!(plugin.take_plugin_calls(Duration::from_millis(300)).await.unwrap(), 0, "not before it runs");

    // The registry changes before PostStartContainer; the container runs by the next Synchronize.
    let stop_hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "stop.json", stop_hook.socket(), "Ignore", &["PostStopContainer"], json!({}));
    c.state = nri::ContainerState::ContainerRunning as i32;
    let mut plugin =
        runtime.accept(vec![p.clone()], vec![c.clone()]).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert!(plugin.subscribed(Event::StopContainer), "{}", log());
    plugin.take_plugin_calls(Duration::from_secs(5)).await.unwrap();
    let sent: Vec<(String, i64)> = plugin
        .updates
        .iter()
        .flat_map(|r| &r.update)
        .map(|u| {
            let shares = u.linux.as_ref().and_then(|l| l.resources.as_ref()).and_then(|r| r.cpu.as_ref());
            (u.container_id.clone(), shares.and_then(|c| c.shares.as_ref()).map_or(0, |s| s.value as i64))
        })
        .collect();
    assert_eq!(sent, [("c1".to_owned(), 444)], "{}", log());
}
