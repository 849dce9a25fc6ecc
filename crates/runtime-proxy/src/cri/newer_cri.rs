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
        let resources = cri::LinuxContainerResources { cpu_shares: 1024, memory_limit_in_bytes: 1 << 28, ..Default::default() };
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
}
