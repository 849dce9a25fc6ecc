//! The small part of the gRPC-over-HTTP/2 wire protocol the proxy needs to read and write itself:
//! status codes, the `grpc-timeout` header, the trailers-only responses it answers with when
//! it cannot reach the backend, and the length-prefixed (possibly compressed) message of a unary
//! call (gRPC's `PROTOCOL-HTTP2.md`, `compression.md`).
//!
//! Everything else about a call (body frames, metadata, trailers) passes through untouched.

pub mod backend;
pub mod hook_client;
pub mod unary_call;

use std::io::Read;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response};

pub use hook_api::status::{Code, Status};

/// The user agent of the calls the proxy makes itself: to hook servers, and its own calls to the
/// runtime ([`unary_call::own_call`]).
pub const USER_AGENT: &str = concat!("runtime-proxy/", env!("CARGO_PKG_VERSION"));

/// Reads `grpc-status` from a header or trailer map; `None` when absent or not a number.
pub fn code_from_headers(headers: &HeaderMap) -> Option<Code> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok().map(Code)
}

/// The status carried by a header or trailer map (`grpc-status`, `grpc-message` as sent,
/// still percent-encoded); `None` without `grpc-status`.
pub fn status_from_headers(headers: &HeaderMap) -> Option<Status> {
    let code = code_from_headers(headers)?;
    let message = headers.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("");
    Some(Status::new(code, message))
}

/// A [`Status`] on the HTTP/2 wire of gRPC: as trailers, or as a trailers-only response.
pub trait StatusHeaders {
    /// The head of a trailers-only gRPC response (sent with END_STREAM, no body): HTTP 200,
    /// `content-type: application/grpc`, `grpc-status` and percent-encoded `grpc-message`. This
    /// is what gRPC servers send for an error before any message, so every gRPC client decodes
    /// it as this status.
    fn trailers_only(&self) -> Response<()>;
    /// The trailers that end a response with this status: `grpc-status` and percent-encoded
    /// `grpc-message` (for a response whose head, and maybe messages, went out already).
    fn trailers(&self) -> HeaderMap;
}

impl StatusHeaders for Status {
    fn trailers_only(&self) -> Response<()> {
        let mut resp = Response::new(());
        *resp.headers_mut() = self.trailers();
        resp.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        resp
    }

    fn trailers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("grpc-status", HeaderValue::from(self.code.0));
        if let Ok(v) = HeaderValue::from_str(&percent_encode(&self.message)) {
            h.insert("grpc-message", v);
        }
        h
    }
}

