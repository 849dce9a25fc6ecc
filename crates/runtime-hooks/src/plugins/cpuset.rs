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
//! Only `cpuset` is read (other keys are ignored). It is applied to LSE and LSR pods only (their
//! class from the pod label, [`crate::context::QosClass::of`]). koordlet takes it for any pod;
//! we do not, deliberately: the annotation is the scheduler's, but a pod author can write it
//! into the pod at creation, and any pod could then pin itself to CPUs of its choosing. Per
//! container:
//!
//! * LSE and LSR pods with a non-empty `cpuset`: `cpuset_cpus` = that list in the kernel's
//!   canonical form (whitespace removed, ascending, merged ranges: `" 0 - 1 "` → `0-1`; an
//!   invalid list is the plugin's failure, under the plugin failure policy), and with
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

use crate::cgroup::{format_cpu_list, parse_cpu_list, CgroupValue};
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

/// The cpuset the scheduler gave an LSE/LSR pod, in the kernel's canonical form (ascending,
/// merged ranges: `" 6-7, 0 - 1,4 "` → `"0-1,4,6-7"`, see [`parse_cpu_list`] and
/// [`format_cpu_list`]); `None` for other pods and when absent, empty or only whitespace.
///
/// Errors (the plugin's failure, under the plugin failure policy; the message names the
/// annotation and the value): the annotation is not JSON, or `cpuset` is not a string holding a
/// valid CPU list (empty elements, descending ranges, non-numbers, CPUs ≥ 8192).
pub fn bound_cpuset(pod: &PodContext) -> anyhow::Result<Option<String>> {
    if !matches!(pod.qos(), QosClass::Lse | QosClass::Lsr) {
        return Ok(None);
    }
    let Some(text) = pod.annotations.get(RESOURCE_STATUS) else {
        return Ok(None);
    };
    let status: ResourceStatus = serde_json::from_str(text).with_context(|| format!("pod annotation {RESOURCE_STATUS}"))?;
    let cpus = match parse_cpu_list(&status.cpuset) {
        Ok(cpus) => cpus,
        Err(e) => bail!("pod annotation {RESOURCE_STATUS}: cpuset {:?}: {e}", status.cpuset),
    };
    Ok(Some(format_cpu_list(&cpus)).filter(|c| !c.is_empty()))
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
        // A cpuset a pod author wrote into an LS, BE or unclassified pod pins nothing.
        for class in ["LS", "BE", "", "SYSTEM", "lsr"] {
            let c = container(class, Some(r#"{"cpuset": "1"}"#));
            assert_ne!(run(&c, &rules).cpuset_cpus.as_deref(), Some("1"), "{class:?}");
            assert!(CpuSet.pod(Stage::PreRunPodSandbox, &c.pod, &rules).unwrap().is_empty(), "{class:?}");
        }
        // Nor does an annotation claiming LSR on a pod without the label.
        let mut c = container("", Some(r#"{"cpuset": "1"}"#));
        c.pod.labels.clear();
        c.pod.annotations.insert(QOS_CLASS_KEY.into(), "LSR".into());
        assert!(run(&c, &rules).is_empty());
        assert!(CpuSet.pod(Stage::PreRunPodSandbox, &c.pod, &rules).unwrap().is_empty());
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
        for (value, why) in
            [("0,,1", "empty element"), ("1,", "empty element"), ("3-1", "descending"), ("x", "not a CPU"), ("0-8192", "range")]
        {
            let status = format!(r#"{{"cpuset": "{value}"}}"#);
            for c in [container("LSR", Some(&status)), container("LSE", Some(&status))] {
                let err = format!("{:#}", CpuSet.container(Stage::PreCreateContainer, &c, &Rules::default()).unwrap_err());
                assert!(err.contains(RESOURCE_STATUS) && err.contains(&format!("{value:?}")) && err.contains(why), "{value:?}: {err}");
                let err = format!("{:#}", CpuSet.pod(Stage::PreRunPodSandbox, &c.pod, &Rules::default()).unwrap_err());
                assert!(err.contains(RESOURCE_STATUS), "{err}");
            }
        }
    }

    #[test]
    fn cpusets_are_normalized_to_the_kernel_form() {
        for (given, canonical) in [(" 0 - 1 ", "0-1"), ("6-7, 0 -1,4", "0-1,4,6-7"), ("3,1,2", "1-3"), ("0-1,1-2", "0-2"), (r"\t5\n", "5")]
        {
            let status = format!(r#"{{"cpuset": "{given}"}}"#);
            let r = run(&container("LSR", Some(&status)), &Rules::default());
            assert_eq!(r.cpuset_cpus.as_deref(), Some(canonical), "{given:?}");
            assert_eq!(r.cpu_quota, Some(-1));
        }
        // Only whitespace: no cpuset, as if absent.
        assert!(run(&container("LSR", Some(r#"{"cpuset": "  "}"#)), &Rules::default()).is_empty());
        assert!(CpuSet
            .pod(Stage::PreRunPodSandbox, &container("LSR", Some(r#"{"cpuset": " "}"#)).pod, &Rules::default())
            .unwrap()
            .is_empty());
    }
}
