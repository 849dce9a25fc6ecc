//! CPUSet: each container's `cpuset.cpus`, and the CFS quota of pods bound to CPUs.
//!
//! # Source
//!
//! koordlet v1.8.0's `cpuset` hook: `pkg/koordlet/runtimehooks/hooks/cpuset/cpuset.go`
//! `SetContainerCPUSet`, and `rule.go` `getContainerCPUSet` for everything after the pod's own
//! cpuset.
//!
//! # Inputs and outputs
//!
//! | | |
//! |---|---|
//! | inputs, pod | label `koordinator.sh/qosClass`; annotation `scheduling.koordinator.sh/resource-status` (`cpuset`, `numaNodeResources`); the cgroup parent (Kubernetes QoS, [`crate::context::KubeQos`]) |
//! | inputs, node | the NodeResourceTopology's LS share pools, SYSTEM QoS cpuset and kubelet CPU manager policy ([`crate::rules::topology`]) |
//! | outputs, container | `container_resources.cpuset_cpus` (and `cpu_quota` −1 for bound pods) in the hook answer; NRI: the adjustment's or update's `cpu.cpus`; standalone: the container's `cpuset.cpus` (and CFS quota) |
//! | outputs, pod | LSE/LSR pods with a cpuset: the pod cgroup's CFS quota −1, written by runtime-hooks |
//! | stages | PreRunPodSandbox (pod quota), PreCreateContainer, PreUpdateContainerResources |
//! | rules | `cpuset.enable`, `cpuset.unsetCfsQuota` (off with `--disable-unset-cpu-quota`), `cpuset.topology` |
//!
//! # The annotation
//!
//! The annotation is what koord-scheduler writes (koordinator `apis/extension/numa_aware.go`
//! `ResourceStatus`), JSON with CPU lists in the kernel's format:
//!
//! ```json
//! {"cpuset": "2-3", "numaNodeResources": [{"node": 0, "resources": {"cpu": "2", "memory": "4Gi"}}]}
//! ```
//!
//! JSON `null` is read as absent, as Go reads it.
//!
//! # Which cpuset a container gets
//!
//! Per container, the first of these that applies ([`container_cpuset`]), in koordlet's order:
//!
//! 1. **Bound** — LSE and LSR pods with a non-empty `cpuset`: that list in the kernel's canonical
//!    form (whitespace removed, ascending, merged ranges: `" 0 - 1 "` → `0-1`; an invalid list is
//!    the plugin's failure, under the plugin failure policy), and with `unsetCfsQuota` (default)
//!    `cpu_quota` = −1: bound CPUs need no CFS throttling (koordlet unsets it unless
//!    `--disable-unset-cpu-quota`). The pod cgroup's quota is unset too. Other pods' `cpuset` is
//!    ignored and they go on down this list (see *Where koordlet differs* below).
//! 2. **NUMA share pools** — pods whose `numaNodeResources` allocate CPU on a NUMA node (a
//!    non-zero `cpu`, or a `kubernetes.io/batch-cpu` above 0, on at least one entry), except BE
//!    pods: the LS share pools of the NUMA nodes the entries name (every entry, in their order).
//!    A pod author choosing NUMA nodes this way only narrows its own pod to share pools.
//! 3. **SYSTEM** — SYSTEM pods, when the node has a SYSTEM QoS cpuset: that cpuset.
//! 4. **LS** — LS pods: all LS share pools.
//! 5. **BestEffort** — pods whose cgroup parent is BestEffort's (BE pods among them): `""`,
//!    "clear": the container runs on whatever its parent may use, not on a cpuset kubelet's
//!    static CPU manager passed. The proxy (like koord's) applies `""` as clear; NRI, which reads
//!    `""` as "no change", gets the pod cgroup's CPUs spelled out ([`crate::nri::convert`]);
//!    standalone mode writes the parent's CPUs on cgroup v1 (v1 has no "inherit") and `""` on
//!    v2.
//! 6. **static policy** — kubelet's CPU manager policy `static`: unchanged (kubelet placed
//!    Guaranteed and Burstable containers itself).
//! 7. **none policy** — anything else (policy `none` or unknown): all LS share pools.
//!
//! A union of share pools is one canonical CPU list (`0-3` and `8-11` → `0-3,8-11`).
//!
//! # Empty pools
//!
//! **Empty pools are "unchanged", never "clear"** (steps 2, 4 and 7); only step 5 clears.
//! koordlet joins whatever pools there are; with none (no NodeResourceTopology, or one without
//! `node.koordinator.sh/cpu-shared-pools`, or no pool for the pod's NUMA nodes) its answer is
//! `""`. Through a proxy, that clears the cpuset kubelet gave the container: under the static
//! policy an LS container would then run on every CPU of its parent, the exclusive CPUs of
//! LSE/LSR and Guaranteed pods included. koordlet's own reconciler and NRI path write nothing
//! for `""`. We answer "unchanged" in every mode, which is what koordlet's reconciler and NRI
//! do and what is safe through a proxy.
//!
//! No NodeResourceTopology at all is the same as one without annotations (our rules do not tell
//! them apart): steps 2, 4 and 7 leave containers unchanged, step 5 still clears BestEffort
//! pods. koordlet, without any NodeResourceTopology, has no rule and stops after step 1; in a
//! Koordinator cluster koordlet itself creates the node's NodeResourceTopology, so that case is
//! a node still starting.
//!
//! # Where koordlet differs
//!
//! * **Bound pods**: koordlet takes the `cpuset` of any pod; we take it only from LSE and LSR
//!   pods (their class from the pod label, [`crate::context::QosClass::of`]), deliberately: the
//!   annotation is the scheduler's, but a pod author can write it into the pod at creation, and
//!   any pod could then pin itself to CPUs of its choosing, exclusive ones included.
//! * **BE pods and NUMA share pools**: koordlet gives BE pods the BE share pools in step 2 only
//!   with its `BECPUManager` feature gate, off by default; we have no feature gates and follow
//!   the default, so BE pods go on down.
//!
//! Not done (koordlet does): the BE share pools (`BECPUManager` feature gate, off by default);
//! the cpuset of pod sandbox containers (koordlet's reconciler sets them like containers; ours
//! sees only the containers the runtime lists) and of host applications (`getHostAppCpuset`).
//!
//! # Errors
//!
//! Failures (under the plugin failure policy, naming the annotation and the value): the
//! annotation is not JSON of the shape above (for any pod that has it, as in koordlet, whose
//! `GetResourceStatus` fails the same way), or an LSE/LSR pod's `cpuset` is not a valid CPU list.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Deserializer};

