//! Rules from the cluster: the node's NodeSLO, NodeResourceTopology and Node, watched through
//! the Kubernetes API as koordlet's statesinformer watches them, fed into the [`RulesStore`].
//!
//! # Watches
//!
//! Each object is followed by a `kube::runtime::watcher` on its collection with the field
//! selector `metadata.name=<node>` (list, then watch from the list's resourceVersion, with
//! bookmarks; a watch that expires — HTTP 200 with an `ERROR` 410 `Expired` event — or a
//! restarted API server leads to a new list, and the rules in force stay until that list is
//! complete). The node's pods are followed the same way (`spec.nodeName=<node>`, all
//! namespaces) into a [`PodIndex`].
//!
//! # Events and errors
//!
//! | event | effect |
//! |---|---|
//! | list complete, object found / `ADDED` / `MODIFIED` | parsed; the rules recomputed and, if they changed, re-applied to running pods |
//! | list complete without the object / `DELETED` | that input back to koordlet's defaults |
//! | object does not parse | WARN naming object, field and value; a Warning Event `RuleParseFailed` on the Node (as koordlet records); `runtime_hooks_rule_errors_total{object}` counted; the last good version stays |
//! | API server unreachable, 5xx | WARN once per outage, retried with backoff (up to ~30 s apart); rules unchanged (file or defaults until the first answer) |
//! | 401 / 403 | ERROR naming the identity's missing permission (verb, resource, group), retried with backoff |
//!
//! No hook call waits on the API server: hooks read the [`RulesStore`]'s snapshot.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event as KubeEvent, EventSource, Node, ObjectReference, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind, ObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use kube::{Client, Resource, ResourceExt as _};
use serde::de::DeserializeOwned;

use crate::metrics::{metrics, object};
use crate::rules::{node, node_slo, topology, FieldError, RuleSource, RulesStore};

/// Where the API server is and who we are: `--kubeconfig`, else the in-cluster service account.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--node-name` (default `$NODE_NAME`).
    pub node_name: String,
}

/// A client for `config`: from the kubeconfig file when given, else from the in-cluster
/// service account when running in a pod (`KUBERNETES_SERVICE_HOST` set); `Ok(None)` when
/// neither (the rules file is then the only source).
///
/// Errors: the kubeconfig cannot be read or is invalid; the service account's token or CA
/// cannot be read.
pub async fn client(config: &ClusterConfig) -> anyhow::Result<Option<Client>> {
    use anyhow::Context as _;
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            kube::Config::incluster().context("in-cluster configuration (service account)")?
        }
        None => return Ok(None),
    };
    Ok(Some(Client::try_from(kube_config).map_err(|e| anyhow::anyhow!("Kubernetes client: {e}"))?))
}

/// The NodeSLO resource (`slo.koordinator.sh/v1alpha1`, cluster-scoped).
pub fn node_slo_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("slo.koordinator.sh", "v1alpha1", "NodeSLO"), "nodeslos")
}

/// The NodeResourceTopology resource (`topology.node.k8s.io/v1alpha1`, cluster-scoped).
pub fn topology_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.node.k8s.io", "v1alpha1", "NodeResourceTopology"),
        "noderesourcetopologies",
    )
}

/// What the rule source has seen, for logs, tests and `runtime-hooks status`.
#[derive(Debug, Default)]
pub struct ClusterStatus {
    /// Objects that did not parse (each distinct failure once).
    pub rule_errors: AtomicU64,
    /// Events posted to the Node.
    pub events_posted: AtomicU64,
    /// Per kind followed (`NodeSLO`, `NodeResourceTopology`, `Node`, `Pod`): synced, errors.
    objects: Mutex<BTreeMap<&'static str, ObjectStatus>>,
}

