//! Hook answers as the proxy handles them: a CRI request (CreateContainer or RunPodSandbox,
//! prost-decoded from the frame's first part, the way `Call::decode` does) and a hook server's
//! answer (prost-decoded from the rest: ContainerResourceHookResponse / PodSandboxHookResponse).
//! The answer is merged into the hook request, the interceptor's wire edits are applied to the
//! original request bytes, and the edited request must decode to the request with the hook's
//! changes: maps merged (answer wins, nothing removed), envs in place then new ones sorted,
//! changed resource fields set, cgroup parent replaced.
#![no_main]

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use hook_api::convert;
use hook_api::merge::{apply_container_response, apply_pod_response};
use hook_api::v1alpha1 as hook;
use k8s_cri::v1 as cri;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_proxy::cri::hook_request::container_hook_request;
use runtime_proxy::cri::intercept::Call;
use runtime_proxy::cri::proto_edit;
use runtime_proxy::hooks::flow::BeforeHooks;
use runtime_proxy::hooks::stages::Method;
use runtime_proxy::hooks::store::Store;
use runtime_proxy_fuzz::{edit_checked, normalize_create, normalize_run, split2};

/// Applies the edits to the request bytes and to valid encodings of the decoded request (see
/// [`edit_checked`]; `message_fields`: its embedded message fields) and decodes the results.
fn edited<M: Message + Default>(msg: &[u8], message_fields: &[u32], call: &Call, before: &BeforeHooks) -> Vec<M> {
    let canonical = M::decode(msg).expect("decoded before").encode_to_vec();
    let edits = call.edits(before);
    if edits.is_empty() {
        assert_eq!(proto_edit::apply(msg, &edits).as_deref(), Ok(msg), "no change: the request goes on byte for byte");
    }
    edit_checked(msg, &canonical, message_fields, &edits)
        .iter()
        .map(|out| M::decode(&out[..]).expect("an edited request decodes"))
        .collect()
}

/// `current` with the entries the hooks added or changed (`before` → `after`).
fn merged(
    current: &HashMap<String, String>,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> HashMap<String, String> {
    let mut out = current.clone();
    for (k, v) in after {
        if before.get(k) != Some(v) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

fn create_container(msg: &[u8], answer: &[u8]) {
    let Ok(resp) = hook::ContainerResourceHookResponse::decode(answer) else { return };
    // The interceptor reads a view of the request (`runtime_proxy::cri::hooked_fields`); what the edits must
    // give is stated on the whole request, so both must decode.
    let Ok(req) = cri::CreateContainerRequest::decode(msg) else { return };
    let Ok(mut call) = Call::decode(Method::CreateContainer, Bytes::copy_from_slice(msg)) else { return };
    let Call::CreateContainer { req: view, hook } = &mut call else { unreachable!() };
    // An empty store: the pod comes from the request's sandbox_config (or there are no hooks).
    let Ok(built) = container_hook_request(view, &Store::new()) else { return };
    *hook = built;
    let before_hook = hook.clone();
    let before = call.hook_state();
    if let Call::CreateContainer { hook: Some(h), .. } = &mut call {
        apply_container_response(h, &resp);
    }
    let got = edited::<cri::CreateContainerRequest>(msg, &[2, 3], &call, &before);
    let (Some(b), Call::CreateContainer { hook: Some(a), .. }) = (before_hook, &call) else {
        assert!(got.iter().all(|g| *g == req), "no hook request, no change");
        return;
    };

    let mut want = req.clone();
    let cfg = want.config.get_or_insert_with(Default::default);
    cfg.annotations = merged(&cfg.annotations, &b.container_annotations, &a.container_annotations);
    let mut envs: Vec<cri::KeyValue> = cfg.envs.clone();
    let mut added: Vec<(String, String)> = Vec::new();
    for (k, v) in &a.container_envs {
        if b.container_envs.get(k) == Some(v) {
            continue;
        }
        let mut found = false;
        for kv in envs.iter_mut().filter(|kv| &kv.key == k) {
            kv.value.clone_from(v);
            found = true;
        }
        if !found {
            added.push((k.clone(), v.clone()));
        }
    }
    added.sort();
    envs.extend(added.into_iter().map(|(key, value)| cri::KeyValue { key, value }));
    cfg.envs = envs;
    let (rb, ra) =
        (b.container_resources.clone().unwrap_or_default(), a.container_resources.clone().unwrap_or_default());
    let (rb, ra) = (convert::to_cri(&rb), convert::to_cri(&ra));
    let res = cfg.linux.get_or_insert_with(Default::default).resources.get_or_insert_with(Default::default);
    macro_rules! field {
        ($($f:ident),*) => {$( if rb.$f != ra.$f { res.$f = ra.$f.clone(); } )*};
    }
    field!(
        cpu_period,
        cpu_quota,
        cpu_shares,
        memory_limit_in_bytes,
        oom_score_adj,
        cpuset_cpus,
        cpuset_mems,
        hugepage_limits,
        unified,
        memory_swap_limit_in_bytes
    );
    if a.pod_cgroup_parent != b.pod_cgroup_parent {
        want.sandbox_config
            .get_or_insert_with(Default::default)
            .linux
            .get_or_insert_with(Default::default)
            .cgroup_parent = a.pod_cgroup_parent.clone();
    }
    let want = normalize_create(want);
    for got in got {
        assert_eq!(normalize_create(got), want);
    }
}

fn run_pod_sandbox(msg: &[u8], answer: &[u8]) {
    let Ok(resp) = hook::PodSandboxHookResponse::decode(answer) else { return };
    // As for CreateContainer: the interceptor reads a view, the expectation is on the whole request.
    let Ok(req) = cri::RunPodSandboxRequest::decode(msg) else { return };
    let Ok(mut call) = Call::decode(Method::RunPodSandbox, Bytes::copy_from_slice(msg)) else { return };
    let Call::RunPodSandbox { hook, .. } = &mut call else { unreachable!() };
    let b = hook.clone();
    let before = call.hook_state();
    let Call::RunPodSandbox { hook: a, .. } = &mut call else { unreachable!() };
    apply_pod_response(a, &resp);
    let a = a.clone();
    let got = edited::<cri::RunPodSandboxRequest>(msg, &[1], &call, &before);
    let mut want = req.clone();
    let cfg = want.config.get_or_insert_with(Default::default);
    cfg.labels = merged(&cfg.labels, &b.labels, &a.labels);
    cfg.annotations = merged(&cfg.annotations, &b.annotations, &a.annotations);
    if a.cgroup_parent != b.cgroup_parent {
        cfg.linux.get_or_insert_with(Default::default).cgroup_parent = a.cgroup_parent.clone();
    }
    let want = normalize_run(want);
    for got in got {
        assert_eq!(normalize_run(got), want);
    }
}

// Input: `split2` frame; selector bit 0 picks CreateContainer (0) or RunPodSandbox (1); the first
// part is the CRI request, the rest the hook's answer.
fuzz_target!(|data: &[u8]| {
    let Some((sel, msg, answer)) = split2(data) else { return };
    if sel & 1 == 0 {
        create_container(msg, answer);
    } else {
        run_pod_sandbox(msg, answer);
    }
});
