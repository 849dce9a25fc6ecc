//! Unit tests of [`super`] (`status_entry.rs`), kept apart so the module reads at a glance.

use super::*;
use k8s_cri::v1 as cri;
use proptest::prelude::*;

/// Verbose infos captured from containerd (trimmed: mounts, capabilities, masked paths).
/// `running` was created with shares 512 / quota 50000 / period 100000 / 64 MiB / cpuset 0 /
/// oom 100 / envs KEEP=me EQ=a=b, then updated to shares 256 / 96 MiB.
struct Fixtures {
    version: &'static str,
    sandbox: &'static str,
    /// The same sandbox after StopPodSandbox.
    stopped: &'static str,
    running: &'static str,
    created: &'static str,
    clamped: &'static str,
}

const FIXTURES: [Fixtures; 2] = [
    Fixtures {
        version: "1.6",
        sandbox: include_str!("../../tests/fixtures/containerd-1.6/sandbox-ready.json"),
        stopped: include_str!("../../tests/fixtures/containerd-1.6/sandbox-notready.json"),
        running: include_str!("../../tests/fixtures/containerd-1.6/container-running-updated.json"),
        created: include_str!("../../tests/fixtures/containerd-1.6/container-created.json"),
        clamped: include_str!("../../tests/fixtures/containerd-1.6/container-clamped.json"),
    },
    Fixtures {
        version: "1.7",
        sandbox: include_str!("../../tests/fixtures/containerd-1.7/sandbox-ready.json"),
        stopped: include_str!("../../tests/fixtures/containerd-1.7/sandbox-notready.json"),
        running: include_str!("../../tests/fixtures/containerd-1.7/container-running-updated.json"),
        created: include_str!("../../tests/fixtures/containerd-1.7/container-created.json"),
        clamped: include_str!("../../tests/fixtures/containerd-1.7/container-clamped.json"),
    },
];

fn map<M: FromIterator<(String, String)>>(kv: &[(&str, &str)]) -> M {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A verbose `info` map: containerd's one key.
fn info(json: &str) -> hooked_fields::Text {
    text(&[("info", json)])
}

/// A map of the status views (values as the wire's bytes).
fn text(kv: &[(&str, &str)]) -> hooked_fields::Text {
    kv.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect()
}

fn json_field(json: &str, keys: &[&str]) -> String {
    let v: Value = serde_json::from_str(json).unwrap();
    path(v.as_object().unwrap(), keys).and_then(Value::as_str).unwrap().to_owned()
}

/// PodSandboxStatus as containerd answered for the fixture's sandbox.
fn sandbox_answer(json: &str) -> hooked_fields::PodSandboxStatusResponse {
    let v: Value = serde_json::from_str(json).unwrap();
    let meta = path(v.as_object().unwrap(), &["config", "metadata"]).unwrap().as_object().unwrap();
    hooked_fields::PodSandboxStatusResponse {
        status: Some(hooked_fields::PodSandboxStatus {
            id: json_field(json, &["snapshotKey"]),
            metadata: Some(cri::PodSandboxMetadata {
                name: string(meta, "name").unwrap(),
                uid: string(meta, "uid").unwrap(),
                namespace: string(meta, "namespace").unwrap(),
                attempt: 0,
            }),
            labels: text(&[("app", "db")]),
            annotations: text(&[("team", "storage")]),
            ..Default::default()
        }),
        info: info(json),
    }
}

fn container_answer(json: &str, resources: cri::LinuxContainerResources) -> hooked_fields::ContainerStatusResponse {
    hooked_fields::ContainerStatusResponse {
        status: Some(hooked_fields::ContainerStatus {
            id: json_field(json, &["snapshotKey"]),
            metadata: Some(cri::ContainerMetadata { name: "main".into(), attempt: 0 }),
            annotations: text(&[("cann", "v")]),
            resources: Some(cri::ContainerResources { linux: Some(resources), windows: None }),
            ..Default::default()
        }),
        info: info(json),
    }
}

/// `ContainerStatus.resources.linux` containerd reported for the `running` fixture.
fn running_status_resources() -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 256,
        memory_limit_in_bytes: 96 << 20,
        oom_score_adj: 100,
        cpuset_cpus: "0".into(),
        cpuset_mems: "0".into(),
        memory_swap_limit_in_bytes: 96 << 20,
        ..Default::default()
    }
}

