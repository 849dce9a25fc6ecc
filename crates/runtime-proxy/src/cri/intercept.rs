//! CRI mode's interceptor: the CRI front end of the one hook flow ([`crate::hooks::flow`]).
//!
//! # What it supplies
//!
//! It supplies what only CRI knows — decoding the protobuf request ([`Call::decode`]), loading from
//! the store or the runtime (`Call::load`), the wire edits that carry the hooks' changes into the
//! request ([`Call::edits`]), sending it on ([`Onward`]: the relay sends the body on the call's own
//! stream and gives the client the answer unchanged as it comes, see [`crate::cri::relay`]) and
//! what the store learns (`Call::commit`); the sequence (pod lock, skip label, stages, post stage)
//! is the flow's, driven by the stage table ([`crate::hooks::stages::METHODS`]).
//!
//! # CRI versions
//!
//! The same methods of `runtime.v1alpha2.RuntimeService` (kubelet 1.23–1.25, served by containerd
//! 1.6 and 1.7) take the same flow. Every v1alpha2 message the proxy reads or edits has the v1
//! layout, field number by field number (v1 only added fields; see the test
//! `tests::v1alpha2_layout`), so both are decoded as v1 messages and edited on the wire, and the
//! fields v1alpha2 lacks stay absent.
//!
//! # Compression
//!
//! A request whose message is compressed (`grpc-encoding: gzip` or `deflate`) is
//! decompressed to read it; when hooks change it, the edited message is compressed again the
//! same way, otherwise the original bytes go on. A backend without that decompressor
//! (containerd 1.6; 1.7 has gzip) then refuses the call exactly as it would without the proxy.
//! Other encodings are refused by the proxy (`UNIMPLEMENTED`, naming the encoding), never read
//! as plain messages.
//!
//! # Ordering and where koord-runtime-proxy differs
//!
//! See [`crate::hooks::flow`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hook_api::convert;
use hook_api::v1alpha1 as hook;
use k8s_cri::v1 as cri;
use prost::Message;

use crate::cri::hook_request::{container_hook_request, pod_hook_request};
use crate::cri::hooked_fields;
use crate::cri::proto_edit::{self, Edit};
use crate::cri::recover;
use crate::cri::restore;
use crate::grpc::backend::Backend;
use crate::grpc::unary_call::{self, Onward};
use crate::grpc::{self, Code, Status};
use crate::hooks::body::{self, BodyError, Chunks};
use crate::hooks::changes::{changed_entries, merged_envs};
use crate::hooks::flow::{self, BeforeHooks, HookRequest};
use crate::hooks::registry::{FailurePolicy, Snapshot};
use crate::hooks::stages::{Method, MethodSpec, METHODS};
use crate::hooks::store::{ContainerEntry, Store};
use crate::hooks::Hooks;

/// Most bytes read (decompressed) of the answers the store learns from: RunPodSandbox's and
/// CreateContainer's, which carry one ID.
const ID_ANSWER_BYTES: usize = 1 << 20;

/// The gRPC path prefixes of the intercepted services: CRI v1 and v1alpha2 RuntimeService.
pub const SERVICES: [&str; 2] = ["/runtime.v1.RuntimeService/", "/runtime.v1alpha2.RuntimeService/"];

/// The row for a gRPC path (`/runtime.v1.RuntimeService/CreateContainer`, or the same under
/// `runtime.v1alpha2`), if the method is intercepted.
pub fn lookup(path: &str) -> Option<&'static MethodSpec> {
    let name = SERVICES.iter().find_map(|service| path.strip_prefix(service))?;
    METHODS.iter().find(|m| m.name == name)
}

/// CRI mode's interceptor: the shared hook state and a CRI client channel to the runtime, to ask
/// it about objects the store does not know.
pub struct Interceptor {
    /// Registry, store, dispatcher, pod locks, skip label and limits, shared by every front end.
    pub hooks: Arc<Hooks>,
    /// The runtime's shared connection (the router's; dialled on first use), for the store
    /// misses' calls ([`recover::fetch_pod`], [`recover::fetch_container`]).
    pub runtime: Arc<Backend>,
}

