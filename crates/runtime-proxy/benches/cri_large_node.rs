//! The CRI proxy on nodes of 10, 100 and 1,000 pods × 4 containers that already run, against the
//! stand-in runtime (`test_support::fake_node`: the pods listed and described as containerd 1.7
//! describes them, every other call answered at once), with one no-op hook server (an echoing
//! tonic server in this process) registered at all seven stages. For each size the release proxy
//! starts, recovers the node into its store, and then:
//!
//! * **per pod created and removed**: `RP_BENCH_SCALE_EVENTS` new pods (default 200), each through
//!   RunPodSandbox, CreateContainer, StartContainer, UpdateContainerResources, StopContainer,
//!   RemoveContainer, StopPodSandbox and RemovePodSandbox (seven hooked calls, one not hooked);
//! * **per update of a container that was there**: as many UpdateContainerResources calls on the
//!   recovered containers, spread over the node (an ID-only call: the proxy finds the container's
//!   pod in its store).
//!
//! For each: the proxy's CPU time per pod or per call (`/proc/PID/task/*/schedstat`, all its
//! threads), and its own time per hooked call at PreCreateContainer and
//! PreUpdateContainerResources: the p50 of its
//! `runtime_proxy_hooked_call_own_duration_seconds{stage}` histogram (from the call's turn to its
//! send, the hook call and the runtime left out; interpolated within the buckets). Neither may grow
//! with the number of stored pods. The calls are sent as kubelet's grpc-go sends them, each in
//! one DATA frame with END_STREAM (`test_support::raw::KubeletClient`).
//!
//! Run: `make bench`, or `cargo bench -p runtime-proxy --bench cri_large_node` (no runtime needed;
//! `RP_BENCH_SIZES=1000` runs only that size, e.g. to profile it).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use hook_api::Stage;
use k8s_cri::v1 as cri;
use serde_json::json;
use test_support::fake_node::NodeShape;
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::raw::KubeletClient;

use common::{loadavg, own_buckets, p50_us, NodeServer};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const SIZES: [usize; 3] = [10, 100, 1000];
const PER_POD: usize = 4;

/// New pod `i`'s RunPodSandbox config, kubelet-like: its labels, annotations and cgroup parent.
fn sandbox_config(i: usize) -> cri::PodSandboxConfig {
    let uid = test_support::scale::uid(100_000 + i);
    let name = format!("new-{i}");
    let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: map(&[
            ("io.kubernetes.pod.name", &name),
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.pod.uid", &uid),
            ("app", "burst"),
        ]),
        annotations: map(&[
            ("kubernetes.io/config.seen", "2026-12-06T09:00:00.000000000Z"),
            ("kubernetes.io/config.source", "api"),
        ]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/burstable/pod{uid}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn resources(shares: i64) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: 100_000,
        cpu_quota: 200_000,
        memory_limit_in_bytes: 512 << 20,
        ..Default::default()
    }
}

/// The RuntimeService call `method` with `request`, sent as kubelet sends it; panics on failure.
async fn call<A: prost::Message + Default>(client: &KubeletClient, method: &str, request: &impl prost::Message) -> A {
    let path = format!("/runtime.v1.RuntimeService/{method}");
    client.unary(&path, request).await.unwrap_or_else(|e| panic!("{e}"))
}

