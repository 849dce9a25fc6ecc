//! Unary calls over a shared [`Backend`] connection: a request sent whole and its answer
//! collected whole ([`Answer`]). The interceptor forwards hooked calls this way, the dispatcher
//! calls hook servers this way, and the relay sends calls it takes over this way
//! ([`crate::cri::relay`]); the proxy's own calls to the runtime (restart recovery, store misses)
//! are made with [`own_call`].

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};

use crate::grpc::backend::Backend;
use crate::grpc::{self, Code, Status};

fn missing_status() -> Status {
    Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status")
}

/// A unary answer collected whole from the backend (for intercepted calls, whose answer the
/// store learns from).
#[derive(Debug)]
pub struct Answer {
    /// Response head (status and headers) as the backend sent it.
    pub head: Response<()>,
    /// The body bytes (gRPC length-prefixed messages).
    pub data: Bytes,
    /// The trailers, absent for a trailers-only answer.
    pub trailers: Option<HeaderMap>,
}

impl Answer {
    /// The call's status, from the trailers or a trailers-only head; `UNKNOWN` when neither
    /// carries `grpc-status`.
    pub fn status(&self) -> Status {
        self.grpc_status().unwrap_or_else(missing_status)
    }

    /// The status the trailers or a trailers-only head carry; `None` without `grpc-status`.
    pub fn grpc_status(&self) -> Option<Status> {
        self.trailers
            .as_ref()
            .and_then(super::status_from_headers)
            .or_else(|| super::status_from_headers(self.head.headers()))
    }

    /// The answer's one message, decompressed per its `grpc-encoding` (see
    /// [`grpc::unary_message`]) up to `limit` bytes; `Ok(None)` when the body is not exactly one
    /// message.
    ///
    /// Errors: as [`grpc::unary_message`] (an encoding the proxy cannot decompress, a corrupt
    /// message, more than `limit` bytes).
    pub fn message(&self, limit: usize) -> Result<Option<Bytes>, Status> {
        grpc::unary_message(&self.data, self.head.headers().get("grpc-encoding"), limit)
    }
}

/// Sends one unary call (`head` and the whole `body`) to `backend` and collects the answer, whose
/// body may hold at most one message of `max_message` bytes.
///
/// Errors: as [`exchange`]; `DEADLINE_EXCEEDED` naming `method` and the backend when `deadline`
/// passes first.
pub async fn unary(
    backend: &Backend,
    head: Request<()>,
    body: Bytes,
    deadline: Option<Duration>,
    method: &str,
    max_message: usize,
) -> Result<Answer, Status> {
    let call = exchange(backend, head, body, method, max_message);
    match deadline {
        None => call.await,
        Some(d) => tokio::time::timeout(d, call).await.map_err(|_| {
            Status::new(Code::DEADLINE_EXCEEDED, format!("{method}: deadline exceeded waiting for {backend}"))
        })?,
    }
}

/// The proxy's own unary call of `path` (`/runtime.v1.RuntimeService/PodSandboxStatus`) to
/// `backend`: `message` (an encoded protobuf message) sent with `grpc-timeout: deadline`, and the
/// answer's one message (at most `max_message` bytes), still encoded.
///
/// Errors: the status the backend answered with when it is not `OK` (its message
/// percent-decoded); `UNAVAILABLE`, `RESOURCE_EXHAUSTED` as [`exchange`], `DEADLINE_EXCEEDED` as
/// [`unary`]; `INTERNAL` naming the method when an `OK` answer is not one message (or one
/// compressed with an encoding the proxy cannot decompress).
pub async fn own_call(
    backend: &Backend,
    path: &'static str,
    message: &[u8],
    deadline: Duration,
    max_message: usize,
) -> Result<Bytes, Status> {
    let method = path.rsplit('/').next().unwrap_or(path);
    let head = Request::post(format!("http://localhost{path}"))
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .header(http::header::USER_AGENT, grpc::USER_AGENT)
        .header("grpc-timeout", grpc::timeout_value(deadline))
        .body(())
        .map_err(|e| Status::new(Code::INTERNAL, format!("{method}: request head: {e}")))?;
    let answer = unary(backend, head, grpc::frame(message), Some(deadline), method, max_message).await?;
    let status = answer.status();
    if status.code != Code::OK {
        return Err(Status::new(status.code, grpc::percent_decode(&status.message)));
    }
    let not_one = || Status::new(Code::INTERNAL, format!("{method}: the answer from {backend} is not one message"));
    answer
        .message(max_message)
        .map_err(|e| Status::new(Code::INTERNAL, format!("{method}: {}", e.message)))?
        .ok_or_else(not_one)
}

