//! Rules: the node-level policy the plugins apply — what NodeSLO is for koordlet.
//!
//! One file (`--rules FILE`), JSON if its name ends in `.json`, YAML otherwise; every key is
//! optional and defaults to koordlet's default (`pkg/util/sloconfig/nodeslo_config.go`). Unknown
//! keys are errors, so a typo is reported instead of silently ignored. The complete file with
//! every default:
//!
//! ```yaml
//! groupIdentity:        # GroupIdentity: cpu.bvt_warp_ns of pod cgroups, by QoS class
//!   enable: true        # false: every pod gets 0 (the kernel default)
//!   lsr: 2              # LSR and LSE pods
//!   ls: 2               # LS pods, and pods without a class in Guaranteed/Burstable cgroups
//!   be: -1              # BE pods, and pods without a class in BestEffort cgroups
//!   none: 0             # the kubepods (Guaranteed) QoS directory
//! cpu:
//!   cfsPeriodUs: 100000 # CFS period (µs) used to turn milli-CPU limits into quotas
//! batchResource:        # BatchResource: BE pods' CPU and memory from batch resources
//!   enable: true
//!   cfsQuota: true      # false: BE CFS quota -1 (unlimited), koordlet's behaviour when
//!                       # BE CPU is suppressed by cfsQuota policy instead
//! cpuset:               # CPUSet: LSE/LSR cpusets, BE shared pool
//!   enable: true
//!   unsetCfsQuota: true # LSE/LSR pods with a cpuset get CFS quota -1 (koordlet's
//!                       # --disable-unset-cpu-quota=false)
//! ```
//!
//! Values are checked: group identity values in −1..=2 (what the kernel accepts), the CFS
//! period in 1000..=1000000 µs. `{}` and a null document (YAML `---`, `null`, `~`, only
//! comments; JSON `null`) mean all defaults; a file of only whitespace is an error (see
//! [`Rules::parse`]); a UTF-8 BOM at the start is skipped.
//!
//! # Reload
//!
//! [`RulesStore::watch`] follows the file: its directory is watched (so atomic renames and
//! ConfigMap `..data` symlink swaps are seen), events are debounced for 100 ms, and the file is
//! also re-read every 10 s as a safety net. A new valid version is swapped in (readers take
//! snapshots, [`RulesStore::current`]) and announced on a [`tokio::sync::watch`] channel, on
//! which the reconciler re-applies the rules to running pods. An invalid version is logged and
//! the previous one kept; a deleted file means the defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use arc_swap::ArcSwap;
use notify::Watcher as _;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The whole rule file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Rules {
    /// GroupIdentity settings.
    pub group_identity: GroupIdentityRules,
    /// CPU settings shared by the plugins.
    pub cpu: CpuRules,
    /// BatchResource settings.
    pub batch_resource: BatchResourceRules,
    /// CPUSet settings.
    pub cpuset: CpusetRules,
}

/// Group identity (`cpu.bvt_warp_ns`) per QoS class; koordlet's NodeSLO
/// `resourceQOSStrategy.<class>.cpuQOS.groupIdentity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GroupIdentityRules {
    /// Off: every pod gets 0. Default on.
    pub enable: bool,
    /// LSR and LSE pods. Default 2.
    pub lsr: i64,
    /// LS pods (and unclassified Guaranteed/Burstable pods). Default 2.
    pub ls: i64,
    /// BE pods (and unclassified BestEffort pods). Default −1.
    pub be: i64,
    /// The Guaranteed QoS directory (`kubepods`). Default 0.
    pub none: i64,
}

impl Default for GroupIdentityRules {
    fn default() -> Self {
        GroupIdentityRules { enable: true, lsr: 2, ls: 2, be: -1, none: 0 }
    }
}

/// CPU settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CpuRules {
    /// CFS period in µs for quotas computed from milli-CPU limits. Default 100000 (kubelet's).
    pub cfs_period_us: i64,
}

impl Default for CpuRules {
    fn default() -> Self {
        CpuRules { cfs_period_us: 100_000 }
    }
}

/// BatchResource settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct BatchResourceRules {
    /// Off: BE pods are left as kubelet made them. Default on.
    pub enable: bool,
    /// Off: BE CFS quota is −1 (unlimited) whatever the batch-cpu limit. Default on.
    pub cfs_quota: bool,
}

impl Default for BatchResourceRules {
    fn default() -> Self {
        BatchResourceRules { enable: true, cfs_quota: true }
    }
}

/// CPUSet settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CpusetRules {
    /// Off: no cpuset changes. Default on.
    pub enable: bool,
    /// LSE/LSR pods with a cpuset get CFS quota −1. Default on.
    pub unset_cfs_quota: bool,
}

impl Default for CpusetRules {
    fn default() -> Self {
        CpusetRules { enable: true, unset_cfs_quota: true }
    }
}

