//! Helpers shared by the benches (`mod common;` in each): percentiles, the raw byte relay, CPU
//! time and context switches of a process, the load average, the stand-in node's server, the
//! proxy's own-time histogram.
//!
//! Each bench is its own crate and uses only some of these, hence `allow(dead_code)`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::fake_node::{FakeNode, NodeShape};

/// Nearest-rank percentile `p` (0 < p ≤ 1) of `sorted`, which must not be empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// `d` in microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `socat UNIX-LISTEN:<socket>,fork UNIX-CONNECT:<backend>`, a raw byte relay (one more process
/// that copies bytes and understands nothing: the floor for any proxy on the path); killed when
/// dropped.
pub struct Relay {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Relay {
    /// Starts socat in front of `backend` on a fresh temp socket and waits (up to 10 s) until it listens.
    pub fn start(backend: &Path) -> Relay {
        let dir = tempfile::Builder::new().prefix("rp-bench-relay").tempdir().expect("temp dir");
        let socket = dir.path().join("relay.sock");
        let child = Command::new("socat")
            .arg(format!("UNIX-LISTEN:{},fork", socket.display()))
            .arg(format!("UNIX-CONNECT:{}", backend.display()))
            .stdin(Stdio::null())
            .spawn()
            .expect("socat (Debian package socat; `make bench` installs it)");
        let start = Instant::now();
        while !socket.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "socat did not listen on {}", socket.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        Relay { child, socket, _dir: dir }
    }

    /// The relay's listening socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The listening socat's process ID (it forks one child per connection).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU time (ns, `/proc/PID/task/*/schedstat`) and context switches (voluntary + involuntary,
/// `/proc/PID/task/*/status`) of process `pid`, all threads, and with `children` those of its
/// child processes too, recursively (socat forks one per connection): the live ones' own, plus
/// the CPU time of those that ended and were reaped (`cutime` + `cstime` of `/proc/PID/stat`, in
/// clock ticks), so a child that ended between two samples is not lost. (0, 0) for a process
/// that is gone.
pub fn usage(pid: u32, children: bool) -> (u64, u64) {
    let (mut ns, mut switches) = (0, 0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    if children {
        ns += reaped_children_ns(pid);
    }
    for task in tasks.flatten() {
        let path = task.path();
        if let Some(v) = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            ns += v;
        }
        for line in std::fs::read_to_string(path.join("status")).unwrap_or_default().lines() {
            if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
        if !children {
            continue;
        }
        for child in std::fs::read_to_string(path.join("children")).unwrap_or_default().split_whitespace() {
            if let Ok(c) = child.parse::<u32>() {
                let (n, s) = usage(c, true);
                ns += n;
                switches += s;
            }
        }
    }
    (ns, switches)
}

/// CPU time (ns) of `pid`'s children that ended and were waited for: `cutime` + `cstime`, the
/// 16th and 17th fields of `/proc/PID/stat` (clock ticks, `sysconf(_SC_CLK_TCK)`); 0 when unreadable.
fn reaped_children_ns(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = after.split_whitespace().skip(13).take(2).filter_map(|v| v.parse().ok()).collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    fields.iter().sum::<u64>() * (1_000_000_000 / tick)
}

/// The 1, 5 and 15 minute load averages, e.g. `1.20 0.85 0.70`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The whole machine's CPU time so far (`/proc/stat`, clock ticks of all CPUs): (busy, total),
/// busy being everything but idle and iowait.
pub fn machine_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user and nice)
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// The CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The stand-in runtime of a node of pods that already run (`test_support::fake_node`), served
/// from a thread and runtime of its own (as a runtime in its own process would); stops when dropped.
pub struct NodeServer {
    /// The node it serves.
    pub node: Arc<FakeNode>,
    /// Its CRI socket.
    pub socket: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NodeServer {
    pub fn start(shape: &NodeShape) -> NodeServer {
        let node = Arc::new(FakeNode::new(shape));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = node.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                let fake = FakeBackend::start(Behaviour::Node(served)).await;
                ready_tx.send(fake.socket().to_owned()).unwrap();
                let _ = stopped.await;
                drop(fake);
            });
        });
        let socket = ready_rx.recv().unwrap();
        NodeServer { node, socket, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for NodeServer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The cumulative bucket counts (upper bound in seconds, count) of the own-time histogram of
/// `stage` on the metrics endpoint `addr`.
pub fn own_buckets(addr: &str, stage: &str) -> Vec<(f64, u64)> {
    let (_, body) = test_support::http_get(addr, "/metrics");
    let mut out: Vec<(f64, u64)> = body
        .lines()
        .filter(|l| l.starts_with("runtime_proxy_hooked_call_own_duration_seconds_bucket{"))
        .filter(|l| l.contains(&format!("stage=\"{stage}\"")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The median of the observations between two scrapes of [`own_buckets`], in microseconds,
/// interpolated linearly within its bucket.
pub fn p50_us(before: &[(f64, u64)], after: &[(f64, u64)]) -> f64 {
    let count = |v: &[(f64, u64)], i: usize| v.get(i).map_or(0, |b| b.1);
    let total = count(after, after.len().saturating_sub(1)) - count(before, before.len().saturating_sub(1));
    let half = total as f64 / 2.0;
    let mut lower = (0.0, 0u64);
    for (i, (le, n)) in after.iter().enumerate() {
        let n = n - count(before, i);
        if n as f64 >= half && n > 0 {
            let (lo, below) = lower;
            let hi = if le.is_finite() { *le } else { lo * 2.0 };
            let within = (half - below as f64) / (n - below).max(1) as f64;
            return (lo + (hi - lo) * within) * 1e6;
        }
        lower = (*le, n);
    }
    0.0
}
