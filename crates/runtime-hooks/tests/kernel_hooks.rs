//! CoreSched and Resctrl (koordlet's `coresched` and `resctrl` hooks) in standalone mode against
//! a real containerd.
//!
//! * CoreSched's `cpu.idle` of the kube-QoS directories, in the real cgroup tree: the test
//!   creates `<harness parent>/kubepods-<unique>/{burstable,besteffort}` (real cgroups: the
//!   kernel gives them `cpu.idle`) and points `--kubepods-cgroup` there. This machine's kernel has
//!   no core scheduling (`prctl(PR_SCHED_CORE)` answers EINVAL): the facility is off, logged
//!   once, and no pod fails.
//! * Resctrl for real pods on a fake resctrl tree (this machine has none): groups, schemata,
//!   the containers' real thread ids in `tasks`, removal of groups whose pod is gone.
//!
//! Each test selects only its own pods (`--selector test=<unique>`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::runtime_client;

const RESCTRL: &str = "node.koordinator.sh/resctrl";
const LLC_MB: &str = r#"{"llc":{"schemata":{"range":[0,30]}},"mb":{"schemata":{"percent":50}}}"#;

fn node_slo(be_sched_idle: u32, policy: &str) -> String {
    format!(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {{name: node-a}}\nspec:\n  resourceQOSStrategy:\n    \
         policies: {{cpuPolicy: {policy}}}\n    lsClass: {{cpuQOS: {{enable: true}}}}\n    \
         beClass: {{cpuQOS: {{enable: true, schedIdle: {be_sched_idle}}}}}\n"
    )
}

/// runtime-hooks in standalone mode; `label`: only the pods with it (`--selector`), `None`: all
/// of the node's pods (whatever plugins `extra` turns on then must touch no other test's pods).
fn start(env: &Containerd, dir: &Path, rules: &Path, label: Option<&(String, String)>, extra: &[&str]) -> Hooks {
    let selector = label.map(|(k, v)| format!("{k}={v}"));
    let mut args = vec![
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--rules",
        rules.to_str().unwrap(),
    ];
    if let Some(selector) = &selector {
        args.extend(["--selector", selector]);
    }
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.join("hooks.log"));
    assert!(
        hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(10)),
        "no first pass:\n{}",
        hooks.log()
    );
    hooks
}