use crate::cgroup::{format_cpu_list, parse_cpu_list, CgroupValue};
use crate::change::{Change, Resources};
use crate::context::{ContainerContext, KubeQos, PodContext, QosClass};
use crate::plugin::{Plugin, Stage};
use crate::plugins::batch_resource::BATCH_CPU;
use crate::quantity::Quantity;
use crate::rules::host_app::HostApplication;
use crate::rules::topology::{CpuSharedPool, Topology};
use crate::rules::Rules;

/// Pod annotation with the scheduler's CPU decision.
pub const RESOURCE_STATUS: &str = "scheduling.koordinator.sh/resource-status";

/// kubelet's CPU manager policy that places Guaranteed containers on exclusive CPUs itself
/// (koordinator `apis/extension/numa_aware.go` `KubeletCPUManagerPolicyStatic`).
pub const KUBELET_POLICY_STATIC: &str = "static";

/// The annotation's JSON (the parts read; other keys are ignored).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    /// CPU list, kernel format (`"0-3,8"`); `""` when absent.
    #[serde(default, deserialize_with = "null_default")]
    pub cpuset: String,
    /// The NUMA nodes the pod is constrained to, with what it was allocated on each.
    #[serde(default, deserialize_with = "null_default")]
    pub numa_node_resources: Vec<NumaNodeResource>,
}

/// One entry of `numaNodeResources`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct NumaNodeResource {
    /// NUMA node id.
    #[serde(default)]
    pub node: i32,
    /// Resources allocated on it by name (`cpu` in CPUs, `kubernetes.io/batch-cpu` in
    /// milli-CPUs, …); a `null` quantity is zero.
    #[serde(default, deserialize_with = "null_default")]
    pub resources: BTreeMap<String, Option<Quantity>>,
}

