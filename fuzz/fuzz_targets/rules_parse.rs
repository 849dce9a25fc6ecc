//! runtime-hooks' rules file parser (`Rules::parse`, JSON or YAML by the file name): any text gives
//! rules or an error, never a panic (deep nesting included); accepted rules are valid and survive
//! a JSON round trip.
//!
//! Input: byte 0 bit 0 picks the file name (`rules.yaml` or `rules.json`), the rest is the file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use runtime_hooks::rules::Rules;

fuzz_target!(|data: &[u8]| {
    let Some((sel, text)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let path = Path::new(if sel & 1 == 0 { "rules.yaml" } else { "rules.json" });
    let Ok(rules) = Rules::parse(path, text) else { return };
    rules.validate().expect("parsed rules are valid");
    let json = serde_json::to_string(&rules).unwrap();
    assert_eq!(Rules::parse(Path::new("again.json"), &json).unwrap(), rules);
});
