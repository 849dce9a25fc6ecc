//! The standalone reconciler on a large node: 250 pods × 4 containers of `test_support::scale`
//! (half BE, 4 in 10 LS, 1 in 10 LSR), served by the CRI stand-in (`test_support::cri_node`),
//! their cgroups in a v1 tree in a temp directory; the reconciler and the built-in plugins in
//! process. No containerd needed (the benchmark `reconciler` has the figures; `standalone` the
//! real runtime).

use std::path::Path;
use std::sync::Arc;

use runtime_hooks::cgroup::{CgroupFs, CgroupVersion};
use runtime_hooks::cgroup_path::CgroupDriver;
use runtime_hooks::framework::Framework;
use runtime_hooks::plugin::FailurePolicy;
use runtime_hooks::rules::RulesStore;
use runtime_hooks::standalone::reconciler::Reconciler;
use test_support::cri_node::{self, CriNode};
use test_support::scale::{self, Qos};

const PODS: usize = 250;
const PER_POD: usize = 4;

fn read(root: &Path, controller: &str, dir: &str, file: &str) -> String {
    let path = root.join(controller).join(dir.trim_start_matches('/')).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_owned()
}

/// One pass writes the plugins' values into every pod's, sandbox's and container's cgroup files
/// (BE: batch shares, CFS quota and memory limit, pod and containers; LSR: their cpuset); a
/// second pass writes nothing and asks the runtime no status again; a NodeSLO turning group
/// identity on reaches every pod (a pod-level value, as koordlet's) in the next pass, and the pass after it writes
/// nothing.
#[tokio::test(flavor = "current_thread")]
async fn one_pass_sets_every_pod_then_nothing() {
    let dir = tempfile::Builder::new().prefix("rh-recon-scale").tempdir().unwrap();
    let root = dir.path().join("cgroup");
    let (pods, containers) = scale::nri_node(PODS, PER_POD);
    scale::cgroup_v1_node(&root, &pods, &containers).unwrap();
    let runtime = CriNode::start(&dir.path().join("cri.sock"), &pods, &containers);
    let rules = RulesStore::defaults();
    let cgroups = CgroupFs::new(&root, CgroupVersion::V1).with_driver(Some(CgroupDriver::Cgroupfs));
    let framework = Arc::new(Framework::new(
        runtime_hooks::plugins::builtin(),
        FailurePolicy::Ignore,
        rules.clone(),
        Arc::new(cgroups),
    ));
    let mut reconciler = Reconciler::new(framework, runtime.socket());

    let first = reconciler.reconcile().await.unwrap();
    assert_eq!((first.pods, first.containers), (PODS, PODS * PER_POD));
    assert!(first.failures.is_empty(), "{:?}", first.failures);
    for (i, pod) in pods.iter().enumerate() {
        let parent = &pod.linux.as_ref().unwrap().cgroup_parent;
        let sandbox = cri_node::sandbox_cgroup(pod);
        let own: Vec<String> = (0..PER_POD).map(|c| format!("{parent}/container-{i:04}-{c}")).collect();
        match Qos::of(i) {
            Qos::Be => {
                // batch-cpu 500 requested, 1000 limit, batch-memory 512Mi per container.
                for dir in &own {
                    assert_eq!(read(&root, "cpu", dir, "cpu.shares"), "512", "{dir}");
                    assert_eq!(read(&root, "cpu", dir, "cpu.cfs_quota_us"), "100000", "{dir}");
                    assert_eq!(read(&root, "memory", dir, "memory.limit_in_bytes"), "536870912", "{dir}");
                }
                assert_eq!(read(&root, "cpu", parent, "cpu.shares"), (4 * 512).to_string(), "{parent}");
                assert_eq!(read(&root, "cpu", parent, "cpu.cfs_quota_us"), "400000", "{parent}");
                assert_eq!(read(&root, "memory", parent, "memory.limit_in_bytes"), (2u64 << 30).to_string());
            }
            Qos::Lsr => {
                let cpus = format!("{}-{}", 2 * (i % 8), 2 * (i % 8) + 1);
                for dir in own.iter().chain([&sandbox]) {
                    assert_eq!(read(&root, "cpuset", dir, "cpuset.cpus"), cpus, "{dir}");
                }
            }
            Qos::Ls => {
                for dir in &own {
                    assert_eq!(read(&root, "cpu", dir, "cpu.shares"), "1024", "kubelet's, kept: {dir}");
                }
            }
        }
    }
    let statuses = |r: &CriNode| {
        r.calls("/runtime.v1.RuntimeService/PodSandboxStatus") + r.calls("/runtime.v1.RuntimeService/ContainerStatus")
    };
    assert_eq!(statuses(&runtime), PODS + PODS * PER_POD, "one status per pod and container");

    let second = reconciler.reconcile().await.unwrap();
    assert_eq!(second.corrected, vec![], "a second pass writes nothing");
    assert_eq!((second.pods, second.containers), (PODS, PODS * PER_POD));
    assert_eq!(statuses(&runtime), PODS + PODS * PER_POD, "cgroup paths are cached");

    // A NodeSLO turns group identity on for every class.
    let spec = serde_json::json!({"resourceQOSStrategy": {
        "lsrClass": {"cpuQOS": {"enable": true, "groupIdentity": 2}},
        "lsClass": {"cpuQOS": {"enable": true, "groupIdentity": 2}},
        "beClass": {"cpuQOS": {"enable": true, "groupIdentity": -1}},
    }});
    assert!(rules.set_cluster_slo(Some(runtime_hooks::rules::node_slo::parse(&spec).unwrap())));
    let changed = reconciler.reconcile().await.unwrap();
    assert!(changed.failures.is_empty(), "{:?}", changed.failures);
    for (i, pod) in pods.iter().enumerate() {
        let parent = &pod.linux.as_ref().unwrap().cgroup_parent;
        let want = if Qos::of(i) == Qos::Be { "-1" } else { "2" };
        assert_eq!(read(&root, "cpu", parent, "cpu.bvt_warp_ns"), want, "{parent}");
    }
    let bvt = changed.corrected.iter().filter(|c| c.drift.path.ends_with("cpu.bvt_warp_ns")).count();
    assert_eq!((bvt, changed.corrected.len()), (PODS, PODS), "the pods' group identity, nothing else");
    let after = reconciler.reconcile().await.unwrap();
    assert_eq!(after.corrected, vec![], "the pass after the change writes nothing");
}
