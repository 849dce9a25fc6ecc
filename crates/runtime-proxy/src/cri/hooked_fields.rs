//! Views of the CRI messages the proxy reads: `runtime.v1` messages (and the same v1alpha2
//! messages, whose layout is the same) with only the fields a hook request is built from, edited
//! in, or recovered from, by their CRI field numbers (`api.proto`).
//!
//! # Why views
//!
//! Two reasons:
//!
//! * **Bytes where a pod author writes.** Env values, label and annotation values are `string` in
//!   older CRI protos, but kubelet sends whatever bytes the pod's Secret or annotation holds (since
//!   Kubernetes 1.34, cri-api's `KeyValue.value` is `bytes`); prost refuses a `string` that is not
//!   UTF-8, and one such value would make the whole request undecodable. Here those values are
//!   bytes ([`Text`] maps, [`KeyValue`]): the request always decodes, a value the hooks did not
//!   change goes on byte for byte, and what the hook protocol (`map<string, string>`, which a Go
//!   hook server refuses to decode when a value is not UTF-8) cannot carry is left out of the hook
//!   request ([`utf8_entries`]).
//! * **Nothing decoded that is not read.** prost skips every other field without allocating or
//!   checking it (kubelet's image, command, mounts, sysctls, security context, a container's
//!   termination message): the request goes on as its original bytes (or edited on the wire,
//!   [`crate::cri::proto_edit`]), so nothing skipped is lost.
//!
//! # Keys and kubelet's values
//!
//! Keys stay `string`: the API server admits only qualified names and C identifiers as label,
//! annotation and env keys; a key that is not UTF-8 leaves the message undecodable, and the
//! interceptor's failure rule decides ([`crate::cri::intercept`]). The messages inside that
//! hold only values kubelet computes (metadata, resources) come from `k8s-cri`.

use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;

/// A label or annotation map with its values as bytes (`map<string, string>` on the wire).
pub type Text = BTreeMap<String, Vec<u8>>;

/// The entries of `map` whose value is UTF-8, as the hook protocol carries them; the others are
/// left out (the workspace's one rule, [`hook_api::utf8`]).
///
/// A `Text` map's keys are unique (prost's decode already kept the last of a repeated key), so
/// the entries are read in place, without [`hook_api::utf8::utf8_map`]'s map of the last entry
/// per key.
pub fn utf8_entries<M: FromIterator<(String, String)>>(map: &Text) -> M {
    map.iter()
        .filter_map(|(k, v)| hook_api::utf8::utf8_entry(k.as_bytes(), v))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// As [`utf8_entries`], taking the map: a UTF-8 value becomes the string without a copy.
pub fn into_utf8_entries(map: Text) -> BTreeMap<String, String> {
    map.into_iter().filter_map(|(k, v)| String::from_utf8(v).ok().map(|v| (k, v))).collect()
}

/// The keys of `map` whose value is not UTF-8 (sorted), for log lines.
pub fn binary_keys(map: &Text) -> Vec<&str> {
    let mut keys: Vec<&str> =
        map.iter().filter(|(_, v)| std::str::from_utf8(v).is_err()).map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys
}

/// `KeyValue` (an env of `ContainerConfig.envs`): `key` (1), `value` (2) as bytes.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct KeyValue {
    /// `key` (1): the env var's name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// `value` (2): the env var's value, any bytes (a slice of the request's buffer, not a copy).
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

impl crate::hooks::changes::EnvEntry for KeyValue {
    fn key(&self) -> &str {
        &self.key
    }
    fn with_text(key: &str, value: &str) -> Self {
        KeyValue::text(key, value)
    }
}

impl KeyValue {
    /// An env whose value is text.
    pub fn text(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.to_owned(), value: Bytes::copy_from_slice(value.as_bytes()) }
    }
}

