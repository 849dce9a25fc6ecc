use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::context::{ContainerContext, QOS_CLASS_KEY};
use crate::host::core_sched::FakeCoreSched;
use crate::host::HostPaths;
use crate::plugin::ContainerState;

fn rules(spec: serde_json::Value) -> Rules {
    Rules { core_sched: crate::rules::core_sched::parse(&spec).unwrap(), ..Default::default() }
}

/// coreSched on for LS (expeller by default) and BE.
fn on() -> Rules {
    rules(json!({"resourceQOSStrategy":{"policies":{"cpuPolicy":"coreSched"},
        "lsClass":{"cpuQOS":{"enable":true}},"beClass":{"cpuQOS":{"enable":true,"schedIdle":1}}}}))
}

fn pod(uid: &str, labels: &[(&str, &str)], kube: &str) -> PodContext {
    PodContext {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        cgroup_parent: format!("/kubepods/{kube}/pod{uid}"),
        ..Default::default()
    }
}

/// A cgroup v2 tree with the pod's sandbox (`pause`) and containers, each with its pids.
fn state(root: &Path, pod: PodContext, sandbox: &[u32], containers: &[(&str, &[u32])]) -> PodState {
    let pod_dir = pod.cgroup_parent.clone();
    let write = |dir: &str, pids: &[u32]| {
        let d = root.join(dir.trim_start_matches('/'));
        std::fs::create_dir_all(&d).unwrap();
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        std::fs::write(d.join("cgroup.procs"), text).unwrap();
    };
    write(&format!("{pod_dir}/pause"), sandbox);
    let mut s = PodState { pod: pod.clone(), cgroup_dir: Some(pod_dir.clone()), containers: Vec::new() };
    for (id, pids) in containers {
        let dir = format!("{pod_dir}/{id}");
        write(&dir, pids);
        s.containers.push(ContainerState {
            container: ContainerContext {
                pod: pod.clone(),
                name: id.to_string(),
                id: id.to_string(),
                ..Default::default()
            },
            cgroup_dir: Some(dir),
        });
    }
    s
}

fn host(root: &Path, fake: &Arc<FakeCoreSched>) -> Host {
    std::fs::write(root.join("cgroup.controllers"), "cpu\n").unwrap();
    Host {
        paths: HostPaths { cgroup_root: root.to_owned(), ..Default::default() },
        core_sched: Some(fake.clone()),
        resctrl: None,
        ..Default::default()
    }
}

#[test]
fn group_by_label_policy_and_expeller() {
    let r = on();
    let ls = |labels: &[(&str, &str)]| {
        let mut l = vec![(QOS_CLASS_KEY, "LS")];
        l.extend_from_slice(labels);
        CoreSched::pod_group(&pod("u1", &l, "burstable"), &r)
    };
    assert_eq!(ls(&[]), (true, "-expeller".into()));
    assert_eq!(ls(&[(LABEL_GROUP_ID, "g")]), (true, "g-expeller".into()));
    assert_eq!(ls(&[(LABEL_GROUP_ID, "g"), (LABEL_POLICY, "exclusive")]), (true, "u1-expeller".into()));
    assert!(!ls(&[(LABEL_GROUP_ID, "g"), (LABEL_POLICY, "none")]).0);
    assert_eq!(ls(&[(LABEL_POLICY, "bogus")]), (true, "-expeller".into()), "unknown policy = default");
    let be = CoreSched::pod_group(&pod("u2", &[(QOS_CLASS_KEY, "BE"), (LABEL_GROUP_ID, "g")], "besteffort"), &r);
    assert_eq!(be, (true, "g".into()), "BE is no expeller");
    let lsr = CoreSched::pod_group(&pod("u3", &[(QOS_CLASS_KEY, "LSR")], "guaranteed"), &r);
    assert_eq!(lsr, (false, "-expeller".into()), "LSR's cookies are off");
    let none = CoreSched::pod_group(&pod("u4", &[], "besteffort"), &r);
    assert_eq!(none, (true, String::new()), "no class: BestEffort → BE");
    assert!(!CoreSched::pod_group(&pod("u1", &[(QOS_CLASS_KEY, "LS")], "burstable"), &Rules::default()).0);
}

