//! The store's entries read from a runtime's verbose status answers (`PodSandboxStatus`,
//! `ContainerStatus` with `verbose = true`): pure functions of the decoded answer, used by restart
//! recovery and store misses ([`crate::cri::recover`]).
//!
//! # What containerd records (verified on 1.6.20 and 1.7.24)
//!
//! Both versions answer a verbose status with one `info` key holding a JSON object; the keys used
//! here are identical in 1.6 and 1.7 (samples in `tests/fixtures/containerd-1.{6,7}/`):
//!
//! * sandbox: `pid`, `processStatus`, `runtimeHandler`, `runtimeType`, `config` (the
//!   `PodSandboxConfig` of the RunPodSandbox call, Go `encoding/json` of the CRI struct: snake_case
//!   keys such as `linux.cgroup_parent`, enums as numbers, empty fields omitted) and
//!   `runtimeSpec` (the pause container's OCI spec; `linux.cgroupsPath` = `<cgroup parent>/<id>`);
//! * container: `sandboxID`, `pid`, `config` (the `ContainerConfig` of the CreateContainer call:
//!   `envs`, `annotations`, `linux.resources` as created) and `runtimeSpec` (`process.env`,
//!   `process.oomScoreAdj`, `linux.resources`, `linux.cgroupsPath`), the spec being updated by
//!   every `UpdateContainerResources`, the `config` not;
//! * `ContainerStatus.resources.linux` (typed) is containerd's conversion of the spec's current
//!   resources (after updates, swap defaulted, oom score clamped): all zero for a container created
//!   without resources.
//!
//! The key fact: `config` is not what kubelet sent but what containerd **received — from the
//! proxy**, which had already applied the PreRunPodSandbox / PreCreateContainer hooks' changes to
//! the request. So `config` holds exactly the hook-merged labels, annotations and cgroup parent
//! that the store held, and the spec and status hold what was applied since.
//!
//! # Where each field comes from
//!
//! The store held the hook requests *after* the hooks' changes; a recovered entry must equal it.
//! Rule: take what the runtime actually applied, from the most direct record of it.
//!
//! Pod sandbox entry (`PodSandboxHookRequest`):
//!
//! | field | source | why |
//! |---|---|---|
//! | `pod_meta` (name, uid, namespace, attempt) | `PodSandboxStatus.metadata` | hooks cannot change it |
//! | `runtime_handler` | `PodSandboxStatus.runtime_handler`, else `info.runtimeHandler` | as RunPodSandbox carried it |
//! | `labels`, `annotations` | `PodSandboxStatus.labels` / `.annotations` | containerd returns the maps it received: kubelet's plus the PreRunPodSandbox hooks' (= `info.config`) |
//! | `cgroup_parent` | `info.config.linux.cgroup_parent`; fallback: `info.runtimeSpec.linux.cgroupsPath` minus its last element (cgroupfs `/parent/<id>`, systemd `parent.slice:cri-containerd:<id>`) | the parent containerd put the pod under, after the hooks' change |
//! | `overhead`, `resources` | `info.config.linux.overhead` / `.resources` | built from the config at RunPodSandbox (hooks' answers for them are ignored) |
//!
//! Container entry (`ContainerResourceHookRequest`, plus its sandbox ID):
//!
//! | field | source | why |
//! |---|---|---|
//! | sandbox ID | `ListContainers` `pod_sandbox_id` | |
//! | `pod_meta`, `pod_labels`, `pod_annotations`, `pod_resources` | the pod entry in the store (recovered, or written by live traffic) | as at CreateContainer, which copies them from the pod entry |
//! | `pod_cgroup_parent` | the container's `info.runtimeSpec.linux.cgroupsPath` minus its last element, when it differs from the pod entry's parent (the pod entry's spelling otherwise; the pod entry's when the pod has none or the path cannot be parsed) | containerd puts the container under the `sandbox_config.linux.cgroup_parent` of the CreateContainer call (checked on 1.6 and 1.7), so a PreCreateContainer hook's change of it is applied — and was in the store |
//! | `container_meta.name`, `.attempt` | `ContainerStatus.metadata` | |
//! | `container_meta.id` | the container ID | |
//! | `container_annotations` | `ContainerStatus.annotations` | the CreateContainer annotations containerd received (kubelet's + PreCreateContainer hooks') |
//! | `container_resources` | `ContainerStatus.resources.linux`, swap normalised (below); fallback: `info.runtimeSpec` `linux.resources` + `process.oomScoreAdj` (the mapping containerd itself uses); last resort `info.config.linux.resources` (as created, without later updates) | applied resources, including every UpdateContainerResources — what the store had merged in |
//! | `container_envs` | none | the store keeps no envs ([`crate::hooks::store`]): the later stages send none |
//!
//! Values that legitimately differ from the pre-restart store:
//!
//! * `memory_swap_limit_in_bytes`: when none is requested, containerd sets swap = memory limit
//!   (swap controller present). Normalised back: if the created config asked for no swap and the
//!   applied swap equals the applied memory limit, it is reported as 0, as the store had it.
//!   A client that asks for a swap limit explicitly (even one equal to the memory limit) has it
//!   in the config, and the applied value is kept.
//! * `oom_score_adj`: the applied score. Differs from the requested one only where containerd
//!   clamps it (`restrict_oom_score_adj`, e.g. −998 → 0).
//! * `hugepage_limits`: the applied ones; containerd drops them where no hugetlb controller is
//!   available (on the test VMs it is only in the cgroup v2 hierarchy of a hybrid layout).
//! * Changes that never reached the runtime are lost: container annotations sent with
//!   UpdateContainerResources and a PreUpdateContainerResources hook's annotation changes (checked:
//!   containerd records neither), every PreStartContainer hook change (StartContainer carries
//!   nothing to apply them to), a PreUpdateContainerResources hook's `pod_cgroup_parent` (the
//!   container stays where it was created: the recovered value is the one in effect).
//!
//! An object whose fields cannot all be determined (no status, no metadata, no verbose info and
//! no fallback; a container without verbose info, whose cgroup parent cannot be told) is
//! skipped — logged and listed in the report — rather than recorded with empty values: a
//! missing entry makes the proxy skip that object's hooks, an entry with an empty
//! cgroup parent would make koordlet take wrong decisions. Fallbacks used are listed too.

