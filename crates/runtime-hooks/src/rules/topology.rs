//! The NodeResourceTopology's annotations → the node's CPU pools, as koordlet v1.8.0's CPUSet
//! hook reads them (`cpuset/rule.go` `parseRule`; types in `apis/extension/numa_aware.go`,
//! `system_qos.go`). Koordinator's koordlet writes these annotations on the node's NRT.
//!
//! | annotation | JSON | default |
//! |---|---|---|
//! | `node.koordinator.sh/cpu-shared-pools` | `[{"socket":0,"node":0,"cpuset":"0-7"}]` | no pools |
//! | `node.koordinator.sh/be-cpu-shared-pools` | same shape | no pools |
//! | `kubelet.koordinator.sh/cpu-manager-policy` | `{"policy":"static","options":{..},"reservedCPUs":"0"}` | policy `""` (none) |
//! | `node.koordinator.sh/system-qos-resource` | `{"cpuset":"0-1","cpusetExclusive":true}` | no SYSTEM cpuset |
//!
//! Every CPU list is checked ([`parse_cpu_list`]) and kept in the kernel's canonical form. A value
//! that is not JSON of that shape, or a CPU list that does not parse, is a [`FieldError`] naming
//! the annotation (koordlet only logs a bad pool CPU list and passes it on to the cgroup write).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::field::FieldError;
use crate::cgroup::{format_cpu_list, parse_cpu_list};

/// NRT annotation: the CPU share pools of LS (and Burstable) pods, per NUMA node.
pub const CPU_SHARED_POOLS: &str = "node.koordinator.sh/cpu-shared-pools";
/// NRT annotation: the CPU share pools of BE pods, per NUMA node.
pub const BE_CPU_SHARED_POOLS: &str = "node.koordinator.sh/be-cpu-shared-pools";
/// NRT annotation: kubelet's CPU manager policy.
pub const CPU_MANAGER_POLICY: &str = "kubelet.koordinator.sh/cpu-manager-policy";
/// NRT annotation: the CPUs reserved for SYSTEM QoS pods.
pub const SYSTEM_QOS_RESOURCE: &str = "node.koordinator.sh/system-qos-resource";

/// One share pool: the CPUs of one NUMA node that pods of its kind share.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSharedPool {
    /// CPU socket id.
    #[serde(default)]
    pub socket: i32,
    /// NUMA node id.
    #[serde(default)]
    pub node: i32,
    /// The pool's CPUs, kernel CPU-list format, canonical (`0-3,8`).
    #[serde(default)]
    pub cpuset: String,
}

/// kubelet's CPU manager policy as koordlet reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletCpuManagerPolicy {
    /// `static`, `none` or `""` (unknown, treated as none).
    #[serde(default)]
    pub policy: String,
    /// kubelet's `--cpu-manager-policy-options`.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
    /// kubelet's `--reserved-cpus`, canonical CPU list.
    #[serde(default, rename = "reservedCPUs")]
    pub reserved_cpus: String,
}

/// What the CPUSet plugin reads from the node's NodeResourceTopology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// LS share pools, one per NUMA node.
    pub share_pools: Vec<CpuSharedPool>,
    /// BE share pools, one per NUMA node.
    pub be_share_pools: Vec<CpuSharedPool>,
    /// kubelet's CPU manager policy.
    pub kubelet_policy: KubeletCpuManagerPolicy,
    /// CPUs of SYSTEM QoS pods (canonical list), `None` when not set.
    pub system_qos_cpuset: Option<String>,
}

impl Topology {
    /// All LS share pools' CPUs, joined as koordlet joins them (`pool0,pool1`).
    pub fn all_share_pool_cpus(&self) -> String {
        self.share_pools.iter().map(|p| p.cpuset.as_str()).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(",")
    }
}

