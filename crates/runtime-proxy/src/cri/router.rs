//! Where each call goes, and the one place a finished call is recorded.
//!
//! The route is picked from the gRPC path (`/<package>.<Service>/<Method>`) alone ([`Route`]):
//! the CRI methods of [`crate::hooks::stages::METHODS`] (v1 and v1alpha2) go through the interceptor;
//! `runtime.v1.ImageService` and `runtime.v1alpha2.ImageService` calls go to the image backend
//! when that is another socket; every other call (RuntimeService, ImageService on the runtime
//! socket, methods and services the compiled proto does not know, server streams such as
//! GetContainerEvents) is relayed as it is to the runtime backend ([`crate::cri::relay`]).
//!
//! A call the proxy sends on itself (intercepted, image) without an `:authority`, or with one
//! that is not a valid URI authority (such as the unix socket path gRPC clients put there), is
//! given `localhost` ([`default_uri`]), so what reaches the backend is well-formed.
//!
//! Each call is logged once, when it ends ([`Router::record`]).

use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;

use crate::cri::intercept::{self, Interceptor};
use crate::grpc::backend::Backend;
use crate::grpc::{Code, Status};
use crate::metrics::Metrics;

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
    pub fn new(
        runtime: Arc<Backend>,
        image: Arc<Backend>,
        interceptor: Option<Arc<Interceptor>>,
        metrics: Arc<Metrics>,
    ) -> Self {
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

    /// The interceptor, if hooks are served.
    pub fn interceptor(&self) -> Option<&Arc<Interceptor>> {
        self.interceptor.as_ref()
    }

    /// Where the call to `path` goes (see the module docs).
    pub fn route(&self, path: &str) -> Route {
        if let (Some(_), Some(spec)) = (&self.interceptor, intercept::lookup(path)) {
            return Route::Intercept(spec);
        }
        if is_image_service(path) && !Arc::ptr_eq(&self.image, &self.runtime) {
            return Route::Unary;
        }
        Route::Relay
    }

    /// Records one finished call in the metrics and logs it once: at `debug` with the method,
    /// gRPC code and latency in microseconds; at `warn` when the code is not OK, with the
    /// status message.
    pub fn record(&self, method: &str, status: &Status, elapsed: Duration) {
        self.metrics.cri_call(method, status.code, elapsed);
        let elapsed_us = elapsed.as_micros() as u64;
        if status.code == Code::OK {
            tracing::debug!(method, code = %status.code, elapsed_us, "CRI call");
        } else {
            tracing::warn!(method, code = %status.code, elapsed_us, message = %status.message, "CRI call failed");
        }
    }
}

/// Where a call goes.
#[derive(Clone, Copy, Debug)]
pub enum Route {
    /// Forwarded frame by frame on the client connection's own runtime connection.
    Relay,
    /// Taken over by the interceptor (a hooked method).
    Intercept(&'static crate::hooks::stages::MethodSpec),
    /// Taken over and sent as one unary call over the shared connection to its backend
    /// ([`Router::backend_for`]): ImageService calls when images are served by another socket
    /// (all its methods are unary), and calls on a client connection whose runtime connection
    /// is gone.
    Unary,
}

/// The URI of a call the proxy sends on itself: scheme `http`, the client's `authority` when it
/// is a valid URI authority, else `localhost` (what tonic and grpc-go send on unix sockets), and
/// `path`.
///
/// Errors: `None` when `path` is not a valid URI path.
pub fn default_uri(authority: Option<&[u8]>, path: &str) -> Option<Uri> {
    let authority =
        authority.and_then(|a| Authority::try_from(a).ok()).unwrap_or_else(|| Authority::from_static("localhost"));
    Uri::builder().scheme(Scheme::HTTP).authority(authority).path_and_query(path).build().ok()
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
        let path = "/runtime.v1.RuntimeService/Version";
        assert_eq!(default_uri(None, path).unwrap(), "http://localhost/runtime.v1.RuntimeService/Version");
        assert_eq!(
            default_uri(Some(b"/run/x.sock"), path).unwrap(),
            "http://localhost/runtime.v1.RuntimeService/Version"
        );
        assert_eq!(default_uri(Some(b"node:1"), path).unwrap(), "http://node:1/runtime.v1.RuntimeService/Version");
        assert!(default_uri(None, "not a path").is_none());
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
