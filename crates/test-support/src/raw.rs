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

/// What a plain HTTP/2 call returned: response headers, body bytes, trailers.
#[derive(Debug)]
pub struct Http2Answer {
    pub headers: http::HeaderMap,
    pub body: Bytes,
    pub trailers: Option<http::HeaderMap>,
}

impl Http2Answer {
    /// `grpc-status` from the trailers, or from the headers of a trailers-only answer.
    pub fn grpc_status(&self) -> Option<String> {
        let from = |h: &http::HeaderMap| h.get("grpc-status").map(|v| v.to_str().unwrap_or("?").to_owned());
        self.trailers.as_ref().and_then(from).or_else(|| from(&self.headers))
    }

    /// `grpc-message` from the trailers or headers.
    pub fn grpc_message(&self) -> Option<String> {
        let from = |h: &http::HeaderMap| h.get("grpc-message").map(|v| v.to_str().unwrap_or("?").to_owned());
        self.trailers.as_ref().and_then(from).or_else(|| from(&self.headers))
    }
}

/// One gRPC-shaped HTTP/2 POST to `path` on the unix socket `socket`, with exactly the given
/// extra headers (no client-side deadline enforcement, unlike tonic's channel).
pub async fn http2_call(
    socket: &std::path::Path,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Http2Answer, Box<dyn std::error::Error + Send + Sync>> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::UnixStream::connect(socket).await?;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = http::Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = send.send_request(req.body(Full::new(body))?).await?;
    let (parts, body) = resp.into_parts();
    let collected = body.collect().await?;
    let trailers = collected.trailers().cloned();
    Ok(Http2Answer { headers: parts.headers, body: collected.to_bytes(), trailers })
}
