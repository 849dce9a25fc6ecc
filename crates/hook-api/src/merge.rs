//! The merge rules: how a hook server's answer changes the hook request, field by field.
//!
//! The dispatcher calls the servers registered for a stage one after another; after each answer
//! it applies these rules to the hook request, so the next server sees the request as changed by
//! the ones before, and the final request is what the proxy applies to the CRI call. All rules
//! are pure functions.
//!
//! Compatibility: koordlet answers with the whole request echoed and its own changes on top (koord-runtime-proxy's
//! `pkg/runtimeproxy/resexecutor/cri/utils.go`), so "the answer's value wins" is exact for it. For servers that answer
//! sparsely, an empty map, an empty string and an absent message mean "no change" — proto3 cannot tell "absent" from
//! "empty", and Go's koord-runtime-proxy treats them the same way (a nil map or "" never changes anything). The table
//! per field:
//!
//! | answer field | rule | source |
//! |---|---|---|
//! | pod `labels`, `annotations` | merged into the request's map, answer wins per key; keys are never removed | koord `MergeMap` |
//! | pod `cgroup_parent` | replaces the request's when not empty | koord `UpdateRequest` |
//! | pod `resources` | when present, field by field by [`merge_resources`] (as `container_resources`). Docker mode applies them to the pod sandbox's (pause) container; CRI and NRI mode apply them nowhere (no CRI or NRI field takes a sandbox's resources at creation) | koord `HandleCreateContainer` (Docker), `PodResourceExecutor.UpdateRequest` (CRI: ignored) |
//! | `container_annotations` | merged, answer wins per key | koord `MergeMap` |
//! | `container_envs` | merged, answer wins per key (koord replaces the whole map, which a sparse answer would empty; with koordlet's echo both agree); an empty name is ignored (no process can read it; containerd and dockerd would write `=V` into the environment) | ours |
//! | `pod_cgroup_parent` | replaces when not empty | koord |
//! | `container_resources` | when present, field by field by [`merge_resources`] | koord `updateResource` |
//!
//! [`merge_resources`], per field of `LinuxContainerResources` (units as in CRI: CFS period and
//! quota in microseconds, CPU shares, bytes):
//!
//! | field | taken from the answer when | note |
//! |---|---|---|
//! | `cpu_period` | > 0 | |
//! | `cpu_quota` | ≠ 0 | −1 (unlimited) allowed |
//! | `cpu_shares` | > 0 | |
//! | `memory_limit_in_bytes` | > 0 | a hook's −1 is ignored, as in koord |
//! | `memory_swap_limit_in_bytes` | > 0 | |
//! | `oom_score_adj` | ≠ 0 and within [−1000, 1000] | koord also takes 0, which lets a sparse answer reset it; we recommend not to |
//! | `cpuset_cpus`, `cpuset_mems` | always | `""` clears the cpuset: koordlet moves BE containers to the shared pool this way (koord PR #484) |
//! | `unified` | merged per key, answer wins | |
//! | `hugepage_limits` | never | koord keeps the original |

use crate::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, LinuxContainerResources, PodSandboxHookRequest,
    PodSandboxHookResponse,
};
use std::collections::BTreeMap;

/// Merges `from` into `into`: every key of `from` is set, `from` winning; nothing is removed.
pub fn merge_map(into: &mut BTreeMap<String, String>, from: &BTreeMap<String, String>) {
    for (k, v) in from {
        if into.get(k) != Some(v) {
            into.insert(k.clone(), v.clone());
        }
    }
}

/// Applies a pod-level answer (PreRunPodSandbox, PostStopPodSandbox) to the hook request.
pub fn apply_pod_response(req: &mut PodSandboxHookRequest, resp: &PodSandboxHookResponse) {
    merge_map(&mut req.labels, &resp.labels);
    merge_map(&mut req.annotations, &resp.annotations);
    if !resp.cgroup_parent.is_empty() {
        req.cgroup_parent.clone_from(&resp.cgroup_parent);
    }
    if let Some(answer) = &resp.resources {
        merge_resources(req.resources.get_or_insert_with(Default::default), answer);
    }
}

/// Applies a container-level answer (PreCreateContainer, PreStartContainer,
/// PreUpdateContainerResources and the post stages) to the hook request.
pub fn apply_container_response(req: &mut ContainerResourceHookRequest, resp: &ContainerResourceHookResponse) {
    merge_map(&mut req.container_annotations, &resp.container_annotations);
    for (k, v) in resp.container_envs.iter().filter(|(k, _)| !k.is_empty()) {
        if req.container_envs.get(k) != Some(v) {
            req.container_envs.insert(k.clone(), v.clone());
        }
    }
    if !resp.pod_cgroup_parent.is_empty() {
        req.pod_cgroup_parent.clone_from(&resp.pod_cgroup_parent);
    }
    if let Some(answer) = &resp.container_resources {
        merge_resources(req.container_resources.get_or_insert_with(Default::default), answer);
    }
}

