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

/// Calls the server-streaming method `path` (e.g. `/runtime.v1.RuntimeService/StreamContainers`)
/// with `request` bytes and a 64 MiB message limit. Returns once the response head is in: its
/// metadata, and the stream, which yields each message's bytes as it arrives
/// (`Streaming::message`) and then the trailers (`Streaming::trailers`).
///
/// Errors: the call's status when it fails before any message (a trailers-only answer such as
/// `UNIMPLEMENTED`), `INVALID_ARGUMENT` for a `path` that is not a URI path.
pub async fn server_streaming(
    channel: Channel,
    path: &str,
    request: tonic::Request<Bytes>,
) -> Result<tonic::Response<tonic::Streaming<Bytes>>, Status> {
    let path = PathAndQuery::try_from(path.to_owned()).map_err(|e| Status::invalid_argument(format!("{path}: {e}")))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(64 << 20);
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    grpc.server_streaming(request, path, RawCodec).await
}

/// Field 1 of an encoded message read as a string (e.g. an event's `container_id`), skipping
/// every other field unread; `""` when absent or not a string.
pub fn string_field_1(message: &[u8]) -> String {
    #[derive(Clone, PartialEq, prost::Message)]
    struct First {
        #[prost(string, tag = "1")]
        first: String,
    }
    <First as prost::Message>::decode(message).map(|f| f.first).unwrap_or_default()
}

/// What a plain HTTP/2 call returned: response headers, body bytes, trailers.
#[derive(Debug)]
pub struct Http2Answer {
    /// The response headers.
    pub headers: http::HeaderMap,
    /// The body bytes as received (gRPC-framed for a gRPC call).
    pub body: Bytes,
    /// The trailers; `None` when the response ended without any (e.g. trailers-only).
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
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await?;
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

/// A CRI client that sends its calls the way kubelet's grpc-go does: one connection, each call a
/// HEADERS frame (with a 2-minute `grpc-timeout`) and one DATA frame carrying the message and
/// END_STREAM (tonic's client sends END_STREAM in a frame of its own, which wakes a proxy twice).
#[derive(Clone, Debug)]
pub struct KubeletClient {
    send: hyper::client::conn::http2::SendRequest<http_body_util::Full<Bytes>>,
}

impl KubeletClient {
    /// Connects to the CRI socket `socket`.
    ///
    /// Errors: the socket cannot be connected to, or the HTTP/2 handshake fails.
    pub async fn connect(socket: &std::path::Path) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let stream = tokio::net::UnixStream::connect(socket).await?;
        let (send, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake(hyper_util::rt::TokioIo::new(stream))
            .await?;
        tokio::spawn(conn);
        Ok(KubeletClient { send })
    }

    /// The unary call `path` (e.g. `/runtime.v1.RuntimeService/StartContainer`) with `request`.
    ///
    /// Errors: the call fails, its `grpc-status` is not 0 (the status and message), or its answer
    /// is not one message of type `A`.
    pub async fn unary<A: prost::Message + Default>(
        &self,
        path: &str,
        request: &impl prost::Message,
    ) -> Result<A, String> {
        use http_body_util::{BodyExt, Full};
        let mut body = Vec::with_capacity(5 + request.encoded_len());
        body.push(0);
        body.extend_from_slice(&(request.encoded_len() as u32).to_be_bytes());
        request.encode(&mut body).map_err(|e| e.to_string())?;
        let head = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("grpc-timeout", "120S")
            .header("user-agent", "grpc-go/1.65.0")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let mut send = self.send.clone();
        send.ready().await.map_err(|e| format!("{path}: connection: {e}"))?;
        let answer = send.send_request(head).await.map_err(|e| format!("{path}: {e}"))?;
        let (parts, body) = answer.into_parts();
        let collected = body.collect().await.map_err(|e| format!("{path}: body: {e}"))?;
        let answer =
            Http2Answer { headers: parts.headers, trailers: collected.trailers().cloned(), body: collected.to_bytes() };
        if answer.grpc_status().as_deref() != Some("0") {
            return Err(format!("{path}: grpc-status {:?}: {:?}", answer.grpc_status(), answer.grpc_message()));
        }
        let message = answer.body.get(5..).ok_or_else(|| format!("{path}: no gRPC message in the answer"))?;
        A::decode(message).map_err(|e| format!("{path}: answer: {e}"))
    }
}

/// How a [`handmade_call`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum HandmadeAnswer {
    /// The server answered: the response's DATA payload (gRPC-framed messages).
    Answered(Vec<u8>),
    /// The server reset the stream with this HTTP/2 error code (1 = PROTOCOL_ERROR).
    Reset(u32),
}

