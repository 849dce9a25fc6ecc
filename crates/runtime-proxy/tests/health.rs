//! Health that tells the truth, with the real proxy process: `/healthz` and
//! `runtime_proxy_backend_up` follow each backend endpoint within 2 s of it going away or coming
//! back, with no CRI call made through the proxy; a backend of the wrong kind, a path that is no
//! socket and a socket the proxy may not open are named (503 with the reason, one ERROR line).
//!
//! Backends: a containerd of the test's own (`scripts/containerd.sh up` in a fresh root, killed
//! and restarted), the shared containerd (`RP_CONTAINERD_ENV`), and in-process stand-ins
//! ([`test_support::stand_in`]: a gRPC server, a Docker Engine API, a plain HTTP/1.1 server).
//! The Docker-mode proxy in front of a real dockerd, and CRI mode in front of one, are in
//! tests/docker_health.rs.

use std::path::Path;
use std::time::{Duration, Instant};

use test_support::containerd::{Containerd, OwnContainerd};
use test_support::proxy::ProxyProcess;
use test_support::stand_in::{Kind, StandIn};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// How soon health must follow a backend (the promise).
const PROMPT: Duration = Duration::from_secs(2);

/// The value of the sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
}

/// Polls `/healthz` until it answers `status`; returns the time that took and the body. Panics
/// after `limit`, with the last answer and the log.
fn wait_health(proxy: &ProxyProcess, status: u16, limit: Duration) -> (Duration, String) {
    let start = Instant::now();
    loop {
        let (got, body) = proxy.admin_get("/healthz");
        if got == status {
            return (start.elapsed(), body);
        }
        assert!(
            start.elapsed() < limit,
            "/healthz still {got} {body:?} after {limit:?}, not {status}:\n{}",
            proxy.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to `pid`.
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill -{sig} {pid}");
}

/// Log lines containing every one of `parts`.
fn log_lines(proxy: &ProxyProcess, parts: &[&str]) -> Vec<String> {
    proxy.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).map(str::to_owned).collect()
}

/// containerd frozen (SIGSTOP) and continued, then `kill -9` and `containerd.sh up` again:
/// `/healthz` turns 503 naming the runtime endpoint (no answer; then ECONNREFUSED: the socket
/// file stays behind) and `backend_up` 0 within 2 s of the freeze and of the daemon's death,
/// and 200 and 1 again within 2 s of SIGCONT and of its socket accepting connections; the proxy
/// got no CRI call at all. Before the fix `/healthz` stayed `200 ok` on the connection made
/// while containerd was up.
#[test]
fn health_follows_containerd_going_away_and_coming_back_without_a_cri_call() {
    let version = Containerd::from_env().series();
    let ctrd = OwnContainerd::up(version);
    let socket = ctrd.env.socket.clone();
    let proxy = ProxyProcess::start(BIN, &socket, &[]);
    wait_health(&proxy, 200, Duration::from_secs(10));
    // Long enough for the checks to settle on their kept connection.
    std::thread::sleep(Duration::from_secs(1));

    // Frozen (SIGSTOP): the kept connection stays open, the socket accepts, nothing answers.
    let pid = ctrd.env.pid().expect("containerd's PID") as i32;
    signal(pid, libc::SIGSTOP);
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    eprintln!("containerd pid {pid} stopped: /healthz 503 after {took:?}: {body}");
    signal(pid, libc::SIGCONT);
    assert!(body.ends_with(": accepts connections but gave no answer to a CRI Version call within 1s\n"), "{body}");
    let (took, _) = wait_health(&proxy, 200, PROMPT);
    eprintln!("containerd pid {pid} continued: /healthz 200 after {took:?}");

    let pid = ctrd.kill_daemon();
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    eprintln!("containerd pid {pid} dead: /healthz 503 after {took:?}: {body}");
    let runtime = format!("runtime endpoint unix://{}: ", socket.display());
    assert!(body.starts_with(&runtime) && body.contains("ECONNREFUSED"), "{body}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"runtime\"}"), 0.0);

    // Restarted: the clock runs from the moment its socket accepts connections.
    let up = std::thread::spawn({
        let socket = socket.clone();
        move || loop {
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    ctrd.restart();
    let accepting = up.join().expect("socket watcher");
    let (_, body) = wait_health(&proxy, 200, Duration::from_secs(10));
    let took = accepting.elapsed();
    eprintln!("containerd back: /healthz 200 {took:?} after its socket accepted connections");
    assert!(took <= PROMPT, "/healthz 200 only {took:?} after containerd accepted connections");
    assert_eq!(body, "ok\n");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 1.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"runtime\"}"), 1.0);
    assert!(!text.contains("runtime_proxy_cri_requests_total{"), "no CRI call was made through the proxy:\n{text}");
    assert_eq!(log_lines(&proxy, &["WARN", "backend down", "ECONNREFUSED"]).len(), 1, "one WARN:\n{}", proxy.log());
    assert_eq!(log_lines(&proxy, &["WARN", "backend down", "no answer"]).len(), 1, "one WARN:\n{}", proxy.log());
    assert_eq!(log_lines(&proxy, &["backend up again"]).len(), 2, "{}", proxy.log());
}

/// `--remote-image-service-endpoint` on a socket of its own (a gRPC stand-in) is checked too:
/// stopped, `/healthz` is 503 naming the image endpoint (and not the runtime's) within 2 s;
/// back, 200 within 2 s. Before the fix the image endpoint was never looked at.
#[test]
fn health_follows_a_separate_image_endpoint() {
    let env = Containerd::from_env();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("image.sock");
    let stand_in = StandIn::start(Kind::Grpc, &image);
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--remote-image-service-endpoint", image.to_str().unwrap()]);
    wait_health(&proxy, 200, Duration::from_secs(10));

    drop(stand_in);
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    eprintln!("image endpoint stopped: 503 after {took:?}: {body}");
    assert_eq!(
        body,
        format!("image endpoint unix://{}: no such socket (ENOENT: No such file or directory)\n", image.display())
    );
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"runtime\"}"), 1.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"image\"}"), 0.0);

    let _back = StandIn::start(Kind::Grpc, &image);
    let (took, _) = wait_health(&proxy, 200, PROMPT);
    eprintln!("image endpoint back: 200 after {took:?}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"image\"}"), 1.0);
    assert_eq!(log_lines(&proxy, &["WARN", "backend down", "endpoint=\"image\""]).len(), 1, "{}", proxy.log());
}