/// An intercepted call after decoding: the CRI request and what the hooks see. (One lives per
/// call, so the variants' different sizes do not matter.)
/// Public for the fuzz targets in `fuzz/` (decode, hook request, edits; no I/O).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Call {
    /// RunPodSandbox: the pod's hook request is built from the request alone.
    RunPodSandbox {
        /// The request's fields the hooks read and edit.
        req: hooked_fields::RunPodSandboxRequest,
        /// The PreRunPodSandbox hook request built from `req`.
        hook: hook::PodSandboxHookRequest,
    },
    /// `hook` is `None` for a pod sandbox nobody knows (see [`container_hook_request`]).
    CreateContainer {
        /// The request's fields the hooks read and edit.
        req: hooked_fields::CreateContainerRequest,
        /// The PreCreateContainer hook request, built by `Call::load` from `req` and the stored
        /// pod.
        hook: Option<hook::ContainerResourceHookRequest>,
    },
    /// UpdateContainerResources: the stored container with the request's resources and
    /// annotations merged in.
    UpdateContainerResources {
        /// The request's fields the hooks read and edit.
        req: hooked_fields::UpdateContainerResourcesRequest,
        /// The stored container (asked of the runtime on a store miss), the update merged in;
        /// `None` before `Call::load` or when nobody knows it.
        entry: Option<ContainerEntry>,
    },
    /// StartContainer, StopContainer: the stored container, if known.
    Container {
        /// The request's `container_id`.
        id: String,
        /// Filled by `Call::load`; `None` when neither the store nor the runtime knows it.
        entry: Option<ContainerEntry>,
    },
    /// StopPodSandbox: the stored pod, if known.
    Pod {
        /// The request's `pod_sandbox_id`.
        id: String,
        /// Filled by `Call::load`; `None` when neither the store nor the runtime knows it.
        pod: Option<hook::PodSandboxHookRequest>,
    },
    /// RemoveContainer: no stage; the store forgets the container once the runtime removed it.
    RemoveContainer {
        /// The request's `container_id`.
        id: String,
    },
    /// RemovePodSandbox: no stage; the store forgets the pod once the runtime removed it.
    RemovePodSandbox {
        /// The request's `pod_sandbox_id`.
        id: String,
    },
    /// UpdatePodSandboxResources (CRI v1 only, kubelet 1.33+): what the store learns once the
    /// runtime accepted it.
    UpdatePodSandboxResources {
        /// The request, decoded (CRI v1 field numbers).
        req: crate::cri::newer_cri::UpdatePodSandboxResourcesRequest,
    },
    /// RestorePod (CRI v1 only, kubelet 1.37+): never driven through the flow; see
    /// [`crate::cri::restore`].
    RestorePod {
        /// The request's fields the proxy reads (CRI v1 field numbers).
        req: crate::cri::newer_cri::RestorePodRequest,
    },
}