fn pod_of(f: &Fixtures) -> hook::PodSandboxHookRequest {
    pod_entry(sandbox_answer(f.sandbox)).unwrap().0
}

#[test]
fn pod_from_containerd_sandbox() {
    for f in &FIXTURES {
        let (pod, notes) = pod_entry(sandbox_answer(f.sandbox)).unwrap();
        assert!(notes.is_empty(), "{}: {notes:?}", f.version);
        let parent = json_field(f.sandbox, &["config", "linux", "cgroup_parent"]);
        assert!(parent.starts_with("/rp-test-rp-rec-ctrd") && parent.contains("/poduid-"), "{}: {parent}", f.version);
        assert_eq!(pod.cgroup_parent, parent, "{}", f.version);
        // The applied cgroup path agrees: <parent>/<sandbox id>.
        let spec_path = json_field(f.sandbox, &["runtimeSpec", "linux", "cgroupsPath"]);
        let id = json_field(f.sandbox, &["snapshotKey"]);
        assert_eq!(cgroup_parent_of(&spec_path, &id).as_deref(), Some(parent.as_str()), "{}", f.version);
        assert_eq!(pod.labels, map(&[("app", "db")]));
        assert_eq!(pod.annotations, map(&[("team", "storage")]));
        let meta = pod.pod_meta.unwrap();
        assert_eq!(meta.namespace, "default");
        assert!(meta.name.starts_with("probe-") && meta.uid.starts_with("uid-"));
        assert_eq!((pod.overhead, pod.resources), (None, None), "none in the config");
        assert_eq!(pod.runtime_handler, "");
        // A stopped sandbox (pause process gone) still has its config.
        assert_eq!(pod_entry(sandbox_answer(f.stopped)).unwrap().0.cgroup_parent, parent, "{}", f.version);
    }
}

#[test]
fn container_from_containerd_running_and_updated() {
    for f in &FIXTURES {
        let pod = pod_of(f);
        let answer = container_answer(f.running, running_status_resources());
        let (c, notes) = container_entry(answer, "cid", &pod).unwrap();
        assert!(notes.is_empty(), "{}: {notes:?}", f.version);
        assert_eq!(
            c.container_meta,
            Some(hook::ContainerMetadata { name: "main".into(), attempt: 0, id: "cid".into() })
        );
        assert_eq!(c.container_annotations, map(&[("cann", "v")]));
        assert!(c.container_envs.is_empty(), "envs are not kept (the config has KEEP, EQ): {:?}", c.container_envs);
        let mut want = convert::to_hook(&running_status_resources());
        want.memory_swap_limit_in_bytes = 0; // containerd's default swap = limit, normalised
        assert_eq!(c.container_resources, Some(want), "{}", f.version);
        assert_eq!(c.pod_meta, pod.pod_meta);
        assert_eq!(
            (&c.pod_labels, &c.pod_annotations, &c.pod_cgroup_parent),
            (&pod.labels, &pod.annotations, &pod.cgroup_parent)
        );
        assert_eq!(c.pod_resources, pod.resources);
    }
}

