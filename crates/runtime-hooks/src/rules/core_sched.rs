//! The NodeSLO's `spec` → the CoreSched settings, as koordlet v1.8.0's CoreSched hook parses
//! its merged NodeSLO (`hooks/coresched/rule.go` `parseRuleForNodeSLO`, `newParam`; defaults
//! from `pkg/util/sloconfig/nodeslo_config.go` `DefaultCPUQOS`).
//!
//! | field | default | effect |
//! |---|---|---|
//! | `resourceQOSStrategy.policies.cpuPolicy` | `groupIdentity` | only `coreSched` turns anything on |
//! | `resourceQOSStrategy.<class>.cpuQOS.enable` | `false` | the class's pods get core-sched cookies |
//! | `resourceQOSStrategy.<class>.cpuQOS.coreExpeller` | LSR, LS `true`; BE `false` | the class's pods take a cookie group of their own (`<group>-expeller`), apart from the same group of other classes |
//! | `resourceQOSStrategy.<class>.cpuQOS.schedIdle` | `0` | `1`: the class's kube-QoS directory gets `cpu.idle` = 1 |
//!
//! `<class>` is `lsrClass`, `lsClass`, `beClass`. Every value needs `cpuPolicy: coreSched`
//! (otherwise all off). Types are checked: a wrong type, or a `schedIdle` other than 0 or 1
//! (the API's validation), is a [`FieldError`].

use serde::Serialize;
use serde_json::Value;

use super::field::{bool_field, int_field, lookup, string_field, FieldError};
use crate::context::{KubeQos, QosClass};

/// What one class gets (koordlet's `Param`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CoreSchedParam {
    /// Its pods get cookies (`cpuQOS.enable` under `cpuPolicy: coreSched`).
    pub enabled: bool,
    /// Its pods' group takes the `-expeller` suffix (`cpuQOS.coreExpeller`).
    pub expeller: bool,
    /// Its kube-QoS directory gets `cpu.idle` = 1 (`cpuQOS.schedIdle` = 1).
    pub cpu_idle: bool,
}

/// The CoreSched rule (koordlet's `Rule`). `Default`: everything off (koordlet's defaults,
/// whose `cpuPolicy` is `groupIdentity`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CoreSchedRules {
    /// Any class has cookies on (koordlet's node-level switch).
    pub enable: bool,
    /// LSE and LSR pods.
    pub lsr: CoreSchedParam,
    /// LS pods; Burstable pods without a class; the `kubepods/burstable` directory.
    pub ls: CoreSchedParam,
    /// BE pods; BestEffort pods without a class; the `kubepods/besteffort` directory.
    pub be: CoreSchedParam,
    /// Guaranteed pods without a class and the `kubepods` directory: LSR's if LSR's cookies are
    /// on, else LS's.
    pub guaranteed: CoreSchedParam,
}

impl CoreSchedRules {
    /// Whether a pod of Koordinator class `qos` and kube QoS `kube` gets cookies, and whether
    /// it is an expeller (koordlet's `Rule.IsPodEnabled`): the class decides for LSE, LSR, LS and
    /// BE, the kube QoS for the others; `(false, false)` when no class is on.
    pub fn pod(&self, qos: QosClass, kube: KubeQos) -> (bool, bool) {
        if !self.enable {
            return (false, false);
        }
        let p = match qos {
            QosClass::Lse | QosClass::Lsr => self.lsr,
            QosClass::Ls => self.ls,
            QosClass::Be => self.be,
            QosClass::System | QosClass::None => self.kube(kube),
        };
        (p.enabled, p.expeller)
    }

    /// The settings of a kube-QoS class.
    pub fn kube(&self, kube: KubeQos) -> CoreSchedParam {
        match kube {
            KubeQos::Guaranteed => self.guaranteed,
            KubeQos::Burstable => self.ls,
            KubeQos::BestEffort => self.be,
        }
    }
}

