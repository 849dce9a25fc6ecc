//! Rules from a real kube-apiserver (envtest's convention): with `KUBEBUILDER_ASSETS` naming a
//! directory with `kube-apiserver` (and `etcd`, else Debian's `/usr/bin/etcd`), the harness
//! (`test_support::envtest`) starts both on loopback with token authentication and RBAC, applies
//! the NodeSLO and NodeResourceTopology CRDs and runtime-hooks' ClusterRole, and these tests run
//! the scenarios of `cluster_rules.rs` through real create/patch/delete, with runtime-hooks
//! authenticated as its ServiceAccount; plus an identity without `nodeslos` rights. Without
//! `KUBEBUILDER_ASSETS` each test prints one line saying so (`setup-envtest use 1.31 -p path`).

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use test_support::containerd::{unique, Containerd, Pod};
use test_support::envtest::Envtest;
use test_support::runtime_client;

const NODE: &str = "node-a";
const NODESLOS: &str = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";

/// The control plane, or `None` (the test returns) without `KUBEBUILDER_ASSETS`; the skip line
/// is printed once per run, not once per test.
fn envtest(dir: &std::path::Path) -> Option<Envtest> {
    static SKIP: std::sync::Once = std::sync::Once::new();
    let mut line = Vec::new();
    let api = Envtest::start_from(std::env::var_os("KUBEBUILDER_ASSETS"), dir, &mut line);
    if api.is_none() {
        // Past the test harness's output capture, which takes `eprint!`.
        SKIP.call_once(|| drop(std::io::Write::write_all(&mut std::io::stderr(), &line)));
    }
    api
}

fn standalone(env: &Containerd, kubeconfig: &std::path::Path, dir: &std::path::Path, selector: &str) -> Hooks {
    let args = [
        "--mode",
        "standalone",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "0s",
        "--selector",
        selector,
    ];
    Hooks::start(&args, dir.join("hooks.log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_slo_create_patch_delete_reach_a_running_pod() {
    let dir = tempfile::tempdir().unwrap();
    let Some(api) = envtest(dir.path()) else { return };
    let env = Containerd::from_env();
    assert!(api.create(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})).ok());
    let slo = json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
        "spec": {"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressPolicy": "cfsQuota"}}});
    let created = api.create(&slo);
    assert!(created.ok(), "{} {}", created.status, created.body);
    let label = ("test".to_string(), unique("envtest"));
    let hooks = standalone(&env, &api.hooks_kubeconfig, dir.path(), &format!("{}={}", label.0, label.1));
    assert!(
        hooks.wait_log(&["watching the node's NodeSLO", "found=true"], 0, Duration::from_secs(20)),
        "{}",
        hooks.log()
    );

    let mut rt = runtime_client(&env.socket);
    let (sandbox, container) = pod_configs(&env, &[(QOS, "BE"), (&label.0, &label.1)], &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, besteffort(sandbox), container).await.expect("BE pod");
    let quota = || pod.cgroup_file("cpu", "cpu.cfs_quota_us");
    let patch = |policy: &str| {
        let a = api.request(
            "PATCH",
            &format!("{NODESLOS}/{NODE}"),
            Some(&json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": policy}}})),
        );
        assert!(a.ok(), "{} {}", a.status, a.body);
    };
    patch("cpuset");
    assert!(
        eventually(Duration::from_secs(5), || quota() == "100000"),
        "after the patch: {}\n{}",
        quota(),
        hooks.log()
    );
    patch("cfsQuota");
    assert!(
        eventually(Duration::from_secs(5), || quota() == "-1"),
        "after the patch back: {}\n{}",
        quota(),
        hooks.log()
    );
    // A value the CRD's schema lets through but koordlet does not know: an Event on the Node.
    patch("bogus");
    let events = || api.request("GET", "/api/v1/namespaces/default/events", None).json();
    let ok = eventually(Duration::from_secs(10), || {
        events()["items"].as_array().is_some_and(|items| items.iter().any(|e| e["reason"] == "RuleParseFailed"))
    });
    assert!(ok, "no RuleParseFailed Event: {}\n{}", events(), hooks.log());
    assert_eq!(quota(), "-1", "the last good NodeSLO stays");
    let deleted = api.request("DELETE", &format!("{NODESLOS}/{NODE}"), None);
    assert!(deleted.ok(), "{} {}", deleted.status, deleted.body);
    assert!(
        eventually(Duration::from_secs(5), || quota() == "100000"),
        "after the deletion: {}\n{}",
        quota(),
        hooks.log()
    );
    pod.remove(&mut rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_without_nodeslo_rights_is_told_which_permission_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(api) = envtest(dir.path()) else { return };
    let env = Containerd::from_env();
    let hooks = standalone(&env, &api.limited_kubeconfig, dir.path(), &format!("test={}", unique("envtest")));
    let ok = hooks.wait_log(
        &["403 Forbidden", "cannot list resource", "nodeslos", "ClusterRole"],
        0,
        Duration::from_secs(20),
    );
    assert!(ok, "{}", hooks.log());
    // The other objects are still watched, and hooks still served (the reconciler ran).
    assert!(
        hooks.wait_log(&["watching the node's NodeResourceTopology"], 0, Duration::from_secs(20)),
        "{}",
        hooks.log()
    );
    assert!(hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(5)), "{}", hooks.log());
}