#[test]
fn container_moved_by_a_hook_keeps_its_applied_parent() {
    for f in &FIXTURES {
        let pod = pod_of(f);
        let id = json_field(f.running, &["snapshotKey"]);
        let mut v: Value = serde_json::from_str(f.running).unwrap();
        v["runtimeSpec"]["linux"]["cgroupsPath"] = Value::from(format!("/kubepods/moved/{id}"));
        let answer = container_answer(&v.to_string(), running_status_resources());
        let (c, _) = container_entry(answer.clone(), &id, &pod).unwrap();
        assert_eq!(c.pod_cgroup_parent, "/kubepods/moved", "{}", f.version);
        // Same place as the pod (trailing slash aside): the pod entry's spelling.
        let pod_slash = hook::PodSandboxHookRequest { cgroup_parent: format!("{}/", pod.cgroup_parent), ..pod.clone() };
        let (c, _) = container_entry(container_answer(f.running, running_status_resources()), &id, &pod_slash).unwrap();
        assert_eq!(c.pod_cgroup_parent, pod_slash.cgroup_parent);
        // A pod without a parent: containerd's default location is not reported.
        let no_parent = hook::PodSandboxHookRequest { cgroup_parent: String::new(), ..pod.clone() };
        let (c, _) = container_entry(answer, &id, &no_parent).unwrap();
        assert_eq!(c.pod_cgroup_parent, "");
    }
    let systemd = serde_json::json!({"linux": {"cgroupsPath": "kubepods-besteffort-pod1.slice:cri-containerd:abc"}});
    let spec = systemd.as_object();
    assert_eq!(
        container_cgroup_parent(spec, "abc", "kubepods-besteffort-pod1.slice"),
        "kubepods-besteffort-pod1.slice"
    );
    assert_eq!(container_cgroup_parent(spec, "abc", "kubepods-pod2.slice"), "kubepods-besteffort-pod1.slice");
    assert_eq!(container_cgroup_parent(None, "abc", "/p"), "/p");
}

#[test]
fn spec_resources_map_as_containerd_maps_them_to_status() {
    for f in &FIXTURES {
        let v: Value = serde_json::from_str(f.running).unwrap();
        let spec = obj(v.as_object().unwrap(), "runtimeSpec").unwrap();
        assert_eq!(spec_resources(spec), Some(convert::to_hook(&running_status_resources())), "{}", f.version);
        // Without typed resources the spec is the fallback, swap normalised the same way.
        let mut answer = container_answer(f.running, Default::default());
        answer.status.as_mut().unwrap().resources = None;
        let (c, notes) = container_entry(answer, "cid", &pod_of(f)).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        let res = c.container_resources.unwrap();
        assert_eq!((res.cpu_shares, res.memory_limit_in_bytes, res.memory_swap_limit_in_bytes), (256, 96 << 20, 0));
    }
}

#[test]
fn created_container_without_resources() {
    for f in &FIXTURES {
        let answer = container_answer(f.created, Default::default());
        let (c, notes) = container_entry(answer, "cid", &pod_of(f)).unwrap();
        assert!(notes.is_empty());
        assert!(c.container_envs.is_empty(), "{}", f.version);
        assert_eq!(c.container_resources, Some(Default::default()), "all zero, as the store builds it");
    }
}

#[test]
fn explicit_swap_is_kept_and_clamped_oom_is_the_applied_one() {
    for f in &FIXTURES {
        // Asked: 64 MiB, swap 128 MiB, oom −998, a 2MB hugepage limit; containerd applied
        // swap 128 MiB, oom 0 (restrict_oom_score_adj) and no hugepages (no hugetlb controller).
        let applied = cri::LinuxContainerResources {
            cpu_shares: 256,
            memory_limit_in_bytes: 64 << 20,
            memory_swap_limit_in_bytes: 128 << 20,
            ..Default::default()
        };
        let (c, _) = container_entry(container_answer(f.clamped, applied.clone()), "cid", &pod_of(f)).unwrap();
        assert_eq!(c.container_resources, Some(convert::to_hook(&applied)), "{}", f.version);
    }
}

