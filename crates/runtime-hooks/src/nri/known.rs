//! The pods and containers NRI mode knows (from Synchronize and the events since), indexed so
//! that no event costs in proportion to the node: a pod's containers by its sandbox ID, and each
//! container's resources as the runtime holds them (what it reported, with every update sent
//! since applied over it: [`nri_plugin::applied::applied`]), so that Synchronize and a rule change send
//! only what differs.

use std::collections::{BTreeSet, HashMap};

use nri_plugin::proto::api as nri;

/// Known pods and containers. Every operation but the iterations costs one or two map lookups.
#[derive(Debug, Default)]
pub struct Known {
    pods: HashMap<String, nri::PodSandbox>,
    containers: HashMap<String, nri::Container>,
    /// Container IDs by sandbox ID (a container whose pod is not known is indexed under its
    /// sandbox ID all the same, and goes with it).
    by_pod: HashMap<String, BTreeSet<String>>,
}

impl Known {
    /// What the runtime reported at Synchronize.
    pub fn new(pods: Vec<nri::PodSandbox>, containers: Vec<nri::Container>) -> Known {
        let mut known = Known { pods: pods.into_iter().map(|p| (p.id.clone(), p)).collect(), ..Default::default() };
        for c in containers {
            known.put_container(c);
        }
        known
    }

    /// The pod sandbox `id`.
    pub fn pod(&self, id: &str) -> Option<&nri::PodSandbox> {
        self.pods.get(id)
    }

    /// Every known pod, with its sandbox ID.
    pub fn pods(&self) -> impl Iterator<Item = (&String, &nri::PodSandbox)> {
        self.pods.iter()
    }

    /// Puts (or replaces) a pod.
    pub fn put_pod(&mut self, pod: nri::PodSandbox) {
        self.pods.insert(pod.id.clone(), pod);
    }

    /// Puts a pod unless it is known already.
    pub fn add_pod(&mut self, pod: &nri::PodSandbox) {
        self.pods.entry(pod.id.clone()).or_insert_with(|| pod.clone());
    }

    /// Forgets a pod and its containers.
    pub fn remove_pod(&mut self, id: &str) {
        self.pods.remove(id);
        for c in self.by_pod.remove(id).unwrap_or_default() {
            self.containers.remove(&c);
        }
    }

    /// The container `id`.
    #[cfg(test)]
    pub fn container(&self, id: &str) -> Option<&nri::Container> {
        self.containers.get(id)
    }

    /// The container `id`, to change in place (its sandbox ID must not change).
    pub fn container_mut(&mut self, id: &str) -> Option<&mut nri::Container> {
        self.containers.get_mut(id)
    }

    /// Every known container.
    pub fn containers(&self) -> impl Iterator<Item = &nri::Container> {
        self.containers.values()
    }

    /// The known containers of pod sandbox `id`.
    pub fn containers_of<'a>(&'a self, id: &str) -> impl Iterator<Item = &'a nri::Container> + 'a {
        self.by_pod.get(id).into_iter().flatten().filter_map(|c| self.containers.get(c))
    }

    /// Puts (or replaces) a container.
    pub fn put_container(&mut self, c: nri::Container) {
        if let Some(old) = self.containers.get(&c.id).filter(|old| old.pod_sandbox_id != c.pod_sandbox_id) {
            let old_pod = old.pod_sandbox_id.clone();
            self.unindex(&old_pod, &c.id);
        }
        self.by_pod.entry(c.pod_sandbox_id.clone()).or_default().insert(c.id.clone());
        self.containers.insert(c.id.clone(), c);
    }

    /// Forgets a container.
    pub fn remove_container(&mut self, id: &str) {
        if let Some(c) = self.containers.remove(id) {
            self.unindex(&c.pod_sandbox_id, id);
        }
    }

    fn unindex(&mut self, pod: &str, id: &str) {
        if let Some(ids) = self.by_pod.get_mut(pod) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_pod.remove(pod);
            }
        }
    }

    /// The part of `update` its container does not hold yet ([`nri_plugin::applied::unapplied`]
    /// against its known resources; all of it for a container not known), recorded as applied;
    /// `None` when it holds all of it.
    pub fn unapplied(&mut self, update: nri::ContainerUpdate) -> Option<nri::ContainerUpdate> {
        let want = update.linux.as_ref().and_then(|l| l.resources.as_ref())?;
        let Some(c) = self.containers.get_mut(&update.container_id) else {
            return Some(update);
        };
        let have = c.linux.as_ref().and_then(|l| l.resources.as_ref());
        let send = nri_plugin::applied::unapplied(want, have)?;
        record(c, &send);
        Some(nri_plugin::answer::update(&update.container_id, send))
    }

    /// Records `resources` as applied to container `id` (an adjustment or update the runtime
    /// took).
    pub fn applied(&mut self, id: &str, resources: &nri::LinuxResources) {
        if let Some(c) = self.containers.get_mut(id) {
            record(c, resources);
        }
    }

    /// Forgets what container `id` holds (an update of it failed): the next pass sends all.
    pub fn unknown_resources(&mut self, id: &str) {
        if let Some(l) = self.containers.get_mut(id).and_then(|c| c.linux.as_mut()) {
            l.resources = None;
        }
    }
}

fn record(c: &mut nri::Container, sent: &nri::LinuxResources) {
    let linux = c.linux.get_or_insert_with(Default::default);
    linux.resources = Some(nri_plugin::applied::applied(linux.resources.as_ref(), sent));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, pod: &str) -> nri::Container {
        nri::Container { id: id.into(), pod_sandbox_id: pod.into(), ..Default::default() }
    }

    fn shares(id: &str, v: u64) -> nri::ContainerUpdate {
        let cpu = nri::LinuxCpu { shares: Some(nri::OptionalUInt64 { value: v }), ..Default::default() };
        nri_plugin::answer::update(id, nri::LinuxResources { cpu: Some(cpu), ..Default::default() })
    }

    #[test]
    fn a_pod_goes_with_its_containers_only() {
        let pod = |id: &str| nri::PodSandbox { id: id.into(), ..Default::default() };
        let mut k = Known::new(vec![pod("s1"), pod("s2")], vec![container("a", "s1"), container("b", "s2")]);
        k.put_container(container("c", "s1"));
        k.put_container(container("b", "s1")); // moved: indexed under its new pod only
        assert_eq!(k.containers_of("s1").count(), 3);
        assert_eq!(k.containers_of("s2").count(), 0);
        k.remove_pod("s1");
        assert_eq!((k.pods().count(), k.containers().count()), (1, 0));
        k.put_container(container("d", "s2"));
        k.remove_container("d");
        assert!(k.by_pod.is_empty());
    }

    #[test]
    fn an_update_is_sent_once() {
        let mut k = Known::new(Vec::new(), vec![container("a", "s1")]);
        assert_eq!(k.unapplied(shares("a", 2)), Some(shares("a", 2)));
        assert_eq!(k.unapplied(shares("a", 2)), None, "held now");
        assert_eq!(k.unapplied(shares("a", 3)), Some(shares("a", 3)));
        k.unknown_resources("a");
        assert_eq!(k.unapplied(shares("a", 3)), Some(shares("a", 3)), "after a failure, sent again");
        assert_eq!(k.unapplied(shares("x", 3)), Some(shares("x", 3)), "unknown container: all of it");
    }
}
