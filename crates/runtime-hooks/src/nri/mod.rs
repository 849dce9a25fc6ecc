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
//! | `StateChange` RunPodSandbox (after the sandbox started: the pod cgroup exists) | PreRunPodSandbox | – (pod-level values written by runtime-hooks, as koordlet does) |
//! | `CreateContainer` (before the container is created) | PreCreateContainer | `ContainerAdjustment`: resources, cpuset, env, annotations |
//! | `UpdateContainer` (kubelet's UpdateContainerResources) | PreUpdateContainerResources, with the new resources | a `ContainerUpdate` of that container: the plugins' fields override kubelet's |
//! | `StateChange` StopPodSandbox, StartContainer, PostStartContainer; `StopContainer` | PostStopPodSandbox, PreStartContainer, PostStartContainer, PostStopContainer, if a plugin wants them | – (pod-level values only); after PostStartContainer the plugins' node-level work (the container's processes exist) |
//! | `StateChange` RemovePodSandbox | the plugins' pod removal (`Plugin::pod_removed`, koordlet's PreRemoveRunPodSandbox), then node-level work without the pod | – |
//!
//! A rule change is re-applied at once to every pod and container the plugin knows (from
//! Synchronize and later events): pod-level values written, container resources sent to the
//! runtime with `Runtime.UpdateContainers`.
//!
//! Plugin failures: under `--plugin-failure-policy Ignore` the failing plugin's change is
//! dropped; under `Fail` the NRI call is answered with an error, and the runtime fails the
//! CRI call (RunPodSandbox, CreateContainer, UpdateContainerResources), as proxy mode with
//! `Fail`/`Fail`. A failure while synchronizing or re-applying rules skips that object.
//!
//! Connection: dial `--nri-socket`, register (`Runtime.RegisterPlugin` with `--nri-plugin-name`
//! and `--nri-plugin-index`), then serve the runtime's calls until the socket closes; when
//! it closes or cannot be dialled (containerd restarting) dial again after 100 ms, doubling up
//! to 5 s, reset once registered. Shutdown closes the socket: the runtime drops the plugin and
//! goes on without it. A plugin that does not answer within the runtime's request timeout
//! (containerd's `plugin_request_timeout`, 2 s by default) is dropped by the runtime, which then
//! runs the call without it.
//!
//! `--selector` applies here too: pods whose labels do not hold every pair get no change.

pub mod convert;
pub mod wire;

/// Generated protobuf types: NRI's API (subset) and ttrpc's envelope (`proto/nri/`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    /// `nri.pkg.api.v1alpha1` (NRI 0.6.1's `pkg/api/api.proto`, a subset).
    pub mod api {
        include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
    }
    /// `ttrpc` (`Request`, `Response`, `Status`).
    pub mod ttrpc {
        include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
    }
}

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::watch;

use self::proto::api::{self as nri, Event};
use self::proto::ttrpc;
use self::wire::{Receiver, Sender, FLAG_REMOTE_CLOSED, PLUGIN_CONN, REQUEST, RESPONSE, RUNTIME_CONN};
use crate::change::Change;
use crate::context::{ContainerContext, PodContext};
use crate::framework::{log_call, Framework, Outcome, PluginFailure};
use crate::lenient::decode_items;
use crate::plugin::{ContainerState, PodState, Stage};

/// The runtime's NRI socket unless `--nri-socket` says otherwise (NRI's `DefaultSocketPath`).
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The service the runtime calls.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The service the plugin calls.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long after Configure the runtime has to send Synchronize (containerd sends it at once).
/// A runtime that does not has dropped the plugin without closing the connection — containerd
/// does so when synchronizing fails — and would never call it: the plugin then registers again.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves [`SYNC_TIMEOUT`] after `configured_at`; never before Configure.
async fn sync_deadline(configured_at: Option<tokio::time::Instant>) {
    match configured_at {
        Some(at) => tokio::time::sleep_until(at + SYNC_TIMEOUT).await,
        None => std::future::pending().await,
    }
}

/// gRPC status codes used in answers.
const CODE_INTERNAL: i32 = 13;
const CODE_UNIMPLEMENTED: i32 = 12;
const CODE_INVALID_ARGUMENT: i32 = 3;

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

