//! GroupIdentity: the pod cgroup's `cpu.bvt_warp_ns` by QoS class (koordlet's `groupidentity`
//! hook).
//!
//! # What it does
//!
//! Group identity is a scheduler feature of Alibaba Cloud Linux / Anolis kernels: tasks of a
//! cgroup with a higher `cpu.bvt_warp_ns` preempt lower ones (2 = highest, −1 = lowest, "BE").
//!
//! | | |
//! |---|---|
//! | inputs | pod label `koordinator.sh/qosClass` (never an annotation); the pod cgroup parent (kube QoS for pods without a class); with group identity off, the kernel's `kernel.sched_group_identity_enabled` (whether anything is written) |
//! | output | pod cgroup file `cpu.bvt_warp_ns` (v1: `<root>/cpu/<pod>/cpu.bvt_warp_ns`), written by runtime-hooks itself; in standalone mode also the kubelet QoS directories |
//! | stages | PreRunPodSandbox |
//! | rules | `groupIdentity` |
//!
//! # Values
//!
//! Source: koordlet's `bvtRule`, from the NodeSLO's `resourceQOSStrategy.<class>.cpuQOS`, see
//! [`crate::rules::node_slo`].
//!
//! * Pods: LSE, LSR → `lsr`; LS → `ls`; BE → `be`; a pod without a Koordinator class by its kube
//!   QoS: Guaranteed → `guaranteed_pod`, Burstable → `ls`, BestEffort → `be`.
//! * QoS directories: `kubepods` → `none` (0), `kubepods/burstable` → `ls`, `kubepods/besteffort` →
//!   `be`.
//! * A class whose CPU QoS is off has 0; with none on (koordlet's default: no NodeSLO)
//!   everything gets 0 — or nothing at all, see below.
//! * Host applications (the NodeSLO's `hostApplications`, koordlet's `SetHostAppBvtValue`): their
//!   directory gets their class's pod value, written by the reconciler.
//!
//! # No NodeSLO, or group identity off: when nothing is written
//!
//! Source: koordlet v1.8.0 `hooks/groupidentity/interceptor.go` `prepare`, used by
//! `SetPodBvtValue`, `SetKubeQOSBvtValue` and `SetHostAppBvtValue` (and the same test in
//! `rule.go` `ruleUpdateCb`); `bvt.go` `isSysctlEnabled`.
//!
//! koordlet's rule is never nil: `Object()` starts it as an empty rule (group identity off, every
//! value 0 — `NoneCPUQOS`), which is what it keeps until a NodeSLO arrives and what a NodeSLO
//! with every class's CPU QoS off gives. With such a rule koordlet writes no `cpu.bvt_warp_ns`
//! **only when the kernel has the switch [`SYSCTL`] and it is not 1** (or cannot be read): "no
//! need to update cgroups if both rule and sysctl disabled". Where the kernel has no switch
//! (older Anolis, group identity always on) or the switch is 1 (e.g. left on after the NodeSLO
//! turned group identity off), koordlet writes the 0s, resetting what an earlier rule set; so do
//! we. The switch is read at each call, through the [`Sysctl`] the plugin was built with (the
//! binary: `/proc/sys`; none: taken as absent).
//!
//! # Per-pod override
//!
//! Source: koordlet `interceptor.go` `SetPodBvtValue`, annotation [`POD_CPU_QOS`]
//! `koordinator.sh/cpuQOS`, JSON `{"enable": bool, "groupIdentity": -1..=2}`.
//!
//! On an **LS** pod only, `groupIdentity` replaces the class's value, and an `enable` that is not
//! `true` makes it 0. LSE/LSR/BE pods cannot change theirs.
//!
//! # Kernel switch
//!
//! Source: koordlet `rule.go` `ruleUpdateCb` → `initSysctl`. With group identity on, on kernels
//! that have [`SYSCTL`] `kernel.sched_group_identity_enabled` (Anolis ≥ 26.4), node-level work
//! turns core scheduling off (`kernel.sched_core` = 0, where present: the two features exclude
//! each other) and then sets it to 1; only values that differ are written, each change logged.
//! With group identity off the switches are left as they are, as koordlet leaves them. Kernels
//! without the parameter (older Anolis: the feature is on with `cpu.bvt_warp_ns`) need nothing.
//!
//! # Errors
//!
//! An annotation value that does not parse, or a group identity outside −1..=2, is this plugin's
//! failure for that pod.
//!
//! On a kernel without the file (most, including this project's machines) the write is skipped
//! with one log line per process; nothing fails.
//!
//! # Where koordlet differs
//!
//! Unlike koordlet, the annotation is not read at all on pods other than LS: koordlet fails the
//! hook for a BE pod whose annotation does not parse, which under the `Ignore` policy would leave
//! that pod without its −1 — a pod author must not be able to switch the BE policy off that way.

