//! The resctrl file system (Intel RDT / AMD PQoS: L3 cache allocation and memory bandwidth;
//! kernel doc `arch/x86/resctrl.rst`), mounted at `/sys/fs/resctrl`.
//!
//! # Layout
//!
//! | path | content |
//! |---|---|
//! | `info/L3/cbm_mask` | the full L3 capacity bit mask of the root, hex (`7ff`: 11 ways) |
//! | `info/L3/num_closids` | how many groups the hardware has |
//! | `schemata` | the root group's schemata, one line per resource: `L3:0=7ff;1=7ff`, `MB:0=100;1=100` (the ids are cache ids, one per L3 domain) |
//! | `<group>/` | a control group: `mkdir` creates it (with `schemata` and `tasks`), `rmdir` removes it |
//! | `<group>/schemata` | its allocation; a written line replaces that resource's values |
//! | `<group>/tasks` | its threads, one id per line; writing an id moves that thread in |
//!
//! # Implementations
//!
//! [`ResctrlFs`] is the small interface the Resctrl hook works through (koordlet's
//! `pkg/koordlet/util/system/resctrl.go` file helpers); [`DirResctrl`] implements it on a
//! directory: the kernel's mount, or a temp directory laid out the same way in tests (there a
//! group is a plain directory, `tasks` accumulates the written ids, and removal deletes the
//! files; on the kernel's mount only `rmdir`).

use std::collections::BTreeSet;
use std::io;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `f_type` of a resctrl mount (`RDTGROUP_SUPER_MAGIC`).
const RDTGROUP_SUPER_MAGIC: i64 = 0x7655821;

/// The CPU vendor, which decides how a memory bandwidth percentage is written (koordlet's
/// `calculateMba`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// `GenuineIntel`: MB values are percentages in steps of 10.
    Intel,
    /// `AuthenticAMD`: MB values are bandwidths in 1/8 GB/s units (2048 = unlimited).
    Amd,
    /// Anything else (`vendor_id` of `/proc/cpuinfo`): koordlet computes MB value 0, i.e. no MB line.
    Other(String),
}

impl Vendor {
    /// The vendor named by a `vendor_id` of `/proc/cpuinfo`.
    pub fn from_id(id: &str) -> Vendor {
        match id {
            "GenuineIntel" => Vendor::Intel,
            "AuthenticAMD" => Vendor::Amd,
            other => Vendor::Other(other.to_owned()),
        }
    }

