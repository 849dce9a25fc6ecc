//! `runtime-hooks status` (the real binary) against a running runtime-hooks: its mode, plugins,
//! stages, registration, rules file and the rules in force with their last change, the
//! reconciler's last pass on a real containerd; exit codes 0 (healthy), 1 (unhealthy) and 2
//! (no status).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;
use test_support::containerd::{unique, Containerd};

/// What one `runtime-hooks status …` printed, and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn status(addr: &str, extra: &[&str]) -> Run {
    let out = Command::new(HOOKS_BIN)
        .arg("status")
        .args(["--metrics-addr", addr])
        .args(extra)
        .output()
        .expect("run runtime-hooks status");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn status_json(addr: &str) -> Value {
    let run = status(addr, &["-o", "json"]);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", run.stdout, run.stderr))
}

/// The admin endpoint's address, from the log line `admin endpoint: … addr=IP:PORT`.
fn admin_addr(hooks: &Hooks) -> String {
    assert!(hooks.wait_log(&["admin endpoint"], 0, Duration::from_secs(10)), "no admin endpoint:\n{}", hooks.log());
    let log = hooks.log();
    let line = log.lines().find(|l| l.contains("admin endpoint")).unwrap_or_default();
    line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()).unwrap_or_default().to_owned()
}

/// Replaces the rules file atomically, as a ConfigMap update or an editor does.
fn write_rules(path: &Path, text: &str) {
    let tmp = path.with_file_name(".rules.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

const BE_GROUP_IDENTITY: &str = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec:\n  resourceQOSStrategy:\n    beClass: {cpuQOS: {enable: true, groupIdentity: -1}}\n";

#[test]
fn status_in_proxy_mode_shows_plugins_registration_and_the_rules_in_force() {
    let dir = tempfile::Builder::new().prefix("rh-status").tempdir().unwrap();
    let (socket, conf, rules) =
        (dir.path().join("hooks.sock"), dir.path().join("hookserver.d"), dir.path().join("rules.yaml"));
    std::fs::write(&rules, BE_GROUP_IDENTITY).unwrap();
    let args = [
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        conf.to_str().unwrap(),
        "--rules",
        rules.to_str().unwrap(),
        "--feature-gates",
        "CPUSetAllocator=false",
        "--failure-policy",
        "Fail",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["serving runtime hooks"], 0, Duration::from_secs(10)), "{}", hooks.log());
    let addr = admin_addr(&hooks);

    // The first scrape: the rules file's series at 0 before its first change, and the build
    // info with what `--version` prints (`runtime-hooks 0.1.0 (git 27cbb9f)`).
    let (code, metrics) = test_support::http_get(&addr, "/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("runtime_hooks_rule_changes_total{source=\"file\"} 0"), "{metrics}");
    let version = Command::new(HOOKS_BIN).arg("--version").output().unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    let (package, revision) =
        version.trim().strip_prefix("runtime-hooks ").and_then(|v| v.split_once(" (git ")).unwrap();
    let build =
        format!("runtime_hooks_build_info{{version=\"{package}\",revision=\"{}\"}} 1", revision.trim_end_matches(')'));
    assert!(metrics.contains(&build), "{build} missing:\n{metrics}");

    let run = status(&addr, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let registration = conf.join("runtime-hooks.json");
    for want in [
        "healthy",
        "proxy",
        "GroupIdentity, BatchResource (plugin failure policy Ignore)",
        "PreRunPodSandbox",
        &format!("{} -> {} (failure-policy Fail): in place", registration.display(), socket.display()),
        &format!("{} (reads fine)", rules.display()),
        "not since start",
        "rules in force",
        "\"groupIdentity\"",
    ] {
        assert!(run.stdout.contains(want), "{want:?} missing:\n{}", run.stdout);
    }
    let doc = status_json(&addr);
    assert_eq!(doc["mode"], "proxy");
    assert_eq!(doc["plugins"], serde_json::json!(["GroupIdentity", "BatchResource"]));
    assert_eq!(doc["registration"]["in_place"], true, "{doc:#}");
    assert_eq!(doc["rules"]["in_force"]["groupIdentity"]["be"], -1, "the file's rules: {doc:#}");
    assert_eq!(doc["rules"]["file"], rules.to_str().unwrap());
    assert!(doc["rules"]["cluster"].is_null() && doc.get("reconciler").is_none(), "{doc:#}");

    // A rules file that does not parse: the rules in force stay, status says why (exit 1).
    write_rules(&rules, "kind: NodeSLO\nspec: {resourceQOSStrategy: {beClass: {cpuQOS: {groupIdentity: 9}}}}\n");
    assert!(eventually(Duration::from_secs(15), || status(&addr, &[]).code == 1), "{}", hooks.log());
    let run = status(&addr, &[]);
    assert!(run.stdout.contains("DOES NOT READ") && run.stdout.contains("groupIdentity"), "{}", run.stdout);
    let doc = status_json(&addr);
    assert_eq!(doc["rules"]["in_force"]["groupIdentity"]["be"], -1, "kept: {doc:#}");
    assert!(doc["problems"][0].as_str().unwrap().contains("does not read"), "{doc:#}");

    // A good version: healthy again, the change and its source shown.
    write_rules(&rules, &BE_GROUP_IDENTITY.replace("groupIdentity: -1", "groupIdentity: 0"));
    assert!(eventually(Duration::from_secs(15), || status(&addr, &[]).code == 0), "{}", hooks.log());
    let doc = status_json(&addr);
    assert_eq!(doc["rules"]["in_force"]["groupIdentity"]["be"], 0, "{doc:#}");
    assert_eq!(
        (doc["rules"]["last_changed_by"].as_str(), doc["rules"]["changes"].as_u64()),
        (Some("file"), Some(1)),
        "{doc:#}"
    );
    assert!(status(&addr, &[]).stdout.contains("from the file; 1 change(s) since start"));
}

/// Standalone mode on a real containerd: the reconciler's last pass (when, why, what it saw).
#[test]
fn status_in_standalone_mode_shows_the_reconcilers_last_pass() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-status").tempdir().unwrap();
    let selector = format!("test={}", unique("status"));
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--selector",
        &selector,
        "--reconcile-interval",
        "30s",
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(10)), "{}", hooks.log());
    let addr = admin_addr(&hooks);
    let run = status(&addr, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(&format!("unix://{} every 30s; last pass ", env.socket.display())), "{}", run.stdout);
    assert!(run.stdout.contains("(start): 0 pods, 0 containers, 0 corrected, 0 failures"), "{}", run.stdout);
    assert!(run.stdout.contains("none (koordlet's defaults unless the cluster gives them)"), "{}", run.stdout);
    let doc = status_json(&addr);
    assert_eq!(doc["reconciler"]["last_pass"]["reason"], "start", "{doc:#}");
    assert!(doc.get("registration").is_none(), "no registration in standalone mode: {doc:#}");
}

/// A runtime the reconciler cannot list is unhealthy (exit 1) and says why; no endpoint is
/// exit 2 with one line.
#[test]
fn status_is_1_when_the_reconciler_fails_and_2_without_an_endpoint() {
    let dir = tempfile::Builder::new().prefix("rh-status").tempdir().unwrap();
    let missing = dir.path().join("containerd.sock");
    let args =
        ["--mode", "standalone", "--runtime-endpoint", missing.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0"];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    let addr = admin_addr(&hooks);
    assert!(eventually(Duration::from_secs(10), || status(&addr, &[]).code == 1), "{}", hooks.log());
    let run = status(&addr, &[]);
    assert!(run.stdout.contains("FAILED") && run.stdout.contains("reconciler: the last pass failed"), "{}", run.stdout);

    let run = status("off", &[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.starts_with("runtime-hooks: status: --metrics-addr is off"), "{}", run.stderr);
    let free = test_support::free_loopback_addr();
    let run = status(&free, &[]);
    assert_eq!((run.code, run.stdout.as_str()), (2, ""));
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains(&free), "{}", run.stderr);
}
