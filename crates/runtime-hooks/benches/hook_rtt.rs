//! runtime-hooks as the hook server: the round trip of a BE pod's PreCreateContainer hook call
//! to the runtime-hooks binary (proxy mode; BatchResource, GroupIdentity and CPUSet on, as by
//! default, with a NodeSLO that turns group identity on) beside the same call to a no-op hook
//! server (it echoes the request, as koordlet does with nothing to change), each in a process
//! of its own, called with the same client (tonic, one connection each, 2 s deadline), call by
//! call interleaved. Target: p50(runtime-hooks) ≤ 1.2 × p50(no-op).
//!
//! runtime-hooks runs with a temp cgroup root (`--cgroup-version v1 --unchecked-cgroup-root`),
//! so its pod-level writes touch nothing of the machine, and logs at `info` (no line per call).
//!
//! Run: `cargo bench -p runtime-hooks --bench hook_rtt` (part of `make bench`; no containerd
//! needed). `RP_BENCH_CALLS` sets the measured calls per server (default 3000), after 500
//! warm-up rounds. `RP_BENCH_HOOKS_BIN` runs another program as runtime-hooks (e.g. a script
//! that execs it under `valgrind --tool=callgrind`); it is stopped with SIGTERM at the end.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{map, BE_SPEC, GROUP_IDENTITY_ON, HOOKS_BIN, QOS, SPEC};
use hook_api::v1alpha1::{
    ContainerMetadata, ContainerResourceHookRequest, LinuxContainerResources, PodSandboxMetadata,
};
use hook_api::RuntimeHookServiceClient;
use test_support::hooks::TestHook;

/// The daemons' allocator here too, so that the bench's own processes (the client and the no-op
/// hook server) allocate as runtime-hooks does: the comparison is of the servers' work, not of
/// two allocators.
#[global_allocator]
static ALLOCATOR: daemon_support::alloc::Allocator = daemon_support::alloc::Allocator;

const WARM_UP: usize = 500;
/// Set in the environment of the bench started again as the no-op hook server.
const NOOP_CHILD: &str = "RP_BENCH_NOOP_CHILD";

/// The no-op server (this bench started again): prints its socket, serves until stdin closes.
async fn serve_noop() {
    use tokio::io::AsyncReadExt;
    let noop = TestHook::echoing(|_, _| {}).await;
    println!("{}", noop.socket().display());
    let _ = tokio::io::stdin().read_to_end(&mut Vec::new()).await;
}

