//! GroupIdentity: the pod cgroup's `cpu.bvt_warp_ns` by QoS class (koordlet's `groupidentity`
//! hook).
//!
//! Group identity is a scheduler feature of Alibaba Cloud Linux / Anolis kernels: tasks of a
//! cgroup with a higher `cpu.bvt_warp_ns` preempt lower ones (2 = highest, −1 = lowest, "BE").
//!
//! | | |
//! |---|---|
//! | inputs | pod label `koordinator.sh/qosClass` (never an annotation); the pod cgroup parent (kube QoS for pods without a class) |
//! | output | pod cgroup file `cpu.bvt_warp_ns` (v1: `<root>/cpu/<pod>/cpu.bvt_warp_ns`), written by runtime-hooks itself; in standalone mode also the kubelet QoS directories |
//! | stages | PreRunPodSandbox |
//! | rules | `groupIdentity` |
//!
//! Value (koordlet's `bvtRule`, from the NodeSLO's `resourceQOSStrategy.<class>.cpuQOS`, see
//! [`crate::rules::node_slo`]): LSE, LSR → `lsr`; LS → `ls`; BE → `be`; a pod without a
//! Koordinator class by its kube QoS: Guaranteed → `guaranteed_pod`, Burstable → `ls`,
//! BestEffort → `be`. QoS directories: `kubepods` → `none` (0), `kubepods/burstable` → `ls`,
//! `kubepods/besteffort` → `be`. A class whose CPU QoS is off has 0; with none on (koordlet's
//! default: no NodeSLO) everything gets 0.
//!
//! On a kernel without the file (most, including this project's machines) the write is skipped
//! with one log line per process; nothing fails.
//!
//! Not done (koordlet does): the per-pod override annotation for LS pods, the sysctl
//! `kernel.sched_group_identity_enabled`, host applications.

use crate::cgroup::CgroupValue;
use crate::change::Change;
use crate::context::{KubeQos, PodContext, QosClass};
use crate::plugin::{Plugin, Stage};
use crate::rules::Rules;

/// The GroupIdentity plugin.
#[derive(Debug, Default)]
pub struct GroupIdentity;

impl GroupIdentity {
    /// The plugin's name.
    pub const NAME: &'static str = "GroupIdentity";

    /// `cpu.bvt_warp_ns` of a pod.
    pub fn pod_value(qos: QosClass, kube: KubeQos, rules: &Rules) -> i64 {
        let g = &rules.group_identity;
        if !g.enable {
            return 0;
        }
        match qos {
            QosClass::Lse | QosClass::Lsr => g.lsr,
            QosClass::Ls => g.ls,
            QosClass::Be => g.be,
            QosClass::System | QosClass::None => match kube {
                KubeQos::Guaranteed => g.guaranteed_pod,
                KubeQos::Burstable => g.ls,
                KubeQos::BestEffort => g.be,
            },
        }
    }
}

