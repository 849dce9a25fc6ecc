//! CPUNormalization: an LS (or class-less) pod's CFS quota scaled by the node's CPU
//! normalization ratio (koordlet v1.8.0 `hooks/cpunormalization`, gate `CPUNormalization`).
//!
//! # What it does
//!
//! On a node whose CPUs are faster than the cluster's reference CPU, Koordinator's manager
//! annotates the Node with `node.koordinator.sh/cpu-normalization-ratio` (e.g. `1.5`) and the
//! scheduler counts the node's CPUs in normalized units; a pod's limit of 1 CPU is then 1
//! normalized CPU, i.e. `1 / 1.5` of one of this node's CPUs.
//!
//! | | |
//! |---|---|
//! | inputs | the Node's `node.koordinator.sh/cpu-normalization-ratio` ([`crate::rules::node`]); pod label `koordinator.sh/qosClass`; pod annotation `scheduling.koordinator.sh/resource-status` (a cpuset there makes a class-less pod LSR-like, left alone); the container's CFS quota (µs) as the request carries it (proxy: `container_resources.cpu_quota`; NRI: `linux.resources.cpu.quota`; reconciler: from the API server's pod spec limits) |
//! | output | the container's CFS quota: ⌈quota ÷ ratio⌉ µs ([`scale_quota`]); pod level: the pod's quota where the mode knows it (the reconciler with the API server's pod) |
//! | stages | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//! | pods | QoS LS and none (no `koordinator.sh/qosClass`); not LSE/LSR/BE/SYSTEM, not a class-less pod with a scheduler cpuset |
//!
//! # When nothing changes
//!
//! Nothing changes when the ratio is absent or ≤ 1 (koordlet's rule is enabled for any ratio
//! but scales only above 1), when the quota is unlimited (≤ 0) or unknown. As in koordlet the
//! pod-level quota is scaled only where the pod's resources are known: koordlet's proxy and NRI
//! modes carry none for a pod ("currently only reconciler mode provides Resources").
//!
//! # Order with BatchResource
//!
//! BatchResource also writes CFS quotas. The two act on disjoint pods (BatchResource on BE pods,
//! this on LS and class-less ones), so neither overrides the other; koordlet registers its
//! plugins in Go map order, i.e. in no fixed order, and relies on that.

use crate::cgroup::CgroupValue;
use crate::change::{Change, Resources};
use crate::context::{ContainerContext, PodContext, QosClass};
use crate::plugin::{Plugin, Stage};
use crate::plugins::batch_resource::scale_quota;
use crate::plugins::cpuset::resource_status;
use crate::rules::Rules;

/// The CPUNormalization plugin.
#[derive(Debug, Default)]
pub struct CpuNormalization;

impl CpuNormalization {
    /// The plugin's name (koordlet's gate name).
    pub const NAME: &'static str = "CPUNormalization";

    /// koordlet's `isPodCPUShare`: LS pods and pods without a class, except a class-less pod
    /// the scheduler gave a cpuset (it is treated as LSR). An annotation that does not parse
    /// counts as no cpuset, as koordlet ignores that error here.
    pub fn applies_to(pod: &PodContext) -> bool {
        match pod.qos() {
            QosClass::Ls => true,
            QosClass::None => resource_status(pod).ok().flatten().is_none_or(|s| s.cpuset.is_empty()),
            _ => false,
        }
    }

    /// The scaled quota for `quota` (µs), `None` when nothing changes: no ratio above 1, or an
    /// unlimited quota.
    pub fn scaled(quota: i64, rules: &Rules) -> Option<i64> {
        let ratio = rules.cpu_normalization.ratio?;
        (quota > 0 && ratio > 1.0).then(|| scale_quota(quota, Some(ratio)))
    }
}