    /// The vendor of this machine: the first `vendor_id` line of `cpuinfo` (`/proc/cpuinfo`),
    /// `Other("unknown")` when there is none.
    pub fn of_cpuinfo(cpuinfo: &Path) -> Vendor {
        let text = std::fs::read_to_string(cpuinfo).unwrap_or_default();
        let id = text
            .lines()
            .find(|l| l.starts_with("vendor_id"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        Vendor::from_id(&id)
    }
}

/// The resctrl file system (see the module documentation). Group names are single path
/// components (`koordlet-<pod uid>`).
pub trait ResctrlFs: Send + Sync {
    /// Where it is mounted.
    fn root(&self) -> &Path;

    /// The CPU vendor.
    fn vendor(&self) -> Vendor;

    /// `info/L3/cbm_mask`, trimmed (hex without `0x`).
    ///
    /// Errors: it cannot be read.
    fn cbm_mask(&self) -> io::Result<String>;

    /// The root `schemata` (each resource's cache ids are read from it).
    ///
    /// Errors: it cannot be read.
    fn root_schemata(&self) -> io::Result<String>;

    /// The control groups (directories of the root other than `info`, `mon_groups`, `mon_data`).
    ///
    /// Errors: the root cannot be listed.
    fn groups(&self) -> io::Result<Vec<String>>;

    /// Creates the group if it is missing; `Ok(true)` when it was created.
    ///
    /// Errors: the kernel's (`ENOSPC`: no CLOSID left).
    fn create_group(&self, group: &str) -> io::Result<bool>;

    /// The group's `schemata` (empty when the file does not exist yet).
    ///
    /// Errors: the group is missing or the file unreadable.
    fn read_schemata(&self, group: &str) -> io::Result<String>;

    /// Writes the group's `schemata` (one or more resource lines).
    ///
    /// Errors: the kernel's (`EINVAL`: a mask or value it refuses).
    fn write_schemata(&self, group: &str, schemata: &str) -> io::Result<()>;

    /// The thread ids in the group's `tasks` (empty when the file does not exist yet).
    ///
    /// Errors: it cannot be read, or a line is not a number.
    fn tasks(&self, group: &str) -> io::Result<BTreeSet<u32>>;

    /// Moves the thread `tid` into the group.
    ///
    /// Errors: the kernel's (`ESRCH`: the thread is gone).
    fn add_task(&self, group: &str, tid: u32) -> io::Result<()>;

    /// Removes the group (its threads go back to the root group).
    ///
    /// Errors: the kernel's; a group already gone is `Ok`.
    fn remove_group(&self, group: &str) -> io::Result<()>;

    /// True when this is the kernel's resctrl mount (the one the container runtime uses), so a
    /// group here can be named as a container's RDT class. Default false.
    fn is_kernel(&self) -> bool {
        false
    }
}

/// [`ResctrlFs`] on a directory (see the module documentation).
#[derive(Debug)]
pub struct DirResctrl {
    root: PathBuf,
    vendor: Vendor,
    kernel: bool,
}

impl DirResctrl {
    /// The resctrl file system at `root`, for a CPU of `vendor`.
    ///
    /// Errors: `root/info/L3/cbm_mask` is missing (no resctrl mounted there, or no L3 cache
    /// allocation: koordlet's `CheckAndTryEnableResctrlCat` condition), naming the file.
    pub fn open(root: impl Into<PathBuf>, vendor: Vendor) -> io::Result<DirResctrl> {
        let root = root.into();
        let cbm = root.join("info/L3/cbm_mask");
        if let Err(e) = std::fs::metadata(&cbm) {
            return Err(io::Error::new(e.kind(), format!("{}: {e}", cbm.display())));
        }
        let kernel = fs_type(&root) == Some(RDTGROUP_SUPER_MAGIC);
        Ok(DirResctrl { root, vendor, kernel })
    }

    fn group_dir(&self, group: &str) -> io::Result<PathBuf> {
        if group.is_empty() || group.contains('/') || group == "." || group == ".." || group == "info" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("resctrl group name {group:?} is not a plain directory name"),
            ));
        }
        Ok(self.root.join(group))
    }
}

/// `statfs(2)`'s `f_type` of `path`, `None` when it fails.
fn fs_type(path: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path, `buf` a properly sized and aligned statfs buffer the
    // kernel fills on success.
    let r = unsafe { libc::statfs(c.as_ptr(), buf.as_mut_ptr()) };
    if r != 0 {
        return None;
    }
    // SAFETY: statfs returned 0, so the buffer is initialized.
    #[allow(clippy::unnecessary_cast)]
    Some(unsafe { buf.assume_init() }.f_type as i64)
}

fn with_path(e: io::Error, op: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

fn read_or_empty(path: &Path) -> io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == io::ErrorKind::NotFound && path.parent().is_some_and(|p| p.is_dir()) => Ok(String::new()),
        Err(e) => Err(with_path(e, "reading", path)),
    }
}

impl ResctrlFs for DirResctrl {
    fn root(&self) -> &Path {
        &self.root
    }

    fn vendor(&self) -> Vendor {
        self.vendor.clone()
    }

    fn cbm_mask(&self) -> io::Result<String> {
        let path = self.root.join("info/L3/cbm_mask");
        std::fs::read_to_string(&path).map(|s| s.trim().to_owned()).map_err(|e| with_path(e, "reading", &path))
    }

    fn root_schemata(&self) -> io::Result<String> {
        let path = self.root.join("schemata");
        std::fs::read_to_string(&path).map_err(|e| with_path(e, "reading", &path))
    }

