//! Proxy mode's gRPC service, with a request decoder that does not trust a lenient peer.
//!
//! The service is `runtime.v1alpha1.RuntimeHookService`, all seven methods, served by hand
//! (instead of tonic's generated server) for one reason: the decoder. A proxy that passes on
//! what kubelet sent may put bytes that are not UTF-8 into a `string` field — a pod annotation,
//! a container env value from a Secret with binary data — and prost refuses the whole request
//! then, so the container would run without its values under the proxy's `Ignore`. Here the
//! request is decoded in one pass straight into hook-api's types ([`crate::hook_decode`]), as
//! [`crate::lenient`] describes: map entries (labels, annotations, envs, `unified`) whose key
//! or value is not UTF-8 are left out, so the plugins never see them and the answer never
//! echoes them (both proxies merge these maps per key: what is left out stays as kubelet sent
//! it); the other strings (names, IDs, cgroup parent, cpusets, hugepage sizes — kubelet's own or
//! validated by the API server) are read lossily should one ever not be UTF-8.
//!
//! Messages of up to [`MAX_MESSAGE_BYTES`] are taken and sent; gRPC compression is not
//! accepted (runtime-proxy and koord-runtime-proxy send none). Any other path is answered
//! `UNIMPLEMENTED`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use hook_api::v1alpha1 as api;
use prost::bytes::Buf;
use prost::Message;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::{Request, Response, Status};

use crate::framework::Framework;
use crate::hook_decode::Lenient;
use crate::plugin::Stage;
use crate::server::MAX_MESSAGE_BYTES;

/// The gRPC service name.
pub const SERVICE_NAME: &str = "runtime.v1alpha1.RuntimeHookService";

/// Decodes a request `T` leniently, in one pass ([`Lenient`]).
///
/// Errors: the bytes are not protobuf at all (`INVALID_ARGUMENT`, naming the field).
pub fn decode_request<T: Default>(bytes: impl Buf) -> Result<T, Status>
where
    Lenient<T>: Message,
{
    Lenient::<T>::decode(bytes).map(|l| l.0).map_err(|e| Status::invalid_argument(format!("runtime-hooks: undecodable hook request: {e}")))
}

/// A codec sending the answer `E` and reading the request `T` leniently.
struct HookCodec<E, T>(PhantomData<fn(E) -> T>);

impl<E, T> Default for HookCodec<E, T> {
    fn default() -> Self {
        HookCodec(PhantomData)
    }
}

impl<E, T> Codec for HookCodec<E, T>
where
    E: Message + Send + 'static,
    T: Default + Send + 'static,
    Lenient<T>: Message,
{
    type Encode = E;
    type Decode = T;
    type Encoder = HookEncoder<E>;
    type Decoder = HookDecoder<T>;
    fn encoder(&mut self) -> Self::Encoder {
        HookEncoder(PhantomData)
    }
    fn decoder(&mut self) -> Self::Decoder {
        HookDecoder(PhantomData)
    }
}

/// Encodes answers with prost.
struct HookEncoder<E>(PhantomData<fn(E)>);

impl<E: Message> Encoder for HookEncoder<E> {
    type Item = E;
    type Error = Status;
    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

/// Decodes requests with [`decode_request`], straight from tonic's buffer.
struct HookDecoder<T>(PhantomData<fn() -> T>);

impl<T: Default> Decoder for HookDecoder<T>
where
    Lenient<T>: Message,
{
    type Item = T;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        decode_request::<T>(src).map(Some)
    }
}

/// One method: the framework at `stage`.
#[derive(Clone)]
struct Method {
    framework: Arc<Framework>,
    stage: Stage,
}

impl tonic::server::UnaryService<api::PodSandboxHookRequest> for Method {
    type Response = api::PodSandboxHookResponse;
    type Future = std::future::Ready<Result<Response<Self::Response>, Status>>;
    fn call(&mut self, request: Request<api::PodSandboxHookRequest>) -> Self::Future {
        std::future::ready(self.framework.pod_hook_owned(self.stage, request.into_inner()).map(Response::new).map_err(Into::into))
    }
}