impl Interceptor {
    /// Runs one intercepted call (`method`: its gRPC path; `parts`: its request head; `body`:
    /// its body, read whole by [`read_body`]) up to the backend's answer, which `onward` sends
    /// it for. Returns the answer (for the front end to give the client, unless `onward` did)
    /// and the post stage, to run once the client has it.
    ///
    /// The caller's `grpc-timeout` bounds the pre stage and the backend call (the head `onward`
    /// gets carries what is left of it).
    ///
    /// Errors: the status to answer the client with, naming the method: a hook failure under `Fail`, `onward`'s
    /// (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, see [`unary_call::unary`]), `INTERNAL` when hook changes cannot be applied
    /// to the request.
    pub async fn intercept<'a>(
        &'a self,
        spec: &'static MethodSpec,
        method: &'a str,
        onward: Onward<'a>,
        parts: http::request::Parts,
        body: Bytes,
    ) -> Result<(unary_call::Answer, Option<impl std::future::Future<Output = ()> + Send + 'static>), Status> {
        let deadline = grpc::parse_timeout(&parts.headers).map(|d| Instant::now() + d);
        if spec.method == Method::RestorePod {
            // No hook stage: guarded and learned from on its own (`crate::cri::restore`).
            return restore::restore_pod(&self.hooks, &self.runtime, method, onward, parts, body)
                .await
                .map(|a| (a, None));
        }
        let in_method = |s: Status| Status::new(s.code, format!("{method}: {}", s.message));
        let encoding = parts.headers.get("grpc-encoding");
        let message =
            match grpc::unary_message(&body, encoding, self.hooks.limits.max_request_bytes).map_err(in_method)? {
                Some(m) => m,
                None => {
                    self.undecodable(
                        spec,
                        method,
                        &self.hooks.registry.snapshot(),
                        "",
                        "the body is not one gRPC message",
                    )?;
                    return onward(parts, body, deadline).await.map(|a| (a, None));
                }
            };
        // One call per pod at a time. Every hooked method's request starts with its ID (field 1:
        // the pod sandbox ID, or the container ID, whose pod the store knows).
        let id = proto_edit::string_field(&message, 1).unwrap_or_default();
        let key = pod_key(spec.method, id, &self.hooks.store);
        let front = CriCall { interceptor: self, spec, method, message: &message, id, deadline };
        let (answer, post) =
            flow::drive(&self.hooks, spec, &front, key.as_deref(), Outgoing { parts, body, onward }, deadline).await?;
        Ok((answer, post.map(flow::Post::run)))
    }

    /// The call decoded from `message`, with what the store (or the runtime) knows of its pod
    /// sandbox or container. A request that does not decode, or whose hook request cannot be
    /// built (a `sandbox_config` that does not decode, a pod sandbox or container the runtime
    /// knows but describes unreadably) is left to [`Interceptor::undecodable`]: `Ok(None)` to
    /// go on without hooks (the store learns nothing from it), or its refusal.
    ///
    /// The call is boxed: a `Call` is kilobytes (the CRI request's messages lie inline), and
    /// every future it lives in across an await would carry it, to be copied when the task is
    /// spawned.
    async fn decode_and_load(
        &self,
        spec: &MethodSpec,
        method: &str,
        message: &Bytes,
        snapshot: &Snapshot,
    ) -> Result<Option<Box<Call>>, Status> {
        let mut call = match Call::decode(spec.method, message.clone()) {
            Ok(call) => Box::new(call),
            Err(e) => {
                self.undecodable(spec, method, snapshot, &hooked_fields::target(spec.name, message), &e.to_string())?;
                return Ok(None);
            }
        };
        match call.load(&self.hooks.store, &self.runtime).await {
            Ok(()) => Ok(Some(call)),
            Err(why) => {
                self.undecodable(spec, method, snapshot, &hooked_fields::target(spec.name, message), &why)?;
                Ok(None)
            }
        }
    }

    /// What becomes of a request the proxy cannot decode, or can decode only in part (`why`:
    /// the field and the reason; `target`: the pod or container, as far as it can be read),
    /// so that no hook server is skipped without its failure policy deciding: with a server
    /// whose policy is `Fail` registered for the method's pre stage, the call is refused with
    /// `INVALID_ARGUMENT` naming the method, that server, the field and the reason; otherwise
    /// (only `Ignore` servers, a method without a pre stage — post stages never refuse a call —
    /// or no servers) a WARN says so and the call goes on without hooks (`Ok`). Both are counted
    /// in `runtime_proxy_undecodable_requests_total{method}`.
    fn undecodable(
        &self,
        spec: &MethodSpec,
        method: &str,
        snapshot: &Snapshot,
        target: &str,
        why: &str,
    ) -> Result<(), Status> {
        self.hooks.metrics.undecodable_request(spec.name);
        let fail = spec.pre.and_then(|stage| {
            snapshot.for_stage(stage).find(|s| s.failure_policy == FailurePolicy::Fail).map(|s| (stage, s))
        });
        if let Some((stage, server)) = fail {
            tracing::warn!(method, target, stage = stage.as_str(), server = %server.name, error = why, "cannot decode the request; hook server with failure-policy Fail: refusing the call");
            return Err(Status::new(
                Code::INVALID_ARGUMENT,
                format!(
                    "{method}: cannot decode the request for the {} hook server {} (failure-policy Fail){}: {why}",
                    stage.as_str(),
                    server.name,
                    if target.is_empty() { String::new() } else { format!(", {target}") }
                ),
            ));
        }
        tracing::warn!(method, target, error = why, "cannot decode the request: forwarded unchanged, without hooks (no hook server with failure-policy Fail at its stage); the store learns nothing from it");
        Ok(())
    }

    /// Whether what [`Call::load`] reads for a call of `method` on `id` (its request's first
    /// field) is in the store already: no runtime round trip.
    fn loads_from_store(&self, method: Method, id: &str) -> bool {
        match method {
            Method::RunPodSandbox
            | Method::RemoveContainer
            | Method::RemovePodSandbox
            | Method::UpdatePodSandboxResources
            | Method::RestorePod => true,
            Method::CreateContainer | Method::StopPodSandbox => self.hooks.store.has_pod(id),
            Method::StartContainer | Method::StopContainer | Method::UpdateContainerResources => {
                self.hooks.store.sandbox_of(id).is_some()
            }
        }
    }
}

