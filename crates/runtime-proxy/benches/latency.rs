//! Added latency of the proxy per unary CRI call: Version and ListContainers against a real
//! containerd, directly and through a release-built runtime-proxy, interleaved call by call in one
//! run so both see the same machine state.
//!
//! Run: `make bench` (starts containerd; or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy
//! --bench latency`). `RP_BENCH_CALLS` sets the measured calls per method and path (default 5000).

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use test_support::containerd::Containerd;
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let env = Containerd::from_env();
    let calls: usize = std::env::var("RP_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
    std::env::set_var("RP_TEST_LOG", "warn");
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    let mut direct = runtime_client(&env.socket);
    let mut proxied = runtime_client(proxy.socket());

    // [method][0 = direct, 1 = proxy]
    let mut samples: [[Vec<Duration>; 2]; 2] = Default::default();
    for i in 0..(calls + 500) {
        for (m, s) in samples.iter_mut().enumerate() {
            for (p, client) in [&mut direct, &mut proxied].into_iter().enumerate() {
                let start = Instant::now();
                if m == 0 {
                    client.version(cri::VersionRequest::default()).await.expect("Version");
                } else {
                    client.list_containers(cri::ListContainersRequest::default()).await.expect("ListContainers");
                }
                if i >= 500 {
                    s[p].push(start.elapsed());
                }
            }
        }
    }
    println!("containerd {} — {calls} calls per method and path, interleaved, after 500 warm-up rounds", env.version);
    println!("| method | direct p50 | proxy p50 | added p50 | direct p99 | proxy p99 | added p99 | p50 ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for (m, name) in ["Version", "ListContainers"].iter().enumerate() {
        let [d, p] = &mut samples[m];
        d.sort();
        p.sort();
        let us = |x: Duration| x.as_secs_f64() * 1e6;
        let (d50, p50, d99, p99) = (percentile(d, 0.5), percentile(p, 0.5), percentile(d, 0.99), percentile(p, 0.99));
        println!(
            "| {name} | {:.0} µs | {:.0} µs | {:+.0} µs | {:.0} µs | {:.0} µs | {:+.0} µs | {:.2} |",
            us(d50),
            us(p50),
            us(p50) - us(d50),
            us(d99),
            us(p99),
            us(p99) - us(d99),
            us(p50) / us(d50)
        );
    }
}
