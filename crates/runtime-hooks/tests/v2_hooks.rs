//! runtime-hooks on a real cgroup v2 node with the systemd cgroup driver (the qemu guest of
//! `scripts/v2vm.sh`: systemd as PID 1, containerd 2.1, runc 1.3 with `SystemdCgroup = true`), in
//! proxy, standalone and NRI mode. Pods are made the way kubelet makes them there: their slices
//! are transient systemd units started over D-Bus before RunPodSandbox, the pod slice's name is
//! the CRI cgroup parent, runc puts each container in a `cri-containerd-<id>.scope` below it.
//!
//! What every test checks on the real files: a BE pod's pod- and container-level `cpu.weight`,
//! `cpu.max` and `memory.max` are what koordlet's BatchResource rules give, with the node's
//! shares → weight conversion (runc 1.3's: 512 shares → 59) at both levels, after the sandbox's
//! scope started, after `systemctl daemon-reload` (systemd rewrites a unit's own properties into
//! its cgroup then: runtime-hooks sets its values as the units' properties too) and across a
//! restart of the daemon; and the reconciler logs no drift for pods nobody changed.
//!
//! Runs only inside the guest (`scripts/v2vm.sh test v2_hooks`, which sets `RP_V2_GUEST=1`).

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use test_support::systemd::{
    cgroup_file, daemon_reload, guest, run, sandbox_config_systemd, scope_dir, show, slice_dir, stop_slice, Qos,
};
use tonic::transport::Channel;

/// What BE_SPEC (batch-cpu request 500, limit 1000; batch-memory limit 128Mi) gives a pod of one
/// container, at both levels, on cgroup v2 with runc 1.3's weight formula: 512 shares → 59.
const BE_FILES: [(&str, &str); 3] = [("cpu.weight", "59"), ("cpu.max", "100000 100000"), ("memory.max", "134217728")];

/// The BE_FILES of `dir`, as read now.
fn files(dir: &std::path::Path) -> Vec<(&'static str, String)> {
    BE_FILES.iter().map(|(f, _)| (*f, cgroup_file(dir, f))).collect()
}

fn be_files() -> Vec<(&'static str, String)> {
    BE_FILES.iter().map(|(f, v)| (*f, v.to_string())).collect()
}

/// Asserts a BE pod's slice and container scope hold BE_FILES, and the slice's unit has them
/// as its own properties (so systemd writes the same values back).
fn assert_be_values(slice: &str, container_id: &str, when: &str, log: impl Fn() -> String) {
    let pod_dir = slice_dir(slice);
    let scope = scope_dir(slice, container_id);
    assert_eq!(files(&pod_dir), be_files(), "pod slice {} {when}\n{}", pod_dir.display(), log());
    assert_eq!(files(&scope), be_files(), "container scope {} {when}\n{}", scope.display(), log());
    let unit = [show(slice, "CPUWeight"), show(slice, "CPUQuotaPerSecUSec"), show(slice, "MemoryMax")];
    assert_eq!(unit, ["59".to_string(), "1s".into(), "134217728".into()], "{slice}'s properties {when}");
}

/// A BE pod's sandbox config below a kubelet-style pod slice, labelled for `selector`.
fn be_sandbox(env: &Containerd, selector: (&str, &str)) -> (cri::PodSandboxConfig, String) {
    let labels: HashMap<String, String> = map(&[(QOS, "BE"), selector]);
    let sandbox = sandbox_config_systemd(env, &unique("v2-be"), labels, map(&[(SPEC, BE_SPEC)]), Qos::BestEffort);
    let slice = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    (sandbox, slice)
}

/// A container as kubelet sends a BestEffort one: 2 shares, 100 ms period, no limits.
fn besteffort_container(env: &Containerd) -> cri::ContainerConfig {
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    container_config(env, "main", &["sleep", "3600"], Some(resources), &[])
}

