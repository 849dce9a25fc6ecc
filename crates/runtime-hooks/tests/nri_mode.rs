//! NRI mode on a real containerd 1.7 or 2.1 with NRI on (`RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`;
//! `scripts/test.sh` runs this target in its own phase, against its own containerd). No proxy:
//! pods are created directly on containerd, which calls runtime-hooks as an NRI plugin.
//!
//! The tests run one at a time (a lock): every NRI plugin sees every pod of its containerd, and
//! some tests restart containerd or stop the plugin. Each test's plugin still selects only its
//! own pods (`--selector`).

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use test_support::runtime_client;
use tonic::transport::Channel;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The harness's env file, with NRI's socket.
struct Env {
    ctrd: Containerd,
    nri_socket: PathBuf,
    root: PathBuf,
}

/// `None` (the test is skipped, loudly) when the containerd under test has no NRI.
fn env() -> Option<Env> {
    let ctrd = Containerd::from_env();
    let file = std::env::var("RP_CONTAINERD_ENV").unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let get =
        |k: &str| text.lines().find_map(|l| l.strip_prefix(k).and_then(|v| v.strip_prefix('='))).map(PathBuf::from);
    match get("NRI_SOCKET") {
        Some(nri_socket) => Some(Env { ctrd, nri_socket, root: get("CONTAINERD_ROOT").expect("CONTAINERD_ROOT") }),
        None => {
            eprintln!("SKIPPED: {file} has no NRI_SOCKET (start containerd with RP_NRI=1 scripts/containerd.sh up 1.7 ROOT, or 2.1)");
            None
        }
    }
}

struct Plugin {
    hooks: Hooks,
    label: (String, String),
    rules: PathBuf,
    _dir: tempfile::TempDir,
}

/// runtime-hooks in NRI mode, selecting pods labelled `test=<unique>`; waits until it is
/// synchronized when `wait` is set.
fn start_plugin(env: &Env, wait: bool) -> Plugin {
    start_plugin_with(env, wait, &[])
}

/// [`start_plugin`] with `extra` flags.
fn start_plugin_with(env: &Env, wait: bool, extra: &[&str]) -> Plugin {
    let dir = tempfile::Builder::new().prefix("rh-nri").tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "cpu: {}\n").unwrap();
    let label = ("test".to_string(), unique("nri"));
    let selector = format!("{}={}", label.0, label.1);
    let mut args = vec![
        "--mode",
        "nri",
        "--nri-socket",
        env.nri_socket.to_str().unwrap(),
        "--nri-plugin-name",
        "runtime-hooks-test",
        "--nri-plugin-index",
        "10",
        "--rules",
        rules.to_str().unwrap(),
        "--selector",
        &selector,
    ];
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    if wait {
        assert!(
            hooks.wait_log(&["NRI: applied to known pods", "synchronize"], 0, Duration::from_secs(10)),
            "not synchronized:\n{}",
            hooks.log()
        );
    }
    Plugin { hooks, label, rules, _dir: dir }
}

impl Plugin {
    fn labels<'a>(&'a self, qos: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![(QOS, qos), (&self.label.0, &self.label.1)]
    }

    fn set_rules(&self, text: &str) {
        let tmp = self.rules.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.rules).unwrap();
    }
}

/// A pod whose container prints its own cgroup values when it starts, then sleeps.
fn reporting_pod(
    env: &Env,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let sandbox = sandbox_config(&env.ctrd, &unique("rh-nri"), map(labels), map(annotations));
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let script = "echo shares=$(cat /sys/fs/cgroup/cpu/cpu.shares) quota=$(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) \
                  period=$(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us) mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes) \
                  cpus=$(cat /sys/fs/cgroup/cpuset/cpuset.cpus); exec sleep 3600";
    let container = container_config(&env.ctrd, "main", &["sh", "-c", script], Some(resources), &[]);
    (sandbox, container)
}

