//! Intercepted requests with arbitrary bytes in every string field (the interceptor's decode of
//! CreateContainer, RunPodSandbox and UpdateContainerResources, the hook request built from
//! them, a hook's answer merged in and the wire edits applied):
//!
//! * decoding never panics, and fails only when a field the proxy must read as text is not UTF-8
//!   (an ID, a name, a map key or env key): values — envs, labels, annotations — never make a
//!   request undecodable;
//! * the hook request carries exactly the values that are UTF-8 (the others are left out);
//! * after a hook changes some entries, every entry it did not change is forwarded byte for byte
//!   (envs in their order; map values by key), and what it changed has its value.
//!
//! The requests are encoded with the message shapes below: every CRI `string` as `bytes`, which
//! has the same wire form.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_proxy::cri::hook_request::container_hook_request;
use runtime_proxy::cri::intercept::Call;
use runtime_proxy::cri::{hooked_fields, proto_edit};
use runtime_proxy::hooks::flow::BeforeHooks;
use runtime_proxy::hooks::stages::Method;
use runtime_proxy::hooks::store::Store;

#[derive(Clone, PartialEq, prost::Message)]
struct RawKv {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawMeta {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
}

/// `PodSandboxConfig`: metadata (1), labels (6), annotations (7), linux.cgroup_parent (8.1).
#[derive(Clone, PartialEq, prost::Message)]
struct RawPodConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<RawMeta>,
    #[prost(message, repeated, tag = "6")]
    labels: Vec<RawKv>,
    #[prost(message, repeated, tag = "7")]
    annotations: Vec<RawKv>,
    #[prost(message, optional, tag = "8")]
    linux: Option<RawMeta>,
}

