//! The body type every response leaving the proxy has, and [`Observed`], the wrapper that sees a
//! call end (its `grpc-status`, wherever the backend put it) so it can be logged once.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;

use crate::grpc::Code;

/// Any error a body can end with (a reset stream, a broken connection).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed HTTP/2 body: backend response bodies streamed through, or bodies the proxy builds.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Wraps a response body and logs the call once, when it ends: at `debug` with the method, the
/// gRPC code and the latency in microseconds; at `warn` when the code is not OK, with the
/// backend's `grpc-message`. A call whose client went away before the end is logged as
/// `CANCELLED`.
///
/// The status is read from the response headers (trailers-only responses) or from the trailers
/// frame; frames themselves pass through untouched.
pub struct Observed {
    inner: ProxyBody,
    call: Option<CallEnd>,
}

struct CallEnd {
    method: String,
    start: Instant,
    code: Option<Code>,
    message: Option<String>,
}

impl Observed {
    /// `headers` are the response headers; `start` is when the proxy received the request.
    pub fn new(inner: ProxyBody, method: String, start: Instant, headers: &HeaderMap) -> Self {
        let mut call = CallEnd { method, start, code: None, message: None };
        call.read_status(headers);
        Observed { inner, call: Some(call) }
    }

    fn finish(&mut self, fallback: Code) {
        if let Some(c) = self.call.take() {
            let code = c.code.unwrap_or(fallback);
            let elapsed_us = c.start.elapsed().as_micros() as u64;
            if code == Code::OK {
                tracing::debug!(method = %c.method, code = %code, elapsed_us, "CRI call");
            } else {
                let message = c.message.as_deref().unwrap_or("");
                tracing::warn!(method = %c.method, code = %code, elapsed_us, message, "CRI call failed");
            }
        }
    }
}

impl CallEnd {
    fn read_status(&mut self, headers: &HeaderMap) {
        if let Some(code) = Code::from_headers(headers) {
            self.code = Some(code);
            self.message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).map(str::to_owned);
        }
    }
}

impl Body for Observed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(trailers), Some(call)) = (frame.trailers_ref(), self.call.as_mut()) {
                    call.read_status(trailers);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                if let Some(call) = self.call.as_mut() {
                    call.message = Some(format!("response stream broken: {e}"));
                }
                self.finish(Code::UNAVAILABLE);
            }
            // The end of the stream; a response without any grpc-status is a protocol error.
            Poll::Ready(None) => self.finish(Code::UNKNOWN),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        // Either the status was seen and the end never polled (hyper stops at is_end_stream), or
        // the client went away mid-call: then the call counts as CANCELLED.
        self.finish(Code::CANCELLED);
    }
}
