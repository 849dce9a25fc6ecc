//! What the proxy knows about each pod sandbox and container, so that hooks at StartContainer,
//! StopContainer, UpdateContainerResources and StopPodSandbox (whose CRI requests carry only an
//! ID) get the pod's metadata, labels, annotations, cgroup parent and the container's resources
//! and envs.
//!
//! Entries are the hook requests as last sent to (and changed by) the hook servers, keyed by
//! sandbox ID and container ID. Life cycle: written when RunPodSandbox / CreateContainer
//! succeed, updated when a PreStartContainer hook changes the container or the backend accepts an
//! UpdateContainerResources (the container) or an UpdatePodSandboxResources (the pod's overhead
//! and resources), removed when RemoveContainer / RemovePodSandbox succeed (removing a sandbox
//! removes its containers). Readers get copies: an entry changes only under the map's write lock.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hook_api::v1alpha1::{ContainerResourceHookRequest, LinuxContainerResources, PodSandboxHookRequest};

/// A container's entry: its sandbox ID and the hook request describing it (with
/// `container_meta.id` set).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerEntry {
    /// The ID of the pod sandbox the container belongs to.
    pub sandbox_id: String,
    /// The container's hook request: pod and container metadata, labels, annotations, resources.
    pub hook: ContainerResourceHookRequest,
}

/// The pod sandbox and container maps. Each operation takes the lock for one map lookup or
/// insert, never across an await.
#[derive(Debug, Default)]
pub struct Store {
    pods: RwLock<HashMap<String, PodSandboxHookRequest>>,
    containers: RwLock<HashMap<String, ContainerEntry>>,
    /// How many stored pods carry the required-hook-servers annotation
    /// ([`crate::hooks::chain::REQUIRED_ANNOTATION`]); kept under the `pods` write lock.
    requiring: AtomicUsize,
}

/// Whether `pod` names hook servers it requires (its required-hook-servers annotation).
fn requires(pod: &PodSandboxHookRequest) -> bool {
    pod.annotations.contains_key(crate::hooks::chain::REQUIRED_ANNOTATION)
}

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pod sandbox `sandbox_id`, if known.
    pub fn pod(&self, sandbox_id: &str) -> Option<PodSandboxHookRequest> {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).get(sandbox_id).cloned()
    }

    /// The pod sandbox of the container `container_id`, if known (without copying its entry).
    pub fn sandbox_of(&self, container_id: &str) -> Option<String> {
        self.containers.read().unwrap_or_else(|p| p.into_inner()).get(container_id).map(|e| e.sandbox_id.clone())
    }

    /// Whether the pod sandbox `sandbox_id` is known (without copying its entry).
    pub fn has_pod(&self, sandbox_id: &str) -> bool {
        self.pods.read().unwrap_or_else(|p| p.into_inner()).contains_key(sandbox_id)
    }

    /// Records (or replaces) the pod sandbox `sandbox_id`.
    pub fn put_pod(&self, sandbox_id: &str, pod: PodSandboxHookRequest) {
        let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
        let now = requires(&pod);
        let before = pods.insert(sandbox_id.to_owned(), pod).is_some_and(|old| requires(&old));
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
        {
            let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
            let Some(pod) = pods.get_mut(sandbox_id) else { return false };
            if overhead.is_some() {
                pod.overhead = overhead;
            }
            if resources.is_some() {
                pod.resources.clone_from(&resources);
            }
        }
        if resources.is_some() {
            let mut containers = self.containers.write().unwrap_or_else(|p| p.into_inner());
            for c in containers.values_mut().filter(|c| c.sandbox_id == sandbox_id) {
                c.hook.pod_resources.clone_from(&resources);
            }
        }
        true
    }

    /// Forgets the pod sandbox `sandbox_id` and every container in it.
    pub fn remove_pod(&self, sandbox_id: &str) {
        let mut pods = self.pods.write().unwrap_or_else(|p| p.into_inner());
        if pods.remove(sandbox_id).is_some_and(|old| requires(&old)) {
            self.requiring.fetch_sub(1, Ordering::Relaxed);
        }
        drop(pods);
        self.containers.write().unwrap_or_else(|p| p.into_inner()).retain(|_, c| c.sandbox_id != sandbox_id);
    }

    /// The container `container_id`, if known.
    pub fn container(&self, container_id: &str) -> Option<ContainerEntry> {
        self.containers.read().unwrap_or_else(|p| p.into_inner()).get(container_id).cloned()
    }

    /// Records (or replaces) the container `container_id`.
    pub fn put_container(&self, container_id: &str, entry: ContainerEntry) {
        self.containers.write().unwrap_or_else(|p| p.into_inner()).insert(container_id.to_owned(), entry);
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
            self.containers.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect(),
        )
    }

    /// Number of (pod sandboxes, containers) known.
    pub fn len(&self) -> (usize, usize) {
        (self.pods.read().unwrap_or_else(|p| p.into_inner()).len(), self.containers.read().unwrap_or_else(|p| p.into_inner()).len())
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
pub fn sweep(store: &Store, live_sandboxes: &HashSet<String>, live_containers: &HashSet<String>) -> (Vec<String>, Vec<String>) {
    let (pods, containers) = store.ids();
    let mut removed_pods = Vec::new();
    let mut removed_containers = Vec::new();
    for id in containers {
        // A container goes with its pod sandbox (Store::remove_pod).
        let pod_gone = store.container(&id).is_some_and(|c| !live_sandboxes.contains(&c.sandbox_id) && pods.contains(&c.sandbox_id));
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
        let pod =
            PodSandboxHookRequest { cgroup_parent: "/kubepods/pod1".into(), overhead: res(10), resources: res(512), ..Default::default() };
        s.put_pod("sb1", pod.clone());
        s.put_pod("sb2", pod.clone());
        let container = |sb: &str| ContainerEntry {
            sandbox_id: sb.into(),
            hook: ContainerResourceHookRequest { pod_resources: res(512), container_resources: res(256), ..Default::default() },
        };
        s.put_container("c1", container("sb1"));
        s.put_container("c2", container("sb2"));
        assert!(s.update_pod_resources("sb1", None, res(1024)), "known pod");
        let got = s.pod("sb1").unwrap();
        assert_eq!((got.overhead, got.resources), (res(10), res(1024)), "absent overhead kept, resources replaced");
        assert_eq!(got.cgroup_parent, pod.cgroup_parent, "the rest as it was");
        let c1 = s.container("c1").unwrap().hook;
        assert_eq!((c1.pod_resources, c1.container_resources), (res(1024), res(256)), "its container sees the pod's new resources");
        assert_eq!(s.container("c2").unwrap(), container("sb2"), "another pod's container untouched");
        assert_eq!(s.pod("sb2").unwrap(), pod, "another pod untouched");
        assert!(s.update_pod_resources("sb1", res(20), None));
        assert_eq!(s.pod("sb1").unwrap().overhead, res(20));
        assert_eq!(s.container("c1").unwrap().hook.pod_resources, res(1024), "no resources: containers as they were");
        assert!(!s.update_pod_resources("unknown", res(1), res(1)), "an unknown pod is not made up");
        assert_eq!(s.len(), (2, 2));
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
