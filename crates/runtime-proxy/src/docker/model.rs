//! How dockershim / cri-dockerd lay a pod out in Docker containers, and the hook requests read
//! from (and the hooks' changes written into) Docker's JSON — pure functions, unit-tested.
//!
//! * Names: `k8s_<container|POD>_<pod name>_<namespace>_<pod uid>_<attempt>`; the pod's name,
//!   namespace, UID and attempt are only there (Kubernetes names and UIDs contain no `_`).
//! * Labels: `io.kubernetes.docker.type` = `podsandbox` | `container`; a container's
//!   `io.kubernetes.sandbox.id` names its sandbox's Docker ID; pod annotations are stored as
//!   labels prefixed `annotation.`, every other label is a pod (or container) label.
//! * Resources: `HostConfig` (create, inspect) or the update body, Docker's field names for the
//!   CRI's `LinuxContainerResources` (CPU shares, CFS period/quota in µs, memory in bytes).
//! * JSON edits change only the fields a hook changed, keeping every other field (unknown ones
//!   included) as the client sent it.

use std::collections::BTreeMap;

use hook_api::v1alpha1 as hook;
use serde_json::{Map, Value};

use crate::hooks::changes;

/// Label holding the Docker object kind (`podsandbox` or `container`).
pub const TYPE_LABEL: &str = "io.kubernetes.docker.type";
/// Label of a container naming its sandbox's Docker ID.
pub const SANDBOX_ID_LABEL: &str = "io.kubernetes.sandbox.id";
/// Prefix of labels that carry pod (or container) annotations.
pub const ANNOTATION_PREFIX: &str = "annotation.";

/// A container name parsed the dockershim way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeName {
    /// `POD` for a pod sandbox, else the container's name.
    pub container: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub uid: String,
    /// The attempt number (kubelet's restart count of the sandbox or container).
    pub attempt: u32,
}

impl KubeName {
    /// Parses `k8s_<container>_<pod>_<namespace>_<uid>_<attempt>` (a leading `/`, as inspect
    /// prints names, is allowed). `None` for any other name: such containers are not pods'.
    pub fn parse(name: &str) -> Option<KubeName> {
        let parts: Vec<&str> = name.trim_start_matches('/').split('_').collect();
        match parts[..] {
            ["k8s", container, pod, namespace, uid, attempt]
                if [container, pod, namespace, uid].iter().all(|p| !p.is_empty()) =>
            {
                Some(KubeName {
                    container: container.into(),
                    pod: pod.into(),
                    namespace: namespace.into(),
                    uid: uid.into(),
                    attempt: attempt.parse().ok()?,
                })
            }
            _ => None,
        }
    }

    /// The pod's metadata.
    pub fn pod_meta(&self) -> hook::PodSandboxMetadata {
        hook::PodSandboxMetadata {
            name: self.pod.clone(),
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
            attempt: self.attempt,
        }
    }
}

/// Whether a container is a pod sandbox: its type label, else the `POD` name part.
pub fn is_sandbox(labels: &BTreeMap<String, String>, name: &KubeName) -> bool {
    match labels.get(TYPE_LABEL).map(String::as_str) {
        Some("podsandbox") => true,
        Some("container") => false,
        _ => name.container == "POD",
    }
}

/// The `Labels` of a container config (the create body itself, or inspect's `Config`) as a
/// map; non-string values are skipped.
pub fn labels_of(config: Option<&Value>) -> BTreeMap<String, String> {
    config
        .and_then(|c| c.get("Labels"))
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

/// Splits Docker labels into (labels, annotations): `annotation.<key>` labels are annotations.
pub fn split_labels(all: &BTreeMap<String, String>) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    for (k, v) in all {
        match k.strip_prefix(ANNOTATION_PREFIX) {
            Some(a) => annotations.insert(a.to_owned(), v.clone()),
            None => labels.insert(k.clone(), v.clone()),
        };
    }
    (labels, annotations)
}

