//! The hook chain's rules beyond the merge: field ownership (conflicts between hook servers) and
//! required hook servers. The dispatcher ([`super::dispatch::Dispatcher::run`])
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

use crate::hooks::message::HookMessage;
pub use crate::hooks::registry::ConflictPolicy;
use crate::hooks::registry::Snapshot;
use crate::metrics::Metrics;

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

/// Most hook servers one pod may require ([`REQUIRED_ANNOTATION`]) or the node may
/// (`--required-hook-servers`): a list naming more is refused whole (the pod's pre stages fail
/// with `FAILED_PRECONDITION`), never cut short, so that no name in it is silently dropped. A node
/// runs a handful of hook servers; the bound keeps what a pod author writes (up to Kubernetes'
/// 256 KiB of annotations) from costing more than one pass over it.
pub const MAX_REQUIRED_SERVERS: usize = 64;

/// How many names a refusal message lists before it counts the rest (`… and 61 more`): with
/// [`NAME_CHARS_SHOWN`] characters of each, a refusal stays under ~1 KiB, far below gRPC's 8 KiB
/// of metadata and NRI's 4 MiB message.
pub const NAMES_SHOWN: usize = 3;
/// How many characters of a name a message shows ([`shown`]).
pub const NAME_CHARS_SHOWN: usize = 64;

/// A list naming more than [`MAX_REQUIRED_SERVERS`] distinct hook servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TooManyNames {
    /// The distinct names counted before giving up (one more than the bound).
    pub at_least: usize,
}

/// The registration names of a comma-separated list: trimmed, empty entries dropped, each once,
/// in the order first written. One pass over `list` (a set remembers the names seen).
///
/// Errors: [`TooManyNames`] when it names more than [`MAX_REQUIRED_SERVERS`] distinct servers.
pub fn parse_names(list: &str) -> Result<Vec<String>, TooManyNames> {
    let mut seen = std::collections::HashSet::new();
    let mut names: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if seen.insert(name) {
            if names.len() == MAX_REQUIRED_SERVERS {
                return Err(TooManyNames { at_least: MAX_REQUIRED_SERVERS + 1 });
            }
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// `name` as a message shows it: control characters escaped (a name comes from a pod author), and
/// at most [`NAME_CHARS_SHOWN`] characters of the escaped text (an escape such as `\u{1d}` counts
/// whole and is never cut), then `…` if anything was left out.
pub fn shown(name: &str) -> String {
    let mut out = String::new();
    let mut count = 0;
    for c in name.chars() {
        let escaped = c.escape_debug();
        let len = escaped.len();
        if count + len > NAME_CHARS_SHOWN {
            out.push('…');
            break;
        }
        out.extend(escaped);
        count += len;
    }
    out
}

/// `items` joined with `, `, at most [`NAMES_SHOWN`] of them, the rest counted (`a, b, c and 61
/// more`).
pub fn list_shown(items: &[String]) -> String {
    let mut out = items.iter().take(NAMES_SHOWN).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > NAMES_SHOWN {
        out.push_str(&format!(" and {} more", items.len() - NAMES_SHOWN));
    }
    out
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
    /// The pod's [`REQUIRED_ANNOTATION`] names more than [`MAX_REQUIRED_SERVERS`] servers: its
    /// pre stages are refused (see [`Required::refusal`]); `servers` holds the node's only.
    pub too_many: Option<TooManyNames>,
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
        let mut too_many = None;
        match annotations.get(REQUIRED_ANNOTATION).map(|list| parse_names(list)) {
            None => {}
            Some(Ok(names)) => {
                for name in names {
                    if !node.contains(&name) {
                        servers.push((name, Source::Pod));
                    }
                }
            }
            Some(Err(e)) => too_many = Some(e),
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
        Required { servers, tolerate_missing, too_many }
    }

    /// Whether the call must go through the requirement checks (some server is required, or the
    /// pod's list is refused).
    pub fn any(&self) -> bool {
        !self.servers.is_empty() || self.too_many.is_some()
    }

    /// Why the pod's requirement cannot be honoured whatever is registered: its list names more
    /// than [`MAX_REQUIRED_SERVERS`] servers. The message counts, it does not list.
    pub fn refusal(&self) -> Option<String> {
        self.too_many.map(|e| {
            format!(
                "{REQUIRED_ANNOTATION} names at least {} hook servers, more than {MAX_REQUIRED_SERVERS}",
                e.at_least
            )
        })
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
        assert_eq!(parse_names(" a.json, b.json,,a.json ,").unwrap(), ["a.json", "b.json"]);
        assert!(parse_names("").unwrap().is_empty());
        assert!(parse_names(" , ").unwrap().is_empty());
        assert!(parse_tolerate("true") && parse_tolerate(" True ") && !parse_tolerate("yes") && !parse_tolerate(""));
    }

    #[test]
    fn a_list_is_bounded_and_read_in_one_pass() {
        let exactly: Vec<String> = (0..MAX_REQUIRED_SERVERS).map(|i| format!("s{i}")).collect();
        assert_eq!(parse_names(&exactly.join(",")).unwrap(), exactly);
        // Repeats do not count against the bound.
        let repeated = format!("{},{}", exactly.join(","), exactly.join(","));
        assert_eq!(parse_names(&repeated).unwrap().len(), MAX_REQUIRED_SERVERS);
        let over = format!("{},one-more", exactly.join(","));
        assert_eq!(parse_names(&over), Err(TooManyNames { at_least: MAX_REQUIRED_SERVERS + 1 }));
        // 65,000 names (260 KB, under Kubernetes' 256 KiB budget for a pod's annotations): one
        // pass that stops at the bound, not 65,000 × 65,000 comparisons.
        let huge: String = (0..65_000).map(|i| format!("{i:x}")).collect::<Vec<_>>().join(",");
        assert!(parse_names(&huge).is_err());
        let m = Metrics::new();
        let r = Required::of_pod(
            &["node.json".into()],
            &annotations(&[(REQUIRED_ANNOTATION, &huge)]),
            None,
            &[],
            "x",
            &m,
            true,
        );
        assert_eq!(r.servers, [("node.json".to_owned(), Source::Node)], "the node's requirement stays");
        let refusal = r.refusal().unwrap();
        assert!(refusal.contains("names at least 65 hook servers, more than 64") && refusal.len() < 200, "{refusal}");
    }

    #[test]
    fn messages_show_a_few_names_escaped_and_count_the_rest() {
        assert_eq!(shown("a\u{1b}[2J\rb"), "a\\u{1b}[2J\\rb");
        assert_eq!(shown(&"x".repeat(100)), format!("{}…", "x".repeat(64)));
        assert_eq!(shown(&"x".repeat(64)), "x".repeat(64));
        // Escapes count whole: a name of control characters shows no more than 64 characters.
        assert_eq!(shown(&"\u{1d}".repeat(20)), format!("{}…", "\\u{1d}".repeat(10)));
        let items: Vec<String> = (0..10).map(|i| i.to_string()).collect();
        assert_eq!(list_shown(&items), "0, 1, 2 and 7 more");
        assert_eq!(list_shown(&items[..2]), "0, 1");
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
        assert!(
            !Required::of_pod(&[], &no, Some(&meta("kube-system")), &ns, "RunPodSandbox", &m, true).tolerate_missing
        );
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
