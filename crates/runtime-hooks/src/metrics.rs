//! runtime-hooks' metrics: the process-wide families the rule sources count into, and their
//! Prometheus text format ([`encode`], served as `GET /metrics` by [`crate::status::serve`]).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `runtime_hooks_rule_errors_total` | counter | `object` (`NodeSLO`, `NodeResourceTopology`, `Node`) | versions of the node's objects that did not parse (each distinct failure once); the last good version stayed in force |
//! | `runtime_hooks_rule_changes_total` | counter | `source` (`file`, `cluster`) | times the rules in force changed |
//! | `runtime_hooks_cluster_watch_errors_total` | counter | `object` (also `Pod`) | list/watch failures (API server unreachable, 401/403, 404), each retried |
//! | `runtime_hooks_cluster_synced` | gauge | `object` | 1 once the first list of that object is complete |
//! | `runtime_hooks_cluster_events_posted_total` | counter | | `RuleParseFailed` Events posted on the Node |

use std::sync::OnceLock;

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
