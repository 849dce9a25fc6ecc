//! The stand-in's etcd: objects as JSON values, one global resourceVersion counter, and the
//! history of every change (what watches replay).
//!
//! What the server sets, it sets as kube-apiserver does (01, 03, 06, 07, 20): `uid`,
//! `creationTimestamp` and `resourceVersion` on create; a new `resourceVersion` on every write
//! that changes the object (a write that changes nothing is no write: same resourceVersion, no
//! watch event); `generation` 1 on create and +1 on a change outside `metadata` for custom
//! resources only (Node, Pod have none in 1.31); a name from `generateName` plus five random
//! characters (20); a deleted object's last state with a new resourceVersion for the `DELETED`
//! event (05). Not set: `managedFields`, and the defaults a built-in type's registry fills in
//! (a Pod's `restartPolicy`, `status.phase`, …): a scenario puts in what it needs.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::resources::Resource;
use super::status::Status;

/// Where an object lives: resource, namespace (`""` when cluster-scoped), name. Sorted as etcd
/// keys are, so lists come out in kube-apiserver's order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Key {
    pub plural: &'static str,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(resource: &'static Resource, namespace: Option<&str>, name: &str) -> Key {
        Key { plural: resource.plural, namespace: namespace.unwrap_or_default().to_owned(), name: name.to_owned() }
    }
}

/// What a change did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One write, as a watch replays it.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub rv: u64,
    pub kind: ChangeType,
    pub key: Key,
    /// The state before a modification (a watch with a selector turns a change that leaves the
    /// selection into `DELETED`, one that enters it into `ADDED`).
    pub old: Option<Value>,
    /// The new state; for a deletion, the last state with the deletion's resourceVersion.
    pub new: Value,
}

/// The objects and their history.
pub(crate) struct Store {
    /// The last resourceVersion given out (a list's `metadata.resourceVersion`).
    pub rv: u64,
    /// Watches from a resourceVersion below this are too old (410 Expired).
    pub compacted: u64,
    pub objects: BTreeMap<Key, Value>,
    pub history: Vec<Change>,
    /// Every core v1 Event created, in order, as stored.
    pub events: Vec<Value>,
}

impl Store {
    pub fn new() -> Store {
        Store { rv: 1, compacted: 0, objects: BTreeMap::new(), history: Vec::new(), events: Vec::new() }
    }

    /// Changes with a resourceVersion above `rv`, oldest first.
    pub fn changes_after(&self, rv: u64) -> &[Change] {
        &self.history[self.history.partition_point(|c| c.rv <= rv)..]
    }

    /// Stores a new object of `resource`. `namespace` is the request path's (`None` when the
    /// object says its own, as the test control API does; a namespaced object without one goes
    /// to `default`).
    pub fn create(
        &mut self,
        resource: &'static Resource,
        namespace: Option<&str>,
        mut object: Value,
    ) -> Result<Value, Status> {
        check_kind(resource, &object)?;
        let meta = metadata(&mut object)?;
        if resource.namespaced {
            let own = meta.get("namespace").and_then(Value::as_str).filter(|ns| !ns.is_empty());
            let ns = match (namespace, own) {
                (Some(path), Some(own)) if path != own => {
                    return Err(Status::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ))
                }
                (Some(ns), _) | (None, Some(ns)) => ns.to_owned(),
                (None, None) => "default".to_owned(),
            };
            meta.insert("namespace".into(), ns.into());
        } else {
            meta.remove("namespace");
        }
        let name = match (meta.get("name").and_then(Value::as_str), meta.get("generateName").and_then(Value::as_str)) {
            (Some(name), _) if !name.is_empty() => name.to_owned(),
            (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", random_suffix()),
            _ => return Err(Status::name_required(resource)),
        };
        let ns = meta.get("namespace").and_then(Value::as_str).map(str::to_owned);
        let key = Key::new(resource, ns.as_deref(), &name);
        if self.objects.contains_key(&key) {
            return Err(Status::already_exists(resource, &name));
        }
        self.rv += 1;
        meta.insert("name".into(), name.into());
        meta.insert("uid".into(), uuid().into());
        meta.insert("resourceVersion".into(), self.rv.to_string().into());
        meta.insert("creationTimestamp".into(), rfc3339(SystemTime::now()).into());
        meta.remove("deletionTimestamp");
        if resource.custom {
            meta.insert("generation".into(), 1.into());
        } else {
            meta.remove("generation");
        }
        prune_empty(meta);
        set_type(resource, &mut object);
        if resource.plural == "events" {
            // As an Event comes back from kube-apiserver (20): its Go time fields serialise as null.
            let event = object.as_object_mut().unwrap();
            for field in ["firstTimestamp", "lastTimestamp", "eventTime"] {
                event.entry(field).or_insert(Value::Null);
            }
            self.events.push(object.clone());
        }
        self.objects.insert(key.clone(), object.clone());
        self.history.push(Change { rv: self.rv, kind: ChangeType::Added, key, old: None, new: object.clone() });
        Ok(object)
    }

