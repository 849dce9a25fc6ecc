//! CRI v1 methods newer than the protos `k8s-cri` 0.11 was generated from, as far as the proxy
//! needs to know them (kubelet 1.33–1.36; field numbers from `kubernetes/cri-api`'s
//! `pkg/apis/runtime/v1/api.proto`):
//!
//! * `UpdatePodSandboxResources` (cri-api 1.33, KEP-1287 in-place pod resize): unary; kubelet
//!   sends it after it resized the pod's cgroup.
//! * KEP-5825's server-streaming lists (cri-api 1.36, feature gate `CRIListStreaming`):
//!   `StreamPodSandboxes`, `StreamContainers`, `StreamContainerStats`, `StreamPodSandboxStats`,
//!   `StreamPodSandboxMetrics` (RuntimeService) and `StreamImages` (ImageService), each taking
//!   its `List*` twin's filter and answering one item per message. Relayed frame by frame like
//!   every method the proxy does not intercept; kubelet falls back to the `List*` call when the
//!   runtime answers `UNIMPLEMENTED` (containerd 1.7, 2.0). [`is_server_stream`] names them.
//!   (`StreamImages` when images are served by another socket is taken over like every
//!   ImageService call, [`crate::router::Route::Unary`]: its messages reach the client together,
//!   once the stream ended.)

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
}
