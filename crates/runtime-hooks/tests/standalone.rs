//! Standalone mode: no proxy; runtime-hooks lists the pods of a real containerd and corrects
//! their cgroup files itself, on its interval and when the rules change.
//!
//! Each test selects only its own pods (`--selector test=<unique>`), so tests running in
//! parallel on the same containerd never reconcile each other's pods.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::runtime_client;

struct Standalone {
    env: Containerd,
    dir: tempfile::TempDir,
    rules: std::path::PathBuf,
    label: (String, String),
    hooks: Hooks,
}

fn start(interval: &str, extra: &[&str]) -> Standalone {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-standalone").tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "# cfsPeriodUs defaults to 100000\ncpu: {}\n").unwrap();
    let label = ("test".to_string(), unique("standalone"));
    let selector = format!("{}={}", label.0, label.1);
    let mut args = vec![
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        interval,
        "--rules",
        rules.to_str().unwrap(),
        "--selector",
        &selector,
    ];
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(10)),
        "no first pass:\n{}",
        hooks.log()
    );
    Standalone { env, dir, rules, label, hooks }
}

impl Standalone {
    /// A BE pod with the issue's batch resources, created directly on containerd (kubelet's
    /// BestEffort values: 2 shares, no quota, no memory limit).
    async fn be_pod(&self) -> Pod {
        let mut rt = runtime_client(&self.env.socket);
        let (sandbox, container) =
            pod_configs(&self.env, &[(QOS, "BE"), (&self.label.0, &self.label.1)], &[(SPEC, BE_SPEC)]);
        Pod::start(&mut rt, sandbox, container).await.expect("BE pod on containerd")
    }

    fn set_rules(&self, text: &str) {
        let tmp = self.dir.path().join(".rules.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.rules).unwrap();
    }
}

fn values(pod: &Pod) -> (String, String, String, String) {
    (
        pod.cgroup_file("cpu", "cpu.shares"),
        pod.cgroup_file("cpu", "cpu.cfs_period_us"),
        pod.cgroup_file("cpu", "cpu.cfs_quota_us"),
        pod.cgroup_file("memory", "memory.limit_in_bytes"),
    )
}

fn want(period: u32, quota: u32) -> (String, String, String, String) {
    ("512".into(), period.to_string(), quota.to_string(), "134217728".into())
}

#[tokio::test]
async fn corrects_a_pod_created_directly_on_containerd_within_one_interval() {
    let s = start("1s", &[]);
    let pod = s.be_pod().await;
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2", "containerd made it as asked");
    let created = Instant::now();
    assert!(
        eventually(Duration::from_millis(2000), || values(&pod) == want(100_000, 100_000)),
        "not corrected within one interval (+1 s for the pass itself): {:?}\n{}",
        values(&pod),
        s.hooks.log()
    );
    let took = created.elapsed();
    // Pod level too.
    let parent = pod.cgroup_parent();
    assert_eq!(cgroup("cpu", &parent, "cpu.shares"), "512");
    assert_eq!(cgroup("cpu", &parent, "cpu.cfs_quota_us"), "100000");
    assert_eq!(cgroup("memory", &parent, "memory.limit_in_bytes"), "134217728");
    // The drift is reported file by file, old → new (each line after its write, through
    // runtime-hooks' log writer thread: waited for, not read at once).
    for (file, old, new) in [
        ("cpu.shares", "2", "512"),
        ("cpu.cfs_quota_us", "-1", "100000"),
        ("memory.limit_in_bytes", "9223372036854771712", "134217728"),
    ] {
        let path = format!("{}/{}/{file}", parent, pod.container_id);
        let line = ["drift corrected", &path, &format!("old={old}"), &format!("new={new}")];
        assert!(
            s.hooks.wait_log(&line, 0, Duration::from_secs(5)),
            "no drift line for {path} {old} → {new}:\n{}",
            s.hooks.log()
        );
    }

    // Idempotent: the next passes write nothing.
    let corrections = s.hooks.count(&["drift corrected"]);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        s.hooks.count(&["drift corrected"]),
        corrections,
        "a pass over an unchanged pod wrote something:\n{}",
        s.hooks.log()
    );

