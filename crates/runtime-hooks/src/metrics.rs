//! runtime-hooks' admin endpoint (`--metrics-addr`, and the root-only `--admin-socket`; both
//! bounded as [`daemon_support::admin_http`] says): `GET /metrics` (Prometheus text format),
//! `GET /healthz` (200 `ok` while the process serves) and `GET /status` (JSON: an operator's
//! view, [`crate::status`]).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `runtime_hooks_rule_errors_total` | counter | `object` (`NodeSLO`, `NodeResourceTopology`, `Node`) | versions of the node's objects that did not parse (each distinct failure once); the last good version stayed in force |
//! | `runtime_hooks_rule_changes_total` | counter | `source` (`file`, `cluster`) | times the rules in force changed |
//! | `runtime_hooks_cluster_watch_errors_total` | counter | `object` (also `Pod`) | list/watch failures (API server unreachable, 401/403, 404), each retried |
//! | `runtime_hooks_cluster_synced` | gauge | `object` | 1 once the first list of that object is complete |
//! | `runtime_hooks_cluster_events_posted_total` | counter | | `RuleParseFailed` Events posted on the Node |

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use daemon_support::admin_http;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label: which of the node's objects.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabel {
    /// `NodeSLO`, `NodeResourceTopology`, `Node` or `Pod`.
    pub object: String,
}

/// Label: where a rule change came from.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    /// `file` or `cluster`.
    pub source: String,
}

/// The process's metrics (see the module table).
#[derive(Debug, Default)]
pub struct Metrics {
    /// `runtime_hooks_rule_errors_total`.
    pub rule_errors: Family<ObjectLabel, Counter>,
    /// `runtime_hooks_rule_changes_total`.
    pub rule_changes: Family<SourceLabel, Counter>,
    /// `runtime_hooks_cluster_watch_errors_total`.
    pub watch_errors: Family<ObjectLabel, Counter>,
    /// `runtime_hooks_cluster_synced`.
    pub synced: Family<ObjectLabel, Gauge>,
    /// `runtime_hooks_cluster_events_posted_total`.
    pub events_posted: Counter,
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// `object` label value.
pub fn object(name: &str) -> ObjectLabel {
    ObjectLabel { object: name.to_owned() }
}

/// The text exposition of [`metrics`].
pub fn encode() -> String {
    let m = metrics();
    let mut registry = Registry::default();
    registry.register("runtime_hooks_rule_errors", "Versions of the node's objects that did not parse", m.rule_errors.clone());
    registry.register("runtime_hooks_rule_changes", "Times the rules in force changed", m.rule_changes.clone());
    registry.register("runtime_hooks_cluster_watch_errors", "List/watch failures of the node's objects", m.watch_errors.clone());
    registry.register("runtime_hooks_cluster_synced", "1 once the first list of the object is complete", m.synced.clone());
    registry.register("runtime_hooks_cluster_events_posted", "RuleParseFailed Events posted on the Node", m.events_posted.clone());
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Binds `addr` (`--metrics-addr`, when given) and `socket` (`--admin-socket`, when on) and
/// serves `/metrics`, `/healthz` and `/status` (from `status`) on both until the process ends,
/// with the bounds of [`daemon_support::admin_http`]; logs each (`admin endpoint: …
/// addr=IP:PORT`, `admin socket: … socket=PATH`).
///
/// Errors, naming the flag: an address or the socket cannot be bound (in use, not local, the
/// directory not writable).
pub fn serve(addr: Option<SocketAddr>, socket: Option<&Path>, status: Arc<crate::status::StatusSource>) -> anyhow::Result<()> {
    let tcp = addr.map(|addr| admin_http::bind_tcp("--metrics-addr", addr)).transpose()?;
    let unix = socket.map(|path| admin_http::bind_socket("--admin-socket", path)).transpose()?;
    let handler = move |req: admin_http::AdminRequest| {
        let answer = match req.uri().path() {
            "/metrics" => admin_http::reply(200, "text/plain; version=0.0.4; charset=utf-8", encode()),
            "/healthz" => admin_http::reply(200, "text/plain", "ok\n"),
            "/status" => admin_http::reply(200, "application/json", status.document().to_string()),
            _ => admin_http::reply(404, "text/plain", "not found: try /metrics, /healthz or /status\n"),
        };
        async move { answer }
    };
    if let Some(l) = tcp {
        tracing::info!(addr = %l.local_addr()?, "admin endpoint: /metrics, /healthz, /status");
        tokio::spawn(admin_http::serve(admin_http::Listener::Tcp(l), "admin endpoint", handler.clone()));
    }
    if let Some(s) = unix {
        let listener = admin_http::Listener::Unix(s);
        tracing::info!(socket = %listener.describe(), "admin socket: /metrics, /healthz, /status");
        tokio::spawn(admin_http::serve(listener, "admin socket", handler));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_names() {
        metrics().rule_errors.get_or_create(&object("NodeSLO")).inc();
        metrics().synced.get_or_create(&object("Node")).set(1);
        let text = encode();
        assert!(text.contains("runtime_hooks_rule_errors_total{object=\"NodeSLO\"}"), "{text}");
        assert!(text.contains("runtime_hooks_cluster_synced{object=\"Node\"} 1"), "{text}");
    }
}
