//! What a handler reads of NRI's pods and containers ([`Reads`]), and the trimming that drops the
//! rest from the encoded messages before they are decoded.
//!
//! A pod author controls a container's env and args and the labels and annotations of their pod
//! and container; NRI sends them whole, up to a ttrpc message (4 MiB: some 200 k envs). Decoded
//! with prost, each env is a `Vec<u8>` of its own (about 60 bytes of heap for a 12-byte env),
//! before any conversion. A handler that reads few of them says so ([`Handler::reads`]); the
//! connection loop then copies the encoded message without the unread fields and entries
//! (skipped over in the buffer, nothing allocated for them) and decodes that copy:
//!
//! | message | fields trimmed |
//! |---|---|
//! | `PodSandbox` | `labels` (5), `annotations` (6): only the entries whose key [`Keys`] names |
//! | `Container` | `labels` (5), `annotations` (6) likewise; `args` (7), `env` (8): all or none |
//! | `CreateContainerRequest`, `UpdateContainerRequest`, `StopContainerRequest` | their `pod` (1) and `container` (2), as above |
//! | `StateChangeEvent` | its `pod` (2) and `container` (3), as above |
//! | `SynchronizeRequest` | each pod and container, as above |
//!
//! Everything else is copied as it is. Entries are compared by their key's bytes (a key that is
//! not UTF-8 names nothing a handler reads). The default, [`Reads::ALL`], trims nothing and
//! copies nothing.
//!
//! [`Handler::reads`]: crate::plugin::Handler::reads

use prost::encoding::{
    check_wire_type, decode_key, decode_varint, encode_key, encode_varint, skip_field, DecodeContext, WireType,
};
use prost::DecodeError;

/// Which entries of a map (labels, annotations) a handler reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keys {
    /// Every entry.
    All,
    /// The entries of these keys only (none: an empty list).
    Only(Vec<String>),
}

impl Keys {
    fn wants(&self, key: &[u8]) -> bool {
        match self {
            Keys::All => true,
            Keys::Only(keys) => keys.iter().any(|k| k.as_bytes() == key),
        }
    }
}

/// What a handler reads of the pods and containers NRI sends it (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reads {
    /// `PodSandbox.labels` entries.
    pub pod_labels: Keys,
    /// `PodSandbox.annotations` entries.
    pub pod_annotations: Keys,
    /// `Container.labels` entries.
    pub container_labels: Keys,
    /// `Container.annotations` entries.
    pub container_annotations: Keys,
    /// `Container.args`, all or none.
    pub container_args: bool,
    /// `Container.env`, all or none.
    pub container_env: bool,
}

impl Reads {
    /// Everything: nothing is trimmed (the default of [`crate::Handler::reads`]).
    pub const ALL: Reads = Reads {
        pod_labels: Keys::All,
        pod_annotations: Keys::All,
        container_labels: Keys::All,
        container_annotations: Keys::All,
        container_args: true,
        container_env: true,
    };

    /// Whether nothing is trimmed.
    pub fn is_all(&self) -> bool {
        *self == Reads::ALL
    }

