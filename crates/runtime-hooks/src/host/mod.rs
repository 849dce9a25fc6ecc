//! The node beyond the cgroup files of pods and containers: the kernel facilities some
//! koordlet hooks act through (core scheduling, resctrl, traffic control, sysctls, …).
//!
//! Each facility is one small trait with a real implementation and a fake for tests, held here
//! as `Option<Arc<dyn …>>`: [`Host::detect`] probes each once at start and logs, once, what the
//! kernel lacks; a facility this kernel does not have is `None`, and the plugins that need it
//! write nothing and fail no pod (koordlet does the same: its hooks check the kernel's support
//! first, e.g. `system.IsCoreSchedSupported`, `system.IsSupportResctrl`).
//!
//! Plugins reach a [`Host`] only in [`crate::plugin::Plugin::node`] (node-level work: koordlet's
//! rule callbacks and all-pods reconcilers), never in the hook path's pure functions.

pub mod sysctl;

use std::path::PathBuf;
use std::sync::Arc;

use self::sysctl::{ProcSys, Sysctl};

/// Where the host's files are (the paths a DaemonSet mounts), for [`Host::detect`].
#[derive(Clone, Debug, Default)]
pub struct HostPaths {
    /// The cgroup root (`--cgroup-root`, `/sys/fs/cgroup` on a host).
    pub cgroup_root: PathBuf,
    /// The kernel parameters' root (`/proc/sys`; the `kernel.*` parameters are the host's even
    /// in a container).
    pub proc_sys: PathBuf,
}

/// The kernel facilities this node has (see the module documentation).
#[derive(Default)]
pub struct Host {
    /// Where the host's files are.
    pub paths: HostPaths,
    /// Kernel parameters; `None` (the default, and in tests that do not give one): not touched.
    pub sysctl: Option<Arc<dyn Sysctl>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("paths", &self.paths).field("facilities", &self.describe()).finish()
    }
}

impl Host {
    /// Probes every facility once (logging, once, each one this kernel lacks).
    pub fn detect(paths: HostPaths) -> Host {
        let sysctl: Arc<dyn Sysctl> = Arc::new(ProcSys::new(&paths.proc_sys));
        Host { paths, sysctl: Some(sysctl) }
    }

    /// The facilities present, for the start line and `status`: `name=yes|no` pairs.
    pub fn describe(&self) -> String {
        let facilities = [("sysctl", self.sysctl.is_some())];
        facilities.iter().map(|(name, present)| format!("{name}={}", if *present { "yes" } else { "no" })).collect::<Vec<_>>().join(" ")
    }
}
