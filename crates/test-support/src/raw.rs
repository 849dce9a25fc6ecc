//! Raw gRPC calls: any path, request and response as uninterpreted message bytes. For methods the
//! compiled proto does not know and for byte-for-byte comparisons.

use bytes::{Buf, BufMut, Bytes};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Status;

/// A codec that passes message bytes through as they are.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Calls `path` (e.g. `/runtime.v1.RuntimeService/NoSuchMethod`) with `request` bytes and a 64 MiB
/// response limit; returns the response bytes and its metadata (headers and trailers merged).
pub async fn unary(
    channel: Channel,
    path: &'static str,
    request: tonic::Request<Bytes>,
) -> Result<tonic::Response<Bytes>, Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.unary(request, PathAndQuery::from_static(path), RawCodec).await
}