/// A BE pod's PreCreateContainer hook request as runtime-proxy builds it from kubelet's call
/// (container "main", kubelet's BestEffort resources, the batch resources in the pod's
/// extended-resource-spec annotation).
fn be_request() -> ContainerResourceHookRequest {
    ContainerResourceHookRequest {
        pod_meta: Some(PodSandboxMetadata {
            name: "be-0".into(),
            namespace: "default".into(),
            uid: "uid-be-0".into(),
            attempt: 0,
        }),
        container_meta: Some(ContainerMetadata { name: "main".into(), attempt: 0, id: String::new() }),
        pod_labels: map(&[
            (QOS, "BE"),
            ("app", "batch"),
            ("io.kubernetes.pod.name", "be-0"),
            ("io.kubernetes.pod.namespace", "default"),
        ]),
        pod_annotations: map(&[(SPEC, BE_SPEC), ("kubernetes.io/config.source", "api")]),
        container_annotations: map(&[
            ("io.kubernetes.container.hash", "3b2a9c1d"),
            ("io.kubernetes.container.restartCount", "0"),
        ]),
        container_envs: map(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("HOME", "/root"),
        ]),
        pod_cgroup_parent: "/kubepods/besteffort/poduid-be-0".into(),
        container_resources: Some(LinuxContainerResources {
            cpu_shares: 2,
            cpu_period: 100_000,
            oom_score_adj: 1000,
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::var_os(NOOP_CHILD).is_some() {
        return serve_noop().await;
    }
    let calls: usize = std::env::var("RP_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let dir = tempfile::Builder::new().prefix("rh-bench-rtt").tempdir().expect("temp dir");
    let (socket, config, cgroups, rules) = (
        dir.path().join("hooks.sock"),
        dir.path().join("hookserver.d"),
        dir.path().join("cgroup"),
        dir.path().join("rules.yaml"),
    );
    std::fs::create_dir_all(&config).expect("config dir");
    std::fs::create_dir_all(&cgroups).expect("cgroup root");
    std::fs::write(&rules, GROUP_IDENTITY_ON).expect("rules file");
    let log = std::fs::File::create(dir.path().join("hooks.log")).expect("log file");
    let path = |p: &PathBuf| p.to_str().expect("utf-8 temp dir").to_string();
    let bin = std::env::var("RP_BENCH_HOOKS_BIN").unwrap_or_else(|_| HOOKS_BIN.to_string());
    let mut hooks = Command::new(bin)
        .args(["--listen", &path(&socket), "--hook-config-dir", &path(&config), "--cgroup-root", &path(&cgroups)])
        .args([
            "--cgroup-version",
            "v1",
            "--unchecked-cgroup-root",
            "--cgroup-driver",
            "cgroupfs",
            "--rules",
            &path(&rules),
        ])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("start runtime-hooks");
    let started = Instant::now();
    while !config.join("runtime-hooks.json").exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "runtime-hooks did not register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut noop = Command::new(std::env::current_exe().expect("the bench's path"))
        .env(NOOP_CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the no-op hook server");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(noop.stdout.take().expect("piped")), &mut line)
        .expect("its socket");
    let noop_socket = PathBuf::from(line.trim());

    let mut clients = [
        RuntimeHookServiceClient::new(hook_api::connect(&noop_socket)),
        RuntimeHookServiceClient::new(hook_api::connect(&socket)),
    ];
    let req = be_request();
    // runtime-hooks' plugins must have run: BatchResource's shares for batch-cpu 500.
    let answer = clients[1].pre_create_container_hook(req.clone()).await.expect("runtime-hooks answers").into_inner();
    let shares = answer.container_resources.as_ref().map(|r| r.cpu_shares);
    assert_eq!(shares, Some(512), "runtime-hooks' answer: {answer:?}");

    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let pids = [noop.id(), hooks.id()];
    let mut samples = [Vec::with_capacity(calls), Vec::with_capacity(calls)];
    let mut cpu_before = [0; 2];
    for i in 0..WARM_UP + calls {
        if i == WARM_UP {
            cpu_before = pids.map(test_support::cpu_ns);
        }
        for k in 0..2 {
            // Alternate which server goes first.
            let s = (i + k) % 2;
            let mut call = tonic::Request::new(req.clone());
            call.set_timeout(Duration::from_secs(2));
            let start = Instant::now();
            clients[s].pre_create_container_hook(call).await.expect("PreCreateContainerHook");
            if i >= WARM_UP {
                samples[s].push(start.elapsed());
            }
        }
    }
    let cpu: Vec<f64> =
        (0..2).map(|s| (test_support::cpu_ns(pids[s]) - cpu_before[s]) as f64 / 1e3 / calls as f64).collect();
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // Connections closed first: runtime-hooks' graceful shutdown waits for open ones.
    drop(clients);
    drop(noop.stdin.take());
    let _ = noop.wait();
    // SIGTERM, not SIGKILL: a profiler wrapped around it (callgrind) then writes its output.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(hooks.id() as i32, libc::SIGTERM) };
    // Waited for on the runtime, so the dropped clients' connection tasks can close meanwhile.
    let stopping = Instant::now();
    while matches!(hooks.try_wait(), Ok(None)) {
        if stopping.elapsed() > Duration::from_secs(60) {
            let _ = hooks.kill();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for s in samples.iter_mut() {
        s.sort();
    }
    let p = |s: usize, q: f64| us(percentile(&samples[s], q));
    println!(
        "### runtime-hooks as the hook server — `cargo bench -p runtime-hooks --bench hook_rtt` ({calls} calls per server, interleaved, after {WARM_UP} warm-up rounds)"
    );
    println!();
    println!("load average before: {}; after: {}", load_before.trim(), load_after.trim());
    println!();
    println!("| hook server (BE PreCreateContainer, tonic client) | p50 | p99 | server CPU per call |");
    println!("|---|---|---|---|");
    let names = ["no-op (echo, tonic server)", "runtime-hooks (BatchResource, GroupIdentity, CPUSet)"];
    for s in 0..2 {
        println!("| {} | {:.0} µs | {:.0} µs | {:.1} µs |", names[s], p(s, 0.5), p(s, 0.99), cpu[s]);
    }
    let ratio = p(1, 0.5) / p(0, 0.5);
    let met = if ratio <= 1.2 { "met" } else { "NOT met" };
    println!("| **p50 ratio runtime-hooks / no-op** | **{ratio:.2}** | target ≤ 1.2: {met} | |");
}
