//! Cgroup files: where a value lives, in which unit, and writing it only when it differs.
//!
//! Plugins speak in [`CgroupValue`]s (CPU shares, CFS quota and period in µs, memory bytes,
//! cpuset, group identity); [`CgroupFs`] maps each to the file of the cgroup version in use and
//! converts units, reads the current value, and writes only when the normalized values differ,
//! returning the [`Drift`] it corrected. That makes every write idempotent, which the
//! reconciler relies on (a second pass over unchanged pods writes nothing).
//!
//! # Layout (cgroupfs driver)
//!
//! A cgroup directory is named by its path below the hierarchy root, as kubelet names it in
//! `cgroup_parent` (`/kubepods/besteffort/pod<uid>`; a container is `<parent>/<container id>`):
//!
//! | | v1 (legacy or hybrid) | v2 (unified) |
//! |---|---|---|
//! | path | `<root>/<controller>/<dir>/<file>` | `<root>/<dir>/<file>` |
//! | [`CgroupValue::CpuShares`] | `cpu/cpu.shares` (2..=262144) | `cpu.weight` = 1 + ((shares − 2) × 9999) / 262142 (runc's conversion) |
//! | [`CgroupValue::CfsQuota`] | `cpu/cpu.cfs_quota_us` (µs, −1 = unlimited) | first field of `cpu.max` (`max` = unlimited) |
//! | [`CgroupValue::CfsPeriod`] | `cpu/cpu.cfs_period_us` (µs) | second field of `cpu.max` |
//! | [`CgroupValue::MemoryLimit`] | `memory/memory.limit_in_bytes` (bytes, −1 = unlimited) | `memory.max` (`max` = unlimited) |
//! | [`CgroupValue::CpusetCpus`] | `cpuset/cpuset.cpus`; `""` is written as the parent's value | `cpuset.cpus` (`""` = inherit) |
//! | [`CgroupValue::BvtWarpNs`] | `cpu/cpu.bvt_warp_ns` | `cpu.bvt_warp_ns` |
//!
//! The root is `/sys/fs/cgroup` on a node and a temp directory in tests. [`CgroupFs::detect`]
//! tells the versions apart by the file system type of the root (`cgroup2` → v2; `tmpfs` with
//! per-controller mounts → v1, which includes the hybrid layout, where `unified/` holds only
//! the v2 hierarchy without the cpu and memory controllers). The systemd driver's `.slice` /
//! `.scope` names are not supported.
//!
//! # Missing files
//!
//! A file missing in an existing directory means the kernel lacks the feature (most kernels have
//! no `cpu.bvt_warp_ns`, an Alibaba Cloud Linux / Anolis extension): the write is
//! [`Written::Unsupported`], logged once per file name per process, and never an error. A missing
//! directory is an error ([`CgroupError::NoDir`]): the pod or container is not (or no longer)
//! there.
//!
//! Directory names come from hook requests and the runtime: a name with a `..` component, or
//! one that is not absolute, is refused before anything is touched.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;

/// CPU shares bounds of the kernel (and kubelet): 2..=262144.
pub const MIN_SHARES: i64 = 2;
/// Upper bound of `cpu.shares`.
pub const MAX_SHARES: i64 = 262_144;
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
        }
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
            | CgroupValue::BvtWarpNs(v) => write!(f, "{}={v}", self.kind()),
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
    /// The directory name is not an absolute path without `..`.
    #[error("refusing cgroup directory {0:?}: not an absolute path without \"..\"")]
    BadDir(String),
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

/// The cgroup file system: root, version, and the files the kernel turned out not to have.
#[derive(Debug)]
pub struct CgroupFs {
    root: PathBuf,
    version: CgroupVersion,
    unsupported: Mutex<BTreeSet<String>>,
}

