//! The `Node` object's annotations → what koordlet's plugins read from the node's metadata
//! (`RegisterTypeNodeMetadata`): BatchResource's CPU normalization ratio
//! (`apis/extension/cpu_normalization.go` `GetCPUNormalizationRatio`, v1.8.0).

use std::collections::BTreeMap;

use super::field::FieldError;

/// Node annotation: the node's CPU normalization ratio (a float > 0, e.g. `"1.20"`).
pub const CPU_NORMALIZATION_RATIO: &str = "node.koordinator.sh/cpu-normalization-ratio";

/// What the Node sets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeRules {
    /// The ratio, `None` when the annotation is absent (koordlet's −1: "do not scale").
    pub cpu_normalization_ratio: Option<f64>,
}

/// Parses a Node's annotations.
///
/// Errors: the ratio annotation is not a finite number > 0 (koordlet: "illegal cpu
/// normalization ratio").
pub fn parse(annotations: &BTreeMap<String, String>) -> Result<NodeRules, FieldError> {
    let Some(text) = annotations.get(CPU_NORMALIZATION_RATIO) else { return Ok(NodeRules::default()) };
    let field = || format!("metadata.annotations[{CPU_NORMALIZATION_RATIO}]");
    let v: f64 = text.trim().parse().map_err(|_| FieldError::new(field(), format!("{text:?} is not a number")))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(FieldError::new(field(), format!("{text:?} is not a ratio > 0")));
    }
    Ok(NodeRules { cpu_normalization_ratio: Some(v) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio() {
        let a = |v: &str| [(CPU_NORMALIZATION_RATIO.to_string(), v.to_string())].into();
        assert_eq!(parse(&BTreeMap::new()).unwrap().cpu_normalization_ratio, None);
        assert_eq!(parse(&a("1.20")).unwrap().cpu_normalization_ratio, Some(1.2));
        for bad in ["0", "-1", "x", "NaN", "inf", ""] {
            assert!(parse(&a(bad)).unwrap_err().field.contains(CPU_NORMALIZATION_RATIO), "{bad}");
        }
    }
}
