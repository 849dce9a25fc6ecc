//! The NRI front end (`--frontend nri`): runtime-proxy as one NRI plugin of containerd (≥ 1.7,
//! NRI on), calling the hook servers registered in `--hook-config-dir` at the runtime's pod and
//! container events, with no proxy in kubelet's CRI path.
//!
//! | NRI event | stage (the one hook flow) | answer |
//! |---|---|---|
//! | RunPodSandbox (sandbox created) | PreRunPodSandbox | – (pod-level changes cannot be expressed: logged) |
//! | `CreateContainer` | PreCreateContainer | `ContainerAdjustment`: resources, cpuset, env, annotations |
//! | StartContainer | PreStartContainer | resources through `Runtime.UpdateContainers` once the container runs (after PostStartContainer: containerd applies an update of a container not started yet to its spec only) |
//! | PostStartContainer | PostStartContainer | – |
//! | `UpdateContainer` | PreUpdateContainerResources | `ContainerUpdate` of the container |
//! | `StopContainer` | PostStopContainer | – |
//! | StopPodSandbox | PostStopPodSandbox | – |
//! | RemovePodSandbox, RemoveContainer | – (the registry has no PreRemoveRunPodSandbox stage) | – (the store forgets the object) |
//! | `Synchronize` (at connect) | none: the store is rebuilt from the runtime's pods and containers | no updates |
//!
//! The front end subscribes only to the events its hook servers' stages need, with a creation
//! gate and the remove events ([`subscribe`]); when a registry change alters that set, it
//! registers again with the new one (NRI cannot change a live connection's subscription): one
//! INFO line names the old and the new set, and the events containerd sends during the
//! reconnect (a few milliseconds) do not reach it. PreStartContainer's resources still waiting
//! for their container to run are kept across the reconnect: at Synchronize, those of a
//! container that runs by then are sent, those of one that is gone are dropped.
//!
//! RunPodSandbox, StartContainer, PostStartContainer, StopPodSandbox and the remove events are
//! their own calls from an NRI 0.12 runtime (containerd 2.3+) and `StateChange` from older ones;
//! the `nri-plugin` crate's events table hands both to [`nri_plugin::Handler::event`].
//!
//! Each event is one call of [`crate::hooks::flow::drive`] ([`front::NriCall`]): the pod's
//! turn, the skip label, the registered servers of the stage in order, each within its
//! deadline under its failure policy, and the whole pre stage within [`CALL_BUDGET`] (inside
//! containerd's `plugin_request_timeout`, 2 s by default). A `Fail` server's refusal is the
//! event's ttrpc error: the runtime fails the call (CreateContainer, RunPodSandbox,
//! UpdateContainerResources). Post stages run after the answer, holding the pod's turn.
//!
//! The connection (dial, register, Synchronize, reconnect with back-off) is the `nri-plugin`
//! crate's loop ([`nri_plugin::run`]).

pub mod convert;
pub mod front;
pub mod subscribe;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nri_plugin::proto::api::{self as nri, Event};
use nri_plugin::Refusal;
use tokio::sync::watch;

use self::front::{Kind, NriAnswer, NriCall};
use crate::hooks::store::{sweep, ContainerEntry};
use crate::hooks::{flow, Hooks};

/// The time a pre stage may take in all, whatever the servers' own timeouts: under containerd's
/// default `plugin_request_timeout` (2 s), after which the runtime drops the plugin's answer.
pub const CALL_BUDGET: Duration = Duration::from_millis(1800);

/// Every event the front end handles; it subscribes to those its hook servers need
/// ([`subscribe::events_for`]).
pub const EVENTS: [Event; 9] = [
    Event::RunPodSandbox,
    Event::StopPodSandbox,
    Event::RemovePodSandbox,
    Event::CreateContainer,
    Event::StartContainer,
    Event::PostStartContainer,
    Event::UpdateContainer,
    Event::StopContainer,
    Event::RemoveContainer,
];

/// The NRI plugin: the shared hook state, updates waiting for `Runtime.UpdateContainers`, and
/// the connection state for health reporting.
pub struct NriFront {
    hooks: Arc<Hooks>,
    /// PreStartContainer's updates, by container ID, until the container runs (PostStartContainer):
    /// containerd applies an update to a container that has not started yet to its spec only.
    starting: HashMap<String, nri::ContainerUpdate>,
    /// Updates for the next `Runtime.UpdateContainers`.
    later: Vec<nri::ContainerUpdate>,
    /// Wakes the connection loop: for `later`, and (from [`run`]'s task) at registry changes, so
    /// that it asks [`nri_plugin::Handler::wanted_events`].
    wake: Arc<watch::Sender<u64>>,
    /// Connected and synchronized now.
    pub synchronized: Arc<AtomicBool>,
}

