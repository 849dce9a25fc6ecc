//! Pod start time with one no-op hook server, by front end: how long a pod takes from
//! RunPodSandbox sent to StartContainer returned, on one containerd with NRI on, in five
//! set-ups, one run each:
//!
//! * **(a) containerd alone**: pods directly on containerd, no proxy, no plugin;
//! * **(b) CRI proxy**: pods through runtime-proxy (`--frontend cri`), one no-op hook server (an
//!   in-process tonic server that echoes every request) registered for PreRunPodSandbox,
//!   PreCreateContainer and PreStartContainer;
//! * **(c) NRI front end**: pods directly on containerd, runtime-proxy `--frontend nri` connected
//!   as its NRI plugin, the same hook server registered the same way;
//! * **(d)** and **(e)**: (b) and (c) with the hook server registered for PreCreateContainer
//!   only (the NRI front end subscribes only to the events its hook servers' stages need).
//!
//! `RP_BENCH_PODS` pods per set-up (default 10), one after another, each removed after it
//! started, in `RP_BENCH_ROUNDS` rounds (default 4): each round runs every set-up in turn with its
//! share of the pods, after one warm-up pod, so that the VM's drift over the run (its speed moves
//! 15 % and more within minutes) falls on every set-up alike. The NRI front end runs only during
//! its own pods.
//! The load average is printed with the numbers, and the events the NRI front end subscribed to.
//! Besides the start time, the CPU time per pod (start and removal) of containerd and
//! runtime-proxy together (the sum of their threads' time on CPU, `/proc/PID/task/*/schedstat`):
//! on a loaded machine the start times mostly measure the load, the CPU time what each set-up
//! costs. Both proxies log at `info`.
//!
//! Run: `RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`, then
//! `RP_CONTAINERD_ENV=ROOT/env cargo bench -p runtime-proxy --bench nri_front` (release), or
//! `cargo test -p runtime-proxy --bench nri_front` (a debug build: slower proxies, same shape).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
const CREATE_ONLY: [&str; 1] = ["PreCreateContainer"];

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// One set-up's pods (over every round): each one's start time, and the CPU time of the set-up's
/// processes (containerd, the proxy) on them together, in nanoseconds.
#[derive(Default)]
struct Run {
    times: Vec<Duration>,
    cpu_ns: u64,
}

impl Run {
    /// Adds one round's pods.
    fn add(&mut self, round: Run) {
        self.times.extend(round.times);
        self.cpu_ns += round.cpu_ns;
    }
}

/// `n` pods one after another through `rt`, and the CPU time `pids` spent on them.
async fn measured(env: &Containerd, rt: &mut RuntimeServiceClient<Channel>, n: usize, pids: &[u32]) -> Run {
    let cpu = || pids.iter().map(|&p| test_support::cpu_ns(p)).sum::<u64>();
    let before = cpu();
    let times = starts(env, rt, n).await;
    Run { times, cpu_ns: cpu() - before }
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

/// Median and 90th percentile (nearest rank) of the start times, and the CPU per pod, in ms.
fn summary(run: &Run) -> String {
    let mut v = run.times.clone();
    v.sort();
    let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1].as_secs_f64() * 1e3;
    let cpu_ms = run.cpu_ns as f64 / v.len().max(1) as f64 / 1e6;
    format!("median {:7.1} ms   p90 {:7.1} ms   CPU/pod {cpu_ms:5.1} ms", at(0.5), at(0.9))
}

