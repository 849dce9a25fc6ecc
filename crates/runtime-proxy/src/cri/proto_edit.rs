//! Protobuf wire-level editing: change a few fields of an encoded message and keep every other
//! byte as it was.
//!
//! The proxy decodes intercepted CRI requests with the compiled proto, but a kubelet newer than
//! that proto may send fields it does not know; decoding and re-encoding would drop them. So a
//! hook's changes are applied as [`Edit`]s to the original bytes: the records of an edited field
//! are replaced, records of untouched fields (known or unknown) are copied verbatim, in order.
//!
//! Wire format facts used (protobuf encoding spec): a record is a varint key
//! `field_number << 3 | wire_type` and a value (0 varint, 1 fixed 8 bytes, 2 length-delimited,
//! 5 fixed 4 bytes; 3/4 are deprecated groups and rejected); several records of one embedded
//! message field are merged by the reader, which equals concatenating their payloads.

use std::ops::Range;

/// A change to one field of an encoded message, keyed by field number in a list of
/// `(field_number, Edit)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edit {
    /// Drop every record of the field and put these bytes (zero or more complete records of the
    /// same field, e.g. a message with only that field set, encoded) where the first record
    /// was, or at the end when the field was absent. Empty bytes remove the field.
    Replace(Vec<u8>),
    /// Edit fields inside an embedded message field (wire type 2), created if absent.
    Nested(Vec<(u32, Edit)>),
}

/// Why an encoded message could not be edited.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A record runs past the end of the message; the byte offset where the bytes ran out.
    #[error("truncated protobuf message at byte {0}")]
    Truncated(usize),
    /// A varint starting at this byte offset is longer than 10 bytes, or a key's field number
    /// does not fit in 32 bits.
    #[error("invalid varint at byte {0}")]
    BadVarint(usize),
    /// A record with a wire type this editor does not read (the deprecated groups, 3 and 4, or
    /// the undefined 6 and 7).
    #[error("unsupported wire type {wire_type} (field {field}) at byte {at}")]
    WireType {
        /// The record's field number.
        field: u32,
        /// The record's wire type (3 to 7).
        wire_type: u8,
        /// The byte offset of its key.
        at: usize,
    },
    /// An [`Edit::Nested`] edit of a field whose record is not length-delimited.
    #[error("field {field} is not length-delimited (wire type {wire_type}); cannot edit inside it")]
    NotAMessage {
        /// The field number the edit names.
        field: u32,
        /// The wire type its record has.
        wire_type: u8,
    },
}

/// One record of an encoded message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    field: u32,
    wire_type: u8,
    /// The whole record (key and value).
    all: Range<usize>,
    /// The value's payload (for wire type 2, without the length prefix).
    payload: Range<usize>,
}

fn read_varint(buf: &[u8], mut pos: usize) -> Result<(u64, usize), WireError> {
    let start = pos;
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(pos).ok_or(WireError::Truncated(pos))?;
        pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, pos));
        }
    }
    Err(WireError::BadVarint(start))
}

fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn records(buf: &[u8]) -> Result<Vec<Record>, WireError> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let (key, after_key) = read_varint(buf, pos)?;
        let field = u32::try_from(key >> 3).map_err(|_| WireError::BadVarint(start))?;
        let wire_type = (key & 7) as u8;
        let (payload, end) = match wire_type {
            0 => {
                let (_, end) = read_varint(buf, after_key)?;
                (after_key..end, end)
            }
            1 | 5 => {
                let end = after_key + if wire_type == 1 { 8 } else { 4 };
                (after_key..end, end)
            }
            2 => {
                let (len, body) = read_varint(buf, after_key)?;
                let end =
                    usize::try_from(len).ok().and_then(|l| body.checked_add(l)).ok_or(WireError::Truncated(body))?;
                (body..end, end)
            }
            _ => return Err(WireError::WireType { field, wire_type, at: start }),
        };
        if end > buf.len() {
            return Err(WireError::Truncated(buf.len()));
        }
        out.push(Record { field, wire_type, all: start..end, payload });
        pos = end;
    }
    Ok(out)
}

