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

use std::time::Duration;

use nri_plugin::proto::api::Event;
use serde_json::json;
use test_support::hooks::{register, start_nri_front, TestHook};
use test_support::nri_runtime::{pod_level, Delivered, NriRuntime};
use test_support::scale;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const SIZES: [usize; 3] = [10, 100, 1000];
const PER_POD: usize = 4;

/// The cumulative bucket counts (upper bound in seconds, count) of the own-time histogram of
/// `stage` on the metrics endpoint `addr`.
fn own_buckets(addr: &str, stage: &str) -> Vec<(f64, u64)> {
    let (_, body) = test_support::http_get(addr, "/metrics");
    let mut out: Vec<(f64, u64)> = body
        .lines()
        .filter(|l| l.starts_with("runtime_proxy_hooked_call_own_duration_seconds_bucket{"))
        .filter(|l| l.contains(&format!("stage=\"{stage}\"")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The median of the observations between two scrapes of [`own_buckets`], in microseconds,
/// interpolated linearly within its bucket.
fn p50_us(before: &[(f64, u64)], after: &[(f64, u64)]) -> f64 {
    let count = |v: &[(f64, u64)], i: usize| v.get(i).map_or(0, |b| b.1);
    let total = count(after, after.len().saturating_sub(1)) - count(before, before.len().saturating_sub(1));
    let half = total as f64 / 2.0;
    let mut lower = (0.0, 0u64);
    for (i, (le, n)) in after.iter().enumerate() {
        let n = n - count(before, i);
        if n as f64 >= half && n > 0 {
            let (lo, below) = lower;
            let hi = if le.is_finite() { *le } else { lo * 2.0 };
            let within = (half - below as f64) / (n - below).max(1) as f64;
            return (lo + (hi - lo) * within) * 1e6;
        }
        lower = (*le, n);
    }
    0.0
}

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
        let proxy = start_nri_front(BIN, runtime.socket(), dir.path(), &["--metrics-addr", &metrics], "warn");
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
