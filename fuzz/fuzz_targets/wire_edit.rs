//! The protobuf wire editor (`runtime_proxy::cri::proto_edit::apply`): random bytes and random edits never
//! panic; no edits is the identity; and on a message that decodes as a CRI CreateContainerRequest,
//! typed edits (built as the interceptor builds them) give exactly the typed change.
#![no_main]

use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use k8s_cri::v1 as cri;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_proxy::cri::proto_edit::{self, Edit};
use runtime_proxy_fuzz::{edit_checked, normalize_create, split2};

#[derive(Arbitrary, Debug)]
enum ArbEdit {
    Replace(Vec<u8>),
    Nested(Vec<(u8, ArbEdit)>),
}

/// Field numbers 0..=19: small, so edits hit the fields a message has.
fn edit(e: &ArbEdit) -> Edit {
    match e {
        ArbEdit::Replace(b) => Edit::Replace(b.clone()),
        ArbEdit::Nested(inner) => Edit::Nested(edits(inner)),
    }
}

fn edits(list: &[(u8, ArbEdit)]) -> Vec<(u32, Edit)> {
    list.iter().map(|(f, e)| (u32::from(*f % 20), edit(e))).collect()
}

/// The changes the interceptor makes to a CreateContainerRequest, as typed values.
#[derive(Arbitrary, Debug)]
struct Typed {
    sandbox_id: Option<String>,
    name: Option<String>,
    annotations: Option<HashMap<String, String>>,
    envs: Option<Vec<(String, String)>>,
    cpu_shares: Option<i64>,
    cpuset_cpus: Option<String>,
    unified: Option<HashMap<String, String>>,
    cgroup_parent: Option<String>,
}

/// What the fuzzer edits with; the message itself is the first part of the frame.
#[derive(Arbitrary, Debug)]
struct Input {
    edits: Vec<(u8, ArbEdit)>,
    typed: Typed,
}

fn replace(m: impl Message) -> Edit {
    Edit::Replace(m.encode_to_vec())
}

fn typed_edits(t: &Typed) -> Vec<(u32, Edit)> {
    let mut top = Vec::new();
    if let Some(s) = &t.sandbox_id {
        top.push((1, replace(cri::CreateContainerRequest { pod_sandbox_id: s.clone(), ..Default::default() })));
    }
    let mut config = Vec::new();
    if let Some(n) = &t.name {
        config.push((1, Edit::Nested(vec![(1, replace(cri::ContainerMetadata { name: n.clone(), attempt: 0 }))])));
    }
    if let Some(envs) = &t.envs {
        let envs = envs.iter().map(|(k, v)| cri::KeyValue { key: k.clone(), value: v.clone() }).collect();
        config.push((6, replace(cri::ContainerConfig { envs, ..Default::default() })));
    }
    if let Some(a) = &t.annotations {
        config.push((10, replace(cri::ContainerConfig { annotations: a.clone(), ..Default::default() })));
    }
    let mut res = Vec::new();
    if let Some(s) = t.cpu_shares {
        res.push((3, replace(cri::LinuxContainerResources { cpu_shares: s, ..Default::default() })));
    }
    if let Some(c) = &t.cpuset_cpus {
        res.push((6, replace(cri::LinuxContainerResources { cpuset_cpus: c.clone(), ..Default::default() })));
    }
    if let Some(u) = &t.unified {
        res.push((9, replace(cri::LinuxContainerResources { unified: u.clone(), ..Default::default() })));
    }
    if !res.is_empty() {
        config.push((15, Edit::Nested(vec![(1, Edit::Nested(res))])));
    }
    if !config.is_empty() {
        top.push((2, Edit::Nested(config)));
    }
    if let Some(p) = &t.cgroup_parent {
        let linux = cri::LinuxPodSandboxConfig { cgroup_parent: p.clone(), ..Default::default() };
        top.push((3, Edit::Nested(vec![(8, Edit::Nested(vec![(1, replace(linux))]))])));
    }
    top
}

fn typed_change(mut r: cri::CreateContainerRequest, t: &Typed) -> cri::CreateContainerRequest {
    if let Some(s) = &t.sandbox_id {
        r.pod_sandbox_id.clone_from(s);
    }
    let touches_config = t.name.is_some() || t.envs.is_some() || t.annotations.is_some();
    let touches_res = t.cpu_shares.is_some() || t.cpuset_cpus.is_some() || t.unified.is_some();
    if touches_config || touches_res {
        let c = r.config.get_or_insert_with(Default::default);
        if let Some(n) = &t.name {
            c.metadata.get_or_insert_with(Default::default).name.clone_from(n);
        }
        if let Some(envs) = &t.envs {
            c.envs = envs.iter().map(|(k, v)| cri::KeyValue { key: k.clone(), value: v.clone() }).collect();
        }
        if let Some(a) = &t.annotations {
            c.annotations.clone_from(a);
        }
        if touches_res {
            let res = c.linux.get_or_insert_with(Default::default).resources.get_or_insert_with(Default::default);
            if let Some(s) = t.cpu_shares {
                res.cpu_shares = s;
            }
            if let Some(cpus) = &t.cpuset_cpus {
                res.cpuset_cpus.clone_from(cpus);
            }
            if let Some(u) = &t.unified {
                res.unified.clone_from(u);
            }
        }
    }
    if let Some(p) = &t.cgroup_parent {
        r.sandbox_config
            .get_or_insert_with(Default::default)
            .linux
            .get_or_insert_with(Default::default)
            .cgroup_parent
            .clone_from(p);
    }
    r
}

fn check(msg: &[u8], input: &Input) {
    // Anything goes: errors, never panics. No edits: the same bytes.
    let _ = proto_edit::apply(msg, &edits(&input.edits));
    assert_eq!(proto_edit::apply(msg, &[]).as_deref(), Ok(msg));

    let Ok(req) = cri::CreateContainerRequest::decode(msg) else { return };
    let want = normalize_create(typed_change(req.clone(), &input.typed));
    for out in edit_checked(msg, &req.encode_to_vec(), &[2, 3], &typed_edits(&input.typed)) {
        let got = cri::CreateContainerRequest::decode(&out[..]).expect("an edited valid message decodes");
        assert_eq!(normalize_create(got), want);
    }
}

// Input: `split2` frame, the message first, then the edits (arbitrary).
fuzz_target!(|data: &[u8]| {
    let Some((_, msg, rest)) = split2(data) else { return };
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(rest)) {
        check(msg, &input);
    }
});
