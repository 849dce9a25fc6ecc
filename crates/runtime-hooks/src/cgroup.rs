//! Cgroup files: where a value lives, in which unit, and writing it only when it differs.
//!
//! Plugins speak in [`CgroupValue`]s (CPU shares, CFS quota and period in µs, memory bytes,
//! cpuset, group identity); [`CgroupFs`] maps each to the file of the cgroup version in use and
//! converts units, reads the current value, and writes only when the normalized values differ,
//! returning the [`Drift`] it corrected. That makes every write idempotent, which the
//! reconciler relies on (a second pass over unchanged pods writes nothing).
//!
//! # Layout
//!
//! A cgroup directory is named by its path below the hierarchy root, as kubelet names it in
//! `cgroup_parent` (cgroupfs driver: `/kubepods/besteffort/pod<uid>`, a container
//! `<parent>/<container id>`; systemd driver: `/kubepods.slice/kubepods-besteffort.slice/…`).
//! Every name goes through [`crate::cgroup_path::resolve`] with the node's cgroup driver
//! ([`CgroupFs::with_driver`]), so a bare systemd slice name (`kubepods-besteffort-pod<uid>.slice`)
//! or a systemd cgroups path (`<slice>:cri-containerd:<id>`) lands in its expanded directory:
//!
//! | | v1 (legacy or hybrid) | v2 (unified) |
//! |---|---|---|
//! | path | `<root>/<controller>/<dir>/<file>` | `<root>/<dir>/<file>` |
//! | [`CgroupValue::CpuShares`] | `cpu/cpu.shares` (2..=262144) | `cpu.weight` by the node runtime's formula ([`crate::cpu_weight`]) |
//! | [`CgroupValue::CfsQuota`] | `cpu/cpu.cfs_quota_us` (µs, −1 = unlimited) | first field of `cpu.max` (`max` = unlimited) |
//! | [`CgroupValue::CfsPeriod`] | `cpu/cpu.cfs_period_us` (µs) | second field of `cpu.max` |
//! | [`CgroupValue::MemoryLimit`] | `memory/memory.limit_in_bytes` (bytes, −1 = unlimited) | `memory.max` (`max` = unlimited) |
//! | [`CgroupValue::CpusetCpus`] | `cpuset/cpuset.cpus`; `""` is written as the parent's value | `cpuset.cpus` (`""` = inherit) |
//! | [`CgroupValue::BvtWarpNs`] | `cpu/cpu.bvt_warp_ns` | `cpu.bvt_warp_ns` |
//! | [`CgroupValue::NetClsClassId`] | `net_cls/net_cls.classid` (decimal `0xAAAABBBB`) | none: always unsupported |
//! | [`CgroupValue::CpuIdle`] | `cpu/cpu.idle` (Anolis kernels only) | `cpu.idle` (Linux ≥ 5.15) |
//!
//! The root is `/sys/fs/cgroup` on a node and a temp directory in tests. [`CgroupFs::detect`]
//! tells the versions apart by the file system type of the root (`cgroup2` → v2; `tmpfs` with
//! per-controller mounts → v1, which includes the hybrid layout, where `unified/` holds only
//! the v2 hierarchy without the cpu and memory controllers).
//!
//! # What the kernel does not support
//!
//! A write the kernel does not support is [`Written::Unsupported`]: logged once per file name per
//! process, skipped, never an error. That is
//!
//! * a file missing in an existing directory: the kernel lacks the feature (most kernels have no
//!   `cpu.bvt_warp_ns`, an Alibaba Cloud Linux / Anolis extension; v2 lacks a controller's files
//!   where the controller is not enabled);
//! * `EOPNOTSUPP` (or `ENOENT`, the directory existing) from reading or writing any file;
//! * for the optional feature files ([`CgroupValue::is_optional_feature`], group identity),
//!   also `EINVAL` and `ENODEV`: a kernel that has the file but not the feature switched on.
//!
//! # systemd units
//!
//! Under the systemd driver a pod slice or container scope is a systemd unit, and systemd writes
//! the unit's own properties back into its cgroup when the slice's first child starts and at
//! every `systemctl daemon-reload`. With a [`Systemd`] connection ([`CgroupFs::with_systemd`]),
//! [`CgroupFs::apply`] therefore also sets each value it manages as the owning unit's runtime
//! property ([`crate::systemd`]: `CPUWeight`, `CPUQuotaPerSecUSec` + `CPUQuotaPeriodUSec`,
//! `MemoryMax`, `AllowedCPUs` on v2; `CPUShares`, the quota, `MemoryLimit` on v1), as kubelet
//! and runc do for theirs, before writing the file; a property already sent by this process is
//! not sent again unless the file had drifted. A failed D-Bus call is logged (once per unit and
//! error) and never fails the write: the file is still written.
//!
//! A missing directory is an error ([`CgroupError::NoDir`]): the pod or container is not (or no
//! longer) there. `EINVAL` on the other files is a real refusal (v1: a child's CFS quota above
//! its parent's), which [`crate::framework::apply_all`] retries.
//!
//! Directory names come from hook requests and the runtime: a name with a `..` component, a
//! relative name that is not a systemd name, or a systemd name under the cgroupfs driver is
//! refused before anything is touched ([`CgroupError::BadDir`]); an empty name (the runtime's
//! default) or the root has no directory of its own ([`CgroupError::NoOwnDir`]).

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::cgroup_path::{self, CgroupDriver, PathError};
use crate::cpu_weight::{WeightConversion, WeightFormula, MAX_SHARES, MIN_SHARES};
use crate::systemd::{self, Systemd, UnitProperty};

