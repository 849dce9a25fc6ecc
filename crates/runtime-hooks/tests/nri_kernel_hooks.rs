//! Resctrl in NRI mode on a real containerd 1.7 with NRI on (`RP_NRI=1 scripts/containerd.sh up
//! 1.7 ROOT`; `scripts/test.sh` runs the `nri_*` targets in their own phase), with a fake
//! resctrl tree (this machine has none): the group is made right after RunPodSandbox, the
//! container's real threads join it once it has started (node-level work at
//! PostStartContainer), and RemovePodSandbox removes it at once (koordlet's
//! PreRemoveRunPodSandbox, [`runtime_hooks::plugin::Plugin::pod_removed`]) — sooner than the
//! all-pods cleanup's 10 s grace could.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd};
use test_support::runtime_client;

const RESCTRL: &str = "node.koordinator.sh/resctrl";

/// The NRI socket of the harness's env file; `None` (skipped, loudly) without one.
fn nri_socket() -> Option<PathBuf> {
    let file = std::env::var("RP_CONTAINERD_ENV").unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let socket = text.lines().find_map(|l| l.strip_prefix("NRI_SOCKET=")).map(PathBuf::from);
    if socket.is_none() {
        eprintln!(
            "SKIPPED: {file} has no NRI_SOCKET (start containerd with RP_NRI=1 scripts/containerd.sh up 1.7 ROOT)"
        );
    }
    socket
}

fn group_tasks(resctrl: &Path, group: &str) -> Vec<u32> {
    std::fs::read_to_string(resctrl.join(group).join("tasks"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn resctrl_group_follows_the_pod_through_nri_events() {
    let Some(socket) = nri_socket() else { return };
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-nri-kernel").tempdir().unwrap();
    let resctrl = dir.path().join("resctrl");
    runtime_hooks::host::resctrl::make_fake_tree(&resctrl, "fff", &[0]).unwrap();
    let rules = rules_file(dir.path(), "cpu: {}\n");
    let label = ("test".to_string(), unique("nri-kernel"));
    let selector = format!("{}={}", label.0, label.1);
    let hooks = Hooks::start(
        &[
            "--mode",
            "nri",
            "--nri-socket",
            socket.to_str().unwrap(),
            "--nri-plugin-name",
            "runtime-hooks-kernel",
            "--nri-plugin-index",
            "10",
            "--rules",
            rules.to_str().unwrap(),
            "--selector",
            &selector,
            "--feature-gates",
            "Resctrl=true",
            "--resctrl-root",
            resctrl.to_str().unwrap(),
        ],
        dir.path().join("hooks.log"),
    );
    assert!(
        hooks.wait_log(&["NRI: applied to known pods", "synchronize"], 0, Duration::from_secs(10)),
        "not synchronized:\n{}",
        hooks.log()
    );

    let mut rt = runtime_client(&env.socket);
    let annotation = r#"{"llc":{"schemata":{"range":[50,100]}},"mb":{"schemata":{"percent":25}}}"#;
    let sandbox =
        sandbox_config(&env, &unique("rh"), map(&[(QOS, "LS"), (&label.0, &label.1)]), map(&[(RESCTRL, annotation)]));
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    let group = format!("koordlet-{uid}");
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    // RunPodSandbox: the group and its schemata (12 ways, upper half; Intel-style 25 → 30 or,
    // on other vendors, whatever this CPU is: only the L3 line is certain).
    assert!(eventually(Duration::from_secs(3), || resctrl.join(&group).join("schemata").exists()), "{}", hooks.log());
    let schemata = std::fs::read_to_string(resctrl.join(&group).join("schemata")).unwrap();
    assert!(schemata.starts_with("L3:0=fc0;\n"), "{schemata:?}");

    let container = container_config(&env, "main", &["sleep", "3600"], None, &[]);
    let container_id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .expect("CreateContainer: no RDT class on a test tree")
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() })
        .await
        .expect("StartContainer");
    let tasks_file =
        format!("/sys/fs/cgroup/cpu{}/{container_id}/tasks", sandbox.linux.as_ref().unwrap().cgroup_parent);
    let threads: Vec<u32> =
        std::fs::read_to_string(&tasks_file).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert!(!threads.is_empty());
    assert!(
        eventually(Duration::from_secs(3), || threads.iter().all(|t| group_tasks(&resctrl, &group).contains(t))),
        "threads {threads:?} not in the group's tasks {:?} after PostStartContainer\n{}",
        group_tasks(&resctrl, &group),
        hooks.log()
    );

    // RemovePodSandbox: the group goes at once (the cleanup pass alone would wait 10 s).
    remove_sandbox(&mut rt, &sandbox_id).await;
    assert!(eventually(Duration::from_secs(2), || !resctrl.join(&group).exists()), "{}", hooks.log());
    // The line is written after the directory goes: waited for, not read at once.
    let removed = hooks.wait_log(&["group removed with its pod"], 0, Duration::from_secs(2));
    assert!(removed && hooks.count(&["group removed with its pod"]) == 1, "{}", hooks.log());
}
