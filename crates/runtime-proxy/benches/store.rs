//! The store at node scale, against a real containerd: the proxy's memory (RSS) idle and with
//! `RP_BENCH_PODS` pods (default 200; one `sleep` container each, or none with
//! `RP_BENCH_CONTAINERS=0`), the store's own memory per pod sandbox and per container, and the
//! time to recover them after a `kill -9` (the release proxy's own log line, and
//! `recover::rebuild` in process). Pods are made 20 at a time; each batch's time and the
//! machine's available memory go to stderr, and no more are made once less than
//! `RP_BENCH_MIN_FREE_MIB` (default 4096) is available: the table then says how many there were.
//! 1,000 pods are measured against a stand-in runtime (`benches/node_scale.rs`).
//!
//! Run: `make bench` (or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy --bench store`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use k8s_cri::v1 as cri;
use runtime_proxy::cri::recover::rebuild;
use runtime_proxy::grpc::backend::Backend;
use runtime_proxy::hooks::store::Store;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
/// Pods made at once.
const BATCH: usize = 20;

fn env_var(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The machine's `MemAvailable`, in MiB.
fn available_mib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        >> 10
}

/// Counts the bytes this process has allocated and not freed.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn recovered_ms(proxy: &ProxyProcess) -> String {
    assert!(proxy.wait_log(&["store recovered"], 0), "no recovery line:\n{}", proxy.log());
    let log = proxy.log();
    let line = log.lines().find(|l| l.contains("store recovered")).unwrap_or_default();
    line[line.find("store recovered").unwrap_or(0)..].split(" why=").next().unwrap_or_default().to_owned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let env = Containerd::from_env();
    std::env::set_var("RP_TEST_LOG", "info");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let log = dir.path().join("a.log");
    let mut proxy = ProxyProcess::spawn(BIN, &socket, &env.socket, &["--metrics-addr", "127.0.0.1:0"], log);
    proxy.wait_ready();
    recovered_ms(&proxy);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = test_support::rss_kib(proxy.pid());

    // The pods, through the proxy, BATCH at a time, while the machine has memory to spare.
    let want = env_var("RP_BENCH_PODS", 200);
    let with_container = env_var("RP_BENCH_CONTAINERS", 1) > 0;
    let min_free = env_var("RP_BENCH_MIN_FREE_MIB", 4096) as u64;
    let mut pods: Vec<String> = Vec::new();
    let made = std::time::Instant::now();
    let mut stopped_early = None;
    for chunk in 0..want.div_ceil(BATCH) {
        if available_mib() < min_free {
            stopped_early = Some(available_mib());
            break;
        }
        let batch = std::time::Instant::now();
        let tasks: Vec<_> = (0..BATCH.min(want - chunk * BATCH))
            .map(|i| {
                let env = env.clone();
                let mut rt = runtime_client(&socket);
                tokio::spawn(async move {
                    let labels = HashMap::from([("app".to_string(), format!("bench-{chunk}-{i}"))]);
                    let annotations = HashMap::from([("team".to_string(), "storage".to_string())]);
                    let sandbox = sandbox_config(&env, &unique("store"), labels, annotations);
                    if !with_container {
                        let req = cri::RunPodSandboxRequest { config: Some(sandbox), runtime_handler: String::new() };
                        return rt.run_pod_sandbox(req).await.map(|r| r.into_inner().pod_sandbox_id);
                    }
                    let container = container_config(
                        &env,
                        "main",
                        &["sleep", "3600"],
                        None,
                        &[("MODE", "bench"), ("IDX", &i.to_string())],
                    );
                    Pod::start(&mut rt, sandbox, container).await.map(|p| p.sandbox_id)
                })
            })
            .collect();
        for t in tasks {
            pods.push(t.await.unwrap().expect("pod"));
        }
        eprintln!(
            "{} pods: batch of {BATCH} in {:.1} s; {} MiB available; proxy RSS {} KiB",
            pods.len(),
            batch.elapsed().as_secs_f64(),
            available_mib(),
            test_support::rss_kib(proxy.pid())
        );
    }
    let made = made.elapsed();
    let n = pods.len();
    let loaded = test_support::rss_kib(proxy.pid());

    // The store's own memory: an in-process rebuild from the same runtime.
    let runtime = std::sync::Arc::new(Backend::new(&env.socket));
    rebuild(&runtime, &std::sync::Arc::new(Store::new())).await.expect("rebuild");
    let mut rebuilds = Vec::new();
    // The store's bytes with pods and containers, and those of a store of the same pods alone.
    let (mut store_bytes, mut pod_bytes) = (0, 0);
    for _ in 0..5 {
        let before = LIVE.load(Ordering::Relaxed);
        let store = std::sync::Arc::new(Store::new());
        let report = rebuild(&runtime, &store).await.expect("rebuild");
        rebuilds.push((report.elapsed, report.pods, report.containers));
        drop(report);
        store_bytes = LIVE.load(Ordering::Relaxed) - before;
        let ids = store.ids().0;
        let before = LIVE.load(Ordering::Relaxed);
        let pods = Store::new();
        for id in &ids {
            pods.put_pod(id, store.pod(id).expect("a listed pod"));
        }
        pod_bytes = LIVE.load(Ordering::Relaxed) - before;
        drop((store, pods, ids));
    }
    rebuilds.sort();
    let (median, recovered_pods, recovered_containers) = rebuilds[2];
    let per_pod = pod_bytes as f64 / recovered_pods.max(1) as f64;
    let per_container = (store_bytes - pod_bytes) as f64 / recovered_containers.max(1) as f64;

    // kill -9 and restart on the same socket: the release proxy's own recovery line.
    proxy.signal(libc::SIGKILL);
    proxy.wait_exit(Duration::from_secs(5));
    let restarted =
        ProxyProcess::spawn(BIN, &socket, &env.socket, &["--metrics-addr", "127.0.0.1:0"], dir.path().join("b.log"));
    let line = recovered_ms(&restarted);

    println!(
        "### Store at node scale — `make bench` (`cargo bench -p runtime-proxy --bench store`), containerd {}",
        env.version
    );
    println!("| what | value |");
    println!("|---|---|");
    let shape = if with_container { "1 container each" } else { "no container" };
    if let Some(left) = stopped_early {
        println!("| pods made | {n} of {want} ({shape}): stopped with {left} MiB available |");
    } else {
        println!("| pods made | {n} ({shape}), {BATCH} at a time, in {:.1} s |", made.as_secs_f64());
    }
    println!("| machine memory available after them | {} MiB |", available_mib());
    println!("| proxy RSS, idle (store recovered, no pods of ours) | {:.1} MiB |", idle as f64 / 1024.0);
    println!("| proxy RSS with the {n} pods created through it | {:.1} MiB |", loaded as f64 / 1024.0);
    println!("| RSS growth per pod | {:.1} KiB |", (loaded as f64 - idle as f64) / n.max(1) as f64);
    println!(
        "| store memory (bytes allocated by a rebuild into an empty store, {recovered_pods} pods + {recovered_containers} containers) | {:.1} KiB: {:.2} KiB per pod sandbox, {:.2} KiB per container |",
        store_bytes as f64 / 1024.0,
        per_pod / 1024.0,
        per_container / 1024.0
    );
    println!(
        "| `rebuild` of {recovered_pods} pod sandboxes + {recovered_containers} containers, in process, median of 5 | {} ms |",
        median.as_millis()
    );
    println!("| release proxy after `kill -9`: its own log line | {line} |");

    let mut rt = runtime_client(&env.socket);
    for id in pods {
        remove_sandbox(&mut rt, &id).await;
    }
}
