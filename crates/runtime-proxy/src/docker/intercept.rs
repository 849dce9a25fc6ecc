//! The hooked Docker Engine API calls: the container calls dockershim / cri-dockerd make for
//! pods, mapped onto the CRI stage table ([`ROUTES`] → [`crate::hooks::stages::METHODS`]) and
//! driven through the one hook flow ([`crate::hooks::flow::drive`]) over the shared
//! [`Hooks`] state (registry, dispatcher, store, per-pod locks, skip label; nothing is copied).
//!
//! # Routes
//!
//! | Docker call | sandbox (`k8s_POD_…`) | container (`k8s_<name>_…`) |
//! |---|---|---|
//! | `POST /containers/create?name=…` | RunPodSandbox: PreRunPodSandbox | CreateContainer: PreCreateContainer |
//! | `POST /containers/{id}/start` | – | StartContainer: PreStartContainer, PostStartContainer |
//! | `POST /containers/{id}/update` | – | UpdateContainerResources: PreUpdateContainerResources |
//! | `POST /containers/{id}/stop` | StopPodSandbox: PostStopPodSandbox | StopContainer: PostStopContainer |
//! | `DELETE /containers/{id}` | RemovePodSandbox: store clean-up | RemoveContainer: store clean-up |
//!
//! # Requests and answers
//!
//! Answers are written into the JSON body field by field ([`model`]); a body no hook changed
//! goes on byte for byte. Containers not named the Kubernetes way pass through untouched.
//!
//! `{id}` may be a full ID, a short ID or a name: what the store does not know is looked up in
//! dockerd (inspect) and recorded.
//!
//! # Failures and post stages
//!
//! A hook failure under `Fail` is answered in Docker's error shape (`{"message": …}`) with an HTTP
//! status mapped from the gRPC code; an unknown container gets dockerd's own answer. Post stages
//! run after the answer is sent, still holding the pod's turn taken before the pre stage (as in CRI
//! mode).

use std::collections::BTreeMap;
use std::future::Future;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use hook_api::v1alpha1 as hook;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use super::model::{self, DockerObject, KubeName};
use super::recover;
use super::relay::{self, Body, Upstream};
use crate::grpc::{Code, Status};
use crate::hooks::body::{self, BodyError, Chunks};
use crate::hooks::flow::{self, BeforeHooks, HookRequest};
use crate::hooks::registry::Snapshot;
use crate::hooks::stages::{self, Method as CriMethod};
use crate::hooks::store::{ContainerEntry, Store};
use crate::hooks::Hooks;

/// An intercepted Docker call (the `{id}` as the client wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `POST /containers/create`.
    Create,
    /// `POST /containers/{id}/start`.
    Start(String),
    /// `POST /containers/{id}/stop`.
    Stop(String),
    /// `POST /containers/{id}/update`.
    Update(String),
    /// `DELETE /containers/{id}`.
    Delete(String),
}

impl Route {
    /// The route's row of [`ROUTES`].
    pub fn spec(&self) -> &'static RouteSpec {
        &ROUTES[match self {
            Route::Create => 0,
            Route::Start(_) => 1,
            Route::Stop(_) => 2,
            Route::Update(_) => 3,
            Route::Delete(_) => 4,
        }]
    }

    /// The metrics label of the route (a fixed set).
    pub fn label(&self) -> &'static str {
        self.spec().label
    }
}

/// The intercepted route of a request, if any. Any API version prefix (`/v1.41`) is accepted.
pub fn route(method: &Method, path: &str) -> Option<Route> {
    let path = strip_version(path);
    let parts: Vec<&str> = path.strip_prefix('/')?.split('/').collect();
    let id = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    match (method, parts.as_slice()) {
        (&Method::POST, ["containers", "create"]) => Some(Route::Create),
        (&Method::POST, ["containers", name, "start"]) => id(name).map(Route::Start),
        (&Method::POST, ["containers", name, "stop"]) => id(name).map(Route::Stop),
        (&Method::POST, ["containers", name, "update"]) => id(name).map(Route::Update),
        (&Method::DELETE, ["containers", name]) => id(name).map(Route::Delete),
        _ => None,
    }
}

/// `path` without a leading `/v<digits>[.<digits>]` segment.
fn strip_version(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/v") else { return path };
    let end = rest.find('/').unwrap_or(rest.len());
    let version = &rest[..end];
    if !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && version.as_bytes()[0].is_ascii_digit()
    {
        &rest[end..]
    } else {
        path
    }
}

