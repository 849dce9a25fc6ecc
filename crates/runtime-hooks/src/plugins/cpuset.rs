//! CPUSet: the cpuset of LSE/LSR containers from the scheduler's decision, and BE containers on
//! the shared pool (koordlet's `cpuset` hook, the part that needs no node topology).
//!
//! | | |
//! |---|---|
//! | inputs | pod label `koordinator.sh/qosClass`; pod annotation `scheduling.koordinator.sh/resource-status` |
//! | outputs, container | `container_resources.cpuset_cpus` (and `cpu_quota` −1) in the hook answer; standalone: the container's `cpuset.cpus` (and CFS quota) |
//! | outputs, pod | LSE/LSR pods with a cpuset: the pod cgroup's CFS quota −1, written by runtime-hooks |
//! | stages | PreRunPodSandbox (pod quota), PreCreateContainer, PreUpdateContainerResources |
//! | rules | `cpuset.enable`, `cpuset.unsetCfsQuota` |
//!
//! The annotation is what koord-scheduler writes for LSE/LSR pods (koordinator
//! `apis/extension` `ResourceStatus`), JSON with the CPU list in the kernel's format:
//!
//! ```json
//! {"cpuset": "2-3", "numaNodeResources": [{"node": 0, "resources": {"cpu": "2"}}]}
//! ```
//!
//! Only `cpuset` is read (other keys are ignored). Per container:
//!
//! * LSE and LSR pods with a non-empty `cpuset`: `cpuset_cpus` = that list, and with
//!   `unsetCfsQuota` (default) `cpu_quota` = −1: bound CPUs need no CFS throttling (koordlet
//!   unsets it unless `--disable-unset-cpu-quota`). The pod cgroup's quota is unset too.
//! * BE pods: `cpuset_cpus` = `""`, which runtime-proxy (like koord) applies as "clear": the
//!   container runs on the shared pool, whatever kubelet's CPU manager set. Standalone mode
//!   writes the parent's CPUs on cgroup v1 (v1 has no "inherit") and `""` on v2.
//! * Everyone else, and LSE/LSR pods without the annotation: unchanged.
//!
//! Not done (koordlet does, from NodeResourceTopology): share pools per NUMA node for LS and
//! unannotated pods, SYSTEM QoS cpusets, the kubelet static-policy exemption.

use anyhow::{bail, Context as _};
use serde::Deserialize;

use crate::cgroup::{parse_cpu_list, CgroupValue};
use crate::change::{Change, Resources};
use crate::context::{ContainerContext, PodContext, QosClass};
use crate::plugin::{Plugin, Stage};
use crate::rules::Rules;

/// Pod annotation with the scheduler's CPU decision.
pub const RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";

/// The annotation's JSON (the part read).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ResourceStatus {
    /// CPU list, kernel format (`"0-3,8"`).
    #[serde(default)]
    pub cpuset: String,
}

/// The cpuset the scheduler gave an LSE/LSR pod; `None` for other pods and when absent or empty.
///
/// Errors: the annotation is not JSON, or `cpuset` is not a CPU list.
pub fn bound_cpuset(pod: &PodContext) -> anyhow::Result<Option<String>> {
    if !matches!(pod.qos(), QosClass::Lse | QosClass::Lsr) {
        return Ok(None);
    }
    let Some(text) = pod.annotations.get(RESOURCE_STATUS) else {
        return Ok(None);
    };
    let status: ResourceStatus = serde_json::from_str(text).with_context(|| format!("pod annotation {RESOURCE_STATUS}"))?;
    let cpuset = status.cpuset.trim();
    if cpuset.is_empty() {
        return Ok(None);
    }
    if let Err(e) = parse_cpu_list(cpuset) {
        bail!("pod annotation {RESOURCE_STATUS}: cpuset {cpuset:?}: {e}");
    }
    Ok(Some(cpuset.to_owned()))
}

/// The CPUSet plugin.
#[derive(Debug, Default)]
pub struct CpuSet;

impl CpuSet {
    /// The plugin's name.
    pub const NAME: &'static str = "CPUSet";
}