/// Parses a NodeSLO's `spec` (`null` or `{}`: the defaults, all off).
///
/// Errors: the first field read that has the wrong type or value (module table).
pub fn parse(spec: &Value) -> Result<CoreSchedRules, FieldError> {
    let policy_field = "spec.resourceQOSStrategy.policies.cpuPolicy";
    let policy = string_field(&lookup(spec, &["resourceQOSStrategy", "policies", "cpuPolicy"]), policy_field)?;
    let core_sched = policy.as_deref() == Some("coreSched");
    let class = |name: &str, default_expeller: bool| -> Result<CoreSchedParam, FieldError> {
        let at = |f: &str| lookup(spec, &["resourceQOSStrategy", name, "cpuQOS", f]);
        let field = |f: &str| format!("spec.resourceQOSStrategy.{name}.cpuQOS.{f}");
        let enable = bool_field(&at("enable"), &field("enable"))?.unwrap_or(false);
        let expeller = bool_field(&at("coreExpeller"), &field("coreExpeller"))?.unwrap_or(default_expeller);
        let idle = int_field(&at("schedIdle"), &field("schedIdle"))?.unwrap_or(0);
        if !(0..=1).contains(&idle) {
            return Err(FieldError::new(field("schedIdle"), format!("{idle} is not 0 or 1")));
        }
        Ok(CoreSchedParam {
            enabled: core_sched && enable,
            expeller: core_sched && expeller,
            cpu_idle: core_sched && idle == 1,
        })
    };
    let (lsr, ls, be) = (class("lsrClass", true)?, class("lsClass", true)?, class("beClass", false)?);
    Ok(CoreSchedRules {
        enable: lsr.enabled || ls.enabled || be.enabled,
        lsr,
        ls,
        be,
        guaranteed: if lsr.enabled { lsr } else { ls },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn off_unless_the_policy_is_core_sched() {
        assert_eq!(parse(&Value::Null).unwrap(), CoreSchedRules::default());
        let spec = json!({"resourceQOSStrategy":{"lsClass":{"cpuQOS":{"enable":true,"schedIdle":1}}}});
        assert_eq!(parse(&spec).unwrap(), CoreSchedRules::default(), "groupIdentity policy");
    }

    #[test]
    fn koordlets_defaults_under_core_sched() {
        let spec = json!({"resourceQOSStrategy":{"policies":{"cpuPolicy":"coreSched"},
            "lsClass":{"cpuQOS":{"enable":true}},"beClass":{"cpuQOS":{"enable":true,"schedIdle":1}}}});
        let r = parse(&spec).unwrap();
        assert!(r.enable);
        assert_eq!(r.ls, CoreSchedParam { enabled: true, expeller: true, cpu_idle: false });
        assert_eq!(r.be, CoreSchedParam { enabled: true, expeller: false, cpu_idle: true });
        assert_eq!(r.lsr, CoreSchedParam { enabled: false, expeller: true, cpu_idle: false });
        assert_eq!(r.guaranteed, r.ls, "LSR off: Guaranteed follows LS");
        assert_eq!(r.pod(QosClass::Be, KubeQos::Guaranteed), (true, false));
        assert_eq!(r.pod(QosClass::Lsr, KubeQos::BestEffort), (false, true));
        assert_eq!(r.pod(QosClass::None, KubeQos::Burstable), (true, true));
        assert_eq!(r.pod(QosClass::System, KubeQos::BestEffort), (true, false));
        assert!(r.kube(KubeQos::BestEffort).cpu_idle && !r.kube(KubeQos::Burstable).cpu_idle);
        let spec = json!({"resourceQOSStrategy":{"policies":{"cpuPolicy":"coreSched"},"lsrClass":{"cpuQOS":{"enable":true,"coreExpeller":false}}}});
        let r = parse(&spec).unwrap();
        assert_eq!(r.guaranteed, CoreSchedParam { enabled: true, expeller: false, cpu_idle: false });
    }

    #[test]
    fn bad_values_name_the_field() {
        for (cpu_qos, field) in [
            (json!({"schedIdle": 2}), "spec.resourceQOSStrategy.beClass.cpuQOS.schedIdle"),
            (json!({"coreExpeller": "yes"}), "spec.resourceQOSStrategy.beClass.cpuQOS.coreExpeller"),
        ] {
            let spec =
                json!({"resourceQOSStrategy":{"policies":{"cpuPolicy":"coreSched"},"beClass":{"cpuQOS": cpu_qos}}});
            assert_eq!(parse(&spec).unwrap_err().field, field);
        }
    }
}
