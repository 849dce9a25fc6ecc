//! CoreSched: Linux core scheduling cookies per pod group, and `cpu.idle` of the kube-QoS
//! directories (koordlet v1.8.0 `pkg/koordlet/runtimehooks/hooks/coresched`, gate `CoreSched`,
//! alpha, default off).
//!
//! # Inputs and outputs
//!
//! | | |
//! |---|---|
//! | inputs | pod labels `koordinator.sh/qosClass`, `koordinator.sh/core-sched-group-id`, `koordinator.sh/core-sched-policy` (`""`, `none`, `exclusive`); the pod's kube QoS (its cgroup parent); the NodeSLO's `cpuPolicy: coreSched` and per-class `cpuQOS.enable`/`coreExpeller`/`schedIdle` ([`crate::rules::core_sched`]) |
//! | outputs | the core-sched cookie of every process (`cgroup.procs`) of each container and of the sandbox (pause) container, through [`crate::host::Host::core_sched`]; `cpu.idle` of `kubepods`, `kubepods/burstable`, `kubepods/besteffort` (v2 `cpu.idle`; v1 `cpu/cpu.idle`, Anolis kernels only — elsewhere skipped as unsupported) |
//! | stages | none of koordlet's hook stages: koordlet does this in its reconcilers and rule callbacks, here in [`Plugin::node`] (each reconciler pass; NRI mode after Synchronize, rule changes, RunPodSandbox, RemovePodSandbox) and [`Plugin::kube_qos`] (the reconciler's `--kubepods-cgroup` pass). It lists PostStartContainer so that NRI mode runs node-level work when a container's processes exist. |
//!
//! # Groups
//!
//! Which group a pod is in (koordlet's `getPodEnabledAndGroup`):
//!
//! * the label `koordinator.sh/core-sched-group-id` (missing: `""`, one group for all such
//!   pods);
//! * policy `exclusive`: the pod UID (a group of its own);
//! * policy `none`: no cookie at all.
//!
//! Whether it gets cookies: its class's `cpuQOS.enable` (LSE/LSR → LSR's, LS, BE; pods without a
//! class by kube QoS: Guaranteed → LSR's if on else LS's, Burstable → LS's, BestEffort → BE's).
//! An expeller class (`coreExpeller`, default on for LSR and LS) appends `-expeller` to the
//! group: its pods never share a core with same-group pods of a non-expeller class. SYSTEM pods
//! are skipped (koordlet's all-pods refresh does).
//!
//! # Cookies
//!
//! [`cookies`]: the first container of a group gets a new cookie, the others share it; a
//! container whose pod leaves core scheduling gets cookie 0 back (only if runtime-hooks gave it
//! one). Existing cookies are read once at the first pass so a restart keeps them. Before the
//! first cookie the kernel is readied ([`crate::host::core_sched::CoreSchedOps::prepare`]: group
//! identity's sysctl off, `kernel.sched_core` on, where they exist).
//!
//! # `cpu.idle`
//!
//! 1 for a kube-QoS directory whose class has `schedIdle: 1` under `cpuPolicy: coreSched`, else 0
//! (Guaranteed → LSR's/LS's as above, Burstable → LS, BestEffort → BE).
//!
//! # Exclusive with GroupIdentity
//!
//! koordlet lets both gates be on; the NodeSLO's `cpuPolicy` picks one (`groupIdentity`, the
//! default: GroupIdentity's values, no cookies; `coreSched`: GroupIdentity writes 0 everywhere,
//! CoreSched acts and switches group identity's sysctl off). The same here.
//!
//! # Without core scheduling
//!
//! On a kernel without core scheduling ([`crate::host::Host::core_sched`] `None`, logged once at
//! start) no cookie is touched and nothing fails; `cpu.idle` is still written where the file
//! exists.

pub mod cookies;

use std::collections::HashMap;
use std::sync::Mutex;

use crate::cgroup::CgroupValue;
use crate::context::{KubeQos, PodContext, QosClass};
use crate::host::Host;
use crate::plugin::{NodePods, Plugin, PodState, Stage};
use crate::rules::Rules;

use super::cgroup_procs;
use cookies::{CookieCache, Outcome};

/// Pod label: the pod's core-sched group (koordinator `apis/slo/v1alpha1` `LabelCoreSchedGroupID`).
pub const LABEL_GROUP_ID: &str = "koordinator.sh/core-sched-group-id";
/// Pod label: `none` (no cookie) or `exclusive` (a group of its own); anything else is the default
/// policy (`LabelCoreSchedPolicy`).
pub const LABEL_POLICY: &str = "koordinator.sh/core-sched-policy";
/// Suffix of an expeller class's group (koordlet's `ExpellerGroupSuffix`).
pub const EXPELLER_SUFFIX: &str = "-expeller";

