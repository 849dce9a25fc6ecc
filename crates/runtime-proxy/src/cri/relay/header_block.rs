//! Header blocks: assembled from HEADERS and CONTINUATION frames, decoded, and the fields and literal blocks the relay
//! reads and writes.

use super::*;

/// A header block being collected (HEADERS, then CONTINUATION until END_HEADERS).
pub(super) struct PendingHeaderBlock {
    pub(super) stream: u32,
    /// The HEADERS frame's flags (END_STREAM).
    pub(super) flags: u8,
    /// The frames as they came, to forward verbatim.
    pub(super) raw: Vec<u8>,
    /// The block itself (fragments without padding and priority), to decode.
    pub(super) fragment: Vec<u8>,
}

/// A whole header block ([`assemble`]).
pub(super) struct HeaderBlock<'a> {
    pub(super) stream: u32,
    /// The HEADERS frame's flags (END_STREAM).
    pub(super) flags: u8,
    /// The block's frames as they came.
    pub(super) raw: Cow<'a, [u8]>,
    /// The block itself, to decode (borrowed when the block is one frame).
    pub(super) fragment: Cow<'a, [u8]>,
}

/// One side's header block assembly (RFC 9113 §4.3): a HEADERS frame starts a block, whole at
/// once when it has END_HEADERS, and CONTINUATION frames of the same stream add to it until
/// one has. Returns the block once whole: the frames as they came (`raw`, borrowed when the
/// block is one frame) and the block itself (`fragment`, without padding and priority fields).
///
/// Errors: any other frame while a block is open (the block is interrupted), a CONTINUATION
/// without a block, padding or priority fields that do not fit the frame, a block over
/// [`MAX_HEADER_LIST_SIZE`].
pub(super) fn assemble<'a>(
    pending: &mut Option<PendingHeaderBlock>,
    head: Head,
    raw: &'a [u8],
) -> Result<Option<HeaderBlock<'a>>, Fatal> {
    let Some(block) = pending else {
        if head.kind != kind::HEADERS {
            return Err(Fatal(reason::PROTOCOL_ERROR, "CONTINUATION without HEADERS"));
        }
        let range = frame::unpadded(&head, &raw[HEAD_LEN..]).ok_or(Fatal(reason::PROTOCOL_ERROR, "bad padding"))?;
        let fragment = &raw[HEAD_LEN + range.start..HEAD_LEN + range.end];
        if head.has(flag::END_HEADERS) {
            return Ok(Some(HeaderBlock {
                stream: head.stream,
                flags: head.flags,
                raw: Cow::Borrowed(raw),
                fragment: Cow::Borrowed(fragment),
            }));
        }
        *pending = Some(PendingHeaderBlock {
            stream: head.stream,
            flags: head.flags,
            raw: raw.to_vec(),
            fragment: fragment.to_vec(),
        });
        return Ok(None);
    };
    if head.kind != kind::CONTINUATION || head.stream != block.stream {
        return Err(Fatal(reason::PROTOCOL_ERROR, "header block interrupted"));
    }
    block.fragment.extend_from_slice(&raw[HEAD_LEN..]);
    block.raw.extend_from_slice(raw);
    if block.fragment.len() > MAX_HEADER_LIST_SIZE as usize {
        return Err(Fatal(reason::PROTOCOL_ERROR, "header block too large"));
    }
    if !head.has(flag::END_HEADERS) {
        return Ok(None);
    }
    let PendingHeaderBlock { stream, flags, raw, fragment } = pending.take().expect("checked above");
    Ok(Some(HeaderBlock { stream, flags, raw: Cow::Owned(raw), fragment: Cow::Owned(fragment) }))
}

