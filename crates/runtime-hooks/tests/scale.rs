//! runtime-hooks' NRI mode on a large node, against the NRI runtime stand-in
//! (`test_support::nri_runtime`) with a node of `test_support::scale` pods (half BE, 4 in 10 LS,
//! 1 in 10 LSR) and their pod cgroups in a v1 tree in a temp directory. No containerd needed:
//! a real containerd here holds far fewer pods (the benchmark `large_node` has the figures at
//! every size, and `nri_mode` the real runtimes).

mod common;

use std::time::Duration;

use common::*;
use test_support::nri_runtime::NriRuntime;
use test_support::scale::{self, Qos};

const PODS: usize = 250;
const PER_POD: usize = 4;

/// Synchronize of 250 pods × 4 containers: the answer updates exactly the containers whose
/// values differ from what the plugins want (the BE ones: batch shares, quota and memory limit;
/// the LSR ones: their cpuset), not the LS ones that already hold kubelet's values; and when
/// runtime-hooks connects again to the runtime that applied them, it answers nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronize_answers_only_what_differs() {
    let dir = tempfile::Builder::new().prefix("rh-nri-scale").tempdir().unwrap();
    let (pods, mut containers) = scale::nri_node(PODS, PER_POD);
    scale::cgroup_v1_tree(&dir.path().join("cgroup"), &pods).unwrap();
    let runtime = NriRuntime::v0_12().unwrap();
    let hooks = start_nri_v1(runtime.socket(), dir.path(), "info");
    let plugin =
        runtime.accept(pods.clone(), containers.clone()).await.unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
    let updated: std::collections::BTreeSet<&str> =
        plugin.sync.answered.iter().map(|u| u.container_id.as_str()).collect();
    let want: std::collections::BTreeSet<&str> = containers
        .iter()
        .enumerate()
        .filter(|(n, _)| Qos::of(n / PER_POD) != Qos::Ls)
        .map(|(_, c)| c.id.as_str())
        .collect();
    assert_eq!(updated, want, "{}", hooks.log());
    let be =
        &plugin.sync.answered[plugin.sync.answered.iter().position(|u| u.container_id.ends_with("0000-0")).unwrap()];
    let cpu = be.linux.as_ref().unwrap().resources.as_ref().unwrap().cpu.as_ref().unwrap();
    assert_eq!((cpu.shares.as_ref().map(|s| s.value), cpu.period), (Some(512), None), "only what differs: {be:?}");
    // The runtime applied them; runtime-hooks connects again (e.g. after a restart of its own).
    scale::updated(&mut containers, &plugin.sync.answered);
    plugin.close().await;
    let plugin = runtime.accept(pods, containers).await.unwrap_or_else(|e| panic!("{e}\n{}", hooks.log()));
    assert!(plugin.sync.answered.is_empty(), "{:?}", &plugin.sync.answered[..3.min(plugin.sync.answered.len())]);
    assert!(
        hooks.wait_log(&["NRI: applied to known pods", "updates=0", "held=600"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
}
