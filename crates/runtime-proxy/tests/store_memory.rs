//! The store keeps a pod's labels and annotations once per sandbox, not once per container
//! (`src/hooks/store.rs`): one pod with Kubernetes' whole annotation budget and many containers,
//! created and started through the real proxy in front of the real containerd with a hook server
//! registered, grows the proxy's RSS by less than 1 MiB. A copy of the pod per container cost
//! ≈ 770 KiB of RSS per container here (the bound below fails then).

use std::collections::HashMap;
use std::time::Instant;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd};
use test_support::hooks::{next_seen, register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// Containers created in the pod after the first (which warms the proxy up).
const CONTAINERS: usize = 64;
/// The pod's annotations: this many of 30 bytes (key and value: 240 KB, within Kubernetes'
/// 256 KiB for all of a pod's annotations).
const ANNOTATIONS: usize = 8_000;
/// Most RSS growth allowed over the [`CONTAINERS`]: with one copy of the pod per container it
/// was ≈ 770 KiB per container (≈ 48 MiB); with one per sandbox it is under 1 MiB (margin for a
/// shared 2-core VM's allocator noise).
const MAX_GROWTH_KIB: u64 = 16 << 10;

/// The proxy's VmRSS in KiB (`/proc/<pid>/status`), once the allocator has had time to give
/// back what the calls before freed (mimalloc purges freed pages after a short delay).
async fn rss_kib(pid: u32) -> u64 {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// CreateContainer (with the pod's `sandbox_config`, as kubelet sends it) and StartContainer of
/// the container `c<i>` in the pod `(sandbox ID, config)`.
async fn start(
    env: &Containerd,
    rt: &mut RuntimeServiceClient<Channel>,
    pod: (&String, &cri::PodSandboxConfig),
    i: usize,
) {
    let container = container_config(env, &format!("c{i}"), &["sleep", "3600"], None, &[("KEEP", "me")]);
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: pod.0.clone(),
        config: Some(container),
        sandbox_config: Some(pod.1.clone()),
    };
    let id = rt
        .create_container(req)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer c{i}: {e:?}"))
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest { container_id: id })
        .await
        .unwrap_or_else(|e| panic!("StartContainer c{i}: {e:?}"));
}

#[tokio::test]
async fn many_containers_of_a_pod_with_large_annotations_keep_one_copy_of_the_pod() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-store-mem").tempdir().unwrap();
    // A hook server at both container stages of a pod's start: every container's request is
    // built from the store (PreCreateContainer: the pod; PreStartContainer: the container).
    let hook = TestHook::echoing(|_, _| {}).await;
    register(
        dir.path(),
        "observer.json",
        hook.socket(),
        "Fail",
        &["PreCreateContainer", "PreStartContainer"],
        json!({}),
    );
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "file=observer.json"], 0), "{}", proxy.log());
    let mut rt = runtime_client(proxy.socket());

    // Many small entries, as labels-turned-annotations and tooling write them: 30 bytes each.
    let annotations: HashMap<String, String> =
        (0..ANNOTATIONS).map(|i| (format!("a{i:04}"), format!("{i:025}"))).collect();
    let config = sandbox_config(
        &env,
        &unique("store-mem"),
        [("app".to_string(), "big".to_string())].into(),
        annotations.clone(),
    );
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let pod = (&sandbox_id, &config);
    start(&env, &mut rt, pod, 0).await;
    let before = rss_kib(proxy.pid()).await;
    let began = Instant::now();
    for i in 1..=CONTAINERS {
        start(&env, &mut rt, pod, i).await;
    }
    let took = began.elapsed();
    let after = rss_kib(proxy.pid()).await;
    let growth = after.saturating_sub(before);
    eprintln!(
        "{CONTAINERS} containers of one pod with {ANNOTATIONS} annotations ({} KB): proxy RSS {before} → {after} KiB (+{growth} KiB, {:.1} KiB per container) in {took:.1?}",
        ANNOTATIONS * 30 / 1000,
        growth as f64 / CONTAINERS as f64
    );

    // Removed before asserting: a pod left behind would slow down the next tests' recoveries.
    remove_sandbox(&mut rt, &sandbox_id).await;
    assert!(
        growth < MAX_GROWTH_KIB,
        "proxy RSS grew by {growth} KiB over {CONTAINERS} containers (bound {MAX_GROWTH_KIB} KiB)"
    );
    // The store was used: the last start's hook request carried the pod's annotations.
    let seen = next_seen(&hook, "PreStartContainer", hook.seen().len() - 1).await.container();
    assert_eq!(seen.container_meta.as_ref().map(|m| m.name.clone()), Some(format!("c{CONTAINERS}")));
    assert_eq!(seen.pod_annotations.len(), ANNOTATIONS, "the pod's annotations, from the store");
    assert_eq!(seen.pod_annotations, annotations.into_iter().collect(), "the pod's annotations, from the store");
    assert!(seen.container_envs.is_empty(), "no envs after PreCreateContainer");
}
