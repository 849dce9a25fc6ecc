//! What the pass-through adds per unary CRI call, next to what a raw byte relay adds: Version and
//! ListContainers against a real containerd over three paths, interleaved call by call in one run
//! so all see the same machine state:
//!
//! * direct: the client talks to containerd's socket;
//! * relay: through `socat UNIX-LISTEN,fork UNIX-CONNECT` (one more process that copies bytes and
//!   understands nothing: the floor for any proxy on the path);
//! * proxy: through a release-built runtime-proxy (pass-through: these methods are not hooked).
//!
//! Printed: p50/p99 of each path, what relay and proxy add over direct, their ratio, the CPU time
//! and context switches per call of the relay and the proxy processes, the load average before
//! and after, and whether the latency targets hold (added p50 ≤ 1.2× the relay's, added p99
//! ≤ 1.5× the relay's, proxy CPU ≤ 40 µs per call).
//!
//! Run: `make bench` (starts containerd; or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy
//! --bench latency`). `RP_BENCH_CALLS` sets the measured calls per method and path (default
//! 5000). `RP_BENCH_STRACE=1` then also counts the proxy's system calls per call (`strace -c -f`
//! attached to it during 2000 further Version calls; slow, so not by default);
//! `RP_BENCH_STRACE=/abs/file` writes a full trace of 5 calls there. `RP_BENCH_PROXY_BIN` runs
//! another program as the proxy (e.g. a script that execs it under valgrind), stopped with
//! SIGTERM at the end.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cpus, loadavg, percentile, us, usage, Relay};

use k8s_cri::v1 as cri;
use test_support::containerd::Containerd;
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const WARM_UP: usize = 500;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Containerd::from_env();
    let calls: usize = std::env::var("RP_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    std::env::set_var("RP_TEST_LOG", "warn");
    // RP_BENCH_PROXY_BIN: another program to start as the proxy (e.g. a script that execs the
    // proxy under `valgrind --tool=callgrind`); it is stopped with SIGTERM at the end.
    let wrapped = std::env::var("RP_BENCH_PROXY_BIN").ok();
    let proxy = ProxyProcess::start(wrapped.as_deref().unwrap_or(BIN), &env.socket, &[]);
    let relay = Relay::start(&env.socket);
    let mut clients = [runtime_client(&env.socket), runtime_client(relay.socket()), runtime_client(proxy.socket())];
    let load_before = loadavg();

    // [method][path]
    let mut samples: [[Vec<Duration>; 3]; 2] = Default::default();
    let (mut proxy_start, mut relay_start) = ((0, 0), (0, 0));
    for i in 0..(calls + WARM_UP) {
        if i == WARM_UP {
            proxy_start = usage(proxy.pid(), false);
            relay_start = usage(relay.pid(), true);
        }
        for (m, s) in samples.iter_mut().enumerate() {
            for (p, client) in clients.iter_mut().enumerate() {
                let start = Instant::now();
                if m == 0 {
                    client.version(cri::VersionRequest::default()).await.expect("Version");
                } else {
                    client.list_containers(cri::ListContainersRequest::default()).await.expect("ListContainers");
                }
                if i >= WARM_UP {
                    s[p].push(start.elapsed());
                }
            }
        }
    }
    let (proxy_end, relay_end) = (usage(proxy.pid(), false), usage(relay.pid(), true));
    let load_after = loadavg();
    let per_call = |end: (u64, u64), start: (u64, u64)| {
        let n = (2 * calls) as f64;
        ((end.0 - start.0) as f64 / 1e3 / n, (end.1 - start.1) as f64 / n)
    };
    let (proxy_cpu, proxy_cs) = per_call(proxy_end, proxy_start);
    let (relay_cpu, relay_cs) = per_call(relay_end, relay_start);

    println!(
        "### Pass-through vs raw relay — `cargo bench -p runtime-proxy --bench latency` (containerd {}; {calls} calls per method and path, interleaved, after {WARM_UP} warm-up rounds; tonic client)",
        env.version
    );
    println!();
    println!("load average before: {load_before}; after: {load_after} ({} CPUs)", cpus());
    println!();
    println!("| method | direct p50 | relay p50 | proxy p50 | relay added p50 | proxy added p50 | ratio | direct p99 | relay p99 | proxy p99 | relay added p99 | proxy added p99 | ratio |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worst = (0.0f64, 0.0f64);
    for (m, name) in ["Version", "ListContainers"].iter().enumerate() {
        for s in samples[m].iter_mut() {
            s.sort();
        }
        let p50: Vec<f64> = samples[m].iter().map(|s| us(percentile(s, 0.5))).collect();
        let p99: Vec<f64> = samples[m].iter().map(|s| us(percentile(s, 0.99))).collect();
        let (r50, x50, r99, x99) = (p50[1] - p50[0], p50[2] - p50[0], p99[1] - p99[0], p99[2] - p99[0]);
        // A relay that (by noise) adds nothing or less makes the ratio meaningless; floor at 1 µs.
        let (q50, q99) = (x50 / r50.max(1.0), x99 / r99.max(1.0));
        worst = (worst.0.max(q50), worst.1.max(q99));
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:.0} µs | {r50:+.0} µs | {x50:+.0} µs | {q50:.2} | {:.0} µs | {:.0} µs | {:.0} µs | {r99:+.0} µs | {x99:+.0} µs | {q99:.2} |",
            p50[0], p50[1], p50[2], p99[0], p99[1], p99[2]
        );
    }
    println!();
    println!("| process | CPU time per call | context switches per call |");
    println!("|---|---|---|");
    println!("| relay (socat) | {relay_cpu:.1} µs | {relay_cs:.2} |");
    println!("| runtime-proxy | {proxy_cpu:.1} µs | {proxy_cs:.2} |");
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!("Targets, worst method:");
    println!("* proxy added p50 ≤ 1.2 × relay added p50: {:.2}× — {}", worst.0, verdict(worst.0 <= 1.2));
    println!("* proxy added p99 ≤ 1.5 × relay added p99: {:.2}× — {}", worst.1, verdict(worst.1 <= 1.5));
    println!("* proxy CPU per forwarded call ≤ 40 µs: {proxy_cpu:.1} µs — {}", verdict(proxy_cpu <= 40.0));
    println!();
    println!(
        "CPU time: on-CPU time of all threads (and, for socat, its forked child) over the measured calls \
         (/proc/PID/task/*/schedstat), per call; context switches from /proc/PID/task/*/status. Wall-clock \
         latencies on a shared machine rise with its load; CPU time and switches per call hardly do."
    );

    match std::env::var("RP_BENCH_STRACE").as_deref() {
        Ok("1") => strace_counts(&proxy, &mut clients[2], None).await,
        // A full trace of 5 calls, to see what each system call carries.
        Ok(path) if path.starts_with('/') => strace_counts(&proxy, &mut clients[2], Some(Path::new(path))).await,
        _ => {}
    }
    if wrapped.is_some() {
        proxy.signal(libc::SIGTERM);
        let mut proxy = proxy;
        proxy.wait_exit(Duration::from_secs(60));
    }
}

