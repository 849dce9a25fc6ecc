//! What the proxy knows about each pod sandbox and container, so that hooks at StartContainer,
//! StopContainer, UpdateContainerResources and StopPodSandbox (whose CRI requests carry only an
//! ID) get the pod's metadata, labels, annotations, cgroup parent and the container's resources.
//!
//! Entries are the hook requests as last sent to (and changed by) the hook servers, keyed by
//! sandbox ID and container ID. Life cycle: written when RunPodSandbox / CreateContainer
//! succeed, updated when a PreStartContainer hook changes the container or the backend accepts an
//! UpdateContainerResources (the container) or an UpdatePodSandboxResources (the pod's overhead
//! and resources), removed when RemoveContainer / RemovePodSandbox succeed (removing a sandbox
//! removes its containers). Readers get copies: an entry changes only under the map's write lock.
//!
//! # One copy of the pod per sandbox
//!
//! A container-level hook request repeats its pod's metadata, labels, annotations and cgroup
//! parent (`pod_meta`, `pod_labels`, `pod_annotations`, `pod_cgroup_parent`) and resources
//! (`pod_resources`), and a container's entry its pod's sandbox ID. The store keeps them once per
//! sandbox: the first four in the pod's entry ([`PodPart`], behind an [`Arc`]), the resources
//! behind an [`Arc`] of their own (a resize replaces them, [`Store::update_pod_resources`]), the
//! sandbox ID as the key of the pod's index of containers (an `Arc<str>`). A container's entry
//! points at those and keeps only what is the container's own: `container_meta`,
//! `container_annotations`, `container_resources`, and a `pod_cgroup_parent` only when it is not
//! its pod's (a PreCreateContainer hook may move one container to a parent of its own).
//! [`Store::container`] assembles the request from the parts, field for field what was put (envs
//! aside, below). A container whose pod fields differ from its pod's entry (its pod not stored,
//! or stored anew with other values since) keeps a part of its own, so what it gets is still
//! exactly what was put.
//!
//! Memory, per pod sandbox: ≈ its labels + annotations + metadata + cgroup parent (the [`PodPart`]) + its resources +
//! its ID, once; per container: ≈ its own annotations + resources + metadata + its ID, whatever the size of its pod. At
//! 1,000 pods × 4 containers of kubelet's sizes (`benches/node_scale.rs`): ≈ 2.1 KiB per pod sandbox and ≈ 1.5 KiB per
//! container (2.1 KiB while it kept its own copy of its pod's sandbox ID, cgroup parent and resources), the same with 8
//! KiB more annotations per pod (only the pod's bytes grow). Measured with a counting allocator (bytes allocated and
//! kept): a pod with 8,000 annotations of 30 bytes (240 KB, near Kubernetes' 256 KiB budget) holds 630 KiB; each of its
//! containers (one small annotation, resources, 64-character IDs, its map slot) 1.4 KiB — where a copy of the pod per
//! container cost 630 KiB more each. Through the real proxy and containerd (`tests/store_memory.rs`): 64 containers of
//! that pod, created and started with a hook server registered, grow the proxy's VmRSS by less than 1 MiB (measured:
//! not at all; ≈ 780 KiB per container with a copy each).
//!
//! # No envs
//!
//! A container's envs are not kept: PreStartContainer, PostStartContainer,
//! PreUpdateContainerResources and PostStopContainer requests carry an empty `container_envs`;
//! only PreCreateContainer sends them, from the CreateContainer request. koord-runtime-proxy keeps
//! and re-sends them at the later stages (and loses them after a restart: its failover fills
//! none); koordlet's one plugin that touches envs (GPUEnvInject) adds them at PreCreateContainer,
//! and none of its plugins at a later stage reads them (Koordinator v1.8.0). Keeping
//! them cost the whole env list per container (`envFrom` of large ConfigMaps: 275 MB for one
//! container of 1.3 M envs), and an env can carry a Secret's value.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hook_api::v1alpha1::{
    ContainerMetadata, ContainerResourceHookRequest, LinuxContainerResources, PodSandboxHookRequest, PodSandboxMetadata,
};

/// A container's entry as readers get it and writers put it: its sandbox ID and the hook request
/// describing it (with `container_meta.id` set). The store keeps it split (see the module doc):
/// `hook.container_envs` is dropped on [`Store::put_container`] and always empty from
/// [`Store::container`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerEntry {
    /// The ID of the pod sandbox the container belongs to.
    pub sandbox_id: String,
    /// The container's hook request: pod and container metadata, labels, annotations, resources.
    pub hook: ContainerResourceHookRequest,
}

/// What every container-level hook request of one pod repeats: the pod's metadata, labels and
/// annotations (their sizes are the pod author's: annotations up to Kubernetes' 256 KiB). Shared
/// by the pod's entry and its containers' entries.
#[derive(Debug, Default, PartialEq)]
pub struct PodPart {
    meta: Option<PodSandboxMetadata>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    cgroup_parent: String,
}

