//! Resctrl: a resctrl control group per pod with L3 cache ways and memory bandwidth from the
//! pod's annotation (koordlet v1.8.0 `pkg/koordlet/runtimehooks/hooks/resctrl`, gate `Resctrl`,
//! alpha, default off).
//!
//! # Inputs and outputs
//!
//! | | |
//! |---|---|
//! | inputs | pod annotation `node.koordinator.sh/resctrl` (JSON, [`schemata`]); the resctrl root's `info/L3/cbm_mask` and `schemata` (cache ids); the CPU vendor (`/proc/cpuinfo`) |
//! | outputs | group `<resctrl root>/koordlet-<pod uid>/` with its `schemata`; the pod's containers' threads written to its `tasks`; groups of pods that are gone removed |
//! | stages | PreRunPodSandbox (the annotation is checked: a bad one fails this plugin), PreCreateContainer (the RDT class, NRI mode, see below), PostStartContainer (no answer: listed so that NRI mode runs node-level work once a container's threads exist); the group work in [`Plugin::node`]; removal at pod removal ([`Plugin::pod_removed`], koordlet's PreRemoveRunPodSandbox) |
//!
//! # Groups
//!
//! Per pod with the annotation, at each node-level pass (koordlet's pod reconcilers
//! `ResctrlSchemata` and `ResctrlTasks`): the group is created if missing, its `schemata`
//! written when it does not hold the computed values, and every thread of the pod's containers
//! (v2 `cgroup.threads`, v1 `tasks`) not yet in the group's `tasks` written there.
//!
//! Then every `koordlet-*` group whose pod is not among the pods with the annotation is removed
//! (koordlet's all-pods reconciler `RemoveUnusedResctrlPath`), except groups first seen less than
//! 10 s ago (koordlet's `ExpirationTime` guard against a pod not yet known). At pod removal the
//! group is removed at once (koordlet's PreRemoveRunPodSandbox, `fromNRI`).
//!
//! # RDT class
//!
//! NRI mode, as koordlet: at PreCreateContainer a container of an annotated pod whose group
//! exists gets [`Change::rdt_class`] `koordlet-<pod uid>`, which NRI 0.6.1 carries as
//! `LinuxResources.rdt_class` and containerd turns into the OCI `intelRdt.closID`: the runtime
//! starts the container in the group. Only when the resctrl root is the kernel's mount (the
//! runtime's view; a class naming a group that is not there would fail the container); with a
//! test tree the threads join by `tasks` at the next node-level pass instead. The proxy's
//! protocol has no such field.
//!
//! # Where koordlet differs
//!
//! * koordlet creates the group and writes the schemata in the hook call at PreRunPodSandbox;
//!   here that happens at the node-level pass that follows (NRI: right after RunPodSandbox;
//!   standalone and proxy mode: the reconciler's next pass).
//! * koordlet writes a group's schemata once per process; here it is rewritten whenever it
//!   drifts or the annotation changes.
//! * koordlet mounts resctrl when it is not mounted; runtime-hooks does not.
//!
//! # Without resctrl
//!
//! Without resctrl ([`crate::host::Host::resctrl`] `None`, logged once at start) nothing is done
//! and nothing fails, bad annotations aside.

pub mod schemata;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::change::Change;
use crate::context::{ContainerContext, PodContext};
use crate::host::resctrl::ResctrlFs;
use crate::host::Host;
use crate::plugin::{NodePods, Plugin, PodState, Stage};
use crate::rules::Rules;

use super::cgroup_procs;
use schemata::{ANNOTATION, GROUP_PREFIX};

/// koordlet's `ExpirationTime`: a group is not removed as unused sooner than this after it was
/// first seen.
pub const REMOVAL_GRACE: Duration = Duration::from_secs(10);