/// What the container printed at start (its CRI log, without the timestamp and stream).
fn startup_line(env: &Env, sandbox: &cri::PodSandboxConfig) -> String {
    let uid = &sandbox.metadata.as_ref().unwrap().uid;
    let path = env.ctrd.log_root.join(uid).join("main.log");
    let mut text = String::new();
    eventually(Duration::from_secs(10), || {
        text = std::fs::read_to_string(&path).unwrap_or_default();
        text.contains("cpus=")
    });
    text.lines()
        .find(|l| l.contains("shares="))
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(l).to_owned())
        .unwrap_or(text)
}

/// The OCI spec containerd stored for a container (verbose ContainerStatus), `linux.resources`.
async fn spec_resources(rt: &mut RuntimeServiceClient<Channel>, id: &str) -> serde_json::Value {
    let status = rt
        .container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: true })
        .await
        .unwrap()
        .into_inner();
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    info["runtimeSpec"]["linux"]["resources"].clone()
}

/// RunPodSandbox and CreateContainer, without StartContainer.
async fn create(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox: &cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> Result<(String, String), tonic::Status> {
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() })
        .await?
        .into_inner()
        .pod_sandbox_id;
    let created = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox.clone()),
        })
        .await;
    match created {
        Ok(r) => Ok((sandbox_id, r.into_inner().container_id)),
        Err(e) => {
            remove_sandbox(rt, &sandbox_id).await;
            Err(e)
        }
    }
}

fn pod_values(parent: &str) -> (String, String, String) {
    (
        cgroup("cpu", parent, "cpu.shares"),
        cgroup("cpu", parent, "cpu.cfs_quota_us"),
        cgroup("memory", parent, "memory.limit_in_bytes"),
    )
}

const BE_LINE: &str = "shares=512 quota=100000 period=100000 mem=134217728";