impl NriFront {
    /// A front end over `hooks` that keeps `synchronized` up to date, and the channel that
    /// wakes the connection loop for updates.
    pub fn new(hooks: Arc<Hooks>, synchronized: Arc<AtomicBool>) -> (NriFront, watch::Receiver<u64>) {
        let (wake, rx) = watch::channel(0);
        let wake = Arc::new(wake);
        (NriFront { hooks, starting: HashMap::new(), later: Vec::new(), wake, synchronized }, rx)
    }

    /// The events the registered hook servers need now ([`subscribe::events_for`]).
    pub fn needed_events(&self) -> i32 {
        subscribe::events_for(subscribe::registered_stages(&self.hooks.registry.snapshot()))
    }

    /// Wakes the connection loop.
    fn wake(&self) {
        self.wake.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// After a reconnect, what is still pending against the runtime's containers (Synchronize's):
    /// PreStartContainer's resources of a container that runs now go out (its PostStartContainer
    /// may have come while the plugin was away), those of a container that is gone or stopped are
    /// dropped, those of one not started yet wait on; updates waiting to be sent go out if their
    /// container is still there.
    fn reconcile_pending(&mut self, containers: &[nri::Container]) {
        let state: HashMap<&str, i32> = containers.iter().map(|c| (c.id.as_str(), c.state)).collect();
        let (running, created) =
            (nri::ContainerState::ContainerRunning as i32, nri::ContainerState::ContainerCreated as i32);
        self.later.retain(|u| state.contains_key(u.container_id.as_str()));
        let mut started = Vec::new();
        self.starting.retain(|id, update| match state.get(id.as_str()) {
            Some(&s) if s == running => {
                started.push(update.clone());
                false
            }
            Some(&s) => s == created,
            None => false,
        });
        self.later.extend(started);
        if !self.later.is_empty() {
            tracing::info!(
                containers = self.later.len(),
                "NRI: PreStartContainer resources pending over the reconnect, sent now"
            );
            self.wake();
        }
    }

    /// Drives one event through the hook flow; spawns its post stage; keeps PreStartContainer's
    /// updates until the container runs, then has them sent.
    ///
    /// Errors: a `Fail` server's refusal (or the budget exceeded under `Fail`).
    async fn event(&mut self, call: NriCall) -> Result<NriAnswer, Refusal> {
        let key = call.pod.id.clone();
        let deadline = Some(Instant::now() + CALL_BUDGET);
        let (answer, post) =
            flow::drive(&self.hooks, call.kind.spec(), &call, Some(&key), NriAnswer::default(), deadline).await?;
        if let Some(post) = post {
            tokio::spawn(post.run());
        }
        self.starting.extend(answer.later.iter().map(|u| (u.container_id.clone(), u.clone())));
        let id = call.container.as_ref().map(|c| c.id.as_str()).unwrap_or_default();
        match call.kind {
            Kind::PostStartContainer => {
                if let Some(update) = self.starting.remove(id) {
                    self.later.push(update);
                    self.wake();
                }
            }
            Kind::RemoveContainer | Kind::StopContainer => {
                self.starting.remove(id);
            }
            Kind::RemovePodSandbox => {
                self.starting.retain(|_, u| self.hooks.store.sandbox_of(&u.container_id).is_some())
            }
            _ => {}
        }
        Ok(answer)
    }

    /// Rebuilds the store from the runtime's pods and containers (restart recovery) and drops
    /// what the runtime no longer has. No hook runs.
    fn rebuild_store(&self, pods: &[nri::PodSandbox], containers: &[nri::Container]) {
        let store = &self.hooks.store;
        let by_id: HashMap<&str, &nri::PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        for pod in pods {
            store.put_pod(&pod.id, convert::pod_request(pod));
        }
        let mut live_containers = HashSet::new();
        for c in containers {
            let Some(pod) = by_id.get(c.pod_sandbox_id.as_str()) else { continue };
            let hook = convert::container_request(pod, c, None);
            store.put_container(&c.id, ContainerEntry { sandbox_id: c.pod_sandbox_id.clone(), hook });
            live_containers.insert(c.id.clone());
        }
        let live_pods: HashSet<String> = by_id.keys().map(|k| (*k).to_owned()).collect();
        let (gone_pods, gone_containers) = sweep(store, &live_pods, &live_containers);
        tracing::info!(
            pods = live_pods.len(),
            containers = live_containers.len(),
            dropped_pods = gone_pods.len(),
            dropped_containers = gone_containers.len(),
            "NRI Synchronize: store rebuilt from the runtime (no hooks run on existing containers)"
        );
    }
}

impl nri_plugin::Handler for NriFront {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        self.needed_events()
    }

