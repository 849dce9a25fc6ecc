//! containerd's verbose `info` JSON (`PodSandboxStatus` and `ContainerStatus` with `verbose`),
//! read once into the few fields the reconciler uses.
//!
//! The JSON holds the runtime spec and the CRI config: a container's envs twice (the spec's
//! `process.env`, the config's `envs`), its mounts, annotations and labels. Only these are
//! read; serde skips everything else without building it (no map, no string per env):
//!
//! | field | used for |
//! |---|---|
//! | `config.linux.cgroup_parent` (a sandbox's) | the pod's cgroup parent, as kubelet gave it |
//! | `runtimeSpec.linux.cgroupsPath` | the sandbox's or container's cgroup as runc got it |
//! | `runtimeSpec.linux.resources.cpu.shares` | the CPU shares runc got (the `cpu.weight` formula) |
//!
//! As leniently as indexing a JSON value: a field of another type than expected (an object
//! where a string is due, a string where an object is) counts as absent, and the rest is still
//! read. Only JSON that does not parse, or that repeats a key on the path, is no info at all.

use std::fmt;
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::cgroup_path;

/// `PodSandboxStatusResponse` and `ContainerStatusResponse` as the reconciler reads them: only
/// `info` (2), the verbose map; its values are slices of the answer's buffer (prost takes a
/// `bytes` field of a `Bytes` buffer without copying it), so a 16 MiB `info` is not copied
/// before it is parsed. The status (1) is skipped unread.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusInfo {
    /// `map<string, string> info = 2`.
    #[prost(message, repeated, tag = "2")]
    pub info: Vec<InfoEntry>,
}

/// One entry of [`StatusInfo::info`], key and value as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InfoEntry {
    /// The key (`info` is containerd's JSON).
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The value.
    #[prost(bytes = "bytes", tag = "2")]
    pub value: prost::bytes::Bytes,
}

impl StatusInfo {
    /// The `info` entry parsed ([`VerboseInfo::parse`]); of a repeated key the last (protobuf's
    /// map rule); `None` when absent or not JSON.
    pub fn verbose(&self) -> Option<VerboseInfo> {
        self.info.iter().rev().find(|e| e.key == b"info").and_then(|e| VerboseInfo::parse(&e.value))
    }
}

/// What the reconciler reads of one verbose `info` (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerboseInfo {
    /// `Some` when `config` is an object: its `linux.cgroup_parent` (`""` when absent, null or
    /// not a string).
    config_cgroup_parent: Option<String>,
    /// `runtimeSpec.linux.cgroupsPath`, when a string.
    cgroups_path: Option<String>,
    /// `runtimeSpec.linux.resources.cpu.shares`, when an integer that fits an `i64`.
    cpu_shares: Option<i64>,
}

impl VerboseInfo {
    /// Parses a verbose `info` JSON; `None` when it is not JSON (see the module docs).
    pub fn parse(json: &[u8]) -> Option<VerboseInfo> {
        let raw: Raw = serde_json::from_slice(json).ok()?;
        let spec = raw.runtime_spec.and_then(|s| s.linux);
        let (cgroups_path, resources) = match spec {
            Some(l) => (l.cgroups_path.0, l.resources),
            None => (None, None),
        };
        Some(VerboseInfo {
            config_cgroup_parent: raw.config.map(|c| c.linux.and_then(|l| l.cgroup_parent.0).unwrap_or_default()),
            cgroups_path,
            cpu_shares: resources.and_then(|r| r.cpu).and_then(|c| c.shares.0),
        })
    }

    /// The pod cgroup parent, as kubelet gave it (any form; resolve it with
    /// [`crate::cgroup::CgroupFs::resolve`]); `Some("")` for the runtime's default (an empty
    /// parent), `None` when the info says nothing.
    ///
    /// With a `config` object (containerd): `config.linux.cgroup_parent`, absent or null meaning
    /// empty. Without one: from the sandbox container's `runtimeSpec.linux.cgroupsPath`, the
    /// parent directory of an absolute path or the slice of a systemd `<slice>:<prefix>:<name>`.
    pub fn sandbox_cgroup_parent(&self) -> Option<String> {
        if let Some(parent) = &self.config_cgroup_parent {
            return Some(parent.clone());
        }
        let path = self.cgroups_path.as_deref()?;
        if cgroup_path::is_systemd_path(path) {
            return cgroup_path::split_systemd_path(path).ok().map(|(slice, _)| slice.to_owned());
        }
        let path = Some(path).filter(|p| p.starts_with('/'))?;
        Path::new(path).parent().map(|p| p.display().to_string()).filter(|p| p != "/")
    }

    /// A container's (or the sandbox container's) cgroup: `runtimeSpec.linux.cgroupsPath` as
    /// the runtime gave it to runc (cgroupfs: an absolute path; systemd:
    /// `<slice>:<prefix>:<name>`); `None` when absent or empty.
    pub fn container_cgroup_dir(&self) -> Option<String> {
        self.cgroups_path.clone().filter(|p| !p.is_empty())
    }

