//! NRI's pods and containers as hook requests, and what the hooks changed as NRI's answers.
//! Pure functions.
//!
//! | NRI | hook request |
//! |---|---|
//! | `PodSandbox.name`, `uid`, `namespace` | `pod_meta` (attempt 0: NRI does not carry it) |
//! | `PodSandbox.labels`, `annotations` | `labels`, `annotations` (`pod_labels`, `pod_annotations` of a container) |
//! | `PodSandbox.runtime_handler` | `runtime_handler` |
//! | `PodSandbox.linux.cgroup_parent` | `cgroup_parent` (`pod_cgroup_parent`) |
//! | `PodSandbox.linux.pod_overhead`, `pod_resources` | `overhead`, `resources` (`pod_resources`) |
//! | `Container.name`, `id` | `container_meta` (attempt 0) |
//! | `Container.annotations` | `container_annotations` |
//! | `Container.env` (`KEY=VALUE`) | `container_envs` |
//! | `Container.linux.resources` (an UpdateContainer's new resources instead) | `container_resources` |
//!
//! Entries whose bytes are not UTF-8 are left out ([`nri_plugin::convert`]).
//!
//! | what the hooks changed | CreateContainer (`ContainerAdjustment`) | UpdateContainer, StartContainer (`ContainerUpdate`) |
//! |---|---|---|
//! | `container_resources`: CPU shares, quota, period, cpuset CPUs and memory nodes, memory limit (swap follows it as kubelet's no-swap, unless the answer set swap), unified | `linux.resources` | `linux.resources` |
//! | `container_envs`, `container_annotations` (added or changed keys) | `env`, `annotations` | not expressed |
//! | `pod_cgroup_parent`, `oom_score_adj`, `hugepage_limits`, a cpuset cleared to `""` (NRI reads `""` as "no change") | not expressed | not expressed |
//!
//! "Not expressed": NRI has no field for it at that event; [`Changes::unexpressed`] names it
//! for the caller's one log line.

use std::collections::BTreeMap;

use hook_api::utf8::utf8_strings;
use hook_api::v1alpha1 as hook;
use nri_plugin::answer::{self, Adjust, ResourceValues};
use nri_plugin::convert::{cri_resources, envs, map_of};
use nri_plugin::proto::api as nri;

/// The pod's metadata as the hook protocol has it.
pub fn pod_meta(pod: &nri::PodSandbox) -> hook::PodSandboxMetadata {
    hook::PodSandboxMetadata {
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        attempt: 0,
    }
}

/// An NRI pod as a pod-level hook request (see the module table).
pub fn pod_request(pod: &nri::PodSandbox) -> hook::PodSandboxHookRequest {
    let linux = pod.linux.clone().unwrap_or_default();
    hook::PodSandboxHookRequest {
        pod_meta: Some(pod_meta(pod)),
        runtime_handler: pod.runtime_handler.clone(),
        labels: map_of(&pod.labels),
        annotations: map_of(&pod.annotations),
        cgroup_parent: linux.cgroup_parent,
        overhead: linux.pod_overhead.as_ref().map(cri_resources),
        resources: linux.pod_resources.as_ref().map(cri_resources),
    }
}

/// An NRI container of `pod` as a container-level hook request; `resources` overrides the
/// container's own (an UpdateContainer's new resources).
pub fn container_request(
    pod: &nri::PodSandbox,
    container: &nri::Container,
    resources: Option<&nri::LinuxResources>,
) -> hook::ContainerResourceHookRequest {
    let linux = pod.linux.clone().unwrap_or_default();
    let resources = resources.or_else(|| container.linux.as_ref().and_then(|l| l.resources.as_ref()));
    hook::ContainerResourceHookRequest {
        pod_meta: Some(pod_meta(pod)),
        container_meta: Some(hook::ContainerMetadata {
            name: container.name.clone(),
            attempt: 0,
            id: container.id.clone(),
        }),
        container_annotations: map_of(&container.annotations),
        container_resources: Some(resources.map(cri_resources).unwrap_or_default()),
        pod_resources: linux.pod_resources.as_ref().map(cri_resources),
        pod_annotations: map_of(&pod.annotations),
        pod_labels: map_of(&pod.labels),
        pod_cgroup_parent: linux.cgroup_parent,
        container_envs: envs(&utf8_strings(&container.env)),
    }
}

/// What the hooks changed in a container's hook request, in NRI's terms.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// The changed resources (only the fields that changed), `None` when none did.
    pub resources: Option<nri::LinuxResources>,
    /// Added or changed env vars, `(name, value)` sorted by name.
    pub env: Vec<(String, String)>,
    /// Added or changed annotations.
    pub annotations: BTreeMap<String, String>,
    /// What NRI cannot express at this event (field names), for one log line.
    pub unexpressed: Vec<&'static str>,
}

