//! BatchResource: CPU and memory of BE pods from their batch resources (koordlet's
//! `batchresource` hook).
//!
//! # What it does
//!
//! Koordinator schedules BE pods on *batch* resources, reclaimed from what LS pods requested but
//! do not use. kubelet knows nothing of them (a BE pod is BestEffort to it: 2 CPU shares, no
//! limits), so the hook turns them into cgroup values.
//!
//! | | |
//! |---|---|
//! | inputs | pod label `koordinator.sh/qosClass: BE`; pod annotation `node.koordinator.sh/extended-resource-spec`; the Node's `node.koordinator.sh/cpu-normalization-ratio` ([`crate::rules::node`]) |
//! | outputs, container | `container_resources` in the hook answer: `cpu_shares`, `cpu_period`, `cpu_quota`, `memory_limit_in_bytes` (standalone: the container's `cpu.shares`, `cpu.cfs_period_us`, `cpu.cfs_quota_us`, `memory.limit_in_bytes` or their v2 equivalents) |
//! | outputs, pod | the pod cgroup's same four files, written by runtime-hooks itself |
//! | stages | PreRunPodSandbox (pod), PreCreateContainer, PreUpdateContainerResources |
//! | rules | `batchResource.enable`, `batchResource.cfsQuota`, `batchResource.cpuNormalizationRatio`, `cpu.cfsPeriodUs` |
//!
//! A container not named in the annotation, a pod that is not BE, or a pod without the
//! annotation is left alone.
//!
//! # The annotation
//!
//! The annotation is JSON:
//!
//! ```json
//! {"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500",  "kubernetes.io/batch-memory": "64Mi"},
//!                          "limits":   {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}
//! ```
//!
//! `kubernetes.io/batch-cpu` is a quantity counting **milli-CPUs** (`"500"` = half a CPU; its
//! integer value, rounded up, as koordinator reads it); `kubernetes.io/batch-memory` is a
//! quantity of bytes (`"128Mi"`). JSON numbers are accepted too. Quantities are read as
//! Kubernetes reads them, saturating ([`crate::quantity`]): a limit of `1e19`, `10E` or `8Ei` is
//! `i64::MAX`, never an error.
//!
//! # Container values
//!
//! Per container (by its Kubernetes name):
//!
//! * `cpu_shares` = batch-cpu request × 1024 / 1000, within 2..=262144 (kubelet's
//!   `MilliCPUToShares`); no request, or 0: 2, the minimum (koordlet v1.8.0
//!   `hooks/batchresource/batch_resource.go` `SetContainerCPUShares`: a request missing or ≤ 0
//!   counts 0, and `MilliCPUToShares(0)` is 2; a container with only a batch-cpu limit gets 2,
//!   not kubelet's value).
//! * `cpu_period` = `cpu.cfsPeriodUs` (100000 µs); `cpu_quota` = batch-cpu limit × period / 1000
//!   (at least 1000 µs); no limit, or `cfsQuota: false`: −1 (unlimited). On a node with a CPU
//!   normalization ratio above 1, a limited quota is divided by it, rounded up
//!   ([`scale_quota`]). The CFS quota is capped at the kernel's maximum, [`MAX_CFS_QUOTA_US`].
//! * `memory_limit_in_bytes` = batch-memory limit; no limit: unchanged (runtime-proxy ignores
//!   −1, as koord does, so "unlimited" cannot be asked for at container level).
//!
//! # Pod values
//!
//! The pod cgroup gets the sums over the annotation's containers: shares from the summed
//! requests (2 when no container has one: koordlet's `SetPodCPUShares` sums the requests above 0
//! and always sets the result); quota from the summed limits if every container has a batch-cpu limit, else −1;
//! memory the summed limits if every container has a batch-memory limit, else −1. The pod's
//! quota is scaled by the normalization ratio like a container's.
//!
//! # CPU normalization
//!
//! Source: koordlet v1.8.0 `hooks/batchresource/rule.go` `GetCFSQuotaScaleRatio`, applied in
//! `batch_resource.go` `SetPodCFSQuota` and `SetContainerCFSQuota`.
//!
//! Koordinator counts batch CPUs in *normalized* CPUs: on a node whose CPUs are faster than the
//! reference (ratio `1.20`), one normalized CPU is 1/1.2 of a local one. So when `cfsQuota` is on
//! and the Node has a ratio, a quota that is limited (> 0) becomes ⌈quota ÷ ratio⌉ µs: 1000
//! batch-cpu at period 100000 µs on a ratio-1.2 node is ⌈100000 ÷ 1.2⌉ = 83334 µs. Ratios at or
//! below 1 are not applied (koordlet: "no support ratio in (0, 1) yet"), nor is any ratio to −1
//! (unlimited) or when `cfsQuota` is off. Shares and memory are not scaled.
//!
//! # Where koordlet differs
//!
//! The scaled quota is kept at 1000 µs or more. koordlet scales after its 1000 µs minimum and
//! can go below it (a 1-milli limit at ratio 1.2 is 834 µs), which the kernel refuses (EINVAL: a
//! CFS quota is at least 1 ms).
//!
//! # Errors
//!
//! Failures, each naming the annotation and the cause, under the plugin failure policy:
//!
//! * an annotation that is not a JSON object with an object `containers`: the whole pod (there
//!   is nothing to go by);
//! * one container's entry that is not an object of `requests` / `limits` maps of quantities,
//!   or holds a quantity that is not one or is negative: **that container only**. The other
//!   containers get their values, and the pod its sums over the other containers' entries (the
//!   broken entry is left out: it neither lifts the pod's limit to "unlimited" nor fails it).