/// How the watch of one kind of the node's objects stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectStatus {
    /// A first list is complete (the object's version, or its absence, is in force).
    pub synced: bool,
    /// The current list/watch failure (cleared when the watch delivers again), and when it
    /// happened.
    pub watch_error: Option<(std::time::SystemTime, String)>,
    /// That failure is a 404: the API server does not serve the kind (its CRD is not
    /// installed), so that input keeps its defaults.
    pub not_served: bool,
    /// Why the latest version of the object does not parse (the last good one stays in
    /// force); cleared when a version parses.
    pub parse_error: Option<(std::time::SystemTime, String)>,
}

impl ClusterStatus {
    /// Each kind followed, with how its watch stands.
    pub fn objects(&self) -> BTreeMap<&'static str, ObjectStatus> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes what is known of `kind` with `f`.
    fn object(&self, kind: &'static str, f: impl FnOnce(&mut ObjectStatus)) {
        f(self.objects.lock().unwrap_or_else(|e| e.into_inner()).entry(kind).or_default());
    }

    /// `kind`'s watch failed with `text`.
    fn watch_failed(&self, kind: &'static str, e: &watcher::Error, text: &str) {
        let not_served = api_status(e).is_some_and(|s| s.code == 404);
        self.object(kind, |o| {
            o.watch_error = Some((std::time::SystemTime::now(), text.to_owned()));
            o.not_served = not_served;
        });
    }

    /// `kind`'s watch delivered (`synced`: a list is complete).
    fn watch_delivered(&self, kind: &'static str, synced: bool) {
        self.object(kind, |o| {
            o.watch_error = None;
            o.not_served = false;
            o.synced |= synced;
        });
    }
}

/// The node's pods as the API server has them, by UID: labels and annotations (e.g. a
/// `scheduling.koordinator.sh/resource-status` the scheduler wrote).
#[derive(Debug, Default)]
pub struct PodIndex {
    pods: Mutex<BTreeMap<String, Arc<Pod>>>,
}