#[tokio::test]
async fn be_pod_gets_koordlet_values_before_its_process_starts() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let mut plugin = start_plugin(&env, true);
    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let sandbox = besteffort(sandbox);
    let (sandbox_id, container_id) = create(&mut rt, &sandbox, container).await.expect("BE pod on containerd");
    let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();

    // RunPodSandbox: the pod cgroup got koordlet's pod-level values from runtime-hooks.
    assert_eq!(
        pod_values(&parent),
        ("512".into(), "100000".into(), "134217728".into()),
        "pod cgroup\n{}",
        plugin.hooks.log()
    );
    // CreateContainer, before any process: the adjustment is in the spec containerd stored.
    let spec = spec_resources(&mut rt, &container_id).await;
    assert_eq!(spec["cpu"]["shares"], 512, "{spec}");
    assert_eq!((spec["cpu"]["quota"].clone(), spec["cpu"]["period"].clone()), (100000.into(), 100000.into()), "{spec}");
    assert_eq!(spec["memory"]["limit"], 134217728, "{spec}");
    let shared = cgroup("cpuset", "", "cpuset.cpus");
    assert_eq!(spec["cpu"]["cpus"], shared.as_str(), "BE: the shared pool, spelled out\n{spec}");

    // The process sees them from its first instruction.
    rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() })
        .await
        .expect("StartContainer");
    let line = startup_line(&env, &sandbox);
    assert_eq!(line, format!("{BE_LINE} cpus={shared}"), "what the container read at start");

    // UpdateContainerResources with kubelet's BestEffort values: the plugin's fields win.
    let update =
        cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, cpu_quota: 0, ..Default::default() };
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: container_id.clone(),
        linux: Some(update),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    let pod = Pod { sandbox_id, container_id, config: sandbox };
    assert_eq!(
        pod.cgroup_file("cpu", "cpu.shares"),
        "512",
        "kept through UpdateContainerResources\n{}",
        plugin.hooks.log()
    );
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");
    assert!(plugin.hooks.count(&["PreUpdateContainerResources", "cpu_shares=512"]) >= 1, "{}", plugin.hooks.log());
    pod.remove(&mut rt).await;

    // SIGTERM: a clean exit; containerd drops the plugin and goes on.
    assert_eq!(plugin.hooks.terminate(), Some(0), "{}", plugin.hooks.log());
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("a pod without the plugin");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2", "no plugin: kubelet's value");
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn lsr_pod_gets_its_cpuset_and_no_quota() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let plugin = start_plugin(&env, true);
    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("LSR"), &[(STATUS, r#"{"cpuset": " 1 "}"#)]);
    let pod = Pod::start(&mut rt, sandbox.clone(), container).await.expect("LSR pod");
    assert_eq!(pod.cgroup_file("cpuset", "cpuset.cpus"), "1", "{}", plugin.hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1");
    assert!(startup_line(&env, &sandbox).ends_with("cpus=1"), "{}", startup_line(&env, &sandbox));
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn rule_change_is_reapplied_to_running_pods() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let plugin = start_plugin(&env, true);
    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_period_us"), "100000");
    plugin.set_rules("cpu: {cfsPeriodUs: 50000}\n");
    let ok = eventually(Duration::from_secs(5), || {
        (pod.cgroup_file("cpu", "cpu.cfs_period_us"), pod.cgroup_file("cpu", "cpu.cfs_quota_us"))
            == ("50000".into(), "50000".into())
    });
    assert!(ok, "container not updated for the new rules\n{}", plugin.hooks.log());
    let parent = pod.cgroup_parent();
    assert_eq!(
        (cgroup("cpu", &parent, "cpu.cfs_period_us"), cgroup("cpu", &parent, "cpu.cfs_quota_us")),
        ("50000".into(), "50000".into())
    );
    assert!(plugin.hooks.count(&["NRI: containers updated for the new rules"]) >= 1, "{}", plugin.hooks.log());
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn synchronize_applies_to_pods_that_existed_before_the_plugin() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let mut rt = runtime_client(&env.ctrd.socket);
    // The plugin's label is chosen before it starts, so the pod made before it is selected.
    let mut plugin = start_plugin(&env, true);
    plugin.hooks.terminate();
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod without a plugin");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    let selector = format!("{}={}", plugin.label.0, plugin.label.1);
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        env.nri_socket.to_str().unwrap(),
        "--nri-plugin-index",
        "10",
        "--selector",
        &selector,
    ];
    let hooks = Hooks::start(&args, plugin._dir.path().join("hooks2.log"));
    assert!(hooks.wait_log(&["synchronize", "updates=1"], 0, Duration::from_secs(10)), "{}", hooks.log());
    let ok = eventually(Duration::from_secs(5), || pod.cgroup_file("cpu", "cpu.shares") == "512");
    assert!(ok, "not corrected by Synchronize\n{}", hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728");
    assert_eq!(pod_values(&pod.cgroup_parent()), ("512".into(), "100000".into(), "134217728".into()));
    // containerd's spec holds the values now (it reports them in Synchronize): a plugin that
    // connects again answers no update, and the runtime's lock is not held to apply one.
    drop(hooks);
    let hooks = Hooks::start(&args, plugin._dir.path().join("hooks3.log"));
    let held = hooks.wait_log(&["synchronize", "updates=0", "held=1"], 0, Duration::from_secs(10));
    assert!(held, "the values the runtime holds were sent again:\n{}", hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512");
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn reconnects_when_containerd_restarts() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let plugin = start_plugin(&env, true);
    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let before = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");

    restart_containerd(&env.ctrd, &env.root);
    assert!(plugin.hooks.wait_log(&["NRI connection lost"], 0, Duration::from_secs(10)), "{}", plugin.hooks.log());
    assert!(
        plugin.hooks.wait_log(&["NRI: registered"], 1, Duration::from_secs(20)),
        "not registered again\n{}",
        plugin.hooks.log()
    );
    // The new containerd synchronized the plugin with the pod that survived the restart; its
    // container holds the values it got at creation (containerd reports them): no update.
    assert!(
        plugin.hooks.wait_log(&["synchronize", "pods=1", "updates=0", "held=1"], 0, Duration::from_secs(10)),
        "{}",
        plugin.hooks.log()
    );

    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let after = Pod::start(&mut rt, sandbox.clone(), container).await.expect("BE pod after the restart");
    assert_eq!(after.cgroup_file("cpu", "cpu.shares"), "512", "{}", plugin.hooks.log());
    assert!(startup_line(&env, &sandbox).starts_with(BE_LINE));
    after.remove(&mut rt).await;
    before.remove(&mut rt).await;
}

#[tokio::test]
async fn pods_start_when_the_plugin_dies_or_hangs() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let mut rt = runtime_client(&env.ctrd.socket);

    // Killed: the socket closes, containerd drops the plugin at once.
    let plugin = start_plugin(&env, true);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(plugin.hooks.pid(), libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let start = Instant::now();
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("a pod after the plugin was killed");
    let killed = start.elapsed();
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    pod.remove(&mut rt).await;

    // Hung (SIGSTOP): containerd waits its request timeout (2 s here), drops the plugin, and
    // the pod starts without it.
    let plugin = start_plugin(&env, true);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(plugin.hooks.pid(), libc::SIGSTOP) };
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let start = Instant::now();
    let pod = Pod::start(&mut rt, sandbox, container).await;
    let hung = start.elapsed();
    // SAFETY: as above.
    unsafe { libc::kill(plugin.hooks.pid(), libc::SIGCONT) };
    let pod = pod.expect("a pod while the plugin hangs");
    eprintln!("pod start: plugin killed {killed:?}, plugin hung {hung:?}");
    assert!(hung >= Duration::from_millis(1900), "containerd waited {hung:?} for the hung plugin");
    assert!(hung < Duration::from_secs(8), "{hung:?}");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2", "the plugin was dropped");
    pod.remove(&mut rt).await;
    // Once it runs again it finds the connection closed and registers anew.
    assert!(plugin.hooks.wait_log(&["NRI: registered"], 1, Duration::from_secs(15)), "{}", plugin.hooks.log());
}

/// SIGTERM the harness's containerd and start it again with the same config and series (`ctrd`:
/// 1.7 or 2.1; pods keep running in their shims).
fn restart_containerd(ctrd: &Containerd, root: &Path) {
    let pid: i32 = std::fs::read_to_string(root.join("containerd.pid")).unwrap().trim().parse().unwrap();
    // SAFETY: kill(2) on the harness's containerd, by its recorded pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert!(
        eventually(Duration::from_secs(10), || !Path::new(&format!("/proc/{pid}/cmdline")).exists() || zombie(pid)),
        "containerd did not stop"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd.sh");
    let out =
        std::process::Command::new(script).args(["up", ctrd.series()]).arg(root).env("RP_NRI", "1").output().unwrap();
    assert!(out.status.success(), "containerd.sh up: {}", String::from_utf8_lossy(&out.stderr));
}

fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z")).unwrap_or(true)
}

/// A reporting BE pod whose annotation `note` and env `TOKEN` get bytes that are not UTF-8
/// ([`start_pod_with_bytes`]).
fn pod_with_bytes(env: &Env, labels: &[(&str, &str)]) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let (sandbox, mut container) = reporting_pod(env, labels, &[(SPEC, BE_SPEC)]);
    let mut sandbox = sandbox;
    sandbox.annotations.insert("note".into(), ANNOTATION_BYTES.into());
    container.envs.push(cri::KeyValue { key: "TOKEN".into(), value: ENV_BYTES.into() });
    (sandbox, container)
}