/// The Resctrl plugin; remembers when it first saw each group.
#[derive(Debug)]
pub struct Resctrl {
    grace: Duration,
    first_seen: Mutex<HashMap<String, Instant>>,
    /// Pod UIDs whose group exists on the kernel's resctrl mount (their containers get the RDT
    /// class), as of the last node-level pass.
    rdt_ready: Mutex<BTreeSet<String>>,
    /// The pods seen are only some of the node's (`--selector`): a `koordlet-*` group whose pod
    /// was never among them may belong to a pod that is not selected, and is left alone; groups
    /// of pods seen before and gone since are still removed.
    partial_view: bool,
    /// Groups wanted by an earlier pass (the pods this process has seen with the annotation).
    seen_groups: Mutex<BTreeSet<String>>,
}

impl Default for Resctrl {
    fn default() -> Self {
        Resctrl {
            grace: REMOVAL_GRACE,
            first_seen: Mutex::default(),
            rdt_ready: Mutex::default(),
            partial_view: false,
            seen_groups: Mutex::default(),
        }
    }
}

impl Resctrl {
    /// A plugin that sees only some of the node's pods (`--selector`): it removes no group of a
    /// pod it does not see.
    pub fn with_partial_view(partial_view: bool) -> Resctrl {
        Resctrl { partial_view, ..Default::default() }
    }

    /// The plugin's name (koordlet's).
    pub const NAME: &'static str = "Resctrl";

    /// The plugin with another removal grace period (tests: zero).
    pub fn with_grace(grace: Duration) -> Resctrl {
        Resctrl { grace, ..Default::default() }
    }

    /// The group of a pod: `koordlet-<pod uid>`.
    pub fn group(pod: &PodContext) -> String {
        format!("{GROUP_PREFIX}{}", pod.uid)
    }

    /// Creates, fills and updates the group of one annotated pod.
    fn apply_pod(
        &self,
        fs: &dyn ResctrlFs,
        root: &std::path::Path,
        cbm: u64,
        ids: &[i64],
        pod: &PodState,
        annotation: &str,
    ) -> anyhow::Result<()> {
        let config = schemata::parse(annotation)?;
        let text = schemata::compute(&config, cbm, ids, &fs.vendor());
        let group = Self::group(&pod.pod);
        if fs.create_group(&group)? {
            tracing::info!(pod = %pod.pod.key(), group, "resctrl: group created");
        }
        self.first_seen.lock().unwrap_or_else(|e| e.into_inner()).entry(group.clone()).or_insert_with(Instant::now);
        if !text.is_empty() && !schemata::holds(&fs.read_schemata(&group)?, &text) {
            fs.write_schemata(&group, &text)?;
            tracing::info!(pod = %pod.pod.key(), group, schemata = %text.trim_end().replace('\n', " "), "resctrl: schemata written");
        }
        let current = fs.tasks(&group)?;
        let mut threads = BTreeSet::new();
        for dir in pod.containers.iter().filter_map(|c| c.cgroup_dir.as_deref()) {
            match cgroup_procs::threads(root, dir) {
                Ok(t) => threads.extend(t),
                Err(e) => tracing::debug!(pod = %pod.pod.key(), "resctrl: no threads: {e}"),
            }
        }
        let mut added = 0;
        for tid in threads.difference(&current) {
            match fs.add_task(&group, *tid) {
                Ok(()) => added += 1,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) || e.to_string().contains("No such process") => {}
                Err(e) => anyhow::bail!("resctrl group {group}: {e}"),
            }
        }
        if added > 0 {
            tracing::debug!(pod = %pod.pod.key(), group, added, "resctrl: threads moved into the group");
        }
        Ok(())
    }
}

