//! The rules in force: one value readers take snapshots of, recomputed from the inputs' last
//! good versions whenever a source delivers a new one, and announced on a channel.
//!
//! # Sources
//!
//! Two sources feed it. The **rules file** (`--rules`, [`super::file`]) is followed on disk:
//! its directory is watched (so atomic renames and ConfigMap `..data` symlink swaps are seen),
//! events are debounced for 100 ms, and the file is re-read every 10 s as a safety net; an
//! invalid version is logged and the previous one kept; a deleted file means the defaults. The
//! **cluster** ([`crate::cluster`]) delivers the node's NodeSLO, NodeResourceTopology and Node
//! as its watches see them. Once the cluster has answered for an input, its version (or its
//! absence: the object was deleted or never existed) replaces the file's for that input; until
//! then (API server unreachable at start) the file's, or koordlet's defaults, are in force.
//!
//! # Announcing changes
//!
//! On every change the new rules are logged and a counter on a [`tokio::sync::watch`] channel
//! moves; the reconciler (proxy and standalone mode) and the NRI plugin re-apply the rules to
//! the running pods on it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use notify::Watcher as _;
use tokio::sync::watch;

use super::file::FileRules;
use super::node::NodeRules;
use super::node_slo::SloRules;
use super::topology::Topology;
use super::{RuleFlags, Rules};

/// Where an input came from, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleSource {
    /// The rules file.
    File,
    /// The Kubernetes API.
    Cluster,
}

impl RuleSource {
    /// `file` or `cluster` (the `source` label of `runtime_hooks_rule_changes_total`).
    pub const fn as_str(self) -> &'static str {
        match self {
            RuleSource::File => "file",
            RuleSource::Cluster => "cluster",
        }
    }
}

/// What the store has seen since start, for `runtime-hooks status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreHistory {
    /// Times the rules in force changed.
    pub changes: u64,
    /// The last change: when, and which source brought it; `None`: the rules are those of the
    /// start (the file's, or koordlet's defaults).
    pub last_change: Option<(std::time::SystemTime, RuleSource)>,
    /// Why the rules file's last read failed (the rules in force were kept); `None` when it
    /// read fine, or there is no file.
    pub file_error: Option<String>,
}

/// The inputs' last good versions.
#[derive(Debug, Default)]
struct Inputs {
    /// Fixed base rules (tests; the binary never sets them).
    fixed: Option<Rules>,
    /// The file's last good content; `None`: no file, or deleted.
    file: Option<FileRules>,
    /// Per input: `None` until the cluster answered; `Some(None)`: the object does not exist.
    cluster_slo: Option<Option<SloRules>>,
    cluster_topology: Option<Option<Topology>>,
    cluster_node: Option<Option<NodeRules>>,
    /// The command line's rule inputs, applied over the rest.
    flags: RuleFlags,
}

/// The cluster's version of an input once it has answered, else the file's.
fn pick<'a, T>(cluster: &'a Option<Option<T>>, file: Option<&'a T>) -> Option<&'a T> {
    match cluster {
        Some(c) => c.as_ref(),
        None => file,
    }
}

impl Inputs {
    fn rules(&self) -> Rules {
        let file = self.file.as_ref();
        let base = self.fixed.clone().or_else(|| file.and_then(|f| f.legacy.clone())).unwrap_or_default();
        self.flags.apply(Rules::compose(
            &base,
            pick(&self.cluster_slo, file.and_then(|f| f.slo.as_ref())),
            pick(&self.cluster_topology, file.and_then(|f| f.topology.as_ref())),
            pick(&self.cluster_node, file.and_then(|f| f.node.as_ref())),
        ))
    }
}

/// The rules in force, swappable while readers hold snapshots, plus a "rules changed" channel.
#[derive(Debug)]
pub struct RulesStore {
    path: Option<PathBuf>,
    inputs: Mutex<Inputs>,
    current: ArcSwap<Rules>,
    changed: watch::Sender<u64>,
    history: Mutex<StoreHistory>,
}

impl RulesStore {
    fn with(path: Option<PathBuf>, inputs: Inputs) -> Arc<RulesStore> {
        let rules = inputs.rules();
        let (current, changed) = (ArcSwap::from_pointee(rules), watch::channel(0).0);
        Arc::new(RulesStore { path, inputs: Mutex::new(inputs), current, changed, history: Mutex::default() })
    }

