//! What of a resource update a container already has: the one rule both plugins use to answer
//! Synchronize (and re-apply rules) with only what differs, so the runtime's NRI lock — which every
//! pod and container event on the node waits for — is held for the changes, not for the node
//! (containerd applies each update, changed or not, at ~17 ms on this project's test machine).
//!
//! The container's values are the ones the runtime reports (`Container.linux.resources` in
//! Synchronize: containerd reads them from the container's OCI spec, which it rewrites at each
//! applied update), or a plugin's record of what it sent since. Pure functions.
//!
//! Equal means equal as the kernel gets it:
//!
//! * CFS quota: absent, 0 and any negative value all mean "no limit" (containerd leaves an absent
//!   or 0 quota out of the spec; runc writes -1 / `max` for a negative one).
//! * Memory limit: absent, 0 and any negative value all mean "no limit" (the same rule: kubelet's 0
//!   is left out of the spec, runc writes `max` for -1).
//! * cpuset CPUs and memory nodes: the same set, however spelled (`0-2` = `0,1,2`); an empty wanted
//!   set is "not set" (NRI reads it so).
//! * `unified`: each wanted key whose value differs; keys the container has that are not wanted
//!   are left alone.
//! * Every other field: the wanted value differs when the container has none or another.

use crate::proto::api as nri;