/// The pod sandbox whose calls a call of `method` on `id` (its request's first field) must not
/// interleave with: the sandbox itself, or the container's (from the store; the container ID
/// when the store does not know it). `None` for RunPodSandbox, whose sandbox does not exist yet.
fn pod_key(method: Method, id: &str, store: &Store) -> Option<String> {
    match method {
        Method::RunPodSandbox | Method::RestorePod => None,
        Method::CreateContainer
        | Method::StopPodSandbox
        | Method::RemovePodSandbox
        | Method::UpdatePodSandboxResources => Some(id.to_owned()),
        Method::StartContainer | Method::StopContainer | Method::RemoveContainer | Method::UpdateContainerResources => {
            Some(store.sandbox_of(id).unwrap_or_else(|| id.to_owned()))
        }
    }
}

impl Call {
    /// Decodes the request; for RunPodSandbox also builds the hook request (the others need the
    /// store: `Call::load`).
    pub fn decode(method: Method, msg: Bytes) -> Result<Call, prost::DecodeError> {
        Ok(match method {
            Method::RunPodSandbox => {
                let req = hooked_fields::RunPodSandboxRequest::decode(msg)?;
                let hook = pod_hook_request(req.config.as_ref(), &req.runtime_handler);
                Call::RunPodSandbox { req, hook }
            }
            Method::CreateContainer => {
                Call::CreateContainer { req: hooked_fields::CreateContainerRequest::decode(msg)?, hook: None }
            }
            Method::UpdateContainerResources => Call::UpdateContainerResources {
                req: hooked_fields::UpdateContainerResourcesRequest::decode(msg)?,
                entry: None,
            },
            Method::StartContainer => {
                Call::Container { id: cri::StartContainerRequest::decode(msg)?.container_id, entry: None }
            }
            Method::StopContainer => {
                Call::Container { id: cri::StopContainerRequest::decode(msg)?.container_id, entry: None }
            }
            Method::StopPodSandbox => {
                Call::Pod { id: cri::StopPodSandboxRequest::decode(msg)?.pod_sandbox_id, pod: None }
            }
            Method::RemoveContainer => {
                Call::RemoveContainer { id: cri::RemoveContainerRequest::decode(msg)?.container_id }
            }
            Method::RemovePodSandbox => {
                Call::RemovePodSandbox { id: cri::RemovePodSandboxRequest::decode(msg)?.pod_sandbox_id }
            }
            Method::UpdatePodSandboxResources => Call::UpdatePodSandboxResources {
                req: crate::cri::newer_cri::UpdatePodSandboxResourcesRequest::decode(msg)?,
            },
            Method::RestorePod => Call::RestorePod { req: crate::cri::newer_cri::RestorePodRequest::decode(msg)? },
        })
    }

