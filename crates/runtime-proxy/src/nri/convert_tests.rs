use super::*;

fn entry(k: &str, v: &[u8]) -> nri::BytesEntry {
    nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.to_vec() }
}

fn pod() -> nri::PodSandbox {
    nri::PodSandbox {
        id: "sb".into(),
        name: "p".into(),
        namespace: "ns".into(),
        uid: "u".into(),
        labels: vec![entry("app", b"web")],
        annotations: vec![entry("note", b"\xff\xfe"), entry("ok", b"yes")],
        runtime_handler: "runc".into(),
        linux: Some(nri::LinuxPodSandbox { cgroup_parent: "/kubepods/podu".into(), ..Default::default() }),
        ..Default::default()
    }
}

fn cpu(shares: u64) -> nri::LinuxResources {
    nri::LinuxResources {
        cpu: Some(nri::LinuxCpu { shares: Some(nri::OptionalUInt64 { value: shares }), ..Default::default() }),
        ..Default::default()
    }
}

#[test]
fn requests_from_nri() {
    let p = pod_request(&pod());
    assert_eq!(
        p.pod_meta.as_ref().map(|m| (m.name.as_str(), m.namespace.as_str(), m.uid.as_str())),
        Some(("p", "ns", "u"))
    );
    assert_eq!((p.cgroup_parent.as_str(), p.runtime_handler.as_str()), ("/kubepods/podu", "runc"));
    assert_eq!(p.annotations, [("ok".to_string(), "yes".to_string())].into(), "bytes that are not UTF-8 are left out");
    let c = nri::Container {
        id: "c1".into(),
        name: "main".into(),
        env: vec![b"PATH=/bin".to_vec(), b"A=b=c".to_vec(), b"T=\xff".to_vec()],
        annotations: vec![entry("c", b"1")],
        linux: Some(nri::LinuxContainer { resources: Some(cpu(2)), ..Default::default() }),
        ..Default::default()
    };
    let r = container_request(&pod(), &c, None);
    assert_eq!(r.container_meta.as_ref().map(|m| (m.name.as_str(), m.id.as_str())), Some(("main", "c1")));
    assert_eq!(
        r.container_envs,
        [("PATH".to_string(), "/bin".to_string()), ("A".to_string(), "b=c".to_string())].into()
    );
    assert_eq!((r.pod_labels["app"].as_str(), r.pod_cgroup_parent.as_str()), ("web", "/kubepods/podu"));
    assert_eq!(r.container_resources.unwrap().cpu_shares, 2);
    let updated = container_request(&pod(), &c, Some(&cpu(7)));
    assert_eq!(updated.container_resources.unwrap().cpu_shares, 7, "an update's resources win");
    let empty = container_request(&nri::PodSandbox::default(), &nri::Container::default(), None);
    assert_eq!(empty.container_resources, Some(Default::default()), "absent parts are empty, not a panic");
}

#[test]
fn changes_to_adjustment_and_update() {
    let before = container_request(
        &pod(),
        &nri::Container {
            id: "c1".into(),
            linux: Some(nri::LinuxContainer { resources: Some(cpu(2)), ..Default::default() }),
            ..Default::default()
        },
        None,
    );
    let mut after = before.clone();
    {
        let r = after.container_resources.as_mut().unwrap();
        r.cpu_shares = 512;
        r.memory_limit_in_bytes = 1 << 27;
        r.cpuset_cpus = "0-1".into();
    }
    after.container_envs.insert("K".into(), "v".into());
    after.container_annotations.insert("a".into(), "1".into());
    after.pod_cgroup_parent = "/elsewhere".into();
    let changes = container_changes(&before, &after, false);
    assert_eq!(changes.unexpressed, ["pod_cgroup_parent"]);
    let adj = changes.adjustment().unwrap();
    assert_eq!(adj.env, [nri::KeyValue { key: "K".into(), value: "v".into() }]);
    assert_eq!(adj.annotations["a"], "1");
    let r = adj.linux.unwrap().resources.unwrap();
    let cpu = r.cpu.unwrap();
    assert_eq!((cpu.shares.unwrap().value, cpu.quota, cpu.cpus.as_str()), (512, None, "0-1"), "only what changed");
    let mem = r.memory.unwrap();
    assert_eq!((mem.limit.unwrap().value, mem.swap.unwrap().value), (1 << 27, 1 << 27), "swap follows the limit");
    let u = changes.update("c1").unwrap();
    assert_eq!(u.linux.unwrap().resources.unwrap().cpu.unwrap().shares.unwrap().value, 512);

    // A created container: env and annotations cannot change any more.
    let changes = container_changes(&before, &after, true);
    assert_eq!(changes.unexpressed, ["pod_cgroup_parent", "container_envs", "container_annotations"]);
    assert!(changes.env.is_empty() && changes.annotations.is_empty());

    // A cpuset cleared to "" cannot be sent (NRI: no change).
    let mut cleared = after.clone();
    cleared.container_resources.as_mut().unwrap().cpuset_cpus.clear();
    let changes = container_changes(&after, &cleared, false);
    assert_eq!(
        (changes.unexpressed.as_slice(), changes.resources),
        (&["container_resources.cpuset_cpus (cleared)"][..], None)
    );

    // Nothing changed: no adjustment, no update.
    let none = container_changes(&before, &before, false);
    assert_eq!((none.adjustment(), none.update("c1")), (None, None));
}

#[test]
fn pod_level_changes_are_named() {
    let before = pod_request(&pod());
    let mut after = before.clone();
    assert!(pod_changes(&before, &after).is_empty());
    after.cgroup_parent = "/x".into();
    after.labels.insert("k".into(), "v".into());
    after.resources = Some(hook::LinuxContainerResources { cpu_shares: 2, ..Default::default() });
    assert_eq!(pod_changes(&before, &after), ["labels", "cgroup_parent"], "resources: applied nowhere, as in CRI mode");
}
