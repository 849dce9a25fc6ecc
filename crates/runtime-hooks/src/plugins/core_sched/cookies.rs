//! Which processes hold which cookie: koordlet's cookie cache (`hooks/coresched/cookie_cache.go`)
//! and its per-container steps (`core_sched.go` `enableContainerCookie`,
//! `disableContainerCookie`, `addCookie`, `assignCookie`, `clearCookie`, `loadAllCookies`).
//!
//! A *group* (a string: the pod's core-sched group id, the pod UID for `exclusive`, with
//! `-expeller` for expeller classes) holds one cookie shared by the processes of every
//! container in it. The first container of a group gets a new cookie (created on its first
//! process, then shared to the others); later containers get it shared from a process of the
//! group still holding it (a *sibling*). A container whose pod turns core scheduling off gets
//! cookie 0 back, but only when runtime-hooks gave it one (containers it never touched are left
//! alone, as koordlet does).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::host::core_sched::CoreSchedOps;

/// A group's cookie and the processes known to hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupEntry {
    /// The cookie (non-zero).
    pub cookie: u64,
    /// Processes (thread group ids) given it.
    pub pids: BTreeSet<u32>,
}

impl GroupEntry {
    fn valid(&self) -> bool {
        self.cookie != 0 && !self.pids.is_empty()
    }
}

/// The cookie state: groups and which group each container was last put in.
#[derive(Debug, Default)]
pub struct CookieCache {
    /// Group id → its cookie and processes.
    pub groups: BTreeMap<String, GroupEntry>,
    /// Container key (`<pod uid>/<container id>`) → its group.
    pub containers: BTreeMap<String, String>,
    /// Existing cookies have been read once (koordlet's `initCache`).
    pub loaded: bool,
}

/// What happened to one container, for logs and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (no processes, already done, never had a cookie).
    Unchanged,
    /// A new cookie was created for the group.
    Created(u64),
    /// The group's cookie was shared to these processes.
    Assigned(u64, Vec<u32>),
    /// These processes got cookie 0 back.
    Cleared(Vec<u32>),
}

impl CookieCache {
    /// Records existing cookies of a container's processes as its group's, if they hold one
    /// (koordlet's `loadAllCookies`: a restart keeps the cookies it gave).
    pub fn load(&mut self, ops: &dyn CoreSchedOps, key: &str, group: &str, pids: &[u32]) {
        let mut first = 0u64;
        let mut holders = Vec::new();
        for pid in pids {
            match ops.get(*pid) {
                Ok(0) | Err(_) => {}
                Ok(c) if first == 0 || c == first => {
                    first = c;
                    holders.push(*pid);
                }
                Ok(_) => {}
            }
        }
        if first == 0 {
            return;
        }
        let entry = self.groups.entry(group.to_owned()).or_default();
        if entry.cookie != 0 && entry.cookie != first {
            tracing::warn!(
                container = key,
                group,
                "core sched: processes hold cookie {first:#x} but the group has {:#x}; left as they are",
                entry.cookie
            );
            return;
        }
        entry.cookie = first;
        entry.pids.extend(holders);
        self.containers.insert(key.to_owned(), group.to_owned());
    }

    fn forget_pids(&mut self, except: &str, pids: &[u32]) {
        for (g, e) in self.groups.iter_mut() {
            if g != except {
                e.pids.retain(|p| !pids.contains(p));
            }
        }
        self.groups.retain(|_, e| e.valid());
    }

    /// Gives the processes `pids` of container `key` the cookie of `group` (koordlet's
    /// `enableContainerCookie`).
    pub fn enable(&mut self, ops: &dyn CoreSchedOps, key: &str, group: &str, pids: &[u32]) -> Outcome {
        if pids.is_empty() {
            return Outcome::Unchanged;
        }
        if let Some(entry) = self.groups.get(group).filter(|e| e.valid()).cloned() {
            if pids.iter().all(|p| entry.pids.contains(p)) {
                self.containers.insert(key.to_owned(), group.to_owned());
                return Outcome::Unchanged;
            }
            match self.share(ops, group, &entry, pids) {
                Some(outcome) => {
                    self.containers.insert(key.to_owned(), group.to_owned());
                    return outcome;
                }
                None => {
                    // No sibling holds the cookie any more: start the group afresh.
                    self.groups.remove(group);
                }
            }
        }
        // A new cookie on the first process, shared to the others.
        if let Err(e) = ops.create(pids[0]) {
            tracing::debug!(container = key, group, "core sched: creating a cookie on {}: {e}", pids[0]);
            return Outcome::Unchanged;
        }
        let cookie = match ops.get(pids[0]) {
            Ok(c) if c != 0 => c,
            other => {
                tracing::debug!(
                    container = key,
                    group,
                    "core sched: no cookie on {} after creating one: {other:?}",
                    pids[0]
                );
                return Outcome::Unchanged;
            }
        };
        let failed: Vec<u32> = ops.assign(pids[0], &pids[1..]).into_iter().map(|(p, _)| p).collect();
        let given: Vec<u32> = pids.iter().copied().filter(|p| !failed.contains(p)).collect();
        self.forget_pids(group, &given);
        self.groups.insert(group.to_owned(), GroupEntry { cookie, pids: given.into_iter().collect() });
        self.containers.insert(key.to_owned(), group.to_owned());
        Outcome::Created(cookie)
    }