impl Plugin for GroupIdentity {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox]
    }

    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        let value = Self::pod_value(pod.qos(), pod.kube_qos(), rules);
        Ok(Change { pod_cgroup: vec![CgroupValue::BvtWarpNs(value)], ..Default::default() })
    }

    fn kube_qos(&self, qos: KubeQos, rules: &Rules) -> Vec<CgroupValue> {
        let g = &rules.group_identity;
        let v = match (g.enable, qos) {
            (false, _) => 0,
            (true, KubeQos::Guaranteed) => g.none,
            (true, KubeQos::Burstable) => g.ls,
            (true, KubeQos::BestEffort) => g.be,
        };
        vec![CgroupValue::BvtWarpNs(v)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::QOS_CLASS_KEY;

    fn pod(class: Option<&str>, parent: &str) -> PodContext {
        PodContext {
            labels: class.map(|c| [(QOS_CLASS_KEY.to_string(), c.to_string())].into()).unwrap_or_default(),
            cgroup_parent: parent.into(),
            ..Default::default()
        }
    }

    fn bvt(p: &PodContext, rules: &Rules) -> Vec<CgroupValue> {
        GroupIdentity.pod(Stage::PreRunPodSandbox, p, rules).unwrap().pod_cgroup
    }

    /// Every class's CPU QoS on, with koordlet's default values.
    fn all_on() -> Rules {
        let on = serde_json::json!({"cpuQOS": {"enable": true}});
        let spec = serde_json::json!({"resourceQOSStrategy": {"lsrClass": on, "lsClass": on, "beClass": on}});
        Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&spec).unwrap()), None, None)
    }

    #[test]
    fn without_a_node_slo_every_value_is_zero() {
        let r = Rules::default();
        for class in [Some("LSE"), Some("LS"), Some("BE"), None] {
            assert_eq!(bvt(&pod(class, "/kubepods/besteffort/pod1"), &r), vec![CgroupValue::BvtWarpNs(0)], "{class:?}");
        }
        assert_eq!(GroupIdentity.kube_qos(KubeQos::BestEffort, &r), vec![CgroupValue::BvtWarpNs(0)]);
    }

    #[test]
    fn guaranteed_pods_follow_lsr_then_ls() {
        let ls_only = serde_json::json!({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": true, "groupIdentity": 1}}}});
        let r = Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&ls_only).unwrap()), None, None);
        assert_eq!(bvt(&pod(None, "/kubepods/pod1"), &r), vec![CgroupValue::BvtWarpNs(1)]);
        assert_eq!(bvt(&pod(Some("LSR"), "/kubepods/pod1"), &r), vec![CgroupValue::BvtWarpNs(0)], "LSR's CPU QoS is off");
    }

    #[test]
    fn values_by_class_with_koordlet_defaults() {
        let r = all_on();
        for (class, parent, want) in [
            (Some("LSE"), "/kubepods/pod1", 2),
            (Some("LSR"), "/kubepods/pod1", 2),
            (Some("LS"), "/kubepods/burstable/pod1", 2),
            (Some("BE"), "/kubepods/besteffort/pod1", -1),
            (None, "/kubepods/pod1", 2),
            (None, "/kubepods/burstable/pod1", 2),
            (None, "/kubepods/besteffort/pod1", -1),
            (Some("SYSTEM"), "/kubepods/besteffort/pod1", -1),
        ] {
            assert_eq!(bvt(&pod(class, parent), &r), vec![CgroupValue::BvtWarpNs(want)], "{class:?} {parent}");
        }
    }

    #[test]
    fn rules_change_the_values_and_disable_resets_to_zero() {
        let mut r = all_on();
        r.group_identity.be = 0;
        r.group_identity.lsr = 1;
        assert_eq!(bvt(&pod(Some("BE"), ""), &r), vec![CgroupValue::BvtWarpNs(0)]);
        assert_eq!(bvt(&pod(Some("LSR"), ""), &r), vec![CgroupValue::BvtWarpNs(1)]);
        r.group_identity.enable = false;
        assert_eq!(bvt(&pod(Some("LS"), ""), &r), vec![CgroupValue::BvtWarpNs(0)]);
        assert_eq!(GroupIdentity.kube_qos(KubeQos::BestEffort, &r), vec![CgroupValue::BvtWarpNs(0)]);
    }

    #[test]
    fn kube_qos_directories() {
        let r = all_on();
        assert_eq!(GroupIdentity.kube_qos(KubeQos::Guaranteed, &r), vec![CgroupValue::BvtWarpNs(0)]);
        assert_eq!(GroupIdentity.kube_qos(KubeQos::Burstable, &r), vec![CgroupValue::BvtWarpNs(2)]);
        assert_eq!(GroupIdentity.kube_qos(KubeQos::BestEffort, &r), vec![CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(GroupIdentity.stages(), &[Stage::PreRunPodSandbox]);
    }
}