/// The HTTP status a Docker client gets for a hook failure of gRPC code `code`.
/// `FAILED_PRECONDITION` (a hook chain's field conflict under `Fail`, a required hook server
/// not registered) is 409 Conflict: the call conflicts with the node's state, which Docker's
/// API answers 409 (its clients read it as `errdefs.Conflict`), not a bad request.
pub fn http_status(code: Code) -> StatusCode {
    match code.0 {
        3 | 11 => StatusCode::BAD_REQUEST,
        5 => StatusCode::NOT_FOUND,
        6 | 9 | 10 => StatusCode::CONFLICT,
        7 | 16 => StatusCode::FORBIDDEN,
        8 => StatusCode::TOO_MANY_REQUESTS,
        14 => StatusCode::SERVICE_UNAVAILABLE,
        4 => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// One row of the Docker route table: the route's metrics label and the rows of the stage table
/// ([`crate::hooks::stages::METHODS`]) its call maps onto, for a pod sandbox and for a pod's
/// container (`None`: that call passes through without hooks).
#[derive(Debug)]
pub struct RouteSpec {
    /// The route's `method` label in the call metrics (`docker POST /containers/create`).
    pub label: &'static str,
    /// The stage table row the call runs for a pod sandbox (`k8s_POD_…`).
    pub sandbox: Option<CriMethod>,
    /// The stage table row the call runs for a pod's container.
    pub container: Option<CriMethod>,
}

/// Every intercepted route, in [`Route`]'s order.
pub const ROUTES: [RouteSpec; 5] = [
    RouteSpec {
        label: "docker POST /containers/create",
        sandbox: Some(CriMethod::RunPodSandbox),
        container: Some(CriMethod::CreateContainer),
    },
    RouteSpec {
        label: "docker POST /containers/{id}/start",
        sandbox: None,
        container: Some(CriMethod::StartContainer),
    },
    RouteSpec {
        label: "docker POST /containers/{id}/stop",
        sandbox: Some(CriMethod::StopPodSandbox),
        container: Some(CriMethod::StopContainer),
    },
    RouteSpec {
        label: "docker POST /containers/{id}/update",
        sandbox: None,
        container: Some(CriMethod::UpdateContainerResources),
    },
    RouteSpec {
        label: "docker DELETE /containers/{id}",
        sandbox: Some(CriMethod::RemovePodSandbox),
        container: Some(CriMethod::RemoveContainer),
    },
];

/// Handles one intercepted call (`upstream`: its connection to dockerd) to its answer; its post stage, if
/// any, is spawned to run after it, holding the pod's turn until it is done.
pub async fn handle(
    hooks: &Arc<Hooks>,
    route: Route,
    upstream: &mut Upstream,
    req: Request<Incoming>,
) -> Response<Body> {
    let spec = route.spec();
    match route {
        Route::Create => create(hooks, spec, upstream, req).await,
        Route::Update(id) => update(hooks, spec, upstream, req, &id).await,
        Route::Start(id) | Route::Stop(id) | Route::Delete(id) => {
            let Some(object) = resolve(hooks, upstream.path(), &id).await else {
                return relay::forward(upstream, req).await;
            };
            let method = match &object {
                DockerObject::Sandbox(..) => spec.sandbox,
                DockerObject::Container(..) => spec.container,
            };
            let Some(method) = method else { return relay::forward(upstream, req).await };
            let key = object.sandbox_id().to_owned();
            let call = DockerCall {
                method,
                backend: upstream.path().to_owned(),
                object: Some(object),
                create: None,
                update: None,
                _out: PhantomData,
            };
            drive(hooks, &call, Some(&key), Outgoing { upstream, body: OutBody::Streamed(req) }).await
        }
    }
}

/// `POST /containers/create`: PreRunPodSandbox or PreCreateContainer, answers into the body.
async fn create(
    hooks: &Arc<Hooks>,
    spec: &RouteSpec,
    upstream: &mut Upstream,
    req: Request<Incoming>,
) -> Response<Body> {
    let name = req.uri().query().and_then(|q| query_param(q, "name"));
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, &hooks.limits).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let kube = name.as_deref().and_then(KubeName::parse);
    let json = serde_json::from_slice::<Value>(&bytes).ok().filter(Value::is_object);
    let (Some(kube), Some(json)) = (kube, json) else {
        if name.as_deref().is_some_and(|n| n.starts_with("k8s_")) {
            tracing::warn!(
                name = name.as_deref().unwrap_or(""),
                "Docker create: not a dockershim name or not a JSON object; forwarding without hooks"
            );
        }
        return forward_bytes(upstream, parts, bytes).await;
    };
    // The create body holds the container config's fields (Env, Labels, …) at the top.
    let labels = model::labels_of(Some(&json));
    let (method, key) = if model::is_sandbox(&labels, &kube) {
        (spec.sandbox, None)
    } else {
        (spec.container, Some(labels.get(model::SANDBOX_ID_LABEL).cloned().unwrap_or_default()))
    };
    let Some(method) = method else { return forward_bytes(upstream, parts, bytes).await };
    let call = DockerCall {
        method,
        backend: upstream.path().to_owned(),
        object: None,
        create: Some((kube, json.clone())),
        update: None,
        _out: PhantomData,
    };
    let body = OutBody::Read { parts, bytes, json };
    drive(hooks, &call, key.as_deref(), Outgoing { upstream, body }).await
}

/// `POST /containers/{id}/update`: the update merged into the stored resources,
/// PreUpdateContainerResources, changes into the update body.
async fn update(
    hooks: &Arc<Hooks>,
    spec: &RouteSpec,
    upstream: &mut Upstream,
    req: Request<Incoming>,
    id: &str,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, &hooks.limits).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let (Some(object @ DockerObject::Container(..)), Some(method)) =
        (resolve(hooks, upstream.path(), id).await, spec.container)
    else {
        return forward_bytes(upstream, parts, bytes).await;
    };
    let Some(json) = serde_json::from_slice::<Value>(&bytes).ok().filter(Value::is_object) else {
        return forward_bytes(upstream, parts, bytes).await;
    };
    let key = object.sandbox_id().to_owned();
    let update = Some(model::resources_of(Some(&json)));
    let call = DockerCall {
        method,
        backend: upstream.path().to_owned(),
        object: Some(object),
        create: None,
        update,
        _out: PhantomData,
    };
    drive(hooks, &call, Some(&key), Outgoing { upstream, body: OutBody::Read { parts, bytes, json } }).await
}

