//! HPACK (RFC 7541) decoding for the frame relay, which forwards header blocks verbatim and
//! decodes each one only to follow the peers' dynamic table and read a few fields (`:path`,
//! `grpc-timeout`, `grpc-status`).
//!
//! Fields come out as the bytes the peer sent (after Huffman decoding), copied into one buffer
//! per block ([`Fields`]); nothing is validated as an HTTP header name or value, as the relay
//! passes the block on unchanged and the receiving peer judges it. h2's own decoder builds a
//! validated `HeaderName` and `HeaderValue` for every field, which cost the relay about 500
//! instructions a field, a third of what it spent per call (measured with callgrind;
//! docs/benchmarks.md); this one costs a copy. Huffman-coded strings are decoded by h2's decoder
//! (`h2::hpack::huffman`).

use std::collections::VecDeque;

use bytes::BytesMut;

/// SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 §6.5.2), in bytes.
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Why a header block did not decode. After any of these the decoder's table no longer follows
/// the encoder's, so the connection cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The block ends inside a representation.
    #[error("header block truncated")]
    Truncated,
    /// An integer longer than the 4 continuation bytes (28 bits) any table index or length
    /// needs.
    #[error("integer too large")]
    Overflow,
    /// Index 0, or beyond the static and dynamic tables.
    #[error("index {0} is not in the table")]
    BadIndex(usize),
    /// A Huffman-coded string that does not decode (RFC 7541 §5.2: EOS, or bad padding).
    #[error("invalid Huffman code")]
    Huffman,
    /// A dynamic table size update above the decoding peer's SETTINGS_HEADER_TABLE_SIZE
    /// (RFC 7541 §6.3).
    #[error("dynamic table size update to {0} bytes, above the {1} allowed")]
    TableTooLarge(usize, usize),
    /// A dynamic table size update after the block's first field (RFC 7541 §4.2).
    #[error("dynamic table size update after a field")]
    LateSizeUpdate,
    /// More fields, or more bytes (RFC 9113 §6.5.2: name, value and 32 each), than the
    /// decode's limits.
    #[error("header list too large")]
    TooLarge,
}

/// The fields of one header block, in order, with pseudo-header fields (`:path`, `:status`, ...)
/// under their names: one buffer of name and value bytes and where each ends.
#[derive(Debug, Default)]
pub struct Fields {
    bytes: Vec<u8>,
    /// For each field, where its name and its value end in `bytes`.
    ends: Vec<(usize, usize)>,
}

impl Fields {
    /// The fields as (name, value) byte strings, in block order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let mut start = 0;
        self.ends.iter().map(move |&(name_end, end)| {
            let field = (&self.bytes[start..name_end], &self.bytes[name_end..end]);
            start = end;
            field
        })
    }

    /// The value of the first field named `name` (lower case, as HTTP/2 requires).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find_map(|(n, v)| (n == name).then_some(v))
    }

    /// How many fields the block held.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the block held no field.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn clear(&mut self) {
        // A rare large block does not pin its memory for the connection's life.
        if self.bytes.capacity() > 64 << 10 {
            self.bytes = Vec::new();
            self.ends = Vec::new();
        }
        self.bytes.clear();
        self.ends.clear();
    }
}

/// The decoding side of one direction of a connection: the dynamic table as the encoder keeps
/// it.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first (dynamic index 62 is the front); each entry is name and value bytes and
    /// where the name ends.
    table: VecDeque<(Box<[u8]>, usize)>,
    /// The table's size in RFC 7541 §4.1's terms (name + value + 32 per entry), in bytes.
    size: usize,
    /// The size the encoder last set (RFC 7541 §4.2), in bytes.
    max: usize,
    /// The decoding peer's SETTINGS_HEADER_TABLE_SIZE, in bytes: the most `max` may be set to.
    allowed: usize,
    /// Room for Huffman decoding.
    scratch: BytesMut,
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: DEFAULT_TABLE_SIZE,
            allowed: DEFAULT_TABLE_SIZE,
            scratch: BytesMut::new(),
        }
    }
}