/// The proxy's CPU time in nanoseconds after `f`, less before, and after the post stages ran.
async fn cpu_of<F: std::future::Future<Output = ()>>(pid: u32, f: F) -> u64 {
    let before = test_support::cpu_ns(pid);
    f.await;
    // post stages run after the answer: let them finish
    tokio::time::sleep(Duration::from_millis(200)).await;
    test_support::cpu_ns(pid) - before
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events: usize = std::env::var("RP_BENCH_SCALE_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    // The proxy's log as a node runs it (its default filter), unless RP_TEST_LOG says otherwise:
    // at the tests' debug level, writing the log lines took a third of the own time measured.
    if std::env::var_os("RP_TEST_LOG").is_none() {
        std::env::set_var("RP_TEST_LOG", "info");
    }
    let hook = TestHook::echoing(|_, _| {}).await;
    let mut rows = Vec::new();
    let sizes: Vec<usize> = match std::env::var("RP_BENCH_SIZES") {
        Ok(v) => v.split(',').map(|s| s.trim().parse().expect("RP_BENCH_SIZES: pod counts, comma-separated")).collect(),
        Err(_) => SIZES.to_vec(),
    };
    for pods in sizes {
        let node = NodeServer::start(&NodeShape { pods, per_pod: PER_POD, pod_annotation_bytes: 0 });
        let dir = tempfile::Builder::new().prefix("rp-cri-large-node").tempdir().unwrap();
        let hooks = dir.path().join("hooks");
        std::fs::create_dir(&hooks).unwrap();
        register(&hooks, "noop.json", hook.socket(), "Ignore", &Stage::ALL.map(Stage::as_str), json!({}));
        let metrics = test_support::free_loopback_addr();
        let hooks_flag = hooks.display().to_string();
        let extra = ["--hook-config-dir", &hooks_flag, "--metrics-addr", &metrics];
        let mut proxy = ProxyProcess::spawn(
            BIN,
            &dir.path().join("proxy.sock"),
            &node.socket,
            &extra,
            dir.path().join("proxy.log"),
        );
        proxy.wait_ready();
        assert!(proxy.wait_log(&["store recovered"], 0), "no recovery:\n{}", proxy.log());
        let pid = proxy.pid();
        let client = KubeletClient::connect(&dir.path().join("proxy.sock")).await.expect("connect to the proxy");

        let create_before = own_buckets(&metrics, "PreCreateContainer");
        let update_before = own_buckets(&metrics, "PreUpdateContainerResources");
        let lifecycle = cpu_of(pid, async {
            for i in 0..events {
                let config = sandbox_config(pods * 10 + i);
                let run = cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
                let sandbox_id =
                    call::<cri::RunPodSandboxResponse>(&client, "RunPodSandbox", &run).await.pod_sandbox_id;
                let create = cri::CreateContainerRequest {
                    pod_sandbox_id: sandbox_id.clone(),
                    config: Some(cri::ContainerConfig {
                        metadata: Some(cri::ContainerMetadata { name: "c0".into(), attempt: 0 }),
                        envs: vec![cri::KeyValue { key: "PATH".into(), value: "/usr/bin:/bin".into() }],
                        linux: Some(cri::LinuxContainerConfig {
                            resources: Some(resources(512)),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    sandbox_config: Some(config),
                };
                let id = call::<cri::CreateContainerResponse>(&client, "CreateContainer", &create).await.container_id;
                let start = cri::StartContainerRequest { container_id: id.clone() };
                call::<cri::StartContainerResponse>(&client, "StartContainer", &start).await;
                let update = cri::UpdateContainerResourcesRequest {
                    container_id: id.clone(),
                    linux: Some(resources(600)),
                    ..Default::default()
                };
                call::<cri::UpdateContainerResourcesResponse>(&client, "UpdateContainerResources", &update).await;
                let stop = cri::StopContainerRequest { container_id: id.clone(), timeout: 0 };
                call::<cri::StopContainerResponse>(&client, "StopContainer", &stop).await;
                let remove = cri::RemoveContainerRequest { container_id: id };
                call::<cri::RemoveContainerResponse>(&client, "RemoveContainer", &remove).await;
                let stop = cri::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() };
                call::<cri::StopPodSandboxResponse>(&client, "StopPodSandbox", &stop).await;
                let remove = cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id };
                call::<cri::RemovePodSandboxResponse>(&client, "RemovePodSandbox", &remove).await;
            }
        })
        .await;
        let create_own = p50_us(&create_before, &own_buckets(&metrics, "PreCreateContainer"));
        let lifecycle_update_own = p50_us(&update_before, &own_buckets(&metrics, "PreUpdateContainerResources"));

        let existing: Vec<String> =
            node.node.pods.iter().flat_map(|p| p.containers.iter().map(|c| c.id.clone())).collect();
        let update_before = own_buckets(&metrics, "PreUpdateContainerResources");
        let updates = cpu_of(pid, async {
            for i in 0..events {
                // spread over the node: every container of a small node, a stride through a large one
                let id = existing[(i * 997) % existing.len()].clone();
                let update = cri::UpdateContainerResourcesRequest {
                    container_id: id,
                    linux: Some(resources(700 + i as i64)),
                    ..Default::default()
                };
                call::<cri::UpdateContainerResourcesResponse>(&client, "UpdateContainerResources", &update).await;
            }
        })
        .await;
        let update_own = p50_us(&update_before, &own_buckets(&metrics, "PreUpdateContainerResources"));
        assert!(!proxy.log().contains("store miss"), "a recovered container was not in the store:\n{}", proxy.log());
        rows.push((pods, lifecycle, create_own, lifecycle_update_own, updates, update_own));
        drop(proxy);
    }
    println!(
        "### The CRI proxy on a large node (stand-in runtime, {PER_POD} containers per pod, one no-op hook server at all \
         seven stages) — `cargo bench -p runtime-proxy --bench cri_large_node`; {} CPUs, load average {}\n",
        common::cpus(),
        loadavg()
    );
    println!(
        "| pods stored | containers stored | CPU per pod created and removed (µs; 8 calls, 7 hooked) | own time p50, \
         PreCreateContainer (µs) | own time p50, PreUpdateContainerResources of a new container (µs) | CPU per update of a \
         recovered container (µs) | own time p50, its PreUpdateContainerResources (µs) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for (pods, lifecycle, create_own, lifecycle_update_own, updates, update_own) in rows {
        println!(
            "| {pods} | {} | {:.0} | {create_own:.1} | {lifecycle_update_own:.1} | {:.0} | {update_own:.1} |",
            pods * PER_POD,
            lifecycle as f64 / events as f64 / 1e3,
            updates as f64 / events as f64 / 1e3,
        );
    }
    println!("\n({events} pods created and removed, and {events} updates, per size: RP_BENCH_SCALE_EVENTS)");
}
