//! Tests of [`super`]: stages run in gate order, merged answers, pod-level writes, failure
//! policies, with fixed plugins over temp cgroup trees.

use super::*;
use crate::cgroup::CgroupVersion;
use crate::cgroup_path::CgroupDriver;
use crate::change::Resources;
use hook_api::merge::{echo_container, echo_pod};
use hook_api::v1alpha1::{ContainerMetadata, LinuxContainerResources, PodSandboxMetadata};

struct Fixed {
    name: &'static str,
    stages: &'static [Stage],
    change: Option<Change>,
}

impl Plugin for Fixed {
    fn name(&self) -> &'static str {
        self.name
    }
    fn stages(&self) -> &'static [Stage] {
        self.stages
    }
    fn pod(&self, _: Stage, _: &PodContext, _: &Rules) -> anyhow::Result<Change> {
        self.change.clone().ok_or_else(|| anyhow::anyhow!("{} broke", self.name))
    }
    fn container(&self, _: Stage, _: &ContainerContext, _: &Rules) -> anyhow::Result<Change> {
        self.change.clone().ok_or_else(|| anyhow::anyhow!("{} broke", self.name))
    }
}

fn framework(plugins: Vec<Fixed>, policy: FailurePolicy, root: &std::path::Path) -> Framework {
    let plugins = plugins.into_iter().map(|p| Arc::new(p) as Arc<dyn Plugin>).collect();
    Framework::new(
        plugins,
        policy,
        RulesStore::fixed(Rules::default()),
        Arc::new(CgroupFs::new(root, CgroupVersion::V2)),
    )
}

fn shares(n: i64) -> Option<Change> {
    Some(Change { resources: Resources { cpu_shares: Some(n), ..Default::default() }, ..Default::default() })
}

fn container_req() -> ContainerResourceHookRequest {
    ContainerResourceHookRequest {
        pod_meta: Some(PodSandboxMetadata { name: "p".into(), namespace: "ns".into(), ..Default::default() }),
        container_meta: Some(ContainerMetadata { name: "c".into(), ..Default::default() }),
        container_resources: Some(LinuxContainerResources {
            cpu_shares: 2,
            cpu_period: 100_000,
            oom_score_adj: 1000,
            ..Default::default()
        }),
        container_envs: [("PATH".to_string(), "/bin".to_string())].into(),
        container_annotations: [("a".to_string(), "1".to_string())].into(),
        pod_cgroup_parent: "/kubepods/besteffort/pod1".into(),
        ..Default::default()
    }
}

/// Node-level work: every plugin runs, a failing one is reported and does not stop the rest.
#[test]
fn node_pass_runs_every_plugin_and_reports_failures() {
    struct Node(&'static str, bool, std::sync::Mutex<usize>);
    impl Plugin for Node {
        fn name(&self) -> &'static str {
            self.0
        }
        fn stages(&self) -> &'static [Stage] {
            &[]
        }
        fn node(&self, pods: &NodePods<'_>, _: &Rules, _: &Host) -> anyhow::Result<()> {
            *self.2.lock().unwrap() += pods.len();
            if self.1 {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{} broke", self.0))
            }
        }
    }
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (Arc::new(Node("a", false, Default::default())), Arc::new(Node("b", true, Default::default())));
    let f = Framework::new(
        vec![a.clone(), b.clone()],
        FailurePolicy::Fail,
        RulesStore::fixed(Rules::default()),
        Arc::new(CgroupFs::new(t.path(), CgroupVersion::V2)),
    );
    let failures = f.node_pass(&NodePods::given(&[PodState::default(), PodState::default()]));
    assert_eq!(failures.len(), 1);
    assert_eq!((failures[0].plugin, failures[0].target.as_str()), ("a", "node"));
    assert_eq!((*a.2.lock().unwrap(), *b.2.lock().unwrap()), (2, 2), "both saw both pods");
}