    /// Replaces the object at `key` with what `change` makes of it. The server's own metadata
    /// (name, namespace, uid, creationTimestamp, generation) stays; `resourceVersion` and, for a
    /// custom resource whose content changed, `generation` move on; nothing changes and no event
    /// is recorded when the result equals the stored object. A `metadata.resourceVersion` in
    /// `expect_rv` that is not the stored one is a 409 Conflict.
    pub fn update(
        &mut self,
        resource: &'static Resource,
        key: &Key,
        expect_rv: Option<&str>,
        change: impl FnOnce(&Value) -> Result<Value, Status>,
    ) -> Result<Value, Status> {
        let old = self.objects.get(key).ok_or_else(|| Status::not_found(resource, &key.name))?;
        let old_meta = old["metadata"].as_object().cloned().unwrap_or_default();
        if expect_rv
            .is_some_and(|rv| !rv.is_empty() && Some(rv) != old_meta.get("resourceVersion").and_then(Value::as_str))
        {
            return Err(Status::conflict(resource, &key.name));
        }
        let mut new = change(old)?;
        check_kind(resource, &new)?;
        set_type(resource, &mut new);
        let meta = metadata(&mut new)?;
        for kept in ["name", "namespace", "uid", "creationTimestamp", "generation", "resourceVersion"] {
            match old_meta.get(kept) {
                Some(v) => meta.insert(kept.into(), v.clone()),
                None => meta.remove(kept),
            };
        }
        prune_empty(meta);
        if new == *old {
            return Ok(new);
        }
        self.rv += 1;
        let content_changed = without_metadata(&new) != without_metadata(old);
        let meta = new["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), self.rv.to_string().into());
        if resource.custom && content_changed {
            let generation = old_meta.get("generation").and_then(Value::as_i64).unwrap_or(0) + 1;
            meta.insert("generation".into(), generation.into());
        }
        let old = self.objects.insert(key.clone(), new.clone());
        self.history.push(Change { rv: self.rv, kind: ChangeType::Modified, key: key.clone(), old, new: new.clone() });
        Ok(new)
    }

    /// Removes the object at `key`; returns its last state with the deletion's resourceVersion.
    pub fn delete(&mut self, resource: &'static Resource, key: &Key) -> Result<Value, Status> {
        let mut object = self.objects.remove(key).ok_or_else(|| Status::not_found(resource, &key.name))?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = self.rv.to_string().into();
        self.history.push(Change {
            rv: self.rv,
            kind: ChangeType::Deleted,
            key: key.clone(),
            old: None,
            new: object.clone(),
        });
        Ok(object)
    }
}

/// RFC 7386 JSON merge patch: `null` removes a member, objects merge, anything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().unwrap();
    for (name, value) in members {
        if value.is_null() {
            target.remove(name);
        } else {
            merge_patch(target.entry(name.clone()).or_insert(Value::Null), value);
        }
    }
}

/// An object body of the resource's kind: `kind`/`apiVersion`, when given, must be the
/// resource's (kube-apiserver answers 400 to another).
fn check_kind(resource: &Resource, object: &Value) -> Result<(), Status> {
    if !object.is_object() {
        return Err(Status::bad_request("the body of the request is not a JSON object".into()));
    }
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or(resource.kind);
    let api_version =
        object.get("apiVersion").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| resource.api_version());
    if kind != resource.kind || api_version != resource.api_version() {
        return Err(Status::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({}), or kind {kind:?} is not {:?}",
            resource.api_version(),
            resource.kind
        )));
    }
    Ok(())
}