    /// An encoded `PodSandbox` without what is not read.
    ///
    /// Errors: the bytes are not protobuf (a truncated field, a map entry that is not a
    /// message), as prost reports it.
    pub fn pod(&self, bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::with_capacity(bytes.len().min(1 << 16));
        each_field(bytes, |tag, whole, payload| {
            match (tag, payload) {
                (5, Some(entry)) if !self.pod_labels.wants(entry_key(entry)?) => {}
                (6, Some(entry)) if !self.pod_annotations.wants(entry_key(entry)?) => {}
                _ => out.extend_from_slice(whole),
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// An encoded `Container` without what is not read.
    ///
    /// Errors: as [`Reads::pod`].
    pub fn container(&self, bytes: &[u8]) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::with_capacity(bytes.len().min(1 << 16));
        each_field(bytes, |tag, whole, payload| {
            match (tag, payload) {
                (5, Some(entry)) if !self.container_labels.wants(entry_key(entry)?) => {}
                (6, Some(entry)) if !self.container_annotations.wants(entry_key(entry)?) => {}
                (7, _) if !self.container_args => {}
                (8, _) if !self.container_env => {}
                _ => out.extend_from_slice(whole),
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// An encoded request whose field `pod_tag` is a `PodSandbox` and `container_tag` a
    /// `Container`, both trimmed ([`Reads::pod`], [`Reads::container`]); its other fields as
    /// they are.
    ///
    /// Errors: as [`Reads::pod`].
    pub fn request(&self, bytes: &[u8], pod_tag: u32, container_tag: u32) -> Result<Vec<u8>, DecodeError> {
        let mut out = Vec::with_capacity(bytes.len().min(1 << 16));
        each_field(bytes, |tag, whole, payload| {
            let trimmed = match payload {
                Some(p) if tag == pod_tag => self.pod(p)?,
                Some(p) if tag == container_tag => self.container(p)?,
                _ => {
                    out.extend_from_slice(whole);
                    return Ok(());
                }
            };
            encode_key(tag, WireType::LengthDelimited, &mut out);
            encode_varint(trimmed.len() as u64, &mut out);
            out.extend_from_slice(&trimmed);
            Ok(())
        })?;
        Ok(out)
    }
}

/// Calls `f` with each field of an encoded message: its tag, its whole encoding (key included)
/// and, when length-delimited, its payload.
///
/// Errors: the bytes are not protobuf, as prost reports it, or `f`'s.
fn each_field<'a>(
    bytes: &'a [u8],
    mut f: impl FnMut(u32, &'a [u8], Option<&'a [u8]>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let mut rest = bytes;
    while !rest.is_empty() {
        let start = rest;
        let (tag, wire_type) = decode_key(&mut rest)?;
        let after_key = rest;
        skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
        let whole = &start[..start.len() - rest.len()];
        let payload = match wire_type {
            WireType::LengthDelimited => Some(payload_of(after_key)?),
            _ => None,
        };
        f(tag, whole, payload)?;
    }
    Ok(())
}

/// The key (field 1) of an encoded map entry (`BytesEntry`); empty when absent, the last one
/// when repeated (protobuf's rule).
///
/// Errors: the entry is not protobuf, or its key is not length-delimited.
fn entry_key(entry: &[u8]) -> Result<&[u8], DecodeError> {
    let (mut rest, mut key) = (entry, &entry[..0]);
    while !rest.is_empty() {
        let (tag, wire_type) = decode_key(&mut rest)?;
        if tag == 1 {
            check_wire_type(WireType::LengthDelimited, wire_type)?;
        }
        let after_key = rest;
        skip_field(wire_type, tag, &mut rest, DecodeContext::default())?;
        if tag == 1 {
            key = payload_of(after_key)?;
        }
    }
    Ok(key)
}

/// The payload of a length-delimited field, `after_key` starting at its length (which
/// `skip_field` has checked against the buffer).
fn payload_of(mut after_key: &[u8]) -> Result<&[u8], DecodeError> {
    let len = usize::try_from(decode_varint(&mut after_key)?).unwrap_or(usize::MAX);
    Ok(after_key.get(..len).unwrap_or(after_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::api as nri;
    use prost::Message;

    fn entry(k: &str, v: &str) -> nri::BytesEntry {
        nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() }
    }

    fn pod() -> nri::PodSandbox {
        nri::PodSandbox {
            id: "s1".into(),
            name: "p".into(),
            labels: vec![entry("qos", "BE"), entry("app", "x"), entry("qos", "LS")],
            annotations: vec![entry("big", &"x".repeat(1000)), entry("spec", "{}")],
            linux: Some(nri::LinuxPodSandbox { cgroup_parent: "/kubepods/p".into(), ..Default::default() }),
            pid: 7,
            ..Default::default()
        }
    }

    fn container(envs: usize) -> nri::Container {
        nri::Container {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            name: "main".into(),
            state: 1,
            labels: vec![entry("l", "1")],
            annotations: vec![entry("a", "1")],
            args: vec![b"sleep".to_vec(), b"1".to_vec()],
            env: (0..envs).map(|i| format!("K{i:05}=1").into_bytes()).collect(),
            linux: Some(nri::LinuxContainer { cgroups_path: "/kubepods/p/c1".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    fn few() -> Reads {
        Reads {
            pod_labels: Keys::Only(vec!["qos".into()]),
            pod_annotations: Keys::Only(vec!["spec".into()]),
            container_labels: Keys::Only(Vec::new()),
            container_annotations: Keys::Only(Vec::new()),
            container_args: false,
            container_env: false,
        }
    }

    /// Only the read keys stay (every entry of a duplicated key, so the last still wins); envs,
    /// args and the unread entries are gone; the rest decodes as before.
    #[test]
    fn only_what_is_read_stays() {
        let p = nri::PodSandbox::decode(few().pod(&pod().encode_to_vec()).unwrap().as_slice()).unwrap();
        assert_eq!(p.labels, vec![entry("qos", "BE"), entry("qos", "LS")]);
        assert_eq!(p.annotations, vec![entry("spec", "{}")]);
        assert_eq!(
            nri::PodSandbox { labels: pod().labels, annotations: pod().annotations, ..p },
            pod(),
            "the rest as it was"
        );

        let encoded = container(20_000).encode_to_vec();
        let trimmed = few().container(&encoded).unwrap();
        assert!(trimmed.len() < 100, "{} bytes of {}", trimmed.len(), encoded.len());
        let c = nri::Container::decode(trimmed.as_slice()).unwrap();
        assert!(c.env.is_empty() && c.args.is_empty() && c.labels.is_empty() && c.annotations.is_empty(), "{c:?}");
        let full = container(20_000);
        assert_eq!(
            nri::Container {
                env: full.env.clone(),
                args: full.args.clone(),
                labels: full.labels.clone(),
                annotations: full.annotations.clone(),
                ..c
            },
            full
        );

        assert_eq!(Reads::ALL.container(&encoded).unwrap(), encoded, "ALL trims nothing");
    }

    /// The requests' pod and container are trimmed where each request has them; the other
    /// fields stay.
    #[test]
    fn requests_are_trimmed_inside() {
        let resources =
            nri::LinuxResources { unified: [("k".to_string(), "v".to_string())].into(), ..Default::default() };
        let req = nri::UpdateContainerRequest {
            pod: Some(pod()),
            container: Some(container(1000)),
            linux_resources: Some(resources.clone()),
        };
        let got =
            nri::UpdateContainerRequest::decode(few().request(&req.encode_to_vec(), 1, 2).unwrap().as_slice()).unwrap();
        assert_eq!(got.linux_resources, Some(resources));
        assert!(got.container.as_ref().unwrap().env.is_empty());
        assert_eq!(got.container.unwrap().id, "c1");
        assert_eq!(got.pod.unwrap().annotations, vec![entry("spec", "{}")]);

        let evt = nri::StateChangeEvent { event: 7, pod: Some(pod()), container: Some(container(1000)) };
        let got = nri::StateChangeEvent::decode(few().request(&evt.encode_to_vec(), 2, 3).unwrap().as_slice()).unwrap();
        assert_eq!((got.event, got.container.unwrap().env.len(), got.pod.unwrap().labels.len()), (7, 0, 2));
    }

    #[test]
    fn bytes_that_are_not_protobuf_are_errors() {
        let mut bytes = container(10).encode_to_vec();
        bytes.truncate(bytes.len() - 3);
        assert!(few().container(&bytes).is_err());
        // A label entry whose key is a varint.
        assert!(few().pod(&[0x2a, 0x02, 0x08, 0x01]).is_err());
        assert!(few().request(&[0x0a, 0x05, 0x01], 1, 2).is_err());
    }
}