/// The NRI front end connected to containerd's `nri_socket` with the hook servers of `dir`,
/// synchronized; its log is `dir/nri.log`. Returns the process and the `NRI: configured` line's
/// event mask.
async fn nri_front(nri_socket: &Path, dir: &Path) -> (KillOnDrop, String) {
    let log = dir.join("nri.log");
    let out = std::fs::File::create(&log).unwrap();
    let process = KillOnDrop(
        Command::new(BIN)
            .args(["--frontend", "nri", "--nri-socket"])
            .arg(nri_socket)
            .args(["--nri-plugin-name", "runtime-proxy-bench", "--hook-config-dir"])
            .arg(dir)
            .args(["--metrics-addr", "off"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("start runtime-proxy --frontend nri"),
    );
    let started = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("NRI Synchronize: store rebuilt") {
            break text;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "not synchronized:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let events = text
        .lines()
        .filter(|l| l.contains("NRI: configured"))
        .filter_map(|l| l.split("events=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(|events| events.trim_matches('"'))
        .next_back()
        .unwrap_or("?")
        .to_owned();
    (process, events)
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
    let pods: usize = std::env::var("RP_BENCH_PODS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(10);
    let env = Containerd::from_env();
    let containerd = env.pid().expect("containerd's pid (ROOT/containerd.pid)");
    // The CRI proxy logs at `info`, as the NRI front end does here (ProxyProcess's default is debug).
    std::env::set_var("RP_TEST_LOG", "info");
    let hook = TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    let dir = tempfile::Builder::new().prefix("rp-bench-nri").tempdir().unwrap();
    register(dir.path(), "noop.json", hook.socket(), "Fail", &STAGES, serde_json::json!({}));
    let create_dir = tempfile::Builder::new().prefix("rp-bench-nri").tempdir().unwrap();
    register(create_dir.path(), "noop.json", hook.socket(), "Fail", &CREATE_ONLY, serde_json::json!({}));
    let load_before = loadavg();

    let rounds: usize =
        std::env::var("RP_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(4);
    let per_round = pods.div_ceil(rounds);
    let pods = per_round * rounds;

    let mut direct = runtime_client(&env.socket);
    let through_proxy = async |dir: &Path| {
        let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.to_str().unwrap()]);
        let mut proxied = runtime_client(proxy.socket());
        starts(&env, &mut proxied, 1).await;
        measured(&env, &mut proxied, per_round, &[containerd, proxy.pid()]).await
    };
    let through_nri = async |direct: &mut RuntimeServiceClient<Channel>, dir: &Path| {
        let (process, events) = nri_front(&nri_socket, dir).await;
        starts(&env, direct, 1).await;
        let run = measured(&env, direct, per_round, &[containerd, process.0.id()]).await;
        drop(process);
        (run, events)
    };
    let [mut alone, mut cri_proxy, mut cri_create, mut nri, mut nri_create]: [Run; 5] = Default::default();
    let (mut events, mut create_events) = (String::new(), String::new());
    for _ in 0..rounds {
        starts(&env, &mut direct, 1).await;
        alone.add(measured(&env, &mut direct, per_round, &[containerd]).await);
        cri_proxy.add(through_proxy(dir.path()).await);
        let (run, e) = through_nri(&mut direct, dir.path()).await;
        nri.add(run);
        events = e;
        cri_create.add(through_proxy(create_dir.path()).await);
        let (run, e) = through_nri(&mut direct, create_dir.path()).await;
        nri_create.add(run);
        create_events = e;
    }
    let calls = hook.seen().len();

    println!(
        "pod start, {pods} pods each in {rounds} rounds, one after another (containerd {}, load average before {load_before}, after {}):",
        env.version,
        loadavg()
    );
    println!("  (a) containerd alone                                  {}", summary(&alone));
    println!("  (b) CRI proxy + one no-op hook                        {}", summary(&cri_proxy));
    println!("  (c) NRI front end + the same no-op hook               {}   events {events}", summary(&nri));
    println!("  (d) CRI proxy, the hook at PreCreateContainer only    {}", summary(&cri_create));
    println!(
        "  (e) NRI front end, the hook at PreCreateContainer only {}   events {create_events}",
        summary(&nri_create)
    );
    println!("  (hook calls: {calls}, expected {})", 2 * (pods + rounds) * (STAGES.len() + CREATE_ONLY.len()));
}