/// What a container-level hook request holds of the container itself, the rest being its pod's:
/// what restart recovery reads from a container's status ([`Store::put_container_of_pod`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerOwn {
    /// `container_meta` (name, attempt, container ID).
    pub container_meta: Option<ContainerMetadata>,
    /// `container_annotations`.
    pub container_annotations: BTreeMap<String, String>,
    /// `container_resources`.
    pub container_resources: Option<LinuxContainerResources>,
    /// `pod_cgroup_parent`: the parent the container's cgroup is under (its pod's, unless a
    /// PreCreateContainer hook moved it).
    pub cgroup_parent: String,
}

/// Resources kept once and shared (a pod's, by its containers' `pod_resources`).
type Shared = Option<Arc<LinuxContainerResources>>;

/// A pod sandbox's entry: the [`PodPart`] and the rest of its `PodSandboxHookRequest`.
#[derive(Debug)]
struct StoredPod {
    part: Arc<PodPart>,
    runtime_handler: String,
    overhead: Option<LinuxContainerResources>,
    resources: Shared,
}

impl StoredPod {
    fn new(pod: PodSandboxHookRequest) -> Self {
        let part = PodPart {
            meta: pod.pod_meta,
            labels: pod.labels,
            annotations: pod.annotations,
            cgroup_parent: pod.cgroup_parent,
        };
        StoredPod {
            part: Arc::new(part),
            runtime_handler: pod.runtime_handler,
            overhead: pod.overhead,
            resources: pod.resources.map(Arc::new),
        }
    }

    fn request(&self) -> PodSandboxHookRequest {
        PodSandboxHookRequest {
            pod_meta: self.part.meta.clone(),
            runtime_handler: self.runtime_handler.clone(),
            labels: self.part.labels.clone(),
            annotations: self.part.annotations.clone(),
            cgroup_parent: self.part.cgroup_parent.clone(),
            overhead: self.overhead.clone(),
            resources: self.resources.as_deref().cloned(),
        }
    }
}

/// A container's entry: its own fields and its pod's (shared).
#[derive(Debug)]
struct StoredContainer {
    /// The pod's sandbox ID: the key of its set in [`Containers::by_pod`].
    sandbox_id: Arc<str>,
    pod: Arc<PodPart>,
    container_meta: Option<ContainerMetadata>,
    container_annotations: BTreeMap<String, String>,
    container_resources: Option<Box<LinuxContainerResources>>,
    pod_resources: Shared,
    /// Its cgroup parent when it is not `pod.cgroup_parent`.
    own_cgroup_parent: Option<String>,
}

impl StoredContainer {
    fn entry(&self) -> ContainerEntry {
        ContainerEntry {
            sandbox_id: self.sandbox_id.to_string(),
            hook: ContainerResourceHookRequest {
                pod_meta: self.pod.meta.clone(),
                container_meta: self.container_meta.clone(),
                container_annotations: self.container_annotations.clone(),
                container_resources: self.container_resources.as_deref().cloned(),
                pod_resources: self.pod_resources.as_deref().cloned(),
                pod_annotations: self.pod.annotations.clone(),
                pod_labels: self.pod.labels.clone(),
                pod_cgroup_parent: self.own_cgroup_parent.as_ref().unwrap_or(&self.pod.cgroup_parent).clone(),
                container_envs: BTreeMap::new(),
            },
        }
    }
}

/// Whether `part` holds exactly these pod fields of a container-level request (its cgroup parent
/// aside: a container may have one of its own).
fn same_pod(part: &PodPart, hook: &ContainerResourceHookRequest) -> bool {
    part.meta == hook.pod_meta && part.labels == hook.pod_labels && part.annotations == hook.pod_annotations
}

/// The containers by container ID, and their IDs by sandbox ID: removing or resizing a pod
/// sandbox touches its own containers only, whatever the number of containers on the node.
#[derive(Debug, Default)]
struct Containers {
    by_id: HashMap<String, StoredContainer>,
    /// The container IDs of each sandbox ID that has containers in `by_id` (no empty sets). Its
    /// keys are the containers' `sandbox_id`s (one allocation per pod).
    by_pod: HashMap<Arc<str>, HashSet<String>>,
}

impl Containers {
    /// The sandbox ID as the index keeps it: its key when the pod has containers, else a new one.
    fn pod_key(&self, sandbox_id: &str) -> Arc<str> {
        self.by_pod.get_key_value(sandbox_id).map_or_else(|| Arc::from(sandbox_id), |(k, _)| k.clone())
    }

    fn insert(&mut self, container_id: &str, stored: StoredContainer) {
        self.by_pod.entry(stored.sandbox_id.clone()).or_default().insert(container_id.to_owned());
        if let Some(old) = self.by_id.insert(container_id.to_owned(), stored) {
            if old.sandbox_id != self.by_id[container_id].sandbox_id {
                self.unlink(&old.sandbox_id, container_id);
            }
        }
    }

