//! Resources from the API server's pod spec, as koordlet's reconciler reads them (protocol
//! `Resources.FromPod` / `FromContainer`, v1.8.0): what the reconciler hands the plugins where
//! the hook path would have the request's resources.
//!
//! | field | from |
//! |---|---|
//! | `cpu_shares` | the CPU request in milli-CPU × 1024 ÷ 1000, 2..=262144 (2 without a request) |
//! | `cpu_quota` (µs per 100000 µs period) | the CPU limit in milli-CPU × 100; −1 without one; at least 1000 |
//! | `cpu_period` | 100000 µs |
//! | `memory_limit_in_bytes` | the memory limit; −1 without one |
//!
//! A pod's values are Kubernetes' `PodRequests` / `PodLimits`: the sum over its containers, or
//! the largest init container's where that is more (pod overhead is not counted). A quantity
//! that does not parse counts as absent.

use hook_api::v1alpha1::LinuxContainerResources;
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};

use crate::quantity::Quantity;

/// The CFS period the values are computed for (µs).
pub const CFS_PERIOD_US: i64 = 100_000;

fn milli(reqs: Option<&ResourceRequirements>, limits: bool, name: &str) -> Option<i64> {
    let map = reqs.and_then(|r| if limits { r.limits.as_ref() } else { r.requests.as_ref() })?;
    let q: Quantity = map.get(name)?.0.parse().ok()?;
    Some(if name == "cpu" { q.milli_value() } else { q.value() })
}

/// CPU shares for a milli-CPU request (koordlet's `MilliCPUToShares`).
pub fn shares(milli_cpu: i64) -> i64 {
    if milli_cpu <= 0 {
        return 2;
    }
    (milli_cpu.saturating_mul(1024) / 1000).clamp(2, 262_144)
}

/// CFS quota (µs per [`CFS_PERIOD_US`]) for a milli-CPU limit; −1 for none (koordlet's
/// `MilliCPUToQuota`).
pub fn quota(milli_cpu: i64) -> i64 {
    match milli_cpu.saturating_mul(CFS_PERIOD_US) / 1000 {
        q if q <= 0 => -1,
        q => q.max(1000),
    }
}

fn values(cpu_request: i64, cpu_limit: i64, memory_limit: i64) -> LinuxContainerResources {
    LinuxContainerResources {
        cpu_shares: shares(cpu_request),
        cpu_quota: quota(cpu_limit),
        cpu_period: CFS_PERIOD_US,
        memory_limit_in_bytes: if memory_limit > 0 { memory_limit } else { -1 },
        ..Default::default()
    }
}

/// A container's resources from its spec.
pub fn container(c: &Container) -> LinuxContainerResources {
    let r = c.resources.as_ref();
    values(
        milli(r, false, "cpu").unwrap_or(0),
        milli(r, true, "cpu").unwrap_or(0),
        milli(r, true, "memory").unwrap_or(0),
    )
}

/// The named container's resources in `pod`'s spec, `None` when the spec has no such container.
pub fn container_of(pod: &Pod, name: &str) -> Option<LinuxContainerResources> {
    pod.spec.as_ref()?.containers.iter().find(|c| c.name == name).map(container)
}

/// The pod's resources: sums over its containers, or the largest init container's value where
/// that is more.
pub fn pod(pod: &Pod) -> Option<LinuxContainerResources> {
    let spec = pod.spec.as_ref()?;
    let get = |c: &Container, limits: bool, name: &str| milli(c.resources.as_ref(), limits, name).unwrap_or(0);
    let total = |limits: bool, name: &str| {
        let sum = spec.containers.iter().map(|c| get(c, limits, name)).fold(0i64, i64::saturating_add);
        let init = spec.init_containers.iter().flatten().map(|c| get(c, limits, name)).max().unwrap_or(0);
        sum.max(init)
    };
    Some(values(total(false, "cpu"), total(true, "cpu"), total(true, "memory")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn c(name: &str, req: &[(&str, &str)], lim: &[(&str, &str)]) -> Container {
        let m = |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), Q(v.to_string()))).collect());
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements { requests: m(req), limits: m(lim), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn container_values_as_koordlet_computes_them() {
        let r = container(&c("a", &[("cpu", "500m")], &[("cpu", "1500m"), ("memory", "1Gi")]));
        assert_eq!(
            (r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes),
            (512, 150_000, 100_000, 1 << 30)
        );
        let r = container(&c("b", &[], &[]));
        assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes), (2, -1, -1), "no requests, no limits");
        assert_eq!(quota(1), 1000, "at least 1000 µs");
        assert_eq!(container(&c("x", &[("cpu", "bogus")], &[])).cpu_shares, 2, "a bad quantity is absent");
    }

    #[test]
    fn pod_values_sum_containers_or_take_the_largest_init_container() {
        let spec = PodSpec {
            containers: vec![c("a", &[("cpu", "1")], &[("cpu", "1")]), c("b", &[("cpu", "1")], &[("cpu", "2")])],
            init_containers: Some(vec![c("i", &[("cpu", "4")], &[("cpu", "2")])]),
            ..Default::default()
        };
        let p = Pod { spec: Some(spec), ..Default::default() };
        let r = pod(&p).unwrap();
        assert_eq!((r.cpu_shares, r.cpu_quota), (4096, 300_000));
        assert_eq!(container_of(&p, "b").unwrap().cpu_quota, 200_000);
        assert!(container_of(&p, "nope").is_none());
    }
}