/// `PodSandboxConfig`: `metadata` (1), `labels` (6), `annotations` (7), `linux` (8).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    /// `metadata` (1): name, uid, namespace, attempt.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<cri::PodSandboxMetadata>,
    /// `labels` (6).
    #[prost(btree_map = "string, bytes", tag = "6")]
    pub labels: Text,
    /// `annotations` (7).
    #[prost(btree_map = "string, bytes", tag = "7")]
    pub annotations: Text,
    /// `linux` (8), in part.
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

/// `LinuxPodSandboxConfig`: `cgroup_parent` (1), `overhead` (4), `resources` (5) (CFS period
/// and quota in microseconds, CPU shares, bytes). `sysctls` (3), which a pod author writes, is
/// skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    /// `cgroup_parent` (1): the pod's cgroup parent as kubelet computed it (a slice or a path).
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    /// `overhead` (4): the pod's RuntimeClass overhead.
    #[prost(message, optional, tag = "4")]
    pub overhead: Option<cri::LinuxContainerResources>,
    /// `resources` (5): the sum of the pod's containers' resources.
    #[prost(message, optional, tag = "5")]
    pub resources: Option<cri::LinuxContainerResources>,
}

/// `RunPodSandboxRequest`: `config` (1), `runtime_handler` (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    /// `config` (1), in part.
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    /// `runtime_handler` (2): the RuntimeClass's handler, `""` for the runtime's default.
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

/// `UpdateContainerResourcesRequest`: `container_id` (1), `linux` (2), `annotations` (4).
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdateContainerResourcesRequest {
    /// `container_id` (1).
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// `linux` (2): the container's new resources (CFS period and quota in microseconds, CPU
    /// shares, bytes).
    #[prost(message, optional, tag = "2")]
    pub linux: Option<cri::LinuxContainerResources>,
    /// `annotations` (4): free-form options of the update (CRI); merged into the hook request's
    /// container annotations.
    #[prost(btree_map = "string, bytes", tag = "4")]
    pub annotations: Text,
}

/// `CreateContainerRequest`: fields 1–3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    /// `pod_sandbox_id` (1).
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// `config` (2), in part.
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    /// `sandbox_config` (3), undecoded, every occurrence (protobuf merges a message field that
    /// occurs more than once): read only for a pod sandbox the store does not know
    /// ([`CreateContainerRequest::sandbox_config`]).
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub sandbox_config: Vec<Bytes>,
}

/// `ContainerConfig`: `metadata` (1), `envs` (6), `annotations` (10), `linux` (15).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    /// `metadata` (1): the container's name and attempt.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<cri::ContainerMetadata>,
    /// `envs` (6), in order.
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<KeyValue>,
    /// `annotations` (10).
    #[prost(btree_map = "string, bytes", tag = "10")]
    pub annotations: Text,
    /// `linux` (15), in part.
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

/// `LinuxContainerConfig`: `resources` (1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    /// `resources` (1): CFS period and quota in microseconds, CPU shares, bytes.
    #[prost(message, optional, tag = "1")]
    pub resources: Option<cri::LinuxContainerResources>,
}

impl CreateContainerRequest {
    /// The request's `sandbox_config`, decoded (its occurrences merged in order); `Ok(None)`
    /// when absent.
    ///
    /// Errors: the decode error of an occurrence that is not a `PodSandboxConfig`.
    pub fn sandbox_config(&self) -> Result<Option<PodSandboxConfig>, prost::DecodeError> {
        if self.sandbox_config.is_empty() {
            return Ok(None);
        }
        let mut config = PodSandboxConfig::default();
        for part in &self.sandbox_config {
            config.merge(part.clone())?;
        }
        Ok(Some(config))
    }
}

/// `PodSandboxStatusResponse`: `status` (1), `info` (2: containerd's verbose JSON, read lossily).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    /// `status` (1), in part.
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// `info` (2): extra information when the request was verbose (containerd: JSON).
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub info: Text,
}

