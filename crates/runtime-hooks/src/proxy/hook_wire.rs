//! Proxy mode's gRPC service, with a request decoder that does not trust a lenient peer.
//!
//! The service is `runtime.v1alpha1.RuntimeHookService`, all seven methods, served by hand
//! (instead of tonic's generated server) for one reason: the decoder. A proxy that passes on
//! what kubelet sent may put bytes that are not UTF-8 into a `string` field — a pod annotation,
//! a container env value from a Secret with binary data — and prost refuses the whole request
//! then, so the container would run without its values under the proxy's `Ignore`. Here the
//! request is decoded in one pass straight into hook-api's types ([`crate::proxy::hook_decode`]), as
//! [`crate::lenient`] describes: map entries (labels, annotations, envs, `unified`) whose key
//! or value is not UTF-8 are left out, so the plugins never see them and the answer never
//! echoes them (both proxies merge these maps per key: what is left out stays as kubelet sent
//! it); the other strings (names, IDs, cgroup parent, cpusets, hugepage sizes — kubelet's own or
//! validated by the API server) are read lossily should one ever not be UTF-8.
//!
//! # What is read and what is answered
//!
//! Only what a plugin reads is decoded ([`crate::proxy::hook_decode`]): of the pod's labels and
//! annotations the keys plugins read, of the container's annotations and envs nothing. The
//! request's bytes (tonic's buffer, not copied) are kept until the answer is sent. The answer
//! echoes what was decoded, overridden by the plugins' change; both proxies merge labels,
//! annotations and envs per key, so what is not echoed stays as kubelet sent it. One exception:
//! koord-runtime-proxy replaces a container's whole env with a non-empty answer's, so when a
//! plugin sets an env (GPUEnvInject) the answer carries every env of the request (those that are
//! UTF-8, straight from the request's bytes: [`ContainerAnswer`]) with the plugins' values over
//! them.
//!
//! # Memory bound
//!
//! Requests of up to [`MAX_MESSAGE_BYTES`] are taken; a larger one is refused before its body
//! is buffered, with `RESOURCE_EXHAUSTED` (gRPC's code for a message over the receiver's limit;
//! tonic's own `OUT_OF_RANGE` is rewritten), and the proxy applies the registration's failure
//! policy. At most [`MAX_CONCURRENT_CALLS`] calls are served at once (their bodies read, decoded,
//! answered); the others wait before their bodies are read, held back by HTTP/2 flow control.
//! A call holds its request's buffer (≤ [`MAX_MESSAGE_BYTES`]) and its answer (small, or up to
//! the request's size when a plugin sets an env), so the calls' memory is at most
//! `MAX_CONCURRENT_CALLS × 2 × MAX_MESSAGE_BYTES` (80 MiB) over the process's base, and
//! `MAX_CONCURRENT_CALLS × MAX_MESSAGE_BYTES` (40 MiB) when no plugin sets envs.
//!
//! gRPC compression is not accepted (runtime-proxy and koord-runtime-proxy send none). Any
//! other path is answered `UNIMPLEMENTED`.

use std::convert::Infallible;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::collections::BTreeMap;

use hook_api::v1alpha1 as api;
use prost::bytes::{Buf, BufMut, Bytes};
use prost::encoding::{
    decode_key, encode_key, encode_varint, encoded_len_varint, key_len, skip_field, DecodeContext, WireType,
};
use prost::{DecodeError, Message};
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::{Request, Response, Status};

use crate::framework::Framework;
use crate::plugin::Stage;
use crate::proxy::hook_decode::{entry_parts, take_delimited, Lenient};

/// Largest hook request taken and answer sent, bytes: 20 MiB, kubelet's CRI message limit (16
/// MiB, `maxMsgSize` of its remote runtime client; runtime-proxy's `--max-request-bytes` default)
/// and 4 MiB for what the proxy adds: the stored pod's labels and annotations (the API server
/// takes at most 256 KiB of annotations, and a whole object of at most 1.5 MiB by etcd's
/// default). kubelet copies a container's preStop handler into the annotation
/// `io.kubernetes.container.preStopHandler`, JSON-escaping each `<` to six bytes, but that is
/// within the CRI request's 16 MiB. A larger request is refused before its body is buffered,
/// `RESOURCE_EXHAUSTED` ([`HookServer`]), and the proxy applies the registration's failure
/// policy. An answer is at most about the request's size (the echoed envs). The bound of the
/// hook server's memory is a multiple of it (this module's documentation, "Memory bound").
pub const MAX_MESSAGE_BYTES: usize = 20 << 20;

