//! Field ownership within one hook chain: which hook server changed which field first, and the
//! conflicts when a later server changes it again to another value.
//!
//! The rule (NRI 0.10+ keeps an owner per adjusted field the same way): within one
//! call's chain of hook servers, the first server whose answer changes a field owns it; a later
//! server whose answer changes it again — to a value other than the current one — conflicts with
//! the owner. "Changes" is exactly what the merge rules ([`crate::merge`]) would change, so an
//! echoed request (koordlet answers with the whole request echoed), the same value, or an empty
//! value where the merge rules read empty as "no change" is not a change and never conflicts.
//!
//! A field is one of (names as in the hook API's messages):
//!
//! | field | key |
//! |---|---|
//! | `labels`, `annotations` (pod stages) | the label or annotation key |
//! | `cgroup_parent` (pod stages) | — |
//! | `container_annotations`, `container_envs` | the annotation key, the variable's name |
//! | `pod_cgroup_parent` | — |
//! | `container_resources.cpu_period`, `.cpu_quota`, `.cpu_shares`, `.memory_limit_in_bytes`, `.memory_swap_limit_in_bytes`, `.oom_score_adj`, `.cpuset_cpus`, `.cpuset_mems` | — |
//! | `container_resources.unified` | the unified cgroup key (`memory.high`) |
//! | `resources.cpu_period`, … (pod stages: the same fields of the pod's `resources`) | as `container_resources` |
//!
//! All functions are pure; the dispatcher applies the policy (warn or refuse).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::fmt;

use crate::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, LinuxContainerResources, PodSandboxHookRequest,
    PodSandboxHookResponse,
};

/// One field of a hook request: its name (a fixed set, see the module doc) and, for map fields,
/// the key. Displayed as `name` or `name[key]` (`container_envs[FOO]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    /// The field's name, e.g. `container_resources.cpu_shares` or `container_envs` (without the
    /// key: a bounded set, fit for a metric label).
    pub name: &'static str,
    /// The map key for map fields (an env name, an annotation key), else `None`.
    pub key: Option<String>,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            Some(key) => write!(f, "{}[{key}]", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// What an answer changes in one field: the value before (`old`) and after (`new`) the merge
/// rules apply it, as text (numbers in decimal; an absent map key is `""`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldChange {
    /// The field.
    pub field: Field,
    /// Its value in the request before the answer.
    pub old: String,
    /// Its value once the answer is applied.
    pub new: String,
}

fn scalar(out: &mut Vec<FieldChange>, name: &'static str, old: impl ToString, new: impl ToString) {
    out.push(FieldChange { field: Field { name, key: None }, old: old.to_string(), new: new.to_string() });
}

/// The keys of `from` that [`crate::merge::merge_map`] would set to another value in `into`,
/// in key order (so that logs and errors are stable), skipping empty keys when `skip_empty_key`.
fn map_changes(
    out: &mut Vec<FieldChange>,
    name: &'static str,
    into: &BTreeMap<String, String>,
    from: &BTreeMap<String, String>,
    skip_empty_key: bool,
) {
    let mut changed: Vec<(&String, &String)> =
        from.iter().filter(|(k, v)| !(skip_empty_key && k.is_empty()) && into.get(*k) != Some(*v)).collect();
    changed.sort();
    for (k, v) in changed {
        let old = into.get(k).cloned().unwrap_or_default();
        out.push(FieldChange { field: Field { name, key: Some(k.clone()) }, old, new: v.clone() });
    }
}