/// `ContainerConfig`: metadata (1), envs (6), labels (9), annotations (10).
#[derive(Clone, PartialEq, prost::Message)]
struct RawContainerConfig {
    #[prost(message, optional, tag = "1")]
    metadata: Option<RawMeta>,
    #[prost(message, repeated, tag = "6")]
    envs: Vec<RawKv>,
    #[prost(message, repeated, tag = "9")]
    labels: Vec<RawKv>,
    #[prost(message, repeated, tag = "10")]
    annotations: Vec<RawKv>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawCreate {
    #[prost(bytes = "vec", tag = "1")]
    pod_sandbox_id: Vec<u8>,
    #[prost(message, optional, tag = "2")]
    config: Option<RawContainerConfig>,
    #[prost(message, optional, tag = "3")]
    sandbox_config: Option<RawPodConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawRun {
    #[prost(message, optional, tag = "1")]
    config: Option<RawPodConfig>,
    #[prost(bytes = "vec", tag = "2")]
    runtime_handler: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawUpdate {
    #[prost(bytes = "vec", tag = "1")]
    container_id: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    annotations: Vec<RawKv>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    method: u8,
    id: Vec<u8>,
    name: Vec<u8>,
    envs: Vec<(Vec<u8>, Vec<u8>)>,
    labels: Vec<(Vec<u8>, Vec<u8>)>,
    annotations: Vec<(Vec<u8>, Vec<u8>)>,
    pod_annotations: Vec<(Vec<u8>, Vec<u8>)>,
    /// What the hook sets: (env or annotation, key, value).
    hook: Vec<(bool, String, String)>,
}

fn kvs(pairs: &[(Vec<u8>, Vec<u8>)]) -> Vec<RawKv> {
    pairs.iter().map(|(k, v)| RawKv { key: k.clone(), value: v.clone() }).collect()
}

fn utf8(b: &[u8]) -> bool {
    std::str::from_utf8(b).is_ok()
}

/// A map as protobuf reads repeated entries: the last entry of a key wins.
fn as_map(pairs: &[(Vec<u8>, Vec<u8>)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    pairs.iter().cloned().collect()
}

/// The entries of the map that are text on both sides, as the hook request must carry them.
fn text_entries(map: &BTreeMap<Vec<u8>, Vec<u8>>) -> BTreeMap<String, String> {
    map.iter()
        .filter_map(|(k, v)| Some((String::from_utf8(k.clone()).ok()?, String::from_utf8(v.clone()).ok()?)))
        .collect()
}

fn bytes_map(map: &hooked_fields::Text) -> BTreeMap<Vec<u8>, Vec<u8>> {
    map.iter().map(|(k, v)| (k.clone().into_bytes(), v.clone())).collect()
}

/// `before` with `changes` set (the hook's entries win), for a map compared by bytes.
fn expected(before: &BTreeMap<Vec<u8>, Vec<u8>>, changes: &BTreeMap<String, String>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = before.clone();
    for (k, v) in changes {
        out.insert(k.clone().into_bytes(), v.clone().into_bytes());
    }
    out
}

fn create_container(input: &Input) {
    let msg = RawCreate {
        pod_sandbox_id: input.id.clone(),
        config: Some(RawContainerConfig {
            metadata: Some(RawMeta { name: input.name.clone() }),
            envs: kvs(&input.envs),
            labels: kvs(&input.labels),
            annotations: kvs(&input.annotations),
        }),
        sandbox_config: Some(RawPodConfig { annotations: kvs(&input.pod_annotations), ..Default::default() }),
    }
    .encode_to_vec();
    let must_decode = utf8(&input.id)
        && utf8(&input.name)
        && input.envs.iter().all(|(k, _)| utf8(k))
        && input.annotations.iter().all(|(k, _)| utf8(k));
    let decoded = Call::decode(Method::CreateContainer, Bytes::from(msg.clone()));
    assert_eq!(decoded.is_ok(), must_decode, "decoding fails only for text fields that are not UTF-8: {decoded:?}");
    let Ok(mut call) = decoded else { return };
    let _ = hooked_fields::target("CreateContainer", &msg);
    let Call::CreateContainer { req, hook } = &mut call else { unreachable!() };
    // `sandbox_config` is read only when the hook request is built (the store does not know the pod).
    let built = container_hook_request(req, &Store::new());
    assert_eq!(built.is_ok(), input.pod_annotations.iter().all(|(k, _)| utf8(k)), "{built:?}");
    let Ok(built) = built else { return };
    *hook = built;
    let h = hook.as_mut().expect("a pod from sandbox_config");
    let (annotations, pod_annotations) = (as_map(&input.annotations), as_map(&input.pod_annotations));
    assert_eq!(h.container_annotations, text_entries(&annotations));
    assert_eq!(h.pod_annotations, text_entries(&pod_annotations));
    let last_env: BTreeMap<Vec<u8>, Vec<u8>> = as_map(&input.envs);
    assert_eq!(h.container_envs, text_entries(&last_env));

    let before = BeforeHooks::Container(h.clone());
    let seen = h.clone();
    for (is_env, k, v) in &input.hook {
        let target = if *is_env { &mut h.container_envs } else { &mut h.container_annotations };
        target.insert(k.clone(), v.clone());
    }
    // What differs from what the hook saw is a change.
    let changed = |before: &BTreeMap<String, String>, after: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let env_changes = changed(&seen.container_envs, &h.container_envs);
    let annotation_changes = changed(&seen.container_annotations, &h.container_annotations);
    let edited = proto_edit::apply(&msg, &call.edits(&before)).expect("edits apply");
    let got = hooked_fields::CreateContainerRequest::decode(edited.as_slice()).expect("the edited request decodes");
    let config = got.config.clone().expect("config");
    // Envs: in their order, every value byte for byte but the hook's; new keys after, sorted.
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = input
        .envs
        .iter()
        .map(|(k, v)| match std::str::from_utf8(k).ok().and_then(|k| env_changes.get(k)) {
            Some(new) => (k.clone(), new.clone().into_bytes()),
            None => (k.clone(), v.clone()),
        })
        .collect();
    if !env_changes.is_empty() {
        let mut added: Vec<_> =
            env_changes.iter().filter(|(k, _)| !input.envs.iter().any(|(e, _)| e == k.as_bytes())).collect();
        added.sort();
        want.extend(added.into_iter().map(|(k, v)| (k.clone().into_bytes(), v.clone().into_bytes())));
    }
    let got_envs: Vec<(Vec<u8>, Vec<u8>)> =
        config.envs.iter().map(|kv| (kv.key.clone().into_bytes(), kv.value.to_vec())).collect();
    if env_changes.is_empty() {
        assert_eq!(got_envs, input.envs, "no env change: the envs as sent");
    } else {
        assert_eq!(got_envs, want);
    }
    assert_eq!(bytes_map(&config.annotations), expected(&annotations, &annotation_changes));
    let pod = got.sandbox_config().expect("decodes").expect("present");
    assert_eq!(bytes_map(&pod.annotations), pod_annotations, "the pod's annotations untouched");
}

fn run_pod_sandbox(input: &Input) {
    let msg = RawRun {
        config: Some(RawPodConfig {
            metadata: Some(RawMeta { name: input.name.clone() }),
            labels: kvs(&input.labels),
            annotations: kvs(&input.annotations),
            linux: Some(RawMeta { name: input.id.clone() }),
        }),
        runtime_handler: input.id.clone(),
    }
    .encode_to_vec();
    let must_decode = utf8(&input.id)
        && utf8(&input.name)
        && input.labels.iter().all(|(k, _)| utf8(k))
        && input.annotations.iter().all(|(k, _)| utf8(k));
    let decoded = Call::decode(Method::RunPodSandbox, Bytes::from(msg.clone()));
    assert_eq!(decoded.is_ok(), must_decode, "{decoded:?}");
    let _ = hooked_fields::target("RunPodSandbox", &msg);
    let Ok(mut call) = decoded else { return };
    let Call::RunPodSandbox { hook, .. } = &mut call else { unreachable!() };
    let (labels, annotations) = (as_map(&input.labels), as_map(&input.annotations));
    assert_eq!(hook.labels, text_entries(&labels));
    assert_eq!(hook.annotations, text_entries(&annotations));
    let before = BeforeHooks::Pod(hook.clone());
    let seen = hook.annotations.clone();
    for (_, k, v) in &input.hook {
        hook.annotations.insert(k.clone(), v.clone());
    }
    let changes: BTreeMap<String, String> = hook
        .annotations
        .iter()
        .filter(|(k, v)| seen.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let edited = proto_edit::apply(&msg, &call.edits(&before)).expect("edits apply");
    let got = hooked_fields::RunPodSandboxRequest::decode(edited.as_slice()).expect("decodes").config.expect("config");
    assert_eq!(bytes_map(&got.labels), labels, "labels untouched");
    assert_eq!(bytes_map(&got.annotations), expected(&annotations, &changes));
}

fn update_container_resources(input: &Input) {
    let msg = RawUpdate { container_id: input.id.clone(), annotations: kvs(&input.annotations) }.encode_to_vec();
    let must_decode = utf8(&input.id) && input.annotations.iter().all(|(k, _)| utf8(k));
    let decoded = Call::decode(Method::UpdateContainerResources, Bytes::from(msg.clone()));
    assert_eq!(decoded.is_ok(), must_decode, "{decoded:?}");
    let _ = hooked_fields::target("UpdateContainerResources", &msg);
}

fuzz_target!(|input: Input| {
    match input.method % 3 {
        0 => create_container(&input),
        1 => run_pod_sandbox(&input),
        _ => update_container_resources(&input),
    }
});
