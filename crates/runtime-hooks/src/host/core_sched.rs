//! Linux core scheduling cookies (`prctl(PR_SCHED_CORE, …)`, Linux ≥ 5.14 with
//! `CONFIG_SCHED_CORE`; kernel doc `admin-guide/hw-vuln/core-scheduling.rst`).
//!
//! # Kernel interface
//!
//! Tasks with different cookies never run on the two SMT siblings of a core at the same time;
//! cookie 0 is the default every task starts with. The kernel offers four commands, each on a
//! `pid` and a scope (`PIDTYPE_PID` = the thread, `PIDTYPE_TGID` = its thread group,
//! `PIDTYPE_PGID` = its process group):
//!
//! | command | effect |
//! |---|---|
//! | `PR_SCHED_CORE_GET` (0) | the thread's cookie (an opaque non-zero id, 0 = none) |
//! | `PR_SCHED_CORE_CREATE` (1) | a new cookie for the scope |
//! | `PR_SCHED_CORE_SHARE_TO` (2) | the calling thread's cookie to the scope |
//! | `PR_SCHED_CORE_SHARE_FROM` (3) | the thread's cookie to the calling thread |
//!
//! # Implementations
//!
//! [`CoreSchedOps`] is the small interface koordlet's CoreSched hook works through (koordlet's
//! `CoreSchedExtendedInterface`: get, create, assign one pid's cookie to others, clear):
//! [`PrctlCoreSched`] does it with `prctl` (sharing through a short-lived helper thread, so no
//! thread of the daemon ever holds a cookie), [`FakeCoreSched`] in memory for tests.
//!
//! # Detection
//!
//! [`PrctlCoreSched::probe`] tells whether this kernel has core scheduling: `PR_SCHED_CORE_GET`
//! on the calling thread answers `EINVAL` on a kernel without it (an unknown `prctl` option),
//! `ENODEV` on a machine without SMT.

use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

/// `prctl` option `PR_SCHED_CORE` (`include/uapi/linux/prctl.h`).
pub const PR_SCHED_CORE: libc::c_int = 62;
/// `PR_SCHED_CORE_GET`.
pub const PR_SCHED_CORE_GET: libc::c_ulong = 0;
/// `PR_SCHED_CORE_CREATE`.
pub const PR_SCHED_CORE_CREATE: libc::c_ulong = 1;
/// `PR_SCHED_CORE_SHARE_TO`.
pub const PR_SCHED_CORE_SHARE_TO: libc::c_ulong = 2;
/// `PR_SCHED_CORE_SHARE_FROM`.
pub const PR_SCHED_CORE_SHARE_FROM: libc::c_ulong = 3;

/// The scope of a command (`enum pid_type` of the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidScope {
    /// `PIDTYPE_PID` (0): the one thread.
    Thread = 0,
    /// `PIDTYPE_TGID` (1): every thread of its process.
    ThreadGroup = 1,
    /// `PIDTYPE_PGID` (2): every process of its process group.
    ProcessGroup = 2,
}

/// A pid the kernel refused, with why (`ESRCH`: it exited; `EPERM`: not ours to touch).
pub type PidError = (u32, io::Error);

/// Core scheduling cookies of tasks (see the module documentation).
pub trait CoreSchedOps: Send + Sync {
    /// The cookie of the thread `pid` (0 = the default).
    ///
    /// Errors: the kernel's (`ESRCH` when the task is gone).
    fn get(&self, pid: u32) -> io::Result<u64>;

    /// Gives the thread group of `pid` a new cookie of its own.
    ///
    /// Errors: the kernel's.
    fn create(&self, pid: u32) -> io::Result<()>;

    /// Gives the thread groups of `to` the cookie of the thread `from` (koordlet's `Assign`).
    ///
    /// Returns the pids that could not be given it; every pid fails when `from`'s cookie cannot
    /// be read.
    fn assign(&self, from: u32, to: &[u32]) -> Vec<PidError>;

    /// Gives the thread groups of `pids` the default cookie 0 again (koordlet's `Clear`).
    ///
    /// Returns the pids that could not be cleared.
    fn clear(&self, pids: &[u32]) -> Vec<PidError>;

    /// Readies the kernel before the first cookie (koordlet's `initSystem`, done whenever core
    /// scheduling is on in the rule): turns group identity off
    /// (`kernel.sched_group_identity_enabled` = 0, the two are exclusive) and core scheduling on
    /// (`kernel.sched_core` = 1), each only where the sysctl exists (Anolis kernels). Default:
    /// nothing.
    ///
    /// Errors: a sysctl that exists but cannot be written.
    fn prepare(&self) -> io::Result<()> {
        Ok(())
    }
}

/// [`CoreSchedOps`] through `prctl(2)`; sysctls under `proc_sys` (`/proc/sys`).
#[derive(Debug)]
pub struct PrctlCoreSched {
    /// Where the sysctls are (`/proc/sys` on a host).
    pub proc_sys: std::path::PathBuf,
}