/// `PodSandboxStatus`: `id` (1), `metadata` (2), `labels` (7), `annotations` (8),
/// `runtime_handler` (9).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    /// `id` (1): the pod sandbox's ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `metadata` (2): name, uid, namespace, attempt.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::PodSandboxMetadata>,
    /// `labels` (7).
    #[prost(btree_map = "string, bytes", tag = "7")]
    pub labels: Text,
    /// `annotations` (8).
    #[prost(btree_map = "string, bytes", tag = "8")]
    pub annotations: Text,
    /// `runtime_handler` (9): the RuntimeClass's handler the sandbox runs with.
    #[prost(string, tag = "9")]
    pub runtime_handler: String,
}

/// `ContainerStatusResponse`: `status` (1), `info` (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    /// `status` (1), in part.
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
    /// `info` (2): extra information when the request was verbose (containerd: JSON).
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub info: Text,
}

/// `ContainerStatus`: `id` (1), `metadata` (2), `labels` (12), `annotations` (13), `resources`
/// (16). Its `reason` and `message` (10, 11: the container's termination message, any bytes
/// the container wrote) are skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    /// `id` (1): the container's ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `metadata` (2): the container's name and attempt.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<cri::ContainerMetadata>,
    /// `labels` (12).
    #[prost(btree_map = "string, bytes", tag = "12")]
    pub labels: Text,
    /// `annotations` (13).
    #[prost(btree_map = "string, bytes", tag = "13")]
    pub annotations: Text,
    /// `resources` (16): the container's current resources, when the runtime reports them.
    #[prost(message, optional, tag = "16")]
    pub resources: Option<cri::ContainerResources>,
}

/// `ListPodSandboxResponse`: `items` (1), each read for its ID only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    /// `items` (1): the pod sandboxes.
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<ListedPodSandbox>,
}

/// A listed `PodSandbox`: `id` (1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedPodSandbox {
    /// `id` (1): the pod sandbox's ID.
    #[prost(string, tag = "1")]
    pub id: String,
}

/// `ListContainersResponse`: `containers` (1), each read for its IDs only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListContainersResponse {
    /// `containers` (1): the containers.
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<ListedContainer>,
}

/// A listed `Container`: `id` (1), `pod_sandbox_id` (2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListedContainer {
    /// `id` (1): the container's ID.
    #[prost(string, tag = "1")]
    pub id: String,
    /// `pod_sandbox_id` (2): the ID of the pod sandbox it belongs to.
    #[prost(string, tag = "2")]
    pub pod_sandbox_id: String,
}

/// What a log line can name of an intercepted request of method `name` (e.g. `CreateContainer`)
/// that does not decode as a whole: `pod sandbox <id>` or `container <id>` (field 1), and for
/// RunPodSandbox and CreateContainer the pod's `namespace/name` or the container's name, read
/// from their metadata alone; `""` when not even that decodes.
pub fn target(name: &str, message: &[u8]) -> String {
    match name {
        "RunPodSandbox" => match PodTarget::decode(message).ok().and_then(|t| t.config?.metadata) {
            Some(m) => format!("pod {}/{}", m.namespace, m.name),
            None => String::new(),
        },
        "CreateContainer" => match ContainerTarget::decode(message) {
            Ok(t) => {
                let name = t.config.and_then(|c| c.metadata).map(|m| m.name).unwrap_or_default();
                format!("container {name:?} of pod sandbox {}", t.pod_sandbox_id)
            }
            Err(_) => crate::cri::proto_edit::string_field(message, 1)
                .map(|id| format!("a container of pod sandbox {id}"))
                .unwrap_or_default(),
        },
        _ => match crate::cri::proto_edit::string_field(message, 1) {
            Some(id) if name.contains("PodSandbox") => format!("pod sandbox {id}"),
            Some(id) => format!("container {id}"),
            None => String::new(),
        },
    }
}

/// `RunPodSandboxRequest.config.metadata` alone (for [`target`]).
#[derive(Clone, PartialEq, prost::Message)]
struct PodTarget {
    #[prost(message, optional, tag = "1")]
    config: Option<PodMetadataOnly>,
}

/// `CreateContainerRequest`'s `pod_sandbox_id` and `config.metadata` alone (for [`target`]).
#[derive(Clone, PartialEq, prost::Message)]
struct ContainerTarget {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    config: Option<ContainerMetadataOnly>,
}

