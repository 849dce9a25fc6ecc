//! The debug endpoint (`--debug-addr`, off by default): `GET /debug/store`, the sandbox and
//! container IDs the store holds (JSON, sorted).
//!
//! It has a listener of its own, apart from the admin endpoint (`--metrics-addr`), because pod
//! IDs are not for every network that may scrape metrics: an operator turns it on where only
//! they can reach it (loopback), when they need it. The admin endpoint answers `/debug/store`
//! with 404 and a line saying where it moved ([`DebugEndpoint::moved`]).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use daemon_support::admin_http;
use hyper::Request;

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

/// Binds `endpoint`'s address (`--debug-addr`) and records where it listens; `None` when off.
/// Must be called within a tokio runtime.
///
/// Errors: the address cannot be bound, naming `--debug-addr` and the address
/// ([`admin_http::bind_tcp`]).
pub fn bind(endpoint: &DebugEndpoint) -> anyhow::Result<Option<admin_http::Listener>> {
    let Some(addr) = endpoint.configured else { return Ok(None) };
    let listener = admin_http::bind_tcp("--debug-addr", addr)?;
    if let Ok(bound) = listener.local_addr() {
        let _ = endpoint.bound.set(bound);
    }
    Ok(Some(admin_http::Listener::Tcp(listener)))
}

/// Serves `GET /debug/store` on `listener` (from [`bind`]) until the task is dropped, with the
/// bounds of [`admin_http`]; logs the bound address (`debug endpoint (/debug/store) listening
/// on …`, useful with port 0).
pub async fn serve(listener: admin_http::Listener, store: Arc<Store>) {
    tracing::info!("debug endpoint (/debug/store) listening on {}", listener.describe());
    admin_http::serve(listener, "debug endpoint", move |req: Request<hyper::body::Incoming>| {
        let answer = match req.uri().path() {
            "/debug/store" => admin_http::reply(200, "application/json", format!("{}\n", store_ids(&store))),
            _ => admin_http::reply(404, "text/plain", "not found: try /debug/store\n"),
        };
        async move { answer }
    })
    .await
}