    // Someone changes a file behind our back: corrected on the next interval.
    let shares = format!("/sys/fs/cgroup/cpu{parent}/{}/cpu.shares", pod.container_id);
    std::fs::write(&shares, "1024").unwrap();
    assert!(
        eventually(Duration::from_millis(2000), || pod.cgroup_file("cpu", "cpu.shares") == "512"),
        "{}",
        s.hooks.log()
    );
    assert!(s.hooks.count(&["drift corrected", "old=1024", "new=512"]) >= 1);
    eprintln!("corrected {took:?} after creation");
    pod.remove(&mut runtime_client(&s.env.socket)).await;
}

#[tokio::test]
async fn rule_change_is_reapplied_without_waiting_for_the_interval() {
    // An interval far longer than the test: only the rule change can trigger the second pass.
    let s = start("1m", &[]);
    let pod = s.be_pod().await;
    // The pod came after the first pass and the interval is 1 min: nothing corrects it yet.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    // A rules change (group identity, which this kernel does not even have) triggers a pass that
    // applies every rule in force.
    s.set_rules("groupIdentity:\n  be: 0\n");
    assert!(s.hooks.wait_log(&["rules changed"], 0, Duration::from_secs(5)), "{}", s.hooks.log());
    assert!(
        eventually(Duration::from_secs(5), || values(&pod) == want(100_000, 100_000)),
        "{:?}\n{}",
        values(&pod),
        s.hooks.log()
    );
    s.set_rules("cpu:\n  cfsPeriodUs: 50000\n");
    assert!(
        eventually(Duration::from_secs(5), || values(&pod) == want(50_000, 50_000)),
        "{:?}\n{}",
        values(&pod),
        s.hooks.log()
    );
    let parent = pod.cgroup_parent();
    assert_eq!(cgroup("cpu", &parent, "cpu.cfs_period_us"), "50000", "pod level too");
    assert_eq!(cgroup("cpu", &parent, "cpu.cfs_quota_us"), "50000");
    // BE CPU no longer limited by CFS.
    s.set_rules("cpu:\n  cfsPeriodUs: 50000\nbatchResource:\n  cfsQuota: false\n");
    assert!(
        eventually(Duration::from_secs(5), || pod.cgroup_file("cpu", "cpu.cfs_quota_us") == "-1"),
        "{}",
        s.hooks.log()
    );
    assert_eq!(cgroup("cpu", &parent, "cpu.cfs_quota_us"), "-1");
    // An invalid file is reported and the rules in force are kept.
    s.set_rules("cpu:\n  cfsPeriodUs: 5\n");
    assert!(s.hooks.wait_log(&["rules file invalid", "cfsPeriodUs"], 0, Duration::from_secs(5)), "{}", s.hooks.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_period_us"), "50000");
    assert!(s.hooks.count(&["reconciled", "reason=\"rules changed\""]) >= 2, "{}", s.hooks.log());
    pod.remove(&mut runtime_client(&s.env.socket)).await;
}

#[tokio::test]
async fn cgroup_v2_tree_gets_unified_file_names_and_units() {
    // The real pods of containerd, but the files in a temp tree laid out like cgroupfs on v2:
    // <root>/<pod parent>/<container id>/{cpu.weight,cpu.max,memory.max,cpuset.cpus}.
    let env = Containerd::from_env();
    let root = tempfile::tempdir().unwrap();
    let label = ("test".to_string(), unique("v2"));
    let mut rt = runtime_client(&env.socket);
    let (sandbox, container) = pod_configs(&env, &[(QOS, "BE"), (&label.0, &label.1)], &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, besteffort(sandbox), container).await.expect("pod");
    let pod_dir = root.path().join(pod.cgroup_parent().trim_start_matches('/'));
    let container_dir = pod_dir.join(&pod.container_id);
    for d in [root.path(), pod_dir.as_path(), container_dir.as_path()] {
        std::fs::create_dir_all(d).unwrap();
        for (f, v) in [("cpu.weight", "1"), ("cpu.max", "max 100000"), ("memory.max", "max"), ("cpuset.cpus", "0-1")] {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    }
    // A kernel with group identity (Anolis) has cpu.bvt_warp_ns; so does this tree, in the pod
    // and in kubelet's QoS directories.
    let kubepods = root.path().join("kubepods");
    for d in [pod_dir.clone(), kubepods.clone(), kubepods.join("burstable"), kubepods.join("besteffort")] {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("cpu.bvt_warp_ns"), "0\n").unwrap();
    }
    let rules = rules_file(root.path(), GROUP_IDENTITY_ON);
    let selector = format!("{}={}", label.0, label.1);
    let log = root.path().join("hooks.log");
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
        "--cgroup-root",
        root.path().to_str().unwrap(),
        "--cgroup-version",
        "v2",
        "--unchecked-cgroup-root",
        "--rules",
        rules.to_str().unwrap(),
        "--kubepods-cgroup",
        "/kubepods",
    ];
    let hooks = Hooks::start(&args, log);
    let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap().trim().to_owned();
    assert!(
        eventually(Duration::from_secs(5), || read(&container_dir, "memory.max") == "134217728"),
        "{}",
        hooks.log()
    );
    assert_eq!(
        read(&container_dir, "cpu.weight"),
        "59",
        "512 shares → weight 59 by runc's formula (nothing learned from this tree)"
    );
    assert_eq!(read(&container_dir, "cpu.max"), "100000 100000");
    assert_eq!(read(&container_dir, "cpuset.cpus"), "", "BE: inherit the parent's CPUs");
    assert_eq!(read(&pod_dir, "cpu.weight"), "59");
    assert_eq!(read(&pod_dir, "cpu.max"), "100000 100000");
    assert_eq!(read(&pod_dir, "memory.max"), "134217728");
    assert!(hooks.log().contains("cgroup=v2"), "{}", hooks.log());
    // GroupIdentity where the file exists: BE pod −1; QoS dirs: kubepods 0, burstable 2, besteffort −1.
    assert_eq!(read(&pod_dir, "cpu.bvt_warp_ns"), "-1");
    assert_eq!(read(&kubepods, "cpu.bvt_warp_ns"), "0");
    assert_eq!(read(&kubepods.join("burstable"), "cpu.bvt_warp_ns"), "2");
    assert_eq!(read(&kubepods.join("besteffort"), "cpu.bvt_warp_ns"), "-1");
    // The real (v1) cgroup was not touched.
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "2");
    pod.remove(&mut rt).await;
}