/// Drives `call` through the hook flow; spawns its post stage.
async fn drive<'u>(hooks: &Arc<Hooks>, call: &DockerCall<'u>, key: Option<&str>, out: Outgoing<'u>) -> Response<Body> {
    match flow::drive(hooks, stages::row(call.method), call, key, out, None).await {
        Ok((answer, post)) => {
            if let Some(post) = post {
                tokio::spawn(post.run());
            }
            answer.response
        }
        Err(answer) => answer,
    }
}

/// The store's entry for `id` (full ID); else dockerd is asked (short IDs, names, objects
/// created before the proxy started) and the answer recorded. `None`: not a pod's container,
/// or dockerd does not know it (then the call passes through and dockerd answers it).
async fn resolve(hooks: &Hooks, backend: &Path, id: &str) -> Option<DockerObject> {
    if let Some(e) = hooks.store.container(id) {
        return Some(DockerObject::Container(id.to_owned(), e));
    }
    if let Some(p) = hooks.store.pod(id) {
        return Some(DockerObject::Sandbox(id.to_owned(), p));
    }
    recover::fetch(backend, &hooks.store, id).await
}

/// One intercepted Docker call, as the hook flow sees it ([`flow::Front`]).
struct DockerCall<'u> {
    /// The stage table's row the call maps onto.
    method: CriMethod,
    /// dockerd's socket (to inspect what the store does not know).
    backend: PathBuf,
    /// The container the call is about, resolved before its pod's turn (calls on an `{id}`).
    object: Option<DockerObject>,
    /// A create's dockershim name and body (the container config's fields at the top).
    create: Option<(KubeName, Value)>,
    /// An update's resources, as its body asks.
    update: Option<hook::LinuxContainerResources>,
    _out: PhantomData<&'u ()>,
}

/// A Docker call after loading: the object and what the stages see.
pub struct Loaded {
    object: DockerObject,
    /// An update's resources once the update is merged into the stored ones (before the hooks).
    merged: Option<hook::LinuxContainerResources>,
}

