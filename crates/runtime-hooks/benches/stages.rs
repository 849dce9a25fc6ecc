//! Per-stage overhead on a real containerd: each hooked CRI call of a pod's life, timed over
//! four paths, pod by pod interleaved (the path order rotated each pod):
//!
//! 1. **direct** on containerd;
//! 2. through runtime-proxy with **no hook** registered;
//! 3. through a second runtime-proxy with **one no-op hook** (an echoing tonic server, as
//!    koordlet answers with nothing to change) registered at all seven stages;
//! 4. through a third runtime-proxy with **runtime-hooks** (proxy mode, its default stages:
//!    PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources; BatchResource,
//!    GroupIdentity, CPUSet on) — at the other stages this path has no hook.
//!
//! A pod's life: RunPodSandbox (PreRunPodSandbox), CreateContainer (PreCreateContainer),
//! StartContainer (PreStartContainer and PostStartContainer), UpdateContainerResources
//! (PreUpdateContainerResources), StopContainer (PostStopContainer), StopPodSandbox
//! (PostStopPodSandbox); then the sandbox is removed directly on containerd, untimed. Every pod is
//! a Koordinator BE pod (runtime-hooks has work to do) with a busybox `sleep` container; its pod
//! cgroup is made first, as kubelet does.
//!
//! Run: `make bench`, or `RP_CONTAINERD_ENV=ROOT/env cargo bench -p runtime-hooks --bench stages`
//! after `cargo build --release -p runtime-proxy`. `RP_BENCH_STAGE_PODS` sets the pods per path
//! (default 20).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{map, precreate_pod_cgroup, Hooks, BE_SPEC, QOS, SPEC};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

