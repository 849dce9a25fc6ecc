//! The NRI front end (`--frontend nri`) on a large node: the NRI runtime stand-in
//! (`test_support::nri_runtime`) with a node of `test_support::scale` pods. No containerd
//! needed (the benchmark `nri_large_node` has the figures at 10, 100 and 1,000 pods).

use std::time::Duration;

use nri_plugin::proto::api::Event;
use serde_json::json;
use test_support::hooks::{register, start_nri_front, TestHook};
use test_support::nri_runtime::{Delivered, NriRuntime};
use test_support::scale;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// Synchronize with 1,000 pods × 4 containers (a 2.6 MiB state): answered with no update (no
/// hook runs on existing containers), every pod and container in the store (`/debug/store`);
/// a container created afterwards in one of those pods reaches the hook server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronize_of_a_thousand_pods_fills_the_store() {
    let dir = tempfile::Builder::new().prefix("rp-scale").tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "echo.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let runtime = NriRuntime::v0_12().unwrap();
    let debug = test_support::free_loopback_addr();
    let extra = ["--metrics-addr", &test_support::free_loopback_addr(), "--debug-addr", &debug];
    let _proxy = start_nri_front(BIN, runtime.socket(), dir.path(), &extra, "info");
    let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
    let (pods, containers) = scale::nri_node(1000, 4);
    let mut plugin = runtime.accept(pods.clone(), containers).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert!(plugin.sync.answered.is_empty(), "{:?}", plugin.sync.answered.first());
    let (code, body) = test_support::http_get(&debug, "/debug/store");
    assert_eq!(code, 200, "{body}");
    let ids: serde_json::Value = serde_json::from_str(&body).unwrap();
    let count = |k: &str| ids[k].as_array().map(Vec::len).unwrap_or_default();
    assert_eq!((count("pod_sandboxes"), count("containers")), (1000, 4000), "{}", log());
    let c = scale::nri_container(500, 4, &pods[500]);
    match plugin.deliver(Event::CreateContainer, &pods[500], Some(&c)).await.unwrap() {
        Ok(Delivered::Answered(..)) => {}
        other => panic!("{other:?}\n{}", log()),
    }
    let seen = test_support::wait_until(Duration::from_secs(5), || async { !hook.seen().is_empty() }).await;
    assert!(seen, "{}", log());
    assert_eq!(hook.seen()[0].stage(), "PreCreateContainer");
}
