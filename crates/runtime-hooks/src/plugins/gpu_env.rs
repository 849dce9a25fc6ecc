//! GPUEnvInject: the GPUs the scheduler allocated, as the container's `NVIDIA_VISIBLE_DEVICES`
//! (koordlet v1.8.0 `runtimehooks/hooks/gpu/gpu.go`, feature gate `GPUEnvInject`, alpha, off by
//! default).
//!
//! # Stage
//!
//! PreCreateContainer (koordlet's only registration of this hook).
//!
//! # Inputs
//!
//! * pod annotation `scheduling.koordinator.sh/device-allocated`, its `gpu` list
//!   ([`super::devices`]); no annotation or no `gpu` entry: no change;
//! * pod label `koordinator.sh/gpu-isolation-provider`: `HAMi-core` turns on HAMi-core's
//!   isolation for a GPU shared below its whole memory;
//! * the HAMi-core library path ([`super::devices::DeviceOptions::hami_core_library`]).
//!
//! # Outputs
//!
//! Every container of the pod alike, as koordlet:
//!
//! * env `NVIDIA_VISIBLE_DEVICES`: the allocated GPUs' minors, in annotation order, joined by
//!   `,` (`"0,1"`);
//! * HAMi-core pods whose first GPU has `koordinator.sh/gpu-memory-ratio` below 100 (its
//!   `Quantity.Value()`, rounded up), also: env `CUDA_DEVICE_MEMORY_LIMIT` =
//!   `koordinator.sh/gpu-memory` in bytes, env `CUDA_DEVICE_SM_LIMIT` = `koordinator.sh/gpu-core`
//!   when given, env `LD_PRELOAD` = the library path (replacing the container's), and two `rbind`
//!   bind mounts, the library onto itself and `/tmp/vgpulock` onto itself (HAMi issue 696). Mounts
//!   are NRI-only ([`crate::change`]): proxy mode logs them and applies the envs.
//!
//! # Errors
//!
//! The plugin's failure, under the failure policy; each names the annotation: the annotation is
//! not a device allocation, a `gpu` entry is `null`, has no `minor` (koordlet would read 0 and
//! expose GPU 0) or a negative one; for a HAMi-core pod, the first GPU has no `gpu-memory-ratio`,
//! or a ratio below 100 and no `gpu-memory`.
//!
//! # Left out
//!
//! koordlet's `HamiCoreVGPUMonitor` feature gate (alpha, off by default), which also creates a
//! per-container directory on the host at each creation and mounts it; a plugin here computes
//! and never writes host files.

use crate::change::{Change, Mount};
use crate::context::ContainerContext;
use crate::plugin::{Plugin, Stage};
use crate::rules::Rules;

use super::devices::{device_allocations, DEVICE_ALLOCATED};

/// Env var listing the allocated GPUs' minors (koordlet's `GpuAllocEnv`).
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Pod label naming the GPU isolation provider (koordinator's `LabelGPUIsolationProvider`).
pub const GPU_ISOLATION_PROVIDER: &str = "koordinator.sh/gpu-isolation-provider";
/// The label value that turns on HAMi-core (`GPUIsolationProviderHAMICore`).
pub const HAMI_CORE: &str = "HAMi-core";
/// Share of the GPU's memory, in percent (`ResourceGPUMemoryRatio`).
pub const GPU_MEMORY_RATIO: &str = "koordinator.sh/gpu-memory-ratio";
/// GPU memory in bytes (`ResourceGPUMemory`).
pub const GPU_MEMORY: &str = "koordinator.sh/gpu-memory";
/// Share of the GPU's SMs, in percent (`ResourceGPUCore`).
pub const GPU_CORE: &str = "koordinator.sh/gpu-core";
/// HAMi-core's lock directory, bind-mounted into HAMi-core containers.
pub const VGPU_LOCK_DIR: &str = "/tmp/vgpulock";

/// The GPUEnvInject plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuEnvInject {
    hami_core_library: String,
}

