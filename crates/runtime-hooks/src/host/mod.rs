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
//! rule callbacks and all-pods reconcilers), never in the hook path's pure functions. One
//! exception, outside the `Host`: GroupIdentity reads the kernel's group identity switch in the
//! hook path through a [`sysctl::Sysctl`] of its own, as koordlet's `prepare` does
//! ([`crate::plugins::group_identity`]).

pub mod core_sched;
pub mod resctrl;
pub mod sysctl;
pub mod tc;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use self::core_sched::{CoreSchedOps, PrctlCoreSched};
use self::resctrl::{DirResctrl, ResctrlFs, Vendor};
use self::sysctl::{ProcSys, Sysctl};
use self::tc::TrafficControl;

/// Where the host's files are (the paths a DaemonSet mounts), for [`Host::detect`].
#[derive(Clone, Debug, Default)]
pub struct HostPaths {
    /// The cgroup root (`--cgroup-root`, `/sys/fs/cgroup` on a host).
    pub cgroup_root: PathBuf,
    /// The kernel parameters' root (`/proc/sys`; the `kernel.*` parameters are the host's even
    /// in a container).
    pub proc_sys: PathBuf,
    /// Where Terway reads its QoS files (`--terway-qos-dir`; koordlet's
    /// `/host-var-lib/terway/qos`, a DaemonSet's mount of `/var/lib/terway/qos`); empty: that
    /// default. Written by TerwayQoS only.
    pub terway_qos_dir: PathBuf,
    /// The resctrl mount (`--resctrl-root`, `/sys/fs/resctrl` on a host; empty: that default).
    pub resctrl_root: PathBuf,
}

/// The kernel facilities this node has (see the module documentation).
#[derive(Default)]
pub struct Host {
    /// Where the host's files are.
    pub paths: HostPaths,
    /// Kernel parameters; `None` (the default, and in tests that do not give one): not touched.
    pub sysctl: Option<Arc<dyn Sysctl>>,
    /// Traffic control on the default route's interface (TCNetworkQoS); `None` without the
    /// v1 `net_cls` hierarchy, `CAP_NET_ADMIN` or a default route ([`detect_tc`]).
    pub tc: Option<Arc<dyn TrafficControl>>,
    /// Core scheduling cookies (`prctl(PR_SCHED_CORE)`), for CoreSched; `None` when the kernel
    /// answers `EINVAL`/`ENODEV` (no `CONFIG_SCHED_CORE`, before 5.14, no SMT).
    pub core_sched: Option<Arc<dyn CoreSchedOps>>,
    /// The resctrl file system, for Resctrl; `None` when `info/L3/cbm_mask` is missing under
    /// [`HostPaths::resctrl_root`] (not mounted, no L3 cache allocation).
    pub resctrl: Option<Arc<dyn ResctrlFs>>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host").field("paths", &self.paths).field("facilities", &self.describe()).finish_non_exhaustive()
    }
}

/// Which plugins that are on use a facility [`Host::detect_for`] probes: its absence is a WARN
/// for them, an INFO otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// CoreSched is on.
    pub core_sched: bool,
    /// Resctrl is on.
    pub resctrl: bool,
}

/// Logs a facility this kernel lacks: `text` at WARN when a plugin that is on needs it
/// (`needed`), at INFO when none does.
fn lacking(needed: bool, text: &str) {
    if needed {
        tracing::warn!("{text}");
    } else {
        tracing::info!("{text} (the plugin is off)");
    }
}

impl Host {
    /// Probes every facility once (logging, once, each one this kernel lacks), as if every
    /// plugin that uses one were on ([`Host::detect_for`]).
    pub fn detect(paths: HostPaths) -> Host {
        Host::detect_for(paths, Uses { core_sched: true, resctrl: true })
    }

    /// Probes every facility once and logs, once, each one this kernel lacks: at WARN when a
    /// plugin that is on (`uses`) needs it, at INFO when none does (a plugin that is off).
    pub fn detect_for(paths: HostPaths, uses: Uses) -> Host {
        let core_sched: Option<Arc<dyn CoreSchedOps>> = match PrctlCoreSched::probe() {
            Ok(()) => Some(Arc::new(PrctlCoreSched::default())),
            Err(e) => {
                let text = format!(
                    "this kernel has no core scheduling (prctl(PR_SCHED_CORE, GET): {e}): CoreSched sets no cookies, only cpu.idle"
                );
                lacking(uses.core_sched, &text);
                None
            }
        };
        let resctrl_root = if paths.resctrl_root.as_os_str().is_empty() {
            PathBuf::from("/sys/fs/resctrl")
        } else {
            paths.resctrl_root.clone()
        };
        let resctrl: Option<Arc<dyn ResctrlFs>> =
            match DirResctrl::open(&resctrl_root, Vendor::of_cpuinfo("/proc/cpuinfo".as_ref())) {
                Ok(fs) => Some(Arc::new(fs)),
                Err(e) => {
                    lacking(
                        uses.resctrl,
                        &format!("no resctrl with L3 cache allocation ({e}): Resctrl creates no groups"),
                    );
                    None
                }
            };
        let sysctl: Arc<dyn Sysctl> = Arc::new(ProcSys::new(&paths.proc_sys));
        let tc = match detect_tc(&paths.cgroup_root) {
            Ok(tc) => Some(tc),
            Err(why) => {
                tracing::info!("no traffic control for TCNetworkQoS: {why}; its tc rules are not set");
                None
            }
        };
        Host { paths, sysctl: Some(sysctl), tc, core_sched, resctrl }
    }

    /// The facilities present, for the start line and `status`: `name=yes|no` pairs.
    pub fn describe(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        let tc = match &self.tc {
            Some(tc) => format!("tc=yes({})", tc.interface()),
            None => "tc=no".into(),
        };
        [
            format!("sysctl={}", yes(self.sysctl.is_some())),
            tc,
            format!("core-sched={}", yes(self.core_sched.is_some())),
            format!("resctrl={}", yes(self.resctrl.is_some())),
        ]
        .join(" ")
    }
}

/// Probes traffic control for TCNetworkQoS, as koordlet's hook needs it: the cgroup v1
/// `net_cls` hierarchy (`<cgroup_root>/net_cls`; the tc classes select traffic by
/// `net_cls.classid`), `CAP_NET_ADMIN` (`/proc/self/status` `CapEff`), and the interface of the
/// IPv4 default route (koordlet's `GetLinkInfoByDefaultRoute`), whose qdiscs can be listed.
///
/// Errors: what is missing, for the one log line.
pub fn detect_tc(cgroup_root: &Path) -> Result<Arc<dyn TrafficControl>, String> {
    if !cgroup_root.join("net_cls").is_dir() {
        return Err(format!("no net_cls hierarchy at {}", cgroup_root.join("net_cls").display()));
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let cap_eff =
        status.lines().find_map(|l| l.strip_prefix("CapEff:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    const CAP_NET_ADMIN: u32 = 12; // linux/capability.h
    if cap_eff.is_none_or(|c| c & (1 << CAP_NET_ADMIN) == 0) {
        return Err("no CAP_NET_ADMIN".into());
    }
    let interface = match tc::Netlink::default_route_interface() {
        Ok(Some(i)) => i,
        Ok(None) => return Err("no IPv4 default route".into()),
        Err(e) => return Err(format!("listing routes: {e}")),
    };
    let tc = tc::Netlink::open(&interface).map_err(|e| format!("interface {interface}: {e}"))?;
    tc.root_qdisc().map_err(|e| format!("listing the qdiscs of {interface}: {e}"))?;
    Ok(Arc::new(tc))
}