/// v1 reads this (`PAGE_COUNTER_MAX` pages, page-aligned `i64::MAX`) or more for "unlimited".
const V1_UNLIMITED_FROM: i64 = 1 << 62;

/// One cgroup setting, in kernel-neutral units.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CgroupValue {
    /// CPU shares (cgroup v1 unit; converted to `cpu.weight` on v2). Clamped to 2..=262144.
    CpuShares(i64),
    /// CFS quota in µs per period; −1 (any value ≤ 0) = unlimited.
    CfsQuota(i64),
    /// CFS period in µs (1000..=1000000).
    CfsPeriod(i64),
    /// Memory limit in bytes; −1 (any value ≤ 0) = unlimited.
    MemoryLimit(i64),
    /// CPU list (`"2-3"`, `"0,4-5"`); `""` = the shared pool, i.e. the parent's CPUs.
    CpusetCpus(String),
    /// Group identity (`cpu.bvt_warp_ns`): 2 = highest, 0 = default, −1 = lowest (BE).
    BvtWarpNs(i64),
    /// The tc class id of the cgroup's sockets (`net_cls.classid`, cgroup v1 only):
    /// `major << 16 | minor`, e.g. `0x10003` for class `1:3`. Without the `net_cls` hierarchy
    /// (cgroup v2, or v1 without it mounted) every write is unsupported (skipped, logged once).
    NetClsClassId(u32),
    /// Cgroup SCHED_IDLE (`cpu.idle`, Linux ≥ 5.15 on v2; Anolis kernels on v1): 1 = the
    /// cgroup's tasks run as idle-class against their siblings, 0 = normal. koordlet's CoreSched
    /// writes it to the kube-QoS directories (`pkg/koordlet/util/system` `CPUIdle`/`CPUIdleV2`).
    CpuIdle(i64),
}

impl CgroupValue {
    /// A short name of the setting, independent of the cgroup version (used to tell which
    /// plugin owns which setting).
    pub fn kind(&self) -> &'static str {
        match self {
            CgroupValue::CpuShares(_) => "cpu-shares",
            CgroupValue::CfsQuota(_) => "cfs-quota",
            CgroupValue::CfsPeriod(_) => "cfs-period",
            CgroupValue::MemoryLimit(_) => "memory-limit",
            CgroupValue::CpusetCpus(_) => "cpuset-cpus",
            CgroupValue::BvtWarpNs(_) => "bvt-warp-ns",
            CgroupValue::NetClsClassId(_) => "net-cls-classid",
            CgroupValue::CpuIdle(_) => "cpu-idle",
        }
    }

    /// True for values of an optional kernel feature (group identity's `cpu.bvt_warp_ns`): a
    /// kernel that has the file but refuses the value (`EINVAL`, `ENODEV`) lacks the feature, and
    /// the write is skipped like a missing file.
    pub fn is_optional_feature(&self) -> bool {
        matches!(self, CgroupValue::BvtWarpNs(_))
    }
}

impl fmt::Display for CgroupValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupValue::CpusetCpus(s) => write!(f, "{}={s:?}", self.kind()),
            CgroupValue::CpuShares(v)
            | CgroupValue::CfsQuota(v)
            | CgroupValue::CfsPeriod(v)
            | CgroupValue::MemoryLimit(v)
            | CgroupValue::BvtWarpNs(v)
            | CgroupValue::CpuIdle(v) => write!(f, "{}={v}", self.kind()),
            CgroupValue::NetClsClassId(v) => write!(f, "{}={v:#x}", self.kind()),
        }
    }
}

/// Cgroup version of the hierarchy holding the cpu and memory controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupVersion {
    /// Legacy or hybrid: one hierarchy per controller.
    V1,
    /// Unified hierarchy.
    V2,
}

/// A value that was not what it should be, and was corrected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The file written.
    pub path: PathBuf,
    /// What it held (trimmed).
    pub old: String,
    /// What was written.
    pub new: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} → {}", self.path.display(), self.old, self.new)
    }
}

/// The result of one successful [`CgroupFs::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// The file already held the value; nothing written.
    Unchanged,
    /// The file was corrected.
    Corrected(Drift),
    /// The kernel has no such file; skipped.
    Unsupported,
}

/// Why a value could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The directory name is refused: a `..` component, a relative name that is not a systemd
    /// name, or a systemd name under the cgroupfs driver (see [`crate::cgroup_path::resolve`]).
    #[error("refusing cgroup directory {0:?}: {1}")]
    BadDir(String, PathError),
    /// The name has no directory of its own: empty (the runtime's default cgroup, valid in CRI)
    /// or the root. Callers skip such writes.
    #[error("cgroup {0:?} has no directory of its own (empty: the runtime's default; or the root)")]
    NoOwnDir(String),
    /// The cgroup directory does not exist.
    #[error("cgroup directory {0} does not exist")]
    NoDir(PathBuf),
    /// Reading or writing the file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// `reading` or `writing "<value>" to`.
        op: String,
        /// The file.
        path: PathBuf,
        /// The OS error (EINVAL for values the kernel refuses, EBUSY for a memory limit below
        /// usage).
        source: io::Error,
    },
    /// The value cannot be expressed (e.g. an invalid CPU list).
    #[error("invalid value {0}")]
    BadValue(String),
}

