//! An operator's view of a running proxy: `GET /status` on the admin endpoint (a JSON
//! document) and `runtime-proxy status`, which fetches it and prints a table.
//!
//! The document holds the node's hook chain settings (conflict policy, required servers), each
//! registered hook server (file, endpoint, stages, failure policy, conflict policy — its own or
//! the node's —, timeout, order) with its health — whether its last call succeeded, its last
//! error and when, failures in a row — the backend (mode, endpoints, up or why not), the store's
//! size, hook calls, failures and refused CRI calls per stage (from the metrics), files
//! rejected, uptime and version, and `healthy` with the `problems` that make it false: the
//! backend down, a server with failure policy `Fail` (or required by the node) whose last call
//! failed (pods are being refused), and what the next pod would meet ([`super::next_pod`]): a
//! `--required-hook-servers` entry not registered, or such a server's socket unreachable now. A
//! failing or unreachable `Ignore` server or a rejected file is a `warning`: pods start, without
//! that server's changes.
//!
//! The hook servers' health is recorded by the dispatcher ([`crate::hooks::hook_health`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use daemon_support::status::{ago, problem_lists, rfc3339, show_duration, str_of, table, unix_ms};
use serde_json::{json, Value};

use crate::admin::debug::DebugEndpoint;
use crate::admin::health::{Health, Verdict};
use crate::admin::next_pod;
use crate::cli::BackendRuntimeMode;
use crate::hooks::hook_health::HookHealth;
use crate::hooks::registry::{FailurePolicy, Registry, Stage};
use crate::hooks::store::Store;
use crate::metrics::Metrics;

/// What the status document says about the process itself (the rest is read when asked).
#[derive(Debug)]
pub struct StatusInfo {
    /// When the process started.
    pub started: SystemTime,
    /// The same, monotonic (uptime).
    pub started_at: Instant,
    /// `--backend-runtime-mode`.
    pub mode: BackendRuntimeMode,
    /// `--remote-runtime-service-endpoint`.
    pub runtime_endpoint: PathBuf,
    /// `--remote-image-service-endpoint` (the runtime's when not given).
    pub image_endpoint: PathBuf,
    /// `--hook-config-dir`.
    pub hook_config_dir: PathBuf,
    /// `--debug-addr`, where `/debug/store` is served.
    pub debug: Arc<DebugEndpoint>,
    /// The hook servers' health, as the dispatcher records it.
    pub hook_health: Arc<HookHealth>,
    /// `--frontend nri`: whether the NRI plugin is connected and synchronized now (the
    /// "backend" is then the runtime's NRI socket, in `runtime_endpoint`).
    pub nri_connected: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// `--hook-conflict-policy` and `--required-hook-servers` ([`crate::hooks::chain`]).
    pub chain: crate::hooks::chain::NodeChain,
}

