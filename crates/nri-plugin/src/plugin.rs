//! The connection loop of an external NRI plugin, behind [`Handler`].
//!
//! | step | what happens |
//! |---|---|
//! | dial | `Options::socket` (a unix socket); not there: retry after 100 ms, doubling up to 5 s |
//! | register | `Runtime.RegisterPlugin` with `Options::name`, `Options::index` and the NRI level spoken ([`crate::events::SPOKEN`]); a refusal ends the connection |
//! | `Configure` | answered with [`Handler::configure`]'s event mask, less the events the runtime's NRI does not know ([`crate::events::known_mask`] of `ConfigureRequest.nri_version`: a bit it does not know fails the registration) |
//! | `Synchronize` | the pods and containers that exist, each trimmed to what the handler reads ([`Handler::reads`]) and decoded one by one (one that does not decode is skipped with a WARN); NRI 0.7+ sends a state over one ttrpc message in parts (`more`): each part but the last is answered with `more` and no update, the last with [`Handler::synchronize`]'s updates over every part: as many as one ttrpc message holds ([`crate::answer::UPDATES_BUDGET`]), the rest sent right after with `Runtime.UpdateContainers`, one request per 4 MiB |
//! | no `Synchronize` within [`SYNC_TIMEOUT`] of Configure, or a close between them | the runtime dropped the plugin (containerd cannot synchronize a pod whose strings are not UTF-8): register again |
//! | events | each event's dedicated call (NRI 0.12: `RunPodSandbox`, `StartContainer`, …) or, from a runtime before 0.12, `StateChange`, trimmed to what the handler reads, to the handler method of [`crate::events::EVENTS`], one at a time (the runtime serializes them too); a [`Refusal`] becomes the ttrpc error status, which fails the runtime's call |
//! | protocol level | logged once per connection: at Configure from the runtime's NRI version (0.12+), else from the first call only one level makes (`StateChange`, or a call new in 0.12) |
//! | `Shutdown` | acknowledged; the runtime closes the socket next |
//! | wake | when the handler's wake channel changes (after Synchronize): [`Handler::refresh`]'s updates sent with `Runtime.UpdateContainers`, one request per 4 MiB |
//! | resubscribe | at a wake, first: when [`Handler::wanted_events`] differs from the subscription (as the runtime's NRI knows its events), one INFO line naming both, then (once the plugin's own calls under way are answered) the connection is closed and the plugin registers again at once, subscribing anew — NRI cannot change a live connection's subscription |
//! | close | [`Handler::disconnected`]; dial again (back-off reset once registered; none after a resubscribe) |
//!
//! Shutdown (the caller's future) closes the socket: the runtime drops the plugin and goes on
//! without it. A plugin that does not answer within the runtime's request timeout
//! (containerd's `plugin_request_timeout`, 2 s by default) is dropped by the runtime.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use hook_api::status::{Code, Status};
use prost::Message;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::answer;
use crate::events::{self, Call};
use crate::proto::api as nri;
use crate::proto::ttrpc;
use crate::trim::Reads;
use crate::wire::{Receiver, Sender, FLAG_REMOTE_CLOSED, PLUGIN_CONN, REQUEST, RESPONSE, RUNTIME_CONN};
use crate::{decode_items, PLUGIN_SERVICE, RUNTIME_SERVICE};

const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long after Configure the runtime has to send Synchronize (containerd sends it at once).
/// A runtime that does not has dropped the plugin without closing the connection — containerd
/// does so when synchronizing fails — and would never call it: the plugin then registers again.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and as whom to connect.
#[derive(Clone, Debug)]
pub struct Options {
    /// The runtime's NRI socket (default [`crate::DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// Plugin name (`--nri-plugin-name`).
    pub name: String,
    /// Plugin index, two digits ([`crate::parse_plugin_index`]): plugins are called in ascending
    /// order.
    pub index: String,
    /// What the plugin calls itself in the error messages it answers (`runtime-hooks`).
    pub program: &'static str,
}

/// An error answer to the runtime: the project's one status type ([`hook_api::status::Status`],
/// a `google.rpc.Code` and a message), sent as ttrpc's `Status`. The runtime fails the call that
/// caused the event (RunPodSandbox, CreateContainer, UpdateContainerResources).
pub type Refusal = Status;