#[test]
fn cookies_per_group_for_containers_and_sandboxes() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let h = host(t.path(), &fake);
    let a = state(
        t.path(),
        pod("a", &[(QOS_CLASS_KEY, "LS"), (LABEL_GROUP_ID, "g")], "burstable"),
        &[9],
        &[("c1", &[10, 11])],
    );
    let b = state(
        t.path(),
        pod("b", &[(QOS_CLASS_KEY, "LS"), (LABEL_GROUP_ID, "g")], "burstable"),
        &[19],
        &[("c2", &[20])],
    );
    let c = state(
        t.path(),
        pod("c", &[(QOS_CLASS_KEY, "BE"), (LABEL_GROUP_ID, "g")], "besteffort"),
        &[29],
        &[("c3", &[30])],
    );
    let plugin = CoreSched::default();
    plugin.node(&NodePods::given(&[a.clone(), b.clone(), c.clone()]), &on(), &h).unwrap();
    let ls = fake.cookie(10);
    assert_ne!(ls, 0);
    for pid in [9, 11, 19, 20] {
        assert_eq!(fake.cookie(pid), ls, "pid {pid}: same group g-expeller, sandbox included");
    }
    let be = fake.cookie(30);
    assert!(be != 0 && be != ls, "BE's group g is another cookie");
    assert_eq!(fake.cookie(29), be);
    assert_eq!(plugin.cache().groups.keys().cloned().collect::<Vec<_>>(), ["g", "g-expeller"]);

    // A second pass changes nothing.
    fake.take_calls();
    plugin.node(&NodePods::given(&[a.clone(), b.clone(), c.clone()]), &on(), &h).unwrap();
    assert_eq!(fake.take_calls(), Vec::<String>::new());

    // A new process in a container gets the group's cookie from a sibling.
    let a2 = state(t.path(), a.pod.clone(), &[9], &[("c1", &[10, 11, 12])]);
    plugin.node(&NodePods::given(&[a2.clone(), b.clone(), c.clone()]), &on(), &h).unwrap();
    assert_eq!(fake.cookie(12), ls);

    // Pod b moves to group h: a cookie of its own.
    let mut b_pod = b.pod.clone();
    b_pod.labels.insert(LABEL_GROUP_ID.into(), "h".into());
    let b2 = state(t.path(), b_pod.clone(), &[19], &[("c2", &[20])]);
    plugin.node(&NodePods::given(&[a2.clone(), b2.clone(), c.clone()]), &on(), &h).unwrap();
    let h_cookie = fake.cookie(20);
    assert!(h_cookie != 0 && h_cookie != ls && h_cookie != be);
    assert_eq!(fake.cookie(19), h_cookie);
    assert_eq!(fake.cookie(10), ls, "group g-expeller keeps its cookie");
    assert!(!plugin.cache().groups["g-expeller"].pids.contains(&20));

    // Pod b turns core sched off: cookie 0 again.
    b_pod.labels.insert(LABEL_POLICY.into(), "none".into());
    let b3 = state(t.path(), b_pod, &[19], &[("c2", &[20])]);
    plugin.node(&NodePods::given(&[a2.clone(), b3.clone(), c.clone()]), &on(), &h).unwrap();
    assert_eq!((fake.cookie(19), fake.cookie(20)), (0, 0));
    assert!(!plugin.cache().groups.contains_key("h-expeller"));

    // Pod c is gone: forgotten; its group dropped.
    plugin.node(&NodePods::given(&[a2.clone(), b3.clone()]), &on(), &h).unwrap();
    assert!(!plugin.cache().groups.contains_key("g"));
    assert!(!plugin.cache().containers.keys().any(|k| k.starts_with("c/")));

    // The node turns core sched off: every container given a cookie gets 0 back.
    plugin.node(&NodePods::given(&[a2, b3]), &Rules::default(), &h).unwrap();
    for pid in [9, 10, 11, 12] {
        assert_eq!(fake.cookie(pid), 0, "pid {pid}");
    }
    assert!(plugin.cache().groups.is_empty());
}

#[test]
fn containers_never_given_a_cookie_are_left_alone() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let h = host(t.path(), &fake);
    let p =
        state(t.path(), pod("d", &[(QOS_CLASS_KEY, "LS"), (LABEL_POLICY, "none")], "burstable"), &[], &[("c4", &[41])]);
    let q = state(t.path(), pod("e", &[(QOS_CLASS_KEY, "LSR")], "guaranteed"), &[], &[("c5", &[40])]);
    let plugin = CoreSched::default();
    plugin.node(&NodePods::given(&[p.clone(), q.clone()]), &on(), &h).unwrap();
    // Another tool gives a cookie after start (cookies found at the first pass count as
    // runtime-hooks' own, as in koordlet's loadAllCookies).
    fake.set(40, 0x77);
    plugin.node(&NodePods::given(&[p, q]), &on(), &h).unwrap();
    assert_eq!(fake.cookie(40), 0x77);
    assert!(!fake.take_calls().iter().any(|c| c.starts_with("clear") || c.contains("41")));
}

