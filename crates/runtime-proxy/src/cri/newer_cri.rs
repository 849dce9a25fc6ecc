//! CRI v1 methods newer than the protos `k8s-cri` 0.11 was generated from, as far as the proxy
//! needs to know them (kubelet 1.33–1.36; field numbers from `kubernetes/cri-api`'s
//! `pkg/apis/runtime/v1/api.proto`).
//!
//! # In-place pod resize
//!
//! `UpdatePodSandboxResources` (cri-api 1.33, KEP-1287 in-place pod resize): unary; kubelet sends
//! it after it resized the pod's cgroup. Intercepted (no hook stage) so that the store's pod
//! resources follow the resize ([`UpdatePodSandboxResourcesRequest`]).
//!
//! # Streaming lists
//!
//! KEP-5825's server-streaming lists (cri-api 1.36, feature gate `CRIListStreaming`):
//! `StreamPodSandboxes`, `StreamContainers`, `StreamContainerStats`, `StreamPodSandboxStats`,
//! `StreamPodSandboxMetrics` (RuntimeService) and `StreamImages` (ImageService), each taking its
//! `List*` twin's filter and answering one item per message. [`is_server_stream`] names them.
//!
//! They are relayed frame by frame like every method the proxy does not intercept; kubelet falls
//! back to the `List*` call when the runtime answers `UNIMPLEMENTED` (containerd 1.7, 2.0).
//! `StreamImages`, when images are served by another socket, is taken over like every
//! ImageService call ([`crate::cri::router::Route::Unary`]): its messages reach the client
//! together, once the stream ended.
//!
//! # Pod checkpoint and restore
//!
//! `CheckpointPod` and `RestorePod` (Kubernetes 1.37 alpha, KEP-5823; cri-api commits
//! "cri-api: Define pod checkpoint and restore messages" and "cri-api: Add pod checkpoint and
//! restore RPCs", the messages at the end of `api.proto` after `CheckpointContainerResponse`):
//! unary RuntimeService calls.
//!
//! * `CheckpointPod(CheckpointPodRequest{pod_sandbox_id = 1, output_path = 2, container_ids = 3,
//!   options = 4}) → CheckpointPodResponse{}`: the runtime pauses the pod's containers, writes
//!   them to `output_path` and resumes them. It creates nothing and changes no resource, so no
//!   hook stage concerns it: relayed as any call the proxy does not intercept.
//! * `RestorePod(`[`RestorePodRequest`]`) → `[`RestorePodResponse`]: the runtime creates a pod
//!   sandbox and its containers (in the CREATED state) from a checkpoint, **without
//!   RunPodSandbox or CreateContainer**: the PreRunPodSandbox and PreCreateContainer hooks never
//!   see the pod. kubelet then calls StartContainer for each container (so PreStartContainer and
//!   later stages run as usual). What the proxy does about that: [`crate::cri::restore`].

use k8s_cri::v1 as cri;

/// `runtime.v1.UpdatePodSandboxResourcesRequest`: the fields the proxy reads. prost skips the
/// others (and any newer ones); the request goes on as its original bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesRequest {
    /// `pod_sandbox_id` (1).
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// `overhead` (2): the pod's overhead (RuntimeClass), if kubelet sends it.
    #[prost(message, optional, tag = "2")]
    pub overhead: Option<cri::LinuxContainerResources>,
    /// `resources` (3): the sum of the pod's container resources after the resize, if kubelet
    /// sends it.
    #[prost(message, optional, tag = "3")]
    pub resources: Option<cri::LinuxContainerResources>,
}

/// `runtime.v1.RestorePodRequest`: the fields the proxy reads (the pod, to tell whether its hooks
/// may be skipped: its skip label, its required hook servers). The others
/// (`checkpoint_path` = 1, `options` = 4, `container_configs` = 5) are skipped by prost; the
/// request goes on as its original bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RestorePodRequest {
    /// `config` (2): the pod's sandbox config as kubelet sends RunPodSandbox's (restore-time pod
    /// UID, cgroup parent, labels, annotations).
    #[prost(message, optional, tag = "2")]
    pub config: Option<crate::cri::hooked_fields::PodSandboxConfig>,
    /// `runtime_handler` (3).
    #[prost(string, tag = "3")]
    pub runtime_handler: String,
}

/// `runtime.v1.RestoredContainer`: one container a RestorePod created.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RestoredContainer {
    /// `name` (1): the container's metadata name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// `container_id` (2): its runtime ID.
    #[prost(string, tag = "2")]
    pub container_id: String,
}

/// `runtime.v1.RestorePodResponse`: what a successful RestorePod created.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RestorePodResponse {
    /// `pod_sandbox_id` (1): the restored pod sandbox's ID.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// `restored_containers` (2): one per container of the checkpoint, in the CREATED state.
    #[prost(message, repeated, tag = "2")]
    pub restored_containers: Vec<RestoredContainer>,
}

