//! NRI mode: runtime-hooks as an external NRI plugin of containerd (≥ 1.7) or CRI-O, no proxy.
//!
//! The runtime calls the plugin synchronously at pod and container life-cycle events; the
//! plugins run through the same [`Framework`] as in proxy mode and their [`Change`] is turned
//! into NRI's answers ([`convert`]):
//!
//! | NRI call | stage run | answer |
//! |---|---|---|
//! | `Configure` | – | the events the plugins' stages need, plus StopContainer, RemovePodSandbox and RemoveContainer (to know which objects are live) |
//! | `Synchronize` (pods and containers that existed before we connected) | PreRunPodSandbox per pod (pod-level values written), PreCreateContainer per created or running container | `ContainerUpdate`s with the containers' resources, applied by the runtime |
//! | `RunPodSandbox` (after the sandbox started: the pod cgroup exists) | PreRunPodSandbox | – (pod-level values written by runtime-hooks, as koordlet does) |
//! | `PostUpdatePodSandbox` (NRI 0.10+, containerd 2.3+: after an in-place pod resize) | PreRunPodSandbox again, with the updated pod | – (pod-level values written again over what the runtime wrote) |
//! | `CreateContainer` (before the container is created) | PreCreateContainer | `ContainerAdjustment`: resources, cpuset, env, annotations |
//! | `UpdateContainer` (kubelet's UpdateContainerResources) | PreUpdateContainerResources, with the new resources | a `ContainerUpdate` of that container: the plugins' fields override kubelet's |
//! | StopPodSandbox, StartContainer, PostStartContainer; `StopContainer` | PostStopPodSandbox, PreStartContainer, PostStartContainer, PostStopContainer, if a plugin wants them | – (pod-level values only); after PostStartContainer the plugins' node-level work (the container's processes exist) |
//! | RemovePodSandbox | the plugins' pod removal (`Plugin::pod_removed`, koordlet's PreRemoveRunPodSandbox), then node-level work without the pod | – |
//!
//! A rule change is re-applied at once to every pod and container the plugin knows (from
//! Synchronize and later events): pod-level values written, container resources sent to the
//! runtime with `Runtime.UpdateContainers`.
//!
//! The events without an answer (RunPodSandbox, StartContainer, …) come as their own calls from
//! an NRI 0.12 runtime (containerd 2.3+) and over `StateChange` from older ones (containerd 1.7,
//! 2.0 to 2.2); the `nri-plugin` crate hands both to the one `NriPlugin::event`.
//!
//! Plugin failures: under `--plugin-failure-policy Ignore` the failing plugin's change is
//! dropped; under `Fail` the NRI call is answered with an error, and the runtime fails the
//! CRI call (RunPodSandbox, CreateContainer, UpdateContainerResources), as proxy mode with
//! `Fail`/`Fail`. A failure while synchronizing or re-applying rules skips that object.
//!
//! Connection (the `nri-plugin` crate's loop): dial `--nri-socket`, register (`Runtime.RegisterPlugin` with
//! `--nri-plugin-name` and `--nri-plugin-index`), then serve the runtime's calls until the socket closes; when it
//! closes or cannot be dialled (containerd restarting) dial again after 100 ms, doubling up to 5 s, reset once
//! registered. Shutdown closes the socket: the runtime drops the plugin and goes on without it. A plugin that does not
//! answer within the runtime's request timeout (containerd's `plugin_request_timeout`, 2 s by default) is dropped by
//! the runtime, which then runs the call without it.
//!
//! `--selector` applies here too: pods whose labels do not hold every pair get no change.
//!
//! Only what the plugins and the selector read is decoded ([`reads`]): a pod's other labels and
//! annotations, and a container's labels, annotations, args and env, are dropped from NRI's
//! messages before they are decoded.

pub mod convert;
mod known;

/// NRI's generated protobuf types (the `nri-plugin` crate's).
pub use nri_plugin::proto;
pub use nri_plugin::{parse_plugin_index, DEFAULT_SOCKET};

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use nri_plugin::Refusal;

