//! Pod start time by mode: how long a BE pod takes from RunPodSandbox sent to StartContainer
//! returned, on one containerd 1.7 with NRI on, in three set-ups:
//!
//! * **containerd alone**: pods directly on containerd, no NRI plugin connected, no proxy;
//! * **proxy mode**: pods through runtime-proxy, with runtime-hooks (`--mode proxy`) registered
//!   in its hook config directory (PreRunPodSandbox, PreCreateContainer);
//! * **NRI mode**: pods directly on containerd, with runtime-hooks (`--mode nri`) connected as
//!   an NRI plugin.
//!
//! Every pod is a Koordinator BE pod (label `koordinator.sh/qosClass: BE`, a batch-resource
//! extended spec) with one busybox `sleep` container "main" carrying kubelet's BestEffort
//! resources, so that GroupIdentity and BatchResource have work to do at both stages; after each
//! round the container's `cpu.shares` is checked: 512 (batch-cpu request 500) with runtime-hooks,
//! 2 without. The pod cgroup is made before the clock starts, as kubelet makes it before
//! RunPodSandbox (proxy mode writes the pod-level values into it).
//!
//! Two measurements, each over `RP_BENCH_PODS` pods per mode (default 50):
//!
//! 1. **one after another**: in rounds of `RP_BENCH_ROUND` pods (default 10), the modes
//!    alternating round by round (the order rotated each round), so that they share the machine's
//!    noise; a round's pods stay until it ends, then are removed.
//! 2. **at once** (a burst): all pods of a mode started together on one connection (kubelet's
//!    one), `RP_BENCH_BURSTS` batches per mode (default 1), the modes alternating batch by batch
//!    (the order rotated each time, as in 1.); each mode's p50 and p99 are over all its batches'
//!    pods. `RP_BENCH_SEQUENTIAL=0` leaves measurement 1 out.
//!
//! runtime-proxy stays up through the whole run (it is idle when not in use); the NRI plugin is
//! started (and synchronized) before each NRI round and stopped after it, so that the other
//! modes' pods never reach it. One warm-up pod per mode first. Pods are removed directly on
//! containerd (by a label of this run), also after a failure.
//!
//! Run: `make bench` (starts its own containerd 1.7 with NRI, then a 2.1; builds runtime-proxy in release;
//! `RP_BENCH_BURSTS=5 RP_BENCH_SEQUENTIAL=0` for the burst alone, five batches per mode),
//! or `RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`, `cargo build --release -p runtime-proxy`,
//! `RP_CONTAINERD_ENV=ROOT/env cargo bench -p runtime-hooks --bench pod_start`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{map, precreate_pod_cgroup, remove_labelled_pods, Hooks, BE_SPEC, QOS, SPEC};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

/// Label on every bench pod sandbox (value: this process's pid), to find and remove them.
const BENCH_LABEL: &str = "runtime-hooks-bench";
/// runtime-hooks' log filter: the default, as a node runs it (one line per hook call that changed something).
const HOOKS_LOG: &str = "info";

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Mode {
    Alone,
    Proxy,
    Nri,
}

const MODES: [Mode; 3] = [Mode::Alone, Mode::Proxy, Mode::Nri];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Alone => "(a) containerd alone",
            Mode::Proxy => "(b) runtime-proxy + runtime-hooks, proxy mode",
            Mode::Nri => "(c) runtime-hooks, NRI mode",
        }
    }

    /// The pod cgroup's `cpu.shares` this mode must produce for a BE pod (made by the bench with
    /// the kernel's default, 1024).
    fn pod_shares(self) -> &'static str {
        match self {
            Mode::Alone => "1024",
            Mode::Proxy | Mode::Nri => "512",
        }
    }

    /// The container's `cpu.shares` this mode must produce for a BE pod.
    fn shares(self) -> &'static str {
        match self {
            Mode::Alone => "2",
            Mode::Proxy | Mode::Nri => "512",
        }
    }
}

