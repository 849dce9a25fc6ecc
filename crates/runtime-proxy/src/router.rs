//! Where each call goes: the one entry point for every request the proxy receives.
//!
//! The route is picked from the gRPC path (`/<package>.<Service>/<Method>`) alone:
//! `runtime.v1.ImageService` and `runtime.v1alpha2.ImageService` go to the image backend, every
//! other path (RuntimeService, methods and services the compiled proto does not know, server
//! streams such as GetContainerEvents, CRI v1alpha2) to the runtime backend. The CRI v1 methods
//! of [`intercept::METHODS`] go through the interceptor; everything else through the generic
//! pass-through.
//!
//! A call without an `:authority` (the client sent none, or sent one that is not a valid URI
//! authority, such as the unix socket path gRPC clients put there, which the patched h2 ignores:
//! vendor/README.md) is given `localhost`, so what reaches the backend is well-formed.
//!
//! Each call is logged here, once, when it ends.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::uri::{Authority, Scheme};
use http::{Request, Uri};

use crate::backend::Backend;
use crate::grpc::{self, Code};
use crate::intercept::{self, Interceptor};
use crate::metrics::Metrics;
use crate::passthrough;

/// Routes calls to the runtime and image backends (which may be one and the same) and to the
/// interceptor.
pub struct Router {
    runtime: Arc<Backend>,
    image: Arc<Backend>,
    interceptor: Option<Arc<Interceptor>>,
    metrics: Arc<Metrics>,
}

impl Router {
    /// A router over the two backends; pass the same `Arc` twice when images are served by the
    /// runtime socket (the default). Without an interceptor every call passes through.
    pub fn new(runtime: Arc<Backend>, image: Arc<Backend>, interceptor: Option<Arc<Interceptor>>, metrics: Arc<Metrics>) -> Self {
        Router { runtime, image, interceptor, metrics }
    }

    /// The backend serving `path`.
    pub fn backend_for(&self, path: &str) -> &Arc<Backend> {
        if is_image_service(path) {
            &self.image
        } else {
            &self.runtime
        }
    }

    /// The runtime backend.
    pub fn runtime(&self) -> &Arc<Backend> {
        &self.runtime
    }

    /// Handles one call to its end, records it in the metrics and logs it once: at `debug` with
    /// the method, gRPC code and latency in microseconds; at `warn` when the code is not OK, with
    /// the status message.
    /// Every failure of the proxy's own is answered as a gRPC status (see [`passthrough::forward`]).
    pub async fn handle(&self, mut req: Request<RecvStream>, respond: SendResponse<Bytes>) {
        let start = Instant::now();
        if req.uri().authority().is_none() {
            set_default_authority(req.uri_mut());
        }
        let method = req.uri().path().to_owned();
        let backend = self.backend_for(&method);
        let status = match (&self.interceptor, intercept::lookup(&method)) {
            // Boxed: the interceptor's future is tens of KB (decoded requests, hook calls), and
            // inline it made every call's task that big — each pass-through call paid for
            // copying it into the spawned task (half the proxy's instructions per call).
            (Some(interceptor), Some(spec)) => Box::pin(interceptor.handle(spec, &method, backend, req, respond)).await,
            _ => {
                let deadline = grpc::parse_timeout(req.headers());
                passthrough::forward(backend, req, respond, deadline, &method).await
            }
        };
        let elapsed = start.elapsed();
        self.metrics.cri_call(&method, status.code, elapsed);
        let elapsed_us = elapsed.as_micros() as u64;
        if status.code == Code::OK {
            tracing::debug!(method, code = %status.code, elapsed_us, "CRI call");
        } else {
            tracing::warn!(method, code = %status.code, elapsed_us, message = %status.message, "CRI call failed");
        }
    }
}

/// Gives a URI without authority the scheme `http` and the authority `localhost` (what tonic and
/// grpc-go send on unix sockets); a URI without a path is left as it is.
fn set_default_authority(uri: &mut Uri) {
    let mut parts = uri.clone().into_parts();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(Authority::from_static("localhost"));
    if let Ok(with) = Uri::from_parts(parts) {
        *uri = with;
    }
}

/// True for the CRI ImageService of any version (`/runtime.v1.ImageService/ListImages`,
/// `/runtime.v1alpha2.ImageService/...`).
pub fn is_image_service(path: &str) -> bool {
    path.split('/').nth(1).is_some_and(|service| service.starts_with("runtime.") && service.ends_with(".ImageService"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_authority() {
        let mut uri = Uri::from_static("/runtime.v1.RuntimeService/Version");
        set_default_authority(&mut uri);
        assert_eq!(uri, "http://localhost/runtime.v1.RuntimeService/Version");
    }

    #[test]
    fn image_service_paths() {
        assert!(is_image_service("/runtime.v1.ImageService/ListImages"));
        assert!(is_image_service("/runtime.v1alpha2.ImageService/PullImage"));
        assert!(!is_image_service("/runtime.v1.RuntimeService/Version"));
        assert!(!is_image_service("/other.ImageService/X"));
        assert!(!is_image_service(""));
    }
}