    /// Fixed base rules (tests); the cluster's inputs still apply over them.
    pub fn fixed(rules: Rules) -> Arc<RulesStore> {
        Self::with(None, Inputs { fixed: Some(rules), ..Default::default() })
    }

    /// No file: koordlet's defaults until the cluster answers.
    pub fn defaults() -> Arc<RulesStore> {
        Self::with(None, Inputs::default())
    }

    /// Rules from `path`. A missing file means the defaults (it is watched and may appear later).
    /// A file in the old format is read with a deprecation warning.
    ///
    /// Errors: the file exists but is not valid — at start-up a bad policy file is a mistake
    /// to fix, not to run with.
    pub fn open(path: &Path) -> anyhow::Result<Arc<RulesStore>> {
        let file = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(file = %path.display(), "rules file does not exist; using the defaults until it appears");
                None
            }
            _ => Some(FileRules::load(path)?),
        };
        warn_if_legacy(path, file.as_ref());
        crate::metrics::rule_source(RuleSource::File.as_str());
        Ok(Self::with(Some(path.to_owned()), Inputs { file, ..Default::default() }))
    }

    /// Sets the command line's rule inputs (`--disable-unset-cpu-quota`), at start-up before the
    /// rules are read by anyone: the rules in force are recomputed, not announced as a change.
    pub fn set_flags(&self, flags: RuleFlags) {
        let rules = {
            let mut inputs = self.inputs.lock().unwrap_or_else(|e| e.into_inner());
            inputs.flags = flags;
            inputs.rules()
        };
        self.current.store(Arc::new(rules));
    }

    /// The rules in force (a snapshot; cheap).
    pub fn current(&self) -> Arc<Rules> {
        self.current.load_full()
    }

    /// The rules file's path (`--rules`), if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// When the rules last changed and from which source, how often, and whether the file's
    /// last read failed.
    pub fn history(&self) -> StoreHistory {
        self.history.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A receiver that sees a new value every time the rules change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Changes the inputs with `f`, recomputes, and swaps in and announces the result if it
    /// differs. Returns whether the rules changed.
    fn update(&self, source: RuleSource, f: impl FnOnce(&mut Inputs)) -> bool {
        let rules = {
            let mut inputs = self.inputs.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut inputs);
            inputs.rules()
        };
        if *self.current.load_full() == rules {
            return false;
        }
        tracing::info!(?source, rules = %serde_json::to_string(&rules).unwrap_or_default(), "rules changed");
        crate::metrics::metrics()
            .rule_changes
            .get_or_create(&crate::metrics::SourceLabel { source: source.as_str().into() })
            .inc();
        self.current.store(Arc::new(rules));
        {
            let mut history = self.history.lock().unwrap_or_else(|e| e.into_inner());
            history.changes += 1;
            history.last_change = Some((std::time::SystemTime::now(), source));
        }
        self.changed.send_modify(|v| *v += 1);
        true
    }

    /// The cluster's NodeSLO (`None`: there is none). Returns whether the rules changed.
    pub fn set_cluster_slo(&self, slo: Option<SloRules>) -> bool {
        self.update(RuleSource::Cluster, |i| i.cluster_slo = Some(slo))
    }

    /// The cluster's NodeResourceTopology (`None`: there is none).
    pub fn set_cluster_topology(&self, topology: Option<Topology>) -> bool {
        self.update(RuleSource::Cluster, |i| i.cluster_topology = Some(topology))
    }

    /// The cluster's Node (`None`: not found).
    pub fn set_cluster_node(&self, node: Option<NodeRules>) -> bool {
        self.update(RuleSource::Cluster, |i| i.cluster_node = Some(node))
    }

    /// Re-reads the file now: a valid new version is swapped in, an invalid one logged and
    /// ignored, a missing file means the defaults. Returns whether the rules changed.
    pub fn reload(&self) -> bool {
        let Some(path) = &self.path else { return false };
        let file = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            _ => match FileRules::load(path) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(file = %path.display(), "rules file invalid, keeping the rules in force: {e:#}");
                    self.history.lock().unwrap_or_else(|e| e.into_inner()).file_error = Some(format!("{e:#}"));
                    return false;
                }
            },
        };
        let was_invalid = self.history.lock().unwrap_or_else(|e| e.into_inner()).file_error.take().is_some();
        if was_invalid {
            valid_again(path, file.is_some());
        }
        let same = self.inputs.lock().unwrap_or_else(|e| e.into_inner()).file == file;
        if !same {
            warn_if_legacy(path, file.as_ref());
        }
        self.update(RuleSource::File, |i| i.file = file)
    }

    /// Follows the file until the process ends (no-op for fixed rules): inotify on its
    /// directory, debounced 100 ms, plus a re-read every 10 s.
    ///
    /// Errors: the watch cannot be set up (e.g. the directory does not exist); the 10 s re-read
    /// still runs then.
    pub fn watch(self: &Arc<Self>) -> anyhow::Result<()> {
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned();
        let name = path.file_name().map(|n| n.to_owned());
        let mut watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let Ok(ev) = ev {
                // Our file, or a ConfigMap's `..data` swap, or anything we cannot attribute.
                let ours = ev.paths.is_empty()
                    || ev.paths.iter().any(|p| {
                        p.file_name() == name.as_deref()
                            || p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".."))
                    });
                if ours && !matches!(ev.kind, notify::EventKind::Access(_)) {
                    let _ = tx.send(());
                }
            }
        });
        let watch_result = match &mut watcher {
            Ok(w) => w
                .watch(&dir, notify::RecursiveMode::NonRecursive)
                .with_context(|| format!("watching {}", dir.display())),
            Err(e) => Err(anyhow::anyhow!("inotify: {e}")),
        };
        let store = self.clone();
        tokio::spawn(async move {
            let _watcher = watcher; // kept alive by the task
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    ev = rx.recv() => {
                        if ev.is_none() { std::future::pending::<()>().await; }
                        // Debounce: an editor or `kubectl` writes in bursts.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        while rx.try_recv().is_ok() {}
                    }
                    _ = tick.tick() => {}
                }
                store.reload();
            }
        });
        watch_result
    }
}

