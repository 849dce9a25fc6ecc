//! A protocol-level stand-in for a container runtime's NRI side, for the runtimes we cannot run
//! here: NRI 0.12 (containerd 2.3 LTS, 2.4) and, for contrast, a runtime before 0.12.
//!
//! It listens on a unix socket, accepts one plugin connection at a time and speaks NRI as
//! containerd does — ttrpc over the multiplexer (`nri_plugin::wire`): the plugin's
//! `Runtime.RegisterPlugin` (name, index, the plugin's NRI version) is answered; `Configure`
//! carries the runtime's NRI version (0.12: `v0.12.1`; before: none) and the plugin's event mask
//! is checked as NRI does (a bit the runtime's NRI does not know: "invalid plugin events",
//! registration fails); `Synchronize` sends the given pods and containers; then each event the
//! test delivers goes to the plugin if it subscribed to it:
//!
//! * NRI 0.12: the event's own call (`RunPodSandbox`, `StartContainer`, …). A plugin that answers
//!   one of them `UNIMPLEMENTED` (ttrpc status code 12) gets that event over `StateChange`, and
//!   every later event that has a `StateChange` form too (NRI's `pkg/adaptation/plugin_type.go`
//!   wraps the whole plugin); each such event is recorded in [`Plugin::deprecated`], the events
//!   containerd 2.3.4+ logs "NRI plugin uses a deprecated interface" for.
//! * before 0.12: `StateChange` for every event without an answer, no pod update events.
//!
//! The plugin's own `Runtime.UpdateContainers` calls are answered (nothing failed) and recorded.
//! Every wait is bounded ([`WAIT`]): a plugin that does not answer fails the test, not hangs it.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nri_plugin::proto::api::{self as nri, Event};
use nri_plugin::proto::ttrpc;
use nri_plugin::wire::{Receiver, Sender, FLAG_REMOTE_CLOSED, PLUGIN_CONN, REQUEST, RESPONSE, RUNTIME_CONN};
use prost::Message;
use tokio::net::UnixListener;

/// How long the stand-in waits for the plugin's connection or answer.
pub const WAIT: Duration = Duration::from_secs(10);

/// ttrpc (gRPC) status code `UNIMPLEMENTED`.
pub const UNIMPLEMENTED: i32 = 12;

/// The NRI version a 0.12 stand-in sends in `ConfigureRequest.nri_version` (containerd 2.4's).
pub const NRI_0_12: &str = "v0.12.1";

/// The events a runtime delivers over `StateChange` when it has no call for them (or the plugin
/// has none), with their NRI 0.12 calls. The others (CreateContainer, UpdateContainer,
/// StopContainer, UpdatePodSandbox) only ever come as their own calls.
const WITH_STATE_CHANGE_FORM: [(Event, &str); 9] = [
    (Event::RunPodSandbox, "RunPodSandbox"),
    (Event::PostUpdatePodSandbox, "PostUpdatePodSandbox"),
    (Event::StopPodSandbox, "StopPodSandbox"),
    (Event::RemovePodSandbox, "RemovePodSandbox"),
    (Event::PostCreateContainer, "PostCreateContainer"),
    (Event::StartContainer, "StartContainer"),
    (Event::PostStartContainer, "PostStartContainer"),
    (Event::PostUpdateContainer, "PostUpdateContainer"),
    (Event::RemoveContainer, "RemoveContainer"),
];

/// Every lifecycle event a plugin can subscribe to, in the order of a pod's life with one
/// container (create, start, resize, update, stop, remove).
pub const LIFECYCLE: [Event; 13] = [
    Event::RunPodSandbox,
    Event::CreateContainer,
    Event::PostCreateContainer,
    Event::StartContainer,
    Event::PostStartContainer,
    Event::UpdatePodSandbox,
    Event::PostUpdatePodSandbox,
    Event::UpdateContainer,
    Event::PostUpdateContainer,
    Event::StopContainer,
    Event::RemoveContainer,
    Event::StopPodSandbox,
    Event::RemovePodSandbox,
];

/// Whether `event` is a pod sandbox's own (its request carries the pod and no container), as the
/// runtime sends it.
pub fn pod_level(event: Event) -> bool {
    matches!(
        event,
        Event::RunPodSandbox
            | Event::StopPodSandbox
            | Event::RemovePodSandbox
            | Event::UpdatePodSandbox
            | Event::PostUpdatePodSandbox
    )
}