    fn remove(&mut self, container_id: &str) {
        if let Some(old) = self.by_id.remove(container_id) {
            self.unlink(&old.sandbox_id, container_id);
        }
    }

    /// Drops `container_id` from the IDs of `sandbox_id`, and the set once it is empty.
    fn unlink(&mut self, sandbox_id: &str, container_id: &str) {
        if let Some(ids) = self.by_pod.get_mut(sandbox_id) {
            ids.remove(container_id);
            if ids.is_empty() {
                self.by_pod.remove(sandbox_id);
            }
        }
    }

    fn remove_pod(&mut self, sandbox_id: &str) {
        for id in self.by_pod.remove(sandbox_id).unwrap_or_default() {
            self.by_id.remove(&id);
        }
    }

    /// Calls `f` on each container of `sandbox_id`.
    fn for_each_of_pod(&mut self, sandbox_id: &str, mut f: impl FnMut(&mut StoredContainer)) {
        for id in self.by_pod.get(sandbox_id).into_iter().flatten() {
            if let Some(c) = self.by_id.get_mut(id) {
                f(c);
            }
        }
    }
}

/// The pod sandbox and container maps. Each operation takes one map's lock for one lookup or
/// insert (never both at once, never across an await); none visits every entry but
/// [`Store::ids`] (the periodic sweep).
#[derive(Debug, Default)]
pub struct Store {
    pods: RwLock<HashMap<String, StoredPod>>,
    containers: RwLock<Containers>,
    /// How many stored pods carry the required-hook-servers annotation
    /// ([`crate::hooks::chain::REQUIRED_ANNOTATION`]); kept under the `pods` write lock.
    requiring: AtomicUsize,
}