/// A pod author's bytes that are not UTF-8 — a pod annotation and a container env value (a
/// Secret with binary data) — on a BE pod: the strict decoder cannot even list the pods, but
/// every pass goes on, and that pod is corrected like any other, as is a plain one next to it.
#[tokio::test]
async fn pods_with_bytes_that_are_not_utf8_are_corrected_like_any_other() {
    let s = start("1s", &[]);
    let labels = [(QOS, "BE"), (s.label.0.as_str(), s.label.1.as_str())];
    let sandbox =
        sandbox_config(&s.env, &unique("rh-bytes"), map(&labels), map(&[(SPEC, BE_SPEC), ("note", ANNOTATION_BYTES)]));
    let resources = k8s_cri::v1::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[("TOKEN", ENV_BYTES)]);
    let odd = start_pod_with_bytes(&s.env.socket, sandbox, container).await;
    let plain = s.be_pod().await;
    // The premise: containerd hands the bytes back, and a strict decoder refuses the listing.
    let mut rt = runtime_client(&s.env.socket);
    let strict = rt.list_pod_sandbox(k8s_cri::v1::ListPodSandboxRequest { filter: None }).await;
    assert!(strict.is_err(), "containerd gave back valid UTF-8; the test proves nothing");
    for pod in [&odd, &plain] {
        assert!(
            eventually(Duration::from_secs(4), || values(pod) == want(100_000, 100_000)),
            "{}: {:?}\n{}",
            pod.sandbox_id,
            values(pod),
            s.hooks.log()
        );
        let parent = pod.cgroup_parent();
        assert_eq!(cgroup("cpu", &parent, "cpu.shares"), "512");
        assert_eq!(cgroup("cpu", &parent, "cpu.cfs_quota_us"), "100000");
    }
    assert_eq!(s.hooks.count(&["ListPodSandbox"]), 0, "{}", s.hooks.log());
    odd.remove(&mut rt).await;
    plain.remove(&mut rt).await;
}