use self::known::Known;
use self::proto::api::{self as nri, Event};
use crate::change::Change;
use crate::context::{ContainerContext, PodContext};
use crate::framework::{failure_status, log_call, Framework, Outcome};
use crate::plugin::{ContainerState, NodePods, PodState, Stage};

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct Options {
    /// The runtime's NRI socket.
    pub socket: PathBuf,
    /// Plugin name (`--nri-plugin-name`).
    pub name: String,
    /// Plugin index, two digits (`--nri-plugin-index`): plugins are called in ascending order.
    pub index: String,
    /// Only pods whose labels hold every pair get changes (empty: all).
    pub selector: Vec<(String, String)>,
}

/// The NRI event a stage is run at, if NRI has one.
pub fn event_of(stage: Stage) -> Event {
    match stage {
        Stage::PreRunPodSandbox => Event::RunPodSandbox,
        Stage::PostStopPodSandbox => Event::StopPodSandbox,
        Stage::PreCreateContainer => Event::CreateContainer,
        Stage::PreStartContainer => Event::StartContainer,
        Stage::PostStartContainer => Event::PostStartContainer,
        Stage::PreUpdateContainerResources => Event::UpdateContainer,
        Stage::PostStopContainer => Event::StopContainer,
    }
}

/// The `ConfigureResponse.events` mask for these stages: bit `event - 1` per event, plus
/// StopContainer and the remove events (to know which objects are live), and with
/// PreRunPodSandbox PostUpdatePodSandbox (an in-place pod resize rewrote the pod cgroup: its
/// pod-level values are written again). The connection loop leaves out what the runtime's NRI
/// does not know (PostUpdatePodSandbox before NRI 0.10).
pub fn event_mask(stages: &[Stage]) -> i32 {
    let resize = stages.contains(&Stage::PreRunPodSandbox).then_some(Event::PostUpdatePodSandbox);
    nri_plugin::event_mask(
        stages
            .iter()
            .map(|s| event_of(*s))
            .chain([Event::StopContainer, Event::RemovePodSandbox, Event::RemoveContainer])
            .chain(resize),
    )
}

/// What runtime-hooks reads of NRI's pods and containers, all else dropped before decoding
/// ([`nri_plugin::trim`]): of a pod's labels the keys of [`POD_LABELS_READ`] and of `selector`,
/// of its annotations those of [`POD_ANNOTATIONS_READ`]; of a container nothing of its labels,
/// annotations, args or env. No plugin reads those (GPUEnvInject only sets envs, and NRI's
/// adjustment adds envs by key: nothing needs echoing), so a pod author's 200 k envs (as many as
/// a 4 MiB ttrpc message holds) cost the message's buffers only, not a map of them, neither per
/// call nor in the containers kept for re-applying rules.
///
/// [`POD_LABELS_READ`]: crate::plugins::POD_LABELS_READ
/// [`POD_ANNOTATIONS_READ`]: crate::plugins::POD_ANNOTATIONS_READ
pub fn reads(selector: &[(String, String)]) -> nri_plugin::Reads {
    use crate::plugins::{POD_ANNOTATIONS_READ, POD_LABELS_READ};
    use nri_plugin::Keys;
    let labels = POD_LABELS_READ.iter().map(|k| k.to_string()).chain(selector.iter().map(|(k, _)| k.clone()));
    nri_plugin::Reads {
        pod_labels: Keys::Only(labels.collect()),
        pod_annotations: Keys::Only(POD_ANNOTATIONS_READ.iter().map(|k| k.to_string()).collect()),
        container_labels: Keys::Only(Vec::new()),
        container_annotations: Keys::Only(Vec::new()),
        container_args: false,
        container_env: false,
    }
}