    fn groups(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.root).map_err(|e| with_path(e, "listing", &self.root))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.file_type()?.is_dir() && !matches!(name.as_str(), "info" | "mon_groups" | "mon_data") {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    fn create_group(&self, group: &str) -> io::Result<bool> {
        let dir = self.group_dir(group)?;
        match std::fs::create_dir(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(with_path(e, "creating", &dir)),
        }
    }

    fn read_schemata(&self, group: &str) -> io::Result<String> {
        read_or_empty(&self.group_dir(group)?.join("schemata"))
    }

    fn write_schemata(&self, group: &str, schemata: &str) -> io::Result<()> {
        let path = self.group_dir(group)?.join("schemata");
        std::fs::write(&path, schemata).map_err(|e| with_path(e, &format!("writing {schemata:?} to"), &path))
    }

    fn tasks(&self, group: &str) -> io::Result<BTreeSet<u32>> {
        let path = self.group_dir(group)?.join("tasks");
        let text = read_or_empty(&path)?;
        text.split_whitespace()
            .map(|t| {
                t.parse::<u32>().map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{}: {t:?} is not a thread id", path.display()))
                })
            })
            .collect()
    }

    fn add_task(&self, group: &str, tid: u32) -> io::Result<()> {
        let path = self.group_dir(group)?.join("tasks");
        // Append: the kernel takes each write as one id whatever the offset; a plain file (tests)
        // keeps them all.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(!self.kernel)
            .open(&path)
            .map_err(|e| with_path(e, "opening", &path))?;
        f.write_all(format!("{tid}\n").as_bytes()).map_err(|e| with_path(e, &format!("writing {tid} to"), &path))
    }

    fn is_kernel(&self) -> bool {
        self.kernel
    }

    fn remove_group(&self, group: &str) -> io::Result<()> {
        let dir = self.group_dir(group)?;
        let result = if self.kernel { std::fs::remove_dir(&dir) } else { std::fs::remove_dir_all(&dir) };
        match result {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(with_path(e, "removing", &dir)),
        }
    }
}

/// Lays out a resctrl-like tree at `root` for tests: `info/L3/cbm_mask` = `cbm`,
/// `info/L3/num_closids` = 16, and a root `schemata` with an `L3` and an `MB` line for each of
/// `cache_ids` (full mask, 100).
///
/// Errors: the files cannot be written.
pub fn make_fake_tree(root: &Path, cbm: &str, cache_ids: &[u32]) -> io::Result<()> {
    std::fs::create_dir_all(root.join("info/L3"))?;
    std::fs::create_dir_all(root.join("info/MB"))?;
    std::fs::write(root.join("info/L3/cbm_mask"), format!("{cbm}\n"))?;
    std::fs::write(root.join("info/L3/num_closids"), "16\n")?;
    std::fs::write(root.join("info/MB/bandwidth_gran"), "10\n")?;
    let l3: Vec<String> = cache_ids.iter().map(|i| format!("{i}={cbm}")).collect();
    let mb: Vec<String> = cache_ids.iter().map(|i| format!("{i}=100")).collect();
    std::fs::write(root.join("schemata"), format!("    L3:{}\n    MB:{}\n", l3.join(";"), mb.join(";")))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_without_l3_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let e = DirResctrl::open(t.path(), Vendor::Intel).unwrap_err();
        assert!(e.to_string().contains("info/L3/cbm_mask"), "{e}");
    }

    #[test]
    fn groups_schemata_tasks_and_removal_on_a_fake_tree() {
        let t = tempfile::tempdir().unwrap();
        make_fake_tree(t.path(), "7ff", &[0, 1]).unwrap();
        let fs = DirResctrl::open(t.path(), Vendor::Intel).unwrap();
        assert_eq!(fs.cbm_mask().unwrap(), "7ff");
        assert!(fs.groups().unwrap().is_empty());
        assert!(fs.create_group("koordlet-a").unwrap());
        assert!(!fs.create_group("koordlet-a").unwrap());
        assert_eq!(fs.groups().unwrap(), ["koordlet-a"]);
        assert_eq!(fs.read_schemata("koordlet-a").unwrap(), "");
        fs.write_schemata("koordlet-a", "L3:0=f;1=f;\n").unwrap();
        assert_eq!(fs.read_schemata("koordlet-a").unwrap(), "L3:0=f;1=f;\n");
        fs.add_task("koordlet-a", 10).unwrap();
        fs.add_task("koordlet-a", 11).unwrap();
        assert_eq!(fs.tasks("koordlet-a").unwrap(), BTreeSet::from([10, 11]));
        fs.remove_group("koordlet-a").unwrap();
        fs.remove_group("koordlet-a").unwrap();
        assert!(fs.groups().unwrap().is_empty());
        assert!(fs.create_group("../x").is_err() && fs.create_group("info").is_err());
        assert!(fs.read_schemata("gone").is_err(), "a missing group is an error");
    }

    #[test]
    fn vendor_from_cpuinfo() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("cpuinfo");
        std::fs::write(&p, "processor\t: 0\nvendor_id\t: AuthenticAMD\n").unwrap();
        assert_eq!(Vendor::of_cpuinfo(&p), Vendor::Amd);
        assert_eq!(Vendor::of_cpuinfo(&t.path().join("none")), Vendor::Other("unknown".into()));
    }
}