/// Sends one unary call (`head` and the whole `body`, in one write when the connection is
/// idle) to `backend` and collects the answer, whose body may hold at most one message of
/// `max_message` bytes (plus its 5-byte prefix). No deadline of its own: the caller bounds it
/// (dropping the future resets the stream).
///
/// Errors: `UNAVAILABLE` naming `method` and the backend when it cannot be reached or fails
/// the call (a reset, a broken connection); `RESOURCE_EXHAUSTED` as soon as the answer's body
/// exceeds `max_message` + 5 bytes (the stream is reset; at most one frame more is read).
pub async fn exchange(
    backend: &Backend,
    head: Request<()>,
    body: Bytes,
    method: &str,
    max_message: usize,
) -> Result<Answer, Status> {
    let (response, mut upstream) = backend.open_stream(head, body.is_empty()).await?;
    if !body.is_empty() {
        // Ignored: a backend that answers before reading the body still answers.
        let _ = upstream.send_data(body, true);
    }
    let failed = |e: h2::Error| Status::new(Code::UNAVAILABLE, format!("{method}: {backend} failed the call: {e}"));
    let (head, mut recv) = response.await.map_err(failed)?.into_parts();
    let mut body = Body::new(max_message.saturating_add(5));
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(failed)?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        if body.push(chunk).is_err() {
            return Err(Status::new(
                Code::RESOURCE_EXHAUSTED,
                format!("{method}: answer from {backend} larger than one message of {max_message} bytes"),
            ));
        }
    }
    let data = body.into_bytes();
    let trailers = recv.trailers().await.map_err(failed)?;
    Ok(Answer { head: Response::from_parts(head, ()), data, trailers })
}

/// An answer's body collected from its DATA frames, up to a limit. The usual unary answer is one
/// DATA frame: kept as it came, without a copy.
pub(crate) struct Body {
    first: Bytes,
    joined: bytes::BytesMut,
    /// Most bytes accepted.
    max: usize,
}

/// The body passed its limit.
pub(crate) struct TooLarge;

impl Body {
    /// An empty body that accepts at most `max` bytes.
    pub(crate) fn new(max: usize) -> Body {
        Body { first: Bytes::new(), joined: bytes::BytesMut::new(), max }
    }

    /// Adds one frame's data.
    ///
    /// Errors: [`TooLarge`] when the body would pass its limit (the chunk is not added).
    pub(crate) fn push(&mut self, chunk: Bytes) -> Result<(), TooLarge> {
        let have = if self.joined.is_empty() { self.first.len() } else { self.joined.len() };
        if have + chunk.len() > self.max {
            return Err(TooLarge);
        }
        if have == 0 {
            self.first = chunk;
        } else {
            if self.joined.is_empty() {
                self.joined.extend_from_slice(&self.first);
            }
            self.joined.extend_from_slice(&chunk);
        }
        Ok(())
    }

    /// The whole body.
    pub(crate) fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.first
        } else {
            self.joined.freeze()
        }
    }
}

/// How an intercepted call goes on once its pre stage is done (the CRI interceptor's calls):
/// called once with the request head, the (edited) body and the caller's deadline, it yields the
/// backend's whole answer — as a unary call ([`over_shared`]) or on the client's own relayed
/// stream ([`crate::cri::relay`]).
pub type Onward<'a> = Box<
    dyn FnOnce(
            http::request::Parts,
            Bytes,
            Option<Instant>,
        ) -> Pin<Box<dyn Future<Output = Result<Answer, Status>> + Send + 'a>>
        + Send
        + 'a,
>;

/// Onward as one unary call over the shared connection to `backend` (`method`: for messages).
pub fn over_shared<'a>(backend: &'a Backend, method: &'a str) -> Onward<'a> {
    Box::new(move |parts, body, deadline| {
        Box::pin(async move {
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            unary(backend, Request::from_parts(parts, ()), body, remaining, method, usize::MAX).await
        })
    })
}
