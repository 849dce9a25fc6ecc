//! The cgroup v2 node of `scripts/v2vm.sh` is the node it says it is: a qemu guest with systemd as
//! PID 1 on cgroup v2 and containerd 2.1 + runc 1.3 with the systemd cgroup driver. A pod made the
//! way kubelet makes one there (its slices as transient units over D-Bus, the pod slice as its
//! cgroup parent), run through runtime-proxy, gets the cgroup v2 values runc 1.3 writes.
//!
//! Runs only inside the guest (`scripts/v2vm.sh test v2_guest`, which sets `RP_V2_GUEST=1`); on
//! any other machine every test here fails, saying so.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use test_support::containerd::{container_config, unique, Pod};
use test_support::proxy::ProxyProcess;
use test_support::systemd::{
    cgroup_file, daemon_reload, guest, sandbox_config_systemd, scope_dir, show, slice_dir, stop_slice, Qos,
    CGROUP_ROOT, KUBEPODS,
};
use test_support::{runtime_client, workspace_binary};

/// The controllers kubelet and koordlet-style hooks need in the pods' cgroups.
const CONTROLLERS: [&str; 5] = ["cpuset", "cpu", "io", "memory", "pids"];

/// runc 1.3's CPU weight for `shares` (libcontainer's ConvertCPUSharesToCgroupV2Value since 1.3:
/// a quadratic in log2(shares) through (2, 1), (1024, 100) and (262144, 10000)).
fn runc_cpu_weight(shares: u64) -> u64 {
    let l = (shares as f64).log2();
    10f64.powf((l * l + 125.0 * l) / 612.0 - 7.0 / 34.0).ceil() as u64
}

/// The controllers enabled in `dir`'s `cgroup.subtree_control`.
fn subtree_control(dir: &std::path::Path) -> String {
    cgroup_file(dir, "cgroup.subtree_control")
}

#[test]
fn the_guest_runs_cgroup_v2_with_systemd_and_runc_1_3() {
    let env = guest();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS… - FSTYPE SOURCE SUPEROPTIONS`
    let fstype = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(CGROUP_ROOT))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|l| l.split(' ').next());
    assert_eq!(fstype, Some("cgroup2"), "{CGROUP_ROOT} in /proc/self/mountinfo:\n{mountinfo}");
    let root = std::path::Path::new(CGROUP_ROOT);
    let control = subtree_control(root);
    for c in CONTROLLERS {
        assert!(control.split(' ').any(|e| e == c), "root's cgroup.subtree_control lacks {c}: {control:?}");
    }
    assert_eq!(std::fs::read_to_string("/proc/1/comm").unwrap().trim(), "systemd", "PID 1");
    assert_eq!(env.major_minor(), (2, 1), "containerd {}", env.version);
    let runc = env.runc_version.as_deref().unwrap_or_default();
    assert!(runc.starts_with("1.3."), "RUNC_VERSION={runc:?}");
    assert!(env.nri_socket.as_ref().is_some_and(|s| s.exists()), "containerd's NRI socket {:?}", env.nri_socket);
}

#[tokio::test]
async fn a_best_effort_pod_under_kubelet_slices_gets_runc_1_3_values() {
    let env = guest();
    let binary = workspace_binary("runtime-proxy");
    let proxy = ProxyProcess::start(binary.to_str().unwrap(), &env.socket, &[]);
    let mut rt = runtime_client(proxy.socket());

    let config =
        rt.runtime_config(cri::RuntimeConfigRequest {}).await.expect("RuntimeConfig through the proxy").into_inner();
    let linux = config.linux.expect("RuntimeConfig has a linux part");
    assert_eq!(linux.cgroup_driver(), cri::CgroupDriver::Systemd, "{linux:?}");

    let sandbox = sandbox_config_systemd(&env, &unique("v2-be"), HashMap::new(), HashMap::new(), Qos::BestEffort);
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    let slice = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    assert_eq!(slice, format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")));
    assert_eq!(show(&slice, "CPUWeight"), "1", "a BestEffort pod's slice: 2 shares");
    assert_eq!(show(&slice, "Wants"), "kubepods-besteffort.slice");
    let resources = cri::LinuxContainerResources {
        cpu_shares: 512,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("the pod starts");

    let scope = scope_dir(&slice, &pod.container_id);
    let sandbox_scope = scope_dir(&slice, &pod.sandbox_id);
    assert!(sandbox_scope.is_dir(), "the sandbox's scope {}", sandbox_scope.display());
    let expected = [
        ("cpu.weight", runc_cpu_weight(512).to_string()),
        ("cpu.max", "50000 100000".into()),
        ("memory.max", "67108864".into()),
    ];
    assert_eq!(expected[0].1, "59", "runc 1.3's weight for 512 shares");
    let read = || expected.iter().map(|(f, _)| (*f, cgroup_file(&scope, f))).collect::<Vec<_>>();
    let want: Vec<(&str, String)> = expected.iter().map(|(f, v)| (*f, v.clone())).collect();
    assert_eq!(read(), want, "the container's scope {}", scope.display());
    // systemd owns the scope with the same values, so a daemon-reload keeps them
    let unit = format!("cri-containerd-{}.scope", pod.container_id);
    assert_eq!(show(&unit, "ControlGroup"), format!("/{}", scope.strip_prefix(CGROUP_ROOT).unwrap().display()));
    assert_eq!((show(&unit, "CPUWeight"), show(&unit, "MemoryMax")), ("59".into(), "67108864".into()));
    daemon_reload();
    assert_eq!(read(), want, "after systemctl daemon-reload");
    // every controller reaches the pod's cgroups
    for dir in [
        std::path::PathBuf::from(CGROUP_ROOT),
        slice_dir(KUBEPODS),
        slice_dir(Qos::BestEffort.parent_slice()),
        slice_dir(&slice),
    ] {
        let control = subtree_control(&dir);
        for c in CONTROLLERS {
            assert!(
                control.split(' ').any(|e| e == c),
                "{}/cgroup.subtree_control lacks {c}: {control:?}",
                dir.display()
            );
        }
    }
    assert!(scope.join("cpuset.cpus").exists(), "the container's scope has cpuset files");

    pod.remove(&mut rt).await;
    stop_slice(&slice);
    assert!(!slice_dir(&slice).exists(), "{} is gone with its slice", slice_dir(&slice).display());
}