impl Default for PrctlCoreSched {
    fn default() -> Self {
        PrctlCoreSched { proc_sys: "/proc/sys".into() }
    }
}

/// Writes `value` to the sysctl file `path` if it exists and holds something else.
fn set_sysctl_if_present(path: &std::path::Path, value: &str) -> io::Result<()> {
    match std::fs::read_to_string(path) {
        Ok(cur) if cur.trim() == value => Ok(()),
        Ok(_) => std::fs::write(path, value)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {value} to {}: {e}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))),
    }
}

fn prctl(cmd: libc::c_ulong, pid: u32, scope: PidScope, addr: libc::c_ulong) -> io::Result<()> {
    // SAFETY: PR_SCHED_CORE takes plain integers; for PR_SCHED_CORE_GET `addr` is the address of
    // a live, aligned u64 the caller owns (see `get`), for the other commands it is 0.
    let r = unsafe { libc::prctl(PR_SCHED_CORE, cmd, pid as libc::c_ulong, scope as libc::c_ulong, addr) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn get_cookie(pid: u32) -> io::Result<u64> {
    let mut cookie: u64 = 0;
    prctl(PR_SCHED_CORE_GET, pid, PidScope::Thread, &mut cookie as *mut u64 as libc::c_ulong)?;
    Ok(cookie)
}

impl PrctlCoreSched {
    /// Whether this kernel has core scheduling: `Ok(())`, or the error of
    /// `PR_SCHED_CORE_GET` on the calling thread (`EINVAL`: no `CONFIG_SCHED_CORE` or a kernel
    /// before 5.14; `ENODEV`: no SMT).
    pub fn probe() -> io::Result<()> {
        get_cookie(0).map(|_| ())
    }

    /// Runs `f` on a new thread, which starts with the caller's cookie (0: no thread of the
    /// daemon takes one) and takes whatever `f` gives it to its grave.
    fn on_helper_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| match s.spawn(f).join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    }
}

impl CoreSchedOps for PrctlCoreSched {
    fn get(&self, pid: u32) -> io::Result<u64> {
        get_cookie(pid)
    }

    fn create(&self, pid: u32) -> io::Result<()> {
        prctl(PR_SCHED_CORE_CREATE, pid, PidScope::ThreadGroup, 0)
    }

    fn assign(&self, from: u32, to: &[u32]) -> Vec<PidError> {
        Self::on_helper_thread(|| {
            if let Err(e) = prctl(PR_SCHED_CORE_SHARE_FROM, from, PidScope::Thread, 0) {
                let kind = e.kind();
                return to
                    .iter()
                    .map(|p| (*p, io::Error::new(kind, format!("taking the cookie of {from}: {e}"))))
                    .collect();
            }
            to.iter()
                .filter_map(|p| prctl(PR_SCHED_CORE_SHARE_TO, *p, PidScope::ThreadGroup, 0).err().map(|e| (*p, e)))
                .collect()
        })
    }

    fn prepare(&self) -> io::Result<()> {
        set_sysctl_if_present(&self.proc_sys.join("kernel/sched_group_identity_enabled"), "0")?;
        set_sysctl_if_present(&self.proc_sys.join("kernel/sched_core"), "1")
    }

    fn clear(&self, pids: &[u32]) -> Vec<PidError> {
        // A fresh helper thread has cookie 0 (the daemon's threads never take one).
        Self::on_helper_thread(|| {
            pids.iter()
                .filter_map(|p| prctl(PR_SCHED_CORE_SHARE_TO, *p, PidScope::ThreadGroup, 0).err().map(|e| (*p, e)))
                .collect()
        })
    }
}

/// [`CoreSchedOps`] in memory, for tests: every pid is its own thread group; pids in
/// [`FakeCoreSched::kill`]ed are gone (`ESRCH`).
#[derive(Debug, Default)]
pub struct FakeCoreSched {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    cookies: HashMap<u32, u64>,
    dead: std::collections::HashSet<u32>,
    next: u64,
    calls: Vec<String>,
    prepare_fails: bool,
}

impl FakeCoreSched {
    /// A fake where every pid has cookie 0.
    pub fn new() -> FakeCoreSched {
        FakeCoreSched::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets a pid's cookie (as if another tool had).
    pub fn set(&self, pid: u32, cookie: u64) {
        self.state().cookies.insert(pid, cookie);
    }

    /// The pid exits: every command on it fails with `ESRCH`.
    pub fn kill(&self, pid: u32) {
        let mut s = self.state();
        s.dead.insert(pid);
        s.cookies.remove(&pid);
    }

    /// From now on [`CoreSchedOps::prepare`] fails (`EPERM`, as a read-only `/proc/sys`).
    pub fn fail_prepare(&self) {
        self.state().prepare_fails = true;
    }

    /// The cookie of a pid (0 for the default or a dead pid).
    pub fn cookie(&self, pid: u32) -> u64 {
        self.state().cookies.get(&pid).copied().unwrap_or(0)
    }

    /// The commands run so far (`create 5`, `assign 5 -> [6, 7]`, `clear [6]`), and forgets them.
    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut self.state().calls)
    }
}

