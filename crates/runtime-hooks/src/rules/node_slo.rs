//! The NodeSLO's `spec` → the GroupIdentity and BatchResource settings, as koordlet v1.8.0
//! parses its merged NodeSLO (`groupidentity/rule.go` `parseRule`, `batchresource/rule.go`
//! `parseRuleForNodeSLO`, defaults from `pkg/util/sloconfig/nodeslo_config.go`).
//!
//! # Fields
//!
//! Fields read, and koordlet's default when missing:
//!
//! | field | default | effect |
//! |---|---|---|
//! | `resourceQOSStrategy.policies.cpuPolicy` | `groupIdentity` | any other value (`coreSched`) turns group identity off |
//! | `resourceQOSStrategy.lsrClass.cpuQOS.enable` | `false` | LSR/LSE pods: `groupIdentity` if on, else 0 |
//! | `resourceQOSStrategy.lsrClass.cpuQOS.groupIdentity` | `2` | |
//! | `resourceQOSStrategy.lsClass.cpuQOS.enable` | `false` | LS pods, Burstable pods and directory |
//! | `resourceQOSStrategy.lsClass.cpuQOS.groupIdentity` | `2` | |
//! | `resourceQOSStrategy.beClass.cpuQOS.enable` | `false` | BE pods, BestEffort pods and directory |
//! | `resourceQOSStrategy.beClass.cpuQOS.groupIdentity` | `-1` | |
//! | `resourceUsedThresholdWithBE.enable` | `false` | with `cpuSuppressPolicy: cfsQuota`: BE CFS quota −1 |
//! | `resourceUsedThresholdWithBE.cpuSuppressPolicy` | `cpuset` | `cpuset` or `cfsQuota` |
//! | `hostApplications` | none | processes outside Kubernetes with a QoS class ([`super::host_app`]) |
//!
//! The network QoS fields (`networkQOS`, `netQOSPolicy`, `totalNetworkBandwidth`) are parsed by
//! [`super::net_qos`], the CoreSched settings (`cpuQOS.coreExpeller`, `cpuQOS.schedIdle`, …) by
//! [`super::core_sched`], `hostApplications` by [`super::host_app`].
//!
//! Every other field of the spec is ignored (koordlet's other modules read them).
//!
//! # Errors
//!
//! Types are checked for the fields read: a wrong type, an unknown enum value or a group identity
//! outside −1..=2 (the API's own validation) is a [`FieldError`] naming the field and the value.

use serde_json::Value;

use super::field::{bool_field, int_field, lookup, string_field, FieldError};
use super::GroupIdentityRules;

/// What the NodeSLO sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SloRules {
    /// Group identity per class.
    pub group_identity: GroupIdentityRules,
    /// BatchResource sets BE pods' CFS quota from their batch-cpu limit.
    pub batch_cfs_quota: bool,
    /// `spec.hostApplications` ([`super::host_app`]).
    pub host_applications: Vec<super::host_app::HostApplication>,
    /// Network QoS (TCNetworkQoS, TerwayQoS): see [`super::net_qos`].
    pub net_qos: super::net_qos::NetQosRules,
    /// CoreSched's rule ([`super::core_sched`]).
    pub core_sched: super::core_sched::CoreSchedRules,
}

impl Default for SloRules {
    /// koordlet's defaults: what an empty spec gives.
    fn default() -> Self {
        parse(&Value::Null).unwrap_or(SloRules {
            group_identity: GroupIdentityRules::default(),
            batch_cfs_quota: true,
            host_applications: Vec::new(),
            net_qos: Default::default(),
            core_sched: Default::default(),
        })
    }
}