impl PodIndex {
    /// The pod with this UID, if the API server has it on this node.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).get(uid).cloned()
    }

    /// Number of pods known.
    pub fn len(&self) -> usize {
        self.pods.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// No pods known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The running rule source.
#[derive(Clone, Debug)]
pub struct ClusterSource {
    /// Counters.
    pub status: Arc<ClusterStatus>,
    /// The node's pods.
    pub pods: Arc<PodIndex>,
}

/// Starts the watches for `node` on `client`, feeding `store`; they run until the process ends.
pub fn spawn(client: Client, node: String, store: Arc<RulesStore>) -> ClusterSource {
    let source = ClusterSource { status: Arc::default(), pods: Arc::default() };
    let reporter = Reporter { client: client.clone(), node: node.clone(), status: source.status.clone() };
    let by_name = watcher::Config::default().fields(&format!("metadata.name={node}"));
    // The objects followed, known from here: their series exist (at 0) before their first event.
    for kind in ["NodeSLO", "NodeResourceTopology", "Node"] {
        crate::metrics::watching(kind, true);
    }
    crate::metrics::watching("Pod", false);
    crate::metrics::rule_source(RuleSource::Cluster.as_str());

    let api = Api::<DynamicObject>::all_with(client.clone(), &node_slo_resource());
    let (s, r) = (store.clone(), reporter.clone());
    tokio::spawn(follow_one(api, by_name.clone(), "NodeSLO", r, move |obj: Option<&DynamicObject>| {
        let parsed = match obj {
            None => None,
            Some(o) => Some(node_slo::parse(o.data.get("spec").unwrap_or(&serde_json::Value::Null))?),
        };
        s.set_cluster_slo(parsed);
        Ok(())
    }));

    let api = Api::<DynamicObject>::all_with(client.clone(), &topology_resource());
    let (s, r) = (store.clone(), reporter.clone());
    tokio::spawn(follow_one(api, by_name.clone(), "NodeResourceTopology", r, move |obj: Option<&DynamicObject>| {
        let parsed = match obj {
            None => None,
            Some(o) => Some(topology::parse(&o.metadata.annotations.clone().unwrap_or_default())?),
        };
        s.set_cluster_topology(parsed);
        Ok(())
    }));

    let api = Api::<Node>::all(client.clone());
    let (s, r) = (store, reporter.clone());
    tokio::spawn(follow_one(api, by_name, "Node", r, move |obj: Option<&Node>| {
        let parsed = match obj {
            None => None,
            Some(o) => Some(node::parse(&o.metadata.annotations.clone().unwrap_or_default())?),
        };
        s.set_cluster_node(parsed);
        Ok(())
    }));

    let api = Api::<Pod>::all(client);
    let on_node = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    tokio::spawn(follow_pods(api, on_node, source.pods.clone(), reporter));
    source
}

/// Posts Events on the Node and counts failures.
#[derive(Clone)]
struct Reporter {
    client: Client,
    node: String,
    status: Arc<ClusterStatus>,
}

impl Reporter {
    /// A Warning Event on the Node, reason `RuleParseFailed`, as koordlet records a bad rule
    /// (shape of a core/v1 Event; `test-support/fixtures/k8s-wire/20-create-event.txt`). A failure to post
    /// is logged, nothing more.
    async fn rule_parse_failed(&self, message: String) {
        let event = KubeEvent {
            metadata: ObjectMeta { generate_name: Some(format!("{}.", self.node)), ..Default::default() },
            involved_object: ObjectReference {
                kind: Some("Node".into()),
                name: Some(self.node.clone()),
                uid: Some(self.node.clone()),
                ..Default::default()
            },
            reason: Some("RuleParseFailed".into()),
            message: Some(message),
            type_: Some("Warning".into()),
            source: Some(EventSource { component: Some("runtime-hooks".into()), host: Some(self.node.clone()) }),
            reporting_component: Some("runtime-hooks".into()),
            reporting_instance: Some(self.node.clone()),
            ..Default::default()
        };
        match Api::<KubeEvent>::namespaced(self.client.clone(), "default").create(&PostParams::default(), &event).await
        {
            Ok(_) => {
                self.status.events_posted.fetch_add(1, Ordering::Relaxed);
                metrics().events_posted.inc();
            }
            Err(e) => {
                tracing::warn!(node = %self.node, "could not post the RuleParseFailed Event on the Node: {}", describe(&e))
            }
        }
    }
}

/// Follows the one object of `kind` named after the node; `apply` parses it (or its absence)
/// into the store.
async fn follow_one<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: &'static str,
    reporter: Reporter,
    apply: impl Fn(Option<&K>) -> Result<(), FieldError> + Send + 'static,
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let node = reporter.node.clone();
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut init: Option<K> = None;
    let mut last_failure: Option<String> = None;
    let mut last_error: Option<String> = None;
    let mut synced = false;
    reporter.status.object(kind, |_| {});
    while let Some(item) = stream.next().await {
        if item.is_ok() {
            reporter.status.watch_delivered(kind, matches!(item, Ok(Event::InitDone)));
        }
        let seen: Option<K> = match item {
            Ok(Event::Init) => {
                init = None;
                continue;
            }
            Ok(Event::InitApply(obj)) => {
                init = Some(obj);
                continue;
            }
            Ok(Event::InitDone) => {
                if last_error.take().is_some() || !synced {
                    tracing::info!(%node, kind, found = init.is_some(), "rules: watching the node's {kind}");
                }
                metrics().synced.get_or_create(&object(kind)).set(1);
                synced = true;
                init.take()
            }
            Ok(Event::Apply(obj)) => Some(obj),
            Ok(Event::Delete(_)) => None,
            Err(e) => {
                metrics().watch_errors.get_or_create(&object(kind)).inc();
                let text = describe_watch(&e, kind);
                reporter.status.watch_failed(kind, &e, &text);
                if last_error.as_deref() != Some(text.as_str()) {
                    if is_permission(&e) {
                        tracing::error!(%node, kind, "rules: {text}; keeping the rules in force and retrying");
                    } else {
                        tracing::warn!(%node, kind, "rules: {text}; keeping the rules in force (the rules file's, or koordlet's defaults, until the API server answers) and retrying");
                    }
                    last_error = Some(text);
                }
                continue;
            }
        };
        let version = seen.as_ref().and_then(|o| o.resource_version()).unwrap_or_default();
        match apply(seen.as_ref()) {
            Ok(()) => {
                last_failure = None;
                reporter.status.object(kind, |o| o.parse_error = None);
            }
            Err(e) => {
                let message = format!("{kind} {node}: {e}");
                reporter.status.object(kind, |o| o.parse_error = Some((std::time::SystemTime::now(), message.clone())));
                if last_failure.as_deref() != Some(message.as_str()) {
                    tracing::warn!(%node, kind, field = %e.field, resource_version = %version, "rules: {message}; the last good {kind} stays in force");
                    reporter.status.rule_errors.fetch_add(1, Ordering::Relaxed);
                    metrics().rule_errors.get_or_create(&object(kind)).inc();
                    reporter.rule_parse_failed(message.clone()).await;
                    last_failure = Some(message);
                }
            }
        }
    }
}

