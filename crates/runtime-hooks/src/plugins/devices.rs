//! What the device plugins ([`super::GpuEnvInject`], [`super::RdmaDeviceInject`]) share: the
//! scheduler's device-allocated annotation, and the node options they are started with.
//!
//! # The annotation
//!
//! Koordinator's scheduler (DeviceShare) writes the devices it allocated to a pod into the pod
//! annotation `scheduling.koordinator.sh/device-allocated` (koordinator v1.8.0
//! `apis/extension/device_share.go`, `AnnotationDeviceAllocated`): a JSON object from device
//! type (`gpu`, `rdma`, `fpga`, …) to a list of allocations:
//!
//! ```json
//! {"gpu":  [{"minor": 0, "resources": {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory-ratio": 100, "koordinator.sh/gpu-memory": "16Gi"}}],
//!  "rdma": [{"minor": 1, "id": "0000:09:00.0", "resources": {"koordinator.sh/rdma": 100},
//!            "extension": {"vfs": [{"minor": 0, "busID": "0000:09:00.2"}]}}]}
//! ```
//!
//! `minor` is a 32-bit integer, `resources` Kubernetes quantities (strings or numbers), `id`
//! the device's well-known identifier (for RDMA its PCI address), `extension.vfs` the SR-IOV
//! virtual functions allocated (each with its PCI `busID`). Unknown keys and device types are
//! ignored, `null` lists and objects are empty, as Go's decoder does. No annotation: no
//! devices. A value that is not such JSON is an error naming the annotation and the problem
//! ([`device_allocations`]).
//!
//! # Options
//!
//! [`DeviceOptions`]: where the host's `/dev` and `/sys` are (RDMA) and the HAMi-core library
//! (GPU), from the command line (`--device-host-root`, `--hami-core-library-directory-path`);
//! the feature gates hand them to the plugins' constructors
//! ([`crate::feature_gates::FeatureGates::plugins`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::Deserialize;

use crate::quantity::Quantity;

/// Pod annotation with the scheduler's device allocation (koordinator's
/// `AnnotationDeviceAllocated`).
pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";

/// One allocated device (koordinator's `DeviceAllocation`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct DeviceAllocation {
    /// The device's minor number (for GPUs: the `/dev/nvidiaN` index). `None` when absent.
    #[serde(default)]
    pub minor: Option<i32>,
    /// Resources taken from the device, by resource name (`koordinator.sh/gpu-memory`, …).
    #[serde(default, deserialize_with = "null_is_empty")]
    pub resources: BTreeMap<String, Quantity>,
    /// The device's identifier; for RDMA the PCI address of the physical function
    /// (`0000:09:00.0`). Empty when absent.
    #[serde(default, deserialize_with = "null_is_empty")]
    pub id: String,
    /// Extra allocation details. `None` when absent.
    #[serde(default)]
    pub extension: Option<DeviceAllocationExtension>,
}

/// koordinator's `DeviceAllocationExtension` (the part the hooks read).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct DeviceAllocationExtension {
    /// SR-IOV virtual functions allocated instead of the physical function.
    #[serde(default, deserialize_with = "null_is_empty")]
    pub vfs: Vec<VirtualFunction>,
}

/// koordinator's `VirtualFunction`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct VirtualFunction {
    /// The VF's minor number (not read by the hooks).
    #[serde(default)]
    pub minor: Option<i64>,
    /// The VF's PCI address (`0000:09:00.2`); empty when absent.
    #[serde(default, rename = "busID", deserialize_with = "null_is_empty")]
    pub bus_id: String,
}

/// The annotation: device type → allocations (an entry may be `null`, as Go's decoder allows).
/// A `null` list is `None`.
pub type DeviceAllocations = BTreeMap<String, Option<Vec<Option<DeviceAllocation>>>>;

fn null_is_empty<'de, D: serde::Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The pod's device allocation of one `device_type` (`"gpu"`, `"rdma"`): `Ok(empty)` when the
/// annotation is absent or allocates no device of that type.
///
/// Errors: the annotation is not the JSON above (the message names the annotation and serde's
/// reason, with line and column), or one of this type's entries is `null`.
pub fn device_allocations(
    annotations: &BTreeMap<String, String>,
    device_type: &str,
) -> anyhow::Result<Vec<DeviceAllocation>> {
    let Some(text) = annotations.get(DEVICE_ALLOCATED) else {
        return Ok(Vec::new());
    };
    let mut all: Option<DeviceAllocations> = serde_json::from_str(text)
        .with_context(|| format!("pod annotation {DEVICE_ALLOCATED}: not a device allocation"))?;
    let entries = all.as_mut().and_then(|a| a.remove(device_type)).flatten().unwrap_or_default();
    entries
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            e.ok_or_else(|| anyhow::anyhow!("pod annotation {DEVICE_ALLOCATED}: {device_type} entry {i} is null"))
        })
        .collect()
}

