//! The debug endpoint (`--debug-addr`, off by default): `GET /debug/store`, the sandbox and
//! container IDs the store holds (JSON, sorted).
//!
//! It has a listener of its own, apart from the admin endpoint (`--metrics-addr`), because pod
//! IDs are not for every network that may scrape metrics: an operator turns it on where only
//! they can reach it (loopback), when they need it. The admin endpoint answers `/debug/store`
//! with 404 and a line saying where it moved ([`DebugEndpoint::moved`]).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::hooks::store::Store;

/// Where the debug endpoint is: the address asked for (`--debug-addr`) and, once bound, the
/// address it listens on (they differ with port 0).
#[derive(Debug, Default)]
pub struct DebugEndpoint {
    /// `--debug-addr`; `None`: off.
    pub configured: Option<SocketAddr>,
    bound: OnceLock<SocketAddr>,
}

impl DebugEndpoint {
    /// The endpoint `--debug-addr` asks for (`None`: off), not bound yet.
    pub fn new(configured: Option<SocketAddr>) -> DebugEndpoint {
        DebugEndpoint { configured, bound: OnceLock::new() }
    }

    /// The address it listens on, once bound.
    pub fn bound(&self) -> Option<SocketAddr> {
        self.bound.get().copied()
    }

    /// The admin endpoint's answer to `/debug/store`: where it is served now, or how to turn it
    /// on.
    pub fn moved(&self) -> String {
        match (self.configured, self.bound()) {
            (_, Some(addr)) => format!("/debug/store moved to its own listener: http://{addr}/debug/store (--debug-addr)\n"),
            (Some(addr), None) => {
                format!("/debug/store moved to its own listener (--debug-addr {addr}), which is not listening: see the proxy's log\n")
            }
            (None, None) => {
                "/debug/store moved to its own listener, which is off: start runtime-proxy with --debug-addr 127.0.0.1:PORT\n".to_owned()
            }
        }
    }
}

/// The `/debug/store` document: `{"pod_sandboxes": [...], "containers": [...]}`, IDs sorted.
pub fn store_ids(store: &Store) -> serde_json::Value {
    let (mut pods, mut containers) = store.ids();
    pods.sort();
    containers.sort();
    serde_json::json!({ "pod_sandboxes": pods, "containers": containers })
}

/// Binds `endpoint`'s address and serves `GET /debug/store` until the task is dropped; logs
/// the bound address (`debug endpoint (/debug/store) listening on …`, useful with port 0). Off:
/// returns at once.
///
/// Errors: the address cannot be bound.
pub async fn serve(endpoint: Arc<DebugEndpoint>, store: Arc<Store>) -> std::io::Result<()> {
    let Some(addr) = endpoint.configured else { return Ok(()) };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let _ = endpoint.bound.set(bound);
    tracing::info!("debug endpoint (/debug/store) listening on {bound}");
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "debug endpoint accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let store = store.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let answer = match req.uri().path() {
                    "/debug/store" => (200, "application/json", format!("{}\n", store_ids(&store))),
                    _ => (404, "text/plain", "not found: try /debug/store\n".to_owned()),
                };
                let (status, content_type, body) = answer;
                let resp = Response::builder()
                    .status(status)
                    .header("content-type", content_type)
                    .body(Full::new(Bytes::from(body)))
                    .unwrap_or_default();
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}
