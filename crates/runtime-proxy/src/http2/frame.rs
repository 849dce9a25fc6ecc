//! HTTP/2 frames as bytes (RFC 9113 §4, §6): the frame header, the frames the relay writes of
//! its own (RST_STREAM, WINDOW_UPDATE, GOAWAY, PING, SETTINGS, HEADERS), padding, and a header
//! block encoder that never touches the HPACK dynamic table.
//!
//! The relay ([`crate::cri::relay`]) forwards most frames as they came; this module is only what it
//! needs to read a frame's header, take a payload apart, and write the few frames it makes. The
//! hook client ([`crate::grpc::hook_client`]) writes and reads its calls' frames with it too.

use bytes::{BufMut, Bytes, BytesMut};

/// The client connection preface (RFC 9113 §3.4), sent before the client's first frame.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Length of a frame header: 24-bit length, type, flags, 31-bit stream identifier.
pub const HEAD_LEN: usize = 9;

/// The frame size every peer accepts before it says otherwise (SETTINGS_MAX_FRAME_SIZE's
/// initial value, 16 KiB).
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// A connection's and a stream's flow-control window before any SETTINGS or WINDOW_UPDATE
/// (65,535 bytes).
pub const DEFAULT_WINDOW: i64 = 65_535;

/// Frame types (RFC 9113 §6).
pub mod kind {
    /// DATA: a stream's body bytes, counted against the flow-control windows.
    pub const DATA: u8 = 0x0;
    /// HEADERS: opens a stream (request or response head) or carries its trailers; starts a
    /// header block.
    pub const HEADERS: u8 = 0x1;
    /// PRIORITY: a stream's priority (deprecated by RFC 9113 §5.3.2).
    pub const PRIORITY: u8 = 0x2;
    /// RST_STREAM: ends one stream at once, with an error code ([`super::reason`]).
    pub const RST_STREAM: u8 = 0x3;
    /// SETTINGS: the sender's connection parameters ([`super::setting`]); acknowledged with ACK.
    pub const SETTINGS: u8 = 0x4;
    /// PUSH_PROMISE: a stream the server opens (server push; gRPC does not use it).
    pub const PUSH_PROMISE: u8 = 0x5;
    /// PING: 8 opaque bytes the peer echoes back with ACK.
    pub const PING: u8 = 0x6;
    /// GOAWAY: the connection is closing: the last stream the sender processes and an error code.
    pub const GOAWAY: u8 = 0x7;
    /// WINDOW_UPDATE: more flow-control window (bytes) for a stream, or for the connection on
    /// stream 0.
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// CONTINUATION: the rest of a header block that did not fit in its HEADERS or PUSH_PROMISE.
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags (RFC 9113 §6).
pub mod flag {
    /// DATA, HEADERS: the sender's last frame on the stream.
    pub const END_STREAM: u8 = 0x1;
    /// SETTINGS, PING: an acknowledgement.
    pub const ACK: u8 = 0x1;
    /// HEADERS, CONTINUATION: the header block ends in this frame.
    pub const END_HEADERS: u8 = 0x4;
    /// DATA, HEADERS: a pad length byte leads the payload, padding ends it.
    pub const PADDED: u8 = 0x8;
    /// HEADERS: 5 bytes of priority follow the pad length.
    pub const PRIORITY: u8 = 0x20;
}

/// Error codes (RFC 9113 §7).
pub mod reason {
    /// No error: a graceful GOAWAY, or a stream ended early by a side that needs no more of it.
    pub const NO_ERROR: u32 = 0x0;
    /// The peer broke the protocol.
    pub const PROTOCOL_ERROR: u32 = 0x1;
    /// The sender failed on its own side.
    pub const INTERNAL_ERROR: u32 = 0x2;
    /// A frame of an invalid size (e.g. over SETTINGS_MAX_FRAME_SIZE).
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    /// The stream was refused before any of it was processed: the client may retry it.
    pub const REFUSED_STREAM: u32 = 0x7;
    /// The stream is no longer needed (a cancelled call).
    pub const CANCEL: u32 = 0x8;
    /// The header compression (HPACK) state cannot be kept: a header block did not decode.
    pub const COMPRESSION_ERROR: u32 = 0x9;
}

/// SETTINGS identifiers the relay reads or writes (RFC 9113 §6.5.2).
pub mod setting {
    /// The size of the HPACK dynamic table the sender's decoder keeps, in bytes (initially 4,096).
    pub const HEADER_TABLE_SIZE: u16 = 0x1;
    /// The most streams the sender lets its peer open at once (initially unlimited).
    pub const MAX_CONCURRENT_STREAMS: u16 = 0x3;
    /// Every stream's initial flow-control window, in bytes (initially 65,535).
    pub const INITIAL_WINDOW_SIZE: u16 = 0x4;
    /// The largest frame payload the sender accepts, in bytes (16,384 to 2^24 − 1).
    pub const MAX_FRAME_SIZE: u16 = 0x5;
}

/// A frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// Payload length in bytes (at most 2^24 − 1).
    pub len: usize,
    /// Frame type ([`kind`]).
    pub kind: u8,
    /// Flags ([`flag`]).
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared); 0 for the connection.
    pub stream: u32,
}