/// Runs the plugin until `shutdown` resolves: connects, serves, reconnects with back-off
/// ([`nri_plugin::run`]); a rule change re-applies to every known pod and container.
///
/// Errors: none so far (a runtime that is not there is waited for); kept for the caller's shape.
pub async fn run(
    framework: Arc<Framework>,
    options: Options,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let rules = framework.rules().subscribe();
    let connection = nri_plugin::Options {
        socket: options.socket.clone(),
        name: options.name.clone(),
        index: options.index.clone(),
        program: "runtime-hooks",
    };
    let mut plugin = NriPlugin::new(framework, options);
    nri_plugin::run(&mut plugin, &connection, Some(rules), shutdown).await
}

struct NriPlugin {
    framework: Arc<Framework>,
    options: Options,
    /// What the plugins (and `--selector`) read of NRI's pods and containers ([`reads`]).
    reads: nri_plugin::Reads,
    known: Known,
    /// Node-level failures of the last pass, each logged once when it first appears.
    node_failures: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl nri_plugin::Handler for NriPlugin {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        event_mask(&self.framework.stages())
    }

    async fn synchronize(
        &mut self,
        pods: Vec<nri::PodSandbox>,
        containers: Vec<nri::Container>,
    ) -> Vec<nri::ContainerUpdate> {
        self.known = Known::new(pods, containers);
        self.learn_weight_formula();
        self.apply_all("synchronize")
    }