use std::sync::Arc;

use anyhow::Context as _;
use serde::Deserialize;

use crate::cgroup::CgroupValue;
use crate::change::Change;
use crate::context::{KubeQos, PodContext, QosClass};
use crate::host::sysctl::Sysctl;
use crate::host::Host;
use crate::plugin::{NodePods, Plugin, Stage};
use crate::rules::host_app::HostApplication;
use crate::rules::Rules;

/// Pod annotation with the pod's own CPU QoS (koordinator `apis/slo/v1alpha1/pod.go`
/// `AnnotationPodCPUQoS`).
pub const POD_CPU_QOS: &str = "koordinator.sh/cpuQOS";

/// The JSON of [`POD_CPU_QOS`] (koordinator's `CPUQOSCfg`; other keys are ignored).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodCpuQos {
    /// Group identity on for this pod; anything but `true` (absent included) means 0.
    pub enable: Option<bool>,
    /// The pod's `cpu.bvt_warp_ns`, −1..=2.
    pub group_identity: Option<i64>,
}

/// The pod's [`POD_CPU_QOS`], `None` when absent.
///
/// Errors: not a JSON object of that shape, or a group identity outside −1..=2 (koordinator's
/// `GetPodCPUQoSConfigByAttr`: "bad group identity value").
pub fn pod_cpu_qos(pod: &PodContext) -> anyhow::Result<Option<PodCpuQos>> {
    let Some(text) = pod.annotations.get(POD_CPU_QOS) else { return Ok(None) };
    let cfg: PodCpuQos = serde_json::from_str(text).with_context(|| format!("pod annotation {POD_CPU_QOS}"))?;
    if let Some(v) = cfg.group_identity.filter(|v| !(-1..=2).contains(v)) {
        anyhow::bail!("pod annotation {POD_CPU_QOS}: groupIdentity {v} is outside -1..=2");
    }
    Ok(Some(cfg))
}

/// The kernel parameter that switches group identity on (1) or off (0) where it exists
/// (koordlet `util/system/system_resource.go` `SchedGroupIdentityEnabledFileName`).
pub const SYSCTL: &str = "kernel.sched_group_identity_enabled";

/// The kernel parameter of core scheduling (`SchedCoreFileName`), turned off before group
/// identity is turned on.
pub const SCHED_CORE_SYSCTL: &str = "kernel.sched_core";

/// Node-level work: the kernel switches (see the module documentation).
///
/// Errors: reading or writing a parameter failed (naming it).
pub fn switch_kernel(sysctl: &dyn Sysctl, rules: &Rules) -> anyhow::Result<()> {
    let get = |name: &str| sysctl.get(name).with_context(|| format!("reading {name}"));
    if !rules.group_identity.enable || get(SYSCTL)?.is_none() {
        return Ok(());
    }
    for (name, want) in [(SCHED_CORE_SYSCTL, "0"), (SYSCTL, "1")] {
        match get(name)? {
            Some(v) if v != want => {
                sysctl.set(name, want).with_context(|| format!("setting {name} to {want}"))?;
                tracing::info!(plugin = GroupIdentity::NAME, "kernel parameter {name} set from {v} to {want}");
            }
            _ => {}
        }
    }
    Ok(())
}

/// The GroupIdentity plugin.
#[derive(Default)]
pub struct GroupIdentity {
    /// The kernel's parameters, where [`SYSCTL`] is read in the hook path (see the module
    /// documentation); `None`: not read, taken as absent.
    sysctl: Option<Arc<dyn Sysctl>>,
}

