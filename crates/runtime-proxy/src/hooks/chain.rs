//! The hook chain's rules beyond the merge: field ownership (conflicts between hook servers) and
//! required hook servers (issue 24). The dispatcher ([`super::dispatch::Dispatcher::run`])
//! applies them; the rules themselves are here and in [`hook_api::owners`].
//!
//! # Field ownership
//!
//! Within one call's pre stage, the first hook server whose answer changes a field owns it; a
//! later server changing it to another value conflicts ([`hook_api::owners`] says what a field
//! is and what counts as a change: an echo, the same value or an empty "no change" never does).
//! The policy of the later server — its registration's `conflict-policy`, else
//! `--hook-conflict-policy` — decides: [`ConflictPolicy::Warn`] keeps the later value (as without
//! ownership), logs one line per conflict and counts `runtime_proxy_hook_conflicts_total{stage,
//! field}`; [`ConflictPolicy::Fail`] refuses the call with `FAILED_PRECONDITION` before the
//! runtime sees it. Post stages' answers are not applied, so they have no owners.
//!
//! # Required hook servers
//!
//! `--required-hook-servers a,b` (every pod) and the pod annotation [`REQUIRED_ANNOTATION`]
//! (`"a,b"`) name hook servers by registration name (the file name, as logs and metrics show
//! it). For such a pod, at a pre stage: a required server with no registration fails the call
//! with `FAILED_PRECONDITION`; a required server's failed or timed-out call at a stage it
//! registered for fails the call with that failure's code, whatever its failure policy. A
//! required server not registered for the stage is fine there. [`TOLERATE_ANNOTATION`]
//! `"true"` lets a pod go on without required servers that are not registered (never past a
//! registered server's failure) — honoured only in the namespaces that may use the skip label
//! (`--runtime-hook-server-namespaces`), elsewhere ignored with a WARN and counted in
//! `runtime_proxy_tolerate_missing_ignored_total`, since nothing a pod author writes may turn
//! the node's policy off. The skip label comes first: a skipped pod calls no server. At post
//! stages (the runtime has already done the call) a missing or failing required server is
//! logged and counted, no more.
//!
//! The annotations read are the pod's as it was created: the dispatcher keeps hook servers
//! from changing these two keys in a PreRunPodSandbox answer, so that a server cannot
//! un-require itself (containers' stages read the pod's annotations from the store).

use std::collections::BTreeMap;

use hook_api::owners::{self, FieldChange};
use hook_api::v1alpha1::{ContainerResourceHookRequest, PodSandboxHookRequest, PodSandboxMetadata};

use crate::admin::metrics::Metrics;
use crate::hooks::dispatch::HookMessage;
pub use crate::hooks::registry::ConflictPolicy;
use crate::hooks::registry::Snapshot;

/// What the chain's rules read of a hook request, beyond [`HookMessage`].
pub trait ChainMessage: HookMessage {
    /// What `answer` changes in the request, field by field ([`hook_api::owners`]).
    fn changes(&self, answer: &Self::Answer) -> Vec<FieldChange>;
    /// The pod's annotations (where [`REQUIRED_ANNOTATION`] is read) and metadata.
    fn pod(&self) -> (&BTreeMap<String, String>, Option<&PodSandboxMetadata>);
    /// The pod annotations an answer may change (pod-level requests), to put [`Kept`] values
    /// back into; `None` when answers cannot change them (container-level requests).
    fn answer_annotations(&mut self) -> Option<&mut BTreeMap<String, String>>;
}

impl ChainMessage for PodSandboxHookRequest {
    fn changes(&self, answer: &Self::Answer) -> Vec<FieldChange> {
        owners::pod_changes(self, answer)
    }
    fn pod(&self) -> (&BTreeMap<String, String>, Option<&PodSandboxMetadata>) {
        (&self.annotations, self.pod_meta.as_ref())
    }
    fn answer_annotations(&mut self) -> Option<&mut BTreeMap<String, String>> {
        Some(&mut self.annotations)
    }
}

impl ChainMessage for ContainerResourceHookRequest {
    fn changes(&self, answer: &Self::Answer) -> Vec<FieldChange> {
        owners::container_changes(self, answer)
    }
    fn pod(&self) -> (&BTreeMap<String, String>, Option<&PodSandboxMetadata>) {
        (&self.pod_annotations, self.pod_meta.as_ref())
    }
    fn answer_annotations(&mut self) -> Option<&mut BTreeMap<String, String>> {
        None
    }
}

