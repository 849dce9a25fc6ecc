//! The rules file (`--rules FILE`): the node's objects as an operator would `kubectl apply`
//! them.
//!
//! # Format
//!
//! JSON if the name ends in `.json`, YAML (one or more `---` documents) otherwise:
//!
//! ```yaml
//! apiVersion: slo.koordinator.sh/v1alpha1
//! kind: NodeSLO
//! metadata: {name: node-a}
//! spec:
//!   resourceUsedThresholdWithBE: {enable: true, cpuSuppressPolicy: cfsQuota}
//!   resourceQOSStrategy:
//!     lsClass: {cpuQOS: {enable: true, groupIdentity: 2}}
//!     beClass: {cpuQOS: {enable: true, groupIdentity: -1}}
//! ---
//! apiVersion: topology.node.k8s.io/v1alpha1
//! kind: NodeResourceTopology
//! metadata:
//!   name: node-a
//!   annotations:
//!     node.koordinator.sh/cpu-shared-pools: '[{"socket":0,"node":0,"cpuset":"0-7"}]'
//! ```
//!
//! # Documents
//!
//! Documents of kind `NodeSLO`, `NodeResourceTopology` and `Node` are read (at most one of
//! each; `metadata.name` is not checked: the file is the node's own); a JSON file holds one
//! object or a `List` (`{"kind": "List", "items": [...]}`). Null documents (`---`, `~`, only
//! comments, JSON `null`) are skipped: a file of only those means koordlet's defaults. A map
//! without `apiVersion` and `kind` is the deprecated old format ([`super::legacy`]), which must
//! then be the only document. A UTF-8 BOM at the start is skipped.
//!
//! # Errors
//!
//! Errors name the file and the document, field or position. A file with nothing but whitespace
//! is an error, not the defaults: it is what a reader sees while a writer truncates and rewrites
//! the file in place, and taking it for the defaults would flip every pod's policy for a moment.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context as _};
use serde::Deserialize as _;
use serde_json::Value;

use super::legacy::LegacyRules;
use super::{node, node_slo, topology, Rules};

/// What a rules file holds, each part parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileRules {
    /// The NodeSLO's settings, if the file has a NodeSLO.
    pub slo: Option<node_slo::SloRules>,
    /// The NodeResourceTopology's pools, if the file has one.
    pub topology: Option<topology::Topology>,
    /// The Node's settings, if the file has a Node.
    pub node: Option<node::NodeRules>,
    /// The old format's rules (deprecated), which replace koordlet's defaults as the base.
    pub legacy: Option<Rules>,
}

impl FileRules {
    /// The rules the file alone means.
    pub fn rules(&self) -> Rules {
        let base = self.legacy.clone().unwrap_or_default();
        Rules::compose(&base, self.slo.as_ref(), self.topology.as_ref(), self.node.as_ref())
    }

    /// Parses the text of `path` (see the module documentation).
    pub fn parse(path: &Path, text: &str) -> anyhow::Result<FileRules> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        if text.trim().is_empty() {
            bail!("{} is empty (write {{}} for the defaults)", path.display());
        }
        let file = path.display();
        let docs: Vec<Value> = if path.extension().is_some_and(|e| e == "json") {
            match serde_json::from_str::<Value>(text).with_context(|| format!("parsing {file} as JSON"))? {
                Value::Object(m) if m.get("kind").and_then(Value::as_str) == Some("List") => match m.get("items") {
                    Some(Value::Array(items)) => items.clone(),
                    _ => bail!("{file}: a List without items"),
                },
                v => vec![v],
            }
        } else {
            let mut docs = Vec::new();
            for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
                docs.push(
                    Value::deserialize(doc).with_context(|| format!("parsing {file} as YAML (document {})", i + 1))?,
                );
            }
            docs
        };
        let mut out = FileRules::default();
        let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
        let count = docs.len();
        for (i, doc) in docs.into_iter().enumerate() {
            let Value::Object(map) = &doc else { bail!("{file}: document {} is not a map", i + 1) };
            let kind = map.get("kind").and_then(Value::as_str);
            if kind.is_none() && !map.contains_key("apiVersion") {
                if count > 1 {
                    bail!("{file}: the old rules format (a map without apiVersion and kind) must be the only document");
                }
                let legacy: LegacyRules = serde_json::from_value(doc.clone())
                    .with_context(|| format!("parsing {file} (old rules format)"))?;
                out.legacy = Some(legacy.to_rules().with_context(|| format!("checking {file}"))?);
                continue;
            }
            let name = map.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("").to_owned();
            let annotations = || annotations(&doc);
            let what = |k: &str| format!("{file}: {k} {name}");
            match kind {
                Some("NodeSLO") if out.slo.is_none() => {
                    let spec = doc.get("spec").cloned().unwrap_or(Value::Null);
                    out.slo = Some(node_slo::parse(&spec).with_context(|| what("NodeSLO"))?);
                }
                Some("NodeResourceTopology") if out.topology.is_none() => {
                    out.topology = Some(
                        topology::parse(&annotations().with_context(|| what("NodeResourceTopology"))?)
                            .with_context(|| what("NodeResourceTopology"))?,
                    );
                }
                Some("Node") if out.node.is_none() => {
                    out.node =
                        Some(node::parse(&annotations().with_context(|| what("Node"))?).with_context(|| what("Node"))?);
                }
                Some(k @ ("NodeSLO" | "NodeResourceTopology" | "Node")) => bail!("{file}: more than one {k}"),
                Some(k) => bail!(
                    "{file}: document {} is a {k}; a rules file holds a NodeSLO, a NodeResourceTopology and a Node",
                    i + 1
                ),
                None => bail!("{file}: document {} has apiVersion but no kind", i + 1),
            }
        }
        Ok(out)
    }

    /// Reads and parses the file.
    pub fn load(path: &Path) -> anyhow::Result<FileRules> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        FileRules::parse(path, &text)
    }
}