impl Head {
    /// Reads a frame header from the first [`HEAD_LEN`] bytes of `b` (which must hold them).
    pub fn parse(b: &[u8]) -> Head {
        Head {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }

    /// Whether `f` is set.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Appends this header to `out`.
    pub fn put(&self, out: &mut BytesMut) {
        let len = self.len as u32;
        out.put_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, self.kind, self.flags]);
        out.put_u32(self.stream & 0x7fff_ffff);
    }
}

/// Appends RST_STREAM(`stream`, `reason`).
pub fn rst_stream(out: &mut BytesMut, stream: u32, reason: u32) {
    Head { len: 4, kind: kind::RST_STREAM, flags: 0, stream }.put(out);
    out.put_u32(reason);
}

/// Appends WINDOW_UPDATE(`stream`, `increment`) (`increment` must be 1..=2^31 − 1).
pub fn window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    Head { len: 4, kind: kind::WINDOW_UPDATE, flags: 0, stream }.put(out);
    out.put_u32(increment & 0x7fff_ffff);
}

/// Appends GOAWAY(`last_stream`, `reason`).
pub fn goaway(out: &mut BytesMut, last_stream: u32, reason: u32) {
    Head { len: 8, kind: kind::GOAWAY, flags: 0, stream: 0 }.put(out);
    out.put_u32(last_stream & 0x7fff_ffff);
    out.put_u32(reason);
}

/// Appends PING (or its ACK) carrying `opaque`.
pub fn ping(out: &mut BytesMut, ack: bool, opaque: &[u8; 8]) {
    Head { len: 8, kind: kind::PING, flags: if ack { flag::ACK } else { 0 }, stream: 0 }.put(out);
    out.put_slice(opaque);
}

/// Appends SETTINGS with `entries` (identifier, value).
pub fn settings(out: &mut BytesMut, entries: &[(u16, u32)]) {
    Head { len: 6 * entries.len(), kind: kind::SETTINGS, flags: 0, stream: 0 }.put(out);
    for (id, value) in entries {
        out.put_u16(*id);
        out.put_u32(*value);
    }
}

/// Appends a SETTINGS acknowledgement.
pub fn settings_ack(out: &mut BytesMut) {
    Head { len: 0, kind: kind::SETTINGS, flags: flag::ACK, stream: 0 }.put(out);
}

/// The entries of a SETTINGS payload (identifier, value); a trailing partial entry is ignored
/// (the peer that reads the frame as forwarded rejects it).
pub fn settings_entries(payload: &[u8]) -> impl Iterator<Item = (u16, u32)> + '_ {
    payload.chunks_exact(6).map(|e| (u16::from_be_bytes([e[0], e[1]]), u32::from_be_bytes([e[2], e[3], e[4], e[5]])))
}