/// What a pod author writes into their own pod switches no policy off: an annotation
/// `koordinator.sh/qosClass: LSR` with a `resource-status` cpuset on a pod without the label
/// keeps its CFS quota and CPUs; a BE pod whose sidecar has a batch-cpu limit beyond 64 bits
/// (`1e19`, which Kubernetes accepts) keeps its main container's and its pod's values.
#[tokio::test]
async fn pod_author_inputs_switch_no_policy_off() {
    let s = start("1s", &[]);
    let mut rt = runtime_client(&s.env.socket);
    let selector = [(s.label.0.as_str(), s.label.1.as_str())];
    // A1/A2: the annotation claims LSR and CPU 1.
    let (sandbox, _) = pod_configs(&s.env, &selector, &[(QOS, "LSR"), (STATUS, r#"{"cpuset": "1"}"#)]);
    let limited = k8s_cri::v1::LinuxContainerResources {
        cpu_shares: 512,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        ..Default::default()
    };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(limited), &[]);
    let claimer = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    let cpus = claimer.cgroup_file("cpuset", "cpuset.cpus");
    // A3: a sidecar's limit of 1e19 milli-CPUs.
    let spec = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}},
                                  "sidecar": {"limits": {"kubernetes.io/batch-cpu": "1e19"}}}}"#;
    let (sandbox, container) = pod_configs(&s.env, &[(QOS, "BE"), selector[0]], &[(SPEC, spec)]);
    let be = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    // Once the BE pod is corrected, a pass has seen both pods.
    assert!(
        eventually(Duration::from_secs(4), || values(&be) == want(100_000, 100_000)),
        "{:?}\n{}",
        values(&be),
        s.hooks.log()
    );
    let parent = be.cgroup_parent();
    assert_eq!(cgroup("cpu", &parent, "cpu.shares"), "512");
    assert_eq!(
        cgroup("cpu", &parent, "cpu.cfs_quota_us"),
        "17592186044415",
        "the sidecar's huge limit: the kernel's largest quota"
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(claimer.cgroup_file("cpu", "cpu.cfs_quota_us"), "50000", "{}", s.hooks.log());
    assert_eq!(claimer.cgroup_file("cpuset", "cpuset.cpus"), cpus, "not pinned to the CPU it asked for");
    assert_eq!(s.hooks.count(&["drift corrected", &claimer.container_id]), 0, "{}", s.hooks.log());
    claimer.remove(&mut rt).await;
    be.remove(&mut rt).await;
}

/// `--cgroup-root` that holds none of the pods' cgroups (a DaemonSet without the host's cgroup
/// mount, in its own cgroup namespace; here a temp tree, taken unchecked): the first pass that
/// finds none of its pods' directories says so, once, naming the root and a missing directory
/// (it used to report `corrected=0` forever); once they are there, it says so and corrects.
#[tokio::test]
async fn a_cgroup_root_without_the_pods_is_a_warning_once() {
    let env = Containerd::from_env();
    let root = tempfile::tempdir().unwrap();
    let label = ("test".to_string(), unique("noroot"));
    let mut rt = runtime_client(&env.socket);
    let (sandbox, container) = pod_configs(&env, &[(QOS, "BE"), (&label.0, &label.1)], &[(SPEC, BE_SPEC)]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    let selector = format!("{}={}", label.0, label.1);
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "500ms",
        "--selector",
        &selector,
        "--cgroup-root",
        root.path().to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
    ];
    let hooks = Hooks::start(&args, root.path().join("hooks.log"));
    let warning = "none of the pods' cgroup directories exist below --cgroup-root";
    assert!(hooks.wait_log(&[warning], 0, Duration::from_secs(10)), "{}", hooks.log());
    let pod_dir = root.path().join("cpu").join(pod.cgroup_parent().trim_start_matches('/'));
    let line = hooks.log().lines().find(|l| l.contains(warning)).unwrap_or_default().to_owned();
    assert!(line.contains("WARN") && line.contains(&format!("cgroup_root={}", root.path().display())), "{line}");
    assert!(line.contains(&format!("missing={}", pod_dir.display())), "names the pod's directory: {line}");
    // Passes every 500 ms: still said once.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(hooks.count(&[warning]), 1, "{}", hooks.log());

    // The pod's cgroup appears below the root (the host's tree mounted after all): said, and
    // its files corrected.
    for ctrl in ["cpu", "memory"] {
        let d = root.path().join(ctrl).join(pod.cgroup_parent().trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(if ctrl == "cpu" { "cpu.shares" } else { "memory.limit_in_bytes" }), "2\n").unwrap();
    }
    assert!(hooks.wait_log(&["pods' cgroup directories found again"], 0, Duration::from_secs(5)), "{}", hooks.log());
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(pod_dir.join("cpu.shares")).unwrap().trim()
            == "512"),
        "{}",
        hooks.log()
    );
    assert_eq!(hooks.count(&[warning]), 1, "{}", hooks.log());
    pod.remove(&mut rt).await;
}

