//! Throughput of the pass-through under concurrency: many callers at once, on one HTTP/2
//! connection and on 16, against a real containerd over three paths:
//!
//! * direct: the callers talk to containerd's socket;
//! * relay: through `socat UNIX-LISTEN,fork UNIX-CONNECT` (a raw byte relay, one socat process
//!   per connection: the floor for any extra process on the path);
//! * proxy: through a release-built runtime-proxy (pass-through: these methods are not hooked;
//!   it multiplexes all its client connections onto its one connection to containerd).
//!
//! Four shapes: 16 and 64 callers on 1 connection, 16 and 64 callers on 16 connections (one tonic
//! `Channel` is one HTTP/2 connection; caller i uses connection i mod 16). Each caller makes
//! unary calls back to back, alternating Version and ListContainers (both pass-through), until
//! its round ends. The paths take turns in short rounds (every shape and path once per round,
//! the path order rotated), so all see the same machine state; a round of one shape and path
//! lasts `RP_BENCH_CONC_ROUND_MS`, and ends when the last call started before then returns.
//! One warm-up round (200 ms each) first connects every connection.
//!
//! Printed: for each shape, calls/s of each path (calls completed / wall time, summed over the
//! rounds), the relay/direct and proxy/direct throughput ratios, p50/p99 of the calls' latencies,
//! and whether the throughput target holds (proxy throughput ≥ 90% of direct); then the CPU
//! time per call of each process on the path (the bench client, socat or runtime-proxy,
//! containerd: `/proc/PID/task/*/schedstat` of all threads, as `benches/latency.rs`) and the
//! relay's or proxy's context switches per call, which show where the CPU time goes; how many
//! CPUs the whole machine kept busy meanwhile (`/proc/stat`: when that is all of them, the calls
//! are CPU-bound and throughput follows the CPU time per call, whoever spends it); and the load
//! average before and after.
//!
//! Run: `make bench` (starts containerd; or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy
//! --bench concurrency`). `RP_BENCH_CONC_ROUNDS` sets the rounds (default 6),
//! `RP_BENCH_CONC_ROUND_MS` the length of one shape and path's turn in a round (default 600 ms):
//! 4 shapes × 3 paths × 6 × 0.6 s ≈ 45 s of measurement by default.

mod common;

use std::time::{Duration, Instant};

use common::{cpus, loadavg, machine_cpu, percentile, us, usage, Relay};
use k8s_cri::v1 as cri;
use test_support::containerd::Containerd;
use test_support::proxy::ProxyProcess;
use test_support::{channel, runtime_client_from};
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
/// (callers, connections).
const SHAPES: [(usize, usize); 4] = [(16, 1), (64, 1), (16, 16), (64, 16)];
const PATHS: [&str; 3] = ["direct", "relay", "proxy"];
const WARM_UP: Duration = Duration::from_millis(200);
/// The target: proxy throughput ≥ this share of direct.
const TARGET: f64 = 0.9;

/// What one shape and path measured over all rounds.
#[derive(Default)]
struct Cell {
    calls: usize,
    wall: Duration,
    samples: Vec<Duration>,
    /// CPU time (ns) during this cell's turns of: the bench client, the relay or proxy (0 on the
    /// direct path), containerd.
    cpu_ns: [u64; 3],
    /// Context switches of the relay or proxy during this cell's turns.
    switches: u64,
    /// The whole machine's (busy, total) CPU clock ticks during this cell's turns.
    machine: (u64, u64),
}

impl Cell {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.wall.as_secs_f64()
    }

    /// CPU time per call (µs) of process `i` of `cpu_ns`.
    fn cpu_per_call(&self, i: usize) -> f64 {
        self.cpu_ns[i] as f64 / 1e3 / self.calls as f64
    }
}

