//! The standalone reconciler on large nodes: 50 and 250 pods × 4 containers of
//! `test_support::scale` (half BE, 4 in 10 LS, 1 in 10 LSR), served by the CRI stand-in
//! (`test_support::cri_node`), their cgroups in a v1 tree in a temp directory. No runtime needed.
//!
//! In process (the reconciler and the built-in plugins, koordlet's default rules, on this
//! thread; the stand-in on a thread of its own), per size:
//!
//! * **first pass**: CPU time of this thread (`CLOCK_THREAD_CPUTIME_ID`: the reconciler and its
//!   CRI client) and wall time, files corrected;
//! * **unchanged pass**: p50 and max of the same over `RP_BENCH_RECON_PASSES` passes (default
//!   20), each writing nothing; bytes allocated by this thread per pass (a counting global
//!   allocator), p50 and max, and whether the last passes allocate more than the first (growth);
//! * **files per unchanged pass**: the cgroup files one pass opens to read and to write, from
//!   `strace -e trace=openat` attached to this thread for one pass (skipped without strace).
//!
//! With the runtime-hooks binary in standalone mode (release, default `--reconcile-interval`
//! 10 s, rules from a file):
//!
//! * **steady state** at 250 pods: its CPU over `RP_BENCH_RECON_SECS` seconds (default 60) after
//!   its first pass, as % of one core (`/proc/PID/task/*/schedstat`);
//! * **RSS** after the first pass at 50 and 250 pods, and per pod (the difference over 200 pods);
//! * **rule change**: the rules file rewritten (a NodeSLO turning group identity on) to every
//!   pod's `cpu.bvt_warp_ns` holding its class's value, at 250 pods.
//!
//! Run: `make bench`, or `cargo bench -p runtime-hooks --bench reconciler` (no runtime needed).

#[path = "../tests/common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Hooks;
use nri_plugin::proto::api as nri;
use runtime_hooks::cgroup::{CgroupFs, CgroupVersion};
use runtime_hooks::cgroup_path::CgroupDriver;
use runtime_hooks::framework::Framework;
use runtime_hooks::plugin::FailurePolicy;
use runtime_hooks::rules::RulesStore;
use runtime_hooks::standalone::reconciler::Reconciler;
use test_support::cri_node::CriNode;
use test_support::scale::{self, Qos};

const SIZES: [usize; 2] = [50, 250];
const PER_POD: usize = 4;

/// Counts the bytes allocated by threads that turned counting on.
struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards every call unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// CPU time of the calling thread, nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn p50(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// One node: its pods, containers, cgroup tree and CRI stand-in (on `stand_in`'s runtime).
struct Node {
    dir: tempfile::TempDir,
    pods: Vec<nri::PodSandbox>,
    runtime: CriNode,
}

impl Node {
    fn new(pods: usize, stand_in: &tokio::runtime::Runtime) -> Node {
        let dir = tempfile::Builder::new().prefix("rh-recon-bench").tempdir().unwrap();
        let (pods, containers) = scale::nri_node(pods, PER_POD);
        scale::cgroup_v1_node(&dir.path().join("cgroup"), &pods, &containers).unwrap();
        let _guard = stand_in.enter();
        let runtime = CriNode::start(&dir.path().join("cri.sock"), &pods, &containers);
        Node { dir, pods, runtime }
    }

    fn root(&self) -> std::path::PathBuf {
        self.dir.path().join("cgroup")
    }
}

struct InProcess {
    pods: usize,
    first_cpu: u64,
    first_wall: u64,
    first_corrected: usize,
    cpu: Vec<u64>,
    wall: Vec<u64>,
    allocated: Vec<u64>,
    /// Cgroup files opened for reading and for writing in one unchanged pass; `None` without strace.
    files: Option<(usize, usize)>,
}