impl CgroupFs {
    /// A cgroup file system at `root` of the given version (tests use a temp tree).
    pub fn new(root: impl Into<PathBuf>, version: CgroupVersion) -> CgroupFs {
        CgroupFs { root: root.into(), version, unsupported: Mutex::new(BTreeSet::new()) }
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
            CgroupValue::CpuShares(_) | CgroupValue::CfsQuota(_) | CgroupValue::CfsPeriod(_) | CgroupValue::BvtWarpNs(_) => "cpu",
            CgroupValue::MemoryLimit(_) => "memory",
            CgroupValue::CpusetCpus(_) => "cpuset",
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
        }
    }

    /// The directory holding `value`'s file for the cgroup `dir` (kubelet's form,
    /// `/kubepods/pod<uid>`).
    ///
    /// Errors: `dir` is not absolute or has a `..` component.
    pub fn dir_path(&self, dir: &str, value: &CgroupValue) -> Result<PathBuf, CgroupError> {
        let rel = Path::new(dir);
        if !rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(CgroupError::BadDir(dir.to_owned()));
        }
        let rel = dir.trim_start_matches('/');
        Ok(match self.version {
            CgroupVersion::V1 => self.root.join(Self::controller(value)).join(rel),
            CgroupVersion::V2 => self.root.join(rel),
        })
    }

    /// The full path of `value`'s file for the cgroup `dir`.
    pub fn file_path(&self, dir: &str, value: &CgroupValue) -> Result<PathBuf, CgroupError> {
        Ok(self.dir_path(dir, value)?.join(self.file_name(value)))
    }

    /// Makes the cgroup `dir` hold `value`: reads the file, and writes only if the normalized
    /// value differs.
    ///
    /// Errors: see [`CgroupError`]; a file the kernel does not have is `Ok(Unsupported)`.
    pub fn apply(&self, dir: &str, value: &CgroupValue) -> Result<Written, CgroupError> {
        let dir_path = self.dir_path(dir, value)?;
        let path = dir_path.join(self.file_name(value));
        let current = match std::fs::read_to_string(&path) {
            Ok(s) => s.trim().to_owned(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !dir_path.is_dir() {
                    return Err(CgroupError::NoDir(dir_path));
                }
                self.note_unsupported(&path);
                return Ok(Written::Unsupported);
            }
            Err(source) => return Err(CgroupError::Io { op: "reading".into(), path, source }),
        };
        let Some(new) = self.desired_text(&dir_path, value, &current)? else {
            return Ok(Written::Unchanged);
        };
        std::fs::write(&path, &new).map_err(|source| CgroupError::Io { op: format!("writing {new:?} to"), path: path.clone(), source })?;
        Ok(Written::Corrected(Drift { path, old: current, new }))
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
                let w = shares_to_weight(*s);
                differs(w.to_string(), current.parse::<i64>().ok() == Some(w))
            }
            (CgroupVersion::V1, CgroupValue::CfsQuota(q)) => {
                let q = if *q <= 0 { -1 } else { (*q).max(1000) };
                differs(q.to_string(), current.parse::<i64>().ok() == Some(q))
            }
            (CgroupVersion::V1, CgroupValue::CfsPeriod(p)) | (CgroupVersion::V1, CgroupValue::BvtWarpNs(p)) => {
                differs(p.to_string(), current.parse::<i64>().ok() == Some(*p))
            }
            (CgroupVersion::V2, CgroupValue::BvtWarpNs(p)) => differs(p.to_string(), current.parse::<i64>().ok() == Some(*p)),
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
                let want = parse_cpu_list(&target).map_err(|e| CgroupError::BadValue(format!("cpuset {target:?}: {e}")))?;
                let have = parse_cpu_list(current).ok();
                differs(target, have.as_ref() == Some(&want))
            }
        }
    }

    /// Logs (once per file name) that the kernel lacks a file.
    fn note_unsupported(&self, path: &Path) {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let first = self.unsupported.lock().unwrap_or_else(|e| e.into_inner()).insert(name.clone());
        if first {
            tracing::warn!(
                file = %name,
                example = %path.display(),
                "this kernel has no {name} (not in {}); every write of {name} is skipped",
                path.parent().map(|p| p.display().to_string()).unwrap_or_default()
            );
        }
    }

    /// File names found missing so far (kernel features this node lacks).
    pub fn unsupported(&self) -> Vec<String> {
        self.unsupported.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

/// cgroup v1 CPU shares → v2 `cpu.weight`, runc's conversion (`ConvertCPUSharesToCgroupV2Value`):
/// 2 → 1, 1024 → 39, 262144 → 10000.
pub fn shares_to_weight(shares: i64) -> i64 {
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + ((s - 2) * 9999) / 262_142
}

/// Parses a kernel CPU list (`"0-3,6"`) into a sorted set. `""` is the empty set.
///
/// Errors: anything but comma-separated numbers and ascending ranges; more than 8192 CPUs.
pub fn parse_cpu_list(s: &str) -> Result<BTreeSet<u32>, String> {
    let mut cpus = BTreeSet::new();
    for part in s.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let a: u32 = a.trim().parse().map_err(|_| format!("bad CPU {a:?}"))?;
        let b: u32 = b.trim().parse().map_err(|_| format!("bad CPU {b:?}"))?;
        if a > b || b >= 8192 {
            return Err(format!("bad CPU range {part:?}"));
        }
        cpus.extend(a..=b);
    }
    Ok(cpus)
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

/// The version of the hierarchy at `root`: `cgroup2` file system → v2; anything else (tmpfs)
/// with a `cpu` subdirectory → v1.
pub fn detect_version(root: &Path) -> io::Result<CgroupVersion> {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: statfs writes into the zeroed struct we own; `c` is a valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.f_type as i64 == CGROUP2_SUPER_MAGIC {
        Ok(CgroupVersion::V2)
    } else if root.join("cpu").is_dir() {
        Ok(CgroupVersion::V1)
    } else {
        Err(io::Error::other(format!("{} is neither a cgroup2 mount nor a v1 hierarchy with a cpu controller", root.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 tree: `<root>/{cpu,memory,cpuset}/pod/c` with kernel-like default contents.
    fn v1_tree() -> (tempfile::TempDir, CgroupFs) {
        let t = tempfile::tempdir().unwrap();
        for (ctrl, files) in [
            ("cpu", &[("cpu.shares", "1024"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")][..]),
            ("memory", &[("memory.limit_in_bytes", "9223372036854771712")][..]),
            ("cpuset", &[("cpuset.cpus", "0-3")][..]),
        ] {
            for dir in ["", "pod", "pod/c"] {
                let d = t.path().join(ctrl).join(dir);
                std::fs::create_dir_all(&d).unwrap();
                for (f, v) in files {
                    std::fs::write(d.join(f), format!("{v}\n")).unwrap();
                }
            }
        }
        let fs = CgroupFs::new(t.path(), CgroupVersion::V1);
        (t, fs)
    }

    fn read(t: &tempfile::TempDir, rel: &str) -> String {
        std::fs::read_to_string(t.path().join(rel)).unwrap().trim().to_owned()
    }

    #[test]
    fn v1_writes_only_when_different_and_reports_drift() {
        let (t, fs) = v1_tree();
        let w = fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap();
        let Written::Corrected(d) = w else { panic!("{w:?}") };
        assert_eq!((d.old.as_str(), d.new.as_str()), ("1024", "512"));
        assert_eq!(d.path, t.path().join("cpu/pod/c/cpu.shares"));
        assert_eq!(read(&t, "cpu/pod/c/cpu.shares"), "512");
        assert_eq!(fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap(), Written::Unchanged);
        assert_eq!(fs.apply("/pod/c", &CgroupValue::CfsQuota(-1)).unwrap(), Written::Unchanged);
        assert!(matches!(fs.apply("/pod/c", &CgroupValue::CfsQuota(100_000)).unwrap(), Written::Corrected(_)));
        assert_eq!(read(&t, "cpu/pod/c/cpu.cfs_quota_us"), "100000");
        assert!(matches!(fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap(), Written::Corrected(_)));
        assert_eq!(read(&t, "cpu/pod/c/cpu.cfs_period_us"), "50000");
    }

    #[test]
    fn v1_memory_unlimited_and_page_rounding() {
        let (t, fs) = v1_tree();
        assert_eq!(fs.apply("/pod", &CgroupValue::MemoryLimit(-1)).unwrap(), Written::Unchanged, "huge = unlimited");
        assert!(matches!(fs.apply("/pod", &CgroupValue::MemoryLimit(128 << 20)).unwrap(), Written::Corrected(_)));
        assert_eq!(read(&t, "memory/pod/memory.limit_in_bytes"), "134217728");
        // The kernel would read back a page-rounded value: not drift.
        std::fs::write(t.path().join("memory/pod/memory.limit_in_bytes"), "4096").unwrap();
        assert_eq!(fs.apply("/pod", &CgroupValue::MemoryLimit(4097)).unwrap(), Written::Unchanged);
        assert!(matches!(fs.apply("/pod", &CgroupValue::MemoryLimit(-1)).unwrap(), Written::Corrected(d) if d.new == "-1"));
    }

    #[test]
    fn v1_cpuset_compares_sets_and_clears_to_parent() {
        let (t, fs) = v1_tree();
        std::fs::write(t.path().join("cpuset/pod/c/cpuset.cpus"), "0,1,2,3").unwrap();
        assert_eq!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("0-3".into())).unwrap(), Written::Unchanged);
        assert!(matches!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("2-3".into())).unwrap(), Written::Corrected(_)));
        assert_eq!(read(&t, "cpuset/pod/c/cpuset.cpus"), "2-3");
        // "" = the shared pool: the parent's CPUs.
        std::fs::write(t.path().join("cpuset/pod/cpuset.cpus"), "0-1").unwrap();
        let w = fs.apply("/pod/c", &CgroupValue::CpusetCpus(String::new())).unwrap();
        assert!(matches!(&w, Written::Corrected(d) if d.new == "0-1"), "{w:?}");
        assert!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("x".into())).is_err());
    }

    #[test]
    fn missing_file_is_unsupported_missing_dir_is_an_error() {
        let (_t, fs) = v1_tree();
        assert_eq!(fs.apply("/pod", &CgroupValue::BvtWarpNs(-1)).unwrap(), Written::Unsupported);
        assert_eq!(fs.apply("/pod/c", &CgroupValue::BvtWarpNs(2)).unwrap(), Written::Unsupported);
        assert_eq!(fs.unsupported(), vec!["cpu.bvt_warp_ns".to_string()]);
        let e = fs.apply("/gone", &CgroupValue::CpuShares(2)).unwrap_err();
        assert!(matches!(e, CgroupError::NoDir(_)), "{e}");
    }

    #[test]
    fn refuses_relative_and_dotdot_dirs() {
        let (_t, fs) = v1_tree();
        for bad in ["pod", "/pod/../../etc", "", "/.."] {
            assert!(matches!(fs.apply(bad, &CgroupValue::CpuShares(2)), Err(CgroupError::BadDir(_))), "{bad:?}");
        }
    }

    /// A v2 tree laid out as cgroupfs does: `<root>/pod/c` with the unified file names.
    fn v2_tree() -> (tempfile::TempDir, CgroupFs) {
        let t = tempfile::tempdir().unwrap();
        for dir in ["", "pod", "pod/c"] {
            let d = t.path().join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in [("cpu.weight", "100"), ("cpu.max", "max 100000"), ("memory.max", "max"), ("cpuset.cpus", "")] {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
        let fs = CgroupFs::new(t.path(), CgroupVersion::V2);
        (t, fs)
    }

    #[test]
    fn v2_files_and_units() {
        let (t, fs) = v2_tree();
        fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap();
        assert_eq!(read(&t, "pod/c/cpu.weight"), shares_to_weight(512).to_string());
        assert_eq!(read(&t, "pod/c/cpu.weight"), "20");
        fs.apply("/pod/c", &CgroupValue::CfsQuota(100_000)).unwrap();
        assert_eq!(read(&t, "pod/c/cpu.max"), "100000 100000");
        fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap();
        assert_eq!(read(&t, "pod/c/cpu.max"), "100000 50000");
        assert_eq!(fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap(), Written::Unchanged);
        fs.apply("/pod/c", &CgroupValue::CfsQuota(-1)).unwrap();
        assert_eq!(read(&t, "pod/c/cpu.max"), "max 50000");
        fs.apply("/pod/c", &CgroupValue::MemoryLimit(128 << 20)).unwrap();
        assert_eq!(read(&t, "pod/c/memory.max"), "134217728");
        fs.apply("/pod/c", &CgroupValue::MemoryLimit(-1)).unwrap();
        assert_eq!(read(&t, "pod/c/memory.max"), "max");
        fs.apply("/pod/c", &CgroupValue::CpusetCpus("1".into())).unwrap();
        assert_eq!(read(&t, "pod/c/cpuset.cpus"), "1");
        fs.apply("/pod/c", &CgroupValue::CpusetCpus(String::new())).unwrap();
        assert_eq!(read(&t, "pod/c/cpuset.cpus"), "", "v2: empty = inherit");
        assert_eq!(fs.apply("/pod", &CgroupValue::BvtWarpNs(2)).unwrap(), Written::Unsupported);
    }

    #[test]
    fn weight_conversion_matches_runc() {
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(1024), 39);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(0), 1, "clamped");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), BTreeSet::from([0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("").unwrap(), BTreeSet::new());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
        assert!(parse_cpu_list("0-100000").is_err());
    }

    #[test]
    fn detects_this_machine() {
        // The project's machines are cgroup v1 (hybrid); a cgroup2-only machine would say V2.
        if Path::new("/sys/fs/cgroup").exists() {
            let v = detect_version(Path::new("/sys/fs/cgroup")).unwrap();
            let unified = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .lines()
                .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains(" - cgroup2 "));
            assert_eq!(v == CgroupVersion::V2, unified);
        }
        assert!(detect_version(&tempfile::tempdir().unwrap().path().join("none")).is_err());
    }
}