    /// Builds what the hooks will see from the request and the store (koord-runtime-proxy's
    /// `pkg/runtimeproxy/resexecutor/cri/`); called once it is this call's turn for its pod. A pod sandbox or container
    /// the store does not know is asked of the runtime (verbose status) and recorded; when the runtime does not know it
    /// either, its hooks are skipped (logged) and the runtime answers the call.
    ///
    /// Errors: what cannot be read — a `sandbox_config` that does not decode, or the runtime's
    /// description of the object (see [`recover::fetch_pod`]) — naming the field or the object.
    async fn load(&mut self, store: &Store, runtime: &Backend) -> Result<(), String> {
        match self {
            Call::CreateContainer { req, hook } => {
                if !store.has_pod(&req.pod_sandbox_id) {
                    if let Err(why) = Box::pin(recover::fetch_pod(runtime, store, &req.pod_sandbox_id)).await {
                        // kubelet sends the pod's config with every CreateContainer: enough to
                        // build the hook request from.
                        if req.sandbox_config.is_empty() {
                            return Err(why);
                        }
                        tracing::debug!(sandbox_id = %req.pod_sandbox_id, reason = %why, "store miss: the runtime's answer is unusable; pod read from the request's sandbox_config");
                    }
                }
                *hook = container_hook_request(req, store)
                    .map_err(|e| format!("CreateContainerRequest.sandbox_config: {e}"))?;
                if hook.is_none() {
                    tracing::warn!(sandbox_id = %req.pod_sandbox_id, "CreateContainer: pod sandbox unknown to the store and the runtime, and no sandbox_config; hooks skipped");
                }
            }
            Call::UpdateContainerResources { req, entry } => {
                *entry = match store.container(&req.container_id) {
                    Some(e) => Some(e),
                    None => Box::pin(recover::fetch_container(runtime, store, &req.container_id)).await?,
                };
                match entry.as_mut() {
                    Some(e) => {
                        let resources = e.hook.container_resources.get_or_insert_with(Default::default);
                        if let Some(update) = &req.linux {
                            hook_api::merge::merge_update(resources, &convert::to_hook(update));
                        }
                        hook_api::merge::merge_map(
                            &mut e.hook.container_annotations,
                            &hooked_fields::utf8_entries(&req.annotations),
                        );
                    }
                    None => {
                        tracing::warn!(container_id = %req.container_id, "UpdateContainerResources: container unknown to the store and the runtime; hooks skipped")
                    }
                }
            }
            Call::Container { id, entry } => {
                *entry = match store.container(id) {
                    Some(e) => Some(e),
                    None => Box::pin(recover::fetch_container(runtime, store, id)).await?,
                };
            }
            Call::Pod { id, pod } => {
                *pod = match store.pod(id) {
                    Some(p) => Some(p),
                    None => Box::pin(recover::fetch_pod(runtime, store, id)).await?,
                };
            }
            Call::RunPodSandbox { .. }
            | Call::RemoveContainer { .. }
            | Call::RemovePodSandbox { .. }
            | Call::UpdatePodSandboxResources { .. }
            | Call::RestorePod { .. } => {}
        }
        Ok(())
    }

    /// The pod's labels (where the skip label is looked up) and metadata (its namespace).
    fn pod_of(&self) -> Option<(&BTreeMap<String, String>, Option<&hook::PodSandboxMetadata>)> {
        match self {
            Call::RunPodSandbox { hook, .. } => Some((&hook.labels, hook.pod_meta.as_ref())),
            Call::CreateContainer { hook, .. } => hook.as_ref().map(|h| (&h.pod_labels, h.pod_meta.as_ref())),
            Call::UpdateContainerResources { entry, .. } | Call::Container { entry, .. } => {
                entry.as_ref().map(|e| (&e.hook.pod_labels, e.hook.pod_meta.as_ref()))
            }
            Call::Pod { pod, .. } => pod.as_ref().map(|p| (&p.labels, p.pod_meta.as_ref())),
            Call::RemoveContainer { .. }
            | Call::RemovePodSandbox { .. }
            | Call::UpdatePodSandboxResources { .. }
            | Call::RestorePod { .. } => None,
        }
    }

    /// A copy of the hook request as it stands (for tests and the fuzz targets; the pre stage
    /// gets its copy from the dispatcher, made only when an answer changes the request).
    pub fn hook_state(&self) -> BeforeHooks {
        match self {
            Call::RunPodSandbox { hook, .. } => BeforeHooks::Pod(hook.clone()),
            Call::CreateContainer { hook: Some(hook), .. } => BeforeHooks::Container(hook.clone()),
            Call::UpdateContainerResources { entry: Some(e), .. } => BeforeHooks::Container(e.hook.clone()),
            _ => BeforeHooks::Unchanged,
        }
    }