/// Waits until the log has a line with every one of `parts`, then 1.5 s more (three checks) and
/// returns the lines that have them: a verdict that does not change is logged once.
fn logged_once(proxy: &ProxyProcess, parts: &[&str]) -> Vec<String> {
    assert!(proxy.wait_log(parts, 0), "no line with {parts:?}:\n{}", proxy.log());
    std::thread::sleep(Duration::from_millis(1500));
    log_lines(proxy, parts)
}

/// CRI mode in front of HTTP/1.1 servers: a Docker Engine API is named with the flag to use, any
/// other HTTP/1.1 server as not a CRI runtime; ERROR once, at start-up. Before the fix the h2
/// handshake "succeeded" (nothing is read back) and `/healthz` said `200 ok`.
#[test]
fn cri_mode_in_front_of_http1_servers_names_them() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("docker.sock");
    let _d = StandIn::start(Kind::Docker, &docker);
    let proxy = ProxyProcess::start(BIN, &docker, &[]);
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    assert!(took < PROMPT, "at start-up");
    assert_eq!(
        body,
        format!(
            "runtime endpoint unix://{}: speaks the Docker Engine API (GET /_ping: OK, API 1.41), not CRI gRPC: use --backend-runtime-mode Docker\n",
            docker.display()
        )
    );
    let lines = logged_once(
        &proxy,
        &["ERROR", "backend of the wrong kind", &docker.display().to_string(), "--backend-runtime-mode Docker"],
    );
    assert_eq!(lines.len(), 1, "{lines:#?}");

    let web = dir.path().join("web.sock");
    let _w = StandIn::start(Kind::Http1, &web);
    let proxy = ProxyProcess::start(BIN, &web, &[]);
    let (_, body) = wait_health(&proxy, 503, PROMPT);
    assert!(body.contains("speaks HTTP/1.1 (GET /_ping: 404 Not Found), not HTTP/2 gRPC"), "{body}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);
}

/// Docker mode in front of containerd's socket: named, with the flag to use; ERROR once. Before
/// the fix the socket accepted a connection, so `/healthz` said `200 ok`.
#[test]
fn docker_mode_in_front_of_containerd_names_it() {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--backend-runtime-mode", "Docker"]);
    let (_, body) = wait_health(&proxy, 503, PROMPT);
    assert_eq!(
        body,
        format!(
            "runtime endpoint unix://{}: speaks HTTP/2 gRPC (a CRI runtime such as containerd), not the Docker Engine API: use --backend-runtime-mode Containerd\n",
            env.socket.display()
        )
    );
    let lines = logged_once(&proxy, &["ERROR", "backend of the wrong kind", "--backend-runtime-mode Containerd"]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);
}