/// A NodeSLO host application (an LS process outside Kubernetes, in its own cgroup below the
/// root) gets CPUSet's value, all LS share pools, from the reconciler: set at once, and again
/// after someone changes it. Its directory is made here, as the operator makes it.
#[tokio::test]
async fn a_host_application_gets_the_ls_share_pools() {
    let parent = unique("rp-test-hostapp");
    let dir = Path::new("/sys/fs/cgroup/cpuset").join(&parent).join("app");
    std::fs::create_dir_all(&dir).unwrap();
    let root_cpus = cgroup("cpuset", "", "cpuset.cpus");
    // cgroup v1 gives a new cpuset group no CPUs: its parent gets the root's, as an operator's would.
    std::fs::write(dir.parent().unwrap().join("cpuset.cpus"), &root_cpus).unwrap();
    let first = root_cpus.split([',', '-']).next().unwrap().to_owned();
    let s = start("500ms", &["--feature-gates", "GroupIdentity=false,BatchResource=false"]);
    s.set_rules(&format!(
        "apiVersion: topology.node.k8s.io/v1alpha1\nkind: NodeResourceTopology\nmetadata:\n  name: n\n  annotations:\
        \n    node.koordinator.sh/cpu-shared-pools: '[{{\"socket\":0,\"node\":0,\"cpuset\":\"{first}\"}}]'\n---\n\
         apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata:\n  name: n\nspec:\n  hostApplications:\
         \n  - name: app\n    qos: LS\n    cgroupPath:\n      base: CgroupRoot\n      parentDir: {parent}\
         \n      relativePath: app\n"
    ));
    let read = || std::fs::read_to_string(dir.join("cpuset.cpus")).unwrap().trim().to_owned();
    assert!(
        eventually(Duration::from_secs(10), || read() == first),
        "cpuset.cpus {:?}, want {first:?}\n{}",
        read(),
        s.hooks.log()
    );
    std::fs::write(dir.join("cpuset.cpus"), &root_cpus).unwrap();
    assert!(
        eventually(Duration::from_secs(10), || read() == first),
        "drift not corrected: {:?}\n{}",
        read(),
        s.hooks.log()
    );
    assert!(s.hooks.log().contains("host application app"), "{}", s.hooks.log());
    drop(s);
    let _ = std::fs::remove_dir(&dir);
    let _ = std::fs::remove_dir(dir.parent().unwrap());
}

/// TerwayQoS's node-level work in standalone mode: Terway's files (in a temp directory) list
/// the real pods of containerd with their bandwidth annotation, and a pod that goes leaves.
#[tokio::test]
async fn terway_qos_files_reflect_the_real_pods() {
    let terway = tempfile::tempdir().unwrap();
    let s = start("1s", &["--feature-gates", "TerwayQoS=true", "--terway-qos-dir", terway.path().to_str().unwrap()]);
    s.set_rules(
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec:\n  \
         systemStrategy: {totalNetworkBandwidth: 800M}\n  resourceQOSStrategy:\n    policies: {netQOSPolicy: terway-qos}\n    \
         beClass: {networkQOS: {enable: true, egressRequest: 10, egressLimit: 400M}}\n",
    );
    let mut rt = runtime_client(&s.env.socket);
    let (sandbox, container) = pod_configs(
        &s.env,
        &[(QOS, "BE"), (&s.label.0, &s.label.1)],
        &[("koordinator.sh/networkQOS", r#"{"ingressLimit": "8M", "egressLimit": "16M"}"#)],
    );
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod on containerd");
    let pods_file = terway.path().join("pod.json");
    let entry = |uid: &str| -> Option<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pods_file).ok()?).ok()?;
        v.get(uid).cloned()
    };
    assert!(eventually(Duration::from_secs(10), || entry(&uid).is_some()), "no entry for {uid}\n{}", s.hooks.log());
    let e = entry(&uid).unwrap();
    assert_eq!(e["podUID"], uid.as_str());
    assert_eq!(e["prio"], 2);
    assert_eq!(e["qosConfig"], serde_json::json!({"ingressBandwidth": 1_000_000, "egressBandwidth": 2_000_000}));
    let parent = pod.cgroup_parent();
    assert_eq!(e["cgroupDir"], format!("/sys/fs/cgroup/net_cls/{}", parent.trim_start_matches('/')));
    let node = std::fs::read_to_string(terway.path().join("global_bps_config")).unwrap();
    assert!(node.starts_with("hw_tx_bps_max 100000000\nhw_rx_bps_max 100000000\n"), "{node}");
    assert!(node.contains("offline_l2_tx_bps_min 10000000\noffline_l2_tx_bps_max 50000000\n"), "{node}");
    pod.remove(&mut rt).await;
    assert!(
        eventually(Duration::from_secs(10), || entry(&uid).is_none()),
        "entry stays after the pod went\n{}",
        s.hooks.log()
    );
}

