//! runtime-hooks' admin endpoints as a local user may abuse them (the real binary): 1,100
//! connections at a time with unfinished and huge heads on `--metrics-addr` while it has 1,024
//! descriptors leave its hook socket (`--probe`) and `status` on the admin socket working, its
//! descriptors and memory bounded; an admin address another process holds stops the start
//! (exit 2, naming the flag).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const FLOOD: usize = 1_100;

fn base(dir: &Path) -> Vec<String> {
    let (config, cgroups) = (dir.join("hookserver.d"), dir.join("cgroup"));
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(&cgroups).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let mut args = vec!["--listen".into(), s(&dir.join("hooks.sock")), "--hook-config-dir".into(), s(&config)];
    args.extend([
        "--cgroup-root".into(),
        s(&cgroups),
        "--cgroup-version".into(),
        "v1".into(),
        "--unchecked-cgroup-root".into(),
    ]);
    args
}

fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// `runtime-hooks --listen SOCKET status` (its default admin socket, no TCP): exit code, output.
fn status_by_socket(listen: &Path) -> (i32, String) {
    let out = Command::new(HOOKS_BIN).arg("--listen").arg(listen).arg("status").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn a_flood_of_admin_connections_leaves_hooks_and_status_working() {
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut own);
        own.rlim_cur = own.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &own);
    }
    assert!(own.rlim_cur as usize > FLOOD + 500, "the test needs more descriptors: {}", own.rlim_cur);
    let dir = tempfile::Builder::new().prefix("rh-admin").tempdir().unwrap();
    let mut args = base(dir.path());
    args.extend(["--metrics-addr".into(), "127.0.0.1:0".into()]);
    let hooks = Hooks::start(&args.iter().map(String::as_str).collect::<Vec<_>>(), dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["serving runtime hooks"], 0, Duration::from_secs(10)), "{}", hooks.log());
    assert!(hooks.wait_log(&["admin endpoint"], 0, Duration::from_secs(10)), "{}", hooks.log());
    let log = hooks.log();
    let line = log.lines().find(|l| l.contains("admin endpoint")).unwrap_or_default();
    let addr = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()).unwrap().to_owned();
    let pid = hooks.pid();
    assert!(Command::new("prlimit")
        .args(["--pid", &pid.to_string(), "--nofile=1024:1024"])
        .status()
        .unwrap()
        .success());
    let (fds_before, rss_before) = (open_fds(pid), test_support::rss_kib(pid));

    let big = [b"GET /metrics HTTP/1.1\r\nX-Fill: ".as_slice(), &vec![b'a'; 400_000]].concat();
    let started = Instant::now();
    let mut conns = Vec::with_capacity(FLOOD);
    let (mut max_fds, mut max_rss) = (0, 0);
    for i in 0..FLOOD {
        let Ok(mut c) = TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1)) else { continue };
        let _ = c.set_nonblocking(true);
        let _ = c.write(if i < 64 { &big } else { b"GET /metrics HTTP/1.1\r\nHost: x\r\n" });
        conns.push(c);
        if i % 100 == 0 {
            max_fds = max_fds.max(open_fds(pid));
            max_rss = max_rss.max(test_support::rss_kib(pid));
        }
    }
    // All held open: the hook socket and the admin socket answer.
    let probe =
        Command::new(HOOKS_BIN).arg("--probe").arg("--listen").arg(dir.path().join("hooks.sock")).output().unwrap();
    let (code, shown) = status_by_socket(&dir.path().join("hooks.sock"));
    max_fds = max_fds.max(open_fds(pid));
    max_rss = max_rss.max(test_support::rss_kib(pid));
    eprintln!(
        "runtime-hooks admin flood: {} connections in {:?}; fds {fds_before} -> max {max_fds}, VmRSS {rss_before} KiB -> max {max_rss} KiB",
        conns.len(),
        started.elapsed()
    );
    assert!(conns.len() >= FLOOD - 10, "the flood made {} connections", conns.len());
    assert!(probe.status.success(), "--probe under the flood: {}", String::from_utf8_lossy(&probe.stderr));
    assert_eq!(code, 0, "status on the admin socket under the flood:\n{shown}");
    assert!(shown.contains("proxy"), "{shown}");
    assert!(max_fds < fds_before + 200, "descriptors: {fds_before} before, {max_fds} under the flood");
    assert!(max_rss < rss_before + 64 * 1024, "VmRSS: {rss_before} KiB before, {max_rss} KiB under the flood");
    drop(conns);
    assert!(eventually(Duration::from_secs(10), || test_support::http_get(&addr, "/healthz").0 == 200), "served again");
}

/// `--metrics-addr` on a port another process holds: exit 2, the last line naming the flag and
/// the address; so does a live `--admin-socket`.
#[test]
fn a_taken_admin_address_stops_the_start_naming_it() {
    let dir = tempfile::Builder::new().prefix("rh-admin").tempdir().unwrap();
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap().to_string();
    let live = dir.path().join("live.sock");
    let _live = std::os::unix::net::UnixListener::bind(&live).unwrap();
    for (flag, value, says) in [
        ("--metrics-addr", taken.clone(), format!("--metrics-addr {taken}: cannot listen: ")),
        (
            "--admin-socket",
            live.display().to_string(),
            format!("--admin-socket {}: another process is serving", live.display()),
        ),
    ] {
        let mut args = base(dir.path());
        args.extend([flag.to_owned(), value.clone()]);
        let out = Command::new(HOOKS_BIN).args(&args).env("RUST_LOG", "info").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}:\n{stderr}");
        let last = stderr.trim_end().lines().last().unwrap_or_default();
        assert!(
            last.contains("runtime-hooks stopped: ") && last.contains(&says),
            "{flag}: the last line names it:\n{stderr}"
        );
    }
}
