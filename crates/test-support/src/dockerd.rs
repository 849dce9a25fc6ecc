//! The real Docker engine (Debian's dockerd 20.10) started by `scripts/dockerd.sh up ROOT`, and
//! its CLI and raw Engine API calls ([`api`]), for the tests of the proxy's Docker mode.
//!
//! The daemon has no bridge network (containers need `--network none` or `container:<id>`), no
//! registry, and a test-only default runtime that turns a negative `OomScoreAdj` into 0 in the
//! OCI spec (the test machines lack CAP_SYS_RESOURCE); `docker inspect` still reports the
//! requested value.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What `scripts/dockerd.sh` wrote to `$ROOT/env`.
#[derive(Clone, Debug)]
pub struct Dockerd {
    /// dockerd's Engine API socket (`DOCKER_SOCK`).
    pub socket: PathBuf,
    /// Debian's docker client, `/usr/bin/docker` (`DOCKER_CLI`; not the newer client that comes
    /// first on PATH).
    pub cli: PathBuf,
    /// `docker version`'s server version, e.g. `20.10.24+dfsg1` (`DOCKERD_VERSION`).
    pub version: String,
    /// The daemon's Engine API version, e.g. `1.41` (`DOCKER_API_VERSION`).
    pub api_version: String,
    /// The local busybox image every test container runs; its CMD is `sleep 3600`
    /// (`DOCKER_TEST_IMAGE`).
    pub test_image: String,
    /// A local pause-like image for pod sandboxes: sleeps, exits 0 on SIGTERM
    /// (`DOCKER_PAUSE_IMAGE`).
    pub pause_image: String,
    /// Container cgroup parents go below this cgroupfs path; it is also the daemon's default
    /// parent (`DOCKER_CGROUP_PARENT`).
    pub cgroup_parent: String,
    /// The harness directory (`DOCKER_ROOT`): data, exec root, logs.
    pub root: PathBuf,
}

impl Dockerd {
    /// Reads the env file named by `RP_DOCKERD_ENV`.
    ///
    /// Panics (test code) with instructions when it is not set: Docker-mode tests run through
    /// `make test`, which starts dockerd and sets it.
    pub fn from_env() -> Dockerd {
        let file = std::env::var("RP_DOCKERD_ENV").unwrap_or_else(|_| {
            panic!(
                "RP_DOCKERD_ENV is not set: run Docker-mode tests with `make test` (or `scripts/test.sh`), which starts a real dockerd and sets it; \
                 by hand: `scripts/dockerd.sh up /tmp/rp-dev-dockerd` and RP_DOCKERD_ENV=/tmp/rp-dev-dockerd/env"
            )
        });
        Dockerd::from_file(Path::new(&file))
    }

    /// Reads an env file written by `scripts/dockerd.sh up`; panics (test code) when it cannot be
    /// read or lacks a key.
    pub fn from_file(file: &Path) -> Dockerd {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| vars.get(k).unwrap_or_else(|| panic!("{} has no {k}", file.display())).to_string();
        Dockerd {
            socket: get("DOCKER_SOCK").into(),
            cli: get("DOCKER_CLI").into(),
            version: get("DOCKERD_VERSION"),
            api_version: get("DOCKER_API_VERSION"),
            test_image: get("DOCKER_TEST_IMAGE"),
            pause_image: get("DOCKER_PAUSE_IMAGE"),
            cgroup_parent: get("DOCKER_CGROUP_PARENT"),
            root: get("DOCKER_ROOT").into(),
        }
    }

    /// The Debian docker CLI preset with `-H unix://<socket>`: point it at the proxy's socket or
    /// at [`Dockerd::socket`]. `DOCKER_HOST`, `DOCKER_CONTEXT` and `DOCKER_API_VERSION` are
    /// removed from its environment so that only `-H` and API negotiation decide; its
    /// configuration directory is the harness's own (no `~/.docker`).
    pub fn docker(&self, socket: &Path) -> Command {
        let mut cmd = Command::new(&self.cli);
        cmd.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env_remove("DOCKER_API_VERSION")
            .env("DOCKER_CONFIG", self.root.join("cli-config"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()));
        cmd
    }

    /// [`Dockerd::docker`] pointed at dockerd itself.
    pub fn docker_direct(&self) -> Command {
        self.docker(&self.socket)
    }
}

/// One Engine API call over HTTP/1.1 on the unix socket `socket` (dockerd's or the proxy's), as
/// dockershim and cri-dockerd make them: `method path` (e.g. `POST`, `/v1.41/containers/create?name=…`)
/// with `body` as JSON (`Content-Type: application/json`, `Content-Length`), on a connection of
/// its own (`Connection: close`). Returns the status code and the body: parsed JSON, `Null` when
/// empty, else the text as a JSON string. Panics (test code) when the socket cannot be reached
/// or no answer comes within 60 s.
pub fn api(socket: &Path, method: &str, path: &str, body: Option<&serde_json::Value>) -> (u16, serde_json::Value) {
    let bytes = body.map(|b| serde_json::to_vec(b).expect("JSON"));
    let (status, answer) = api_raw(socket, method, path, bytes.as_deref());
    let value = if answer.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&answer)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&answer).into_owned()))
    };
    (status, value)
}