/// A node pass builds the pods once, and only when a plugin reads them: with every built-in plugin
/// on default rules and a host with no core scheduling, resctrl or tc (a default node), an NRI
/// event's node pass costs nothing per pod.
#[test]
fn node_pods_are_built_once_and_only_when_read() {
    let t = tempfile::tempdir().unwrap();
    let builds = std::sync::atomic::AtomicUsize::new(0);
    let build = || {
        builds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        vec![PodState::default(); 3]
    };
    let builtin = Framework::new(
        crate::plugins::builtin(),
        FailurePolicy::Ignore,
        RulesStore::fixed(Rules::default()),
        Arc::new(CgroupFs::new(t.path(), CgroupVersion::V2)),
    );
    let pods = NodePods::lazy(&build);
    assert!(builtin.node_pass(&pods).is_empty());
    assert!(!pods.were_read(), "no built-in plugin reads the pods on a default node");
    assert_eq!(builds.load(std::sync::atomic::Ordering::Relaxed), 0);

    struct Reads;
    impl Plugin for Reads {
        fn name(&self) -> &'static str {
            "reads"
        }
        fn stages(&self) -> &'static [Stage] {
            &[]
        }
        fn node(&self, pods: &NodePods<'_>, _: &Rules, _: &crate::host::Host) -> anyhow::Result<()> {
            anyhow::ensure!(pods.len() == 3, "saw {} pods", pods.len());
            Ok(())
        }
    }
    let two = Framework::new(
        vec![Arc::new(Reads), Arc::new(Reads)],
        FailurePolicy::Ignore,
        RulesStore::fixed(Rules::default()),
        Arc::new(CgroupFs::new(t.path(), CgroupVersion::V2)),
    );
    let pods = NodePods::lazy(&build);
    assert!(two.node_pass(&pods).is_empty(), "both saw the three pods");
    assert_eq!(builds.load(std::sync::atomic::Ordering::Relaxed), 1, "built once for two plugins");
}

#[test]
fn stages_are_the_union_in_order() {
    let t = tempfile::tempdir().unwrap();
    let f = framework(
        vec![
            Fixed {
                name: "a",
                stages: &[Stage::PreUpdateContainerResources, Stage::PreCreateContainer],
                change: shares(3),
            },
            Fixed { name: "b", stages: &[Stage::PreRunPodSandbox, Stage::PreCreateContainer], change: shares(4) },
        ],
        FailurePolicy::Ignore,
        t.path(),
    );
    assert_eq!(
        f.stages(),
        vec![Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources]
    );
}

#[test]
fn answer_is_the_echo_plus_changes_later_plugin_winning() {
    let t = tempfile::tempdir().unwrap();
    let mut envs = Change { envs: [("HOOKED".to_string(), "yes".to_string())].into(), ..shares(300).unwrap() };
    envs.annotations.insert("b".into(), "2".into());
    let f = framework(
        vec![
            Fixed { name: "first", stages: &[Stage::PreCreateContainer], change: Some(envs) },
            Fixed { name: "second", stages: &[Stage::PreCreateContainer], change: shares(512) },
            Fixed { name: "elsewhere", stages: &[Stage::PreStartContainer], change: shares(7) },
        ],
        FailurePolicy::Fail,
        t.path(),
    );
    let req = container_req();
    let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
    let r = resp.container_resources.unwrap();
    assert_eq!((r.cpu_shares, r.cpu_period, r.oom_score_adj), (512, 100_000, 1000), "later wins, the rest echoed");
    assert_eq!(resp.container_envs["PATH"], "/bin");
    assert_eq!(resp.container_envs["HOOKED"], "yes");
    assert_eq!(resp.container_annotations.len(), 2);
    assert_eq!(resp.pod_cgroup_parent, req.pod_cgroup_parent);
    // A stage no plugin wants: the pure echo.
    assert_eq!(f.container_hook(Stage::PostStopContainer, &req).unwrap(), echo_container(&req));
}

