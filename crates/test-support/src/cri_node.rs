//! A CRI runtime stand-in for a node of pods (what runtime-hooks' standalone reconciler asks a
//! runtime), for scale tests and benchmarks without containerd: the pods and containers of
//! [`crate::scale::nri_node`] served on a unix socket as containerd's CRI plugin describes them.
//!
//! | call (CRI v1 `RuntimeService`) | answer |
//! |---|---|
//! | `ListPodSandbox` | every pod, READY (the request's filter is not read) |
//! | `ListContainers` | every container, RUNNING (same) |
//! | `PodSandboxStatus` | the pod, with containerd's verbose `info` JSON: `config.linux.cgroup_parent` (kubelet's parent) and `runtimeSpec.linux.cgroupsPath` (the sandbox container's cgroup, `<parent>/<sandbox id>`); `NOT_FOUND` for other IDs |
//! | `ContainerStatus` | the container, with `info`: `runtimeSpec.linux.cgroupsPath` and `runtimeSpec.linux.resources.cpu.shares`; `NOT_FOUND` for other IDs |
//! | anything else | `UNIMPLEMENTED` |
//!
//! Every answer is encoded once, at start, so that serving costs the caller's measurements
//! little. The `info` JSON holds only the fields named above (containerd's holds the whole
//! runtime spec too), which the reconciler reads once per ID and caches.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_cri::v1 as cri;
use nri_plugin::proto::api as nri;
use prost::Message;
use tokio::net::UnixListener;

use crate::fake_backend::grpc_frame;

const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
const LIST_CONTAINERS: &str = "/runtime.v1.RuntimeService/ListContainers";
const POD_SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
const CONTAINER_STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";

/// The answers, encoded.
struct Answers {
    pods: Bytes,
    containers: Bytes,
    pod_status: HashMap<String, Bytes>,
    container_status: HashMap<String, Bytes>,
    /// Calls answered, per path.
    calls: std::sync::Mutex<BTreeMap<String, usize>>,
    connections: AtomicUsize,
}

/// The stand-in runtime on a unix socket; stopped (and its socket removed) when dropped.
pub struct CriNode {
    socket: PathBuf,
    answers: Arc<Answers>,
    task: tokio::task::JoinHandle<()>,
}

fn string_map(entries: &[nri::BytesEntry]) -> HashMap<String, String> {
    entries
        .iter()
        .map(|e| (String::from_utf8_lossy(&e.key).into_owned(), String::from_utf8_lossy(&e.value).into_owned()))
        .collect()
}

/// `pod` as a CRI runtime lists it (READY).
pub fn cri_pod(pod: &nri::PodSandbox) -> cri::PodSandbox {
    cri::PodSandbox {
        id: pod.id.clone(),
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
        }),
        state: cri::PodSandboxState::SandboxReady as i32,
        created_at: 1_765_000_000_000_000_000,
        labels: string_map(&pod.labels),
        annotations: string_map(&pod.annotations),
        runtime_handler: "runc".into(),
    }
}

/// `container` as a CRI runtime lists it (RUNNING).
pub fn cri_container(container: &nri::Container) -> cri::Container {
    let image = cri::ImageSpec { image: "registry.k8s.io/pause:3.10".into(), ..Default::default() };
    cri::Container {
        id: container.id.clone(),
        pod_sandbox_id: container.pod_sandbox_id.clone(),
        metadata: Some(cri::ContainerMetadata { name: container.name.clone(), attempt: 0 }),
        image: Some(image),
        image_ref: "sha256:873ed75102791e5b0b8a7fcd41606c92fcec98d56d05ead4ac5131650004c136".into(),
        state: cri::ContainerState::ContainerRunning as i32,
        created_at: 1_765_000_000_000_000_000,
        labels: string_map(&container.labels),
        annotations: string_map(&container.annotations),
        ..Default::default()
    }
}

/// The sandbox container's cgroup of `pod` as containerd reports it (cgroupfs driver):
/// `<cgroup parent>/<sandbox id>`.
pub fn sandbox_cgroup(pod: &nri::PodSandbox) -> String {
    let parent = pod.linux.as_ref().map(|l| l.cgroup_parent.as_str()).unwrap_or_default();
    format!("{parent}/{}", pod.id)
}

/// containerd's verbose `info` of `pod` (the fields the reconciler reads).
pub fn sandbox_info(pod: &nri::PodSandbox) -> String {
    let parent = pod.linux.as_ref().map(|l| l.cgroup_parent.as_str()).unwrap_or_default();
    serde_json::json!({
        "pid": 4242,
        "config": {"metadata": {"name": pod.name, "uid": pod.uid, "namespace": pod.namespace},
                   "linux": {"cgroup_parent": parent}},
        "runtimeSpec": {"linux": {"cgroupsPath": sandbox_cgroup(pod), "resources": {"cpu": {"shares": 2}}}},
    })
    .to_string()
}