/// Whether a pod with these annotations names hook servers it requires (its
/// required-hook-servers annotation).
fn requires(part: &PodPart) -> bool {
    part.annotations.contains_key(crate::hooks::chain::REQUIRED_ANNOTATION)
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pod sandbox `sandbox_id`, if known.
    pub fn pod(&self, sandbox_id: &str) -> Option<PodSandboxHookRequest> {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).get(sandbox_id).map(StoredPod::request)
    }

    /// The cgroup parent of the pod sandbox `sandbox_id`, if known (without copying its entry).
    pub fn pod_cgroup_parent(&self, sandbox_id: &str) -> Option<String> {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).get(sandbox_id).map(|p| p.part.cgroup_parent.clone())
    }

    /// The pod sandbox of the container `container_id`, if known (without copying its entry).
    pub fn sandbox_of(&self, container_id: &str) -> Option<String> {
        let containers = self.containers.read().unwrap_or_else(|p| p.into_inner());
        containers.by_id.get(container_id).map(|e| e.sandbox_id.to_string())
    }

    /// Whether the pod sandbox `sandbox_id` is known (without copying its entry).
    pub fn has_pod(&self, sandbox_id: &str) -> bool {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).contains_key(sandbox_id)
    }

    /// Whether the container `container_id` is known (without copying its entry).
    pub fn has_container(&self, container_id: &str) -> bool {
        self.containers.read().unwrap_or_else(|p| p.into_inner()).by_id.contains_key(container_id)
    }

    /// Records (or replaces) the pod sandbox `sandbox_id`. A replacement with the same metadata,
    /// labels and annotations keeps sharing them with the pod's containers.
    pub fn put_pod(&self, sandbox_id: &str, pod: PodSandboxHookRequest) {
        let mut new = StoredPod::new(pod);
        let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
        let now = requires(&new.part);
        let old = pods.get(sandbox_id);
        if let Some(old) = old.filter(|old| old.part == new.part) {
            new.part = old.part.clone();
        }
        let before = old.is_some_and(|old| requires(&old.part));
        pods.insert(sandbox_id.to_owned(), new);
        match (before, now) {
            (false, true) => self.requiring.fetch_add(1, Ordering::Relaxed),
            (true, false) => self.requiring.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    /// Whether some stored pod sandbox names hook servers it requires: when none does (and the
    /// node requires none), a call of a stage no server registered for needs no hook flow.
    pub fn any_pod_requires_servers(&self) -> bool {
        self.requiring.load(Ordering::Relaxed) > 0
    }

    /// Sets the stored overhead and resources of the pod sandbox `sandbox_id` to those given
    /// (kubelet resized the pod: UpdatePodSandboxResources), and the `pod_resources` of each of
    /// its stored containers to the new resources; `None` leaves that field as it is. Returns
    /// false, changing nothing, when the pod is not known.
    pub fn update_pod_resources(
        &self,
        sandbox_id: &str,
        overhead: Option<LinuxContainerResources>,
        resources: Option<LinuxContainerResources>,
    ) -> bool {
        // The new resources, once: the pod's and its containers' `pod_resources`.
        let resized: Option<Shared> = {
            let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
            let Some(pod) = pods.get_mut(sandbox_id) else { return false };
            if overhead.is_some() {
                pod.overhead = overhead;
            }
            resources.map(|r| {
                pod.resources = Some(Arc::new(r));
                pod.resources.clone()
            })
        };
        if let Some(shared) = resized {
            let mut containers = self.containers.write().unwrap_or_else(|p| p.into_inner());
            containers.for_each_of_pod(sandbox_id, |c| c.pod_resources.clone_from(&shared));
        }
        true
    }

    /// Forgets the pod sandbox `sandbox_id` and every container in it.
    pub fn remove_pod(&self, sandbox_id: &str) {
        let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
        if pods.remove(sandbox_id).is_some_and(|old| requires(&old.part)) {
            self.requiring.fetch_sub(1, Ordering::Relaxed);
        }
        drop(pods);
        self.containers.write().unwrap_or_else(|p| p.into_inner()).remove_pod(sandbox_id);
    }

    /// The container `container_id`, if known: its hook request assembled from its entry and its
    /// pod's part (`container_envs` empty, see the module doc).
    pub fn container(&self, container_id: &str) -> Option<ContainerEntry> {
        self.containers.read().unwrap_or_else(|p| p.into_inner()).by_id.get(container_id).map(StoredContainer::entry)
    }

    /// Records (or replaces) the container `container_id`. Its pod fields are kept as a reference
    /// to its pod's part when they equal it (or the part the container had), else as a part of
    /// its own; its envs are dropped (see the module doc).
    pub fn put_container(&self, container_id: &str, entry: ContainerEntry) {
        let ContainerEntry { sandbox_id, hook } = entry;
        // What to share: the pod's, else what this container had (a part of its own).
        let pod = self
            .pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&sandbox_id)
            .map(|p| (p.part.clone(), p.resources.clone()));
        let (pod_part, pod_resources) = pod.unzip();
        let mut part = pod_part.filter(|part| same_pod(part, &hook));
        let mut resources = pod_resources.filter(|r| r.as_deref() == hook.pod_resources.as_ref());
        if part.is_none() || resources.is_none() {
            let containers = self.containers.read().unwrap_or_else(|p| p.into_inner());
            let had = containers.by_id.get(container_id);
            part = part.or_else(|| had.map(|c| c.pod.clone()).filter(|part| same_pod(part, &hook)));
            resources = resources.or_else(|| {
                had.map(|c| c.pod_resources.clone()).filter(|r| r.as_deref() == hook.pod_resources.as_ref())
            });
        }
        let ContainerResourceHookRequest {
            pod_meta,
            container_meta,
            container_annotations,
            container_resources,
            pod_resources,
            pod_annotations,
            pod_labels,
            pod_cgroup_parent,
            container_envs: _,
        } = hook;
        let pod = part.unwrap_or_else(|| {
            let cgroup_parent = pod_cgroup_parent.clone();
            Arc::new(PodPart { meta: pod_meta, labels: pod_labels, annotations: pod_annotations, cgroup_parent })
        });
        let own_cgroup_parent = (pod_cgroup_parent != pod.cgroup_parent).then_some(pod_cgroup_parent);
        let mut containers = self.containers.write().unwrap_or_else(|p| p.into_inner());
        let stored = StoredContainer {
            sandbox_id: containers.pod_key(&sandbox_id),
            pod,
            container_meta,
            container_annotations,
            container_resources: container_resources.map(Box::new),
            pod_resources: resources.unwrap_or_else(|| pod_resources.map(Arc::new)),
            own_cgroup_parent,
        };
        containers.insert(container_id, stored);
    }

    /// Records (or replaces) the container `container_id` of the stored pod sandbox `sandbox_id`
    /// from its own fields: its pod metadata, labels, annotations and resources are the pod
    /// entry's, shared without a copy or a comparison (restart recovery, where the pod entry was
    /// just read from the same runtime). Returns false, recording nothing, when the pod is not
    /// stored.
    pub fn put_container_of_pod(&self, container_id: &str, sandbox_id: &str, own: ContainerOwn) -> bool {
        let pod = self
            .pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(sandbox_id)
            .map(|p| (p.part.clone(), p.resources.clone()));
        let Some((pod, pod_resources)) = pod else { return false };
        let ContainerOwn { container_meta, container_annotations, container_resources, cgroup_parent } = own;
        let own_cgroup_parent = (cgroup_parent != pod.cgroup_parent).then_some(cgroup_parent);
        let mut containers = self.containers.write().unwrap_or_else(|p| p.into_inner());
        let stored = StoredContainer {
            sandbox_id: containers.pod_key(sandbox_id),
            pod,
            container_meta,
            container_annotations,
            container_resources: container_resources.map(Box::new),
            pod_resources,
            own_cgroup_parent,
        };
        containers.insert(container_id, stored);
        true
    }

    /// Forgets the container `container_id`.
    pub fn remove_container(&self, container_id: &str) {
        self.containers.write().unwrap_or_else(|p| p.into_inner()).remove(container_id);
    }

    /// The IDs of every (pod sandbox, container) known, in no particular order: for
    /// [`sweep`], which drops entries the runtime no longer has.
    pub fn ids(&self) -> (Vec<String>, Vec<String>) {
        (
            self.pods.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect(),
            self.containers.read().unwrap_or_else(|p| p.into_inner()).by_id.keys().cloned().collect(),
        )
    }

    /// Number of (pod sandboxes, containers) known.
    pub fn len(&self) -> (usize, usize) {
        (
            self.pods.read().unwrap_or_else(|p| p.into_inner()).len(),
            self.containers.read().unwrap_or_else(|p| p.into_inner()).by_id.len(),
        )
    }
}

