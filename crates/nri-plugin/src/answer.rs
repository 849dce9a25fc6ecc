//! The one writer of NRI answers for every plugin of the workspace: resource values, envs, annotations,
//! devices and mounts into a `ContainerAdjustment` (CreateContainer) or a `ContainerUpdate` (UpdateContainer,
//! Synchronize, the plugin's own updates). Pure functions.
//!
//! What to write is the caller's (runtime-hooks writes its plugins' changes, runtime-proxy what its hooks
//! changed); how it is spelled in NRI is here:
//!
//! * An answer carries only what it changes: every field left unset is left as the container has it. NRI reads
//!   an empty cpuset as "no change", so a cpuset cannot be cleared.
//! * CPU shares and period are unsigned in NRI (`OptionalUInt64`): a negative value is written as 0.
//! * A part with nothing set is absent (`linux.resources` without a value, `linux` without resources or
//!   devices), so an answer that changes nothing equals the default message.
//! * An update is never `ignore_failure`: a failed update is the runtime's error to report.

use std::collections::HashMap;

use crate::proto::api as nri;

/// Resource values to write into an NRI answer; `None` / empty = not set (left as it is).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceValues {
    /// CPU shares (cgroup v1 units; a negative value is written as 0).
    pub cpu_shares: Option<i64>,
    /// CFS quota in microseconds (-1: no limit).
    pub cpu_quota: Option<i64>,
    /// CFS period in microseconds (a negative value is written as 0).
    pub cpu_period: Option<i64>,
    /// Cpuset CPUs (`"0-3,8"`); `""`: not set.
    pub cpuset_cpus: String,
    /// Cpuset memory nodes; `""`: not set.
    pub cpuset_mems: String,
    /// Memory limit in bytes.
    pub memory_limit: Option<i64>,
    /// Memory + swap limit in bytes.
    pub memory_swap: Option<i64>,
    /// cgroup v2 unified entries (file name to value).
    pub unified: HashMap<String, String>,
    /// The RDT (resctrl) class; only a CreateContainer adjustment can set it.
    pub rdt_class: Option<String>,
}

impl ResourceValues {
    /// The values as NRI's `LinuxResources`, `None` when none is set.
    pub fn into_nri(self) -> Option<nri::LinuxResources> {
        let cpu = nri::LinuxCpu {
            shares: self.cpu_shares.map(|v| nri::OptionalUInt64 { value: v.max(0) as u64 }),
            quota: self.cpu_quota.map(|value| nri::OptionalInt64 { value }),
            period: self.cpu_period.map(|v| nri::OptionalUInt64 { value: v.max(0) as u64 }),
            cpus: self.cpuset_cpus,
            mems: self.cpuset_mems,
            ..Default::default()
        };
        let memory = nri::LinuxMemory {
            limit: self.memory_limit.map(|value| nri::OptionalInt64 { value }),
            swap: self.memory_swap.map(|value| nri::OptionalInt64 { value }),
            ..Default::default()
        };
        let resources = nri::LinuxResources {
            cpu: (cpu != nri::LinuxCpu::default()).then_some(cpu),
            memory: (memory != nri::LinuxMemory::default()).then_some(memory),
            unified: self.unified,
            rdt_class: self.rdt_class.map(|value| nri::OptionalString { value }),
            ..Default::default()
        };
        (resources != nri::LinuxResources::default()).then_some(resources)
    }
}

/// What a CreateContainer answer changes; each part empty / `None` = no change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Adjust {
    /// The changed resources ([`ResourceValues::into_nri`]).
    pub resources: Option<nri::LinuxResources>,
    /// Env vars to add or replace, `(name, value)`.
    pub env: Vec<(String, String)>,
    /// Annotations to add or replace.
    pub annotations: Vec<(String, String)>,
    /// Devices to add (`linux.devices`).
    pub devices: Vec<nri::LinuxDevice>,
    /// Mounts to add.
    pub mounts: Vec<nri::Mount>,
}

impl Adjust {
    /// The `ContainerAdjustment` (the default message when nothing changes).
    pub fn into_nri(self) -> nri::ContainerAdjustment {
        let Adjust { resources, env, annotations, devices, mounts } = self;
        nri::ContainerAdjustment {
            annotations: annotations.into_iter().collect(),
            mounts,
            env: env.into_iter().map(|(key, value)| nri::KeyValue { key, value }).collect(),
            linux: (resources.is_some() || !devices.is_empty()).then(|| nri::LinuxContainerAdjustment {
                devices,
                resources,
                ..Default::default()
            }),
        }
    }
}