/// The stand-in runtime: its socket and NRI level.
pub struct NriRuntime {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    listener: UnixListener,
    nri_version: Option<&'static str>,
}

/// One registered, configured plugin connection.
pub struct Plugin {
    /// `RegisterPluginRequest` as the plugin sent it.
    pub registered: nri::RegisterPluginRequest,
    /// The plugin's event mask (`ConfigureResponse.events`; 0 is every event, as NRI reads it).
    pub events: i32,
    /// Every call made to the plugin: method and answered status code (0: OK).
    pub calls: Vec<(String, i32)>,
    /// The events delivered over `StateChange` after the plugin answered a call `UNIMPLEMENTED`.
    pub deprecated: BTreeSet<&'static str>,
    /// The plugin's `Runtime.UpdateContainers` requests.
    pub updates: Vec<nri::UpdateContainersRequest>,
    /// How the Synchronize at registration went.
    pub sync: Synchronized,
    per_event: bool,
    fallen_back: bool,
    sender: Sender,
    receiver: Receiver,
    next_stream: u32,
}

/// One Synchronize as the stand-in sent it and the plugin answered it.
#[derive(Debug, Default)]
pub struct Synchronized {
    /// The encoded size of each request sent (one per part), in bytes.
    pub request_bytes: Vec<usize>,
    /// The encoded size of the last part's answer (the one with the updates), in bytes.
    pub answer_bytes: usize,
    /// The updates the answer carried.
    pub answered: Vec<nri::ContainerUpdate>,
    /// From sending the first part to the last answer.
    pub elapsed: Duration,
}

/// What a delivered event answered.
#[derive(Debug)]
pub enum Delivered {
    /// The plugin did not subscribe to the event (nothing sent).
    NotSubscribed,
    /// The answer's payload, from the call named.
    Answered(String, Vec<u8>),
}

impl NriRuntime {
    /// A runtime speaking NRI 0.12 ([`NRI_0_12`]) on a fresh socket.
    ///
    /// Errors: the socket cannot be bound.
    pub fn v0_12() -> io::Result<NriRuntime> {
        NriRuntime::new(Some(NRI_0_12))
    }

    /// A runtime before NRI 0.12 (0.6 to 0.9: no NRI version sent, events 1 to 11, `StateChange`).
    ///
    /// Errors: the socket cannot be bound.
    pub fn before_0_12() -> io::Result<NriRuntime> {
        NriRuntime::new(None)
    }

    fn new(nri_version: Option<&'static str>) -> io::Result<NriRuntime> {
        let dir = tempfile::Builder::new().prefix("nri-stand-in").tempdir()?;
        let socket = dir.path().join("nri.sock");
        let listener = UnixListener::bind(&socket)?;
        Ok(NriRuntime { _dir: dir, socket, listener, nri_version })
    }

    /// The socket plugins dial.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The mask bits this runtime's NRI knows (NRI's `ValidEvents`: 0.12's enum ends at 15, the
    /// older one at 12).
    pub fn valid_events(&self) -> i32 {
        if self.nri_version.is_some() {
            (1 << 14) - 1
        } else {
            (1 << 11) - 1
        }
    }

    /// Accepts the next plugin, answers its registration, configures it and synchronizes it
    /// with `pods` and `containers`.
    ///
    /// Errors: no plugin within [`WAIT`], a broken exchange, or an event mask with a bit the
    /// runtime does not know (as NRI refuses it).
    pub async fn accept(&self, pods: Vec<nri::PodSandbox>, containers: Vec<nri::Container>) -> io::Result<Plugin> {
        let (stream, _) = bounded(self.listener.accept()).await??;
        let (read, write) = stream.into_split();
        let mut plugin = Plugin {
            registered: Default::default(),
            events: 0,
            calls: Vec::new(),
            deprecated: BTreeSet::new(),
            updates: Vec::new(),
            sync: Synchronized::default(),
            per_event: self.nri_version.is_some(),
            fallen_back: false,
            sender: Sender::new(write),
            receiver: Receiver::new(read),
            next_stream: 1,
        };
        let register = bounded(plugin.receiver.next()).await??;
        let req = ttrpc::Request::decode(register.payload.as_slice()).map_err(invalid)?;
        if (register.conn, register.kind, req.method.as_str()) != (RUNTIME_CONN, REQUEST, "RegisterPlugin") {
            return Err(invalid(format!(
                "expected RegisterPlugin first, got {} on connection {}",
                req.method, register.conn
            )));
        }
        plugin.registered = nri::RegisterPluginRequest::decode(req.payload.as_slice()).map_err(invalid)?;
        plugin.answer(register.stream, &nri::Empty {}).await?;
        let configure = nri::ConfigureRequest {
            runtime_name: "nri-stand-in".into(),
            runtime_version: if self.nri_version.is_some() { "v2.4.0" } else { "v1.7.24" }.into(),
            registration_timeout: 5000,
            request_timeout: 2000,
            nri_version: self.nri_version.unwrap_or_default().into(),
            ..Default::default()
        };
        let answer = plugin
            .call("Configure", configure.encode_to_vec())
            .await?
            .map_err(|s| invalid(format!("Configure failed: {s:?}")))?;
        plugin.events = nri::ConfigureResponse::decode(answer.as_slice()).map_err(invalid)?.events;
        let extra = plugin.events & !self.valid_events();
        if extra != 0 {
            return Err(invalid(format!("invalid plugin events: {extra:#x}")));
        }
        plugin.synchronize(pods, containers).await?;
        Ok(plugin)
    }
}