impl Plugin for Resctrl {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PostStartContainer]
    }

    /// PreRunPodSandbox: checks the annotation (koordlet's `RegisterApp` fails on bad JSON).
    fn pod(&self, _stage: Stage, pod: &PodContext, _rules: &Rules) -> anyhow::Result<Change> {
        if let Some(a) = pod.annotations.get(ANNOTATION) {
            schemata::parse(a)?;
        }
        Ok(Change::default())
    }

    /// PreCreateContainer: the RDT class `koordlet-<pod uid>` when the pod's group exists on the
    /// kernel's resctrl mount (module documentation).
    fn container(&self, stage: Stage, c: &ContainerContext, _rules: &Rules) -> anyhow::Result<Change> {
        let ready = self.rdt_ready.lock().unwrap_or_else(|e| e.into_inner()).contains(&c.pod.uid);
        if stage != Stage::PreCreateContainer || !ready || !c.pod.annotations.contains_key(ANNOTATION) {
            return Ok(Change::default());
        }
        Ok(Change { rdt_class: Some(Self::group(&c.pod)), ..Default::default() })
    }

    fn node(&self, pods: &NodePods<'_>, _rules: &Rules, host: &Host) -> anyhow::Result<()> {
        let Some(fs) = host.resctrl.as_deref() else {
            return Ok(());
        };
        let cbm_text = fs.cbm_mask()?;
        let cbm = u64::from_str_radix(&cbm_text, 16)
            .map_err(|_| anyhow::anyhow!("resctrl cbm_mask {cbm_text:?} is not hex"))?;
        let ids = schemata::cache_ids(&fs.root_schemata()?);
        let mut errors = Vec::new();
        let mut wanted = BTreeSet::new();
        let mut ready = BTreeSet::new();
        for pod in pods {
            let Some(annotation) = pod.pod.annotations.get(ANNOTATION) else { continue };
            wanted.insert(Self::group(&pod.pod));
            match self.apply_pod(fs, &host.paths.cgroup_root, cbm, &ids, pod, annotation) {
                Ok(()) if fs.is_kernel() => {
                    ready.insert(pod.pod.uid.clone());
                }
                Ok(()) => {}
                Err(e) => errors.push(format!("{}: {e:#}", pod.pod.key())),
            }
        }
        *self.rdt_ready.lock().unwrap_or_else(|e| e.into_inner()) = ready;
        let now = Instant::now();
        let mut first_seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen_groups = self.seen_groups.lock().unwrap_or_else(|e| e.into_inner());
        seen_groups.extend(wanted.iter().cloned());
        let candidates: Vec<String> = if self.partial_view {
            seen_groups.iter().filter(|g| !wanted.contains(*g)).cloned().collect()
        } else {
            fs.groups()?
        };
        for group in candidates.into_iter().filter(|g| g.starts_with(GROUP_PREFIX) && !wanted.contains(g)) {
            let seen = *first_seen.entry(group.clone()).or_insert(now);
            if now.duration_since(seen) < self.grace {
                continue;
            }
            match fs.remove_group(&group) {
                Ok(()) => {
                    first_seen.remove(&group);
                    seen_groups.remove(&group);
                    tracing::info!(group, "resctrl: group of a pod that is gone removed");
                }
                Err(e) => errors.push(format!("removing unused group {group}: {e}")),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", errors.join("; "))
        }
    }

    /// koordlet's PreRemoveRunPodSandbox: the pod's group is removed at once.
    fn pod_removed(&self, pod: &PodState, _rules: &Rules, host: &Host) -> anyhow::Result<()> {
        let (Some(fs), true) = (host.resctrl.as_deref(), pod.pod.annotations.contains_key(ANNOTATION)) else {
            return Ok(());
        };
        let group = Self::group(&pod.pod);
        self.rdt_ready.lock().unwrap_or_else(|e| e.into_inner()).remove(&pod.pod.uid);
        fs.remove_group(&group)?;
        self.first_seen.lock().unwrap_or_else(|e| e.into_inner()).remove(&group);
        self.seen_groups.lock().unwrap_or_else(|e| e.into_inner()).remove(&group);
        tracing::info!(pod = %pod.pod.key(), group, "resctrl: group removed with its pod");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