/// `PodSandboxConfig.metadata` (1) alone.
#[derive(Clone, PartialEq, prost::Message)]
struct PodMetadataOnly {
    #[prost(message, optional, tag = "1")]
    metadata: Option<cri::PodSandboxMetadata>,
}

/// `ContainerConfig.metadata` (1) alone.
#[derive(Clone, PartialEq, prost::Message)]
struct ContainerMetadataOnly {
    #[prost(message, optional, tag = "1")]
    metadata: Option<cri::ContainerMetadata>,
}

fn text<'a>(map: impl IntoIterator<Item = (&'a String, &'a String)>) -> Text {
    map.into_iter().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect()
}

/// The view of a whole config (for tests, the fuzz targets and Docker mode, which start from
/// `k8s-cri` messages).
impl From<&cri::PodSandboxConfig> for PodSandboxConfig {
    fn from(c: &cri::PodSandboxConfig) -> Self {
        PodSandboxConfig {
            metadata: c.metadata.clone(),
            labels: text(&c.labels),
            annotations: text(&c.annotations),
            linux: c.linux.as_ref().map(|l| LinuxPodSandboxConfig {
                cgroup_parent: l.cgroup_parent.clone(),
                overhead: l.overhead.clone(),
                resources: l.resources.clone(),
            }),
        }
    }
}

