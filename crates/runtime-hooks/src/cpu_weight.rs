//! CPU shares → cgroup v2 `cpu.weight`: the two conversions in use, and which one this node's
//! runtime uses.
//!
//! Plugins speak CPU shares (the cgroup v1 unit, 2..=262144, kubelet's `MilliCPUToShares`). On
//! cgroup v2 the kernel file is `cpu.weight` (1..=10000, default 100), and two conversions are in
//! use on real nodes:
//!
//! | formula | who | 2 | 512 | 1024 | 262144 |
//! |---|---|---|---|---|---|
//! | [`WeightFormula::Linear`] | koordlet (`pkg/koordlet/util/system/cgroup2.go`), runc < 1.3.2, crun < 1.23, systemd's `CPUShares=` mapping | 1 | 20 | 39 | 10000 |
//! | [`WeightFormula::Runc`] | runc ≥ 1.3.2, crun ≥ 1.23 (opencontainers/cgroups#20) | 1 | 59 | 100 | 10000 |
//!
//! In proxy and NRI mode runtime-hooks answers CPU shares and the runtime converts them for the
//! container; at pod level, and for every container in standalone mode, runtime-hooks writes
//! `cpu.weight` itself. If the two used different formulas, a pod's weight and its containers'
//! would stand in a ratio nobody chose, and the reconciler would "correct" runc's values on
//! every pass. So runtime-hooks writes with the formula of the node's runtime ([`WeightConversion`]):
//! forced by `--cpu-weight-formula linear|runc`, or learned (`auto`, the default) from the
//! first running container whose CPU shares (from the runtime's OCI spec) and `cpu.weight` (the
//! file runc wrote) are both known and tell the formulas apart — every shares value but 2 and
//! 262144 does. Until then [`WeightFormula::Runc`]: the runc that current containerd releases
//! ship (and Debian sid's 1.3.6) uses it.

use std::sync::atomic::{AtomicU8, Ordering};

/// CPU shares bounds of the kernel (and kubelet): 2..=262144.
pub const MIN_SHARES: i64 = 2;
/// Upper bound of `cpu.shares`.
pub const MAX_SHARES: i64 = 262_144;

/// A shares → `cpu.weight` conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum WeightFormula {
    /// `1 + (shares − 2) × 9999 / 262142` (integer division): koordlet's, and runc's before
    /// 1.3.2. 1024 shares → 39.
    Linear,
    /// runc ≥ 1.3.2's: with `l = log2(shares)`, `⌈10^((l² + 125·l) / 612 − 7/34)⌉`, so that
    /// 2 → 1, 1024 → 100 (the v2 default for the v1 default) and 262144 → 10000.
    Runc,
}

impl WeightFormula {
    /// `cpu.weight` (1..=10000) for CPU shares, clamped to 2..=262144 first.
    pub fn weight(self, shares: i64) -> i64 {
        let s = shares.clamp(MIN_SHARES, MAX_SHARES);
        match self {
            WeightFormula::Linear => 1 + ((s - 2) * 9999) / 262_142,
            WeightFormula::Runc => {
                if s <= MIN_SHARES {
                    return 1;
                }
                if s >= MAX_SHARES {
                    return 10_000;
                }
                let l = (s as f64).log2();
                let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
                (10f64.powf(exponent).ceil() as i64).clamp(1, 10_000)
            }
        }
    }

    /// The formula that turned `shares` into `weight`, if exactly one of them does (`None` for
    /// 2 and 262144, where both agree, and for a weight neither gives: someone else wrote it).
    pub fn of_sample(shares: i64, weight: i64) -> Option<WeightFormula> {
        let linear = WeightFormula::Linear.weight(shares) == weight;
        let runc = WeightFormula::Runc.weight(shares) == weight;
        match (linear, runc) {
            (true, false) => Some(WeightFormula::Linear),
            (false, true) => Some(WeightFormula::Runc),
            _ => None,
        }
    }

    /// The flag's spelling: `linear` or `runc`.
    pub fn as_str(self) -> &'static str {
        match self {
            WeightFormula::Linear => "linear",
            WeightFormula::Runc => "runc",
        }
    }
}

/// The node's conversion: forced, or learned from the runtime's own writes (module docs).
/// Shared by every writer of the process through [`crate::cgroup::CgroupFs`].
#[derive(Debug)]
pub struct WeightConversion {
    forced: Option<WeightFormula>,
    /// 0 = not learned yet, 1 = linear, 2 = runc.
    learned: AtomicU8,
}

impl Default for WeightConversion {
    fn default() -> WeightConversion {
        WeightConversion::new(None)
    }
}

/// The default of `auto` before a container has told the formulas apart (module docs).
pub const DEFAULT_FORMULA: WeightFormula = WeightFormula::Runc;

