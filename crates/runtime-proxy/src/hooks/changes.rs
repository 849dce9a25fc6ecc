//! What the hooks changed in a request's maps and environment, as every front end writes it
//! back into its own request (CRI's protobuf fields, Docker's JSON): koord's merge of maps (the
//! hooks' entries added or replaced, nothing removed) and of envs (existing entries keep their
//! order, new ones follow sorted by name).

use std::collections::BTreeMap;

/// The entries of `after` that are new or different from `before` (what the hooks set).
pub fn changed_entries(
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    after.iter().filter(|(k, v)| before.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// One entry of a front end's environment list: a key, and a value the hooks may set as text
/// (CRI's `KeyValue`, whose value is bytes; Docker's `K=V` as a pair of strings).
pub trait EnvEntry: Clone {
    /// The entry's name.
    fn key(&self) -> &str;
    /// An entry named `key` with the text `value`.
    fn with_text(key: &str, value: &str) -> Self;
}

impl EnvEntry for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }
    fn with_text(key: &str, value: &str) -> Self {
        (key.to_owned(), value.to_owned())
    }
}

/// The container's envs after the hooks (`hooked`: the entries they set, see
/// [`changed_entries`]): existing entries keep their order (their value updated where a hook set
/// it; every other value, text or not, as it was), new ones follow sorted by name — a stable
/// order, unlike koord's map order.
pub fn merged_envs<E: EnvEntry>(envs: &[E], hooked: &BTreeMap<String, String>) -> Vec<E> {
    let mut out: Vec<E> = envs
        .iter()
        .map(|e| match hooked.get(e.key()) {
            Some(v) => E::with_text(e.key(), v),
            None => e.clone(),
        })
        .collect();
    let mut added: Vec<_> = hooked.iter().filter(|(k, _)| !envs.iter().any(|e| e.key() == k.as_str())).collect();
    added.sort();
    out.extend(added.into_iter().map(|(k, v)| E::with_text(k, v)));
    out
}