fn warn_if_legacy(path: &Path, file: Option<&FileRules>) {
    if file.is_some_and(|f| f.legacy.is_some()) {
        tracing::warn!(
            file = %path.display(),
            "rules file is in the old format, which is deprecated and read for one more release: convert it to a NodeSLO (docs/guide/rules.md, \"Rules: from the cluster, or from a file\")"
        );
    }
}

/// Logs (INFO) that the rules file at `path`, invalid at its last read, reads again: its
/// rules are in force (`exists`), or it is gone and the defaults are.
fn valid_again(path: &Path, exists: bool) {
    if exists {
        tracing::info!(file = %path.display(), "rules file valid again: its rules are in force");
    } else {
        tracing::info!(file = %path.display(), "rules file, invalid before, is gone: using the defaults until it appears");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// koordlet's `--disable-unset-cpu-quota` with NodeSLO-era rules: CPU-bound LSR pods keep
    /// their CFS quota (pod and container), whatever NodeSLO the cluster or a file brings;
    /// without it their quota is −1.
    #[test]
    fn disable_unset_cpu_quota_holds_over_node_slo_rules() {
        use crate::context::{ContainerContext, PodContext, QOS_CLASS_KEY};
        use crate::plugin::{Plugin, Stage};
        use crate::plugins::cpuset::{CpuSet, RESOURCE_STATUS};
        let pod = PodContext {
            labels: [(QOS_CLASS_KEY.to_string(), "LSR".to_string())].into(),
            annotations: [(RESOURCE_STATUS.to_string(), r#"{"cpuset": "2-3"}"#.to_string())].into(),
            cgroup_parent: "/kubepods/pod1".into(),
            ..Default::default()
        };
        let c = ContainerContext { pod: pod.clone(), name: "main".into(), ..Default::default() };
        let quotas = |store: &RulesStore| {
            let rules = store.current();
            let container = CpuSet::default().container(Stage::PreCreateContainer, &c, &rules).unwrap().resources;
            assert_eq!(container.cpuset_cpus.as_deref(), Some("2-3"), "bound either way");
            (CpuSet::default().pod(Stage::PreRunPodSandbox, &pod, &rules).unwrap().pod_cgroup, container.cpu_quota)
        };
        let slo = super::super::node_slo::parse(
            &serde_json::json!({"resourceQOSStrategy": {"lsrClass": {"cpuQOS": {"enable": true}}}}),
        )
        .unwrap();
        let without = RulesStore::defaults();
        assert!(without.set_cluster_slo(Some(slo.clone())));
        assert_eq!(
            quotas(&without),
            (vec![crate::cgroup::CgroupValue::CfsQuota(-1)], Some(-1)),
            "koordlet's default: unset"
        );
        let with = RulesStore::defaults();
        let rx = with.subscribe();
        with.set_flags(RuleFlags { disable_unset_cpu_quota: true });
        assert!(!rx.has_changed().unwrap(), "set at start, not announced");
        assert_eq!(quotas(&with), (vec![], None), "the quota kept");
        assert!(with.set_cluster_slo(Some(slo)));
        assert!(with.current().group_identity.enable, "the NodeSLO is in force");
        assert_eq!(quotas(&with), (vec![], None), "still kept under the cluster's NodeSLO");
        assert!(with.set_cluster_slo(None));
        assert!(!with.current().cpuset.unset_cfs_quota);
    }

    #[test]
    fn store_swaps_and_announces_only_real_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let store = RulesStore::open(&path).unwrap();
        assert_eq!(*store.current(), Rules::default(), "missing file: defaults");
        let rx = store.subscribe();
        std::fs::write(
            &path,
            "kind: NodeSLO\napiVersion: slo.koordinator.sh/v1alpha1\nspec: {resourceQOSStrategy: {beClass: {cpuQOS: {enable: true}}}}\n",
        )
        .unwrap();
        assert!(store.reload());
        assert_eq!(store.current().group_identity.be, -1);
        assert!(rx.has_changed().unwrap());
        assert!(!store.reload(), "same content: no change");
        std::fs::write(&path, "kind: NodeSLO\nspec: {resourceQOSStrategy: {beClass: {cpuQOS: {groupIdentity: 9}}}}\n")
            .unwrap();
        assert!(!store.reload(), "invalid: kept");
        assert_eq!(store.current().group_identity.be, -1);
        let history = store.history();
        assert_eq!(history.changes, 1);
        assert!(matches!(history.last_change, Some((_, RuleSource::File))));
        assert!(history.file_error.is_some_and(|e| e.contains("groupIdentity")), "{:?}", store.history());
        std::fs::remove_file(&path).unwrap();
        assert!(store.reload(), "deleted: defaults");
        assert_eq!(*store.current(), Rules::default());
        assert_eq!((store.history().changes, store.history().file_error), (2, None), "a good read clears the error");
        std::fs::write(&path, "{{{").unwrap();
        assert!(RulesStore::open(&path).is_err(), "invalid at start-up is an error");
    }

    #[test]
    fn the_cluster_replaces_the_file_per_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, "kind: NodeSLO\napiVersion: slo.koordinator.sh/v1alpha1\nspec: {resourceUsedThresholdWithBE: {enable: true, cpuSuppressPolicy: cfsQuota}}\n").unwrap();
        let store = RulesStore::open(&path).unwrap();
        assert!(!store.current().batch_resource.cfs_quota, "the file until the cluster answers");
        assert!(!store.set_cluster_topology(None), "no NRT: nothing changes");
        assert!(store.set_cluster_slo(None), "the cluster has no NodeSLO: defaults");
        assert!(store.current().batch_resource.cfs_quota);
        assert!(!store.reload(), "the file no longer decides the NodeSLO");
        let slo = super::super::node_slo::parse(
            &serde_json::json!({"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressPolicy": "cfsQuota"}}),
        )
        .unwrap();
        assert!(store.set_cluster_slo(Some(slo.clone())));
        assert!(!store.set_cluster_slo(Some(slo)), "same: no change announced");
        assert!(!store.current().batch_resource.cfs_quota);
    }

    #[tokio::test]
    async fn watcher_picks_up_atomic_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        std::fs::write(&path, "null").unwrap();
        let store = RulesStore::open(&path).unwrap();
        store.watch().unwrap();
        let mut rx = store.subscribe();
        let tmp = dir.path().join(".rules.tmp");
        std::fs::write(&tmp, r#"{"kind":"NodeSLO","apiVersion":"slo.koordinator.sh/v1alpha1","spec":{"resourceQOSStrategy":{"lsClass":{"cpuQOS":{"enable":true}}}}}"#).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed()).await.expect("change seen").unwrap();
        assert_eq!(store.current().group_identity.ls, 2);
    }
}
