//! The merge rules (`hook_api::merge`) on arbitrary hook requests and answers, decoded with prost
//! from the two parts of a `split2` frame (selector bit 0: container, 1: pod). Never panics, and
//! the documented properties hold: an echoed answer changes nothing, applying an answer twice
//! equals once, answered values the rules accept win (pod resources as container resources), keys are never
//! removed, hugepages are kept.
#![no_main]

use hook_api::merge::{
    apply_container_response, apply_pod_response, echo_container, echo_pod, merge_resources, merge_update,
};
use hook_api::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, LinuxContainerResources, PodSandboxHookRequest,
    PodSandboxHookResponse,
};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_proxy_fuzz::split2;

fn check_resources(cur: &LinuxContainerResources, answer: &LinuxContainerResources) {
    let mut once = cur.clone();
    merge_resources(&mut once, answer);
    let mut twice = once.clone();
    merge_resources(&mut twice, answer);
    assert_eq!(once, twice, "merge_resources is idempotent");
    assert_eq!(once.hugepage_limits, cur.hugepage_limits);
    assert_eq!(once.cpu_shares, if answer.cpu_shares > 0 { answer.cpu_shares } else { cur.cpu_shares });
    assert_eq!(once.cpu_quota, if answer.cpu_quota != 0 { answer.cpu_quota } else { cur.cpu_quota });
    assert_eq!(once.cpu_period, if answer.cpu_period > 0 { answer.cpu_period } else { cur.cpu_period });
    let oom_ok = answer.oom_score_adj != 0 && (-1000..=1000).contains(&answer.oom_score_adj);
    assert_eq!(once.oom_score_adj, if oom_ok { answer.oom_score_adj } else { cur.oom_score_adj });
    assert_eq!(once.cpuset_cpus, answer.cpuset_cpus);
    assert_eq!(once.cpuset_mems, answer.cpuset_mems);
    for (k, v) in &answer.unified {
        assert_eq!(once.unified.get(k), Some(v));
    }
    assert!(cur.unified.keys().all(|k| once.unified.contains_key(k)));

    let mut updated = cur.clone();
    merge_update(&mut updated, answer);
    let mut again = updated.clone();
    merge_update(&mut again, answer);
    assert_eq!(updated, again, "merge_update is idempotent");
    assert_eq!(updated.oom_score_adj, cur.oom_score_adj, "oom_score_adj is not updatable");
    assert_eq!(updated.hugepage_limits, cur.hugepage_limits);
}

fn check_container(req: ContainerResourceHookRequest, resp: &ContainerResourceHookResponse) {
    let mut echoed = req.clone();
    apply_container_response(&mut echoed, &echo_container(&req));
    assert_eq!(echoed.container_annotations, req.container_annotations);
    assert_eq!(echoed.container_envs, req.container_envs);
    assert_eq!(echoed.pod_cgroup_parent, req.pod_cgroup_parent);
    // An echo of absent resources stays absent; of present ones, equal.
    assert_eq!(echoed.container_resources, req.container_resources);

    let mut once = req.clone();
    apply_container_response(&mut once, resp);
    let mut twice = once.clone();
    apply_container_response(&mut twice, resp);
    assert_eq!(once, twice, "apply_container_response is idempotent");
    for (k, v) in &resp.container_annotations {
        assert_eq!(once.container_annotations.get(k), Some(v));
    }
    for (k, v) in resp.container_envs.iter().filter(|(k, _)| !k.is_empty()) {
        assert_eq!(once.container_envs.get(k), Some(v));
    }
    assert_eq!(once.container_envs.get(""), req.container_envs.get(""), "an empty env name from a hook is ignored");
    assert!(req.container_annotations.keys().all(|k| once.container_annotations.contains_key(k)));
    assert!(req.container_envs.keys().all(|k| once.container_envs.contains_key(k)));
    if !resp.pod_cgroup_parent.is_empty() {
        assert_eq!(once.pod_cgroup_parent, resp.pod_cgroup_parent);
    }
    // Everything the rules do not touch is kept.
    assert_eq!(
        (&once.pod_meta, &once.container_meta, &once.pod_labels),
        (&req.pod_meta, &req.container_meta, &req.pod_labels)
    );
    if let Some(answer) = &resp.container_resources {
        check_resources(&req.container_resources.clone().unwrap_or_default(), answer);
    }
}

fn check_pod(req: PodSandboxHookRequest, resp: &PodSandboxHookResponse) {
    let mut echoed = req.clone();
    apply_pod_response(&mut echoed, &echo_pod(&req));
    assert_eq!(echoed, req, "an echoed pod answer changes nothing");
    let mut once = req.clone();
    apply_pod_response(&mut once, resp);
    let mut twice = once.clone();
    apply_pod_response(&mut twice, resp);
    assert_eq!(once, twice);
    for (k, v) in &resp.labels {
        assert_eq!(once.labels.get(k), Some(v));
    }
    assert!(req.annotations.keys().all(|k| once.annotations.contains_key(k)));
    match &resp.resources {
        // Pod resources merge as container resources do (Docker mode applies them to the pause
        // container); an absent answer keeps the request's.
        Some(answer) => check_resources(&req.resources.clone().unwrap_or_default(), answer),
        None => assert_eq!(once.resources, req.resources, "absent pod resources change nothing"),
    }
    if !resp.cgroup_parent.is_empty() {
        assert_eq!(once.cgroup_parent, resp.cgroup_parent);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, a, b)) = split2(data) else { return };
    if sel & 1 == 0 {
        let (Ok(req), Ok(resp)) = (ContainerResourceHookRequest::decode(a), ContainerResourceHookResponse::decode(b))
        else {
            return;
        };
        check_container(req, &resp);
    } else {
        let (Ok(req), Ok(resp)) = (PodSandboxHookRequest::decode(a), PodSandboxHookResponse::decode(b)) else { return };
        check_pod(req, &resp);
    }
});
