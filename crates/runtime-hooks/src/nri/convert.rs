//! NRI's pods and containers to the plugins' contexts, and the plugins' [`Change`] to NRI's
//! answers. Pure functions.
//!
//! | NRI | context |
//! |---|---|
//! | `PodSandbox.name`, `namespace`, `uid`, `labels`, `annotations` | the same [`PodContext`] fields |
//! | `PodSandbox.linux.cgroup_parent` | `cgroup_parent` (kubelet's, as containerd got it) |
//! | `Container.name` (the CRI metadata name), `id`, `annotations` | the same [`ContainerContext`] fields |
//! | `Container.env` (`KEY=VALUE` strings) | `envs` |
//!
//! NRI mode decodes only what is read ([`super::reads`]): a container's annotations and env
//! arrive empty there, and so are they in the context.
//!
//! Labels, annotations and env arrive as bytes (`proto/nri/api.proto`): an entry whose key or
//! value is not UTF-8 is left out of the context ([`crate::lenient`]), and the container is
//! handled like any other; adjustments carry only the plugins' changes, so what was left out
//! stays as the container has it.
//! | `Container.linux.resources` (or an update's new resources) | `resources` in CRI units |
//!
//! | [`Change`] | `ContainerAdjustment` (CreateContainer) | `ContainerUpdate` (UpdateContainer, Synchronize, rule changes) |
//! |---|---|---|
//! | `cpu_shares`, `cpu_quota`, `cpu_period` | `linux.resources.cpu` | `linux.resources.cpu` |
//! | `memory_limit_in_bytes` | `linux.resources.memory.limit`, and `swap` the same (as kubelet: no swap beyond the limit) | the same |
//! | `cpuset_cpus` | `linux.resources.cpu.cpus`; `""` (clear: BestEffort pods) becomes the pod's CPUs, since NRI reads `""` as "no change" | the same |
//! | `envs` | `env` | – (cannot change after creation) |
//! | `annotations` | `annotations` | – |
//! | `cgroup_parent` | – (NRI cannot move a container to another pod cgroup) | – |
//! | `devices` | `linux.devices` (`LinuxDevice`: path, type, major, minor, `file_mode`, `uid`, `gid`; containerd also allows each in the device cgroup) | – (cannot change after creation) |
//! | `mounts` | `mounts` (`Mount`: destination, type, source, options) | – |
//! | `pod_cgroup` | written by runtime-hooks itself | the same |

use std::collections::BTreeMap;

use crate::change::{Change, Device, Mount, Resources};
use crate::context::{ContainerContext, PodContext};
use hook_api::utf8::utf8_strings;
use nri_plugin::answer::{self, Adjust, ResourceValues};
use nri_plugin::proto::api as nri;

pub use nri_plugin::convert::{cri_resources, envs, map_of};

/// The plugins' view of an NRI pod.
pub fn pod_context(pod: &nri::PodSandbox) -> PodContext {
    PodContext {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        uid: pod.uid.clone(),
        labels: map_of(&pod.labels),
        annotations: map_of(&pod.annotations),
        cgroup_parent: pod.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        resources: None,
    }
}

/// The plugins' view of an NRI container; `resources` overrides the container's own (the new
/// resources of an UpdateContainer).
pub fn container_context(
    pod: &nri::PodSandbox,
    container: &nri::Container,
    resources: Option<&nri::LinuxResources>,
) -> ContainerContext {
    let resources = resources.or_else(|| container.linux.as_ref().and_then(|l| l.resources.as_ref()));
    ContainerContext {
        pod: pod_context(pod),
        name: container.name.clone(),
        id: container.id.clone(),
        annotations: map_of(&container.annotations),
        envs: envs(&utf8_strings(&container.env)),
        resources: resources.map(cri_resources),
    }
}

/// The set fields of `r` as NRI resources, `None` when nothing is set. `shared_cpus` gives the
/// CPUs of the shared pool for a cpuset of `""`; when it has none, the cpuset is left alone.
pub fn nri_resources(r: &Resources, shared_cpus: impl FnOnce() -> Option<String>) -> Option<nri::LinuxResources> {
    resource_values(r, shared_cpus).into_nri()
}

/// The set fields of `r` as the values NRI's answer writer ([`nri_plugin::answer`]) writes: a cpuset of `""`
/// spelled out by `shared_cpus`, a memory limit (when positive) with swap the same (kubelet's no swap beyond
/// the limit).
fn resource_values(r: &Resources, shared_cpus: impl FnOnce() -> Option<String>) -> ResourceValues {
    let cpuset_cpus = match r.cpuset_cpus.as_deref() {
        Some("") => shared_cpus().unwrap_or_default(),
        Some(c) => c.to_owned(),
        None => String::new(),
    };
    let memory = r.memory_limit_in_bytes.filter(|v| *v > 0);
    ResourceValues {
        cpu_shares: r.cpu_shares,
        cpu_quota: r.cpu_quota,
        cpu_period: r.cpu_period,
        cpuset_cpus,
        memory_limit: memory,
        memory_swap: memory,
        ..Default::default()
    }
}