/// `--nri-plugin-index`: exactly two ASCII digits (NRI's `CheckPluginIndex`).
pub fn parse_plugin_index(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_owned())
    } else {
        Err(format!("invalid NRI plugin index {s:?}: must be two digits, 00 to 99"))
    }
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
/// StopContainer and the remove events (to know which objects are live).
pub fn event_mask(stages: &[Stage]) -> i32 {
    let events = stages.iter().map(|s| event_of(*s)).chain([Event::StopContainer, Event::RemovePodSandbox, Event::RemoveContainer]);
    events.fold(0, |mask, e| mask | (1 << (e as i32 - 1)))
}

/// `SynchronizeRequest` with its pods (1) and containers (2) still encoded, for
/// [`decode_items`].
#[derive(Clone, PartialEq, Message)]
struct SynchronizeItems {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pods: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    containers: Vec<Vec<u8>>,
    /// NRI 0.7+: more pods and containers follow in further Synchronize requests.
    #[prost(bool, tag = "3")]
    more: bool,
}

/// Pods and containers the runtime told us about (Synchronize and events), for re-applying
/// rule changes.
#[derive(Debug, Default)]
struct Known {
    pods: HashMap<String, nri::PodSandbox>,
    containers: HashMap<String, nri::Container>,
}

/// Runs the plugin until `shutdown` resolves: connects, serves, reconnects with back-off.
///
/// Errors: none so far (a runtime that is not there is waited for); kept for the caller's shape.
pub async fn run(framework: Arc<Framework>, options: Options, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let mut plugin = NriPlugin::new(framework.clone(), options);
    let mut rules = framework.rules().subscribe();
    rules.borrow_and_update();
    let mut backoff = BACKOFF_MIN;
    let mut last_error: Option<String> = None;
    loop {
        let outcome = tokio::select! {
            () = &mut shutdown => break,
            r = plugin.session(&mut rules) => r,
        };
        let registered = plugin.synchronized;
        plugin.synchronized = false;
        plugin.sync_in_parts = false;
        plugin.known = Known::default();
        let msg = match outcome {
            Ok(()) => "the runtime closed the connection".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if registered {
            backoff = BACKOFF_MIN;
            tracing::warn!(socket = %plugin.options.socket.display(), "NRI connection lost ({msg}); reconnecting");
            last_error = None;
        } else if last_error.as_deref() != Some(msg.as_str()) {
            tracing::warn!(socket = %plugin.options.socket.display(), "NRI: {msg}; retrying (up to every {BACKOFF_MAX:?})");
            last_error = Some(msg);
        } else {
            tracing::debug!(socket = %plugin.options.socket.display(), "NRI: {msg}; retrying");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    tracing::info!("NRI plugin stopping: closing the connection");
    Ok(())
}

struct NriPlugin {
    framework: Arc<Framework>,
    options: Options,
    known: Known,
    /// Configured and synchronized on the current connection.
    synchronized: bool,
    /// When the runtime configured us on the current connection (Synchronize is due next).
    configured_at: Option<tokio::time::Instant>,
    /// Node-level failures of the last pass, each logged once when it first appears.
    node_failures: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Between the parts of a Synchronize sent in parts (NRI 0.7+ `more`).
    sync_in_parts: bool,
}

/// What a handled call answers: a payload, or a status.
type Answer = Result<Vec<u8>, (i32, String)>;

impl NriPlugin {
    /// A plugin not connected yet.
    fn new(framework: Arc<Framework>, options: Options) -> NriPlugin {
        NriPlugin {
            framework,
            options,
            known: Known::default(),
            synchronized: false,
            configured_at: None,
            node_failures: Default::default(),
            sync_in_parts: false,
        }
    }

    /// One connection: dial, register, serve until it closes.
    async fn session(&mut self, rules: &mut watch::Receiver<u64>) -> anyhow::Result<()> {
        let socket = &self.options.socket;
        let stream = UnixStream::connect(socket).await.with_context(|| format!("connecting to {}", socket.display()))?;
        let (read, write) = stream.into_split();
        let sender = Sender::new(write);
        let mut receiver = Receiver::new(read);
        let mut next_stream = 1u32;
        let mut calls: HashMap<u32, &'static str> = HashMap::new();
        self.configured_at = None;
        let register = nri::RegisterPluginRequest { plugin_name: self.options.name.clone(), plugin_idx: self.options.index.clone() };
        call(&sender, &mut next_stream, &mut calls, "RegisterPlugin", &register).await?;
        tracing::info!(socket = %socket.display(), name = %self.options.name, index = %self.options.index, "NRI: connected, registering");
        loop {
            tokio::select! {
                msg = receiver.next() => {
                    let msg = match msg {
                        Ok(m) => m,
                        // containerd 2.x closes the connection of a plugin it cannot synchronize
                        // (1.7 keeps it open and sends nothing: the deadline below).
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && self.configured_at.is_some() && !self.synchronized => {
                            anyhow::bail!(
                                "the runtime configured the plugin but did not synchronize it: it closed the connection (containerd 2.x \
                                 closes a plugin's connection when it cannot synchronize it, e.g. with a pod whose annotations or env \
                                 are not UTF-8: \"failed to synchronize plugin: string field contains invalid UTF-8\" in its log); \
                                 registering again"
                            );
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e).context("reading from the runtime"),
                    };
                    match (msg.conn, msg.kind) {
                        (PLUGIN_CONN, REQUEST) => {
                            let response = self.handle(&msg.payload);
                            sender.respond(msg.stream, &response).await.context("answering the runtime")?;
                        }
                        (RUNTIME_CONN, RESPONSE) => self.response(calls.remove(&msg.stream), &msg.payload)?,
                        (conn, kind) => tracing::debug!(conn, kind, stream = msg.stream, "NRI: unexpected ttrpc message ignored"),
                    }
                }
                () = sync_deadline(self.configured_at), if !self.synchronized => {
                    anyhow::bail!(
                        "the runtime configured the plugin but did not synchronize it within {SYNC_TIMEOUT:?}: containerd drops a plugin it \
                         cannot synchronize and sends it no events (containerd 1.7 cannot send a pod whose annotations or env are not \
                         UTF-8: \"failed to synchronize plugin: string field contains invalid UTF-8\" in its log); registering again"
                    );
                }
                changed = rules.changed(), if self.synchronized => {
                    if changed.is_err() {
                        // The rules store is gone; nothing more to re-apply.
                        std::future::pending::<()>().await;
                    }
                    let updates = self.apply_all("rules changed");
                    if !updates.is_empty() {
                        let req = nri::UpdateContainersRequest { update: updates, evict: Vec::new() };
                        call(&sender, &mut next_stream, &mut calls, "UpdateContainers", &req).await?;
                    }
                }
            }
        }
    }

    /// A response to one of our calls.
    fn response(&mut self, method: Option<&'static str>, payload: &[u8]) -> anyhow::Result<()> {
        let resp = ttrpc::Response::decode(payload).context("decoding a ttrpc response")?;
        let method = method.unwrap_or("an unknown call");
        if let Some(status) = resp.status.filter(|s| s.code != 0) {
            if method == "RegisterPlugin" {
                anyhow::bail!("RegisterPlugin refused: code {}: {}", status.code, status.message);
            }
            tracing::warn!(code = status.code, "NRI: {method} failed: {}", status.message);
            return Ok(());
        }
        match method {
            "RegisterPlugin" => tracing::info!(name = %self.options.name, index = %self.options.index, "NRI: registered"),
            "UpdateContainers" => {
                let failed = nri::UpdateContainersResponse::decode(resp.payload.as_slice()).map(|r| r.failed).unwrap_or_default();
                if failed.is_empty() {
                    tracing::info!("NRI: containers updated for the new rules");
                } else {
                    let ids: Vec<&str> = failed.iter().map(|u| u.container_id.as_str()).collect();
                    tracing::warn!(failed = ?ids, "NRI: the runtime failed to update some containers");
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers one request of the runtime.
    fn handle(&mut self, payload: &[u8]) -> ttrpc::Response {
        let answer = match ttrpc::Request::decode(payload) {
            Err(e) => Err((CODE_INVALID_ARGUMENT, format!("runtime-hooks: undecodable ttrpc request: {e}"))),
            Ok(req) if req.service != PLUGIN_SERVICE => {
                Err((CODE_UNIMPLEMENTED, format!("runtime-hooks: unknown service {}", req.service)))
            }
            Ok(req) => self.dispatch(&req.method, &req.payload),
        };
        match answer {
            Ok(payload) => ttrpc::Response { status: None, payload },
            Err((code, message)) => ttrpc::Response { status: Some(ttrpc::Status { code, message }), payload: Vec::new() },
        }
    }

    fn dispatch(&mut self, method: &str, payload: &[u8]) -> Answer {
        fn decode<M: Message + Default>(method: &str, payload: &[u8]) -> Result<M, (i32, String)> {
            M::decode(payload).map_err(|e| (CODE_INVALID_ARGUMENT, format!("runtime-hooks: undecodable {method} request: {e}")))
        }
        match method {
            "Configure" => {
                let req: nri::ConfigureRequest = decode(method, payload)?;
                let events = event_mask(&self.framework.stages());
                tracing::info!(runtime = %req.runtime_name, version = %req.runtime_version, events = format!("{events:#x}"), "NRI: configured");
                self.configured_at = Some(tokio::time::Instant::now());
                Ok(nri::ConfigureResponse { events }.encode_to_vec())
            }
            "Synchronize" => {
                // Each pod and container on its own: one that does not decode is skipped, not
                // the whole runtime state.
                let req: SynchronizeItems = decode(method, payload)?;
                let (pods, bad) = decode_items::<nri::PodSandbox>(&req.pods);
                for (index, id, why) in bad {
                    tracing::warn!(index, sandbox = %id, "NRI Synchronize: a pod that does not decode is skipped: {why}");
                }
                let (containers, bad) = decode_items::<nri::Container>(&req.containers);
                for (index, id, why) in bad {
                    tracing::warn!(index, container = %id, "NRI Synchronize: a container that does not decode is skipped: {why}");
                }
                // A state larger than one ttrpc message (4 MiB; koordinator#2678 on big nodes)
                // comes from NRI 0.7+ runtimes in parts, each but the last with `more`: each part
                // is taken and answered with `more` and no update, the last with every update.
                if !self.sync_in_parts {
                    self.known = Known::default();
                }
                self.known.pods.extend(pods.into_iter().map(|p| (p.id.clone(), p)));
                self.known.containers.extend(containers.into_iter().map(|c| (c.id.clone(), c)));
                self.sync_in_parts = req.more;
                if req.more {
                    tracing::debug!(
                        pods = self.known.pods.len(),
                        containers = self.known.containers.len(),
                        "NRI Synchronize: a part, more to follow"
                    );
                    return Ok(nri::SynchronizeResponse { update: Vec::new(), more: true }.encode_to_vec());
                }
                let update = self.apply_all("synchronize");
                self.synchronized = true;
                Ok(nri::SynchronizeResponse { update, more: false }.encode_to_vec())
            }
            "Shutdown" => {
                tracing::info!("NRI: the runtime is shutting down");
                Ok(nri::Empty {}.encode_to_vec())
            }
            "CreateContainer" => {
                let req: nri::CreateContainerRequest = decode(method, payload)?;
                let (pod, mut container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
                self.known.pods.entry(pod.id.clone()).or_insert_with(|| pod.clone());
                // containerd 1.7 sends CONTAINER_UNKNOWN here; it exists once we answer.
                container.state = nri::ContainerState::ContainerCreated as i32;
                self.known.containers.insert(container.id.clone(), container.clone());
                let ctx = convert::container_context(&pod, &container, None);
                let adjust = match self.container(Stage::PreCreateContainer, &ctx)? {
                    Some(change) => {
                        if let Some(parent) = &change.cgroup_parent {
                            tracing::warn!(on = %ctx.key(), parent, "NRI cannot move a container to another pod cgroup parent; cgroup_parent not applied");
                        }
                        let dir = ctx.pod.cgroup_parent.clone();
                        Some(convert::adjustment(&change, || self.framework.cgroups().shared_cpus(Some(&dir))))
                    }
                    None => None,
                };
                Ok(nri::CreateContainerResponse { adjust, update: Vec::new(), evict: Vec::new() }.encode_to_vec())
            }
            "UpdateContainer" => {
                let req: nri::UpdateContainerRequest = decode(method, payload)?;
                let (pod, mut container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
                let ctx = convert::container_context(&pod, &container, req.linux_resources.as_ref());
                if let Some(new) = req.linux_resources {
                    container.linux.get_or_insert_with(Default::default).resources = Some(new);
                }
                self.known.containers.insert(container.id.clone(), container.clone());
                let update = match self.container(Stage::PreUpdateContainerResources, &ctx)? {
                    Some(change) => {
                        let dir = ctx.pod.cgroup_parent.clone();
                        convert::update(&container.id, &change, || self.framework.cgroups().shared_cpus(Some(&dir))).into_iter().collect()
                    }
                    None => Vec::new(),
                };
                Ok(nri::UpdateContainerResponse { update, evict: Vec::new() }.encode_to_vec())
            }
            "StopContainer" => {
                let req: nri::StopContainerRequest = decode(method, payload)?;
                let (pod, container) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
                if let Some(known) = self.known.containers.get_mut(&container.id) {
                    known.state = nri::ContainerState::ContainerStopped as i32;
                }
                self.container(Stage::PostStopContainer, &convert::container_context(&pod, &container, None))?;
                Ok(nri::StopContainerResponse { update: Vec::new() }.encode_to_vec())
            }
            "StateChange" => {
                let req: nri::StateChangeEvent = decode(method, payload)?;
                self.state_change(req)?;
                Ok(nri::Empty {}.encode_to_vec())
            }
            other => Err((CODE_UNIMPLEMENTED, format!("runtime-hooks: {PLUGIN_SERVICE}/{other} is not implemented"))),
        }
    }

    fn state_change(&mut self, evt: nri::StateChangeEvent) -> Result<(), (i32, String)> {
        let pod = evt.pod.unwrap_or_default();
        let event = Event::try_from(evt.event).unwrap_or(Event::Unknown);
        match event {
            Event::RunPodSandbox => {
                self.known.pods.insert(pod.id.clone(), pod.clone());
                let result = self.pod(Stage::PreRunPodSandbox, &pod);
                self.node_pass("RunPodSandbox");
                result
            }
            Event::StopPodSandbox => self.pod(Stage::PostStopPodSandbox, &pod),
            Event::RemovePodSandbox => {
                // koordlet's PreRemoveRunPodSandbox, with the pod and its containers still known.
                let state = self.pod_states().into_iter().find(|s| s.pod.uid == pod.uid).or_else(|| {
                    let ctx = convert::pod_context(&pod);
                    let cgroup_dir = self.framework.cgroups().resolve(&ctx.cgroup_parent).ok().flatten();
                    self.selected(&ctx).then_some(PodState { pod: ctx, cgroup_dir, containers: Vec::new() })
                });
                if let Some(state) = state {
                    for f in self.framework.pod_removed(&state) {
                        tracing::warn!("NRI: RemovePodSandbox: {f}");
                    }
                }
                self.known.pods.remove(&pod.id);
                self.known.containers.retain(|_, c| c.pod_sandbox_id != pod.id);
                self.node_pass("RemovePodSandbox");
                Ok(())
            }
            Event::StartContainer | Event::PostStartContainer => {
                let stage = if event == Event::StartContainer { Stage::PreStartContainer } else { Stage::PostStartContainer };
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
                    self.known.containers.remove(&c.id);
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
    fn pod(&self, stage: Stage, pod: &nri::PodSandbox) -> Result<(), (i32, String)> {
        let ctx = convert::pod_context(pod);
        if !self.wants(stage) || !self.selected(&ctx) {
            return Ok(());
        }
        let outcome = self.framework.pod_stage(stage, &ctx).map_err(|f| failure(&f))?;
        log_call(stage, &ctx.key(), &outcome.change);
        Ok(())
    }

    /// A container-level stage: the merged change (`None` when the stage is not wanted or the pod
    /// not selected). Errors: a failure under `Fail`, as a status.
    fn container(&self, stage: Stage, ctx: &ContainerContext) -> Result<Option<Change>, (i32, String)> {
        if !self.wants(stage) || !self.selected(&ctx.pod) {
            return Ok(None);
        }
        let outcome: Outcome = self.framework.container_stage(stage, ctx).map_err(|f| failure(&f))?;
        log_call(stage, &ctx.key(), &outcome.change);
        Ok(Some(outcome.change))
    }

    /// Every known pod at PreRunPodSandbox (pod values written) and every created or running
    /// container at PreCreateContainer (resources returned as updates). Failures are logged and
    /// skip the object.
    fn apply_all(&self, reason: &str) -> Vec<nri::ContainerUpdate> {
        let mut pods = 0;
        for pod in self.known.pods.values().filter(|p| self.selected(&convert::pod_context(p))) {
            match self.pod(Stage::PreRunPodSandbox, pod) {
                Ok(()) => pods += 1,
                Err((_, msg)) => tracing::warn!(reason, "NRI: {msg}; pod skipped"),
            }
        }
        let (mut updates, mut containers) = (Vec::new(), 0);
        for c in self.known.containers.values() {
            let live = matches!(
                nri::ContainerState::try_from(c.state),
                Ok(nri::ContainerState::ContainerCreated | nri::ContainerState::ContainerRunning)
            );
            let Some(pod) = self.known.pods.get(&c.pod_sandbox_id).filter(|p| live && self.selected(&convert::pod_context(p))) else {
                continue;
            };
            containers += 1;
            let ctx = convert::container_context(pod, c, None);
            match self.container(Stage::PreCreateContainer, &ctx) {
                Ok(Some(change)) => {
                    let dir = ctx.pod.cgroup_parent.clone();
                    updates.extend(convert::update(&c.id, &change, || self.framework.cgroups().shared_cpus(Some(&dir))));
                }
                Ok(None) => {}
                Err((_, msg)) => tracing::warn!(reason, "NRI: {msg}; container skipped"),
            }
        }
        tracing::info!(reason, pods, containers, updates = updates.len(), "NRI: applied to known pods");
        self.node_pass(reason);
        updates
    }

    /// The known (selected) pods with their cgroup directories, for node-level work.
    fn pod_states(&self) -> Vec<PodState> {
        let cgroups = self.framework.cgroups();
        let mut states: HashMap<&str, PodState> = HashMap::new();
        for (id, pod) in &self.known.pods {
            let ctx = convert::pod_context(pod);
            if !self.selected(&ctx) {
                continue;
            }
            let cgroup_dir = cgroups.resolve(&ctx.cgroup_parent).ok().flatten();
            states.insert(id, PodState { pod: ctx, cgroup_dir, containers: Vec::new() });
        }
        for c in self.known.containers.values() {
            let (Some(state), Some(pod)) = (states.get_mut(c.pod_sandbox_id.as_str()), self.known.pods.get(&c.pod_sandbox_id)) else {
                continue;
            };
            let path = c.linux.as_ref().map(|l| l.cgroups_path.as_str()).unwrap_or_default();
            let cgroup_dir = match path {
                "" => None,
                path => crate::cgroup_path::container_dir(path, state.cgroup_dir.as_deref(), cgroups.driver()).ok(),
            };
            state.containers.push(ContainerState { container: convert::container_context(pod, c, None), cgroup_dir });
        }
        states.into_values().collect()
    }

    /// Every plugin's node-level work over the known pods; each distinct failure logged once, when
    /// it first appears (never fails a pod).
    fn node_pass(&self, reason: &str) {
        let now: std::collections::HashSet<String> = self.framework.node_pass(&self.pod_states()).iter().map(|f| f.to_string()).collect();
        let mut reported = self.node_failures.lock().unwrap_or_else(|e| e.into_inner());
        for f in now.difference(&reported) {
            tracing::warn!(reason, "NRI: node-level work: {f}");
        }
        *reported = now;
    }
}

/// A plugin failure under `Fail` as an NRI error: the runtime fails the CRI call.
fn failure(f: &PluginFailure) -> (i32, String) {
    tracing::warn!(plugin = f.plugin, stage = %f.stage, on = %f.target, "{f} (plugin-failure-policy Fail)");
    (CODE_INTERNAL, format!("runtime-hooks: {f} (plugin-failure-policy Fail)"))
}

/// Sends a request of the `Runtime` service; its response is matched by stream ID in `calls`.
async fn call(
    sender: &Sender,
    next_stream: &mut u32,
    calls: &mut HashMap<u32, &'static str>,
    method: &'static str,
    msg: &impl Message,
) -> anyhow::Result<()> {
    let stream = *next_stream;
    *next_stream += 2;
    let req = ttrpc::Request {
        service: RUNTIME_SERVICE.into(),
        method: method.into(),
        payload: msg.encode_to_vec(),
        timeout_nano: 0,
        metadata: Vec::new(),
    };
    calls.insert(stream, method);
    sender.send(RUNTIME_CONN, stream, REQUEST, FLAG_REMOTE_CLOSED, &req.encode_to_vec()).await.with_context(|| format!("sending {method}"))
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
        NriPlugin::new(Arc::new(framework), Options { socket, name: "t".into(), index: "10".into(), selector: Vec::new() })
    }

    #[test]
    fn event_mask_of_the_default_plugins() {
        let stages = [Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources];
        // RunPodSandbox 1, RemovePodSandbox 3, CreateContainer 4, UpdateContainer 8, StopContainer 10,
        // RemoveContainer 11.
        assert_eq!(event_mask(&stages), 1 | 1 << 2 | 1 << 3 | 1 << 7 | 1 << 9 | 1 << 10);
        assert_eq!(event_mask(&[]), 1 << 2 | 1 << 9 | 1 << 10);
        // Within NRI 0.6.1's ValidEvents (bits 0..=10).
        assert_eq!(event_mask(&Stage::ALL) & !((1 << 11) - 1), 0);
    }

    /// A runtime that does not check UTF-8 sends a CreateContainer whose pod annotation and env
    /// value are bytes: the event is answered, with the BE pod's adjustment.
    #[test]
    fn create_container_with_bytes_is_adjusted() {
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Fail, root.path().join("nri.sock"));
        plugin.synchronized = true;
        let entry = |k: &str, v: &[u8]| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.to_vec() };
        let spec = br#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;
        let pod = nri::PodSandbox {
            id: "s1".into(),
            name: "p".into(),
            namespace: "ns".into(),
            labels: vec![entry("koordinator.sh/qosClass", b"BE")],
            annotations: vec![entry("note", b"\xff\xfe"), entry("node.koordinator.sh/extended-resource-spec", spec)],
            linux: Some(nri::LinuxPodSandbox { cgroup_parent: "/kubepods/besteffort/pod1".into(), ..Default::default() }),
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
        let payload = nri::CreateContainerRequest { pod: Some(pod), container: Some(container) }.encode_to_vec();
        let answer = plugin.dispatch("CreateContainer", &payload).expect("answered");
        let adjust = nri::CreateContainerResponse::decode(answer.as_slice()).unwrap().adjust.expect("an adjustment");
        let cpu = adjust.linux.unwrap().resources.unwrap().cpu.unwrap();
        assert_eq!((cpu.shares.unwrap().value, cpu.quota.unwrap().value), (512, 100_000));
        assert!(adjust.env.is_empty() && adjust.annotations.is_empty(), "nothing of the bytes is sent back");
    }

    /// A Synchronize with one pod that is not protobuf at all: the others are known and the
    /// answer goes out.
    #[test]
    fn synchronize_skips_what_does_not_decode() {
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Ignore, root.path().join("nri.sock"));
        let good = nri::PodSandbox { id: "s2".into(), ..Default::default() }.encode_to_vec();
        let broken = b"\x0a\x02s1\x12\x7f\x01".to_vec();
        let payload = SynchronizeItems { pods: vec![broken, good], containers: Vec::new(), more: false }.encode_to_vec();
        assert!(plugin.dispatch("Synchronize", &payload).is_ok());
        assert!(plugin.synchronized);
        assert_eq!(plugin.known.pods.keys().collect::<Vec<_>>(), vec!["s2"]);
    }

    /// NRI 0.7+'s Synchronize in parts (a state over one 4 MiB ttrpc message: here 6 MiB of pods
    /// in two parts of 3 MiB): each part but the last is answered with `more` and no update, the
    /// last with the updates for every part's containers; a 0.6 runtime's single request is
    /// unchanged. Fails without split handling (the first part would be taken as the whole).
    #[test]
    fn a_synchronize_in_parts_is_taken_whole() {
        let root = tempfile::tempdir().unwrap();
        let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Ignore, root.path().join("nri.sock"));
        let be_pod = |id: &str| {
            let big = nri::BytesEntry { key: b"padding".to_vec(), value: vec![b'x'; 3 << 20] };
            let spec = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}}}}"#;
            let annotations =
                vec![big, nri::BytesEntry { key: b"node.koordinator.sh/extended-resource-spec".to_vec(), value: spec.into() }];
            let labels = vec![nri::BytesEntry { key: b"koordinator.sh/qosClass".to_vec(), value: b"BE".to_vec() }];
            nri::PodSandbox { id: id.into(), uid: id.into(), labels, annotations, ..Default::default() }.encode_to_vec()
        };
        let container = |id: &str, pod: &str| {
            let state = nri::ContainerState::ContainerRunning as i32;
            nri::Container { id: id.into(), pod_sandbox_id: pod.into(), name: "main".into(), state, ..Default::default() }.encode_to_vec()
        };
        let part = |pod: &str, ctr: &str, more: bool| {
            SynchronizeItems { pods: vec![be_pod(pod)], containers: vec![container(ctr, pod)], more }.encode_to_vec()
        };
        let first = part("p1", "c1", true);
        assert!(first.len() < wire::MAX_MESSAGE && 2 * first.len() > wire::MAX_MESSAGE, "{} bytes", first.len());
        let answer = nri::SynchronizeResponse::decode(plugin.dispatch("Synchronize", &first).unwrap().as_slice()).unwrap();
        assert!(answer.more && answer.update.is_empty() && !plugin.synchronized, "{answer:?}");
        let answer =
            nri::SynchronizeResponse::decode(plugin.dispatch("Synchronize", &part("p2", "c2", false)).unwrap().as_slice()).unwrap();
        assert!(!answer.more && plugin.synchronized);
        let mut updated: Vec<&str> = answer.update.iter().map(|u| u.container_id.as_str()).collect();
        updated.sort();
        assert_eq!(updated, ["c1", "c2"], "both parts' containers get their BE values");
        // The next connection's Synchronize, in one request (a 0.6 runtime), starts afresh.
        let answer =
            nri::SynchronizeResponse::decode(plugin.dispatch("Synchronize", &part("p3", "c3", false)).unwrap().as_slice()).unwrap();
        assert_eq!(answer.update.iter().map(|u| u.container_id.as_str()).collect::<Vec<_>>(), ["c3"]);
        assert_eq!(plugin.known.pods.keys().collect::<Vec<_>>(), ["p3"]);
    }

    /// A fake runtime registers the plugin, then closes the connection: right away (the plugin
    /// was never configured: a plain close, as when containerd stops), or after Configure and
    /// before Synchronize — what containerd 2.1 does to a plugin it cannot synchronize (1.7
    /// keeps the connection open instead: the deadline). That one is an error naming the failed
    /// synchronization, so the plugin says why it registers again.
    #[tokio::test]
    async fn a_close_between_configure_and_synchronize_is_a_failed_synchronization() {
        for configure in [false, true] {
            let root = tempfile::tempdir().unwrap();
            let socket = root.path().join("nri.sock");
            let listener = tokio::net::UnixListener::bind(&socket).unwrap();
            let runtime = tokio::spawn(async move {
                let (stream, _) = listener.accept().await.unwrap();
                let (read, write) = stream.into_split();
                let (mut rx, tx) = (Receiver::new(read), Sender::new(write));
                let register = rx.next().await.unwrap();
                assert_eq!((register.conn, register.kind), (RUNTIME_CONN, REQUEST));
                tx.send(RUNTIME_CONN, register.stream, RESPONSE, 0, &ttrpc::Response::default().encode_to_vec()).await.unwrap();
                if configure {
                    let payload = nri::ConfigureRequest { runtime_name: "fake".into(), ..Default::default() }.encode_to_vec();
                    let req = ttrpc::Request { service: PLUGIN_SERVICE.into(), method: "Configure".into(), payload, ..Default::default() };
                    tx.send(PLUGIN_CONN, 1, REQUEST, 0, &req.encode_to_vec()).await.unwrap();
                    let answer = rx.next().await.unwrap();
                    assert_eq!((answer.conn, answer.kind), (PLUGIN_CONN, RESPONSE));
                }
            });
            let mut plugin = test_plugin(root.path(), crate::plugin::FailurePolicy::Ignore, socket);
            let (_changes, mut rules) = watch::channel(0u64);
            let outcome =
                tokio::time::timeout(Duration::from_secs(2), plugin.session(&mut rules)).await.expect("the session ends at the close");
            runtime.await.unwrap();
            match (configure, outcome) {
                (false, outcome) => assert!(outcome.is_ok(), "{outcome:?}"),
                (true, Err(e)) => assert!(format!("{e:#}").contains("did not synchronize it: it closed the connection"), "{e:#}"),
                (true, Ok(())) => panic!("a close after Configure taken for a plain close"),
            }
        }
    }

    #[test]
    fn plugin_index_is_two_digits() {
        assert_eq!(parse_plugin_index("05").unwrap(), "05");
        for bad in ["5", "005", "ab", "", "1a"] {
            assert!(parse_plugin_index(bad).is_err(), "{bad:?}");
        }
    }
}