impl tonic::server::UnaryService<api::ContainerResourceHookRequest> for Method {
    type Response = api::ContainerResourceHookResponse;
    type Future = std::future::Ready<Result<Response<Self::Response>, Status>>;
    fn call(&mut self, request: Request<api::ContainerResourceHookRequest>) -> Self::Future {
        std::future::ready(self.framework.container_hook_owned(self.stage, request.into_inner()).map(Response::new).map_err(Into::into))
    }
}

/// The method at a gRPC path, and whether it takes a pod request.
fn route(path: &str) -> Option<(Stage, bool)> {
    let method = path.strip_prefix("/runtime.v1alpha1.RuntimeHookService/")?;
    Some(match method {
        "PreRunPodSandboxHook" => (Stage::PreRunPodSandbox, true),
        "PostStopPodSandboxHook" => (Stage::PostStopPodSandbox, true),
        "PreCreateContainerHook" => (Stage::PreCreateContainer, false),
        "PreStartContainerHook" => (Stage::PreStartContainer, false),
        "PostStartContainerHook" => (Stage::PostStartContainer, false),
        "PostStopContainerHook" => (Stage::PostStopContainer, false),
        "PreUpdateContainerResourcesHook" => (Stage::PreUpdateContainerResources, false),
        _ => return None,
    })
}

/// The service for tonic's server: `Server::builder().add_service(HookServer::new(framework))`.
#[derive(Clone)]
pub struct HookServer {
    framework: Arc<Framework>,
}

impl HookServer {
    /// Serves `framework`'s stages.
    pub fn new(framework: Arc<Framework>) -> HookServer {
        HookServer { framework }
    }
}

impl tonic::server::NamedService for HookServer {
    const NAME: &'static str = SERVICE_NAME;
}