impl GpuEnvInject {
    /// With this HAMi-core library path.
    pub fn new(hami_core_library: impl Into<String>) -> GpuEnvInject {
        GpuEnvInject { hami_core_library: hami_core_library.into() }
    }

    fn hami_core(&self, first: &super::devices::DeviceAllocation, change: &mut Change) -> anyhow::Result<()> {
        let get = |name: &str| first.resources.get(name).map(|q| q.value());
        let ratio = get(GPU_MEMORY_RATIO).ok_or_else(|| {
            anyhow::anyhow!("pod annotation {DEVICE_ALLOCATED}: HAMi-core pod, gpu entry 0 has no {GPU_MEMORY_RATIO}")
        })?;
        if ratio >= 100 {
            return Ok(());
        }
        let memory = get(GPU_MEMORY).ok_or_else(|| {
            anyhow::anyhow!(
                "pod annotation {DEVICE_ALLOCATED}: HAMi-core pod, gpu entry 0 has {GPU_MEMORY_RATIO} {ratio} but no {GPU_MEMORY}"
            )
        })?;
        change.envs.insert("CUDA_DEVICE_MEMORY_LIMIT".into(), memory.to_string());
        if let Some(core) = get(GPU_CORE) {
            change.envs.insert("CUDA_DEVICE_SM_LIMIT".into(), core.to_string());
        }
        change.envs.insert("LD_PRELOAD".into(), self.hami_core_library.clone());
        for path in [self.hami_core_library.as_str(), VGPU_LOCK_DIR] {
            change.add_mount(Mount {
                destination: path.into(),
                kind: "bind".into(),
                source: path.into(),
                options: vec!["rbind".into()],
            });
        }
        Ok(())
    }
}