use std::borrow::Cow;
use std::collections::BTreeMap;

use hook_api::convert;
use hook_api::v1alpha1 as hook;
use serde_json::{Map, Value};

use crate::cri::{hooked_fields, info_view};
use crate::hooks::store::ContainerOwn;

/// The pod sandbox entry for a verbose `PodSandboxStatus` answer, and the fallbacks used. Label and
/// annotation values that are not UTF-8 are left out, as in hook requests ([`hooked_fields::utf8_entries`]).
///
/// Errors: why the entry cannot be built (no status or metadata, no cgroup parent source).
pub fn pod_entry(
    answer: hooked_fields::PodSandboxStatusResponse,
) -> Result<(hook::PodSandboxHookRequest, Vec<String>), String> {
    let status = answer.status.ok_or("no status in PodSandboxStatus")?;
    let meta = status.metadata.as_ref().ok_or("no metadata in PodSandboxStatus")?;
    let info = verbose_info(&answer.info);
    let config = info.as_ref().and_then(|i| obj(i, "config"));
    let linux = config.and_then(|c| obj(c, "linux"));
    let mut notes = Vec::new();

    let cgroup_parent = match (config, linux) {
        (Some(_), Some(l)) => string(l, "cgroup_parent").unwrap_or_default(),
        (Some(_), None) => String::new(),
        (None, _) => {
            let spec_path =
                info.as_ref().and_then(|i| path(i, &["runtimeSpec", "linux", "cgroupsPath"])).and_then(Value::as_str);
            match spec_path.and_then(|p| cgroup_parent_of(p, &status.id)) {
                Some(p) => {
                    notes.push(format!("cgroup parent from the runtime spec's cgroupsPath {:?}", spec_path.unwrap_or("")));
                    p
                }
                None if info.is_none() => return Err("no verbose info: cannot tell the pod cgroup parent".into()),
                None => {
                    return Err(
                        "verbose info has neither config nor runtimeSpec.linux.cgroupsPath: cannot tell the pod cgroup parent".into()
                    )
                }
            }
        }
    };
    let runtime_handler = if status.runtime_handler.is_empty() {
        info.as_ref().and_then(|i| string(i, "runtimeHandler")).unwrap_or_default()
    } else {
        status.runtime_handler.clone()
    };
    let pod = hook::PodSandboxHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            attempt: meta.attempt,
        }),
        runtime_handler,
        labels: hooked_fields::into_utf8_entries(status.labels),
        annotations: hooked_fields::into_utf8_entries(status.annotations),
        cgroup_parent,
        overhead: linux.and_then(|l| obj(l, "overhead")).map(cri_resources),
        resources: linux.and_then(|l| obj(l, "resources")).map(cri_resources),
    };
    Ok((pod, notes))
}