/// Merges an answer's resources into the current ones, field by field (table in the module doc).
pub fn merge_resources(cur: &mut LinuxContainerResources, answer: &LinuxContainerResources) {
    if answer.cpu_period > 0 {
        cur.cpu_period = answer.cpu_period;
    }
    if answer.cpu_quota != 0 {
        cur.cpu_quota = answer.cpu_quota;
    }
    if answer.cpu_shares > 0 {
        cur.cpu_shares = answer.cpu_shares;
    }
    if answer.memory_limit_in_bytes > 0 {
        cur.memory_limit_in_bytes = answer.memory_limit_in_bytes;
    }
    if answer.memory_swap_limit_in_bytes > 0 {
        cur.memory_swap_limit_in_bytes = answer.memory_swap_limit_in_bytes;
    }
    if answer.oom_score_adj != 0 && (-1000..=1000).contains(&answer.oom_score_adj) {
        cur.oom_score_adj = answer.oom_score_adj;
    }
    cur.cpuset_cpus.clone_from(&answer.cpuset_cpus);
    cur.cpuset_mems.clone_from(&answer.cpuset_mems);
    merge_map(&mut cur.unified, &answer.unified);
}

/// Whether [`merge_map`] of `from` into `into` would change `into`: some key of `from` is
/// missing from `into` or has another value there.
pub fn map_changes(into: &BTreeMap<String, String>, from: &BTreeMap<String, String>) -> bool {
    from.iter().any(|(k, v)| into.get(k) != Some(v))
}

/// Whether [`apply_pod_response`] of `resp` would change `req` at all. Exact (a property test
/// holds it to the rule): an answer that only echoes the request, or leaves every field empty,
/// changes nothing, and the dispatcher then neither copies the request nor looks for edits.
pub fn pod_response_changes(req: &PodSandboxHookRequest, resp: &PodSandboxHookResponse) -> bool {
    map_changes(&req.labels, &resp.labels)
        || map_changes(&req.annotations, &resp.annotations)
        || (!resp.cgroup_parent.is_empty() && resp.cgroup_parent != req.cgroup_parent)
        || match (&req.resources, &resp.resources) {
            (_, None) => false,
            // The rule puts default resources in first, then merges.
            (None, Some(_)) => true,
            (Some(cur), Some(answer)) => resources_change(cur, answer),
        }
}

/// Whether [`apply_container_response`] of `resp` would change `req` at all (exact, as
/// [`pod_response_changes`]).
pub fn container_response_changes(req: &ContainerResourceHookRequest, resp: &ContainerResourceHookResponse) -> bool {
    map_changes(&req.container_annotations, &resp.container_annotations)
        || resp.container_envs.iter().any(|(k, v)| !k.is_empty() && req.container_envs.get(k) != Some(v))
        || (!resp.pod_cgroup_parent.is_empty() && resp.pod_cgroup_parent != req.pod_cgroup_parent)
        || match (&req.container_resources, &resp.container_resources) {
            (_, None) => false,
            // The rule puts default resources in first, then merges.
            (None, Some(_)) => true,
            (Some(cur), Some(answer)) => resources_change(cur, answer),
        }
}

/// Whether [`merge_resources`] of `answer` would change `cur` (field by field, the same
/// conditions).
pub fn resources_change(cur: &LinuxContainerResources, answer: &LinuxContainerResources) -> bool {
    (answer.cpu_period > 0 && answer.cpu_period != cur.cpu_period)
        || (answer.cpu_quota != 0 && answer.cpu_quota != cur.cpu_quota)
        || (answer.cpu_shares > 0 && answer.cpu_shares != cur.cpu_shares)
        || (answer.memory_limit_in_bytes > 0 && answer.memory_limit_in_bytes != cur.memory_limit_in_bytes)
        || (answer.memory_swap_limit_in_bytes > 0
            && answer.memory_swap_limit_in_bytes != cur.memory_swap_limit_in_bytes)
        || (answer.oom_score_adj != 0
            && (-1000..=1000).contains(&answer.oom_score_adj)
            && answer.oom_score_adj != cur.oom_score_adj)
        || answer.cpuset_cpus != cur.cpuset_cpus
        || answer.cpuset_mems != cur.cpuset_mems
        || map_changes(&cur.unified, &answer.unified)
}