impl Decoder {
    /// Records the decoding peer's SETTINGS_HEADER_TABLE_SIZE (bytes): the largest table the
    /// encoder may ask for from now on.
    pub fn set_allowed(&mut self, size: usize) {
        self.allowed = size;
    }

    /// Decodes one whole header block into `out` (cleared first), updating the dynamic table.
    ///
    /// Errors: see [`Error`]; [`Error::TooLarge`] once the block passes `max_fields` fields or
    /// `max_size` bytes of header list (RFC 9113 §6.5.2's size).
    pub fn decode(&mut self, block: &[u8], out: &mut Fields, max_fields: usize, max_size: usize) -> Result<(), Error> {
        out.clear();
        let mut at = 0;
        let mut size = 0usize;
        while at < block.len() {
            let first = block[at];
            let start = out.bytes.len();
            let name_end;
            if first & 0x80 != 0 {
                // Indexed field (§6.1); the limit checked before the copy (a one-byte reference
                // can stand for a whole table's worth).
                let (name, value) = self.entry(integer(block, &mut at, 7)?)?;
                if size + name.len() + value.len() + 32 > max_size {
                    return Err(Error::TooLarge);
                }
                out.bytes.extend_from_slice(name);
                name_end = out.bytes.len();
                out.bytes.extend_from_slice(value);
            } else if first & 0xe0 == 0x20 {
                // Dynamic table size update (§6.3): only before the block's first field.
                if !out.ends.is_empty() {
                    return Err(Error::LateSizeUpdate);
                }
                let max = integer(block, &mut at, 5)?;
                if max > self.allowed {
                    return Err(Error::TableTooLarge(max, self.allowed));
                }
                self.max = max;
                self.evict(0);
                continue;
            } else {
                // Literal field (§6.2): with incremental indexing (01), without indexing (0000)
                // or never indexed (0001); the name is indexed or literal.
                let indexing = first & 0x40 != 0;
                let index = integer(block, &mut at, if indexing { 6 } else { 4 })?;
                if index == 0 {
                    self.string(block, &mut at, &mut out.bytes)?;
                } else {
                    out.bytes.extend_from_slice(self.entry(index)?.0);
                }
                name_end = out.bytes.len();
                self.string(block, &mut at, &mut out.bytes)?;
                if indexing {
                    self.insert(&out.bytes[start..], name_end - start);
                }
            }
            size += out.bytes.len() - start + 32;
            out.ends.push((name_end, out.bytes.len()));
            if out.ends.len() > max_fields || size > max_size {
                return Err(Error::TooLarge);
            }
        }
        Ok(())
    }

    /// The (name, value) at `index`: 1 to 61 the static table, then the dynamic one, newest
    /// first (§2.3.3).
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), Error> {
        match index {
            0 => Err(Error::BadIndex(0)),
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Ok((name.as_bytes(), value.as_bytes()))
            }
            _ => {
                let (bytes, name_len) = self.table.get(index - 62).ok_or(Error::BadIndex(index))?;
                Ok(bytes.split_at(*name_len))
            }
        }
    }

    /// Adds a field to the dynamic table (§4.4): older entries go to make room; a field larger
    /// than the whole table empties it and is not added.
    fn insert(&mut self, field: &[u8], name_len: usize) {
        let size = field.len() + 32;
        if size > self.max {
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.table.push_front((field.into(), name_len));
        self.size += size;
    }

    /// Drops the oldest entries until `room` more bytes fit within the table's size.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max {
            let Some((bytes, _)) = self.table.pop_back() else { break };
            self.size -= bytes.len() + 32;
        }
    }

    /// A string literal (§5.2) at `at`, appended to `out`.
    fn string(&mut self, block: &[u8], at: &mut usize, out: &mut Vec<u8>) -> Result<(), Error> {
        let huffman = *block.get(*at).ok_or(Error::Truncated)? & 0x80 != 0;
        let len = integer(block, at, 7)?;
        let raw = block.get(*at..*at + len).ok_or(Error::Truncated)?;
        *at += len;
        if huffman {
            self.scratch.clear();
            let decoded = h2::hpack::huffman::decode(raw, &mut self.scratch).map_err(|_| Error::Huffman)?;
            out.extend_from_slice(&decoded);
        } else {
            out.extend_from_slice(raw);
        }
        Ok(())
    }
}