impl Plugin for CpuNormalization {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources]
    }

    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        let quota = pod.resources.as_ref().map(|r| r.cpu_quota).filter(|_| Self::applies_to(pod));
        Ok(match quota.and_then(|q| Self::scaled(q, rules)) {
            Some(q) => Change { pod_cgroup: vec![CgroupValue::CfsQuota(q)], ..Default::default() },
            None => Change::default(),
        })
    }

    fn container(&self, _stage: Stage, c: &ContainerContext, rules: &Rules) -> anyhow::Result<Change> {
        let quota = c.resources.as_ref().map(|r| r.cpu_quota).filter(|_| Self::applies_to(&c.pod));
        Ok(match quota.and_then(|q| Self::scaled(q, rules)) {
            Some(q) => {
                Change { resources: Resources { cpu_quota: Some(q), ..Default::default() }, ..Default::default() }
            }
            None => Change::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::QOS_CLASS_KEY;
    use crate::plugins::cpuset::RESOURCE_STATUS;
    use hook_api::v1alpha1::LinuxContainerResources;

    fn rules(ratio: Option<f64>) -> Rules {
        let mut r = Rules::default();
        r.cpu_normalization.ratio = ratio;
        r
    }

    fn container(class: Option<&str>, quota: i64, status: Option<&str>) -> ContainerContext {
        let mut pod = PodContext::default();
        if let Some(c) = class {
            pod.labels.insert(QOS_CLASS_KEY.into(), c.into());
        }
        if let Some(s) = status {
            pod.annotations.insert(RESOURCE_STATUS.into(), s.into());
        }
        let resources = LinuxContainerResources { cpu_quota: quota, cpu_period: 100_000, ..Default::default() };
        ContainerContext { pod, name: "main".into(), resources: Some(resources), ..Default::default() }
    }

    fn quota(c: &ContainerContext, rules: &Rules) -> Option<i64> {
        CpuNormalization.container(Stage::PreCreateContainer, c, rules).unwrap().resources.cpu_quota
    }

    #[test]
    fn scales_ls_and_classless_quotas_up_to_the_next_microsecond() {
        assert_eq!(quota(&container(Some("LS"), 200_000, None), &rules(Some(1.5))), Some(133_334));
        assert_eq!(quota(&container(None, 150_000, None), &rules(Some(1.5))), Some(100_000));
    }

    #[test]
    fn leaves_other_classes_unlimited_quotas_and_small_ratios_alone() {
        let r = rules(Some(1.5));
        for class in ["LSR", "LSE", "BE", "SYSTEM"] {
            assert_eq!(quota(&container(Some(class), 200_000, None), &r), None, "{class}");
        }
        assert_eq!(quota(&container(Some("LS"), -1, None), &r), None, "unlimited");
        assert_eq!(quota(&container(Some("LS"), 200_000, None), &rules(Some(1.0))), None);
        assert_eq!(quota(&container(Some("LS"), 200_000, None), &rules(Some(0.8))), None);
        assert_eq!(quota(&container(Some("LS"), 200_000, None), &rules(None)), None);
        let mut unknown = container(Some("LS"), 200_000, None);
        unknown.resources = None;
        assert_eq!(quota(&unknown, &r), None, "quota unknown");
    }

    #[test]
    fn a_classless_pod_with_a_cpuset_is_lsr_like() {
        let r = rules(Some(2.0));
        assert_eq!(quota(&container(None, 200_000, Some(r#"{"cpuset":"2-3"}"#)), &r), None);
        assert_eq!(quota(&container(None, 200_000, Some(r#"{"cpuset":""}"#)), &r), Some(100_000));
        assert_eq!(quota(&container(None, 200_000, Some("not json")), &r), Some(100_000), "koordlet ignores the error");
    }

    #[test]
    fn pod_level_only_where_the_pod_resources_are_known() {
        let r = rules(Some(2.0));
        let mut pod = container(Some("LS"), 0, None).pod;
        assert!(CpuNormalization.pod(Stage::PreRunPodSandbox, &pod, &r).unwrap().is_empty());
        pod.resources = Some(LinuxContainerResources { cpu_quota: 400_000, ..Default::default() });
        let change = CpuNormalization.pod(Stage::PreRunPodSandbox, &pod, &r).unwrap();
        assert_eq!(change.pod_cgroup, vec![CgroupValue::CfsQuota(200_000)]);
    }
}
