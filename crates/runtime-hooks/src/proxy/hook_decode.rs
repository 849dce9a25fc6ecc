//! The two hook requests decoded in one pass, without trusting their strings to be UTF-8.
//!
//! [`Lenient<T>`] is hook-api's message `T` with a decoder of our own, wire-compatible with
//! prost's: the protobuf is read once, straight into `T` (no intermediate view), with the
//! lenient rules of [`crate::lenient`]:
//!
//! * only what a plugin reads is materialised: of the pod's labels and annotations the keys of
//!   [`POD_LABELS_READ`] and [`POD_ANNOTATIONS_READ`]; the container's annotations and envs, which
//!   no plugin reads, not at all (skipped over in the buffer, nothing allocated). A pod author's
//!   15 MiB of envs (`envFrom` large ConfigMaps) or annotations thus cost the buffer tonic already
//!   holds, not a map of 1.3 M entries ([`crate::proxy::hook_wire`] echoes the envs from that buffer
//!   when a plugin changes one);
//! * a map entry kept (those keys, and `unified` in full) whose key or value is not UTF-8 is left
//!   out ([`hook_api::utf8`]); entries are taken in wire order, so of a duplicated key the last entry
//!   decides (protobuf's rule): when it is left out, so is the key;
//! * the other strings (names, IDs, cgroup parent, cpusets, hugepage sizes — kubelet's own or
//!   validated by the API server) are read lossily (U+FFFD) should one ever not be UTF-8;
//! * fields this version does not know are skipped, as prost skips them; a repeated scalar or
//!   string field keeps its last value, a repeated message field is merged (protobuf's rules);
//! * bytes that are not protobuf (a truncated field, a wrong wire type) are a [`DecodeError`]
//!   naming the message and field, as prost's.
//!
//! Encoding a [`Lenient<T>`] is `T`'s own encoding.

use std::collections::BTreeMap;

use hook_api::utf8::utf8_entry;
use hook_api::v1alpha1 as api;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    bytes, check_wire_type, decode_key, decode_varint, int64, message, skip_field, uint32, uint64, DecodeContext,
    WireType,
};
use prost::{DecodeError, Message};

use crate::lenient::BytesEntry;
use crate::plugins::{POD_ANNOTATIONS_READ, POD_LABELS_READ};

/// Message `T` decoded leniently (see the module docs); `.0` is the message.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lenient<T>(pub T);

/// Reads a `string` field lossily: bytes that are not UTF-8 become U+FFFD.
fn merge_lossy(
    wire_type: WireType,
    value: &mut String,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let mut raw = std::mem::take(value).into_bytes();
    bytes::merge(wire_type, &mut raw, buf, ctx)?;
    *value = String::from_utf8(raw).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    Ok(())
}

/// Which entries of a `map<string, string>` field are kept.
#[derive(Clone, Copy)]
enum Keep {
    /// Every entry (`unified`: kubelet's own, echoed in the resources).
    All,
    /// The entries of these keys only (the pod's labels and annotations plugins read).
    Keys(&'static [&'static str]),
}

impl Keep {
    fn wants(self, key: &[u8]) -> bool {
        match self {
            Keep::All => true,
            Keep::Keys(keys) => keys.iter().any(|k| k.as_bytes() == key),
        }
    }
}

/// Takes one length-delimited field's payload off the front of `rest` (after its key).
///
/// Errors: the length runs past the end, as prost reports it.
pub(crate) fn take_delimited<'a>(rest: &mut &'a [u8], tag: u32, ctx: DecodeContext) -> Result<&'a [u8], DecodeError> {
    let mut before: &'a [u8] = rest;
    skip_field(WireType::LengthDelimited, tag, rest, ctx)?;
    let len = decode_varint(&mut before)? as usize;
    Ok(&before[..len])
}

/// The key and value of a map entry's encoded body, as slices of it (unknown fields skipped;
/// an absent key or value is empty).
///
/// Errors: the body is not protobuf, or a key or value is not length-delimited.
pub(crate) fn entry_parts(body: &[u8], ctx: DecodeContext) -> Result<(&[u8], &[u8]), DecodeError> {
    let (mut rest, mut key, mut value) = (body, &body[..0], &body[..0]);
    while !rest.is_empty() {
        let (tag, wire_type) = decode_key(&mut rest)?;
        match tag {
            1 | 2 => {
                check_wire_type(WireType::LengthDelimited, wire_type)?;
                let field = take_delimited(&mut rest, tag, ctx.clone())?;
                if tag == 1 {
                    key = field;
                } else {
                    value = field;
                }
            }
            _ => skip_field(wire_type, tag, &mut rest, ctx.clone())?,
        }
    }
    Ok((key, value))
}

