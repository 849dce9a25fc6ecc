//! The keys of a runtime's verbose `info` JSON that store recovery reads
//! ([`crate::cri::recover`]), parsed without the rest.
//!
//! containerd's verbose info holds the whole `config` of the RunPodSandbox / CreateContainer call
//! (envs, mounts, labels, annotations) and the whole OCI `runtimeSpec` (mounts, capabilities,
//! namespaces, masked paths): 4–10 KB per container on a kubelet node, and a container's envs
//! can make it megabytes. Recovery reads six values of it. Parsing all of it into a
//! [`serde_json::Value`] tree was a quarter of the proxy's CPU during a start-up recovery of
//! 1,000 pods × 4 containers (`benches/node_scale.rs`, profiled with `perf`); here the parser
//! still reads every byte (the JSON must be well-formed, as before) but builds values only for
//! the keys in [`WANTED`], skipping the others without allocating.
//!
//! The result is the same JSON object with only those keys: a key present with a value of an
//! unexpected type (an object where a string was expected, or the reverse) is kept as it is, so
//! what the readers make of it is what they made of the whole tree.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

/// Which parts of a JSON value to keep.
#[derive(Clone, Copy, Debug)]
pub enum Want {
    /// The whole value.
    All,
    /// Of an object, these keys (each with what to keep of its value); other keys are skipped.
    /// A value that is not an object is kept whole.
    Keys(&'static [(&'static str, Want)]),
}

/// What recovery reads of a verbose `info` object (the sources are listed in
/// [`crate::cri::recover`]): `config.linux.{cgroup_parent, overhead, resources}`,
/// `runtimeSpec.linux.{cgroupsPath, resources}`, `runtimeSpec.process.oomScoreAdj` and
/// `runtimeHandler`.
pub const WANTED: Want = Want::Keys(&[
    (
        "config",
        Want::Keys(&[(
            "linux",
            Want::Keys(&[("cgroup_parent", Want::All), ("overhead", Want::All), ("resources", Want::All)]),
        )]),
    ),
    (
        "runtimeSpec",
        Want::Keys(&[
            ("linux", Want::Keys(&[("cgroupsPath", Want::All), ("resources", Want::All)])),
            ("process", Want::Keys(&[("oomScoreAdj", Want::All)])),
        ]),
    ),
    ("runtimeHandler", Want::All),
]);

/// The JSON object in `text`, with only what `want` keeps. None when `text` is not JSON or not an
/// object.
pub fn parse_object(text: &str, want: Want) -> Option<Map<String, Value>> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = want.deserialize(&mut de).ok()?;
    de.end().ok()?;
    match value {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

impl<'de> DeserializeSeed<'de> for Want {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self {
            Want::All => serde::Deserialize::deserialize(deserializer),
            Want::Keys(keys) => deserializer.deserialize_any(Pruning(keys)),
        }
    }
}

/// A visitor that keeps the keys of an object it is told to, and any other value whole.
struct Pruning(&'static [(&'static str, Want)]);

impl<'de> Visitor<'de> for Pruning {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(found) = map.next_key_seed(KeyIn(self.0))? {
            match found {
                Some((key, want)) => drop(out.insert(key.to_owned(), map.next_value_seed(want)?)),
                None => drop(map.next_value::<IgnoredAny>()?),
            }
        }
        Ok(Value::Object(out))
    }

    // Not an object where one was expected: kept as it is.
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
}

/// An object key, looked up in the wanted keys without being copied (a key skipped costs no
/// allocation): the entry it names, or `None`.
struct KeyIn(&'static [(&'static str, Want)]);

impl<'de> DeserializeSeed<'de> for KeyIn {
    type Value = Option<(&'static str, Want)>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIn {
    type Value = Option<(&'static str, Want)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().find(|(k, _)| *k == key).copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fixture of `tests/fixtures/`: what the pruned parse keeps is exactly what the whole
    /// tree has at those keys.
    #[test]
    fn keeps_exactly_the_wanted_keys_of_real_answers() {
        let fixtures = [
            include_str!("../../tests/fixtures/containerd-1.6/sandbox-ready.json"),
            include_str!("../../tests/fixtures/containerd-1.6/container-running-updated.json"),
            include_str!("../../tests/fixtures/containerd-1.7/sandbox-notready.json"),
            include_str!("../../tests/fixtures/containerd-1.7/container-created.json"),
            include_str!("../../tests/fixtures/containerd-1.7/container-clamped.json"),
        ];
        for text in fixtures {
            let whole: Value = serde_json::from_str(text).unwrap();
            let pruned = Value::Object(parse_object(text, WANTED).expect("an object"));
            let pointers = [
                "/config/linux/cgroup_parent",
                "/config/linux/overhead",
                "/config/linux/resources",
                "/runtimeSpec/linux/cgroupsPath",
                "/runtimeSpec/linux/resources",
                "/runtimeSpec/process/oomScoreAdj",
                "/runtimeHandler",
            ];
            for p in pointers {
                assert_eq!(pruned.pointer(p), whole.pointer(p), "{p}");
            }
            assert!(pruned.pointer("/runtimeSpec/mounts").is_none() && pruned.pointer("/config/envs").is_none());
            assert!(pruned.pointer("/runtimeSpec/linux/resources").is_some(), "{pruned}");
        }
    }

    #[test]
    fn values_of_other_types_are_kept_and_bad_json_is_none() {
        let text = r#"{"config": "text", "runtimeSpec": {"linux": [1, {"a": 2}], "process": null},
            "runtimeHandler": {"x": 1.5}, "other": {"deep": [1, 2, {"x": "y"}]}}"#;
        let got = Value::Object(parse_object(text, WANTED).unwrap());
        let want = serde_json::json!({"config": "text", "runtimeSpec": {"linux": [1, {"a": 2}], "process": null},
            "runtimeHandler": {"x": 1.5}});
        assert_eq!(got, want);
        assert_eq!(parse_object("[1, 2]", WANTED), None, "not an object");
        assert_eq!(parse_object(r#"{"config": {"linux": {}}"#, WANTED), None, "cut short");
        assert_eq!(parse_object(r#"{"config": {}} trailing"#, WANTED), None, "trailing characters");
        assert_eq!(
            parse_object(r#"{"a": "\u00e9\n", "config": {"linux": {"cgroup_parent": "/x\"y"}}}"#, WANTED)
                .and_then(|m| m["config"]["linux"]["cgroup_parent"].as_str().map(str::to_owned)),
            Some("/x\"y".to_owned())
        );
    }
}
