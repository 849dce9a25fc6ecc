//! `--feature-gates`: which plugins run, switched as koordlet switches its runtime hooks
//! (`pkg/koordlet/runtimehooks/config.go`, Koordinator v1.8.0: one gate per hook plugin, with
//! its default), in Kubernetes' `Name=true,Other=false` form.
//!
//! # Gates
//!
//! | gate | default | plugin |
//! |---|---|---|
//! | `GroupIdentity` | on | [`crate::plugins::GroupIdentity`] |
//! | `CPUSetAllocator` | on | [`crate::plugins::CpuSet`] |
//! | `BatchResource` | on | [`crate::plugins::BatchResource`] |
//! | `CPUNormalization` | off | [`crate::plugins::CpuNormalization`] |
//! | `CoreSched` | off | [`crate::plugins::CoreSched`] |
//! | `GPUEnvInject` | off | [`crate::plugins::GpuEnvInject`] (HAMi-core library: `--hami-core-library-directory-path`) |
//! | `RDMADeviceInject` | off | [`crate::plugins::RdmaDeviceInject`] (host `/dev` and `/sys` under `--device-host-root`) |
//! | `Resctrl` | off | [`crate::plugins::Resctrl`] (`--resctrl-root`) |
//! | `TCNetworkQoS` | off | [`crate::plugins::TcNetworkQos`] |
//! | `TerwayQoS` | off | [`crate::plugins::TerwayQos`] (`--terway-qos-dir`) |
//! | `BECPUManager` (koordlet's, read by CPUSet) | off | [`crate::plugins::CpuSet`] gives NUMA-aware BE pods the BE share pools |
//!
//! # CoreSched and GroupIdentity
//!
//! `CoreSched` and `GroupIdentity` may both be on, as in koordlet (whose `config.go` calls
//! them exclusive but does not refuse the pair): the NodeSLO's `cpuPolicy` picks which one
//! acts (see [`crate::plugins::core_sched`]).
//!
//! # Syntax
//!
//! `AllAlpha` and `AllBeta` set every alpha (all but the three on by default, which are beta)
//! or beta gate, as in Kubernetes; a named gate wins over them whatever the order. Values are
//! Go's `strconv.ParseBool` (`true`, `1`, `t`, `TRUE`, …).
//!
//! # Errors
//!
//! An unknown gate name is refused at start, naming the known ones: a typo must not leave a
//! policy silently off.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::plugin::Plugin;
use crate::plugins::rdma_device::HostFs;
use crate::plugins::PluginOptions;
use crate::plugins::{BatchResource, CpuNormalization, CpuSet, GroupIdentity};
use crate::plugins::{GpuEnvInject, RdmaDeviceInject, TcNetworkQos, TerwayQos};

/// koordlet's gate read by CPUSet (not a plugin of its own): [`PluginOptions::be_cpu_manager`].
pub const BE_CPU_MANAGER: &str = "BECPUManager";

/// Builds a gate's plugin from the node's options (the command line's).
pub type PluginFn = fn(&PluginOptions) -> Arc<dyn Plugin>;
use crate::plugins::{CoreSched, Resctrl};

/// One gate.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// koordlet's name.
    pub name: &'static str,
    /// koordlet's default.
    pub default: bool,
    /// koordlet's maturity: beta gates default on, alpha off.
    pub beta: bool,
    /// The plugin it switches, built from the node's options; `None` for a gate that is an
    /// option of another plugin ([`BE_CPU_MANAGER`]).
    pub plugin: Option<PluginFn>,
}