use std::collections::BTreeMap;

use anyhow::{bail, Context as _};
use serde::Deserialize;

use crate::cgroup::CgroupValue;
use crate::change::{Change, Resources};
use crate::context::{ContainerContext, PodContext, QosClass};
use crate::cpu_weight::{MAX_SHARES, MIN_SHARES};
use crate::plugin::{Plugin, Stage};
use crate::quantity::Quantity;
use crate::rules::Rules;

/// Pod annotation with the per-container batch resources.
pub const EXTENDED_RESOURCE_SPEC: &str = "node.koordinator.sh/extended-resource-spec";
/// Batch CPU resource name; its quantity counts milli-CPUs.
pub const BATCH_CPU: &str = "kubernetes.io/batch-cpu";
/// Batch memory resource name; its quantity counts bytes.
pub const BATCH_MEMORY: &str = "kubernetes.io/batch-memory";

/// The kernel's largest CFS quota, µs (`MAX_BW` in `kernel/sched/sched.h`: 2⁴⁴ − 1; a larger
/// `cpu.cfs_quota_us` or `cpu.max` is refused with EINVAL). A quota computed above it is capped.
pub const MAX_CFS_QUOTA_US: i64 = (1 << 44) - 1;

/// The annotation's JSON, each container's entry kept as JSON until asked for
/// ([`ExtendedResourceSpec::container`]), so one bad entry spoils only its own container.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ExtendedResourceSpec {
    /// Per container name, the raw entry.
    #[serde(default)]
    pub containers: BTreeMap<String, serde_json::Value>,
}

impl ExtendedResourceSpec {
    /// The entry of container `name`: `None` when the annotation does not name it.
    ///
    /// Errors: the entry is not an object of `requests` / `limits` maps of quantities.
    pub fn container(&self, name: &str) -> Option<anyhow::Result<ContainerResourceSpec>> {
        let raw = self.containers.get(name)?;
        Some(ContainerResourceSpec::deserialize(raw).map_err(|e| anyhow::anyhow!("container {name:?}: {e}")))
    }
}

/// One container's batch resources.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct ContainerResourceSpec {
    /// Requests by resource name.
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
    /// Limits by resource name.
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
}

