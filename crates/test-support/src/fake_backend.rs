//! An in-process HTTP/2 server standing in for the runtime, for what real containerd cannot show:
//! which metadata arrived, an answer with custom trailers or a 20 MiB body, a backend that hangs,
//! a server stream written message by message as the test says ([`Behaviour::streams`]).
//! It speaks raw HTTP/2 (no gRPC decoding), so it answers any path.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;
use tokio::sync::mpsc;

use crate::fake_node::FakeNode;

/// How the fake answers every call.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// After `delay`, answer with these response headers, body bytes and trailers.
    Reply {
        /// Response headers besides `:status` 200 and `content-type: application/grpc`.
        headers: Vec<(String, String)>,
        /// The response body, sent as it is in one DATA frame (gRPC-framed by the test,
        /// [`grpc_frame`]).
        body: Bytes,
        /// The trailers that end the response (`grpc-status`, …).
        trailers: Vec<(String, String)>,
        /// How long to wait after the request before answering; zero answers at once.
        delay: std::time::Duration,
    },
    /// Never answer; the call stays open until the client gives up.
    Hang,
    /// A minimal CRI runtime for volume tests: RunPodSandbox and CreateContainer answer a fresh
    /// ID each (`fake-sandbox-N`, `fake-container-N`, unique in the process),
    /// PodSandboxStatus and ContainerStatus `NOT_FOUND` (it keeps no objects), every other call
    /// an empty OK message (empty lists for ListPodSandbox / ListContainers). Nothing is decoded.
    Cri,
    /// As [`Cri`](Behaviour::Cri), but calls on these paths are refused: `FAILED_PRECONDITION`,
    /// `fake backend: refused`.
    CriRefusing(Vec<String>),
    /// As [`Cri`](Behaviour::Cri), plus one pod restored from a checkpoint (CRI v1
    /// `RestorePod`, which no runtime implements yet; made by [`Behaviour::restoring`]):
    /// RestorePod answers its sandbox ID and its containers' names and IDs; from then on
    /// ListPodSandbox, PodSandboxStatus, ListContainers and ContainerStatus describe it as containerd does
    /// (verbose `info` JSON holding the `config`), for its IDs only (`NOT_FOUND`, an empty list,
    /// for others and before the restore).
    Restoring {
        /// The pod RestorePod creates.
        pod: RestoredPod,
        /// Whether RestorePod was called.
        restored: Arc<std::sync::atomic::AtomicBool>,
    },
    /// As [`Cri`](Behaviour::Cri), plus a node of pods that already run ([`FakeNode`]):
    /// ListPodSandbox, ListContainers, PodSandboxStatus and ContainerStatus describe them as
    /// containerd does (`NOT_FOUND` for other IDs), for store recovery at node scale.
    Node(Arc<FakeNode>),
    /// Answer the response head and `body`, then fail the body: hyper resets the stream
    /// (`RST_STREAM`) instead of sending trailers, as a backend that aborts a call does.
    ResetAfter {
        /// The body bytes sent before the reset, as they are.
        body: Bytes,
    },
    /// The first call on each path of `feeds` is answered with a server stream the test writes
    /// through that path's [`StreamFeed`] ([`Behaviour::streams`]): the response head (with
    /// `headers`) at once, each part when the test sends it, nothing before. A later call on
    /// such a path is answered `UNAVAILABLE` (one feed, one call); calls on other paths as
    /// [`Cri`] (the proxy's own store recovery at start-up).
    ///
    /// [`Cri`]: Behaviour::Cri
    Stream {
        /// Response headers besides `:status` 200 and `content-type: application/grpc`.
        headers: Vec<(String, String)>,
        /// The receiving end of each path's feed; taken (`None`) by the first call on the path.
        feeds: Arc<Mutex<HashMap<String, Option<mpsc::UnboundedReceiver<StreamPart>>>>>,
    },
}

/// The pod a [`Behaviour::Restoring`] fake restores.
#[derive(Clone, Debug)]
pub struct RestoredPod {
    /// The restored pod sandbox's ID.
    pub sandbox_id: String,
    /// Its metadata (name, uid, namespace, attempt).
    pub metadata: k8s_cri::v1::PodSandboxMetadata,
    /// Its labels, as its status reports them.
    pub labels: HashMap<String, String>,
    /// Its annotations, as its status reports them.
    pub annotations: HashMap<String, String>,
    /// Its cgroup parent (`info.config.linux.cgroup_parent`).
    pub cgroup_parent: String,
    /// Its containers: (metadata name, ID), each with 256 CPU shares and env `RESTORED=1`.
    pub containers: Vec<(String, String)>,
}

