//! runtime-hooks' rules file parser (`FileRules::parse`: NodeSLO, NodeResourceTopology and Node
//! documents, or the deprecated old format; JSON or YAML by the file name): any text gives rules
//! or an error, never a panic (deep nesting included); accepted rules hold only valid values
//! (group identity in −1..=2, CPU lists in canonical form) and parsing is deterministic.
//!
//! Input: byte 0 bit 0 picks the file name (`rules.yaml` or `rules.json`), the rest is the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use runtime_hooks::cgroup::{format_cpu_list, parse_cpu_list};
use runtime_hooks::rules::file::FileRules;

fuzz_target!(|data: &[u8]| {
    let Some((sel, text)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let path = Path::new(if sel & 1 == 0 { "rules.yaml" } else { "rules.json" });
    let Ok(file) = FileRules::parse(path, text) else { return };
    assert_eq!(FileRules::parse(path, text).unwrap(), file, "deterministic");
    let rules = file.rules();
    let g = &rules.group_identity;
    for v in [g.lsr, g.ls, g.be, g.none, g.guaranteed_pod] {
        assert!((-1..=2).contains(&v), "group identity {v}");
    }
    let t = &rules.cpuset.topology;
    let lists =
        t.share_pools.iter().chain(&t.be_share_pools).map(|p| p.cpuset.clone()).chain(t.system_qos_cpuset.clone());
    for list in lists.chain([t.kubelet_policy.reserved_cpus.clone()]) {
        assert_eq!(format_cpu_list(&parse_cpu_list(&list).expect("a kept CPU list parses")), list, "canonical");
    }
    if let Some(r) = rules.batch_resource.cpu_normalization_ratio {
        assert!(r.is_finite() && r > 0.0);
    }
});
