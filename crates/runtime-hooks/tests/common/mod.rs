//! Shared by the integration tests: the runtime-hooks binary as a child process, pods with
//! Koordinator labels and annotations, cgroup files.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd};

pub const HOOKS_BIN: &str = env!("CARGO_BIN_EXE_runtime-hooks");
pub const QOS: &str = "koordinator.sh/qosClass";
pub const SPEC: &str = "node.koordinator.sh/extended-resource-spec";
pub const STATUS: &str = "scheduling.koordinator.sh/resource-status";

/// The issue's example: batch-cpu request 500, limit 1000 (milli-CPU), batch-memory limit 128 MiB.
pub const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

/// A running `runtime-hooks`; killed when dropped.
pub struct Hooks {
    child: Option<Child>,
    log: PathBuf,
}

impl Hooks {
    /// Starts the binary with `args`, logging (debug) to `log`.
    pub fn start(args: &[&str], log: PathBuf) -> Hooks {
        Hooks::start_logging(args, log, "info,runtime_hooks=debug")
    }

    /// Starts the binary with `args`, logging to `log` at `rust_log` (the `RUST_LOG` filter).
    pub fn start_logging(args: &[&str], log: PathBuf, rust_log: &str) -> Hooks {
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(HOOKS_BIN)
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start runtime-hooks");
        Hooks { child: Some(child), log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn count(&self, parts: &[&str]) -> usize {
        self.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).count()
    }

    /// Waits up to `timeout` until more than `already` lines contain all `parts`.
    pub fn wait_log(&self, parts: &[&str], already: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.count(parts) > already {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// SIGTERM, then waits for the exit code (None after 10 s).
    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Hooks {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn map(kv: &[(&str, &str)]) -> HashMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A pod sandbox config with these labels/annotations and a container "main" running `sleep`,
/// with the resources kubelet gives a BestEffort container (2 shares, 100 ms period).
pub fn pod_configs(
    env: &Containerd,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let sandbox = sandbox_config(env, &unique("rh"), map(labels), map(annotations));
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
    (sandbox, container)
}

/// Creates the pod's cgroup directories for the controllers runtime-hooks writes at the pod
/// level, as kubelet does before RunPodSandbox (without kubelet, runc would create them later).
pub fn precreate_pod_cgroup(parent: &str) {
    for ctrl in ["cpu", "memory"] {
        let dir = Path::new("/sys/fs/cgroup").join(ctrl).join(parent.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
}

/// Reads `/sys/fs/cgroup/<controller><dir>/<file>`, trimmed.
pub fn cgroup(controller: &str, dir: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{controller}{dir}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).trim().to_owned()
}

/// Polls until `check` holds or `timeout` passes; returns the last result.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