/// The value of the string field `field` of the encoded message `msg`, as a protobuf reader
/// takes it (the last record wins); `None` when it is absent, not length-delimited or not
/// UTF-8, or when `msg` is not valid protobuf.
pub fn string_field(msg: &[u8], field: u32) -> Option<&str> {
    let last = records(msg).ok()?.into_iter().rfind(|r| r.field == field)?;
    if last.wire_type != 2 {
        return None;
    }
    std::str::from_utf8(&msg[last.payload]).ok()
}

/// Applies `edits` to the encoded message `msg` and returns the new encoding.
///
/// Records of fields without an edit are copied byte for byte and keep their order; an edited
/// field's output takes the position of its first record. With no edits the output equals the
/// input.
///
/// Errors: `msg` (or an edited embedded message) is not valid protobuf, or a [`Edit::Nested`]
/// targets a field that is not length-delimited.
pub fn apply(msg: &[u8], edits: &[(u32, Edit)]) -> Result<Vec<u8>, WireError> {
    if edits.is_empty() {
        return Ok(msg.to_vec());
    }
    let recs = records(msg)?;
    // Payloads of every record of each nested-edited field, concatenated (= merged message).
    let mut nested_payload: Vec<Option<Vec<u8>>> = vec![None; edits.len()];
    for r in &recs {
        if let Some(i) = edits.iter().position(|(f, _)| *f == r.field) {
            if let Edit::Nested(_) = edits[i].1 {
                if r.wire_type != 2 {
                    return Err(WireError::NotAMessage { field: r.field, wire_type: r.wire_type });
                }
                nested_payload[i].get_or_insert_with(Vec::new).extend_from_slice(&msg[r.payload.clone()]);
            }
        }
    }
    let mut out = Vec::with_capacity(msg.len() + 64);
    let mut emitted = vec![false; edits.len()];
    for r in &recs {
        match edits.iter().position(|(f, _)| *f == r.field) {
            None => out.extend_from_slice(&msg[r.all.clone()]),
            Some(i) if !emitted[i] => {
                emitted[i] = true;
                emit(&edits[i], nested_payload[i].as_deref().unwrap_or(&[]), &mut out)?;
            }
            Some(_) => {}
        }
    }
    for (i, edit) in edits.iter().enumerate() {
        if !emitted[i] {
            emit(edit, &[], &mut out)?;
        }
    }
    Ok(out)
}