/// Merges the resources of an UpdateContainerResources call (kubelet's new values) into the
/// stored ones before the PreUpdateContainerResources hook sees them: period, shares, memory and
/// swap when > 0, quota when ≠ 0, cpusets when not empty, `unified` merged; `oom_score_adj` and
/// hugepages are not updatable (koord `updateResourceByUpdateContainerResourceRequest`).
pub fn merge_update(cur: &mut LinuxContainerResources, update: &LinuxContainerResources) {
    if update.cpu_period > 0 {
        cur.cpu_period = update.cpu_period;
    }
    if update.cpu_quota != 0 {
        cur.cpu_quota = update.cpu_quota;
    }
    if update.cpu_shares > 0 {
        cur.cpu_shares = update.cpu_shares;
    }
    if update.memory_limit_in_bytes > 0 {
        cur.memory_limit_in_bytes = update.memory_limit_in_bytes;
    }
    if update.memory_swap_limit_in_bytes > 0 {
        cur.memory_swap_limit_in_bytes = update.memory_swap_limit_in_bytes;
    }
    if !update.cpuset_cpus.is_empty() {
        cur.cpuset_cpus.clone_from(&update.cpuset_cpus);
    }
    if !update.cpuset_mems.is_empty() {
        cur.cpuset_mems.clone_from(&update.cpuset_mems);
    }
    merge_map(&mut cur.unified, &update.unified);
}

/// A koordlet-style answer to a container request: the request echoed into the response
/// (koordlet's `proxyserver/service.go`). Used by hook servers built on this crate and in tests.
pub fn echo_container(req: &ContainerResourceHookRequest) -> ContainerResourceHookResponse {
    ContainerResourceHookResponse {
        container_annotations: req.container_annotations.clone(),
        container_resources: req.container_resources.clone(),
        pod_cgroup_parent: req.pod_cgroup_parent.clone(),
        container_envs: req.container_envs.clone(),
    }
}

