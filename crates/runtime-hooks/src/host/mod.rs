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

pub mod core_sched;
pub mod resctrl;

use std::path::PathBuf;
use std::sync::Arc;

use core_sched::{CoreSchedOps, PrctlCoreSched};
use resctrl::{DirResctrl, ResctrlFs, Vendor};

/// Where the host's files are (the paths a DaemonSet mounts), for [`Host::detect`].
#[derive(Clone, Debug, Default)]
pub struct HostPaths {
    /// The cgroup root (`--cgroup-root`, `/sys/fs/cgroup` on a host).
    pub cgroup_root: PathBuf,
    /// The resctrl mount (`--resctrl-root`, `/sys/fs/resctrl` on a host; empty: that default).
    pub resctrl_root: PathBuf,
}

/// The kernel facilities this node has (see the module documentation).
#[derive(Default)]
pub struct Host {
    /// Where the host's files are.
    pub paths: HostPaths,
    /// Core scheduling cookies (`prctl(PR_SCHED_CORE)`), for CoreSched; `None` when the kernel
    /// answers `EINVAL`/`ENODEV` (no `CONFIG_SCHED_CORE`, before 5.14, no SMT).
    pub core_sched: Option<Arc<dyn CoreSchedOps>>,
    /// The resctrl file system, for Resctrl; `None` when `info/L3/cbm_mask` is missing under
    /// [`HostPaths::resctrl_root`] (not mounted, no L3 cache allocation).
    pub resctrl: Option<Arc<dyn ResctrlFs>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("paths", &self.paths).field("facilities", &self.describe()).finish()
    }
}

impl Host {
    /// Probes every facility once (logging, once, each one this kernel lacks).
    pub fn detect(paths: HostPaths) -> Host {
        let core_sched: Option<Arc<dyn CoreSchedOps>> = match PrctlCoreSched::probe() {
            Ok(()) => Some(Arc::new(PrctlCoreSched::default())),
            Err(e) => {
                tracing::warn!(
                    "this kernel has no core scheduling (prctl(PR_SCHED_CORE, GET): {e}): CoreSched sets no cookies, only cpu.idle"
                );
                None
            }
        };
        let resctrl_root =
            if paths.resctrl_root.as_os_str().is_empty() { PathBuf::from("/sys/fs/resctrl") } else { paths.resctrl_root.clone() };
        let resctrl: Option<Arc<dyn ResctrlFs>> = match DirResctrl::open(&resctrl_root, Vendor::of_cpuinfo("/proc/cpuinfo".as_ref())) {
            Ok(fs) => Some(Arc::new(fs)),
            Err(e) => {
                tracing::warn!("no resctrl with L3 cache allocation ({e}): Resctrl creates no groups");
                None
            }
        };
        Host { paths, core_sched, resctrl }
    }

    /// The facilities present, for the start line and `status`: `name=yes|no` pairs.
    pub fn describe(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        [format!("core-sched={}", yes(self.core_sched.is_some())), format!("resctrl={}", yes(self.resctrl.is_some()))].join(" ")
    }
}