/// The cgroup files (below `root`) that one `pass` opens, for reading and for writing, from
/// `strace` attached to this thread; `None` when strace cannot be run or attach.
fn traced<F: FnOnce()>(root: &Path, pass: F) -> Option<(usize, usize)> {
    // SAFETY: gettid(2) has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let out = root.with_file_name("strace.out");
    let mut strace = std::process::Command::new("strace")
        .args(["-qq", "-e", "trace=openat", "-o"])
        .arg(&out)
        .args(["-p", &tid.to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let status = format!("/proc/self/task/{tid}/status");
    let attached = || {
        let s = std::fs::read_to_string(&status).unwrap_or_default();
        s.lines().any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
    };
    let start = Instant::now();
    while !attached() {
        if start.elapsed() > Duration::from_secs(5) || strace.try_wait().ok().flatten().is_some() {
            let _ = strace.kill();
            let _ = strace.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    pass();
    // SAFETY: kill(2) on our own child: strace detaches on SIGINT.
    unsafe { libc::kill(strace.id() as i32, libc::SIGINT) };
    let _ = strace.wait();
    let text = std::fs::read_to_string(&out).ok()?;
    let root = root.display().to_string();
    let opens = text.lines().filter(|l| l.contains(&root));
    let (mut read, mut written) = (0, 0);
    for l in opens {
        if l.contains("O_WRONLY") || l.contains("O_RDWR") {
            written += 1;
        } else {
            read += 1;
        }
    }
    Some((read, written))
}

fn in_process(pods: usize, passes: usize, stand_in: &tokio::runtime::Runtime) -> InProcess {
    let node = Node::new(pods, stand_in);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let cgroups = CgroupFs::new(node.root(), CgroupVersion::V1).with_driver(Some(CgroupDriver::Cgroupfs));
    let framework = Arc::new(Framework::new(
        runtime_hooks::plugins::builtin(),
        FailurePolicy::Ignore,
        RulesStore::defaults(),
        Arc::new(cgroups),
    ));
    let mut reconciler = rt.block_on(async { Reconciler::new(framework, node.runtime.socket()) });
    let mut pass = |count: bool| {
        let (cpu, wall) = (thread_cpu_ns(), Instant::now());
        let before = ALLOCATED.load(Ordering::Relaxed);
        COUNTING.with(|c| c.set(count));
        let report = rt.block_on(reconciler.reconcile()).expect("a pass");
        COUNTING.with(|c| c.set(false));
        let allocated = ALLOCATED.load(Ordering::Relaxed) - before;
        assert_eq!((report.pods, report.containers), (pods, pods * PER_POD));
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        (thread_cpu_ns() - cpu, wall.elapsed().as_nanos() as u64, allocated, report.corrected.len())
    };
    let (first_cpu, first_wall, _, first_corrected) = pass(false);
    let (mut cpu, mut wall, mut allocated) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..passes {
        let (c, w, a, corrected) = pass(true);
        assert_eq!(corrected, 0, "an unchanged pass writes nothing");
        cpu.push(c);
        wall.push(w);
        allocated.push(a);
    }
    let files = traced(&node.root(), || {
        pass(false);
    });
    InProcess { pods, first_cpu, first_wall, first_corrected, cpu, wall, allocated, files }
}

const RULES_OFF: &str = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: bench}\nspec: {}\n";
const RULES_ON: &str = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: bench}\nspec:\n  \
                        resourceQOSStrategy:\n    lsrClass: {cpuQOS: {enable: true, groupIdentity: 2}}\n    \
                        lsClass: {cpuQOS: {enable: true, groupIdentity: 2}}\n    \
                        beClass: {cpuQOS: {enable: true, groupIdentity: -1}}\n";

/// runtime-hooks in standalone mode on `node`, default interval, after its first pass.
fn binary(node: &Node) -> Hooks {
    let rules = node.dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES_OFF).unwrap();
    let root = node.root();
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        node.runtime.socket().to_str().unwrap(),
        "--rules",
        rules.to_str().unwrap(),
        "--cgroup-root",
        root.to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--cgroup-driver",
        "cgroupfs",
        "--unchecked-cgroup-root",
    ];
    let hooks = Hooks::start_logging(&args, node.dir.path().join("hooks.log"), "info");
    assert!(
        hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(60)),
        "no first pass:\n{}",
        hooks.log()
    );
    hooks
}