/// Every gate known, in the order the framework runs the plugins (koordlet's registration order
/// for the three implemented).
pub const GATES: &[Gate] = &[
    Gate {
        name: "GroupIdentity",
        default: true,
        beta: true,
        plugin: Some(|o| Arc::new(GroupIdentity::from_options(o))),
    },
    Gate { name: "BatchResource", default: true, beta: true, plugin: Some(|_| Arc::new(BatchResource)) },
    Gate {
        name: "CPUSetAllocator",
        default: true,
        beta: true,
        plugin: Some(|o| Arc::new(CpuSet { be_cpu_manager: o.be_cpu_manager })),
    },
    Gate { name: "CPUNormalization", default: false, beta: false, plugin: Some(|_| Arc::new(CpuNormalization)) },
    Gate { name: "CoreSched", default: false, beta: false, plugin: Some(|_| Arc::new(CoreSched::default())) },
    Gate {
        name: "GPUEnvInject",
        default: false,
        beta: false,
        plugin: Some(|o| Arc::new(GpuEnvInject::new(o.devices.hami_core_library.clone()))),
    },
    Gate {
        name: "RDMADeviceInject",
        default: false,
        beta: false,
        plugin: Some(|o| Arc::new(RdmaDeviceInject::new(Arc::new(HostFs::new(&o.devices.host_root))))),
    },
    Gate {
        name: "Resctrl",
        default: false,
        beta: false,
        plugin: Some(|o| Arc::new(Resctrl::with_partial_view(o.partial_view))),
    },
    Gate { name: "TCNetworkQoS", default: false, beta: false, plugin: Some(|_| Arc::new(TcNetworkQos::default())) },
    Gate { name: "TerwayQoS", default: false, beta: false, plugin: Some(|_| Arc::new(TerwayQos::default())) },
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
            let (name, value) =
                entry.split_once('=').ok_or_else(|| format!("{entry:?}: expected Name=true or Name=false"))?;
            let (name, value) = (name.trim(), value.trim());
            let value = parse_bool(value)
                .ok_or_else(|| format!("{name}={value}: {value:?} is not a boolean (true or false)"))?;
            match name {
                "AllAlpha" => all_alpha = Some(value),
                "AllBeta" => all_beta = Some(value),
                _ => match GATES.iter().find(|g| g.name == name) {
                    Some(g) => {
                        named.insert(g.name, value);
                    }
                    None => {
                        let known: Vec<&str> = GATES.iter().map(|g| g.name).collect();
                        return Err(format!(
                            "unknown feature gate {name:?} (known: {}, AllAlpha, AllBeta)",
                            known.join(", ")
                        ));
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

    /// The plugins of the gates that are on, in [`GATES`] order, built with `options` (and
    /// [`BE_CPU_MANAGER`]'s value).
    pub fn plugins(&self, options: &PluginOptions) -> Vec<Arc<dyn Plugin>> {
        let options = &PluginOptions { be_cpu_manager: self.enabled(BE_CPU_MANAGER), ..options.clone() };
        GATES.iter().filter(|g| self.enabled(g.name)).filter_map(|g| g.plugin.map(|p| p(options))).collect()
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
        g.plugins(&PluginOptions::default()).iter().map(|p| p.name()).collect()
    }

    #[test]
    fn koordlets_defaults() {
        let g = FeatureGates::parse("").unwrap();
        assert_eq!(g, FeatureGates::default());
        assert_eq!(names(&g), ["GroupIdentity", "BatchResource", "CPUSet"]);
        assert!(!g.enabled("CoreSched") && !g.enabled("BECPUManager"));
        assert!(!g.enabled("TCNetworkQoS") && !g.enabled("TerwayQoS"));
        let g = FeatureGates::parse("TCNetworkQoS=true,TerwayQoS=true").unwrap();
        assert_eq!(names(&g), ["GroupIdentity", "BatchResource", "CPUSet", "TCNetworkQoS", "TerwayQoS"]);
    }

    #[test]
    fn kubernetes_form() {
        let g = FeatureGates::parse("GroupIdentity=false, BatchResource=f,CPUSetAllocator=1").unwrap();
        assert_eq!(names(&g), ["CPUSet"]);
        let g = FeatureGates::parse("AllBeta=false,BatchResource=true").unwrap();
        assert_eq!(names(&g), ["BatchResource"], "a named gate wins over AllBeta");
        let g = FeatureGates::parse("BatchResource=true,AllBeta=false").unwrap();
        assert_eq!(names(&g), ["BatchResource"], "whatever the order");
        assert!(FeatureGates::parse("AllAlpha=false").unwrap().plugins(&PluginOptions::default()).len() == 3);
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
        // Every gate of koordlet's is implemented: all of them on is a valid node.
        assert_eq!(FeatureGates::parse("AllAlpha=true").unwrap().plugins(&PluginOptions::default()).len(), 10);
    }

    /// BECPUManager is no plugin: on, it is accepted and CPUSet is built with it.
    #[test]
    fn be_cpu_manager_is_an_option_of_cpuset() {
        let g = FeatureGates::parse("BECPUManager=true").unwrap();
        let plugins = g.plugins(&PluginOptions::default());
        assert_eq!(plugins.iter().map(|p| p.name()).collect::<Vec<_>>(), ["GroupIdentity", "BatchResource", "CPUSet"]);
        // Its effect: a NUMA-aware BE container gets the BE share pool of its node.
        let mut rules = crate::rules::Rules::default();
        rules.cpuset.topology.be_share_pools =
            vec![crate::rules::topology::CpuSharedPool { socket: 0, node: 0, cpuset: "1".into() }];
        let mut c = crate::context::ContainerContext::default();
        c.pod.labels.insert(crate::context::QOS_CLASS_KEY.into(), "BE".into());
        c.pod.cgroup_parent = "/kubepods/besteffort/pod1".into();
        c.pod.annotations.insert(
            crate::plugins::cpuset::RESOURCE_STATUS.into(),
            r#"{"numaNodeResources": [{"node": 0, "resources": {"kubernetes.io/batch-cpu": "1000"}}]}"#.into(),
        );
        let cpus = |p: &Arc<dyn Plugin>| {
            p.container(crate::plugin::Stage::PreCreateContainer, &c, &rules).unwrap().resources.cpuset_cpus
        };
        assert_eq!(cpus(&plugins[2]).as_deref(), Some("1"));
        let off = FeatureGates::default().plugins(&PluginOptions::default());
        assert_eq!(cpus(&off[2]).as_deref(), Some(""), "gate off: cleared");
    }

    #[test]
    fn device_gates_switch_their_plugins() {
        let g = FeatureGates::parse("GPUEnvInject=true,RDMADeviceInject=true").unwrap();
        assert_eq!(names(&g), ["GroupIdentity", "BatchResource", "CPUSet", "GPUEnvInject", "RDMADeviceInject"]);
        assert!(
            !FeatureGates::default().enabled("GPUEnvInject") && !FeatureGates::default().enabled("RDMADeviceInject")
        );
    }
}
