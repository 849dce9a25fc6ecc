//! Kernel parameters (`/proc/sys`), for the plugins that switch a kernel feature on or off
//! (GroupIdentity: `kernel.sched_group_identity_enabled`, and `kernel.sched_core` which it must
//! turn off first, as koordlet's `util/system/system_file.go` does).

use std::io;
use std::path::PathBuf;

/// Reads and writes kernel parameters by their dotted name (`kernel.sched_core`).
pub trait Sysctl: Send + Sync {
    /// The parameter's value, trimmed; `None` when this kernel has no such parameter.
    ///
    /// Errors: reading it failed for another reason (permissions, …).
    fn get(&self, name: &str) -> io::Result<Option<String>>;

    /// Sets the parameter.
    ///
    /// Errors: the kernel refused the write, or the parameter does not exist (`ENOENT`).
    fn set(&self, name: &str, value: &str) -> io::Result<()>;
}

/// The files below a `/proc/sys` (a test's temp dir in tests): `kernel.sched_core` is
/// `<root>/kernel/sched_core`.
#[derive(Clone, Debug)]
pub struct ProcSys {
    root: PathBuf,
}

impl ProcSys {
    /// Parameters below `root` (`/proc/sys` on a host).
    pub fn new(root: impl Into<PathBuf>) -> ProcSys {
        ProcSys { root: root.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name.replace('.', "/"))
    }
}

impl Sysctl for ProcSys {
    fn get(&self, name: &str) -> io::Result<Option<String>> {
        match std::fs::read_to_string(self.path(name)) {
            Ok(v) => Ok(Some(v.trim().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn set(&self, name: &str, value: &str) -> io::Result<()> {
        // Not `fs::write`: a sysctl file must not be created when the kernel lacks it.
        use std::io::Write as _;
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(self.path(name))?;
        f.write_all(value.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_names_are_files_and_missing_ones_are_none() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("kernel")).unwrap();
        std::fs::write(t.path().join("kernel/sched_core"), "1\n").unwrap();
        let s = ProcSys::new(t.path());
        assert_eq!(s.get("kernel.sched_core").unwrap().as_deref(), Some("1"));
        s.set("kernel.sched_core", "0").unwrap();
        assert_eq!(s.get("kernel.sched_core").unwrap().as_deref(), Some("0"));
        assert_eq!(s.get("kernel.sched_group_identity_enabled").unwrap(), None);
        assert!(s.set("kernel.sched_group_identity_enabled", "1").is_err(), "never created");
        assert!(!t.path().join("kernel/sched_group_identity_enabled").exists());
    }
}
