//! The admin endpoints as a local user may abuse them, against the real binary in front of a
//! real containerd: thousands of idle connections and huge heads on `--metrics-addr` while the
//! proxy has 1,024 descriptors (pods still start through a `Fail` hook server, `status` still
//! answers on the admin socket, the proxy's descriptors and memory stay bounded); the soft
//! open files limit raised at start; an admin address someone else holds stops the start (exit
//! 2, naming the flag); `status` refusing an admin socket another user serves.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// Connections the flood holds open at once (more than the 1,024 descriptors the proxy has).
const FLOOD: usize = 1_100;

/// The soft and hard open files limits of `pid` (`Max open files` of /proc/PID/limits).
fn nofile(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap().to_owned();
    let mut n = line.split_whitespace().skip(3).map(|v| v.parse().unwrap());
    (n.next().unwrap(), n.next().unwrap())
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// This test process's own soft open files limit raised to its hard limit (the flood needs
/// more than 1,024).
fn raise_own_nofile() {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
    assert!(l.rlim_cur as usize > FLOOD + 500, "the test needs more than {} descriptors: {}", FLOOD + 500, l.rlim_cur);
}

/// Until `stop`: [`FLOOD`] connections to `addr` opened in rounds, each sending an unfinished
/// head, the first 64 of each round a huge one (400 KB offered without waiting), held for half
/// a second, then opened anew (the proxy closes them: at once beyond its cap, or after its head
/// timeout). Counts the connections made in `made`; returns the rounds made.
fn flood(addr: String, stop: Arc<AtomicBool>, made: Arc<AtomicUsize>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let big = [b"GET /metrics HTTP/1.1\r\nX-Fill: ".as_slice(), &vec![b'a'; 400_000]].concat();
        let mut rounds = 0;
        while !stop.load(Ordering::SeqCst) {
            let mut conns = Vec::with_capacity(FLOOD);
            for i in 0..FLOOD {
                let Ok(mut c) = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1)) else {
                    continue;
                };
                let _ = c.set_nonblocking(true);
                let _ = c.write(if i < 64 { &big } else { b"GET /metrics HTTP/1.1\r\nHost: x\r\n" });
                conns.push(c);
                made.fetch_add(1, Ordering::SeqCst);
            }
            rounds += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
        rounds
    })
}

/// `runtime-proxy status` of the proxy whose socket is `socket`: its default admin socket
/// beside it, no TCP. Exit code and stdout, stderr.
fn status_by_socket(socket: &std::path::Path, extra: &[&str]) -> (i32, String) {
    let out =
        Command::new(BIN).arg("--koord-runtimeproxy-endpoint").arg(socket).arg("status").args(extra).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// 1,100 connections at a time on the admin endpoint, 64 of them with 400 KB heads, against a
/// proxy with 1,024 descriptors: pods still start through a `Fail` hook server (CRI and hook
/// connections get their descriptors), `status` answers on the admin socket, and the proxy
/// holds no more than its caps (descriptors, memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_admin_connections_leaves_pods_hooks_and_status_working() {
    raise_own_nofile();
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "guard.json", hook.socket(), "Fail", &["PreRunPodSandbox", "PreCreateContainer"], json!({}));
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "guard.json"], 0), "{}", proxy.log());
    let pid = proxy.pid();
    // What a unit without LimitNOFILE= gives, hard limit included (so no raise helps).
    let clamp = Command::new("prlimit").args(["--pid", &pid.to_string(), "--nofile=1024:1024"]).status().unwrap();
    assert!(clamp.success());
    assert_eq!(nofile(pid), (1024, 1024));
    let addr = proxy.admin_addr();
    let (fds_before, rss_before) = (open_fds(pid), test_support::rss_kib(pid));

    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let flooder = flood(addr.clone(), stop.clone(), made.clone());
    let (mut max_fds, mut max_rss) = (0, 0);
    let sample = |max_fds: &mut usize, max_rss: &mut u64| {
        *max_fds = (*max_fds).max(open_fds(pid));
        *max_rss = (*max_rss).max(test_support::rss_kib(pid));
    };
    // A first round of connections is open (the proxy closes those beyond its cap at once).
    let start = Instant::now();
    while made.load(Ordering::SeqCst) < FLOOD && start.elapsed() < Duration::from_secs(60) {
        sample(&mut max_fds, &mut max_rss);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(made.load(Ordering::SeqCst) >= FLOOD, "the flood made {} connections in 60 s", made.load(Ordering::SeqCst));

    // Under the flood: a pod through the proxy and its Fail hook server, status on the socket.
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("flood"), HashMap::new(), HashMap::new());
    let started = Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await;
    sample(&mut max_fds, &mut max_rss);
    let (code, shown) = status_by_socket(proxy.socket(), &[]);
    sample(&mut max_fds, &mut max_rss);
    stop.store(true, Ordering::SeqCst);
    let rounds = flooder.join().unwrap();
    let pod = started.unwrap_or_else(|e| panic!("a pod under the admin flood: {e:?}\n{}", proxy.log()));
    assert!(hook.seen().len() >= 2, "the hook server was called at both stages: {:?}", hook.seen().len());
    assert_eq!(code, 0, "status on the admin socket under the flood:\n{shown}");
    assert!(shown.contains("guard.json"), "{shown}");
    eprintln!(
        "admin flood: {rounds} rounds, {} connections in {:?}; proxy fds {fds_before} -> max {max_fds}, VmRSS {rss_before} KiB -> max {max_rss} KiB",
        made.load(Ordering::SeqCst),
        start.elapsed()
    );
    // 64 served connections, a few accepted and closed at once, the proxy's own.
    assert!(max_fds < fds_before + 200, "descriptors: {fds_before} before, {max_fds} under the flood");
    // 64 connections' 16 KiB head buffers are 1 MiB; 64 MiB is generous margin, 400 KB heads
    // read whole would be 25 MiB and more each round.
    assert!(max_rss < rss_before + 64 * 1024, "VmRSS: {rss_before} KiB before, {max_rss} KiB under the flood");
    assert!(proxy.log().contains("connections at their limit"), "the cap said so:\n{}", proxy.log());
    let (code, body) = test_support::http_get(&addr, "/healthz");
    assert_eq!(code, 200, "served again after the flood: {body}");
    pod.remove(&mut rt).await;
}