/// The view of a whole request (for tests and the fuzz targets).
impl From<&cri::CreateContainerRequest> for CreateContainerRequest {
    fn from(req: &cri::CreateContainerRequest) -> Self {
        let config = req.config.as_ref().map(|c| ContainerConfig {
            metadata: c.metadata.clone(),
            envs: c.envs.iter().map(|kv| KeyValue::text(&kv.key, &kv.value)).collect(),
            annotations: text(&c.annotations),
            linux: c.linux.as_ref().map(|l| LinuxContainerConfig { resources: l.resources.clone() }),
        });
        CreateContainerRequest {
            pod_sandbox_id: req.pod_sandbox_id.clone(),
            config,
            sandbox_config: req.sandbox_config.iter().map(|s| Bytes::from(s.encode_to_vec())).collect(),
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding the view of a full request gives what the view of the decoded request holds:
    /// the field numbers are CRI's, and skipped fields do not disturb the others.
    #[test]
    fn the_view_reads_the_cri_fields() {
        let full = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "c".into(), attempt: 2 }),
                image: Some(cri::ImageSpec { image: "busybox".into(), ..Default::default() }),
                command: vec!["sleep".into()],
                envs: vec![
                    cri::KeyValue { key: "B".into(), value: "2".into() },
                    cri::KeyValue { key: "A".into(), value: "1".into() },
                ],
                mounts: vec![cri::Mount { container_path: "/x".into(), ..Default::default() }],
                labels: [("l".to_string(), "1".to_string())].into(),
                annotations: [("a".to_string(), "1".to_string())].into(),
                log_path: "c.log".into(),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 512,
                        cpuset_cpus: "0-1".into(),
                        ..Default::default()
                    }),
                    security_context: Some(cri::LinuxContainerSecurityContext {
                        masked_paths: vec!["/proc/kcore".into()],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            sandbox_config: Some(cri::PodSandboxConfig {
                hostname: "h".into(),
                labels: [("l".to_string(), "1".to_string())].into(),
                ..Default::default()
            }),
        };
        let view = CreateContainerRequest::decode(full.encode_to_vec().as_slice()).unwrap();
        assert_eq!(view, CreateContainerRequest::from(&full));
        let config = view.config.as_ref().unwrap();
        assert_eq!(config.metadata.as_ref().unwrap().name, "c");
        assert_eq!(config.envs[0].key, "B", "envs keep their order");
        assert_eq!(config.annotations["a"], b"1");
        assert_eq!(config.linux.as_ref().unwrap().resources.as_ref().unwrap().cpu_shares, 512);
        assert_eq!(view.sandbox_config().unwrap().unwrap().labels["l"], b"1");
        // Field 3 twice: merged, as protobuf does (and containerd with it).
        let mut twice = full.encode_to_vec();
        twice.extend(
            cri::CreateContainerRequest {
                sandbox_config: Some(cri::PodSandboxConfig {
                    annotations: [("a".to_string(), "2".to_string())].into(),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let merged = CreateContainerRequest::decode(twice.as_slice()).unwrap().sandbox_config().unwrap().unwrap();
        assert_eq!((&merged.labels["l"][..], &merged.annotations["a"][..]), (&b"1"[..], &b"2"[..]));
        let broken = CreateContainerRequest { sandbox_config: vec![Bytes::from_static(&[0xff])], ..view };
        assert!(broken.sandbox_config().is_err(), "a sandbox_config that does not decode is an error");
    }

    /// An env value and annotation values that are not UTF-8 (what kubelet sends for a Secret
    /// holding binary data) make the `k8s-cri` message undecodable, but not the views: they
    /// hold the bytes as sent, and the hook side sees only the entries that are text.
    #[test]
    fn values_that_are_not_utf8_decode_as_bytes() {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                envs: vec![cri::KeyValue { key: "BIN".into(), value: "ENVVALUE".into() }, cri::KeyValue::default()],
                annotations: [("bin".to_string(), "ANNOTVAL".to_string()), ("text".to_string(), "t".to_string())]
                    .into(),
                ..Default::default()
            }),
            sandbox_config: Some(cri::PodSandboxConfig {
                annotations: [("pod-bin".to_string(), "PODVALUE".to_string())].into(),
                ..Default::default()
            }),
        };
        let mut bytes = req.encode_to_vec();
        for placeholder in ["ENVVALUE", "ANNOTVAL", "PODVALUE"] {
            let at = bytes.windows(8).position(|w| w == placeholder.as_bytes()).unwrap();
            bytes[at..at + 8].copy_from_slice(b"\xff\xfe\x00bin\x80!");
        }
        assert!(cri::CreateContainerRequest::decode(bytes.as_slice()).is_err(), "k8s-cri refuses it");
        let view = CreateContainerRequest::decode(bytes.as_slice()).expect("the view reads it");
        let config = view.config.as_ref().unwrap();
        assert_eq!(&config.envs[0].value[..], b"\xff\xfe\x00bin\x80!");
        assert_eq!(config.annotations["bin"], b"\xff\xfe\x00bin\x80!");
        assert_eq!(
            utf8_entries::<BTreeMap<_, _>>(&config.annotations),
            BTreeMap::from([("text".to_string(), "t".to_string())])
        );
        assert_eq!(binary_keys(&config.annotations), ["bin"]);
        let pod = view.sandbox_config().unwrap().unwrap();
        assert!(utf8_entries::<BTreeMap<_, _>>(&pod.annotations).is_empty());
        // Re-encoding the view's envs gives the bytes kubelet sent.
        let envs = ContainerConfig { envs: config.envs.clone(), ..Default::default() }.encode_to_vec();
        assert!(bytes.windows(envs.len()).any(|w| w == envs.as_slice()));
    }

    #[test]
    fn targets_name_what_can_be_read() {
        let run = cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "p".into(),
                    namespace: "ns".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(target("RunPodSandbox", &run.encode_to_vec()), "pod ns/p");
        let create = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "c".into(), attempt: 0 }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(target("CreateContainer", &create.encode_to_vec()), "container \"c\" of pod sandbox sb");
        let start = cri::StartContainerRequest { container_id: "c1".into() };
        assert_eq!(target("StartContainer", &start.encode_to_vec()), "container c1");
        let stop = cri::StopPodSandboxRequest { pod_sandbox_id: "s1".into() };
        assert_eq!(target("StopPodSandbox", &stop.encode_to_vec()), "pod sandbox s1");
        assert_eq!(
            target("UpdatePodSandboxResources", &stop.encode_to_vec()),
            "pod sandbox s1",
            "field 1 is its sandbox ID too"
        );
        assert_eq!(target("RunPodSandbox", &[0xff]), "");
    }
}