#[test]
fn fallbacks_without_the_config() {
    for f in &FIXTURES {
        let strip = |json: &str| {
            let mut v: Value = serde_json::from_str(json).unwrap();
            v.as_object_mut().unwrap().remove("config");
            v.to_string()
        };
        let sandbox = strip(f.sandbox);
        let mut answer = sandbox_answer(f.sandbox);
        answer.info = info(&sandbox);
        let (pod, notes) = pod_entry(answer).unwrap();
        assert_eq!(pod.cgroup_parent, json_field(f.sandbox, &["config", "linux", "cgroup_parent"]));
        assert_eq!(notes.len(), 1, "{notes:?}");

        let mut answer = container_answer(f.running, running_status_resources());
        answer.info = info(&strip(f.running));
        let (c, notes) = container_entry(answer, "cid", &pod).unwrap();
        assert!(notes.is_empty(), "resources from the status, no envs read: {notes:?}");
        assert!(c.container_envs.is_empty(), "not even the spec's: {:?}", c.container_envs);
        let res = c.container_resources.unwrap();
        assert_eq!(
            res.memory_swap_limit_in_bytes,
            96 << 20,
            "without the config the swap default cannot be told apart"
        );
    }
}

#[test]
fn values_that_are_not_text_are_left_out_and_the_info_is_read_lossily() {
    let mut answer = sandbox_answer(FIXTURES[0].sandbox);
    let status = answer.status.as_mut().unwrap();
    status.annotations.insert("bin".into(), vec![0xff]);
    status.labels.insert("bin".into(), vec![b'a', 0xfe]);
    let mut json = br#"{"config": {"linux": {"cgroup_parent": "/kubepods/pod1"}}, "pid": ""#.to_vec();
    json.extend_from_slice(&[0xff, b'"', b'}']);
    answer.info = [("info".to_string(), json)].into();
    let (pod, _) = pod_entry(answer).unwrap();
    assert_eq!(pod.cgroup_parent, "/kubepods/pod1", "an invalid byte elsewhere in the info");
    assert_eq!(pod.labels, map(&[("app", "db")]));
    assert_eq!(pod.annotations, map(&[("team", "storage")]));

    let mut answer = container_answer(FIXTURES[0].running, running_status_resources());
    answer.status.as_mut().unwrap().annotations.insert("bin".into(), vec![0xff]);
    let (c, _) = container_entry(answer, "cid", &pod_of(&FIXTURES[0])).unwrap();
    assert_eq!(c.container_annotations, map(&[("cann", "v")]));
}

#[test]
fn objects_without_enough_information_are_refused() {
    let f = &FIXTURES[0];
    let mut answer = sandbox_answer(f.sandbox);
    answer.info.clear();
    assert!(pod_entry(answer.clone()).unwrap_err().contains("cgroup parent"));
    answer.info = info("{\"pid\": 1}");
    assert!(pod_entry(answer).unwrap_err().contains("cgroup parent"));
    assert!(pod_entry(hooked_fields::PodSandboxStatusResponse::default()).is_err());

    let mut answer = container_answer(f.running, running_status_resources());
    answer.info.clear();
    assert!(container_entry(answer.clone(), "cid", &pod_of(f)).unwrap_err().contains("cgroup parent"));
    answer.status.as_mut().unwrap().resources = None;
    assert!(container_entry(answer, "cid", &pod_of(f)).unwrap_err().contains("resources"));
    assert!(container_entry(hooked_fields::ContainerStatusResponse::default(), "cid", &pod_of(f)).is_err());
}

#[test]
fn pod_overhead_and_resources_from_either_json_spelling() {
    let json = r#"{"config": {"linux": {"cgroup_parent": "/kubepods/burstable/pod1",
        "overhead": {"cpu_shares": 10, "memory_limit_in_bytes": "1048576", "hugepage_limits": [{"page_size": "2MB", "limit": 4194304}]},
        "resources": {"cpuQuota": -1, "cpusetCpus": "0-3", "unified": {"memory.max": "max", "bad": 5}, "memorySwapLimitInBytes": 18446744073709551615}}}}"#;
    let mut answer = sandbox_answer(FIXTURES[0].sandbox);
    answer.info = info(json);
    let (pod, _) = pod_entry(answer).unwrap();
    assert_eq!(pod.cgroup_parent, "/kubepods/burstable/pod1");
    let o = pod.overhead.unwrap();
    assert_eq!((o.cpu_shares, o.memory_limit_in_bytes), (10, 1 << 20));
    assert_eq!(o.hugepage_limits, vec![hook::HugepageLimit { page_size: "2MB".into(), limit: 4 << 20 }]);
    let r = pod.resources.unwrap();
    assert_eq!((r.cpu_quota, r.cpuset_cpus.as_str(), r.memory_swap_limit_in_bytes), (-1, "0-3", i64::MAX));
    assert_eq!(r.unified, map(&[("memory.max", "max")]), "non-string values dropped");
}