// Store recovery, shared by both front ends' keepers (crate::cri::recover, crate::docker::recover).

/// Start-up retries while the runtime is not reachable: first delay, doubled up to the maximum.
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest delay between start-up retries.
pub const RETRY_MAX: Duration = Duration::from_secs(5);

/// How often the store is checked against the runtime for objects that went away without the
/// proxy seeing a Remove call (a sweep also recovers objects created around the proxy).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(300);

/// Removes the entries of pod sandboxes and containers not in the live sets (removing a pod
/// removes its containers). Returns the IDs removed: (pod sandboxes, containers).
pub fn sweep(
    store: &Store,
    live_sandboxes: &HashSet<String>,
    live_containers: &HashSet<String>,
) -> (Vec<String>, Vec<String>) {
    let (pods, containers) = store.ids();
    let mut removed_pods = Vec::new();
    let mut removed_containers = Vec::new();
    for id in containers {
        // A container goes with its pod sandbox (Store::remove_pod).
        let pod_gone = store.sandbox_of(&id).is_some_and(|sb| !live_sandboxes.contains(&sb) && pods.contains(&sb));
        if !live_containers.contains(&id) || pod_gone {
            store.remove_container(&id);
            removed_containers.push(id);
        }
    }
    for id in pods {
        if !live_sandboxes.contains(&id) {
            store.remove_pod(&id);
            removed_pods.push(id);
        }
    }
    for id in removed_pods.iter().chain(&removed_containers) {
        tracing::debug!(id = %id, "recovery: store entry of an object the runtime no longer has removed");
    }
    (removed_pods, removed_containers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_drops_what_the_runtime_no_longer_has() {
        let store = Store::new();
        for sb in ["sb1", "sb2", "sb3"] {
            store.put_pod(sb, Default::default());
        }
        for (c, sb) in [("c1", "sb1"), ("c2", "sb1"), ("c3", "sb2"), ("c4", "sb3")] {
            store.put_container(c, ContainerEntry { sandbox_id: sb.into(), ..Default::default() });
        }
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        // sb2 is gone (with c3, which is still listed in a race); c2 is gone; c4 lives.
        let (mut pods, mut containers) = sweep(&store, &set(&["sb1", "sb3"]), &set(&["c1", "c3", "c4"]));
        pods.sort();
        containers.sort();
        assert_eq!(pods, ["sb2"]);
        assert_eq!(containers, ["c2", "c3"]);
        assert_eq!(store.len(), (2, 2));
        assert!(store.container("c1").is_some() && store.container("c4").is_some());
    }

    #[test]
    fn counts_pods_that_require_hook_servers() {
        let store = Store::new();
        let requiring = |v: &str| PodSandboxHookRequest {
            annotations: [(crate::hooks::chain::REQUIRED_ANNOTATION.to_owned(), v.to_owned())].into(),
            ..Default::default()
        };
        store.put_pod("plain", PodSandboxHookRequest::default());
        assert!(!store.any_pod_requires_servers());
        store.put_pod("a", requiring("x"));
        store.put_pod("a", requiring("y"));
        store.put_pod("b", requiring("x"));
        assert_eq!(store.requiring.load(Ordering::Relaxed), 2, "a replaced entry is counted once");
        store.put_pod("b", PodSandboxHookRequest::default());
        store.remove_pod("plain");
        assert!(store.any_pod_requires_servers());
        sweep(&store, &HashSet::new(), &HashSet::new());
        assert!(!store.any_pod_requires_servers(), "swept pods are no longer counted");
    }

    #[tokio::test]
    async fn same_pod_waits_other_pods_do_not() {
        let locks = Arc::new(PodLocks::default());
        let a = locks.lock("pod-a").await;
        let b = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock("pod-b")).await;
        assert!(b.is_ok(), "another pod does not wait");
        drop(b);
        let locks2 = locks.clone();
        let waiter = tokio::spawn(async move {
            let _g = locks2.lock("pod-a").await;
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "the same pod waits");
        drop(a);
        waiter.await.unwrap();
        assert!(locks.is_empty(), "unused locks are forgotten");
    }

    #[test]
    fn pod_resources_follow_a_resize() {
        let s = Store::new();
        let res = |shares| Some(LinuxContainerResources { cpu_shares: shares, ..Default::default() });
        let pod = PodSandboxHookRequest {
            cgroup_parent: "/kubepods/pod1".into(),
            overhead: res(10),
            resources: res(512),
            ..Default::default()
        };
        s.put_pod("sb1", pod.clone());
        s.put_pod("sb2", pod.clone());
        let container = |sb: &str| ContainerEntry {
            sandbox_id: sb.into(),
            hook: ContainerResourceHookRequest {
                pod_resources: res(512),
                container_resources: res(256),
                ..Default::default()
            },
        };
        s.put_container("c1", container("sb1"));
        s.put_container("c2", container("sb2"));
        assert!(s.update_pod_resources("sb1", None, res(1024)), "known pod");
        let got = s.pod("sb1").unwrap();
        assert_eq!((got.overhead, got.resources), (res(10), res(1024)), "absent overhead kept, resources replaced");
        assert_eq!(got.cgroup_parent, pod.cgroup_parent, "the rest as it was");
        let c1 = s.container("c1").unwrap().hook;
        assert_eq!(
            (c1.pod_resources, c1.container_resources),
            (res(1024), res(256)),
            "its container sees the pod's new resources"
        );
        assert_eq!(s.container("c2").unwrap(), container("sb2"), "another pod's container untouched");
        assert_eq!(s.pod("sb2").unwrap(), pod, "another pod untouched");
        assert!(s.update_pod_resources("sb1", res(20), None));
        assert_eq!(s.pod("sb1").unwrap().overhead, res(20));
        assert_eq!(s.container("c1").unwrap().hook.pod_resources, res(1024), "no resources: containers as they were");
        assert!(!s.update_pod_resources("unknown", res(1), res(1)), "an unknown pod is not made up");
        assert_eq!(s.len(), (2, 2));
    }

    /// A pod with `size` bytes of annotations, and the request of its container `name` as
    /// CreateContainer builds it (pod fields copied from the pod; envs).
    fn pod_and_container(size: usize, name: &str) -> (PodSandboxHookRequest, ContainerEntry) {
        let pod = PodSandboxHookRequest {
            pod_meta: Some(PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "ns".into(),
                attempt: 1,
            }),
            runtime_handler: "runc".into(),
            labels: [("app".to_owned(), "db".to_owned())].into(),
            annotations: (0..size / 1000).map(|i| (format!("a{i}"), "x".repeat(1000))).collect(),
            cgroup_parent: "/kubepods/pod1".into(),
            overhead: None,
            resources: Some(LinuxContainerResources { cpu_shares: 1024, ..Default::default() }),
        };
        let hook = ContainerResourceHookRequest {
            pod_meta: pod.pod_meta.clone(),
            container_meta: Some(ContainerMetadata { name: name.into(), attempt: 0, id: name.into() }),
            container_annotations: [("c".to_owned(), name.to_owned())].into(),
            container_resources: Some(LinuxContainerResources {
                cpu_shares: 512,
                cpuset_cpus: "0-1".into(),
                ..Default::default()
            }),
            pod_resources: pod.resources.clone(),
            pod_annotations: pod.annotations.clone(),
            pod_labels: pod.labels.clone(),
            pod_cgroup_parent: format!("{}-{name}", pod.cgroup_parent),
            container_envs: [("KEEP".to_owned(), "me".to_owned())].into(),
        };
        (pod, ContainerEntry { sandbox_id: "sb".into(), hook })
    }

    /// The entry as [`Store::container`] gives it back: as put, without envs.
    fn without_envs(mut e: ContainerEntry) -> ContainerEntry {
        e.hook.container_envs.clear();
        e
    }

    #[test]
    fn containers_of_one_pod_share_one_copy_of_it() {
        let s = Store::new();
        let (pod, _) = pod_and_container(200_000, "c0");
        s.put_pod("sb", pod.clone());
        let n = 50;
        let entries: Vec<ContainerEntry> = (0..n).map(|i| pod_and_container(200_000, &format!("c{i}")).1).collect();
        for e in &entries {
            s.put_container(&e.hook.container_meta.as_ref().unwrap().id, e.clone());
        }
        let part = s.pods.read().unwrap()["sb"].part.clone();
        {
            let containers = &s.containers.read().unwrap().by_id;
            assert!(
                containers.values().all(|c| Arc::ptr_eq(&c.pod, &part)),
                "every container points at the pod's part"
            );
        }
        assert_eq!(Arc::strong_count(&part), n + 2, "one copy: the pod's entry, {n} containers and this handle");
        for e in &entries {
            let id = &e.hook.container_meta.as_ref().unwrap().id;
            assert_eq!(
                s.container(id).as_ref(),
                Some(&without_envs(e.clone())),
                "{id}: the request as put, field for field"
            );
        }
        assert_eq!(s.pod("sb"), Some(pod.clone()), "the pod as put");
        drop(part);

        // A container put again as a call read it (StartContainer) still shares; so does a pod
        // put again with the same values (recovery).
        let again = s.container("c3").unwrap();
        s.put_container("c3", again.clone());
        s.put_pod("sb", pod.clone());
        let part = s.pods.read().unwrap()["sb"].part.clone();
        assert_eq!(Arc::strong_count(&part), n + 2, "still one copy");
        assert_eq!(s.container("c3"), Some(again));
    }

    #[test]
    fn containers_keep_no_copy_of_their_pods_id_cgroup_parent_or_resources() {
        let s = Store::new();
        let (pod, _) = pod_and_container(1_000, "c0");
        s.put_pod("sb", pod.clone());
        let mut entries = Vec::new();
        for i in 0..3 {
            let (_, mut c) = pod_and_container(1_000, &format!("c{i}"));
            c.hook.pod_cgroup_parent = pod.cgroup_parent.clone();
            s.put_container(&format!("c{i}"), c.clone());
            entries.push(c);
        }
        let shared_by_all = |s: &Store| {
            let pod_resources = s.pods.read().unwrap()["sb"].resources.clone().expect("the pod's resources");
            let containers = s.containers.read().unwrap();
            let key = containers.by_pod.get_key_value("sb").unwrap().0.clone();
            for (id, c) in &containers.by_id {
                assert!(Arc::ptr_eq(&c.sandbox_id, &key), "{id}: the index's sandbox ID, not a copy");
                assert!(Arc::ptr_eq(c.pod_resources.as_ref().unwrap(), &pod_resources), "{id}: the pod's resources");
                assert_eq!(c.own_cgroup_parent, None, "{id}: the pod's cgroup parent, not a copy");
            }
        };
        shared_by_all(&s);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(s.container(&format!("c{i}")), Some(without_envs(e.clone())), "c{i} as put");
        }
        // A resize: still one copy, which every container sees.
        let bigger = LinuxContainerResources { cpu_shares: 2048, ..Default::default() };
        assert!(s.update_pod_resources("sb", None, Some(bigger.clone())));
        shared_by_all(&s);
        assert_eq!(s.container("c1").unwrap().hook.pod_resources, Some(bigger));
        // A container with other pod resources and a parent of its own keeps both.
        let (_, mut moved) = pod_and_container(1_000, "c9");
        moved.hook.pod_resources = Some(LinuxContainerResources { cpu_shares: 1, ..Default::default() });
        s.put_container("c9", moved.clone());
        assert_eq!(s.container("c9"), Some(without_envs(moved)));
        assert!(s.containers.read().unwrap().by_id["c9"].own_cgroup_parent.is_some());
    }

    #[test]
    fn a_container_put_of_its_pod_is_as_if_put_whole() {
        let s = Store::new();
        let (pod, whole) = pod_and_container(2_000, "c1");
        let own = |e: &ContainerEntry| ContainerOwn {
            container_meta: e.hook.container_meta.clone(),
            container_annotations: e.hook.container_annotations.clone(),
            container_resources: e.hook.container_resources.clone(),
            cgroup_parent: e.hook.pod_cgroup_parent.clone(),
        };
        assert!(!s.put_container_of_pod("c1", "sb", own(&whole)), "no pod stored: nothing recorded");
        assert_eq!(s.container("c1"), None);
        s.put_pod("sb", pod.clone());
        assert!(s.put_container_of_pod("c1", "sb", own(&whole)));
        assert_eq!(s.container("c1"), Some(without_envs(whole.clone())), "a parent of its own");
        let (_, mut under_pod) = pod_and_container(2_000, "c2");
        under_pod.hook.pod_cgroup_parent = pod.cgroup_parent.clone();
        assert!(s.put_container_of_pod("c2", "sb", own(&under_pod)));
        assert_eq!(s.container("c2"), Some(without_envs(under_pod)), "the pod's parent");
        let part = s.pods.read().unwrap()["sb"].part.clone();
        let containers = &s.containers.read().unwrap().by_id;
        assert!(containers.values().all(|c| Arc::ptr_eq(&c.pod, &part)), "the pod's part, shared");
        assert_eq!(containers["c2"].own_cgroup_parent, None);
    }

    #[test]
    fn a_container_whose_pod_fields_differ_keeps_them() {
        let s = Store::new();
        let (pod, mut c) = pod_and_container(2_000, "c1");
        s.put_pod("sb", pod.clone());
        c.hook.pod_labels.insert("other".into(), "value".into());
        s.put_container("c1", c.clone());
        assert_eq!(s.container("c1"), Some(without_envs(c.clone())), "exactly what was put");
        let (_, orphan) = pod_and_container(2_000, "c2");
        let orphan = ContainerEntry { sandbox_id: "unknown".into(), ..orphan };
        s.put_container("c2", orphan.clone());
        assert_eq!(s.container("c2"), Some(without_envs(orphan)), "a pod the store does not know");
        let part = s.pods.read().unwrap()["sb"].part.clone();
        assert_eq!(Arc::strong_count(&part), 2, "neither shares the pod's part");
        // Put again as read: the part it had is kept, not copied.
        let own = s.containers.read().unwrap().by_id["c1"].pod.clone();
        s.put_container("c1", s.container("c1").unwrap());
        assert!(Arc::ptr_eq(&own, &s.containers.read().unwrap().by_id["c1"].pod));
    }

    #[test]
    fn envs_are_not_kept() {
        let s = Store::new();
        let (pod, c) = pod_and_container(0, "c1");
        s.put_pod("sb", pod);
        assert!(!c.hook.container_envs.is_empty());
        s.put_container("c1", c);
        let got = s.container("c1").unwrap();
        assert!(got.hook.container_envs.is_empty(), "{:?}", got.hook.container_envs);
    }

    #[test]
    fn removing_a_pod_removes_its_containers() {
        let s = Store::new();
        s.put_pod("sb1", PodSandboxHookRequest::default());
        s.put_pod("sb2", PodSandboxHookRequest::default());
        s.put_container("c1", ContainerEntry { sandbox_id: "sb1".into(), ..Default::default() });
        s.put_container("c2", ContainerEntry { sandbox_id: "sb2".into(), ..Default::default() });
        s.remove_pod("sb1");
        assert_eq!(s.len(), (1, 1));
        assert!(s.container("c1").is_none());
        assert!(s.container("c2").is_some());
        assert_eq!(s.ids(), (vec!["sb2".to_string()], vec!["c2".to_string()]));
        s.remove_container("c2");
        assert_eq!(s.len(), (1, 0));
    }

    /// The sandbox ID → container IDs index, as the maps say it must be.
    fn index_of(s: &Store) -> BTreeMap<String, Vec<String>> {
        let containers = s.containers.read().unwrap();
        let mut want: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, c) in &containers.by_id {
            want.entry(c.sandbox_id.to_string()).or_default().push(id.clone());
        }
        let mut got: BTreeMap<String, Vec<String>> =
            containers.by_pod.iter().map(|(sb, ids)| (sb.to_string(), ids.iter().cloned().collect())).collect();
        want.values_mut().chain(got.values_mut()).for_each(|v| v.sort());
        assert_eq!(got, want, "the index matches the containers (and holds no empty set)");
        got
    }

    #[test]
    fn the_pod_index_follows_every_change() {
        let s = Store::new();
        let entry = |sb: &str| ContainerEntry { sandbox_id: sb.into(), ..Default::default() };
        s.put_container("c1", entry("sb1"));
        s.put_container("c2", entry("sb1"));
        s.put_container("c3", entry("sb2"));
        s.put_container("c1", entry("sb1"));
        assert_eq!(index_of(&s).len(), 2);
        // A container put again under another sandbox ID (a recovery that learnt better) moves.
        s.put_container("c2", entry("sb2"));
        assert_eq!(index_of(&s)["sb2"], ["c2", "c3"]);
        s.remove_container("c1");
        assert!(!index_of(&s).contains_key("sb1"), "the last container gone: no empty set kept");
        s.remove_container("unknown");
        s.remove_pod("sb2");
        assert!(index_of(&s).is_empty());
        assert_eq!(s.len(), (0, 0));
    }
}

/// One lock per pod sandbox: calls for the same pod run one after another (their store reads,
/// hooks, backend call and store writes do not interleave), calls for different pods never wait
/// on each other. Entries exist only while someone holds or waits for them.
#[derive(Debug, Default)]
pub struct PodLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Held while a call for one pod runs; releases (and forgets an unused lock) on drop. It owns
/// a handle on its [`PodLocks`], so a post stage that runs after the answer went out (in a task
/// of its own, as in Docker mode) keeps the pod's turn until it is done.
pub struct PodGuard {
    owner: Arc<PodLocks>,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl PodLocks {
    /// Waits for the pod's turn (key: sandbox ID).
    pub async fn lock(self: &Arc<Self>, key: &str) -> PodGuard {
        let lock = self.locks.lock().unwrap_or_else(|p| p.into_inner()).entry(key.to_owned()).or_default().clone();
        let guard = lock.lock_owned().await;
        PodGuard { owner: self.clone(), key: key.to_owned(), guard: Some(guard) }
    }

    /// Locks currently held or awaited.
    pub fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when no lock is held or awaited.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.owner.locks.lock().unwrap_or_else(|p| p.into_inner());
        if locks.get(&self.key).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&self.key);
        }
    }
}