/// Parses a NodeSLO's `spec` (`null` or `{}`: all defaults).
///
/// Errors: the first field read that has the wrong type or value (see the module table).
pub fn parse(spec: &Value) -> Result<SloRules, FieldError> {
    let at = |path: &[&str]| lookup(spec, path);
    let policy = string_field(
        &at(&["resourceQOSStrategy", "policies", "cpuPolicy"]),
        "spec.resourceQOSStrategy.policies.cpuPolicy",
    )?;
    let group_identity_policy = match policy.as_deref() {
        None | Some("") | Some("groupIdentity") => true,
        Some("coreSched") => false,
        Some(other) => {
            return Err(FieldError::new(
                "spec.resourceQOSStrategy.policies.cpuPolicy",
                format!("unknown value {other:?} (groupIdentity or coreSched)"),
            ))
        }
    };
    let class = |name: &str, default_gi: i64| -> Result<i64, FieldError> {
        let base = format!("spec.resourceQOSStrategy.{name}.cpuQOS");
        let enable = bool_field(&at(&["resourceQOSStrategy", name, "cpuQOS", "enable"]), &format!("{base}.enable"))?
            .unwrap_or(false);
        let field = format!("{base}.groupIdentity");
        let value =
            int_field(&at(&["resourceQOSStrategy", name, "cpuQOS", "groupIdentity"]), &field)?.unwrap_or(default_gi);
        if !(-1..=2).contains(&value) {
            return Err(FieldError::new(field, format!("{value} is not one of -1, 0, 1, 2")));
        }
        Ok(if group_identity_policy && enable { value } else { 0 })
    };
    let enabled = |name: &str| -> Result<bool, FieldError> {
        let field = format!("spec.resourceQOSStrategy.{name}.cpuQOS.enable");
        Ok(group_identity_policy
            && bool_field(&at(&["resourceQOSStrategy", name, "cpuQOS", "enable"]), &field)?.unwrap_or(false))
    };
    let (lsr, ls, be) = (class("lsrClass", 2)?, class("lsClass", 2)?, class("beClass", -1)?);
    let (lsr_on, ls_on, be_on) = (enabled("lsrClass")?, enabled("lsClass")?, enabled("beClass")?);
    let group_identity = GroupIdentityRules {
        enable: lsr_on || ls_on || be_on,
        lsr,
        ls,
        be,
        none: 0,
        guaranteed_pod: if lsr_on {
            lsr
        } else if ls_on {
            ls
        } else {
            0
        },
    };

    let threshold = at(&["resourceUsedThresholdWithBE"]);
    let suppress_field = "spec.resourceUsedThresholdWithBE.cpuSuppressPolicy";
    let suppress = string_field(&lookup(&threshold, &["cpuSuppressPolicy"]), suppress_field)?;
    let suppress_on =
        bool_field(&lookup(&threshold, &["enable"]), "spec.resourceUsedThresholdWithBE.enable")?.unwrap_or(false);
    let cfs_quota_policy = match suppress.as_deref() {
        // koordlet: an empty policy means the defaults for both fields (enable false).
        None | Some("") => false,
        Some("cpuset") => false,
        Some("cfsQuota") => suppress_on,
        Some(other) => {
            return Err(FieldError::new(suppress_field, format!("unknown value {other:?} (cpuset or cfsQuota)")))
        }
    };
    let host_applications = super::host_app::parse(spec)?;
    let net_qos = super::net_qos::parse(spec)?;
    let core_sched = super::core_sched::parse(spec)?;
    Ok(SloRules { group_identity, batch_cfs_quota: !cfs_quota_policy, host_applications, net_qos, core_sched })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_empty_spec_is_koordlets_defaults() {
        for spec in [Value::Null, json!({}), json!({"resourceQOSStrategy": {}})] {
            let r = parse(&spec).unwrap();
            assert_eq!(r.group_identity, GroupIdentityRules::default(), "{spec}");
            assert!(r.batch_cfs_quota);
        }
        assert_eq!(SloRules::default(), parse(&json!({})).unwrap());
    }

    #[test]
    fn the_recorded_node_slo() {
        // test-support/fixtures/k8s-wire/03-create-nodeslo.txt
        let spec = json!({"resourceUsedThresholdWithBE":{"enable":true,"cpuSuppressThresholdPercent":65,"cpuSuppressPolicy":"cfsQuota"},
            "resourceQOSStrategy":{"beClass":{"cpuQOS":{"enable":true,"groupIdentity":-1}},"lsClass":{"cpuQOS":{"enable":true,"groupIdentity":2}}}});
        let r = parse(&spec).unwrap();
        assert_eq!(
            r.group_identity,
            GroupIdentityRules { enable: true, lsr: 0, ls: 2, be: -1, none: 0, guaranteed_pod: 2 }
        );
        assert!(!r.batch_cfs_quota, "enabled cfsQuota suppression unsets BE quotas");
    }

    #[test]
    fn suppress_policy_needs_enable_and_cfs_quota() {
        for (t, want) in [
            (json!({"enable": true, "cpuSuppressPolicy": "cpuset"}), true),
            (json!({"enable": false, "cpuSuppressPolicy": "cfsQuota"}), true),
            (json!({"cpuSuppressPolicy": "cfsQuota"}), true),
            (json!({"enable": true}), true),
            (json!({"enable": true, "cpuSuppressPolicy": "cfsQuota"}), false),
        ] {
            assert_eq!(parse(&json!({"resourceUsedThresholdWithBE": t})).unwrap().batch_cfs_quota, want, "{t}");
        }
    }

    #[test]
    fn core_sched_policy_turns_group_identity_off() {
        let spec =
            json!({"resourceQOSStrategy":{"policies":{"cpuPolicy":"coreSched"},"lsrClass":{"cpuQOS":{"enable":true}}}});
        assert_eq!(parse(&spec).unwrap().group_identity, GroupIdentityRules::default());
        let spec = json!({"resourceQOSStrategy":{"lsrClass":{"cpuQOS":{"enable":true}}}});
        let g = parse(&spec).unwrap().group_identity;
        assert_eq!((g.enable, g.lsr, g.ls, g.be, g.guaranteed_pod), (true, 2, 0, 0, 2));
    }

    #[test]
    fn bad_values_name_the_field() {
        for (spec, field, needle) in [
            (
                json!({"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "bogus"}}),
                "spec.resourceUsedThresholdWithBE.cpuSuppressPolicy",
                "\"bogus\"",
            ),
            (
                json!({"resourceUsedThresholdWithBE": {"enable": "yes", "cpuSuppressPolicy": "cfsQuota"}}),
                "spec.resourceUsedThresholdWithBE.enable",
                "boolean",
            ),
            (
                json!({"resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 5}}}}),
                "spec.resourceQOSStrategy.beClass.cpuQOS.groupIdentity",
                "5",
            ),
            (
                json!({"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"groupIdentity": "2"}}}}),
                "spec.resourceQOSStrategy.lsClass.cpuQOS.groupIdentity",
                "integer",
            ),
            (
                json!({"resourceQOSStrategy": {"policies": {"cpuPolicy": "fast"}}}),
                "spec.resourceQOSStrategy.policies.cpuPolicy",
                "\"fast\"",
            ),
        ] {
            let e = parse(&spec).unwrap_err();
            assert_eq!(e.field, field, "{spec}");
            assert!(e.reason.contains(needle), "{spec}: {e}");
        }
    }
}