/// A CreateContainer answer: resources (with the change's RDT class), envs, annotations, devices and mounts of
/// the change. The change's `cgroup_parent` cannot be expressed (the caller logs it).
pub fn adjustment(change: &Change, shared_cpus: impl FnOnce() -> Option<String>) -> nri::ContainerAdjustment {
    let resources =
        ResourceValues { rdt_class: change.rdt_class.clone(), ..resource_values(&change.resources, shared_cpus) };
    let pairs = |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    Adjust {
        resources: resources.into_nri(),
        env: pairs(&change.envs),
        annotations: pairs(&change.annotations),
        devices: change.devices.iter().map(nri_device).collect(),
        mounts: change.mounts.iter().map(nri_mount).collect(),
    }
    .into_nri()
}

/// A device of a change as NRI's `LinuxDevice` (unset mode, uid, gid: absent).
pub fn nri_device(d: &Device) -> nri::LinuxDevice {
    nri::LinuxDevice {
        path: d.path.clone(),
        r#type: d.kind.as_str().to_owned(),
        major: d.major,
        minor: d.minor,
        file_mode: d.file_mode.map(|value| nri::OptionalFileMode { value }),
        uid: d.uid.map(|value| nri::OptionalUInt32 { value }),
        gid: d.gid.map(|value| nri::OptionalUInt32 { value }),
    }
}

/// A mount of a change as NRI's `Mount`.
pub fn nri_mount(m: &Mount) -> nri::Mount {
    nri::Mount {
        destination: m.destination.clone(),
        r#type: m.kind.clone(),
        source: m.source.clone(),
        options: m.options.clone(),
    }
}

