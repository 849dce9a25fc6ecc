//! The generic pass-through: forwards one call to a backend as it is and streams the answer back.
//!
//! The request's headers (gRPC metadata such as `traceparent`, `grpc-timeout`), body frames and
//! trailers are sent on unchanged; the response's status, headers, body frames and trailers
//! (`grpc-status`, `grpc-message`, `grpc-status-details-bin`) come back unchanged. Nothing is
//! decoded, so it serves every method, stream and service, known or not, and imposes no message
//! size limit of its own.

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;

use crate::backend::Backend;
use crate::body::ProxyBody;
use crate::grpc::{Code, Status};

/// Forwards `req` to `backend` and returns its response with the body still streaming.
///
/// `deadline` is the caller's `grpc-timeout`: the backend enforces it too (the header travels
/// with the call), and the proxy gives up waiting for the response head when it expires, so a
/// hung backend cannot hold a call past the kubelet's deadline. Once the response has started,
/// its body streams until the backend or the client ends it.
///
/// Errors: `UNAVAILABLE` when the backend cannot be reached (see [`Backend::send`]);
/// `DEADLINE_EXCEEDED` naming the method and backend when the deadline expires first.
pub async fn forward(
    backend: &Backend,
    req: Request<ProxyBody>,
    deadline: Option<Duration>,
    method: &str,
) -> Result<Response<ProxyBody>, Status> {
    let sent = backend.send(req);
    let resp = match deadline {
        None => sent.await?,
        Some(d) => tokio::time::timeout(d, sent).await.map_err(|_| {
            Status::new(
                Code::DEADLINE_EXCEEDED,
                format!("{method}: deadline of {d:?} exceeded waiting for backend unix://{}", backend.path().display()),
            )
        })??,
    };
    Ok(resp.map(|b| b.map_err(Into::into).boxed_unsync()))
}