/// What [`crate::merge::merge_resources`] of `answer` would change in `cur`, field by field (same
/// conditions: a period, shares, memory or swap only when > 0, a quota when ≠ 0, `oom_score_adj`
/// when ≠ 0 and within [−1000, 1000], the cpusets always, `unified` per key).
pub fn resources_changes(cur: &LinuxContainerResources, answer: &LinuxContainerResources) -> Vec<FieldChange> {
    let mut out = Vec::new();
    if answer.cpu_period > 0 && answer.cpu_period != cur.cpu_period {
        scalar(&mut out, "container_resources.cpu_period", cur.cpu_period, answer.cpu_period);
    }
    if answer.cpu_quota != 0 && answer.cpu_quota != cur.cpu_quota {
        scalar(&mut out, "container_resources.cpu_quota", cur.cpu_quota, answer.cpu_quota);
    }
    if answer.cpu_shares > 0 && answer.cpu_shares != cur.cpu_shares {
        scalar(&mut out, "container_resources.cpu_shares", cur.cpu_shares, answer.cpu_shares);
    }
    if answer.memory_limit_in_bytes > 0 && answer.memory_limit_in_bytes != cur.memory_limit_in_bytes {
        scalar(
            &mut out,
            "container_resources.memory_limit_in_bytes",
            cur.memory_limit_in_bytes,
            answer.memory_limit_in_bytes,
        );
    }
    if answer.memory_swap_limit_in_bytes > 0 && answer.memory_swap_limit_in_bytes != cur.memory_swap_limit_in_bytes {
        scalar(
            &mut out,
            "container_resources.memory_swap_limit_in_bytes",
            cur.memory_swap_limit_in_bytes,
            answer.memory_swap_limit_in_bytes,
        );
    }
    if answer.oom_score_adj != 0
        && (-1000..=1000).contains(&answer.oom_score_adj)
        && answer.oom_score_adj != cur.oom_score_adj
    {
        scalar(&mut out, "container_resources.oom_score_adj", cur.oom_score_adj, answer.oom_score_adj);
    }
    if answer.cpuset_cpus != cur.cpuset_cpus {
        scalar(&mut out, "container_resources.cpuset_cpus", &cur.cpuset_cpus, &answer.cpuset_cpus);
    }
    if answer.cpuset_mems != cur.cpuset_mems {
        scalar(&mut out, "container_resources.cpuset_mems", &cur.cpuset_mems, &answer.cpuset_mems);
    }
    map_changes(&mut out, "container_resources.unified", &cur.unified, &answer.unified, false);
    out
}

/// What [`crate::merge::apply_pod_response`] of `resp` would change in `req`, field by field
/// (empty when [`crate::merge::pod_response_changes`] is false).
pub fn pod_changes(req: &PodSandboxHookRequest, resp: &PodSandboxHookResponse) -> Vec<FieldChange> {
    let mut out = Vec::new();
    map_changes(&mut out, "labels", &req.labels, &resp.labels, false);
    map_changes(&mut out, "annotations", &req.annotations, &resp.annotations, false);
    if !resp.cgroup_parent.is_empty() && resp.cgroup_parent != req.cgroup_parent {
        scalar(&mut out, "cgroup_parent", &req.cgroup_parent, &resp.cgroup_parent);
    }
    if let Some(answer) = &resp.resources {
        let default = LinuxContainerResources::default();
        out.extend(resources_changes(req.resources.as_ref().unwrap_or(&default), answer).into_iter().map(|mut c| {
            c.field.name = pod_resource_field(c.field.name);
            c
        }));
    }
    out
}

/// The pod-level name of a [`resources_changes`] field: `container_resources.cpu_shares` →
/// `resources.cpu_shares`.
fn pod_resource_field(name: &'static str) -> &'static str {
    match name {
        "container_resources.cpu_period" => "resources.cpu_period",
        "container_resources.cpu_quota" => "resources.cpu_quota",
        "container_resources.cpu_shares" => "resources.cpu_shares",
        "container_resources.memory_limit_in_bytes" => "resources.memory_limit_in_bytes",
        "container_resources.memory_swap_limit_in_bytes" => "resources.memory_swap_limit_in_bytes",
        "container_resources.oom_score_adj" => "resources.oom_score_adj",
        "container_resources.cpuset_cpus" => "resources.cpuset_cpus",
        "container_resources.cpuset_mems" => "resources.cpuset_mems",
        "container_resources.unified" => "resources.unified",
        other => other,
    }
}

/// What [`crate::merge::apply_container_response`] of `resp` would change in `req`, field by
/// field (empty when [`crate::merge::container_response_changes`] is false). A request without
/// resources is compared as default resources, as the merge rule puts those in first.
pub fn container_changes(req: &ContainerResourceHookRequest, resp: &ContainerResourceHookResponse) -> Vec<FieldChange> {
    let mut out = Vec::new();
    map_changes(&mut out, "container_annotations", &req.container_annotations, &resp.container_annotations, false);
    map_changes(&mut out, "container_envs", &req.container_envs, &resp.container_envs, true);
    if !resp.pod_cgroup_parent.is_empty() && resp.pod_cgroup_parent != req.pod_cgroup_parent {
        scalar(&mut out, "pod_cgroup_parent", &req.pod_cgroup_parent, &resp.pod_cgroup_parent);
    }
    if let Some(answer) = &resp.container_resources {
        let default = LinuxContainerResources::default();
        out.extend(resources_changes(req.container_resources.as_ref().unwrap_or(&default), answer));
    }
    out
}

/// A later server's change to a field another server of the chain changed first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The field.
    pub field: Field,
    /// The server that changed the field first (its owner).
    pub owner: String,
    /// The field's value before the later server's answer (the owner's, unless another server
    /// overrode it since).
    pub owner_value: String,
    /// The server whose answer changes the field again.
    pub server: String,
    /// The value that server's answer sets.
    pub value: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "hook servers {} and {} both set {}: {} set {:?}, {} sets {:?}",
            self.owner, self.server, self.field, self.owner, self.owner_value, self.server, self.value
        )
    }
}