/// The `GET /status` document (module docs), read now from `info`, the hook calls' counts in
/// `metrics`, the registry's snapshot of `hooks` and the size of `store`; the backend as its
/// latest health checks left it (`health`, [`crate::admin::health`]), waiting for the first ones
/// as `/healthz` does.
pub async fn document(info: &StatusInfo, metrics: &Metrics, hooks: &Registry, store: &Store, health: &Health) -> Value {
    let (_, healthz) = health.healthz().await;
    let now = unix_ms(SystemTime::now());
    let endpoints: Vec<Value> = health
        .verdicts()
        .into_iter()
        .map(|(target, verdict)| {
            let reason = match &verdict {
                Some(Verdict::Up) => None,
                Some(Verdict::Down { reason, .. }) => Some(reason.clone()),
                None => Some("not checked yet".to_owned()),
            };
            json!({
                "endpoint": target.role.label(),
                "socket": target.path,
                "up": verdict.as_ref().is_some_and(Verdict::is_up),
                "error": reason,
            })
        })
        .collect();
    let nri_up = info.nri_connected.as_ref().map(|c| c.load(std::sync::atomic::Ordering::Relaxed));
    let backend: Result<(), String> = match nri_up {
        Some(true) => Ok(()),
        Some(false) => Err("not connected to the runtime's NRI socket (or not synchronized yet)".to_owned()),
        None if health.all_up() => Ok(()),
        None => Err(healthz.trim_end().replace('\n', "; ")),
    };
    let snapshot = hooks.snapshot();
    let names: Vec<&str> = snapshot.servers().iter().map(|s| s.name.as_str()).collect();
    info.hook_health.retain(&names);
    let (mut problems, mut warnings) = (Vec::new(), Vec::new());
    if let Err(why) = &backend {
        problems.push(format!("backend down: {why}"));
    }
    problems.extend(next_pod::missing_required(&info.chain, &snapshot));
    let unreachable_servers = next_pod::unreachable(&snapshot, next_pod::PROBE_TIMEOUT).await;
    let mut servers = Vec::new();
    for server in snapshot.servers() {
        let h = info.hook_health.report(server);
        let failing = h.failures_in_a_row > 0;
        let unreachable = unreachable_servers.get(&server.name);
        let health = match (failing, unreachable, h.last_ok_ms) {
            (true, _, _) => "failing",
            (false, Some(_), _) => "unreachable",
            (false, None, Some(_)) => "ok",
            (false, None, None) => "not called yet",
        };
        if let (false, Some(why)) = (failing, unreachable) {
            let (problem, line) = next_pod::unreachable_line(server, &info.chain, why);
            let list = if problem { &mut problems } else { &mut warnings };
            list.push(line);
        }
        if failing {
            let what = format!(
                "hook server {} (failure-policy {}) failed its last {} call(s): {}",
                server.name,
                server.failure_policy,
                h.failures_in_a_row,
                h.last_error.as_deref().unwrap_or_default()
            );
            match (server.failure_policy, next_pod::refuses(server, &info.chain)) {
                (FailurePolicy::Fail, _) => problems.push(format!("{what}; its stages' CRI calls are refused")),
                (_, true) => problems.push(format!(
                    "{what}; required by --required-hook-servers: its pre stages' CRI calls are refused"
                )),
                (_, false) => warnings.push(format!("{what}; pods go on without it")),
            }
        }
        for w in &server.warnings {
            warnings.push(w.clone());
        }
        let (mut calls, mut failures) = (0u64, 0u64);
        for stage in &server.stages {
            let [ok, error, timeout] = metrics.hook_counts(stage.as_str(), &server.name);
            calls += ok + error + timeout;
            failures += error + timeout;
        }
        servers.push(json!({
            "name": server.name,
            "file": server.file,
            "endpoint": server.endpoint,
            "stages": server.stages.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "failure_policy": server.failure_policy.as_str(),
            "conflict_policy": server.conflict_policy.unwrap_or(info.chain.conflict_policy).as_str(),
            "conflict_policy_explicit": server.conflict_policy.is_some(),
            "timeout_ms": server.timeout.as_millis() as u64,
            "order": server.order,
            "health": health,
            "unreachable": unreachable,
            "failures_in_a_row": h.failures_in_a_row,
            "last_ok": h.last_ok_ms.map(rfc3339),
            "last_error": h.last_error,
            "last_error_at": h.last_failure_ms.map(rfc3339),
            "last_error_ms": h.last_failure_ms,
            "calls": calls,
            "failures": failures,
            "warnings": server.warnings,
        }));
    }
    for r in snapshot.rejected() {
        let kept = if r.serving_last_good { "; its last good version is still registered" } else { "" };
        warnings.push(format!("registration file {} rejected: {}{kept}", r.name, r.error));
    }
    let stages: Vec<Value> = Stage::ALL
        .iter()
        .map(|&stage| {
            let (mut counts, mut refused, mut registered) = ([0u64; 3], 0, 0);
            for server in snapshot.for_stage(stage) {
                registered += 1;
                for (sum, n) in counts.iter_mut().zip(metrics.hook_counts(stage.as_str(), &server.name)) {
                    *sum += n;
                }
                refused += metrics.hook_refusals(stage.as_str(), &server.name);
            }
            json!({
                "stage": stage.as_str(),
                "servers": registered,
                "calls": counts.iter().sum::<u64>(),
                "failures": counts[1] + counts[2],
                "timeouts": counts[2],
                "refused": refused,
            })
        })
        .collect();
    let (pods, containers) = store.len();
    json!({
        "program": "runtime-proxy",
        "version": crate::cli::VERSION,
        "now": rfc3339(now),
        "now_ms": now,
        "started": rfc3339(unix_ms(info.started)),
        "uptime_seconds": info.started_at.elapsed().as_secs(),
        "healthy": problems.is_empty(),
        "problems": problems,
        "warnings": warnings,
        "backend": {
            "mode": match (nri_up, info.mode) {
                (Some(_), _) => "NRI",
                (None, BackendRuntimeMode::Containerd) => "Containerd",
                (None, BackendRuntimeMode::Docker) => "Docker",
            },
            "endpoint": info.runtime_endpoint,
            "image_endpoint": info.image_endpoint,
            "up": backend.is_ok(),
            "error": backend.err(),
            "endpoints": endpoints,
        },
        "store": { "pod_sandboxes": pods, "containers": containers },
        "hook_config_dir": info.hook_config_dir,
        "hook_conflict_policy": info.chain.conflict_policy.as_str(),
        "required_hook_servers": info.chain.required,
        "hook_servers": servers,
        "rejected_files": snapshot.rejected().iter().map(|r| json!({
            "name": r.name, "error": r.error.to_string(), "serving_last_good": r.serving_last_good,
        })).collect::<Vec<_>>(),
        "stages": stages,
        "debug_endpoint": info.debug.bound().map(|a| a.to_string()),
    })
}