/// Like [`api`], with the request body as bytes (sent as JSON) and the answer body as dockerd
/// (or the proxy) wrote it, de-chunked: for byte-for-byte comparisons.
pub fn api_raw(socket: &Path, method: &str, path: &str, body: Option<&[u8]>) -> (u16, Vec<u8>) {
    let mut conn = UnixStream::connect(socket).unwrap_or_else(|e| panic!("connecting to {}: {e}", socket.display()));
    conn.set_read_timeout(Some(Duration::from_secs(60))).expect("read timeout");
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: docker\r\nUser-Agent: rp-test\r\nConnection: close\r\n");
    if let Some(b) = body {
        request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    request.push_str("\r\n");
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body.unwrap_or_default());
    conn.write_all(&bytes).unwrap_or_else(|e| panic!("{method} {path}: writing: {e}"));
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).unwrap_or_else(|e| panic!("{method} {path}: reading the answer: {e}"));
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("{method} {path}: no HTTP answer head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let rest = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{method} {path}: bad status line in {head:?}"));
    let chunked = head.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
        })
    });
    (status, if chunked { dechunk(rest) } else { rest.to_vec() })
}

/// The payload of a `Transfer-Encoding: chunked` body (trailers ignored; stops at a malformed size).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let Ok(size) = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16) else { break };
        raw = &raw[eol + 2..];
        if size == 0 || raw.len() < size {
            out.extend_from_slice(&raw[..size.min(raw.len())]);
            break;
        }
        out.extend_from_slice(&raw[..size]);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
    out
}

/// A dockerd of a test's own, started by `scripts/dockerd.sh up ROOT` in a fresh short root under
/// /tmp, next to the shared one; `purge`d (containers removed, daemon and its containerd stopped,
/// mounts and cgroups removed, root deleted) when dropped, also when the test fails.
pub struct OwnDockerd {
    /// What its `ROOT/env` says.
    pub env: Dockerd,
    root: PathBuf,
}

fn dockerd_sh(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dockerd.sh");
    let out = Command::new(script).args(args).output().expect("running scripts/dockerd.sh");
    assert!(out.status.success(), "dockerd.sh {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

impl OwnDockerd {
    /// Starts a dockerd in `/tmp/<prefix>-<pid>-<n>` (short: its containerd's socket path must stay
    /// under 94 bytes).
    pub fn up(prefix: &str) -> OwnDockerd {
        let root = PathBuf::from(format!("/tmp/{}", crate::containerd::unique(prefix)));
        assert!(!root.exists(), "{} exists already", root.display());
        // The guard exists before `up` runs, so a failing `up` is cleaned up too.
        let mut own = OwnDockerd { env: Dockerd::from_file_lenient(&root), root };
        dockerd_sh(&["up", own.root.to_str().expect("UTF-8 root")]);
        own.env = Dockerd::from_file(&own.root.join("env"));
        own
    }

    /// SIGTERMs the daemon (it stops its own containerd) and waits until it is gone, not even a
    /// zombie; returns its PID. Its socket file is removed by dockerd on the way out.
    pub fn stop_daemon(&self) -> i32 {
        let pid = self.pid();
        // SAFETY: kill(2) has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill -TERM {pid}");
        let start = std::time::Instant::now();
        let alive = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
        while alive() {
            assert!(start.elapsed() < Duration::from_secs(20), "dockerd {pid} still alive 20 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        }
        pid
    }

    /// The daemon's PID (from `ROOT/docker.pid`, checked against its command line).
    pub fn pid(&self) -> i32 {
        let text = std::fs::read_to_string(self.root.join("docker.pid")).expect("ROOT/docker.pid");
        let pid: i32 = text.trim().parse().expect("a PID");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains(self.root.to_str().unwrap_or("?")),
            "PID {pid} is our dockerd"
        );
        pid
    }

    /// `dockerd.sh up` again on the same root (after [`OwnDockerd::stop_daemon`]: it cleans up
    /// after the old daemon and starts a new one on the same socket).
    pub fn restart(&self) {
        dockerd_sh(&["up", self.root.to_str().expect("UTF-8 root")]);
    }
}

impl Drop for OwnDockerd {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/dockerd.sh");
        match Command::new(script).arg("purge").arg(&self.root).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "dockerd.sh purge {}: {}\n{}",
                self.root.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("dockerd.sh purge {}: {e}", self.root.display()),
        }
    }
}

impl Dockerd {
    /// Placeholder values for a root whose env file is not written yet.
    fn from_file_lenient(root: &Path) -> Dockerd {
        Dockerd {
            socket: root.join("run/docker.sock"),
            cli: PathBuf::from("/usr/bin/docker"),
            version: String::new(),
            api_version: String::new(),
            test_image: String::new(),
            pause_image: String::new(),
            cgroup_parent: String::new(),
            root: root.to_owned(),
        }
    }
}