    /// The CPU shares the runtime gave runc for a container
    /// (`runtimeSpec.linux.resources.cpu.shares`); `None` when absent.
    pub fn container_cpu_shares(&self) -> Option<i64> {
        self.cpu_shares
    }
}

#[derive(serde::Deserialize)]
struct Raw {
    #[serde(default, deserialize_with = "object")]
    config: Option<Config>,
    #[serde(default, rename = "runtimeSpec", deserialize_with = "object")]
    runtime_spec: Option<Spec>,
}

#[derive(serde::Deserialize)]
struct Config {
    #[serde(default, deserialize_with = "object")]
    linux: Option<ConfigLinux>,
}

#[derive(serde::Deserialize)]
struct ConfigLinux {
    #[serde(default)]
    cgroup_parent: Loose<String>,
}

#[derive(serde::Deserialize)]
struct Spec {
    #[serde(default, deserialize_with = "object")]
    linux: Option<SpecLinux>,
}

#[derive(serde::Deserialize)]
struct SpecLinux {
    #[serde(default, rename = "cgroupsPath")]
    cgroups_path: Loose<String>,
    #[serde(default, deserialize_with = "object")]
    resources: Option<Resources>,
}

#[derive(serde::Deserialize)]
struct Resources {
    #[serde(default, deserialize_with = "object")]
    cpu: Option<Cpu>,
}

#[derive(serde::Deserialize)]
struct Cpu {
    #[serde(default)]
    shares: Loose<i64>,
}

/// Drains a JSON array or object of another shape than wanted.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// An object read as `T`; anything else (null, a string, an array…) as `None`.
fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            drain_seq(seq).map(|()| None)
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// A leaf of type `T` when the JSON has one there (a string; an integer that fits an `i64`),
/// `None` for any other value, as `Value::as_str` and `Value::as_i64` read it.
#[derive(Default)]
struct Loose<T>(Option<T>);

/// The leaf types [`Loose`] reads.
trait Leaf: Sized {
    fn from_str(_: &str) -> Option<Self> {
        None
    }
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
}

impl Leaf for String {
    fn from_str(s: &str) -> Option<String> {
        Some(s.to_owned())
    }
}

impl Leaf for i64 {
    fn from_i64(v: i64) -> Option<i64> {
        Some(v)
    }
}