    async fn create_container(
        &mut self,
        req: nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, Refusal> {
        self.create(req)
    }

    async fn update_container(
        &mut self,
        req: nri::UpdateContainerRequest,
    ) -> Result<nri::UpdateContainerResponse, Refusal> {
        let (pod, mut container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
        let ctx = convert::container_context(&pod, &container, req.linux_resources.as_ref());
        if let Some(new) = req.linux_resources {
            container.linux.get_or_insert_with(Default::default).resources = Some(new);
        }
        let id = container.id.clone();
        self.known.put_container(container);
        let update: Vec<_> = match self.container(Stage::PreUpdateContainerResources, &ctx)? {
            Some(change) => {
                let dir = ctx.pod.cgroup_parent.clone();
                convert::update(&id, &change, || self.framework.cgroups().shared_cpus(Some(&dir))).into_iter().collect()
            }
            None => Vec::new(),
        };
        for u in &update {
            if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                self.known.applied(&id, r);
            }
        }
        Ok(nri::UpdateContainerResponse { update, evict: Vec::new() })
    }

    async fn stop_container(&mut self, req: nri::StopContainerRequest) -> Result<nri::StopContainerResponse, Refusal> {
        let (pod, container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
        if let Some(known) = self.known.container_mut(&container.id) {
            known.state = nri::ContainerState::ContainerStopped as i32;
        }
        self.container(Stage::PostStopContainer, &convert::container_context(&pod, &container, None))?;
        Ok(nri::StopContainerResponse { update: Vec::new() })
    }

    async fn event(&mut self, evt: nri::StateChangeEvent) -> Result<(), Refusal> {
        self.event(evt)
    }

    async fn refresh(&mut self) -> Vec<nri::ContainerUpdate> {
        self.apply_all("rules changed")
    }

    const REFRESHED: &'static str = "for the new rules";

    /// A failed update leaves the container's values unknown: the next pass sends all of them.
    fn refreshed(&mut self, failed: &[nri::ContainerUpdate]) {
        for u in failed {
            self.known.unknown_resources(&u.container_id);
        }
        nri_plugin::plugin::log_refreshed(Self::REFRESHED, failed);
    }

    fn reads(&self) -> nri_plugin::Reads {
        self.reads.clone()
    }

    fn disconnected(&mut self) {
        self.known = Known::default();
    }
}

impl NriPlugin {
    /// A plugin not connected yet.
    fn new(framework: Arc<Framework>, options: Options) -> NriPlugin {
        let reads = reads(&options.selector);
        NriPlugin { framework, options, reads, known: Known::default(), node_failures: Default::default() }
    }

    /// CreateContainer: PreCreateContainer's change as the container's adjustment.
    fn create(&mut self, req: nri::CreateContainerRequest) -> Result<nri::CreateContainerResponse, Refusal> {
        let (pod, mut container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
        self.known.add_pod(&pod);
        // containerd 1.7 sends CONTAINER_UNKNOWN here; it exists once we answer.
        container.state = nri::ContainerState::ContainerCreated as i32;
        let ctx = convert::container_context(&pod, &container, None);
        let id = container.id.clone();
        self.known.put_container(container);
        let adjust = match self.container(Stage::PreCreateContainer, &ctx)? {
            Some(change) => {
                if let Some(parent) = &change.cgroup_parent {
                    tracing::warn!(on = %ctx.key(), parent, "NRI cannot move a container to another pod cgroup parent; cgroup_parent not applied");
                }
                let dir = ctx.pod.cgroup_parent.clone();
                let adjust = convert::adjustment(&change, || self.framework.cgroups().shared_cpus(Some(&dir)));
                if let Some(r) = adjust.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                    self.known.applied(&id, r);
                }
                Some(adjust)
            }
            None => None,
        };
        Ok(nri::CreateContainerResponse { adjust, update: Vec::new(), evict: Vec::new() })
    }

    /// An event without an answer (its own NRI 0.12 call or StateChange).
    fn event(&mut self, evt: nri::StateChangeEvent) -> Result<(), Refusal> {
        let pod = evt.pod.unwrap_or_default();
        let event = Event::try_from(evt.event).unwrap_or(Event::Unknown);
        match event {
            // After an in-place pod resize (NRI 0.10+; containerd 2.3+) the runtime has written
            // the pod cgroup's new resources over the pod-level values: they are written again,
            // as at RunPodSandbox, from the updated pod.
            Event::RunPodSandbox | Event::PostUpdatePodSandbox => {
                self.known.put_pod(pod.clone());
                let result = self.pod(Stage::PreRunPodSandbox, &pod);
                self.node_pass(if event == Event::RunPodSandbox { "RunPodSandbox" } else { "PostUpdatePodSandbox" });
                result
            }
            Event::StopPodSandbox => self.pod(Stage::PostStopPodSandbox, &pod),
            Event::RemovePodSandbox => {
                // koordlet's PreRemoveRunPodSandbox, with the pod and its containers still known.
                let state = self.pod_state(&pod.id).or_else(|| {
                    let ctx = convert::pod_context(&pod);
                    let cgroup_dir = self.framework.cgroups().resolve(&ctx.cgroup_parent).ok().flatten();
                    self.selected(&ctx).then_some(PodState { pod: ctx, cgroup_dir, containers: Vec::new() })
                });
                if let Some(state) = state {
                    for f in self.framework.pod_removed(&state) {
                        tracing::warn!("NRI: RemovePodSandbox: {f}");
                    }
                }
                self.known.remove_pod(&pod.id);
                self.node_pass("RemovePodSandbox");
                Ok(())
            }
            Event::StartContainer | Event::PostStartContainer => {
                let stage =
                    if event == Event::StartContainer { Stage::PreStartContainer } else { Stage::PostStartContainer };
                let container = evt.container.unwrap_or_default();
                let result = self.container(stage, &convert::container_context(&pod, &container, None)).map(|_| ());
                if event == Event::PostStartContainer {
                    // The container's processes exist now: node-level work for them (cookies,
                    // resctrl tasks), as koordlet's container reconcilers would do.
                    self.node_pass("PostStartContainer");
                }
                result
            }
            Event::RemoveContainer => {
                if let Some(c) = evt.container {
                    self.known.remove_container(&c.id);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn selected(&self, pod: &PodContext) -> bool {
        self.options.selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v))
    }

    fn wants(&self, stage: Stage) -> bool {
        self.framework.stages().contains(&stage)
    }

    /// A pod-level stage: pod values written. Errors: a failure under `Fail`, as a status.
    fn pod(&self, stage: Stage, pod: &nri::PodSandbox) -> Result<(), Refusal> {
        let ctx = convert::pod_context(pod);
        if !self.wants(stage) || !self.selected(&ctx) {
            return Ok(());
        }
        let outcome = self.framework.pod_stage(stage, &ctx).map_err(|f| failure_status(&f))?;
        log_call(stage, &ctx.key(), &outcome.change);
        Ok(())
    }

    /// A container-level stage: the merged change (`None` when the stage is not wanted or the pod
    /// not selected). Errors: a failure under `Fail`, as a status.
    fn container(&self, stage: Stage, ctx: &ContainerContext) -> Result<Option<Change>, Refusal> {
        if !self.wants(stage) || !self.selected(&ctx.pod) {
            return Ok(None);
        }
        let outcome: Outcome = self.framework.container_stage(stage, ctx).map_err(|f| failure_status(&f))?;
        log_call(stage, &ctx.key(), &outcome.change);
        Ok(Some(outcome.change))
    }

    /// Every known pod at PreRunPodSandbox (pod values written) and every created or running
    /// container at PreCreateContainer; of its resources, what the container does not hold yet
    /// is returned as its update ([`Known::unapplied`]: the runtime applies each update, changed
    /// or not, under the lock every pod event waits for). Failures are logged and skip the object.
    fn apply_all(&mut self, reason: &str) -> Vec<nri::ContainerUpdate> {
        let mut pods = 0;
        for (_, pod) in self.known.pods().filter(|(_, p)| self.selected(&convert::pod_context(p))) {
            match self.pod(Stage::PreRunPodSandbox, pod) {
                Ok(()) => pods += 1,
                Err(r) => tracing::warn!(reason, "NRI: {}; pod skipped", r.message),
            }
        }
        let (mut wanted, mut containers) = (Vec::new(), 0);
        for c in self.known.containers() {
            let live = matches!(
                nri::ContainerState::try_from(c.state),
                Ok(nri::ContainerState::ContainerCreated | nri::ContainerState::ContainerRunning)
            );
            let Some(pod) =
                self.known.pod(&c.pod_sandbox_id).filter(|p| live && self.selected(&convert::pod_context(p)))
            else {
                continue;
            };
            containers += 1;
            let ctx = convert::container_context(pod, c, None);
            match self.container(Stage::PreCreateContainer, &ctx) {
                Ok(Some(change)) => {
                    let dir = ctx.pod.cgroup_parent.clone();
                    wanted.extend(convert::update(&c.id, &change, || self.framework.cgroups().shared_cpus(Some(&dir))));
                }
                Ok(None) => {}
                Err(r) => tracing::warn!(reason, "NRI: {}; container skipped", r.message),
            }
        }
        let held = wanted.len();
        let updates: Vec<_> = wanted.into_iter().filter_map(|u| self.known.unapplied(u)).collect();
        let held = held - updates.len();
        tracing::info!(reason, pods, containers, updates = updates.len(), held, "NRI: applied to known pods");
        self.node_pass(reason);
        updates
    }

    /// Learns the runtime's `cpu.weight` formula ([`crate::cpu_weight`]) from the running
    /// containers the runtime reported, before anything is written to them: each one's CPU
    /// shares against the weight runc made of them.
    fn learn_weight_formula(&self) {
        let cgroups = self.framework.cgroups();
        for c in self.known.containers() {
            if !cgroups.weight().learning() {
                return;
            }
            let Some(linux) = c.linux.as_ref() else { continue };
            let Some(shares) =
                linux.resources.as_ref().and_then(|r| r.cpu.as_ref()).and_then(|cpu| cpu.shares.as_ref())
            else {
                continue;
            };
            let pod_dir = self
                .known
                .pod(&c.pod_sandbox_id)
                .and_then(|p| cgroups.resolve(&convert::pod_context(p).cgroup_parent).ok().flatten());
            if let Ok(dir) =
                crate::cgroup_path::container_dir(&linux.cgroups_path, pod_dir.as_deref(), cgroups.driver())
            {
                cgroups.learn_weight_formula(&dir, i64::try_from(shares.value).unwrap_or(i64::MAX));
            }
        }
    }

    /// The known (selected) pod `sandbox_id` with its cgroup directory and its containers, for
    /// its removal.
    fn pod_state(&self, sandbox_id: &str) -> Option<PodState> {
        self.known.pod(sandbox_id).and_then(|pod| self.state_of(pod))
    }

    /// The known (selected) pods with their cgroup directories, for node-level work.
    fn pod_states(&self) -> Vec<PodState> {
        self.known.pods().filter_map(|(_, pod)| self.state_of(pod)).collect()
    }

    /// A known pod with its cgroup directory and its known containers; `None` when the selector
    /// leaves it out.
    fn state_of(&self, pod: &nri::PodSandbox) -> Option<PodState> {
        let cgroups = self.framework.cgroups();
        let ctx = convert::pod_context(pod);
        if !self.selected(&ctx) {
            return None;
        }
        let cgroup_dir = cgroups.resolve(&ctx.cgroup_parent).ok().flatten();
        let containers = self
            .known
            .containers_of(&pod.id)
            .map(|c| {
                let path = c.linux.as_ref().map(|l| l.cgroups_path.as_str()).unwrap_or_default();
                let dir = match path {
                    "" => None,
                    path => crate::cgroup_path::container_dir(path, cgroup_dir.as_deref(), cgroups.driver()).ok(),
                };
                ContainerState { container: convert::container_context(pod, c, None), cgroup_dir: dir }
            })
            .collect();
        Some(PodState { pod: ctx, cgroup_dir, containers })
    }

    /// Every plugin's node-level work over the known pods; each distinct failure logged once, when
    /// it first appears (never fails a pod).
    fn node_pass(&self, reason: &str) {
        let build = || self.pod_states();
        let now: std::collections::HashSet<String> =
            self.framework.node_pass(&NodePods::lazy(&build)).iter().map(|f| f.to_string()).collect();
        let mut reported = self.node_failures.lock().unwrap_or_else(|e| e.into_inner());
        for f in now.difference(&reported) {
            tracing::warn!(reason, "NRI: node-level work: {f}");
        }
        *reported = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin with the built-in plugins under `policy`, default rules and a v1 cgroup tree at
    /// `root`, for `socket`.
    fn test_plugin(root: &std::path::Path, policy: crate::plugin::FailurePolicy, socket: PathBuf) -> NriPlugin {
        use crate::cgroup::{CgroupFs, CgroupVersion};
        use crate::rules::{Rules, RulesStore};
        let framework = Framework::new(
            crate::plugins::builtin(),
            policy,
            RulesStore::fixed(Rules::default()),
            Arc::new(CgroupFs::new(root, CgroupVersion::V1)),
        );
        NriPlugin::new(
            Arc::new(framework),
            Options { socket, name: "t".into(), index: "10".into(), selector: Vec::new() },
        )
    }

    #[test]
    fn event_mask_of_the_default_plugins() {
        let stages = [Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources];
        // RunPodSandbox 1, RemovePodSandbox 3, CreateContainer 4, UpdateContainer 8, StopContainer 10,
        // RemoveContainer 11, PostUpdatePodSandbox 13.
        assert_eq!(event_mask(&stages), 1 | 1 << 2 | 1 << 3 | 1 << 7 | 1 << 9 | 1 << 10 | 1 << 12);
        assert_eq!(event_mask(&[]), 1 << 2 | 1 << 9 | 1 << 10);
        // Within NRI 0.6.1's ValidEvents (bits 0..=10) but PostUpdatePodSandbox (13, 0.10+).
        assert_eq!(event_mask(&Stage::ALL) & !((1 << 11) - 1), 1 << 12);
        assert_eq!(event_mask(&[Stage::PreCreateContainer]) & 1 << 12, 0, "no resize event without PreRunPodSandbox");
    }

    /// A runtime that does not check UTF-8 sends a CreateContainer whose pod annotation and env
    /// value are bytes: the event is answered, with the BE pod's adjustment.
    #[test]
    fn create_container_with_bytes_is_adjusted() {
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Fail, root.path().join("nri.sock"));
        let entry = |k: &str, v: &[u8]| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.to_vec() };
        let spec = br#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;
        let pod = nri::PodSandbox {
            id: "s1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            labels: vec![entry("koordinator.sh/qosClass", b"BE")],
            annotations: vec![entry("note", b"\xff\xfe"), entry("node.koordinator.sh/extended-resource-spec", spec)],
            linux: Some(nri::LinuxPodSandbox {
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let container = nri::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            name: "main".into(),
            env: vec![b"TOKEN=\xff\x80".to_vec(), b"PATH=/bin".to_vec()],
            annotations: vec![entry("bad", b"\xc3")],
            ..Default::default()
        };
        let answer = plugin
            .create(nri::CreateContainerRequest { pod: Some(pod), container: Some(container) })
            .expect("answered");
        let adjust = answer.adjust.expect("an adjustment");
        let cpu = adjust.linux.unwrap().resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.shares.unwrap().value, cpu.quota.unwrap().value), (512, 100_000));
        assert!(adjust.env.is_empty() && adjust.annotations.is_empty(), "nothing of the bytes is sent back");
    }

    /// A CreateContainer of 200 k envs (a full 4 MiB ttrpc message) and unread labels and
    /// annotations, through the connection loop's decoding: answered with the BE values, and
    /// what is kept of it holds only the read keys and the selector's, no env.
    #[tokio::test]
    async fn create_container_keeps_only_what_is_read() {
        use prost::Message;
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Fail, root.path().join("nri.sock"));
        plugin.options.selector = vec![("test".into(), "me".into())];
        plugin.reads = reads(&plugin.options.selector);
        let entry = |k: &str, v: &str| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() };
        let spec = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#;
        let pod = nri::PodSandbox {
            id: "s1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            labels: vec![entry("koordinator.sh/qosClass", "BE"), entry("test", "me"), entry("app", "x")],
            annotations: vec![
                entry("note", &"n".repeat(1000)),
                entry("node.koordinator.sh/extended-resource-spec", spec),
            ],
            linux: Some(nri::LinuxPodSandbox {
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let container = nri::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            name: "main".into(),
            env: (0..200_000).map(|i| format!("K{i:06}=1").into_bytes()).collect(),
            annotations: vec![entry("a", "1")],
            labels: vec![entry("l", "1")],
            args: vec![b"sleep".to_vec()],
            ..Default::default()
        };
        let payload = nri::CreateContainerRequest { pod: Some(pod), container: Some(container) }.encode_to_vec();
        assert!(payload.len() < nri_plugin::wire::MAX_MESSAGE, "{} bytes", payload.len());
        let options = nri_plugin::Options {
            socket: "/nonexistent".into(),
            name: "t".into(),
            index: "10".into(),
            program: "runtime-hooks",
        };
        let answer = nri_plugin::plugin::Session::new(&mut plugin, &options)
            .dispatch("CreateContainer", &payload)
            .await
            .expect("answered");
        let adjust = nri::CreateContainerResponse::decode(answer.as_slice()).unwrap().adjust.expect("an adjustment");
        let cpu = adjust.linux.unwrap().resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.shares.unwrap().value, cpu.quota.unwrap().value), (512, 100_000));
        let kept = plugin.known.container("c1").unwrap();
        assert!(
            kept.env.is_empty() && kept.args.is_empty() && kept.annotations.is_empty() && kept.labels.is_empty(),
            "{:?}",
            kept.env.len()
        );
        let pod = plugin.known.pod("s1").unwrap();
        let keys =
            |e: &[nri::BytesEntry]| e.iter().map(|e| String::from_utf8_lossy(&e.key).into_owned()).collect::<Vec<_>>();
        assert_eq!(keys(&pod.labels), ["koordinator.sh/qosClass", "test"]);
        assert_eq!(keys(&pod.annotations), ["node.koordinator.sh/extended-resource-spec"]);
    }

    /// An in-place pod resize (NRI 0.12's PostUpdatePodSandbox call, or its StateChange form)
    /// after the runtime wrote the pod cgroup's new shares: the BE pod's batch value is written
    /// again. Without the resize event handled, the runtime's value would stay.
    #[tokio::test]
    async fn a_pod_resize_rewrites_the_pod_level_values() {
        use prost::Message;
        let root = tempfile::tempdir().unwrap();
        let pod_dir = root.path().join("cpu/kubepods/besteffort/pod1");
        std::fs::create_dir_all(&pod_dir).unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Fail, root.path().join("nri.sock"));
        let entry = |k: &str, v: &str| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() };
        let spec = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#;
        let pod = nri::PodSandbox {
            id: "s1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            labels: vec![entry("koordinator.sh/qosClass", "BE")],
            annotations: vec![entry("node.koordinator.sh/extended-resource-spec", spec)],
            linux: Some(nri::LinuxPodSandbox {
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = nri_plugin::Options {
            socket: "/nonexistent".into(),
            name: "t".into(),
            index: "10".into(),
            program: "runtime-hooks",
        };
        let shares = || std::fs::read_to_string(pod_dir.join("cpu.shares")).unwrap();
        std::fs::write(pod_dir.join("cpu.shares"), "2").unwrap();
        let run = nri::RunPodSandboxRequest { pod: Some(pod.clone()) }.encode_to_vec();
        nri_plugin::plugin::Session::new(&mut plugin, &options)
            .dispatch("RunPodSandbox", &run)
            .await
            .expect("answered");
        assert_eq!(shares(), "512", "RunPodSandbox writes the batch shares");
        // The runtime resizes the pod and writes the pod cgroup's shares of its new resources.
        std::fs::write(pod_dir.join("cpu.shares"), "1024").unwrap();
        let resized = nri::PostUpdatePodSandboxRequest { pod: Some(pod.clone()) }.encode_to_vec();
        let answer =
            nri_plugin::plugin::Session::new(&mut plugin, &options).dispatch("PostUpdatePodSandbox", &resized).await;
        assert_eq!(answer.expect("answered"), Vec::<u8>::new());
        assert_eq!(shares(), "512", "written again after the resize");
        // The same event from a runtime before 0.12 (StateChange).
        std::fs::write(pod_dir.join("cpu.shares"), "1024").unwrap();
        let evt = nri::StateChangeEvent { event: Event::PostUpdatePodSandbox as i32, pod: Some(pod), container: None }
            .encode_to_vec();
        nri_plugin::plugin::Session::new(&mut plugin, &options).dispatch("StateChange", &evt).await.expect("answered");
        assert_eq!(shares(), "512");
    }

    /// Synchronize's pods and containers are trimmed as the events' are.
    #[tokio::test]
    async fn synchronize_keeps_only_what_is_read() {
        use prost::Message;
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Ignore, root.path().join("nri.sock"));
        let entry = |k: &str, v: &str| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() };
        let pod = nri::PodSandbox {
            id: "s1".into(),
            labels: vec![entry("koordinator.sh/qosClass", "LS"), entry("app", "x")],
            annotations: vec![entry("note", "n")],
            ..Default::default()
        };
        let container = nri::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            state: nri::ContainerState::ContainerRunning as i32,
            env: (0..1000).map(|i| format!("K{i}=1").into_bytes()).collect(),
            ..Default::default()
        };
        let payload =
            nri::SynchronizeRequest { pods: vec![pod], containers: vec![container], more: false }.encode_to_vec();
        let options = nri_plugin::Options {
            socket: "/nonexistent".into(),
            name: "t".into(),
            index: "10".into(),
            program: "runtime-hooks",
        };
        nri_plugin::plugin::Session::new(&mut plugin, &options)
            .dispatch("Synchronize", &payload)
            .await
            .expect("answered");
        assert!(plugin.known.container("c1").unwrap().env.is_empty());
        let pod = plugin.known.pod("s1").unwrap();
        assert_eq!((pod.labels.len(), pod.annotations.len()), (1, 0), "{pod:?}");
    }
}