impl Plugin {
    /// Synchronize as NRI sends it (`pkg/adaptation/plugin.go`): the whole state in one request
    /// when it fits ttrpc's message limit, else in parts of halved pod and container counts,
    /// each but the last with `more` (which the plugin must answer with `more` and no update).
    async fn synchronize(&mut self, pods: Vec<nri::PodSandbox>, containers: Vec<nri::Container>) -> io::Result<()> {
        let started = std::time::Instant::now();
        let (mut per_pods, mut per_containers) = (pods.len().max(1), containers.len().max(1));
        let parts = loop {
            let parts = sync_parts(&pods, &containers, per_pods, per_containers);
            // room for the ttrpc request around it
            if parts.iter().all(|p| p.encoded_len() + 1024 <= nri_plugin::wire::MAX_MESSAGE)
                || (per_pods, per_containers) == (1, 1)
            {
                break parts;
            }
            (per_pods, per_containers) = ((per_pods / 2).max(1), (per_containers / 2).max(1));
        };
        for part in parts {
            let more = part.more;
            let payload = part.encode_to_vec();
            self.sync.request_bytes.push(payload.len());
            let answer =
                self.call("Synchronize", payload).await?.map_err(|s| invalid(format!("Synchronize failed: {s:?}")))?;
            let answer_bytes = answer.len();
            let answer = nri::SynchronizeResponse::decode(answer.as_slice()).map_err(invalid)?;
            if more && (answer.more != more || !answer.update.is_empty()) {
                return Err(invalid("plugin does not handle split sync requests"));
            }
            if !more {
                self.sync.answer_bytes = answer_bytes;
                self.sync.answered = answer.update;
            }
        }
        self.sync.elapsed = started.elapsed();
        Ok(())
    }

    /// Whether the plugin subscribed to `event` (an empty mask is every event, as NRI reads it).
    pub fn subscribed(&self, event: Event) -> bool {
        self.events == 0 || self.events & (1 << (event as i32 - 1)) != 0
    }

    /// The calls answered `UNIMPLEMENTED`.
    pub fn unimplemented(&self) -> Vec<&str> {
        self.calls.iter().filter(|(_, code)| *code == UNIMPLEMENTED).map(|(m, _)| m.as_str()).collect()
    }