    fn wanted_events(&mut self) -> Option<i32> {
        Some(self.needed_events())
    }

    async fn synchronize(
        &mut self,
        pods: Vec<nri::PodSandbox>,
        containers: Vec<nri::Container>,
    ) -> Vec<nri::ContainerUpdate> {
        self.rebuild_store(&pods, &containers);
        self.reconcile_pending(&containers);
        Vec::new()
    }

    async fn create_container(
        &mut self,
        req: nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, Refusal> {
        let call = NriCall {
            kind: Kind::CreateContainer,
            pod: req.pod.unwrap_or_default(),
            container: req.container,
            resources: None,
        };
        let answer = self.event(call).await?;
        Ok(nri::CreateContainerResponse { adjust: answer.adjust, update: Vec::new(), evict: Vec::new() })
    }

    async fn update_container(
        &mut self,
        req: nri::UpdateContainerRequest,
    ) -> Result<nri::UpdateContainerResponse, Refusal> {
        let (pod, container) = (req.pod.unwrap_or_default(), req.container);
        let call = NriCall { kind: Kind::UpdateContainer, pod, container, resources: req.linux_resources };
        let answer = self.event(call).await?;
        Ok(nri::UpdateContainerResponse { update: answer.update, evict: Vec::new() })
    }

    async fn stop_container(&mut self, req: nri::StopContainerRequest) -> Result<nri::StopContainerResponse, Refusal> {
        let call = NriCall {
            kind: Kind::StopContainer,
            pod: req.pod.unwrap_or_default(),
            container: req.container,
            resources: None,
        };
        self.event(call).await?;
        Ok(nri::StopContainerResponse { update: Vec::new() })
    }

    async fn event(&mut self, evt: nri::StateChangeEvent) -> Result<(), Refusal> {
        let kind = match Event::try_from(evt.event).unwrap_or(Event::Unknown) {
            Event::RunPodSandbox => Kind::RunPodSandbox,
            Event::StopPodSandbox => Kind::StopPodSandbox,
            Event::RemovePodSandbox => Kind::RemovePodSandbox,
            Event::StartContainer => Kind::StartContainer,
            Event::PostStartContainer => Kind::PostStartContainer,
            Event::RemoveContainer => Kind::RemoveContainer,
            _ => return Ok(()),
        };
        let call = NriCall { kind, pod: evt.pod.unwrap_or_default(), container: evt.container, resources: None };
        self.event(call).await.map(|_| ())
    }

    async fn refresh(&mut self) -> Vec<nri::ContainerUpdate> {
        std::mem::take(&mut self.later)
    }

    const REFRESHED: &'static str = "with the PreStartContainer hooks' resources";

    // `starting` and `later` are kept over a reconnect: Synchronize reconciles them with the
    // runtime's containers ([`NriFront::reconcile_pending`]).

    fn connection_state(&mut self, synchronized: bool) {
        self.synchronized.store(synchronized, Ordering::Relaxed);
    }
}

/// Serves the NRI front end until `shutdown` resolves: registers with the runtime at `options`
/// and drives each event through the hook flow of `hooks`; `synchronized` says whether it is
/// connected and synchronized (for `/status`).
///
/// Errors: none so far (a runtime that is not there is waited for, with back-off).
pub async fn run(
    hooks: Arc<Hooks>,
    synchronized: Arc<AtomicBool>,
    options: nri_plugin::Options,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut changed = hooks.registry.changed();
    let (mut front, wake) = NriFront::new(hooks, synchronized);
    // A registry change wakes the loop, which asks whether the events needed changed.
    let waker = front.wake.clone();
    let registry_changes = tokio::spawn(async move {
        while changed.changed().await.is_ok() {
            waker.send_modify(|n| *n = n.wrapping_add(1));
        }
    });
    let outcome = nri_plugin::run(&mut front, &options, Some(wake), shutdown).await;
    registry_changes.abort();
    outcome
}
