//! Calls for different pods never wait on each other, and the store keeps nothing of pods and
//! containers that are gone — including containers that exit on their own and are removed
//! without a StopContainer, as kubelet does for finished init containers and jobs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const PODS: usize = 50;
const HOOK_DELAY: Duration = Duration::from_millis(100);

/// The sandbox and container IDs the proxy's store holds (`/debug/store`, on `--debug-addr`).
/// The store also holds what other tests run on the same containerd, so tests look for their
/// own IDs.
fn store_ids(proxy: &ProxyProcess) -> (HashSet<String>, HashSet<String>) {
    let (status, body) = proxy.debug_get("/debug/store");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let ids = |k: &str| v[k].as_array().expect(k).iter().filter_map(|s| s.as_str().map(str::to_owned)).collect();
    (ids("pod_sandboxes"), ids("containers"))
}

/// Whether the store holds each of `pods` (sandbox and container).
fn stored(proxy: &ProxyProcess, pods: &[(String, String)]) -> Vec<(bool, bool)> {
    let (sandboxes, containers) = store_ids(proxy);
    pods.iter().map(|(s, c)| (sandboxes.contains(s), containers.contains(c))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_pods_with_a_100ms_hook_run_in_parallel_and_leave_no_store_entries() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let hook = TestHook::start_with_delay(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
        HOOK_DELAY,
    )
    .await;
    let stages = ["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"];

    // Baseline: the same 50 pods with no hook registered (containerd's own time on 2 cores).
    let (baseline, pods) = start_pods(&env, &proxy).await;
    remove_pods(&proxy, pods).await;

    register(dir.path(), "slow.json", hook.socket(), "Fail", &stages, json!({}));
    assert!(proxy.wait_log(&["hook server added", "slow.json"], 0));
    let (hooked, pods) = start_pods(&env, &proxy).await;
    assert_eq!(hook.seen().len(), PODS * stages.len());
    // A proxy that serialised calls across pods would never have two hook calls in flight. The
    // wall times are printed for the record (timing is measured in benches, not asserted).
    eprintln!(
        "{PODS} pods: {baseline:?} without hooks, {hooked:?} with a {HOOK_DELAY:?} hook at {} stages; up to {} hook calls in flight",
        stages.len(),
        hook.max_concurrent()
    );
    assert!(
        hook.max_concurrent() >= 10,
        "hook calls of different pods overlap: at most {} at once",
        hook.max_concurrent()
    );
    let ids: Vec<(String, String)> = pods.iter().map(|p| (p.sandbox_id.clone(), p.container_id.clone())).collect();
    assert!(stored(&proxy, &ids).iter().all(|s| *s == (true, true)), "every pod and container stored");

    remove_pods(&proxy, pods).await;
    assert!(stored(&proxy, &ids).iter().all(|s| *s == (false, false)), "nothing left of the removed pods");
}

#[tokio::test]
async fn a_container_that_exits_and_is_removed_without_stop_leaves_nothing() {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("initc"), HashMap::new(), HashMap::new());
    let pod = Pod::start(&mut rt, sandbox, container_config(&env, "init", &["true"], None, &[])).await.unwrap();
    // Wait until the container has exited on its own.
    let exited = test_support::wait_until(Duration::from_secs(10), || {
        let mut rt = rt.clone();
        let id = pod.container_id.clone();
        async move {
            let status = rt.container_status(cri::ContainerStatusRequest { container_id: id, verbose: false }).await;
            status.is_ok_and(|s| {
                s.into_inner().status.is_some_and(|s| s.state == cri::ContainerState::ContainerExited as i32)
            })
        }
    })
    .await;
    assert!(exited, "the container exited");
    let ids = [(pod.sandbox_id.clone(), pod.container_id.clone())];
    assert_eq!(stored(&proxy, &ids), [(true, true)]);
    rt.remove_container(cri::RemoveContainerRequest { container_id: pod.container_id.clone() }).await.unwrap();
    assert_eq!(stored(&proxy, &ids), [(true, false)], "removed without StopContainer: gone from the store");
    test_support::containerd::remove_sandbox(&mut rt, &pod.sandbox_id).await;
    assert_eq!(stored(&proxy, &ids), [(false, false)]);
}

/// Starts [`PODS`] pods concurrently through `proxy`; returns the wall time and the pods.
async fn start_pods(env: &Containerd, proxy: &ProxyProcess) -> (Duration, Vec<Pod>) {
    let started = Instant::now();
    let tasks: Vec<_> = (0..PODS)
        .map(|_| {
            let env = env.clone();
            let mut rt = runtime_client(proxy.socket());
            tokio::spawn(async move {
                let sandbox = sandbox_config(&env, &unique("par"), HashMap::new(), HashMap::new());
                Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await
            })
        })
        .collect();
    let mut pods = Vec::new();
    for t in tasks {
        pods.push(t.await.unwrap().expect("pod"));
    }
    (started.elapsed(), pods)
}

/// Removes `pods` concurrently.
async fn remove_pods(proxy: &ProxyProcess, pods: Vec<Pod>) {
    let tasks: Vec<_> = pods
        .into_iter()
        .map(|pod| {
            let mut rt = runtime_client(proxy.socket());
            tokio::spawn(async move { pod.remove(&mut rt).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("pod removed");
    }
}
