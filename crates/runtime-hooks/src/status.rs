//! runtime-hooks' admin endpoint (`--metrics-addr`, and the root-only `--admin-socket`; both
//! bounded as [`daemon_support::admin_http`] says, [`serve`]): `GET /metrics` (Prometheus text
//! format, [`crate::metrics`]), `GET /healthz` (200 `ok` while the process serves) and
//! `GET /status`, an operator's view of a running runtime-hooks (a JSON document), which
//! `runtime-hooks status` fetches and prints as a table.
//!
//! # Contents
//!
//! The document holds:
//!
//! * the mode, the plugins and the stages they register;
//! * the registration (proxy mode: its file, and whether the file still names this server) or
//!   the NRI plugin;
//! * the rule source — the rules file (and whether its last read failed), the cluster's node
//!   and, per kind followed, whether its first list is complete and its current watch or parse
//!   error;
//! * the rules in force (the serialized [`Rules`](crate::rules::Rules)) with when and from
//!   which source they last changed;
//! * the reconciler's last pass, uptime and version.
//!
//! # Health
//!
//! `healthy` is false when there are `problems`: a rules file or cluster object that does not
//! parse (the last good rules stay in force), a failing watch, a reconciler pass that could not
//! list the runtime, a registration file that no longer names this server. Plugin failures in a
//! pass, a kind the API server does not serve (404: its CRD is not installed), a list not
//! complete yet are `warnings`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use daemon_support::admin_http;
use daemon_support::status::{ago, problem_lists, rfc3339, show_duration, str_of, table, unix_ms};
use serde_json::{json, Value};

use crate::cli::Mode;
use crate::cluster::ClusterStatus;
use crate::metrics;
use crate::plugin::{FailurePolicy, Stage};
use crate::proxy::server::{Holder, Registration};
use crate::rules::RulesStore;
use crate::standalone::reconciler::LastPass;

/// What `/status` reads, from start-up on.
pub struct StatusSource {
    started: SystemTime,
    started_at: Instant,
    mode: Mode,
    rules: Arc<RulesStore>,
    /// The node whose objects are followed, and what their watches have seen.
    cluster: Option<(String, Arc<ClusterStatus>)>,
    running: OnceLock<Running>,
}

/// What is known once the plugins are set up (until then `/status` says it is starting).
pub struct Running {
    /// The enabled plugins' names, in order.
    pub plugins: Vec<&'static str>,
    /// `--plugin-failure-policy`.
    pub plugin_failure_policy: FailurePolicy,
    /// The stages the plugins want (what proxy mode registers).
    pub stages: Vec<Stage>,
    /// Proxy mode: the registration, read back when asked.
    pub registration: Option<Registration>,
    /// `--failure-policy` (written into the registration).
    pub failure_policy: FailurePolicy,
    /// NRI mode: the runtime's NRI socket, the plugin's name and index.
    pub nri: Option<(PathBuf, String, String)>,
    /// The reconciler, when it runs: the runtime's socket, the interval (`None`: only at start
    /// and on rule changes), its last pass.
    pub reconciler: Option<(PathBuf, Option<Duration>, Arc<Mutex<LastPass>>)>,
    /// The cgroup version and driver in use, as logged at start.
    pub cgroups: String,
}

impl StatusSource {
    /// The status of a process in `mode` with these rules and (when the cluster is a source)
    /// node and watch status, started now.
    pub fn new(mode: Mode, rules: Arc<RulesStore>, cluster: Option<(String, Arc<ClusterStatus>)>) -> StatusSource {
        StatusSource {
            started: SystemTime::now(),
            started_at: Instant::now(),
            mode,
            rules,
            cluster,
            running: OnceLock::new(),
        }
    }

    /// The plugins are set up (once; a second call is ignored).
    pub fn set_running(&self, running: Running) {
        let _ = self.running.set(running);
    }