/// TCNetworkQoS on this machine, which has no `net_cls` hierarchy: the facility is reported
/// missing once at start, the classid write is skipped as unsupported (logged once), and the
/// pod's other values are still corrected.
#[tokio::test]
async fn tc_network_qos_without_net_cls_skips_and_fails_nothing() {
    if std::path::Path::new("/sys/fs/cgroup/net_cls").is_dir() {
        eprintln!("skipped: this machine has net_cls");
        return;
    }
    let s = start("1s", &["--feature-gates", "TCNetworkQoS=true"]);
    assert!(
        s.hooks.wait_log(&["no traffic control for TCNetworkQoS", "no net_cls hierarchy"], 0, Duration::from_secs(5)),
        "{}",
        s.hooks.log()
    );
    assert!(s.hooks.wait_log(&["runtime-hooks running", "tc=no"], 0, Duration::from_secs(5)), "{}", s.hooks.log());
    let pod = s.be_pod().await;
    assert!(
        eventually(Duration::from_secs(10), || values(&pod) == want(100_000, 100_000)),
        "{:?}\n{}",
        values(&pod),
        s.hooks.log()
    );
    assert!(s.hooks.wait_log(&["net_cls.classid", "skipped"], 0, Duration::from_secs(5)), "{}", s.hooks.log());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.hooks.count(&["net_cls.classid", "skipped"]), 1, "logged once\n{}", s.hooks.log());
    assert_eq!(s.hooks.count(&["TCNetworkQoS", "failed"]), 0, "{}", s.hooks.log());
    pod.remove(&mut runtime_client(&s.env.socket)).await;
}

/// An LSR pod created directly on containerd: the reconciler pins its container **and its
/// sandbox (pause) container** to the scheduler's CPU, and lifts both CFS quotas (koordlet's
/// container- and sandbox-level CPUSet reconcilers).
#[tokio::test]
async fn an_lsr_pod_and_its_sandbox_container_get_the_scheduler_cpus() {
    let root_cpus = cgroup("cpuset", "", "cpuset.cpus");
    let cpu = root_cpus.split([',', '-']).next().unwrap().to_owned();
    let s = start("500ms", &["--feature-gates", "GroupIdentity=false,BatchResource=false"]);
    let mut rt = runtime_client(&s.env.socket);
    let status = format!(r#"{{"cpuset": "{cpu}"}}"#);
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "LSR"), (&s.label.0, &s.label.1)], &[(STATUS, &status)]);
    let limited = k8s_cri::v1::LinuxContainerResources {
        cpu_shares: 1024,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        ..Default::default()
    };
    container.linux.as_mut().unwrap().resources = Some(limited);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("LSR pod on containerd");
    let pause = |ctrl: &str, file: &str| cgroup(ctrl, &format!("{}/{}", pod.cgroup_parent(), pod.sandbox_id), file);
    assert!(
        eventually(Duration::from_secs(10), || pod.cgroup_file("cpuset", "cpuset.cpus") == cpu
            && pause("cpuset", "cpuset.cpus") == cpu),
        "container {:?}, sandbox {:?}, want {cpu:?}\n{}",
        pod.cgroup_file("cpuset", "cpuset.cpus"),
        pause("cpuset", "cpuset.cpus"),
        s.hooks.log()
    );
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1");
    assert_eq!(pause("cpu", "cpu.cfs_quota_us"), "-1");
    pod.remove(&mut rt).await;
}