#[test]
fn cgroup_parents_of_cgroups_paths() {
    assert_eq!(cgroup_parent_of("/kubepods/burstable/pod1/abc", "abc").as_deref(), Some("/kubepods/burstable/pod1"));
    assert_eq!(cgroup_parent_of("/abc", "abc").as_deref(), Some(""));
    assert_eq!(
        cgroup_parent_of("kubepods-pod1.slice:cri-containerd:abc", "abc").as_deref(),
        Some("kubepods-pod1.slice")
    );
    assert_eq!(cgroup_parent_of("/kubepods/pod1/crio-abc.scope", "abc").as_deref(), Some("/kubepods/pod1"));
    assert_eq!(cgroup_parent_of("/kubepods/pod1/other", "abc"), None);
    assert_eq!(cgroup_parent_of("abc", "abc"), None);
    assert_eq!(cgroup_parent_of("/x/abc", ""), None);
}

#[test]
fn integers_in_any_json_form() {
    let v = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(int_of(&v("5")), Some(5));
    assert_eq!(int_of(&v("-1")), Some(-1));
    assert_eq!(int_of(&v("18446744073709551615")), Some(i64::MAX));
    assert_eq!(int_of(&v("\"42\"")), Some(42));
    assert_eq!(int_of(&v("1e3")), Some(1000));
    assert_eq!(int_of(&v("1.5")), None);
    assert_eq!(int_of(&v("\"x\"")), None);
    assert_eq!(int_of(&v("null")), None);
}

#[test]
fn verbose_info_takes_the_info_key_or_any_object() {
    assert!(verbose_info(&text(&[("info", "{\"a\": 1}")])).is_some());
    assert!(verbose_info(&text(&[("info", "[1]"), ("other", "{\"a\": 1}")])).is_some());
    assert!(verbose_info(&text(&[("info", "not json")])).is_none());
    assert!(verbose_info(&hooked_fields::Text::new()).is_none());
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)),
        "[a-z0-9=/:._-]{0,12}".prop_map(Value::from),
    ];
    let keys = prop_oneof![
        Just("config".to_string()),
        Just("runtimeSpec".to_string()),
        Just("linux".to_string()),
        Just("resources".to_string()),
        Just("overhead".to_string()),
        Just("cgroup_parent".to_string()),
        Just("cgroupsPath".to_string()),
        Just("process".to_string()),
        Just("env".to_string()),
        Just("envs".to_string()),
        Just("cpu".to_string()),
        Just("memory".to_string()),
        Just("hugepageLimits".to_string()),
        Just("hugepage_limits".to_string()),
        Just("unified".to_string()),
        Just("key".to_string()),
        Just("value".to_string()),
        Just("limit".to_string()),
        "[a-z_]{1,8}",
    ];
    leaf.prop_recursive(6, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((keys.clone(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn odd_json_never_panics(v in json_value(), raw in ".{0,40}") {
        let pod_answer = |json: String| hooked_fields::PodSandboxStatusResponse {
            info: info(&json),
            ..sandbox_answer(FIXTURES[0].sandbox)
        };
        let pod = pod_entry(pod_answer(v.to_string())).map(|p| p.0).unwrap_or_default();
        let _ = pod_entry(pod_answer(raw.clone()));
        let mut c = container_answer(FIXTURES[0].running, Default::default());
        c.info = info(&v.to_string());
        let _ = container_entry(c.clone(), "cid", &pod);
        c.status.as_mut().unwrap().resources = None;
        let _ = container_entry(c.clone(), "cid", &pod);
        c.info = info(&raw);
        let _ = container_entry(c, "cid", &pod);
    }
}