/// An update of a created container's resources, `None` when the change sets none.
pub fn update(
    container_id: &str,
    change: &Change,
    shared_cpus: impl FnOnce() -> Option<String>,
) -> Option<nri::ContainerUpdate> {
    nri_resources(&change.resources, shared_cpus).map(|resources| answer::update(container_id, resources))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(k: &str, v: &[u8]) -> nri::BytesEntry {
        nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.to_vec() }
    }

    fn pod() -> nri::PodSandbox {
        nri::PodSandbox {
            id: "sb".into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            labels: vec![entry("koordinator.sh/qosClass", b"BE")],
            annotations: vec![entry("note", b"\xff\xfe"), entry("ok", b"yes")],
            linux: Some(nri::LinuxPodSandbox {
                cgroup_parent: "/kubepods/besteffort/podu".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn contexts_from_nri() {
        let c = nri::Container {
            id: "c1".into(),
            name: "main".into(),
            env: vec![b"PATH=/bin".to_vec(), b"A=b=c".to_vec(), b"BARE".to_vec(), b"TOKEN=\xff\x80".to_vec()],
            annotations: vec![entry("c", b"1"), entry("bad", b"\xc3")],
            linux: Some(nri::LinuxContainer {
                resources: Some(nri::LinuxResources {
                    cpu: Some(nri::LinuxCpu {
                        shares: Some(nri::OptionalUInt64 { value: 2 }),
                        period: Some(nri::OptionalUInt64 { value: 100_000 }),
                        cpus: "0-1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let ctx = container_context(&pod(), &c, None);
        assert_eq!((ctx.key(), ctx.id.as_str()), ("ns/p/main".to_string(), "c1"));
        assert_eq!(ctx.pod.qos(), crate::context::QosClass::Be);
        assert_eq!(ctx.pod.kube_qos(), crate::context::KubeQos::BestEffort);
        assert_eq!((ctx.envs["PATH"].as_str(), ctx.envs["A"].as_str(), ctx.envs["BARE"].as_str()), ("/bin", "b=c", ""));
        assert!(!ctx.envs.contains_key("TOKEN"), "an env that is not UTF-8 is left out");
        assert_eq!(ctx.annotations, [("c".to_string(), "1".to_string())].into());
        assert_eq!(ctx.pod.annotations, [("ok".to_string(), "yes".to_string())].into());
        let r = ctx.resources.unwrap();
        assert_eq!((r.cpu_shares, r.cpu_period, r.cpu_quota, r.cpuset_cpus.as_str()), (2, 100_000, 0, "0-1"));
        let new = nri::LinuxResources {
            memory: Some(nri::LinuxMemory { limit: Some(nri::OptionalInt64 { value: 5 }), ..Default::default() }),
            ..Default::default()
        };
        let ctx = container_context(&pod(), &c, Some(&new));
        assert_eq!(ctx.resources.unwrap().memory_limit_in_bytes, 5, "an update's resources win");
        assert_eq!(
            pod_context(&nri::PodSandbox::default()),
            PodContext::default(),
            "absent parts are empty, not a panic"
        );
    }

    #[test]
    fn changes_to_adjustments_and_updates() {
        let change = Change {
            resources: Resources {
                cpu_shares: Some(512),
                cpu_quota: Some(-1),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(134_217_728),
                cpuset_cpus: Some(String::new()),
            },
            envs: [("K".to_string(), "v".to_string())].into(),
            annotations: [("a".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let adj = adjustment(&change, || Some("0-3".into()));
        assert_eq!(adj.env, vec![nri::KeyValue { key: "K".into(), value: "v".into() }]);
        assert_eq!(adj.annotations["a"], "1");
        let r = adj.linux.unwrap().resources.unwrap();
        let cpu = r.cpu.unwrap();
        assert_eq!(
            (cpu.shares.unwrap().value, cpu.quota.unwrap().value, cpu.period.unwrap().value),
            (512, -1, 100_000)
        );
        assert_eq!(cpu.cpus, "0-3", "\"\" is the shared pool spelled out");
        let mem = r.memory.unwrap();
        assert_eq!((mem.limit.unwrap().value, mem.swap.unwrap().value), (134_217_728, 134_217_728));

        // Without a shared pool to name, the cpuset is left alone.
        let only_cpuset = Change {
            resources: Resources { cpuset_cpus: Some(String::new()), ..Default::default() },
            ..Default::default()
        };
        assert_eq!(adjustment(&only_cpuset, || None).linux, None);
        assert_eq!(update("c", &only_cpuset, || None), None);
        let u = update("c", &change, || None).unwrap();
        assert_eq!(u.container_id, "c");
        let cpu = u.linux.unwrap().resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.shares.unwrap().value, cpu.cpus.as_str()), (512, ""));
        assert_eq!(update("c", &Change::default(), || None), None);
        // The RDT class (Resctrl) rides in the adjustment's resources, alone or with others.
        let rdt = Change { rdt_class: Some("koordlet-u".into()), ..Default::default() };
        let r = adjustment(&rdt, || None).linux.unwrap().resources.unwrap();
        assert_eq!(r.rdt_class, Some(nri::OptionalString { value: "koordlet-u".into() }));
        assert_eq!(r.cpu, None);
        assert_eq!(update("c", &rdt, || None), None, "not an update: a running container keeps its class");
        assert_eq!(adjustment(&Change::default(), || None), nri::ContainerAdjustment::default());
    }

    /// Devices become `linux.devices` (with or without resources), mounts `mounts`; an update
    /// carries neither (a created container's devices and mounts cannot change).
    #[test]
    fn devices_and_mounts_to_the_adjustment() {
        use crate::change::DeviceKind;
        let change = Change {
            devices: vec![Device {
                path: "/dev/infiniband/uverbs0".into(),
                kind: DeviceKind::Char,
                major: 231,
                minor: 192,
                file_mode: Some(0o666),
                uid: None,
                gid: Some(5),
            }],
            mounts: vec![Mount {
                destination: "/tmp/vgpulock".into(),
                kind: "bind".into(),
                source: "/tmp/vgpulock".into(),
                options: vec!["rbind".into()],
            }],
            ..Default::default()
        };
        let adj = adjustment(&change, || None);
        let linux = adj.linux.expect("linux part for the devices");
        assert_eq!(linux.resources, None);
        assert_eq!(
            linux.devices,
            vec![nri::LinuxDevice {
                path: "/dev/infiniband/uverbs0".into(),
                r#type: "c".into(),
                major: 231,
                minor: 192,
                file_mode: Some(nri::OptionalFileMode { value: 0o666 }),
                uid: None,
                gid: Some(nri::OptionalUInt32 { value: 5 }),
            }]
        );
        assert_eq!(adj.mounts.len(), 1);
        assert_eq!(
            (adj.mounts[0].destination.as_str(), adj.mounts[0].r#type.as_str(), adj.mounts[0].source.as_str()),
            ("/tmp/vgpulock", "bind", "/tmp/vgpulock")
        );
        assert_eq!(adj.mounts[0].options, ["rbind"]);
        assert_eq!(update("c", &change, || None), None);
    }
}