/// Reads one entry of a `map<string, string>` field: inserted when `keep` wants its key and its
/// key and value are both UTF-8; otherwise left out, and an earlier entry of its key removed (the
/// last entry decides, `hook_api::utf8`). The entry is read in place (nothing is
/// allocated for an entry left out) when the buffer is contiguous, as tonic's is.
fn merge_entry(
    wire_type: WireType,
    map: &mut BTreeMap<String, String>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
    keep: Keep,
) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    if buf.chunk().len() < buf.remaining() {
        let mut entry = BytesEntry::default();
        message::merge(wire_type, &mut entry, buf, ctx)?;
        if keep.wants(&entry.key) {
            if let Ok(key) = String::from_utf8(entry.key) {
                match String::from_utf8(entry.value) {
                    Ok(value) => map.insert(key, value),
                    Err(_) => map.remove(&key),
                };
            }
        }
        return Ok(());
    }
    let chunk = buf.chunk();
    let mut rest = chunk;
    let body = take_delimited(&mut rest, 1, ctx.clone())?;
    let (key, value) = entry_parts(body, ctx)?;
    if keep.wants(key) {
        match utf8_entry(key, value) {
            Some((key, value)) => map.insert(key.to_owned(), value.to_owned()),
            // A later entry of the key decides (`hook_api::utf8`): one that is not UTF-8 drops it.
            None => std::str::from_utf8(key).ok().and_then(|key| map.remove(key)),
        };
    }
    let used = chunk.len() - rest.len();
    buf.advance(used);
    Ok(())
}

/// Skips a `map<string, string>` field no plugin reads, without looking into it.
///
/// Errors: it is not length-delimited, or runs past the end.
fn skip_map_field(wire_type: WireType, tag: u32, buf: &mut impl Buf, ctx: DecodeContext) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    skip_field(wire_type, tag, buf, ctx)
}