fn set_type(resource: &Resource, object: &mut Value) {
    let object = object.as_object_mut().unwrap();
    object.insert("apiVersion".into(), resource.api_version().into());
    object.insert("kind".into(), resource.kind.into());
}

fn metadata(object: &mut Value) -> Result<&mut Map<String, Value>, Status> {
    let object = object.as_object_mut().ok_or_else(|| Status::bad_request("the object is not a JSON object".into()))?;
    let meta = object.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    meta.as_object_mut().ok_or_else(|| Status::bad_request("metadata is not a JSON object".into()))
}

/// Drops empty members of `metadata` (`""`, `{}`, `[]`, `null`): every ObjectMeta field is
/// `omitempty`, so kube-apiserver never sends one (17 sends `"annotations": {}`, 18 has none).
fn prune_empty(meta: &mut Map<String, Value>) {
    meta.retain(|_, v| match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        _ => true,
    });
}

fn without_metadata(object: &Value) -> Map<String, Value> {
    let mut map = object.as_object().cloned().unwrap_or_default();
    map.remove("metadata");
    map
}

/// Random 64 bits: std's per-instance random hasher keys, a counter and the clock.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish()
}

/// A version 4 UUID, as kube-apiserver gives every object.
fn uuid() -> String {
    let (a, b) = (random_u64(), random_u64());
    let hex = format!("{a:016x}{b:016x}");
    let variant = ["8", "9", "a", "b"][(b >> 62) as usize];
    format!("{}-{}-4{}-{variant}{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..])
}

/// Five characters as apimachinery's `rand.String` picks them for `generateName` (20: `g5kv8`).
fn random_suffix() -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bits = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHANUMS[(bits % ALPHANUMS.len() as u64) as usize] as char;
            bits /= ALPHANUMS.len() as u64;
            c
        })
        .collect()
}

/// `2026-11-25T19:25:10Z`: UTC, whole seconds, as `metav1.Time` encodes.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // days since 1970-01-01 to a civil date (H. Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn timestamps_and_ids() {
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_634_710)), "2026-11-25T19:25:10Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)), "2000-02-29T00:00:00Z");
        let id = uuid();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
        assert_ne!(uuid(), uuid());
        assert_eq!(random_suffix().len(), 5);
    }

    #[test]
    fn merge_patch_rfc7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1]});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}, "l": [2], "n": {"x": 1}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}, "l": [2], "n": {"x": 1}}));
    }

    #[test]
    fn writes_set_what_the_server_sets() {
        let slo = Resource::by_plural("nodeslos");
        let mut store = Store::new();
        let created = store
            .create(
                slo,
                None,
                json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n"}, "spec": {"a": 1}}),
            )
            .unwrap();
        assert_eq!(created["metadata"]["generation"], 1);
        assert_eq!(created["metadata"]["resourceVersion"], "2");
        let key = Key::new(slo, None, "n");
        let same = store.update(slo, &key, None, |old| Ok(old.clone())).unwrap();
        assert_eq!(same["metadata"]["resourceVersion"], "2", "a write that changes nothing is no write");
        let labelled = store
            .update(slo, &key, None, |old| {
                let mut new = old.clone();
                merge_patch(&mut new, &json!({"metadata": {"labels": {"x": "y"}, "uid": "mine"}}));
                Ok(new)
            })
            .unwrap();
        assert_eq!(
            (labelled["metadata"]["resourceVersion"].as_str(), labelled["metadata"]["generation"].as_i64()),
            (Some("3"), Some(1))
        );
        assert_eq!(labelled["metadata"]["uid"], created["metadata"]["uid"]);
        let conflict = store.update(slo, &key, Some("2"), |old| Ok(old.clone())).unwrap_err();
        assert_eq!(conflict.code, 409);
        let deleted = store.delete(slo, &key).unwrap();
        assert_eq!(deleted["metadata"]["resourceVersion"], "4");
        assert_eq!(store.changes_after(2).len(), 2);
        let event = store
            .create(
                Resource::by_plural("events"),
                Some("default"),
                json!({"metadata": {"generateName": "node-a."}, "reason": "R"}),
            )
            .unwrap();
        assert!(event["metadata"]["name"].as_str().unwrap().starts_with("node-a."));
        assert_eq!((event["kind"].as_str(), event["eventTime"].is_null()), (Some("Event"), true));
        assert_eq!(store.create(slo, None, json!({"metadata": {}})).unwrap_err().code, 422);
    }
}