/// The node's chain settings: `--hook-conflict-policy` and `--required-hook-servers`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeChain {
    /// The conflict policy of servers whose registration sets none.
    pub conflict_policy: ConflictPolicy,
    /// The hook servers every pod requires (registration names).
    pub required: Vec<String>,
}

/// The pod annotation naming the hook servers a pod requires: registration names, comma
/// separated (`"koordlet.json,gpu.json"`).
pub const REQUIRED_ANNOTATION: &str = "runtimeproxy.koordinator.sh/required-hook-servers";

/// The pod annotation that, set to `"true"` in a namespace allowed to use the skip label, lets
/// the pod go on when a required server is not registered.
pub const TOLERATE_ANNOTATION: &str = "runtimeproxy.koordinator.sh/tolerate-missing-hook-servers";

/// The registration names of a comma-separated list: trimmed, empty entries dropped, each once,
/// in the order first written.
pub fn parse_names(list: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

/// Whether [`TOLERATE_ANNOTATION`]'s value means yes: `true`, any case, spaces around ignored.
pub fn parse_tolerate(value: &str) -> bool {
    value.trim().eq_ignore_ascii_case("true")
}

/// Where a server's requirement comes from (for messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--required-hook-servers`.
    Node,
    /// The pod's [`REQUIRED_ANNOTATION`].
    Pod,
}

impl Source {
    /// How messages name the source.
    pub const fn describe(self) -> &'static str {
        match self {
            Source::Node => "--required-hook-servers",
            Source::Pod => REQUIRED_ANNOTATION,
        }
    }
}

/// The hook servers one call requires, and whether the pod may go on without those not
/// registered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Required {
    /// Required servers by registration name, with where each requirement comes from (the node
    /// flag first).
    pub servers: Vec<(String, Source)>,
    /// The pod's [`TOLERATE_ANNOTATION`] is `"true"` and honoured.
    pub tolerate_missing: bool,
}

impl Required {
    /// Nothing required (a call without a pod).
    pub fn none() -> Self {
        Self::default()
    }

    /// The requirement of a pod with `annotations` (as created) and metadata `pod`, on a node
    /// requiring `node`; `namespaces` may use [`TOLERATE_ANNOTATION`] (the skip label's). An
    /// ignored tolerate annotation is logged (WARN, naming the pod, its namespace and `call`)
    /// and counted in `metrics`, when `report` (once per call: at its pre stage).
    pub fn of_pod(
        node: &[String],
        annotations: &BTreeMap<String, String>,
        pod: Option<&PodSandboxMetadata>,
        namespaces: &[String],
        call: &str,
        metrics: &Metrics,
        report: bool,
    ) -> Self {
        let mut servers: Vec<(String, Source)> = node.iter().map(|n| (n.clone(), Source::Node)).collect();
        if let Some(list) = annotations.get(REQUIRED_ANNOTATION) {
            for name in parse_names(list) {
                if !servers.iter().any(|(n, _)| *n == name) {
                    servers.push((name, Source::Pod));
                }
            }
        }
        let mut tolerate_missing = false;
        if annotations.get(TOLERATE_ANNOTATION).is_some_and(|v| parse_tolerate(v)) {
            let (name, namespace) = pod.map_or(("", ""), |m| (m.name.as_str(), m.namespace.as_str()));
            if namespaces.iter().any(|n| n == namespace) {
                tolerate_missing = true;
            } else if report && !servers.is_empty() {
                metrics.tolerate_missing_ignored();
                tracing::warn!(
                    pod = name,
                    namespace,
                    call,
                    annotation = TOLERATE_ANNOTATION,
                    "tolerate-missing annotation ignored: the pod's namespace is not in --runtime-hook-server-namespaces; required hook servers must be registered"
                );
            }
        }
        Required { servers, tolerate_missing }
    }

    /// Whether `server` (a registration name) is required, and by what.
    pub fn source(&self, server: &str) -> Option<Source> {
        self.servers.iter().find(|(n, _)| n == server).map(|(_, s)| *s)
    }

    /// The required servers `snapshot` has no registration for, with their sources.
    pub fn missing<'a>(&'a self, snapshot: &Snapshot) -> Vec<&'a (String, Source)> {
        self.servers.iter().filter(|(n, _)| !snapshot.servers().iter().any(|s| s.name == *n)).collect()
    }
}

