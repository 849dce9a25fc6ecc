//! The two hook requests encoded in one pass: exactly the bytes prost writes for them
//! (`Message::encode`), without prost's per-field length computations and buffer checks.
//!
//! # Why
//!
//! The proxy encodes a hook request for every hook call; a kubelet-sized PreCreateContainer
//! request has some sixty map entries (labels, annotations, envs). prost computes each nested
//! message's and each map entry's length once for the parent's length and again when it writes
//! it, through a generic buffer: about 20,000 instructions per request (callgrind,
//! docs/benchmarks.md). Here map entries — which carry no length of their own beyond their
//! two strings' — are written straight, and only the few small nested messages (metadata,
//! resources) are measured first.
//!
//! # The format (protobuf's, as prost writes it)
//!
//! Fields in tag order; a field at its default (0, "", an empty map or list) left out, an
//! optional message present even when empty; map entries in the map's order (a `BTreeMap`:
//! sorted by key), each entry's key and value left out when empty. The property tests hold the
//! output to prost's byte for byte.

use std::collections::BTreeMap;

use crate::v1alpha1::{
    ContainerMetadata, ContainerResourceHookRequest, HugepageLimit, LinuxContainerResources, PodSandboxHookRequest,
    PodSandboxMetadata,
};

/// Appends the encoding of a PreRunPodSandbox / PostStopPodSandbox request to `out`.
pub fn pod_request(r: &PodSandboxHookRequest, out: &mut Vec<u8>) {
    out.reserve(pod_request_hint(r));
    if let Some(m) = &r.pod_meta {
        put_message(out, 1, pod_meta_len(m), |out| put_pod_meta(out, m));
    }
    put_str(out, 2, &r.runtime_handler);
    put_map(out, 3, &r.labels);
    put_map(out, 4, &r.annotations);
    put_str(out, 5, &r.cgroup_parent);
    if let Some(res) = &r.overhead {
        put_message(out, 6, resources_len(res), |out| put_resources(out, res));
    }
    if let Some(res) = &r.resources {
        put_message(out, 7, resources_len(res), |out| put_resources(out, res));
    }
}

/// Appends the encoding of a container-level hook request (PreCreateContainer,
/// PreStartContainer, PostStartContainer, PreUpdateContainerResources, PostStopContainer) to
/// `out`.
pub fn container_request(r: &ContainerResourceHookRequest, out: &mut Vec<u8>) {
    out.reserve(container_request_hint(r));
    if let Some(m) = &r.pod_meta {
        put_message(out, 1, pod_meta_len(m), |out| put_pod_meta(out, m));
    }
    if let Some(m) = &r.container_meta {
        put_message(out, 2, container_meta_len(m), |out| put_container_meta(out, m));
    }
    put_map(out, 3, &r.container_annotations);
    if let Some(res) = &r.container_resources {
        put_message(out, 4, resources_len(res), |out| put_resources(out, res));
    }
    if let Some(res) = &r.pod_resources {
        put_message(out, 5, resources_len(res), |out| put_resources(out, res));
    }
    put_map(out, 6, &r.pod_annotations);
    put_map(out, 7, &r.pod_labels);
    put_str(out, 8, &r.pod_cgroup_parent);
    put_map(out, 9, &r.container_envs);
}

/// Room to reserve for a pod request: its strings plus 8 bytes of framing per entry (a close
/// upper bound for entries under 128 bytes; a longer one only makes the vector grow once).
fn pod_request_hint(r: &PodSandboxHookRequest) -> usize {
    64 + r.runtime_handler.len() + r.cgroup_parent.len() + map_hint(&r.labels) + map_hint(&r.annotations)
}

/// As [`pod_request_hint`].
fn container_request_hint(r: &ContainerResourceHookRequest) -> usize {
    128 + r.pod_cgroup_parent.len()
        + map_hint(&r.container_annotations)
        + map_hint(&r.pod_annotations)
        + map_hint(&r.pod_labels)
        + map_hint(&r.container_envs)
}

fn map_hint(map: &BTreeMap<String, String>) -> usize {
    map.iter().map(|(k, v)| 8 + k.len() + v.len()).sum()
}