impl CgroupError {
    /// True for EINVAL from the kernel, which v1 returns for a CFS quota/period that would let a
    /// child exceed its parent: retried after the other writes of the same pod.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, CgroupError::Io { source, .. } if source.raw_os_error() == Some(libc::EINVAL))
    }
}

/// The cgroup file system: root, version, the node's cgroup driver, and the files the kernel
/// turned out not to support.
#[derive(Debug)]
pub struct CgroupFs {
    root: PathBuf,
    version: CgroupVersion,
    driver: Option<CgroupDriver>,
    weight: WeightConversion,
    systemd: Option<Systemd>,
    unsupported: Mutex<BTreeSet<String>>,
    /// `unit: error` already logged, so a failing bus is one WARN per unit and error.
    unit_errors: Mutex<BTreeSet<String>>,
}

impl CgroupFs {
    /// A cgroup file system at `root` of the given version (tests use a temp tree), its driver
    /// auto (each name's form decides, see [`crate::cgroup_path`]).
    pub fn new(root: impl Into<PathBuf>, version: CgroupVersion) -> CgroupFs {
        CgroupFs {
            root: root.into(),
            version,
            driver: None,
            weight: WeightConversion::default(),
            systemd: None,
            unsupported: Mutex::new(BTreeSet::new()),
            unit_errors: Mutex::new(BTreeSet::new()),
        }
    }

    /// The same, setting the values of systemd-owned cgroups (slices, scopes) as their units'
    /// properties through `systemd` too (module docs, "systemd units"); `None`: files only.
    pub fn with_systemd(mut self, systemd: Option<Systemd>) -> CgroupFs {
        self.systemd = systemd;
        self
    }

    /// Whether values are also set as systemd unit properties.
    pub fn sets_unit_properties(&self) -> bool {
        self.systemd.is_some()
    }

    /// Forgets what was sent to systemd for the unit owning the cgroup `dir` (a pod removed),
    /// so a unit of the same name later gets its properties again.
    pub fn forget_unit(&self, dir: &str) {
        let (Some(sd), Ok(path)) = (&self.systemd, self.cgroup_dir(dir)) else { return };
        if let Some(unit) = systemd::unit_of(&path) {
            sd.forget(&unit);
        }
    }

    /// The same with the node's CPU shares → `cpu.weight` conversion: `Some` forces one
    /// (`--cpu-weight-formula linear|runc`), `None` learns the runtime's ([`crate::cpu_weight`]).
    pub fn with_weight_formula(mut self, forced: Option<WeightFormula>) -> CgroupFs {
        self.weight = WeightConversion::new(forced);
        self
    }

    /// The CPU shares → `cpu.weight` conversion every v2 write and comparison uses.
    pub fn weight(&self) -> &WeightConversion {
        &self.weight
    }

    /// Learns the runtime's `cpu.weight` formula from a container it created with `shares`
    /// (cgroup v2, while the formula is being learned): reads the container directory `dir`'s
    /// `cpu.weight` and logs the formula when this sample decides it. Unreadable files and
    /// samples that decide nothing are ignored.
    pub fn learn_weight_formula(&self, dir: &str, shares: i64) {
        if self.version != CgroupVersion::V2 || !self.weight.learning() {
            return;
        }
        let Ok(path) = self.file_path(dir, &CgroupValue::CpuShares(shares)) else { return };
        let Some(weight) = std::fs::read_to_string(&path).ok().and_then(|t| t.trim().parse::<i64>().ok()) else {
            return;
        };
        if let Some(formula) = self.weight.learn(shares, weight) {
            tracing::info!(
                formula = formula.as_str(),
                sample = %path.display(),
                shares,
                weight,
                "cpu.weight formula learned from the runtime: {shares} CPU shares became weight {weight}; runtime-hooks writes and compares cpu.weight with the {} formula",
                formula.as_str()
            );
        }
    }

    /// The same with the node's cgroup driver: `None` = auto (each name's form decides),
    /// `Some(Cgroupfs)` refuses systemd names, `Some(Systemd)` expands them.
    pub fn with_driver(mut self, driver: Option<CgroupDriver>) -> CgroupFs {
        self.driver = driver;
        self
    }

    /// The cgroup driver in use (`None`: auto).
    pub fn driver(&self) -> Option<CgroupDriver> {
        self.driver
    }

    /// The directory below each controller's root for a cgroup parent as kubelet or the runtime
    /// gives it ([`crate::cgroup_path::resolve`] with this driver); `None` for an empty name
    /// (the runtime's default) or the root.
    ///
    /// Errors: [`CgroupError::BadDir`].
    pub fn resolve(&self, name: &str) -> Result<Option<String>, CgroupError> {
        cgroup_path::resolve(name, self.driver).map_err(|e| CgroupError::BadDir(name.to_owned(), e))
    }

