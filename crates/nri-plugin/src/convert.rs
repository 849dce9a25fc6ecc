//! NRI's pods and containers read as the hook protocol reads them, for every plugin of the
//! workspace: maps and env lists whose bytes are UTF-8, resources in CRI units. Pure functions.
//!
//! Labels, annotations and env arrive as bytes (`proto/nri/api.proto`): what is not UTF-8 is left out, by
//! the workspace's one rule ([`hook_api::utf8`]).

use std::collections::BTreeMap;

use hook_api::utf8::utf8_map;
use hook_api::v1alpha1::LinuxContainerResources;

use crate::proto::api as nri;

/// NRI map entries (bytes) as a map, by [`utf8_map`]'s rule: of a duplicated key the last entry decides, and
/// what is not UTF-8 is left out.
pub fn map_of(entries: &[nri::BytesEntry]) -> BTreeMap<String, String> {
    utf8_map(entries.iter().map(|e| (e.key.as_slice(), e.value.as_slice())))
}

/// `KEY=VALUE` strings as a map (a string without `=` is a key with an empty value).
pub fn envs(env: &[String]) -> BTreeMap<String, String> {
    env.iter()
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (kv.clone(), String::new()),
        })
        .collect()
}

/// NRI resources in CRI units (0 / `""` = not set): CPU shares, quota and period, memory and
/// swap limit (bytes), cpuset CPUs and memory nodes, cgroup v2 unified entries.
pub fn cri_resources(r: &nri::LinuxResources) -> LinuxContainerResources {
    let cpu = r.cpu.clone().unwrap_or_default();
    let mem = r.memory.unwrap_or_default();
    LinuxContainerResources {
        cpu_period: cpu.period.map(|v| v.value as i64).unwrap_or(0),
        cpu_quota: cpu.quota.map(|v| v.value).unwrap_or(0),
        cpu_shares: cpu.shares.map(|v| v.value as i64).unwrap_or(0),
        memory_limit_in_bytes: mem.limit.map(|v| v.value).unwrap_or(0),
        memory_swap_limit_in_bytes: mem.swap.map(|v| v.value).unwrap_or(0),
        cpuset_cpus: cpu.cpus,
        cpuset_mems: cpu.mems,
        unified: r.unified.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        ..Default::default()
    }
}