/// What a plugin does at each call of the runtime. The loop calls one method at a time, in the
/// order the runtime sends its calls.
pub trait Handler: Send {
    /// `Configure`: the events the plugin subscribes to ([`crate::event_mask`]). NRI reads 0 as
    /// every event.
    fn configure(&mut self, req: &nri::ConfigureRequest) -> i32;

    /// The events the plugin needs now ([`crate::event_mask`]), asked at each wake while
    /// synchronized, before [`Handler::refresh`]: a mask that subscribes to other events than
    /// Configure's answer did (of those the runtime's NRI knows) makes the loop close the
    /// connection and register again at once, answering Configure anew; events the runtime sends
    /// meanwhile do not reach the plugin. `None` (the default): the subscription stays.
    fn wanted_events(&mut self) -> Option<i32> {
        None
    }

    /// `Synchronize`: the pods and containers that exist (every part of a split Synchronize,
    /// together); the answer is the container updates the runtime applies.
    fn synchronize(
        &mut self,
        pods: Vec<nri::PodSandbox>,
        containers: Vec<nri::Container>,
    ) -> impl Future<Output = Vec<nri::ContainerUpdate>> + Send;

    /// `CreateContainer`, before the container is created.
    ///
    /// Errors: a [`Refusal`] fails the container's creation.
    fn create_container(
        &mut self,
        req: nri::CreateContainerRequest,
    ) -> impl Future<Output = Result<nri::CreateContainerResponse, Refusal>> + Send;

    /// `UpdateContainer` (kubelet's UpdateContainerResources), before the runtime applies it.
    ///
    /// Errors: a [`Refusal`] fails the update.
    fn update_container(
        &mut self,
        req: nri::UpdateContainerRequest,
    ) -> impl Future<Output = Result<nri::UpdateContainerResponse, Refusal>> + Send;

    /// `StopContainer`, once the container stopped.
    ///
    /// Errors: a [`Refusal`] (the runtime logs it).
    fn stop_container(
        &mut self,
        req: nri::StopContainerRequest,
    ) -> impl Future<Output = Result<nri::StopContainerResponse, Refusal>> + Send;

    /// An event without an answer ([`crate::events::Call::Notice`]: RunPodSandbox,
    /// StopPodSandbox, RemovePodSandbox, StartContainer, PostStartContainer, RemoveContainer,
    /// PostUpdatePodSandbox, …), from its dedicated call (NRI 0.12+) or from `StateChange`
    /// (older runtimes), in the one shape: the event, its pod, its container.
    ///
    /// Errors: a [`Refusal`] fails the runtime's call where NRI lets a plugin fail it
    /// (RunPodSandbox, StartContainer). A refusal coded `UNIMPLEMENTED` (a hook server's, say)
    /// is sent as `UNKNOWN` from a dedicated call: an NRI 0.12 runtime reads `UNIMPLEMENTED` there
    /// as a plugin without the call and would deliver the event again over `StateChange`.
    fn event(&mut self, evt: nri::StateChangeEvent) -> impl Future<Output = Result<(), Refusal>> + Send;

    /// Whether the handler takes `event` as its own NRI 0.12 call (default: every event). `false`
    /// answers that call `UNIMPLEMENTED`, as a plugin built before NRI 0.12 does: an NRI 0.12
    /// runtime then delivers it, and every later event with a `StateChange` form, over
    /// `StateChange` (for tests of that fallback).
    fn per_event_call(&self, event: nri::Event) -> bool {
        let _ = event;
        true
    }

    /// `UpdatePodSandbox` (NRI 0.10+; containerd 2.3+ sends it for an in-place pod resize), before
    /// the runtime applies the pod's new resources. Default: nothing.
    ///
    /// Errors: a [`Refusal`] fails the update.
    fn update_pod_sandbox(
        &mut self,
        req: nri::UpdatePodSandboxRequest,
    ) -> impl Future<Output = Result<nri::UpdatePodSandboxResponse, Refusal>> + Send {
        let _ = req;
        async { Ok(nri::UpdatePodSandboxResponse {}) }
    }