/// `strace -c -f` attached to the proxy during 2000 Version calls: system calls per call.
/// With `trace`, writes the full trace of 5 calls there instead.
async fn strace_counts(
    proxy: &ProxyProcess,
    client: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    trace: Option<&Path>,
) {
    let n: usize = if trace.is_some() { 5 } else { 2000 };
    let out = tempfile::NamedTempFile::new().expect("temp file");
    let mut strace = Command::new("strace")
        .args(if trace.is_some() { &["-f", "-tt", "-s", "64", "-o"][..] } else { &["-c", "-f", "-o"][..] })
        .arg(trace.unwrap_or(out.path()))
        .args(["-p", &proxy.pid().to_string()])
        .stderr(Stdio::null())
        .spawn()
        .expect("strace");
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..n {
        client.version(cri::VersionRequest::default()).await.expect("Version");
    }
    // SIGINT detaches strace, which then writes its summary.
    unsafe { libc::kill(strace.id() as i32, libc::SIGINT) };
    let _ = strace.wait();
    if trace.is_some() {
        return;
    }
    let text = std::fs::read_to_string(out.path()).unwrap_or_default();
    println!();
    println!("System calls of the proxy per Version call (`strace -c -f`, {n} calls):");
    println!();
    println!("| syscall | per call |");
    println!("|---|---|");
    let mut total = 0.0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // % time, seconds, usecs/call, calls, [errors], syscall
        if f.len() >= 5 && f[0].parse::<f64>().is_ok() && f.last() != Some(&"total") {
            let calls: f64 = f[3].parse().unwrap_or(0.0);
            let per = calls / n as f64;
            total += per;
            if per >= 0.01 {
                println!("| {} | {per:.2} |", f.last().unwrap_or(&"?"));
            }
        }
    }
    println!("| **total** | **{total:.2}** |");
}