/// The answers built of the moved request are the echo of every field the answer has: a
/// full request of each kind, at a stage no plugin wants.
#[test]
fn moved_requests_answer_the_whole_echo() {
    let t = tempfile::tempdir().unwrap();
    let f = framework(vec![], FailurePolicy::Fail, t.path());
    let res = LinuxContainerResources {
        cpu_shares: 2,
        cpuset_cpus: "0-1".into(),
        unified: [("a".into(), "b".into())].into(),
        ..Default::default()
    };
    let meta = PodSandboxMetadata { name: "p".into(), namespace: "ns".into(), uid: "u".into(), attempt: 1 };
    let map = |k: &str| -> std::collections::BTreeMap<String, String> { [(k.to_string(), "v".to_string())].into() };
    let req = ContainerResourceHookRequest {
        pod_meta: Some(meta.clone()),
        container_meta: Some(ContainerMetadata { name: "c".into(), attempt: 2, id: "id".into() }),
        container_annotations: map("ca"),
        container_resources: Some(res.clone()),
        pod_resources: Some(res.clone()),
        pod_annotations: map("pa"),
        pod_labels: map("pl"),
        pod_cgroup_parent: "/kubepods/pod1".into(),
        container_envs: map("E"),
    };
    assert_eq!(f.container_hook_owned(Stage::PreCreateContainer, req.clone()).unwrap(), echo_container(&req));
    let req = PodSandboxHookRequest {
        pod_meta: Some(meta),
        runtime_handler: "runc".into(),
        labels: map("l"),
        annotations: map("a"),
        cgroup_parent: "/kubepods/pod1".into(),
        overhead: Some(res.clone()),
        resources: Some(res),
    };
    assert_eq!(f.pod_hook_owned(Stage::PreRunPodSandbox, req.clone()).unwrap(), echo_pod(&req));
}

/// An answer that would pass the proxies' 4 MiB limit leaves out unchanged annotations
/// (and envs when no plugin changed one); the plugins' changes stay.
#[test]
fn large_answers_leave_out_the_unchanged_echo() {
    let t = tempfile::tempdir().unwrap();
    let mut with_env = Change { envs: [("HOOKED".to_string(), "yes".to_string())].into(), ..shares(300).unwrap() };
    with_env.annotations.insert("b".into(), "2".into());
    let big = "x".repeat(ECHO_LIMIT_BYTES);
    let mut req = container_req();
    req.container_annotations.insert("big".into(), big.clone());
    let f = framework(
        vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: shares(512) }],
        FailurePolicy::Fail,
        t.path(),
    );
    let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
    assert!(resp.container_annotations.is_empty() && resp.container_envs.is_empty(), "{:?}", resp.container_envs);
    assert_eq!(resp.container_resources.unwrap().cpu_shares, 512);
    let f = framework(
        vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: Some(with_env) }],
        FailurePolicy::Fail,
        t.path(),
    );
    let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
    assert_eq!(resp.container_annotations, [("b".to_string(), "2".to_string())].into());
    assert_eq!(resp.container_envs.len(), 2, "a changed env keeps the whole env echoed");
    // Envs that are large are left out too when no plugin changed one.
    let mut req = container_req();
    req.container_envs.insert("BIG".into(), big);
    let f = framework(
        vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: shares(512) }],
        FailurePolicy::Fail,
        t.path(),
    );
    let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
    assert!(resp.container_envs.is_empty());
    assert!(prost::Message::encoded_len(&resp) < ECHO_LIMIT_BYTES);
}

#[test]
fn fail_policy_stops_with_the_plugin_named() {
    let t = tempfile::tempdir().unwrap();
    let f = framework(
        vec![
            Fixed { name: "broken", stages: &[Stage::PreCreateContainer], change: None },
            Fixed { name: "fine", stages: &[Stage::PreCreateContainer], change: shares(512) },
        ],
        FailurePolicy::Fail,
        t.path(),
    );
    let err = f.container_hook(Stage::PreCreateContainer, &container_req()).unwrap_err();
    assert_eq!(err.code, Code::INTERNAL);
    for part in ["broken", "PreCreateContainer", "ns/p/c", "broken broke", "Fail"] {
        assert!(err.message.contains(part), "{part:?} in {:?}", err.message);
    }
}