/// A container config's `Env` (`["K=V", …]`) as key-value pairs, in order; an entry without `=` is a key with
/// an empty value (values may contain `=`).
pub fn envs_of(config: Option<&Value>) -> Vec<(String, String)> {
    config
        .and_then(|c| c.get("Env"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (k.to_owned(), v.to_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The resources in a `HostConfig` or an update body (absent fields are 0 / empty).
pub fn resources_of(obj: Option<&Value>) -> hook::LinuxContainerResources {
    let int = |k: &str| obj.and_then(|o| o.get(k)).and_then(Value::as_i64).unwrap_or(0);
    let text = |k: &str| obj.and_then(|o| o.get(k)).and_then(Value::as_str).unwrap_or("").to_owned();
    hook::LinuxContainerResources {
        cpu_period: int("CpuPeriod"),
        cpu_quota: int("CpuQuota"),
        cpu_shares: int("CpuShares"),
        memory_limit_in_bytes: int("Memory"),
        oom_score_adj: int("OomScoreAdj"),
        cpuset_cpus: text("CpusetCpus"),
        cpuset_mems: text("CpusetMems"),
        memory_swap_limit_in_bytes: int("MemorySwap"),
        ..Default::default()
    }
}

/// Writes into `obj` (a `HostConfig` or an update body) each resource field whose value differs
/// between `before` and `after` the hooks. `with_oom`: whether the object has `OomScoreAdj`
/// (HostConfig does, the update body does not). Returns whether anything was written.
pub fn write_resources(
    obj: &mut Map<String, Value>,
    before: &hook::LinuxContainerResources,
    after: &hook::LinuxContainerResources,
    with_oom: bool,
) -> bool {
    let mut changed = false;
    let numbers = [
        ("CpuPeriod", before.cpu_period, after.cpu_period),
        ("CpuQuota", before.cpu_quota, after.cpu_quota),
        ("CpuShares", before.cpu_shares, after.cpu_shares),
        ("Memory", before.memory_limit_in_bytes, after.memory_limit_in_bytes),
        ("OomScoreAdj", before.oom_score_adj, after.oom_score_adj),
        ("MemorySwap", before.memory_swap_limit_in_bytes, after.memory_swap_limit_in_bytes),
    ];
    for (field, b, a) in numbers {
        if b != a && (with_oom || field != "OomScoreAdj") {
            obj.insert(field.to_owned(), Value::from(a));
            changed = true;
        }
    }
    for (field, b, a) in [
        ("CpusetCpus", &before.cpuset_cpus, &after.cpuset_cpus),
        ("CpusetMems", &before.cpuset_mems, &after.cpuset_mems),
    ] {
        if b != a {
            obj.insert(field.to_owned(), Value::from(a.as_str()));
            changed = true;
        }
    }
    changed
}

/// Keeps the swap limit in step when hooks changed the memory limit but not the swap limit, so
/// dockerd accepts the change (it refuses a memory limit above the swap limit: "Memory limit
/// should be smaller than already set memoryswap limit"). Docker's `MemorySwap` is memory + swap:
/// `-1` unlimited (kept), equal to the old memory limit (no swap, what kubelet asks for) → the
/// new memory limit, `0` (Docker's default: twice the memory) → at create left to dockerd, at an
/// update (where 0 means "unchanged", i.e. still twice the *old* limit) twice the new limit.
pub fn follow_swap(before: &hook::LinuxContainerResources, after: &mut hook::LinuxContainerResources, update: bool) {
    if after.memory_limit_in_bytes == before.memory_limit_in_bytes
        || after.memory_swap_limit_in_bytes != before.memory_swap_limit_in_bytes
    {
        return;
    }
    let (memory, swap) = (after.memory_limit_in_bytes, before.memory_swap_limit_in_bytes);
    after.memory_swap_limit_in_bytes = match swap {
        -1 => -1,
        0 if update && memory > 0 => memory.saturating_mul(2),
        0 => 0,
        s if s == before.memory_limit_in_bytes => memory,
        s => s.max(memory),
    };
}

/// Sets `obj[key]` to an empty object if it is absent or not an object, and returns it.
pub fn object_at<'a>(obj: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let slot = obj.entry(key.to_owned()).or_insert_with(|| Value::Object(Map::new()));
    if !slot.is_object() {
        *slot = Value::Object(Map::new());
    }
    match slot {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

/// The PreRunPodSandbox request for a sandbox container being created (or inspected): pod
/// metadata from its name, labels and annotations from its labels, cgroup parent and resources
/// from its `HostConfig`, runtime handler `docker`.
pub fn pod_request(
    name: &KubeName,
    config: Option<&Value>,
    host_config: Option<&Value>,
) -> hook::PodSandboxHookRequest {
    let (labels, annotations) = split_labels(&labels_of(config));
    hook::PodSandboxHookRequest {
        pod_meta: Some(name.pod_meta()),
        runtime_handler: "docker".into(),
        labels,
        annotations,
        cgroup_parent: host_config.and_then(|h| h.get("CgroupParent")).and_then(Value::as_str).unwrap_or("").to_owned(),
        overhead: None,
        resources: Some(resources_of(host_config)),
    }
}

/// The PreCreateContainer request for a container being created (or inspected): pod fields from
/// `pod` (the stored sandbox; else only the metadata in the container's name), the container's
/// name and attempt, annotations, envs and resources from its config, the pod cgroup parent from
/// its `HostConfig.CgroupParent` when set (else the pod's).
pub fn container_request(
    name: &KubeName,
    pod: Option<&hook::PodSandboxHookRequest>,
    config: Option<&Value>,
    host_config: Option<&Value>,
) -> hook::ContainerResourceHookRequest {
    let (_, annotations) = split_labels(&labels_of(config));
    let pod = pod
        .cloned()
        .unwrap_or_else(|| hook::PodSandboxHookRequest { pod_meta: Some(name.pod_meta()), ..Default::default() });
    hook::ContainerResourceHookRequest {
        pod_meta: pod.pod_meta,
        container_meta: Some(hook::ContainerMetadata {
            name: name.container.clone(),
            attempt: name.attempt,
            id: String::new(),
        }),
        container_annotations: annotations,
        container_resources: Some(resources_of(host_config)),
        pod_resources: pod.resources,
        pod_annotations: pod.annotations,
        pod_labels: pod.labels,
        // The parent the container is created under: its own HostConfig's (what cri-dockerd
        // sends, and where a PreCreateContainer hook's change lands), else the pod's.
        pod_cgroup_parent: host_config
            .and_then(|h| h.get("CgroupParent"))
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .map_or(pod.cgroup_parent, str::to_owned),
        container_envs: envs_of(config).into_iter().collect(),
    }
}

/// Writes the changes PreRunPodSandbox hooks made (`before` → `after`) into a sandbox's create
/// body (Docker's container config fields at the top level, plus `HostConfig`): resources into
/// the pause container's `HostConfig` (`CpuShares`, `CpuQuota`, `CpuPeriod`, `Memory`, …, as
/// koord-runtime-proxy's `HandleCreateContainer` applies the answer's `resources` with
/// `UpdateHostConfigByResource`; here only the fields the merge rules changed, the swap limit
/// following the memory limit), cgroup parent, labels, annotations (as `annotation.` labels).
/// Returns whether anything changed.
pub fn write_pod_changes(
    body: &mut Map<String, Value>,
    before: &hook::PodSandboxHookRequest,
    after: &hook::PodSandboxHookRequest,
) -> bool {
    let mut changed = false;
    let default = hook::LinuxContainerResources::default();
    let (b, a) = (before.resources.as_ref().unwrap_or(&default), after.resources.as_ref().unwrap_or(&default));
    if b != a {
        let mut a = a.clone();
        follow_swap(b, &mut a, false);
        changed |= write_resources(object_at(body, "HostConfig"), b, &a, true);
    }
    if before.cgroup_parent != after.cgroup_parent {
        object_at(body, "HostConfig").insert("CgroupParent".into(), Value::from(after.cgroup_parent.as_str()));
        changed = true;
    }
    changed |= write_labels(body, "", &before.labels, &after.labels);
    changed |= write_labels(body, ANNOTATION_PREFIX, &before.annotations, &after.annotations);
    changed
}

/// Writes the changes PreCreateContainer hooks made into a container's create body: resources
/// into `HostConfig`, the pod cgroup parent into `HostConfig.CgroupParent`, envs into `Env`
/// (existing entries keep their place, new ones follow sorted), container annotations as
/// `annotation.` labels. Returns whether anything changed.
pub fn write_container_changes(
    body: &mut Map<String, Value>,
    before: &hook::ContainerResourceHookRequest,
    after: &hook::ContainerResourceHookRequest,
) -> bool {
    let mut changed = false;
    let default = hook::LinuxContainerResources::default();
    let (b, a) = (
        before.container_resources.as_ref().unwrap_or(&default),
        after.container_resources.as_ref().unwrap_or(&default),
    );
    if b != a {
        let mut a = a.clone();
        follow_swap(b, &mut a, false);
        changed |= write_resources(object_at(body, "HostConfig"), b, &a, true);
    }
    if before.pod_cgroup_parent != after.pod_cgroup_parent {
        object_at(body, "HostConfig").insert("CgroupParent".into(), Value::from(after.pod_cgroup_parent.as_str()));
        changed = true;
    }
    let added = changes::changed_entries(&before.container_envs, &after.container_envs);
    if !added.is_empty() {
        let envs = changes::merged_envs(&envs_of(Some(&Value::Object(body.clone()))), &added);
        let list: Vec<Value> = envs.into_iter().map(|(k, v)| Value::from(format!("{k}={v}"))).collect();
        body.insert("Env".into(), Value::Array(list));
        changed = true;
    }
    changed |= write_labels(body, ANNOTATION_PREFIX, &before.container_annotations, &after.container_annotations);
    changed
}

/// Sets `Labels[prefix + key]` for every entry the hooks added or changed.
fn write_labels(
    body: &mut Map<String, Value>,
    prefix: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> bool {
    let changed = changes::changed_entries(before, after);
    if changed.is_empty() {
        return false;
    }
    let labels = object_at(body, "Labels");
    for (k, v) in changed {
        labels.insert(format!("{prefix}{k}"), Value::from(v));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kube_names() {
        let n = KubeName::parse("/k8s_POD_web_default_1234-abcd_2").unwrap();
        assert_eq!(
            (n.container.as_str(), n.pod.as_str(), n.namespace.as_str(), n.uid.as_str(), n.attempt),
            ("POD", "web", "default", "1234-abcd", 2)
        );
        assert_eq!(KubeName::parse("k8s_main_web_default_u_0").unwrap().container, "main");
        for bad in [
            "web",
            "k8s_POD_web_default_u",
            "k8s_POD_web_default_u_x",
            "k8s_POD_web_default_u_1_extra",
            "k8s__web_default_u_1",
            "x8s_a_b_c_d_1",
        ] {
            assert_eq!(KubeName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn reads_what_cri_dockerd_sends() {
        let body = json!({
            "Env": ["A=1", "EQ=a=b", "BARE"], "Labels": {"io.kubernetes.docker.type": "container", "app": "web", "annotation.team": "x"},
            "HostConfig": {"CpuShares": 700, "Memory": 67108864, "CpuPeriod": 100000, "CpuQuota": 50000, "OomScoreAdj": 5, "CpusetCpus": "0-1", "CgroupParent": "/kubepods/podu"}
        });
        let name = KubeName::parse("k8s_main_web_default_u_1").unwrap();
        assert!(!is_sandbox(&labels_of(Some(&body)), &name));
        let c = container_request(&name, None, Some(&body), body.get("HostConfig"));
        assert_eq!(
            c.container_envs,
            BTreeMap::from([("A".into(), "1".into()), ("EQ".into(), "a=b".into()), ("BARE".into(), String::new())])
        );
        assert_eq!(c.container_annotations, BTreeMap::from([("team".into(), "x".into())]));
        let r = c.container_resources.unwrap();
        assert_eq!(
            (r.cpu_shares, r.memory_limit_in_bytes, r.cpu_period, r.cpu_quota, r.oom_score_adj, r.cpuset_cpus.as_str()),
            (700, 64 << 20, 100_000, 50_000, 5, "0-1")
        );
        assert_eq!(c.pod_meta.unwrap().uid, "u");
        let p = pod_request(&KubeName::parse("k8s_POD_web_default_u_1").unwrap(), Some(&body), body.get("HostConfig"));
        assert_eq!(
            (p.cgroup_parent.as_str(), p.labels.get("app").map(String::as_str)),
            ("/kubepods/podu", Some("web"))
        );
    }

    #[test]
    fn writes_only_what_hooks_changed_and_keeps_unknown_fields() {
        let mut body = json!({
            "Future": {"x": 1},
            "Env": ["B=2", "A=1"], "Labels": {"keep": "me"},
            "HostConfig": {"CpuShares": 512, "Memory": 1024, "Unknown": true}
        });
        let name = KubeName::parse("k8s_main_web_default_u_0").unwrap();
        let before = container_request(&name, None, Some(&body.clone()), body.get("HostConfig"));
        let mut after = before.clone();
        assert!(!write_container_changes(body.as_object_mut().unwrap(), &before, &after), "no change, no write");
        after.container_resources.as_mut().unwrap().cpu_shares = 2048;
        after.container_resources.as_mut().unwrap().cpuset_cpus = "2".into();
        after.container_envs.insert("A".into(), "9".into());
        after.container_envs.insert("C".into(), "3".into());
        after.container_annotations.insert("hooked".into(), "yes".into());
        after.pod_cgroup_parent = "/kubepods/besteffort/podu".into();
        assert!(write_container_changes(body.as_object_mut().unwrap(), &before, &after));
        assert_eq!(
            body,
            json!({
                "Future": {"x": 1},
                "Env": ["B=2", "A=9", "C=3"], "Labels": {"keep": "me", "annotation.hooked": "yes"},
                "HostConfig": {"CpuShares": 2048, "Memory": 1024, "Unknown": true, "CpusetCpus": "2", "CgroupParent": "/kubepods/besteffort/podu"}
            })
        );
    }

    #[test]
    fn update_bodies_have_no_oom_score() {
        let mut update = Map::new();
        let before = hook::LinuxContainerResources { oom_score_adj: 1, cpu_shares: 2, ..Default::default() };
        let after = hook::LinuxContainerResources { oom_score_adj: 5, cpu_shares: 3, ..Default::default() };
        assert!(write_resources(&mut update, &before, &after, false));
        assert_eq!(Value::Object(update), json!({"CpuShares": 3}));
    }

    #[test]
    fn swap_follows_memory() {
        let r = |memory, swap| hook::LinuxContainerResources {
            memory_limit_in_bytes: memory,
            memory_swap_limit_in_bytes: swap,
            ..Default::default()
        };
        let follow = |before: hook::LinuxContainerResources, memory, update| {
            let mut after = before.clone();
            after.memory_limit_in_bytes = memory;
            follow_swap(&before, &mut after, update);
            after.memory_swap_limit_in_bytes
        };
        assert_eq!(follow(r(64, 64), 200, true), 200, "no swap stays no swap");
        assert_eq!(follow(r(64, 0), 200, true), 400, "an update of a default-swap container");
        assert_eq!(follow(r(64, 0), 200, false), 0, "at create dockerd applies its default");
        assert_eq!(follow(r(64, -1), 200, true), -1, "unlimited stays");
        assert_eq!(follow(r(64, 100), 200, true), 200, "never below the memory limit");
        assert_eq!(follow(r(64, 300), 200, true), 300);
        let mut hooked = r(200, 500);
        follow_swap(&r(64, 64), &mut hooked, true);
        assert_eq!(hooked.memory_swap_limit_in_bytes, 500, "a swap the hook set itself is kept");
    }

    #[test]
    fn pod_changes() {
        let mut body = json!({"HostConfig": {"CgroupParent": "/kubepods/podu"}});
        let before = pod_request(
            &KubeName::parse("k8s_POD_web_default_u_0").unwrap(),
            Some(&body.clone()),
            body.get("HostConfig"),
        );
        let mut after = before.clone();
        after.cgroup_parent = "/kubepods/besteffort/podu".into();
        after.labels.insert("l".into(), "1".into());
        after.annotations.insert("a".into(), "2".into());
        assert!(write_pod_changes(body.as_object_mut().unwrap(), &before, &after));
        assert_eq!(
            body,
            json!({"HostConfig": {"CgroupParent": "/kubepods/besteffort/podu"}, "Labels": {"l": "1", "annotation.a": "2"}})
        );
    }

    /// koordlet's PreRunPodSandbox answer for a BE pod (its BatchResource sums) reaches the
    /// pause container's HostConfig, as koord-runtime-proxy applies it; fields the hooks left
    /// alone stay as cri-dockerd sent them.
    #[test]
    fn pod_resources_go_to_the_pause_container() {
        let mut body = json!({"HostConfig": {"CgroupParent": "/kubepods/podu", "CpuShares": 2, "MemorySwap": 0, "OomScoreAdj": -998}});
        let before = pod_request(
            &KubeName::parse("k8s_POD_web_default_u_0").unwrap(),
            Some(&body.clone()),
            body.get("HostConfig"),
        );
        let mut after = before.clone();
        let answer = hook::LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 100_000,
            memory_limit_in_bytes: 128 << 20,
            ..before.resources.clone().unwrap()
        };
        hook_api::merge::apply_pod_response(
            &mut after,
            &hook::PodSandboxHookResponse { resources: Some(answer), ..Default::default() },
        );
        assert!(write_pod_changes(body.as_object_mut().unwrap(), &before, &after));
        assert_eq!(
            body,
            json!({"HostConfig": {"CgroupParent": "/kubepods/podu", "CpuShares": 512, "CpuQuota": 100_000, "Memory": 128 << 20, "MemorySwap": 0, "OomScoreAdj": -998}})
        );
        let unchanged = before.clone();
        assert!(!write_pod_changes(body.as_object_mut().unwrap(), &before, &unchanged), "an echo writes nothing");
    }
}

/// A container the store knows (or dockerd told us about), by its full Docker ID: a pod
/// sandbox (`k8s_POD_…`) or a pod's container, with its hook request.
#[derive(Debug, Clone)]
pub enum DockerObject {
    /// A pod sandbox: its Docker ID and its pod's hook request.
    Sandbox(String, hook::PodSandboxHookRequest),
    /// A pod's container: its Docker ID and its store entry (sandbox ID, hook request).
    Container(String, crate::hooks::store::ContainerEntry),
}

impl DockerObject {
    /// The pod sandbox's Docker ID (the key of the pod's lock).
    pub fn sandbox_id(&self) -> &str {
        match self {
            DockerObject::Sandbox(id, _) => id,
            DockerObject::Container(_, e) => &e.sandbox_id,
        }
    }

    /// The object's full Docker ID (empty until dockerd created it).
    pub fn id(&self) -> &str {
        match self {
            DockerObject::Sandbox(id, _) | DockerObject::Container(id, _) => id,
        }
    }
}