    /// The cgroup file system at `root`, its version detected from the file system type
    /// (`cgroup2` → v2; otherwise v1 if `<root>/cpu` exists).
    ///
    /// Errors: `root` cannot be inspected, or looks like neither version.
    pub fn detect(root: impl Into<PathBuf>) -> io::Result<CgroupFs> {
        let root = root.into();
        let version = detect_version(&root)?;
        Ok(CgroupFs::new(root, version))
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cgroup version.
    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The controller directory a value lives under (v1), e.g. `cpu`.
    fn controller(value: &CgroupValue) -> &'static str {
        match value {
            CgroupValue::CpuShares(_)
            | CgroupValue::CfsQuota(_)
            | CgroupValue::CfsPeriod(_)
            | CgroupValue::BvtWarpNs(_)
            | CgroupValue::CpuIdle(_) => "cpu",
            CgroupValue::MemoryLimit(_) => "memory",
            CgroupValue::CpusetCpus(_) => "cpuset",
            CgroupValue::NetClsClassId(_) => "net_cls",
        }
    }

    /// The file name for a value in this version.
    pub fn file_name(&self, value: &CgroupValue) -> &'static str {
        match (self.version, value) {
            (CgroupVersion::V1, CgroupValue::CpuShares(_)) => "cpu.shares",
            (CgroupVersion::V1, CgroupValue::CfsQuota(_)) => "cpu.cfs_quota_us",
            (CgroupVersion::V1, CgroupValue::CfsPeriod(_)) => "cpu.cfs_period_us",
            (CgroupVersion::V1, CgroupValue::MemoryLimit(_)) => "memory.limit_in_bytes",
            (CgroupVersion::V2, CgroupValue::CpuShares(_)) => "cpu.weight",
            (CgroupVersion::V2, CgroupValue::CfsQuota(_) | CgroupValue::CfsPeriod(_)) => "cpu.max",
            (CgroupVersion::V2, CgroupValue::MemoryLimit(_)) => "memory.max",
            (_, CgroupValue::CpusetCpus(_)) => "cpuset.cpus",
            (_, CgroupValue::BvtWarpNs(_)) => "cpu.bvt_warp_ns",
            (_, CgroupValue::NetClsClassId(_)) => "net_cls.classid",
            (_, CgroupValue::CpuIdle(_)) => "cpu.idle",
        }
    }

    /// The directory holding `value`'s file for the cgroup `dir`, in any form
    /// [`CgroupFs::resolve`] accepts (`/kubepods/pod<uid>`, `kubepods-pod<uid>.slice`).
    ///
    /// Errors: [`CgroupError::BadDir`]; [`CgroupError::NoOwnDir`] for an empty name or the root.
    pub fn dir_path(&self, dir: &str, value: &CgroupValue) -> Result<PathBuf, CgroupError> {
        let resolved = self.resolve(dir)?.ok_or_else(|| CgroupError::NoOwnDir(dir.to_owned()))?;
        let rel = resolved.trim_start_matches('/');
        Ok(match self.version {
            CgroupVersion::V1 => self.root.join(Self::controller(value)).join(rel),
            CgroupVersion::V2 => self.root.join(rel),
        })
    }

    /// The CPUs a container of the pod cgroup `pod_dir` may use when it has no cpuset of its own
    /// (the shared pool): the pod directory's CPUs (v1 `cpuset/<dir>/cpuset.cpus`, v2
    /// `<dir>/cpuset.cpus.effective`), else the root's; `None` when neither can be read. For
    /// runtimes that cannot be asked to clear a cpuset (NRI takes `""` as "no change").
    pub fn shared_cpus(&self, pod_dir: Option<&str>) -> Option<String> {
        let (controller, file) = match self.version {
            CgroupVersion::V1 => ("cpuset", "cpuset.cpus"),
            CgroupVersion::V2 => ("", "cpuset.cpus.effective"),
        };
        let base = self.root.join(controller);
        let pod = pod_dir.and_then(|d| self.resolve(d).ok().flatten()).map(|d| base.join(d.trim_start_matches('/')));
        pod.into_iter().chain([base.clone()]).find_map(|dir| {
            let text = std::fs::read_to_string(dir.join(file)).ok()?;
            let cpus = parse_cpu_list(text.trim()).ok().filter(|c| !c.is_empty())?;
            Some(format_cpu_list(&cpus))
        })
    }

    /// The directory of the cgroup `dir` in the hierarchy whose files most values live in (v1:
    /// the cpu controller's; v2: the unified one): where to look whether a pod's or
    /// container's cgroup exists at all.
    ///
    /// Errors: as [`CgroupFs::dir_path`].
    pub fn cgroup_dir(&self, dir: &str) -> Result<PathBuf, CgroupError> {
        self.dir_path(dir, &CgroupValue::CpuShares(0))
    }

    /// The full path of `value`'s file for the cgroup `dir`.
    pub fn file_path(&self, dir: &str, value: &CgroupValue) -> Result<PathBuf, CgroupError> {
        Ok(self.dir_path(dir, value)?.join(self.file_name(value)))
    }

    /// Makes the cgroup `dir` hold `value`: reads the file, and writes only if the normalized
    /// value differs.
    ///
    /// Errors: see [`CgroupError`]; a write the kernel does not support (module documentation)
    /// is `Ok(Unsupported)`, logged once per file name.
    pub fn apply(&self, dir: &str, value: &CgroupValue) -> Result<Written, CgroupError> {
        let dir_path = self.dir_path(dir, value)?;
        let path = dir_path.join(self.file_name(value));
        if let CgroupValue::NetClsClassId(_) = value {
            // net_cls is a v1 hierarchy of its own; v2 has no such file at all.
            let hierarchy = self.root.join(Self::controller(value));
            if self.version == CgroupVersion::V2 || !hierarchy.is_dir() {
                self.note_unsupported(&path, &io::Error::from(io::ErrorKind::NotFound));
                return Ok(Written::Unsupported);
            }
        }
        let current = match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().to_owned(),
            Err(source) => {
                return self.unsupported_or(value, &dir_path, CgroupError::Io { op: "reading".into(), path, source })
            }
        };
        let new = self.desired_text(&dir_path, value, &current)?;
        self.set_unit_property(&dir_path, value, &current, new.is_some());
        let Some(new) = new else {
            return Ok(Written::Unchanged);
        };
        if let Err(source) = std::fs::write(&path, &new) {
            return self.unsupported_or(
                value,
                &dir_path,
                CgroupError::Io { op: format!("writing {new:?} to"), path, source },
            );
        }
        Ok(Written::Corrected(Drift { path, old: current, new }))
    }

    /// Sets `value` as the property of the systemd unit owning `dir_path`, if there is one and
    /// a bus (module docs, "systemd units"); `current` is the file's content (its other half of
    /// `cpu.max`), `drifted` that it differs from `value` (then the property is sent again even
    /// if this process sent it before: kubelet or a resize may have changed it since).
    fn set_unit_property(&self, dir_path: &Path, value: &CgroupValue, current: &str, drifted: bool) {
        let Some(sd) = &self.systemd else { return };
        let Some(unit) = systemd::unit_of(dir_path) else { return };
        let Some(property) = self.unit_property(dir_path, value, current) else { return };
        if drifted {
            sd.forget_properties(&unit, std::slice::from_ref(&property));
        }
        match sd.set_properties(&unit, &[property]) {
            Ok(_) => {}
            Err(e) if e.is_no_such_unit() => {
                tracing::debug!(unit = %unit, "systemd has no unit {unit}; {value} written to the file only")
            }
            Err(e) => {
                let key = format!("{unit}: {e}");
                if self.unit_errors.lock().unwrap_or_else(|p| p.into_inner()).insert(key) {
                    tracing::warn!(unit = %unit, value = %value, "setting the systemd unit's property failed ({e}); the cgroup file is written, and systemd may revert it at the next daemon-reload");
                }
            }
        }
    }

    /// The unit property for `value` in this cgroup version (`None`: systemd has none, e.g.
    /// group identity, `cpu.idle`, v1 `cpuset.cpus`, which systemd never writes on v1).
    fn unit_property(&self, dir_path: &Path, value: &CgroupValue, current: &str) -> Option<UnitProperty> {
        let limit = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
        let v1_file =
            |name: &str| std::fs::read_to_string(dir_path.join(name)).ok().and_then(|t| t.trim().parse::<i64>().ok());
        let (cur_quota, cur_period) = match self.version {
            CgroupVersion::V2 => {
                let (q, p) = current.split_once(' ').unwrap_or((current, "100000"));
                (q.parse::<i64>().ok(), p.parse::<i64>().ok())
            }
            CgroupVersion::V1 => (None, None),
        };
        match (self.version, value) {
            (CgroupVersion::V2, CgroupValue::CpuShares(s)) => {
                Some(UnitProperty::CpuWeight(self.weight.weight(*s) as u64))
            }
            (CgroupVersion::V1, CgroupValue::CpuShares(s)) => {
                Some(UnitProperty::CpuShares((*s).clamp(MIN_SHARES, MAX_SHARES) as u64))
            }
            (version, CgroupValue::CfsQuota(q)) => {
                let period = if version == CgroupVersion::V2 { cur_period } else { v1_file("cpu.cfs_period_us") };
                Some(UnitProperty::CpuQuota { quota_us: limit(*q).map(|q| q.max(1000)), period_us: limit(period?)? })
            }
            (version, CgroupValue::CfsPeriod(p)) => {
                let quota = if version == CgroupVersion::V2 { cur_quota } else { v1_file("cpu.cfs_quota_us") };
                Some(UnitProperty::CpuQuota { quota_us: quota.and_then(limit), period_us: limit(*p)? })
            }
            (CgroupVersion::V2, CgroupValue::MemoryLimit(m)) => Some(UnitProperty::MemoryMax(limit(*m))),
            (CgroupVersion::V1, CgroupValue::MemoryLimit(m)) => Some(UnitProperty::MemoryLimit(limit(*m))),
            (CgroupVersion::V2, CgroupValue::CpusetCpus(cpus)) => {
                parse_cpu_list(cpus).ok().map(UnitProperty::AllowedCpus)
            }
            _ => None,
        }
    }

    /// An I/O error as the kernel meant it: a missing directory is [`CgroupError::NoDir`], an
    /// unsupported write (see [`unsupported_errno`]) is `Ok(Unsupported)` (logged once), anything
    /// else the error itself.
    fn unsupported_or(&self, value: &CgroupValue, dir_path: &Path, error: CgroupError) -> Result<Written, CgroupError> {
        let CgroupError::Io { path, source, .. } = &error else {
            return Err(error);
        };
        if source.kind() == io::ErrorKind::NotFound && !dir_path.is_dir() {
            return Err(CgroupError::NoDir(dir_path.to_owned()));
        }
        match source.raw_os_error() {
            Some(errno) if unsupported_errno(value, errno) => {
                self.note_unsupported(path, source);
                Ok(Written::Unsupported)
            }
            _ => Err(error),
        }
    }

    /// What to write given the current file content, or `None` when it already matches.
    fn desired_text(&self, dir_path: &Path, value: &CgroupValue, current: &str) -> Result<Option<String>, CgroupError> {
        let differs = |new: String, same: bool| Ok(if same { None } else { Some(new) });
        match (self.version, value) {
            (CgroupVersion::V1, CgroupValue::CpuShares(s)) => {
                let s = (*s).clamp(MIN_SHARES, MAX_SHARES);
                differs(s.to_string(), current.parse::<i64>().ok() == Some(s))
            }
            (CgroupVersion::V2, CgroupValue::CpuShares(s)) => {
                let w = self.weight.weight(*s);
                differs(w.to_string(), current.parse::<i64>().ok() == Some(w))
            }
            (CgroupVersion::V1, CgroupValue::CfsQuota(q)) => {
                let q = if *q <= 0 { -1 } else { (*q).max(1000) };
                differs(q.to_string(), current.parse::<i64>().ok() == Some(q))
            }
            (CgroupVersion::V1, CgroupValue::CfsPeriod(p)) | (CgroupVersion::V1, CgroupValue::BvtWarpNs(p)) => {
                differs(p.to_string(), current.parse::<i64>().ok() == Some(*p))
            }
            (CgroupVersion::V2, CgroupValue::BvtWarpNs(p)) => {
                differs(p.to_string(), current.parse::<i64>().ok() == Some(*p))
            }
            // The kernel reads it back in decimal.
            (_, CgroupValue::NetClsClassId(id)) => differs(id.to_string(), current.parse::<u32>().ok() == Some(*id)),
            (_, CgroupValue::CpuIdle(v)) => differs(v.to_string(), current.parse::<i64>().ok() == Some(*v)),
            (CgroupVersion::V2, CgroupValue::CfsQuota(q)) => {
                let (cur_q, cur_p) = current.split_once(' ').unwrap_or((current, ""));
                let q = if *q <= 0 { "max".to_owned() } else { (*q).max(1000).to_string() };
                // Keep the period: "quota" alone leaves it unchanged, but writing both is explicit.
                let new = if cur_p.is_empty() { q.clone() } else { format!("{q} {cur_p}") };
                differs(new, cur_q == q)
            }
            (CgroupVersion::V2, CgroupValue::CfsPeriod(p)) => {
                let (cur_q, cur_p) = current.split_once(' ').unwrap_or((current, ""));
                differs(format!("{cur_q} {p}"), cur_p.parse::<i64>().ok() == Some(*p))
            }
            (CgroupVersion::V1, CgroupValue::MemoryLimit(m)) => {
                let cur: Option<i64> = current.parse().ok();
                if *m <= 0 {
                    differs("-1".into(), cur.is_some_and(|c| c >= V1_UNLIMITED_FROM))
                } else {
                    // The kernel rounds down to whole pages.
                    let page = page_size();
                    differs(m.to_string(), cur == Some(m / page * page))
                }
            }
            (CgroupVersion::V2, CgroupValue::MemoryLimit(m)) => {
                if *m <= 0 {
                    differs("max".into(), current == "max")
                } else {
                    let page = page_size();
                    differs(m.to_string(), current.parse::<i64>().ok() == Some(m / page * page))
                }
            }
            (version, CgroupValue::CpusetCpus(cpus)) => {
                let target = if cpus.is_empty() && version == CgroupVersion::V1 {
                    // v1 has no "inherit": the shared pool is whatever the parent may use.
                    let parent = dir_path.parent().map(|p| p.join("cpuset.cpus")).unwrap_or_default();
                    std::fs::read_to_string(&parent)
                        .map_err(|source| CgroupError::Io { op: "reading".into(), path: parent, source })?
                        .trim()
                        .to_owned()
                } else {
                    cpus.clone()
                };
                let want =
                    parse_cpu_list(&target).map_err(|e| CgroupError::BadValue(format!("cpuset {target:?}: {e}")))?;
                let have = parse_cpu_list(current).ok();
                // Written in the canonical form: older kernels refuse spaces in the list.
                differs(format_cpu_list(&want), have.as_ref() == Some(&want))
            }
        }
    }

    /// Logs (once per file name) that the kernel does not support a file.
    fn note_unsupported(&self, path: &Path, error: &io::Error) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let first = self.unsupported.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone());
        if !first {
            return;
        }
        let dir = path.parent().map(|p| p.display().to_string()).unwrap_or_default();
        if error.kind() == io::ErrorKind::NotFound {
            tracing::warn!(file = %name, example = %path.display(), "this kernel has no {name} (not in {dir}); every write of {name} is skipped");
        } else {
            tracing::warn!(file = %name, example = %path.display(), "this kernel does not support {name} ({error}); every write of {name} is skipped");
        }
    }

    /// File names found unsupported so far (kernel features this node lacks).
    pub fn unsupported(&self) -> Vec<String> {
        self.unsupported.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

/// True when `errno` from reading or writing `value`'s file in an existing directory means the
/// kernel does not support the write (skipped, not an error): `ENOENT` (the file is missing) and
/// `EOPNOTSUPP` for any file, and for optional features ([`CgroupValue::is_optional_feature`])
/// also `EINVAL` and `ENODEV` (the file is there, the feature is not).
pub fn unsupported_errno(value: &CgroupValue, errno: i32) -> bool {
    errno == libc::EOPNOTSUPP
        || errno == libc::ENOTSUP
        || errno == libc::ENOENT
        || (value.is_optional_feature() && (errno == libc::EINVAL || errno == libc::ENODEV))
}

/// Highest CPU number accepted in a CPU list, plus one (the kernel's `NR_CPUS` maximum).
pub const MAX_CPUS: u32 = 8192;

/// Parses a kernel CPU list (`cpuset.cpus`, the kernel's `bitmap_parselist` format:
/// `"0-3,6"`) into a sorted set. Whitespace anywhere is removed first (`" 0 - 1 "` is `0-1`);
/// then the list must be comma-separated elements, each a CPU number or an ascending range
/// `A-B` of ASCII decimal numbers below [`MAX_CPUS`]. `""` (or only whitespace) is the empty
/// set. Elements may overlap and come in any order.
///
/// Errors: an empty element (`"0,,1"`, `"1,"`), a non-number (`"a"`, `"+1"`, `"1-"`), a
/// descending range (`"3-1"`), a CPU ≥ 8192; the message names the element.
pub fn parse_cpu_list(s: &str) -> Result<BTreeSet<u32>, String> {
    let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.is_empty() {
        return Ok(BTreeSet::new());
    }
    let number = |n: &str| {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{n:?} is not a CPU number"));
        }
        match n.parse::<u32>() {
            Ok(v) if v < MAX_CPUS => Ok(v),
            _ => Err(format!("CPU {n} is out of range (at most {})", MAX_CPUS - 1)),
        }
    };
    let mut ranges = Vec::new();
    for part in compact.split(',') {
        if part.is_empty() {
            return Err(format!("empty element in CPU list {compact:?}"));
        }
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b) = (number(a)?, number(b)?);
        if a > b {
            return Err(format!("CPU range {part:?} is descending"));
        }
        ranges.push((a, b));
    }
    // Merged first, so a long list of overlapping ranges costs no more than MAX_CPUS inserts.
    ranges.sort_unstable();
    let mut cpus = BTreeSet::new();
    let mut next = 0; // the lowest CPU not inserted yet
    for (a, b) in ranges {
        cpus.extend(a.max(next)..=b);
        next = next.max(b + 1);
    }
    Ok(cpus)
}

