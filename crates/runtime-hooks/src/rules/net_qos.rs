//! The NodeSLO's network QoS settings, read by TCNetworkQoS and TerwayQoS (koordlet v1.8.0
//! `hooks/tc/rule.go` + `helper.go`, `hooks/terwayqos/terwayqos.go`; API
//! `apis/slo/v1alpha1/nodeslo_types.go`; defaults `pkg/util/sloconfig/nodeslo_config.go`).
//!
//! # Fields
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `resourceQOSStrategy.policies.netQOSPolicy` | `tc` | `tc` (TCNetworkQoS acts) or `terway-qos` (TerwayQoS acts) |
//! | `systemStrategy.totalNetworkBandwidth` | `0` | the node's bandwidth, a quantity (koordlet reads its `Value()`; the API calls the unit Mbps, the hooks use it as bits/s) |
//! | `resourceQOSStrategy.{lsClass,beClass}.networkQOS.enable` | `false` | the class's limits count only when on |
//! | `….networkQOS.{ingressRequest,ingressLimit,egressRequest,egressLimit}` | `0` | an int (percent of the total, 0..=100) or a quantity string (`"50M"`) |
//!
//! Only LS (TC's "L1") and BE ("L2") are read, as koordlet does. How the values turn into
//! rates differs between the two hooks and is done by each plugin.
//!
//! # Errors
//!
//! Checked here: each field's type, the policy's value, a quantity that does not parse or is
//! negative, a percentage outside 0..=100 — each a [`FieldError`] naming the field.
//!
//! # Where koordlet differs
//!
//! koordlet's TC hook reads a bad quantity or percentage as 0, its Terway hook fails the whole
//! rule; refusing the NodeSLO keeps the last good rules in force, see [`super::store`].

use serde::Serialize;
use serde_json::Value;

use super::field::FieldError;
use crate::quantity::Quantity;

/// `resourceQOSStrategy.policies.netQOSPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum NetQosPolicy {
    /// `tc` (koordlet's default): the TCNetworkQoS hook sets tc rules and `net_cls.classid`.
    #[default]
    #[serde(rename = "tc")]
    Tc,
    /// `terway-qos`: the TerwayQoS hook writes Terway's QoS files.
    #[serde(rename = "terway-qos")]
    TerwayQos,
}

/// One bandwidth field: a percentage of the total or an absolute quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Bandwidth {
    /// An int in the NodeSLO: percent (0..=100) of `totalNetworkBandwidth`.
    Percent(u64),
    /// A string in the NodeSLO: the quantity's `Value()` (≥ 0), in the unit the hook gives it.
    Quantity(u64),
}

impl Default for Bandwidth {
    /// koordlet's `NoneNetworkQOS`: int 0.
    fn default() -> Self {
        Bandwidth::Percent(0)
    }
}

impl Bandwidth {
    /// koordlet TC's `getBandwidthVal`: a percentage of `total`, or the quantity as is.
    pub fn of_total(&self, total: u64) -> u64 {
        match *self {
            Bandwidth::Percent(p) => (total as u128 * p as u128 / 100) as u64,
            Bandwidth::Quantity(q) => q,
        }
    }
}

/// A class's `networkQOS` (only kept when its `enable` is true).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassBandwidth {
    /// `ingressRequest`: minimum guaranteed ingress.
    pub ingress_request: Bandwidth,
    /// `ingressLimit`: maximum ingress.
    pub ingress_limit: Bandwidth,
    /// `egressRequest`: minimum guaranteed egress.
    pub egress_request: Bandwidth,
    /// `egressLimit`: maximum egress.
    pub egress_limit: Bandwidth,
}

/// The network QoS rule (see the module table). `Default` is koordlet's: policy `tc`, total 0,
/// both classes off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetQosRules {
    /// Which hook acts.
    pub policy: NetQosPolicy,
    /// `systemStrategy.totalNetworkBandwidth`'s `Value()` (≥ 0).
    pub total_bandwidth: u64,
    /// LS's bandwidth, `None` when its `networkQOS.enable` is off.
    pub ls: Option<ClassBandwidth>,
    /// BE's bandwidth, `None` when its `networkQOS.enable` is off.
    pub be: Option<ClassBandwidth>,
}