    /// The wire edits that carry what the hooks changed (the hook request now, compared with
    /// `before` the pre stage) into the CRI request. Only fields a hook changed are edited, so
    /// with no hook (or hooks that only echo) the request goes out byte for byte.
    pub fn edits(&self, before: &BeforeHooks) -> Vec<(u32, Edit)> {
        match (self, before) {
            (Call::RunPodSandbox { req, hook }, BeforeHooks::Pod(before)) => {
                let default = hooked_fields::PodSandboxConfig::default();
                let config = req.config.as_ref().unwrap_or(&default);
                let mut inner = Vec::new();
                if let Some(labels) = changed_map(&config.labels, &before.labels, &hook.labels) {
                    inner.push((6, replace(hooked_fields::PodSandboxConfig { labels, ..Default::default() })));
                }
                if let Some(annotations) = changed_map(&config.annotations, &before.annotations, &hook.annotations) {
                    inner.push((7, replace(hooked_fields::PodSandboxConfig { annotations, ..Default::default() })));
                }
                if hook.cgroup_parent != before.cgroup_parent {
                    inner.push(cgroup_parent_edit(&hook.cgroup_parent));
                }
                nested(1, inner)
            }
            (Call::CreateContainer { req, hook: Some(hook) }, BeforeHooks::Container(before)) => {
                let default = hooked_fields::ContainerConfig::default();
                let config = req.config.as_ref().unwrap_or(&default);
                let mut inner = Vec::new();
                if let Some(annotations) =
                    changed_map(&config.annotations, &before.container_annotations, &hook.container_annotations)
                {
                    inner.push((10, replace(hooked_fields::ContainerConfig { annotations, ..Default::default() })));
                }
                let envs = merged_envs(&config.envs, &changed_entries(&before.container_envs, &hook.container_envs));
                if envs != config.envs {
                    inner.push((6, replace(hooked_fields::ContainerConfig { envs, ..Default::default() })));
                }
                let default = cri::LinuxContainerResources::default();
                let current = config.linux.as_ref().and_then(|l| l.resources.as_ref()).unwrap_or(&default);
                let resources = resource_edits(current, &before.container_resources, &hook.container_resources);
                if !resources.is_empty() {
                    inner.push((15, Edit::Nested(vec![(1, Edit::Nested(resources))])));
                }
                let mut edits = nested(2, inner);
                if hook.pod_cgroup_parent != before.pod_cgroup_parent {
                    edits.push((3, Edit::Nested(vec![cgroup_parent_edit(&hook.pod_cgroup_parent)])));
                }
                edits
            }
            (Call::UpdateContainerResources { req, entry: Some(e) }, BeforeHooks::Container(before)) => {
                let default = cri::LinuxContainerResources::default();
                let current = req.linux.as_ref().unwrap_or(&default);
                let mut edits =
                    nested(2, resource_edits(current, &before.container_resources, &e.hook.container_resources));
                if let Some(annotations) =
                    changed_map(&req.annotations, &before.container_annotations, &e.hook.container_annotations)
                {
                    edits.push((
                        4,
                        replace(hooked_fields::UpdateContainerResourcesRequest { annotations, ..Default::default() }),
                    ));
                }
                edits
            }
            _ => Vec::new(),
        }
    }

    /// Records what a successful call taught the store; `post`: a post stage follows, which
    /// needs the call's hook request still (else it moves into the store).
    fn commit(&mut self, answer: &unary_call::Answer, store: &Store, post: bool) {
        match self {
            Call::RunPodSandbox { req, hook } => {
                match answer.message(ID_ANSWER_BYTES).map(|m| m.map(cri::RunPodSandboxResponse::decode)) {
                    Ok(Some(Ok(resp))) => {
                        // A PreRunPodSandbox answer's `resources` reach nothing in CRI mode (no CRI
                        // field takes a sandbox's resources; koord ignores them too): the store keeps
                        // the resources the runtime got, as recovery reads them back.
                        let mut pod = hook.clone();
                        pod.resources = req
                            .config
                            .as_ref()
                            .and_then(|c| c.linux.as_ref())
                            .and_then(|l| l.resources.as_ref())
                            .map(convert::to_hook);
                        store.put_pod(&resp.pod_sandbox_id, pod)
                    }
                    _ => tracing::warn!("RunPodSandbox answer without a sandbox ID; pod not recorded"),
                }
            }
            Call::CreateContainer { req, hook: Some(hook) } => {
                match answer.message(ID_ANSWER_BYTES).map(|m| m.map(cri::CreateContainerResponse::decode)) {
                    Ok(Some(Ok(resp))) => {
                        let mut hook = if post { hook.clone() } else { std::mem::take(hook) };
                        hook.container_meta.get_or_insert_with(Default::default).id = resp.container_id.clone();
                        store.put_container(
                            &resp.container_id,
                            ContainerEntry { sandbox_id: req.pod_sandbox_id.clone(), hook },
                        );
                    }
                    _ => tracing::warn!("CreateContainer answer without a container ID; container not recorded"),
                }
            }
            Call::UpdateContainerResources { req, entry: Some(e) } => store.put_container(&req.container_id, e.clone()),
            Call::Container { id, entry: Some(e) } => store.put_container(id, e.clone()),
            Call::RemoveContainer { id } => store.remove_container(id),
            Call::RemovePodSandbox { id } => store.remove_pod(id),
            Call::UpdatePodSandboxResources { req } => {
                let (overhead, resources) =
                    (req.overhead.as_ref().map(convert::to_hook), req.resources.as_ref().map(convert::to_hook));
                if !store.update_pod_resources(&req.pod_sandbox_id, overhead, resources) {
                    // Nothing stale to fix: a later call that needs the pod asks the runtime.
                    tracing::debug!(sandbox_id = %req.pod_sandbox_id, "UpdatePodSandboxResources: pod sandbox unknown to the store");
                }
            }
            _ => {}
        }
    }
}

