//! The hooked Docker Engine API calls: the container calls dockershim / cri-dockerd make for
//! pods, mapped onto the CRI mode's stages and served by the same registry, dispatcher, store,
//! per-pod locks and skip label (the shared [`Interceptor`] state; nothing is copied).
//!
//! | Docker call | sandbox (`k8s_POD_…`) | container (`k8s_<name>_…`) |
//! |---|---|---|
//! | `POST /containers/create?name=…` | PreRunPodSandbox | PreCreateContainer |
//! | `POST /containers/{id}/start` | – | PreStartContainer, PostStartContainer |
//! | `POST /containers/{id}/update` | – | PreUpdateContainerResources |
//! | `POST /containers/{id}/stop` | PostStopPodSandbox | PostStopContainer |
//! | `DELETE /containers/{id}` | store clean-up | store clean-up |
//!
//! Answers are written into the JSON body field by field ([`model`]); a body no hook changed
//! goes on byte for byte. Containers not named the Kubernetes way pass through untouched.
//! `{id}` may be a full ID, a short ID or a name: what the store does not know is looked up in
//! dockerd (inspect) and recorded. A hook failure under `Fail` is answered in Docker's error
//! shape (`{"message": …}`) with an HTTP status mapped from the gRPC code; an unknown container
//! gets dockerd's own answer. Post stages run after the answer is sent, under the pod's lock.

use std::sync::Arc;

use bytes::Bytes;
use hook_api::v1alpha1 as hook;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use super::model::{self, KubeName};
use super::recover;
use super::relay::{self, Body, Upstream};
use crate::grpc::{Code, Status};
use crate::intercept::Interceptor;
use crate::registry::Stage;
use crate::store::ContainerEntry;

/// An intercepted Docker call (the `{id}` as the client wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Create,
    Start(String),
    Stop(String),
    Update(String),
    Delete(String),
}

impl Route {
    /// The metrics label of the route (a fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            Route::Create => "docker POST /containers/create",
            Route::Start(_) => "docker POST /containers/{id}/start",
            Route::Stop(_) => "docker POST /containers/{id}/stop",
            Route::Update(_) => "docker POST /containers/{id}/update",
            Route::Delete(_) => "docker DELETE /containers/{id}",
        }
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
    if !version.is_empty() && version.bytes().all(|b| b.is_ascii_digit() || b == b'.') && version.as_bytes()[0].is_ascii_digit() {
        &rest[end..]
    } else {
        path
    }
}

