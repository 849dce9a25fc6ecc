//! An in-process HTTP/2 server standing in for the runtime, for what real containerd cannot show:
//! which metadata arrived, an answer with custom trailers or a 20 MiB body, a backend that hangs.
//! It speaks raw HTTP/2 (no gRPC decoding), so it answers any path.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;

/// How the fake answers every call.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// After `delay`, answer with these response headers, body bytes and trailers.
    Reply { headers: Vec<(String, String)>, body: Bytes, trailers: Vec<(String, String)>, delay: std::time::Duration },
    /// Never answer; the call stays open until the client gives up.
    Hang,
    /// A minimal CRI runtime for volume tests: RunPodSandbox and CreateContainer answer a fresh
    /// ID each (`fake-sandbox-N`, `fake-container-N`, unique in the process),
    /// PodSandboxStatus and ContainerStatus `NOT_FOUND` (it keeps no objects), every other call
    /// an empty OK message (empty lists for ListPodSandbox / ListContainers). Nothing is decoded.
    Cri,
    /// Answer the response head and `body`, then fail the body: hyper resets the stream
    /// (`RST_STREAM`) instead of sending trailers, as a backend that aborts a call does.
    ResetAfter { body: Bytes },
}

/// One call as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
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

type FakeBody = StreamBody<futures_lite::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>>;

async fn answer(
    req: Request<Incoming>,
    rec: Arc<Mutex<Vec<Recorded>>>,
    dropped: Arc<AtomicUsize>,
    behaviour: Behaviour,
) -> Response<FakeBody> {
    let head_at = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    // As a gRPC server's handler, the fake sees a call once its request message is whole: a
    // stream reset before that (runtime-proxy resets the runtime's copy of every call it takes
    // over) never becomes a call.
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
        return Response::new(StreamBody::new(futures_lite::stream::iter(Vec::new())));
    };
    let record = Recorded { path, headers: parts.headers, body, head_at, whole_at: std::time::Instant::now() };
    match behaviour {
        Behaviour::Hang => {
            rec.lock().unwrap().push(record);
            let guard = CountOnDrop(dropped);
            std::future::pending::<()>().await;
            drop(guard);
            unreachable!()
        }
        Behaviour::Cri => {
            let (data, trailers) = cri_answer(&record.path);
            rec.lock().unwrap().push(record);
            let mut frames = Vec::new();
            if let Some(data) = data {
                frames.push(Ok(Frame::data(data)));
            }
            frames.push(Ok(Frame::trailers(trailers)));
            let resp = Response::builder().status(200).header("content-type", "application/grpc");
            resp.body(StreamBody::new(futures_lite::stream::iter(frames))).unwrap()
        }
        Behaviour::ResetAfter { body: reply } => {
            rec.lock().unwrap().push(record);
            let frames = vec![Ok(Frame::data(reply)), Err(std::io::Error::other("the fake backend aborts the call"))];
            let resp = Response::builder().status(200).header("content-type", "application/grpc");
            resp.body(StreamBody::new(futures_lite::stream::iter(frames))).unwrap()
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
            let mut t = HeaderMap::new();
            for (k, v) in trailers {
                t.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(&v).unwrap());
            }
            let frames = vec![Ok(Frame::data(reply)), Ok(Frame::trailers(t))];
            resp.body(StreamBody::new(futures_lite::stream::iter(frames))).unwrap()
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
