//! The pod annotation `node.koordinator.sh/resctrl` → a resctrl `schemata`, as koordlet v1.8.0
//! computes it.
//!
//! # Source
//!
//! `pkg/koordlet/util/resctrl/resctrl.go` `RegisterApp`, `ParseSchemata`, `calculateMba`;
//! `pkg/koordlet/util/system/resctrl.go` `CalculateCatL3MaskValue`, `ResctrlSchemataRaw`.
//!
//! # Input
//!
//! The annotation (koordinator `apis/extension/resctrl.go` `ResctrlConfig`), every field optional:
//!
//! ```json
//! {"llc": {"schemata": {"range": [0, 30]},
//!          "schemataPerCache": [{"cacheID": 1, "range": [30, 60]}]},
//!  "mb":  {"schemata": {"percent": 50},
//!          "schemataPerCache": [{"cacheID": 0, "percent": 80}]}}
//! ```
//!
//! # Computation
//!
//! * `llc…range: [start, end]` (percent of the L3 ways, 0 ≤ start < end ≤ 100) → the contiguous
//!   way mask covering ways `⌈ways·start/100⌉ .. ⌈ways·end/100⌉` of the root's `cbm_mask`
//!   (`7ff`, 11 ways, `[0, 30]` → `f`); a range that is not two numbers is ignored; an invalid one
//!   stops the L3 computation there (koordlet logs and keeps what it has).
//! * `mb…percent` → per vendor: Intel rounds up to a multiple of 10; AMD: 100 → 2048
//!   (unlimited), else ⌊160·p/100⌋ (1/8 GB/s units); other vendors 0 (no MB line).
//! * One value per cache id of the root `schemata` (`L3:0=…;1=…`), per-cache entries override.
//! * The `L3:` line is written only when every cache id has a mask > 0 (and per-cache entries
//!   name no other id), the `MB:` line only when every value is > 0 — so an annotation with
//!   only `llc` gives only an `L3:` line.
//!
//! # Output
//!
//! `L3:0=f;1=f;\n` then `MB:0=50;1=50;\n` (koordlet's exact text, trailing `;`).
//!
//! # Errors
//!
//! The annotation is not JSON of that shape (a wrong type, a fraction where an integer goes).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::host::resctrl::Vendor;

/// The pod annotation (koordinator `apis/extension` `AnnotationResctrl`).
pub const ANNOTATION: &str = "node.koordinator.sh/resctrl";

/// Group name prefix (koordlet's `ClosdIdPrefix`): a pod's group is `koordlet-<pod uid>`.
pub const GROUP_PREFIX: &str = "koordlet-";

/// `ResctrlConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ResctrlConfig {
    /// L3 cache allocation.
    pub llc: Part,
    /// Memory bandwidth.
    pub mb: Part,
}

/// `LLC` / `MB`: one setting for every cache, and per-cache overrides.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Part {
    /// For every cache id.
    pub schemata: SchemataConfig,
    /// Per cache id.
    pub schemata_per_cache: Vec<PerCache>,
}

/// `SchemataConfig`: `percent` (MB) or `range` (L3, percent of the ways).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct SchemataConfig {
    /// MB percent; 0 = not set.
    pub percent: i64,
    /// L3 `[start, end]` percent.
    pub range: Vec<i64>,
}

/// `SchemataPerCacheConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PerCache {
    /// The cache id (`cacheID`).
    #[serde(rename = "cacheID")]
    pub cache_id: i64,
    /// MB percent.
    pub percent: i64,
    /// L3 range.
    pub range: Vec<i64>,
}

/// Parses the annotation.
///
/// Errors: not JSON of the `ResctrlConfig` shape (the message names the annotation).
pub fn parse(annotation: &str) -> anyhow::Result<ResctrlConfig> {
    serde_json::from_str(annotation).map_err(|e| anyhow::anyhow!("annotation {ANNOTATION} {annotation:?}: {e}"))
}

