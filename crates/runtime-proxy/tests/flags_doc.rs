//! docs/flags.md's `## runtime-proxy` section names every flag of `runtime-proxy --help` and of
//! `runtime-proxy status --help`, and lists in its table only flags `--help` shows (the rule:
//! `test_support::flags_doc`). No runtime needed.

use std::path::Path;

#[test]
fn flags_md_matches_help() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md");
    let bin = Path::new(env!("CARGO_BIN_EXE_runtime-proxy"));
    if let Err(problems) = test_support::flags_doc::check(&doc, "runtime-proxy", bin, &["status"]) {
        panic!("docs/flags.md drifted from runtime-proxy --help:\n{problems}");
    }
}