impl Changes {
    /// The CreateContainer adjustment of these changes (`None` when nothing changed), written by
    /// [`nri_plugin::answer`].
    pub fn adjustment(&self) -> Option<nri::ContainerAdjustment> {
        let adjust = Adjust {
            resources: self.resources.clone(),
            env: self.env.clone(),
            annotations: self.annotations.clone().into_iter().collect(),
            ..Default::default()
        }
        .into_nri();
        (adjust != nri::ContainerAdjustment::default()).then_some(adjust)
    }

    /// The update of container `id` with these changes' resources (`None` when none changed).
    pub fn update(&self, id: &str) -> Option<nri::ContainerUpdate> {
        self.resources.clone().map(|resources| answer::update(id, resources))
    }
}

/// What changed from `before` to `after`. `created`: the container exists already (StartContainer,
/// UpdateContainer), so env and annotations can no longer change and count as unexpressed.
pub fn container_changes(
    before: &hook::ContainerResourceHookRequest,
    after: &hook::ContainerResourceHookRequest,
    created: bool,
) -> Changes {
    let mut changes = Changes::default();
    let (b, a) =
        (before.container_resources.clone().unwrap_or_default(), after.container_resources.clone().unwrap_or_default());
    changes.resources = resources_diff(&b, &a);
    if a.oom_score_adj != b.oom_score_adj {
        changes.unexpressed.push("container_resources.oom_score_adj");
    }
    if a.hugepage_limits != b.hugepage_limits {
        changes.unexpressed.push("container_resources.hugepage_limits");
    }
    // NRI reads an empty cpuset as "no change": a cleared one cannot be sent.
    if a.cpuset_cpus.is_empty() && !b.cpuset_cpus.is_empty() {
        changes.unexpressed.push("container_resources.cpuset_cpus (cleared)");
    }
    if a.cpuset_mems.is_empty() && !b.cpuset_mems.is_empty() {
        changes.unexpressed.push("container_resources.cpuset_mems (cleared)");
    }
    if after.pod_cgroup_parent != before.pod_cgroup_parent {
        changes.unexpressed.push("pod_cgroup_parent");
    }
    let added = |after: &BTreeMap<String, String>, before: &BTreeMap<String, String>| -> Vec<(String, String)> {
        let mut v: Vec<_> =
            after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort();
        v
    };
    let env = added(&after.container_envs, &before.container_envs);
    let annotations = added(&after.container_annotations, &before.container_annotations);
    if created {
        if !env.is_empty() {
            changes.unexpressed.push("container_envs");
        }
        if !annotations.is_empty() {
            changes.unexpressed.push("container_annotations");
        }
    } else {
        changes.env = env;
        changes.annotations = annotations.into_iter().collect();
    }
    changes
}

/// The fields of `after` that differ from `before` as NRI resources, `None` when none do. A
/// changed memory limit brings the swap limit along (kubelet's no swap beyond the limit) unless
/// the answer changed swap itself.
pub fn resources_diff(
    before: &hook::LinuxContainerResources,
    after: &hook::LinuxContainerResources,
) -> Option<nri::LinuxResources> {
    let changed = |b: i64, a: i64| (a != b).then_some(a);
    let text = |b: &str, a: &str| if a != b { a.to_owned() } else { String::new() };
    let limit = changed(before.memory_limit_in_bytes, after.memory_limit_in_bytes);
    ResourceValues {
        cpu_shares: changed(before.cpu_shares, after.cpu_shares),
        cpu_quota: changed(before.cpu_quota, after.cpu_quota),
        cpu_period: changed(before.cpu_period, after.cpu_period),
        cpuset_cpus: text(&before.cpuset_cpus, &after.cpuset_cpus),
        cpuset_mems: text(&before.cpuset_mems, &after.cpuset_mems),
        memory_limit: limit,
        memory_swap: changed(before.memory_swap_limit_in_bytes, after.memory_swap_limit_in_bytes).or(limit),
        unified: after
            .unified
            .iter()
            .filter(|(k, v)| before.unified.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        rdt_class: None,
    }
    .into_nri()
}

/// The pod-level fields the hooks changed (`labels`, `annotations`, `cgroup_parent`): NRI
/// cannot change a pod sandbox that exists, so each is unexpressed. A PreRunPodSandbox answer's
/// `resources` are not among them: as in CRI mode (and koord-runtime-proxy's), they are applied
/// nowhere without a word — koordlet answers them for every BE and CPU-bound pod and writes the
/// pod cgroup itself, so they are no lost change.
pub fn pod_changes(before: &hook::PodSandboxHookRequest, after: &hook::PodSandboxHookRequest) -> Vec<&'static str> {
    let mut v = Vec::new();
    if after.labels != before.labels {
        v.push("labels");
    }
    if after.annotations != before.annotations {
        v.push("annotations");
    }
    if after.cgroup_parent != before.cgroup_parent {
        v.push("cgroup_parent");
    }
    v
}

#[cfg(test)]
#[path = "convert_tests.rs"]
mod tests;
