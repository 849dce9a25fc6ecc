//! The store at 1,000 pods, against a stand-in runtime (`test_support::fake_node`: pods and
//! containers described as containerd 1.7 describes them, every answer encoded beforehand), for
//! sizes a 2-core test machine cannot run for real:
//!
//! * restart recovery: the release proxy's own `store recovered … in N ms` line after a start on
//!   a node of 200 pods × 1 container and of 1,000 pods × 4 containers (median of
//!   `RP_BENCH_ROUNDS` starts, default 5), and `recover::rebuild` in process (the same runtime
//!   flavour as the proxy's: one thread);
//! * the store's memory (bytes allocated and kept, counted by this bench's allocator): per pod sandbox and per
//!   container, at 1,000 pods × 4 containers, with kubelet-sized pods and with 8 KiB of pod annotations (16 KiB would
//!   make ListPodSandbox exceed kubelet's 16 MiB answer limit) — per container it must not grow with the pod's size.
//!
//! The stand-in runs on a thread and runtime of its own (as a runtime in its own process would).
//!
//! Run: `cargo bench -p runtime-proxy --bench node_scale` (no containerd needed; in `make bench`).
//! `RP_BENCH_COMPARE=PATH` also starts this build's proxy and the proxy binary at PATH (a build of
//! another commit) in turn on the node of 1,000 pods × 4 containers, and prints both.
//! `RP_BENCH_SERVE=N` only serves a node of N pods × 4 containers, printing its socket, until
//! killed: to profile a proxy started by hand against it (`perf record -g runtime-proxy
//! --remote-runtime-service-endpoint unix://SOCKET …`).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runtime_proxy::cri::recover::rebuild;
use runtime_proxy::grpc::backend::Backend;
use runtime_proxy::hooks::store::Store;
use test_support::fake_node::NodeShape;
use test_support::proxy::ProxyProcess;

use common::NodeServer;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// Counts the bytes the main thread and its runtime's blocking threads (where the store is built)
/// have allocated and not freed; the stand-in's thread (its call log) is not counted.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn counted() -> bool {
    COUNTED.try_with(Cell::get).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counted() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if counted() {
            LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn env_var(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(default)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One start of the proxy `bin` on `node` (socket and log in `dir`, numbered `r`): the `N ms` of
/// its `store recovered` line, its CPU time from its start to that line (all threads), its peak
/// RSS then (`VmHWM`, KiB), and the line.
fn one_start(bin: &str, node: &NodeServer, dir: &std::path::Path, r: usize) -> ((Duration, Duration, u64), String) {
    let socket = dir.join(format!("proxy-{r}.sock"));
    let log = dir.join(format!("proxy-{r}.log"));
    let mut proxy = ProxyProcess::spawn(bin, &socket, &node.socket, &[], log);
    assert!(proxy.wait_log(&["store recovered"], 0), "no recovery line:\n{}", proxy.log());
    let cpu = Duration::from_nanos(common::usage(proxy.pid(), false).0);
    let status = std::fs::read_to_string(format!("/proc/{}/status", proxy.pid())).unwrap_or_default();
    let hwm =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse().ok());
    let log = proxy.log();
    let line = log.lines().find(|l| l.contains("store recovered")).unwrap_or_default();
    let line = line[line.find("store recovered").unwrap_or(0)..].split(" why=").next().unwrap_or_default();
    let ms: u64 = line
        .rsplit(" in ")
        .next()
        .and_then(|t| t.trim_end_matches(" ms").parse().ok())
        .unwrap_or_else(|| panic!("no time in {line:?}"));
    let want = format!("{} pod sandboxes, {} containers", node.node.pods.len(), node.node.containers());
    assert!(line.contains(&want), "the proxy recovered less than the node has: {line} (want {want})");
    proxy.signal(libc::SIGKILL);
    proxy.wait_exit(Duration::from_secs(5));
    ((Duration::from_millis(ms), cpu, hwm.unwrap_or(0)), line.to_owned())
}

/// The release proxy started on `node`, `rounds` times ([`one_start`]): each start's recovery
/// time and CPU time, and the line of the median start.
fn proxy_recovery(node: &NodeServer, rounds: usize) -> (Vec<(Duration, Duration)>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut runs: Vec<_> = (0..rounds).map(|r| one_start(BIN, node, dir.path(), r)).collect();
    runs.sort_by_key(|r| r.0 .0);
    let line = runs[runs.len() / 2].1.clone();
    (runs.into_iter().map(|((ms, cpu, _), _)| (ms, cpu)).collect(), line)
}

/// `RP_BENCH_COMPARE=OTHER`: this build's proxy and the proxy binary `other` (e.g. a build of
/// another commit) started on `node` in turn, `rounds` times each, in one run; prints each one's
/// median recovery time, CPU time and peak RSS.
fn compare(node: &NodeServer, rounds: usize, other: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut results: [Vec<(Duration, Duration, u64)>; 2] = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        for (n, bin) in [BIN, other].into_iter().enumerate() {
            results[n].push(one_start(bin, node, dir.path(), 2 * r + n).0);
        }
    }
    println!("\nThis build against {other}, alternating, {rounds} starts each, load average {}:\n", common::loadavg());
    println!("| proxy | recovery, median (all) | CPU time to that line, median | peak RSS, median |");
    println!("|---|---|---|---|");
    for (name, runs) in [("this build", &results[0]), (other, &results[1])] {
        let all: Vec<String> = runs.iter().map(|r| r.0.as_millis().to_string()).collect();
        let mut hwm: Vec<u64> = runs.iter().map(|r| r.2).collect();
        hwm.sort_unstable();
        println!(
            "| {name} | {} ms ({}) | {} ms | {:.1} MiB |",
            median(runs.iter().map(|r| r.0).collect()).as_millis(),
            all.join(", "),
            median(runs.iter().map(|r| r.1).collect()).as_millis(),
            hwm[hwm.len() / 2] as f64 / 1024.0
        );
    }
}