fn emit(edit: &(u32, Edit), current: &[u8], out: &mut Vec<u8>) -> Result<(), WireError> {
    match &edit.1 {
        Edit::Replace(bytes) => out.extend_from_slice(bytes),
        Edit::Nested(inner) => {
            let payload = apply(current, inner)?;
            write_varint(u64::from(edit.0) << 3 | 2, out);
            write_varint(payload.len() as u64, out);
            out.extend_from_slice(&payload);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_field_is_the_last_record_of_it() {
        let mut msg = Vec::new();
        for (field, value) in [(1u8, "a"), (2, "x"), (1, "sandbox")] {
            msg.extend([field << 3 | 2, value.len() as u8]);
            msg.extend(value.as_bytes());
        }
        msg.extend([3 << 3, 7]);
        assert_eq!(string_field(&msg, 1), Some("sandbox"));
        assert_eq!(string_field(&msg, 2), Some("x"));
        assert_eq!(string_field(&msg, 3), None, "a varint");
        assert_eq!(string_field(&msg, 4), None, "absent");
        assert_eq!(string_field(&msg[..msg.len() - 1], 1), None, "not valid protobuf");
    }
    use k8s_cri::v1 as cri;
    use proptest::prelude::*;
    use prost::Message;

    fn create_request() -> cri::CreateContainerRequest {
        cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "c".into(), attempt: 1 }),
                command: vec!["sleep".into(), "1".into()],
                envs: vec![cri::KeyValue { key: "A".into(), value: "1".into() }],
                annotations: [("x".to_string(), "y".to_string())].into(),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_shares: 2,
                        cpuset_cpus: "0-1".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: None,
        }
    }

    fn shares_edit(shares: i64) -> Vec<(u32, Edit)> {
        let field = cri::LinuxContainerResources { cpu_shares: shares, ..Default::default() }.encode_to_vec();
        vec![(2, Edit::Nested(vec![(15, Edit::Nested(vec![(1, Edit::Nested(vec![(3, Edit::Replace(field))]))]))]))]
    }

    #[test]
    fn no_edits_is_identity() {
        let bytes = create_request().encode_to_vec();
        assert_eq!(apply(&bytes, &[]).unwrap(), bytes);
    }

    #[test]
    fn nested_edit_changes_only_that_field() {
        let req = create_request();
        let out = apply(&req.encode_to_vec(), &shares_edit(512)).unwrap();
        let mut want = req.clone();
        want.config.as_mut().unwrap().linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_shares = 512;
        assert_eq!(cri::CreateContainerRequest::decode(out.as_slice()).unwrap(), want);
    }

    #[test]
    fn replace_with_empty_removes_and_absent_parents_are_created() {
        let mut req = create_request();
        req.config.as_mut().unwrap().linux = None;
        let out = apply(&req.encode_to_vec(), &shares_edit(7)).unwrap();
        let got = cri::CreateContainerRequest::decode(out.as_slice()).unwrap();
        assert_eq!(got.config.unwrap().linux.unwrap().resources.unwrap().cpu_shares, 7);

        let clear = vec![(1, Edit::Replace(Vec::new()))];
        let out = apply(&create_request().encode_to_vec(), &clear).unwrap();
        assert_eq!(cri::CreateContainerRequest::decode(out.as_slice()).unwrap().pod_sandbox_id, "");
    }

    #[test]
    fn unknown_fields_survive_an_edit() {
        let mut bytes = create_request().encode_to_vec();
        // Unknown field 99 (string "new") at top level.
        bytes.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']);
        let out = apply(&bytes, &shares_edit(512)).unwrap();
        assert!(out.ends_with(&[0x9a, 0x06, 3, b'n', b'e', b'w']));
    }

    #[test]
    fn errors_instead_of_panics() {
        assert_eq!(apply(&[0x0a, 5, 1], &shares_edit(1)), Err(WireError::Truncated(3)));
        assert!(matches!(apply(&[0x0b], &shares_edit(1)), Err(WireError::WireType { .. })));
        // Field 2 as a varint cannot be edited inside.
        assert!(matches!(apply(&[0x10, 1], &shares_edit(1)), Err(WireError::NotAMessage { field: 2, .. })));
    }

    proptest! {
        #[test]
        fn never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = apply(&bytes, &shares_edit(3));
        }

        #[test]
        fn edit_equals_typed_change(shares in 1i64..1_000_000, name in "[a-z]{0,12}", annotations in proptest::collection::hash_map("[a-z]{1,5}", "[a-z]{0,5}", 0..4)) {
            let mut req = create_request();
            req.config.as_mut().unwrap().metadata.as_mut().unwrap().name = name;
            let edits = {
                let mut e = shares_edit(shares);
                let anns =
                    cri::ContainerConfig { annotations: annotations.clone(), ..Default::default() }.encode_to_vec();
                if let Edit::Nested(inner) = &mut e[0].1 { inner.push((10, Edit::Replace(anns))); }
                e
            };
            let out = apply(&req.encode_to_vec(), &edits).unwrap();
            let mut want = req.clone();
            let cfg = want.config.as_mut().unwrap();
            cfg.linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_shares = shares;
            cfg.annotations = annotations;
            prop_assert_eq!(cri::CreateContainerRequest::decode(out.as_slice()).unwrap(), want);
        }
    }
}