    /// The `GET /status` document (module docs), read now.
    pub fn document(&self) -> Value {
        let now = unix_ms(SystemTime::now());
        let (mut problems, mut warnings) = (Vec::<String>::new(), Vec::<String>::new());
        let history = self.rules.history();
        if let (Some(path), Some(e)) = (self.rules.path(), &history.file_error) {
            problems.push(format!("rules file {} does not read, the rules in force are kept: {e}", path.display()));
        }
        let cluster = self.cluster.as_ref().map(|(node, status)| {
            let objects: Vec<Value> = status
                .objects()
                .into_iter()
                .map(|(kind, o)| {
                    match (&o.watch_error, o.not_served) {
                        (Some((_, e)), true) => warnings.push(format!("{kind}: {e} (that input keeps its defaults)")),
                        (Some((_, e)), false) => problems.push(format!("{kind}: {e}")),
                        (None, _) if !o.synced => warnings.push(format!("{kind}: first list not complete yet")),
                        (None, _) => {}
                    }
                    if let Some((_, e)) = &o.parse_error {
                        problems.push(format!("{e}; the last good {kind} stays in force"));
                    }
                    json!({
                        "object": kind,
                        "synced": o.synced,
                        "watch_error": o.watch_error.as_ref().map(|(_, e)| e),
                        "watch_error_at": o.watch_error.as_ref().map(|(t, _)| rfc3339(unix_ms(*t))),
                        "not_served": o.not_served,
                        "parse_error": o.parse_error.as_ref().map(|(_, e)| e),
                        "parse_error_at": o.parse_error.as_ref().map(|(t, _)| rfc3339(unix_ms(*t))),
                    })
                })
                .collect();
            json!({ "node": node, "objects": objects })
        });
        let rules = json!({
            "file": self.rules.path(),
            "file_error": history.file_error,
            "cluster": cluster,
            "in_force": serde_json::to_value(&*self.rules.current()).unwrap_or_default(),
            "changes": history.changes,
            "last_changed": history.last_change.map(|(t, _)| rfc3339(unix_ms(t))),
            "last_changed_ms": history.last_change.map(|(t, _)| unix_ms(t)),
            "last_changed_by": history.last_change.map(|(_, s)| s.as_str()),
        });
        let mut doc = json!({
            "program": "runtime-hooks",
            "version": crate::cli::VERSION,
            "now": rfc3339(now),
            "now_ms": now,
            "started": rfc3339(unix_ms(self.started)),
            "uptime_seconds": self.started_at.elapsed().as_secs(),
            "mode": mode_name(self.mode),
            "rules": rules,
        });
        match self.running.get() {
            None => problems.push("starting: the plugins are not set up yet".to_owned()),
            Some(r) => self.running_part(r, &mut doc, &mut problems, &mut warnings),
        }
        doc["healthy"] = json!(problems.is_empty());
        doc["problems"] = json!(problems);
        doc["warnings"] = json!(warnings);
        doc
    }

    /// The parts of the document known once running: plugins, registration or NRI, reconciler.
    fn running_part(&self, r: &Running, doc: &mut Value, problems: &mut Vec<String>, warnings: &mut Vec<String>) {
        doc["plugins"] = json!(r.plugins);
        doc["plugin_failure_policy"] = json!(r.plugin_failure_policy.as_str());
        doc["stages"] = json!(r.stages.iter().map(|s| s.as_str()).collect::<Vec<_>>());
        doc["cgroups"] = json!(r.cgroups);
        if let Some(reg) = &r.registration {
            let holder = reg.holder();
            if holder != Holder::Us {
                problems.push(format!(
                    "registration file {} does not name this server (found: {holder}); it is written again within a second",
                    reg.file().display()
                ));
            }
            doc["registration"] = json!({
                "file": reg.file(),
                "endpoint": reg.endpoint(),
                "failure_policy": r.failure_policy.as_str(),
                "in_place": holder == Holder::Us,
                "found": holder.to_string(),
            });
        }
        if let Some((socket, name, index)) = &r.nri {
            doc["nri"] = json!({ "socket": socket, "plugin_name": name, "plugin_index": index });
        }
        if let Some((endpoint, interval, last)) = &r.reconciler {
            let last = last.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(e) = &last.error {
                problems.push(format!("reconciler: the last pass failed: {e}"));
            } else if last.failures > 0 {
                warnings.push(format!(
                    "reconciler: {} plugin or write failure(s) in the last pass (logged when they first appeared)",
                    last.failures
                ));
            }
            doc["reconciler"] = json!({
                "endpoint": endpoint,
                "interval_ms": interval.map(|d| d.as_millis() as u64),
                "passes": last.passes,
                "last_pass": last.at.map(|t| json!({
                    "at": rfc3339(unix_ms(t)),
                    "at_ms": unix_ms(t),
                    "reason": last.reason,
                    "pods": last.pods,
                    "containers": last.containers,
                    "corrected": last.corrected,
                    "failures": last.failures,
                    "error": last.error,
                })),
            });
        }
    }
}