    /// Shares the group's cookie to the processes that lack it, from a sibling that still holds
    /// it; `None` when no sibling does (koordlet's `assignCookie`).
    fn share(&mut self, ops: &dyn CoreSchedOps, group: &str, entry: &GroupEntry, pids: &[u32]) -> Option<Outcome> {
        let target = entry.cookie;
        let (mut to_assign, mut holding, mut unknown) = (Vec::new(), Vec::new(), 0);
        for pid in pids {
            match ops.get(*pid) {
                Ok(c) if c == target => holding.push(*pid),
                Ok(_) => to_assign.push(*pid),
                Err(_) => unknown += 1,
            }
        }
        if unknown == pids.len() {
            return Some(Outcome::Unchanged); // all gone (a restarting container)
        }
        let e = self.groups.entry(group.to_owned()).or_default();
        e.pids.extend(holding.iter().copied());
        if to_assign.is_empty() {
            return Some(Outcome::Unchanged);
        }
        let mut stale = Vec::new();
        let candidates: Vec<u32> =
            holding.iter().copied().chain(entry.pids.iter().copied().filter(|p| !holding.contains(p))).collect();
        let sibling = candidates.into_iter().find(|s| {
            holding.contains(s)
                || match ops.get(*s) {
                    Ok(c) if c == target => true,
                    _ => {
                        stale.push(*s);
                        false
                    }
                }
        });
        let e = self.groups.entry(group.to_owned()).or_default();
        e.pids.retain(|p| !stale.contains(p));
        let sibling = sibling?;
        let failed: Vec<u32> = ops.assign(sibling, &to_assign).into_iter().map(|(p, _)| p).collect();
        let given: Vec<u32> = to_assign.into_iter().filter(|p| !failed.contains(p)).collect();
        self.forget_pids(group, &given);
        if let Some(e) = self.groups.get_mut(group) {
            e.pids.extend(given.iter().copied());
        }
        Some(Outcome::Assigned(target, given))
    }

    /// Gives the processes `pids` of container `key` cookie 0 again if runtime-hooks gave it one
    /// (koordlet's `disableContainerCookie`).
    pub fn disable(&mut self, ops: &dyn CoreSchedOps, key: &str, pids: &[u32]) -> Outcome {
        let Some(last) = self.containers.get(key).cloned() else {
            return Outcome::Unchanged;
        };
        if pids.is_empty() {
            return Outcome::Unchanged;
        }
        let holding: Vec<u32> = pids.iter().copied().filter(|p| matches!(ops.get(*p), Ok(c) if c != 0)).collect();
        let failed: Vec<u32> =
            if holding.is_empty() { Vec::new() } else { ops.clear(&holding).into_iter().map(|(p, _)| p).collect() };
        let cleared: Vec<u32> = holding.into_iter().filter(|p| !failed.contains(p)).collect();
        if let Some(e) = self.groups.get_mut(&last) {
            e.pids.retain(|p| !pids.contains(p) || failed.contains(p));
        }
        self.groups.retain(|_, e| e.valid());
        self.containers.remove(key);
        if cleared.is_empty() {
            Outcome::Unchanged
        } else {
            Outcome::Cleared(cleared)
        }
    }

    /// Forgets containers not in `live` and processes no live container has (koordlet's caches
    /// expire instead); groups left without processes are dropped.
    pub fn retain(&mut self, live: &HashMap<String, Vec<u32>>) {
        self.containers.retain(|k, _| live.contains_key(k));
        let pids: BTreeSet<u32> = live.values().flatten().copied().collect();
        for e in self.groups.values_mut() {
            e.pids.retain(|p| pids.contains(p));
        }
        self.groups.retain(|_, e| e.valid());
    }
}