/// Percent-encodes a `grpc-message` value: bytes outside printable ASCII (0x20..=0x7E) and `%`
/// become `%XX`, as the gRPC HTTP/2 protocol requires.
pub fn percent_encode(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    for &b in msg.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Parses the `grpc-timeout` header: 1 to 8 ASCII digits and a unit (`H` hours, `M` minutes,
/// `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds). `None` when the header is
/// absent or malformed (then the call has no deadline, as a gRPC server would treat it).
pub fn parse_timeout(headers: &HeaderMap) -> Option<Duration> {
    parse_timeout_value(headers.get("grpc-timeout")?.as_bytes())
}

/// Parses one `grpc-timeout` value (see [`parse_timeout`]).
pub fn parse_timeout_value(value: &[u8]) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    // Split as bytes: a value need not be ASCII, and a split inside a UTF-8 character panics
    // (`1é`, found by fuzz/fuzz_targets/grpc_timeout.rs).
    let (digits, unit) = value.split_at(value.len() - 1);
    // Digits only: `u64::from_str` also takes a leading `+`, so `+5S` was a 5 s deadline
    // (found by fuzz/fuzz_targets/grpc_timeout.rs).
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit[0] {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// A `grpc-timeout` header value for `left`: whole milliseconds (at least 1, so a call with
/// under a millisecond left still has a deadline), or whole seconds from 100 000 s on (the
/// value holds at most 8 digits).
pub fn timeout_value(left: Duration) -> HeaderValue {
    let ms = left.as_millis().max(1);
    let value = if ms < 100_000_000 { format!("{ms}m") } else { format!("{}S", left.as_secs().min(99_999_999)) };
    HeaderValue::from_str(&value).expect("digits and a unit are a valid header value")
}

/// Decodes a `grpc-message` value as sent (see [`percent_encode`]): `%XX` becomes the byte XX,
/// anything else is kept (a `%` not followed by two hex digits too); bytes that are not UTF-8
/// become U+FFFD.
pub fn percent_decode(msg: &str) -> String {
    if !msg.contains('%') {
        return msg.to_owned();
    }
    let b = msg.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: Option<&u8>| c.and_then(|c| (*c as char).to_digit(16));
        match (b[i], hex(b.get(i + 1)), hex(b.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The message encodings (`grpc-encoding`) the proxy can decompress: gzip and deflate (zlib), the
/// two that grpc-go, gRPC C-core and grpc-java ship.
pub const SUPPORTED_ENCODINGS: &str = "gzip, deflate, identity";

/// The one message of a unary call's body (`body` = 1-byte compressed flag, 4-byte big-endian
/// length, message), decompressed when its flag is set, per the `grpc-encoding` header
/// `encoding`. At most `limit` bytes after decompression.
///
/// Returns `Ok(None)` when the body is not exactly one length-prefixed message (empty,
/// truncated, several messages): the caller forwards such a body as it is and lets the backend
/// answer it.
///
/// Errors: `UNIMPLEMENTED` naming the encoding when the flag is set and the encoding is not one
/// of [`SUPPORTED_ENCODINGS`] (as a gRPC server without that decompressor answers); `INTERNAL`
/// when the compressed bytes do not decompress, or the flag is set without a `grpc-encoding`;
/// `RESOURCE_EXHAUSTED` when the message is larger than `limit` once decompressed.
pub fn unary_message(body: &Bytes, encoding: Option<&HeaderValue>, limit: usize) -> Result<Option<Bytes>, Status> {
    if body.len() < 5 || body[0] > 1 {
        return Ok(None);
    }
    let len = (&body[1..5]).get_u32() as usize;
    if body.len() != 5 + len {
        return Ok(None);
    }
    let message = body.slice(5..);
    if body[0] == 0 {
        return Ok(Some(message));
    }
    let name = encoding.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let mut out = Vec::new();
    let read = match name.as_deref() {
        Some("gzip") => flate2::read::GzDecoder::new(&message[..]).take(limit as u64 + 1).read_to_end(&mut out),
        Some("deflate") => flate2::read::ZlibDecoder::new(&message[..]).take(limit as u64 + 1).read_to_end(&mut out),
        Some(other) => {
            let why = format!("message compressed with grpc-encoding {other:?}, which runtime-proxy cannot decompress");
            return Err(Status::new(Code::UNIMPLEMENTED, format!("{why} (it can: {SUPPORTED_ENCODINGS})")));
        }
        None => {
            return Err(Status::new(
                Code::INTERNAL,
                "message flagged as compressed but the call has no grpc-encoding header",
            ))
        }
    };
    let name = name.unwrap_or_default();
    if let Err(e) = read {
        return Err(Status::new(Code::INTERNAL, format!("message does not decompress as grpc-encoding {name}: {e}")));
    }
    if out.len() > limit {
        return Err(Status::new(
            Code::RESOURCE_EXHAUSTED,
            format!("message larger than {limit} bytes once decompressed ({name})"),
        ));
    }
    Ok(Some(out.into()))
}

/// Frames an edited `message` the way the original `body` was framed: compressed again with
/// the call's `encoding` when the original message was compressed (so the backend gets what the
/// client meant to send, and refuses an encoding it lacks just as it would without the proxy),
/// plain otherwise. Only called for bodies [`unary_message`] decoded, so the encoding is gzip
/// or deflate; anything else frames the message plain (flag 0, valid under any `grpc-encoding`).
pub fn reframe(message: &[u8], body: &Bytes, encoding: Option<&HeaderValue>) -> Bytes {
    use std::io::Write;
    let compressed = body.first() == Some(&1);
    let data = match encoding.map(HeaderValue::as_bytes) {
        Some(b"gzip") if compressed => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(message).and_then(|()| e.finish()).ok()
        }
        Some(b"deflate") if compressed => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(message).and_then(|()| e.finish()).ok()
        }
        _ => None,
    };
    match data {
        Some(data) => {
            let mut b = BytesMut::with_capacity(5 + data.len());
            b.put_u8(1);
            b.put_u32(data.len() as u32);
            b.put_slice(&data);
            b.freeze()
        }
        None => frame(message),
    }
}

/// Frames one message as a unary gRPC body, uncompressed (flag 0).
pub fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout(&hdr("1H")), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(&hdr("2M")), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(&hdr("3S")), Some(Duration::from_secs(3)));
        assert_eq!(parse_timeout(&hdr("250m")), Some(Duration::from_millis(250)));
        assert_eq!(parse_timeout(&hdr("99999999u")), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse_timeout(&hdr("7n")), Some(Duration::from_nanos(7)));
        assert_eq!(parse_timeout_value("1é".as_bytes()), None, "a unit that is not ASCII");
        assert_eq!(parse_timeout_value(b"1\xff"), None);
        assert_eq!(parse_timeout(&hdr("123456789S")), None, "more than 8 digits");
        assert_eq!(parse_timeout(&hdr("5x")), None);
        assert_eq!(parse_timeout(&hdr("S")), None);
        assert_eq!(parse_timeout(&HeaderMap::new()), None);
    }

    /// Fuzz finding (fuzz/fuzz_targets/grpc_timeout.rs, fuzz/regressions/grpc_timeout/): a sign is not a digit.
    #[test]
    fn timeout_with_a_sign_is_malformed() {
        assert_eq!(parse_timeout(&hdr("+2222n")), None);
        assert_eq!(parse_timeout(&hdr("+5S")), None);
        assert_eq!(parse_timeout(&hdr("-5S")), None);
    }

    #[test]
    fn message_encoding() {
        assert_eq!(percent_encode("backend unix:///a b"), "backend unix:///a b");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
        for msg in ["", "plain + text", "100% é\n", "%%", "ü%"] {
            assert_eq!(percent_decode(&percent_encode(msg)), msg);
        }
        assert_eq!(percent_decode("50%"), "50%", "an incomplete escape is kept");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%FF"), "\u{FFFD}", "not UTF-8");
    }

    #[test]
    fn timeout_values() {
        assert_eq!(timeout_value(Duration::from_millis(1500)), "1500m");
        assert_eq!(timeout_value(Duration::from_micros(2500)), "2m");
        assert_eq!(timeout_value(Duration::ZERO), "1m");
        assert_eq!(timeout_value(Duration::from_secs(100_000)), "100000S");
        assert_eq!(timeout_value(Duration::MAX), "99999999S");
        for d in [Duration::from_millis(1), Duration::from_millis(99_999_999), Duration::from_secs(100_000)] {
            let mut h = HeaderMap::new();
            h.insert("grpc-timeout", timeout_value(d));
            assert_eq!(parse_timeout(&h), Some(d), "{d:?}");
        }
    }

    #[test]
    fn trailers_only_response() {
        let r = Status::new(Code::UNAVAILABLE, "backend down").trailers_only();
        assert_eq!(r.status(), 200);
        assert_eq!(code_from_headers(r.headers()), Some(Code::UNAVAILABLE));
        assert_eq!(r.headers()["grpc-message"], "backend down");
        assert_eq!(r.headers()["content-type"], "application/grpc");
    }

    #[test]
    fn code_names() {
        assert_eq!(Code::NOT_FOUND.to_string(), "NOT_FOUND");
        assert_eq!(Code(99).name(), "OUT_OF_SPEC");
    }

    fn compressed(encoding: &str, message: &[u8]) -> Bytes {
        use std::io::Write;
        let data = match encoding {
            "gzip" => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(message).unwrap();
                e.finish().unwrap()
            }
            _ => {
                let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(message).unwrap();
                e.finish().unwrap()
            }
        };
        let mut b = BytesMut::new();
        b.put_u8(1);
        b.put_u32(data.len() as u32);
        b.put_slice(&data);
        b.freeze()
    }

    #[test]
    fn unary_messages() {
        let plain = frame(b"abc");
        assert_eq!(unary_message(&plain, None, 10).unwrap().unwrap(), Bytes::from_static(b"abc"));
        let gzip = HeaderValue::from_static("gzip");
        assert_eq!(
            unary_message(&plain, Some(&gzip), 10).unwrap().unwrap(),
            Bytes::from_static(b"abc"),
            "flag 0 under gzip"
        );
        for enc in ["gzip", "deflate"] {
            let body = compressed(enc, b"hello hooks");
            let got = unary_message(&body, Some(&HeaderValue::from_static(enc)), 100).unwrap().unwrap();
            assert_eq!(got, Bytes::from_static(b"hello hooks"), "{enc}");
            let err = unary_message(&body, Some(&HeaderValue::from_static(enc)), 5).unwrap_err();
            assert_eq!(err.code, Code::RESOURCE_EXHAUSTED, "{enc}: {err}");
        }
        for enc in ["gzip", "deflate"] {
            let header = HeaderValue::from_static(enc);
            let again = reframe(b"edited", &compressed(enc, b"original"), Some(&header));
            assert_eq!(again[0], 1, "{enc}: compressed again");
            assert_eq!(unary_message(&again, Some(&header), 100).unwrap().unwrap(), Bytes::from_static(b"edited"));
            assert_eq!(
                reframe(b"edited", &frame(b"original"), Some(&header)),
                frame(b"edited"),
                "{enc}: a plain message stays plain"
            );
        }
        let snappy =
            unary_message(&compressed("gzip", b"x"), Some(&HeaderValue::from_static("snappy")), 10).unwrap_err();
        assert_eq!(snappy.code, Code::UNIMPLEMENTED);
        assert!(snappy.message.contains("\"snappy\""), "{snappy}");
        let garbage = unary_message(&Bytes::from_static(&[1, 0, 0, 0, 2, 7, 7]), Some(&gzip), 10).unwrap_err();
        assert_eq!(garbage.code, Code::INTERNAL, "{garbage}");
        assert_eq!(unary_message(&compressed("gzip", b"x"), None, 10).unwrap_err().code, Code::INTERNAL);
        assert_eq!(unary_message(&Bytes::from_static(&[0, 0, 0, 0, 9]), None, 10).unwrap(), None, "truncated");
        assert_eq!(unary_message(&Bytes::new(), None, 10).unwrap(), None, "empty");
        assert_eq!(unary_message(&Bytes::from_static(&[2, 0, 0, 0, 0]), None, 10).unwrap(), None, "bad flag");
    }
}