/// containerd's verbose `info` of `container` (the fields the reconciler reads).
pub fn container_info(container: &nri::Container) -> String {
    let linux = container.linux.as_ref();
    let shares = linux.and_then(|l| l.resources.as_ref()?.cpu.as_ref()?.shares.as_ref().map(|s| s.value)).unwrap_or(2);
    serde_json::json!({
        "sandboxID": container.pod_sandbox_id,
        "pid": 4243,
        "runtimeSpec": {"linux": {
            "cgroupsPath": linux.map(|l| l.cgroups_path.as_str()).unwrap_or_default(),
            "resources": {"cpu": {"shares": shares}},
        }},
    })
    .to_string()
}

impl CriNode {
    /// Serves `pods` and `containers` on `socket` (which must not exist) from the current tokio
    /// runtime. Panics when the socket cannot be bound (a test set-up error).
    pub fn start(socket: &Path, pods: &[nri::PodSandbox], containers: &[nri::Container]) -> CriNode {
        let encode = |m: &dyn Fn() -> Vec<u8>| grpc_frame(&m());
        let answers = Arc::new(Answers {
            pods: encode(&|| cri::ListPodSandboxResponse { items: pods.iter().map(cri_pod).collect() }.encode_to_vec()),
            containers: encode(&|| {
                cri::ListContainersResponse { containers: containers.iter().map(cri_container).collect() }
                    .encode_to_vec()
            }),
            pod_status: pods
                .iter()
                .map(|p| {
                    let c = cri_pod(p);
                    let status = cri::PodSandboxStatus {
                        id: c.id.clone(),
                        metadata: c.metadata,
                        state: c.state,
                        created_at: c.created_at,
                        labels: c.labels,
                        annotations: c.annotations,
                        runtime_handler: c.runtime_handler,
                        ..Default::default()
                    };
                    let answer = cri::PodSandboxStatusResponse {
                        status: Some(status),
                        info: [("info".to_owned(), sandbox_info(p))].into(),
                        ..Default::default()
                    };
                    (c.id, grpc_frame(&answer.encode_to_vec()))
                })
                .collect(),
            container_status: containers
                .iter()
                .map(|ct| {
                    let c = cri_container(ct);
                    let status = cri::ContainerStatus {
                        id: c.id.clone(),
                        metadata: c.metadata,
                        state: c.state,
                        created_at: c.created_at,
                        image: c.image,
                        image_ref: c.image_ref,
                        labels: c.labels,
                        annotations: c.annotations,
                        ..Default::default()
                    };
                    let answer = cri::ContainerStatusResponse {
                        status: Some(status),
                        info: [("info".to_owned(), container_info(ct))].into(),
                    };
                    (c.id, grpc_frame(&answer.encode_to_vec()))
                })
                .collect(),
            calls: Default::default(),
            connections: AtomicUsize::new(0),
        });
        let listener = UnixListener::bind(socket).unwrap_or_else(|e| panic!("binding {}: {e}", socket.display()));
        let served = answers.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: aborts every connection's task.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                served.connections.fetch_add(1, Ordering::Relaxed);
                let answers = served.clone();
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let answers = answers.clone();
                        async move { Ok::<_, Infallible>(answer(&answers, req).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CriNode { socket: socket.to_owned(), answers, task }
    }

    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Calls answered so far on `path` (e.g. `/runtime.v1.RuntimeService/ContainerStatus`).
    pub fn calls(&self, path: &str) -> usize {
        self.answers.calls.lock().unwrap_or_else(|e| e.into_inner()).get(path).copied().unwrap_or(0)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.answers.connections.load(Ordering::Relaxed)
    }
}

/// The ID in a status request: field 1 (`pod_sandbox_id`, `container_id`), read from the gRPC
/// frame of `body`; empty when absent or not a frame.
fn requested_id(mut body: Bytes) -> String {
    if body.len() < 5 {
        return String::new();
    }
    body.advance(5);
    // Both requests carry the ID in field 1, the verbose flag in field 2.
    cri::ContainerStatusRequest::decode(body).map(|r| r.container_id).unwrap_or_default()
}

type Frames = futures_lite::stream::Iter<std::array::IntoIter<Result<Frame<Bytes>, Infallible>, 2>>;

async fn answer(answers: &Answers, req: Request<Incoming>) -> Response<StreamBody<Frames>> {
    let path = req.uri().path().to_owned();
    *answers.calls.lock().unwrap_or_else(|e| e.into_inner()).entry(path.clone()).or_default() += 1;
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let found = match path.as_str() {
        LIST_POD_SANDBOX => Ok(answers.pods.clone()),
        LIST_CONTAINERS => Ok(answers.containers.clone()),
        POD_SANDBOX_STATUS => answers.pod_status.get(&requested_id(body)).cloned().ok_or(5),
        CONTAINER_STATUS => answers.container_status.get(&requested_id(body)).cloned().ok_or(5),
        _ => Err(12),
    };
    let status = |code: u16| {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from(code));
        Ok(Frame::trailers(trailers))
    };
    // The message, then the status in the trailers; a failure: an empty body and its trailers.
    let frames = match found {
        Ok(message) => [Ok(Frame::data(message)), status(0)],
        Err(code) => [Ok(Frame::data(Bytes::new())), status(code)],
    };
    let body = StreamBody::new(futures_lite::stream::iter(frames));
    let mut resp = Response::new(body);
    resp.headers_mut().insert("content-type", HeaderValue::from_static("application/grpc"));
    resp
}

impl Drop for CriNode {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}