/// An integer with an `prefix`-bit prefix (§5.1) at `at`, which moves past it.
fn integer(block: &[u8], at: &mut usize, prefix: u8) -> Result<usize, Error> {
    let mask = (1usize << prefix) - 1;
    let mut value = *block.get(*at).ok_or(Error::Truncated)? as usize & mask;
    *at += 1;
    if value < mask {
        return Ok(value);
    }
    for shift in [0, 7, 14, 21] {
        let byte = *block.get(*at).ok_or(Error::Truncated)?;
        *at += 1;
        value += ((byte & 0x7f) as usize) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Error::Overflow)
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests {
    use super::*;
    use h2::hpack::{Encoder, Header};
    use http::{HeaderName, HeaderValue, Method};

    fn decoded(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, Error> {
        let mut out = Fields::default();
        d.decode(block, &mut out, 100, 1 << 20)?;
        Ok(out
            .iter()
            .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
            .collect())
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    #[test]
    fn rfc_7541_appendix_c_4_requests_with_huffman_coding() {
        let mut d = Decoder::default();
        let first = decoded(&mut d, &hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff")).unwrap();
        assert_eq!(
            first,
            pairs(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")])
        );
        let second = decoded(&mut d, &hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(
            second,
            pairs(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        let third = decoded(&mut d, &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf")).unwrap();
        assert_eq!(
            third,
            pairs(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        // Table: custom-key (54), cache-control (53), :authority (57) = 164 bytes (§C.4.3).
        assert_eq!(d.size, 164);
        assert_eq!(d.table.len(), 3);
    }

    #[test]
    fn rfc_7541_appendix_c_5_responses_evict_to_fit_a_256_byte_table() {
        let mut d = Decoder { allowed: 256, ..Decoder::default() };
        // The example's table is 256 bytes: the encoder announces it first (§6.3).
        let mut first = hex("3fe1 01");
        first.extend(hex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        ));
        let got = decoded(&mut d, &first).unwrap();
        assert_eq!(got[0], (":status".into(), "302".into()));
        assert_eq!(got[3], ("location".into(), "https://www.example.com".into()));
        assert_eq!(d.size, 222);
        let second = decoded(&mut d, &hex("4803 3330 37c1 c0bf")).unwrap();
        assert_eq!(second[0], (":status".into(), "307".into()));
        assert_eq!(second[1], ("cache-control".into(), "private".into()));
        // ":status: 302" was evicted to make room for ":status: 307" (§C.5.2).
        assert_eq!(d.size, 222);
        assert_eq!(d.table.len(), 4);
    }

    #[test]
    fn blocks_from_h2s_encoder_decode_as_encoded() {
        // h2's encoder: Huffman, incremental indexing, a value that changes every block, and a
        // table small enough to evict.
        let mut enc = Encoder::new(DEFAULT_TABLE_SIZE, 0);
        // Sent as a size update at the start of the first block.
        enc.update_max_size(256);
        let mut d = Decoder::default();
        let text = |s: &str| h2::hpack::BytesStr::try_from(bytes::Bytes::copy_from_slice(s.as_bytes())).unwrap();
        let field = |n: &'static str, v: &str| Header::Field {
            name: Some(HeaderName::from_static(n)),
            value: HeaderValue::from_str(v).unwrap(),
        };
        for i in 0..50 {
            let headers: Vec<Header<Option<HeaderName>>> = vec![
                Header::Method(Method::POST),
                Header::Scheme(text("http")),
                Header::Path(text(&format!("/runtime.v1.RuntimeService/Call{}", i % 7))),
                field("content-type", "application/grpc"),
                field("grpc-timeout", &format!("{}m", 1000 + i)),
                field("x-big", &"v".repeat(i * 3)),
            ];
            let mut block = BytesMut::new();
            enc.encode(headers, &mut block);
            let got = decoded(&mut d, &block).unwrap();
            let path = format!("/runtime.v1.RuntimeService/Call{}", i % 7);
            let timeout = format!("{}m", 1000 + i);
            let big = "v".repeat(i * 3);
            assert_eq!(
                got,
                pairs(&[
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", &path),
                    ("content-type", "application/grpc"),
                    ("grpc-timeout", &timeout),
                    ("x-big", &big)
                ]),
                "block {i}"
            );
            assert!(d.size <= 256);
        }
    }

    #[test]
    fn every_static_entry_is_rfc_7541s() {
        // Each static entry against h2's decoder, an independent copy of Appendix A.
        for index in 1..=61u8 {
            let block = [0x80 | index];
            let ours = decoded(&mut Decoder::default(), &block).unwrap();
            let mut theirs = Vec::new();
            let mut h2 = h2::hpack::Decoder::new(4096);
            h2.decode(&mut std::io::Cursor::new(&mut BytesMut::from(&block[..])), |h| {
                theirs.push(h);
                std::ops::ControlFlow::Continue(())
            })
            .unwrap();
            let (name, value) = match &theirs[0] {
                Header::Field { name, value } => (name.as_str().to_owned(), value.to_str().unwrap().to_owned()),
                Header::Authority(v) => (":authority".into(), v.to_string()),
                Header::Method(m) => (":method".into(), m.as_str().into()),
                Header::Scheme(v) => (":scheme".into(), v.to_string()),
                Header::Path(v) => (":path".into(), v.to_string()),
                Header::Protocol(v) => (":protocol".into(), v.as_str().into()),
                Header::Status(s) => (":status".into(), s.as_str().into()),
            };
            assert_eq!(ours, vec![(name, value)], "static index {index}");
        }
    }

    #[test]
    fn malformed_blocks_are_errors() {
        let mut d = Decoder::default();
        assert_eq!(decoded(&mut d, &[0x80]), Err(Error::BadIndex(0)));
        assert_eq!(decoded(&mut d, &[0xbe]), Err(Error::BadIndex(62)), "an empty dynamic table");
        assert_eq!(decoded(&mut d, &[0xff]), Err(Error::Truncated));
        assert_eq!(decoded(&mut d, &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]), Err(Error::Overflow));
        assert_eq!(decoded(&mut d, &[0x40, 0x05, b'a']), Err(Error::Truncated), "a string past the block");
        assert_eq!(decoded(&mut d, &[0x3f, 0xe1, 0x1f]), Ok(vec![]), "a size update to 4096, alone");
        assert_eq!(decoded(&mut d, &[0x3f, 0xe2, 0x1f]), Err(Error::TableTooLarge(4097, 4096)));
        assert_eq!(decoded(&mut d, &[0x82, 0x20]), Err(Error::LateSizeUpdate));
        // EOS (30 ones) inside a Huffman string.
        assert_eq!(decoded(&mut d, &[0x00, 0x84, 0xff, 0xff, 0xff, 0xff, 0x00]), Err(Error::Huffman));
    }

    #[test]
    fn limits_end_the_decode() {
        let mut d = Decoder::default();
        let mut out = Fields::default();
        assert_eq!(d.decode(&[0x82; 11], &mut out, 10, 1 << 20), Err(Error::TooLarge));
        // ":method: POST" counts 7 + 4 + 32 = 43 bytes.
        assert_eq!(d.decode(&[0x83; 3], &mut out, 10, 128), Err(Error::TooLarge));
        assert_eq!(d.decode(&[0x83; 2], &mut out, 10, 86), Ok(()));
        assert_eq!(out.len(), 2);
        assert_eq!(out.get(b":method"), Some(&b"POST"[..]));
        assert_eq!(out.get(b":path"), None);
        // A 4 000-byte entry referenced 100 times by a 100-byte block: refused before the copies
        // pass the limit.
        let mut insert = vec![0x40, 0x01, b'x', 0x7f];
        let mut len = 4000 - 127;
        while len >= 128 {
            insert.push(0x80 | (len % 128) as u8);
            len /= 128;
        }
        insert.push(len as u8);
        insert.extend([b'v'; 4000]);
        assert_eq!(d.decode(&insert, &mut out, 10, 1 << 20), Ok(()));
        assert_eq!(d.decode(&[0xbe; 100], &mut out, 1000, 64 << 10), Err(Error::TooLarge));
        assert!(out.bytes.len() <= 64 << 10, "copied {} bytes", out.bytes.len());
    }
}