/// The gRPC service name.
pub const SERVICE_NAME: &str = "runtime.v1alpha1.RuntimeHookService";

/// Most hook calls served at once (bodies read, decoded and answered); the others wait, their
/// bodies unread. 2: the nodes' hook calls take well under a millisecond each, and each call
/// may hold up to twice [`MAX_MESSAGE_BYTES`] (see the module documentation, "Memory bound").
pub const MAX_CONCURRENT_CALLS: usize = 2;

/// A request as decoded ([`crate::proxy::hook_decode`]) and its wire bytes (tonic's buffer, shared,
/// not copied), from which [`ContainerAnswer`] echoes the envs when a plugin sets one.
#[derive(Clone, Debug, Default)]
pub struct Decoded<T> {
    /// The request, with only what plugins read.
    pub message: T,
    /// The request's encoding.
    pub wire: Bytes,
}

/// Decodes a request `T` leniently, in one pass ([`Lenient`]).
///
/// Errors: the bytes are not protobuf at all (`INVALID_ARGUMENT`, naming the field).
pub fn decode_request<T: Default>(bytes: impl Buf) -> Result<T, Status>
where
    Lenient<T>: Message,
{
    Lenient::<T>::decode(bytes)
        .map(|l| l.0)
        .map_err(|e| Status::invalid_argument(format!("runtime-hooks: undecodable hook request: {e}")))
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
    type Decode = Decoded<T>;
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
        // Once, exactly: growing by doubling would hold up to twice a large answer.
        dst.reserve(item.encoded_len());
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

/// Decodes requests with [`decode_request`], from tonic's buffer taken whole (not copied).
struct HookDecoder<T>(PhantomData<fn() -> T>);

impl<T: Default> Decoder for HookDecoder<T>
where
    Lenient<T>: Message,
{
    type Item = Decoded<T>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Decoded<T>>, Status> {
        let wire = src.copy_to_bytes(src.remaining());
        let message = decode_request::<T>(wire.clone())?;
        Ok(Some(Decoded { message, wire }))
    }
}

/// Field number of `container_envs` in a container hook request and in its answer.
const REQUEST_ENVS: u32 = 9;
const ANSWER_ENVS: u32 = 4;

/// Calls `f` with the key and value of each `container_envs` entry of an encoded container hook
/// request, in wire order.
///
/// Errors: the bytes are not protobuf (never for a request [`decode_request`] took).
fn for_each_env(wire: &[u8], mut f: impl FnMut(&[u8], &[u8])) -> Result<(), DecodeError> {
    let ctx = DecodeContext::default();
    let mut rest = wire;
    while !rest.is_empty() {
        let (tag, wire_type) = decode_key(&mut rest)?;
        if tag == REQUEST_ENVS && wire_type == WireType::LengthDelimited {
            let (key, value) = entry_parts(take_delimited(&mut rest, tag, ctx.clone())?, ctx.clone())?;
            f(key, value);
        } else {
            skip_field(wire_type, tag, &mut rest, ctx.clone())?;
        }
    }
    Ok(())
}

/// Encoded length of a `string` field `tag` of `len` bytes.
fn string_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A container hook answer, and when a plugin set an env, the request's other envs echoed from
/// its wire bytes: each entry whose key and value are UTF-8 and whose key the answer does not
/// set, as an entry of the answer's `container_envs`, so that koord-runtime-proxy (which
/// replaces the whole env with a non-empty answer's) keeps them. Encodes as the answer with
/// those entries added; never decoded.
#[derive(Debug, Default)]
pub struct ContainerAnswer {
    answer: api::ContainerResourceHookResponse,
    /// The request's bytes to echo envs from; empty: none echoed.
    wire: Bytes,
    /// Encoded length of the echoed entries.
    echo_len: usize,
}

impl ContainerAnswer {
    /// `answer` for the request `wire`: the request's envs are echoed when `answer` sets one.
    pub fn new(answer: api::ContainerResourceHookResponse, wire: Bytes) -> ContainerAnswer {
        if answer.container_envs.is_empty() {
            return ContainerAnswer { answer, wire: Bytes::new(), echo_len: 0 };
        }
        let mut echo_len = 0;
        let walked = for_each_env(&wire, |key, value| {
            if let Some(entry) = echoed_entry_len(&answer.container_envs, key, value) {
                echo_len += key_len(ANSWER_ENVS) + encoded_len_varint(entry as u64) + entry;
            }
        });
        match walked {
            Ok(()) => ContainerAnswer { answer, wire, echo_len },
            Err(e) => {
                tracing::warn!("runtime-hooks: the request's envs cannot be echoed: {e}");
                ContainerAnswer { answer, wire: Bytes::new(), echo_len: 0 }
            }
        }
    }

    /// The answer without the echoed envs.
    pub fn answer(&self) -> &api::ContainerResourceHookResponse {
        &self.answer
    }
}

/// The encoded length of the answer entry echoing the request's env `key`=`value`; `None` when
/// it is not echoed (not UTF-8, or the answer sets `key`).
fn echoed_entry_len(set: &BTreeMap<String, String>, key: &[u8], value: &[u8]) -> Option<usize> {
    let (key, _) = hook_api::utf8::utf8_entry(key, value)?;
    if set.contains_key(key) {
        return None;
    }
    let len = |tag, n: usize| if n == 0 { 0 } else { string_field_len(tag, n) };
    Some(len(1, key.len()) + len(2, value.len()))
}

impl Message for ContainerAnswer {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.answer.encode_raw(buf);
        if self.wire.is_empty() {
            return;
        }
        // Walked once already in new(): it cannot fail here.
        let _ = for_each_env(&self.wire, |key, value| {
            let Some(entry) = echoed_entry_len(&self.answer.container_envs, key, value) else { return };
            encode_key(ANSWER_ENVS, WireType::LengthDelimited, buf);
            encode_varint(entry as u64, buf);
            for (tag, bytes) in [(1, key), (2, value)] {
                if !bytes.is_empty() {
                    encode_key(tag, WireType::LengthDelimited, buf);
                    encode_varint(bytes.len() as u64, buf);
                    buf.put_slice(bytes);
                }
            }
        });
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.answer.encoded_len() + self.echo_len
    }

    fn clear(&mut self) {
        *self = ContainerAnswer::default();
    }
}