impl ContainerResourceSpec {
    /// The integer value of a resource (rounded up, saturating); `None` when absent. Errors:
    /// negative.
    fn get(map: &BTreeMap<String, Quantity>, name: &str, which: &str) -> anyhow::Result<Option<i64>> {
        match map.get(name) {
            None => Ok(None),
            Some(q) if q.is_negative() => bail!("{which} {name} = {q} is negative"),
            Some(q) => Ok(Some(q.value())),
        }
    }

    /// batch-cpu request in milli-CPUs.
    pub fn cpu_request_milli(&self) -> anyhow::Result<Option<i64>> {
        Self::get(&self.requests, BATCH_CPU, "request")
    }

    /// batch-cpu limit in milli-CPUs; `None` also for 0 (no limit).
    pub fn cpu_limit_milli(&self) -> anyhow::Result<Option<i64>> {
        Ok(Self::get(&self.limits, BATCH_CPU, "limit")?.filter(|v| *v > 0))
    }

    /// batch-memory limit in bytes; `None` also for 0 (no limit).
    pub fn memory_limit_bytes(&self) -> anyhow::Result<Option<i64>> {
        Ok(Self::get(&self.limits, BATCH_MEMORY, "limit")?.filter(|v| *v > 0))
    }

    /// Every value this plugin reads, checked: (cpu request, cpu limit, memory limit).
    ///
    /// Errors: a negative quantity.
    fn values(&self) -> anyhow::Result<(Option<i64>, Option<i64>, Option<i64>)> {
        Ok((self.cpu_request_milli()?, self.cpu_limit_milli()?, self.memory_limit_bytes()?))
    }
}

/// The pod's batch resource spec, if it is a BE pod with the annotation.
///
/// Errors: the annotation is not a JSON object whose `containers` (if present) is an object.
pub fn spec_of(pod: &PodContext) -> anyhow::Result<Option<ExtendedResourceSpec>> {
    if pod.qos() != QosClass::Be {
        return Ok(None);
    }
    let Some(text) = pod.annotations.get(EXTENDED_RESOURCE_SPEC) else {
        return Ok(None);
    };
    let spec = serde_json::from_str(text).with_context(|| format!("pod annotation {EXTENDED_RESOURCE_SPEC}"))?;
    Ok(Some(spec))
}