impl Rules {
    /// Parses rules: JSON when `path` ends in `.json`, YAML otherwise; then [`Rules::validate`].
    ///
    /// A UTF-8 BOM at the start is skipped (some editors write one; runtime-proxy skips it in
    /// registration files too). A null document means the defaults, like `{}`: YAML `---` (an
    /// empty document), `null`, `~` or only comments; JSON `null`.
    ///
    /// Errors name the file and the position or field. A file with nothing but whitespace is an
    /// error, not the defaults: it is what a reader sees while a writer truncates and rewrites
    /// the file in place, and taking it for the defaults would flip every pod's policy for a
    /// moment (a hot reload keeps the rules in force instead).
    pub fn parse(path: &Path, text: &str) -> anyhow::Result<Rules> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if text.trim().is_empty() {
            bail!("{} is empty (write {{}} for the defaults)", path.display());
        }
        let rules: Option<Rules> = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(text).with_context(|| format!("parsing {} as JSON", path.display()))?
        } else {
            serde_norway::from_str(text).with_context(|| format!("parsing {} as YAML", path.display()))?
        };
        let rules = rules.unwrap_or_default();
        rules.validate().with_context(|| format!("checking {}", path.display()))?;
        Ok(rules)
    }

    /// Reads and parses the file.
    pub fn load(path: &Path) -> anyhow::Result<Rules> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Rules::parse(path, &text)
    }

    /// Checks value ranges: group identity values in −1..=2, `cfsPeriodUs` in 1000..=1000000.
    pub fn validate(&self) -> anyhow::Result<()> {
        let g = &self.group_identity;
        for (name, v) in [("lsr", g.lsr), ("ls", g.ls), ("be", g.be), ("none", g.none)] {
            if !(-1..=2).contains(&v) {
                bail!("groupIdentity.{name} = {v}: must be -1, 0, 1 or 2");
            }
        }
        let p = self.cpu.cfs_period_us;
        if !(1000..=1_000_000).contains(&p) {
            bail!("cpu.cfsPeriodUs = {p}: must be within 1000..=1000000");
        }
        Ok(())
    }
}

/// The rules in force, swappable while readers hold snapshots, plus a "rules changed" channel.
#[derive(Debug)]
pub struct RulesStore {
    path: Option<PathBuf>,
    current: ArcSwap<Rules>,
    changed: watch::Sender<u64>,
}

impl RulesStore {
    /// Fixed rules (no file): tests, and the binary without `--rules`.
    pub fn fixed(rules: Rules) -> Arc<RulesStore> {
        Arc::new(RulesStore { path: None, current: ArcSwap::from_pointee(rules), changed: watch::channel(0).0 })
    }