/// One method: the framework at `stage`.
#[derive(Clone)]
struct Method {
    framework: Arc<Framework>,
    stage: Stage,
}

impl tonic::server::UnaryService<Decoded<api::PodSandboxHookRequest>> for Method {
    type Response = api::PodSandboxHookResponse;
    type Future = std::future::Ready<Result<Response<Self::Response>, Status>>;
    fn call(&mut self, request: Request<Decoded<api::PodSandboxHookRequest>>) -> Self::Future {
        let request = request.into_inner().message;
        std::future::ready(self.framework.pod_hook_owned(self.stage, request).map(Response::new).map_err(Into::into))
    }
}

impl tonic::server::UnaryService<Decoded<api::ContainerResourceHookRequest>> for Method {
    type Response = ContainerAnswer;
    type Future = std::future::Ready<Result<Response<Self::Response>, Status>>;
    fn call(&mut self, request: Request<Decoded<api::ContainerResourceHookRequest>>) -> Self::Future {
        let Decoded { message, wire } = request.into_inner();
        let answer = self.framework.container_hook_owned(self.stage, message);
        std::future::ready(answer.map(|a| Response::new(ContainerAnswer::new(a, wire))).map_err(Into::into))
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
    /// [`MAX_CONCURRENT_CALLS`] permits: one per call served.
    calls: Arc<tokio::sync::Semaphore>,
}

impl HookServer {
    /// Serves `framework`'s stages, [`MAX_CONCURRENT_CALLS`] calls at once.
    pub fn new(framework: Arc<Framework>) -> HookServer {
        HookServer { framework, calls: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_CALLS)) }
    }
}