/// Label on every bench pod sandbox (value: this process's pid), to find and remove them.
const BENCH_LABEL: &str = "runtime-hooks-stage-bench";
const PATHS: [&str; 4] = ["direct", "proxy, no hook", "proxy, no-op hook", "proxy, runtime-hooks"];
/// The timed calls of a pod's life and the stages each runs.
const CALLS: [(&str, &str); 6] = [
    ("RunPodSandbox", "PreRunPodSandbox"),
    ("CreateContainer", "PreCreateContainer"),
    ("StartContainer", "PreStartContainer, PostStartContainer"),
    ("UpdateContainerResources", "PreUpdateContainerResources"),
    ("StopContainer", "PostStopContainer"),
    ("StopPodSandbox", "PostStopPodSandbox"),
];
const ALL_STAGES: [&str; 7] = [
    "PreRunPodSandbox",
    "PostStopPodSandbox",
    "PreCreateContainer",
    "PreStartContainer",
    "PostStartContainer",
    "PostStopContainer",
    "PreUpdateContainerResources",
];

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::var_os("RP_CONTAINERD_ENV").is_none() {
        println!("(per-stage overhead: skipped, RP_CONTAINERD_ENV is not set; `make bench` sets it)");
        return;
    }
    let env = Containerd::from_env();
    let pods: usize = std::env::var("RP_BENCH_STAGE_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    // info: the registry's "hook server added" line, and no line per call.
    std::env::set_var("RP_TEST_LOG", "info");
    let dir = tempfile::Builder::new().prefix("rh-bench-stages").tempdir().expect("temp dir");
    let proxy_bin = test_support::workspace_binary("runtime-proxy");
    let proxy = |name: &str| {
        let conf = dir.path().join(name);
        std::fs::create_dir(&conf).expect("hook config dir");
        let p = ProxyProcess::start(
            proxy_bin.to_str().expect("utf-8 path"),
            &env.socket,
            &["--hook-config-dir", conf.to_str().expect("utf-8")],
        );
        (p, conf)
    };
    let (plain, _) = proxy("plain.d");
    let (noop_proxy, noop_conf) = proxy("noop.d");
    let (rh_proxy, rh_conf) = proxy("rh.d");
    let noop = TestHook::echoing(|_, _| {}).await;
    register(&noop_conf, "noop.json", noop.socket(), "Fail", &ALL_STAGES, serde_json::json!({}));
    assert!(
        noop_proxy.wait_log(&["hook server added", "file=noop.json"], 0),
        "no-op hook not taken up:\n{}",
        noop_proxy.log()
    );
    let socket = dir.path().join("runtime-hooks.sock");
    let args = ["--listen", socket.to_str().expect("utf-8"), "--hook-config-dir", rh_conf.to_str().expect("utf-8")];
    let _hooks = Hooks::start_logging(&args, dir.path().join("hooks.log"), "info");
    assert!(
        rh_proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "runtime-hooks not taken up:\n{}",
        rh_proxy.log()
    );

    let containerd = runtime_client(&env.socket);
    let clients = [
        containerd.clone(),
        runtime_client(plain.socket()),
        runtime_client(noop_proxy.socket()),
        runtime_client(rh_proxy.socket()),
    ];
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // samples[path][call]
    let mut samples = vec![vec![Vec::with_capacity(pods); CALLS.len()]; PATHS.len()];
    let mut parents = vec![];
    // One warm-up pod per path.
    for i in 0..=pods {
        for k in 0..PATHS.len() {
            let p = (i + k) % PATHS.len();
            let (times, parent) = life(&env, clients[p].clone(), &containerd).await;
            parents.push(parent);
            if i > 0 {
                for (c, t) in times.into_iter().enumerate() {
                    samples[p][c].push(t);
                }
            }
        }
    }
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    remove_bench_pods(&containerd).await;
    remove_pod_cgroups(&parents);
    assert!(noop.seen().len() >= 7 * pods, "the no-op hook saw {} calls", noop.seen().len());

    println!(
        "### Per-stage overhead — `cargo bench -p runtime-hooks --bench stages` ({pods} BE pods per path, interleaved, after one warm-up pod per path)"
    );
    println!();
    println!("load average before: {}; after: {}", load_before.trim(), load_after.trim());
    println!();
    let header: Vec<String> = PATHS.iter().map(|p| format!("{p} p50 / p99")).collect();
    println!("| call (stages) | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(PATHS.len()));
    for (c, (call, stages)) in CALLS.iter().enumerate() {
        let cells: Vec<String> = (0..PATHS.len())
            .map(|p| {
                let mut s = samples[p][c].clone();
                s.sort();
                format!("{:.1} / {:.1} ms", ms(percentile(&s, 0.5)), ms(percentile(&s, 0.99)))
            })
            .collect();
        println!("| {call} ({stages}) | {} |", cells.join(" | "));
    }
    println!();
    println!("runtime-hooks registers at PreRunPodSandbox, PreCreateContainer and PreUpdateContainerResources only: at the other stages its path has no hook.");
}

/// One BE pod's life through `client`: the six timed calls; the sandbox removed on `containerd`
/// after. Returns the times and the pod's cgroup parent.
async fn life(
    env: &Containerd,
    mut client: RuntimeServiceClient<Channel>,
    containerd: &RuntimeServiceClient<Channel>,
) -> (Vec<Duration>, String) {
    let pid = std::process::id().to_string();
    let sandbox =
        sandbox_config(env, &unique("stage"), map(&[(QOS, "BE"), (BENCH_LABEL, &pid)]), map(&[(SPEC, BE_SPEC)]));
    let parent = sandbox.linux.as_ref().expect("linux config").cgroup_parent.clone();
    precreate_pod_cgroup(&parent);
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
    let mut times = vec![];
    let t = Instant::now();
    let sandbox_id = client
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox.clone()), ..Default::default() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    times.push(t.elapsed());
    let t = Instant::now();
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.clone(),
        config: Some(container),
        sandbox_config: Some(sandbox),
    };
    let container_id = client.create_container(create).await.expect("CreateContainer").into_inner().container_id;
    times.push(t.elapsed());
    let t = Instant::now();
    client
        .start_container(cri::StartContainerRequest { container_id: container_id.clone() })
        .await
        .expect("StartContainer");
    times.push(t.elapsed());
    let t = Instant::now();
    let linux = cri::LinuxContainerResources { cpu_shares: 4, cpu_period: 100_000, ..Default::default() };
    let update = cri::UpdateContainerResourcesRequest {
        container_id: container_id.clone(),
        linux: Some(linux),
        ..Default::default()
    };
    client.update_container_resources(update).await.expect("UpdateContainerResources");
    times.push(t.elapsed());
    let t = Instant::now();
    client.stop_container(cri::StopContainerRequest { container_id, timeout: 0 }).await.expect("StopContainer");
    times.push(t.elapsed());
    let t = Instant::now();
    client
        .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() })
        .await
        .expect("StopPodSandbox");
    times.push(t.elapsed());
    remove_sandbox(&mut containerd.clone(), &sandbox_id).await;
    (times, parent)
}

/// Removes every pod sandbox carrying this run's label, directly on containerd. Best effort.
async fn remove_bench_pods(containerd: &RuntimeServiceClient<Channel>) {
    let filter = cri::PodSandboxFilter {
        label_selector: HashMap::from([(BENCH_LABEL.to_owned(), std::process::id().to_string())]),
        ..Default::default()
    };
    let Ok(list) = containerd.clone().list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await
    else {
        return;
    };
    for s in list.into_inner().items {
        remove_sandbox(&mut containerd.clone(), &s.id).await;
    }
}

/// Removes the pods' cgroup directories (kubelet would), in every hierarchy; best effort.
fn remove_pod_cgroups(parents: &[String]) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let hierarchies: Vec<std::path::PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
    for parent in parents {
        for h in &hierarchies {
            rmdir_tree(&h.join(parent.trim_start_matches('/')));
        }
    }
}

fn rmdir_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                rmdir_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}