/// The table `runtime-proxy status` prints for a status document.
pub fn render(doc: &Value) -> String {
    let mut out = String::new();
    let now = doc["now_ms"].as_u64().unwrap_or(0);
    let uptime = show_duration(std::time::Duration::from_secs(doc["uptime_seconds"].as_u64().unwrap_or(0)));
    let verdict = if doc["healthy"].as_bool() == Some(true) { "healthy" } else { "UNHEALTHY" };
    let _ = writeln!(
        out,
        "runtime-proxy {}, up {uptime} (since {}): {verdict}",
        str_of(doc, "version"),
        str_of(doc, "started")
    );
    let b = &doc["backend"];
    let up = match b["up"].as_bool() {
        Some(true) => "up".to_owned(),
        _ => format!("DOWN: {}", str_of(b, "error")),
    };
    let mut rows =
        vec![vec!["backend".to_owned(), format!("{} unix://{}: {up}", str_of(b, "mode"), str_of(b, "endpoint"))]];
    if b["image_endpoint"] != b["endpoint"] {
        rows.push(vec!["images".to_owned(), format!("unix://{}", str_of(b, "image_endpoint"))]);
    }
    let s = &doc["store"];
    rows.push(vec![
        "store".to_owned(),
        format!("{} pod sandboxes, {} containers", s["pod_sandboxes"], s["containers"]),
    ]);
    rows.push(vec!["hook config".to_owned(), str_of(doc, "hook_config_dir").to_owned()]);
    let required: Vec<&str> = doc["required_hook_servers"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    let required = if required.is_empty() { "none (--required-hook-servers)".to_owned() } else { required.join(",") };
    rows.push(vec![
        "hook chain".to_owned(),
        format!("conflicts: {}; required servers: {required}", str_of(doc, "hook_conflict_policy")),
    ]);
    let debug = match doc["debug_endpoint"].as_str() {
        Some(a) => format!("/debug/store on {a}"),
        None => "off (--debug-addr)".to_owned(),
    };
    rows.push(vec!["debug".to_owned(), debug]);
    out.push_str(&table(&["", ""], &rows).lines().skip(1).map(|l| format!("{l}\n")).collect::<String>());

    let servers = doc["hook_servers"].as_array().cloned().unwrap_or_default();
    out.push('\n');
    if servers.is_empty() {
        out.push_str("hook servers: none registered\n");
    } else {
        let rows: Vec<Vec<String>> = servers
            .iter()
            .map(|h| {
                let stages: Vec<&str> =
                    h["stages"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect()).unwrap_or_default();
                let health = match str_of(h, "health") {
                    "failing" => format!("FAILING ({} in a row)", h["failures_in_a_row"]),
                    "unreachable" => "UNREACHABLE".to_owned(),
                    other => other.to_owned(),
                };
                let last_error = match (h["last_error"].as_str(), h["last_error_ms"].as_u64()) {
                    (Some(e), Some(at)) => format!("{}: {e}", ago(now, at)),
                    _ => "-".to_owned(),
                };
                vec![
                    str_of(h, "name").to_owned(),
                    str_of(h, "endpoint").to_owned(),
                    stages.join(","),
                    str_of(h, "failure_policy").to_owned(),
                    str_of(h, "conflict_policy").to_owned(),
                    format!("{}ms", h["timeout_ms"]),
                    format!("{}/{}", h["failures"], h["calls"]),
                    health,
                    last_error,
                ]
            })
            .collect();
        out.push_str("hook servers\n");
        out.push_str(&table(
            &["NAME", "ENDPOINT", "STAGES", "POLICY", "CONFLICTS", "TIMEOUT", "FAILED/CALLS", "HEALTH", "LAST ERROR"],
            &rows,
        ));
    }

    let stage_rows: Vec<Vec<String>> = doc["stages"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["servers"].as_u64().unwrap_or(0) > 0 || s["calls"].as_u64().unwrap_or(0) > 0)
                .map(|s| {
                    vec![
                        str_of(s, "stage").to_owned(),
                        s["servers"].to_string(),
                        s["calls"].to_string(),
                        s["failures"].to_string(),
                        s["timeouts"].to_string(),
                        s["refused"].to_string(),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    if !stage_rows.is_empty() {
        out.push_str("\nhook calls by stage\n");
        out.push_str(&table(&["STAGE", "SERVERS", "CALLS", "FAILURES", "TIMEOUTS", "REFUSED"], &stage_rows));
    }
    out.push_str(&problem_lists(doc));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_servers_policies_and_errors() {
        let doc = json!({
            "version": "0.1.0 (git abc)", "now_ms": 60_000u64, "started": "1970-01-01T00:00:00.000Z", "uptime_seconds": 60,
            "healthy": false,
            "problems": ["backend down: x"], "warnings": [],
            "backend": {"mode": "Containerd", "endpoint": "/run/c.sock", "image_endpoint": "/run/c.sock", "up": false, "error": "no socket"},
            "store": {"pod_sandboxes": 1, "containers": 2},
            "hook_config_dir": "/etc/runtime/hookserver.d",
            "hook_conflict_policy": "Warn", "required_hook_servers": ["strict.json", "gpu.json"],
            "hook_servers": [{"name": "strict.json", "endpoint": "/run/s.sock", "stages": ["PreCreateContainer"],
                "failure_policy": "Fail", "conflict_policy": "Fail", "timeout_ms": 300, "health": "failing", "failures_in_a_row": 1,
                "last_error": "PreCreateContainer: Unavailable: refused", "last_error_ms": 48_000u64, "calls": 3, "failures": 1}],
            "stages": [{"stage": "PreCreateContainer", "servers": 1, "calls": 3, "failures": 1, "timeouts": 0, "refused": 1},
                       {"stage": "PreStartContainer", "servers": 0, "calls": 0, "failures": 0, "timeouts": 0}],
            "debug_endpoint": null,
        });
        let text = render(&doc);
        for want in [
            "up 1m00s",
            "UNHEALTHY",
            "Containerd unix:///run/c.sock: DOWN: no socket",
            "1 pod sandboxes, 2 containers",
            "off (--debug-addr)",
            "strict.json",
            "conflicts: Warn; required servers: strict.json,gpu.json",
            "CONFLICTS",
            "/run/s.sock  PreCreateContainer  Fail    Fail",
            "300ms",
            "FAILING (1 in a row)",
            "12s ago: PreCreateContainer: Unavailable: refused",
            "- backend down: x",
        ] {
            assert!(text.contains(want), "{want:?} missing:\n{text}");
        }
        assert!(!text.contains("PreStartContainer"), "stages nobody registered are left out:\n{text}");
    }
}
