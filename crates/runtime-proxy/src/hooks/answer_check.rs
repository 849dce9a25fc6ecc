//! Whether a hook server's answer changes the hook request, read from the answer's bytes
//! without decoding it.
//!
//! koordlet answers every hook call with the whole request echoed (its maps included), and
//! most answers change nothing. Decoding such an answer into the hook-api message (a
//! `BTreeMap<String, String>` per map, each key and value an owned string hashed with SipHash)
//! was the largest part of a hook call's own cost; [`container_unchanged`] and [`pod_unchanged`]
//! walk the answer's protobuf wire format instead and compare each field with the request as it
//! lies in the buffer.
//!
//! Both answer `true` only when they are sure: the bytes are a message prost would decode (the
//! fields the merge rules read have their wire types, strings are UTF-8, nested messages
//! decode), and [`hook_api::merge`] applying it would change nothing (the same conditions as
//! [`hook_api::merge::container_response_changes`] and
//! [`hook_api::merge::pod_response_changes`]). Anything else — a change, a field repeated in a way
//! whose merged value needs the decode (a second `container_resources`), a malformed message —
//! answers `false`, and the dispatcher decodes the answer as before, which gives the exact
//! answer or the decode error. A property test holds them to that.

use hook_api::v1alpha1::{ContainerResourceHookRequest, HugepageLimit, LinuxContainerResources, PodSandboxHookRequest};
use prost::Message;
use std::collections::BTreeMap;

/// One field of a message as it lies on the wire.
enum Field<'a> {
    /// Wire type 0: a varint, as the `u64` it encodes.
    Varint(u64),
    /// Wire type 2: length-delimited bytes (a string, a nested message, a map entry).
    Bytes(&'a [u8]),
    /// Wire types 1 and 5 (fixed 64 and 32 bits): never a field the merge rules read.
    Fixed,
}

/// Reads the fields of one message, in order.
struct Fields<'a> {
    buf: &'a [u8],
}

impl<'a> Fields<'a> {
    /// A varint, as prost reads it: at most 10 bytes, the tenth at most 1. `None` when
    /// malformed or cut off.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.buf.split_first()?;
            self.buf = rest;
            if i == 9 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// The next field (its number and value); `Some(None)` at the end of the message, `None`
    /// when the bytes are not a message (a bad key, a group, a field past the end).
    fn next_field(&mut self) -> Option<Option<(u32, Field<'a>)>> {
        if self.buf.is_empty() {
            return Some(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).ok().filter(|n| *n != 0)?;
        let field = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 | 5 => {
                let len = if key & 7 == 1 { 8 } else { 4 };
                self.buf = self.buf.get(len..)?;
                Field::Fixed
            }
            2 => {
                let len = usize::try_from(self.varint()?).ok()?;
                let (bytes, rest) = (self.buf.get(..len)?, self.buf.get(len..)?);
                self.buf = rest;
                Field::Bytes(bytes)
            }
            // Groups (3, 4) and the undefined wire types: left to the decode.
            _ => return None,
        };
        Some(Some((number, field)))
    }
}

/// A `map<string, string>` entry's key and value as they lie on the wire (empty when absent,
/// the last occurrence when repeated, as prost reads them). `None` when malformed.
fn raw_entry(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (mut key, mut value): (&[u8], &[u8]) = (b"", b"");
    let mut fields = Fields { buf: bytes };
    while let Some((number, field)) = fields.next_field()? {
        match (number, field) {
            (1, Field::Bytes(b)) => key = b,
            (2, Field::Bytes(b)) => value = b,
            (1 | 2, _) => return None,
            _ => {}
        }
    }
    Some((key, value))
}

/// A request's map, walked in key order beside the answer's entries of the same map.
///
/// An answer that echoes the map in key order (a hook server built on hook-api, whose maps are
/// `BTreeMap`s, or any that sorts them) is checked one byte comparison per entry: an entry equal
/// to the next one of the request is valid UTF-8 and unchanged, with no UTF-8 check and no
/// lookup. An entry out of that order (a Go server's map order, a duplicate) is looked up.
struct Echoed<'m> {
    map: &'m BTreeMap<String, String>,
    rest: std::collections::btree_map::Iter<'m, String, String>,
    next: Option<(&'m String, &'m String)>,
}