impl<'de, T: Leaf> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Leaf> Visitor<'de> for V<T> {
            type Value = Loose<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                drain_map(map).map(|()| Loose(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                drain_seq(seq).map(|()| Loose(None))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Loose(T::from_str(s)))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
                Ok(Loose(None))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Loose(T::from_i64(v)))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(Loose(i64::try_from(v).ok().and_then(T::from_i64)))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Loose(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Loose(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> VerboseInfo {
        VerboseInfo::parse(json.as_bytes()).expect(json)
    }

    #[test]
    fn cgroup_paths_from_verbose_info() {
        let sandbox = r#"{"pid": 1, "config": {"linux": {"cgroup_parent": "/kubepods/besteffort/pod1"}}, "runtimeSpec": {"linux": {"cgroupsPath": "/kubepods/besteffort/pod1/abc"}}}"#;
        assert_eq!(parse(sandbox).sandbox_cgroup_parent().as_deref(), Some("/kubepods/besteffort/pod1"));
        assert_eq!(
            parse(sandbox).container_cgroup_dir().as_deref(),
            Some("/kubepods/besteffort/pod1/abc"),
            "the same parse"
        );
        let spec_only = r#"{"runtimeSpec": {"linux": {"cgroupsPath": "/kubepods/pod2/abc"}}}"#;
        assert_eq!(parse(spec_only).sandbox_cgroup_parent().as_deref(), Some("/kubepods/pod2"));
        let systemd = r#"{"runtimeSpec": {"linux": {"cgroupsPath": "kubepods-pod.slice:cri-containerd:abc"}}}"#;
        assert_eq!(parse(systemd).sandbox_cgroup_parent().as_deref(), Some("kubepods-pod.slice"));
        assert_eq!(VerboseInfo::parse(b"not json"), None);
        assert_eq!(parse("{}").sandbox_cgroup_parent(), None, "nothing said: unknown");
        let container = r#"{"runtimeSpec": {"linux": {"cgroupsPath": "/kubepods/pod2/def"}}}"#;
        assert_eq!(parse(container).container_cgroup_dir().as_deref(), Some("/kubepods/pod2/def"));
        assert_eq!(parse(systemd).container_cgroup_dir().as_deref(), Some("kubepods-pod.slice:cri-containerd:abc"));
        assert_eq!(parse(r#"{"runtimeSpec": {"linux": {"cgroupsPath": ""}}}"#).container_cgroup_dir(), None);
        let with_shares = r#"{"runtimeSpec": {"linux": {"resources": {"cpu": {"shares": 512, "quota": 50000}}}}}"#;
        assert_eq!(parse(with_shares).container_cpu_shares(), Some(512));
        assert_eq!(parse(container).container_cpu_shares(), None);
    }

    /// What containerd 1.6 and 1.7 (cgroupfs runc) report, captured from the dev containerds.
    #[test]
    fn cgroup_paths_as_containerd_reports_them() {
        // kubelet's systemd parent: containerd makes the systemd form from its last component.
        let parent = "/rp-test/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poduid_1.slice";
        let sandbox = format!(
            r#"{{"config": {{"linux": {{"cgroup_parent": "{parent}"}}}}, "runtimeSpec": {{"linux": {{"cgroupsPath": "kubepods-besteffort-poduid_1.slice:cri-containerd:s1"}}}}}}"#
        );
        assert_eq!(parse(&sandbox).sandbox_cgroup_parent().as_deref(), Some(parent));
        // A bare slice name is kept as given: resolved later, with the driver.
        let bare = r#"{"config": {"linux": {"cgroup_parent": "kubepods-besteffort-poduid_3.slice"}}, "runtimeSpec": {"linux": {"cgroupsPath": "kubepods-besteffort-poduid_3.slice:cri-containerd:s3"}}}"#;
        assert_eq!(parse(bare).sandbox_cgroup_parent().as_deref(), Some("kubepods-besteffort-poduid_3.slice"));
        // An empty parent: containerd omits it and puts the pod in its own namespace cgroup.
        let empty = r#"{"config": {"linux": {"security_context": {}}}, "runtimeSpec": {"linux": {"cgroupsPath": "/k8s.io/s2"}}}"#;
        assert_eq!(parse(empty).sandbox_cgroup_parent().as_deref(), Some(""), "the runtime's default, not /k8s.io");
        let container = r#"{"runtimeSpec": {"linux": {"cgroupsPath": "/k8s.io/c2"}}}"#;
        assert_eq!(parse(container).container_cgroup_dir().as_deref(), Some("/k8s.io/c2"));
    }

    /// Fields of another type count as absent, as indexing a JSON value reads them; the rest
    /// is still read.
    #[test]
    fn other_types_are_absent() {
        let odd = r#"{"config": "x", "runtimeSpec": {"linux": {"cgroupsPath": "/kubepods/p/c", "resources": {"cpu": {"shares": "512"}}}}}"#;
        assert_eq!(
            parse(odd).sandbox_cgroup_parent().as_deref(),
            Some("/kubepods/p"),
            "config not an object: from the spec"
        );
        assert_eq!(parse(odd).container_cpu_shares(), None);
        let odd = r#"{"config": {"linux": {"cgroup_parent": 5}}, "runtimeSpec": {"linux": {"cgroupsPath": {"a": [1]}, "resources": {"cpu": {"shares": 1.5}}}}}"#;
        assert_eq!(
            (parse(odd).sandbox_cgroup_parent().as_deref(), parse(odd).container_cgroup_dir()),
            (Some(""), None)
        );
        assert_eq!(
            parse(r#"{"runtimeSpec": {"linux": {"resources": {"cpu": {"shares": 18446744073709551615}}}}}"#)
                .container_cpu_shares(),
            None
        );
        assert_eq!(parse(r#"{"config": null, "runtimeSpec": [1, {"linux": 2}]}"#), VerboseInfo::default());
        assert_eq!(
            VerboseInfo::parse(b"[1]").unwrap_or_default(),
            VerboseInfo::default(),
            "not an object: nothing said"
        );
    }

    /// A container's verbose info of 200 k envs (spec and CRI config, 8 MiB of JSON), in a
    /// status answer: the fields are found past them. (What it costs is measured in
    /// `tests/standalone.rs`.)
    #[test]
    fn envs_are_not_materialised() {
        let envs: Vec<String> = (0..200_000).map(|i| format!("\"K{i:06}=1\"")).collect();
        let kv: Vec<String> = (0..200_000).map(|i| format!(r#"{{"key": "K{i:06}", "value": "1"}}"#)).collect();
        let json = format!(
            r#"{{"config": {{"envs": [{}]}}, "runtimeSpec": {{"process": {{"env": [{}]}}, "linux": {{"cgroupsPath": "/kubepods/p/c", "resources": {{"cpu": {{"shares": 2}}}}}}}}}}"#,
            kv.join(","),
            envs.join(",")
        );
        drop((envs, kv));
        use prost::Message;
        let answer =
            k8s_cri::v1::ContainerStatusResponse { info: [("info".to_string(), json)].into(), ..Default::default() };
        let info = StatusInfo::decode(prost::bytes::Bytes::from(answer.encode_to_vec())).unwrap().verbose().unwrap();
        assert_eq!(
            (info.container_cgroup_dir().as_deref(), info.container_cpu_shares()),
            (Some("/kubepods/p/c"), Some(2))
        );
        assert_eq!(
            info.sandbox_cgroup_parent().as_deref(),
            Some(""),
            "a config object without linux: the default parent"
        );
    }
}