impl Plugin for CpuSet {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources]
    }

    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.cpuset.enable || !rules.cpuset.unset_cfs_quota || bound_cpuset(pod)?.is_none() {
            return Ok(Change::default());
        }
        Ok(Change { pod_cgroup: vec![CgroupValue::CfsQuota(-1)], ..Default::default() })
    }

    fn container(&self, _stage: Stage, c: &ContainerContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.cpuset.enable {
            return Ok(Change::default());
        }
        let resources = if c.pod.qos() == QosClass::Be {
            Resources { cpuset_cpus: Some(String::new()), ..Default::default() }
        } else if let Some(cpus) = bound_cpuset(&c.pod)? {
            Resources { cpuset_cpus: Some(cpus), cpu_quota: rules.cpuset.unset_cfs_quota.then_some(-1), ..Default::default() }
        } else {
            return Ok(Change::default());
        };
        Ok(Change { resources, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::QOS_CLASS_KEY;

    fn container(class: &str, status: Option<&str>) -> ContainerContext {
        let annotations = status.map(|s| [(RESOURCE_STATUS.to_string(), s.to_string())].into()).unwrap_or_default();
        let pod = PodContext { labels: [(QOS_CLASS_KEY.to_string(), class.to_string())].into(), annotations, ..Default::default() };
        ContainerContext { pod, name: "main".into(), ..Default::default() }
    }

    fn run(c: &ContainerContext, rules: &Rules) -> Resources {
        CpuSet.container(Stage::PreCreateContainer, c, rules).unwrap().resources
    }

    #[test]
    fn lse_and_lsr_get_their_cpuset_and_no_quota() {
        for class in ["LSE", "LSR"] {
            let r = run(&container(class, Some(r#"{"cpuset": "2-3", "numaNodeResources": [{"node": 0}]}"#)), &Rules::default());
            assert_eq!(r, Resources { cpuset_cpus: Some("2-3".into()), cpu_quota: Some(-1), ..Default::default() }, "{class}");
        }
        let mut rules = Rules::default();
        rules.cpuset.unset_cfs_quota = false;
        assert_eq!(run(&container("LSR", Some(r#"{"cpuset": "1"}"#)), &rules).cpu_quota, None);
        let pod = container("LSR", Some(r#"{"cpuset": "1"}"#)).pod;
        assert_eq!(CpuSet.pod(Stage::PreRunPodSandbox, &pod, &Rules::default()).unwrap().pod_cgroup, vec![CgroupValue::CfsQuota(-1)]);
        assert!(CpuSet.pod(Stage::PreRunPodSandbox, &pod, &rules).unwrap().is_empty());
    }

    #[test]
    fn be_is_cleared_to_the_shared_pool() {
        let r = run(&container("BE", None), &Rules::default());
        assert_eq!(r, Resources { cpuset_cpus: Some(String::new()), ..Default::default() });
        assert!(CpuSet.pod(Stage::PreRunPodSandbox, &container("BE", None).pod, &Rules::default()).unwrap().is_empty());
    }

    #[test]
    fn others_are_left_alone() {
        let rules = Rules::default();
        assert!(run(&container("LS", Some(r#"{"cpuset": "2-3"}"#)), &rules).is_empty(), "LS: share pools need topology");
        assert!(run(&container("LSR", None), &rules).is_empty());
        assert!(run(&container("LSR", Some(r#"{"numaNodeResources": []}"#)), &rules).is_empty());
        assert!(run(&container("", None), &rules).is_empty());
        let mut off = Rules::default();
        off.cpuset.enable = false;
        assert!(run(&container("BE", None), &off).is_empty());
    }

    #[test]
    fn bad_annotations_are_errors() {
        for bad in ["{", r#"{"cpuset": "3-1"}"#, r#"{"cpuset": 5}"#] {
            let err = CpuSet.container(Stage::PreCreateContainer, &container("LSE", Some(bad)), &Rules::default()).unwrap_err();
            assert!(format!("{err:#}").contains(RESOURCE_STATUS), "{err:#}");
        }
    }
}
