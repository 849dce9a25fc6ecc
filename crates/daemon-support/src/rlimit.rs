//! The open files limit (`RLIMIT_NOFILE`): raised at start from its soft limit to its hard
//! limit, as Go programs (containerd, kubelet, koord-runtime-proxy) do at start since Go 1.19.
//!
//! A systemd unit without `LimitNOFILE=` gives a soft limit of 1,024 (and a hard limit of
//! 524,288 on current systemd); every kubelet connection, hook server call, runtime connection
//! and admin connection holds a descriptor, so 1,024 is little for a daemon on the path of
//! every pod start. The units set `LimitNOFILE=` too (`packaging/systemd`); this covers the
//! other ways of starting the daemons (a DaemonSet, a shell). Neither daemon starts other
//! programs, so no child inherits the raised limit.

use std::io;

/// Raises the soft `RLIMIT_NOFILE` of this process to its hard limit. Returns the soft limit
/// before and after (equal when it already was the hard limit).
///
/// Errors: `getrlimit(2)` or `setrlimit(2)` fails (not expected: raising the soft limit up to
/// the hard one needs no privilege).
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes the rlimit it is given, which lives across the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = limit.rlim_cur;
    if limit.rlim_cur >= limit.rlim_max {
        return Ok((wide(before), wide(before)));
    }
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit(2) reads the rlimit it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((wide(before), wide(limit.rlim_cur)))
}

/// `rlim_t` (u64 on 64-bit Linux, not on every target) as u64.
#[allow(clippy::unnecessary_cast)]
fn wide(v: libc::rlim_t) -> u64 {
    v as u64
}

/// Raises the limit ([`raise_nofile`]) and logs the outcome: INFO with both values when it
/// was raised, DEBUG when it already was the hard limit, WARN when it could not be read or set.
pub fn raise_nofile_and_log() {
    match raise_nofile() {
        Ok((before, after)) if after > before => {
            tracing::info!(before, after, "open files limit (RLIMIT_NOFILE) raised to the hard limit")
        }
        Ok((limit, _)) => tracing::debug!(limit, "open files limit (RLIMIT_NOFILE) already at the hard limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit (RLIMIT_NOFILE) to the hard limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft_and_hard() -> (u64, u64) {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: as in raise_nofile.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        (wide(limit.rlim_cur), wide(limit.rlim_max))
    }

    /// The soft limit lowered below the hard one is raised back to it; raising again changes
    /// nothing.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit() {
        let (_, hard) = soft_and_hard();
        let lowered = libc::rlimit { rlim_cur: hard.min(512) as libc::rlim_t, rlim_max: hard as libc::rlim_t };
        // SAFETY: as in raise_nofile.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        assert_eq!(raise_nofile().unwrap(), (hard.min(512), hard));
        assert_eq!(soft_and_hard(), (hard, hard));
        assert_eq!(raise_nofile().unwrap(), (hard, hard));
    }
}