/// `rounds` in-process rebuilds of `node` into an empty store (after one to warm the
/// connection): their times, and the bytes kept of the last one by the store of pods and
/// containers, and by a store of the same pods alone.
async fn rebuilds(node: &NodeServer, rounds: usize) -> (Vec<Duration>, isize, isize) {
    let runtime = Arc::new(Backend::new(&node.socket));
    let warm = Arc::new(Store::new());
    rebuild(&runtime, &warm).await.expect("rebuild");
    drop(warm);
    let mut times = Vec::new();
    let (mut all, mut pods_only) = (0, 0);
    for _ in 0..rounds {
        let before = LIVE.load(Ordering::Relaxed);
        let store = Arc::new(Store::new());
        let report = rebuild(&runtime, &store).await.expect("rebuild");
        assert_eq!((report.pods, report.containers), (node.node.pods.len(), node.node.containers()), "{report:?}");
        assert!(report.skipped.is_empty() && report.fallbacks.is_empty(), "{report:?}");
        times.push(report.elapsed);
        drop(report);
        all = LIVE.load(Ordering::Relaxed) - before;
        let ids = store.ids().0;
        let before = LIVE.load(Ordering::Relaxed);
        let pods = Store::new();
        for id in &ids {
            pods.put_pod(id, store.pod(id).expect("a listed pod"));
        }
        pods_only = LIVE.load(Ordering::Relaxed) - before;
        drop((store, pods, ids));
    }
    (times, all, pods_only)
}

fn main() {
    let rounds = env_var("RP_BENCH_ROUNDS", 5);
    COUNTED.with(|c| c.set(true));
    if let Ok(pods) = std::env::var("RP_BENCH_SERVE") {
        let pods = pods.parse().expect("RP_BENCH_SERVE: a number of pods");
        let node = NodeServer::start(&NodeShape { pods, per_pod: 4, pod_annotation_bytes: 0 });
        println!("{}", node.socket.display());
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    // The proxy's log as a node runs it (its default filter).
    std::env::set_var("RP_TEST_LOG", "info");
    // As the proxy runs: one thread.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(|| COUNTED.with(|c| c.set(true)))
        .build()
        .unwrap();
    let shapes = [
        NodeShape { pods: 200, per_pod: 1, pod_annotation_bytes: 0 },
        NodeShape { pods: 1000, per_pod: 4, pod_annotation_bytes: 0 },
        NodeShape { pods: 1000, per_pod: 4, pod_annotation_bytes: 8 << 10 },
    ];
    let (mut rows, mut comparison) = (Vec::new(), None);
    for shape in &shapes {
        let node = NodeServer::start(shape);
        let (proxy_times, line) =
            if shape.pod_annotation_bytes == 0 { proxy_recovery(&node, rounds) } else { (vec![], String::new()) };
        let (times, all, pods_only) = rt.block_on(rebuilds(&node, rounds));
        rows.push((shape.clone(), proxy_times, line, times, all, pods_only));
        if let (Ok(other), 1000, 4, 0) =
            (std::env::var("RP_BENCH_COMPARE"), shape.pods, shape.per_pod, shape.pod_annotation_bytes)
        {
            comparison = Some((node, other));
        }
    }

    println!(
        "### Store at 1,000 pods (stand-in runtime) — `cargo bench -p runtime-proxy --bench node_scale`; {} CPUs, load average {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!();
    println!(
        "| node | release proxy's recovery, median of {rounds} starts (all) | its CPU time to that line, median | `rebuild` in process, median of {rounds} | store per pod sandbox | store per container |"
    );
    println!("|---|---|---|---|---|---|");
    for (shape, proxy_times, line, times, all, pods_only) in rows {
        let n_containers = shape.pods * shape.per_pod;
        let per_container = (all - pods_only) as f64 / n_containers.max(1) as f64;
        let per_pod = pods_only as f64 / shape.pods as f64;
        let extra = if shape.pod_annotation_bytes > 0 {
            format!(", {} KiB of annotations per pod", shape.pod_annotation_bytes >> 10)
        } else {
            String::new()
        };
        let (proxy, cpu) = if proxy_times.is_empty() {
            ("–".to_owned(), "–".to_owned())
        } else {
            let wall: Vec<Duration> = proxy_times.iter().map(|t| t.0).collect();
            let all: Vec<String> = wall.iter().map(|d| d.as_millis().to_string()).collect();
            let cpu = median(proxy_times.iter().map(|t| t.1).collect());
            (
                format!("**{} ms** ({}): `{line}`", median(wall).as_millis(), all.join(", ")),
                format!("{} ms", cpu.as_millis()),
            )
        };
        println!(
            "| {} pods × {} container(s){extra} | {proxy} | {cpu} | {} ms | {:.2} KiB | {:.2} KiB |",
            shape.pods,
            shape.per_pod,
            median(times).as_millis(),
            per_pod / 1024.0,
            per_container / 1024.0
        );
    }
    if let Some((node, other)) = comparison {
        compare(&node, rounds, &other);
    }
}