/// A koordlet-style answer to a pod request: the request echoed into the response.
pub fn echo_pod(req: &PodSandboxHookRequest) -> PodSandboxHookResponse {
    PodSandboxHookResponse {
        labels: req.labels.clone(),
        annotations: req.annotations.clone(),
        cgroup_parent: req.cgroup_parent.clone(),
        resources: req.resources.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn resources() -> LinuxContainerResources {
        LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 1024,
            memory_limit_in_bytes: 64 << 20,
            oom_score_adj: 500,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            unified: map(&[("memory.high", "1000")]),
            memory_swap_limit_in_bytes: 128 << 20,
            ..Default::default()
        }
    }

    #[test]
    fn sparse_answer_changes_only_what_it_sets_except_cpuset() {
        let mut cur = resources();
        let answer = LinuxContainerResources {
            cpu_shares: 512,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            ..Default::default()
        };
        merge_resources(&mut cur, &answer);
        assert_eq!(cur, LinuxContainerResources { cpu_shares: 512, ..resources() });
    }

    #[test]
    fn empty_cpuset_clears_and_minus_one_quota_unlimits() {
        let mut cur = resources();
        merge_resources(&mut cur, &LinuxContainerResources { cpu_quota: -1, ..Default::default() });
        assert_eq!(cur.cpu_quota, -1);
        assert_eq!(cur.cpuset_cpus, "");
        assert_eq!(cur.cpuset_mems, "");
        assert_eq!(cur.oom_score_adj, 500, "an omitted oom_score_adj (0) does not reset it");
        assert_eq!(cur.memory_limit_in_bytes, 64 << 20);
    }

    #[test]
    fn negative_memory_and_out_of_range_oom_are_ignored() {
        let mut cur = resources();
        let answer = LinuxContainerResources { memory_limit_in_bytes: -1, oom_score_adj: 5000, ..resources() };
        merge_resources(&mut cur, &answer);
        assert_eq!(cur.memory_limit_in_bytes, 64 << 20);
        assert_eq!(cur.oom_score_adj, 500);
    }

    #[test]
    fn container_answer_merges_maps_and_keeps_keys() {
        let mut req = ContainerResourceHookRequest {
            container_annotations: map(&[("a", "1"), ("b", "2")]),
            container_envs: map(&[("PATH", "/bin"), ("X", "1")]),
            pod_cgroup_parent: "/kubepods/besteffort/pod1".into(),
            container_resources: Some(resources()),
            ..Default::default()
        };
        let resp = ContainerResourceHookResponse {
            container_annotations: map(&[("b", "3"), ("c", "4")]),
            container_envs: map(&[("X", "2")]),
            pod_cgroup_parent: String::new(),
            container_resources: None,
        };
        apply_container_response(&mut req, &resp);
        assert_eq!(req.container_annotations, map(&[("a", "1"), ("b", "3"), ("c", "4")]));
        assert_eq!(req.container_envs, map(&[("PATH", "/bin"), ("X", "2")]));
        assert_eq!(req.pod_cgroup_parent, "/kubepods/besteffort/pod1", "empty means no change");
        assert_eq!(req.container_resources, Some(resources()), "absent resources: no change");
    }

    #[test]
    fn env_with_empty_name_is_ignored() {
        let mut req = ContainerResourceHookRequest { container_envs: map(&[("PATH", "/bin")]), ..Default::default() };
        let resp =
            ContainerResourceHookResponse { container_envs: map(&[("", "2"), ("X", "1")]), ..Default::default() };
        apply_container_response(&mut req, &resp);
        assert_eq!(req.container_envs, map(&[("PATH", "/bin"), ("X", "1")]));
    }

    #[test]
    fn pod_answer_merges_and_sets_cgroup_parent() {
        let mut req =
            PodSandboxHookRequest { labels: map(&[("app", "x")]), cgroup_parent: "/a".into(), ..Default::default() };
        let resp = PodSandboxHookResponse {
            labels: map(&[("hooked", "yes")]),
            cgroup_parent: "/b".into(),
            ..Default::default()
        };
        apply_pod_response(&mut req, &resp);
        assert_eq!(req.labels, map(&[("app", "x"), ("hooked", "yes")]));
        assert_eq!(req.cgroup_parent, "/b");
    }

    /// koordlet's PreRunPodSandbox answer carries the pod's resources (its BatchResource sums):
    /// merged by the container rule, so a hook's −1 memory is ignored and the rest taken.
    #[test]
    fn pod_answer_merges_resources() {
        let mut req = PodSandboxHookRequest { resources: Some(resources()), ..Default::default() };
        let answer =
            LinuxContainerResources { cpu_shares: 512, cpu_quota: 100_000, memory_limit_in_bytes: -1, ..resources() };
        let resp = PodSandboxHookResponse { resources: Some(answer), ..Default::default() };
        assert!(pod_response_changes(&req, &resp));
        apply_pod_response(&mut req, &resp);
        assert_eq!(req.resources, Some(LinuxContainerResources { cpu_shares: 512, cpu_quota: 100_000, ..resources() }));
        let mut none = PodSandboxHookRequest::default();
        apply_pod_response(
            &mut none,
            &PodSandboxHookResponse {
                resources: Some(LinuxContainerResources { cpu_shares: 2, ..Default::default() }),
                ..Default::default()
            },
        );
        assert_eq!(none.resources.map(|r| r.cpu_shares), Some(2), "default resources put in first");
        let mut echoed = PodSandboxHookRequest { resources: Some(resources()), ..Default::default() };
        assert!(!pod_response_changes(&echoed, &echo_pod(&echoed)));
        apply_pod_response(&mut echoed, &PodSandboxHookResponse::default());
        assert_eq!(echoed.resources, Some(resources()), "absent resources: no change");
    }

    #[test]
    fn update_merge_keeps_oom_and_cpuset_when_not_sent() {
        let mut cur = resources();
        merge_update(&mut cur, &LinuxContainerResources { cpu_shares: 2, oom_score_adj: -7, ..Default::default() });
        assert_eq!(cur, LinuxContainerResources { cpu_shares: 2, ..resources() });
    }

    fn arb_resources() -> impl Strategy<Value = LinuxContainerResources> {
        (
            (-1i64..1_000_000, -1i64..1_000_000, 0i64..100_000, -1i64..(1 << 40)),
            (-1000i64..=1000, "[0-9,-]{0,6}", "[0-9]{0,2}", 0i64..(1 << 40)),
            proptest::collection::btree_map("[a-z.]{1,8}", "[0-9]{1,4}", 0..3),
        )
            .prop_map(|((period, quota, shares, memory), (oom, cpus, mems, swap), unified)| {
                LinuxContainerResources {
                    cpu_period: period,
                    cpu_quota: quota,
                    cpu_shares: shares,
                    memory_limit_in_bytes: memory,
                    oom_score_adj: oom,
                    cpuset_cpus: cpus,
                    cpuset_mems: mems,
                    unified,
                    memory_swap_limit_in_bytes: swap,
                    ..Default::default()
                }
            })
    }

    proptest! {
        /// koordlet echoes the request: merging the echo changes nothing.
        #[test]
        fn echo_is_identity(r in arb_resources(), anns in proptest::collection::btree_map("[a-z]{1,4}", "[a-z]{0,4}", 0..4)) {
            let req = ContainerResourceHookRequest {
                container_resources: Some(r),
                container_annotations: anns,
                ..Default::default()
            };
            let mut merged = req.clone();
            apply_container_response(&mut merged, &echo_container(&req));
            prop_assert_eq!(merged.container_annotations, req.container_annotations.clone());
            let (m, o) = (merged.container_resources.unwrap(), req.container_resources.unwrap());
            // Everything but a negative memory limit / zero-or-negative values the rules skip
            // is already equal, so the merge is the identity.
            prop_assert_eq!(m, o);
        }

        /// `container_response_changes` says exactly whether the rule changes the request.
        #[test]
        fn container_changes_is_exact(
            cur in proptest::option::of(arb_resources()),
            answer in proptest::option::of(arb_resources()),
            anns in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            answer_anns in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            envs in proptest::collection::btree_map("[A-C]{0,1}", "[0-1]{1}", 0..3),
            answer_envs in proptest::collection::btree_map("[A-C]{0,1}", "[0-1]{1}", 0..3),
            parents in ("(/a|/b)?", "(/a|/b)?"),
            echo in any::<bool>(),
            out_of_range_oom in proptest::option::of(prop_oneof![Just(-1001i64), Just(5000)]),
        ) {
            let req = ContainerResourceHookRequest {
                container_annotations: anns,
                container_envs: envs,
                pod_cgroup_parent: parents.0,
                container_resources: cur,
                ..Default::default()
            };
            let resp = if echo {
                echo_container(&req)
            } else {
                ContainerResourceHookResponse {
                    container_annotations: answer_anns,
                    container_envs: answer_envs,
                    pod_cgroup_parent: parents.1,
                    container_resources: answer,
                }
            };
            // Now and then an out-of-range oom_score_adj, which the rule ignores (on an echo too).
            let mut resp = resp;
            if let (Some(oom), Some(r)) = (out_of_range_oom, resp.container_resources.as_mut()) {
                r.oom_score_adj = oom;
            }
            let mut merged = req.clone();
            apply_container_response(&mut merged, &resp);
            prop_assert_eq!(container_response_changes(&req, &resp), merged != req);
        }

        /// `pod_response_changes` says exactly whether the rule changes the request.
        #[test]
        fn pod_changes_is_exact(
            labels in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            answer_labels in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            anns in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            answer_anns in proptest::collection::btree_map("[a-c]{1}", "[0-1]{1}", 0..3),
            parents in ("(/a|/b)?", "(/a|/b)?"),
            echo in any::<bool>(),
            res in proptest::option::of(arb_resources()),
            answer_res in proptest::option::of(arb_resources()),
        ) {
            let req = PodSandboxHookRequest {
                labels, annotations: anns, cgroup_parent: parents.0, resources: res, ..Default::default()
            };
            let resp = if echo {
                echo_pod(&req)
            } else {
                PodSandboxHookResponse {
                    labels: answer_labels, annotations: answer_anns, cgroup_parent: parents.1, resources: answer_res
                }
            };
            let mut merged = req.clone();
            apply_pod_response(&mut merged, &resp);
            prop_assert_eq!(pod_response_changes(&req, &resp), merged != req);
        }

        /// Applying the same answer twice gives the same result as once.
        #[test]
        fn idempotent(cur in arb_resources(), answer in arb_resources()) {
            let mut once = cur.clone();
            merge_resources(&mut once, &answer);
            let mut twice = once.clone();
            merge_resources(&mut twice, &answer);
            prop_assert_eq!(once, twice);
        }

        /// Whatever a server answers, hugepage limits are never touched and answered values the
        /// rules accept end up in the result.
        #[test]
        fn accepted_values_win(cur in arb_resources(), answer in arb_resources()) {
            let mut merged = cur.clone();
            merge_resources(&mut merged, &answer);
            prop_assert_eq!(&merged.hugepage_limits, &cur.hugepage_limits);
            let shares = if answer.cpu_shares > 0 { answer.cpu_shares } else { cur.cpu_shares };
            prop_assert_eq!(merged.cpu_shares, shares);
            let quota = if answer.cpu_quota != 0 { answer.cpu_quota } else { cur.cpu_quota };
            prop_assert_eq!(merged.cpu_quota, quota);
            prop_assert_eq!(&merged.cpuset_cpus, &answer.cpuset_cpus);
            for (k, v) in &answer.unified { prop_assert_eq!(merged.unified.get(k), Some(v)); }
            for k in cur.unified.keys() { prop_assert!(merged.unified.contains_key(k)); }
        }
    }
}