    /// Delivers `event` about `pod` (and `container`, for a container event) as the runtime
    /// would: its own call, or `StateChange` (before 0.12, or after the plugin answered a call
    /// `UNIMPLEMENTED`). UpdateContainer carries the container's resources as the new ones,
    /// UpdatePodSandbox the pod's.
    ///
    /// Errors: `Ok(Err(status))` for the plugin's error answer (after any fallback); `Err` for
    /// a broken connection or an event this runtime's NRI cannot send.
    pub async fn deliver(
        &mut self,
        event: Event,
        pod: &nri::PodSandbox,
        container: Option<&nri::Container>,
    ) -> io::Result<Result<Delivered, ttrpc::Status>> {
        if !self.subscribed(event) {
            return Ok(Ok(Delivered::NotSubscribed));
        }
        let (pod, container) = (Some(pod.clone()), container.cloned());
        let resources = container.as_ref().and_then(|c| c.linux.as_ref()).and_then(|l| l.resources.clone());
        let payload = match event {
            Event::CreateContainer => nri::CreateContainerRequest { pod, container }.encode_to_vec(),
            Event::UpdateContainer => {
                nri::UpdateContainerRequest { pod, container, linux_resources: resources }.encode_to_vec()
            }
            Event::StopContainer => nri::StopContainerRequest { pod, container }.encode_to_vec(),
            Event::UpdatePodSandbox => {
                let resources = pod.as_ref().and_then(|p| p.linux.as_ref()).and_then(|l| l.pod_resources.clone());
                nri::UpdatePodSandboxRequest { pod, overhead_linux_resources: None, linux_resources: resources }
                    .encode_to_vec()
            }
            _ => {
                let Some(&(_, method)) = WITH_STATE_CHANGE_FORM.iter().find(|(e, _)| *e == event) else {
                    return Err(invalid(format!("no lifecycle event {event:?}")));
                };
                return self.notice(event, method, pod, container).await;
            }
        };
        let method = method_of(event);
        if !self.per_event && event == Event::UpdatePodSandbox {
            return Err(invalid("UpdatePodSandbox is NRI 0.10+"));
        }
        Ok(self.call(method, payload).await?.map(|p| Delivered::Answered(method.to_owned(), p)))
    }

    /// An event with a `StateChange` form: its own call first (0.12), the fallback as NRI does.
    async fn notice(
        &mut self,
        event: Event,
        method: &'static str,
        pod: Option<nri::PodSandbox>,
        container: Option<nri::Container>,
    ) -> io::Result<Result<Delivered, ttrpc::Status>> {
        if self.per_event && !self.fallen_back {
            // Every such request is {pod = 1, container = 2}: StartContainerRequest's encoding
            // is each one's (a pod event's has no container).
            let req = nri::StartContainerRequest { pod: pod.clone(), container: container.clone() };
            match self.call(method, req.encode_to_vec()).await? {
                Err(status) if status.code == UNIMPLEMENTED => self.fallen_back = true,
                other => return Ok(other.map(|p| Delivered::Answered(method.to_owned(), p))),
            }
        } else if !self.per_event && event == Event::PostUpdatePodSandbox {
            return Err(invalid("PostUpdatePodSandbox is NRI 0.10+"));
        }
        if self.per_event {
            self.deprecated.insert(method);
        }
        let evt = nri::StateChangeEvent { event: event as i32, pod, container };
        Ok(self.call("StateChange", evt.encode_to_vec()).await?.map(|p| Delivered::Answered("StateChange".into(), p)))
    }

    /// Calls `method` of the plugin's service and waits for its answer, answering the plugin's
    /// own calls meanwhile.
    ///
    /// Errors: `Ok(Err(status))` for the plugin's error answer; `Err` for a broken connection or
    /// no answer within [`WAIT`].
    pub async fn call(&mut self, method: &str, payload: Vec<u8>) -> io::Result<Result<Vec<u8>, ttrpc::Status>> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let req = ttrpc::Request {
            service: nri_plugin::PLUGIN_SERVICE.into(),
            method: method.into(),
            payload,
            timeout_nano: 2_000_000_000,
            metadata: Vec::new(),
        };
        self.sender.send(PLUGIN_CONN, stream, REQUEST, FLAG_REMOTE_CLOSED, &req.encode_to_vec()).await?;
        loop {
            let msg = bounded(self.receiver.next()).await??;
            match (msg.conn, msg.kind) {
                (PLUGIN_CONN, RESPONSE) if msg.stream == stream => {
                    let resp = ttrpc::Response::decode(msg.payload.as_slice()).map_err(invalid)?;
                    let status = resp.status.filter(|s| s.code != 0);
                    self.calls.push((method.to_owned(), status.as_ref().map_or(0, |s| s.code)));
                    return Ok(match status {
                        Some(s) => Err(s),
                        None => Ok(resp.payload),
                    });
                }
                (RUNTIME_CONN, REQUEST) => self.plugin_call(msg.stream, &msg.payload).await?,
                (conn, kind) => {
                    return Err(invalid(format!("unexpected ttrpc message: connection {conn}, type {kind}")))
                }
            }
        }
    }

    /// Waits up to `within` for the plugin's `Runtime.UpdateContainers` calls (answered and
    /// recorded in [`Plugin::updates`]); returns how many arrived.
    ///
    /// Errors: a broken connection.
    pub async fn take_plugin_calls(&mut self, within: Duration) -> io::Result<usize> {
        let before = self.updates.len();
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(msg) = tokio::time::timeout_at(deadline, self.receiver.next()).await {
            let msg = msg?;
            if (msg.conn, msg.kind) == (RUNTIME_CONN, REQUEST) {
                self.plugin_call(msg.stream, &msg.payload).await?;
            }
        }
        Ok(self.updates.len() - before)
    }

    /// One call of the plugin's (`Runtime` service): UpdateContainers answered with nothing
    /// failed; anything else `UNIMPLEMENTED`.
    async fn plugin_call(&mut self, stream: u32, payload: &[u8]) -> io::Result<()> {
        let req = ttrpc::Request::decode(payload).map_err(invalid)?;
        if req.method == "UpdateContainers" {
            self.updates.push(nri::UpdateContainersRequest::decode(req.payload.as_slice()).map_err(invalid)?);
            return self.answer(stream, &nri::UpdateContainersResponse { failed: Vec::new() }).await;
        }
        let status = ttrpc::Status { code: UNIMPLEMENTED, message: format!("stand-in: {} not served", req.method) };
        let resp = ttrpc::Response { status: Some(status), payload: Vec::new() };
        self.sender.send(RUNTIME_CONN, stream, RESPONSE, 0, &resp.encode_to_vec()).await
    }

    /// Answers the plugin's call on `stream` with `msg`.
    async fn answer(&self, stream: u32, msg: &impl Message) -> io::Result<()> {
        let resp = ttrpc::Response { status: None, payload: msg.encode_to_vec() };
        self.sender.send(RUNTIME_CONN, stream, RESPONSE, 0, &resp.encode_to_vec()).await
    }

    /// Closes the connection (the runtime drops the plugin).
    pub async fn close(self) {
        self.sender.shutdown().await;
    }
}

