//! Messages whose strings a pod author controls, decoded without trusting them to be UTF-8.
//!
//! # Why
//!
//! Protobuf `string` fields must hold UTF-8, and prost (like every strict decoder) refuses a
//! whole message when one does not. But runtimes pass on what they were given: containerd 1.6
//! and 1.7 store a pod's annotations and a container's env byte for byte (an env value from a
//! Secret holding binary data via `secretKeyRef`, an annotation written over the API server's
//! protobuf API), and hand them back in `ListPodSandbox`, `ListContainers` and the status calls
//! (containerd 1.7.24's NRI refuses to send them, but a runtime that marshals without checking
//! would put them into NRI events too). One such pod would then make every listing fail, and no
//! pod would be corrected.
//!
//! # How
//!
//! So the messages runtime-hooks reads from a runtime are decoded through views of our own,
//! wire-compatible with the real ones, whose author-controlled fields are `bytes`: maps as
//! repeated [`BytesEntry`] (a map entry's wire form), repeated strings as repeated bytes.
//! Lists are decoded **item by item** ([`decode_items`]), so an item that does not decode at
//! all (malformed protobuf) is skipped with a WARN naming it, never the whole answer.
//!
//! # What plugins see
//!
//! A key or value that is not UTF-8 is **left out** of the maps and env lists plugins get, never replaced
//! lossily: the workspace's one rule, [`hook_api::utf8`], which says why.

use std::collections::BTreeMap;

use hook_api::utf8::utf8_map;
use prost::bytes::Buf;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// One map entry with the key and value as bytes: the wire form of a `map<string, string>`
/// entry (key = 1, value = 2).
#[derive(Clone, PartialEq, Message)]
pub struct BytesEntry {
    /// The key's bytes.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value's bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// [`BytesEntry`]s as a map by the workspace's rule ([`utf8_map`]): an entry that is not UTF-8 is left out.
pub fn entries_map(entries: &[BytesEntry]) -> BTreeMap<String, String> {
    utf8_map(entries.iter().map(|e| (e.key.as_slice(), e.value.as_slice())))
}

/// Bytes for a log line or an ID: lossy (U+FFFD for what is not UTF-8).
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Decodes each item of a repeated message field on its own (shared with NRI's Synchronize:
/// [`nri_plugin::decode_items`]).
pub use nri_plugin::decode_items;

/// A gRPC codec that sends `E` and reads the answer as the view `D` (prost, with the size
/// limits the caller sets on `tonic::client::Grpc`).
#[derive(Debug)]
pub struct ViewCodec<E, D>(std::marker::PhantomData<fn(E) -> D>);

impl<E, D> Default for ViewCodec<E, D> {
    fn default() -> Self {
        ViewCodec(std::marker::PhantomData)
    }
}

impl<E: Message + Send + 'static, D: Message + Default + Send + 'static> Codec for ViewCodec<E, D> {
    type Encode = E;
    type Decode = D;
    type Encoder = ViewEncoder<E>;
    type Decoder = ViewDecoder<D>;
    fn encoder(&mut self) -> Self::Encoder {
        ViewEncoder(std::marker::PhantomData)
    }
    fn decoder(&mut self) -> Self::Decoder {
        ViewDecoder(std::marker::PhantomData)
    }
}

/// The encoding half of [`ViewCodec`].
#[derive(Debug)]
pub struct ViewEncoder<E>(std::marker::PhantomData<fn(E)>);

impl<E: Message> Encoder for ViewEncoder<E> {
    type Item = E;
    type Error = Status;
    fn encode(&mut self, item: E, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst).map_err(|e| Status::internal(e.to_string()))
    }
}

/// The decoding half of [`ViewCodec`].
#[derive(Debug)]
pub struct ViewDecoder<D>(std::marker::PhantomData<fn() -> D>);

impl<D: Message + Default> Decoder for ViewDecoder<D> {
    type Item = D;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        D::decode(bytes).map(Some).map_err(|e| Status::internal(format!("decoding the answer: {e}")))
    }
}

/// Views of CRI v1 answers (`runtime.v1`), field numbers as in `api.proto`; fields not listed
/// are skipped unread (prost skips unknown fields without looking into them).
pub mod cri {
    use crate::lenient::BytesEntry;