impl<'m> Echoed<'m> {
    fn new(map: &'m BTreeMap<String, String>) -> Self {
        let mut rest = map.iter();
        let next = rest.next();
        Echoed { map, rest, next }
    }

    /// Whether the map entry `bytes` is valid and already in the map with that value (merging
    /// it changes nothing); an entry with an empty key counts as unchanged when `empty_key_ignored`
    /// (the env merge rule ignores it), provided it is valid.
    fn unchanged(&mut self, bytes: &[u8], empty_key_ignored: bool) -> bool {
        let Some((key, value)) = raw_entry(bytes) else { return false };
        if let Some((k, v)) = self.next {
            if k.as_bytes() == key && v.as_bytes() == value {
                self.next = self.rest.next();
                return true;
            }
        }
        let (Ok(key), Ok(value)) = (std::str::from_utf8(key), std::str::from_utf8(value)) else { return false };
        (empty_key_ignored && key.is_empty()) || self.map.get(key).is_some_and(|have| have == value)
    }
}

/// A string field's occurrence: `true` when it is UTF-8 and either empty or `have` (a
/// "replaces when not empty" field that this occurrence leaves as it is).
fn empty_or_same(bytes: &[u8], have: &str) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|s| s.is_empty() || s == have)
}

/// Whether an answer to a container-level stage (`ContainerResourceHookResponse` on the wire)
/// surely changes nothing in `req` (see the module documentation); `false` when unsure.
pub fn container_unchanged(req: &ContainerResourceHookRequest, answer: &[u8]) -> bool {
    let mut fields = Fields { buf: answer };
    let mut resources_seen = false;
    let (mut annotations, mut envs) = (Echoed::new(&req.container_annotations), Echoed::new(&req.container_envs));
    loop {
        let Some(next) = fields.next_field() else { return false };
        let Some((number, field)) = next else { return true };
        let unchanged = match (number, field) {
            (1, Field::Bytes(b)) => annotations.unchanged(b, false),
            (2, Field::Bytes(b)) => {
                // A second occurrence merges into the first: left to the decode.
                let first = !std::mem::replace(&mut resources_seen, true);
                first && req.container_resources.as_ref().is_some_and(|cur| resources_unchanged(cur, b))
            }
            (3, Field::Bytes(b)) => empty_or_same(b, &req.pod_cgroup_parent),
            // An env without a name is ignored by the merge rule, but must still decode.
            (4, Field::Bytes(b)) => envs.unchanged(b, true),
            (1..=4, _) => false,
            _ => true,
        };
        if !unchanged {
            return false;
        }
    }
}

/// Whether `answer` (`LinuxContainerResources` on the wire) merged into `cur` by
/// [`hook_api::merge::merge_resources`] surely changes nothing.
fn resources_unchanged(cur: &LinuxContainerResources, answer: &[u8]) -> bool {
    let mut fields = Fields { buf: answer };
    // The cpusets are taken from the answer whatever they are: absent means "".
    let (mut cpus, mut mems): (&[u8], &[u8]) = (b"", b"");
    let mut unified = Echoed::new(&cur.unified);
    loop {
        let Some(next) = fields.next_field() else { return false };
        let Some((number, field)) = next else { break };
        let unchanged = match (number, field) {
            (1, Field::Varint(v)) => v as i64 <= 0 || v as i64 == cur.cpu_period,
            (2, Field::Varint(v)) => v as i64 == 0 || v as i64 == cur.cpu_quota,
            (3, Field::Varint(v)) => v as i64 <= 0 || v as i64 == cur.cpu_shares,
            (4, Field::Varint(v)) => v as i64 <= 0 || v as i64 == cur.memory_limit_in_bytes,
            (10, Field::Varint(v)) => v as i64 <= 0 || v as i64 == cur.memory_swap_limit_in_bytes,
            (5, Field::Varint(v)) => {
                let v = v as i64;
                v == 0 || !(-1000..=1000).contains(&v) || v == cur.oom_score_adj
            }
            (6, Field::Bytes(b)) => {
                cpus = b;
                std::str::from_utf8(b).is_ok()
            }
            (7, Field::Bytes(b)) => {
                mems = b;
                std::str::from_utf8(b).is_ok()
            }
            // Never merged, but must decode.
            (8, Field::Bytes(b)) => HugepageLimit::decode(b).is_ok(),
            (9, Field::Bytes(b)) => unified.unchanged(b, false),
            (1..=10, _) => false,
            _ => true,
        };
        if !unchanged {
            return false;
        }
    }
    cpus == cur.cpuset_cpus.as_bytes() && mems == cur.cpuset_mems.as_bytes()
}

