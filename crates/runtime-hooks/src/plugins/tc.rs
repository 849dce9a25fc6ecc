//! TCNetworkQoS: egress bandwidth classes on the node's interface and each pod's
//! `net_cls.classid` (koordlet's `hooks/tc`, gate `TCNetworkQoS`).
//!
//! # Inputs and outputs
//!
//! | | |
//! |---|---|
//! | inputs | pod label `koordinator.sh/qosClass`; pod annotation `koordinator.sh/networkQOS` (`{"ingressLimit": "10M", "egressLimit": "20M"}`, bits/s quantities, missing = `"0"`); the NodeSLO's network QoS ([`crate::rules::net_qos`]) |
//! | outputs | pod cgroup `net_cls.classid` (v1 `<root>/net_cls/<pod>/net_cls.classid`); on the default route's interface: root qdisc `htb 1:` (default `1:2`), classes `1:1`–`1:4`, `cgroup` filters at prio 1–3, one class per pod with an egress limit |
//! | stages | PreRunPodSandbox (the reconciler's pod-level values; koordlet registers a pod-level `NetClsClassId` reconciler) + node-level work |
//! | rules | `netQOSPolicy: tc` (the default) |
//!
//! # Classid
//!
//! Source: koordlet's `SetPodNetCls`. SYSTEM → `1:2`, LSE/LSR/LS → `1:3`, BE → `1:4`; a pod with
//! a non-zero ingress or egress limit gets its own class's handle once node-level work has
//! assigned one; pods without a class get nothing. Written only under the `tc` policy.
//!
//! # Classes
//!
//! Source: koordlet's `EnsureClasses`; rates from bits/s to bytes/s, as `newClass` does. With
//! `T` = `totalNetworkBandwidth`, L1 = LS, L2 = BE, each request/limit a quantity or a
//! percentage of `T`:
//!
//! | class | parent | rate | ceil | prio |
//! |---|---|---|---|---|
//! | `1:1` | root | T | T | 0 |
//! | `1:2` system | `1:1` | T − L1 egress request − L2 egress request | T | 1 |
//! | `1:3` LS | `1:1` | L1 egress request | L1 egress limit | 2 |
//! | `1:4` BE | `1:1` | L2 egress request | L2 egress limit | 3 |
//! | per pod | `1:1` | egress limit | egress limit | its class's |
//!
//! A class whose rate or ceil comes out 0 (a class whose `networkQOS` is off) is not sent to
//! the kernel, which refuses 0 (koordlet sends it and logs the error); it is reported in the
//! plugin's failure.
//!
//! Per-pod handles are `1:<minor>`, the minor derived from the pod UID (probing past
//! collisions, 5..=0xffff) so a restart finds the same ones — koordlet draws them at random and
//! re-reads them from `net_cls.classid` at start. A pod that goes loses its class.
//!
//! Policy not `tc`, or a total of 0: the `htb 1:` root qdisc is deleted (koordlet's `CleanUp`;
//! for a total of 0 koordlet would send classes of rate 0).
//!
//! # Without node-level access
//!
//! Node-level work needs [`Host::tc`]; without it (no `net_cls`, no `CAP_NET_ADMIN`, no
//! default route — logged once at start) only the classids are written, where `net_cls` exists.
//!
//! # Where koordlet differs
//!
//! Not done (koordlet does): the `mangle POSTROUTING … CLASSIFY` iptables rules and the
//! `system_class`/`ls_class`/`be_class` ipsets of pod IPs, and the per-pod `u32` (by pod IP) and
//! `cgroup` filters: the pod states carry no pod IP nor host-network flag, and netfilter's ipset
//! and iptables interfaces have no maintained Rust crate (iptables itself has no netlink API).
//! The generic `cgroup` filters still classify host-network pods' traffic by classid.
//!
//! koordlet divides a pod's egress limit by 8 twice (once parsing the annotation, once in
//! `newClass`); here once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use anyhow::{anyhow, Context};