#[test]
fn ignore_policy_drops_only_the_failing_plugin() {
    let t = tempfile::tempdir().unwrap();
    let f = framework(
        vec![
            Fixed { name: "fine", stages: &[Stage::PreCreateContainer], change: shares(512) },
            Fixed { name: "broken", stages: &[Stage::PreCreateContainer], change: None },
        ],
        FailurePolicy::Ignore,
        t.path(),
    );
    let ctx = ContainerContext::from_request(&container_req());
    let outcome = f.run_container(Stage::PreCreateContainer, &ctx).unwrap();
    assert_eq!(outcome.change.resources.cpu_shares, Some(512));
    assert_eq!(outcome.failures.len(), 1);
    assert_eq!(outcome.failures[0].plugin, "broken");
    assert_eq!(outcome.container_values, vec![Owned { plugin: "fine", value: CgroupValue::CpuShares(512) }]);
}

#[test]
fn pod_values_are_written_and_a_missing_kernel_file_is_no_failure() {
    let t = tempfile::tempdir().unwrap();
    let pod_dir = t.path().join("kubepods/pod1");
    std::fs::create_dir_all(&pod_dir).unwrap();
    std::fs::write(pod_dir.join("cpu.weight"), "100").unwrap();
    let change =
        Change { pod_cgroup: vec![CgroupValue::CpuShares(1024), CgroupValue::BvtWarpNs(-1)], ..Default::default() };
    let f = framework(
        vec![Fixed { name: "podlevel", stages: &[Stage::PreRunPodSandbox], change: Some(change) }],
        FailurePolicy::Fail,
        t.path(),
    );
    let req = PodSandboxHookRequest {
        cgroup_parent: "/kubepods/pod1".into(),
        labels: [("x".to_string(), "y".to_string())].into(),
        ..Default::default()
    };
    let resp = f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap();
    let shares = Some(LinuxContainerResources { cpu_shares: 1024, ..Default::default() });
    assert_eq!(
        resp,
        PodSandboxHookResponse { resources: shares.clone(), ..echo_pod(&req) },
        "the echo, and the pod's shares as koordlet answers them"
    );
    assert_eq!(std::fs::read_to_string(pod_dir.join("cpu.weight")).unwrap(), "100", "1024 shares, runc's formula");
    assert_eq!(f.cgroups().unsupported(), vec!["cpu.bvt_warp_ns".to_string()]);
    // The pod's directory does not exist yet: logged, not a failure (even under Fail).
    let early = PodSandboxHookRequest { cgroup_parent: "/kubepods/pod2".into(), ..Default::default() };
    assert_eq!(
        f.pod_hook(Stage::PreRunPodSandbox, &early).unwrap(),
        PodSandboxHookResponse { resources: shares, ..echo_pod(&early) }
    );
    // A file that cannot be read or written is the owning plugin's failure (here: cpu.max is
    // a directory, which even root cannot write).
    std::fs::create_dir(pod_dir.join("cpu.max")).unwrap();
    let change = Change { pod_cgroup: vec![CgroupValue::CfsQuota(5000)], ..Default::default() };
    let f = framework(
        vec![Fixed { name: "quota", stages: &[Stage::PreRunPodSandbox], change: Some(change) }],
        FailurePolicy::Fail,
        t.path(),
    );
    let blocked = PodSandboxHookRequest { cgroup_parent: "/kubepods/pod1".into(), ..Default::default() };
    let err = f.pod_hook(Stage::PreRunPodSandbox, &blocked).unwrap_err();
    assert!(err.message.contains("plugin quota") && err.message.contains("cpu.max"), "{}", err.message);
}