/// The way mask for `[start, end)` percent of `cbm`'s ways, hex (koordlet's
/// `CalculateCatL3MaskValue`).
///
/// Errors: `cbm` is not contiguous low bits (`0x7ff`), or the range is not 0 ≤ start < end ≤ 100.
pub fn l3_mask(cbm: u64, start: i64, end: i64) -> Result<u64, String> {
    if cbm == 0 || cbm == u64::MAX || (cbm + 1).count_ones() != 1 {
        return Err(format!("illegal cbm {cbm:x}"));
    }
    if start < 0 || end > 100 || end <= start {
        return Err(format!("illegal l3 cat percent: start {start}, end {end}"));
    }
    let ways = (64 - cbm.leading_zeros()) as i64;
    let way = |p: i64| ((ways * p) as f64 / 100.0).ceil() as u32;
    let (s, e) = (way(start), way(end));
    let bit = |n: u32| if n >= 64 { 0 } else { 1u64 << n };
    Ok(bit(e).wrapping_sub(bit(s)))
}

/// The MB value of a percentage on `vendor`'s CPUs (koordlet's `calculateMba`).
pub fn mb_value(vendor: &Vendor, percent: i64) -> i64 {
    match vendor {
        Vendor::Intel if percent % 10 != 0 => percent / 10 * 10 + 10,
        Vendor::Intel => percent,
        Vendor::Amd if percent == 100 => 2048,
        Vendor::Amd => (160.0 * percent as f64 / 100.0) as i64,
        Vendor::Other(_) => 0,
    }
}

/// The cache ids of a `schemata` text: the `L3` line's, else the `MB` line's.
pub fn cache_ids(root_schemata: &str) -> Vec<i64> {
    let lines = parse_lines(root_schemata);
    lines.get("L3").or_else(|| lines.get("MB")).map(|m| m.keys().copied().collect()).unwrap_or_default()
}

/// `schemata` text → resource → cache id → value text (`L3` → {0: "7ff"}); malformed parts
/// skipped (koordlet's `ParseResctrlSchemataMap`).
pub fn parse_lines(text: &str) -> BTreeMap<String, BTreeMap<i64, String>> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let Some((res, values)) = line.split_once(':') else { continue };
        let mut m = BTreeMap::new();
        for part in values.split(';') {
            if let Some((id, v)) = part.split_once('=') {
                if let Ok(id) = id.trim().parse::<i64>() {
                    m.insert(id, v.trim().to_owned());
                }
            }
        }
        out.insert(res.trim().to_owned(), m);
    }
    out
}

/// True when `current` (a group's `schemata` as the kernel prints it) already holds every value
/// of `desired` (L3 masks compared as hex numbers, MB as decimal).
pub fn holds(current: &str, desired: &str) -> bool {
    let (cur, want) = (parse_lines(current), parse_lines(desired));
    want.iter().all(|(res, values)| {
        let radix = if res == "MB" { 10 } else { 16 };
        let num = |s: &str| u64::from_str_radix(s, radix).ok();
        values
            .iter()
            .all(|(id, v)| cur.get(res).and_then(|m| m.get(id)).is_some_and(|c| num(c).is_some() && num(c) == num(v)))
    })
}