impl NumaNodeResource {
    /// CPU is allocated on this node: a non-zero `cpu`, or a `kubernetes.io/batch-cpu` above 0
    /// (koordlet `cpuset/rule.go` `getContainerCPUSet`: "there can be numa allocation without
    /// cpu").
    pub fn allocates_cpu(&self) -> bool {
        let get = |name: &str| self.resources.get(name).copied().flatten();
        get("cpu").is_some_and(|q| !q.is_zero()) || get(BATCH_CPU).is_some_and(|q| q.value() > 0)
    }
}

impl ResourceStatus {
    /// CPU is allocated per NUMA node on at least one entry.
    pub fn is_numa_aware(&self) -> bool {
        self.numa_node_resources.iter().any(NumaNodeResource::allocates_cpu)
    }
}

/// `null` as the type's default, as Go's `encoding/json` leaves a field alone for `null`.
fn null_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The pod's `scheduling.koordinator.sh/resource-status`, `None` when absent (any pod).
///
/// Errors: the annotation is not a JSON object of [`ResourceStatus`]'s shape (the message names
/// the annotation). JSON `null` is an empty status, as Go reads it.
pub fn resource_status(pod: &PodContext) -> anyhow::Result<Option<ResourceStatus>> {
    let Some(text) = pod.annotations.get(RESOURCE_STATUS) else {
        return Ok(None);
    };
    let parse = || -> anyhow::Result<ResourceStatus> {
        let value: serde_json::Value = serde_json::from_str(text)?;
        match value {
            // Go's json.Unmarshal leaves the struct alone for `null`.
            serde_json::Value::Null => Ok(ResourceStatus::default()),
            serde_json::Value::Object(_) => Ok(ResourceStatus::deserialize(value)?),
            other => bail!("not a JSON object: {other}"),
        }
    };
    parse().map(Some).with_context(|| format!("pod annotation {RESOURCE_STATUS}"))
}

/// The cpuset the scheduler gave an LSE/LSR pod, in the kernel's canonical form (ascending,
/// merged ranges: `" 6-7, 0 - 1,4 "` → `"0-1,4,6-7"`, see [`parse_cpu_list`] and
/// [`format_cpu_list`]); `None` for other pods and when absent, empty or only whitespace.
///
/// Errors (the plugin's failure, under the plugin failure policy; the message names the
/// annotation and the value): the annotation is not JSON of [`ResourceStatus`]'s shape (any
/// pod), or an LSE/LSR pod's `cpuset` is not a valid CPU list (empty elements, descending
/// ranges, non-numbers, CPUs ≥ 8192).
pub fn bound_cpuset(pod: &PodContext) -> anyhow::Result<Option<String>> {
    bound_of(pod, resource_status(pod)?.as_ref())
}

fn bound_of(pod: &PodContext, status: Option<&ResourceStatus>) -> anyhow::Result<Option<String>> {
    let Some(status) = status.filter(|_| matches!(pod.qos(), QosClass::Lse | QosClass::Lsr)) else {
        return Ok(None);
    };
    let cpus = match parse_cpu_list(&status.cpuset) {
        Ok(cpus) => cpus,
        Err(e) => bail!("pod annotation {RESOURCE_STATUS}: cpuset {:?}: {e}", status.cpuset),
    };
    Ok(Some(format_cpu_list(&cpus)).filter(|c| !c.is_empty()))
}

/// The cpuset of a container of `pod` on a node with `topology`: `Some(list)` to set,
/// `Some("")` to clear (BestEffort pods), `None` to leave unchanged — steps 1 to 7 of the
/// module documentation, koordlet v1.8.0's `SetContainerCPUSet` and `getContainerCPUSet`
/// (`hooks/cpuset/cpuset.go`, `rule.go`), with empty pools as "unchanged".
///
/// `be_cpu_manager`: koordlet's `BECPUManager` gate (NUMA-aware BE pods get the BE share pools).
///
/// Errors: as [`bound_cpuset`].
pub fn container_cpuset(pod: &PodContext, topology: &Topology, be_cpu_manager: bool) -> anyhow::Result<Option<String>> {
    let status = resource_status(pod)?;
    if let Some(cpus) = bound_of(pod, status.as_ref())? {
        return Ok(Some(cpus));
    }
    Ok(rule_cpuset(pod, status.as_ref(), topology, be_cpu_manager))
}