/// Reads a message field into `slot` (merged into what is there, protobuf's rule), leniently.
fn merge_nested<T: Default>(
    wire_type: WireType,
    slot: &mut T,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError>
where
    Lenient<T>: Message,
{
    let mut lenient = Lenient(std::mem::take(slot));
    let result = message::merge(wire_type, &mut lenient, buf, ctx);
    *slot = lenient.0;
    result
}

/// [`merge_nested`] for an optional field: present afterwards.
fn merge_optional<T: Default>(
    wire_type: WireType,
    slot: &mut Option<T>,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError>
where
    Lenient<T>: Message,
{
    merge_nested(wire_type, slot.get_or_insert_with(T::default), buf, ctx)
}

/// Names the field of a failed decode in the error, as prost's derived decoders do.
fn in_field(result: Result<(), DecodeError>, message: &'static str, field: &'static str) -> Result<(), DecodeError> {
    result.map_err(|mut e| {
        e.push(message, field);
        e
    })
}

/// `Message` for `Lenient<$t>`: `merge_field` by the given match (the tag, wire type, buffer
/// and context bound to the names given), everything else `$t`'s own.
macro_rules! lenient_message {
    (
        $t:ty, $name:literal,
        |$m:ident, $tag:ident, $wt:ident, $buf:ident, $ctx:ident|
        { $($field:literal => ($num:pat, $merge:expr)),* $(,)? }
    ) => {
        impl Message for Lenient<$t> {
            fn encode_raw(&self, buf: &mut impl BufMut) {
                self.0.encode_raw(buf)
            }
            fn merge_field(
                &mut self,
                $tag: u32,
                $wt: WireType,
                $buf: &mut impl Buf,
                $ctx: DecodeContext,
            ) -> Result<(), DecodeError> {
                let $m = &mut self.0;
                match $tag {
                    $($num => in_field($merge, $name, $field),)*
                    _ => skip_field($wt, $tag, $buf, $ctx),
                }
            }
            fn encoded_len(&self) -> usize {
                self.0.encoded_len()
            }
            fn clear(&mut self) {
                self.0.clear()
            }
        }
    };
}

lenient_message!(api::PodSandboxMetadata, "PodSandboxMetadata", |m, tag, wt, buf, ctx| {
    "name" => (1, merge_lossy(wt, &mut m.name, buf, ctx)),
    "uid" => (2, merge_lossy(wt, &mut m.uid, buf, ctx)),
    "namespace" => (3, merge_lossy(wt, &mut m.namespace, buf, ctx)),
    "attempt" => (4, uint32::merge(wt, &mut m.attempt, buf, ctx)),
});

lenient_message!(api::ContainerMetadata, "ContainerMetadata", |m, tag, wt, buf, ctx| {
    "name" => (1, merge_lossy(wt, &mut m.name, buf, ctx)),
    "attempt" => (2, uint32::merge(wt, &mut m.attempt, buf, ctx)),
    "id" => (3, merge_lossy(wt, &mut m.id, buf, ctx)),
});

lenient_message!(api::HugepageLimit, "HugepageLimit", |m, tag, wt, buf, ctx| {
    "page_size" => (1, merge_lossy(wt, &mut m.page_size, buf, ctx)),
    "limit" => (2, uint64::merge(wt, &mut m.limit, buf, ctx)),
});

lenient_message!(api::LinuxContainerResources, "LinuxContainerResources", |m, tag, wt, buf, ctx| {
    "cpu_period" => (1, int64::merge(wt, &mut m.cpu_period, buf, ctx)),
    "cpu_quota" => (2, int64::merge(wt, &mut m.cpu_quota, buf, ctx)),
    "cpu_shares" => (3, int64::merge(wt, &mut m.cpu_shares, buf, ctx)),
    "memory_limit_in_bytes" => (4, int64::merge(wt, &mut m.memory_limit_in_bytes, buf, ctx)),
    "oom_score_adj" => (5, int64::merge(wt, &mut m.oom_score_adj, buf, ctx)),
    "cpuset_cpus" => (6, merge_lossy(wt, &mut m.cpuset_cpus, buf, ctx)),
    "cpuset_mems" => (7, merge_lossy(wt, &mut m.cpuset_mems, buf, ctx)),
    "hugepage_limits" => (8, {
        let mut limit = api::HugepageLimit::default();
        merge_nested(wt, &mut limit, buf, ctx).map(|()| m.hugepage_limits.push(limit))
    }),
    "unified" => (9, merge_entry(wt, &mut m.unified, buf, ctx, Keep::All)),
    "memory_swap_limit_in_bytes" => (10, int64::merge(wt, &mut m.memory_swap_limit_in_bytes, buf, ctx)),
});

lenient_message!(api::PodSandboxHookRequest, "PodSandboxHookRequest", |m, tag, wt, buf, ctx| {
    "pod_meta" => (1, merge_optional(wt, &mut m.pod_meta, buf, ctx)),
    "runtime_handler" => (2, merge_lossy(wt, &mut m.runtime_handler, buf, ctx)),
    "labels" => (3, merge_entry(wt, &mut m.labels, buf, ctx, Keep::Keys(POD_LABELS_READ))),
    "annotations" => (4, merge_entry(wt, &mut m.annotations, buf, ctx, Keep::Keys(POD_ANNOTATIONS_READ))),
    "cgroup_parent" => (5, merge_lossy(wt, &mut m.cgroup_parent, buf, ctx)),
    "overhead" => (6, merge_optional(wt, &mut m.overhead, buf, ctx)),
    "resources" => (7, merge_optional(wt, &mut m.resources, buf, ctx)),
});

lenient_message!(api::ContainerResourceHookRequest, "ContainerResourceHookRequest", |m, tag, wt, buf, ctx| {
    "pod_meta" => (1, merge_optional(wt, &mut m.pod_meta, buf, ctx)),
    "container_meta" => (2, merge_optional(wt, &mut m.container_meta, buf, ctx)),
    "container_annotations" => (3, skip_map_field(wt, tag, buf, ctx)),
    "container_resources" => (4, merge_optional(wt, &mut m.container_resources, buf, ctx)),
    "pod_resources" => (5, merge_optional(wt, &mut m.pod_resources, buf, ctx)),
    "pod_annotations" => (6, merge_entry(wt, &mut m.pod_annotations, buf, ctx, Keep::Keys(POD_ANNOTATIONS_READ))),
    "pod_labels" => (7, merge_entry(wt, &mut m.pod_labels, buf, ctx, Keep::Keys(POD_LABELS_READ))),
    "pod_cgroup_parent" => (8, merge_lossy(wt, &mut m.pod_cgroup_parent, buf, ctx)),
    "container_envs" => (9, skip_map_field(wt, tag, buf, ctx)),
});

#[cfg(test)]
mod tests {
    use super::*;
    use prost::encoding::{encode_key, encode_varint};

    const NOT_UTF8: &[u8] = b"\xff\xfebin\x00\x80!";

    /// A length-delimited field `tag` holding `body`.
    fn field(tag: u32, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(tag, WireType::LengthDelimited, &mut out);
        encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(body);
        out
    }

    /// A map entry field `tag`: key, value, and `extra` bytes (an unknown field) after them.
    fn entry(tag: u32, key: &[u8], value: &[u8], extra: &[u8]) -> Vec<u8> {
        field(tag, &[field(1, key), field(2, value), extra.to_vec()].concat())
    }

    fn container(wire: &[u8]) -> Result<api::ContainerResourceHookRequest, DecodeError> {
        Lenient::<api::ContainerResourceHookRequest>::decode(wire).map(|l| l.0)
    }

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const CLASS: &str = crate::context::QOS_CLASS_KEY;
    const POLICY: &str = crate::plugins::core_sched::LABEL_POLICY;
    const DEVICES: &str = crate::plugins::devices::DEVICE_ALLOCATED;

    /// Entries whose key or value is not UTF-8 are left out, in every map kept of both
    /// requests; the others are kept.
    #[test]
    fn entries_not_utf8_are_left_out() {
        for (tag, key) in [(6, DEVICES), (7, CLASS)] {
            let wire = [
                entry(tag, key.as_bytes(), NOT_UTF8, b""),
                entry(tag, NOT_UTF8, b"bad key", b""),
                entry(tag, POLICY.as_bytes(), b"x", b""),
            ]
            .concat();
            let got = container(&wire).unwrap();
            let kept = if tag == 6 { &got.pod_annotations } else { &got.pod_labels };
            assert!(kept.is_empty() || (tag == 7 && kept == &map(&[(POLICY, "x")])), "tag {tag}: {got:?}");
            let wire = [entry(tag, key.as_bytes(), NOT_UTF8, b""), entry(tag, key.as_bytes(), b"yes", b"")].concat();
            let got = container(&wire).unwrap();
            let kept = if tag == 6 { &got.pod_annotations } else { &got.pod_labels };
            assert_eq!(kept, &map(&[(key, "yes")]), "tag {tag}");
        }
        for (tag, key) in [(3, CLASS), (4, DEVICES)] {
            let wire = [
                entry(tag, key.as_bytes(), NOT_UTF8, b""),
                entry(tag, b"a", b"1", b""),
                entry(tag, key.as_bytes(), b"1", b""),
            ]
            .concat();
            let got = Lenient::<api::PodSandboxHookRequest>::decode(wire.as_slice()).unwrap().0;
            let kept = if tag == 3 { &got.labels } else { &got.annotations };
            assert_eq!(kept, &map(&[(key, "1")]), "tag {tag}");
        }
        let resources = entry(9, b"memory.high", NOT_UTF8, b"");
        let got = container(&field(4, &[resources, entry(9, b"cpu.idle", b"1", b"")].concat())).unwrap();
        assert_eq!(got.container_resources.unwrap().unified, map(&[("cpu.idle", "1")]));
    }

    /// Only what a plugin reads is kept: of the pod's labels and annotations the keys plugins
    /// read, of the container's annotations and envs nothing; `unified` in full. A map field
    /// that is not length-delimited is still an error.
    #[test]
    fn only_what_plugins_read_is_kept() {
        let wire = [
            entry(3, b"io.kubernetes.container.hash", b"1", b""),
            entry(9, b"PATH", b"/bin", b""),
            entry(9, b"HUGE", &[b'x'; 4096], b""),
            entry(6, DEVICES.as_bytes(), b"{}", b""),
            entry(6, b"note", b"kept by nobody", b""),
            entry(7, CLASS.as_bytes(), b"BE", b""),
            entry(7, b"app", b"web", b""),
        ]
        .concat();
        let got = container(&wire).unwrap();
        assert!(got.container_annotations.is_empty() && got.container_envs.is_empty(), "{got:?}");
        assert_eq!(got.pod_annotations, map(&[(DEVICES, "{}")]));
        assert_eq!(got.pod_labels, map(&[(CLASS, "BE")]));
        for key in crate::plugins::POD_LABELS_READ {
            let got = container(&entry(7, key.as_bytes(), b"v", b"")).unwrap();
            assert_eq!(got.pod_labels, map(&[(key, "v")]), "{key}");
        }
        for key in crate::plugins::POD_ANNOTATIONS_READ {
            let got = container(&entry(6, key.as_bytes(), b"v", b"")).unwrap();
            assert_eq!(got.pod_annotations, map(&[(key, "v")]), "{key}");
        }
        for tag in [3, 9] {
            let mut varint = Vec::new();
            encode_key(tag, WireType::Varint, &mut varint);
            encode_varint(1, &mut varint);
            assert!(container(&varint).unwrap_err().to_string().contains("wire type"), "tag {tag}");
            let truncated = entry(tag, b"K", b"V", b"");
            assert!(container(&truncated[..truncated.len() - 1]).is_err(), "tag {tag}");
        }
    }

    /// A duplicated key: the last entry decides (protobuf's rule); when it is not UTF-8 the key
    /// is left out, not given the earlier value ([`hook_api::utf8`]).
    #[test]
    fn duplicated_keys_the_last_entry_decides() {
        let (c, p) = (CLASS.as_bytes(), POLICY.as_bytes());
        let wire = [entry(7, c, b"1", b""), entry(7, c, b"2", b""), entry(7, p, b"1", b""), entry(7, p, NOT_UTF8, b"")]
            .concat();
        assert_eq!(container(&wire).unwrap().pod_labels, map(&[(CLASS, "2")]));
    }

    /// Unknown fields are skipped: at the top, inside a nested message and inside a map entry;
    /// an entry with no value is the empty value.
    #[test]
    fn unknown_fields_are_skipped() {
        let mut varint = Vec::new();
        encode_key(15, WireType::Varint, &mut varint);
        encode_varint(300, &mut varint);
        let meta = field(1, &[field(1, b"p"), varint.clone(), field(3, b"ns"), field(99, b"later field")].concat());
        let wire = [
            field(42, b"unknown"),
            meta,
            entry(7, CLASS.as_bytes(), b"v", &varint),
            field(7, &field(1, POLICY.as_bytes())),
            varint,
        ]
        .concat();
        let got = container(&wire).unwrap();
        let meta = got.pod_meta.unwrap();
        assert_eq!((meta.name.as_str(), meta.namespace.as_str()), ("p", "ns"));
        assert_eq!(got.pod_labels, map(&[(CLASS, "v"), (POLICY, "")]));
    }

    /// The other strings are read lossily; a string field given twice keeps the last; a message
    /// field given twice is merged; hugepage limits are a list.
    #[test]
    fn strings_are_lossy_and_protobufs_merge_rules_hold() {
        let wire = [
            field(8, b"/first"),
            field(8, &[b"/kubepods/".as_slice(), NOT_UTF8].concat()),
            field(2, &[field(1, b"c"), field(3, b"id-1")].concat()),
            field(2, &field(3, b"id-2")),
            field(4, &[field(8, &field(1, b"2MB")), field(8, &field(1, b"1GB")), field(6, b"0-1")].concat()),
        ]
        .concat();
        let got = container(&wire).unwrap();
        assert_eq!(got.pod_cgroup_parent, format!("/kubepods/{}", String::from_utf8_lossy(NOT_UTF8)));
        let meta = got.container_meta.unwrap();
        assert_eq!((meta.name.as_str(), meta.id.as_str()), ("c", "id-2"), "merged: name kept, last ID");
        let r = got.container_resources.unwrap();
        let sizes: Vec<&str> = r.hugepage_limits.iter().map(|h| h.page_size.as_str()).collect();
        assert_eq!((sizes, r.cpuset_cpus.as_str()), (vec!["2MB", "1GB"], "0-1"));
    }

    /// Bytes that are not protobuf are an error naming the message and the field; encoding is
    /// the real message's.
    #[test]
    fn broken_bytes_are_an_error_naming_the_field() {
        let truncated = [field(1, &field(1, b"pod"))[..5].to_vec()].concat();
        let e = container(&truncated).unwrap_err().to_string();
        assert!(e.contains("ContainerResourceHookRequest.pod_meta"), "{e}");
        let mut wrong_type = Vec::new();
        encode_key(8, WireType::Varint, &mut wrong_type);
        encode_varint(1, &mut wrong_type);
        let e = container(&wrong_type).unwrap_err().to_string();
        assert!(e.contains("pod_cgroup_parent") && e.contains("wire type"), "{e}");
        let req = api::ContainerResourceHookRequest { pod_labels: map(&[("a", "b")]), ..Default::default() };
        assert_eq!(Lenient(req.clone()).encode_to_vec(), req.encode_to_vec());
    }
}