/// The canonical kernel form of a CPU set: ascending, consecutive CPUs merged into ranges
/// (`{0, 1, 2, 5, 7, 8}` → `"0-2,5,7-8"`, a single CPU without a range); `""` for the empty set.
/// [`parse_cpu_list`] reads it back unchanged.
pub fn format_cpu_list(cpus: &BTreeSet<u32>) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &cpu in cpus {
        match ranges.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(cpu) => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    let parts: Vec<String> =
        ranges.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    parts.join(",")
}

fn page_size() -> i64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as i64
    } else {
        4096
    }
}

/// `statfs(2)`'s `f_type` of a cgroup2 mount.
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
/// `f_type` of a cgroup v1 controller mount.
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;

/// The file system type (`statfs(2)`'s `f_type`) of the mount `path` is on, symlinks followed.
fn fs_type(path: &Path) -> io::Result<i64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: statfs writes into the zeroed struct we own; `c` is a valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Whether the mount `path` is on is read-only (`statvfs(2)`'s `ST_RDONLY`).
fn read_only(path: &Path) -> io::Result<bool> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: statvfs writes into the zeroed struct we own; `c` is a valid NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}

/// A file system type's name for messages.
fn fs_name(magic: i64) -> String {
    match magic {
        CGROUP2_SUPER_MAGIC => "cgroup2".into(),
        CGROUP_SUPER_MAGIC => "cgroup (v1)".into(),
        0x0102_1994 => "tmpfs".into(),
        0x794c_7630 => "overlay".into(),
        0xef53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683e => "btrfs".into(),
        0x6265_6572 => "sysfs".into(),
        0x9fa0 => "proc".into(),
        other => format!("a file system of type {other:#x}"),
    }
}