impl Plugin for GpuEnvInject {
    fn name(&self) -> &'static str {
        "GPUEnvInject"
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreCreateContainer]
    }

    fn container(&self, _stage: Stage, c: &ContainerContext, _rules: &Rules) -> anyhow::Result<Change> {
        let gpus = device_allocations(&c.pod.annotations, "gpu")?;
        let Some(first) = gpus.first() else {
            return Ok(Change::default());
        };
        let mut minors = Vec::with_capacity(gpus.len());
        for (i, gpu) in gpus.iter().enumerate() {
            match gpu.minor {
                Some(m) if m >= 0 => minors.push(m.to_string()),
                Some(m) => anyhow::bail!("pod annotation {DEVICE_ALLOCATED}: gpu entry {i} has a negative minor {m}"),
                None => anyhow::bail!("pod annotation {DEVICE_ALLOCATED}: gpu entry {i} has no minor"),
            }
        }
        let mut change = Change::default();
        change.envs.insert(NVIDIA_VISIBLE_DEVICES.into(), minors.join(","));
        if c.pod.labels.get(GPU_ISOLATION_PROVIDER).map(String::as_str) == Some(HAMI_CORE) {
            self.hami_core(first, &mut change)?;
        }
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::PodContext;

    fn container(labels: &[(&str, &str)], annotation: Option<&str>) -> ContainerContext {
        let pod = PodContext {
            name: "p".into(),
            namespace: "ns".into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            annotations: annotation.map(|a| (DEVICE_ALLOCATED.to_string(), a.to_string())).into_iter().collect(),
            ..Default::default()
        };
        ContainerContext { pod, name: "main".into(), ..Default::default() }
    }

    fn run(labels: &[(&str, &str)], annotation: Option<&str>) -> anyhow::Result<Change> {
        GpuEnvInject::new("/usr/local/vgpu/libvgpu.so").container(
            Stage::PreCreateContainer,
            &container(labels, annotation),
            &Rules::default(),
        )
    }

    const TWO: &str = r#"{"gpu": [{"minor": 2, "resources": {"koordinator.sh/gpu-memory-ratio": 100}}, {"minor": 0}],
                          "rdma": [{"minor": 1, "id": "0000:09:00.0"}]}"#;
    const HALF: &str = r#"{"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-memory-ratio": 50,
                           "koordinator.sh/gpu-memory": "8Gi", "koordinator.sh/gpu-core": "30"}}]}"#;

    #[test]
    fn minors_in_annotation_order() {
        let change = run(&[], Some(TWO)).unwrap();
        assert_eq!(change.envs, [(NVIDIA_VISIBLE_DEVICES.to_string(), "2,0".to_string())].into());
        assert!(change.mounts.is_empty() && change.devices.is_empty());
        assert!(run(&[], None).unwrap().is_empty(), "no annotation");
        assert!(run(&[], Some(r#"{"rdma": [{"minor": 0}]}"#)).unwrap().is_empty(), "no gpu");
        assert!(run(&[], Some(r#"{"gpu": []}"#)).unwrap().is_empty(), "an empty gpu list");
    }

    #[test]
    fn hami_core_below_a_whole_gpu_gets_limits_preload_and_mounts() {
        let change = run(&[(GPU_ISOLATION_PROVIDER, HAMI_CORE)], Some(HALF)).unwrap();
        let env = |k: &str| change.envs.get(k).cloned();
        assert_eq!(env(NVIDIA_VISIBLE_DEVICES).as_deref(), Some("1"));
        assert_eq!(env("CUDA_DEVICE_MEMORY_LIMIT").as_deref(), Some("8589934592"));
        assert_eq!(env("CUDA_DEVICE_SM_LIMIT").as_deref(), Some("30"));
        assert_eq!(env("LD_PRELOAD").as_deref(), Some("/usr/local/vgpu/libvgpu.so"));
        let mounts: Vec<(&str, &str, &str)> =
            change.mounts.iter().map(|m| (m.source.as_str(), m.destination.as_str(), m.kind.as_str())).collect();
        assert_eq!(
            mounts,
            [
                ("/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/libvgpu.so", "bind"),
                ("/tmp/vgpulock", "/tmp/vgpulock", "bind")
            ]
        );
        assert!(change.mounts.iter().all(|m| m.options == ["rbind"]));
        // No gpu-core: no SM limit, the rest as before.
        let no_core = HALF.replace(r#", "koordinator.sh/gpu-core": "30""#, "");
        let change = run(&[(GPU_ISOLATION_PROVIDER, HAMI_CORE)], Some(&no_core)).unwrap();
        assert!(!change.envs.contains_key("CUDA_DEVICE_SM_LIMIT") && change.envs.contains_key("LD_PRELOAD"));
        // A whole GPU (ratio 100), or another provider: only the visible devices.
        assert_eq!(run(&[(GPU_ISOLATION_PROVIDER, HAMI_CORE)], Some(TWO)).unwrap().envs.len(), 1);
        assert_eq!(run(&[(GPU_ISOLATION_PROVIDER, "hami-core")], Some(HALF)).unwrap().envs.len(), 1, "case-sensitive");
        assert_eq!(run(&[], Some(HALF)).unwrap().envs.len(), 1);
    }

    #[test]
    fn bad_allocations_are_errors_naming_the_annotation() {
        let hami = [(GPU_ISOLATION_PROVIDER, HAMI_CORE)];
        for (labels, text, needle) in [
            (&[][..], "not json", "not a device allocation"),
            (&[][..], r#"{"gpu": [{"minor": 0}, {"resources": {}}]}"#, "gpu entry 1 has no minor"),
            (&[][..], r#"{"gpu": [{"minor": -1}]}"#, "gpu entry 0 has a negative minor -1"),
            (&hami[..], r#"{"gpu": [{"minor": 0}]}"#, "has no koordinator.sh/gpu-memory-ratio"),
            (
                &hami[..],
                r#"{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-memory-ratio": 25}}]}"#,
                "but no koordinator.sh/gpu-memory",
            ),
        ] {
            let e = format!("{:#}", run(labels, Some(text)).unwrap_err());
            assert!(e.contains(DEVICE_ALLOCATED) && e.contains(needle), "{text}: {e}");
        }
    }
}
