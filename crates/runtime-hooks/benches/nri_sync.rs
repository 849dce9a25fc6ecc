//! Synchronize on a real containerd with NRI: how long the runtime holds its NRI lock — which
//! every pod and container event on the node waits for — when runtime-hooks (NRI mode) connects
//! to a node of `RP_BENCH_SYNC_PODS` BE pods (default 150) that exist already, each with one
//! busybox `sleep` container carrying kubelet's BestEffort resources (made directly on
//! containerd, no plugin connected: 2 CPU shares, as kubelet leaves them).
//!
//! Two connections, one after the other:
//!
//! 1. **fresh**: every container still has kubelet's values: runtime-hooks answers one update per
//!    container (batch shares, quota, memory limit), which containerd applies under the lock —
//!    what every Synchronize cost when each container was updated whether or not it differed;
//! 2. **again**: runtime-hooks is killed and started again (a restart, an upgrade): containerd
//!    reports the values it holds now, and runtime-hooks answers only what differs: nothing.
//!
//! The lock time is read from containerd's log: from "Synchronizing NRI (plugin) with current
//! runtime state" to "plugin … connected" (2.x: "… connected and synchronized") of this plugin. Beside it: the updates
//! answered and runtime-hooks' CPU time until its answer (`/proc/PID/task/*/schedstat`).
//!
//! What the node's other pods see of the lock: while runtime-hooks connects, a probe makes one pod
//! sandbox after another (pause only, removed after) until containerd logged the plugin
//! synchronized, and its RunPodSandbox times are printed (median and longest) beside those of
//! probes on the idle node.
//!
//! Run: `make bench`, or `RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`,
//! `RP_CONTAINERD_ENV=ROOT/env cargo bench -p runtime-hooks --bench nri_sync`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{map, precreate_pod_cgroup, remove_labelled_pods, Hooks, BE_SPEC, QOS, SPEC};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use test_support::runtime_client;
use tonic::transport::Channel;

const BENCH_LABEL: &str = "runtime-hooks-sync-bench";
const PLUGIN: &str = "runtime-hooks-sync-bench";

