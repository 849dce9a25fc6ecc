//! runtime-hooks' NRI mode on nodes of 10, 100 and 1,000 pods × 4 containers (the pod mix of
//! `test_support::scale`: half BE, 4 in 10 LS, 1 in 10 LSR), against the NRI runtime stand-in
//! (`test_support::nri_runtime`, NRI 0.12, Synchronize split as NRI splits it), the pod cgroups in
//! a v1 tree in a temp directory. For each size:
//!
//! * **Synchronize, fresh**: the containers hold kubelet's values; the messages' sizes and parts,
//!   the updates answered (only what differs), the time from the first part sent to the answer,
//!   and runtime-hooks' CPU time for it;
//! * **Synchronize, again**: runtime-hooks connects again to a runtime that applied those
//!   updates (as after a restart of runtime-hooks): the same figures, with no update to answer;
//! * **per pod created**: runtime-hooks' CPU per new pod (RunPodSandbox, CreateContainer,
//!   StartContainer, PostStartContainer of one container) and per pod removed (StopContainer,
//!   RemoveContainer, StopPodSandbox, RemovePodSandbox), over `RP_BENCH_SCALE_EVENTS` pods
//!   (default 200) — flat when no per-event work grows with the node.
//!
//! * **memory**: runtime-hooks' RSS when started and after Synchronize (again), and per pod. The
//!   daemon runs with mimalloc told to give freed pages back at once (`MIMALLOC_PURGE_DELAY=0`,
//!   `MIMALLOC_PURGE_DECOMMITS=1`), so that the RSS is what it keeps, not the peak of decoding
//!   Synchronize (by default mimalloc keeps freed pages a while, and the kernel leaves the ones it
//!   frees lazily in the RSS until it needs them).
//!
//! Then the same in **proxy mode**: runtime-hooks serving the hook protocol (`--listen`), asked
//! about every pod of the node as runtime-proxy asks (PreRunPodSandbox; PreCreateContainer,
//! PreStartContainer and PostStartContainer of each container), node size by node size; its RSS
//! per pod so asked, and its CPU per pod created (those four stages of one container) and removed
//! (PostStopContainer, PostStopPodSandbox) on each size.
//!
//! CPU time is the sum of runtime-hooks' threads' time on CPU (`/proc/PID/task/*/schedstat`,
//! nanoseconds), independent of how this VM wakes idle CPUs.
//!
//! Run: `make bench`, or `cargo bench -p runtime-hooks --bench large_node` (no runtime needed).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{start_nri_v1, Hooks};
use hook_api::RuntimeHookServiceClient;
use nri_plugin::proto::api::Event;
use test_support::nri_runtime::{Delivered, NriRuntime};
use test_support::scale;

const SIZES: [usize; 3] = [10, 100, 1000];
const PER_POD: usize = 4;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