const VARINT: u8 = 0;
const LEN: u8 = 2;

/// Appends a field key (tag and wire type).
fn put_key(out: &mut Vec<u8>, field: u32, wire: u8) {
    put_varint(out, u64::from(field << 3 | u32::from(wire)));
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Bytes of `v` as a varint.
fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least 1.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Bytes of a field key (tags under 16 take one).
fn key_len(field: u32) -> usize {
    varint_len(u64::from(field << 3))
}

/// A length-delimited field of `len` bytes: its key, length and payload.
fn delimited_len(field: u32, len: usize) -> usize {
    key_len(field) + varint_len(len as u64) + len
}

fn str_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(field, s.len())
    }
}

fn put_str(out: &mut Vec<u8>, field: u32, s: &str) {
    if !s.is_empty() {
        put_key(out, field, LEN);
        put_varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
}

/// int64, uint32 and uint64 fields: a varint of the value's two's complement (10 bytes for a
/// negative int64).
fn varint_field_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + varint_len(v)
    }
}

fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(out, field, VARINT);
        put_varint(out, v);
    }
}

/// A nested message of `len` bytes written by `body`.
fn put_message(out: &mut Vec<u8>, field: u32, len: usize, body: impl FnOnce(&mut Vec<u8>)) {
    put_key(out, field, LEN);
    put_varint(out, len as u64);
    body(out);
}

/// One entry per field occurrence, key (1) and value (2) each left out when empty.
fn put_map(out: &mut Vec<u8>, field: u32, map: &BTreeMap<String, String>) {
    for (k, v) in map {
        put_key(out, field, LEN);
        put_varint(out, (str_len(1, k) + str_len(2, v)) as u64);
        put_str(out, 1, k);
        put_str(out, 2, v);
    }
}

fn map_len(field: u32, map: &BTreeMap<String, String>) -> usize {
    map.iter().map(|(k, v)| delimited_len(field, str_len(1, k) + str_len(2, v))).sum()
}

fn pod_meta_len(m: &PodSandboxMetadata) -> usize {
    str_len(1, &m.name) + str_len(2, &m.uid) + str_len(3, &m.namespace) + varint_field_len(4, u64::from(m.attempt))
}

fn put_pod_meta(out: &mut Vec<u8>, m: &PodSandboxMetadata) {
    put_str(out, 1, &m.name);
    put_str(out, 2, &m.uid);
    put_str(out, 3, &m.namespace);
    put_varint_field(out, 4, u64::from(m.attempt));
}

fn container_meta_len(m: &ContainerMetadata) -> usize {
    str_len(1, &m.name) + varint_field_len(2, u64::from(m.attempt)) + str_len(3, &m.id)
}

fn put_container_meta(out: &mut Vec<u8>, m: &ContainerMetadata) {
    put_str(out, 1, &m.name);
    put_varint_field(out, 2, u64::from(m.attempt));
    put_str(out, 3, &m.id);
}

fn hugepage_len(h: &HugepageLimit) -> usize {
    str_len(1, &h.page_size) + varint_field_len(2, h.limit)
}

fn resources_len(r: &LinuxContainerResources) -> usize {
    varint_field_len(1, r.cpu_period as u64)
        + varint_field_len(2, r.cpu_quota as u64)
        + varint_field_len(3, r.cpu_shares as u64)
        + varint_field_len(4, r.memory_limit_in_bytes as u64)
        + varint_field_len(5, r.oom_score_adj as u64)
        + str_len(6, &r.cpuset_cpus)
        + str_len(7, &r.cpuset_mems)
        + r.hugepage_limits.iter().map(|h| delimited_len(8, hugepage_len(h))).sum::<usize>()
        + map_len(9, &r.unified)
        + varint_field_len(10, r.memory_swap_limit_in_bytes as u64)
}

