//! `fieldSelector` and `labelSelector`, as kube-apiserver parses and applies them.
//!
//! Field selectors: `label=value`, `label==value`, `label!=value`, comma-separated (all must
//! hold), with `\,` `\=` `\\` escapes; a label the resource does not support is a 400
//! `field label not supported: …`. Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
//! `k notin (a,b)`, `k`, `!k`; anything else (`k>1`, …) is a 400.

use serde_json::Value;

use super::resources::Resource;

/// A parsed field selector.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `raw` for `resource`; `Err` holds the 400 message.
    pub fn parse(raw: &str, resource: &Resource) -> Result<FieldSelector, String> {
        let mut terms = Vec::new();
        for term in split_unescaped(raw, ',') {
            if term.is_empty() {
                continue;
            }
            let (label, equal, value) = if let Some(i) = find_unescaped(&term, "!=") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "==") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = find_unescaped(&term, "=") {
                (&term[..i], true, &term[i + 1..])
            } else {
                return Err(format!("invalid selector: '{raw}'; can't understand '{term}'"));
            };
            let label = label.trim();
            if !resource.selectable(label) {
                return Err(format!("field label not supported: {label}"));
            }
            terms.push((label.to_owned(), equal, unescape(value)));
        }
        Ok(FieldSelector(terms))
    }

    /// The name an exact `metadata.name=X` term selects, which kube-apiserver takes as the
    /// request's object name (it appears in a 403: 11-list-nodeslo-forbidden.txt).
    pub fn name(&self) -> Option<&str> {
        self.0.iter().find(|(label, equal, _)| label == "metadata.name" && *equal).map(|(_, _, v)| v.as_str())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(label, equal, value)| (field(object, label) == *value) == *equal)
    }
}

/// The field's value as a selector compares it: strings as they are, numbers and booleans
/// printed, a missing field as `""` (so `spec.nodeName=` selects unscheduled pods).
fn field(object: &Value, label: &str) -> String {
    match label.split('.').try_fold(object, |v, key| v.get(key)) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

fn find_unescaped(s: &str, pattern: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if s[i..].starts_with(pattern) {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn split_unescaped(s: &str, separator: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            parts.last_mut().unwrap().extend(['\\', c]);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == separator {
            parts.push(String::new());
        } else {
            parts.last_mut().unwrap().push(c);
        }
    }
    parts
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next().unwrap_or('\\') } else { c });
    }
    out
}

/// A parsed label selector.
#[derive(Clone, Debug, Default)]
pub(crate) struct LabelSelector(Vec<Requirement>);

#[derive(Clone, Debug)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

impl LabelSelector {
    /// Parses `raw`; `Err` holds the 400 message.
    pub fn parse(raw: &str) -> Result<LabelSelector, String> {
        let mut requirements = Vec::new();
        for term in split_outside_parens(raw) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let bad = || format!("unable to parse requirement: {term:?}");
            let requirement = if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotIn(key.trim().to_owned(), vec![value.trim().to_owned()])
            } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Requirement::In(key.trim().to_owned(), vec![value.trim().to_owned()])
            } else if let Some((key, set)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), parse_set(set).ok_or_else(bad)?)
            } else if let Some((key, set)) = term.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), parse_set(set).ok_or_else(bad)?)
            } else if term.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c)) {
                Requirement::Exists(term.to_owned())
            } else {
                return Err(bad());
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| object.pointer("/metadata/labels").and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::In(key, values) => label(key).is_some_and(|v| values.iter().any(|x| x == v)),
            Requirement::NotIn(key, values) => label(key).is_none_or(|v| values.iter().all(|x| x != v)),
            Requirement::Exists(key) => label(key).is_some(),
            Requirement::NotExists(key) => label(key).is_none(),
        })
    }
}

fn split_outside_parens(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_selectors() {
        let pods = Resource::by_plural("pods");
        let pod = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": "node-a"}});
        let unscheduled = json!({"metadata": {"name": "q", "namespace": "default"}, "spec": {}});
        let on_a = FieldSelector::parse("spec.nodeName=node-a", pods).unwrap();
        assert!(on_a.matches(&pod) && !on_a.matches(&unscheduled));
        assert!(FieldSelector::parse("spec.nodeName=", pods).unwrap().matches(&unscheduled));
        assert!(FieldSelector::parse("spec.nodeName!=node-b,metadata.name==p", pods).unwrap().matches(&pod));
        assert_eq!(FieldSelector::parse("metadata.name=node-a", pods).unwrap().name(), Some("node-a"));
        assert_eq!(FieldSelector::parse("spec.foo=x", pods).unwrap_err(), "field label not supported: spec.foo");
        let slos = Resource::by_plural("nodeslos");
        assert_eq!(
            FieldSelector::parse("spec.nodeName=x", slos).unwrap_err(),
            "field label not supported: spec.nodeName"
        );
    }

    #[test]
    fn label_selectors() {
        let be = json!({"metadata": {"labels": {"koordinator.sh/qosClass": "BE", "app": "x"}}});
        let none = json!({"metadata": {}});
        let check = |raw: &str| LabelSelector::parse(raw).unwrap().matches(&be);
        assert!(check("koordinator.sh/qosClass=BE"));
        assert!(check("koordinator.sh/qosClass in (LS, BE),app"));
        assert!(!check("koordinator.sh/qosClass notin (BE)"));
        assert!(check("app!=y,!missing"));
        assert!(!check("missing"));
        assert!(LabelSelector::parse("app notin (x)").unwrap().matches(&none));
        assert!(LabelSelector::parse("app>1").is_err());
    }
}