    /// Rules from `path`. A missing file means the defaults (it is watched and may appear later).
    ///
    /// Errors: the file exists but is not valid — at start-up a bad policy file is a mistake
    /// to fix, not to run with.
    pub fn open(path: &Path) -> anyhow::Result<Arc<RulesStore>> {
        let rules = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(file = %path.display(), "rules file does not exist; using the defaults until it appears");
                Rules::default()
            }
            _ => Rules::load(path)?,
        };
        Ok(Arc::new(RulesStore { path: Some(path.to_owned()), current: ArcSwap::from_pointee(rules), changed: watch::channel(0).0 }))
    }

    /// The rules in force (a snapshot; cheap).
    pub fn current(&self) -> Arc<Rules> {
        self.current.load_full()
    }

    /// A receiver that sees a new value every time the rules change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Swaps in `rules` if they differ from the current ones; returns whether they did.
    pub fn set(&self, rules: Rules) -> bool {
        if *self.current.load_full() == rules {
            return false;
        }
        self.current.store(Arc::new(rules));
        self.changed.send_modify(|v| *v += 1);
        true
    }

    /// Re-reads the file now: a valid new version is swapped in, an invalid one logged and
    /// ignored, a missing file means the defaults. Returns whether the rules changed.
    pub fn reload(&self) -> bool {
        let Some(path) = &self.path else { return false };
        let rules = match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Rules::default(),
            _ => match Rules::load(path) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(file = %path.display(), "rules file invalid, keeping the rules in force: {e:#}");
                    return false;
                }
            },
        };
        let changed = self.set(rules);
        if changed {
            tracing::info!(file = %path.display(), rules = %serde_json::to_string(&*self.current()).unwrap_or_default(), "rules changed");
        }
        changed
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
                    || ev
                        .paths
                        .iter()
                        .any(|p| p.file_name() == name.as_deref() || p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("..")));
                if ours && !matches!(ev.kind, notify::EventKind::Access(_)) {
                    let _ = tx.send(());
                }
            }
        });
        let watch_result = match &mut watcher {
            Ok(w) => w.watch(&dir, notify::RecursiveMode::NonRecursive).with_context(|| format!("watching {}", dir.display())),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_koordlets() {
        let r = Rules::default();
        assert_eq!((r.group_identity.lsr, r.group_identity.ls, r.group_identity.be, r.group_identity.none), (2, 2, -1, 0));
        assert!(
            r.group_identity.enable && r.batch_resource.enable && r.batch_resource.cfs_quota && r.cpuset.enable && r.cpuset.unset_cfs_quota
        );
        assert_eq!(r.cpu.cfs_period_us, 100_000);
        assert_eq!(Rules::parse(Path::new("r.json"), "{}").unwrap(), r);
        assert_eq!(Rules::parse(Path::new("r.yaml"), "{}").unwrap(), r);
    }

    #[test]
    fn null_documents_mean_the_defaults() {
        for (name, text) in [
            ("r.yaml", "---"),
            ("r.yaml", "---\n"),
            ("r.yaml", "null"),
            ("r.yaml", "~\n"),
            ("r.yaml", "--- ~"),
            ("r.yaml", "# all defaults\n"),
            ("r.yaml", "{}"),
            ("r.json", "null"),
            ("r.json", " {} "),
        ] {
            assert_eq!(Rules::parse(Path::new(name), text).unwrap(), Rules::default(), "{name} {text:?}");
        }
        for (name, text) in [("r.yaml", ""), ("r.yaml", " \n\t"), ("r.json", ""), ("r.json", "\n")] {
            let e = format!("{:#}", Rules::parse(Path::new(name), text).unwrap_err());
            assert!(e.contains("empty") && e.contains("{}"), "{name} {text:?}: {e}");
        }
    }

    #[test]
    fn a_utf8_bom_is_skipped() {
        let r = Rules::parse(Path::new("r.json"), "\u{feff}{\"cpu\": {\"cfsPeriodUs\": 50000}}").unwrap();
        assert_eq!(r.cpu.cfs_period_us, 50_000);
        let r = Rules::parse(Path::new("r.yaml"), "\u{feff}groupIdentity:\n  be: 0\n").unwrap();
        assert_eq!(r.group_identity.be, 0);
        assert_eq!(Rules::parse(Path::new("r.yaml"), "\u{feff}---\n").unwrap(), Rules::default());
        assert!(Rules::parse(Path::new("r.json"), "\u{feff}").unwrap_err().to_string().contains("empty"));
        // Only at the start.
        assert!(Rules::parse(Path::new("r.json"), "{}\u{feff}").is_err());
        // Through the file, as the binary reads it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        std::fs::write(&path, b"\xEF\xBB\xBF{\"batchResource\": {\"enable\": false}}").unwrap();
        assert!(!RulesStore::open(&path).unwrap().current().batch_resource.enable);
    }

    #[test]
    fn yaml_and_json_partial_files() {
        let y = "groupIdentity:\n  be: 0\ncpu:\n  cfsPeriodUs: 50000\n";
        let r = Rules::parse(Path::new("rules.yaml"), y).unwrap();
        assert_eq!((r.group_identity.be, r.group_identity.ls, r.cpu.cfs_period_us), (0, 2, 50_000));
        let j = r#"{"batchResource": {"cfsQuota": false}}"#;
        let r = Rules::parse(Path::new("rules.json"), j).unwrap();
        assert!(!r.batch_resource.cfs_quota && r.batch_resource.enable);
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (name, text, needle) in [
            ("r.yaml", "groupIdentity:\n  bee: 1\n", "bee"),
            ("r.json", r#"{"cpu": {"cfsPeriodUs": 10}}"#, "cfsPeriodUs"),
            ("r.json", r#"{"groupIdentity": {"be": -5}}"#, "groupIdentity.be"),
            ("r.json", "{", "JSON"),
            ("r.yaml", "", "empty"),
            ("r.yaml", "cpu: [1]", "YAML"),
        ] {
            let e = format!("{:#}", Rules::parse(Path::new(name), text).unwrap_err());
            assert!(e.contains(needle) && e.contains(name), "{name} {text:?}: {e}");
        }
    }

    #[test]
    fn store_swaps_and_announces_only_real_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let store = RulesStore::open(&path).unwrap();
        assert_eq!(*store.current(), Rules::default(), "missing file: defaults");
        let rx = store.subscribe();
        std::fs::write(&path, "cpu:\n  cfsPeriodUs: 50000\n").unwrap();
        assert!(store.reload());
        assert_eq!(store.current().cpu.cfs_period_us, 50_000);
        assert!(rx.has_changed().unwrap());
        assert!(!store.reload(), "same content: no change");
        std::fs::write(&path, "cpu: {cfsPeriodUs: 1}").unwrap();
        assert!(!store.reload(), "invalid: kept");
        assert_eq!(store.current().cpu.cfs_period_us, 50_000);
        std::fs::remove_file(&path).unwrap();
        assert!(store.reload(), "deleted: defaults");
        assert_eq!(*store.current(), Rules::default());
        std::fs::write(&path, "{{{").unwrap();
        assert!(RulesStore::open(&path).is_err(), "invalid at start-up is an error");
    }

    #[tokio::test]
    async fn watcher_picks_up_atomic_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.json");
        std::fs::write(&path, "{}").unwrap();
        let store = RulesStore::open(&path).unwrap();
        store.watch().unwrap();
        let mut rx = store.subscribe();
        let tmp = dir.path().join(".rules.tmp");
        std::fs::write(&tmp, r#"{"groupIdentity": {"be": 0}}"#).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        tokio::time::timeout(Duration::from_secs(5), rx.changed()).await.expect("change seen").unwrap();
        assert_eq!(store.current().group_identity.be, 0);
    }
}