/// Follows the node's pods into `index`.
async fn follow_pods(api: Api<Pod>, config: watcher::Config, index: Arc<PodIndex>, reporter: Reporter) {
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut init: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
    let mut last_error: Option<String> = None;
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    reporter.status.object("Pod", |_| {});
    while let Some(item) = stream.next().await {
        if item.is_ok() {
            reporter.status.watch_delivered("Pod", matches!(item, Ok(Event::InitDone)));
        }
        let mut pods = index.pods.lock().unwrap_or_else(|e| e.into_inner());
        match item {
            Ok(Event::Init) => init.clear(),
            Ok(Event::InitApply(p)) => {
                init.insert(uid(&p), Arc::new(p));
            }
            Ok(Event::InitDone) => {
                *pods = std::mem::take(&mut init);
                metrics().synced.get_or_create(&object("Pod")).set(1);
                if last_error.take().is_some() || pods.is_empty() {
                    tracing::info!(node = %reporter.node, pods = pods.len(), "rules: watching the node's pods");
                }
            }
            Ok(Event::Apply(p)) => {
                pods.insert(uid(&p), Arc::new(p));
            }
            Ok(Event::Delete(p)) => {
                pods.remove(&uid(&p));
            }
            Err(e) => {
                metrics().watch_errors.get_or_create(&object("Pod")).inc();
                let text = describe_watch(&e, "Pod");
                reporter.status.watch_failed("Pod", &e, &text);
                if last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(node = %reporter.node, "rules: {text}; retrying");
                    last_error = Some(text);
                }
            }
        }
    }
}

fn api_status(e: &watcher::Error) -> Option<&kube::core::Status> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s),
        watcher::Error::WatchError(s) => Some(s),
        _ => None,
    }
}

fn is_permission(e: &watcher::Error) -> bool {
    api_status(e).is_some_and(|s| s.code == 401 || s.code == 403)
}

/// One line for a watch failure; 401 and 403 name what is missing.
fn describe_watch(e: &watcher::Error, kind: &str) -> String {
    match api_status(e) {
        Some(s) if s.code == 403 => format!(
            "the API server refused to list/watch {kind} (403 Forbidden: {}): the ClusterRole of runtime-hooks needs get, list and watch on it (deploy/runtime-hooks.yaml)",
            s.message
        ),
        Some(s) if s.code == 401 => format!(
            "the API server did not accept our credentials for {kind} (401 Unauthorized: {}): check --kubeconfig or the service account token",
            s.message
        ),
        Some(s) if s.code == 404 => format!(
            "the API server does not serve {kind} (404: {}): is its CRD installed?",
            if s.message.is_empty() { "not found" } else { &s.message }
        ),
        _ => format!("watching {kind}: {e}"),
    }
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}: {}", s.code, s.reason, s.message),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