fn put_resources(out: &mut Vec<u8>, r: &LinuxContainerResources) {
    put_varint_field(out, 1, r.cpu_period as u64);
    put_varint_field(out, 2, r.cpu_quota as u64);
    put_varint_field(out, 3, r.cpu_shares as u64);
    put_varint_field(out, 4, r.memory_limit_in_bytes as u64);
    put_varint_field(out, 5, r.oom_score_adj as u64);
    put_str(out, 6, &r.cpuset_cpus);
    put_str(out, 7, &r.cpuset_mems);
    for h in &r.hugepage_limits {
        put_message(out, 8, hugepage_len(h), |out| {
            put_str(out, 1, &h.page_size);
            put_varint_field(out, 2, h.limit);
        });
    }
    put_map(out, 9, &r.unified);
    put_varint_field(out, 10, r.memory_swap_limit_in_bytes as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn text() -> impl Strategy<Value = String> {
        // Empty strings (left out), multi-byte UTF-8, and lengths past one varint byte.
        prop_oneof![Just(String::new()), "\\PC{0,6}", "[a-z]{120,140}"]
    }

    fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(text(), text(), 0..5)
    }

    fn number() -> impl Strategy<Value = i64> {
        prop_oneof![Just(0i64), -1000i64..1000, any::<i64>()]
    }

    fn resources() -> impl Strategy<Value = LinuxContainerResources> {
        (
            (number(), number(), number(), number(), number()),
            (text(), text(), proptest::collection::vec((text(), any::<u64>()), 0..3), map(), number()),
        )
            .prop_map(|((period, quota, shares, memory, oom), (cpus, mems, huge, unified, swap))| {
                LinuxContainerResources {
                    cpu_period: period,
                    cpu_quota: quota,
                    cpu_shares: shares,
                    memory_limit_in_bytes: memory,
                    oom_score_adj: oom,
                    cpuset_cpus: cpus,
                    cpuset_mems: mems,
                    hugepage_limits: huge
                        .into_iter()
                        .map(|(page_size, limit)| HugepageLimit { page_size, limit })
                        .collect(),
                    unified,
                    memory_swap_limit_in_bytes: swap,
                }
            })
    }

    fn pod_meta() -> impl Strategy<Value = Option<PodSandboxMetadata>> {
        proptest::option::of(
            (text(), text(), text(), any::<u32>()).prop_map(|(name, uid, namespace, attempt)| PodSandboxMetadata {
                name,
                uid,
                namespace,
                attempt,
            }),
        )
    }

    proptest! {
        #[test]
        fn container_requests_encode_as_prost_encodes_them(
            pod in pod_meta(),
            container in proptest::option::of((text(), any::<u32>(), text())),
            maps in (map(), map(), map(), map()),
            res in (proptest::option::of(resources()), proptest::option::of(resources())),
            parent in text(),
        ) {
            let r = ContainerResourceHookRequest {
                pod_meta: pod,
                container_meta: container.map(|(name, attempt, id)| ContainerMetadata { name, attempt, id }),
                container_annotations: maps.0,
                container_resources: res.0,
                pod_resources: res.1,
                pod_annotations: maps.1,
                pod_labels: maps.2,
                pod_cgroup_parent: parent,
                container_envs: maps.3,
            };
            let mut out = Vec::new();
            container_request(&r, &mut out);
            prop_assert_eq!(out, r.encode_to_vec());
        }

        #[test]
        fn pod_requests_encode_as_prost_encodes_them(
            pod in pod_meta(),
            strings in (text(), text()),
            maps in (map(), map()),
            res in (proptest::option::of(resources()), proptest::option::of(resources())),
        ) {
            let r = PodSandboxHookRequest {
                pod_meta: pod,
                runtime_handler: strings.0,
                labels: maps.0,
                annotations: maps.1,
                cgroup_parent: strings.1,
                overhead: res.0,
                resources: res.1,
            };
            let mut out = vec![7];
            pod_request(&r, &mut out);
            prop_assert_eq!(out[0], 7, "appended");
            prop_assert_eq!(&out[1..], &r.encode_to_vec()[..]);
        }
    }

    #[test]
    fn varint_lengths() {
        for (v, n) in [(0u64, 1), (127, 1), (128, 2), (16_383, 2), (16_384, 3), (u64::MAX, 10)] {
            assert_eq!(varint_len(v), n, "{v}");
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), n, "{v}");
        }
    }
}