/// One part of a server stream the test feeds to [`Behaviour::Stream`].
#[derive(Debug)]
pub enum StreamPart {
    /// Bytes of the body, sent as one DATA frame (a gRPC-framed message, or any part of one).
    Data(Bytes),
    /// The trailers; they end the stream.
    Trailers(Vec<(String, String)>),
}

/// The test's end of a [`Behaviour::Stream`]: what it sends is written to the call's stream as
/// it is sent, in order.
#[derive(Debug)]
pub struct StreamFeed {
    tx: mpsc::UnboundedSender<StreamPart>,
}

impl StreamFeed {
    /// Sends one message (gRPC-framed here: uncompressed flag, length, bytes). False when the
    /// call is gone (its client reset it) and nothing can be sent any more.
    pub fn message(&self, message: &[u8]) -> bool {
        self.tx.send(StreamPart::Data(grpc_frame(message))).is_ok()
    }

    /// Sends raw body bytes as one DATA frame; false as for [`message`](Self::message).
    pub fn data(&self, bytes: Bytes) -> bool {
        self.tx.send(StreamPart::Data(bytes)).is_ok()
    }

    /// Ends the stream with these trailers (e.g. `grpc-status: 0`); false as for
    /// [`message`](Self::message).
    pub fn end(&self, trailers: &[(&str, &str)]) -> bool {
        let trailers = trailers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.tx.send(StreamPart::Trailers(trailers)).is_ok()
    }

    /// True once the call's stream is gone: ended, or reset by its client (hyper drops the body).
    pub fn closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// One call as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The request's path, the gRPC method (`/runtime.v1.RuntimeService/Version`).
    pub path: String,
    /// The request headers as received (the call's metadata).
    pub headers: HeaderMap,
    /// The whole request body, as received (gRPC-framed).
    pub body: Bytes,
    /// When its request head arrived (hyper hands a request over at its HEADERS).
    pub head_at: std::time::Instant,
    /// When its request body was whole.
    pub whole_at: std::time::Instant,
}

/// A running fake backend; stops when dropped.
pub struct FakeBackend {
    socket: PathBuf,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    dropped: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// Frames one gRPC message: flag 0 (uncompressed), 4-byte big-endian length, the bytes.
pub fn grpc_frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

impl Behaviour {
    /// A [`Behaviour::Stream`] for one call on each of `paths`, whose response heads carry
    /// `headers`, and the feeds the test writes those streams with (in the order of `paths`).
    pub fn streams(paths: &[&str], headers: &[(&str, &str)]) -> (Behaviour, Vec<StreamFeed>) {
        let (mut feeds, mut senders) = (HashMap::new(), Vec::new());
        for path in paths {
            let (tx, rx) = mpsc::unbounded_channel();
            feeds.insert(path.to_string(), Some(rx));
            senders.push(StreamFeed { tx });
        }
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        (Behaviour::Stream { headers, feeds: Arc::new(Mutex::new(feeds)) }, senders)
    }

    /// A [`Behaviour::Restoring`] fake of `pod`, not restored yet.
    pub fn restoring(pod: RestoredPod) -> Behaviour {
        Behaviour::Restoring { pod, restored: Default::default() }
    }

    /// A successful unary answer carrying `message` (already encoded), no delay.
    pub fn ok(message: &[u8]) -> Behaviour {
        Behaviour::Reply {
            headers: vec![],
            body: grpc_frame(message),
            trailers: vec![("grpc-status".into(), "0".into())],
            delay: std::time::Duration::ZERO,
        }
    }
}

impl FakeBackend {
    /// Starts serving on a fresh socket in a temp dir.
    pub async fn start(behaviour: Behaviour) -> FakeBackend {
        let dir = tempfile::Builder::new().prefix("rp-fake").tempdir().expect("temp dir");
        let socket = dir.path().join("fake.sock");
        Self::serve(behaviour, socket, dir)
    }

    /// Starts serving on `socket` (a path that does not exist yet: a runtime that comes up
    /// where the proxy expects it). The caller keeps the directory.
    pub async fn start_at(behaviour: Behaviour, socket: &Path) -> FakeBackend {
        let dir = tempfile::Builder::new().prefix("rp-fake").tempdir().expect("temp dir");
        Self::serve(behaviour, socket.to_owned(), dir)
    }