/// The CRI methods (last part of the gRPC path) that answer with a server stream:
/// GetContainerEvents and KEP-5825's list streams.
pub const SERVER_STREAMS: [&str; 7] = [
    "GetContainerEvents",
    "StreamPodSandboxes",
    "StreamContainers",
    "StreamContainerStats",
    "StreamPodSandboxStats",
    "StreamPodSandboxMetrics",
    "StreamImages",
];

/// True for a call of a CRI server stream (any CRI version: `/runtime.<version>.<Service>/`
/// followed by a name of [`SERVER_STREAMS`]). Such a call cannot be sent on as one unary call
/// (its messages would wait for its end), so the relay never takes one over.
pub fn is_server_stream(path: &str) -> bool {
    let mut parts = path.splitn(3, '/');
    let (Some(""), Some(service), Some(method)) = (parts.next(), parts.next(), parts.next()) else { return false };
    service.starts_with("runtime.") && SERVER_STREAMS.contains(&method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn server_stream_paths() {
        for method in SERVER_STREAMS {
            assert!(is_server_stream(&format!("/runtime.v1.RuntimeService/{method}")), "{method}");
        }
        assert!(is_server_stream("/runtime.v1.ImageService/StreamImages"));
        assert!(is_server_stream("/runtime.v1alpha2.RuntimeService/GetContainerEvents"));
        assert!(!is_server_stream("/runtime.v1.RuntimeService/ListContainers"));
        assert!(!is_server_stream("/runtime.v1.RuntimeService/StreamContainersX"));
        assert!(!is_server_stream("/other.Service/StreamContainers"));
        assert!(!is_server_stream("runtime.v1.RuntimeService/StreamContainers"));
        assert!(!is_server_stream(""));
    }

    /// The field numbers of api.proto: an encoding made by hand, field by field, decodes to the
    /// values put in, and a field the proxy does not read (4, annotations in later proposals) is
    /// skipped.
    #[test]
    fn update_pod_sandbox_resources_layout() {
        let resources =
            cri::LinuxContainerResources { cpu_shares: 1024, memory_limit_in_bytes: 1 << 28, ..Default::default() };
        let overhead = cri::LinuxContainerResources { cpu_shares: 10, ..Default::default() };
        let mut bytes = vec![0x0a, 2, b's', b'b'];
        for (tag, m) in [(0x12u8, &overhead), (0x1a, &resources)] {
            let inner = m.encode_to_vec();
            bytes.push(tag);
            bytes.push(inner.len() as u8);
            bytes.extend_from_slice(&inner);
        }
        bytes.extend_from_slice(&[0x22, 4, 0x0a, 0, 0x12, 0]); // field 4: a map entry ("" → "")
        let req = UpdatePodSandboxResourcesRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(req.pod_sandbox_id, "sb");
        assert_eq!(req.overhead, Some(overhead));
        assert_eq!(req.resources, Some(resources));
    }

    /// RestorePod's field numbers, encoded by hand as api.proto numbers them: the request's
    /// `config` (2) and `runtime_handler` (3) decode past `checkpoint_path` (1), `options` (4)
    /// and `container_configs` (5); the answer's pod sandbox ID (1) and restored containers (2,
    /// each `name` = 1, `container_id` = 2).
    #[test]
    fn restore_pod_layout() {
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "u2".into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            labels: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        let config = config.encode_to_vec();
        let mut bytes = vec![0x0a, 4, b'/', b'c', b'k', b'p']; // checkpoint_path
        bytes.extend_from_slice(&[0x12, config.len() as u8]);
        bytes.extend_from_slice(&config);
        bytes.extend_from_slice(&[0x1a, 4, b'r', b'u', b'n', b'c']);
        bytes.extend_from_slice(&[0x22, 6, 0x0a, 1, b'k', 0x12, 1, b'v']); // options {k: v}
        bytes.extend_from_slice(&[0x2a, 4, 0x0a, 2, 0x0a, 0]); // container_configs [{metadata {}}]
        let req = RestorePodRequest::decode(bytes.as_slice()).unwrap();
        let meta = req.config.as_ref().and_then(|c| c.metadata.as_ref()).unwrap();
        assert_eq!((meta.name.as_str(), meta.uid.as_str(), meta.namespace.as_str()), ("web", "u2", "ns"));
        assert_eq!(req.config.unwrap().labels.get("app").map(Vec::as_slice), Some(&b"web"[..]));
        assert_eq!(req.runtime_handler, "runc");

        let answer =
            [0x0a, 2, b's', b'b', 0x12, 8, 0x0a, 1, b'a', 0x12, 3, b'c', b'-', b'1', 0x12, 4, 0x0a, 0, 0x12, 0];
        let resp = RestorePodResponse::decode(&answer[..]).unwrap();
        assert_eq!(resp.pod_sandbox_id, "sb");
        let containers: Vec<(&str, &str)> =
            resp.restored_containers.iter().map(|c| (c.name.as_str(), c.container_id.as_str())).collect();
        assert_eq!(containers, [("a", "c-1"), ("", "")]);
    }
}