/// The built-in plugins on a v1 tree laid out like a systemd node (`kubepods.slice/…`).
fn builtin_on(root: &std::path::Path, driver: Option<CgroupDriver>, policy: FailurePolicy) -> Framework {
    let cgroups = CgroupFs::new(root, CgroupVersion::V1).with_driver(driver);
    Framework::new(crate::plugins::builtin(), policy, RulesStore::fixed(Rules::default()), Arc::new(cgroups))
}

const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

fn be_pod(parent: &str) -> PodSandboxHookRequest {
    PodSandboxHookRequest {
        pod_meta: Some(PodSandboxMetadata {
            name: "be".into(),
            namespace: "ns".into(),
            uid: "1234".into(),
            attempt: 0,
        }),
        labels: [(crate::context::QOS_CLASS_KEY.to_string(), "BE".to_string())].into(),
        annotations: [(crate::plugins::batch_resource::EXTENDED_RESOURCE_SPEC.to_string(), BE_SPEC.to_string())].into(),
        cgroup_parent: parent.into(),
        ..Default::default()
    }
}

/// The answer to [`be_pod`]: the echo with BatchResource's pod values in `resources`, as
/// koordlet fills them (shares, quota, memory limit; not the period).
fn be_answer(req: &PodSandboxHookRequest) -> PodSandboxHookResponse {
    let resources = LinuxContainerResources {
        cpu_shares: 512,
        cpu_quota: 100_000,
        memory_limit_in_bytes: 128 << 20,
        ..Default::default()
    };
    PodSandboxHookResponse { resources: Some(resources), ..echo_pod(req) }
}

