//! The NRI front end (`runtime-proxy --frontend nri`) on nodes of 10, 100 and 1,000 pods × 4
//! containers (the pod mix of `test_support::scale`), against the NRI runtime stand-in
//! (`test_support::nri_runtime`, NRI 0.12, Synchronize split as NRI splits it), with one no-op
//! hook server (an echoing tonic server) registered at PreCreateContainer. For each size:
//!
//! * **Synchronize**: the messages' sizes and parts, the time from the first part sent to the
//!   answer, and the proxy's CPU time for it (it rebuilds its store: no hook runs on existing
//!   containers, and nothing is answered);
//! * **per pod created / removed**: the proxy's CPU per new pod (RunPodSandbox, CreateContainer
//!   with its hook call, StartContainer, PostStartContainer of one container) and per pod removed
//!   (StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox), over
//!   `RP_BENCH_SCALE_EVENTS` pods (default 200) — flat when no per-event work grows with the node.
//!   The front end subscribes only to CreateContainer, RemoveContainer and RemovePodSandbox of
//!   these for its one PreCreateContainer server (`runtime_proxy::nri::subscribe`): the stand-in
//!   does not send it the others.
//!
//! CPU time is the sum of the proxy's threads' time on CPU (`/proc/PID/task/*/schedstat`,
//! nanoseconds). Beside it, the proxy's own time per hooked CreateContainer (its
//! `runtime_proxy_hooked_call_own_duration_seconds{stage="PreCreateContainer"}` histogram, from
//! the pod's turn to the answer less the hook call: p50 interpolated within the buckets).
//!
//! Run: `make bench`, or `cargo bench -p runtime-proxy --bench nri_large_node` (no runtime
//! needed).

mod common;

use std::time::Duration;

use nri_plugin::proto::api::Event;
use serde_json::json;
use test_support::hooks::{register, start_nri_front, TestHook};
use test_support::nri_runtime::{pod_level, Delivered, NriRuntime};
use test_support::scale;

use common::{own_buckets, p50_us};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const SIZES: [usize; 3] = [10, 100, 1000];
const PER_POD: usize = 4;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let events: usize = std::env::var("RP_BENCH_SCALE_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let hook = TestHook::echoing(|_, _| {}).await;
    let mut rows = Vec::new();
    for pods in SIZES {
        let dir = tempfile::Builder::new().prefix("rp-large-node").tempdir().unwrap();
        register(dir.path(), "noop.json", hook.socket(), "Ignore", &["PreCreateContainer"], json!({}));
        let (all_pods, containers) = scale::nri_node(pods, PER_POD);
        let runtime = NriRuntime::v0_12().unwrap();
        let metrics = test_support::free_loopback_addr();
        let proxy = start_nri_front(BIN, runtime.socket(), dir.path(), &["--metrics-addr", &metrics], "info");
        let pid = proxy.0.id();
        let log = || std::fs::read_to_string(dir.path().join("proxy.log")).unwrap_or_default();
        // the proxy's start-up is not Synchronize's
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = test_support::cpu_ns(pid);
        let mut plugin = runtime.accept(all_pods, containers).await.unwrap_or_else(|e| panic!("{e}\n{}", log()));
        let sync_cpu = test_support::cpu_ns(pid) - before;
        let extra: Vec<_> = (pods..pods + events).map(|i| scale::nri_pod(i, 1)).collect();
        let create = [Event::RunPodSandbox, Event::CreateContainer, Event::StartContainer, Event::PostStartContainer];
        let remove = [Event::StopContainer, Event::RemoveContainer, Event::StopPodSandbox, Event::RemovePodSandbox];
        let mut cpu = [0u64; 2];
        let own_before = own_buckets(&metrics, "PreCreateContainer");
        for (n, phase) in [create, remove].iter().enumerate() {
            let before = test_support::cpu_ns(pid);
            for (i, pod) in extra.iter().enumerate() {
                let c = scale::nri_container(pods + i, 0, pod);
                for event in phase {
                    match plugin.deliver(*event, pod, (!pod_level(*event)).then_some(&c)).await.unwrap() {
                        Ok(Delivered::Answered(..) | Delivered::NotSubscribed) => {}
                        Err(s) => panic!("{event:?}: {s:?}\n{}", log()),
                    }
                }
            }
            // post stages run after the answer: let them finish
            tokio::time::sleep(Duration::from_millis(200)).await;
            cpu[n] = test_support::cpu_ns(pid) - before;
        }
        let own = p50_us(&own_before, &own_buckets(&metrics, "PreCreateContainer"));
        rows.push((
            pods,
            plugin.sync.request_bytes.len(),
            plugin.sync.request_bytes.iter().sum::<usize>() as f64 / 1024.0,
            plugin.sync.elapsed.as_secs_f64() * 1e3,
            sync_cpu as f64 / 1e6,
            cpu[0] as f64 / events as f64 / 1e3,
            cpu[1] as f64 / events as f64 / 1e3,
            own,
        ));
        plugin.close().await;
        drop(proxy);
    }
    println!("runtime-proxy --frontend nri on a large node ({PER_POD} containers per pod; one no-op hook at PreCreateContainer; stand-in runtime, NRI 0.12)\n");
    println!("| pods | containers | Synchronize parts | request KiB | wall ms | proxy CPU ms | CPU per pod created (µs) | CPU per pod removed (µs) | own time per hooked CreateContainer, p50 (µs) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (pods, parts, kib, wall, cpu, create, remove, own) in rows {
        println!(
            "| {pods} | {} | {parts} | {kib:.0} | {wall:.1} | {cpu:.1} | {create:.0} | {remove:.0} | {own:.1} |",
            pods * PER_POD
        );
    }
    println!("\n({events} pods created and removed per size: RP_BENCH_SCALE_EVENTS)");
}
