//! Where each call goes: the one entry point for every request the proxy receives.
//!
//! The route is picked from the gRPC path (`/<package>.<Service>/<Method>`) alone:
//! `runtime.v1.ImageService` and `runtime.v1alpha2.ImageService` go to the image backend, every
//! other path (RuntimeService, methods and services the compiled proto does not know, server
//! streams such as GetContainerEvents) to the runtime backend. All of them take the generic
//! pass-through today; the interceptor for hooked methods slots in here.

use std::sync::Arc;
use std::time::Instant;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::backend::Backend;
use crate::body::Observed;
use crate::{grpc, passthrough};

/// Routes calls to the runtime and image backends (which may be one and the same).
pub struct Router {
    runtime: Arc<Backend>,
    image: Arc<Backend>,
}

impl Router {
    /// A router over the two backends; pass the same `Arc` twice when images are served by the
    /// runtime socket (the default).
    pub fn new(runtime: Arc<Backend>, image: Arc<Backend>) -> Self {
        Router { runtime, image }
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

    /// Handles one call and never fails at the HTTP level: every failure of the proxy's own is
    /// answered as a gRPC status (see [`passthrough::forward`]).
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Observed> {
        let start = Instant::now();
        let method = req.uri().path().to_owned();
        let deadline = grpc::parse_timeout(req.headers());
        let backend = self.backend_for(&method);
        let req = req.map(|b| b.map_err(Into::into).boxed_unsync());
        let resp = passthrough::forward(backend, req, deadline, &method).await.unwrap_or_else(|s| s.into_response());
        let (parts, body) = resp.into_parts();
        let body = Observed::new(body, method, start, &parts.headers);
        Response::from_parts(parts, body)
    }
}

/// True for the CRI ImageService of any version (`/runtime.v1.ImageService/ListImages`,
/// `/runtime.v1alpha2.ImageService/...`).
pub fn is_image_service(path: &str) -> bool {
    path.split('/')
        .nth(1)
        .is_some_and(|service| service.starts_with("runtime.") && service.ends_with(".ImageService"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_service_paths() {
        assert!(is_image_service("/runtime.v1.ImageService/ListImages"));
        assert!(is_image_service("/runtime.v1alpha2.ImageService/PullImage"));
        assert!(!is_image_service("/runtime.v1.RuntimeService/Version"));
        assert!(!is_image_service("/other.ImageService/X"));
        assert!(!is_image_service(""));
    }
}