/// Field-level edits of the CRI request's resources `current`: every field the hooks changed
/// (`after` differs from `before`) is set to the hooks' value, unless it already has it.
fn resource_edits(
    current: &cri::LinuxContainerResources,
    before: &Option<hook::LinuxContainerResources>,
    after: &Option<hook::LinuxContainerResources>,
) -> Vec<(u32, Edit)> {
    if before == after {
        return Vec::new();
    }
    let before = before.as_ref().map(convert::to_cri).unwrap_or_default();
    let after = after.as_ref().map(convert::to_cri).unwrap_or_default();
    let mut edits = Vec::new();
    macro_rules! field {
        ($num:expr, $f:ident) => {
            if before.$f != after.$f && current.$f != after.$f {
                edits
                    .push(($num, replace(cri::LinuxContainerResources { $f: after.$f.clone(), ..Default::default() })));
            }
        };
    }
    field!(1, cpu_period);
    field!(2, cpu_quota);
    field!(3, cpu_shares);
    field!(4, memory_limit_in_bytes);
    field!(5, oom_score_adj);
    field!(6, cpuset_cpus);
    field!(7, cpuset_mems);
    field!(8, hugepage_limits);
    field!(9, unified);
    field!(10, memory_swap_limit_in_bytes);
    edits
}

/// `current` (the request's map, values as bytes) with the hooks' changes to it (`before` →
/// `after`) merged in as koord merges maps (the hooks' entries added or replaced, nothing
/// removed); every other value, text or not, byte for byte. `None` when that changes nothing.
fn changed_map(
    current: &hooked_fields::Text,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> Option<hooked_fields::Text> {
    let mut merged = current.clone();
    for (k, v) in changed_entries(before, after) {
        merged.insert(k, v.into_bytes());
    }
    (merged != *current).then_some(merged)
}

/// Edit of `PodSandboxConfig.linux.cgroup_parent` (fields 8, 1).
fn cgroup_parent_edit(cgroup_parent: &str) -> (u32, Edit) {
    let field = cri::LinuxPodSandboxConfig { cgroup_parent: cgroup_parent.to_owned(), ..Default::default() };
    (8, Edit::Nested(vec![(1, replace(field))]))
}

/// A `Replace` with the encoding of a message that has only the edited field set.
fn replace(message: impl Message) -> Edit {
    Edit::Replace(message.encode_to_vec())
}

fn nested(field: u32, inner: Vec<(u32, Edit)>) -> Vec<(u32, Edit)> {
    if inner.is_empty() {
        Vec::new()
    } else {
        vec![(field, Edit::Nested(inner))]
    }
}

/// A request body as the front end receives it: its chunks in order (the DATA frames' data),
/// closed after the last; an `Err` ends it early (the stream broke).
pub type RequestBody = tokio::sync::mpsc::UnboundedReceiver<Result<Bytes, Status>>;

impl Chunks for RequestBody {
    type Error = Status;
    async fn next_chunk(&mut self) -> Option<Result<Bytes, Status>> {
        self.recv().await
    }
}

/// Reads a whole request body: at most `limits.max_request_bytes` plus the 5-byte gRPC prefix,
/// with no gap longer than `limits.request_idle_timeout` between frames ([`body::read_whole`]).
///
/// Errors: `RESOURCE_EXHAUSTED` for a larger body, `DEADLINE_EXCEEDED` for a stalled one,
/// the front end's status when the client's stream breaks; each names the method (and the flag).
pub async fn read_body(
    mut body: RequestBody,
    method: &str,
    limits: &crate::hooks::limits::Limits,
) -> Result<Bytes, Status> {
    body::read_whole(&mut body, limits.max_request_bytes + 5, limits.request_idle_timeout).await.map_err(|e| match e {
        BodyError::Stalled(idle) => Status::new(
            Code::DEADLINE_EXCEEDED,
            format!("{method}: request body stalled for {idle:?} (--request-idle-timeout)"),
        ),
        BodyError::TooLarge { .. } => {
            let max = limits.max_request_bytes;
            Status::new(
                Code::RESOURCE_EXHAUSTED,
                format!("{method}: request larger than {max} bytes (--max-request-bytes)"),
            )
        }
        BodyError::Broken(s) => Status::new(s.code, format!("{method}: {}", s.message)),
    })
}

/// Rewrites `grpc-timeout` to what is left, so the backend's deadline is the kubelet's, not the
/// kubelet's plus the time hooks took.
fn set_timeout(headers: &mut http::HeaderMap, left: Duration) {
    headers.insert("grpc-timeout", grpc::timeout_value(left));
}

/// What goes on to the runtime: the request head, the (edited) body, and how it is sent.
pub struct Outgoing<'a> {
    parts: http::request::Parts,
    body: Bytes,
    onward: Onward<'a>,
}