/// What goes on to dockerd: the client's request (streamed) or its body, read and parsed.
struct Outgoing<'u> {
    upstream: &'u mut Upstream,
    body: OutBody,
}

enum OutBody {
    Streamed(Request<Incoming>),
    Read { parts: http::request::Parts, bytes: Bytes, json: Value },
}

/// dockerd's answer, with the new container's ID for a create.
struct DockerAnswer {
    response: Response<Body>,
    id: Option<String>,
}

impl DockerCall<'_> {
    fn log_name(&self) -> &'static str {
        match self.method {
            CriMethod::RunPodSandbox => "create (pod sandbox)",
            CriMethod::CreateContainer => "create (container)",
            CriMethod::StartContainer => "start",
            CriMethod::StopContainer | CriMethod::StopPodSandbox => "stop",
            CriMethod::UpdateContainerResources => "update",
            _ => "delete",
        }
    }
}

impl<'u> flow::Front for DockerCall<'u> {
    type Call = Loaded;
    type Request = Outgoing<'u>;
    type Answer = DockerAnswer;
    type Error = Response<Body>;

    fn name(&self) -> &str {
        self.log_name()
    }

    async fn load(&self, hooks: &Hooks, _snapshot: &Snapshot) -> Result<Option<Box<Loaded>>, Response<Body>> {
        let mut object = match (&self.object, &self.create) {
            (Some(object), _) => {
                // The store again, now that it is the pod's turn: a call before may have changed it.
                let id = object.id();
                match object {
                    DockerObject::Container(..) => {
                        hooks.store.container(id).map(|e| DockerObject::Container(id.to_owned(), e))
                    }
                    DockerObject::Sandbox(..) => hooks.store.pod(id).map(|p| DockerObject::Sandbox(id.to_owned(), p)),
                }
                .unwrap_or_else(|| object.clone())
            }
            (None, Some((kube, config))) => {
                let host_config = config.get("HostConfig");
                if self.method == CriMethod::RunPodSandbox {
                    DockerObject::Sandbox(String::new(), model::pod_request(kube, Some(config), host_config))
                } else {
                    let sandbox_id =
                        model::labels_of(Some(config)).get(model::SANDBOX_ID_LABEL).cloned().unwrap_or_default();
                    let mut pod = hooks.store.pod(&sandbox_id);
                    if pod.is_none() && !sandbox_id.is_empty() {
                        pod = match recover::fetch(&self.backend, &hooks.store, &sandbox_id).await {
                            Some(DockerObject::Sandbox(_, p)) => Some(p),
                            _ => None,
                        };
                    }
                    let hook = model::container_request(kube, pod.as_ref(), Some(config), host_config);
                    DockerObject::Container(String::new(), ContainerEntry { sandbox_id, hook })
                }
            }
            (None, None) => return Ok(None),
        };
        let mut merged = None;
        if let (Some(update), DockerObject::Container(_, entry)) = (&self.update, &mut object) {
            let resources = entry.hook.container_resources.get_or_insert_with(Default::default);
            hook_api::merge::merge_update(resources, update);
            merged = Some(resources.clone());
        }
        Ok(Some(Box::new(Loaded { object, merged })))
    }

