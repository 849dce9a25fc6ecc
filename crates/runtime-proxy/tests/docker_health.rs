//! Health that tells the truth with a real dockerd: the Docker-mode proxy's
//! `/healthz` follows a dockerd of the test's own going away and coming back within 2 s with no
//! call made through the proxy, and a CRI-mode proxy in front of dockerd names the Docker Engine
//! API. Needs `RP_DOCKERD_ENV` (set by `make test`); the own dockerd is started by
//! `scripts/dockerd.sh up` in a fresh root and purged at the end, pass or fail.

use std::time::{Duration, Instant};

use test_support::dockerd::{Dockerd, OwnDockerd};
use test_support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// How soon health must follow a backend (the promise).
const PROMPT: Duration = Duration::from_secs(2);

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

/// The value of the sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
}

/// Sends `sig` to `pid`.
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill -{sig} {pid}");
}

/// dockerd answers `GET /_ping` with `OK` (checked from the test, on a connection of its own).
fn pings(socket: &std::path::Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut conn) = std::os::unix::net::UnixStream::connect(socket) else { return false };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(1)));
    if conn.write_all(b"GET /_ping HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = conn.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200") && answer.ends_with("OK")
}

/// dockerd frozen (SIGSTOP) and continued, then stopped (SIGTERM) and started again
/// (`dockerd.sh up`): `/healthz` 503 naming the runtime endpoint within 2 s of the freeze and of
/// the daemon's exit, 200 within 2 s of SIGCONT and of its first `_ping` answer; no call went
/// through the proxy. Before the fix `/healthz` only tried a connection, when asked, so a frozen
/// dockerd (its socket still accepts) was `200 ok`.
#[test]
fn docker_mode_health_follows_dockerd_going_away_and_coming_back() {
    let dockerd = OwnDockerd::up("rpdh");
    let socket = dockerd.env.socket.clone();
    let proxy = ProxyProcess::start(BIN, &socket, &["--backend-runtime-mode", "Docker"]);
    let (_, body) = wait_health(&proxy, 200, Duration::from_secs(10));
    assert_eq!(body, "ok\n");
    std::thread::sleep(Duration::from_secs(1));

    // Frozen (SIGSTOP): its socket still accepts connections, but nothing answers.
    let pid = dockerd.pid();
    signal(pid, libc::SIGSTOP);
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    eprintln!("dockerd pid {pid} stopped: /healthz 503 after {took:?}: {body}");
    signal(pid, libc::SIGCONT);
    assert!(body.ends_with(": accepts connections but gave no answer to GET /_ping within 1s\n"), "{body}");
    let (took, _) = wait_health(&proxy, 200, PROMPT);
    eprintln!("dockerd pid {pid} continued: /healthz 200 after {took:?}");

    let pid = dockerd.stop_daemon();
    let (took, body) = wait_health(&proxy, 503, PROMPT);
    eprintln!("dockerd pid {pid} gone: /healthz 503 after {took:?}: {body}");
    assert!(body.starts_with(&format!("runtime endpoint unix://{}: ", socket.display())), "{body}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);

    let answering = std::thread::spawn({
        let socket = socket.clone();
        move || loop {
            if pings(&socket) {
                return Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    dockerd.restart();
    let answering = answering.join().expect("ping watcher");
    wait_health(&proxy, 200, Duration::from_secs(10));
    let took = answering.elapsed();
    eprintln!("dockerd back: /healthz 200 {took:?} after its first _ping answer");
    assert!(took <= PROMPT, "/healthz 200 only {took:?} after dockerd answered");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 1.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_endpoint_up{endpoint=\"runtime\"}"), 1.0);
    assert!(!text.contains("runtime_proxy_cri_requests_total{"), "no call was made through the proxy:\n{text}");
}

/// CRI mode in front of the real dockerd: 503 naming the Docker Engine API, its API version and
/// the flag to use; one ERROR naming the socket. Before the fix: `200 ok`, and CRI calls failed
/// with "frame larger than SETTINGS_MAX_FRAME_SIZE"-like errors.
#[test]
fn cri_mode_in_front_of_dockerd_names_the_docker_engine_api() {
    let env = Dockerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    let (_, body) = wait_health(&proxy, 503, PROMPT);
    assert_eq!(
        body,
        format!(
            "runtime endpoint unix://{}: speaks the Docker Engine API (GET /_ping: OK, API {}), not CRI gRPC: use --backend-runtime-mode Docker\n",
            env.socket.display(),
            env.api_version
        )
    );
    let parts = ["ERROR", "backend of the wrong kind", &env.socket.display().to_string()];
    assert!(proxy.wait_log(&parts, 0), "{}", proxy.log());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(proxy.count_log(&parts), 1, "logged once:\n{}", proxy.log());
}
