//! Docker mode (`--backend-runtime-mode Docker`): the proxy serves the Docker Engine HTTP API on
//! its socket and forwards it to dockerd, for kubelet's dockershim or cri-dockerd pointed at the
//! proxy (`--docker-endpoint`).
//!
//! * [`relay`] — the HTTP/1.1 pass-through: streamed bodies, hijacked (`101`) connections.
//! * [`model`] — dockershim's names and labels, hook requests from Docker JSON and back.
//! * [`intercept`] — the container calls of pods named the dockershim way, mapped onto the same
//!   stage table and driven through the same hook flow as CRI mode ([`crate::hooks`]).
//! * [`recover`] — the store rebuilt from dockerd (`/containers/json?all=1` + inspect).
//!
//! Routes (any `/v1.xx` prefix): `POST /containers/create`, `POST /containers/{id}/start`,
//! `/stop`, `/update`, `DELETE /containers/{id}` are intercepted; everything else passes through.

pub mod intercept;
pub mod model;
pub mod recover;
pub mod relay;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixListener;

use crate::hooks::Hooks;
use crate::metrics::Metrics;
use relay::{Body, Upstream};

/// The Docker front end's shared state.
pub struct DockerFront {
    /// dockerd's socket.
    pub backend: std::path::PathBuf,
    /// The hook state shared with CRI mode's code.
    pub hooks: Arc<Hooks>,
    /// The call metrics, where each Docker call is counted and timed by route and HTTP status.
    pub metrics: Arc<Metrics>,
}

impl DockerFront {
    /// Handles one request of a client connection whose dockerd connection is `upstream`, and
    /// logs it once (debug; warn for answers ≥ 400) with its route and status.
    async fn handle(&self, upstream: &mut Upstream, req: Request<Incoming>) -> Response<Body> {
        let start = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let resp = match intercept::route(&method, &path) {
            Some(route) => intercept::handle(&self.hooks, route, upstream, req).await,
            None => relay::forward(upstream, req).await,
        };
        let elapsed = start.elapsed();
        let status = resp.status().as_u16();
        let label = intercept::route(&method, &path).map(|r| r.label()).unwrap_or("docker other");
        self.metrics.docker_call(label, status, elapsed);
        let elapsed_us = elapsed.as_micros() as u64;
        if status < 400 {
            tracing::debug!(%method, path, status, elapsed_us, "Docker API call");
        } else {
            tracing::warn!(%method, path, status, elapsed_us, "Docker API call failed");
        }
        resp
    }
}

/// Serves the Docker Engine API on `listener` until `shutdown` resolves, then removes the socket
/// at `socket_path` and lets open requests (streams, hijacked connections excepted) finish for
/// at most `drain_timeout` (the accept loop is CRI mode's, [`crate::listener::accept_and_drain`]).
///
/// Errors: none so far (accept errors are logged and retried).
pub async fn serve(
    listener: UnixListener,
    socket_path: &Path,
    front: Arc<DockerFront>,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
) -> anyhow::Result<()> {
    crate::listener::accept_and_drain(listener, socket_path, shutdown, drain_timeout, |stream, mut stop, _tasks| {
        let front = front.clone();
        let upstream = Arc::new(tokio::sync::Mutex::new(Upstream::new(&front.backend)));
        let service = hyper::service::service_fn(move |req| {
            let (front, upstream) = (front.clone(), upstream.clone());
            async move {
                // An intercepted call with a large body (as its Content-Length says) runs off the
                // proxy's thread (`crate::hooks::offload`); a chunked body counts as small.
                let intercepted = intercept::route(req.method(), req.uri().path()).is_some();
                let size = if intercepted { hyper::body::Body::size_hint(req.body()).lower() } else { 0 };
                let hooks = front.hooks.clone();
                let work = async move {
                    let mut upstream = upstream.lock().await;
                    front.handle(&mut upstream, req).await
                };
                Ok::<_, std::convert::Infallible>(
                    hooks.offload.run(usize::try_from(size).unwrap_or(usize::MAX), work).await,
                )
            }
        });
        let conn =
            hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).with_upgrades();
        async move {
            tokio::pin!(conn);
            let ended = tokio::select! {
                ended = conn.as_mut() => ended,
                _ = stop.changed() => {
                    // Finish the request in flight, then close.
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(error = %e, "Docker API client connection ended with an error");
            }
        }
    })
    .await;
    Ok(())
}