/// Parses the network QoS fields of a NodeSLO `spec` (`null`: the defaults).
///
/// Errors: the first bad field (module documentation), as a [`FieldError`] naming it.
pub fn parse(spec: &Value) -> Result<NetQosRules, FieldError> {
    let strategy = spec.get("resourceQOSStrategy").unwrap_or(&Value::Null);
    let policy_field = "spec.resourceQOSStrategy.policies.netQOSPolicy";
    let policy = match strategy.get("policies").and_then(|p| p.get("netQOSPolicy")).unwrap_or(&Value::Null) {
        Value::Null => NetQosPolicy::Tc,
        Value::String(s) if s == "tc" || s.is_empty() => NetQosPolicy::Tc,
        Value::String(s) if s == "terway-qos" => NetQosPolicy::TerwayQos,
        Value::String(s) => {
            return Err(FieldError::new(policy_field, format!("unknown value {s:?} (tc or terway-qos)")))
        }
        other => return Err(FieldError::new(policy_field, format!("{other} is not a string"))),
    };
    let total_field = "spec.systemStrategy.totalNetworkBandwidth";
    let total = match spec.get("systemStrategy").and_then(|s| s.get("totalNetworkBandwidth")).unwrap_or(&Value::Null) {
        Value::Null => 0,
        v => quantity(v, total_field)?,
    };
    let class = |name: &str| -> Result<Option<ClassBandwidth>, FieldError> {
        let base = format!("spec.resourceQOSStrategy.{name}.networkQOS");
        let cfg = strategy.get(name).and_then(|c| c.get("networkQOS")).unwrap_or(&Value::Null);
        let enable = match cfg.get("enable").unwrap_or(&Value::Null) {
            Value::Null => false,
            Value::Bool(b) => *b,
            other => return Err(FieldError::new(format!("{base}.enable"), format!("{other} is not a boolean"))),
        };
        let field = |key: &str| -> Result<Bandwidth, FieldError> {
            let f = format!("{base}.{key}");
            match cfg.get(key).unwrap_or(&Value::Null) {
                Value::Null => Ok(Bandwidth::default()),
                Value::Number(n) => match n.as_i64() {
                    Some(p) if (0..=100).contains(&p) => Ok(Bandwidth::Percent(p as u64)),
                    _ => Err(FieldError::new(f, format!("{n} is not a percentage (0..=100)"))),
                },
                v @ Value::String(_) => Ok(Bandwidth::Quantity(quantity(v, &f)?)),
                other => Err(FieldError::new(f, format!("{other} is neither a percentage nor a quantity string"))),
            }
        };
        let bw = ClassBandwidth {
            ingress_request: field("ingressRequest")?,
            ingress_limit: field("ingressLimit")?,
            egress_request: field("egressRequest")?,
            egress_limit: field("egressLimit")?,
        };
        Ok(enable.then_some(bw))
    };
    Ok(NetQosRules { policy, total_bandwidth: total, ls: class("lsClass")?, be: class("beClass")? })
}

/// A quantity (JSON string or number, as `resource.Quantity` unmarshals) as its non-negative
/// `Value()`.
fn quantity(v: &Value, field: &str) -> Result<u64, FieldError> {
    let text = match v {
        Value::String(s) => s.trim().to_owned(),
        Value::Number(n) => n.to_string(),
        other => return Err(FieldError::new(field, format!("{other} is not a quantity"))),
    };
    let q: Quantity = text.parse().map_err(|e| FieldError::new(field, format!("{text:?} is not a quantity: {e}")))?;
    if q.is_negative() {
        return Err(FieldError::new(field, format!("{text:?} is negative")));
    }
    Ok(q.value() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_are_koordlets() {
        for spec in [Value::Null, json!({}), json!({"resourceQOSStrategy": {"lsClass": {"networkQOS": {}}}})] {
            assert_eq!(parse(&spec).unwrap(), NetQosRules::default(), "{spec}");
        }
        assert_eq!(NetQosRules::default().policy, NetQosPolicy::Tc);
    }

    #[test]
    fn full_spec() {
        let spec = json!({
            "systemStrategy": {"totalNetworkBandwidth": "1G"},
            "resourceQOSStrategy": {
                "policies": {"netQOSPolicy": "terway-qos"},
                "lsClass": {"networkQOS": {"enable": true, "ingressRequest": "100M", "ingressLimit": 100, "egressRequest": 50, "egressLimit": "800M"}},
                "beClass": {"networkQOS": {"enable": false, "ingressLimit": 10}},
            }
        });
        let r = parse(&spec).unwrap();
        assert_eq!(r.policy, NetQosPolicy::TerwayQos);
        assert_eq!(r.total_bandwidth, 1_000_000_000);
        let ls = r.ls.unwrap();
        assert_eq!(ls.ingress_request, Bandwidth::Quantity(100_000_000));
        assert_eq!(ls.ingress_limit, Bandwidth::Percent(100));
        assert_eq!(ls.egress_request.of_total(r.total_bandwidth), 500_000_000);
        assert_eq!(ls.egress_limit.of_total(r.total_bandwidth), 800_000_000);
        assert_eq!(r.be, None, "BE's networkQOS is off");
        assert_eq!(parse(&json!({"systemStrategy": {"totalNetworkBandwidth": 1000}})).unwrap().total_bandwidth, 1000);
    }

    #[test]
    fn bad_values_name_the_field() {
        for (spec, field, needle) in [
            (
                json!({"systemStrategy": {"totalNetworkBandwidth": "lots"}}),
                "spec.systemStrategy.totalNetworkBandwidth",
                "\"lots\"",
            ),
            (
                json!({"systemStrategy": {"totalNetworkBandwidth": "-1G"}}),
                "spec.systemStrategy.totalNetworkBandwidth",
                "negative",
            ),
            (
                json!({"resourceQOSStrategy": {"beClass": {"networkQOS": {"enable": true, "egressLimit": "10Q"}}}}),
                "spec.resourceQOSStrategy.beClass.networkQOS.egressLimit",
                "\"10Q\"",
            ),
            (
                json!({"resourceQOSStrategy": {"lsClass": {"networkQOS": {"ingressRequest": 150}}}}),
                "spec.resourceQOSStrategy.lsClass.networkQOS.ingressRequest",
                "percentage",
            ),
            (
                json!({"resourceQOSStrategy": {"lsClass": {"networkQOS": {"enable": "yes"}}}}),
                "spec.resourceQOSStrategy.lsClass.networkQOS.enable",
                "boolean",
            ),
            (
                json!({"resourceQOSStrategy": {"policies": {"netQOSPolicy": "ebpf"}}}),
                "spec.resourceQOSStrategy.policies.netQOSPolicy",
                "\"ebpf\"",
            ),
        ] {
            let e = parse(&spec).unwrap_err();
            assert_eq!(e.field, field, "{spec}");
            assert!(e.reason.contains(needle), "{spec}: {e}");
        }
    }
}
