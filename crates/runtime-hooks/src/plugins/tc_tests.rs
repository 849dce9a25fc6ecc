use std::sync::Arc;

use super::*;
use crate::context::QOS_CLASS_KEY;
use crate::host::tc::{FakeTc, Netlink};

fn pod(uid: &str, class: &str, qos: Option<&str>) -> PodState {
    let mut p = PodContext { uid: uid.into(), name: uid.into(), namespace: "default".into(), ..Default::default() };
    p.labels.insert(QOS_CLASS_KEY.into(), class.into());
    if let Some(q) = qos {
        p.annotations.insert(NETWORK_QOS.into(), q.into());
    }
    PodState { pod: p, cgroup_dir: Some(format!("/kubepods/pod{uid}")), containers: Vec::new() }
}

/// 1000 Mbit/s; LS egress 100M..800M (quantities), BE egress 10%..50%.
fn rules(policy: &str) -> Rules {
    let spec = serde_json::json!({
        "systemStrategy": {"totalNetworkBandwidth": "1000M"},
        "resourceQOSStrategy": {
            "policies": {"netQOSPolicy": policy},
            "lsClass": {"networkQOS": {"enable": true, "egressRequest": "100M", "egressLimit": "800M"}},
            "beClass": {"networkQOS": {"enable": true, "egressRequest": 10, "egressLimit": 50}},
        }
    });
    Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&spec).unwrap()), None, None)
}

fn host(tc: Arc<dyn TrafficControl>) -> Host {
    Host { tc: Some(tc), ..Default::default() }
}

fn classid(p: &TcNetworkQos, s: &PodState, r: &Rules) -> Vec<CgroupValue> {
    p.pod(Stage::PreRunPodSandbox, &s.pod, r).unwrap().pod_cgroup
}

#[test]
fn classid_by_qos_class_under_the_tc_policy_only() {
    let p = TcNetworkQos::default();
    let r = rules("tc");
    for (class, want) in
        [("SYSTEM", vec![CgroupValue::NetClsClassId(0x10002)]), ("LSR", vec![CgroupValue::NetClsClassId(0x10003)])]
    {
        assert_eq!(classid(&p, &pod("a", class, None), &r), want, "{class}");
    }
    assert_eq!(classid(&p, &pod("a", "BE", None), &r), vec![CgroupValue::NetClsClassId(0x10004)]);
    assert_eq!(classid(&p, &pod("a", "", None), &r), vec![], "no class, no classid");
    assert_eq!(classid(&p, &pod("a", "BE", None), &rules("terway-qos")), vec![]);
    assert_eq!(
        classid(&p, &pod("a", "BE", None), &Rules::default()),
        vec![CgroupValue::NetClsClassId(0x10004)],
        "tc is the default"
    );
}