/// One intercepted CRI call, as the hook flow sees it ([`flow::Front`]).
struct CriCall<'a, 'b> {
    interceptor: &'a Interceptor,
    spec: &'static MethodSpec,
    method: &'a str,
    /// The request's gRPC message (decompressed).
    message: &'b Bytes,
    /// The request's first field: the pod sandbox's or container's ID.
    id: &'b str,
    deadline: Option<Instant>,
}

impl<'a, 'b> flow::Front for CriCall<'a, 'b> {
    type Call = Call;
    type Request = Outgoing<'a>;
    type Answer = unary_call::Answer;
    type Error = Status;

    fn name(&self) -> &str {
        self.method
    }

    fn send_first(&self, _hooks: &Hooks) -> bool {
        self.interceptor.loads_from_store(self.spec.method, self.id)
    }

    async fn load(&self, _hooks: &Hooks, snapshot: &Snapshot) -> Result<Option<Box<Call>>, Status> {
        self.interceptor.decode_and_load(self.spec, self.method, self.message, snapshot).await
    }

    fn apply(&self, call: &Call, before: &BeforeHooks, request: Outgoing<'a>) -> Result<Outgoing<'a>, Status> {
        let edits = call.edits(before);
        if edits.is_empty() {
            return Ok(request);
        }
        match proto_edit::apply(self.message, &edits) {
            Ok(edited) => Ok(Outgoing {
                body: grpc::reframe(&edited, &request.body, request.parts.headers.get("grpc-encoding")),
                ..request
            }),
            Err(e) => Err(Status::new(
                Code::INTERNAL,
                format!("{}: cannot apply hook changes to the request: {e}", self.method),
            )),
        }
    }

    fn send(&self, request: Outgoing<'a>) -> impl Future<Output = Result<unary_call::Answer, Status>> + Send {
        // What is left of the caller's deadline goes on with the call.
        let Outgoing { mut parts, body, onward } = request;
        if let Some(d) = self.deadline {
            set_timeout(&mut parts.headers, d.saturating_duration_since(Instant::now()));
        }
        onward(parts, body, self.deadline)
    }

    fn succeeded(&self, answer: &unary_call::Answer) -> bool {
        answer.status().code == Code::OK
    }

    fn commit(&self, call: &mut Call, answer: &unary_call::Answer, store: &Store, post: bool) {
        call.commit(answer, store, post)
    }

    fn refuse(&self, status: Status) -> Status {
        status
    }
}

impl flow::HookedCall for Call {
    fn hook_request(&mut self) -> Option<HookRequest<'_>> {
        match self {
            Call::RunPodSandbox { hook, .. } => Some(HookRequest::Pod(hook)),
            Call::Pod { pod: Some(p), .. } => Some(HookRequest::Pod(p)),
            Call::CreateContainer { hook: Some(hook), .. } => Some(HookRequest::Container(hook)),
            Call::UpdateContainerResources { entry: Some(e), .. } | Call::Container { entry: Some(e), .. } => {
                Some(HookRequest::Container(&mut e.hook))
            }
            _ => None,
        }
    }

    fn pod(&self) -> Option<(&BTreeMap<String, String>, Option<&hook::PodSandboxMetadata>)> {
        self.pod_of()
    }
}

#[cfg(test)]
#[path = "intercept_tests.rs"]
mod tests;