struct Row {
    pods: usize,
    what: &'static str,
    parts: usize,
    request_kib: f64,
    answer_kib: f64,
    updates: usize,
    wall_ms: f64,
    cpu_ms: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events: usize = std::env::var("RP_BENCH_SCALE_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    // runtime-hooks' RSS as what it keeps (see the module doc); read by mimalloc at its start
    std::env::set_var("MIMALLOC_PURGE_DELAY", "0");
    std::env::set_var("MIMALLOC_PURGE_DECOMMITS", "1");
    let (mut rows, mut per_event, mut memory) = (Vec::new(), Vec::new(), Vec::new());
    for pods in SIZES {
        let dir = tempfile::Builder::new().prefix("rh-large-node").tempdir().unwrap();
        let (all_pods, mut containers) = scale::nri_node(pods, PER_POD);
        let extra: Vec<_> = (pods..pods + events).map(|i| scale::nri_pod(i, 1)).collect();
        scale::cgroup_v1_tree(&dir.path().join("cgroup"), &all_pods).unwrap();
        scale::cgroup_v1_tree(&dir.path().join("cgroup"), &extra).unwrap();
        let runtime = NriRuntime::v0_12().unwrap();
        let hooks = start_nri_v1(runtime.socket(), dir.path(), "warn");
        let pid = hooks.pid();
        // started, not yet connected
        tokio::time::sleep(Duration::from_millis(300)).await;
        let rss_started = test_support::rss_kib(pid);
        for what in ["Synchronize, fresh", "Synchronize, again"] {
            let before = test_support::cpu_ns(pid);
            let plugin = runtime
                .accept(all_pods.clone(), containers.clone())
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
            let cpu = test_support::cpu_ns(pid) - before;
            rows.push(Row {
                pods,
                what,
                parts: plugin.sync.request_bytes.len(),
                request_kib: plugin.sync.request_bytes.iter().sum::<usize>() as f64 / 1024.0,
                answer_kib: plugin.sync.answer_bytes as f64 / 1024.0,
                updates: plugin.sync.answered.len(),
                wall_ms: plugin.sync.elapsed.as_secs_f64() * 1e3,
                cpu_ms: ms(cpu),
            });
            scale::updated(&mut containers, &plugin.sync.answered);
            if what == "Synchronize, again" {
                memory.push((pods, rss_started, test_support::rss_kib(pid)));
            }
            if what == "Synchronize, fresh" {
                plugin.close().await;
                continue;
            }
            // Pods created and removed on the node of this size.
            let mut plugin = plugin;
            let create =
                [Event::RunPodSandbox, Event::CreateContainer, Event::StartContainer, Event::PostStartContainer];
            let remove = [Event::StopContainer, Event::RemoveContainer, Event::StopPodSandbox, Event::RemovePodSandbox];
            let mut cpu = [0u64; 2];
            for (n, events_of) in [create, remove].iter().enumerate() {
                let before = test_support::cpu_ns(pid);
                for (i, pod) in extra.iter().enumerate() {
                    let c = scale::nri_container(pods + i, 0, pod);
                    for event in events_of {
                        let container = (!test_support::nri_runtime::pod_level(*event)).then_some(&c);
                        match plugin.deliver(*event, pod, container).await.unwrap() {
                            Ok(Delivered::Answered(..) | Delivered::NotSubscribed) => {}
                            Err(s) => panic!("{event:?}: {s:?}\n{}", hooks.log()),
                        }
                    }
                }
                cpu[n] = test_support::cpu_ns(pid) - before;
            }
            per_event.push((pods, cpu[0] as f64 / events as f64 / 1e3, cpu[1] as f64 / events as f64 / 1e3));
            plugin.close().await;
        }
        drop(hooks);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("runtime-hooks NRI mode on a large node ({PER_POD} containers per pod; stand-in runtime, NRI 0.12)\n");
    println!(
        "| pods | containers | call | parts | request KiB | answer KiB | updates | wall ms | runtime-hooks CPU ms |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1} | {} | {:.1} | {:.1} |",
            r.pods,
            r.pods * PER_POD,
            r.what,
            r.parts,
            r.request_kib,
            r.answer_kib,
            r.updates,
            r.wall_ms,
            r.cpu_ms
        );
    }
    println!("\n| pods on the node | CPU per pod created (µs) | CPU per pod removed (µs) |");
    println!("|---:|---:|---:|");
    for (pods, create, remove) in per_event {
        println!("| {pods} | {create:.0} | {remove:.0} |");
    }
    println!("\n| pods | RSS started (KiB) | RSS after Synchronize (KiB; freed pages given back) | per pod (KiB) |");
    println!("|---:|---:|---:|---:|");
    for (pods, started, synced) in memory {
        println!("| {pods} | {started} | {synced} | {:.1} |", (synced as f64 - started as f64) / pods as f64);
    }
    println!("\n({events} pods created and removed per size: RP_BENCH_SCALE_EVENTS)");
    proxy_mode(events).await;
}

/// runtime-hooks in proxy mode over the cgroup tree `dir/cgroup`, listening on `dir/hooks.sock`,
/// registering in `dir/hookserver.d`.
fn start_proxy_mode(dir: &std::path::Path) -> Hooks {
    let (socket, config, cgroups) = (dir.join("hooks.sock"), dir.join("hookserver.d"), dir.join("cgroup"));
    std::fs::create_dir_all(&config).unwrap();
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "cpu: {}\n").unwrap();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let args = [
        "--listen".to_owned(),
        path(&socket),
        "--hook-config-dir".into(),
        path(&config),
        "--rules".into(),
        path(&rules),
        "--cgroup-root".into(),
        path(&cgroups),
        "--cgroup-version".into(),
        "v1".into(),
        "--unchecked-cgroup-root".into(),
        "--cgroup-driver".into(),
        "cgroupfs".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let hooks = Hooks::start_logging(&args, dir.join("hooks.log"), "warn");
    let start = std::time::Instant::now();
    while !config.join("runtime-hooks.json").exists() {
        assert!(start.elapsed() < Duration::from_secs(10), "not registered:\n{}", hooks.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    hooks
}

/// Pod `i` with `per_pod` containers asked about as runtime-proxy asks when it is created.
async fn create_hooked(client: &mut RuntimeHookServiceClient<tonic::transport::Channel>, i: usize, per_pod: usize) {
    let pod = scale::nri_pod(i, per_pod);
    client.pre_run_pod_sandbox_hook(scale::hook_pod(&pod)).await.expect("PreRunPodSandbox");
    for c in 0..per_pod {
        let request = scale::hook_container(&scale::nri_container(i, c, &pod), &pod);
        client.pre_create_container_hook(request.clone()).await.expect("PreCreateContainer");
        client.pre_start_container_hook(request.clone()).await.expect("PreStartContainer");
        client.post_start_container_hook(request).await.expect("PostStartContainer");
    }
}

async fn proxy_mode(events: usize) {
    let dir = tempfile::Builder::new().prefix("rh-large-node-proxy").tempdir().unwrap();
    let top = *SIZES.last().unwrap();
    let all: Vec<_> = (0..top + events).map(|i| scale::nri_pod(i, PER_POD)).collect();
    scale::cgroup_v1_tree(&dir.path().join("cgroup"), &all).unwrap();
    let hooks = start_proxy_mode(dir.path());
    let pid = hooks.pid();
    let mut client = RuntimeHookServiceClient::new(hook_api::connect(dir.path().join("hooks.sock")));
    // one call to connect, then the RSS before any pod
    create_hooked(&mut client, top + events, 0).await;
    let rss_started = test_support::rss_kib(pid);
    let (mut filled, mut rows) = (0, Vec::new());
    for pods in SIZES {
        for i in filled..pods {
            create_hooked(&mut client, i, PER_POD).await;
        }
        filled = pods;
        let rss = test_support::rss_kib(pid);
        let before = test_support::cpu_ns(pid);
        for i in top..top + events {
            create_hooked(&mut client, i, 1).await;
        }
        let created = test_support::cpu_ns(pid) - before;
        let before = test_support::cpu_ns(pid);
        for i in top..top + events {
            let pod = scale::nri_pod(i, 1);
            let request = scale::hook_container(&scale::nri_container(i, 0, &pod), &pod);
            client.post_stop_container_hook(request).await.expect("PostStopContainer");
            client.post_stop_pod_sandbox_hook(scale::hook_pod(&pod)).await.expect("PostStopPodSandbox");
        }
        let removed = test_support::cpu_ns(pid) - before;
        rows.push((pods, rss, created as f64 / events as f64 / 1e3, removed as f64 / events as f64 / 1e3));
    }
    println!(
        "\nruntime-hooks proxy mode on a large node ({PER_POD} containers per pod; asked as runtime-proxy asks)\n"
    );
    println!("| pods asked about | RSS (KiB; {rss_started} before any pod) | per pod (KiB) | CPU per pod created (µs) | CPU per pod removed (µs) |");
    println!("|---:|---:|---:|---:|---:|");
    for (pods, rss, created, removed) in rows {
        let per_pod = (rss as f64 - rss_started as f64) / pods as f64;
        println!("| {pods} | {rss} | {per_pod:.1} | {created:.0} | {removed:.0} |");
    }
    drop(hooks);
}