/// One gRPC call written byte by byte (connection preface, SETTINGS, a HEADERS frame of HPACK
/// literals, one DATA frame), so that `:authority` can be anything at all — a unix socket path,
/// empty, absent — which HTTP/2 libraries refuse to send. Reads frames until the stream ends.
///
/// Errors: the socket fails, or the connection ends before the stream does.
pub async fn handmade_call(
    socket: &std::path::Path,
    authority: Option<&[u8]>,
    path: &str,
    message: &[u8],
) -> std::io::Result<HandmadeAnswer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    fn int(out: &mut Vec<u8>, mut n: usize) {
        // HPACK integer with a 7-bit prefix (string lengths, no Huffman flag).
        if n < 127 {
            out.push(n as u8);
            return;
        }
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128 + 128) as u8);
            n /= 128;
        }
        out.push(n as u8);
    }
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }
    let mut headers = Vec::new();
    let mut literal = |name: &[u8], value: &[u8]| {
        headers.push(0); // literal header field without indexing, new name
        int(&mut headers, name.len());
        headers.extend_from_slice(name);
        int(&mut headers, value.len());
        headers.extend_from_slice(value);
    };
    literal(b":method", b"POST");
    literal(b":scheme", b"http");
    literal(b":path", path.as_bytes());
    if let Some(a) = authority {
        literal(b":authority", a);
    }
    literal(b"content-type", b"application/grpc");
    literal(b"te", b"trailers");
    let mut body = vec![0];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);

    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[])); // SETTINGS
    out.extend(frame(1, 0x4, 1, &headers)); // HEADERS, END_HEADERS
    out.extend(frame(0, 0x1, 1, &body)); // DATA, END_STREAM
    let mut conn = tokio::net::UnixStream::connect(socket).await?;
    conn.write_all(&out).await?;
    let mut data = Vec::new();
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).await?;
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags, stream) =
            (head[3], head[4], u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff);
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload).await?;
        match (kind, stream) {
            (4, 0) if flags & 0x1 == 0 => conn.write_all(&frame(4, 0x1, 0, &[])).await?, // ACK their SETTINGS
            (6, 0) if flags & 0x1 == 0 => conn.write_all(&frame(6, 0x1, 0, &payload)).await?, // PING ACK
            (3, 1) => {
                return Ok(HandmadeAnswer::Reset(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])))
            }
            (0, 1) => {
                data.extend_from_slice(&payload);
                if flags & 0x1 != 0 {
                    return Ok(HandmadeAnswer::Answered(data));
                }
            }
            (1, 1) if flags & 0x1 != 0 => return Ok(HandmadeAnswer::Answered(data)),
            (7, _) => return Err(std::io::Error::other(format!("GOAWAY: {payload:?}"))),
            _ => {}
        }
    }
}

/// `encoded` (a protobuf message) with the one occurrence of `placeholder`'s bytes replaced by
/// `bytes` of the same length: a way to put bytes that are not UTF-8 into a `string` field
/// (an env value, an annotation value) of a message built with `k8s-cri`'s types, whose
/// `String`s cannot hold them. Length prefixes stay valid because the length does not change.
///
/// Panics (test set-up error) when the lengths differ or `placeholder` does not occur exactly once.
pub fn with_bytes(encoded: &[u8], placeholder: &str, bytes: &[u8]) -> Bytes {
    let needle = placeholder.as_bytes();
    assert_eq!(needle.len(), bytes.len(), "placeholder and bytes must have the same length");
    let hits: Vec<usize> =
        encoded.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "placeholder {placeholder:?} must occur exactly once");
    let mut out = encoded.to_vec();
    out[hits[0]..hits[0] + needle.len()].copy_from_slice(bytes);
    Bytes::from(out)
}

/// Bytes that are not UTF-8 (invalid lead bytes, a lone continuation byte; no NUL, which runc
/// refuses in an env value): what a Secret holding binary data gives an env value via
/// `secretKeyRef`. 8 bytes.
pub const NOT_UTF8: &[u8; 8] = b"\xff\xfebin\x80!!";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_bytes_swaps_in_place() {
        let out = with_bytes(b"\x0a\x08PLACEHLDx", "PLACEHLD", NOT_UTF8);
        assert_eq!(&out[..], b"\x0a\x08\xff\xfebin\x80!!x");
        assert!(std::str::from_utf8(&out[2..10]).is_err());
    }
}
