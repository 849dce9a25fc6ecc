//! The rules file format of earlier releases (deprecated; read for one more release, with a
//! warning).
//!
//! # Format
//!
//! A file in this format is a map without `apiVersion`/`kind`; every key optional,
//! unknown keys refused. With every default:
//!
//! ```yaml
//! groupIdentity: {enable: true, lsr: 2, ls: 2, be: -1, none: 0}
//! cpu: {cfsPeriodUs: 100000}
//! batchResource: {enable: true, cfsQuota: true}
//! cpuset: {enable: true, unsetCfsQuota: true}
//! ```
//!
//! # In the NodeSLO form
//!
//! See docs/guide/rules.md, "Rules: from the cluster, or from a file". The `groupIdentity` values are
//! `resourceQOSStrategy.<class>.cpuQOS` (`enable: true` plus `groupIdentity`), and
//! `batchResource.cfsQuota: false` is `resourceUsedThresholdWithBE: {enable: true,
//! cpuSuppressPolicy: cfsQuota}`. `cpuset.unsetCfsQuota: false` is koordlet's flag
//! `--disable-unset-cpu-quota` ([`super::RuleFlags`]), which works with either format. `cpu`,
//! `batchResource.enable` and `cpuset.enable` have no NodeSLO field; they keep their defaults in
//! the new format.
//!
//! # Difference in meaning
//!
//! The old format's defaults had group identity on, koordlet's (and the new format's) have it off.

use anyhow::bail;
use serde::Deserialize;

use super::{BatchResourceRules, CpuRules, CpusetRules, GroupIdentityRules, Rules};

/// The old file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LegacyRules {
    /// Group identity per class.
    pub group_identity: LegacyGroupIdentity,
    /// CPU settings.
    pub cpu: LegacyCpu,
    /// BatchResource switches.
    pub batch_resource: LegacySwitches,
    /// CPUSet switches.
    pub cpuset: LegacyCpuset,
}

/// `groupIdentity`: values −1..=2; `enable: false` means 0 everywhere.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LegacyGroupIdentity {
    /// Default true.
    pub enable: bool,
    /// LSR and LSE pods. Default 2.
    pub lsr: i64,
    /// LS pods, unclassified Guaranteed/Burstable pods. Default 2.
    pub ls: i64,
    /// BE pods, unclassified BestEffort pods. Default −1.
    pub be: i64,
    /// The `kubepods` directory. Default 0.
    pub none: i64,
}

impl Default for LegacyGroupIdentity {
    fn default() -> Self {
        LegacyGroupIdentity { enable: true, lsr: 2, ls: 2, be: -1, none: 0 }
    }
}

/// `cpu`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LegacyCpu {
    /// CFS period, µs, 1000..=1000000. Default 100000.
    pub cfs_period_us: i64,
}

impl Default for LegacyCpu {
    fn default() -> Self {
        LegacyCpu { cfs_period_us: 100_000 }
    }
}

/// `batchResource`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LegacySwitches {
    /// Default true.
    pub enable: bool,
    /// Default true.
    pub cfs_quota: bool,
}

impl Default for LegacySwitches {
    fn default() -> Self {
        LegacySwitches { enable: true, cfs_quota: true }
    }
}

/// `cpuset`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LegacyCpuset {
    /// Default true.
    pub enable: bool,
    /// Default true.
    pub unset_cfs_quota: bool,
}

impl Default for LegacyCpuset {
    fn default() -> Self {
        LegacyCpuset { enable: true, unset_cfs_quota: true }
    }
}

impl LegacyRules {
    /// The rules it means.
    ///
    /// Errors: a group identity value outside −1..=2, a CFS period outside 1000..=1000000 µs.
    pub fn to_rules(&self) -> anyhow::Result<Rules> {
        let g = &self.group_identity;
        for (name, v) in [("lsr", g.lsr), ("ls", g.ls), ("be", g.be), ("none", g.none)] {
            if !(-1..=2).contains(&v) {
                bail!("groupIdentity.{name} = {v}: must be -1, 0, 1 or 2");
            }
        }
        let p = self.cpu.cfs_period_us;
        if !(1000..=1_000_000).contains(&p) {
            bail!("cpu.cfsPeriodUs = {p}: must be within 1000..=1000000");
        }
        let group_identity = if g.enable {
            GroupIdentityRules { enable: true, lsr: g.lsr, ls: g.ls, be: g.be, none: g.none, guaranteed_pod: g.ls }
        } else {
            GroupIdentityRules::default()
        };
        Ok(Rules {
            group_identity,
            cpu: CpuRules { cfs_period_us: p },
            batch_resource: BatchResourceRules {
                enable: self.batch_resource.enable,
                cfs_quota: self.batch_resource.cfs_quota,
                ..Default::default()
            },
            cpuset: CpusetRules {
                enable: self.cpuset.enable,
                unset_cfs_quota: self.cpuset.unset_cfs_quota,
                ..Default::default()
            },
            ..Default::default()
        })
    }
}
