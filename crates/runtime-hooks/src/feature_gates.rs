//! `--feature-gates`: which plugins run, switched as koordlet switches its runtime hooks
//! (`pkg/koordlet/runtimehooks/config.go`, Koordinator v1.8.0: one gate per hook plugin, with
//! its default), in Kubernetes' `Name=true,Other=false` form.
//!
//! | gate | default | plugin |
//! |---|---|---|
//! | `GroupIdentity` | on | [`crate::plugins::GroupIdentity`] |
//! | `CPUSetAllocator` | on | [`crate::plugins::CpuSet`] |
//! | `BatchResource` | on | [`crate::plugins::BatchResource`] |
//! | `CoreSched` | off | [`crate::plugins::CoreSched`] |
//! | `Resctrl` | off | [`crate::plugins::Resctrl`] |
//! | `CPUNormalization`, `GPUEnvInject`, `RDMADeviceInject`, `TCNetworkQoS`, `TerwayQoS` | off | not implemented here yet: turning one on is refused |
//! | `BECPUManager` (koordlet's, read by CPUSet) | off | not implemented here yet: turning it on is refused |
//!
//! `CoreSched` and `GroupIdentity` may both be on, as in koordlet (whose `config.go` calls
//! them exclusive but does not refuse the pair): the NodeSLO's `cpuPolicy` picks which one
//! acts (see [`crate::plugins::core_sched`]).
//!
//! `AllAlpha` and `AllBeta` set every alpha (all but the three above, which are beta) or beta
//! gate, as in Kubernetes; a named gate wins over them whatever the order. Values are Go's
//! `strconv.ParseBool` (`true`, `1`, `t`, `TRUE`, …). An unknown gate name is refused at start,
//! naming the known ones: a typo must not leave a policy silently off.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::plugin::Plugin;
use crate::plugins::{BatchResource, CoreSched, CpuSet, GroupIdentity, Resctrl};

/// One gate.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// koordlet's name.
    pub name: &'static str,
    /// koordlet's default.
    pub default: bool,
    /// koordlet's maturity: beta gates default on, alpha off.
    pub beta: bool,
    /// The plugin it switches, when implemented here.
    pub plugin: Option<fn() -> Arc<dyn Plugin>>,
}

/// Every gate known, in the order the framework runs the plugins (koordlet's registration order
/// for the three implemented).
pub const GATES: &[Gate] = &[
    Gate { name: "GroupIdentity", default: true, beta: true, plugin: Some(|| Arc::new(GroupIdentity)) },
    Gate { name: "BatchResource", default: true, beta: true, plugin: Some(|| Arc::new(BatchResource)) },
    Gate { name: "CPUSetAllocator", default: true, beta: true, plugin: Some(|| Arc::new(CpuSet)) },
    Gate { name: "CPUNormalization", default: false, beta: false, plugin: None },
    Gate { name: "CoreSched", default: false, beta: false, plugin: Some(|| Arc::new(CoreSched::default())) },
    Gate { name: "GPUEnvInject", default: false, beta: false, plugin: None },
    Gate { name: "RDMADeviceInject", default: false, beta: false, plugin: None },
    Gate { name: "Resctrl", default: false, beta: false, plugin: Some(|| Arc::new(Resctrl::default())) },
    Gate { name: "TCNetworkQoS", default: false, beta: false, plugin: None },
    Gate { name: "TerwayQoS", default: false, beta: false, plugin: None },
    Gate { name: "BECPUManager", default: false, beta: false, plugin: None },
];