/// Binds `addr` (`--metrics-addr`, when given) and `socket` (`--admin-socket`, when on) and
/// serves `/metrics`, `/healthz` and `/status` (from `status`) on both until the process ends,
/// with the bounds of [`daemon_support::admin_http`]; logs each (`admin endpoint: …
/// addr=IP:PORT`, `admin socket: … socket=PATH`).
///
/// Errors, naming the flag: an address or the socket cannot be bound (in use, not local, the
/// directory not writable).
pub fn serve(addr: Option<SocketAddr>, socket: Option<&Path>, status: Arc<StatusSource>) -> anyhow::Result<()> {
    let tcp = addr.map(|addr| admin_http::bind_tcp("--metrics-addr", addr)).transpose()?;
    let unix = socket.map(|path| admin_http::bind_socket("--admin-socket", path)).transpose()?;
    let handler = move |req: admin_http::AdminRequest| {
        let answer = match req.uri().path() {
            "/metrics" => admin_http::reply(200, "text/plain; version=0.0.4; charset=utf-8", metrics::encode()),
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

/// `proxy`, `standalone` or `nri`.
fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Proxy => "proxy",
        Mode::Standalone => "standalone",
        Mode::Nri => "nri",
    }
}

/// The table `runtime-hooks status` prints for a status document.
pub fn render(doc: &Value) -> String {
    let mut out = String::new();
    let now = doc["now_ms"].as_u64().unwrap_or(0);
    let uptime = show_duration(Duration::from_secs(doc["uptime_seconds"].as_u64().unwrap_or(0)));
    let verdict = if doc["healthy"].as_bool() == Some(true) { "healthy" } else { "UNHEALTHY" };
    let _ = writeln!(
        out,
        "runtime-hooks {}, up {uptime} (since {}): {verdict}",
        str_of(doc, "version"),
        str_of(doc, "started")
    );
    let list = |v: &Value| {
        v.as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect::<Vec<_>>().join(", ")).unwrap_or_default()
    };
    let mut rows = vec![vec!["mode".to_owned(), str_of(doc, "mode").to_owned()]];
    if doc.get("plugins").is_some() {
        rows.push(vec![
            "plugins".into(),
            format!("{} (plugin failure policy {})", list(&doc["plugins"]), str_of(doc, "plugin_failure_policy")),
        ]);
        rows.push(vec!["stages".into(), list(&doc["stages"])]);
        rows.push(vec!["cgroups".into(), str_of(doc, "cgroups").to_owned()]);
    }
    if let Some(reg) = doc.get("registration") {
        let state = if reg["in_place"].as_bool() == Some(true) {
            "in place".to_owned()
        } else {
            format!("NOT IN PLACE ({})", str_of(reg, "found"))
        };
        let text = format!(
            "{} -> {} (failure-policy {}): {state}",
            str_of(reg, "file"),
            str_of(reg, "endpoint"),
            str_of(reg, "failure_policy")
        );
        rows.push(vec!["registration".into(), text]);
    }
    if let Some(nri) = doc.get("nri") {
        rows.push(vec![
            "nri".into(),
            format!(
                "{} as {} (index {})",
                str_of(nri, "socket"),
                str_of(nri, "plugin_name"),
                str_of(nri, "plugin_index")
            ),
        ]);
    }
    let rules = &doc["rules"];
    let file = match (rules["file"].as_str(), rules["file_error"].as_str()) {
        (None, _) => "none (koordlet's defaults unless the cluster gives them)".to_owned(),
        (Some(f), None) => format!("{f} (reads fine)"),
        (Some(f), Some(e)) => format!("{f}: DOES NOT READ: {e}"),
    };
    rows.push(vec!["rules file".into(), file]);
    let changed = match (rules["last_changed_ms"].as_u64(), rules["last_changed_by"].as_str()) {
        (Some(at), Some(by)) => {
            format!(
                "{} ({}) from the {by}; {} change(s) since start",
                ago(now, at),
                str_of(rules, "last_changed"),
                rules["changes"]
            )
        }
        _ => "not since start".to_owned(),
    };
    rows.push(vec!["rules changed".into(), changed]);
    if let Some(r) = doc.get("reconciler") {
        let every = match r["interval_ms"].as_u64() {
            Some(ms) => format!("every {}", show_duration(Duration::from_millis(ms))),
            None => "at start and on rule changes".to_owned(),
        };
        let last = match r.get("last_pass").filter(|p| !p.is_null()) {
            None => "no pass yet".to_owned(),
            Some(p) => {
                let when = format!("{} ({})", ago(now, p["at_ms"].as_u64().unwrap_or(0)), str_of(p, "reason"));
                match p["error"].as_str() {
                    Some(e) => format!("last pass {when} FAILED: {e}"),
                    None => format!(
                        "last pass {when}: {} pods, {} containers, {} corrected, {} failures",
                        p["pods"], p["containers"], p["corrected"], p["failures"]
                    ),
                }
            }
        };
        rows.push(vec!["reconciler".into(), format!("unix://{} {every}; {last}", str_of(r, "endpoint"))]);
    }
    out.push_str(&table(&["", ""], &rows).lines().skip(1).map(|l| format!("{l}\n")).collect::<String>());

    if let Some(cluster) = rules.get("cluster").filter(|c| !c.is_null()) {
        let _ = writeln!(out, "\ncluster rule source: node {}", str_of(cluster, "node"));
        let rows: Vec<Vec<String>> = cluster["objects"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|o| {
                        let synced = if o["synced"].as_bool() == Some(true) { "yes" } else { "no" };
                        let error = o["parse_error"].as_str().or(o["watch_error"].as_str()).unwrap_or("-");
                        vec![str_of(o, "object").to_owned(), synced.to_owned(), error.to_owned()]
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&table(&["OBJECT", "SYNCED", "ERROR"], &rows));
    }
    let in_force = serde_json::to_string_pretty(&rules["in_force"]).unwrap_or_default();
    let _ = writeln!(out, "\nrules in force\n{in_force}");
    out.push_str(&problem_lists(doc));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_starting_process_is_not_healthy_then_is() {
        let status = StatusSource::new(Mode::Standalone, RulesStore::defaults(), None);
        let doc = status.document();
        assert_eq!(doc["healthy"], false);
        assert!(doc["problems"][0].as_str().unwrap().starts_with("starting"), "{doc}");
        assert_eq!(doc["rules"]["in_force"]["groupIdentity"]["enable"], false, "koordlet's defaults: {doc}");
        let last = Arc::new(Mutex::new(LastPass::default()));
        status.set_running(Running {
            plugins: vec!["GroupIdentity", "BatchResource"],
            plugin_failure_policy: FailurePolicy::Ignore,
            stages: vec![Stage::PreRunPodSandbox],
            registration: None,
            failure_policy: FailurePolicy::Ignore,
            nri: None,
            reconciler: Some((PathBuf::from("/run/c.sock"), Some(Duration::from_secs(10)), last.clone())),
            cgroups: "v1, cgroupfs".into(),
        });
        let doc = status.document();
        assert_eq!(doc["healthy"], true, "{doc}");
        assert_eq!(doc["plugins"], json!(["GroupIdentity", "BatchResource"]));
        *last.lock().unwrap() = LastPass {
            passes: 1,
            at: Some(SystemTime::now()),
            reason: "start",
            error: Some("no runtime".into()),
            ..Default::default()
        };
        let doc = status.document();
        assert_eq!(doc["healthy"], false);
        assert!(doc["problems"][0].as_str().unwrap().contains("no runtime"), "{doc}");
        let text = render(&doc);
        for want in [
            "UNHEALTHY",
            "mode           standalone",
            "GroupIdentity, BatchResource (plugin failure policy Ignore)",
            "every 10s",
            "FAILED: no runtime",
            "\"groupIdentity\"",
        ] {
            assert!(text.contains(want), "{want:?} missing:\n{text}");
        }
    }

    /// `deploy/grafana-dashboard.json` queries only metrics runtime-hooks exports (as the
    /// metrics text names them).
    #[test]
    fn the_dashboard_queries_only_metrics_runtime_hooks_exports() {
        let dashboard = include_str!("../../../deploy/grafana-dashboard.json");
        let used = daemon_support::status::dashboard_names(dashboard, "runtime_hooks_").unwrap();
        // A family shows in the metrics text once it has a series: make one of each (at 0).
        let m = crate::metrics::metrics();
        let _ = (
            m.rule_errors.get_or_create(&crate::metrics::object("NodeSLO")),
            m.synced.get_or_create(&crate::metrics::object("Node")),
        );
        let _ = m.watch_errors.get_or_create(&crate::metrics::object("Pod"));
        let _ = m.rule_changes.get_or_create(&crate::metrics::SourceLabel { source: "file".into() });
        let exported = daemon_support::status::exposed_names(&crate::metrics::encode());
        assert!(used.len() >= 5, "{used:?}");
        let unknown: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "the dashboard uses metrics runtime-hooks does not export: {unknown:?}; it exports {exported:?}"
        );
        // Every family has a panel: the version table included.
        let unshown: Vec<&String> =
            exported.iter().filter(|n| !used.iter().any(|u| u.starts_with(n.as_str()))).collect();
        assert!(unshown.is_empty(), "metrics runtime-hooks exports that the dashboard does not show: {unshown:?}");
    }

    #[test]
    fn a_rules_file_that_does_not_read_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        let store = RulesStore::open(&path).unwrap();
        std::fs::write(&path, "{{{").unwrap();
        assert!(!store.reload());
        let status = StatusSource::new(Mode::Proxy, store, None);
        let doc = status.document();
        assert!(
            doc["problems"].as_array().unwrap().iter().any(|p| p.as_str().unwrap().contains("does not read")),
            "{doc}"
        );
        assert!(render(&doc).contains("DOES NOT READ"));
    }
}
