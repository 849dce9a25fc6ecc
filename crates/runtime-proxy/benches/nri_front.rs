//! Pod start time with one no-op hook server, by front end: how long a pod takes from
//! RunPodSandbox sent to StartContainer returned, on one containerd with NRI on, in three
//! set-ups, one run each:
//!
//! * **(a) containerd alone**: pods directly on containerd, no proxy, no plugin;
//! * **(b) CRI proxy**: pods through runtime-proxy (`--frontend cri`), one no-op hook server (an
//!   in-process tonic server that echoes every request) registered for PreRunPodSandbox,
//!   PreCreateContainer and PreStartContainer;
//! * **(c) NRI front end**: pods directly on containerd, runtime-proxy `--frontend nri` connected
//!   as its NRI plugin, the same hook server registered the same way.
//!
//! `RP_BENCH_PODS` pods per set-up (default 10), one after another, each removed after it
//! started; one warm-up pod per set-up first. The NRI front end runs only during its own pods.
//! The load average is printed with the numbers.
//!
//! Run: `RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`, then
//! `RP_CONTAINERD_ENV=ROOT/env cargo bench -p runtime-proxy --bench nri_front` (release), or
//! `cargo test -p runtime-proxy --bench nri_front` (a debug build: slower proxies, same shape).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, KillOnDrop, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const STAGES: [&str; 3] = ["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"];

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `n` pods one after another through `rt`: each one's start time.
async fn starts(env: &Containerd, rt: &mut RuntimeServiceClient<Channel>, n: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let sandbox = sandbox_config(env, &unique("bench-nri"), HashMap::new(), HashMap::new());
        let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
        let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
        let start = Instant::now();
        let pod = Pod::start(rt, sandbox, container).await.expect("pod start");
        times.push(start.elapsed());
        pod.remove(rt).await;
    }
    times
}

/// Median and 90th percentile (nearest rank), in ms.
fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1].as_secs_f64() * 1e3;
    format!("median {:7.1} ms   p90 {:7.1} ms", at(0.5), at(0.9))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(file) = std::env::var("RP_CONTAINERD_ENV") else {
        println!("(pod start by front end: skipped, RP_CONTAINERD_ENV is not set)");
        return;
    };
    let text = std::fs::read_to_string(&file).expect("env file");
    let Some(nri_socket) = text.lines().find_map(|l| l.strip_prefix("NRI_SOCKET=")).map(PathBuf::from) else {
        println!(
            "(pod start by front end: skipped, {file} has no NRI_SOCKET: RP_NRI=1 scripts/containerd.sh up 1.7 ROOT)"
        );
        return;
    };
    let pods = std::env::var("RP_BENCH_PODS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(10);
    let env = Containerd::from_env();
    let hook = TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    let dir = tempfile::Builder::new().prefix("rp-bench-nri").tempdir().unwrap();
    register(dir.path(), "noop.json", hook.socket(), "Fail", &STAGES, serde_json::json!({}));
    let load_before = loadavg();

    let mut direct = runtime_client(&env.socket);
    starts(&env, &mut direct, 1).await;
    let alone = starts(&env, &mut direct, pods).await;

    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let mut proxied = runtime_client(proxy.socket());
    starts(&env, &mut proxied, 1).await;
    let cri_proxy = starts(&env, &mut proxied, pods).await;
    drop(proxy);

    let log = dir.path().join("nri.log");
    let out = std::fs::File::create(&log).unwrap();
    let _nri = KillOnDrop(
        Command::new(BIN)
            .args(["--frontend", "nri", "--nri-socket"])
            .arg(&nri_socket)
            .args(["--nri-plugin-name", "runtime-proxy-bench", "--hook-config-dir"])
            .arg(dir.path())
            .args(["--metrics-addr", "off"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start runtime-proxy --frontend nri"),
    );
    let started = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("NRI Synchronize: store rebuilt") {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not synchronized:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    starts(&env, &mut direct, 1).await;
    let nri = starts(&env, &mut direct, pods).await;
    let calls = hook.seen().len();

    println!(
        "pod start, {pods} pods each, one after another (containerd {}, load average before {load_before}, after {}):",
        env.version,
        loadavg()
    );
    println!("  (a) containerd alone                      {}", summary(alone));
    println!("  (b) CRI proxy + one no-op hook            {}", summary(cri_proxy));
    println!("  (c) NRI front end + the same no-op hook   {}", summary(nri));
    println!("  (hook calls: {calls}, expected {})", 2 * (pods + 1) * STAGES.len());
}