/// A containerd log line's `time="…"` as seconds since the epoch (RFC 3339, UTC).
fn log_time(line: &str) -> Option<f64> {
    let t = line.split("time=\"").nth(1)?.split('"').next()?;
    let (date, clock) = t.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    // days from the civil date (Howard Hinnant's algorithm)
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let mut c = clock.split(':');
    let (h, min, s) = (c.next()?.parse::<f64>().ok()?, c.next()?.parse::<f64>().ok()?, c.next()?.parse::<f64>().ok()?);
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

/// The last Synchronize of `plugin` in containerd's log after byte `from`: seconds from the
/// runtime's "Synchronizing NRI" to the plugin's "connected and synchronized".
fn lock_time(log: &str, from: usize) -> Option<f64> {
    let text = log.get(from..)?;
    // 1.7: `plugin "10-NAME" connected`; 2.x: `… connected and synchronized`
    let done = text.lines().rfind(|l| l.contains("msg=\"plugin ") && l.contains(" connected") && l.contains(PLUGIN))?;
    let end = log_time(done)?;
    let start = text
        .lines()
        .take_while(|l| !std::ptr::eq(*l, done))
        .filter(|l| l.contains("Synchronizing NRI (plugin) with current runtime state"))
        .last()?;
    Some(end - log_time(start)?)
}

/// One probe pod sandbox (pause only, labelled for the clean-up): its RunPodSandbox time; removed
/// after.
async fn probe(env: &Containerd, client: &mut RuntimeServiceClient<Channel>, label: &str) -> Duration {
    let sandbox = sandbox_config(env, &unique("probe"), map(&[(BENCH_LABEL, label)]), map(&[]));
    precreate_pod_cgroup(&sandbox.linux.as_ref().unwrap().cgroup_parent);
    let start = Instant::now();
    let req = cri::RunPodSandboxRequest { config: Some(sandbox), runtime_handler: String::new() };
    let id = client.run_pod_sandbox(req).await.expect("probe pod sandbox").into_inner().pod_sandbox_id;
    let took = start.elapsed();
    remove_sandbox(client, &id).await;
    took
}

/// Median and longest of `times`, in ms.
fn median_max(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    times.last().map_or((0.0, 0.0), |&max| (ms(times[times.len() / 2]), ms(max)))
}

fn start_hooks(nri_socket: &Path, dir: &Path, n: usize) -> Hooks {
    let selector = format!("{BENCH_LABEL}={}", std::process::id());
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        nri_socket.to_str().unwrap(),
        "--nri-plugin-name",
        PLUGIN,
        "--nri-plugin-index",
        "10",
        "--selector",
        &selector,
    ];
    Hooks::start_logging(&args, dir.join(format!("hooks-{n}.log")), "info")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Ok(file) = std::env::var("RP_CONTAINERD_ENV") else {
        println!("(Synchronize on containerd: skipped, RP_CONTAINERD_ENV is not set; `make bench` sets it)");
        return;
    };
    let env = Containerd::from_env();
    let (Some(nri_socket), Some(root)) = (env.nri_socket.clone(), env.root.clone()) else {
        println!("(Synchronize on containerd: skipped, {file} has no NRI_SOCKET: RP_NRI=1 scripts/containerd.sh up 1.7 ROOT)");
        return;
    };
    let pods: usize = std::env::var("RP_BENCH_SYNC_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let containerd = runtime_client(&env.socket);
    let outcome = tokio::spawn(run(env, nri_socket, root, pods)).await;
    let left = remove_labelled_pods(&containerd, BENCH_LABEL).await;
    if let Err(e) = outcome {
        panic!("Synchronize bench failed (removed {left} pods left behind): {e}");
    }
}

async fn run(env: Containerd, nri_socket: PathBuf, root: PathBuf, pods: usize) {
    let dir = tempfile::Builder::new().prefix("rh-sync-bench").tempdir().unwrap();
    let started = Instant::now();
    let mut made = Vec::new();
    let pid = std::process::id().to_string();
    for batch in (0..pods).collect::<Vec<_>>().chunks(10) {
        let mut set = tokio::task::JoinSet::new();
        for _ in batch {
            let sandbox = sandbox_config(
                &env,
                &unique("sync"),
                map(&[(QOS, "BE"), (BENCH_LABEL, &pid)]),
                map(&[(SPEC, BE_SPEC)]),
            );
            precreate_pod_cgroup(&sandbox.linux.as_ref().unwrap().cgroup_parent);
            let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
            let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[]);
            let mut client = runtime_client(&env.socket);
            set.spawn(async move { Pod::start(&mut client, sandbox, container).await });
        }
        while let Some(pod) = set.join_next().await {
            made.push(pod.unwrap().expect("BE pod on containerd"));
        }
    }
    let made_in = started.elapsed();
    let mut client = runtime_client(&env.socket);
    let mut idle = Vec::new();
    for _ in 0..5 {
        idle.push(probe(&env, &mut client, &pid).await);
    }
    let log_file = root.join("containerd.log");
    let mut rows = Vec::new();
    let mut probed = Vec::new();
    let mut hooks: Option<Hooks> = None;
    for (n, what) in ["fresh", "again"].into_iter().enumerate() {
        drop(hooks.take());
        let from = std::fs::metadata(&log_file).map(|m| m.len() as usize).unwrap_or(0);
        let h = start_hooks(&nri_socket, dir.path(), n);
        let hooks_pid = h.pid();
        // Probes from the plugin's start until containerd logged the plugin synchronized.
        let connecting = Instant::now();
        let mut probes = Vec::new();
        let (mut cpu, mut line) = (None, String::new());
        loop {
            let log = h.log();
            if cpu.is_none() && log.contains("NRI: applied to known pods") {
                cpu = Some(test_support::cpu_ns(hooks_pid));
                line = log.lines().find(|l| l.contains("NRI: applied to known pods")).unwrap_or_default().to_owned();
            }
            let synced = lock_time(&std::fs::read_to_string(&log_file).unwrap_or_default(), from).is_some();
            if cpu.is_some() && synced && !probes.is_empty() {
                break;
            }
            assert!(connecting.elapsed() < Duration::from_secs(120), "not synchronized:\n{log}");
            probes.push(probe(&env, &mut client, &pid).await);
        }
        let synced_in = connecting.elapsed();
        let cpu = cpu.unwrap_or_default();
        let field =
            |k: &str| line.split(&format!(" {k}=")).nth(1).and_then(|v| v.split(' ').next()).unwrap_or("?").to_owned();
        let deadline = Instant::now() + Duration::from_secs(60);
        let lock = loop {
            let log = std::fs::read_to_string(&log_file).unwrap_or_default();
            match lock_time(&log, from) {
                Some(t) => break t,
                None if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
                None => panic!("no Synchronize of {PLUGIN} in {}", log_file.display()),
            }
        };
        let (median, max) = median_max(&mut probes);
        rows.push((what, field("containers"), field("updates"), field("held"), lock * 1e3, cpu as f64 / 1e6));
        probed.push((what, synced_in.as_secs_f64() * 1e3, probes.len(), median, max));
        hooks = Some(h);
    }
    let shares = made[0].cgroup_file("cpu", "cpu.shares");
    assert_eq!(shares, "512", "runtime-hooks' batch shares");
    drop(hooks);
    println!(
        "Synchronize on containerd {} with NRI: {pods} BE pods of one container (made in {:.0} s), runtime-hooks NRI mode\n",
        env.version,
        made_in.as_secs_f64()
    );
    println!("| connection | containers | updates answered | already held | containerd's NRI lock, ms | runtime-hooks CPU until synchronized, ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, containers, updates, held, lock, cpu) in rows {
        println!("| {what} | {containers} | {updates} | {held} | {lock:.0} | {cpu:.0} |");
    }
    let (median, max) = median_max(&mut idle);
    println!("\nRunPodSandbox of a probe pod meanwhile (on the idle node before: median {median:.0} ms, longest {max:.0} ms):\n");
    println!("| connection | from the plugin's start to synchronized, ms | probes | RunPodSandbox median, ms | longest, ms |");
    println!("|---|---:|---:|---:|---:|");
    for (what, synced, n, median, max) in probed {
        println!("| {what} | {synced:.0} | {n} | {median:.0} | {max:.0} |");
    }
}