/// The two tests of big containers run one at a time: every runtime-hooks of this binary lists
/// every container, and one's peak memory must not count the other's container.
static BIG_ONES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// runtime-hooks' peak resident memory (`VmHWM`), bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM").trim().trim_end_matches(" kB").trim();
    kb.parse::<u64>().unwrap() * 1024
}

/// A running BE container of 100 k envs (as many as the kernel lets a process start with: 2 MiB
/// of env and argv under an 8 MiB stack limit), whose verbose status is 5 MiB of JSON holding
/// them twice: corrected like any other, and runtime-hooks' peak memory grows by less than a
/// JSON value of that status costs (it reads only the cgroup fields:
/// `runtime_hooks::standalone::reconciler::VerboseInfo`).
#[tokio::test]
async fn a_container_of_100k_envs_is_corrected_without_its_envs_in_memory() {
    let _one = BIG_ONES.lock().await;
    let s = start("1s", &[]);
    let base = peak_rss(s.hooks.pid());
    let mut rt = runtime_client(&s.env.socket);
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE"), (&s.label.0, &s.label.1)], &[(SPEC, BE_SPEC)]);
    container.envs.extend((0..100_000).map(|i| k8s_cri::v1::KeyValue { key: format!("K{i:05}"), value: "1".into() }));
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod of 100 k envs on containerd");
    let corrected = eventually(Duration::from_secs(5), || values(&pod) == want(100_000, 100_000));
    let got = values(&pod);
    // One more pass over it.
    std::thread::sleep(Duration::from_millis(1500));
    let peak = peak_rss(s.hooks.pid());
    pod.remove(&mut rt).await;
    eprintln!("runtime-hooks VmHWM: {} MB before, {} MB after a container of 100 k envs", base >> 20, peak >> 20);
    assert!(corrected, "not corrected: {got:?}\n{}", s.hooks.log());
    assert!(!s.hooks.log().contains("ContainerStatus failed"), "{}", s.hooks.log());
    // Measured: +88 MB when the status is read into a JSON value (three times), +8 MB when only
    // its cgroup fields are.
    assert!(peak < base + (24 << 20), "VmHWM {} MB from {} MB", peak >> 20, base >> 20);
}

/// A running BE container whose verbose status is above 16 MiB (13 MiB of annotation and 100 k
/// envs, which it holds twice): containerd cannot send it (`RESOURCE_EXHAUSTED`). The failure is
/// logged once, not every pass, and the container still gets its values, in the runtime's
/// default directory below its pod's, as does its pod.
#[tokio::test]
async fn a_container_whose_status_is_too_big_is_still_corrected_and_logged_once() {
    let _one = BIG_ONES.lock().await;
    let s = start("1s", &[]);
    let mut rt = runtime_client(&s.env.socket);
    let (sandbox, mut container) = pod_configs(&s.env, &[(QOS, "BE"), (&s.label.0, &s.label.1)], &[(SPEC, BE_SPEC)]);
    container.envs.extend((0..100_000).map(|i| k8s_cri::v1::KeyValue { key: format!("K{i:05}"), value: "1".into() }));
    container.annotations.insert("big".into(), "x".repeat(13 << 20));
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod on containerd");
    let status = rt
        .container_status(k8s_cri::v1::ContainerStatusRequest { container_id: pod.container_id.clone(), verbose: true })
        .await;
    let corrected = eventually(Duration::from_secs(5), || values(&pod) == want(100_000, 100_000));
    let got = values(&pod);
    let parent = pod.cgroup_parent();
    let pod_level = (cgroup("cpu", &parent, "cpu.shares"), cgroup("memory", &parent, "memory.limit_in_bytes"));
    std::thread::sleep(Duration::from_millis(2500));
    let log = s.hooks.log();
    let container_id = pod.container_id.clone();
    pod.remove(&mut rt).await;
    assert_eq!(
        status.map(|_| ()).map_err(|e| e.code()),
        Err(tonic::Code::ResourceExhausted),
        "the status is too big for containerd"
    );
    assert!(corrected, "not corrected: {got:?}\n{log}");
    assert_eq!(pod_level, ("512".into(), "134217728".into()), "pod level\n{log}");
    // Counted for this container: on a loaded machine a pass may also meet the container while
    // containerd is still creating it ("not found"), which is another container's line.
    let failed = log.lines().filter(|l| l.contains("ContainerStatus failed") && l.contains(&container_id)).count();
    assert_eq!(failed, 1, "logged once, over several passes:\n{log}");
}