/// The container hook request for a verbose `ContainerStatus` answer of container `id` in
/// `pod`, and the fallbacks used: [`container_own`] with the pod's fields.
///
/// Errors: as [`container_own`].
pub fn container_entry(
    answer: hooked_fields::ContainerStatusResponse,
    id: &str,
    pod: &hook::PodSandboxHookRequest,
) -> Result<(hook::ContainerResourceHookRequest, Vec<String>), String> {
    let (own, notes) = container_own(answer, id, &pod.cgroup_parent)?;
    let hook = hook::ContainerResourceHookRequest {
        pod_meta: pod.pod_meta.clone(),
        container_meta: own.container_meta,
        container_annotations: own.container_annotations,
        container_resources: own.container_resources,
        pod_resources: pod.resources.clone(),
        pod_annotations: pod.annotations.clone(),
        pod_labels: pod.labels.clone(),
        pod_cgroup_parent: own.cgroup_parent,
        // Not kept (see `crate::hooks::store`).
        container_envs: BTreeMap::new(),
    };
    Ok((hook, notes))
}

/// The container's own fields for a verbose `ContainerStatus` answer of container `id` whose pod
/// sandbox has the cgroup parent `pod_parent`, and the fallbacks used.
///
/// Annotation values that are not UTF-8 are left out, as in hook requests.
///
/// Errors: why the entry cannot be built (no status or metadata, no source for resources, no
/// verbose info to tell the container's cgroup parent by).
pub fn container_own(
    answer: hooked_fields::ContainerStatusResponse,
    id: &str,
    pod_parent: &str,
) -> Result<(ContainerOwn, Vec<String>), String> {
    let status = answer.status.ok_or("no status in ContainerStatus")?;
    let meta = status.metadata.as_ref().ok_or("no metadata in ContainerStatus")?;
    let info = verbose_info(&answer.info);
    let config = info.as_ref().and_then(|i| obj(i, "config"));
    let spec = info.as_ref().and_then(|i| obj(i, "runtimeSpec"));
    let requested = config.and_then(|c| path(c, &["linux", "resources"])).and_then(Value::as_object).map(cri_resources);
    let mut notes = Vec::new();

    let applied = status.resources.as_ref().and_then(|r| r.linux.as_ref()).map(convert::to_hook);
    let mut resources = match (applied, spec.and_then(spec_resources), &requested) {
        (Some(r), _, _) => r,
        (None, Some(r), _) => {
            notes.push("resources from the runtime spec (ContainerStatus has none)".into());
            r
        }
        (None, None, Some(r)) if config.is_some() => {
            notes.push("resources as created (no applied resources reported: later updates are missing)".into());
            r.clone()
        }
        _ => return Err("no resources in ContainerStatus and no verbose info to read them from".into()),
    };
    if config.is_some() {
        // The swap the CreateContainer config asked for (absent = 0).
        normalise_swap(&mut resources, requested.as_ref().map_or(0, |r| r.memory_swap_limit_in_bytes));
    }

    if info.is_none() {
        // A PreCreateContainer hook may have moved the container: only the spec tells.
        return Err("no verbose info: cannot tell the container's cgroup parent".into());
    }

    let own = ContainerOwn {
        container_meta: Some(hook::ContainerMetadata {
            name: meta.name.clone(),
            attempt: meta.attempt,
            id: id.to_owned(),
        }),
        container_annotations: hooked_fields::into_utf8_entries(status.annotations),
        container_resources: Some(resources),
        cgroup_parent: container_cgroup_parent(spec, id, pod_parent),
    };
    Ok((own, notes))
}