/// Rewrites the rules file (atomically) to `text`.
fn set_rules(node: &Node, text: &str) {
    let tmp = node.dir.path().join(".rules.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, node.dir.path().join("rules.yaml")).unwrap();
}

/// Whether every pod's `cpu.bvt_warp_ns` holds its class's value with group identity on.
fn all_bvt_set(node: &Node) -> bool {
    node.pods.iter().enumerate().all(|(i, pod)| {
        let parent = pod.linux.as_ref().unwrap().cgroup_parent.trim_start_matches('/');
        let want = if Qos::of(i) == Qos::Be { "-1" } else { "2" };
        let path = node.root().join("cpu").join(parent).join("cpu.bvt_warp_ns");
        std::fs::read_to_string(path).is_ok_and(|v| v.trim() == want)
    })
}

fn main() {
    let passes: usize = std::env::var("RP_BENCH_RECON_PASSES").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let secs: u64 = std::env::var("RP_BENCH_RECON_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(60);
    let stand_in = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();

    let rows: Vec<InProcess> = SIZES.iter().map(|&pods| in_process(pods, passes, &stand_in)).collect();
    println!("runtime-hooks' standalone reconciler, in process ({PER_POD} containers per pod; CRI stand-in, cgroup v1 tree in a temp dir)\n");
    println!("| pods | first pass: corrected | CPU ms | wall ms | unchanged pass: CPU ms p50 (max) | wall ms p50 | allocated KiB p50 (max) | cgroup files read / written |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in &rows {
        let files = r.files.map_or("(no strace)".to_owned(), |(rd, wr)| format!("{rd} / {wr}"));
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} ({:.1}) | {:.1} | {:.0} ({:.0}) | {files} |",
            r.pods,
            r.first_corrected,
            ms(r.first_cpu),
            ms(r.first_wall),
            ms(p50(r.cpu.clone())),
            ms(*r.cpu.iter().max().unwrap()),
            ms(p50(r.wall.clone())),
            p50(r.allocated.clone()) as f64 / 1024.0,
            *r.allocated.iter().max().unwrap() as f64 / 1024.0,
        );
    }
    for r in &rows {
        let half = r.allocated.len() / 2;
        let (early, late) = (&r.allocated[..half], &r.allocated[half..]);
        let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        println!(
            "\n{} pods: allocated per unchanged pass, first half {:.0} B, second half {:.0} B (growth {:+.1} %)",
            r.pods,
            mean(early),
            mean(late),
            (mean(late) / mean(early) - 1.0) * 100.0
        );
    }

    // The binary: RSS at both sizes; steady CPU and the rule change at the largest.
    let mut rss = Vec::new();
    for &pods in &SIZES {
        let node = Node::new(pods, &stand_in);
        let hooks = binary(&node);
        std::thread::sleep(Duration::from_secs(1));
        rss.push((pods, test_support::rss_kib(hooks.pid())));
        if pods != SIZES[SIZES.len() - 1] {
            continue;
        }
        let pid = hooks.pid();
        let before = (test_support::cpu_ns(pid), Instant::now());
        let passes_before = hooks.count(&["reconciled"]);
        std::thread::sleep(Duration::from_secs(secs));
        let (cpu, wall) = (test_support::cpu_ns(pid) - before.0, before.1.elapsed());
        let rss_after = test_support::rss_kib(pid);
        println!(
            "\nruntime-hooks --mode standalone, {pods} pods x {PER_POD}, default interval (10 s): {:.2} % of a core over {:.0} s \
             ({:.1} ms CPU; {} passes logged at info: only passes that correct something or follow a rule change are); \
             RSS {} KiB after the first pass, {} KiB after {secs} s",
            cpu as f64 / wall.as_nanos() as f64 * 100.0,
            wall.as_secs_f64(),
            ms(cpu),
            hooks.count(&["reconciled"]) - passes_before,
            rss[rss.len() - 1].1,
            rss_after,
        );
        let start = Instant::now();
        set_rules(&node, RULES_ON);
        while !all_bvt_set(&node) {
            assert!(start.elapsed() < Duration::from_secs(30), "the rule change did not arrive:\n{}", hooks.log());
            std::thread::sleep(Duration::from_millis(2));
        }
        println!(
            "rule change (rules file rewritten: group identity on) to all {pods} pods' cpu.bvt_warp_ns set: {:.0} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    let (small, large) = (rss[0], rss[rss.len() - 1]);
    println!(
        "RSS after the first pass: {} pods {} KiB, {} pods {} KiB: {:.1} KiB per pod ({PER_POD} containers)",
        small.0,
        small.1,
        large.0,
        large.1,
        (large.1 as f64 - small.1 as f64) / (large.0 - small.0) as f64
    );
}