/// gRPC's code for a message over the receiver's limit (`RESOURCE_EXHAUSTED`, as grpc-go
/// answers) instead of tonic's `OUT_OF_RANGE` for a request over [`MAX_MESSAGE_BYTES`], in a
/// call's status (response headers of a trailers-only answer, or trailers).
fn resource_exhausted_over_limit(headers: &mut http::HeaderMap) {
    let over_limit = Status::from_header_map(headers)
        .is_some_and(|s| s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large"));
    if over_limit {
        let status = Status::resource_exhausted(format!(
            "runtime-hooks: hook request larger than its limit of {MAX_MESSAGE_BYTES} bytes"
        ));
        if let Ok(value) = http::HeaderValue::from_str(&(status.code() as i32).to_string()) {
            headers.insert("grpc-status", value);
        }
        if let Ok(value) = http::HeaderValue::from_str(status.message()) {
            headers.insert("grpc-message", value);
        }
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
        let calls = self.calls.clone();
        Box::pin(async move {
            // Before the body is read: a call waiting here holds no buffer. Never closed. Held
            // until the answer's body is sent (or dropped): the answer may echo the request.
            let permit = calls.acquire_owned().await.ok();
            let response = if pod {
                let codec = HookCodec::<api::PodSandboxHookResponse, api::PodSandboxHookRequest>::default();
                tonic::server::Grpc::new(codec)
                    .apply_max_message_size_config(limits.0, limits.1)
                    .unary(method, req)
                    .await
            } else {
                let codec = HookCodec::<ContainerAnswer, api::ContainerResourceHookRequest>::default();
                tonic::server::Grpc::new(codec)
                    .apply_max_message_size_config(limits.0, limits.1)
                    .unary(method, req)
                    .await
            };
            let mut response = response;
            resource_exhausted_over_limit(response.headers_mut());
            Ok(response.map(move |body| {
                Body::new(http_body_util::BodyExt::map_frame(body, move |mut frame| {
                    let _held = &permit;
                    if let Some(trailers) = frame.trailers_mut() {
                        resource_exhausted_over_limit(trailers);
                    }
                    frame
                }))
            }))
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

    const CLASS: &str = crate::context::QOS_CLASS_KEY;
    const DEVICES: &str = crate::plugins::devices::DEVICE_ALLOCATED;
    const STATUS: &str = crate::plugins::cpuset::RESOURCE_STATUS;

    /// Every field of both requests a plugin reads survives the view when it is UTF-8: the
    /// lenient decoder reads what the strict one reads, less the maps (and keys) no plugin reads.
    #[test]
    fn views_read_every_field_plugins_read() {
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
            labels: map(&[(CLASS, "BE")]),
            annotations: map(&[(DEVICES, "2")]),
            cgroup_parent: "/kubepods".into(),
            overhead: Some(res.clone()),
            resources: Some(res.clone()),
        };
        assert_eq!(decode_request::<api::PodSandboxHookRequest>(pod.encode_to_vec().as_slice()).unwrap(), pod);
        let mut with_others = pod.clone();
        with_others.labels.insert("app".into(), "web".into());
        with_others.annotations.insert("note".into(), "x".into());
        assert_eq!(decode_request::<api::PodSandboxHookRequest>(with_others.encode_to_vec().as_slice()).unwrap(), pod);
        let container = api::ContainerResourceHookRequest {
            pod_meta: Some(meta),
            container_meta: Some(api::ContainerMetadata { name: "c".into(), attempt: 1, id: "id".into() }),
            container_annotations: map(&[("ca", "1")]),
            container_resources: Some(res.clone()),
            pod_resources: Some(res),
            pod_annotations: map(&[(STATUS, "2"), ("pa", "2")]),
            pod_labels: map(&[(CLASS, "3"), ("pl", "3")]),
            pod_cgroup_parent: "/kubepods/pod".into(),
            container_envs: map(&[("E", "4")]),
        };
        let want = api::ContainerResourceHookRequest {
            container_annotations: Default::default(),
            container_envs: Default::default(),
            pod_annotations: map(&[(STATUS, "2")]),
            pod_labels: map(&[(CLASS, "3")]),
            ..container.clone()
        };
        assert_eq!(
            decode_request::<api::ContainerResourceHookRequest>(container.encode_to_vec().as_slice()).unwrap(),
            want
        );
    }

    /// Bytes that are not UTF-8 in an env and an annotation: prost refuses the request, the
    /// view leaves out only those entries.
    #[test]
    fn bytes_are_left_out_not_refused() {
        let req = api::ContainerResourceHookRequest {
            pod_labels: map(&[(CLASS, "BE")]),
            pod_annotations: map(&[(DEVICES, "PLACEHL1"), (STATUS, "yes")]),
            container_envs: map(&[("TOKEN", "PLACEHL2"), ("PATH", "/bin")]),
            ..Default::default()
        };
        let wire = swap(swap(req.encode_to_vec(), "PLACEHL1", NOT_UTF8), "PLACEHL2", NOT_UTF8);
        assert!(api::ContainerResourceHookRequest::decode(wire.as_slice()).is_err(), "the strict decoder refuses it");
        let got = decode_request::<api::ContainerResourceHookRequest>(wire.as_slice()).unwrap();
        assert_eq!(got.pod_annotations, map(&[(STATUS, "yes")]));
        assert!(got.container_envs.is_empty());
        assert_eq!(got.pod_labels, req.pod_labels);
        let e = decode_request::<api::ContainerResourceHookRequest>(&b"\x0a\x7f"[..]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    /// The answer echoes no env when no plugin sets one; when one does, every env of the
    /// request that is UTF-8, with the plugins' values over them, and nothing else changes.
    #[test]
    fn container_answers_echo_the_envs_when_a_plugin_sets_one() {
        let req = api::ContainerResourceHookRequest {
            pod_labels: map(&[(CLASS, "BE")]),
            container_envs: map(&[
                ("TOKEN", "PLACEHL2"),
                ("PATH", "/bin"),
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("EMPTY", ""),
            ]),
            ..Default::default()
        };
        let wire = Bytes::from(swap(req.encode_to_vec(), "PLACEHL2", NOT_UTF8));
        let sparse = api::ContainerResourceHookResponse { pod_cgroup_parent: "/p".into(), ..Default::default() };
        let answer = ContainerAnswer::new(sparse.clone(), wire.clone());
        assert_eq!(answer.encode_to_vec(), sparse.encode_to_vec(), "no plugin set an env: nothing echoed");
        let set = api::ContainerResourceHookResponse {
            container_envs: map(&[("NVIDIA_VISIBLE_DEVICES", "0"), ("NEW", "1")]),
            ..sparse
        };
        let answer = ContainerAnswer::new(set.clone(), wire);
        let encoded = answer.encode_to_vec();
        assert_eq!(encoded.len(), answer.encoded_len());
        let got = api::ContainerResourceHookResponse::decode(encoded.as_slice())
            .expect("the echo is valid protobuf, UTF-8 only");
        let want = map(&[("PATH", "/bin"), ("NVIDIA_VISIBLE_DEVICES", "0"), ("NEW", "1"), ("EMPTY", "")]);
        assert_eq!(got.container_envs, want);
        assert_eq!(
            api::ContainerResourceHookResponse { container_envs: Default::default(), ..got },
            api::ContainerResourceHookResponse { container_envs: Default::default(), ..set }
        );
    }

    proptest::proptest! {
        /// For any maps of strings the view decodes what prost decodes of the keys plugins
        /// read; and bytes that are not UTF-8 put into one env value are left out of the echo
        /// only.
        #[test]
        fn views_agree_with_prost_and_leave_out_only_bytes(
            labels in proptest::collection::btree_map(
                proptest::prop_oneof![proptest::strategy::Just(CLASS.to_string()), "\\PC{0,12}"],
                "\\PC{0,12}",
                0..5,
            ),
            envs in proptest::collection::btree_map("[A-Z]{1,8}", "\\PC{0,12}", 0..5),
        ) {
            let mut req = api::ContainerResourceHookRequest {
                pod_labels: labels,
                container_envs: envs.clone(),
                ..Default::default()
            };
            let got = decode_request::<api::ContainerResourceHookRequest>(req.encode_to_vec().as_slice()).unwrap();
            let read: BTreeMap<String, String> =
                req.pod_labels.iter().filter(|(k, _)| k.as_str() == CLASS).map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
            proptest::prop_assert_eq!(&got.pod_labels, &read);
            req.container_envs.insert("ZZZZZZZZZ".into(), "PLACEHLX".into());
            let wire = Bytes::from(swap(req.encode_to_vec(), "PLACEHLX", b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8"));
            let got = decode_request::<api::ContainerResourceHookRequest>(wire.clone()).unwrap();
            proptest::prop_assert_eq!(&got.pod_labels, &read);
            let set = api::ContainerResourceHookResponse { container_envs: map(&[("a", "1")]), ..Default::default() };
            let answer = ContainerAnswer::new(set, wire).encode_to_vec();
            let echoed = api::ContainerResourceHookResponse::decode(answer.as_slice()).unwrap();
            let mut want = envs;
            want.insert("a".into(), "1".into());
            proptest::prop_assert_eq!(echoed.container_envs, want);
        }
    }

    #[test]
    fn routes() {
        assert_eq!(
            route("/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"),
            Some((Stage::PreRunPodSandbox, true))
        );
        assert_eq!(
            route("/runtime.v1alpha1.RuntimeHookService/PreUpdateContainerResourcesHook"),
            Some((Stage::PreUpdateContainerResources, false))
        );
        assert_eq!(route("/runtime.v1alpha1.RuntimeHookService/Nope"), None);
        assert_eq!(route("/other.Service/PreRunPodSandboxHook"), None);
    }
}
