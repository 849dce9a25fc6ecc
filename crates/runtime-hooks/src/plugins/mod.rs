//! The built-in plugins, koordlet's QoS hooks in our own code (koordinator.md §9.3):
//!
//! | plugin | what it sets | stages |
//! |---|---|---|
//! | [`GroupIdentity`] | pod `cpu.bvt_warp_ns` by QoS class | PreRunPodSandbox |
//! | [`BatchResource`] | BE pods' CPU shares, CFS quota and memory limit from batch resources | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//! | [`CpuSet`] | LSE/LSR cpusets from the scheduler, BE on the shared pool | PreRunPodSandbox, PreCreateContainer, PreUpdateContainerResources |
//!
//! Each module's documentation lists its inputs (label and annotation keys, formats), outputs
//! (fields and files, units) and stages.

pub mod batch_resource;
pub mod cpuset;
pub mod group_identity;

use std::sync::Arc;

pub use batch_resource::BatchResource;
pub use cpuset::CpuSet;
pub use group_identity::GroupIdentity;

use crate::plugin::Plugin;

/// Every built-in plugin, in the order the framework runs them.
pub fn builtin() -> Vec<Arc<dyn Plugin>> {
    vec![Arc::new(GroupIdentity), Arc::new(BatchResource), Arc::new(CpuSet)]
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

    #[test]
    fn select_by_name() {
        let names: Vec<&str> = select(&["cpuset".into(), "GroupIdentity".into()]).unwrap().iter().map(|p| p.name()).collect();
        assert_eq!(names, ["GroupIdentity", "CPUSet"]);
        assert!(select(&["Nope".into()]).err().unwrap().contains("BatchResource"));
    }
}
