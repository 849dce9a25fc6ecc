//! A log pipe that goes away never takes the proxy (and kubelet's CRI path) down: with stderr a
//! pipe whose reader is closed before the start, or a FIFO whose reader goes away while the
//! proxy runs, it keeps serving CRI calls, exits cleanly on SIGTERM and removes its socket.
//! The lines it could not write are counted (`runtime_proxy_log_lines_dropped_total`).

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// A pipe: (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two-element array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both descriptors were just created and are owned by the two Files only.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// Version and a hooked call (RunPodSandbox, intercepted: no hook server registered) through
/// the proxy, `n` times each; every call logs a line at debug level.
async fn calls_succeed(socket: &Path, n: usize) {
    let mut rt = runtime_client(socket);
    for i in 0..n {
        rt.version(cri::VersionRequest::default())
            .await
            .unwrap_or_else(|e| panic!("Version #{i} through the proxy: {e}"));
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("p{i}"),
                uid: format!("u{i}"),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        rt.run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox #{i} through the proxy: {e}"));
    }
}

/// The admin endpoint's metric `name`, as a number.
fn metric(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("admin endpoint {addr}: {e}"));
    write!(conn, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let line = raw.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} not in /metrics:\n{raw}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// SIGTERM, then a clean exit within 10 s and the socket gone. Waits on a blocking thread: the
/// test's clients must go on running to close their connections at the proxy's GOAWAY.
async fn stop(proxy: ProxyProcess, socket: &Path) {
    let socket = socket.to_owned();
    tokio::task::spawn_blocking(move || stop_blocking(proxy, &socket)).await.unwrap();
}

fn stop_blocking(mut proxy: ProxyProcess, socket: &Path) {
    proxy.signal(libc::SIGTERM);
    assert_eq!(proxy.wait_exit(Duration::from_secs(10)), Some(0), "clean exit on SIGTERM, without its log pipe");
    assert!(!socket.exists(), "socket removed on exit");
}

#[tokio::test]
async fn stderr_closed_before_the_start() {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let (reader, writer) = pipe();
    drop(reader);
    let addr = test_support::free_loopback_addr();
    let out = writer.try_clone().unwrap();
    let mut proxy = ProxyProcess::spawn_with_output(
        BIN,
        &socket,
        fake.socket(),
        &["--metrics-addr", &addr],
        Stdio::from(out),
        Stdio::from(writer),
        dir.path().join("unused.log"),
    );
    proxy.wait_ready();
    calls_succeed(&socket, 20).await;
    assert!(metric(&addr, "runtime_proxy_log_lines_dropped_total") >= 20.0, "the lines it could not write are counted");
    stop(proxy, &socket).await;
}

#[tokio::test]
async fn stderr_fifo_whose_reader_goes_away() {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let fifo = dir.path().join("stderr.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // The reader first (non-blocking, so opening it does not wait for a writer).
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let addr = test_support::free_loopback_addr();
    let mut proxy = ProxyProcess::spawn_with_output(
        BIN,
        &socket,
        fake.socket(),
        &["--metrics-addr", &addr],
        Stdio::null(),
        Stdio::from(writer),
        dir.path().join("unused.log"),
    );
    proxy.wait_ready();
    // The log arrives while the reader is there.
    let mut seen = String::new();
    let start = Instant::now();
    while !seen.contains("runtime-proxy serving") {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        match reader.read(&mut buf) {
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("reading the FIFO: {e}"),
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no start-up line on the FIFO:\n{seen}");
    }
    calls_succeed(&socket, 2).await;
    drop(reader);
    calls_succeed(&socket, 20).await;
    assert!(metric(&addr, "runtime_proxy_log_lines_dropped_total") >= 20.0, "the lines it could not write are counted");
    stop(proxy, &socket).await;
}
