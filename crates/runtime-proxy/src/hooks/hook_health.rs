//! Each hook server's recent health, by registration file name: whether its last call
//! succeeded, its last error and when, failures in a row. The dispatcher records it
//! ([`HookHealth::record_ok`], [`HookHealth::record_failure`]): one lock-free map load and two
//! atomic stores per successful call; a mutex is taken only on failure, to keep the error's
//! text. `/status` reports it ([`crate::admin::status`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use daemon_support::status::unix_ms;

use crate::hooks::registry::{HookServer, Stage};

/// What one hook server's calls have looked like lately.
#[derive(Debug)]
struct ServerHealth {
    /// The endpoint the entry is about: a file that now names another endpoint starts afresh.
    endpoint: PathBuf,
    /// Unix ms of the last successful call; 0: none yet.
    last_ok_ms: AtomicU64,
    /// Unix ms of the last failed call; 0: none yet.
    last_failure_ms: AtomicU64,
    /// Calls failed since the last success.
    failures_in_a_row: AtomicU64,
    /// The last failure: stage and cause (as logged).
    last_error: Mutex<String>,
}

/// Each hook server's recent health, by registration file name; shared by the dispatcher (which
/// records) and the admin endpoint (which reports).
#[derive(Debug, Default)]
pub struct HookHealth {
    servers: ArcSwap<HashMap<String, Arc<ServerHealth>>>,
}

/// One hook server's health as reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerReport {
    /// Unix ms of the last successful call, if any.
    pub last_ok_ms: Option<u64>,
    /// Unix ms of the last failed call, if any.
    pub last_failure_ms: Option<u64>,
    /// Calls failed since the last success (0: the last call succeeded, or none was made).
    pub failures_in_a_row: u64,
    /// The last failure's stage and cause, if any.
    pub last_error: Option<String>,
}

impl HookHealth {
    /// Runs `f` on the entry of `server`: one lock-free load of the map; the entry is made on
    /// the server's first call (or when its file names a new endpoint).
    fn with_entry(&self, server: &HookServer, f: impl FnOnce(&ServerHealth)) {
        let serves = |h: &ServerHealth| h.endpoint.as_os_str() == server.endpoint.as_os_str();
        {
            let map = self.servers.load();
            if let Some(h) = map.get(&server.name).filter(|h| serves(h)) {
                return f(h);
            }
        }
        let fresh = Arc::new(ServerHealth {
            endpoint: server.endpoint.clone(),
            last_ok_ms: AtomicU64::new(0),
            last_failure_ms: AtomicU64::new(0),
            failures_in_a_row: AtomicU64::new(0),
            last_error: Mutex::new(String::new()),
        });
        let mut entry = fresh.clone();
        self.servers.rcu(|map| {
            let mut map = HashMap::clone(map);
            match map.get(&server.name) {
                // Another call made it meanwhile.
                Some(h) if serves(h) => entry = h.clone(),
                _ => {
                    entry = fresh.clone();
                    map.insert(server.name.clone(), fresh.clone());
                }
            }
            map
        });
        f(&entry)
    }

    /// A call to `server` succeeded.
    pub fn record_ok(&self, server: &HookServer) {
        self.with_entry(server, |h| {
            h.last_ok_ms.store(unix_ms(SystemTime::now()), Ordering::Relaxed);
            h.failures_in_a_row.store(0, Ordering::Relaxed);
        });
    }

    /// A call to `server` failed at `stage` with `cause` (as the dispatcher logs it).
    pub fn record_failure(&self, server: &HookServer, stage: Stage, cause: &str) {
        self.with_entry(server, |h| {
            {
                let mut last = h.last_error.lock().unwrap_or_else(|p| p.into_inner());
                last.clear();
                let _ = write!(last, "{}: {cause}", stage.as_str());
            }
            h.last_failure_ms.store(unix_ms(SystemTime::now()), Ordering::Relaxed);
            h.failures_in_a_row.fetch_add(1, Ordering::Relaxed);
        });
    }

    /// What is known of `server` (nothing before its first call).
    pub fn report(&self, server: &HookServer) -> ServerReport {
        let map = self.servers.load();
        let Some(h) = map.get(&server.name).filter(|h| h.endpoint.as_os_str() == server.endpoint.as_os_str()) else {
            return ServerReport::default();
        };
        let at = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|ms| *ms > 0);
        let last_error = h.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ServerReport {
            last_ok_ms: at(&h.last_ok_ms),
            last_failure_ms: at(&h.last_failure_ms),
            failures_in_a_row: h.failures_in_a_row.load(Ordering::Relaxed),
            last_error: Some(last_error).filter(|e| !e.is_empty()),
        }
    }

    /// Forgets servers whose file is no longer registered (`keep`: the names registered now).
    pub fn retain(&self, keep: &[&str]) {
        if self.servers.load().keys().all(|k| keep.contains(&k.as_str())) {
            return;
        }
        self.servers.rcu(|map| {
            let mut map = HashMap::clone(map);
            map.retain(|k, _| keep.contains(&k.as_str()));
            map
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;
    use crate::hooks::registry::FailurePolicy;

    fn server(name: &str, endpoint: &str, policy: FailurePolicy) -> HookServer {
        HookServer {
            name: name.into(),
            file: PathBuf::from(format!("/etc/runtime/hookserver.d/{name}")),
            endpoint: endpoint.into(),
            failure_policy: policy,
            policy_explicit: true,
            stages: BTreeSet::from([Stage::PreCreateContainer]),
            timeout: Duration::from_secs(2),
            order: 0,
            allowed_uids: vec![],
            conflict_policy: None,
            warnings: vec![],
        }
    }

    #[test]
    fn health_follows_the_last_calls() {
        let health = HookHealth::default();
        let a = server("a.json", "/run/a.sock", FailurePolicy::Fail);
        assert_eq!(health.report(&a), ServerReport::default(), "never called");
        health.record_failure(&a, Stage::PreCreateContainer, "Unavailable: connection refused");
        health.record_failure(&a, Stage::PreCreateContainer, "DeadlineExceeded: timed out after 2s");
        let r = health.report(&a);
        assert_eq!(r.failures_in_a_row, 2);
        assert_eq!(r.last_error.as_deref(), Some("PreCreateContainer: DeadlineExceeded: timed out after 2s"));
        assert!(r.last_failure_ms.is_some() && r.last_ok_ms.is_none());
        health.record_ok(&a);
        let r = health.report(&a);
        assert_eq!(r.failures_in_a_row, 0);
        assert!(r.last_ok_ms.is_some());
        assert!(r.last_error.is_some(), "the last error stays, with its time");
        let moved = server("a.json", "/run/elsewhere.sock", FailurePolicy::Fail);
        assert_eq!(health.report(&moved), ServerReport::default(), "the file now names another server");
        health.record_ok(&moved);
        assert_eq!(health.report(&a), ServerReport::default());
        health.retain(&[]);
        assert_eq!(health.report(&moved), ServerReport::default(), "forgotten once unregistered");
    }
}