/// The annotation values a hook server may not change in a pod-level hook request (see the
/// module doc): the two keys' values before the chain, to put back after each answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Kept {
    values: [Option<String>; 2],
}

impl Kept {
    const KEYS: [&'static str; 2] = [REQUIRED_ANNOTATION, TOLERATE_ANNOTATION];

    /// The values of the two keys in `annotations`.
    pub fn of(annotations: &BTreeMap<String, String>) -> Self {
        Kept { values: Self::KEYS.map(|k| annotations.get(k).cloned()) }
    }

    /// Puts the kept values back into `annotations` (merge never removes a key, so only a changed
    /// or added value is undone). Returns the keys a hook answer had changed.
    pub fn restore(&self, annotations: &mut BTreeMap<String, String>) -> Vec<&'static str> {
        let mut undone = Vec::new();
        for (key, value) in Self::KEYS.iter().zip(&self.values) {
            if annotations.get(*key) == value.as_ref() {
                continue;
            }
            undone.push(*key);
            match value {
                Some(v) => annotations.insert((*key).to_owned(), v.clone()),
                None => annotations.remove(*key),
            };
        }
        undone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn meta(namespace: &str) -> PodSandboxMetadata {
        PodSandboxMetadata { name: "p".into(), namespace: namespace.into(), ..Default::default() }
    }

    #[test]
    fn names_are_trimmed_deduplicated_and_empty_ones_dropped() {
        assert_eq!(parse_names(" a.json, b.json,,a.json ,"), ["a.json", "b.json"]);
        assert!(parse_names("").is_empty());
        assert!(parse_names(" , ").is_empty());
        assert!(parse_tolerate("true") && parse_tolerate(" True ") && !parse_tolerate("yes") && !parse_tolerate(""));
    }

    #[test]
    fn the_node_flag_and_the_annotation_add_up() {
        let m = Metrics::new();
        let node = vec!["koordlet.json".to_owned()];
        let a = annotations(&[(REQUIRED_ANNOTATION, "gpu.json,koordlet.json")]);
        let r = Required::of_pod(&node, &a, Some(&meta("default")), &[], "RunPodSandbox", &m, true);
        assert_eq!(r.servers, [("koordlet.json".to_owned(), Source::Node), ("gpu.json".to_owned(), Source::Pod)]);
        assert_eq!(r.source("gpu.json"), Some(Source::Pod));
        assert_eq!(r.source("other.json"), None);
        assert!(!r.tolerate_missing);
        assert!(Required::of_pod(&[], &Default::default(), None, &[], "x", &m, true).servers.is_empty());
    }

    #[test]
    fn tolerate_missing_is_honoured_only_in_the_allowed_namespaces() {
        let m = Metrics::new();
        let ns = vec!["kube-system".to_owned()];
        let a = annotations(&[(REQUIRED_ANNOTATION, "gpu.json"), (TOLERATE_ANNOTATION, "true")]);
        assert!(Required::of_pod(&[], &a, Some(&meta("kube-system")), &ns, "RunPodSandbox", &m, true).tolerate_missing);
        assert!(!Required::of_pod(&[], &a, Some(&meta("default")), &ns, "RunPodSandbox", &m, true).tolerate_missing);
        assert!(!Required::of_pod(&[], &a, None, &ns, "RunPodSandbox", &m, true).tolerate_missing);
        let no = annotations(&[(REQUIRED_ANNOTATION, "gpu.json"), (TOLERATE_ANNOTATION, "false")]);
        assert!(!Required::of_pod(&[], &no, Some(&meta("kube-system")), &ns, "RunPodSandbox", &m, true).tolerate_missing);
        let text = m.render_for_tests();
        assert!(text.contains("runtime_proxy_tolerate_missing_ignored_total 2"), "{text}");
    }

    #[test]
    fn kept_annotations_are_put_back() {
        let before = annotations(&[(REQUIRED_ANNOTATION, "gpu.json"), ("other", "1")]);
        let kept = Kept::of(&before);
        let mut after = annotations(&[(REQUIRED_ANNOTATION, ""), (TOLERATE_ANNOTATION, "true"), ("other", "2")]);
        assert_eq!(kept.restore(&mut after), [REQUIRED_ANNOTATION, TOLERATE_ANNOTATION]);
        assert_eq!(after, annotations(&[(REQUIRED_ANNOTATION, "gpu.json"), ("other", "2")]));
        assert!(kept.restore(&mut after).is_empty());
    }
}
