//! The store at node scale, against a real containerd: the proxy's memory (RSS) idle and with
//! 200 pods, the store's own memory per pod, and the time to recover 200 containers after a
//! `kill -9` (the release proxy's own log line, and `recover::rebuild` in process).
//!
//! Run: `make bench` (or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy --bench store`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use runtime_proxy::cri::recover::rebuild;
use runtime_proxy::hooks::store::Store;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const PODS: usize = 200;

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

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

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
    let idle = rss_kib(proxy.pid());

    // 200 pods of one container each, through the proxy, 20 at a time.
    let mut pods = Vec::new();
    for chunk in 0..(PODS / 20) {
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let env = env.clone();
                let mut rt = runtime_client(&socket);
                tokio::spawn(async move {
                    let labels = HashMap::from([("app".to_string(), format!("bench-{chunk}-{i}"))]);
                    let annotations = HashMap::from([("team".to_string(), "storage".to_string())]);
                    let sandbox = sandbox_config(&env, &unique("store"), labels, annotations);
                    let container = container_config(
                        &env,
                        "main",
                        &["sleep", "3600"],
                        None,
                        &[("MODE", "bench"), ("IDX", &i.to_string())],
                    );
                    Pod::start(&mut rt, sandbox, container).await
                })
            })
            .collect();
        for t in tasks {
            pods.push(t.await.unwrap().expect("pod"));
        }
    }
    let loaded = rss_kib(proxy.pid());

    // The store's own memory: an in-process rebuild from the same runtime.
    let channel = test_support::channel(&env.socket);
    let mut rebuilds = Vec::new();
    let mut store_bytes = 0;
    for _ in 0..5 {
        let before = LIVE.load(Ordering::Relaxed);
        let store = Store::new();
        let report = rebuild(&channel, &store).await.expect("rebuild");
        store_bytes = LIVE.load(Ordering::Relaxed) - before;
        rebuilds.push((report.elapsed, report.pods, report.containers));
        drop(store);
    }
    rebuilds.sort();
    let (median, recovered_pods, recovered_containers) = rebuilds[2];

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
    println!("| proxy RSS, idle (store recovered, no pods of ours) | {:.1} MiB |", idle as f64 / 1024.0);
    println!(
        "| proxy RSS with {PODS} more pods (1 container each) created through it | {:.1} MiB |",
        loaded as f64 / 1024.0
    );
    println!("| RSS growth per pod | {:.1} KiB |", (loaded as f64 - idle as f64) / PODS as f64);
    println!(
        "| store memory per pod + container (bytes allocated by a rebuild into an empty store, {} pods + {} containers) | {:.1} KiB |",
        recovered_pods,
        recovered_containers,
        store_bytes as f64 / 1024.0 / recovered_pods.max(1) as f64
    );
    println!(
        "| `rebuild` of {recovered_pods} pod sandboxes + {recovered_containers} containers, in process, median of 5 | {} ms |",
        median.as_millis()
    );
    println!("| release proxy after `kill -9`: its own log line | {line} |");

    let mut rt = runtime_client(&env.socket);
    for pod in pods {
        remove_sandbox(&mut rt, &pod.sandbox_id).await;
    }
}