use crate::cgroup::CgroupValue;
use crate::change::Change;
use crate::context::{PodContext, QosClass};
use crate::host::tc::{HtbClass, TrafficControl};
use crate::host::Host;
use crate::plugin::{NodePods, Plugin, PodState, Stage};
use crate::quantity::Quantity;
use crate::rules::net_qos::{NetQosPolicy, NetQosRules};
use crate::rules::Rules;

/// Pod annotation with a pod's bandwidth limits (koordinator `AnnotationNetworkQOS`).
pub const NETWORK_QOS: &str = "koordinator.sh/networkQOS";

/// The HTB qdisc handle `1:`.
pub const QDISC: u32 = 0x1_0000;
/// Class `1:1`, parent of all others.
pub const ROOT_CLASS: u32 = 0x1_0001;
/// Class `1:2`, SYSTEM pods and the default.
pub const SYSTEM_CLASS: u32 = 0x1_0002;
/// Class `1:3`, LS (LSE, LSR, LS) pods.
pub const LS_CLASS: u32 = 0x1_0003;
/// Class `1:4`, BE pods.
pub const BE_CLASS: u32 = 0x1_0004;
const TC_H_ROOT: u32 = 0xffff_ffff;

/// A pod's network QoS class (koordlet's `NetQoSClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetClass {
    /// SYSTEM.
    System,
    /// LSE, LSR, LS.
    Ls,
    /// BE.
    Be,
}

impl NetClass {
    /// By the QoS label (koordlet's `GetPodNetQoSClassByName`); `None` without a class.
    pub fn of(pod: &PodContext) -> Option<NetClass> {
        match pod.qos() {
            QosClass::System => Some(NetClass::System),
            QosClass::Lse | QosClass::Lsr | QosClass::Ls => Some(NetClass::Ls),
            QosClass::Be => Some(NetClass::Be),
            QosClass::None => None,
        }
    }

    /// The class handle.
    pub fn handle(self) -> u32 {
        match self {
            NetClass::System => SYSTEM_CLASS,
            NetClass::Ls => LS_CLASS,
            NetClass::Be => BE_CLASS,
        }
    }

    /// HTB prio (koordlet's `GetPrio`): 1, 2, 3.
    pub fn prio(self) -> u32 {
        match self {
            NetClass::System => 1,
            NetClass::Ls => 2,
            NetClass::Be => 3,
        }
    }
}

/// A pod's `koordinator.sh/networkQOS` as `(ingress, egress)` in bytes/s (the annotation's
/// bits/s divided by 8); `(0, 0)` without the annotation. A missing field is `"0"`.
///
/// Errors: not a JSON object, a field that is not a string, a string that is not a quantity,
/// a negative quantity — naming the annotation and the field.
pub fn pod_bandwidth(pod: &PodContext) -> anyhow::Result<(u64, u64)> {
    let Some(text) = pod.annotations.get(NETWORK_QOS).filter(|t| !t.is_empty()) else {
        return Ok((0, 0));
    };
    let v: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("annotation {NETWORK_QOS}: {text:?} is not JSON"))?;
    if !v.is_object() {
        return Err(anyhow!("annotation {NETWORK_QOS}: {text:?} is not a JSON object"));
    }
    let field = |key: &str| -> anyhow::Result<u64> {
        let s = match v.get(key) {
            None | Some(serde_json::Value::Null) => return Ok(0),
            Some(serde_json::Value::String(s)) => s,
            Some(other) => return Err(anyhow!("annotation {NETWORK_QOS}: {key} {other} is not a quantity string")),
        };
        let q: Quantity =
            s.trim().parse().map_err(|e| anyhow!("annotation {NETWORK_QOS}: {key} {s:?} is not a quantity: {e}"))?;
        if q.is_negative() {
            return Err(anyhow!("annotation {NETWORK_QOS}: {key} {s:?} is negative"));
        }
        Ok(q.value() as u64 / 8)
    };
    Ok((field("ingressLimit")?, field("egressLimit")?))
}

