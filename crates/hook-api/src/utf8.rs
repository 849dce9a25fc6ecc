//! The one rule for strings a pod author controls that arrive as bytes: **what is not UTF-8 is left out, never
//! replaced lossily.** Both programs and every NRI plugin of the workspace read labels, annotations and envs
//! through these functions.
//!
//! # Why
//!
//! * Kubelet and the runtimes pass on what they were given: an env value from a Secret holding binary data
//!   (`secretKeyRef`), an annotation written over the API server's protobuf API. Since Kubernetes 1.34 cri-api's
//!   `KeyValue.value` is `bytes`; containerd 1.6 and 1.7 store and list such values byte for byte; NRI's
//!   `api.proto` carries labels, annotations and env as bytes.
//! * The hook protocol's fields are `string` (`map<string, string>`, `repeated string`): prost refuses a whole
//!   message with one string that is not UTF-8, and so does a Go hook server. Such a value cannot be carried.
//! * Replacing it lossily (U+FFFD) would be worse than leaving it out: answers echo what the plugins saw, and
//!   both proxies merge annotations and envs per key, so an echoed lossy copy would overwrite the container's
//!   real value. Left out, it stays as it was; the plugins read only Koordinator's own keys, whose values are
//!   JSON or class names, so a value that is not UTF-8 is no valid value anyway and as absent asks for nothing.
//!
//! # Shape
//!
//! An entry is left out when its key **or** its value is not UTF-8. Of a duplicated key the last entry decides
//! (protobuf's rule for a repeated map key, and what the container gets of a repeated env): when it is not
//! UTF-8 the key is left out, even if an earlier entry of it was UTF-8 — the plugins must not see, and echo
//! back over the real value, a value the container does not have. Lists keep their order.

/// The key and value of one map entry as strings, `None` when either is not UTF-8 (borrowed: nothing is
/// allocated for an entry left out).
pub fn utf8_entry<'a>(key: &'a [u8], value: &'a [u8]) -> Option<(&'a str, &'a str)> {
    Some((std::str::from_utf8(key).ok()?, std::str::from_utf8(value).ok()?))
}

/// The entries as strings, collected into `M` in key order: of a duplicated key the last entry decides, and a
/// key whose deciding entry is not UTF-8 (key or value) is left out.
pub fn utf8_map<'a, M: FromIterator<(String, String)>>(entries: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) -> M {
    let last: std::collections::BTreeMap<&[u8], &[u8]> = entries.into_iter().collect();
    last.into_iter().filter_map(|(k, v)| utf8_entry(k, v)).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

/// The items that are UTF-8, in order; the others are left out.
pub fn utf8_strings<B: AsRef<[u8]>>(items: &[B]) -> Vec<String> {
    items.iter().filter_map(|b| std::str::from_utf8(b.as_ref()).ok().map(str::to_owned)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const NOT_UTF8: &[u8] = b"\xff\xfebin\x00\x80!";

    #[test]
    fn maps_and_lists_leave_out_what_is_not_utf8() {
        let entries = [(b"k".as_slice(), NOT_UTF8), (NOT_UTF8, b"v".as_slice()), (b"ok".as_slice(), b"yes".as_slice())];
        assert_eq!(utf8_map::<BTreeMap<_, _>>(entries), [("ok".to_string(), "yes".to_string())].into());
        assert_eq!(utf8_strings(&[b"A=1".to_vec(), [b"B=".as_slice(), NOT_UTF8].concat()]), vec!["A=1".to_string()]);
    }

    /// Of a duplicated key the last entry decides: when it is not UTF-8 the key is left out (the container has
    /// that value, not the earlier one).
    #[test]
    fn duplicated_keys_the_last_entry_decides() {
        let entries = [
            (b"a".as_slice(), b"1".as_slice()),
            (b"a", b"2"),
            (b"b", b"1"),
            (b"b", NOT_UTF8),
            (b"c", NOT_UTF8),
            (b"c", b"3"),
        ];
        let got: BTreeMap<String, String> = utf8_map(entries);
        assert_eq!(got, BTreeMap::from([("a".into(), "2".into()), ("c".into(), "3".into())]));
    }

    #[test]
    fn an_entry_is_kept_only_when_key_and_value_are_utf8() {
        assert_eq!(utf8_entry(b"k", b"v"), Some(("k", "v")));
        assert_eq!(utf8_entry(b"", b""), Some(("", "")));
        assert_eq!(utf8_entry(b"k", NOT_UTF8), None);
        assert_eq!(utf8_entry(NOT_UTF8, b"v"), None);
    }
}