fn set_rules(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Real cgroups `<parent>/kubepods-<unique>/{burstable,besteffort}` in the cpu controller,
/// removed on drop.
struct KubePods {
    name: String,
}

impl KubePods {
    fn new(env: &Containerd) -> KubePods {
        let name = format!("{}/{}", env.cgroup_parent, unique("kubepods"));
        for d in ["", "/burstable", "/besteffort"] {
            std::fs::create_dir_all(format!("/sys/fs/cgroup/cpu{name}{d}")).unwrap();
        }
        KubePods { name }
    }

    fn idle(&self, sub: &str) -> String {
        cgroup("cpu", &format!("{}{sub}", self.name), "cpu.idle")
    }
}

impl Drop for KubePods {
    fn drop(&mut self) {
        for d in ["/besteffort", "/burstable", ""] {
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/cpu{}{d}", self.name));
        }
    }
}

#[tokio::test]
async fn be_kube_qos_cpu_idle_follows_the_node_slo() {
    if !Path::new("/sys/fs/cgroup/cpu/cpu.idle").exists() {
        eprintln!("SKIPPED: this kernel's cgroup v1 cpu controller has no cpu.idle (Linux >= 5.15 has it)");
        return;
    }
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-kernel").tempdir().unwrap();
    let kubepods = KubePods::new(&env);
    assert_eq!(kubepods.idle("/besteffort"), "0", "the kernel's default");
    let rules = rules_file(dir.path(), &node_slo(1, "coreSched"));
    let label = ("test".to_string(), unique("kernel"));
    let hooks = start(
        &env,
        dir.path(),
        &rules,
        Some(&label),
        &["--feature-gates", "CoreSched=true", "--kubepods-cgroup", &kubepods.name],
    );

    // A BE pod below the BestEffort directory, as kubelet would place it: core sched is on for
    // BE in the NodeSLO but this kernel has none, so no cookie and no failure.
    let mut rt = runtime_client(&env.socket);
    let mut sandbox = sandbox_config(&env, &unique("rh"), map(&[(QOS, "BE"), (&label.0, &label.1)]), map(&[]));
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    sandbox.linux.as_mut().unwrap().cgroup_parent = format!("{}/besteffort/pod{uid}", kubepods.name);
    let container = container_config(&env, "main", &["sleep", "3600"], None, &[]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");

    assert!(eventually(Duration::from_secs(5), || kubepods.idle("/besteffort") == "1"), "{}", hooks.log());
    assert_eq!(kubepods.idle("/burstable"), "0");
    assert_eq!(kubepods.idle(""), "0");
    assert!(
        hooks.wait_log(&["drift corrected", "besteffort/cpu.idle", "old=0", "new=1"], 0, Duration::from_secs(2)),
        "{}",
        hooks.log()
    );

    // schedIdle back to 0, then the group identity policy: cpu.idle 0 again.
    set_rules(&rules, &node_slo(0, "coreSched"));
    assert!(eventually(Duration::from_secs(5), || kubepods.idle("/besteffort") == "0"), "{}", hooks.log());
    set_rules(&rules, &node_slo(1, "coreSched"));
    assert!(eventually(Duration::from_secs(5), || kubepods.idle("/besteffort") == "1"), "{}", hooks.log());
    set_rules(&rules, &node_slo(1, "groupIdentity"));
    assert!(eventually(Duration::from_secs(5), || kubepods.idle("/besteffort") == "0"), "{}", hooks.log());

    // The missing kernel feature: said once at start, nothing failed.
    std::thread::sleep(Duration::from_millis(1500));
    let log = hooks.log();
    assert_eq!(hooks.count(&["no core scheduling"]), 1, "{log}");
    assert!(log.contains("core-sched=no"), "{log}");
    let failures = log.lines().filter(|l| {
        l.contains("CoreSched") && !l.contains("no core scheduling") && (l.contains("WARN") || l.contains("fail"))
    });
    assert_eq!(failures.count(), 0, "{log}");
    pod.remove(&mut rt).await;
}

/// The thread ids of a container (its cgroup v1 `tasks`).
fn container_threads(pod: &Pod) -> Vec<u32> {
    pod.cgroup_file("cpu", "tasks").split_whitespace().map(|t| t.parse().unwrap()).collect()
}

fn group_tasks(resctrl: &Path, group: &str) -> Vec<u32> {
    std::fs::read_to_string(resctrl.join(group).join("tasks"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

#[tokio::test]
async fn resctrl_groups_for_real_pods_on_a_fake_tree() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-kernel").tempdir().unwrap();
    let resctrl: PathBuf = dir.path().join("resctrl");
    runtime_hooks::host::resctrl::make_fake_tree(&resctrl, "7ff", &[0, 1]).unwrap();
    std::fs::create_dir(resctrl.join("koordlet-gone")).unwrap(); // left by a pod deleted while we were down
    let rules = rules_file(dir.path(), "cpu: {}\n");
    let label = ("test".to_string(), unique("kernel"));
    // All pods (no selector: a group whose pod this process never saw is removed only with a
    // whole view of the node), and Resctrl alone, on a tree of its own: no other test's pod is
    // touched (only this test's pods carry the annotation).
    let gates = "Resctrl=true,GroupIdentity=false,BatchResource=false,CPUSetAllocator=false";
    let hooks =
        start(&env, dir.path(), &rules, None, &["--feature-gates", gates, "--resctrl-root", resctrl.to_str().unwrap()]);
    assert!(hooks.log().contains("resctrl=yes"), "{}", hooks.log());

    let mut rt = runtime_client(&env.socket);
    let labels = [(QOS, "LS"), (&label.0[..], &label.1[..])];
    let (sandbox, container) = pod_configs(&env, &labels, &[(RESCTRL, LLC_MB)]);
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod with resctrl");
    let (bad_sandbox, bad_container) =
        pod_configs(&env, &labels, &[(RESCTRL, r#"{"llc":{"schemata":{"range":"0-30"}}}"#)]);
    let bad_uid = bad_sandbox.metadata.as_ref().unwrap().uid.clone();
    let bad = Pod::start(&mut rt, bad_sandbox, bad_container).await.expect("pod with a bad annotation");
    let (plain_sandbox, plain_container) = pod_configs(&env, &labels, &[]);
    let plain_uid = plain_sandbox.metadata.as_ref().unwrap().uid.clone();
    let plain = Pod::start(&mut rt, plain_sandbox, plain_container).await.expect("plain pod");

    let group = format!("koordlet-{uid}");
    let threads = container_threads(&pod);
    assert!(!threads.is_empty());
    assert!(
        eventually(Duration::from_secs(5), || { threads.iter().all(|t| group_tasks(&resctrl, &group).contains(t)) }),
        "threads {threads:?} not in {group}/tasks {:?}\n{}",
        group_tasks(&resctrl, &group),
        hooks.log()
    );
    assert_eq!(std::fs::read_to_string(resctrl.join(&group).join("schemata")).unwrap(), "L3:0=f;1=f;\nMB:0=50;1=50;\n");
    assert!(!resctrl.join(format!("koordlet-{plain_uid}")).exists(), "no annotation, no group");
    // The bad annotation fails only this plugin, for that pod, naming the annotation.
    assert!(!resctrl.join(format!("koordlet-{bad_uid}")).exists());
    assert!(hooks.wait_log(&["Resctrl", RESCTRL, "range"], 0, Duration::from_secs(2)), "{}", hooks.log());
    assert_eq!(bad.cgroup_file("cpu", "cpu.shares"), "2", "the pod itself is untouched and running");

    // The group of a pod that is gone goes after koordlet's 10 s grace; ours stays.
    assert!(eventually(Duration::from_secs(15), || !resctrl.join("koordlet-gone").exists()), "{}", hooks.log());
    assert!(resctrl.join(&group).exists());

    // The pod is deleted: its group is removed by a later pass (the grace has passed).
    pod.remove(&mut rt).await;
    assert!(eventually(Duration::from_secs(5), || !resctrl.join(&group).exists()), "{}", hooks.log());
    bad.remove(&mut rt).await;
    plain.remove(&mut rt).await;
}