/// The part of `want` that `have` (the container's current resources, `None` when the runtime
/// reported none) does not already hold, field by field; `None` when it holds all of it.
pub fn unapplied(want: &nri::LinuxResources, have: Option<&nri::LinuxResources>) -> Option<nri::LinuxResources> {
    let empty = nri::LinuxResources::default();
    let have = have.unwrap_or(&empty);
    let cpu = want.cpu.as_ref().and_then(|w| cpu(w, have.cpu.as_ref().unwrap_or(&Default::default())));
    let memory = want.memory.as_ref().and_then(|w| memory(w, have.memory.as_ref().unwrap_or(&Default::default())));
    let unified: std::collections::HashMap<String, String> = want
        .unified
        .iter()
        .filter(|(k, v)| have.unified.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let out = nri::LinuxResources {
        cpu,
        memory,
        blockio_class: differs(&want.blockio_class, &have.blockio_class),
        rdt_class: differs(&want.rdt_class, &have.rdt_class),
        unified,
    };
    (out != empty).then_some(out)
}

/// The wanted value when it is set and the container's differs.
fn differs<T: PartialEq + Clone>(want: &Option<T>, have: &Option<T>) -> Option<T> {
    want.as_ref().filter(|w| have.as_ref() != Some(*w)).cloned()
}

fn cpu(want: &nri::LinuxCpu, have: &nri::LinuxCpu) -> Option<nri::LinuxCpu> {
    let unlimited = |q: &Option<nri::OptionalInt64>| q.as_ref().is_none_or(|q| q.value <= 0);
    let quota = want.quota.as_ref().filter(|w| {
        let same = if w.value <= 0 { unlimited(&have.quota) } else { have.quota.as_ref() == Some(*w) };
        !same
    });
    let out = nri::LinuxCpu {
        shares: differs(&want.shares, &have.shares),
        quota: quota.cloned(),
        period: differs(&want.period, &have.period),
        realtime_runtime: differs(&want.realtime_runtime, &have.realtime_runtime),
        realtime_period: differs(&want.realtime_period, &have.realtime_period),
        cpus: set_differs(&want.cpus, &have.cpus),
        mems: set_differs(&want.mems, &have.mems),
    };
    (out != nri::LinuxCpu::default()).then_some(out)
}

fn memory(want: &nri::LinuxMemory, have: &nri::LinuxMemory) -> Option<nri::LinuxMemory> {
    let unlimited = |l: &Option<nri::OptionalInt64>| l.as_ref().is_none_or(|l| l.value <= 0);
    let limit = want.limit.as_ref().filter(|w| {
        let same = if w.value <= 0 { unlimited(&have.limit) } else { have.limit.as_ref() == Some(*w) };
        !same
    });
    let out = nri::LinuxMemory {
        limit: limit.cloned(),
        reservation: differs(&want.reservation, &have.reservation),
        swap: differs(&want.swap, &have.swap),
        kernel: differs(&want.kernel, &have.kernel),
        kernel_tcp: differs(&want.kernel_tcp, &have.kernel_tcp),
        swappiness: differs(&want.swappiness, &have.swappiness),
        disable_oom_killer: differs(&want.disable_oom_killer, &have.disable_oom_killer),
        use_hierarchy: differs(&want.use_hierarchy, &have.use_hierarchy),
    };
    (out != nri::LinuxMemory::default()).then_some(out)
}

/// The wanted cpuset list when it is set and names another set than the container's (a list
/// that does not parse is compared as text).
fn set_differs(want: &str, have: &str) -> String {
    let same = match (cpu_list(want), cpu_list(have)) {
        (Some(w), Some(h)) => w == h,
        _ => want == have,
    };
    if want.is_empty() || same {
        String::new()
    } else {
        want.to_owned()
    }
}

/// A Linux list (`0-3,8`, the kernel's `cpuset.cpus` format) as its sorted members; `None` when
/// it does not parse or names more than 65,536 members.
fn cpu_list(list: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.trim().parse::<u32>().ok()?, hi.trim().parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if hi < lo || out.len() + (hi - lo) as usize >= 1 << 16 {
            return None;
        }
        out.extend(lo..=hi);
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// `have` with `sent` applied over it: each field `sent` sets replaces the container's (what the
/// runtime's spec holds once it applied the update), the rest kept.
pub fn applied(have: Option<&nri::LinuxResources>, sent: &nri::LinuxResources) -> nri::LinuxResources {
    let mut out = have.cloned().unwrap_or_default();
    if let Some(s) = &sent.cpu {
        let c = out.cpu.get_or_insert_with(Default::default);
        over(&mut c.shares, &s.shares);
        over(&mut c.quota, &s.quota);
        over(&mut c.period, &s.period);
        over(&mut c.realtime_runtime, &s.realtime_runtime);
        over(&mut c.realtime_period, &s.realtime_period);
        if !s.cpus.is_empty() {
            c.cpus = s.cpus.clone();
        }
        if !s.mems.is_empty() {
            c.mems = s.mems.clone();
        }
    }
    if let Some(s) = &sent.memory {
        let m = out.memory.get_or_insert_with(Default::default);
        over(&mut m.limit, &s.limit);
        over(&mut m.reservation, &s.reservation);
        over(&mut m.swap, &s.swap);
        over(&mut m.kernel, &s.kernel);
        over(&mut m.kernel_tcp, &s.kernel_tcp);
        over(&mut m.swappiness, &s.swappiness);
        over(&mut m.disable_oom_killer, &s.disable_oom_killer);
        over(&mut m.use_hierarchy, &s.use_hierarchy);
    }
    over(&mut out.blockio_class, &sent.blockio_class);
    over(&mut out.rdt_class, &sent.rdt_class);
    out.unified.extend(sent.unified.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

fn over<T: Clone>(field: &mut Option<T>, sent: &Option<T>) {
    if sent.is_some() {
        field.clone_from(sent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(shares: Option<u64>, quota: Option<i64>, cpus: &str, limit: Option<i64>) -> nri::LinuxResources {
        nri::LinuxResources {
            cpu: Some(nri::LinuxCpu {
                shares: shares.map(|value| nri::OptionalUInt64 { value }),
                quota: quota.map(|value| nri::OptionalInt64 { value }),
                cpus: cpus.into(),
                ..Default::default()
            }),
            memory: limit
                .map(|value| nri::LinuxMemory { limit: Some(nri::OptionalInt64 { value }), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn held_values_are_not_sent_again() {
        let want = res(Some(2), Some(-1), "0-2", Some(1 << 30));
        assert_eq!(unapplied(&want, Some(&res(Some(2), None, "0,1,2", Some(1 << 30)))), None);
        assert_eq!(unapplied(&want, Some(&res(Some(2), Some(0), "2,0-1", Some(1 << 30)))), None);
        // only the differing fields are sent
        let out = unapplied(&want, Some(&res(Some(1024), None, "0-2", Some(1 << 30)))).unwrap();
        assert_eq!(out, res(Some(2), None, "", None));
        let out = unapplied(&want, Some(&res(Some(2), Some(50_000), "0-3", None))).unwrap();
        assert_eq!(out, res(None, Some(-1), "0-2", Some(1 << 30)));
    }

    #[test]
    fn nothing_reported_is_everything_to_send() {
        let want = res(Some(2), Some(20_000), "1", Some(-1));
        let mut expected = want.clone();
        expected.memory = None; // "no limit" wanted, none reported: the same
        assert_eq!(unapplied(&want, None), Some(expected));
        assert_eq!(unapplied(&nri::LinuxResources::default(), None), None);
    }

    #[test]
    fn unified_by_key() {
        let mut want = nri::LinuxResources::default();
        want.unified.insert("memory.high".into(), "100".into());
        want.unified.insert("cpu.idle".into(), "1".into());
        let mut have = nri::LinuxResources::default();
        have.unified.insert("memory.high".into(), "100".into());
        have.unified.insert("other".into(), "x".into());
        let out = unapplied(&want, Some(&have)).unwrap();
        assert_eq!(out.unified.into_iter().collect::<Vec<_>>(), vec![("cpu.idle".to_string(), "1".to_string())]);
    }

    #[test]
    fn a_list_that_does_not_parse_is_compared_as_text() {
        assert_eq!(set_differs("0-x", "0-x"), "");
        assert_eq!(set_differs("0-x", "0"), "0-x");
        assert_eq!(set_differs("3-1", "1-3"), "3-1");
        assert_eq!(cpu_list("0-4294967295"), None);
    }

    #[test]
    fn applied_then_unapplied_is_nothing() {
        let have = res(Some(1024), Some(100_000), "0-3", Some(1 << 20));
        let want = res(Some(2), Some(-1), "0-1", None);
        let sent = unapplied(&want, Some(&have)).unwrap();
        let now = applied(Some(&have), &sent);
        assert_eq!(unapplied(&want, Some(&now)), None);
        assert_eq!(now.memory, have.memory, "fields not sent are kept");
    }
}