/// The fix every refusal of [`check_root`] ends with.
const ROOT_FIX: &str = "runtime-hooks writes the pods' cgroup files below --cgroup-root: give it the host's cgroup file system \
(the default /sys/fs/cgroup on the host; in a DaemonSet a hostPath mount of /sys/fs/cgroup, e.g. at /host/sys/fs/cgroup, \
read-write) and its version (--cgroup-version auto detects it)";

/// Checks at start that `root` is what runtime-hooks can write pods' cgroups in: a mounted
/// cgroup file system, of version `want` when given (`None`: auto), and writable. Returns the
/// version found, and warnings (a v1 hierarchy without the memory or cpuset controller: those
/// values cannot be written).
///
/// * cgroup2 mounted at `root` → v2;
/// * cgroup v1 controllers mounted below `root` (`root/cpu` a cgroup mount; `root` itself a
///   tmpfs, on legacy and hybrid hosts) → v1;
/// * anything else — `root` missing, an empty directory or one of the image's own files (a
///   DaemonSet without the host mount), another file system — is refused.
///
/// A container's own `/sys/fs/cgroup` (its cgroup namespace) is a mount of the right type but
/// read-only unless the container is privileged: refused as read-only. A privileged
/// container's own view passes; the reconciler's warning for a pass that finds none of the
/// pods' directories ([`crate::standalone::reconciler`]) catches it.
///
/// Errors: one message naming `root`, what was found there and the fix.
pub fn check_root(root: &Path, want: Option<CgroupVersion>) -> Result<(CgroupVersion, Vec<String>), String> {
    let shown = root.display();
    let refuse = |found: String| format!("--cgroup-root {shown}: {found}; {ROOT_FIX}");
    let meta = match std::fs::metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(refuse("does not exist".into())),
        Err(e) => return Err(refuse(format!("cannot be inspected ({e})"))),
    };
    if !meta.is_dir() {
        return Err(refuse("is not a directory".into()));
    }
    let magic = fs_type(root).map_err(|e| refuse(format!("cannot be inspected ({e})")))?;
    let (found, writable_at) = if magic == CGROUP2_SUPER_MAGIC {
        (CgroupVersion::V2, root.to_owned())
    } else if fs_type(&root.join("cpu")).ok() == Some(CGROUP_SUPER_MAGIC) {
        (CgroupVersion::V1, root.join("cpu"))
    } else if magic == CGROUP_SUPER_MAGIC {
        return Err(refuse(format!(
            "is one cgroup v1 controller's mount, not the root of the controllers: use its parent ({})",
            root.parent().unwrap_or(root).display()
        )));
    } else {
        let what = fs_name(magic);
        let contents = match std::fs::read_dir(root).map(|mut d| d.next().is_none()) {
            Ok(true) => "an empty directory",
            _ => "a directory",
        };
        let expected = match want {
            Some(CgroupVersion::V2) => "a cgroup2 mount (--cgroup-version v2)",
            Some(CgroupVersion::V1) => "cgroup v1 controllers (--cgroup-version v1: a cgroup mount at <root>/cpu)",
            None => "a cgroup2 mount, or cgroup v1 controllers (a cgroup mount at <root>/cpu)",
        };
        return Err(refuse(format!("{contents} on {what}, not a mounted cgroup file system: expected {expected}")));
    };
    match (want, found) {
        (Some(CgroupVersion::V2), CgroupVersion::V1) => {
            return Err(refuse(format!(
                "is a cgroup v1 hierarchy ({} with v1 controllers such as {}/cpu), not cgroup2 as --cgroup-version v2 says; \
                 use --cgroup-version v1 (or auto){}",
                fs_name(magic),
                shown,
                if root.join("unified").is_dir() { " (a hybrid host: its cgroup2 part, <root>/unified, holds no controllers)" } else { "" }
            )))
        }
        (Some(CgroupVersion::V1), CgroupVersion::V2) => {
            return Err(refuse(
                "is a cgroup2 (unified) mount, not cgroup v1 as --cgroup-version v1 says; use --cgroup-version v2 (or auto)".into(),
            ))
        }
        _ => {}
    }
    if read_only(&writable_at).unwrap_or(false) {
        return Err(refuse(format!(
            "{} is mounted read-only (a container's own /sys/fs/cgroup is, unless privileged: mount the host's read-write)",
            writable_at.display()
        )));
    }
    let mut warnings = Vec::new();
    if found == CgroupVersion::V1 {
        for ctrl in ["memory", "cpuset"] {
            if fs_type(&root.join(ctrl)).ok() != Some(CGROUP_SUPER_MAGIC) {
                warnings.push(format!(
                    "--cgroup-root {shown}: no cgroup v1 {ctrl} controller at {shown}/{ctrl}; the plugins' {ctrl} values cannot be written"
                ));
            }
        }
    }
    Ok((found, warnings))
}

/// The version of the hierarchy at `root`: `cgroup2` file system → v2; anything else (tmpfs)
/// with a `cpu` subdirectory → v1. Looks at the directory only (`--unchecked-cgroup-root`
/// trees, tests); the start-up check is [`check_root`].
pub fn detect_version(root: &Path) -> io::Result<CgroupVersion> {
    if fs_type(root)? == CGROUP2_SUPER_MAGIC {
        Ok(CgroupVersion::V2)
    } else if root.join("cpu").is_dir() {
        Ok(CgroupVersion::V1)
    } else {
        Err(io::Error::other(format!(
            "{} is neither a cgroup2 mount nor a v1 hierarchy with a cpu controller",
            root.display()
        )))
    }
}

#[cfg(test)]
#[path = "cgroup_tests.rs"]
mod tests;