/// Removes a sandbox when dropped, also when the test fails: a pod with bytes left behind would
/// make containerd fail to synchronize the plugins of every later test.
struct RemoveOnDrop(PathBuf, String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let (socket, id) = (self.0.clone(), self.1.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async { remove_sandbox(&mut runtime_client(&socket), &id).await });
        })
        .join();
    }
}

/// A pod author's bytes that are not UTF-8 (a pod annotation, a container env value, as from a
/// Secret with binary data), against containerd 1.7.24 and 2.1.9: their NRI cannot send them
/// (protobuf-go refuses to marshal them), so
///
/// * while the plugin is connected, such a pod is refused at RunPodSandbox — it cannot run
///   without the plugins;
/// * one made while no plugin was connected makes containerd fail to synchronize every plugin that connects, and drop
///   it: 1.7 silently (the connection stays open, nothing comes), 2.1 by closing the connection. The plugin notices (no
///   Synchronize after Configure: the deadline, or the connection closed), says why and registers again; meanwhile the
///   reconciler (`--runtime-endpoint`, which decodes such pods) corrects that pod and a plain one created meanwhile;
///   once the pod is gone the plugin is synchronized and the next pod gets its values at creation.
#[tokio::test]
async fn pods_with_bytes_that_are_not_utf8_escape_no_plugin() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let mut rt = runtime_client(&env.ctrd.socket);
    let dir = tempfile::Builder::new().prefix("rh-nri-bytes").tempdir().unwrap();
    let label = ("test".to_string(), unique("nri-bytes"));
    let labels = [(QOS, "BE"), (label.0.as_str(), label.1.as_str())];
    let selector = format!("{}={}", label.0, label.1);
    let socket = env.ctrd.socket.to_str().unwrap();
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        env.nri_socket.to_str().unwrap(),
        "--nri-plugin-index",
        "10",
        "--selector",
        &selector,
        "--runtime-endpoint",
        socket,
        "--reconcile-interval",
        "1s",
    ];
    let mut hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["synchronize"], 0, Duration::from_secs(10)), "{}", hooks.log());
    // Connected: containerd refuses the pod.
    let (sandbox, container) = pod_with_bytes(&env, &labels);
    let refused = try_start_pod_with_bytes(&env.ctrd.socket, sandbox, container).await.expect_err("containerd ran it");
    assert!(refused.message().contains("invalid UTF-8"), "{refused:?}");
    // Not connected: it runs, with kubelet's values.
    assert_eq!(hooks.terminate(), Some(0));
    let start = Instant::now();
    let odd = loop {
        // containerd drops the closed connection shortly after the plugin exits.
        let (sandbox, container) = pod_with_bytes(&env, &labels);
        match try_start_pod_with_bytes(&env.ctrd.socket, sandbox, container).await {
            Ok(pod) => break pod,
            Err(e) if start.elapsed() < Duration::from_secs(5) => eprintln!("not yet: {}", e.message()),
            Err(e) => panic!("containerd still refuses the pod without a plugin: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let odd_guard = RemoveOnDrop(env.ctrd.socket.clone(), odd.sandbox_id.clone());
    assert_eq!(odd.cgroup_file("cpu", "cpu.shares"), "2");
    let hooks = Hooks::start(&args, dir.path().join("hooks2.log"));
    assert!(hooks.wait_log(&["did not synchronize", "invalid UTF-8"], 0, Duration::from_secs(10)), "{}", hooks.log());
    // The reconciler corrects it, and a plain pod containerd now creates without the plugin.
    let (sandbox, container) = reporting_pod(&env, &labels, &[(SPEC, BE_SPEC)]);
    let plain = Pod::start(&mut rt, sandbox, container).await.expect("plain pod");
    for pod in [&odd, &plain] {
        let ok = eventually(Duration::from_secs(5), || pod.cgroup_file("cpu", "cpu.shares") == "512");
        assert!(ok, "not corrected by the reconciler\n{}", hooks.log());
        assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000");
        assert_eq!(pod_values(&pod.cgroup_parent()), ("512".into(), "100000".into(), "134217728".into()));
    }
    // The pod is gone: the plugin is synchronized again and pods get their values at creation.
    odd.remove(&mut rt).await;
    std::mem::forget(odd_guard);
    assert!(hooks.wait_log(&["synchronize", "updates=1"], 0, Duration::from_secs(15)), "{}", hooks.log());
    let shared = cgroup("cpuset", "", "cpuset.cpus");
    let (sandbox, container) = reporting_pod(&env, &labels, &[(SPEC, BE_SPEC)]);
    let next = Pod::start(&mut rt, sandbox.clone(), container).await.expect("next pod");
    assert_eq!(startup_line(&env, &sandbox), format!("{BE_LINE} cpus={shared}"), "{}", hooks.log());
    plain.remove(&mut rt).await;
    next.remove(&mut rt).await;
}

/// Rules from the cluster in NRI mode: a NodeSLO change on the loopback API stand-in reaches a
/// running BE pod through `UpdateContainers` (container) and the pod cgroup write (pod); its
/// deletion returns to koordlet's defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_slo_from_the_cluster_reaches_running_pods() {
    use serde_json::json;
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let api = test_support::kube_api::KubeApi::start().await;
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));
    api.create(json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "node-a"},
        "spec": {"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressPolicy": "cfsQuota"}}}));
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let plugin =
        start_plugin_with(&env, true, &["--kubeconfig", kubeconfig.to_str().unwrap(), "--node-name", "node-a"]);
    assert!(
        plugin.hooks.wait_log(&["watching the node's NodeSLO"], 0, Duration::from_secs(10)),
        "{}",
        plugin.hooks.log()
    );
    let mut rt = runtime_client(&env.ctrd.socket);
    let (sandbox, container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod");
    let parent = pod.cgroup_parent();
    let quotas = || (pod.cgroup_file("cpu", "cpu.cfs_quota_us"), cgroup("cpu", &parent, "cpu.cfs_quota_us"));
    assert_eq!(quotas(), ("-1".into(), "-1".into()), "created under cfsQuota suppression\n{}", plugin.hooks.log());
    api.merge_patch(
        "nodeslos",
        None,
        "node-a",
        json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuset"}}}),
    );
    let ok = eventually(Duration::from_secs(5), || quotas() == ("100000".into(), "100000".into()));
    assert!(ok, "after the patch: {:?}\n{}", quotas(), plugin.hooks.log());
    api.merge_patch(
        "nodeslos",
        None,
        "node-a",
        json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cfsQuota"}}}),
    );
    assert!(
        eventually(Duration::from_secs(5), || quotas() == ("-1".into(), "-1".into())),
        "{:?}\n{}",
        quotas(),
        plugin.hooks.log()
    );
    api.delete("nodeslos", None, "node-a");
    let ok = eventually(Duration::from_secs(5), || quotas() == ("100000".into(), "100000".into()));
    assert!(ok, "after the deletion: {:?}\n{}", quotas(), plugin.hooks.log());
    // The runtime applies an update before its answer reaches the plugin, which logs it then.
    let logged =
        eventually(Duration::from_secs(5), || plugin.hooks.count(&["NRI: containers updated for the new rules"]) >= 3);
    assert!(logged, "{}", plugin.hooks.log());
    pod.remove(&mut rt).await;
}