    /// The handler's own updates when its wake channel changed (see [`run`]). Default: none.
    fn refresh(&mut self) -> impl Future<Output = Vec<nri::ContainerUpdate>> + Send {
        async { Vec::new() }
    }

    /// What the updates of [`Handler::refresh`] carry, for their log lines ("for the new rules":
    /// `NRI: containers updated for the new rules`). Default: nothing.
    const REFRESHED: &'static str = "";

    /// The runtime's answer to the updates [`Handler::refresh`] returned: the ones it failed.
    /// Default: one INFO line when none failed, else one WARN naming them (with
    /// [`Handler::REFRESHED`]).
    fn refreshed(&mut self, failed: &[nri::ContainerUpdate]) {
        log_refreshed(Self::REFRESHED, failed);
    }

    /// What the handler reads of the pods and containers of the runtime's calls (Synchronize,
    /// CreateContainer, UpdateContainer, StopContainer, StateChange): the rest is dropped from
    /// the encoded request before it is decoded ([`crate::trim`]), so a pod author's envs or
    /// annotations the handler never reads are never allocated. Asked once per call. Default:
    /// everything ([`Reads::ALL`]).
    fn reads(&self) -> Reads {
        Reads::ALL
    }

    /// The connection is gone (the runtime closed it, it failed, or the plugin closed it to
    /// subscribe anew): what the runtime said is no longer current; the next connection
    /// synchronizes again.
    fn disconnected(&mut self) {}

    /// Whether the handler is connected and synchronized now (`true`) or not (`false`), for
    /// health reporting. Default: nothing.
    fn connection_state(&mut self, _synchronized: bool) {}
}

/// [`Handler::refreshed`]'s default: one INFO line when no update failed, else one WARN naming
/// the containers; `what` says what the updates were for ("" for nothing).
pub fn log_refreshed(what: &str, failed: &[nri::ContainerUpdate]) {
    let sep = if what.is_empty() { "" } else { " " };
    if failed.is_empty() {
        tracing::info!("NRI: containers updated{sep}{what}");
    } else {
        let ids: Vec<&str> = failed.iter().map(|u| u.container_id.as_str()).collect();
        tracing::warn!(failed = ?ids, "NRI: the runtime failed to update some containers{sep}{what}");
    }
}

/// Resolves [`SYNC_TIMEOUT`] after `configured_at`; never before Configure.
async fn sync_deadline(configured_at: Option<tokio::time::Instant>) {
    match configured_at {
        Some(at) => tokio::time::sleep_until(at + SYNC_TIMEOUT).await,
        None => std::future::pending().await,
    }
}