/// `pods` and `containers` in requests of at most `per_pods` pods and `per_containers`
/// containers, all pods first, each request but the last with `more`.
fn sync_parts(
    pods: &[nri::PodSandbox],
    containers: &[nri::Container],
    per_pods: usize,
    per_containers: usize,
) -> Vec<nri::SynchronizeRequest> {
    let (mut pods, mut containers) = (pods.chunks(per_pods), containers.chunks(per_containers));
    let mut parts = Vec::new();
    loop {
        let (p, c) = (pods.next(), containers.next());
        if p.is_none() && c.is_none() {
            break;
        }
        let (pods, containers) = (p.unwrap_or_default().to_vec(), c.unwrap_or_default().to_vec());
        parts.push(nri::SynchronizeRequest { pods, containers, more: true });
    }
    match parts.last_mut() {
        Some(last) => last.more = false,
        None => parts.push(nri::SynchronizeRequest::default()),
    }
    parts
}

/// The NRI call of an event without a `StateChange` form.
fn method_of(event: Event) -> &'static str {
    match event {
        Event::CreateContainer => "CreateContainer",
        Event::UpdateContainer => "UpdateContainer",
        Event::StopContainer => "StopContainer",
        _ => "UpdatePodSandbox",
    }
}

async fn bounded<F: std::future::Future>(f: F) -> io::Result<F::Output> {
    tokio::time::timeout(WAIT, f)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("no answer within {WAIT:?}")))
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// A pod as the runtime describes it (ID, name, namespace, UID, labels, cgroup parent).
pub fn pod(id: &str, labels: &[(&str, &str)], cgroup_parent: &str) -> nri::PodSandbox {
    let entry = |(k, v): &(&str, &str)| nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() };
    nri::PodSandbox {
        id: id.into(),
        name: format!("{id}-name"),
        uid: format!("{id}-uid"),
        namespace: "default".into(),
        labels: labels.iter().map(entry).collect(),
        linux: Some(nri::LinuxPodSandbox { cgroup_parent: cgroup_parent.into(), ..Default::default() }),
        ..Default::default()
    }
}

/// A container of `pod` as the runtime describes it (ID, name, state running).
pub fn container(id: &str, pod: &nri::PodSandbox) -> nri::Container {
    nri::Container {
        id: id.into(),
        pod_sandbox_id: pod.id.clone(),
        name: "main".into(),
        state: nri::ContainerState::ContainerRunning as i32,
        linux: Some(nri::LinuxContainer { cgroups_path: format!("{}/{id}", pod_parent(pod)), ..Default::default() }),
        ..Default::default()
    }
}

fn pod_parent(pod: &nri::PodSandbox) -> String {
    pod.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default()
}

#[cfg(test)]
#[path = "nri_runtime_tests.rs"]
mod tests;