/// A regular file, then a directory, at the runtime socket's path: 503 naming what it is and the
/// OS error, one ERROR (not "not there yet" at INFO); replaced by a real socket, 200 within 2 s.
/// Before the fix: "cannot connect: Connection refused", and only when asked.
#[test]
fn a_regular_file_or_a_directory_at_the_socket_path_is_named() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("containerd.sock");
    for (what, make, mode) in [
        ("a regular file", (|p: &Path| std::fs::write(p, b"")) as fn(&Path) -> std::io::Result<()>, "Containerd"),
        ("a directory", |p: &Path| std::fs::create_dir(p), "Docker"),
    ] {
        make(&path).unwrap();
        let proxy = ProxyProcess::start(BIN, &path, &["--backend-runtime-mode", mode]);
        let (_, body) = wait_health(&proxy, 503, PROMPT);
        assert_eq!(
            body,
            format!(
                "runtime endpoint unix://{}: is {what}, not a socket (connect: ECONNREFUSED: Connection refused)\n",
                path.display()
            )
        );
        let lines = logged_once(&proxy, &["ERROR", "backend socket unusable", &path.display().to_string(), what]);
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(log_lines(&proxy, &["not there yet"]).is_empty(), "{}", proxy.log());

        if what == "a regular file" {
            std::fs::remove_file(&path).unwrap();
        } else {
            std::fs::remove_dir(&path).unwrap();
        }
        let kind = if mode == "Docker" { Kind::Docker } else { Kind::Grpc };
        let _s = StandIn::start(kind, &path);
        let (took, _) = wait_health(&proxy, 200, PROMPT);
        eprintln!("{what} replaced by a socket: 200 after {took:?}");
    }
}

/// A socket the proxy may not open, the proxy running as `nobody` (root, the tests' user here,
/// passes every permission check): (1) a socket of mode 000, (2) a socket in a directory
/// `nobody` may not search. 503 naming EACCES, the uid and the mode, one ERROR; the socket
/// opened up (chmod), 200 within 2 s. Before the fix: no ERROR, "not there yet" at INFO for (2).
#[test]
fn a_socket_the_proxy_may_not_open_is_named() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to run the proxy as nobody (uid 65534)");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    mode(dir.path(), 0o755);

    // (1) mode 000, owned by nobody (so that the proxy may give its own socket that owner).
    let locked = dir.path().join("locked.sock");
    let _s = StandIn::start(Kind::Grpc, &locked);
    std::os::unix::fs::chown(&locked, Some(65534), Some(65534)).unwrap();
    mode(&locked, 0o000);
    let proxy = ProxyProcess::start_as(BIN, &locked, &[], 65534, 65534);
    let (_, body) = wait_health(&proxy, 503, PROMPT);
    assert_eq!(
        body,
        format!(
            "runtime endpoint unix://{}: permission denied (EACCES: Permission denied) for uid 65534: the socket's mode is 0000, owner 65534:65534\n",
            locked.display()
        )
    );
    let lines = logged_once(&proxy, &["ERROR", "backend socket unusable", &locked.display().to_string(), "EACCES"]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    mode(&locked, 0o660);
    let (took, _) = wait_health(&proxy, 200, PROMPT);
    eprintln!("socket opened up: 200 after {took:?}");

    // (2) a directory nobody may not search.
    let hidden = dir.path().join("hidden");
    std::fs::create_dir(&hidden).unwrap();
    mode(&hidden, 0o700);
    let socket = hidden.join("c.sock");
    let _h = StandIn::start(Kind::Grpc, &socket);
    // Only the directory is in the way (connecting needs write permission on the socket).
    mode(&socket, 0o666);
    let proxy = ProxyProcess::start_as(BIN, &socket, &[], 65534, 65534);
    let (_, body) = wait_health(&proxy, 503, PROMPT);
    assert_eq!(
        body,
        format!(
            "runtime endpoint unix://{}: permission denied (EACCES: Permission denied) for uid 65534: a directory on its path may not be searched\n",
            socket.display()
        )
    );
    let lines = logged_once(&proxy, &["ERROR", "backend socket unusable", "EACCES"]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(log_lines(&proxy, &["not there yet"]).is_empty(), "{}", proxy.log());
    assert_eq!(
        log_lines(&proxy, &["WARN", "backend socket cannot be inspected", "Permission denied"]).len(),
        1,
        "{}",
        proxy.log()
    );
    mode(&hidden, 0o755);
    wait_health(&proxy, 200, PROMPT);
}

/// A backend socket that never appears is said at INFO at once (a runtime starting after the
/// proxy is normal), then at WARN after 10 s, naming the socket: a wrong endpoint does not hide
/// at INFO while every call fails.
#[test]
fn a_socket_that_never_appears_is_a_warn_after_10s() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("never.sock");
    let proxy = ProxyProcess::start(BIN, &missing, &["--hook-config-dir", dir.path().join("hooks").to_str().unwrap()]);
    let socket = missing.display().to_string();
    assert!(proxy.wait_log(&["INFO", "backend socket not there yet", &socket], 0), "{}", proxy.log());
    std::thread::sleep(Duration::from_secs(8));
    assert!(log_lines(&proxy, &["WARN", "still not there"]).is_empty(), "not before 10 s:\n{}", proxy.log());
    let until = Instant::now() + Duration::from_secs(6);
    while log_lines(&proxy, &["WARN", "backend socket still not there after 10s", &socket]).is_empty()
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let warns = log_lines(&proxy, &["WARN", "backend socket still not there after", &socket]);
    assert_eq!(warns.len(), 1, "one WARN after 10 s, the next a minute later:\n{}", proxy.log());
}