/// `callers` tasks on `channels` (caller i on channel i mod len), each making calls back to back
/// until `length` has passed. Returns every call's latency and the wall time until the last
/// call returned.
async fn turn(channels: &[Channel], callers: usize, length: Duration) -> (Vec<Duration>, Duration) {
    let start = Instant::now();
    let deadline = start + length;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let mut client = runtime_client_from(channels[i % channels.len()].clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                // Half the callers start with each method.
                let mut n = i;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    if n % 2 == 0 {
                        client.version(cri::VersionRequest::default()).await.expect("Version");
                    } else {
                        client.list_containers(cri::ListContainersRequest::default()).await.expect("ListContainers");
                    }
                    samples.push(t.elapsed());
                    n += 1;
                }
                samples
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("caller task"));
    }
    (all, start.elapsed())
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Containerd::from_env();
    let rounds = env_or("RP_BENCH_CONC_ROUNDS", 6).max(1) as usize;
    let length = Duration::from_millis(env_or("RP_BENCH_CONC_ROUND_MS", 600).max(1));
    std::env::set_var("RP_TEST_LOG", "warn");
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    let relay = Relay::start(&env.socket);
    let containerd_pid = env.pid();
    let me = std::process::id();
    // channels[path][shape]: the shapes with the same number of connections share them.
    let sockets = [env.socket.as_path(), relay.socket(), proxy.socket()];
    let channels: Vec<Vec<Vec<Channel>>> = sockets
        .iter()
        .map(|socket| {
            let mut made: Vec<Vec<Channel>> = Vec::new();
            SHAPES
                .iter()
                .map(|&(_, conns)| {
                    if let Some(set) = made.iter().find(|set| set.len() == conns) {
                        return set.clone();
                    }
                    let set: Vec<Channel> = (0..conns).map(|_| channel(socket)).collect();
                    made.push(set.clone());
                    set
                })
                .collect()
        })
        .collect();
    // Connect every connection now, one at a time: many connects at once overflow socat's listen
    // backlog (5), which a non-blocking unix connect reports as EAGAIN.
    for set in channels.iter().flatten() {
        for ch in set {
            runtime_client_from(ch.clone()).version(cri::VersionRequest::default()).await.expect("Version");
        }
    }
    let containers = runtime_client_from(channels[0][0][0].clone())
        .list_containers(cri::ListContainersRequest::default())
        .await
        .expect("ListContainers")
        .into_inner()
        .containers
        .len();
    let load_before = loadavg();

    for (s, &(callers, _)) in SHAPES.iter().enumerate() {
        for path in &channels {
            turn(&path[s], callers, WARM_UP).await;
        }
    }

    // cells[shape][path]
    let mut cells: Vec<[Cell; 3]> = SHAPES.iter().map(|_| Default::default()).collect();
    // ([CPU ns of client, relay or proxy, containerd], switches of the relay or proxy)
    let cpu = |p: usize| {
        let middle = match p {
            1 => usage(relay.pid(), true),
            2 => usage(proxy.pid(), false),
            _ => (0, 0),
        };
        ([usage(me, false).0, middle.0, containerd_pid.map_or(0, |pid| usage(pid, false).0)], middle.1)
    };
    for round in 0..rounds {
        for (s, &(callers, _)) in SHAPES.iter().enumerate() {
            for k in 0..PATHS.len() {
                let p = (k + round + s) % PATHS.len();
                let (before, machine_before) = (cpu(p), machine_cpu());
                let (samples, wall) = turn(&channels[p][s], callers, length).await;
                let (after, machine_after) = (cpu(p), machine_cpu());
                let cell = &mut cells[s][p];
                cell.calls += samples.len();
                cell.wall += wall;
                cell.samples.extend(samples);
                for (total, (a, b)) in cell.cpu_ns.iter_mut().zip(after.0.iter().zip(before.0)) {
                    *total += a - b;
                }
                cell.switches += after.1 - before.1;
                cell.machine.0 += machine_after.0 - machine_before.0;
                cell.machine.1 += machine_after.1 - machine_before.1;
            }
        }
    }
    let load_after = loadavg();

    println!(
        "### Throughput under concurrency — `cargo bench -p runtime-proxy --bench concurrency` (containerd {}, {containers} containers; {rounds} rounds of {} ms per shape and path, paths rotated; tonic client; Version and ListContainers alternating)",
        env.version,
        length.as_millis()
    );
    println!();
    println!("load average before: {load_before}; after: {load_after} ({} CPUs)", cpus());
    println!();
    println!("| callers × connections | direct calls/s | relay calls/s | proxy calls/s | relay/direct | proxy/direct | direct p50 | relay p50 | proxy p50 | direct p99 | relay p99 | proxy p99 | proxy ≥ 90% of direct |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let mut held = 0;
    for (s, &(callers, conns)) in SHAPES.iter().enumerate() {
        let row = &mut cells[s];
        for cell in row.iter_mut() {
            cell.samples.sort();
        }
        let rate: Vec<f64> = row.iter().map(Cell::rate).collect();
        let p50: Vec<f64> = row.iter().map(|c| us(percentile(&c.samples, 0.5))).collect();
        let p99: Vec<f64> = row.iter().map(|c| us(percentile(&c.samples, 0.99))).collect();
        let (relay_ratio, proxy_ratio) = (rate[1] / rate[0], rate[2] / rate[0]);
        held += usize::from(proxy_ratio >= TARGET);
        println!(
            "| {callers} × {conns} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.0}% | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {:.0} µs | {} |",
            rate[0],
            rate[1],
            rate[2],
            relay_ratio * 100.0,
            proxy_ratio * 100.0,
            p50[0],
            p50[1],
            p50[2],
            p99[0],
            p99[1],
            p99[2],
            verdict(proxy_ratio >= TARGET)
        );
    }
    println!();
    println!("Target: proxy throughput ≥ 90% of direct: met in {held} of {} shapes.", SHAPES.len());
    println!();
    println!(
        "CPU time per call of each process on the path, during that path's turns (µs; sum × calls/s = CPUs busy with the calls; \
         the whole machine's busy CPUs from /proc/stat, other work included):"
    );
    println!();
    println!("| callers × connections | path | calls | bench client | socat / runtime-proxy | containerd | sum | CPUs busy with the calls | CPUs busy, whole machine | socat / runtime-proxy context switches per call |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (s, &(callers, conns)) in SHAPES.iter().enumerate() {
        for (p, name) in PATHS.iter().enumerate() {
            let cell = &cells[s][p];
            let [client, middle, ctrd] = [0, 1, 2].map(|i| cell.cpu_per_call(i));
            let (middle, switches) = if p == 0 {
                ("–".to_owned(), "–".to_owned())
            } else {
                (format!("{middle:.1}"), format!("{:.2}", cell.switches as f64 / cell.calls as f64))
            };
            let ctrd_text = if containerd_pid.is_some() { format!("{ctrd:.1}") } else { "?".to_owned() };
            let sum: f64 = (0..3).map(|i| cell.cpu_per_call(i)).sum();
            println!(
                "| {callers} × {conns} | {name} | {} | {client:.1} | {middle} | {ctrd_text} | {sum:.1} | {:.2} | {:.2} | {switches} |",
                cell.calls,
                sum * cell.rate() / 1e6,
                cell.machine.0 as f64 / cell.machine.1.max(1) as f64 * cpus() as f64
            );
        }
    }
    println!();
    println!(
        "Calls/s: calls completed over the summed wall time of that shape and path's turns (a turn ends when its last call \
         returns). Latencies: each call's, nearest-rank percentiles over all rounds. CPU: on-CPU time of all threads \
         (/proc/PID/task/*/schedstat; socat with its forked children) during the turns, per call; containerd's \
         includes whatever else it served meanwhile."
    );
}
