//! The built-in plugins, koordlet's QoS hooks in our own code (`pkg/koordlet/runtimehooks/hooks/`,
//! Koordinator v1.8.0).
//!
//! # Plugins
//!
//! | plugin | what it sets | stages |
//! |---|---|---|
//! | [`GroupIdentity`] | pod `cpu.bvt_warp_ns` by QoS class | PreRunPodSandbox |
//! | [`BatchResource`] | BE pods' CPU shares, CFS quota (scaled by the node's CPU normalization ratio) and memory limit from batch resources | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//! | [`CpuNormalization`] | LS and class-less pods' CFS quota ÷ the node's CPU normalization ratio | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//! | [`CpuSet`] | cpusets: LSE/LSR from the scheduler, others from the NodeResourceTopology's share pools by QoS, BestEffort cleared | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//! | [`GpuEnvInject`] | env `NVIDIA_VISIBLE_DEVICES` from the scheduler's `device-allocated` GPUs; for HAMi-core pods below a whole GPU also CUDA limits, `LD_PRELOAD` and two bind mounts (mounts: NRI only) | PreCreateContainer |
//! | [`RdmaDeviceInject`] | char devices `/dev/infiniband/rdma_cm` and the allocated RDMA PFs' or VFs' verbs devices (NRI only) | PreCreateContainer |
//! | [`TcNetworkQos`] | pod `net_cls.classid` by QoS class; node: HTB qdisc, classes and cgroup filters on the default route's interface (gate `TCNetworkQoS`, off) | PreRunPodSandbox, node-level |
//! | [`TerwayQos`] | node: Terway's `global_bps_config` and `pod.json` (gate `TerwayQoS`, off) | node-level |
//! | [`CoreSched`] | core-scheduling cookies per pod group (containers and sandboxes), kube-QoS `cpu.idle` | node-level work, kube-QoS directories (PostStartContainer listed for NRI mode's node pass) |
//! | [`Resctrl`] | a resctrl group per annotated pod: schemata, tasks, removal | PreRunPodSandbox (annotation check), PreCreateContainer, node-level work, pod removal |
//!
//! # Per-plugin documentation
//!
//! Each module's documentation lists its inputs (label and annotation keys, formats), outputs
//! (fields and files, units) and stages.

pub mod batch_resource;
pub mod cgroup_procs;
pub mod core_sched;
pub mod cpu_normalization;
pub mod cpuset;
pub mod devices;
pub mod gpu_env;
pub mod group_identity;
mod options;
pub mod rdma_device;
pub mod resctrl;
pub mod tc;
pub mod terway_qos;

use std::sync::Arc;

pub use batch_resource::BatchResource;
pub use core_sched::CoreSched;
pub use cpu_normalization::CpuNormalization;
pub use cpuset::CpuSet;
pub use gpu_env::GpuEnvInject;
pub use group_identity::GroupIdentity;
pub use options::PluginOptions;
pub use rdma_device::RdmaDeviceInject;
pub use resctrl::Resctrl;
pub use tc::TcNetworkQos;
pub use terway_qos::TerwayQos;

use crate::plugin::Plugin;

/// The pod label keys any built-in plugin reads; hook requests keep only these of a pod's
/// labels ([`crate::proxy::hook_decode`]), so a pod's other labels cost runtime-hooks nothing.
/// Koordinator's class, CoreSched's group and policy, GPUEnvInject's isolation provider.
pub const POD_LABELS_READ: &[&str] = &[
    crate::context::QOS_CLASS_KEY,
    core_sched::LABEL_GROUP_ID,
    core_sched::LABEL_POLICY,
    gpu_env::GPU_ISOLATION_PROVIDER,
];

/// The pod annotation keys any built-in plugin reads (Koordinator's scheduler and manager write
/// them); hook requests keep only these ([`crate::proxy::hook_decode`]). No plugin reads a container's
/// own annotations or its environment (GPUEnvInject only sets envs), so hook requests keep
/// none of those.
pub const POD_ANNOTATIONS_READ: &[&str] = &[
    batch_resource::EXTENDED_RESOURCE_SPEC,
    cpuset::RESOURCE_STATUS,
    devices::DEVICE_ALLOCATED,
    group_identity::POD_CPU_QOS,
    resctrl::schemata::ANNOTATION,
    tc::NETWORK_QOS,
];

/// Every built-in plugin, in the order the framework runs them.
pub fn builtin() -> Vec<Arc<dyn Plugin>> {
    vec![Arc::new(GroupIdentity::default()), Arc::new(BatchResource), Arc::new(CpuSet::default())]
}

/// The built-in plugins named in `names` (case-insensitive), in the built-in order.
///
/// Errors: an unknown name (the message lists the known ones).
pub fn select(names: &[String]) -> Result<Vec<Arc<dyn Plugin>>, String> {
    let all = builtin();
    for n in names {
        if !all.iter().any(|p| p.name().eq_ignore_ascii_case(n)) {
            let known: Vec<&str> = all.iter().map(|p| p.name()).collect();
            return Err(format!("unknown plugin {n:?} (known: {})", known.join(", ")));
        }
    }
    Ok(all.into_iter().filter(|p| names.iter().any(|n| p.name().eq_ignore_ascii_case(n))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{ContainerContext, PodContext, QOS_CLASS_KEY};
    use crate::plugin::Stage;
    use crate::rules::Rules;
    use proptest::prelude::*;

    proptest! {
        /// Annotations are untrusted input: whatever they hold, no plugin panics (errors are fine).
        #[test]
        fn plugins_never_panic_on_annotations(
            class in prop_oneof![Just("BE".to_string()), Just("LSR".to_string()), Just("LSE".to_string()), Just("LS".to_string()), "\\PC{0,4}"],
            spec in prop_oneof![
                "\\PC{0,60}",
                "[0-9a-zA-Z.+-]{0,12}".prop_map(|q| format!(r#"{{"containers": {{"main": {{"requests": {{"kubernetes.io/batch-cpu": "{q}"}}, "limits": {{"kubernetes.io/batch-memory": "{q}", "kubernetes.io/batch-cpu": "{q}"}}}}}}}}"#)),
            ],
            status in prop_oneof!["\\PC{0,40}", "[0-9,-]{0,10}".prop_map(|c| format!(r#"{{"cpuset": "{c}"}}"#))],
        ) {
            let pod = PodContext {
                labels: [(QOS_CLASS_KEY.to_string(), class)].into(),
                annotations: [
                    (batch_resource::EXTENDED_RESOURCE_SPEC.to_string(), spec),
                    (cpuset::RESOURCE_STATUS.to_string(), status.clone()),
                    (resctrl::schemata::ANNOTATION.to_string(), status),
                ].into(),
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                ..Default::default()
            };
            let container = ContainerContext { pod: pod.clone(), name: "main".into(), ..Default::default() };
            for p in builtin() {
                let _ = p.pod(Stage::PreRunPodSandbox, &pod, &Rules::default());
                let _ = p.container(Stage::PreCreateContainer, &container, &Rules::default());
            }
        }
    }

    #[test]
    fn select_by_name() {
        let names: Vec<&str> =
            select(&["cpuset".into(), "GroupIdentity".into()]).unwrap().iter().map(|p| p.name()).collect();
        assert_eq!(names, ["GroupIdentity", "CPUSet"]);
        assert!(select(&["Nope".into()]).err().unwrap().contains("BatchResource"));
    }
}
