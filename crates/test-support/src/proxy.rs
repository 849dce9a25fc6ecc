//! The real `runtime-proxy` binary, started as a child process on a socket in a temp dir.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `runtime-proxy` process; killed (SIGKILL) when dropped.
pub struct ProxyProcess {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl ProxyProcess {
    /// Starts `binary` listening on a fresh temp socket and forwarding to `backend`, with
    /// `extra` flags appended, and waits (up to 10 s) until the socket accepts connections.
    /// The admin and debug endpoints listen on free loopback ports unless `extra` says
    /// otherwise (`--metrics-addr`, `--debug-addr`).
    ///
    /// Panics (this is test code) when it does not come up, with the tail of its log.
    pub fn start(binary: &str, backend: &Path, extra: &[&str]) -> ProxyProcess {
        let dir = tempfile::Builder::new().prefix("rp-proxy").tempdir().expect("temp dir");
        let socket = dir.path().join("run/runtimeproxy.sock");
        let mut p = Self::spawn(binary, &socket, backend, extra, dir.path().join("proxy.log"));
        p._dir = Some(dir);
        p.wait_ready();
        p
    }

    /// Like [`start`](Self::start) but the process runs as `uid`:`gid` with no supplementary
    /// groups (the caller must be root), in a temp dir that user owns: for what an unprivileged
    /// proxy may not open.
    pub fn start_as(binary: &str, backend: &Path, extra: &[&str], uid: u32, gid: u32) -> ProxyProcess {
        let dir = tempfile::Builder::new().prefix("rp-proxy").tempdir().expect("temp dir");
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the proxy's temp dir");
        let socket = dir.path().join("run/runtimeproxy.sock");
        let log = dir.path().join("proxy.log");
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let stdout = Stdio::from(logf.try_clone().expect("log file"));
        let mut cmd = Self::command(binary, &socket, backend, extra);
        std::os::unix::process::CommandExt::uid(&mut cmd, uid);
        std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        let child =
            cmd.stdout(stdout).stderr(Stdio::from(logf)).spawn().unwrap_or_else(|e| panic!("spawning {binary}: {e}"));
        let mut p = ProxyProcess { child: Some(child), socket, log, _dir: Some(dir) };
        p.wait_ready();
        p
    }

    /// Like [`start`](Self::start) but on a caller-chosen socket and log file, for restarts.
    pub fn spawn(binary: &str, socket: &Path, backend: &Path, extra: &[&str], log: PathBuf) -> ProxyProcess {
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
        let stdout = Stdio::from(logf.try_clone().expect("log file"));
        Self::spawn_with_output(binary, socket, backend, extra, stdout, Stdio::from(logf), log)
    }

    /// Like [`spawn`](Self::spawn) but with stdout and stderr where the caller says (a pipe, a
    /// FIFO); [`log`](Self::log) then reads `log`, which the process does not write to.
    pub fn spawn_with_output(
        binary: &str,
        socket: &Path,
        backend: &Path,
        extra: &[&str],
        stdout: Stdio,
        stderr: Stdio,
        log: PathBuf,
    ) -> ProxyProcess {
        let child = Self::command(binary, socket, backend, extra)
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {binary}: {e}"));
        ProxyProcess { child: Some(child), socket: socket.to_owned(), log, _dir: None }
    }

    /// The proxy's command line: its socket, the backend, an admin endpoint on a free port (unless
    /// `extra` names one), `extra`; `RUST_LOG` from `RP_TEST_LOG` (default: debug for the proxy).
    fn command(binary: &str, socket: &Path, backend: &Path, extra: &[&str]) -> Command {
        let mut cmd = Command::new(binary);
        cmd.arg("--koord-runtimeproxy-endpoint")
            .arg(socket)
            .arg("--remote-runtime-service-endpoint")
            .arg(format!("unix://{}", backend.display()))
            .args(if extra.contains(&"--metrics-addr") { &[][..] } else { &["--metrics-addr", "127.0.0.1:0"][..] })
            .args(if extra.contains(&"--debug-addr") { &[][..] } else { &["--debug-addr", "127.0.0.1:0"][..] })
            .args(extra)
            .env("RUST_LOG", std::env::var("RP_TEST_LOG").unwrap_or_else(|_| "info,runtime_proxy=debug".into()))
            .stdin(Stdio::null());
        cmd
    }

    /// Waits until the socket accepts connections; panics with the log tail after 10 s.
    pub fn wait_ready(&mut self) {
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("runtime-proxy exited with {status}:\n{}", self.log_tail());
            }
            if start.elapsed() > Duration::from_secs(10) {
                panic!("runtime-proxy did not listen on {} within 10 s:\n{}", self.socket.display(), self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The proxy's listening socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Everything the proxy logged so far.
    ///
    /// The proxy writes its log from a thread of its own (non-blocking, so logging never holds a
    /// call up): the line of what just happened may still be on its way when a call's answer is
    /// in. So the file is read until it has not grown for 20 ms (at most 500 ms).
    pub fn log(&self) -> String {
        let read = || std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = Instant::now();
        let mut text = read();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let again = read();
            if again.len() == text.len() || start.elapsed() > Duration::from_millis(500) {
                return again;
            }
            text = again;
        }
    }

    /// Waits (up to 10 s) until the log has more than `already` lines containing every one of
    /// `parts`; returns whether it did. Tests use it to wait for the registry to take up a file.
    pub fn wait_log(&self, parts: &[&str], already: usize) -> bool {
        let start = Instant::now();
        loop {
            if self.count_log(parts) > already {
                return true;
            }
            if start.elapsed() > Duration::from_secs(10) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `GET path` on the admin endpoint (its port is read from the log); returns the HTTP status
    /// code and body. Panics (test code) when the endpoint is not up within 10 s.
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        crate::http_get(&self.admin_addr(), path)
    }

    /// The address the admin endpoint (`--metrics-addr`) listens on, read from the log
    /// (`admin endpoint listening on …`). Panics (test code) when it is not up within 10 s.
    pub fn admin_addr(&self) -> String {
        self.listening("admin endpoint listening on")
    }

    /// `GET path` on the debug endpoint (`--debug-addr`, its port read from the log); returns
    /// the HTTP status code and body. Panics (test code) when it is not up within 10 s.
    pub fn debug_get(&self, path: &str) -> (u16, String) {
        crate::http_get(&self.listening("debug endpoint (/debug/store) listening on"), path)
    }

    /// The address after `what` in the log, waiting up to 10 s for the line.
    fn listening(&self, what: &str) -> String {
        assert!(self.wait_log(&[what], 0), "no {what:?} in the log:\n{}", self.log_tail());
        let log = self.log();
        let line = log.lines().find(|l| l.contains(what)).unwrap_or_default();
        line.rsplit("listening on ")
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_default()
            .to_owned()
    }

    /// How many log lines contain every one of `parts`.
    pub fn count_log(&self, parts: &[&str]) -> usize {
        self.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).count()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The process ID.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Sends `signal` (e.g. `libc::SIGTERM`) to the process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID has no memory-safety preconditions.
        unsafe {
            libc::kill(self.pid() as i32, signal);
        }
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code (None: still running
    /// or killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