fn esrch() -> io::Error {
    io::Error::from_raw_os_error(libc::ESRCH)
}

impl CoreSchedOps for FakeCoreSched {
    fn prepare(&self) -> io::Result<()> {
        if self.state().prepare_fails {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
        Ok(())
    }

    fn get(&self, pid: u32) -> io::Result<u64> {
        let s = self.state();
        if s.dead.contains(&pid) {
            return Err(esrch());
        }
        Ok(s.cookies.get(&pid).copied().unwrap_or(0))
    }

    fn create(&self, pid: u32) -> io::Result<()> {
        let mut s = self.state();
        s.calls.push(format!("create {pid}"));
        if s.dead.contains(&pid) {
            return Err(esrch());
        }
        s.next += 1;
        let cookie = 0x1000 + s.next;
        s.cookies.insert(pid, cookie);
        Ok(())
    }

    fn assign(&self, from: u32, to: &[u32]) -> Vec<PidError> {
        let mut s = self.state();
        s.calls.push(format!("assign {from} -> {to:?}"));
        if s.dead.contains(&from) {
            return to.iter().map(|p| (*p, esrch())).collect();
        }
        let cookie = s.cookies.get(&from).copied().unwrap_or(0);
        let mut failed = Vec::new();
        for p in to {
            if s.dead.contains(p) {
                failed.push((*p, esrch()));
            } else {
                s.cookies.insert(*p, cookie);
            }
        }
        failed
    }

    fn clear(&self, pids: &[u32]) -> Vec<PidError> {
        let mut s = self.state();
        s.calls.push(format!("clear {pids:?}"));
        let mut failed = Vec::new();
        for p in pids {
            if s.dead.contains(p) {
                failed.push((*p, esrch()));
            } else {
                s.cookies.insert(*p, 0);
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On this machine's kernel: either core scheduling works on a child process (cookies
    /// created, shared, cleared, read back), or the probe says why not (EINVAL / ENODEV).
    #[test]
    fn prctl_on_this_kernel() {
        match PrctlCoreSched::probe() {
            Err(e) => {
                let errno = e.raw_os_error();
                assert!(
                    matches!(errno, Some(libc::EINVAL) | Some(libc::ENODEV) | Some(libc::EPERM)),
                    "unexpected probe error {e}"
                );
            }
            Ok(()) => {
                let mut a = std::process::Command::new("sleep").arg("30").spawn().unwrap();
                let mut b = std::process::Command::new("sleep").arg("30").spawn().unwrap();
                let ops = PrctlCoreSched::default();
                ops.create(a.id()).unwrap();
                let cookie = ops.get(a.id()).unwrap();
                assert_ne!(cookie, 0);
                assert!(ops.assign(a.id(), &[b.id()]).is_empty());
                assert_eq!(ops.get(b.id()).unwrap(), cookie);
                assert!(ops.clear(&[b.id()]).is_empty());
                assert_eq!(ops.get(b.id()).unwrap(), 0);
                assert_eq!(ops.get(0).unwrap(), 0, "the daemon's thread never takes a cookie");
                let _ = (a.kill(), b.kill(), a.wait(), b.wait());
            }
        }
    }

    #[test]
    fn the_fake_keeps_cookies() {
        let f = FakeCoreSched::new();
        f.create(5).unwrap();
        let c = f.get(5).unwrap();
        assert_ne!(c, 0);
        f.kill(7);
        let failed = f.assign(5, &[6, 7]);
        assert_eq!(failed.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [7]);
        assert_eq!(f.get(6).unwrap(), c);
        assert!(f.clear(&[6]).is_empty());
        assert_eq!(f.get(6).unwrap(), 0);
        assert_eq!(f.get(7).unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }

    #[test]
    fn prepare_writes_only_existing_sysctls() {
        let t = tempfile::tempdir().unwrap();
        let ops = PrctlCoreSched { proc_sys: t.path().to_owned() };
        ops.prepare().unwrap();
        assert!(!t.path().join("kernel").exists(), "nothing created");
        std::fs::create_dir(t.path().join("kernel")).unwrap();
        std::fs::write(t.path().join("kernel/sched_group_identity_enabled"), "1\n").unwrap();
        std::fs::write(t.path().join("kernel/sched_core"), "0\n").unwrap();
        ops.prepare().unwrap();
        assert_eq!(std::fs::read_to_string(t.path().join("kernel/sched_group_identity_enabled")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(t.path().join("kernel/sched_core")).unwrap(), "1");
    }
}