/// Parses the annotations of a NodeResourceTopology (absent annotations: defaults).
///
/// Errors: an annotation that is not JSON of its shape, or holds a CPU list that does not
/// parse; the error's field is `metadata.annotations[<name>]`.
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<Topology, FieldError> {
    Ok(Topology {
        share_pools: pools(annotations, CPU_SHARED_POOLS)?,
        be_share_pools: pools(annotations, BE_CPU_SHARED_POOLS)?,
        kubelet_policy: match json::<KubeletCpuManagerPolicy>(annotations, CPU_MANAGER_POLICY)? {
            None => KubeletCpuManagerPolicy::default(),
            Some(mut p) => {
                p.reserved_cpus = canonical(&p.reserved_cpus)
                    .map_err(|e| field_error(CPU_MANAGER_POLICY, format!("reservedCPUs: {e}")))?;
                p
            }
        },
        system_qos_cpuset: match json::<SystemQosResource>(annotations, SYSTEM_QOS_RESOURCE)? {
            None => None,
            Some(r) => {
                Some(canonical(&r.cpuset).map_err(|e| field_error(SYSTEM_QOS_RESOURCE, format!("cpuset: {e}")))?)
                    .filter(|s| !s.is_empty())
            }
        },
    })
}

#[derive(Deserialize)]
struct SystemQosResource {
    #[serde(default)]
    cpuset: String,
}

fn field_error(annotation: &str, reason: String) -> FieldError {
    FieldError::new(format!("metadata.annotations[{annotation}]"), reason)
}

fn json<T: serde::de::DeserializeOwned>(
    annotations: &BTreeMap<String, String>,
    name: &str,
) -> Result<Option<T>, FieldError> {
    let Some(text) = annotations.get(name) else { return Ok(None) };
    serde_json::from_str(text).map(Some).map_err(|e| field_error(name, format!("{text:?} does not parse: {e}")))
}

fn pools(annotations: &BTreeMap<String, String>, name: &str) -> Result<Vec<CpuSharedPool>, FieldError> {
    let mut pools: Vec<CpuSharedPool> = json(annotations, name)?.unwrap_or_default();
    for pool in &mut pools {
        pool.cpuset =
            canonical(&pool.cpuset).map_err(|e| field_error(name, format!("node {} cpuset: {e}", pool.node)))?;
    }
    Ok(pools)
}

fn canonical(list: &str) -> Result<String, String> {
    parse_cpu_list(list).map(|cpus| format_cpu_list(&cpus)).map_err(|e| format!("{list:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_recorded_nrt() {
        // test-support/fixtures/k8s-wire/14-create-nrt.txt
        let t = parse(&ann(&[
            (CPU_SHARED_POOLS, r#"[{"socket":0,"node":0,"cpuset":"0-1"}]"#),
            (CPU_MANAGER_POLICY, r#"{"policy":"none"}"#),
        ]))
        .unwrap();
        assert_eq!(t.share_pools, vec![CpuSharedPool { socket: 0, node: 0, cpuset: "0-1".into() }]);
        assert_eq!(t.kubelet_policy.policy, "none");
        assert_eq!((t.be_share_pools.len(), t.system_qos_cpuset.as_deref()), (0, None));
        assert_eq!(t.all_share_pool_cpus(), "0-1");
        assert_eq!(parse(&BTreeMap::new()).unwrap(), Topology::default());
    }

    #[test]
    fn lists_are_canonical_and_joined() {
        let t = parse(&ann(&[
            (CPU_SHARED_POOLS, r#"[{"socket":0,"node":0,"cpuset":" 3, 0-1,2"},{"socket":1,"node":1,"cpuset":"8-9"}]"#),
            (SYSTEM_QOS_RESOURCE, r#"{"cpuset":"5,4"}"#),
            (CPU_MANAGER_POLICY, r#"{"policy":"static","reservedCPUs":"1,0"}"#),
        ]))
        .unwrap();
        assert_eq!(t.all_share_pool_cpus(), "0-3,8-9");
        assert_eq!(t.system_qos_cpuset.as_deref(), Some("4-5"));
        assert_eq!(t.kubelet_policy.reserved_cpus, "0-1");
    }

    #[test]
    fn bad_annotations_name_themselves() {
        for (name, value, needle) in [
            (CPU_SHARED_POOLS, r#"[{"node":0,"cpuset":"3-1"}]"#, "3-1"),
            (BE_CPU_SHARED_POOLS, "not json", "not json"),
            (CPU_MANAGER_POLICY, r#"{"policy":7}"#, "policy"),
            (SYSTEM_QOS_RESOURCE, r#"{"cpuset":"x"}"#, "\"x\""),
        ] {
            let e = parse(&ann(&[(name, value)])).unwrap_err();
            assert_eq!(e.field, format!("metadata.annotations[{name}]"));
            assert!(e.reason.contains(needle), "{name}: {e}");
        }
    }
}
