//! Unit tests of [`super`] (`intercept.rs`), kept apart so the module reads at a glance.

use super::*;

#[test]
fn envs_keep_order_and_add_sorted() {
    let envs = vec![hooked_fields::KeyValue::text("B", "1"), hooked_fields::KeyValue::text("A", "2")];
    let hooked: BTreeMap<String, String> =
        [("A", "9"), ("B", "1"), ("Z", "z"), ("C", "c")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let out: Vec<(String, String)> = merged_envs(&envs, &hooked)
        .into_iter()
        .map(|kv| (kv.key, String::from_utf8(kv.value.to_vec()).unwrap()))
        .collect();
    assert_eq!(out, [("B", "1"), ("A", "9"), ("C", "c"), ("Z", "z")].map(|(k, v)| (k.to_string(), v.to_string())));
}

#[test]
fn untouched_request_has_no_edits() {
    let store = Store::new();
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: "sb".into(),
        config: Some(cri::ContainerConfig {
            envs: vec![cri::KeyValue { key: "A".into(), value: "1".into() }],
            annotations: [("x".to_string(), "y".to_string())].into(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources { cpu_shares: 2, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig { cgroup_parent: "/kubepods/pod1".into(), ..Default::default() }),
            ..Default::default()
        }),
    };
    let hook = container_hook_request(&(&req).into(), &store).unwrap().expect("pod from sandbox_config");
    assert_eq!(hook.pod_cgroup_parent, "/kubepods/pod1");
    let call = Call::CreateContainer { req: (&req).into(), hook: Some(hook.clone()) };
    let before = call.hook_state();
    assert!(call.edits(&before).is_empty());

    // A hook changes cpu shares and adds an env: only those fields are edited.
    let mut hook = hook;
    hook.container_resources.as_mut().unwrap().cpu_shares = 512;
    hook.container_envs.insert("HOOKED".into(), "1".into());
    let call = Call::CreateContainer { req: (&req).into(), hook: Some(hook) };
    let edited = proto_edit::apply(&req.encode_to_vec(), &call.edits(&before)).unwrap();
    let got = cri::CreateContainerRequest::decode(edited.as_slice()).unwrap();
    let mut want = req;
    let cfg = want.config.as_mut().unwrap();
    cfg.linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_shares = 512;
    cfg.envs.push(cri::KeyValue { key: "HOOKED".into(), value: "1".into() });
    assert_eq!(got, want);
}

/// A value that is not UTF-8 is left out of the hook request, and a hook's answer for other
/// keys never drops or alters it: the edited request carries it byte for byte.
#[test]
fn binary_values_survive_hook_edits() {
    const BIN: &[u8; 8] = b"\xff\xfebin\x00\x80!";
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: "sb".into(),
        config: Some(cri::ContainerConfig {
            envs: vec![
                cri::KeyValue { key: "SECRET".into(), value: "ENVVALUE".into() },
                cri::KeyValue { key: "A".into(), value: "1".into() },
            ],
            annotations: [("bin".to_string(), "ANNOTVAL".to_string())].into(),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            annotations: [("pod-bin".to_string(), "PODVALUE".to_string()), ("pod-text".to_string(), "x".to_string())]
                .into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    let mut bytes = req.encode_to_vec();
    for placeholder in ["ENVVALUE", "ANNOTVAL", "PODVALUE"] {
        let at = bytes.windows(8).position(|w| w == placeholder.as_bytes()).unwrap();
        bytes[at..at + 8].copy_from_slice(BIN);
    }
    let mut call = Call::decode(Method::CreateContainer, Bytes::from(bytes.clone())).expect("decodes");
    let Call::CreateContainer { req: view, hook } = &mut call else { unreachable!() };
    *hook = container_hook_request(view, &Store::new()).unwrap();
    let h = hook.as_mut().unwrap();
    assert_eq!(h.container_envs, BTreeMap::from([("A".to_string(), "1".to_string())]), "the binary env is left out");
    assert!(h.container_annotations.is_empty() && !h.pod_annotations.contains_key("pod-bin"));
    assert_eq!(h.pod_annotations["pod-text"], "x");
    let before = BeforeHooks::Container(h.clone());
    h.container_envs.insert("HOOKED".into(), "1".into());
    h.container_envs.insert("A".into(), "2".into());
    h.container_annotations.insert("hooked".into(), "yes".into());
    h.container_resources.get_or_insert_with(Default::default).cpu_shares = 2;
    let edited = proto_edit::apply(&bytes, &call.edits(&before)).unwrap();
    let got = hooked_fields::CreateContainerRequest::decode(edited.as_slice()).unwrap();
    let config = got.config.unwrap();
    let envs: Vec<(&str, &[u8])> = config.envs.iter().map(|kv| (kv.key.as_str(), &kv.value[..])).collect();
    assert_eq!(envs, [("SECRET", &BIN[..]), ("A", b"2"), ("HOOKED", b"1")]);
    assert_eq!(config.annotations["bin"], BIN, "kept byte for byte");
    assert_eq!(config.annotations["hooked"], b"yes");
    assert_eq!(config.linux.unwrap().resources.unwrap().cpu_shares, 2);
    assert!(edited.windows(BIN.len()).filter(|w| *w == BIN).count() == 3, "the pod's binary annotation too");
}

#[test]
fn create_container_for_a_sandbox_nobody_knows_has_no_hook_request() {
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: "gone".into(),
        config: Some(Default::default()),
        sandbox_config: None,
    };
    assert!(container_hook_request(&(&req).into(), &Store::new()).unwrap().is_none());
    let call = Call::CreateContainer { req: (&req).into(), hook: None };
    assert!(matches!(call.hook_state(), BeforeHooks::Unchanged));
    assert!(call.edits(&BeforeHooks::Unchanged).is_empty());
}

#[tokio::test]
async fn update_without_hook_changes_is_untouched_and_cpuset_clear_applies() {
    let stored = hook::ContainerResourceHookRequest {
        container_annotations: [("stored".to_string(), "1".to_string())].into(),
        container_resources: Some(hook::LinuxContainerResources {
            cpu_shares: 1024,
            cpuset_cpus: "0-1".into(),
            oom_score_adj: 5,
            ..Default::default()
        }),
        ..Default::default()
    };
    let store = Store::new();
    store.put_container("c", ContainerEntry { sandbox_id: "sb".into(), hook: stored });
    let req = cri::UpdateContainerResourcesRequest {
        container_id: "c".into(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 256, ..Default::default() }),
        ..Default::default()
    };
    let mut call = Call::decode(Method::UpdateContainerResources, Bytes::from(req.encode_to_vec())).unwrap();
    call.load(&store, &crate::grpc::backend::Backend::new("/nonexistent/runtime.sock")).await.unwrap();
    let before = call.hook_state();
    assert!(call.edits(&before).is_empty(), "stored cpuset, oom score and annotations are not added");

    // A hook clears the cpuset and sets an annotation: exactly those reach the request.
    if let Call::UpdateContainerResources { entry: Some(e), .. } = &mut call {
        e.hook.container_resources.as_mut().unwrap().cpuset_cpus.clear();
        e.hook.container_annotations.insert("hooked".into(), "yes".into());
    }
    let edited = proto_edit::apply(&req.encode_to_vec(), &call.edits(&before)).unwrap();
    let got = cri::UpdateContainerResourcesRequest::decode(edited.as_slice()).unwrap();
    let mut want = req.clone();
    want.annotations.insert("hooked".into(), "yes".into());
    assert_eq!(got, want, "cpuset was already empty in the request; only the annotation is added");
}

#[test]
fn timeouts_are_rewritten() {
    let mut h = http::HeaderMap::new();
    set_timeout(&mut h, Duration::from_millis(1500));
    assert_eq!(h["grpc-timeout"], "1500m");
    set_timeout(&mut h, Duration::ZERO);
    assert_eq!(h["grpc-timeout"], "1m");
}

/// Every CRI v1alpha2 message the interceptor reads or edits, with every field it reads or
/// edits set, decodes as the v1 message with nothing left over (re-encoding gives the same
/// bytes; an unknown or differently typed field would be dropped or fail), and the proxy's
/// v1 edits land in the v1alpha2 fields. Checked against the protos too: v1alpha2 has no
/// field whose number or type differs from v1; v1 only adds fields
/// (docs/guide/hook-servers.md, "CRI v1 and v1alpha2, field by field").
#[test]
fn v1alpha2_layout() {
    use k8s_cri::v1alpha2 as a2;
    fn same_as_v1<A: Message, V: Message + Default>(what: &str, a: &A) -> V {
        let bytes = a.encode_to_vec();
        let v = V::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(v.encode_to_vec(), bytes, "{what}: v1alpha2 bytes re-encoded as v1");
        v
    }
    let one = |k: &str, v: &str| std::collections::HashMap::from([(k.to_string(), v.to_string())]);
    let resources = a2::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 1 << 27,
        oom_score_adj: -998,
        cpuset_cpus: "0-1".into(),
        cpuset_mems: "0".into(),
        hugepage_limits: vec![a2::HugepageLimit { page_size: "2MB".into(), limit: 1 << 21 }],
        unified: one("memory.high", "1000"),
        memory_swap_limit_in_bytes: 1 << 28,
    };
    let sandbox = a2::PodSandboxConfig {
        metadata: Some(a2::PodSandboxMetadata { name: "p".into(), uid: "u".into(), namespace: "n".into(), attempt: 2 }),
        labels: one("l", "1"),
        annotations: one("a", "2"),
        linux: Some(a2::LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/podu".into(),
            overhead: Some(resources.clone()),
            resources: Some(resources.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let run = a2::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: "runc".into() };
    let v1_run: cri::RunPodSandboxRequest = same_as_v1("RunPodSandboxRequest", &run);
    let hook = pod_hook_request(v1_run.config.as_ref().map(Into::into).as_ref(), &v1_run.runtime_handler);
    assert_eq!(
        (hook.cgroup_parent.as_str(), hook.labels["l"].as_str(), hook.pod_meta.unwrap().attempt),
        ("/kubepods/podu", "1", 2)
    );
    assert_eq!(hook.resources.unwrap().cpu_shares, 512);
    let create = a2::CreateContainerRequest {
        pod_sandbox_id: "sb".into(),
        config: Some(a2::ContainerConfig {
            metadata: Some(a2::ContainerMetadata { name: "c".into(), attempt: 1 }),
            envs: vec![a2::KeyValue { key: "K".into(), value: "V".into() }],
            annotations: one("ca", "3"),
            linux: Some(a2::LinuxContainerConfig { resources: Some(resources.clone()), ..Default::default() }),
            ..Default::default()
        }),
        sandbox_config: Some(sandbox),
    };
    let _: cri::CreateContainerRequest = same_as_v1("CreateContainerRequest", &create);
    let update = a2::UpdateContainerResourcesRequest {
        container_id: "c".into(),
        linux: Some(resources),
        annotations: one("ua", "4"),
        ..Default::default()
    };
    let _: cri::UpdateContainerResourcesRequest = same_as_v1("UpdateContainerResourcesRequest", &update);
    let _: cri::RunPodSandboxResponse =
        same_as_v1("RunPodSandboxResponse", &a2::RunPodSandboxResponse { pod_sandbox_id: "sb".into() });
    let _: cri::CreateContainerResponse =
        same_as_v1("CreateContainerResponse", &a2::CreateContainerResponse { container_id: "c".into() });
    let _: cri::StartContainerRequest =
        same_as_v1("StartContainerRequest", &a2::StartContainerRequest { container_id: "c".into() });
    let _: cri::StopContainerRequest =
        same_as_v1("StopContainerRequest", &a2::StopContainerRequest { container_id: "c".into(), timeout: 3 });
    let _: cri::RemoveContainerRequest =
        same_as_v1("RemoveContainerRequest", &a2::RemoveContainerRequest { container_id: "c".into() });
    let _: cri::StopPodSandboxRequest =
        same_as_v1("StopPodSandboxRequest", &a2::StopPodSandboxRequest { pod_sandbox_id: "sb".into() });
    let _: cri::RemovePodSandboxRequest =
        same_as_v1("RemovePodSandboxRequest", &a2::RemovePodSandboxRequest { pod_sandbox_id: "sb".into() });

    // The v1 edits a hook causes, applied to v1alpha2 bytes, read back as v1alpha2.
    let store = Store::new();
    let v1_create = cri::CreateContainerRequest::decode(create.encode_to_vec().as_slice()).unwrap();
    let before = container_hook_request(&(&v1_create).into(), &store).unwrap().unwrap();
    let mut after = before.clone();
    after.container_resources.as_mut().unwrap().cpu_shares = 256;
    after.container_resources.as_mut().unwrap().cpuset_cpus = "2-3".into();
    after.container_envs.insert("HOOKED".into(), "1".into());
    after.pod_cgroup_parent = "/kubepods/besteffort/podu".into();
    let call = Call::CreateContainer { req: (&v1_create).into(), hook: Some(after) };
    let edited = proto_edit::apply(&create.encode_to_vec(), &call.edits(&BeforeHooks::Container(before))).unwrap();
    let got = a2::CreateContainerRequest::decode(edited.as_slice()).unwrap();
    let config = got.config.unwrap();
    let res = config.linux.unwrap().resources.unwrap();
    assert_eq!((res.cpu_shares, res.cpuset_cpus.as_str(), res.cpu_quota), (256, "2-3", 50_000));
    assert_eq!(config.envs.last().map(|kv| (kv.key.as_str(), kv.value.as_str())), Some(("HOOKED", "1")));
    assert_eq!(got.sandbox_config.unwrap().linux.unwrap().cgroup_parent, "/kubepods/besteffort/podu");
}

#[test]
fn both_cri_versions_are_intercepted() {
    for spec in &METHODS {
        for service in SERVICES {
            let path = format!("{service}{}", spec.name);
            assert_eq!(lookup(&path).map(|s| s.method), Some(spec.method), "{path}");
        }
    }
    assert!(lookup("/runtime.v1.RuntimeService/Version").is_none());
    assert!(lookup("/runtime.v1.ImageService/RunPodSandbox").is_none());
    assert!(lookup("/runtime.v2.RuntimeService/RunPodSandbox").is_none());
}

/// A PreRunPodSandbox answer's `resources` (koordlet's pod values for a BE pod) reach nothing in
/// CRI mode, as in koord-runtime-proxy (`PodResourceExecutor.UpdateRequest` ignores them): no
/// edit of the RunPodSandbox request, and the store keeps the resources kubelet sent (what
/// recovery reads back from containerd). The rest of the chain sees them.
#[test]
fn pod_resources_of_an_answer_reach_nothing_in_cri_mode() {
    let kubelet = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let req = cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/besteffort/pod1".into(),
                resources: Some(kubelet.clone()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut call = Call::decode(Method::RunPodSandbox, Bytes::from(req.encode_to_vec())).expect("decodes");
    let Call::RunPodSandbox { req: view, hook } = &mut call else { unreachable!() };
    *hook = pod_hook_request(view.config.as_ref(), &view.runtime_handler);
    let before = call.hook_state();
    let Call::RunPodSandbox { hook, .. } = &mut call else { unreachable!() };
    let answer = hook::LinuxContainerResources {
        cpu_shares: 512,
        cpu_quota: 100_000,
        memory_limit_in_bytes: 128 << 20,
        ..Default::default()
    };
    hook_api::merge::apply_pod_response(
        hook,
        &hook::PodSandboxHookResponse { resources: Some(answer), ..Default::default() },
    );
    assert_eq!(
        hook.resources.as_ref().map(|r| (r.cpu_shares, r.cpu_period)),
        Some((512, 100_000)),
        "merged for the chain"
    );
    assert!(call.edits(&before).is_empty(), "no CRI field takes a sandbox's resources");
    let msg = cri::RunPodSandboxResponse { pod_sandbox_id: "sb".into() }.encode_to_vec();
    let mut data = vec![0u8];
    data.extend((msg.len() as u32).to_be_bytes());
    data.extend(msg);
    let answer = unary_call::Answer { head: http::Response::new(()), data: data.into(), trailers: None };
    let store = Store::new();
    call.commit(&answer, &store, false);
    assert_eq!(store.pod("sb").expect("recorded").resources, Some(convert::to_hook(&kubelet)));
}