#[test]
fn a_restart_keeps_the_cookies_it_finds() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let h = host(t.path(), &fake);
    let a = state(t.path(), pod("a", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c1", &[10])]);
    CoreSched::default().node(&NodePods::given(std::slice::from_ref(&a)), &on(), &h).unwrap();
    let cookie = fake.cookie(10);
    let b = state(t.path(), pod("b", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c2", &[20])]);
    fake.take_calls();
    let restarted = CoreSched::default();
    restarted.node(&NodePods::given(&[a, b]), &on(), &h).unwrap();
    assert_eq!(fake.cookie(20), cookie, "the new pod joins the cookie found on pod a");
    assert_eq!(fake.take_calls(), ["assign 10 -> [20]"]);
}

#[test]
fn dead_siblings_and_processes() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let h = host(t.path(), &fake);
    let plugin = CoreSched::default();
    let a = state(t.path(), pod("a", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c1", &[10])]);
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &on(), &h).unwrap();
    // Every holder of the group's cookie exits; a new pod of the group gets a fresh cookie.
    fake.kill(10);
    let b = state(t.path(), pod("b", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c2", &[20, 21])]);
    plugin.node(&NodePods::given(&[a, b]), &on(), &h).unwrap();
    let c = fake.cookie(20);
    assert!(c != 0 && fake.cookie(21) == c);
    assert_eq!(plugin.cache().groups[""].pids.iter().copied().collect::<Vec<_>>(), [20, 21]);
}

#[test]
fn no_core_sched_on_this_kernel_means_no_work_and_no_failure() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let mut h = host(t.path(), &fake);
    h.core_sched = None;
    let a = state(t.path(), pod("a", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c1", &[10])]);
    CoreSched::default().node(&NodePods::given(&[a]), &on(), &h).unwrap();
    assert_eq!(fake.cookie(10), 0);
    assert!(fake.take_calls().is_empty());
}

#[test]
fn cpu_idle_of_kube_qos_dirs() {
    let r = on();
    assert_eq!(CoreSched::default().kube_qos(KubeQos::BestEffort, &r), [CgroupValue::CpuIdle(1)]);
    assert_eq!(CoreSched::default().kube_qos(KubeQos::Burstable, &r), [CgroupValue::CpuIdle(0)]);
    assert_eq!(CoreSched::default().kube_qos(KubeQos::Guaranteed, &r), [CgroupValue::CpuIdle(0)]);
    assert_eq!(CoreSched::default().kube_qos(KubeQos::BestEffort, &Rules::default()), [CgroupValue::CpuIdle(0)]);
    // Written to cpu.idle on v2; a kernel without it is skipped.
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("kubepods/besteffort")).unwrap();
    std::fs::write(t.path().join("kubepods/besteffort/cpu.idle"), "0\n").unwrap();
    let fs = crate::cgroup::CgroupFs::new(t.path(), crate::cgroup::CgroupVersion::V2);
    assert!(matches!(
        fs.apply("/kubepods/besteffort", &CgroupValue::CpuIdle(1)).unwrap(),
        crate::cgroup::Written::Corrected(_)
    ));
    assert_eq!(std::fs::read_to_string(t.path().join("kubepods/besteffort/cpu.idle")).unwrap(), "1");
    std::fs::create_dir_all(t.path().join("kubepods/burstable")).unwrap();
    assert_eq!(fs.apply("/kubepods/burstable", &CgroupValue::CpuIdle(1)).unwrap(), crate::cgroup::Written::Unsupported);
}

#[test]
fn a_kernel_that_cannot_be_readied_gets_no_new_cookies_but_clears_old_ones() {
    let t = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeCoreSched::new());
    let h = host(t.path(), &fake);
    let plugin = CoreSched::default();
    let a = state(t.path(), pod("a", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c1", &[10])]);
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &on(), &h).unwrap();
    assert_ne!(fake.cookie(10), 0);
    fake.fail_prepare();
    let mut off = a.pod.clone();
    off.labels.insert(LABEL_POLICY.into(), "none".into());
    let a_off = state(t.path(), off, &[], &[("c1", &[10])]);
    let b = state(t.path(), pod("b", &[(QOS_CLASS_KEY, "BE")], "besteffort"), &[], &[("c2", &[20])]);
    let e = plugin.node(&NodePods::given(&[a_off, b]), &on(), &h).unwrap_err();
    assert!(e.to_string().contains("readying the kernel"), "{e}");
    assert_eq!(fake.cookie(10), 0, "leaving core sched still works");
    assert_eq!(fake.cookie(20), 0, "no new cookie");
}