/// An update of container `container_id`'s resources.
pub fn update(container_id: &str, resources: nri::LinuxResources) -> nri::ContainerUpdate {
    nri::ContainerUpdate {
        container_id: container_id.to_owned(),
        linux: Some(nri::LinuxContainerUpdate { resources: Some(resources) }),
        ignore_failure: false,
    }
}

/// The most the updates of one Synchronize answer or one `Runtime.UpdateContainers` request may
/// take, in encoded bytes: ttrpc's message limit ([`crate::wire::MAX_MESSAGE`], 4 MiB) less room
/// for the envelope (the ttrpc request or response around it).
pub const UPDATES_BUDGET: usize = crate::wire::MAX_MESSAGE - 64 * 1024;

/// `updates` in order, cut into parts of at most `budget` encoded bytes each (as repeated fields
/// of one message); an update larger than `budget` alone is a part of its own (the runtime
/// refuses that message, and says so). No part is empty; no updates is no part.
pub fn in_parts(updates: Vec<nri::ContainerUpdate>, budget: usize) -> Vec<Vec<nri::ContainerUpdate>> {
    use prost::Message;
    let mut parts: Vec<Vec<nri::ContainerUpdate>> = Vec::new();
    let mut size = 0;
    for u in updates {
        let len = u.encoded_len();
        // the field's tag (1 byte) and length prefix
        let len = len + 1 + prost::length_delimiter_len(len);
        match parts.last_mut() {
            Some(part) if size + len <= budget => part.push(u),
            _ => {
                parts.push(vec![u]);
                size = 0;
            }
        }
        size += len;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_set_is_nothing_written() {
        assert_eq!(ResourceValues::default().into_nri(), None);
        assert_eq!(Adjust::default().into_nri(), nri::ContainerAdjustment::default());
    }

    #[test]
    fn values_in_nri_units() {
        let r =
            ResourceValues { cpu_shares: Some(-2), cpu_period: Some(-1), cpu_quota: Some(-1), ..Default::default() };
        let cpu = r.into_nri().unwrap().cpu.unwrap();
        assert_eq!((cpu.shares.unwrap().value, cpu.period.unwrap().value, cpu.quota.unwrap().value), (0, 0, -1));
        let r = ResourceValues { memory_swap: Some(5), ..Default::default() }.into_nri().unwrap();
        assert_eq!((r.cpu, r.memory.unwrap().swap.unwrap().value), (None, 5));
        let r = ResourceValues { rdt_class: Some("gold".into()), ..Default::default() }.into_nri().unwrap();
        assert_eq!((r.cpu, r.memory, r.rdt_class.unwrap().value), (None, None, "gold".to_string()));
        let unified = HashMap::from([("memory.high".to_string(), "1".to_string())]);
        assert_eq!(
            ResourceValues { unified: unified.clone(), ..Default::default() }.into_nri().unwrap().unified,
            unified
        );
    }

    #[test]
    fn linux_part_only_with_resources_or_devices() {
        let adj = Adjust {
            env: vec![("K".into(), "v".into())],
            annotations: vec![("a".into(), "1".into())],
            ..Default::default()
        };
        let adj = adj.into_nri();
        assert_eq!(
            (adj.env[0].key.as_str(), adj.env[0].value.as_str(), adj.annotations["a"].as_str()),
            ("K", "v", "1")
        );
        assert_eq!(adj.linux, None);
        let dev = nri::LinuxDevice { path: "/dev/x".into(), ..Default::default() };
        let linux = Adjust { devices: vec![dev.clone()], ..Default::default() }.into_nri().linux.unwrap();
        assert_eq!((linux.devices, linux.resources), (vec![dev], None));
        let u = update("c1", nri::LinuxResources::default());
        assert_eq!((u.container_id.as_str(), u.ignore_failure), ("c1", false));
    }

    #[test]
    fn updates_in_parts_under_the_budget() {
        use prost::Message;
        let u = |i: usize| {
            update(
                &format!("c{i:03}"),
                ResourceValues { cpu_shares: Some(2), ..Default::default() }.into_nri().unwrap(),
            )
        };
        let one = nri::SynchronizeResponse { update: vec![u(0)], more: false }.encoded_len();
        let all: Vec<_> = (0..100).map(u).collect();
        let parts = in_parts(all.clone(), one * 10);
        assert_eq!(parts.concat(), all, "in order, none lost");
        assert_eq!(parts.len(), 10, "{:?}", parts.iter().map(Vec::len).collect::<Vec<_>>());
        for p in &parts {
            let size = nri::SynchronizeResponse { update: p.clone(), more: false }.encoded_len();
            assert!(size <= one * 10, "{size}");
        }
        assert_eq!(in_parts(all.clone(), 1).len(), 100, "one each when each passes the budget");
        assert!(in_parts(Vec::new(), 10).is_empty());
    }
}