/// The parent the container's cgroup was created under (its spec's `cgroupsPath` without the
/// last element), when it differs from the pod's `pod_parent`; `pod_parent` otherwise, and when
/// the pod has none (containerd then uses a default location nobody chose) or the path cannot
/// be parsed.
fn container_cgroup_parent(spec: Option<&Map<String, Value>>, id: &str, pod_parent: &str) -> String {
    let applied = spec
        .and_then(|s| path(s, &["linux", "cgroupsPath"]))
        .and_then(Value::as_str)
        .and_then(|p| cgroup_parent_of(p, id));
    match applied {
        Some(p) if !pod_parent.is_empty() && p.trim_end_matches('/') != pod_parent.trim_end_matches('/') => p,
        _ => pod_parent.to_owned(),
    }
}

/// Undoes containerd's swap default: with no swap requested (`asked` = 0) containerd applies
/// swap = memory limit, which the store never had.
fn normalise_swap(r: &mut hook::LinuxContainerResources, asked: i64) {
    if asked == 0 && r.memory_limit_in_bytes > 0 && r.memory_swap_limit_in_bytes == r.memory_limit_in_bytes {
        r.memory_swap_limit_in_bytes = 0;
    }
}

/// The JSON object of a verbose `info` map: containerd's single `info` key, else the first
/// value that is a JSON object (other runtimes). None when there is none. Only the keys read
/// here are kept ([`info_view::WANTED`]).
fn verbose_info(info: &hooked_fields::Text) -> Option<Map<String, Value>> {
    // Read lossily: containerd writes JSON, which is UTF-8 (then nothing is copied). `from_utf8`
    // first: its check is several times faster than `from_utf8_lossy`'s on valid text (+4 % of
    // recovery's instructions at 1,000 pods × 4, counted with callgrind).
    let parse = |v: &Vec<u8>| {
        let text = std::str::from_utf8(v).map_or_else(|_| String::from_utf8_lossy(v), Cow::Borrowed);
        info_view::parse_object(&text, info_view::WANTED)
    };
    if let Some(m) = info.get("info").and_then(parse) {
        return Some(m);
    }
    info.values().find_map(parse)
}

/// The parent of an OCI `cgroupsPath` for the object `id`: cgroupfs `/a/b/<id>` → `/a/b`,
/// systemd `parent.slice:prefix:<id>` → `parent.slice`. None when the path does not end in the
/// object's own element.
fn cgroup_parent_of(cgroups_path: &str, id: &str) -> Option<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    if parts.len() == 3 && !parts[0].contains('/') {
        return (parts[2] == id || parts[2].contains(id)).then(|| parts[0].to_owned());
    }
    let (parent, last) = cgroups_path.rsplit_once('/')?;
    (!id.is_empty() && last.contains(id)).then(|| parent.to_owned())
}