/// The CoreSched plugin; holds the cookie state between passes.
#[derive(Debug, Default)]
pub struct CoreSched {
    cache: Mutex<CookieCache>,
}

impl CoreSched {
    /// The plugin's name (koordlet's).
    pub const NAME: &'static str = "CoreSched";

    /// Whether `pod` gets cookies and its group (koordlet's `getPodEnabledAndGroup`).
    pub fn pod_group(pod: &PodContext, rules: &Rules) -> (bool, String) {
        let mut group = pod.labels.get(LABEL_GROUP_ID).cloned().unwrap_or_default();
        let (mut enabled, expeller) = rules.core_sched.pod(pod.qos(), pod.kube_qos());
        match pod.labels.get(LABEL_POLICY).map(String::as_str) {
            Some("exclusive") => group = pod.uid.clone(),
            Some("none") => enabled = false,
            _ => {}
        }
        if expeller {
            group.push_str(EXPELLER_SUFFIX);
        }
        (enabled, group)
    }

    /// The cookie state (for tests and status).
    pub fn cache(&self) -> std::sync::MutexGuard<'_, CookieCache> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One container's (or sandbox's) processes: its key and cgroup directory.
struct Target {
    key: String,
    dir: String,
}

/// The sandbox and containers of a pod, with their cgroup directories.
fn targets(pod: &PodState, root: &std::path::Path) -> Vec<Target> {
    let mut out = Vec::new();
    let containers: Vec<&str> = pod.containers.iter().filter_map(|c| c.cgroup_dir.as_deref()).collect();
    if let Some(pod_dir) = &pod.cgroup_dir {
        for dir in cgroup_procs::other_children(root, pod_dir, &containers) {
            let name = dir.rsplit('/').next().unwrap_or_default().to_owned();
            out.push(Target { key: format!("{}/sandbox:{name}", pod.pod.uid), dir });
        }
    }
    for c in &pod.containers {
        if let (Some(dir), false) = (&c.cgroup_dir, c.container.id.is_empty()) {
            out.push(Target { key: format!("{}/{}", pod.pod.uid, c.container.id), dir: dir.clone() });
        }
    }
    out
}

impl Plugin for CoreSched {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PostStartContainer]
    }

    fn kube_qos(&self, qos: KubeQos, rules: &Rules) -> Vec<CgroupValue> {
        vec![CgroupValue::CpuIdle(i64::from(rules.core_sched.kube(qos).cpu_idle))]
    }

    fn node(&self, pods: &NodePods<'_>, rules: &Rules, host: &Host) -> anyhow::Result<()> {
        let Some(ops) = host.core_sched.as_deref() else {
            return Ok(());
        };
        let root = host.paths.cgroup_root.as_path();
        let mut cache = self.cache();
        let mut live: HashMap<String, Vec<u32>> = HashMap::new();
        let mut work = Vec::new();
        for pod in pods.iter().filter(|p| p.pod.qos() != QosClass::System) {
            let (enabled, group) = Self::pod_group(&pod.pod, rules);
            for t in targets(pod, root) {
                let pids = match cgroup_procs::procs(root, &t.dir) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::debug!(container = %t.key, "core sched: no processes: {e}");
                        continue;
                    }
                };
                live.insert(t.key.clone(), pids.clone());
                work.push((t.key, enabled, group.clone(), pids));
            }
        }
        if !cache.loaded {
            for (key, _, group, pids) in &work {
                cache.load(ops, key, group, pids);
            }
            cache.loaded = true;
        }
        // koordlet's initSystem: when it fails, pods to enable are skipped (not cleared).
        let prepare_error = if rules.core_sched.enable { ops.prepare().err() } else { None };
        for (key, enabled, group, pids) in work {
            let outcome = match (enabled, &prepare_error) {
                (true, None) => cache.enable(ops, &key, &group, &pids),
                (true, Some(_)) => Outcome::Unchanged,
                (false, _) => cache.disable(ops, &key, &pids),
            };
            match outcome {
                Outcome::Unchanged => {}
                Outcome::Created(c) => {
                    tracing::info!(container = %key, group = %group, "core sched: new cookie {c:#x} for {} process(es)", pids.len())
                }
                Outcome::Assigned(c, p) => {
                    tracing::info!(container = %key, group = %group, "core sched: cookie {c:#x} shared to {p:?}")
                }
                Outcome::Cleared(p) => tracing::info!(container = %key, "core sched: cookie cleared on {p:?}"),
            }
        }
        cache.retain(&live);
        match prepare_error {
            Some(e) => anyhow::bail!("core sched: readying the kernel: {e}; no cookies given"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