/// The gates' values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    values: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    /// koordlet's defaults.
    fn default() -> Self {
        FeatureGates { values: GATES.iter().map(|g| (g.name, g.default)).collect() }
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl FeatureGates {
    /// Parses `Name=bool,…` over koordlet's defaults (empty: the defaults).
    ///
    /// Errors: an entry without `=`, a value that is not a boolean, an unknown gate name (the
    /// message lists the known ones).
    pub fn parse(s: &str) -> Result<FeatureGates, String> {
        let mut gates = FeatureGates::default();
        let mut named = BTreeMap::new();
        let (mut all_alpha, mut all_beta) = (None, None);
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, value) = entry.split_once('=').ok_or_else(|| format!("{entry:?}: expected Name=true or Name=false"))?;
            let (name, value) = (name.trim(), value.trim());
            let value = parse_bool(value).ok_or_else(|| format!("{name}={value}: {value:?} is not a boolean (true or false)"))?;
            match name {
                "AllAlpha" => all_alpha = Some(value),
                "AllBeta" => all_beta = Some(value),
                _ => match GATES.iter().find(|g| g.name == name) {
                    Some(g) => {
                        named.insert(g.name, value);
                    }
                    None => {
                        let known: Vec<&str> = GATES.iter().map(|g| g.name).collect();
                        return Err(format!("unknown feature gate {name:?} (known: {}, AllAlpha, AllBeta)", known.join(", ")));
                    }
                },
            }
        }
        for g in GATES {
            if let Some(v) = if g.beta { all_beta } else { all_alpha } {
                gates.values.insert(g.name, v);
            }
        }
        gates.values.extend(named);
        Ok(gates)
    }

    /// Whether `name` is on (unknown names: off).
    pub fn enabled(&self, name: &str) -> bool {
        self.values.get(name).copied().unwrap_or(false)
    }

    /// The plugins of the gates that are on, in [`GATES`] order.
    ///
    /// Errors: a gate that is on but whose plugin is not implemented here (naming them all).
    pub fn plugins(&self) -> Result<Vec<Arc<dyn Plugin>>, String> {
        let missing: Vec<&str> = GATES.iter().filter(|g| self.enabled(g.name) && g.plugin.is_none()).map(|g| g.name).collect();
        if !missing.is_empty() {
            return Err(format!(
                "feature gate{} {} {} koordlet's but not implemented by runtime-hooks yet: turn {} off",
                if missing.len() > 1 { "s" } else { "" },
                missing.join(", "),
                if missing.len() > 1 { "are" } else { "is" },
                if missing.len() > 1 { "them" } else { "it" },
            ));
        }
        Ok(GATES.iter().filter(|g| self.enabled(g.name)).filter_map(|g| g.plugin.map(|p| p())).collect())
    }

    /// `Name=value` of every gate, for the start-up log line.
    pub fn describe(&self) -> String {
        GATES.iter().map(|g| format!("{}={}", g.name, self.enabled(g.name))).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(g: &FeatureGates) -> Vec<&'static str> {
        g.plugins().unwrap().iter().map(|p| p.name()).collect()
    }

    #[test]
    fn koordlets_defaults() {
        let g = FeatureGates::parse("").unwrap();
        assert_eq!(g, FeatureGates::default());
        assert_eq!(names(&g), ["GroupIdentity", "BatchResource", "CPUSet"]);
        assert!(!g.enabled("CoreSched") && !g.enabled("BECPUManager"));
    }

    #[test]
    fn kubernetes_form() {
        let g = FeatureGates::parse("GroupIdentity=false, BatchResource=f,CPUSetAllocator=1").unwrap();
        assert_eq!(names(&g), ["CPUSet"]);
        let g = FeatureGates::parse("AllBeta=false,BatchResource=true").unwrap();
        assert_eq!(names(&g), ["BatchResource"], "a named gate wins over AllBeta");
        let g = FeatureGates::parse("BatchResource=true,AllBeta=false").unwrap();
        assert_eq!(names(&g), ["BatchResource"], "whatever the order");
        assert!(FeatureGates::parse("AllAlpha=false").unwrap().plugins().is_ok());
        let g = FeatureGates::parse("CoreSched=true,Resctrl=true").unwrap();
        assert_eq!(
            names(&g),
            ["GroupIdentity", "BatchResource", "CPUSet", "CoreSched", "Resctrl"],
            "CoreSched with GroupIdentity, as koordlet"
        );
    }

    #[test]
    fn refusals_name_the_problem() {
        for (s, needle) in [
            ("GroupIdentiy=true", "unknown feature gate \"GroupIdentiy\""),
            ("GroupIdentity", "expected Name=true"),
            ("GroupIdentity=yes", "\"yes\" is not a boolean"),
        ] {
            let e = FeatureGates::parse(s).unwrap_err();
            assert!(e.contains(needle), "{s}: {e}");
        }
        let e = FeatureGates::parse("CPUNormalization=true,TerwayQoS=true").unwrap().plugins().err().unwrap();
        assert!(e.contains("CPUNormalization, TerwayQoS are koordlet's but not implemented"), "{e}");
        assert!(FeatureGates::parse("AllAlpha=true").unwrap().plugins().is_err());
    }
}