/// Whether an answer to a pod-level stage (`PodSandboxHookResponse` on the wire) surely changes
/// nothing in `req` (see the module documentation); `false` when unsure.
pub fn pod_unchanged(req: &PodSandboxHookRequest, answer: &[u8]) -> bool {
    let mut fields = Fields { buf: answer };
    let mut resources_seen = false;
    let (mut labels, mut annotations) = (Echoed::new(&req.labels), Echoed::new(&req.annotations));
    loop {
        let Some(next) = fields.next_field() else { return false };
        let Some((number, field)) = next else { return true };
        let unchanged = match (number, field) {
            (1, Field::Bytes(b)) => labels.unchanged(b, false),
            (2, Field::Bytes(b)) => annotations.unchanged(b, false),
            (3, Field::Bytes(b)) => empty_or_same(b, &req.cgroup_parent),
            (4, Field::Bytes(b)) => {
                // A second occurrence merges into the first: left to the decode.
                let first = !std::mem::replace(&mut resources_seen, true);
                first && req.resources.as_ref().is_some_and(|cur| resources_unchanged(cur, b))
            }
            (1..=4, _) => false,
            _ => true,
        };
        if !unchanged {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hook_api::merge;
    use hook_api::v1alpha1::{ContainerResourceHookResponse, PodSandboxHookResponse};
    use proptest::prelude::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn request() -> ContainerResourceHookRequest {
        ContainerResourceHookRequest {
            container_annotations: map(&[("io.kubernetes.container.hash", "3b2a"), ("a", "")]),
            container_envs: map(&[("PATH", "/bin"), ("HOME", "/root")]),
            pod_cgroup_parent: "/kubepods/besteffort/pod1".into(),
            container_resources: Some(LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: -1,
                cpu_shares: 2,
                oom_score_adj: 1000,
                cpuset_cpus: "0-1".into(),
                unified: map(&[("memory.high", "max")]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_echo_and_an_empty_answer_change_nothing() {
        let req = request();
        assert!(container_unchanged(&req, &merge::echo_container(&req).encode_to_vec()));
        assert!(container_unchanged(&req, &[]));
        let pod = PodSandboxHookRequest {
            labels: map(&[("app", "web")]),
            cgroup_parent: "/kubepods".into(),
            ..Default::default()
        };
        assert!(pod_unchanged(&pod, &merge::echo_pod(&pod).encode_to_vec()));
        assert!(pod_unchanged(&pod, &[]));
    }

    /// A pod answer's resources (koordlet's PreRunPodSandbox answer for a BE pod) are a change
    /// the merge applies (Docker mode: to the pause container), seen from the bytes too.
    #[test]
    fn pod_resources_in_an_answer_are_seen() {
        let pod = PodSandboxHookRequest { resources: request().container_resources, ..Default::default() };
        assert!(pod_unchanged(&pod, &merge::echo_pod(&pod).encode_to_vec()));
        let mut answer = merge::echo_pod(&pod);
        answer.resources.as_mut().unwrap().cpu_shares = 512;
        assert!(merge::pod_response_changes(&pod, &answer));
        assert!(!pod_unchanged(&pod, &answer.encode_to_vec()));
        answer.resources.as_mut().unwrap().cpu_shares = pod.resources.as_ref().unwrap().cpu_shares;
        answer.resources.as_mut().unwrap().memory_limit_in_bytes = -1;
        assert!(pod_unchanged(&pod, &answer.encode_to_vec()), "−1 memory is ignored by the merge");
        let without = PodSandboxHookRequest::default();
        let answer = PodSandboxHookResponse { resources: Some(Default::default()), ..Default::default() };
        assert!(!pod_unchanged(&without, &answer.encode_to_vec()), "default resources are put in");
    }

    #[test]
    fn each_change_is_seen() {
        let req = request();
        let changed = |edit: &dyn Fn(&mut ContainerResourceHookResponse)| {
            let mut answer = merge::echo_container(&req);
            edit(&mut answer);
            assert!(merge::container_response_changes(&req, &answer), "the case changes the request");
            !container_unchanged(&req, &answer.encode_to_vec())
        };
        assert!(changed(&|a| drop(a.container_envs.insert("PATH".into(), "/usr/bin".into()))));
        assert!(changed(&|a| drop(a.container_annotations.insert("new".into(), String::new()))));
        assert!(changed(&|a| a.pod_cgroup_parent = "/kubepods/burstable/pod1".into()));
        assert!(changed(&|a| a.container_resources.as_mut().unwrap().cpu_shares = 512));
        assert!(changed(&|a| a.container_resources.as_mut().unwrap().cpu_quota = 50_000));
        assert!(changed(&|a| a.container_resources.as_mut().unwrap().oom_score_adj = -998));
        assert!(changed(&|a| a.container_resources.as_mut().unwrap().cpuset_cpus = String::new()));
        assert!(changed(&|a| a.container_resources.as_mut().unwrap().cpuset_mems = "0".into()));
        assert!(changed(&|a| drop(
            a.container_resources.as_mut().unwrap().unified.insert("cpu.idle".into(), "1".into())
        )));
        let no_resources = ContainerResourceHookRequest { container_resources: None, ..request() };
        let answer =
            ContainerResourceHookResponse { container_resources: Some(Default::default()), ..Default::default() };
        assert!(!container_unchanged(&no_resources, &answer.encode_to_vec()), "default resources are put in");
    }

    /// One message per map entry, concatenated (a protobuf merge) in the order given.
    fn entries_in_order(entries: &[(&str, &str)], envs: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in entries {
            let one = map(&[(k, v)]);
            let message = if envs {
                ContainerResourceHookResponse { container_envs: one, ..Default::default() }
            } else {
                ContainerResourceHookResponse { container_annotations: one, ..Default::default() }
            };
            out.extend(message.encode_to_vec());
        }
        out
    }

    #[test]
    fn an_echo_in_any_order_changes_nothing_and_a_change_in_it_is_seen() {
        let req = ContainerResourceHookRequest {
            container_annotations: map(&[("a", "1"), ("b", "2"), ("c", "3")]),
            container_envs: map(&[("HOME", "/root"), ("PATH", "/bin")]),
            ..Default::default()
        };
        // A Go server's map order, a repeated entry, an env without a name.
        let mut answer = entries_in_order(&[("c", "3"), ("a", "1"), ("b", "2"), ("a", "1")], false);
        answer.extend(entries_in_order(&[("PATH", "/bin"), ("", "x"), ("HOME", "/root")], true));
        assert!(container_unchanged(&req, &answer));
        // In key order up to a change, out of order after it.
        for changed in [
            entries_in_order(&[("a", "1"), ("b", "9")], false),
            entries_in_order(&[("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")], false),
            entries_in_order(&[("c", "3"), ("a", "0")], false),
            entries_in_order(&[("HOME", "/root"), ("PATH", "/usr/bin")], true),
        ] {
            assert!(!container_unchanged(&req, &changed));
        }
    }

    #[test]
    fn what_the_decode_refuses_is_left_to_it() {
        let req = request();
        let mut echo = merge::echo_container(&req).encode_to_vec();
        echo.push(0x0a); // field 1, length-delimited, cut off
        assert!(!container_unchanged(&req, &echo));
        // An env without a name whose value is not UTF-8: ignored by the rule, refused by prost.
        let bad = [0x22, 0x04, 0x12, 0x02, 0xff, 0xfe];
        assert!(ContainerResourceHookResponse::decode(&bad[..]).is_err());
        assert!(!container_unchanged(&req, &bad));
        // A group (wire type 3) at an unknown field number.
        assert!(!container_unchanged(&req, &[0x2b, 0x2c]));
    }

    fn small_map() -> impl Strategy<Value = BTreeMap<String, String>> {
        prop::collection::btree_map("[ab]{0,2}", "[xy]{0,2}", 0..3)
    }

    fn resources() -> impl Strategy<Value = Option<LinuxContainerResources>> {
        let fields = (
            -2i64..3,
            -2i64..3,
            -1i64..2,
            -1i64..2,
            prop::sample::select(vec![0i64, 5, 1000, -1001]),
            "[01]{0,1}",
            "[01]{0,1}",
            small_map(),
        );
        prop::option::of(fields.prop_map(
            |(cpu_period, cpu_quota, cpu_shares, memory_limit_in_bytes, oom, cpus, mems, unified)| {
                LinuxContainerResources {
                    cpu_period,
                    cpu_quota,
                    cpu_shares,
                    memory_limit_in_bytes,
                    oom_score_adj: oom,
                    cpuset_cpus: cpus,
                    cpuset_mems: mems,
                    unified,
                    ..Default::default()
                }
            },
        ))
    }

    proptest! {
        /// Never "unchanged" when the merge rule would change the request; always for an echo.
        #[test]
        fn agrees_with_the_merge_rule(
            annotations in small_map(), envs in small_map(), parent in "[p]{0,1}", res in resources(),
            a_annotations in small_map(), a_envs in small_map(), a_parent in "[p]{0,1}", a_res in resources(),
        ) {
            let req = ContainerResourceHookRequest {
                container_annotations: annotations, container_envs: envs, pod_cgroup_parent: parent,
                container_resources: res, ..Default::default()
            };
            let answer = ContainerResourceHookResponse {
                container_annotations: a_annotations, container_envs: a_envs, pod_cgroup_parent: a_parent,
                container_resources: a_res,
            };
            if container_unchanged(&req, &answer.encode_to_vec()) {
                prop_assert!(!merge::container_response_changes(&req, &answer));
            }
            prop_assert!(container_unchanged(&req, &merge::echo_container(&req).encode_to_vec()));
            // The echo with other resources: only the resources decide.
            let resources_only = ContainerResourceHookResponse {
                container_resources: answer.container_resources.clone(),
                ..merge::echo_container(&req)
            };
            if container_unchanged(&req, &resources_only.encode_to_vec()) {
                prop_assert!(!merge::container_response_changes(&req, &resources_only));
            }
            let pod = PodSandboxHookRequest {
                labels: req.container_envs.clone(), annotations: req.container_annotations.clone(),
                cgroup_parent: req.pod_cgroup_parent.clone(),
                resources: req.container_resources.clone(),
                ..Default::default()
            };
            let pod_answer = PodSandboxHookResponse {
                labels: answer.container_envs.clone(), annotations: answer.container_annotations.clone(),
                cgroup_parent: answer.pod_cgroup_parent.clone(), resources: answer.container_resources.clone(),
            };
            if pod_unchanged(&pod, &pod_answer.encode_to_vec()) {
                prop_assert!(!merge::pod_response_changes(&pod, &pod_answer));
            }
            prop_assert!(pod_unchanged(&pod, &merge::echo_pod(&pod).encode_to_vec()));
        }
    }
}