/// GPUEnvInject and RDMADeviceInject as an NRI plugin: a pod the scheduler gave an RDMA PF, a
/// GPU and HAMi-core half a GPU gets, before its process starts, the character devices
/// `/dev/infiniband/rdma_cm` and `/dev/infiniband/uverbs0` with the numbers of the real nodes
/// made with mknod under `--device-host-root` (in containerd's OCI spec and as nodes inside the
/// container), `NVIDIA_VISIBLE_DEVICES`, the CUDA limits, `LD_PRELOAD` and the bind-mounted
/// library. A pod whose RDMA device is not on the host fails only RDMADeviceInject (Ignore):
/// it starts with its GPU env and without devices, and the log names the annotation.
#[tokio::test]
async fn rdma_allocation_adds_char_devices_and_gpu_env_in_nri_mode() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let host = tempfile::Builder::new().prefix("rh-rdma").tempdir().unwrap();
    fake_rdma_host(host.path());
    let library = host.path().join("libvgpu.so");
    std::fs::write(&library, "hami-core stand-in\n").unwrap();
    std::fs::create_dir_all("/tmp/vgpulock").unwrap();
    let (root, lib) = (host.path().to_str().unwrap(), library.to_str().unwrap());
    let flags = [
        "--feature-gates",
        "GPUEnvInject=true,RDMADeviceInject=true",
        "--device-host-root",
        root,
        "--hami-core-library-directory-path",
        lib,
    ];
    let plugin = start_plugin_with(&env, true, &flags);
    let mut rt = runtime_client(&env.ctrd.socket);

    let alloc = r#"{"gpu": [{"minor": 1, "resources": {"koordinator.sh/gpu-memory-ratio": 50, "koordinator.sh/gpu-memory": "8Gi", "koordinator.sh/gpu-core": 30}}],
                    "rdma": [{"minor": 0, "id": "0000:09:00.0", "resources": {"koordinator.sh/rdma": 100}}]}"#;
    let mut labels = plugin.labels("LS");
    labels.push(("koordinator.sh/gpu-isolation-provider", "HAMi-core"));
    let (sandbox, container) = pod_configs(&env.ctrd, &labels, &[(DEVICE_ALLOCATED, alloc)]);
    let (sandbox_id, container_id) =
        create(&mut rt, &sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", plugin.hooks.log()));
    // Before any process: the adjustment is in the spec containerd stored.
    let status = rt
        .container_status(cri::ContainerStatusRequest { container_id: container_id.clone(), verbose: true })
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(&status.into_inner().info["info"]).unwrap();
    let devices = &info["runtimeSpec"]["linux"]["devices"];
    let find = |path: &str| devices.as_array().and_then(|d| d.iter().find(|d| d["path"] == path).cloned());
    let cm = find("/dev/infiniband/rdma_cm").unwrap_or_else(|| panic!("rdma_cm in {devices}\n{}", plugin.hooks.log()));
    assert_eq!(
        (cm["type"].as_str(), cm["major"].as_i64(), cm["minor"].as_i64(), cm["fileMode"].as_i64()),
        (Some("c"), Some(10), Some(58), Some(0o666))
    );
    let uverbs = find("/dev/infiniband/uverbs0").unwrap_or_else(|| panic!("uverbs0 in {devices}"));
    assert_eq!((uverbs["major"].as_i64(), uverbs["minor"].as_i64()), (Some(231), Some(192)));
    rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() })
        .await
        .expect("StartContainer");
    let pod = Pod { sandbox_id, container_id, config: sandbox };

    // Inside the container: the nodes (busybox stat: major and minor in hex), the env, the mount.
    let nodes =
        exec(&mut rt, &pod.container_id, "stat -c '%n %F %t:%T %a' /dev/infiniband/rdma_cm /dev/infiniband/uverbs0")
            .await;
    assert_eq!(
        nodes,
        "/dev/infiniband/rdma_cm character special file a:3a 666\n/dev/infiniband/uverbs0 character special file e7:c0 666\n",
        "{}",
        plugin.hooks.log()
    );
    let envs = exec(
        &mut rt,
        &pod.container_id,
        "echo $NVIDIA_VISIBLE_DEVICES $CUDA_DEVICE_MEMORY_LIMIT $CUDA_DEVICE_SM_LIMIT $LD_PRELOAD",
    )
    .await;
    assert_eq!(envs, format!("1 8589934592 30 {lib}\n"));
    assert_eq!(
        exec(&mut rt, &pod.container_id, &format!("cat {lib}; test -d /tmp/vgpulock && echo lock")).await,
        "hami-core stand-in\nlock\n"
    );

    // An RDMA device the host does not have: RDMADeviceInject fails (Ignore), GPUEnvInject not.
    let missing = r#"{"gpu": [{"minor": 3}], "rdma": [{"id": "0000:0f:00.0"}]}"#;
    let (sandbox, container) = pod_configs(&env.ctrd, &plugin.labels("LS"), &[(DEVICE_ALLOCATED, missing)]);
    let other =
        Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", plugin.hooks.log()));
    let seen =
        exec(&mut rt, &other.container_id, "echo $NVIDIA_VISIBLE_DEVICES; ls /dev/infiniband 2>&1 | grep -c uverbs")
            .await;
    assert_eq!(seen, "3\n0\n", "{}", plugin.hooks.log());
    let log = plugin.hooks.log();
    let line = log
        .lines()
        .find(|l| l.contains("plugin RDMADeviceInject failed"))
        .unwrap_or_else(|| panic!("no failure in\n{log}"));
    assert!(
        line.contains(DEVICE_ALLOCATED) && line.contains("0000:0f:00.0") && line.contains("infiniband_verbs"),
        "{line}"
    );
    assert!(!log.contains("plugin GPUEnvInject failed"), "{log}");
    pod.remove(&mut rt).await;
    other.remove(&mut rt).await;
}