    /// `ListPodSandboxResponse`: the items still encoded, for [`crate::lenient::decode_items`].
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        /// `repeated PodSandbox items = 1`.
        #[prost(bytes = "vec", repeated, tag = "1")]
        pub items: Vec<Vec<u8>>,
    }

    /// `PodSandbox` (id 1, metadata 2, labels 5, annotations 6).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        /// Sandbox ID.
        #[prost(bytes = "vec", tag = "1")]
        pub id: Vec<u8>,
        /// Pod metadata.
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
        /// Pod labels.
        #[prost(message, repeated, tag = "5")]
        pub labels: Vec<BytesEntry>,
        /// Pod annotations.
        #[prost(message, repeated, tag = "6")]
        pub annotations: Vec<BytesEntry>,
    }

    /// `PodSandboxMetadata` (name 1, uid 2, namespace 3).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        /// Pod name.
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
        /// Pod UID.
        #[prost(bytes = "vec", tag = "2")]
        pub uid: Vec<u8>,
        /// Pod namespace.
        #[prost(bytes = "vec", tag = "3")]
        pub namespace: Vec<u8>,
    }

    /// `ListContainersResponse`: the containers still encoded.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListContainersResponse {
        /// `repeated Container containers = 1`.
        #[prost(bytes = "vec", repeated, tag = "1")]
        pub containers: Vec<Vec<u8>>,
    }

    /// `Container` (id 1, pod_sandbox_id 2, metadata 3, annotations 9).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Container {
        /// Container ID.
        #[prost(bytes = "vec", tag = "1")]
        pub id: Vec<u8>,
        /// Its sandbox's ID.
        #[prost(bytes = "vec", tag = "2")]
        pub pod_sandbox_id: Vec<u8>,
        /// Container metadata.
        #[prost(message, optional, tag = "3")]
        pub metadata: Option<ContainerMetadata>,
        /// Container annotations.
        #[prost(message, repeated, tag = "9")]
        pub annotations: Vec<BytesEntry>,
    }

    /// `ContainerMetadata` (name 1).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerMetadata {
        /// Kubernetes container name.
        #[prost(bytes = "vec", tag = "1")]
        pub name: Vec<u8>,
    }

    /// `PodSandboxStatusResponse` and `ContainerStatusResponse`: only `info` (2), the verbose
    /// JSON; the status (1), with the object's labels and annotations, is skipped unread.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        /// `map<string, string> info = 2`.
        #[prost(message, repeated, tag = "2")]
        pub info: Vec<BytesEntry>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1 as real;

    const NOT_UTF8: &[u8] = b"\xff\xfebin\x00\x80!";

    /// Encodes `msg`, then puts `bytes` where `placeholder` (same length) is.
    fn swap(msg: &impl Message, placeholder: &str, bytes: &[u8]) -> Vec<u8> {
        let mut out = msg.encode_to_vec();
        let at = out.windows(placeholder.len()).position(|w| w == placeholder.as_bytes()).expect("placeholder");
        out[at..at + bytes.len()].copy_from_slice(bytes);
        out
    }

    fn sandbox(id: &str, annotation: &str) -> real::PodSandbox {
        real::PodSandbox {
            id: id.into(),
            metadata: Some(real::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            labels: [("koordinator.sh/qosClass".to_string(), "BE".to_string())].into(),
            annotations: [("a".to_string(), annotation.to_string()), ("b".to_string(), "ok".to_string())].into(),
            ..Default::default()
        }
    }

    /// A listing with one pod whose annotation is not UTF-8: prost refuses the whole answer,
    /// the view decodes every pod, and leaves out only that value.
    #[test]
    fn a_listing_with_bytes_decodes_item_by_item() {
        let list = real::ListPodSandboxResponse { items: vec![sandbox("s1", "PLACEHLD"), sandbox("s2", "fine")] };
        let wire = swap(&list, "PLACEHLD", NOT_UTF8);
        assert!(real::ListPodSandboxResponse::decode(wire.as_slice()).is_err(), "the strict decoder refuses it");
        let view = cri::ListPodSandboxResponse::decode(wire.as_slice()).unwrap();
        let (pods, bad): (Vec<cri::PodSandbox>, _) = decode_items(&view.items);
        assert!(bad.is_empty());
        assert_eq!(pods.len(), 2);
        let first = entries_map(&pods[0].annotations);
        assert_eq!(first, [("b".to_string(), "ok".to_string())].into(), "the value that is not UTF-8 is left out");
        assert_eq!(entries_map(&pods[1].annotations)["a"], "fine");
        assert_eq!(entries_map(&pods[0].labels)["koordinator.sh/qosClass"], "BE");
        assert_eq!(lossy(&pods[0].metadata.clone().unwrap().name), "p");
    }

    /// An item that is not protobuf at all is named (index and ID) and skipped; the others
    /// decode.
    #[test]
    fn a_broken_item_is_skipped_and_named() {
        let good = sandbox("s2", "fine").encode_to_vec();
        let mut broken = b"\x0a\x02s1".to_vec();
        broken.extend_from_slice(b"\x12\x7f\x01"); // metadata claiming 127 bytes
        let (pods, bad): (Vec<cri::PodSandbox>, _) = decode_items(&[broken, good]);
        assert_eq!(pods.len(), 1);
        assert_eq!(lossy(&pods[0].id), "s2");
        assert_eq!((bad[0].0, bad[0].1.as_str()), (0, "s1"));
    }

    /// The status view reads `info` and never looks into the status with its annotations.
    #[test]
    fn status_info_without_the_status() {
        let resp = real::PodSandboxStatusResponse {
            status: Some(real::PodSandboxStatus {
                id: "s1".into(),
                annotations: [("a".to_string(), "PLACEHLD".to_string())].into(),
                ..Default::default()
            }),
            info: [("info".to_string(), r#"{"config": {}}"#.to_string())].into(),
            ..Default::default()
        };
        let wire = swap(&resp, "PLACEHLD", NOT_UTF8);
        assert!(real::PodSandboxStatusResponse::decode(wire.as_slice()).is_err());
        let view = cri::StatusResponse::decode(wire.as_slice()).unwrap();
        assert_eq!(entries_map(&view.info)["info"], r#"{"config": {}}"#);
    }
}