/// The TCNetworkQoS plugin. Holds the per-pod class handles node-level work assigned (pod UID →
/// handle).
#[derive(Debug, Default)]
pub struct TcNetworkQos {
    handles: Mutex<BTreeMap<String, u32>>,
}

impl TcNetworkQos {
    /// The plugin's name (koordlet's gate).
    pub const NAME: &'static str = "TCNetworkQoS";

    fn handles(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, u32>> {
        self.handles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node classes `1:1`–`1:4` for `rules` (module table; rates in bytes/s).
    pub fn node_classes(rules: &NetQosRules) -> Vec<HtbClass> {
        let total = rules.total_bandwidth;
        let (l1_min, l1_max) =
            rules.ls.map(|c| (c.egress_request.of_total(total), c.egress_limit.of_total(total))).unwrap_or((0, 0));
        let (l2_min, l2_max) =
            rules.be.map(|c| (c.egress_request.of_total(total), c.egress_limit.of_total(total))).unwrap_or((0, 0));
        let class = |handle, parent, rate: u64, ceil: u64, prio| HtbClass {
            handle,
            parent,
            rate: rate / 8,
            ceil: ceil / 8,
            prio,
        };
        vec![
            class(ROOT_CLASS, TC_H_ROOT, total, total, 0),
            class(SYSTEM_CLASS, ROOT_CLASS, total.saturating_sub(l1_min).saturating_sub(l2_min), total, 1),
            class(LS_CLASS, ROOT_CLASS, l1_min, l1_max, 2),
            class(BE_CLASS, ROOT_CLASS, l2_min, l2_max, 3),
        ]
    }

    /// A free per-pod handle for `uid`: `1:<minor>`, minor from the UID's FNV-1a hash in
    /// 5..=0xffff, probing upwards past handles in `used`. `None` when all are taken.
    fn pick_handle(uid: &str, used: &BTreeSet<u32>) -> Option<u32> {
        let hash = uid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
        let span = 0xffff - 5 + 1;
        (0..span).map(|i| 0x1_0000 | (5 + (hash + i) % span) as u32).find(|h| !used.contains(h))
    }

    /// Makes the kernel's classes and filters match (koordlet's `InitRelatedRules` and the pod
    /// part of `refreshForAllPods`). Errors are collected, not stopping the rest.
    fn ensure(&self, tc: &dyn TrafficControl, pods: &[PodState], rules: &NetQosRules) -> Vec<String> {
        let mut errors = Vec::new();
        let dev = tc.interface().to_owned();
        match tc.root_qdisc() {
            Ok(Some(q)) if q.kind == "htb" && q.handle == QDISC => {}
            Ok(_) => {
                if let Err(e) = tc.replace_root_htb(QDISC, SYSTEM_CLASS & 0xffff) {
                    return vec![format!("root qdisc htb 1: on {dev}: {e}")];
                }
            }
            Err(e) => return vec![format!("listing the qdiscs of {dev}: {e}")],
        }
        let existing = match tc.classes() {
            Ok(c) => c,
            Err(e) => return vec![format!("listing the classes of {dev}: {e}")],
        };
        let mut want = Self::node_classes(rules);

        // Per-pod classes.
        let mut handles = self.handles();
        let live: BTreeSet<&str> = pods.iter().map(|p| p.pod.uid.as_str()).collect();
        handles.retain(|uid, _| live.contains(uid.as_str()));
        for p in pods {
            let Some(class) = NetClass::of(&p.pod) else { continue };
            let (ingress, egress) = match pod_bandwidth(&p.pod) {
                Ok(b) => b,
                Err(e) => {
                    errors.push(format!("pod {}: {e:#}", p.pod.key()));
                    continue;
                }
            };
            if ingress == 0 && egress == 0 {
                continue;
            }
            let handle = match handles.get(&p.pod.uid) {
                Some(h) => *h,
                None => {
                    let used: BTreeSet<u32> = handles.values().copied().collect();
                    let Some(h) = Self::pick_handle(&p.pod.uid, &used) else {
                        errors.push("too many tc classes".into());
                        continue;
                    };
                    handles.insert(p.pod.uid.clone(), h);
                    h
                }
            };
            want.push(HtbClass { handle, parent: ROOT_CLASS, rate: egress, ceil: egress, prio: class.prio() });
        }
        let pod_handles: BTreeSet<u32> = handles.values().copied().collect();
        drop(handles);

        for class in &want {
            if class.rate == 0 || class.ceil == 0 {
                errors.push(format!(
                    "class {}: rate {} ceil {} bytes/s: a rate of 0 is not set",
                    show(class.handle),
                    class.rate,
                    class.ceil
                ));
                continue;
            }
            if existing.iter().any(|c| c == class) {
                continue;
            }
            if let Err(e) = tc.put_class(class) {
                errors.push(format!("class {} on {dev}: {e}", show(class.handle)));
            }
        }
        // Classes of pods that went (ours: minor ≥ 5 under 1:1).
        for c in existing
            .iter()
            .filter(|c| c.parent == ROOT_CLASS && c.handle & 0xffff >= 5 && !pod_handles.contains(&c.handle))
        {
            if let Err(e) = tc.delete_class(c.parent, c.handle) {
                errors.push(format!("deleting class {} on {dev}: {e}", show(c.handle)));
            }
        }
        match tc.filters(QDISC) {
            Ok(filters) => {
                for (prio, minor) in [(1u16, 2u32), (2, 3), (3, 4)] {
                    if filters.iter().any(|f| f.kind == "cgroup" && f.prio == prio) {
                        continue;
                    }
                    if let Err(e) = tc.add_cgroup_filter(QDISC, prio, minor) {
                        errors.push(format!("cgroup filter prio {prio} on {dev}: {e}"));
                    }
                }
            }
            Err(e) => errors.push(format!("listing the filters of {dev}: {e}")),
        }
        errors
    }
}

/// `1:3` form of a handle.
fn show(handle: u32) -> String {
    format!("{:x}:{:x}", handle >> 16, handle & 0xffff)
}

impl Plugin for TcNetworkQos {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox]
    }

    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        if rules.net_qos.policy != NetQosPolicy::Tc {
            return Ok(Change::default());
        }
        let Some(class) = NetClass::of(pod) else { return Ok(Change::default()) };
        let (ingress, egress) = pod_bandwidth(pod)?;
        let handle =
            if ingress != 0 || egress != 0 { self.handles().get(&pod.uid).copied() } else { Some(class.handle()) };
        Ok(Change { pod_cgroup: handle.map(CgroupValue::NetClsClassId).into_iter().collect(), ..Default::default() })
    }

    fn node(&self, pods: &NodePods<'_>, rules: &Rules, host: &Host) -> anyhow::Result<()> {
        let Some(tc) = &host.tc else { return Ok(()) };
        let r = &rules.net_qos;
        if r.policy != NetQosPolicy::Tc || r.total_bandwidth == 0 {
            self.handles().clear();
            return match tc.root_qdisc() {
                Ok(Some(q)) if q.kind == "htb" && q.handle == QDISC => {
                    tc.delete_root_qdisc(QDISC).with_context(|| format!("deleting qdisc htb 1: on {}", tc.interface()))
                }
                Ok(_) => Ok(()),
                Err(e) => Err(anyhow!("listing the qdiscs of {}: {e}", tc.interface())),
            };
        }
        let errors = self.ensure(tc.as_ref(), pods, r);
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!("{}", errors.join("; ")))
        }
    }
}

#[cfg(test)]
#[path = "tc_tests.rs"]
mod tests;