/// koordlet's PreRunPodSandbox answer (`PodResponse.ProxyDone`) carries the pod-level values
/// its hooks computed: a BE pod's batch sums over the echoed request's resources (its CFS
/// period kept: koordlet never answers one), a CPU-bound LSR pod's −1 quota; a pod no
/// plugin sets a value for gets the plain echo, without a `resources` it did not send.
#[test]
fn pod_answers_carry_the_pod_values_as_koordlet_fills_them() {
    let t = tempfile::tempdir().unwrap();
    let f = builtin_on(t.path(), None, FailurePolicy::Fail);
    let mut be = be_pod("/kubepods/besteffort/pod1234");
    be.resources =
        Some(LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, oom_score_adj: -998, ..Default::default() });
    let resp = f.pod_hook(Stage::PreRunPodSandbox, &be).unwrap();
    let want = LinuxContainerResources {
        cpu_shares: 512,
        cpu_quota: 100_000,
        memory_limit_in_bytes: 128 << 20,
        ..be.resources.clone().unwrap()
    };
    assert_eq!(resp, PodSandboxHookResponse { resources: Some(want), ..echo_pod(&be) });
    // One container without a memory limit: the pod's is −1 (unlimited), answered as is.
    let open = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#;
    be.annotations.insert(crate::plugins::batch_resource::EXTENDED_RESOURCE_SPEC.into(), open.into());
    assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &be).unwrap().resources.unwrap().memory_limit_in_bytes, -1);
    let lsr = PodSandboxHookRequest {
        labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LSR".to_string())].into(),
        annotations: [(crate::plugins::cpuset::RESOURCE_STATUS.to_string(), r#"{"cpuset": "2-3"}"#.to_string())].into(),
        cgroup_parent: "/kubepods/pod5678".into(),
        ..Default::default()
    };
    let want = LinuxContainerResources { cpu_quota: -1, ..Default::default() };
    assert_eq!(
        f.pod_hook(Stage::PreRunPodSandbox, &lsr).unwrap(),
        PodSandboxHookResponse { resources: Some(want), ..echo_pod(&lsr) }
    );
    let ls =
        PodSandboxHookRequest { labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LS".to_string())].into(), ..lsr };
    assert_eq!(
        f.pod_hook(Stage::PreRunPodSandbox, &ls).unwrap(),
        echo_pod(&ls),
        "GroupIdentity's bvt is no answer field"
    );
}

/// Creates `<root>/{cpu,memory}/<dir>` with kernel-like defaults (no cpu.bvt_warp_ns: this
/// kernel has no group identity).
fn v1_dir(root: &std::path::Path, dir: &str) {
    for (ctrl, files) in [
        ("cpu", &[("cpu.shares", "2"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")][..]),
        ("memory", &[("memory.limit_in_bytes", "9223372036854771712")][..]),
    ] {
        let d = root.join(ctrl).join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in files {
            std::fs::write(d.join(f), v).unwrap();
        }
    }
}

/// The issue: a systemd slice name as the pod's cgroup parent was refused ("not an absolute
/// path"), failing every pod under Fail. It resolves to its expanded directory, where the BE
/// values land.
#[test]
fn a_systemd_slice_parent_gets_the_be_values_in_its_expanded_directory() {
    let t = tempfile::tempdir().unwrap();
    let expanded = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice";
    v1_dir(t.path(), expanded);
    let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap().trim().to_owned();
    for driver in [Some(CgroupDriver::Systemd), None] {
        std::fs::write(t.path().join("cpu").join(expanded).join("cpu.shares"), "2").unwrap();
        let f = builtin_on(t.path(), driver, FailurePolicy::Fail);
        let req = be_pod("kubepods-besteffort-pod1234.slice");
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap(), be_answer(&req), "{driver:?}");
        assert_eq!(read(&format!("cpu/{expanded}/cpu.shares")), "512", "{driver:?}");
        assert_eq!(read(&format!("cpu/{expanded}/cpu.cfs_quota_us")), "100000");
        assert_eq!(read(&format!("cpu/{expanded}/cpu.cfs_period_us")), "100000");
        assert_eq!(read(&format!("memory/{expanded}/memory.limit_in_bytes")), "134217728");
        assert_eq!(f.cgroups().unsupported(), vec!["cpu.bvt_warp_ns".to_string()], "no group identity here: skipped");
    }
    // kubelet's own (expanded) form, under the cgroupfs driver too.
    std::fs::write(t.path().join("cpu").join(expanded).join("cpu.shares"), "2").unwrap();
    let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Fail);
    f.pod_hook(Stage::PreRunPodSandbox, &be_pod(&format!("/{expanded}"))).unwrap();
    assert_eq!(read(&format!("cpu/{expanded}/cpu.shares")), "512");
}

/// The cluster's NodeResourceTopology and Node reach the plugins through the rules store:
/// an LS container gets the share pools in its answer, a BE pod's quota (its cgroup and its
/// container's answer) is scaled by the normalization ratio and its cpuset cleared. And
/// when the inputs go away, the answers go back.
#[test]
fn the_rules_stores_topology_and_node_reach_the_plugins() {
    use crate::rules::node::NodeRules;
    use crate::rules::topology::{CpuSharedPool, Topology};
    let t = tempfile::tempdir().unwrap();
    let pod_dir = "kubepods/besteffort/pod1234";
    v1_dir(t.path(), pod_dir);
    let store = RulesStore::fixed(Rules::default());
    let f = Framework::new(
        crate::plugins::builtin(),
        FailurePolicy::Fail,
        store.clone(),
        Arc::new(CgroupFs::new(t.path(), CgroupVersion::V1)),
    );
    let pools = vec![
        CpuSharedPool { socket: 0, node: 0, cpuset: "0-3".into() },
        CpuSharedPool { socket: 1, node: 1, cpuset: "8-11".into() },
    ];
    assert!(store.set_cluster_topology(Some(Topology { share_pools: pools, ..Default::default() })));
    assert!(store.set_cluster_node(Some(NodeRules { cpu_normalization_ratio: Some(1.2) })));

    let ls = ContainerResourceHookRequest {
        pod_labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LS".to_string())].into(),
        pod_cgroup_parent: "/kubepods/burstable/pod5678".into(),
        ..container_req()
    };
    let answer = |req: &ContainerResourceHookRequest| {
        f.container_hook(Stage::PreCreateContainer, req).unwrap().container_resources.unwrap()
    };
    assert_eq!(answer(&ls).cpuset_cpus, "0-3,8-11");
    let pod = be_pod(&format!("/{pod_dir}"));
    f.pod_hook(Stage::PreRunPodSandbox, &pod).unwrap();
    let quota = || std::fs::read_to_string(t.path().join("cpu").join(pod_dir).join("cpu.cfs_quota_us")).unwrap();
    assert_eq!(quota(), "83334", "⌈100000 ÷ 1.2⌉");
    let be = ContainerResourceHookRequest {
        pod_labels: pod.labels.clone(),
        pod_annotations: pod.annotations.clone(),
        pod_cgroup_parent: pod.cgroup_parent.clone(),
        container_meta: Some(ContainerMetadata { name: "main".into(), ..Default::default() }),
        container_resources: Some(LinuxContainerResources { cpuset_cpus: "4-5".into(), ..Default::default() }),
        ..container_req()
    };
    let r = answer(&be);
    assert_eq!((r.cpu_quota, r.cpu_shares, r.cpuset_cpus.as_str()), (83_334, 512, ""));

    assert!(store.set_cluster_topology(None));
    assert!(store.set_cluster_node(None));
    assert_eq!(answer(&ls).cpuset_cpus, "", "no pools: unchanged (the request's empty cpuset echoed)");
    assert_eq!(answer(&ls), container_req().container_resources.unwrap(), "the echo");
    f.pod_hook(Stage::PreRunPodSandbox, &pod).unwrap();
    assert_eq!(quota(), "100000");
    let r = answer(&be);
    assert_eq!((r.cpu_quota, r.cpuset_cpus.as_str()), (100_000, ""), "BestEffort is still cleared");
}

/// Under the cgroupfs driver a slice name is refused: a failure of each plugin with pod
/// values, naming the name and the driver; nothing written.
#[test]
fn a_slice_name_under_the_cgroupfs_driver_is_the_plugins_failure() {
    let t = tempfile::tempdir().unwrap();
    let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Fail);
    let err = f.pod_hook(Stage::PreRunPodSandbox, &be_pod("kubepods-besteffort-pod1234.slice")).unwrap_err();
    for part in ["GroupIdentity", "PreRunPodSandbox", "kubepods-besteffort-pod1234.slice", "cgroupfs"] {
        assert!(err.message.contains(part), "{part:?} in {:?}", err.message);
    }
    let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Ignore);
    let pod = PodContext::from_pod_request(&be_pod("kubepods-besteffort-pod1234.slice"));
    let mut outcome = f.run_pod(Stage::PreRunPodSandbox, &pod).unwrap();
    f.write_pod_values(Stage::PreRunPodSandbox, &pod, &mut outcome).unwrap();
    let failed: Vec<&str> = outcome.failures.iter().map(|f| f.plugin).collect();
    assert_eq!(failed, ["GroupIdentity", "BatchResource"]);
    assert!(!t.path().join("cpu").exists(), "nothing written");
}

/// The issue: an empty cgroup parent (CRI: the runtime's default) failed GroupIdentity under
/// Fail, for pods without a QoS class too, on a kernel without cpu.bvt_warp_ns. Nothing is
/// written at pod level and nothing fails.
#[test]
fn an_empty_parent_is_the_runtime_default_never_a_failure() {
    let t = tempfile::tempdir().unwrap();
    for driver in [None, Some(CgroupDriver::Systemd), Some(CgroupDriver::Cgroupfs)] {
        let f = builtin_on(t.path(), driver, FailurePolicy::Fail);
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &be_pod("")).unwrap(), be_answer(&be_pod("")), "{driver:?}");
        for req in [
            PodSandboxHookRequest::default(),
            PodSandboxHookRequest { cgroup_parent: "/".into(), ..Default::default() },
        ] {
            assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap(), echo_pod(&req), "{driver:?} {req:?}");
        }
    }
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "nothing written");
}