/// The part of a DATA or HEADERS payload that carries data or a header block fragment: without
/// the pad length, the padding and (HEADERS with PRIORITY) the 5 priority bytes.
///
/// Errors: `None` when the padding or priority fields do not fit the payload (a PROTOCOL_ERROR
/// the peer reports too).
pub fn unpadded(head: &Head, payload: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut start = 0;
    let mut end = payload.len();
    if head.has(flag::PADDED) {
        let pad = usize::from(*payload.first()?);
        start = 1;
        end = end.checked_sub(pad)?;
    }
    if head.kind == kind::HEADERS && head.has(flag::PRIORITY) {
        start += 5;
    }
    (start <= end).then_some(start..end)
}

/// Appends an HPACK integer with an `n`-bit prefix whose high bits are `first` (RFC 7541 §5.1).
fn put_int(out: &mut BytesMut, first: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.put_u8(first | value as u8);
        return;
    }
    out.put_u8(first | max as u8);
    value -= max;
    while value >= 128 {
        out.put_u8((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.put_u8(value as u8);
}

/// Appends an HPACK string literal, not Huffman-coded (RFC 7541 §5.2).
fn put_str(out: &mut BytesMut, s: &[u8]) {
    put_int(out, 0, 7, s.len());
    out.put_slice(s);
}

/// Appends `name: value` as a literal header field without indexing, with a literal name (RFC
/// 7541 §6.2.2): the decoder's dynamic table is neither read nor changed, so the block can be
/// put anywhere in a connection whose table state the writer does not know.
pub fn put_literal(out: &mut BytesMut, name: &[u8], value: &[u8]) {
    out.put_u8(0);
    put_str(out, name);
    put_str(out, value);
}

/// Appends `:status` (static table index 8, RFC 7541 Appendix A): indexed for 200, a literal
/// value with the indexed name otherwise; neither touches the dynamic table.
pub fn put_status(out: &mut BytesMut, status: u16) {
    if status == 200 {
        out.put_u8(0x88);
    } else {
        put_int(out, 0, 4, 8);
        put_str(out, status.to_string().as_bytes());
    }
}

/// Appends a header block as HEADERS (with END_STREAM when `end_stream`) and as many
/// CONTINUATION frames as `max_frame` requires.
pub fn put_headers(out: &mut BytesMut, stream: u32, end_stream: bool, block: &[u8], max_frame: usize) {
    let max_frame = max_frame.max(1);
    let mut chunks = block.chunks(max_frame).peekable();
    let mut first = true;
    if block.is_empty() {
        let flags = flag::END_HEADERS | if end_stream { flag::END_STREAM } else { 0 };
        Head { len: 0, kind: kind::HEADERS, flags, stream }.put(out);
        return;
    }
    while let Some(chunk) = chunks.next() {
        let mut flags = if chunks.peek().is_none() { flag::END_HEADERS } else { 0 };
        let kind = if first {
            if end_stream {
                flags |= flag::END_STREAM;
            }
            kind::HEADERS
        } else {
            kind::CONTINUATION
        };
        first = false;
        Head { len: chunk.len(), kind, flags, stream }.put(out);
        out.put_slice(chunk);
    }
}

/// Appends DATA frames carrying `data` (split at `max_frame`), the last with END_STREAM when
/// `end_stream`.
pub fn put_data(out: &mut BytesMut, stream: u32, data: &Bytes, end_stream: bool, max_frame: usize) {
    let max_frame = max_frame.max(1);
    if data.is_empty() {
        Head { len: 0, kind: kind::DATA, flags: if end_stream { flag::END_STREAM } else { 0 }, stream }.put(out);
        return;
    }
    let mut chunks = data.chunks(max_frame).peekable();
    while let Some(chunk) = chunks.next() {
        let flags = if end_stream && chunks.peek().is_none() { flag::END_STREAM } else { 0 };
        Head { len: chunk.len(), kind: kind::DATA, flags, stream }.put(out);
        out.put_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use h2::hpack::{Decoder, Header};
    use std::io::Cursor;
    use std::ops::ControlFlow;

    fn decode(block: &[u8]) -> Vec<(String, String)> {
        let mut d = Decoder::new(4096);
        let mut buf = BytesMut::from(block);
        let mut out = Vec::new();
        d.decode(&mut Cursor::new(&mut buf), |h| {
            out.push(match h {
                Header::Field { name, value } => (name.to_string(), value.to_str().unwrap().to_owned()),
                Header::Status(s) => (":status".into(), s.as_str().to_owned()),
                other => (format!("{other:?}"), String::new()),
            });
            ControlFlow::Continue(())
        })
        .unwrap();
        out
    }

    #[test]
    fn literal_blocks_decode_as_written() {
        let mut b = BytesMut::new();
        put_status(&mut b, 200);
        put_literal(&mut b, b"content-type", b"application/grpc");
        put_literal(&mut b, b"grpc-message", "x".repeat(300).as_bytes());
        put_status(&mut b, 503);
        let got = decode(&b);
        assert_eq!(got[0], (":status".into(), "200".into()));
        assert_eq!(got[1], ("content-type".into(), "application/grpc".into()));
        assert_eq!(got[2].1.len(), 300, "a length beyond the 7-bit prefix");
        assert_eq!(got[3], (":status".into(), "503".into()));
    }

    #[test]
    fn headers_split_into_continuations_and_data_into_frames() {
        let mut out = BytesMut::new();
        put_headers(&mut out, 3, true, &[7u8; 25], 10);
        let heads: Vec<Head> = [0, 19, 38].iter().map(|&at| Head::parse(&out[at..])).collect();
        assert_eq!(heads[0], Head { len: 10, kind: kind::HEADERS, flags: flag::END_STREAM, stream: 3 });
        assert_eq!(heads[1], Head { len: 10, kind: kind::CONTINUATION, flags: 0, stream: 3 });
        assert_eq!(heads[2], Head { len: 5, kind: kind::CONTINUATION, flags: flag::END_HEADERS, stream: 3 });
        assert_eq!(out.len(), 3 * HEAD_LEN + 25);
        let mut out = BytesMut::new();
        put_data(&mut out, 5, &Bytes::from(vec![1u8; 15]), true, 10);
        assert_eq!(Head::parse(&out), Head { len: 10, kind: kind::DATA, flags: 0, stream: 5 });
        assert_eq!(Head::parse(&out[19..]), Head { len: 5, kind: kind::DATA, flags: flag::END_STREAM, stream: 5 });
    }

    #[test]
    fn padding_and_priority_are_stripped() {
        let h = Head { len: 0, kind: kind::HEADERS, flags: flag::PADDED | flag::PRIORITY, stream: 1 };
        let payload = [2u8, 0, 0, 0, 0, 9, b'a', b'b', 0, 0];
        assert_eq!(unpadded(&h, &payload), Some(6..8));
        let d = Head { len: 0, kind: kind::DATA, flags: flag::PADDED, stream: 1 };
        assert_eq!(unpadded(&d, &[5u8, 1, 2]), None, "padding longer than the payload");
        assert_eq!(unpadded(&d, &[]), None);
        let plain = Head { len: 0, kind: kind::DATA, flags: 0, stream: 1 };
        assert_eq!(unpadded(&plain, &[1, 2, 3]), Some(0..3));
    }

    #[test]
    fn heads_round_trip() {
        let h = Head { len: 0x01_02_03, kind: kind::WINDOW_UPDATE, flags: 0xff, stream: 0x7fff_fffe };
        let mut b = BytesMut::new();
        h.put(&mut b);
        assert_eq!(Head::parse(&b), h);
        let mut b = BytesMut::from(&[0u8, 0, 0, 0, 0, 0x80, 0, 0, 1][..]);
        assert_eq!(Head::parse(&b).stream, 1, "the reserved bit is ignored");
        b.clear();
        settings(&mut b, &[(setting::MAX_CONCURRENT_STREAMS, 7)]);
        assert_eq!(settings_entries(&b[HEAD_LEN..]).collect::<Vec<_>>(), vec![(3, 7)]);
    }
}