    fn apply(
        &self,
        call: &Loaded,
        before: &BeforeHooks,
        mut out: Outgoing<'u>,
    ) -> Result<Outgoing<'u>, Response<Body>> {
        let OutBody::Read { bytes, json, .. } = &mut out.body else { return Ok(out) };
        let Some(obj) = json.as_object_mut() else { return Ok(out) };
        let changed = match (&call.object, before) {
            (DockerObject::Sandbox(_, pod), BeforeHooks::Pod(before)) => model::write_pod_changes(obj, before, pod),
            (DockerObject::Container(_, entry), BeforeHooks::Container(before))
                if self.method == CriMethod::CreateContainer =>
            {
                model::write_container_changes(obj, before, &entry.hook)
            }
            (DockerObject::Container(_, entry), BeforeHooks::Container(_))
                if self.method == CriMethod::UpdateContainerResources =>
            {
                let merged = call.merged.clone().unwrap_or_default();
                let after = swap_followed(&merged, &entry.hook);
                model::write_resources(obj, &merged, &after, false)
            }
            _ => false,
        };
        if changed {
            *bytes = Bytes::from(json.to_string());
        }
        Ok(out)
    }

    fn send(&self, out: Outgoing<'u>) -> impl Future<Output = Result<DockerAnswer, Response<Body>>> + Send {
        let create = self.create.is_some();
        async move {
            let Outgoing { upstream, body } = out;
            match body {
                OutBody::Streamed(req) => Ok(DockerAnswer { response: relay::forward(upstream, req).await, id: None }),
                OutBody::Read { parts, bytes, .. } if create => {
                    let (response, id) = create_and_read_id(upstream, parts, bytes).await?;
                    Ok(DockerAnswer { response, id })
                }
                OutBody::Read { parts, bytes, .. } => {
                    Ok(DockerAnswer { response: forward_bytes(upstream, parts, bytes).await, id: None })
                }
            }
        }
    }

    fn succeeded(&self, answer: &DockerAnswer) -> bool {
        let status = answer.response.status();
        // Stop: 204 stopped, 304 already stopped; either way the post stage is due.
        status.is_success()
            || (matches!(self.method, CriMethod::StopContainer | CriMethod::StopPodSandbox)
                && status == StatusCode::NOT_MODIFIED)
    }

    fn commit(&self, call: &mut Loaded, answer: &DockerAnswer, store: &Store, post: bool) {
        match (self.method, &mut call.object) {
            (CriMethod::RunPodSandbox, DockerObject::Sandbox(_, pod)) => {
                if let Some(id) = &answer.id {
                    store.put_pod(id, pod.clone());
                }
            }
            (CriMethod::CreateContainer, DockerObject::Container(_, entry)) => {
                if let Some(id) = &answer.id {
                    entry.hook.container_meta.get_or_insert_with(Default::default).id = id.clone();
                    store.put_container(id, if post { entry.clone() } else { std::mem::take(entry) });
                }
            }
            (CriMethod::StartContainer, DockerObject::Container(id, entry)) => store.put_container(id, entry.clone()),
            (CriMethod::UpdateContainerResources, DockerObject::Container(id, entry)) => {
                if let Some(merged) = &call.merged {
                    entry.hook.container_resources = Some(swap_followed(merged, &entry.hook));
                }
                store.put_container(id, entry.clone());
            }
            (CriMethod::RemovePodSandbox, DockerObject::Sandbox(id, _)) => store.remove_pod(id),
            (CriMethod::RemoveContainer, DockerObject::Container(id, _)) => store.remove_container(id),
            _ => {}
        }
    }

    fn refuse(&self, status: Status) -> Response<Body> {
        relay::error(http_status(status.code), &status.message)
    }
}

impl flow::HookedCall for Loaded {
    fn hook_request(&mut self) -> Option<HookRequest<'_>> {
        Some(match &mut self.object {
            DockerObject::Sandbox(_, pod) => HookRequest::Pod(pod),
            DockerObject::Container(_, entry) => HookRequest::Container(&mut entry.hook),
        })
    }

    fn pod(&self) -> Option<(&BTreeMap<String, String>, Option<&hook::PodSandboxMetadata>)> {
        Some(match &self.object {
            DockerObject::Sandbox(_, p) => (&p.labels, p.pod_meta.as_ref()),
            DockerObject::Container(_, e) => (&e.hook.pod_labels, e.hook.pod_meta.as_ref()),
        })
    }
}

/// The hooks' resources for an update, with the swap limit kept in step with the memory limit
/// they set ([`model::follow_swap`]; `merged`: the resources before the hooks).
fn swap_followed(
    merged: &hook::LinuxContainerResources,
    hooked: &hook::ContainerResourceHookRequest,
) -> hook::LinuxContainerResources {
    let mut after = hooked.container_resources.clone().unwrap_or_default();
    model::follow_swap(merged, &mut after, true);
    after
}

impl Chunks for Incoming {
    type Error = hyper::Error;
    async fn next_chunk(&mut self) -> Option<Result<Bytes, hyper::Error>> {
        match self.frame().await? {
            Ok(frame) => Some(Ok(frame.into_data().unwrap_or_default())),
            Err(e) => Some(Err(e)),
        }
    }
}

