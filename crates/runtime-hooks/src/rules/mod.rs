//! Rules: the node-level policy the plugins apply, computed from the objects koordlet's Rule
//! module reads.
//!
//! # Inputs
//!
//! | input | read by | module |
//! |---|---|---|
//! | the node's `NodeSLO` (`slo.koordinator.sh/v1alpha1`) `spec` | GroupIdentity, BatchResource, CoreSched, TCNetworkQoS, TerwayQoS | [`node_slo`], [`core_sched`], [`net_qos`], [`host_app`] |
//! | the node's `NodeResourceTopology` (`topology.node.k8s.io/v1alpha1`) annotations | CPUSet | [`topology`] |
//! | the `Node`'s annotations | BatchResource, CPUNormalization (CPU normalization ratio) | [`node`] |
//! | koordlet's flags: `--disable-unset-cpu-quota` | CPUSet | [`RuleFlags`] |
//!
//! # Sources
//!
//! The inputs come from the cluster ([`crate::cluster`]: watches of the node's objects) or from
//! a rules file ([`file`](mod@file): the same objects as YAML or JSON, what an operator would
//! `kubectl apply`; the old file format of earlier releases is still read, with a deprecation
//! warning). Each input is parsed on its own; one that does not parse is reported and the last
//! good one of that input stays in force ([`store::RulesStore`]).
//!
//! # Defaults
//!
//! Missing inputs and missing fields take koordlet's defaults (`pkg/util/sloconfig`, v1.8.0):
//! koordlet merges the NodeSLO spec over its defaults before its plugins parse it. So with no
//! NodeSLO at all, group identity is off (every `cpu.bvt_warp_ns` 0) and BE pods' CFS quota is
//! set from their batch-cpu limit.

mod compose;
pub mod core_sched;
pub mod field;
pub mod file;
pub mod host_app;
pub mod legacy;
pub mod net_qos;
pub mod node;
pub mod node_slo;
pub mod store;
pub mod topology;

use serde::Serialize;

pub use field::FieldError;
pub use store::{RuleSource, RulesStore};

/// The policy in force: what the plugins read. Built by [`Rules::compose`]; `Default` is
/// koordlet's defaults with no NodeSLO, no NodeResourceTopology and no Node annotation.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rules {
    /// GroupIdentity settings (NodeSLO).
    pub group_identity: GroupIdentityRules,
    /// CPU settings shared by the plugins.
    pub cpu: CpuRules,
    /// BatchResource settings (NodeSLO, Node).
    pub batch_resource: BatchResourceRules,
    /// CPUSet settings (NodeResourceTopology).
    pub cpuset: CpusetRules,
    /// CoreSched settings (NodeSLO).
    pub core_sched: core_sched::CoreSchedRules,
    /// Network QoS settings (NodeSLO), read by TCNetworkQoS and TerwayQoS.
    pub net_qos: net_qos::NetQosRules,
    /// CPUNormalization settings (Node).
    pub cpu_normalization: CpuNormalizationRules,
    /// The NodeSLO's host applications (GroupIdentity, CPUSet).
    pub host_applications: Vec<host_app::HostApplication>,
}

/// CPUNormalization settings (koordlet `hooks/cpunormalization/rule.go`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuNormalizationRules {
    /// The Node's `node.koordinator.sh/cpu-normalization-ratio` (> 0), `None` when absent
    /// (koordlet's −1: the rule is off). Quotas are scaled only when it is above 1.
    pub ratio: Option<f64>,
}

/// Group identity (`cpu.bvt_warp_ns`, −1..=2) per QoS class, as koordlet's `bvtRule` holds
/// them: the values already reflect `cpuQOS.enable` (a class whose CPU QoS is off gets 0).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupIdentityRules {
    /// Any class enabled (koordlet's `bvtRule.enable`). Off: every pod and directory gets 0.
    pub enable: bool,
    /// LSR and LSE pods.
    pub lsr: i64,
    /// LS pods; Burstable pods without a Koordinator class; the `kubepods/burstable` directory.
    pub ls: i64,
    /// BE pods; BestEffort pods without a class; the `kubepods/besteffort` directory.
    pub be: i64,
    /// The Guaranteed QoS directory (`kubepods`): 0 ("must be 0 until the kernel supports it").
    pub none: i64,
    /// Guaranteed pods without a Koordinator class: LSR's value if LSR's CPU QoS is on, else
    /// LS's if LS's is on, else 0.
    pub guaranteed_pod: i64,
}

/// CPU settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuRules {
    /// CFS period in µs for quotas computed from milli-CPU limits. Default 100000 (kubelet's).
    pub cfs_period_us: i64,
}

impl Default for CpuRules {
    fn default() -> Self {
        CpuRules { cfs_period_us: 100_000 }
    }
}

/// BatchResource settings.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchResourceRules {
    /// Off: BE pods are left as kubelet made them. Default on.
    pub enable: bool,
    /// Off: BE CFS quota is −1 (unlimited) whatever the batch-cpu limit. koordlet turns it off
    /// when the NodeSLO's `resourceUsedThresholdWithBE` is enabled with `cpuSuppressPolicy:
    /// cfsQuota` (BE CPU is then limited at the `kubepods-besteffort` level). Default on.
    pub cfs_quota: bool,
    /// The Node's `node.koordinator.sh/cpu-normalization-ratio` (> 0), `None` when absent:
    /// batch-cpu limits are in normalized CPUs and scaled by it.
    pub cpu_normalization_ratio: Option<f64>,
}

impl Default for BatchResourceRules {
    fn default() -> Self {
        BatchResourceRules { enable: true, cfs_quota: true, cpu_normalization_ratio: None }
    }
}

/// CPUSet settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpusetRules {
    /// Off: no cpuset changes. Default on.
    pub enable: bool,
    /// LSE/LSR pods with a cpuset get CFS quota −1 (koordlet's `--disable-unset-cpu-quota=false`).
    /// Default on; off with `--disable-unset-cpu-quota` ([`RuleFlags`]) or the old format's
    /// `cpuset.unsetCfsQuota: false`.
    pub unset_cfs_quota: bool,
    /// The node's CPU pools, from its NodeResourceTopology.
    pub topology: topology::Topology,
}

impl Default for CpusetRules {
    fn default() -> Self {
        CpusetRules { enable: true, unset_cfs_quota: true, topology: topology::Topology::default() }
    }
}

/// The command line's rule inputs: koordlet's flags that change what a plugin does, applied over
/// the rules from every source (defaults, file, cluster), so they combine with NodeSLO-era rule
/// objects. Fixed for the process's life ([`RulesStore::set_flags`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleFlags {
    /// koordlet's `--disable-unset-cpu-quota` (v1.8.0 `runtimehooks/config.go`, a plain flag, not
    /// a feature gate; read by `hooks/cpuset/cpuset.go` `UnsetPodCPUQuota` and
    /// `UnsetContainerCPUQuota`, which then return without touching the quota): CPU-bound LSE/LSR
    /// pods keep their CFS quota, at pod and container level, instead of −1.
    pub disable_unset_cpu_quota: bool,
}

impl RuleFlags {
    /// The flags applied to `rules`.
    pub fn apply(&self, mut rules: Rules) -> Rules {
        if self.disable_unset_cpu_quota {
            rules.cpuset.unset_cfs_quota = false;
        }
        rules
    }
}