/// Started with a soft limit of 1,024 under a hard limit of 4,096 (as `prlimit` sets it before
/// exec), the proxy runs with 4,096 and says so.
#[test]
fn the_soft_open_files_limit_is_raised_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("limited-proxy");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec prlimit --nofile=1024:4096 -- {BIN} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let backend = dir.path().join("absent-runtime.sock");
    let proxy =
        ProxyProcess::start(wrapper.to_str().unwrap(), &backend, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert_eq!(nofile(proxy.pid()), (4096, 4096), "{}", proxy.log());
    assert!(
        proxy.log().contains("open files limit (RLIMIT_NOFILE) raised to the hard limit before=1024 after=4096"),
        "{}",
        proxy.log()
    );
}

/// An admin address or socket another process holds: the proxy does not start (exit 2), its
/// last line naming the flag and the address; its CRI socket is never bound.
#[test]
fn a_taken_admin_address_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().to_string();
    let live = dir.path().join("live.sock");
    let _live = std::os::unix::net::UnixListener::bind(&live).unwrap();
    for (i, (flag, value, says)) in [
        ("--metrics-addr", taken.clone(), format!("--metrics-addr {taken}: cannot listen: ")),
        ("--debug-addr", taken.clone(), format!("--debug-addr {taken}: cannot listen: ")),
        (
            "--admin-socket",
            live.display().to_string(),
            format!("--admin-socket {}: another process is serving", live.display()),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let socket = dir.path().join(format!("p{i}/proxy.sock"));
        let log = dir.path().join(format!("p{i}.log"));
        let hooks = dir.path().join("hooks");
        let mut proxy = ProxyProcess::spawn(
            BIN,
            &socket,
            &dir.path().join("rt.sock"),
            &[flag, &value, "--hook-config-dir", hooks.to_str().unwrap()],
            log,
        );
        assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(2), "{flag} {value}:\n{}", proxy.log());
        let text = proxy.log();
        let last = text.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.contains("runtime-proxy stopped: ") && last.contains(&says),
            "{flag}: the last line names it:\n{text}"
        );
        if flag == "--metrics-addr" {
            assert!(last.contains("another process holds the port"), "{last}");
        }
        assert!(!socket.exists(), "{flag}: the CRI socket was bound:\n{text}");
    }
}

/// An admin socket served by another user (here a proxy running as nobody, in a directory of
/// its own): `status` does not believe it (exit 2, naming the user), whatever it answers.
#[test]
fn status_refuses_an_admin_socket_another_user_serves() {
    let dir = tempfile::tempdir().unwrap();
    let backend = dir.path().join("absent-runtime.sock");
    let theirs = ProxyProcess::start_as(BIN, &backend, &["--metrics-addr", "off", "--debug-addr", "off"], 65534, 65534);
    let socket = theirs.socket().with_file_name("runtimeproxy-admin.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, shown) = status_by_socket(theirs.socket(), &[]);
    assert_eq!(code, 2, "{shown}");
    assert!(shown.contains("is served by uid 65534, neither root nor you"), "{shown}");
    // Asked by its own user, it answers (exit 1: the backend is absent).
    let out = Command::new(BIN).arg("--admin-socket").arg(&socket).arg("status").uid_gid(65534).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

trait UidGid {
    fn uid_gid(&mut self, id: u32) -> &mut Self;
}

impl UidGid for Command {
    fn uid_gid(&mut self, id: u32) -> &mut Self {
        std::os::unix::process::CommandExt::uid(self, id);
        std::os::unix::process::CommandExt::gid(self, id)
    }
}