/// CRI `LinuxContainerResources` as Go's `encoding/json` writes it (snake_case, as containerd's
/// `config`); protobuf JSON's camelCase names are accepted too. Missing or odd values are 0.
fn cri_resources(r: &Map<String, Value>) -> hook::LinuxContainerResources {
    let int = |names: &[&str]| names.iter().find_map(|n| r.get(*n).and_then(int_of)).unwrap_or(0);
    let text = |names: &[&str]| names.iter().find_map(|n| r.get(*n).and_then(Value::as_str)).unwrap_or("").to_owned();
    let hugepages = ["hugepage_limits", "hugepageLimits"].iter().find_map(|n| r.get(*n).and_then(Value::as_array));
    hook::LinuxContainerResources {
        cpu_period: int(&["cpu_period", "cpuPeriod"]),
        cpu_quota: int(&["cpu_quota", "cpuQuota"]),
        cpu_shares: int(&["cpu_shares", "cpuShares"]),
        memory_limit_in_bytes: int(&["memory_limit_in_bytes", "memoryLimitInBytes"]),
        oom_score_adj: int(&["oom_score_adj", "oomScoreAdj"]),
        cpuset_cpus: text(&["cpuset_cpus", "cpusetCpus"]),
        cpuset_mems: text(&["cpuset_mems", "cpusetMems"]),
        hugepage_limits: hugepages.map(|l| hugepage_limits(l, &["page_size", "pageSize"])).unwrap_or_default(),
        unified: string_map(r.get("unified")),
        memory_swap_limit_in_bytes: int(&["memory_swap_limit_in_bytes", "memorySwapLimitInBytes"]),
    }
}

/// The resources of an OCI runtime spec (`linux.resources`, `process.oomScoreAdj`), mapped as
/// containerd maps them to `ContainerStatus.resources`. None without `linux.resources`.
fn spec_resources(spec: &Map<String, Value>) -> Option<hook::LinuxContainerResources> {
    let res = path(spec, &["linux", "resources"])?.as_object()?;
    let cpu = obj(res, "cpu");
    let mem = obj(res, "memory");
    let int = |m: Option<&Map<String, Value>>, k: &str| m.and_then(|m| m.get(k)).and_then(int_of).unwrap_or(0);
    let text = |m: Option<&Map<String, Value>>, k: &str| m.and_then(|m| string(m, k)).unwrap_or_default();
    Some(hook::LinuxContainerResources {
        cpu_period: int(cpu, "period"),
        cpu_quota: int(cpu, "quota"),
        cpu_shares: int(cpu, "shares"),
        memory_limit_in_bytes: int(mem, "limit"),
        oom_score_adj: path(spec, &["process", "oomScoreAdj"]).and_then(int_of).unwrap_or(0),
        cpuset_cpus: text(cpu, "cpus"),
        cpuset_mems: text(cpu, "mems"),
        hugepage_limits: res
            .get("hugepageLimits")
            .and_then(Value::as_array)
            .map(|l| hugepage_limits(l, &["pageSize"]))
            .unwrap_or_default(),
        unified: string_map(res.get("unified")),
        memory_swap_limit_in_bytes: int(mem, "swap"),
    })
}

fn hugepage_limits(list: &[Value], size_keys: &[&str]) -> Vec<hook::HugepageLimit> {
    list.iter()
        .filter_map(Value::as_object)
        .filter_map(|h| {
            let page_size = size_keys.iter().find_map(|k| string(h, k))?;
            let limit = h.get("limit").and_then(int_of).map(|l| l.max(0) as u64).unwrap_or(0);
            Some(hook::HugepageLimit { page_size, limit })
        })
        .collect()
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

/// An integer from a JSON number (saturated to i64) or a decimal string (protobuf JSON writes
/// 64-bit integers as strings).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|u| i64::try_from(u).unwrap_or(i64::MAX)))
            .or_else(|| n.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn obj<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    m.get(key).and_then(Value::as_object)
}

fn string(m: &Map<String, Value>, key: &str) -> Option<String> {
    m.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn path<'a>(m: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    let (last, inner) = keys.split_last()?;
    let mut cur = m;
    for k in inner {
        cur = obj(cur, k)?;
    }
    cur.get(*last)
}

#[cfg(test)]
#[path = "status_entry_tests.rs"]
mod tests;