/// Decodes one header block into `out`.
///
/// Errors (the connection cannot go on either way: the HPACK state is lost): PROTOCOL_ERROR for
/// a block of more than `MAX_FIELDS` fields or of more bytes than said below, COMPRESSION_ERROR
/// for one that does not decode.
pub(super) fn decode(hpack: &mut hpack::Decoder, fragment: &[u8], out: &mut Fields) -> Result<(), Fatal> {
    // Indexed fields are copied out of the table, so a small block could stand for up to
    // MAX_HEADER_LIST_SIZE bytes of copies: a block may decode to 64 KiB, plus 64 times its own
    // size (a field from the static table is about 40 bytes per byte; gRPC calls need far less).
    let max_size = (MAX_HEADER_LIST_SIZE as usize).min((64 << 10) + 64 * fragment.len());
    hpack.decode(fragment, out, MAX_FIELDS, max_size).map_err(|e| match e {
        hpack::Error::TooLarge => Fatal(reason::PROTOCOL_ERROR, "header list too large"),
        _ => Fatal(reason::COMPRESSION_ERROR, "cannot decode a header block"),
    })
}

/// The request head of a call the relay hands to a task, from its decoded header block; `None`
/// when the path is not a valid URI path. `all`: with every field (a call sent on over the
/// shared connection); else with the `grpc-` fields only (`grpc-timeout`, `grpc-encoding`: what
/// the interceptor reads of a call that goes on on its stream, whose header block the runtime
/// got as it came). Fields that are not valid HTTP headers are left out.
pub(super) fn request_parts(headers: &Fields, path: &str, all: bool) -> Option<http::request::Parts> {
    let uri = router::default_uri(headers.get(b":authority"), path)?;
    let (mut parts, ()) = Request::builder().method(Method::POST).uri(uri).body(()).ok()?.into_parts();
    parts.headers = fields_where(headers, |name| all || name.starts_with(b"grpc-"));
    Some(parts)
}

/// A response head from a decoded header block.
pub(super) fn response_head(headers: &Fields) -> Response<()> {
    let mut head = Response::new(());
    if let Some(status) = headers.get(b":status").and_then(|s| http::StatusCode::from_bytes(s).ok()) {
        *head.status_mut() = status;
    }
    *head.headers_mut() = fields(headers);
    head
}

/// A decoded header block encoded again literally ([`frame::put_literal`]), pseudo-header
/// fields other than `:status` left out.
pub(super) fn literal_block(headers: &Fields) -> BytesMut {
    let mut out = BytesMut::with_capacity(128);
    for (name, value) in headers.iter() {
        if name == b":status" || !name.starts_with(b":") {
            frame::put_literal(&mut out, name, value);
        }
    }
    out
}

/// The regular fields of a decoded header block that are valid HTTP headers.
pub(super) fn fields(headers: &Fields) -> HeaderMap {
    fields_where(headers, |_| true)
}

/// The regular fields of a decoded header block that are valid HTTP headers and whose name
/// `keep` accepts.
pub(super) fn fields_where(headers: &Fields, keep: impl Fn(&[u8]) -> bool) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in headers.iter().filter(|(name, _)| keep(name)) {
        if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) {
            map.append(name, value);
        }
    }
    map
}

/// The status a block of trailers (or a trailers-only head) carries; `UNKNOWN` without one.
pub(super) fn status_of(headers: &Fields) -> Status {
    let code = headers.get(b"grpc-status").and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok());
    match code {
        Some(c) => {
            Status::new(Code(c), std::str::from_utf8(headers.get(b"grpc-message").unwrap_or_default()).unwrap_or(""))
        }
        None => Status::new(Code::UNKNOWN, "backend ended the call without a grpc-status"),
    }
}

/// A trailers-only answer's header block: `:status 200`, `content-type`, the status fields.
pub(super) fn trailers_only(status: &Status) -> BytesMut {
    let mut block = BytesMut::with_capacity(64 + status.message.len());
    frame::put_status(&mut block, 200);
    frame::put_literal(&mut block, b"content-type", b"application/grpc");
    put_fields(&mut block, &status.trailers());
    block
}

pub(super) fn put_fields(out: &mut BytesMut, headers: &HeaderMap) {
    for (name, value) in headers {
        frame::put_literal(out, name.as_str().as_bytes(), value.as_bytes());
    }
}