/// An LSR pod bound to CPU 1 by its resource-status annotation, one container with a 1-CPU
/// quota, below a Burstable pod slice; returns the pod and its container's scope.
async fn lsr_pod(rt: &mut RuntimeServiceClient<Channel>, env: &Containerd, label: &str) -> (Pod, std::path::PathBuf) {
    let labels: HashMap<String, String> = map(&[(QOS, "LSR"), ("v2test", label)]);
    let sandbox =
        sandbox_config_systemd(env, &unique("v2-lsr"), labels, map(&[(STATUS, r#"{"cpuset": "1"}"#)]), Qos::Burstable);
    let slice = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    let r = cri::LinuxContainerResources {
        cpu_shares: 1024,
        cpu_period: 100_000,
        cpu_quota: 100_000,
        ..Default::default()
    };
    let container = container_config(env, "main", &["sleep", "3600"], Some(r), &[]);
    let pod = Pod::start(rt, sandbox, container).await.expect("LSR pod");
    let scope = scope_dir(&slice, &pod.container_id);
    (pod, scope)
}

/// An LSR container's cpuset and unset quota, as CPUSet gives them.
fn lsr_files(scope: &std::path::Path) -> (String, String) {
    (cgroup_file(scope, "cpuset.cpus"), cgroup_file(scope, "cpu.max"))
}

fn lsr_expected() -> (String, String) {
    ("1".into(), "max 100000".into())
}

/// Lines of `log` that report a corrected drift on `target` (a pod's name or a container ID).
fn drift_lines(log: &str, target: &str) -> Vec<String> {
    log.lines().filter(|l| l.contains("drift corrected") && l.contains(target)).map(str::to_owned).collect()
}

/// Waits until runtime-hooks has logged `n` more reconciler passes than `before`.
fn wait_passes(hooks: &Hooks, before: usize, n: usize) {
    assert!(
        hooks.wait_log(&["reconciled"], before + n - 1, Duration::from_secs(60)),
        "no reconciler pass:\n{}",
        hooks.log()
    );
}

struct ProxySetup {
    env: Containerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
    hooks: Hooks,
}

/// runtime-hooks in proxy mode (with the runtime endpoint, so its reconciler runs too) and
/// runtime-proxy, registered, on the guest's containerd; runtime-hooks picks the cgroup driver
/// from the runtime (`RuntimeConfig`) and the weight formula from the node.
fn proxy_setup(env: Containerd) -> ProxySetup {
    let dir = tempfile::Builder::new().prefix("v2-proxy").tempdir().unwrap();
    let conf = dir.path().join("hookserver.d");
    std::fs::create_dir(&conf).unwrap();
    let hooks = start_proxy_mode_hooks(&env, dir.path());
    let proxy = start_proxy(&env, &conf);
    ProxySetup { env, dir, proxy, hooks }
}

/// runtime-proxy on `env`'s containerd with the hook config dir `conf`, once it has taken up
/// runtime-hooks' registration.
fn start_proxy(env: &Containerd, conf: &Path) -> ProxyProcess {
    let proxy_bin = test_support::workspace_binary("runtime-proxy");
    let proxy =
        ProxyProcess::start(proxy_bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
    assert!(
        proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "proxy did not take up runtime-hooks.json\n{}",
        proxy.log()
    );
    proxy
}

fn start_proxy_mode_hooks(env: &Containerd, dir: &Path) -> Hooks {
    let socket = dir.join("runtime-hooks.sock");
    let conf = dir.join("hookserver.d");
    let args = [
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        conf.to_str().unwrap(),
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
    ];
    let log = dir.join(format!("hooks-{}.log", unique("p")));
    let hooks = Hooks::start(&args, log);
    assert!(
        hooks.wait_log(&["reconciled"], 0, Duration::from_secs(60)),
        "runtime-hooks did not start:\n{}",
        hooks.log()
    );
    hooks
}

#[tokio::test]
async fn proxy_mode_be_pod_values_survive_systemd_and_restarts() {
    let env = guest();
    let mut s = proxy_setup(env);
    let mut rt = runtime_client(s.proxy.socket());
    let label = unique("v2p");
    let (sandbox, slice) = be_sandbox(&s.env, ("v2test", &label));
    let pod = Pod::start(&mut rt, sandbox, besteffort_container(&s.env)).await.expect("BE pod through the proxy");

    let log = |h: &Hooks| h.log();
    assert_be_values(&slice, &pod.container_id, "after the pod started", || log(&s.hooks));
    daemon_reload();
    assert_be_values(&slice, &pod.container_id, "after systemctl daemon-reload", || log(&s.hooks));

    // An LSR pod bound to CPU 1 (resource-status): its container's cpuset, by runc from the answer.
    let (lsr, lsr_scope) = lsr_pod(&mut rt, &s.env, &label).await;
    let lsr_slice = lsr.cgroup_parent();
    assert_eq!(
        lsr_files(&lsr_scope),
        lsr_expected(),
        "LSR container bound to CPU 1, CFS quota unset\nproxy log:\n{}\nruntime-hooks log:\n{}",
        s.proxy.log(),
        s.hooks.log()
    );
    daemon_reload();
    assert_eq!(cgroup_file(&lsr_scope, "cpuset.cpus"), "1", "after daemon-reload");

    // runtime-hooks restarts: nothing drifts, nothing is rewritten for these pods.
    s.hooks.terminate();
    let hooks = start_proxy_mode_hooks(&s.env, s.dir.path());
    daemon_reload();
    wait_passes(&hooks, hooks.count(&["reconciled"]), 2);
    assert_be_values(&slice, &pod.container_id, "after runtime-hooks restarted", || hooks.log());
    assert_eq!(cgroup_file(&lsr_scope, "cpuset.cpus"), "1");
    let hooks_log = hooks.log();
    for id in [&pod.container_id, &lsr.container_id] {
        assert!(drift_lines(&hooks_log, id).is_empty(), "drift on {id} nobody made:\n{hooks_log}");
    }
    assert!(drift_lines(&hooks_log, &slice).is_empty(), "drift on {slice}:\n{hooks_log}");
    assert!(hooks_log.contains("cpu.weight formula learned") && hooks_log.contains("formula=\"runc\""), "{hooks_log}");

    // runtime-proxy restarts: it recovers its store, and kubelet's BestEffort update keeps the policy.
    s.proxy.signal(libc::SIGKILL);
    s.proxy.wait_exit(Duration::from_secs(5));
    s.proxy = start_proxy(&s.env, &s.dir.path().join("hookserver.d"));
    let mut rt = runtime_client(s.proxy.socket());
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources through the restarted proxy");
    assert_eq!(
        files(&scope_dir(&slice, &pod.container_id)),
        be_files(),
        "after the proxy restarted and kubelet updated"
    );

    pod.remove(&mut rt).await;
    lsr.remove(&mut rt).await;
    stop_slice(&slice);
    stop_slice(&lsr_slice);
    s.hooks = hooks;
}

#[tokio::test]
async fn standalone_mode_corrects_once_and_then_leaves_pods_alone() {
    let env = guest();
    let mut rt = runtime_client(&env.socket);
    let label = unique("v2s");
    let (sandbox, slice) = be_sandbox(&env, ("v2test", &label));
    // Straight to containerd: BestEffort values, as if runtime-hooks had been down.
    let be = Pod::start(&mut rt, sandbox, besteffort_container(&env)).await.expect("BE pod");
    let scope = scope_dir(&slice, &be.container_id);
    assert_eq!(cgroup_file(&scope, "cpu.weight"), "1", "2 shares");
    // A Burstable pod nobody changes: 1024 shares → runc 1.3 writes weight 100.
    let ls_labels: HashMap<String, String> = map(&[(QOS, "LS"), ("v2test", &label)]);
    let ls_sandbox = sandbox_config_systemd(&env, &unique("v2-ls"), ls_labels, HashMap::new(), Qos::Burstable);
    let ls_slice = ls_sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    let ls_container = {
        let r = cri::LinuxContainerResources { cpu_shares: 1024, cpu_period: 100_000, ..Default::default() };
        container_config(&env, "main", &["sleep", "3600"], Some(r), &[])
    };
    let ls = Pod::start(&mut rt, ls_sandbox, ls_container).await.expect("LS pod");
    assert_eq!(cgroup_file(&scope_dir(&ls_slice, &ls.container_id), "cpu.weight"), "100");

    // An LSR pod created without runtime-hooks: runc gave it all CPUs and its quota.
    let (lsr, lsr_scope) = lsr_pod(&mut rt, &env, &label).await;
    assert_eq!(cgroup_file(&lsr_scope, "cpu.max"), "100000 100000");

    let dir = tempfile::Builder::new().prefix("v2-standalone").tempdir().unwrap();
    let selector = format!("v2test={label}");
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    wait_passes(&hooks, 0, 2);
    assert_be_values(&slice, &be.container_id, "after the first passes", || hooks.log());
    assert_eq!(lsr_files(&lsr_scope), lsr_expected(), "the LSR container corrected\n{}", hooks.log());
    assert_eq!(
        show(&format!("cri-containerd-{}.scope", lsr.container_id), "AllowedCPUs"),
        "1",
        "as its scope's property"
    );
    let log = hooks.log();
    assert!(
        log.contains("cpu.weight formula learned") && log.contains("formula=\"runc\""),
        "formula learned from the LS container:\n{log}"
    );
    assert!(!drift_lines(&log, &be.container_id).is_empty(), "the BE container was corrected:\n{log}");
    assert!(drift_lines(&log, &ls.container_id).is_empty(), "no drift on a pod nobody changed:\n{log}");

    // daemon-reload: systemd writes the units' properties back, which are runtime-hooks' values;
    // nothing drifts, and no property is sent again (each was sent once).
    wait_passes(&hooks, hooks.count(&["reconciled"]), 1);
    let drifts = hooks.count(&["drift corrected"]);
    let sends = hooks.count(&["unit properties set"]);
    daemon_reload();
    wait_passes(&hooks, hooks.count(&["reconciled"]), 2);
    assert_be_values(&slice, &be.container_id, "after daemon-reload", || hooks.log());
    let log = hooks.log();
    assert_eq!(hooks.count(&["drift corrected"]), drifts, "no drift after daemon-reload:\n{log}");
    assert_eq!(hooks.count(&["unit properties set"]), sends, "no property sent twice:\n{log}");
    assert_eq!(lsr_files(&lsr_scope), lsr_expected(), "the LSR container after daemon-reload");

    drop(hooks);
    be.remove(&mut rt).await;
    ls.remove(&mut rt).await;
    let lsr_slice = lsr.cgroup_parent();
    lsr.remove(&mut rt).await;
    stop_slice(&lsr_slice);
    stop_slice(&slice);
    stop_slice(&ls_slice);
}

#[tokio::test]
async fn nri_mode_be_pod_values_survive_systemd() {
    let env = guest();
    let nri_socket = env.nri_socket.clone().expect("the guest's containerd has NRI on");
    let dir = tempfile::Builder::new().prefix("v2-nri").tempdir().unwrap();
    let label = unique("v2n");
    let selector = format!("v2test={label}");
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        nri_socket.to_str().unwrap(),
        "--nri-plugin-name",
        "runtime-hooks-v2",
        "--nri-plugin-index",
        "10",
        "--selector",
        &selector,
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        hooks.wait_log(&["NRI: applied to known pods", "synchronize"], 0, Duration::from_secs(30)),
        "not synchronized:\n{}",
        hooks.log()
    );
    let mut rt = runtime_client(&env.socket);
    let (sandbox, slice) = be_sandbox(&env, ("v2test", &label));
    let pod = Pod::start(&mut rt, sandbox, besteffort_container(&env)).await.expect("BE pod with the NRI plugin");
    assert_be_values(&slice, &pod.container_id, "after the pod started", || hooks.log());
    daemon_reload();
    assert_be_values(&slice, &pod.container_id, "after daemon-reload", || hooks.log());
    let (lsr, lsr_scope) = lsr_pod(&mut rt, &env, &label).await;
    assert_eq!(lsr_files(&lsr_scope), lsr_expected(), "LSR container through NRI\n{}", hooks.log());
    daemon_reload();
    assert_eq!(lsr_files(&lsr_scope), lsr_expected(), "LSR container after daemon-reload");
    drop(hooks);
    pod.remove(&mut rt).await;
    stop_slice(&slice);
    let lsr_slice = lsr.cgroup_parent();
    lsr.remove(&mut rt).await;
    stop_slice(&lsr_slice);
}

/// A NodeSLO with the `coreSched` CPU policy and `schedIdle` IDLE for the BE class:
/// kubepods-besteffort.slice's `cpu.idle`.
const SCHED_IDLE: &str = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec:\n  \
    resourceQOSStrategy:\n    policies: {cpuPolicy: coreSched}\
    \n    beClass: {cpuQOS: {enable: true, schedIdle: IDLE}}\n";

#[tokio::test]
async fn standalone_mode_follows_a_node_slo_change_on_kube_qos_slices() {
    let env = guest();
    test_support::systemd::ensure_kubepods();
    let dir = tempfile::Builder::new().prefix("v2-nodeslo").tempdir().unwrap();
    let rules = rules_file(dir.path(), &SCHED_IDLE.replace("IDLE", "1"));
    let selector = format!("v2test={}", unique("v2c"));
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
        "--rules",
        rules.to_str().unwrap(),
        "--feature-gates=CoreSched=true",
        "--kubepods-cgroup",
        "kubepods.slice",
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    let besteffort = slice_dir(Qos::BestEffort.parent_slice());
    let burstable = slice_dir(Qos::Burstable.parent_slice());
    let idle = |d: &std::path::Path| cgroup_file(d, "cpu.idle");
    assert!(
        eventually(Duration::from_secs(30), || idle(&besteffort) == "1"),
        "BE slice cpu.idle {}\n{}",
        idle(&besteffort),
        hooks.log()
    );
    assert_eq!(idle(&burstable), "0");

    // The NodeSLO changes: the BE class is no longer idle.
    let tmp = rules.with_extension("tmp");
    std::fs::write(&tmp, SCHED_IDLE.replace("IDLE", "0")).unwrap();
    std::fs::rename(&tmp, &rules).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || idle(&besteffort) == "0"),
        "after the change: {}\n{}",
        idle(&besteffort),
        hooks.log()
    );
    let log = hooks.log();
    assert!(!log.contains("reconcile: "), "no failure:\n{log}");
}

/// The unit the Debian package installs.
const PACKAGED_UNIT: &str = include_str!("../../../packaging/systemd/runtime-hooks.service");

/// `journalctl -u UNIT`: what the unit logged.
fn journal(unit: &str) -> String {
    run("journalctl", &["-u", unit, "--no-pager", "-o", "cat"])
}

#[tokio::test]
async fn the_packaged_unit_runs_standalone_with_its_sandboxing_and_reaches_systemd() {
    let env = guest();
    let binary = test_support::workspace_binary("runtime-hooks");
    let label = unique("v2u");
    let opts = format!(
        "--mode standalone --runtime-endpoint {} --reconcile-interval 1s --selector v2test={label}",
        env.socket.display()
    );
    let text = PACKAGED_UNIT
        .replace("ExecStart=/usr/bin/runtime-hooks ", &format!("ExecStart={} ", binary.display()))
        .replace("EnvironmentFile=-/etc/default/runtime-hooks", &format!("Environment=\"RUNTIME_HOOKS_OPTS={opts}\""));
    assert!(
        text.contains(&opts) && text.contains(binary.to_str().unwrap()),
        "the packaged unit changed its form:\n{PACKAGED_UNIT}"
    );
    // The package creates the registration directory the unit's ReadWritePaths= names.
    std::fs::create_dir_all("/etc/runtime/hookserver.d").unwrap();
    let unit = "runtime-hooks-v2test.service";
    std::fs::write(format!("/run/systemd/system/{unit}"), text).unwrap();
    daemon_reload();
    run("systemctl", &["start", unit]); // Type=notify: returns once it reported READY=1

    let mut rt = runtime_client(&env.socket);
    let (sandbox, slice) = be_sandbox(&env, ("v2test", &label));
    let pod = Pod::start(&mut rt, sandbox, besteffort_container(&env)).await.expect("BE pod");
    let scope = scope_dir(&slice, &pod.container_id);
    assert!(
        eventually(Duration::from_secs(30), || files(&scope) == be_files()),
        "{:?}\n{}",
        files(&scope),
        journal(unit)
    );
    assert_be_values(&slice, &pod.container_id, "under the packaged unit", || journal(unit));
    daemon_reload();
    assert_be_values(&slice, &pod.container_id, "after daemon-reload", || journal(unit));
    let log = journal(unit);
    assert!(log.contains("systemd's bus: values on slices and scopes are also set"), "{log}");
    let denied = |l: &&str| {
        l.contains("WARN") && ["systemd", "bus", "denied", "Read-only", "reconcile: "].iter().any(|w| l.contains(w))
    };
    assert!(!log.lines().any(|l| denied(&l)), "nothing refused under the unit's sandboxing:\n{log}");

    run("systemctl", &["stop", unit]);
    std::fs::remove_file(format!("/run/systemd/system/{unit}")).unwrap();
    daemon_reload();
    pod.remove(&mut rt).await;
    stop_slice(&slice);
}

/// The DaemonSet and its rules ConfigMap as deploy/ ships them.
const DAEMONSET: &str = include_str!("../../../deploy/runtime-hooks.yaml");
const RULES_CONFIGMAP: &str = include_str!("../../../deploy/runtime-hooks-rules.yaml");

#[tokio::test]
async fn the_daemonsets_args_and_host_mounts_work_on_a_v2_host() {
    let env = guest();
    // The container's args, as deploy/runtime-hooks.yaml gives them.
    let args: Vec<&str> = DAEMONSET
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- --").map(|_| l.trim_start()[2..].trim()))
        .collect();
    assert!(args.contains(&"--cgroup-root=/host/sys/fs/cgroup") && args.contains(&"--mode=proxy"), "{args:?}");
    // Its host mounts, made here as the kubelet would: the cgroup tree at /host/sys/fs/cgroup,
    // /run/dbus and the containerd socket where they are on the host, the ConfigMap's rules.
    std::fs::create_dir_all("/host/sys/fs/cgroup").unwrap();
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(" /host/sys/fs/cgroup ");
    if !mounted {
        let out = std::process::Command::new("mount")
            .args(["--bind", "/sys/fs/cgroup", "/host/sys/fs/cgroup"])
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", String::from_utf8_lossy(&out.stderr));
    }
    let configmap: serde_json::Value = serde_norway::from_str(RULES_CONFIGMAP).unwrap();
    let rules = configmap["data"]["rules.yaml"].as_str().expect("the ConfigMap's rules.yaml");
    for dir in ["/etc/runtime-hooks", "/etc/runtime/hookserver.d", "/var/run/runtime-hooks"] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write("/etc/runtime-hooks/rules.yaml", rules).unwrap();
    let dir = tempfile::Builder::new().prefix("v2-daemonset").tempdir().unwrap();
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    let proxy = start_proxy(&env, Path::new("/etc/runtime/hookserver.d"));
    let log = hooks.log();
    assert!(log.contains("cgroup=v2 cgroup_root=/host/sys/fs/cgroup"), "{log}");
    assert!(log.contains("systemd's bus: values on slices and scopes are also set"), "{log}");

    let mut rt = runtime_client(proxy.socket());
    let (sandbox, slice) = be_sandbox(&env, ("v2test", &unique("v2d")));
    let pod = Pod::start(&mut rt, sandbox, besteffort_container(&env)).await.expect("BE pod through the proxy");
    assert_be_values(&slice, &pod.container_id, "with the DaemonSet's args and mounts", || hooks.log());
    daemon_reload();
    assert_be_values(&slice, &pod.container_id, "after daemon-reload", || hooks.log());
    pod.remove(&mut rt).await;
    stop_slice(&slice);
    drop(hooks);
    let _ = std::fs::remove_file("/etc/runtime/hookserver.d/runtime-hooks.json");
}
