//! The clients and hook servers we did not write the gRPC side of (crates/runtime-proxy/tests/clients/:
//! Python grpcio, Node grpc-js, raw HTTP/2), set up by its setup.sh into `target/cri-clients`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::hooks::KillOnDrop;

/// crates/runtime-proxy/tests/clients/.
pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime-proxy/tests/clients")
}

/// `<workspace>/target/cri-clients`, brought up to date by setup.sh once per test binary: it
/// installs what is missing or changed (e.g. after `cargo test` without scripts/test.sh, or a new
/// pin) and returns in about a second when nothing is.
pub fn setup_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let workspace =
            Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("crates/test-support is two levels down");
        let dir = workspace.join("target/cri-clients");
        let out = Command::new("bash")
            .arg(clients_dir().join("setup.sh"))
            .arg(&dir)
            .output()
            .expect("running tests/clients/setup.sh");
        assert!(
            out.status.success(),
            "tests/clients/setup.sh {} failed:\n{}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// The command that runs tests/clients/`script` with the setup's venv and generated stubs.
pub fn python(script: &str) -> Command {
    let dir = setup_dir();
    let mut c = Command::new(dir.join("venv/bin/python"));
    // No __pycache__ next to the scripts in the source tree.
    c.arg(clients_dir().join(script)).env("PYTHONPATH", dir.join("gen")).env("PYTHONDONTWRITEBYTECODE", "1");
    c
}

/// tests/clients/hook_server.py (Python grpcio) serving on `socket`, recording its calls as JSON
/// lines in `record`, its output in `log`; killed on drop.
pub struct PyHookServer {
    /// The unix socket it serves on.
    pub socket: PathBuf,
    /// Its calls, one JSON object a line.
    pub record: PathBuf,
    /// Its stdout and stderr.
    pub log: PathBuf,
    _process: KillOnDrop,
}

impl PyHookServer {
    /// Starts it in `dir` (files `py-hook.sock`, `calls.jsonl`, `hook_server.log`) and waits up
    /// to 20 s until it listens. Panics (test set-up) when it exits or does not listen.
    pub fn start(dir: &Path) -> PyHookServer {
        let (socket, record, log) = (dir.join("py-hook.sock"), dir.join("calls.jsonl"), dir.join("hook_server.log"));
        let out = std::fs::File::create(&log).expect("hook_server.log");
        let mut server = python("hook_server.py");
        server.arg("--socket").arg(&socket).arg("--record").arg(&record);
        server.stdin(Stdio::null()).stdout(out.try_clone().expect("log fd")).stderr(out);
        let mut process = KillOnDrop(server.spawn().expect("starting tests/clients/hook_server.py"));
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if let Some(status) = process.0.try_wait().expect("try_wait") {
                panic!("hook_server.py exited with {status}:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "hook_server.py did not listen:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        PyHookServer { socket, record, log, _process: process }
    }

    /// What it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The calls it recorded so far, one JSON object each (`stage`, `pod`, `time_remaining`).
    pub fn calls(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    /// The stages it was called at for pod `name`, in order.
    pub fn stages_of(&self, name: &str) -> Vec<String> {
        self.calls()
            .iter()
            .filter(|c| c["pod"] == name)
            .map(|c| c["stage"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}