impl WeightConversion {
    /// `Some(formula)`: always that one (`--cpu-weight-formula linear|runc`); `None`: learn it.
    pub fn new(forced: Option<WeightFormula>) -> WeightConversion {
        WeightConversion { forced, learned: AtomicU8::new(0) }
    }

    /// The formula in use now.
    pub fn formula(&self) -> WeightFormula {
        self.forced.or_else(|| self.learned()).unwrap_or(DEFAULT_FORMULA)
    }

    /// The formula learned so far (`None`: forced, or nothing decisive seen yet).
    pub fn learned(&self) -> Option<WeightFormula> {
        match self.learned.load(Ordering::Relaxed) {
            1 => Some(WeightFormula::Linear),
            2 => Some(WeightFormula::Runc),
            _ => None,
        }
    }

    /// True when the formula is still to be learned (`auto` and nothing decisive seen yet).
    pub fn learning(&self) -> bool {
        self.forced.is_none() && self.learned().is_none()
    }

    /// `cpu.weight` for `shares` by the formula in use.
    pub fn weight(&self, shares: i64) -> i64 {
        self.formula().weight(shares)
    }

    /// Learns from a container the runtime created with `shares` whose `cpu.weight` reads
    /// `weight`: the first decisive sample decides, for the life of the process (later samples
    /// could be runtime-hooks' own writes). Returns the formula when this sample decided it.
    pub fn learn(&self, shares: i64, weight: i64) -> Option<WeightFormula> {
        if !self.learning() {
            return None;
        }
        let formula = WeightFormula::of_sample(shares, weight)?;
        let code = match formula {
            WeightFormula::Linear => 1,
            WeightFormula::Runc => 2,
        };
        self.learned.compare_exchange(0, code, Ordering::Relaxed, Ordering::Relaxed).ok().map(|_| formula)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (shares, linear, runc): the vectors; linear from koordlet's integer formula, runc
    /// from runc 1.3's (1024 → 100 and 512 → 59 as runc 1.3.6 wrote them on a real v2 node).
    const VECTORS: [(i64, i64, i64); 9] = [
        (2, 1, 1),
        (3, 1, 2),
        (10, 1, 4),
        (102, 4, 17),
        (512, 20, 59),
        (1024, 39, 100),
        (2000, 77, 170),
        (8192, 313, 532),
        (262_144, 10_000, 10_000),
    ];

    #[test]
    fn both_formulas_give_the_known_vectors() {
        for (shares, linear, runc) in VECTORS {
            assert_eq!(WeightFormula::Linear.weight(shares), linear, "linear({shares})");
            assert_eq!(WeightFormula::Runc.weight(shares), runc, "runc({shares})");
        }
    }

    #[test]
    fn out_of_range_shares_are_clamped() {
        for f in [WeightFormula::Linear, WeightFormula::Runc] {
            assert_eq!(f.weight(0), 1);
            assert_eq!(f.weight(-5), 1);
            assert_eq!(f.weight(1 << 40), 10_000);
        }
    }

    #[test]
    fn runc_is_monotonic_and_in_range() {
        let mut last = 0;
        for s in MIN_SHARES..=MAX_SHARES {
            let w = WeightFormula::Runc.weight(s);
            assert!((1..=10_000).contains(&w) && w >= last, "runc({s}) = {w} after {last}");
            last = w;
        }
    }

    #[test]
    fn a_sample_tells_the_formulas_apart_except_at_the_ends() {
        assert_eq!(WeightFormula::of_sample(512, 59), Some(WeightFormula::Runc));
        assert_eq!(WeightFormula::of_sample(512, 20), Some(WeightFormula::Linear));
        assert_eq!(WeightFormula::of_sample(2, 1), None, "both give 1");
        assert_eq!(WeightFormula::of_sample(262_144, 10_000), None, "both give 10000");
        assert_eq!(WeightFormula::of_sample(512, 100), None, "neither: someone else wrote it");
    }

    #[test]
    fn the_first_decisive_sample_decides_and_later_ones_do_not_change_it() {
        let c = WeightConversion::new(None);
        assert_eq!(c.formula(), DEFAULT_FORMULA);
        assert_eq!(c.learn(2, 1), None, "not decisive");
        assert_eq!(c.learn(1024, 39), Some(WeightFormula::Linear));
        assert_eq!(c.weight(1024), 39);
        assert_eq!(c.learn(1024, 100), None, "decided already");
        assert_eq!(c.formula(), WeightFormula::Linear);
    }

    #[test]
    fn a_forced_formula_never_learns() {
        let c = WeightConversion::new(Some(WeightFormula::Linear));
        assert_eq!(c.learn(1024, 100), None);
        assert_eq!(c.weight(512), 20);
        assert!(!c.learning());
    }
}