struct Setup {
    env: Containerd,
    nri_socket: PathBuf,
    dir: tempfile::TempDir,
    containerd: RuntimeServiceClient<Channel>,
    proxied: RuntimeServiceClient<Channel>,
    _proxy: ProxyProcess,
    _hooks: Hooks,
}

fn env_var(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(default)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let Ok(file) = std::env::var("RP_CONTAINERD_ENV") else {
        println!("(pod start time by mode: skipped, RP_CONTAINERD_ENV is not set; `make bench` sets it)");
        return;
    };
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {file}: {e}"));
    let Some(nri_socket) = text.lines().find_map(|l| l.strip_prefix("NRI_SOCKET=")).map(PathBuf::from) else {
        println!(
            "(pod start time by mode: skipped, {file} has no NRI_SOCKET: start containerd with RP_NRI=1 scripts/containerd.sh up 1.7 ROOT)"
        );
        return;
    };
    let env = Containerd::from_env();
    let pods = env_var("RP_BENCH_PODS", 50);
    let round = env_var("RP_BENCH_ROUND", 10).min(pods);
    // info: the registry's "hook server added" line, and no line per call.
    std::env::set_var("RP_TEST_LOG", "info");
    let containerd = runtime_client(&env.socket);

    let outcome = tokio::spawn(async move {
        let setup = setup(env, nri_socket);
        run(&setup, pods, round).await
    })
    .await;
    let left = remove_labelled_pods(&containerd, BENCH_LABEL).await;
    if let Err(e) = outcome {
        panic!("pod start bench failed (removed {left} pods left behind): {e}");
    }
}

/// runtime-proxy in front of containerd and runtime-hooks in proxy mode registered with it.
fn setup(env: Containerd, nri_socket: PathBuf) -> Setup {
    let dir = tempfile::Builder::new().prefix("rh-bench").tempdir().expect("temp dir");
    let conf = dir.path().join("hookserver.d");
    std::fs::create_dir(&conf).unwrap();
    let proxy_bin = test_support::workspace_binary("runtime-proxy");
    let proxy =
        ProxyProcess::start(proxy_bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
    let socket = dir.path().join("runtime-hooks.sock");
    let args = ["--listen", socket.to_str().unwrap(), "--hook-config-dir", conf.to_str().unwrap()];
    let hooks = Hooks::start_logging(&args, dir.path().join("hooks-proxy.log"), HOOKS_LOG);
    assert!(
        proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "proxy did not take up runtime-hooks.json\nproxy:\n{}\nhooks:\n{}",
        proxy.log(),
        hooks.log()
    );
    let containerd = runtime_client(&env.socket);
    let proxied = runtime_client(proxy.socket());
    Setup { env, nri_socket, dir, containerd, proxied, _proxy: proxy, _hooks: hooks }
}

/// runtime-hooks as an NRI plugin, synchronized.
fn start_nri(s: &Setup) -> Hooks {
    let socket = s.nri_socket.to_str().unwrap();
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        socket,
        "--nri-plugin-name",
        "runtime-hooks-bench",
        "--nri-plugin-index",
        "10",
    ];
    let hooks = Hooks::start_logging(&args, s.dir.path().join(format!("{}.log", unique("hooks-nri"))), HOOKS_LOG);
    assert!(
        hooks.wait_log(&["NRI: applied to known pods", "synchronize"], 0, Duration::from_secs(10)),
        "NRI plugin not synchronized:\n{}",
        hooks.log()
    );
    hooks
}

fn stop_nri(mut hooks: Hooks) {
    assert_eq!(hooks.terminate(), Some(0), "NRI plugin did not exit cleanly:\n{}", hooks.log());
}

