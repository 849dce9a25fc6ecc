//! A unary gRPC body as the interceptor reads it (`runtime_proxy::grpc::unary_message`: 5-byte
//! prefix, gzip/deflate decompression with a size limit) and frames it again after an edit
//! (`reframe`). Never panics; a plain message is the body's tail; a decompressed one is within
//! the limit; and reframing a message then reading it back gives the same message.
//!
//! Input: byte 0 picks the `grpc-encoding` header (none, gzip, deflate, identity, snappy), byte 1
//! the limit (in 256-byte steps, up to 64 KiB), the rest is the body.
#![no_main]

use bytes::Bytes;
use http::HeaderValue;
use libfuzzer_sys::fuzz_target;
use runtime_proxy::grpc::{reframe, unary_message};

fuzz_target!(|data: &[u8]| {
    let [enc, limit, body @ ..] = data else { return };
    let encoding = [None, Some("gzip"), Some("deflate"), Some("identity"), Some("snappy")][usize::from(*enc % 5)]
        .map(HeaderValue::from_static);
    let limit = (usize::from(*limit) + 1) * 256;
    let body = Bytes::copy_from_slice(body);
    let Ok(Some(message)) = unary_message(&body, encoding.as_ref(), limit) else { return };
    if body[0] == 0 {
        assert_eq!(message, body.slice(5..));
    } else {
        assert!(message.len() <= limit, "{} bytes over the limit {limit}", message.len());
    }
    // What the interceptor sends on after an edit reads back as the edited message.
    let edited = [&message[..], b"\x0a\x03new"].concat();
    let framed = reframe(&edited, &body, encoding.as_ref());
    assert_eq!(framed[0], body[0], "compressed again iff it was compressed");
    let back =
        unary_message(&framed, encoding.as_ref(), edited.len()).expect("reframed body reads").expect("one message");
    assert_eq!(&back[..], &edited[..]);
});