/// The schemata for `config` on a node with L3 mask `cbm` and these cache ids (see the module
/// documentation); empty when neither line is valid.
pub fn compute(config: &ResctrlConfig, cbm: u64, ids: &[i64], vendor: &Vendor) -> String {
    let mut l3: BTreeMap<i64, u64> = ids.iter().map(|i| (*i, 0)).collect();
    let mut mb: BTreeMap<i64, i64> = ids.iter().map(|i| (*i, 0)).collect();
    if config.mb.schemata.percent != 0 {
        let v = mb_value(vendor, config.mb.schemata.percent);
        mb.values_mut().for_each(|m| *m = v);
    }
    for c in &config.mb.schemata_per_cache {
        mb.insert(c.cache_id, mb_value(vendor, c.percent));
    }
    let l3_done = (|| {
        if let [start, end] = config.llc.schemata.range[..] {
            let mask = l3_mask(cbm, start, end).map_err(|e| tracing::warn!("resctrl: {e}"))?;
            l3.values_mut().for_each(|m| *m = mask);
        }
        for c in &config.llc.schemata_per_cache {
            if let [start, end] = c.range[..] {
                let mask = l3_mask(cbm, start, end).map_err(|e| tracing::warn!("resctrl: {e}"))?;
                l3.insert(c.cache_id, mask);
            }
        }
        Ok::<(), ()>(())
    })();
    let _ = l3_done;
    let n = ids.len();
    let mut out = String::new();
    let sorted_ids: Vec<i64> = l3.keys().copied().collect();
    if n > 0 && !l3.is_empty() && l3.len() == n && l3.values().all(|v| *v > 0) {
        out.push_str("L3:");
        for id in &sorted_ids {
            out.push_str(&format!("{id}={:x};", l3[id]));
        }
        out.push('\n');
    }
    if n > 0 && !mb.is_empty() && mb.values().all(|v| *v > 0) {
        out.push_str("MB:");
        for id in &sorted_ids {
            out.push_str(&format!("{id}={};", mb.get(id).copied().unwrap_or(0)));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_as_koordlet_computes_them() {
        // koordlet's own examples (CalculateCatL3MaskValue's comment).
        assert_eq!(l3_mask(0x3ff, 10, 80), Ok(0xfe));
        assert_eq!(l3_mask(0x7ff, 10, 50), Ok(0x3c));
        assert_eq!(l3_mask(0x7ff, 0, 30), Ok(0xf));
        assert_eq!(l3_mask(0x7ff, 0, 100), Ok(0x7ff));
        assert!(l3_mask(0x7fe, 0, 30).is_err());
        assert!(l3_mask(0x7ff, 30, 30).is_err());
        assert!(l3_mask(0x7ff, -1, 30).is_err());
        assert!(l3_mask(0x7ff, 0, 101).is_err());
    }

    #[test]
    fn mb_by_vendor() {
        assert_eq!(mb_value(&Vendor::Intel, 35), 40);
        assert_eq!(mb_value(&Vendor::Intel, 50), 50);
        assert_eq!(mb_value(&Vendor::Amd, 100), 2048);
        assert_eq!(mb_value(&Vendor::Amd, 50), 80);
        assert_eq!(mb_value(&Vendor::Other("x".into()), 50), 0);
    }

    #[test]
    fn schemata_lines() {
        let ids = cache_ids("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n");
        assert_eq!(ids, [0, 1]);
        let c = parse(r#"{"llc":{"schemata":{"range":[0,30]}},"mb":{"schemata":{"percent":35}}}"#).unwrap();
        assert_eq!(compute(&c, 0x7ff, &ids, &Vendor::Intel), "L3:0=f;1=f;\nMB:0=40;1=40;\n");
        let c = parse(r#"{"llc":{"schemata":{"range":[0,30]},"schemataPerCache":[{"cacheID":1,"range":[50,100]}]}}"#)
            .unwrap();
        assert_eq!(compute(&c, 0x7ff, &ids, &Vendor::Intel), "L3:0=f;1=7c0;\n", "no mb: no MB line");
        let c =
            parse(r#"{"mb":{"schemataPerCache":[{"cacheID":0,"percent":20},{"cacheID":1,"percent":100}]}}"#).unwrap();
        assert_eq!(compute(&c, 0x7ff, &ids, &Vendor::Amd), "MB:0=32;1=2048;\n");
        let c = parse(r#"{"llc":{"schemataPerCache":[{"cacheID":3,"range":[0,50]}]}}"#).unwrap();
        assert_eq!(compute(&c, 0x7ff, &ids, &Vendor::Intel), "", "an unknown cache id invalidates L3");
        let c = parse(r#"{"llc":{"schemata":{"range":[50,10]}}}"#).unwrap();
        assert_eq!(compute(&c, 0x7ff, &ids, &Vendor::Intel), "");
        assert_eq!(compute(&parse("{}").unwrap(), 0x7ff, &ids, &Vendor::Intel), "");
    }

    #[test]
    fn bad_annotations_are_errors() {
        for bad in
            ["", "[", r#"{"mb":{"schemata":{"percent":"50"}}}"#, r#"{"llc":{"schemata":{"range":[0.5,30]}}}"#, "[1]"]
        {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains(ANNOTATION), "{bad}: {e}");
        }
        assert_eq!(
            parse(r#"{"other":1}"#).unwrap(),
            ResctrlConfig::default(),
            "unknown fields are ignored, as Go does"
        );
    }

    #[test]
    fn kernel_padding_is_the_same_schemata() {
        assert!(holds("    L3:0=00f;1=00f\n    MB:0= 40;1= 40\n", "L3:0=f;1=f;\nMB:0=40;1=40;\n"));
        assert!(!holds("    L3:0=7ff;1=00f\n", "L3:0=f;1=f;\n"));
        assert!(!holds("", "L3:0=f;\n"));
    }
}