/// The plugin's peak resident memory (`VmHWM`), bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM").trim().trim_end_matches(" kB").trim();
    kb.parse::<u64>().unwrap() * 1024
}

/// A BE container of 200 k envs (3.3 MiB of NRI CreateContainer, under ttrpc's 4 MiB) and a
/// 1 MiB unread pod annotation: containerd stores the BE values runtime-hooks adjusted, a rule
/// change re-applies to it, and runtime-hooks' peak memory grows by less than what a map of the
/// envs costs (it decodes no env: [`runtime_hooks::nri::reads`]).
#[tokio::test]
async fn a_container_of_200k_envs_gets_its_be_values_without_its_envs_in_memory() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(env) = env() else { return };
    let plugin = start_plugin(&env, true);
    let mut rt = runtime_client(&env.ctrd.socket);
    let note = "n".repeat(1 << 20);
    let (sandbox, mut container) = reporting_pod(&env, &plugin.labels("BE"), &[(SPEC, BE_SPEC), ("note", &note)]);
    container.envs.extend((0..200_000).map(|i| cri::KeyValue { key: format!("K{i:06}"), value: "1".into() }));
    let sandbox = besteffort(sandbox);
    let base = peak_rss(plugin.hooks.pid());
    let (sandbox_id, container_id) =
        create(&mut rt, &sandbox, container).await.expect("BE pod of 200 k envs on containerd");
    // The verbose status holds the envs twice (spec and CRI config): read with a larger limit.
    let mut big = runtime_client(&env.ctrd.socket).max_decoding_message_size(64 << 20);
    let status =
        big.container_status(cri::ContainerStatusRequest { container_id: container_id.clone(), verbose: true }).await;
    let info: serde_json::Value =
        status.map(|s| serde_json::from_str(&s.into_inner().info["info"]).unwrap()).unwrap_or_default();
    let spec = info["runtimeSpec"]["linux"]["resources"].clone();
    let envs = info["runtimeSpec"]["process"]["env"].as_array().map(Vec::len).unwrap_or(0);
    drop(info);
    // A rule change re-applies to the known containers, this one included.
    plugin.set_rules("cpu: {cfsPeriodUs: 50000}\n");
    let reapplied = plugin.hooks.wait_log(&["NRI: applied to known pods", "rules changed"], 0, Duration::from_secs(10));
    let peak = peak_rss(plugin.hooks.pid());
    // Removed before asserting: a 3.3 MiB container left behind would keep every later plugin
    // from being synchronized (containerd 1.7 sends its whole state in one 4 MiB message).
    remove_sandbox(&mut rt, &sandbox_id).await;
    eprintln!("runtime-hooks VmHWM: {} MB before, {} MB after a CreateContainer of 200 k envs", base >> 20, peak >> 20);
    assert_eq!(
        (spec["cpu"]["shares"].clone(), spec["cpu"]["quota"].clone()),
        (512.into(), 100000.into()),
        "{spec}\n{}",
        plugin.hooks.log()
    );
    assert_eq!(spec["memory"]["limit"], 134217728);
    assert!(envs >= 200_000, "the envs reached containerd whole: {envs}");
    assert!(reapplied, "{}", plugin.hooks.log());
    // Measured: +71 MB when every env is decoded (prost's Vec<u8> each, as strings, as a map,
    // kept for rule changes), +16 MB when none is (the message's own buffers, 4 MiB each).
    assert!(peak < base + (32 << 20), "VmHWM {} MB from {} MB", peak >> 20, base >> 20);
}