/// Waits for a change of `wake`, if there is one; a closed channel never wakes again.
async fn woken(wake: &mut Option<watch::Receiver<u64>>) {
    match wake {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The request of every [`Call::Notice`] event's dedicated call: the pod (1) and, for a
/// container event, the container (2) (NRI 0.12's `RunPodSandboxRequest`, `StartContainerRequest`,
/// …, all of this shape).
#[derive(Clone, PartialEq, Message)]
struct PodAndContainer {
    #[prost(message, optional, tag = "1")]
    pod: Option<nri::PodSandbox>,
    #[prost(message, optional, tag = "2")]
    container: Option<nri::Container>,
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

/// Runs the plugin until `shutdown` resolves: connects, serves `handler`, reconnects with
/// back-off. When `wake` changes while the plugin is synchronized, [`Handler::refresh`]'s
/// updates go to the runtime.
///
/// Errors: none so far (a runtime that is not there is waited for); kept for the callers' shape.
pub async fn run<H: Handler>(
    handler: &mut H,
    options: &Options,
    mut wake: Option<watch::Receiver<u64>>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    if let Some(rx) = &mut wake {
        rx.borrow_and_update();
    }
    let mut backoff = BACKOFF_MIN;
    let mut last_error: Option<String> = None;
    loop {
        let mut session = Session::new(handler, options);
        let outcome = tokio::select! {
            () = &mut shutdown => break,
            r = session.serve(&mut wake) => r,
        };
        let registered = session.synchronized;
        handler.disconnected();
        handler.connection_state(false);
        let msg = match outcome {
            Ok(Ended::Resubscribe) => {
                backoff = BACKOFF_MIN;
                last_error = None;
                continue;
            }
            Ok(Ended::Closed) => "the runtime closed the connection".to_owned(),
            Err(e) => format!("{e:#}"),
        };
        if registered {
            backoff = BACKOFF_MIN;
            tracing::warn!(socket = %options.socket.display(), "NRI connection lost ({msg}); reconnecting");
            last_error = None;
        } else if last_error.as_deref() != Some(msg.as_str()) {
            tracing::warn!(socket = %options.socket.display(), "NRI: {msg}; retrying (up to every {BACKOFF_MAX:?})");
            last_error = Some(msg);
        } else {
            tracing::debug!(socket = %options.socket.display(), "NRI: {msg}; retrying");
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

/// How a connection ended without an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The runtime closed it.
    Closed,
    /// The plugin closed it to subscribe to other events ([`Handler::wanted_events`]).
    Resubscribe,
}

/// One connection's state.
pub struct Session<'a, H> {
    handler: &'a mut H,
    options: &'a Options,
    /// Configured and synchronized on this connection.
    pub synchronized: bool,
    /// When the runtime configured us (Synchronize is due next).
    configured_at: Option<tokio::time::Instant>,
    /// The parts of a Synchronize sent in parts (NRI 0.7+ `more`) so far.
    parts: Option<(Vec<nri::PodSandbox>, Vec<nri::Container>)>,
    /// The protocol level in use on this connection, once known (logged then).
    pub protocol: Option<Protocol>,
    /// Updates to send with `Runtime.UpdateContainers`, one request per part: what did not fit in
    /// the Synchronize answer or in one request ([`answer::in_parts`]).
    pending: Vec<Vec<nri::ContainerUpdate>>,
    /// The events this connection subscribed to (Configure's answer, less what the runtime's NRI
    /// does not know) and the mask of those it knows; `None` before Configure.
    pub subscribed: Option<(i32, i32)>,
}

/// How a connection's runtime delivers the events without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// One call per event (NRI 0.12+).
    PerEvent,
    /// `StateChange` (NRI before 0.12).
    StateChange,
}

/// What a handled call answers: a payload, or a refusal.
type Answer = Result<Vec<u8>, Refusal>;

impl<'a, H: Handler> Session<'a, H> {
    /// A connection not made yet.
    pub fn new(handler: &'a mut H, options: &'a Options) -> Self {
        Session {
            handler,
            options,
            synchronized: false,
            configured_at: None,
            parts: None,
            protocol: None,
            pending: Vec::new(),
            subscribed: None,
        }
    }

    /// One connection: dial, register, serve until it closes ([`Ended::Closed`]) or the handler
    /// needs other events ([`Ended::Resubscribe`]).
    ///
    /// Errors: dialling, registering, reading or answering failed, or the runtime configured the
    /// plugin but did not synchronize it.
    pub async fn serve(&mut self, wake: &mut Option<watch::Receiver<u64>>) -> anyhow::Result<Ended> {
        let socket = &self.options.socket;
        let stream =
            UnixStream::connect(socket).await.with_context(|| format!("connecting to {}", socket.display()))?;
        let (read, write) = stream.into_split();
        let sender = Sender::new(write);
        let mut receiver = Receiver::new(read);
        let mut next_stream = 1u32;
        let mut calls: HashMap<u32, &'static str> = HashMap::new();
        // The handler needs other events: the connection closes once our calls are answered.
        let mut resubscribing = false;
        let register = nri::RegisterPluginRequest {
            plugin_name: self.options.name.clone(),
            plugin_idx: self.options.index.clone(),
            nri_version: crate::events::SPOKEN.into(),
        };
        call(&sender, &mut next_stream, &mut calls, "RegisterPlugin", &register).await?;
        tracing::info!(socket = %socket.display(), name = %self.options.name, index = %self.options.index, "NRI: connected, registering");
        loop {
            tokio::select! {
                msg = receiver.next() => {
                    let msg = match msg {
                        Ok(m) => m,
                        // containerd 2.x closes the connection of a plugin it cannot synchronize
                        // (1.7 keeps it open and sends nothing: the deadline below).
                        Err(e)
                            if e.kind() == std::io::ErrorKind::UnexpectedEof
                                && self.configured_at.is_some()
                                && !self.synchronized =>
                        {
                            anyhow::bail!(
                                "the runtime configured the plugin but did not synchronize it: it closed the connection (containerd 2.x \
                                 closes a plugin's connection when it cannot synchronize it, e.g. with a pod whose annotations or env \
                                 are not UTF-8: \"failed to synchronize plugin: string field contains invalid UTF-8\" in its log); \
                                 registering again"
                            );
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Ended::Closed),
                        Err(e) => return Err(e).context("reading from the runtime"),
                    };
                    match (msg.conn, msg.kind) {
                        (PLUGIN_CONN, REQUEST) => {
                            let response = self.handle(&msg.payload).await;
                            sender.respond(msg.stream, &response).await.context("answering the runtime")?;
                            for update in std::mem::take(&mut self.pending) {
                                let req = nri::UpdateContainersRequest { update, evict: Vec::new() };
                                call(&sender, &mut next_stream, &mut calls, "UpdateContainers", &req).await?;
                            }
                        }
                        (RUNTIME_CONN, RESPONSE) => {
                            self.response(calls.remove(&msg.stream), &msg.payload)?;
                            if resubscribing && calls.is_empty() {
                                return Ok(Ended::Resubscribe);
                            }
                        }
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
                () = woken(wake), if self.synchronized => {
                    // Our calls still under way are answered first: a close would cut them.
                    if resubscribing || self.resubscribe() {
                        if calls.is_empty() {
                            return Ok(Ended::Resubscribe);
                        }
                        resubscribing = true;
                        continue;
                    }
                    let updates = self.handler.refresh().await;
                    for update in answer::in_parts(updates, answer::UPDATES_BUDGET) {
                        let req = nri::UpdateContainersRequest { update, evict: Vec::new() };
                        call(&sender, &mut next_stream, &mut calls, "UpdateContainers", &req).await?;
                    }
                }
            }
        }
    }

    /// Whether the handler now wants other events than this connection subscribed to (of those
    /// the runtime's NRI knows); if so, logs the old and the new set.
    fn resubscribe(&mut self) -> bool {
        let (Some((subscribed, known)), Some(wanted)) = (self.subscribed, self.handler.wanted_events()) else {
            return false;
        };
        let now = wanted & known;
        if now == subscribed {
            return false;
        }
        tracing::info!(
            old = %events::names(subscribed).join(","),
            new = %events::names(now).join(","),
            "NRI: the plugin needs other events: registering again to subscribe to them"
        );
        true
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
            "RegisterPlugin" => {
                tracing::info!(name = %self.options.name, index = %self.options.index, "NRI: registered")
            }
            "UpdateContainers" => {
                let failed = nri::UpdateContainersResponse::decode(resp.payload.as_slice())
                    .map(|r| r.failed)
                    .unwrap_or_default();
                self.handler.refreshed(&failed);
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers one request of the runtime.
    async fn handle(&mut self, payload: &[u8]) -> ttrpc::Response {
        let program = self.options.program;
        let answer = match ttrpc::Request::decode(payload) {
            Err(e) => Err(Status::new(Code::INVALID_ARGUMENT, format!("{program}: undecodable ttrpc request: {e}"))),
            Ok(req) if req.service != PLUGIN_SERVICE => {
                Err(Status::new(Code::UNIMPLEMENTED, format!("{program}: unknown service {}", req.service)))
            }
            Ok(req) => self.dispatch(&req.method, &req.payload).await,
        };
        match answer {
            Ok(payload) => ttrpc::Response { status: None, payload },
            Err(r) => ttrpc::Response {
                status: Some(ttrpc::Status { code: i32::from(r.code.0), message: r.message }),
                payload: Vec::new(),
            },
        }
    }

    /// Decodes the `Plugin` service call `method` and passes it to the handler.
    ///
    /// Errors: an undecodable request, an unknown method, or the handler's refusal.
    pub async fn dispatch(&mut self, method: &str, payload: &[u8]) -> Answer {
        let program = self.options.program;
        match method {
            "Configure" => {
                let req: nri::ConfigureRequest = decoded(program, method, payload)?;
                let wanted = self.handler.configure(&req);
                let level = events::runtime_level(&req.nri_version);
                let events = wanted & events::known_mask(level);
                let nri_version =
                    if req.nri_version.is_empty() { "before 0.12 (not sent)" } else { req.nri_version.as_str() };
                tracing::info!(
                    runtime = %req.runtime_name,
                    version = %req.runtime_version,
                    nri = %nri_version,
                    events = format!("{events:#x}"),
                    subscribed = %events::names(events).join(","),
                    "NRI: configured"
                );
                if events != wanted {
                    tracing::info!(
                        nri = %nri_version,
                        left_out = ?events::names(wanted & !events),
                        "NRI: the runtime's NRI does not know some events the plugin handles; not subscribed"
                    );
                }
                if level.is_some_and(|l| l >= events::Level::V0_12) {
                    self.protocol_is(Protocol::PerEvent);
                }
                self.configured_at = Some(tokio::time::Instant::now());
                self.subscribed = Some((events, events::known_mask(level)));
                Ok(nri::ConfigureResponse { events }.encode_to_vec())
            }
            "Synchronize" => self.synchronize(decoded(program, method, payload)?).await,
            "Shutdown" => {
                tracing::info!("NRI: the runtime is shutting down");
                Ok(nri::Empty {}.encode_to_vec())
            }
            "StateChange" => {
                self.protocol_is(Protocol::StateChange);
                self.handler.event(trimmed(program, method, payload, &self.handler.reads(), (2, 3))?).await?;
                Ok(nri::Empty {}.encode_to_vec())
            }
            other => match events::by_method(other) {
                Some(spec) => self.event(spec, payload).await,
                None => Err(Status::new(
                    Code::UNIMPLEMENTED,
                    format!("{program}: {PLUGIN_SERVICE}/{other} is not implemented"),
                )),
            },
        }
    }

    /// The dedicated call of one event ([`events::EVENTS`]), to its handler method.
    ///
    /// Errors: an undecodable request, or the handler's refusal.
    async fn event(&mut self, spec: &events::EventSpec, payload: &[u8]) -> Answer {
        let (program, method) = (self.options.program, spec.method);
        if spec.call_since >= events::Level::V0_12 {
            self.protocol_is(Protocol::PerEvent);
        }
        let tags = (1, if spec.container { 2 } else { 0 });
        let reads = self.handler.reads();
        match spec.call {
            Call::Create => Ok(self
                .handler
                .create_container(trimmed(program, method, payload, &reads, tags)?)
                .await?
                .encode_to_vec()),
            Call::Update => Ok(self
                .handler
                .update_container(trimmed(program, method, payload, &reads, tags)?)
                .await?
                .encode_to_vec()),
            Call::Stop => {
                Ok(self.handler.stop_container(trimmed(program, method, payload, &reads, tags)?).await?.encode_to_vec())
            }
            Call::UpdatePod => Ok(self
                .handler
                .update_pod_sandbox(trimmed(program, method, payload, &reads, tags)?)
                .await?
                .encode_to_vec()),
            Call::Notice => {
                if !self.handler.per_event_call(spec.event) {
                    return Err(Status::new(
                        Code::UNIMPLEMENTED,
                        format!("{program}: {PLUGIN_SERVICE}/{method} is not served"),
                    ));
                }
                let req: PodAndContainer = trimmed(program, method, payload, &reads, tags)?;
                let evt = nri::StateChangeEvent { event: spec.event as i32, pod: req.pod, container: req.container };
                self.handler.event(evt).await.map_err(|r| match r.code {
                    Code::UNIMPLEMENTED => {
                        Status::new(Code::UNKNOWN, format!("{} (UNIMPLEMENTED, sent as UNKNOWN)", r.message))
                    }
                    _ => r,
                })?;
                // Every answer of these calls is an empty message.
                Ok(Vec::new())
            }
        }
    }

    /// Logs the protocol level the first time it is known on this connection.
    fn protocol_is(&mut self, protocol: Protocol) {
        if self.protocol.is_some() {
            return;
        }
        self.protocol = Some(protocol);
        match protocol {
            Protocol::PerEvent => tracing::info!("NRI: protocol level 0.12: the runtime calls one method per event"),
            Protocol::StateChange => {
                tracing::info!(
                    "NRI: protocol level before 0.12: the runtime sends the events without an answer over StateChange"
                )
            }
        }
    }

    /// One Synchronize request: each pod and container decoded on its own (one that does not
    /// decode is skipped, not the whole runtime state); a part with `more` is kept and answered
    /// with `more`, the last part goes to the handler with every earlier part.
    async fn synchronize(&mut self, mut req: SynchronizeItems) -> Answer {
        let reads = self.handler.reads();
        if !reads.is_all() {
            // An item that does not trim does not decode either: kept as it is, to be named below.
            for pod in &mut req.pods {
                if let Ok(t) = reads.pod(pod) {
                    *pod = t;
                }
            }
            for container in &mut req.containers {
                if let Ok(t) = reads.container(container) {
                    *container = t;
                }
            }
        }
        let (pods, bad) = decode_items::<nri::PodSandbox>(&req.pods);
        for (index, id, why) in bad {
            tracing::warn!(index, sandbox = %id, "NRI Synchronize: a pod that does not decode is skipped: {why}");
        }
        let (containers, bad) = decode_items::<nri::Container>(&req.containers);
        for (index, id, why) in bad {
            tracing::warn!(index, container = %id, "NRI Synchronize: a container that does not decode is skipped: {why}");
        }
        // A state larger than one ttrpc message (4 MiB; koordinator#2678 on big nodes) comes
        // from NRI 0.7+ runtimes in parts, each but the last with `more`.
        let (all_pods, all_containers) = self.parts.get_or_insert_with(Default::default);
        all_pods.extend(pods);
        all_containers.extend(containers);
        if req.more {
            tracing::debug!(
                pods = all_pods.len(),
                containers = all_containers.len(),
                "NRI Synchronize: a part, more to follow"
            );
            return Ok(nri::SynchronizeResponse { update: Vec::new(), more: true }.encode_to_vec());
        }
        let (pods, containers) = self.parts.take().unwrap_or_default();
        let update = self.handler.synchronize(pods, containers).await;
        // The answer is one ttrpc message (NRI has no `more` for it): what passes the limit
        // follows at once with `Runtime.UpdateContainers`, in parts.
        let mut parts = answer::in_parts(update, answer::UPDATES_BUDGET).into_iter();
        let update = parts.next().unwrap_or_default();
        self.pending.extend(parts);
        if !self.pending.is_empty() {
            tracing::info!(
                answered = update.len(),
                requests = self.pending.len(),
                "NRI Synchronize: more updates than one ttrpc message holds; the rest follow with UpdateContainers"
            );
        }
        self.synchronized = true;
        self.handler.connection_state(true);
        Ok(nri::SynchronizeResponse { update, more: false }.encode_to_vec())
    }
}

/// Decodes a request of `method` (`program` names us in the error).
///
/// Errors: `INVALID_ARGUMENT` naming the method.
fn decoded<M: Message + Default>(program: &str, method: &str, payload: &[u8]) -> Result<M, Refusal> {
    M::decode(payload)
        .map_err(|e| Status::new(Code::INVALID_ARGUMENT, format!("{program}: undecodable {method} request: {e}")))
}

/// Decodes a request of `method` whose pod and container are the fields `tags` (pod, container),
/// without what the handler does not read ([`Reads::request`]; as it is for [`Reads::ALL`]).
///
/// Errors: `INVALID_ARGUMENT` naming the method.
fn trimmed<M: Message + Default>(
    program: &str,
    method: &str,
    payload: &[u8],
    reads: &Reads,
    tags: (u32, u32),
) -> Result<M, Refusal> {
    if reads.is_all() {
        return decoded(program, method, payload);
    }
    let bytes = reads
        .request(payload, tags.0, tags.1)
        .map_err(|e| Status::new(Code::INVALID_ARGUMENT, format!("{program}: undecodable {method} request: {e}")))?;
    decoded(program, method, &bytes)
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
    sender
        .send(RUNTIME_CONN, stream, REQUEST, FLAG_REMOTE_CLOSED, &req.encode_to_vec())
        .await
        .with_context(|| format!("sending {method}"))
}

#[cfg(test)]
#[path = "plugin_tests.rs"]
mod tests;