/// The owners of the fields changed so far in one chain (one stage of one call): the first
/// server to change each field.
#[derive(Clone, Debug, Default)]
pub struct Owners {
    owners: HashMap<Field, String>,
}

impl Owners {
    /// No field owned yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The conflicts `server`'s `changes` (from [`pod_changes`] or [`container_changes`], against
    /// the request as the servers before it left it) cause: each change of a field another
    /// server owns. Does not record anything (see [`Owners::record`]).
    pub fn conflicts(&self, server: &str, changes: &[FieldChange]) -> Vec<Conflict> {
        changes
            .iter()
            .filter_map(|c| {
                let owner = self.owners.get(&c.field).filter(|owner| owner.as_str() != server)?;
                Some(Conflict {
                    field: c.field.clone(),
                    owner: owner.clone(),
                    owner_value: c.old.clone(),
                    server: server.to_owned(),
                    value: c.new.clone(),
                })
            })
            .collect()
    }

    /// Records `server` as the owner of each field of `changes` that has no owner yet (an owned
    /// field keeps its first owner).
    pub fn record(&mut self, server: &str, changes: &[FieldChange]) {
        for c in changes {
            self.owners.entry(c.field.clone()).or_insert_with(|| server.to_owned());
        }
    }

    /// The owner of `field`, if a server changed it.
    pub fn owner(&self, field: &Field) -> Option<&str> {
        self.owners.get(field).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merge;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn container() -> ContainerResourceHookRequest {
        ContainerResourceHookRequest {
            container_annotations: map(&[("a", "1")]),
            container_envs: map(&[("PATH", "/bin")]),
            pod_cgroup_parent: "/kubepods/pod1".into(),
            container_resources: Some(LinuxContainerResources {
                cpu_shares: 1024,
                cpu_quota: 50_000,
                cpuset_cpus: "0-1".into(),
                unified: map(&[("memory.high", "100")]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn names(changes: &[FieldChange]) -> Vec<String> {
        changes.iter().map(|c| c.field.to_string()).collect()
    }

    /// Runs a chain of (server, answer) over `req` as the dispatcher does, returning the
    /// conflicts in order.
    fn chain(
        mut req: ContainerResourceHookRequest,
        answers: &[(&str, ContainerResourceHookResponse)],
    ) -> Vec<Conflict> {
        let mut owners = Owners::new();
        let mut all = Vec::new();
        for (server, answer) in answers {
            let changes = container_changes(&req, answer);
            all.extend(owners.conflicts(server, &changes));
            owners.record(server, &changes);
            merge::apply_container_response(&mut req, answer);
        }
        all
    }

    #[test]
    fn an_echo_changes_nothing() {
        let req = container();
        assert!(container_changes(&req, &merge::echo_container(&req)).is_empty());
        let pod =
            PodSandboxHookRequest { labels: map(&[("x", "1")]), cgroup_parent: "/a".into(), ..Default::default() };
        assert!(pod_changes(&pod, &merge::echo_pod(&pod)).is_empty());
    }

    #[test]
    fn changes_name_each_field_with_old_and_new() {
        let req = container();
        let mut answer = merge::echo_container(&req);
        let r = answer.container_resources.as_mut().unwrap();
        r.cpu_shares = 2;
        r.cpuset_cpus = String::new();
        r.unified.insert("memory.high".into(), "200".into());
        answer.container_envs.insert("FOO".into(), "bar".into());
        answer.container_envs.insert(String::new(), "ignored".into());
        answer.container_annotations.insert("a".into(), "2".into());
        answer.pod_cgroup_parent = "/other".into();
        let changes = container_changes(&req, &answer);
        assert_eq!(
            names(&changes),
            [
                "container_annotations[a]",
                "container_envs[FOO]",
                "pod_cgroup_parent",
                "container_resources.cpu_shares",
                "container_resources.cpuset_cpus",
                "container_resources.unified[memory.high]",
            ]
        );
        assert_eq!((changes[1].old.as_str(), changes[1].new.as_str()), ("", "bar"));
        assert_eq!((changes[3].old.as_str(), changes[3].new.as_str()), ("1024", "2"));
        assert_eq!(
            (changes[4].old.as_str(), changes[4].new.as_str()),
            ("0-1", ""),
            "an empty cpuset clears it: a change"
        );
    }

    #[test]
    fn empty_values_are_no_change_where_the_merge_rules_say_so() {
        let req = container();
        let sparse = ContainerResourceHookResponse {
            container_resources: Some(LinuxContainerResources {
                cpu_shares: 0,
                cpu_quota: 0,
                memory_limit_in_bytes: -1,
                oom_score_adj: 5000,
                cpuset_cpus: "0-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(container_changes(&req, &sparse).is_empty());
    }

    #[test]
    fn the_changes_are_exactly_what_the_merge_rules_change() {
        let req = container();
        let mut answer = ContainerResourceHookResponse {
            container_resources: Some(LinuxContainerResources {
                cpu_period: 100_000,
                cpuset_cpus: "0-1".into(),
                ..Default::default()
            }),
            container_envs: map(&[("PATH", "/bin"), ("X", "1")]),
            ..Default::default()
        };
        assert_eq!(merge::container_response_changes(&req, &answer), !container_changes(&req, &answer).is_empty());
        answer = merge::echo_container(&req);
        assert_eq!(merge::container_response_changes(&req, &answer), !container_changes(&req, &answer).is_empty());
        let no_resources = ContainerResourceHookRequest { container_resources: None, ..container() };
        let shares = ContainerResourceHookResponse {
            container_resources: Some(LinuxContainerResources { cpu_shares: 5, ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(names(&container_changes(&no_resources, &shares)), ["container_resources.cpu_shares"]);
    }

    fn shares(n: i64) -> ContainerResourceHookResponse {
        let mut answer = merge::echo_container(&container());
        answer.container_resources.as_mut().unwrap().cpu_shares = n;
        answer
    }

    #[test]
    fn a_later_server_setting_another_value_conflicts() {
        let conflicts = chain(container(), &[("a.json", shares(2)), ("b.json", shares(512))]);
        assert_eq!(
            conflicts,
            [Conflict {
                field: Field { name: "container_resources.cpu_shares", key: None },
                owner: "a.json".into(),
                owner_value: "2".into(),
                server: "b.json".into(),
                value: "512".into(),
            }]
        );
        assert_eq!(
            conflicts[0].to_string(),
            r#"hook servers a.json and b.json both set container_resources.cpu_shares: a.json set "2", b.json sets "512""#
        );
    }

    #[test]
    fn the_same_value_or_an_echo_after_the_owner_is_no_conflict() {
        assert!(chain(container(), &[("a.json", shares(2)), ("b.json", shares(2))]).is_empty());
        // b echoes what a left (koordlet's whole-request echo).
        let mut after_a = container();
        merge::apply_container_response(&mut after_a, &shares(2));
        assert!(chain(container(), &[("a.json", shares(2)), ("b.json", merge::echo_container(&after_a))]).is_empty());
        // b answers sparsely with only its own field.
        let sparse_env = ContainerResourceHookResponse { container_envs: map(&[("B", "1")]), ..Default::default() };
        assert!(chain(container(), &[("a.json", shares(2)), ("b.json", sparse_env)]).is_empty());
    }

    #[test]
    fn map_fields_are_owned_per_key() {
        let env =
            |k: &str, v: &str| ContainerResourceHookResponse { container_envs: map(&[(k, v)]), ..Default::default() };
        assert!(chain(container(), &[("a", env("FOO", "1")), ("b", env("BAR", "2"))]).is_empty(), "different keys");
        let conflicts = chain(container(), &[("a", env("FOO", "1")), ("b", env("FOO", "2"))]);
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].field.to_string(), "container_envs[FOO]");
        assert_eq!(conflicts[0].field.name, "container_envs", "the metric label has no key");
        let note = |k: &str, v: &str| ContainerResourceHookResponse {
            container_annotations: map(&[(k, v)]),
            ..Default::default()
        };
        assert_eq!(
            chain(container(), &[("a", note("x", "1")), ("b", note("x", "2"))])[0].field.to_string(),
            "container_annotations[x]"
        );
    }

    #[test]
    fn the_first_owner_keeps_the_field_and_a_server_never_conflicts_with_itself() {
        let conflicts = chain(container(), &[("a", shares(2)), ("b", shares(3)), ("c", shares(4))]);
        assert_eq!(
            conflicts.iter().map(|c| (c.owner.as_str(), c.server.as_str(), c.owner_value.as_str())).collect::<Vec<_>>(),
            [("a", "b", "2"), ("a", "c", "3")]
        );
        let mut owners = Owners::new();
        let changes = container_changes(&container(), &shares(2));
        owners.record("a", &changes);
        assert!(owners.conflicts("a", &changes).is_empty());
        assert_eq!(owners.owner(&changes[0].field), Some("a"));
    }

    #[test]
    fn pod_fields_conflict_too() {
        let req = PodSandboxHookRequest { cgroup_parent: "/kubepods".into(), ..Default::default() };
        let a = PodSandboxHookResponse { cgroup_parent: "/a".into(), labels: map(&[("l", "1")]), ..Default::default() };
        let b = PodSandboxHookResponse {
            cgroup_parent: "/b".into(),
            labels: map(&[("l", "2")]),
            annotations: map(&[("n", "1")]),
            ..Default::default()
        };
        let mut owners = Owners::new();
        let first = pod_changes(&req, &a);
        owners.record("a", &first);
        let mut after = req.clone();
        merge::apply_pod_response(&mut after, &a);
        let second = pod_changes(&after, &b);
        let conflicts: Vec<String> = owners.conflicts("b", &second).iter().map(|c| c.field.to_string()).collect();
        assert_eq!(conflicts, ["labels[l]", "cgroup_parent"]);
        let empty = PodSandboxHookResponse::default();
        assert!(pod_changes(&after, &empty).is_empty(), "an empty cgroup parent is no change");
    }

    /// The pod's `resources` are fields of their own (`resources.cpu_shares`), changed as the
    /// merge rule changes them.
    #[test]
    fn pod_resources_are_fields() {
        let req = PodSandboxHookRequest {
            resources: Some(LinuxContainerResources { cpu_shares: 2, ..Default::default() }),
            ..Default::default()
        };
        let answer = |shares, memory| PodSandboxHookResponse {
            resources: Some(LinuxContainerResources {
                cpu_shares: shares,
                memory_limit_in_bytes: memory,
                ..Default::default()
            }),
            ..Default::default()
        };
        let changes = pod_changes(&req, &answer(512, -1));
        assert_eq!(
            changes.iter().map(|c| c.field.to_string()).collect::<Vec<_>>(),
            ["resources.cpu_shares"],
            "−1 memory is no change"
        );
        assert_eq!((changes[0].old.as_str(), changes[0].new.as_str()), ("2", "512"));
        let mut owners = Owners::new();
        owners.record("a", &changes);
        let mut after = req.clone();
        merge::apply_pod_response(&mut after, &answer(512, -1));
        let conflicts: Vec<String> =
            owners.conflicts("b", &pod_changes(&after, &answer(1024, 0))).iter().map(|c| c.field.to_string()).collect();
        assert_eq!(conflicts, ["resources.cpu_shares"]);
        assert!(pod_changes(&after, &merge::echo_pod(&after)).is_empty(), "the echo changes nothing");
    }
}