/// Steps 2 to 7 (koordlet's `getContainerCPUSet`).
fn rule_cpuset(
    pod: &PodContext,
    status: Option<&ResourceStatus>,
    topology: &Topology,
    be_cpu_manager: bool,
) -> Option<String> {
    let class = pod.qos();
    // NUMA-aware: the pools of the pod's NUMA nodes; BE pods the BE pools, under BECPUManager only.
    if let Some(status) = status.filter(|s| s.is_numa_aware() && (class != QosClass::Be || be_cpu_manager)) {
        let pools = if class == QosClass::Be { &topology.be_share_pools } else { &topology.share_pools };
        let numa = status.numa_node_resources.iter().flat_map(|n| pools.iter().filter(move |p| p.node == n.node));
        return union(numa);
    }
    if class == QosClass::System {
        if let Some(cpus) = &topology.system_qos_cpuset {
            return Some(cpus.clone());
        }
    }
    if class == QosClass::Ls {
        return union(topology.share_pools.iter());
    }
    if pod.kube_qos() == KubeQos::BestEffort {
        return Some(String::new());
    }
    if topology.kubelet_policy.policy == KUBELET_POLICY_STATIC {
        return None;
    }
    union(topology.share_pools.iter())
}

/// The pools' CPUs as one canonical list; `None` when they have none (see "empty pools" in the
/// module documentation). The pools' lists were checked when the topology was parsed; one that
/// does not parse all the same is left out.
fn union<'a>(pools: impl Iterator<Item = &'a CpuSharedPool>) -> Option<String> {
    let cpus: BTreeSet<u32> = pools.filter_map(|p| parse_cpu_list(&p.cpuset).ok()).flatten().collect();
    Some(format_cpu_list(&cpus)).filter(|c| !c.is_empty())
}