impl std::fmt::Debug for GroupIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupIdentity").field("sysctl", &self.sysctl.is_some()).finish()
    }
}

impl GroupIdentity {
    /// The plugin's name.
    pub const NAME: &'static str = "GroupIdentity";

    /// The plugin reading the kernel's group identity switch through `sysctl`.
    pub fn with_sysctl(sysctl: Arc<dyn Sysctl>) -> GroupIdentity {
        GroupIdentity { sysctl: Some(sysctl) }
    }

    /// The plugin as the binary builds it: the switch read below `options.proc_sys`, unless
    /// that is empty.
    pub fn from_options(options: &super::options::PluginOptions) -> GroupIdentity {
        if options.proc_sys.as_os_str().is_empty() {
            return GroupIdentity::default();
        }
        GroupIdentity::with_sysctl(Arc::new(crate::host::sysctl::ProcSys::new(&options.proc_sys)))
    }

    /// koordlet's `prepare`: whether `cpu.bvt_warp_ns` values are written at all — always with
    /// group identity on in the rules; with it off only when the kernel has no switch or it is
    /// 1 (see the module documentation).
    pub fn writes(&self, rules: &Rules) -> bool {
        if rules.group_identity.enable {
            return true;
        }
        let Some(sysctl) = &self.sysctl else { return true };
        match sysctl.get(SYSCTL) {
            Ok(None) => true,
            Ok(Some(v)) => v == "1",
            Err(e) => {
                tracing::debug!(
                    plugin = Self::NAME,
                    "reading {SYSCTL}: {e}; no cpu.bvt_warp_ns written (koordlet's prepare)"
                );
                false
            }
        }
    }

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
        if !self.writes(rules) {
            return Ok(Change::default());
        }
        let mut value = Self::pod_value(pod.qos(), pod.kube_qos(), rules);
        if pod.qos() == QosClass::Ls {
            if let Some(cfg) = pod_cpu_qos(pod)? {
                value = match cfg.enable {
                    Some(true) => cfg.group_identity.unwrap_or(value),
                    _ => 0,
                };
            }
        }
        Ok(Change { pod_cgroup: vec![CgroupValue::BvtWarpNs(value)], ..Default::default() })
    }

    fn kube_qos(&self, qos: KubeQos, rules: &Rules) -> Vec<CgroupValue> {
        if !self.writes(rules) {
            return Vec::new();
        }
        let g = &rules.group_identity;
        let v = match (g.enable, qos) {
            (false, _) => 0,
            (true, KubeQos::Guaranteed) => g.none,
            (true, KubeQos::Burstable) => g.ls,
            (true, KubeQos::BestEffort) => g.be,
        };
        vec![CgroupValue::BvtWarpNs(v)]
    }

    /// koordlet's `SetHostAppBvtValue`: the class's pod value (LSE/LSR → `lsr`, LS → `ls`,
    /// BE → `be`), 0 for other classes or with group identity off.
    fn host_app(&self, app: &HostApplication, rules: &Rules) -> anyhow::Result<Vec<CgroupValue>> {
        if !self.writes(rules) {
            return Ok(Vec::new());
        }
        let g = &rules.group_identity;
        let v = match app.qos {
            _ if !g.enable => 0,
            QosClass::Lse | QosClass::Lsr => g.lsr,
            QosClass::Ls => g.ls,
            QosClass::Be => g.be,
            QosClass::System | QosClass::None => 0,
        };
        Ok(vec![CgroupValue::BvtWarpNs(v)])
    }

    fn node(&self, _pods: &NodePods<'_>, rules: &Rules, host: &Host) -> anyhow::Result<()> {
        match &host.sysctl {
            Some(sysctl) => switch_kernel(sysctl.as_ref(), rules),
            None => Ok(()),
        }
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
        GroupIdentity::default().pod(Stage::PreRunPodSandbox, p, rules).unwrap().pod_cgroup
    }

    /// Every class's CPU QoS on, with koordlet's default values.
    fn all_on() -> Rules {
        let on = serde_json::json!({"cpuQOS": {"enable": true}});
        let spec = serde_json::json!({"resourceQOSStrategy": {"lsrClass": on, "lsClass": on, "beClass": on}});
        Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&spec).unwrap()), None, None)
    }

    /// koordlet's `prepare` with its empty starting rule (no NodeSLO) or a NodeSLO with group
    /// identity off: nothing written where the kernel's switch is 0; every value 0 where it is
    /// 1 or the kernel has none (older Anolis) — and likewise with no switch read at all.
    #[test]
    fn without_a_node_slo_every_value_is_zero() {
        use crate::host::sysctl::ProcSys;
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("kernel")).unwrap();
        let gi = GroupIdentity::with_sysctl(Arc::new(ProcSys::new(t.path())));
        let app = HostApplication {
            name: "a".into(),
            qos: QosClass::Be,
            base: crate::rules::host_app::HostAppBase::CgroupRoot,
            path: "a".into(),
        };
        let off = serde_json::json!({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": false}}}});
        let slo_off =
            Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&off).unwrap()), None, None);
        for (switch, written) in [(None, true), (Some("1"), true), (Some("0"), false)] {
            if let Some(v) = switch {
                std::fs::write(t.path().join("kernel/sched_group_identity_enabled"), v).unwrap();
            }
            let want = |v: CgroupValue| if written { vec![v] } else { vec![] };
            for r in [Rules::default(), slo_off.clone()] {
                for class in [Some("LSE"), Some("LS"), Some("BE"), None] {
                    let p = pod(class, "/kubepods/besteffort/pod1");
                    let got = gi.pod(Stage::PreRunPodSandbox, &p, &r).unwrap().pod_cgroup;
                    assert_eq!(got, want(CgroupValue::BvtWarpNs(0)), "switch {switch:?}, {class:?}");
                    assert_eq!(bvt(&p, &r), vec![CgroupValue::BvtWarpNs(0)], "no switch read: written");
                }
                assert_eq!(gi.kube_qos(KubeQos::BestEffort, &r), want(CgroupValue::BvtWarpNs(0)), "switch {switch:?}");
                assert_eq!(gi.host_app(&app, &r).unwrap(), want(CgroupValue::BvtWarpNs(0)), "switch {switch:?}");
            }
            // With group identity on in the rules, the switch does not matter (koordlet turns it on).
            assert_eq!(
                gi.pod(Stage::PreRunPodSandbox, &pod(Some("BE"), ""), &all_on()).unwrap().pod_cgroup,
                vec![CgroupValue::BvtWarpNs(-1)]
            );
        }
    }

    #[test]
    fn guaranteed_pods_follow_lsr_then_ls() {
        let ls_only =
            serde_json::json!({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": true, "groupIdentity": 1}}}});
        let r = Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&ls_only).unwrap()), None, None);
        assert_eq!(bvt(&pod(None, "/kubepods/pod1"), &r), vec![CgroupValue::BvtWarpNs(1)]);
        assert_eq!(
            bvt(&pod(Some("LSR"), "/kubepods/pod1"), &r),
            vec![CgroupValue::BvtWarpNs(0)],
            "LSR's CPU QoS is off"
        );
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
        assert_eq!(GroupIdentity::default().kube_qos(KubeQos::BestEffort, &r), vec![CgroupValue::BvtWarpNs(0)]);
    }

    #[test]
    fn an_ls_pod_may_override_its_value_and_no_other_pod_can() {
        let r = all_on();
        let with = |class: &str, a: &str| {
            let mut p = pod(Some(class), "/kubepods/burstable/pod1");
            p.annotations.insert(POD_CPU_QOS.into(), a.into());
            GroupIdentity::default().pod(Stage::PreRunPodSandbox, &p, &r).map(|c| c.pod_cgroup)
        };
        assert_eq!(with("LS", r#"{"enable": true, "groupIdentity": -1}"#).unwrap(), vec![CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(with("LS", r#"{"enable": true}"#).unwrap(), vec![CgroupValue::BvtWarpNs(2)], "the class's value");
        assert_eq!(with("LS", r#"{"groupIdentity": -1}"#).unwrap(), vec![CgroupValue::BvtWarpNs(0)], "not enabled: 0");
        assert_eq!(with("LS", r#"{"enable": false, "groupIdentity": 2}"#).unwrap(), vec![CgroupValue::BvtWarpNs(0)]);
        let bad = with("LS", r#"{"enable": true, "groupIdentity": 3}"#).unwrap_err().to_string();
        assert!(bad.contains(POD_CPU_QOS) && bad.contains("groupIdentity 3"), "{bad}");
        assert!(with("LS", "{").unwrap_err().to_string().contains(POD_CPU_QOS));
        // BE and LSR pods keep their class's value whatever the annotation says, parseable or not.
        assert_eq!(with("BE", r#"{"enable": true, "groupIdentity": 2}"#).unwrap(), vec![CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(with("BE", "{").unwrap(), vec![CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(with("LSR", r#"{"enable": false}"#).unwrap(), vec![CgroupValue::BvtWarpNs(2)]);
    }

    /// koordlet's order: core scheduling off, then group identity on; nothing when off or when
    /// the kernel has no switch.
    #[test]
    fn the_kernel_switch_follows_the_rule() {
        use crate::host::sysctl::ProcSys;
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("kernel")).unwrap();
        let sysctl = ProcSys::new(t.path());
        let file = |name: &str| std::fs::read_to_string(t.path().join("kernel").join(name)).ok();
        // No switch in this kernel: nothing written, nothing created.
        std::fs::write(t.path().join("kernel/sched_core"), "1").unwrap();
        switch_kernel(&sysctl, &all_on()).unwrap();
        assert_eq!(file("sched_core").as_deref(), Some("1"));
        assert_eq!(file("sched_group_identity_enabled"), None);
        // With it: off → core scheduling off and group identity on.
        std::fs::write(t.path().join("kernel/sched_group_identity_enabled"), "0").unwrap();
        switch_kernel(&sysctl, &Rules::default()).unwrap();
        assert_eq!(file("sched_group_identity_enabled").as_deref(), Some("0"), "rule off: left alone");
        switch_kernel(&sysctl, &all_on()).unwrap();
        assert_eq!(
            (file("sched_core").as_deref(), file("sched_group_identity_enabled").as_deref()),
            (Some("0"), Some("1"))
        );
        // Through the plugin's node-level work, with a Host.
        std::fs::write(t.path().join("kernel/sched_group_identity_enabled"), "0").unwrap();
        let host = Host { sysctl: Some(std::sync::Arc::new(sysctl)), ..Default::default() };
        GroupIdentity::default().node(&NodePods::given(&[]), &all_on(), &host).unwrap();
        assert_eq!(file("sched_group_identity_enabled").as_deref(), Some("1"));
    }

    #[test]
    fn host_applications_get_their_class_value() {
        use crate::rules::host_app::{HostAppBase, HostApplication};
        let app = |qos| HostApplication { name: "a".into(), qos, base: HostAppBase::CgroupRoot, path: "a".into() };
        let r = all_on();
        for (qos, want) in [(QosClass::Lsr, 2), (QosClass::Ls, 2), (QosClass::Be, -1), (QosClass::None, 0)] {
            assert_eq!(
                GroupIdentity::default().host_app(&app(qos), &r).unwrap(),
                vec![CgroupValue::BvtWarpNs(want)],
                "{qos:?}"
            );
        }
        assert_eq!(
            GroupIdentity::default().host_app(&app(QosClass::Be), &Rules::default()).unwrap(),
            vec![CgroupValue::BvtWarpNs(0)]
        );
    }

    #[test]
    fn kube_qos_directories() {
        let r = all_on();
        assert_eq!(GroupIdentity::default().kube_qos(KubeQos::Guaranteed, &r), vec![CgroupValue::BvtWarpNs(0)]);
        assert_eq!(GroupIdentity::default().kube_qos(KubeQos::Burstable, &r), vec![CgroupValue::BvtWarpNs(2)]);
        assert_eq!(GroupIdentity::default().kube_qos(KubeQos::BestEffort, &r), vec![CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(GroupIdentity::default().stages(), &[Stage::PreRunPodSandbox]);
    }
}