/// Node options of the device plugins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// Where the host's root file system is seen (`--device-host-root`, default `/`): the RDMA
    /// plugin reads `<root>/sys/bus/pci/devices/…` and stats `<root>/dev/infiniband/…` there.
    /// The device paths it gives the container stay koordlet's (`/dev/infiniband/…`).
    pub host_root: PathBuf,
    /// The HAMi-core library (`--hami-core-library-directory-path`, koordlet's flag and
    /// default `/usr/local/vgpu/libvgpu.so`): `LD_PRELOAD` and a bind mount of HAMi-core GPU
    /// containers.
    pub hami_core_library: String,
}

/// koordlet's default HAMi-core library (`system.Conf.HAMICoreLibraryDirectoryPath`).
pub const DEFAULT_HAMI_CORE_LIBRARY: &str = "/usr/local/vgpu/libvgpu.so";

impl Default for DeviceOptions {
    /// Host root `/`, koordlet's HAMi-core library.
    fn default() -> Self {
        DeviceOptions { host_root: PathBuf::from("/"), hami_core_library: DEFAULT_HAMI_CORE_LIBRARY.to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pod(text: &str) -> BTreeMap<String, String> {
        [(DEVICE_ALLOCATED.to_string(), text.to_string())].into()
    }

    #[test]
    fn koordinators_example_parses() {
        let text = r#"{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": 100, "koordinator.sh/gpu-memory": "16Gi"}},
                               {"minor": 1, "resources": null}],
                       "rdma": [{"minor": 1, "id": "0000:09:00.0", "extension": {"vfs": [{"busID": "0000:09:00.2"}]}}],
                       "fpga": [{"minor": 2, "future": true}]}"#;
        let gpu = device_allocations(&pod(text), "gpu").unwrap();
        assert_eq!(gpu.len(), 2);
        assert_eq!((gpu[0].minor, gpu[1].minor), (Some(0), Some(1)));
        assert_eq!(gpu[0].resources["koordinator.sh/gpu-memory"].value(), 16 << 30);
        assert!(gpu[1].resources.is_empty());
        let rdma = device_allocations(&pod(text), "rdma").unwrap();
        assert_eq!(rdma[0].id, "0000:09:00.0");
        assert_eq!(rdma[0].extension.as_ref().unwrap().vfs[0].bus_id, "0000:09:00.2");
        assert!(device_allocations(&pod(text), "npu").unwrap().is_empty());
        assert!(device_allocations(&Default::default(), "gpu").unwrap().is_empty(), "no annotation: nothing");
        assert!(device_allocations(&pod("null"), "gpu").unwrap().is_empty());
        assert!(device_allocations(&pod(r#"{"gpu": null}"#), "gpu").unwrap().is_empty());
    }

    #[test]
    fn bad_annotations_name_the_annotation_and_the_problem() {
        for (text, needle) in [
            ("{", "EOF"),
            (r#"{"gpu": {"minor": 0}}"#, "invalid type: map"),
            (r#"{"gpu": [{"minor": "zero"}]}"#, "invalid type: string"),
            (r#"{"gpu": [{"minor": 4294967296}]}"#, "invalid value"),
            (r#"{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-memory": "lots"}}]}"#, "lots"),
            (r#"{"gpu": [null]}"#, "gpu entry 0 is null"),
        ] {
            let e = format!("{:#}", device_allocations(&pod(text), "gpu").unwrap_err());
            assert!(e.contains(DEVICE_ALLOCATED) && e.contains(needle), "{text}: {e}");
        }
    }

    proptest::proptest! {
        /// The annotation is untrusted input: whatever it holds, neither device plugin panics
        /// (errors are fine); the host is an empty directory.
        #[test]
        fn device_plugins_never_panic(
            text in proptest::prop_oneof![
                "\\PC{0,60}",
                "[0-9a-f:./-]{0,14}".prop_map(|id| format!(r#"{{"rdma": [{{"id": "{id}", "extension": {{"vfs": [{{"busID": "{id}"}}]}}}}]}}"#)),
                "[0-9a-zA-Z.+-]{0,8}".prop_map(|q| format!(r#"{{"gpu": [{{"minor": 0, "resources": {{"koordinator.sh/gpu-memory-ratio": "{q}", "koordinator.sh/gpu-memory": "{q}"}}}}]}}"#)),
            ],
        ) {
            use crate::plugin::{Plugin, Stage};
            let host = tempfile::tempdir().unwrap();
            let mut c = crate::context::ContainerContext::default();
            c.pod.annotations = pod(&text);
            use super::super::{gpu_env, rdma_device, RdmaDeviceInject};
            c.pod.labels.insert(gpu_env::GPU_ISOLATION_PROVIDER.into(), gpu_env::HAMI_CORE.into());
            let rdma = RdmaDeviceInject::new(std::sync::Arc::new(rdma_device::HostFs::new(host.path())));
            for p in [&super::super::GpuEnvInject::new(DEFAULT_HAMI_CORE_LIBRARY) as &dyn Plugin, &rdma] {
                let _ = p.container(Stage::PreCreateContainer, &c, &crate::rules::Rules::default());
            }
        }
    }

    #[test]
    fn options_default_to_koordlets() {
        let o = DeviceOptions::default();
        assert_eq!((o.host_root.to_str(), o.hami_core_library.as_str()), (Some("/"), "/usr/local/vgpu/libvgpu.so"));
    }
}