/// The HTTP status a Docker client gets for a hook failure of gRPC code `code`.
pub fn http_status(code: Code) -> StatusCode {
    match code.0 {
        3 | 11 => StatusCode::BAD_REQUEST,
        5 => StatusCode::NOT_FOUND,
        6 | 10 => StatusCode::CONFLICT,
        7 | 16 => StatusCode::FORBIDDEN,
        8 => StatusCode::TOO_MANY_REQUESTS,
        14 => StatusCode::SERVICE_UNAVAILABLE,
        4 => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A container the store knows (or dockerd told us about), by its full Docker ID: a pod
/// sandbox or a pod's container.
pub enum Known {
    Pod(String, hook::PodSandboxHookRequest),
    Container(String, ContainerEntry),
}

impl Known {
    /// The pod sandbox's Docker ID (the key of the pod's lock).
    pub fn sandbox_id(&self) -> &str {
        match self {
            Known::Pod(id, _) => id,
            Known::Container(_, e) => &e.sandbox_id,
        }
    }
    fn labels(&self) -> &std::collections::HashMap<String, String> {
        match self {
            Known::Pod(_, p) => &p.labels,
            Known::Container(_, e) => &e.hook.pod_labels,
        }
    }
    fn meta(&self) -> Option<&hook_api::v1alpha1::PodSandboxMetadata> {
        match self {
            Known::Pod(_, p) => p.pod_meta.as_ref(),
            Known::Container(_, e) => e.hook.pod_meta.as_ref(),
        }
    }
}

/// The Docker front end's interceptor over the shared hook state.
pub struct DockerInterceptor {
    /// Registry, dispatcher, store, pod locks and skip label, shared with CRI mode's code.
    pub hooks: Arc<Interceptor>,
}

impl DockerInterceptor {
    /// Handles one intercepted call to its answer (post stages are spawned to run after it).
    pub async fn handle(self: &Arc<Self>, route: Route, upstream: &mut Upstream, req: Request<Incoming>) -> Response<Body> {
        match route {
            Route::Create => self.create(upstream, req).await,
            Route::Start(id) => self.start(upstream, req, &id).await,
            Route::Stop(id) => self.stop(upstream, req, &id).await,
            Route::Update(id) => self.update(upstream, req, &id).await,
            Route::Delete(id) => self.delete(upstream, req, &id).await,
        }
    }

    /// Whether the pod (`labels`, `meta`) skips every hook: the skip label, honoured in the
    /// allowed namespaces only ([`crate::skip_label`]); `route` names the call in the log.
    fn skips(
        &self,
        labels: &std::collections::HashMap<String, String>,
        meta: Option<&hook_api::v1alpha1::PodSandboxMetadata>,
        route: &str,
    ) -> bool {
        self.hooks.skip_label.skips(labels, meta, route, &self.hooks.metrics)
    }

    async fn run<R: crate::dispatch::HookMessage>(&self, stage: Stage, req: &mut R) -> Result<(), Status> {
        // Docker mode applies the hooks' result from the request as it stands, not by edits.
        self.hooks.dispatcher.run(&self.hooks.registry.snapshot(), stage, req, None).await.map(drop)
    }

    /// `POST /containers/create`: PreRunPodSandbox or PreCreateContainer, answers into the body.
    async fn create(&self, upstream: &mut Upstream, req: Request<Incoming>) -> Response<Body> {
        let name = req.uri().query().and_then(|q| query_param(q, "name"));
        let (parts, body) = req.into_parts();
        let bytes = match read_body(body, &self.hooks.limits).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let kube = name.as_deref().and_then(KubeName::parse);
        let json = serde_json::from_slice::<Value>(&bytes).ok().filter(Value::is_object);
        let (Some(kube), Some(mut json)) = (kube, json) else {
            if name.as_deref().is_some_and(|n| n.starts_with("k8s_")) {
                tracing::warn!(
                    name = name.as_deref().unwrap_or(""),
                    "Docker create: not a dockershim name or not a JSON object; forwarding without hooks"
                );
            }
            return forward_bytes(upstream, parts, bytes).await;
        };
        // The create body holds the container config's fields (Env, Labels, …) at the top.
        let config = Some(json.clone());
        let labels = model::labels_of(config.as_ref());
        if model::is_sandbox(&labels, &kube) {
            let mut pod = model::pod_request(&kube, config.as_ref(), json.get("HostConfig"));
            let before = pod.clone();
            if !self.skips(&pod.labels, pod.pod_meta.as_ref(), "create (pod sandbox)") {
                if let Err(status) = self.run(Stage::PreRunPodSandbox, &mut pod).await {
                    return refuse(&status);
                }
            }
            let obj = json.as_object_mut().expect("checked: an object");
            let bytes = if model::write_pod_changes(obj, &before, &pod) { Bytes::from(json.to_string()) } else { bytes };
            let (resp, id) = match create_and_read_id(upstream, parts, bytes).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
            if let Some(id) = id {
                self.hooks.store.put_pod(&id, pod);
            }
            resp
        } else {
            let sandbox_id = labels.get(model::SANDBOX_ID_LABEL).cloned().unwrap_or_default();
            let _turn = self.hooks.pod_locks.lock(&sandbox_id).await;
            let mut pod = self.hooks.store.pod(&sandbox_id);
            if pod.is_none() && !sandbox_id.is_empty() {
                pod = match recover::fetch(upstream.path(), &self.hooks.store, &sandbox_id).await {
                    Some(Known::Pod(_, p)) => Some(p),
                    _ => None,
                };
            }
            let mut container = model::container_request(&kube, pod.as_ref(), config.as_ref(), json.get("HostConfig"));
            let before = container.clone();
            if !self.skips(&container.pod_labels, container.pod_meta.as_ref(), "create (container)") {
                if let Err(status) = self.run(Stage::PreCreateContainer, &mut container).await {
                    return refuse(&status);
                }
            }
            let obj = json.as_object_mut().expect("checked: an object");
            let bytes = if model::write_container_changes(obj, &before, &container) { Bytes::from(json.to_string()) } else { bytes };
            let (resp, id) = match create_and_read_id(upstream, parts, bytes).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
            if let Some(id) = id {
                container.container_meta.get_or_insert_with(Default::default).id = id.clone();
                self.hooks.store.put_container(&id, ContainerEntry { sandbox_id, hook: container });
            }
            resp
        }
    }

    /// `POST /containers/{id}/start`: PreStartContainer, forward, PostStartContainer.
    async fn start(self: &Arc<Self>, upstream: &mut Upstream, req: Request<Incoming>, id: &str) -> Response<Body> {
        let Some(known) = self.resolve(upstream, id).await else { return relay::forward(upstream, req).await };
        let Known::Container(full_id, mut entry) = known else { return relay::forward(upstream, req).await };
        let turn = self.hooks.pod_locks.lock(&entry.sandbox_id).await;
        let hooked = !self.skips(&entry.hook.pod_labels, entry.hook.pod_meta.as_ref(), "start");
        if hooked {
            if let Err(status) = self.run(Stage::PreStartContainer, &mut entry.hook).await {
                return refuse(&status);
            }
        }
        let resp = relay::forward(upstream, req).await;
        if resp.status().is_success() {
            self.hooks.store.put_container(&full_id, entry.clone());
            drop(turn);
            if hooked {
                self.post(Stage::PostStartContainer, Known::Container(full_id, entry));
            }
        }
        resp
    }

    /// `POST /containers/{id}/stop`: forward, then PostStopContainer / PostStopPodSandbox.
    async fn stop(self: &Arc<Self>, upstream: &mut Upstream, req: Request<Incoming>, id: &str) -> Response<Body> {
        let Some(known) = self.resolve(upstream, id).await else { return relay::forward(upstream, req).await };
        let turn = self.hooks.pod_locks.lock(known.sandbox_id()).await;
        let resp = relay::forward(upstream, req).await;
        // 204 stopped, 304 already stopped: either way the post stage is due.
        if resp.status().is_success() || resp.status() == StatusCode::NOT_MODIFIED {
            drop(turn);
            if !self.skips(known.labels(), known.meta(), "stop") {
                let stage = if matches!(known, Known::Pod(..)) { Stage::PostStopPodSandbox } else { Stage::PostStopContainer };
                self.post(stage, known);
            }
        }
        resp
    }

    /// `POST /containers/{id}/update`: the update merged into the stored resources,
    /// PreUpdateContainerResources, changes into the update body.
    async fn update(&self, upstream: &mut Upstream, req: Request<Incoming>, id: &str) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = match read_body(body, &self.hooks.limits).await {
            Ok(b) => b,
            Err(resp) => return resp,
        };
        let Some(Known::Container(full_id, mut entry)) = self.resolve(upstream, id).await else {
            return forward_bytes(upstream, parts, bytes).await;
        };
        let Some(mut json) = serde_json::from_slice::<Value>(&bytes).ok().filter(Value::is_object) else {
            return forward_bytes(upstream, parts, bytes).await;
        };
        let _turn = self.hooks.pod_locks.lock(&entry.sandbox_id).await;
        let update = model::resources_of(Some(&json));
        let resources = entry.hook.container_resources.get_or_insert_with(Default::default);
        hook_api::merge::merge_update(resources, &update);
        let before = resources.clone();
        if !self.skips(&entry.hook.pod_labels, entry.hook.pod_meta.as_ref(), "update") {
            if let Err(status) = self.run(Stage::PreUpdateContainerResources, &mut entry.hook).await {
                return refuse(&status);
            }
        }
        let after = entry.hook.container_resources.get_or_insert_with(Default::default);
        model::follow_swap(&before, after, true);
        let after = after.clone();
        let obj = json.as_object_mut().expect("checked: an object");
        let bytes = if model::write_resources(obj, &before, &after, false) { Bytes::from(json.to_string()) } else { bytes };
        let resp = forward_bytes(upstream, parts, bytes).await;
        if resp.status().is_success() {
            self.hooks.store.put_container(&full_id, entry);
        }
        resp
    }

    /// `DELETE /containers/{id}`: forward; on success forget the container (or the sandbox and
    /// its containers).
    async fn delete(&self, upstream: &mut Upstream, req: Request<Incoming>, id: &str) -> Response<Body> {
        let known = self.resolve(upstream, id).await;
        let resp = relay::forward(upstream, req).await;
        if resp.status().is_success() {
            match known {
                Some(Known::Pod(id, _)) => self.hooks.store.remove_pod(&id),
                Some(Known::Container(id, _)) => self.hooks.store.remove_container(&id),
                None => {}
            }
        }
        resp
    }

    /// The store's entry for `id` (full ID); else dockerd is asked (short IDs, names, objects
    /// created before the proxy started) and the answer recorded. `None`: not a pod's container,
    /// or dockerd does not know it (then the call passes through and dockerd answers it).
    async fn resolve(&self, upstream: &Upstream, id: &str) -> Option<Known> {
        if let Some(e) = self.hooks.store.container(id) {
            return Some(Known::Container(id.to_owned(), e));
        }
        if let Some(p) = self.hooks.store.pod(id) {
            return Some(Known::Pod(id.to_owned(), p));
        }
        recover::fetch(upstream.path(), &self.hooks.store, id).await
    }

    /// Runs a post stage after the answer has gone out (its result is only logged).
    fn post(self: &Arc<Self>, stage: Stage, known: Known) {
        let this = self.clone();
        tokio::spawn(async move {
            let _turn = this.hooks.pod_locks.lock(known.sandbox_id()).await;
            let _ = match known {
                Known::Pod(_, mut p) => this.run(stage, &mut p).await,
                Known::Container(_, mut e) => this.run(stage, &mut e.hook).await,
            };
        });
    }
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

/// A hook failure as a Docker error answer.
fn refuse(status: &Status) -> Response<Body> {
    relay::error(http_status(status.code), &status.message)
}

/// Reads a request body whole: at most `limits.max_request_bytes`, with no gap longer than
/// `limits.request_idle_timeout`.
///
/// Errors: `413` for a larger body, `408` for a stalled one, `400` when the client's stream
/// breaks; Docker's error shape, naming the flag.
async fn read_body(mut body: Incoming, limits: &crate::limits::Limits) -> Result<Bytes, Response<Body>> {
    let mut buf = bytes::BytesMut::new();
    let max = limits.max_request_bytes;
    loop {
        let next = tokio::time::timeout(limits.request_idle_timeout, body.frame()).await.map_err(|_| {
            let idle = limits.request_idle_timeout;
            relay::error(StatusCode::REQUEST_TIMEOUT, &format!("runtime-proxy: request body stalled for {idle:?} (--request-idle-timeout)"))
        })?;
        let Some(frame) = next else { break };
        let frame = frame.map_err(|e| relay::error(StatusCode::BAD_REQUEST, &format!("runtime-proxy: reading the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > max {
                return Err(relay::error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &format!("runtime-proxy: request body larger than {max} bytes (--max-request-bytes)"),
                ));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
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
        .map_err(|e| relay::error(StatusCode::BAD_GATEWAY, &format!("runtime-proxy: reading dockerd's create answer: {e}")))?
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
        assert_eq!(route(&Method::POST, "/containers/k8s_main_web_default_u_0/stop"), Some(Route::Stop("k8s_main_web_default_u_0".into())));
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
        assert_eq!(http_status(Code::UNKNOWN), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