/// A BE pod's sandbox and container config, labelled for this run; its pod cgroup made.
fn be_pod(env: &Containerd) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let pid = std::process::id().to_string();
    let sandbox =
        sandbox_config(env, &unique("bench"), map(&[(QOS, "BE"), (BENCH_LABEL, &pid)]), map(&[(SPEC, BE_SPEC)]));
    precreate_pod_cgroup(&sandbox.linux.as_ref().unwrap().cgroup_parent);
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
    (sandbox, container)
}

/// RunPodSandbox sent → StartContainer returned.
async fn timed_start(
    mut client: RuntimeServiceClient<Channel>,
    sandbox: cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> (Duration, Result<Pod, tonic::Status>) {
    let start = Instant::now();
    let pod = Pod::start(&mut client, sandbox, container).await;
    (start.elapsed(), pod)
}

/// The client a mode's pods go through.
fn client(s: &Setup, mode: Mode) -> RuntimeServiceClient<Channel> {
    if mode == Mode::Proxy {
        s.proxied.clone()
    } else {
        s.containerd.clone()
    }
}

/// Starts `n` pods of `mode` one after another (`at_once` false) or all together; checks their
/// cgroup values, removes them. Returns each pod's start time.
async fn round(s: &Setup, mode: Mode, n: usize, at_once: bool) -> Vec<Duration> {
    let nri = (mode == Mode::Nri).then(|| start_nri(s));
    let mut results = vec![];
    if at_once {
        let configs: Vec<_> = (0..n).map(|_| be_pod(&s.env)).collect();
        let mut set = tokio::task::JoinSet::new();
        for (sandbox, container) in configs {
            set.spawn(timed_start(client(s, mode), sandbox, container));
        }
        while let Some(r) = set.join_next().await {
            results.push(r.expect("pod task"));
        }
    } else {
        for _ in 0..n {
            let (sandbox, container) = be_pod(&s.env);
            results.push(timed_start(client(s, mode), sandbox, container).await);
        }
    }
    let mut times = vec![];
    let mut failures = vec![];
    let mut wrong = vec![];
    for (took, pod) in &results {
        match pod {
            Ok(pod) => {
                times.push(*took);
                // the container's (BatchResource at PreCreateContainer), then the pod's (at PreRunPodSandbox)
                let shares = pod.cgroup_file("cpu", "cpu.shares");
                if shares != mode.shares() {
                    wrong.push(format!("container {shares}"));
                }
                let shares = common::cgroup("cpu", &pod.cgroup_parent(), "cpu.shares");
                if shares != mode.pod_shares() {
                    wrong.push(format!("pod {shares}"));
                }
            }
            Err(e) => failures.push(e.clone()),
        }
    }
    let parents: Vec<String> = results.iter().filter_map(|(_, p)| p.as_ref().ok()).map(|p| p.cgroup_parent()).collect();
    remove_labelled_pods(&s.containerd, BENCH_LABEL).await;
    remove_pod_cgroups(&parents);
    if let Some(hooks) = nri {
        stop_nri(hooks);
    }
    assert!(
        failures.is_empty(),
        "{}: {} of {n} pods failed to start; first: {:?}",
        mode.name(),
        failures.len(),
        failures[0]
    );
    assert!(
        wrong.is_empty(),
        "{}: {} wrong cpu.shares of {n} pods (want container {}, pod {}): {wrong:?}",
        mode.name(),
        wrong.len(),
        mode.shares(),
        mode.pod_shares()
    );
    times
}

async fn run(s: &Setup, pods: usize, round_size: usize) {
    let before = loadavg();
    let started = Instant::now();
    for mode in MODES {
        round(s, mode, 1, false).await;
    }
    let mut sequential: HashMap<Mode, Vec<Duration>> = HashMap::new();
    let mut done = 0;
    let mut r = 0;
    let with_sequential = std::env::var("RP_BENCH_SEQUENTIAL").map_or(true, |v| v != "0");
    if !with_sequential {
        // The one-after-another columns then show the warm-up pods only.
        done = pods;
        for mode in MODES {
            sequential.entry(mode).or_default().extend(round(s, mode, 1, false).await);
        }
    }
    while done < pods {
        let n = round_size.min(pods - done);
        for i in 0..MODES.len() {
            let mode = MODES[(i + r) % MODES.len()];
            sequential.entry(mode).or_default().extend(round(s, mode, n, false).await);
        }
        done += n;
        r += 1;
    }
    let bursts = env_var("RP_BENCH_BURSTS", 1);
    let mut at_once: HashMap<Mode, (Vec<Duration>, Duration)> = HashMap::new();
    for b in 0..bursts {
        for i in 0..MODES.len() {
            let mode = MODES[(i + b) % MODES.len()];
            let times = round(s, mode, pods, true).await;
            let slowest = times.iter().max().copied().unwrap_or_default();
            let entry = at_once.entry(mode).or_default();
            entry.0.extend(times);
            entry.1 = entry.1.max(slowest);
        }
    }
    let after = loadavg();

    println!(
        "### Pod start time by mode — `cargo bench -p runtime-hooks --bench pod_start` (containerd {}, NRI on; {} CPUs)",
        s.env.version,
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    );
    println!();
    println!(
        "BE pods (RunPodSandbox sent → StartContainer returned), {} per mode one after another (rounds of {round_size}, modes \
         alternating) and {pods} per mode at once ({bursts} batch(es) each, modes alternating); load average (1, 5, 15 min) \
         before {before}, after {after}; {:.0} s in all.",
        if with_sequential { pods } else { 1 },
        started.elapsed().as_secs_f64()
    );
    println!();
    println!(
        "| mode | one after another p50 | p99 | at once p50 | p99 | at once: slowest pod | at once p50 / p99 vs (a) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let base = |m: &HashMap<Mode, Vec<Duration>>, p| percentile(&sorted(&m[&Mode::Alone]), p);
    let seq_base = (base(&sequential, 0.5), base(&sequential, 0.99));
    let once: HashMap<Mode, Vec<Duration>> = at_once.iter().map(|(m, (t, _))| (*m, t.clone())).collect();
    let once_base = (base(&once, 0.5), base(&once, 0.99));
    for mode in MODES {
        let seq = sorted(&sequential[&mode]);
        let all = sorted(&once[&mode]);
        let cell = |d: Duration, b: Duration| {
            if mode == Mode::Alone {
                format!("{:.0} ms", ms(d))
            } else {
                format!("{:.0} ms ({:+.0})", ms(d), ms(d) - ms(b))
            }
        };
        let ratio = |d: Duration, b: Duration| format!("{:+.1} %", (ms(d) / ms(b) - 1.0) * 100.0);
        println!(
            "| {} | {} | {} | {} | {} | {:.2} s | {} / {} |",
            mode.name(),
            cell(percentile(&seq, 0.5), seq_base.0),
            cell(percentile(&seq, 0.99), seq_base.1),
            cell(percentile(&all, 0.5), once_base.0),
            cell(percentile(&all, 0.99), once_base.1),
            at_once[&mode].1.as_secs_f64(),
            ratio(percentile(&all, 0.5), once_base.0),
            ratio(percentile(&all, 0.99), once_base.1)
        );
    }
    println!();
    println!(
        "(+N): ms more than containerd alone. p99 by nearest rank: with {} samples per mode at once, {}. Every pod was \
         checked: cpu.shares 512 in the container and the pod cgroup with runtime-hooks, 2 and 1024 without.",
        pods * bursts,
        if pods * bursts < 100 { "the slowest pod" } else { "one of the slowest" }
    );
}

fn sorted(v: &[Duration]) -> Vec<Duration> {
    let mut v = v.to_vec();
    v.sort();
    v
}

/// Removes the pods' cgroup directories (kubelet would), in every hierarchy; best effort.
fn remove_pod_cgroups(parents: &[String]) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    let hierarchies: Vec<PathBuf> = hierarchies.flatten().map(|e| e.path()).collect();
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