/// The CPUSet plugin.
#[derive(Debug, Default)]
pub struct CpuSet {
    /// koordlet's `BECPUManager` gate: NUMA-aware BE pods get the BE share pools of their NUMA
    /// nodes instead of being cleared.
    pub be_cpu_manager: bool,
}

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

    /// koordlet's `UnsetPodCPUQuota`: CFS quota −1 for pods bound to CPUs.
    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.cpuset.enable || !rules.cpuset.unset_cfs_quota || bound_cpuset(pod)?.is_none() {
            return Ok(Change::default());
        }
        Ok(Change { pod_cgroup: vec![CgroupValue::CfsQuota(-1)], ..Default::default() })
    }

    /// koordlet's `SetHostAppCPUSet`: an LS host application runs on all LS share pools; no
    /// pools known leaves its cpuset unchanged (an empty list would leave it no CPU).
    ///
    /// Errors: a class other than LS ("only LS is supported for host application", koordlet's
    /// `getHostAppCpuset`).
    fn host_app(&self, app: &HostApplication, rules: &Rules) -> anyhow::Result<Vec<CgroupValue>> {
        if !rules.cpuset.enable {
            return Ok(Vec::new());
        }
        if app.qos != QosClass::Ls {
            anyhow::bail!(
                "host application {:?} is {}: only LS is supported for a host application's cpuset",
                app.name,
                app.qos
            );
        }
        let cpus = rules.cpuset.topology.all_share_pool_cpus();
        Ok(if cpus.is_empty() { Vec::new() } else { vec![CgroupValue::CpusetCpus(cpus)] })
    }

    /// koordlet's `SetContainerCPUSetAndUnsetCFS`.
    fn container(&self, _stage: Stage, c: &ContainerContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.cpuset.enable {
            return Ok(Change::default());
        }
        let status = resource_status(&c.pod)?;
        let resources = if let Some(cpus) = bound_of(&c.pod, status.as_ref())? {
            Resources {
                cpuset_cpus: Some(cpus),
                cpu_quota: rules.cpuset.unset_cfs_quota.then_some(-1),
                ..Default::default()
            }
        } else if let Some(cpus) = rule_cpuset(&c.pod, status.as_ref(), &rules.cpuset.topology, self.be_cpu_manager) {
            Resources { cpuset_cpus: Some(cpus), ..Default::default() }
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
    use crate::rules::topology::KubeletCpuManagerPolicy;

    const GUARANTEED: &str = "/kubepods/pod1";
    const BURSTABLE: &str = "/kubepods/burstable/pod1";
    const BESTEFFORT: &str = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";

    fn container(class: &str, status: Option<&str>) -> ContainerContext {
        in_parent(class, status, "")
    }

    fn in_parent(class: &str, status: Option<&str>, parent: &str) -> ContainerContext {
        let annotations = status.map(|s| [(RESOURCE_STATUS.to_string(), s.to_string())].into()).unwrap_or_default();
        let pod = PodContext {
            labels: [(QOS_CLASS_KEY.to_string(), class.to_string())].into(),
            annotations,
            cgroup_parent: parent.into(),
            ..Default::default()
        };
        ContainerContext { pod, name: "main".into(), ..Default::default() }
    }

    fn run(c: &ContainerContext, rules: &Rules) -> Resources {
        CpuSet::default().container(Stage::PreCreateContainer, c, rules).unwrap().resources
    }

    /// What the container's cpuset becomes: `Some` list (`""` = clear) or `None` (unchanged).
    fn cpus(c: &ContainerContext, rules: &Rules) -> Option<String> {
        let r = run(c, rules);
        let want = container_cpuset(&c.pod, &rules.cpuset.topology, false).unwrap();
        assert_eq!(r.cpuset_cpus, want, "the plugin answers what container_cpuset says");
        r.cpuset_cpus
    }

    fn pool(node: i32, cpuset: &str) -> CpuSharedPool {
        CpuSharedPool { socket: node, node, cpuset: cpuset.into() }
    }

    /// Two NUMA nodes with LS pools 0-3 and 8-11, BE pools 0-5 and 8-13, SYSTEM CPUs 14-15.
    fn node(policy: &str) -> Rules {
        let mut rules = Rules::default();
        rules.cpuset.topology = Topology {
            share_pools: vec![pool(0, "0-3"), pool(1, "8-11")],
            be_share_pools: vec![pool(0, "0-5"), pool(1, "8-13")],
            kubelet_policy: KubeletCpuManagerPolicy { policy: policy.into(), ..Default::default() },
            system_qos_cpuset: Some("14-15".into()),
        };
        rules
    }

    fn numa(entries: &str) -> String {
        format!(r#"{{"numaNodeResources": {entries}}}"#)
    }

    #[test]
    fn lse_and_lsr_get_their_cpuset_and_no_quota() {
        for class in ["LSE", "LSR"] {
            let r = run(
                &container(class, Some(r#"{"cpuset": "2-3", "numaNodeResources": [{"node": 0}]}"#)),
                &Rules::default(),
            );
            assert_eq!(
                r,
                Resources { cpuset_cpus: Some("2-3".into()), cpu_quota: Some(-1), ..Default::default() },
                "{class}"
            );
        }
        let mut rules = Rules::default();
        rules.cpuset.unset_cfs_quota = false;
        assert_eq!(run(&container("LSR", Some(r#"{"cpuset": "1"}"#)), &rules).cpu_quota, None);
        let pod = container("LSR", Some(r#"{"cpuset": "1"}"#)).pod;
        assert_eq!(
            CpuSet::default().pod(Stage::PreRunPodSandbox, &pod, &Rules::default()).unwrap().pod_cgroup,
            vec![CgroupValue::CfsQuota(-1)]
        );
        assert!(CpuSet::default().pod(Stage::PreRunPodSandbox, &pod, &rules).unwrap().is_empty());
        // Bound comes first: before NUMA pools, the static policy, a BestEffort parent.
        let bound = r#"{"cpuset": "5", "numaNodeResources": [{"node": 1, "resources": {"cpu": "1"}}]}"#;
        for rules in [node("none"), node("static")] {
            for parent in [GUARANTEED, BESTEFFORT] {
                let r = run(&in_parent("LSE", Some(bound), parent), &rules);
                assert_eq!((r.cpuset_cpus.as_deref(), r.cpu_quota), (Some("5"), Some(-1)), "{parent}");
            }
        }
    }

    /// Steps 2 to 7 of the module documentation, on a node with pools.
    #[test]
    fn koordlets_order_on_a_node_with_pools() {
        let none = node("none");
        let some = |s: &str| Some(s.to_string());
        // 2. NUMA share pools: every entry's node, in their order, for any class but BE.
        let node1 = numa(r#"[{"node": 1, "resources": {"cpu": "2"}}]"#);
        for class in ["LS", "LSR", "SYSTEM", ""] {
            assert_eq!(cpus(&in_parent(class, Some(&node1), BURSTABLE), &none), some("8-11"), "{class:?}");
            assert_eq!(cpus(&in_parent(class, Some(&node1), BESTEFFORT), &node("static")), some("8-11"), "{class:?}");
        }
        let both = numa(r#"[{"node": 1, "resources": {"memory": "1Gi"}}, {"node": 0, "resources": {"cpu": "500m"}}]"#);
        assert_eq!(
            cpus(&container("LS", Some(&both)), &none),
            some("0-3,8-11"),
            "entries without CPU still name a node"
        );
        let batch = numa(r#"[{"node": 0, "resources": {"kubernetes.io/batch-cpu": "1000"}}]"#);
        assert_eq!(cpus(&container("LS", Some(&batch)), &none), some("0-3"));
        // No CPU on any node: not NUMA-aware.
        for entries in [
            r#"[{"node": 1, "resources": {"cpu": "0", "memory": "1Gi"}}]"#,
            r#"[{"node": 1, "resources": {"kubernetes.io/batch-cpu": "0"}}]"#,
            r#"[{"node": 1}]"#,
            "[]",
        ] {
            assert_eq!(cpus(&container("LS", Some(&numa(entries))), &none), some("0-3,8-11"), "{entries}");
        }
        // BE pods skip the NUMA step (BECPUManager off): cleared as BestEffort; with the gate on
        // they get the BE share pools of their NUMA nodes.
        assert_eq!(cpus(&in_parent("BE", Some(&node1), BESTEFFORT), &none), some(""));
        let be = CpuSet { be_cpu_manager: true };
        let be_cpus =
            |c: &ContainerContext| be.container(Stage::PreCreateContainer, c, &none).unwrap().resources.cpuset_cpus;
        assert_eq!(be_cpus(&in_parent("BE", Some(&node1), BESTEFFORT)), some("8-13"));
        assert_eq!(be_cpus(&in_parent("BE", None, BESTEFFORT)), some(""), "not NUMA-aware: cleared");
        assert_eq!(be_cpus(&in_parent("LS", Some(&node1), BURSTABLE)), some("8-11"), "LS pods keep the LS pools");
        // 3. SYSTEM: the SYSTEM cpuset, if the node has one.
        assert_eq!(cpus(&in_parent("SYSTEM", None, BESTEFFORT), &none), some("14-15"));
        let mut no_system = node("none");
        no_system.cpuset.topology.system_qos_cpuset = None;
        assert_eq!(cpus(&in_parent("SYSTEM", None, BURSTABLE), &no_system), some("0-3,8-11"), "on to the none policy");
        assert_eq!(cpus(&in_parent("SYSTEM", None, BESTEFFORT), &no_system), some(""));
        // 4. LS: all pools, whatever the parent and policy.
        for parent in [GUARANTEED, BURSTABLE, BESTEFFORT] {
            assert_eq!(cpus(&in_parent("LS", None, parent), &node("static")), some("0-3,8-11"), "{parent}");
        }
        // 5. BestEffort: cleared, BE or not.
        for class in ["BE", "", "LSR", "bogus"] {
            assert_eq!(cpus(&in_parent(class, None, BESTEFFORT), &node("static")), some(""), "{class:?}");
        }
        // 6. static policy: unchanged; 7. none (or unknown) policy: all pools.
        for class in ["", "LSR", "LSE", "BE"] {
            for parent in [GUARANTEED, BURSTABLE, ""] {
                let c = in_parent(class, None, parent);
                assert_eq!(cpus(&c, &node("static")), None, "{class:?} {parent}");
                for policy in ["none", "", "whatever"] {
                    assert_eq!(cpus(&c, &node(policy)), some("0-3,8-11"), "{class:?} {parent} {policy}");
                }
            }
        }
        // Only the bound step unsets the CFS quota; no step asks for pod values.
        let r = run(&container("LS", None), &none);
        assert_eq!(r, Resources { cpuset_cpus: some("0-3,8-11"), ..Default::default() });
        assert!(CpuSet::default()
            .pod(Stage::PreRunPodSandbox, &container("LS", Some(&node1)).pod, &none)
            .unwrap()
            .is_empty());
    }

    /// A cpuset an LS, BE or unclassified pod's author wrote is not taken: the pod gets what its
    /// class gets.
    #[test]
    fn only_lse_and_lsr_are_bound() {
        let rules = node("none");
        for (class, parent, want) in [
            ("LS", GUARANTEED, Some("0-3,8-11")),
            ("", BURSTABLE, Some("0-3,8-11")),
            ("BE", BESTEFFORT, Some("")),
            ("SYSTEM", "", Some("14-15")),
        ] {
            let c = in_parent(class, Some(r#"{"cpuset": "1"}"#), parent);
            let r = run(&c, &rules);
            assert_eq!((r.cpuset_cpus.as_deref(), r.cpu_quota), (want, None), "{class:?}");
            assert!(CpuSet::default().pod(Stage::PreRunPodSandbox, &c.pod, &rules).unwrap().is_empty(), "{class:?}");
        }
        for class in ["LS", "BE", "", "SYSTEM", "lsr"] {
            assert_ne!(
                run(&container(class, Some(r#"{"cpuset": "1"}"#)), &Rules::default()).cpuset_cpus.as_deref(),
                Some("1")
            );
        }
        // Nor does an annotation claiming LSR on a pod without the label.
        let mut c = in_parent("", Some(r#"{"cpuset": "1"}"#), GUARANTEED);
        c.pod.labels.clear();
        c.pod.annotations.insert(QOS_CLASS_KEY.into(), "LSR".into());
        assert_eq!(run(&c, &node("static")), Resources::default());
        assert!(CpuSet::default().pod(Stage::PreRunPodSandbox, &c.pod, &rules).unwrap().is_empty());
    }

    /// With no pools (no NodeResourceTopology, or one without them, or none for the pod's NUMA
    /// nodes) the pool steps leave the container alone instead of answering koordlet's `""`;
    /// only BestEffort pods are cleared.
    #[test]
    fn empty_pools_leave_containers_unchanged() {
        let defaults = Rules::default();
        for (class, status) in [
            ("LS", None),
            ("LS", Some(r#"{"cpuset": "2-3"}"#.to_string())),
            ("LSR", None),
            ("LSR", Some(r#"{"numaNodeResources": []}"#.to_string())),
            ("", None),
            ("SYSTEM", None),
            ("LS", Some(numa(r#"[{"node": 0, "resources": {"cpu": "1"}}]"#))),
        ] {
            for parent in [GUARANTEED, BURSTABLE, ""] {
                assert!(
                    run(&in_parent(class, status.as_deref(), parent), &defaults).is_empty(),
                    "{class:?} {status:?} {parent}"
                );
            }
        }
        assert_eq!(cpus(&in_parent("BE", None, BESTEFFORT), &defaults).as_deref(), Some(""));
        assert_eq!(cpus(&in_parent("", None, BESTEFFORT), &defaults).as_deref(), Some(""));
        // Pools, but none on the pod's NUMA node; or pools with no CPUs.
        let node7 = numa(r#"[{"node": 7, "resources": {"cpu": "1"}}]"#);
        assert!(run(&container("LS", Some(&node7)), &node("none")).is_empty());
        let mut hollow = node("none");
        hollow.cpuset.topology.share_pools = vec![pool(0, ""), pool(1, "")];
        assert!(run(&container("LS", None), &hollow).is_empty());
        assert!(run(&in_parent("", None, BURSTABLE), &hollow).is_empty());
        // Off: nothing at all.
        let mut off = node("none");
        off.cpuset.enable = false;
        for c in
            [in_parent("BE", None, BESTEFFORT), container("LS", None), container("LSR", Some(r#"{"cpuset": "1"}"#))]
        {
            assert!(CpuSet::default().container(Stage::PreCreateContainer, &c, &off).unwrap().is_empty());
            assert!(CpuSet::default().pod(Stage::PreRunPodSandbox, &c.pod, &off).unwrap().is_empty());
        }
    }

    #[test]
    fn pools_are_joined_canonically() {
        let mut rules = node("none");
        rules.cpuset.topology.share_pools = vec![pool(1, "8-11"), pool(0, "0-3"), pool(2, "4-7")];
        assert_eq!(cpus(&container("LS", None), &rules).as_deref(), Some("0-11"));
        let twice =
            numa(r#"[{"node": 2, "resources": {"cpu": "1"}}, {"node": 1, "resources": {"cpu": "1"}}, {"node": 2}]"#);
        assert_eq!(cpus(&container("LS", Some(&twice)), &rules).as_deref(), Some("4-11"));
    }

    #[test]
    fn null_is_absent() {
        let rules = node("none");
        for status in [
            r#"{"cpuset": null, "numaNodeResources": null}"#,
            r#"{"numaNodeResources": [{"node": 1, "resources": null}]}"#,
            r#"{"numaNodeResources": [{"node": 1, "resources": {"cpu": null}}]}"#,
        ] {
            assert_eq!(cpus(&container("LS", Some(status)), &rules).as_deref(), Some("0-3,8-11"), "{status}");
            assert!(run(&container("LSR", Some(status)), &Rules::default()).is_empty(), "{status}");
        }
    }

    #[test]
    fn bad_annotations_are_errors() {
        for bad in ["{", r#"{"cpuset": "3-1"}"#, r#"{"cpuset": 5}"#] {
            let err = CpuSet::default()
                .container(Stage::PreCreateContainer, &container("LSE", Some(bad)), &Rules::default())
                .unwrap_err();
            assert!(format!("{err:#}").contains(RESOURCE_STATUS), "{err:#}");
        }
        // Annotations that are not JSON of the shape fail any pod, as in koordlet.
        for bad in [
            "{",
            "[]",
            "7",
            r#"{"numaNodeResources": {}}"#,
            r#"{"numaNodeResources": [{"node": "x"}]}"#,
            &numa(r#"[{"node": 0, "resources": {"cpu": "lots"}}]"#),
        ] {
            for class in ["LS", "BE", ""] {
                let c = in_parent(class, Some(bad), BESTEFFORT);
                let err = format!(
                    "{:#}",
                    CpuSet::default().container(Stage::PreCreateContainer, &c, &node("none")).unwrap_err()
                );
                assert!(err.contains(RESOURCE_STATUS), "{class:?} {bad}: {err}");
                assert!(
                    CpuSet::default().pod(Stage::PreRunPodSandbox, &c.pod, &node("none")).is_err(),
                    "{class:?} {bad}"
                );
            }
        }
        // Another class's cpuset is not read, so not checked.
        assert_eq!(cpus(&container("LS", Some(r#"{"cpuset": "3-1"}"#)), &node("none")).as_deref(), Some("0-3,8-11"));
        for (value, why) in [
            ("0,,1", "empty element"),
            ("1,", "empty element"),
            ("3-1", "descending"),
            ("x", "not a CPU"),
            ("0-8192", "range"),
        ] {
            let status = format!(r#"{{"cpuset": "{value}"}}"#);
            for c in [container("LSR", Some(&status)), container("LSE", Some(&status))] {
                let err = format!(
                    "{:#}",
                    CpuSet::default().container(Stage::PreCreateContainer, &c, &Rules::default()).unwrap_err()
                );
                assert!(
                    err.contains(RESOURCE_STATUS) && err.contains(&format!("{value:?}")) && err.contains(why),
                    "{value:?}: {err}"
                );
                let err = format!(
                    "{:#}",
                    CpuSet::default().pod(Stage::PreRunPodSandbox, &c.pod, &Rules::default()).unwrap_err()
                );
                assert!(err.contains(RESOURCE_STATUS), "{err}");
            }
        }
    }

    #[test]
    fn cpusets_are_normalized_to_the_kernel_form() {
        for (given, canonical) in
            [(" 0 - 1 ", "0-1"), ("6-7, 0 -1,4", "0-1,4,6-7"), ("3,1,2", "1-3"), ("0-1,1-2", "0-2"), (r"\t5\n", "5")]
        {
            let status = format!(r#"{{"cpuset": "{given}"}}"#);
            let r = run(&container("LSR", Some(&status)), &Rules::default());
            assert_eq!(r.cpuset_cpus.as_deref(), Some(canonical), "{given:?}");
            assert_eq!(r.cpu_quota, Some(-1));
        }
        // Only whitespace: no cpuset, as if absent (on down the steps).
        assert!(run(&container("LSR", Some(r#"{"cpuset": "  "}"#)), &Rules::default()).is_empty());
        assert_eq!(
            run(&container("LSR", Some(r#"{"cpuset": "  "}"#)), &node("none")).cpuset_cpus.as_deref(),
            Some("0-3,8-11")
        );
        assert!(CpuSet::default()
            .pod(Stage::PreRunPodSandbox, &container("LSR", Some(r#"{"cpuset": " "}"#)).pod, &Rules::default())
            .unwrap()
            .is_empty());
    }
}
