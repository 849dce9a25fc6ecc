//! A backend socket that never appears: the health checks log it once at INFO (`backend socket
//! not there yet`, [`super::health`]: a runtime that starts after the proxy is normal), and
//! [`StillMissing`] repeats it at WARN when it lasts — first after [`FIRST_WARN_AFTER`], then
//! every [`WARN_EVERY`] — naming the socket, so that a wrong `--remote-runtime-service-endpoint`
//! (or a runtime that never starts) does not hide at INFO while every call fails.

use std::time::{Duration, Instant};

use crate::admin::health::{Target, Trouble, Verdict};

/// How long a backend socket may be missing from the start before a WARN says so: 10 s.
pub const FIRST_WARN_AFTER: Duration = Duration::from_secs(10);

/// How often the WARN is repeated while the socket stays missing: 1 min.
pub const WARN_EVERY: Duration = Duration::from_secs(60);

/// One endpoint's missing-socket reminder: when its socket was first seen missing (never up
/// before) and when the next WARN is due.
#[derive(Debug, Default)]
pub struct StillMissing {
    since: Option<Instant>,
    next_warn: Option<Instant>,
}

impl StillMissing {
    /// Records the verdict of a check of `target` made at `now` (`ever_up`: the endpoint was up
    /// at some check before) and logs the WARN when due. Returns whether it did.
    pub fn observe(&mut self, target: &Target, verdict: &Verdict, ever_up: bool, now: Instant) -> bool {
        let missing = matches!(verdict, Verdict::Down { trouble: Trouble::Missing, .. }) && !ever_up;
        if !missing {
            *self = StillMissing::default();
            return false;
        }
        let since = *self.since.get_or_insert(now);
        let due = *self.next_warn.get_or_insert(since + FIRST_WARN_AFTER);
        if now < due {
            return false;
        }
        self.next_warn = Some(now + WARN_EVERY);
        let waited = daemon_support::status::show_duration(now.duration_since(since));
        tracing::warn!(
            endpoint = target.role.label(),
            socket = %target.path.display(),
            "backend socket still not there after {waited}: every call the proxy forwards fails; is the runtime running, and is {} its socket?",
            target.path.display()
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::health::{Protocol, Role};

    #[test]
    fn a_warn_after_10s_then_every_minute_until_it_appears() {
        let target = Target { role: Role::Runtime, path: "/run/c.sock".into(), protocol: Protocol::Grpc };
        let missing = Verdict::Down { trouble: Trouble::Missing, reason: "no such file".into() };
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = StillMissing::default();
        assert!(!m.observe(&target, &missing, false, at(0)));
        assert!(!m.observe(&target, &missing, false, at(9)));
        assert!(m.observe(&target, &missing, false, at(10)), "first WARN after 10 s");
        assert!(!m.observe(&target, &missing, false, at(11)));
        assert!(!m.observe(&target, &missing, false, at(69)));
        assert!(m.observe(&target, &missing, false, at(70)), "then once a minute");
        assert!(!m.observe(&target, &Verdict::Up, true, at(71)), "up: reset");
        assert!(!m.observe(&target, &missing, true, at(200)), "gone after being up: health's own WARN");
        let mut fresh = StillMissing::default();
        let refused = Verdict::Down { trouble: Trouble::Refused, reason: "refused".into() };
        assert!(!fresh.observe(&target, &refused, false, at(0)) && !fresh.observe(&target, &refused, false, at(100)));
    }
}
