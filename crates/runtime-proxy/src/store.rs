//! What the proxy knows about each pod sandbox and container, so that hooks at StartContainer,
//! StopContainer, UpdateContainerResources and StopPodSandbox (whose CRI requests carry only an
//! ID) get the pod's metadata, labels, annotations, cgroup parent and the container's resources
//! and envs.
//!
//! Entries are the hook requests as last sent to (and changed by) the hook servers, keyed by
//! sandbox ID and container ID. Life cycle: written when RunPodSandbox / CreateContainer
//! succeed, updated when a PreStartContainer hook changes the container or the backend accepts an
//! UpdateContainerResources, removed when RemoveContainer / RemovePodSandbox succeed (removing a
//! sandbox removes its containers). Readers get copies: no entry is ever mutated in place.

use std::collections::HashMap;
use std::sync::RwLock;

use hook_api::v1alpha1::{ContainerResourceHookRequest, PodSandboxHookRequest};

/// A container's entry: its sandbox ID and the hook request describing it (with
/// `container_meta.id` set).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerEntry {
    pub sandbox_id: String,
    pub hook: ContainerResourceHookRequest,
}

/// The pod sandbox and container maps. Each operation takes the lock for one map lookup or
/// insert, never across an await.
#[derive(Debug, Default)]
pub struct Store {
    pods: RwLock<HashMap<String, PodSandboxHookRequest>>,
    containers: RwLock<HashMap<String, ContainerEntry>>,
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

    /// Records (or replaces) the pod sandbox `sandbox_id`.
    pub fn put_pod(&self, sandbox_id: &str, pod: PodSandboxHookRequest) {
        self.pods.write().unwrap_or_else(|p| p.into_inner()).insert(sandbox_id.to_owned(), pod);
    }

    /// Forgets the pod sandbox `sandbox_id` and every container in it.
    pub fn remove_pod(&self, sandbox_id: &str) {
        self.pods.write().unwrap_or_else(|p| p.into_inner()).remove(sandbox_id);
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
    /// [`crate::recover::sweep`], which drops entries the runtime no longer has.
    pub fn ids(&self) -> (Vec<String>, Vec<String>) {
        (
            self.pods.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect(),
            self.containers.read().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect(),
        )
    }

    /// Number of (pod sandboxes, containers) known.
    pub fn len(&self) -> (usize, usize) {
        (
            self.pods.read().unwrap_or_else(|p| p.into_inner()).len(),
            self.containers.read().unwrap_or_else(|p| p.into_inner()).len(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