    fn serve(behaviour: Behaviour, socket: PathBuf, dir: tempfile::TempDir) -> FakeBackend {
        let listener = UnixListener::bind(&socket).expect("bind fake backend");
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let dropped = Arc::new(AtomicUsize::new(0));
        let (rec, drp) = (recorded.clone(), dropped.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (rec, drp, behaviour) = (rec.clone(), drp.clone(), behaviour.clone());
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (rec, drp, behaviour) = (rec.clone(), drp.clone(), behaviour.clone());
                    async move { Ok::<_, Infallible>(answer(req, rec, drp, behaviour).await) }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .max_header_list_size(16 << 20)
                        // As grpc-go (containerd, CRI-O): no limit on streams the client resets
                        // before they are served; runtime-proxy resets the runtime's copy of
                        // every call it takes over, 500 at once in the fault tests.
                        .max_pending_accept_reset_streams(usize::MAX)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeBackend { socket, recorded, dropped, task, _dir: dir }
    }

    /// The fake's unix socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every call received so far, once its request body was whole.
    pub fn calls(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }

    /// Calls received so far on one gRPC path (the proxy also calls the backend on its own, e.g.
    /// to recover its store at start-up).
    pub fn calls_to(&self, path: &str) -> Vec<Recorded> {
        self.calls().into_iter().filter(|c| c.path == path).collect()
    }

    /// How many calls were abandoned by the client (stream reset) before the fake answered.
    pub fn abandoned(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct CountOnDrop(Arc<AtomicUsize>);
impl Drop for CountOnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

type FakeFrames = Pin<Box<dyn futures_lite::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send>>;
type FakeBody = StreamBody<FakeFrames>;

/// A body of these frames, all there at once.
fn frames_body(frames: Vec<Result<Frame<Bytes>, std::io::Error>>) -> FakeBody {
    StreamBody::new(Box::pin(futures_lite::stream::iter(frames)))
}

/// A body written as the test sends its parts; it ends after the trailers (or when the feed is
/// dropped).
fn fed_body(parts: mpsc::UnboundedReceiver<StreamPart>) -> FakeBody {
    let frames = futures_lite::stream::unfold(Some(parts), |parts| async move {
        let mut parts = parts?;
        match parts.recv().await? {
            StreamPart::Data(bytes) => Some((Ok(Frame::data(bytes)), Some(parts))),
            StreamPart::Trailers(trailers) => Some((Ok(Frame::trailers(header_map(trailers))), None)),
        }
    });
    StreamBody::new(Box::pin(frames))
}

fn header_map(fields: Vec<(String, String)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in fields {
        map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(&v).unwrap());
    }
    map
}

async fn answer(
    req: Request<Incoming>,
    rec: Arc<Mutex<Vec<Recorded>>>,
    dropped: Arc<AtomicUsize>,
    behaviour: Behaviour,
) -> Response<FakeBody> {
    let head_at = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    // The proxy's own health checks (a CRI Version call every 500 ms, user-agent
    // `runtime-proxy-health`) are answered like any call, a stream feed excepted, but neither
    // recorded nor counted as abandoned: `calls()` and `abandoned()` are the test's own calls
    // and the proxy's on their behalf.
    let health_check =
        parts.headers.get(http::header::USER_AGENT).is_some_and(|v| v.as_bytes().starts_with(b"runtime-proxy-health"));
    let (rec, dropped) = if health_check { (Default::default(), Default::default()) } else { (rec, dropped) };
    // As a gRPC server's handler, the fake sees a call once its request message is whole: a
    // stream reset before that (runtime-proxy resets the runtime's copy of every call it takes
    // over) never becomes a call.
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
        return Response::new(frames_body(Vec::new()));
    };
    let record = Recorded { path, headers: parts.headers, body, head_at, whole_at: std::time::Instant::now() };
    match behaviour {
        Behaviour::Stream { headers, feeds } if !health_check && feeds.lock().unwrap().contains_key(&record.path) => {
            let parts = feeds.lock().unwrap().get_mut(&record.path).and_then(Option::take);
            rec.lock().unwrap().push(record);
            let mut resp = Response::builder().status(200).header("content-type", "application/grpc");
            let Some(parts) = parts else {
                let trailers = vec![
                    ("grpc-status".into(), "14".into()),
                    ("grpc-message".into(), "fake backend: stream already served".into()),
                ];
                return resp.body(frames_body(vec![Ok(Frame::trailers(header_map(trailers)))])).unwrap();
            };
            for (k, v) in headers {
                resp = resp.header(k, v);
            }
            resp.body(fed_body(parts)).unwrap()
        }
        Behaviour::Hang => {
            rec.lock().unwrap().push(record);
            let guard = CountOnDrop(dropped);
            std::future::pending::<()>().await;
            drop(guard);
            unreachable!()
        }
        Behaviour::Cri
        | Behaviour::CriRefusing(_)
        | Behaviour::Restoring { .. }
        | Behaviour::Stream { .. }
        | Behaviour::Node(_) => {
            let (data, trailers) = match &behaviour {
                Behaviour::CriRefusing(paths) if paths.contains(&record.path) => {
                    let trailers = vec![
                        ("grpc-status".into(), "9".into()),
                        ("grpc-message".into(), "fake backend: refused".into()),
                    ];
                    (None, header_map(trailers))
                }
                Behaviour::Restoring { pod, restored } => restoring_answer(&record.path, &record.body, pod, restored)
                    .unwrap_or_else(|| cri_answer(&record.path)),
                Behaviour::Node(node) => match node.answer(&record.path, &record.body) {
                    Some(Ok(message)) => (Some(message), header_map(vec![("grpc-status".into(), "0".into())])),
                    Some(Err(())) => {
                        let trailers = vec![
                            ("grpc-status".into(), "5".into()),
                            ("grpc-message".into(), "fake backend: no such object".into()),
                        ];
                        (None, header_map(trailers))
                    }
                    None => cri_answer(&record.path),
                },
                _ => cri_answer(&record.path),
            };
            rec.lock().unwrap().push(record);
            let mut frames = Vec::new();
            if let Some(data) = data {
                frames.push(Ok(Frame::data(data)));
            }
            frames.push(Ok(Frame::trailers(trailers)));
            let resp = Response::builder().status(200).header("content-type", "application/grpc");
            resp.body(frames_body(frames)).unwrap()
        }
        Behaviour::ResetAfter { body: reply } => {
            rec.lock().unwrap().push(record);
            let frames = vec![Ok(Frame::data(reply)), Err(std::io::Error::other("the fake backend aborts the call"))];
            let resp = Response::builder().status(200).header("content-type", "application/grpc");
            resp.body(frames_body(frames)).unwrap()
        }
        Behaviour::Reply { headers, body: reply, trailers, delay } => {
            rec.lock().unwrap().push(record);
            // No timer for no delay: tokio's timer wheel has 1 ms ticks, so even a zero sleep
            // can cost up to a millisecond, which would swamp latency measurements.
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut resp = Response::builder().status(200).header("content-type", "application/grpc");
            for (k, v) in headers {
                resp = resp.header(k, v);
            }
            let frames = vec![Ok(Frame::data(reply)), Ok(Frame::trailers(header_map(trailers)))];
            resp.body(frames_body(frames)).unwrap()
        }
    }
}

/// [`Behaviour::Cri`]'s answer to a call on `path`: the response message (gRPC-framed; `None`
/// for an error status) and the trailers.
fn cri_answer(path: &str) -> (Option<Bytes>, HeaderMap) {
    use k8s_cri::v1 as cri;
    use prost::Message;
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let mut trailers = HeaderMap::new();
    let method = path.rsplit('/').next().unwrap_or_default();
    let message = match method {
        "RunPodSandbox" => {
            let id = format!("fake-sandbox-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
            cri::RunPodSandboxResponse { pod_sandbox_id: id }.encode_to_vec()
        }
        "CreateContainer" => {
            let id = format!("fake-container-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
            cri::CreateContainerResponse { container_id: id }.encode_to_vec()
        }
        "PodSandboxStatus" | "ContainerStatus" => {
            trailers.insert("grpc-status", HeaderValue::from_static("5"));
            trailers.insert("grpc-message", HeaderValue::from_static("fake backend: no such object"));
            return (None, trailers);
        }
        _ => Vec::new(),
    };
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    (Some(grpc_frame(&message)), trailers)
}

/// [`Behaviour::Restoring`]'s answer to the calls about its pod (`body`: the gRPC-framed
/// request; `restored`: set by RestorePod); `None` for the calls answered as [`Behaviour::Cri`]
/// answers them.
fn restoring_answer(
    path: &str,
    body: &[u8],
    pod: &RestoredPod,
    restored: &std::sync::atomic::AtomicBool,
) -> Option<(Option<Bytes>, HeaderMap)> {
    use k8s_cri::v1 as cri;
    use prost::Message;
    let request = body.get(5..).unwrap_or_default();
    let method = path.rsplit('/').next().unwrap_or_default();
    if method == "RestorePod" {
        restored.store(true, Ordering::SeqCst);
    } else if !restored.load(Ordering::SeqCst) {
        return None;
    }
    let resources = cri::LinuxContainerResources { cpu_shares: 256, ..Default::default() };
    let container = |id: &str| pod.containers.iter().find(|(_, c)| c == id).map(|(name, _)| name.clone());
    let message = match method {
        "RestorePod" => {
            // RestorePodResponse: pod_sandbox_id (1), restored_containers (2: name 1, container_id 2).
            let mut out = Vec::new();
            prost::encoding::string::encode(1, &pod.sandbox_id, &mut out);
            for (name, id) in &pod.containers {
                let mut inner = Vec::new();
                prost::encoding::string::encode(1, name, &mut inner);
                prost::encoding::string::encode(2, id, &mut inner);
                prost::encoding::bytes::encode(2, &inner, &mut out);
            }
            out
        }
        "PodSandboxStatus" => {
            if cri::PodSandboxStatusRequest::decode(request).ok()?.pod_sandbox_id != pod.sandbox_id {
                return None;
            }
            let config = serde_json::json!({ "metadata": { "name": pod.metadata.name }, "linux": { "cgroup_parent": pod.cgroup_parent } });
            cri::PodSandboxStatusResponse {
                status: Some(cri::PodSandboxStatus {
                    id: pod.sandbox_id.clone(),
                    metadata: Some(pod.metadata.clone()),
                    state: cri::PodSandboxState::SandboxReady as i32,
                    labels: pod.labels.clone(),
                    annotations: pod.annotations.clone(),
                    ..Default::default()
                }),
                info: [("info".to_string(), serde_json::json!({ "config": config }).to_string())].into(),
                ..Default::default()
            }
            .encode_to_vec()
        }
        "ListPodSandbox" => {
            let item = cri::PodSandbox {
                id: pod.sandbox_id.clone(),
                metadata: Some(pod.metadata.clone()),
                state: cri::PodSandboxState::SandboxReady as i32,
                ..Default::default()
            };
            cri::ListPodSandboxResponse { items: vec![item] }.encode_to_vec()
        }
        "ListContainers" => {
            let filter = cri::ListContainersRequest::decode(request).ok()?.filter.unwrap_or_default();
            let containers = pod
                .containers
                .iter()
                .filter(|(_, id)| filter.id.is_empty() || *id == filter.id)
                .map(|(name, id)| cri::Container {
                    id: id.clone(),
                    pod_sandbox_id: pod.sandbox_id.clone(),
                    metadata: Some(cri::ContainerMetadata { name: name.clone(), attempt: 0 }),
                    state: cri::ContainerState::ContainerCreated as i32,
                    ..Default::default()
                })
                .collect();
            cri::ListContainersResponse { containers }.encode_to_vec()
        }
        "ContainerStatus" => {
            let id = cri::ContainerStatusRequest::decode(request).ok()?.container_id;
            let name = container(&id)?;
            let config = serde_json::json!({
                "metadata": { "name": name },
                "envs": [{ "key": "RESTORED", "value": "1" }],
                "linux": { "resources": { "cpu_shares": 256 } },
            });
            cri::ContainerStatusResponse {
                status: Some(cri::ContainerStatus {
                    id: id.clone(),
                    metadata: Some(cri::ContainerMetadata { name, attempt: 0 }),
                    state: cri::ContainerState::ContainerCreated as i32,
                    resources: Some(cri::ContainerResources { linux: Some(resources), ..Default::default() }),
                    ..Default::default()
                }),
                info: [(
                    "info".to_string(),
                    serde_json::json!({ "sandboxID": pod.sandbox_id, "config": config }).to_string(),
                )]
                .into(),
            }
            .encode_to_vec()
        }
        _ => return None,
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    Some((Some(grpc_frame(&message)), trailers))
}
