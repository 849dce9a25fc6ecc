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
//! | `runtime_hooks_build_info` | gauge | `version`, `revision` | always 1: the version and git revision `--version` prints |
//!
//! The label sets known at start exist at 0 before their first event, so that a dashboard shows
//! 0 rather than "No data" and `increase()` sees the first event (Prometheus' advice): per object
//! followed in the cluster, `cluster_watch_errors_total` and `cluster_synced` (and
//! `rule_errors_total` for the three whose content is rules), from when the watches start
//! ([`watching`]); `rule_changes_total` for each source in use: `file` with `--rules`, `cluster`
//! when following the cluster ([`rule_source`]).

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

/// Label: the build, for `runtime_hooks_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

/// The version `runtime_hooks_build_info` carries: the package's, as `--version` prints it.
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git revision `runtime_hooks_build_info` carries, as `--version` prints it (`27cbb9f`,
/// `27cbb9f-dirty`, `unknown`; set by `crates/git_revision.rs`).
pub const BUILD_REVISION: &str = env!("GIT_REVISION");

/// Creates at 0 the series of the object `kind` (`NodeSLO`, `NodeResourceTopology`, `Node`,
/// `Pod`) as its watch starts: `runtime_hooks_cluster_watch_errors_total`, and
/// `runtime_hooks_cluster_synced` (0 until the first list completes; a value already set stays);
/// `runtime_hooks_rule_errors_total` too when the object's content is rules (`rules`).
pub fn watching(kind: &str, rules: bool) {
    let m = metrics();
    let label = object(kind);
    drop(m.watch_errors.get_or_create(&label));
    drop(m.synced.get_or_create(&label));
    if rules {
        drop(m.rule_errors.get_or_create(&label));
    }
}

/// Creates at 0 `runtime_hooks_rule_changes_total{source}` for a rule source in use (`file`,
/// `cluster`: the names of [`crate::rules`]' `RuleSource`).
pub fn rule_source(source: &str) {
    drop(metrics().rule_changes.get_or_create(&SourceLabel { source: source.to_owned() }));
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
    registry.register(
        "runtime_hooks_rule_errors",
        "Versions of the node's objects that did not parse",
        m.rule_errors.clone(),
    );
    registry.register("runtime_hooks_rule_changes", "Times the rules in force changed", m.rule_changes.clone());
    registry.register(
        "runtime_hooks_cluster_watch_errors",
        "List/watch failures of the node's objects",
        m.watch_errors.clone(),
    );
    registry.register(
        "runtime_hooks_cluster_synced",
        "1 once the first list of the object is complete",
        m.synced.clone(),
    );
    registry.register(
        "runtime_hooks_cluster_events_posted",
        "RuleParseFailed Events posted on the Node",
        m.events_posted.clone(),
    );
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info.get_or_create(&BuildLabels { version: BUILD_VERSION, revision: BUILD_REVISION }).set(1);
    registry.register(
        "runtime_hooks_build_info",
        "Always 1: the version and git revision of this runtime-hooks (as --version prints them)",
        build_info,
    );
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

    /// The build info is there from the start; a watched object's and a rule source's series
    /// exist at 0 before their first event, and a synced object stays synced. (The metrics are
    /// the process's, which other tests' cluster watches move: these label values are this
    /// test's own.)
    #[test]
    fn known_label_sets_exist_at_zero() {
        let text = encode();
        let build = format!("runtime_hooks_build_info{{version=\"{BUILD_VERSION}\",revision=\"{BUILD_REVISION}\"}} 1");
        assert!(text.contains(&build), "{build} missing:\n{text}");
        watching("TestRules", true);
        watching("TestPods", false);
        rule_source("test");
        metrics().synced.get_or_create(&object("TestPods")).set(1);
        watching("TestPods", false);
        let text = encode();
        for want in [
            "runtime_hooks_rule_errors_total{object=\"TestRules\"} 0",
            "runtime_hooks_cluster_watch_errors_total{object=\"TestRules\"} 0",
            "runtime_hooks_cluster_synced{object=\"TestRules\"} 0",
            "runtime_hooks_cluster_watch_errors_total{object=\"TestPods\"} 0",
            "runtime_hooks_cluster_synced{object=\"TestPods\"} 1",
            "runtime_hooks_rule_changes_total{source=\"test\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        assert!(!text.contains("runtime_hooks_rule_errors_total{object=\"TestPods\"}"), "not rules:\n{text}");
    }
}