/// Reads a request body whole: at most `limits.max_request_bytes`, with no gap longer than
/// `limits.request_idle_timeout` ([`body::read_whole`]).
///
/// Errors: `413` for a larger body, `408` for a stalled one, `400` when the client's stream
/// breaks; Docker's error shape, naming the flag.
async fn read_body(mut body: Incoming, limits: &crate::hooks::limits::Limits) -> Result<Bytes, Response<Body>> {
    body::read_whole(&mut body, limits.max_request_bytes, limits.request_idle_timeout).await.map_err(|e| match e {
        BodyError::Stalled(idle) => relay::error(
            StatusCode::REQUEST_TIMEOUT,
            &format!("runtime-proxy: request body stalled for {idle:?} (--request-idle-timeout)"),
        ),
        BodyError::TooLarge { max } => relay::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("runtime-proxy: request body larger than {max} bytes (--max-request-bytes)"),
        ),
        BodyError::Broken(e) => {
            relay::error(StatusCode::BAD_REQUEST, &format!("runtime-proxy: reading the request body: {e}"))
        }
    })
}
/// The value of `key` in a query string (percent-decoded), if present.
pub fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').filter_map(|kv| kv.split_once('=')).find(|(k, _)| *k == key).map(|(_, v)| percent_decode(v))
}

/// `+` is a space, `%XX` a byte (invalid `%` sequences kept); not UTF-8 → U+FFFD.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).and_then(|c| hex(*c)), b.get(i + 2).and_then(|c| hex(*c))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Forwards a request whose body was read (and maybe rewritten), with `Content-Length` fixed.
async fn forward_bytes(upstream: &mut Upstream, mut parts: http::request::Parts, body: Bytes) -> Response<Body> {
    parts.headers.remove(http::header::TRANSFER_ENCODING);
    parts.headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
    match upstream.send(Request::from_parts(parts, relay::full(body))).await {
        Ok(resp) => resp.map(|b| b.boxed()),
        Err(answer) => answer,
    }
}

/// Forwards a create and reads its (small) answer to learn the new container's ID.
async fn create_and_read_id(
    upstream: &mut Upstream,
    parts: http::request::Parts,
    body: Bytes,
) -> Result<(Response<Body>, Option<String>), Response<Body>> {
    let resp = forward_bytes(upstream, parts, body).await;
    if !resp.status().is_success() {
        return Ok((resp, None));
    }
    let (head, body) = resp.into_parts();
    let bytes = body
        .collect()
        .await
        .map_err(|e| {
            relay::error(StatusCode::BAD_GATEWAY, &format!("runtime-proxy: reading dockerd's create answer: {e}"))
        })?
        .to_bytes();
    let id = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v.get("Id")?.as_str().map(str::to_owned));
    if id.is_none() {
        tracing::warn!("Docker create answer without an Id; not recorded");
    }
    Ok((Response::from_parts(head, relay::full(bytes)), id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(&Method::POST, "/v1.41/containers/create"), Some(Route::Create));
        assert_eq!(route(&Method::POST, "/containers/create"), Some(Route::Create));
        assert_eq!(route(&Method::POST, "/v1.24/containers/abc123/start"), Some(Route::Start("abc123".into())));
        assert_eq!(
            route(&Method::POST, "/containers/k8s_main_web_default_u_0/stop"),
            Some(Route::Stop("k8s_main_web_default_u_0".into()))
        );
        assert_eq!(route(&Method::POST, "/v1.41/containers/a-b.c/update"), Some(Route::Update("a-b.c".into())));
        assert_eq!(route(&Method::DELETE, "/v1.41/containers/abc"), Some(Route::Delete("abc".into())));
        assert_eq!(route(&Method::GET, "/v1.41/containers/abc/json"), None);
        assert_eq!(route(&Method::GET, "/containers/create"), None, "the method counts");
        assert_eq!(route(&Method::POST, "/v1.41/containers/abc/attach"), None);
        assert_eq!(route(&Method::POST, "/vx/containers/create"), None);
        assert_eq!(route(&Method::POST, "/v1.41/containers//start"), None);
    }

    #[test]
    fn query_and_statuses() {
        assert_eq!(query_param("name=k8s_POD_a_b_c_0&platform=", "name").as_deref(), Some("k8s_POD_a_b_c_0"));
        assert_eq!(query_param("x=1&name=a%2Fb", "name").as_deref(), Some("a/b"));
        assert_eq!(query_param("x=1", "name"), None);
        assert_eq!(http_status(Code(7)), StatusCode::FORBIDDEN);
        assert_eq!(http_status(Code::UNAVAILABLE), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(http_status(Code::FAILED_PRECONDITION), StatusCode::CONFLICT);
        assert_eq!(http_status(Code::UNKNOWN), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