#[test]
fn a_bad_annotation_fails_the_pod_naming_it() {
    let p = TcNetworkQos::default();
    for (bad, needle) in [
        ("{", "not JSON"),
        (r#"{"egressLimit": "fast"}"#, "egressLimit \"fast\""),
        (r#"{"egressLimit": 5}"#, "quantity string"),
    ] {
        let e = p.pod(Stage::PreRunPodSandbox, &pod("a", "BE", Some(bad)).pod, &rules("tc")).unwrap_err();
        assert!(format!("{e:#}").contains(needle) && format!("{e:#}").contains(NETWORK_QOS), "{bad}: {e:#}");
    }
    assert_eq!(pod_bandwidth(&pod("a", "BE", Some(r#"{"ingressLimit": "80M"}"#)).pod).unwrap(), (10_000_000, 0));
}

#[test]
fn node_classes_from_the_rule() {
    let classes = TcNetworkQos::node_classes(&rules("tc").net_qos);
    let rates: Vec<(u32, u64, u64, u32)> = classes.iter().map(|c| (c.handle, c.rate, c.ceil, c.prio)).collect();
    assert_eq!(
        rates,
        vec![
            (ROOT_CLASS, 125_000_000, 125_000_000, 0),
            (SYSTEM_CLASS, 100_000_000, 125_000_000, 1), // 1000M − 100M − 10% → 800M bits
            (LS_CLASS, 12_500_000, 100_000_000, 2),
            (BE_CLASS, 12_500_000, 62_500_000, 3),
        ]
    );
}

#[test]
fn node_work_sets_qdisc_classes_filters_and_per_pod_classes() {
    let fake = Arc::new(FakeTc::default());
    let h = host(fake.clone());
    let p = TcNetworkQos::default();
    let r = rules("tc");
    let limited = pod("uid-1", "LS", Some(r#"{"ingressLimit": "10M", "egressLimit": "16M"}"#));
    let plain = pod("uid-2", "BE", None);
    assert_eq!(classid(&p, &limited, &r), vec![], "no handle before node-level work");
    p.node(&NodePods::given(&[limited.clone(), plain.clone()]), &r, &h).unwrap();
    assert_eq!(fake.root_qdisc().unwrap().unwrap().handle, QDISC);
    let classes = fake.classes().unwrap();
    assert_eq!(classes.len(), 5, "{classes:?}");
    let [CgroupValue::NetClsClassId(handle)] = classid(&p, &limited, &r)[..] else { panic!("no per-pod classid") };
    assert!(handle >> 16 == 1 && handle & 0xffff >= 5, "{handle:#x}");
    let own = classes.iter().find(|c| c.handle == handle).unwrap();
    assert_eq!((own.parent, own.rate, own.ceil, own.prio), (ROOT_CLASS, 2_000_000, 2_000_000, 2));
    let filters: Vec<(u16, u32)> = fake.filters(QDISC).unwrap().iter().map(|f| (f.prio, f.handle)).collect();
    assert_eq!(filters, vec![(1, 2), (2, 3), (3, 4)]);

    // Idempotent; the pod going removes its class.
    p.node(&NodePods::given(&[limited.clone(), plain.clone()]), &r, &h).unwrap();
    assert_eq!(fake.classes().unwrap().len(), 5);
    p.node(&NodePods::given(std::slice::from_ref(&plain)), &r, &h).unwrap();
    assert!(fake.classes().unwrap().iter().all(|c| c.handle != handle));
    assert_eq!(classid(&p, &limited, &r), vec![]);

    // Policy switched away: the qdisc goes.
    p.node(&NodePods::given(&[plain]), &rules("terway-qos"), &h).unwrap();
    assert_eq!(fake.root_qdisc().unwrap(), None);
}

#[test]
fn failures_are_reported_without_stopping_the_rest() {
    let fake = Arc::new(FakeTc { fail_filters: true, ..Default::default() });
    let p = TcNetworkQos::default();
    let mut r = rules("tc");
    r.net_qos.be = None; // BE's networkQOS off: rate 0
    let e = p.node(&NodePods::given(&[pod("x", "BE", Some("{"))]), &r, &host(fake.clone())).unwrap_err().to_string();
    assert!(e.contains("class 1:4") && e.contains("cgroup filter prio 1") && e.contains("pod default/x"), "{e}");
    assert_eq!(fake.classes().unwrap().len(), 3, "the others are set");
}

#[test]
fn without_the_facility_nothing_is_done() {
    let p = TcNetworkQos::default();
    p.node(&NodePods::given(&[pod("a", "LS", Some(r#"{"egressLimit": "1M"}"#))]), &rules("tc"), &Host::default())
        .unwrap();
    assert!(p.handles().is_empty());
}

#[test]
fn handles_are_stable_and_probe_past_collisions() {
    let a = TcNetworkQos::pick_handle("uid-1", &BTreeSet::new()).unwrap();
    assert_eq!(TcNetworkQos::pick_handle("uid-1", &BTreeSet::new()), Some(a));
    let b = TcNetworkQos::pick_handle("uid-1", &[a].into()).unwrap();
    assert_ne!(a, b);
    assert!((0x10005..=0x1ffff).contains(&b));
}

/// The real netlink path, on `lo` of a private network namespace (needs root; skipped with a
/// message otherwise): qdisc, classes and per-pod class created, read back through netlink,
/// changed and deleted.
#[test]
fn real_netlink_in_a_private_network_namespace() {
    let result = std::thread::spawn(|| -> Result<(), String> {
        // SAFETY: unshare affects only this thread's network namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!("skipped: unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error()));
        }
        let tc: Arc<dyn TrafficControl> = Arc::new(Netlink::open("lo").map_err(|e| e.to_string()).unwrap());
        let h = host(tc.clone());
        let p = TcNetworkQos::default();
        let r = rules("tc");
        let limited = pod("uid-1", "BE", Some(r#"{"egressLimit": "16M"}"#));
        // cls_cgroup may be missing from this kernel: filters are then the only failure.
        if let Err(e) = p.node(&NodePods::given(std::slice::from_ref(&limited)), &r, &h) {
            assert!(!e.to_string().contains("class "), "{e}");
        }
        let q = tc.root_qdisc().unwrap().unwrap();
        assert_eq!((q.kind.as_str(), q.handle), ("htb", QDISC));
        let mut got = tc.classes().unwrap();
        got.sort();
        let mut want = TcNetworkQos::node_classes(&r.net_qos);
        let [CgroupValue::NetClsClassId(handle)] = classid(&p, &limited, &r)[..] else { panic!("no classid") };
        want.push(HtbClass { handle, parent: ROOT_CLASS, rate: 2_000_000, ceil: 2_000_000, prio: 3 });
        want.sort();
        assert_eq!(got, want, "read back through netlink");

        // A rate above 2³² − 1 bytes/s (64-bit attributes), then the pod going.
        let mut fast = r.clone();
        fast.net_qos.total_bandwidth = 100_000_000_000;
        let _ = p.node(&NodePods::given(&[]), &fast, &h);
        let got = tc.classes().unwrap();
        let root = got.iter().find(|c| c.handle == ROOT_CLASS).unwrap();
        assert_eq!((root.rate, root.ceil), (12_500_000_000, 12_500_000_000));
        assert!(got.iter().all(|c| c.handle != handle), "the pod's class is gone: {got:?}");

        p.node(&NodePods::given(&[]), &rules("terway-qos"), &h).unwrap();
        let after = tc.root_qdisc().unwrap();
        assert!(after.as_ref().is_none_or(|q| q.kind != "htb"), "htb deleted: {after:?}");
        Ok(())
    })
    .join()
    .unwrap();
    if let Err(why) = result {
        eprintln!("{why}");
    }
}