/// CPU shares for a milli-CPU request (kubelet's `MilliCPUToShares`).
pub fn milli_to_shares(milli: i64) -> i64 {
    (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// CFS quota in µs for a milli-CPU limit at `period` µs (kubelet's `MilliCPUToQuota`, at least
/// 1000 µs), at most [`MAX_CFS_QUOTA_US`].
pub fn milli_to_quota(milli: i64, period: i64) -> i64 {
    (milli.saturating_mul(period) / 1000).clamp(1000, MAX_CFS_QUOTA_US)
}

/// A CFS quota (µs) scaled by the node's CPU normalization ratio: ⌈`quota` ÷ `ratio`⌉, at least
/// 1000 µs, when the quota is limited (> 0) and the ratio is above 1; otherwise `quota` as is
/// (koordlet v1.8.0 `hooks/batchresource/batch_resource.go` `SetPodCFSQuota` /
/// `SetContainerCFSQuota` with `rule.go` `GetCFSQuotaScaleRatio`; the 1000 µs floor is ours, see
/// the module documentation).
pub fn scale_quota(quota: i64, ratio: Option<f64>) -> i64 {
    match ratio {
        // A quota is at most MAX_CFS_QUOTA_US (2⁴⁴), exact in an f64; the result is ≤ quota.
        Some(r) if quota > 0 && r > 1.0 => ((quota as f64 / r).ceil() as i64).max(1000),
        _ => quota,
    }
}

/// The BatchResource plugin.
#[derive(Debug, Default)]
pub struct BatchResource;

impl BatchResource {
    /// The plugin's name.
    pub const NAME: &'static str = "BatchResource";
}

impl Plugin for BatchResource {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources]
    }

    fn pod(&self, _stage: Stage, pod: &PodContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.batch_resource.enable {
            return Ok(Change::default());
        }
        let Some(spec) = spec_of(pod)? else {
            return Ok(Change::default());
        };
        if spec.containers.is_empty() {
            return Ok(Change::default());
        }
        let period = rules.cpu.cfs_period_us;
        let mut requests = 0i64;
        let (mut cpu_limits, mut mem_limits) = (Some(0i64), Some(0i64));
        let mut counted = 0;
        for name in spec.containers.keys() {
            let values =
                spec.container(name).unwrap_or_else(|| Ok(ContainerResourceSpec::default())).and_then(|c| c.values());
            let (request, cpu, mem) = match values {
                Ok(v) => v,
                Err(e) => {
                    // Its container's own call reports it as the plugin's failure.
                    tracing::debug!(pod = %pod.key(), "pod annotation {EXTENDED_RESOURCE_SPEC}: {e:#}; entry left out of the pod's sums");
                    continue;
                }
            };
            counted += 1;
            if let Some(r) = request {
                requests = requests.saturating_add(r);
            }
            cpu_limits = cpu_limits.zip(cpu).map(|(a, b)| a.saturating_add(b));
            mem_limits = mem_limits.zip(mem).map(|(a, b)| a.saturating_add(b));
        }
        if counted == 0 {
            return Ok(Change::default());
        }
        // koordlet's SetPodCPUShares: no request anywhere is 0 milli-CPUs, i.e. 2 shares.
        let mut values = vec![CgroupValue::CpuShares(milli_to_shares(requests))];
        let quota = match cpu_limits {
            Some(milli) if rules.batch_resource.cfs_quota => {
                scale_quota(milli_to_quota(milli, period), rules.batch_resource.cpu_normalization_ratio)
            }
            _ => -1,
        };
        values.push(CgroupValue::CfsPeriod(period));
        values.push(CgroupValue::CfsQuota(quota));
        values.push(CgroupValue::MemoryLimit(mem_limits.unwrap_or(-1)));
        Ok(Change { pod_cgroup: values, ..Default::default() })
    }

    fn container(&self, _stage: Stage, c: &ContainerContext, rules: &Rules) -> anyhow::Result<Change> {
        if !rules.batch_resource.enable {
            return Ok(Change::default());
        }
        let Some(spec) = spec_of(&c.pod)? else {
            return Ok(Change::default());
        };
        let Some(res) = spec.container(&c.name) else {
            return Ok(Change::default());
        };
        let ctx = || format!("pod annotation {EXTENDED_RESOURCE_SPEC}, container {:?}", c.name);
        let (request, limit, memory) = res.and_then(|r| r.values()).with_context(ctx)?;
        let period = rules.cpu.cfs_period_us;
        let quota = match limit {
            Some(milli) if rules.batch_resource.cfs_quota => {
                scale_quota(milli_to_quota(milli, period), rules.batch_resource.cpu_normalization_ratio)
            }
            _ => -1,
        };
        let resources = Resources {
            // koordlet's SetContainerCPUShares: a missing request counts 0 (2 shares).
            cpu_shares: Some(milli_to_shares(request.unwrap_or(0))),
            cpu_period: Some(period),
            cpu_quota: Some(quota),
            memory_limit_in_bytes: memory,
            cpuset_cpus: None,
        };
        Ok(Change { resources, ..Default::default() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::QOS_CLASS_KEY;

    fn pod(class: &str, spec: Option<&str>) -> PodContext {
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(s) = spec {
            annotations.insert(EXTENDED_RESOURCE_SPEC.to_string(), s.to_string());
        }
        PodContext {
            labels: [(QOS_CLASS_KEY.to_string(), class.to_string())].into(),
            annotations,
            cgroup_parent: "/kubepods/besteffort/pod1".into(),
            ..Default::default()
        }
    }

    fn container(pod: PodContext, name: &str) -> ContainerContext {
        ContainerContext { pod, name: name.into(), ..Default::default() }
    }

    const SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"},
                                                  "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

    fn run(c: &ContainerContext, rules: &Rules) -> Resources {
        BatchResource.container(Stage::PreCreateContainer, c, rules).unwrap().resources
    }

    #[test]
    fn the_issue_example() {
        let r = run(&container(pod("BE", Some(SPEC)), "main"), &Rules::default());
        assert_eq!(
            r,
            Resources {
                cpu_shares: Some(512),
                cpu_period: Some(100_000),
                cpu_quota: Some(100_000),
                memory_limit_in_bytes: Some(134_217_728),
                cpuset_cpus: None
            }
        );
    }

    #[test]
    fn period_and_cfs_quota_rules() {
        let mut rules = Rules::default();
        rules.cpu.cfs_period_us = 50_000;
        let r = run(&container(pod("BE", Some(SPEC)), "main"), &rules);
        assert_eq!((r.cpu_period, r.cpu_quota), (Some(50_000), Some(50_000)));
        rules.batch_resource.cfs_quota = false;
        assert_eq!(run(&container(pod("BE", Some(SPEC)), "main"), &rules).cpu_quota, Some(-1));
        rules.batch_resource.enable = false;
        assert!(run(&container(pod("BE", Some(SPEC)), "main"), &rules).is_empty());
    }

    #[test]
    fn unlimited_and_absent_values() {
        let spec = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": 250}}}}"#;
        let r = run(&container(pod("BE", Some(spec)), "main"), &Rules::default());
        assert_eq!(r.cpu_shares, Some(256));
        assert_eq!(r.cpu_quota, Some(-1), "no limit: unlimited");
        assert_eq!(r.memory_limit_in_bytes, None, "no memory limit: unchanged");
        let tiny = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "1"}, "limits": {"kubernetes.io/batch-cpu": "1"}}}}"#;
        let r = run(&container(pod("BE", Some(tiny)), "main"), &Rules::default());
        assert_eq!((r.cpu_shares, r.cpu_quota), (Some(2), Some(1000)), "kernel minimums");
        let big = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "1M"}}}}"#;
        assert_eq!(run(&container(pod("BE", Some(big)), "main"), &Rules::default()).cpu_shares, Some(262_144));
    }

    /// koordlet v1.8.0 `SetContainerCPUShares` / `SetPodCPUShares`: a container with a batch-cpu
    /// limit and no batch-cpu request (or a request of 0) gets 2 shares, not kubelet's; a pod
    /// none of whose containers has a request gets 2 too.
    #[test]
    fn a_limit_without_a_request_gets_two_shares() {
        for spec in [
            r#"{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#,
            r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "0"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#,
            r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-memory": "64Mi"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#,
        ] {
            let r = run(&container(pod("BE", Some(spec)), "main"), &Rules::default());
            assert_eq!((r.cpu_shares, r.cpu_quota), (Some(2), Some(100_000)), "{spec}");
            let p = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(spec)), &Rules::default()).unwrap();
            assert_eq!(p.pod_cgroup[0], CgroupValue::CpuShares(2), "{spec}");
        }
    }

    #[test]
    fn only_be_pods_with_the_annotation_and_named_containers() {
        let rules = Rules::default();
        assert!(run(&container(pod("LS", Some(SPEC)), "main"), &rules).is_empty());
        assert!(run(&container(pod("BE", None), "main"), &rules).is_empty());
        assert!(run(&container(pod("BE", Some(SPEC)), "sidecar"), &rules).is_empty());
        assert!(BatchResource.pod(Stage::PreRunPodSandbox, &pod("LS", Some(SPEC)), &rules).unwrap().is_empty());
    }

    #[test]
    fn bad_annotations_are_errors_naming_the_annotation() {
        for bad in ["{", r#"{"containers": []}"#, r#"{"containers": 5}"#] {
            let err = BatchResource
                .container(Stage::PreCreateContainer, &container(pod("BE", Some(bad)), "main"), &Rules::default())
                .unwrap_err();
            assert!(format!("{err:#}").contains(EXTENDED_RESOURCE_SPEC), "{err:#}");
            assert!(
                BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(bad)), &Rules::default()).is_err(),
                "{bad}"
            );
        }
        for bad in [
            r#"{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}"#,
            r#"{"containers": {"main": {"limits": {"kubernetes.io/batch-memory": "-1Gi"}}}}"#,
            r#"{"containers": {"main": {"limits": ["kubernetes.io/batch-cpu"]}}}"#,
            r#"{"containers": {"main": 5}}"#,
        ] {
            let err = BatchResource
                .container(Stage::PreCreateContainer, &container(pod("BE", Some(bad)), "main"), &Rules::default())
                .unwrap_err();
            let err = format!("{err:#}");
            assert!(err.contains(EXTENDED_RESOURCE_SPEC) && err.contains("\"main\""), "{err}");
        }
    }

    /// A limit Kubernetes accepts but 64 bits do not hold saturates: the container is as good
    /// as unlimited, within what the kernel takes.
    #[test]
    fn huge_quantities_saturate() {
        for huge in ["1e19", "10E", "8Ei", "99999999999999999999999"] {
            let spec = format!(
                r#"{{"containers": {{"main": {{"requests": {{"kubernetes.io/batch-cpu": "{huge}"}}, "limits": {{"kubernetes.io/batch-cpu": "{huge}", "kubernetes.io/batch-memory": "{huge}"}}}}}}}}"#
            );
            let r = run(&container(pod("BE", Some(&spec)), "main"), &Rules::default());
            assert_eq!(r.cpu_shares, Some(MAX_SHARES), "{huge}");
            assert_eq!(r.cpu_quota, Some(MAX_CFS_QUOTA_US), "{huge}");
            assert_eq!(r.memory_limit_in_bytes, Some(i64::MAX), "{huge}");
            let p = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(&spec)), &Rules::default()).unwrap();
            assert!(p.pod_cgroup.contains(&CgroupValue::CfsQuota(MAX_CFS_QUOTA_US)), "{huge}: {:?}", p.pod_cgroup);
        }
    }

    /// One container's bad entry (a sidecar's) spoils that container only: the main container
    /// and the pod keep their values.
    #[test]
    fn a_bad_entry_affects_only_its_container() {
        let main = r#""main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}"#;
        for sidecar in [
            r#""sidecar": {"limits": {"kubernetes.io/batch-cpu": "lots"}}"#,
            r#""sidecar": {"limits": {"kubernetes.io/batch-cpu": "-1"}}"#,
            r#""sidecar": "1e19""#,
        ] {
            let spec = format!(r#"{{"containers": {{{main}, {sidecar}}}}}"#);
            let p = pod("BE", Some(&spec));
            assert_eq!(run(&container(p.clone(), "main"), &Rules::default()).cpu_quota, Some(100_000), "{sidecar}");
            assert!(BatchResource
                .container(Stage::PreCreateContainer, &container(p.clone(), "sidecar"), &Rules::default())
                .is_err());
            let c = BatchResource.pod(Stage::PreRunPodSandbox, &p, &Rules::default()).unwrap();
            assert_eq!(
                c.pod_cgroup,
                vec![
                    CgroupValue::CpuShares(512),
                    CgroupValue::CfsPeriod(100_000),
                    CgroupValue::CfsQuota(100_000),
                    CgroupValue::MemoryLimit(128 << 20)
                ],
                "{sidecar}: the pod keeps a limit"
            );
        }
        // Only bad entries: the pod is left alone.
        let spec = r#"{"containers": {"sidecar": {"limits": {"kubernetes.io/batch-cpu": "lots"}}}}"#;
        assert!(BatchResource
            .pod(Stage::PreRunPodSandbox, &pod("BE", Some(spec)), &Rules::default())
            .unwrap()
            .is_empty());
    }

    /// koordlet's CPU normalization: a limited quota divided by a ratio above 1, rounded up.
    #[test]
    fn cpu_normalization_divides_limited_quotas() {
        assert_eq!(scale_quota(100_000, Some(1.2)), 83_334, "⌈83333.3⌉");
        assert_eq!(scale_quota(120_000, Some(1.2)), 100_000);
        assert_eq!(scale_quota(150_000, Some(1.5)), 100_000);
        assert_eq!(scale_quota(100_000, Some(3.0)), 33_334);
        assert_eq!(scale_quota(100_000, None), 100_000);
        for ratio in [1.0, 0.8, 0.01] {
            assert_eq!(scale_quota(100_000, Some(ratio)), 100_000, "{ratio}: not applied");
        }
        assert_eq!(scale_quota(-1, Some(1.2)), -1, "unlimited stays unlimited");
        assert_eq!(scale_quota(1000, Some(1.2)), 1000, "the kernel's minimum (koordlet: 834)");
        assert_eq!(scale_quota(MAX_CFS_QUOTA_US, Some(2.0)), 1 << 43);

        let mut rules = Rules::default();
        rules.batch_resource.cpu_normalization_ratio = Some(1.2);
        let r = run(&container(pod("BE", Some(SPEC)), "main"), &rules);
        let want = Resources {
            cpu_shares: Some(512),
            cpu_period: Some(100_000),
            cpu_quota: Some(83_334),
            memory_limit_in_bytes: Some(128 << 20),
            cpuset_cpus: None,
        };
        assert_eq!(r, want, "only the quota is scaled");
        let two = r#"{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "1000"}}, "b": {"limits": {"kubernetes.io/batch-cpu": "500"}}}}"#;
        let p = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(two)), &rules).unwrap();
        assert!(p.pod_cgroup.contains(&CgroupValue::CfsQuota(125_000)), "{:?}", p.pod_cgroup);
        rules.cpu.cfs_period_us = 50_000;
        assert_eq!(run(&container(pod("BE", Some(SPEC)), "main"), &rules).cpu_quota, Some(41_667));
        // Unlimited, or cfsQuota off: −1, not scaled.
        let unlimited = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}}}}"#;
        assert_eq!(run(&container(pod("BE", Some(unlimited)), "main"), &rules).cpu_quota, Some(-1));
        rules.batch_resource.cfs_quota = false;
        assert_eq!(run(&container(pod("BE", Some(SPEC)), "main"), &rules).cpu_quota, Some(-1));
        let p = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(two)), &rules).unwrap();
        assert!(p.pod_cgroup.contains(&CgroupValue::CfsQuota(-1)), "{:?}", p.pod_cgroup);
        // Not a BE pod: nothing.
        assert!(run(&container(pod("LS", Some(SPEC)), "main"), &rules).is_empty());
    }

    #[test]
    fn pod_level_sums() {
        let two = r#"{"containers": {
            "a": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}},
            "b": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "64Mi"}}}}"#;
        let c = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(two)), &Rules::default()).unwrap();
        assert_eq!(
            c.pod_cgroup,
            vec![
                CgroupValue::CpuShares(1024),
                CgroupValue::CfsPeriod(100_000),
                CgroupValue::CfsQuota(150_000),
                CgroupValue::MemoryLimit(192 << 20)
            ]
        );
        assert!(c.resources.is_empty(), "pod values go to the cgroup only");
        // One container without limits: the pod is unlimited.
        let open = r#"{"containers": {"a": {"limits": {"kubernetes.io/batch-cpu": "1000"}}, "b": {"requests": {"kubernetes.io/batch-cpu": "100"}}}}"#;
        let c = BatchResource.pod(Stage::PreRunPodSandbox, &pod("BE", Some(open)), &Rules::default()).unwrap();
        assert_eq!(
            c.pod_cgroup,
            vec![
                CgroupValue::CpuShares(102),
                CgroupValue::CfsPeriod(100_000),
                CgroupValue::CfsQuota(-1),
                CgroupValue::MemoryLimit(-1)
            ]
        );
    }
}