type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl<B> tonic::codegen::Service<http::Request<B>> for HookServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> BoxFuture {
        let Some((stage, pod)) = route(req.uri().path()) else {
            return Box::pin(async { Ok(Status::unimplemented("runtime-hooks: unknown method").into_http()) });
        };
        let method = Method { framework: self.framework.clone(), stage };
        let limits = (Some(MAX_MESSAGE_BYTES), Some(MAX_MESSAGE_BYTES));
        Box::pin(async move {
            Ok(if pod {
                let codec = HookCodec::<api::PodSandboxHookResponse, api::PodSandboxHookRequest>::default();
                tonic::server::Grpc::new(codec).apply_max_message_size_config(limits.0, limits.1).unary(method, req).await
            } else {
                let codec = HookCodec::<api::ContainerResourceHookResponse, api::ContainerResourceHookRequest>::default();
                tonic::server::Grpc::new(codec).apply_max_message_size_config(limits.0, limits.1).unary(method, req).await
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOT_UTF8: &[u8] = b"\xff\xfebin\x00\x80!";

    fn swap(encoded: Vec<u8>, placeholder: &str, bytes: &[u8]) -> Vec<u8> {
        let mut out = encoded;
        let at = out.windows(placeholder.len()).position(|w| w == placeholder.as_bytes()).expect("placeholder");
        out[at..at + bytes.len()].copy_from_slice(bytes);
        out
    }

    fn map(kv: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Every field of both requests survives the view when it is UTF-8: the lenient decoder
    /// reads what the strict one reads.
    #[test]
    fn views_read_every_field() {
        let res = api::LinuxContainerResources {
            cpu_period: 1,
            cpu_quota: 2,
            cpu_shares: 3,
            memory_limit_in_bytes: 4,
            oom_score_adj: 5,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            hugepage_limits: vec![api::HugepageLimit { page_size: "2MB".into(), limit: 6 }],
            unified: map(&[("memory.high", "7")]),
            memory_swap_limit_in_bytes: 8,
        };
        let meta = api::PodSandboxMetadata { name: "p".into(), uid: "u".into(), namespace: "n".into(), attempt: 9 };
        let pod = api::PodSandboxHookRequest {
            pod_meta: Some(meta.clone()),
            runtime_handler: "runc".into(),
            labels: map(&[("l", "1")]),
            annotations: map(&[("a", "2")]),
            cgroup_parent: "/kubepods".into(),
            overhead: Some(res.clone()),
            resources: Some(res.clone()),
        };
        assert_eq!(decode_request::<api::PodSandboxHookRequest>(pod.encode_to_vec().as_slice()).unwrap(), pod);
        let container = api::ContainerResourceHookRequest {
            pod_meta: Some(meta),
            container_meta: Some(api::ContainerMetadata { name: "c".into(), attempt: 1, id: "id".into() }),
            container_annotations: map(&[("ca", "1")]),
            container_resources: Some(res.clone()),
            pod_resources: Some(res),
            pod_annotations: map(&[("pa", "2")]),
            pod_labels: map(&[("pl", "3")]),
            pod_cgroup_parent: "/kubepods/pod".into(),
            container_envs: map(&[("E", "4")]),
        };
        assert_eq!(decode_request::<api::ContainerResourceHookRequest>(container.encode_to_vec().as_slice()).unwrap(), container);
    }

    /// Bytes that are not UTF-8 in an env and an annotation: prost refuses the request, the
    /// view leaves out only those entries.
    #[test]
    fn bytes_are_left_out_not_refused() {
        let req = api::ContainerResourceHookRequest {
            pod_labels: map(&[("koordinator.sh/qosClass", "BE")]),
            pod_annotations: map(&[("note", "PLACEHL1"), ("keep", "yes")]),
            container_envs: map(&[("TOKEN", "PLACEHL2"), ("PATH", "/bin")]),
            ..Default::default()
        };
        let wire = swap(swap(req.encode_to_vec(), "PLACEHL1", NOT_UTF8), "PLACEHL2", NOT_UTF8);
        assert!(api::ContainerResourceHookRequest::decode(wire.as_slice()).is_err(), "the strict decoder refuses it");
        let got = decode_request::<api::ContainerResourceHookRequest>(wire.as_slice()).unwrap();
        assert_eq!(got.pod_annotations, map(&[("keep", "yes")]));
        assert_eq!(got.container_envs, map(&[("PATH", "/bin")]));
        assert_eq!(got.pod_labels, req.pod_labels);
        let e = decode_request::<api::ContainerResourceHookRequest>(&b"\x0a\x7f"[..]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    proptest::proptest! {
        /// For any maps of strings the view decodes what prost decodes; and bytes that are not
        /// UTF-8 put into one env value leave out that entry only.
        #[test]
        fn views_agree_with_prost_and_leave_out_only_bytes(
            labels in proptest::collection::btree_map("\\PC{0,12}", "\\PC{0,12}", 0..5),
            envs in proptest::collection::btree_map("[A-Z]{1,8}", "\\PC{0,12}", 0..5),
        ) {
            let mut req = api::ContainerResourceHookRequest { pod_labels: labels, container_envs: envs.clone(), ..Default::default() };
            let got = decode_request::<api::ContainerResourceHookRequest>(req.encode_to_vec().as_slice()).unwrap();
            proptest::prop_assert_eq!(&got, &req);
            req.container_envs.insert("ZZZZZZZZZ".into(), "PLACEHLX".into());
            let wire = swap(req.encode_to_vec(), "PLACEHLX", b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8");
            let got = decode_request::<api::ContainerResourceHookRequest>(wire.as_slice()).unwrap();
            proptest::prop_assert_eq!(got.container_envs, envs);
            proptest::prop_assert_eq!(got.pod_labels, req.pod_labels);
        }
    }

    #[test]
    fn routes() {
        assert_eq!(route("/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"), Some((Stage::PreRunPodSandbox, true)));
        assert_eq!(
            route("/runtime.v1alpha1.RuntimeHookService/PreUpdateContainerResourcesHook"),
            Some((Stage::PreUpdateContainerResources, false))
        );
        assert_eq!(route("/runtime.v1alpha1.RuntimeHookService/Nope"), None);
        assert_eq!(route("/other.Service/PreRunPodSandboxHook"), None);
    }
}