/// `metadata.annotations` of an object as strings (absent: empty).
///
/// Errors: annotations that are not a map of strings.
pub fn annotations(obj: &Value) -> Result<BTreeMap<String, String>, super::field::FieldError> {
    match obj.get("metadata").and_then(|m| m.get("annotations")) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| super::field::FieldError::new("metadata.annotations", format!("not a map of strings: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(name: &str, text: &str) -> anyhow::Result<FileRules> {
        FileRules::parse(Path::new(name), text)
    }

    const SLO: &str = "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec:\n  \
        resourceUsedThresholdWithBE: {enable: true, cpuSuppressPolicy: cfsQuota}\n  resourceQOSStrategy:\
        \n    lsClass: {cpuQOS: {enable: true}}\n";

    #[test]
    fn a_node_slo_document() {
        let r = parse("r.yaml", SLO).unwrap();
        assert!(r.legacy.is_none() && r.topology.is_none());
        let rules = r.rules();
        assert!(!rules.batch_resource.cfs_quota);
        assert_eq!((rules.group_identity.ls, rules.group_identity.lsr, rules.group_identity.be), (2, 0, 0));
    }

    #[test]
    fn several_documents_and_a_json_list() {
        let nrt = "apiVersion: topology.node.k8s.io/v1alpha1\nkind: NodeResourceTopology\nmetadata:\n  name: node-a\n  annotations:\n    \
            node.koordinator.sh/cpu-shared-pools: '[{\"socket\":0,\"node\":0,\"cpuset\":\"0-3\"}]'\n";
        let r = parse("r.yaml", &format!("---\n{SLO}---\n{nrt}---\n")).unwrap();
        assert_eq!(r.rules().cpuset.topology.all_share_pool_cpus(), "0-3");
        assert!(!r.rules().batch_resource.cfs_quota);
        let j = r#"{"kind":"List","items":[{"apiVersion":"v1","kind":"Node","metadata":{"name":"n","annotations":{"node.koordinator.sh/cpu-normalization-ratio":"1.5"}}}]}"#;
        assert_eq!(parse("r.json", j).unwrap().rules().batch_resource.cpu_normalization_ratio, Some(1.5));
    }

    #[test]
    fn null_documents_mean_the_defaults() {
        for (name, text) in [
            ("r.yaml", "---"),
            ("r.yaml", "null"),
            ("r.yaml", "~\n"),
            ("r.yaml", "# all defaults\n"),
            ("r.json", "null"),
        ] {
            assert_eq!(parse(name, text).unwrap().rules(), Rules::default(), "{name} {text:?}");
        }
        for (name, text) in [("r.yaml", ""), ("r.yaml", " \n\t"), ("r.json", "\n")] {
            let e = format!("{:#}", parse(name, text).unwrap_err());
            assert!(e.contains("empty") && e.contains("{}"), "{name} {text:?}: {e}");
        }
        assert_eq!(parse("r.yaml", "\u{feff}---\n").unwrap().rules(), Rules::default());
    }

    #[test]
    fn the_old_format_still_reads() {
        let r = parse("r.yaml", "groupIdentity:\n  be: 0\ncpu:\n  cfsPeriodUs: 50000\n").unwrap();
        let rules = r.rules();
        assert_eq!(
            (rules.group_identity.be, rules.group_identity.ls, rules.group_identity.enable, rules.cpu.cfs_period_us),
            (0, 2, true, 50_000)
        );
        // `{}` is the old format's defaults: group identity on, as before.
        assert!(parse("r.json", "{}").unwrap().rules().group_identity.enable);
        assert!(
            !parse("r.json", r#"{"batchResource": {"cfsQuota": false}}"#).unwrap().rules().batch_resource.cfs_quota
        );
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (name, text, needle) in [
            ("r.yaml", "groupIdentity:\n  bee: 1\n", "bee"),
            ("r.json", r#"{"cpu": {"cfsPeriodUs": 10}}"#, "cfsPeriodUs"),
            ("r.json", r#"{"groupIdentity": {"be": -5}}"#, "groupIdentity.be"),
            ("r.json", "{", "JSON"),
            ("r.yaml", "cpu: [1]", "cfsPeriodUs"),
            ("r.yaml", "cpu: 7", "old rules format"),
            ("r.yaml", &SLO.replace("cfsQuota}", "bogus}"), "cpuSuppressPolicy: unknown value \"bogus\""),
            ("r.yaml", &SLO.replace("NodeSLO", "ConfigMap"), "ConfigMap"),
            ("r.yaml", &format!("{SLO}---\n{SLO}"), "more than one NodeSLO"),
            ("r.yaml", &format!("{SLO}---\ncpu: {{}}\n"), "only document"),
        ] {
            let e = format!("{:#}", parse(name, text).unwrap_err());
            assert!(e.contains(needle) && e.contains(name), "{name} {text:?}: {e}");
        }
    }
}
