//! docs/flags.md's `## runtime-hooks` section names every flag of `runtime-hooks --help` and of
//! `runtime-hooks status --help`, and lists in its table only flags `--help` shows (the rule:
//! `test_support::flags_doc`). No runtime needed.

use std::path::Path;

#[test]
fn flags_md_matches_help() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md");
    let bin = Path::new(env!("CARGO_BIN_EXE_runtime-hooks"));
    if let Err(problems) = test_support::flags_doc::check(&doc, "runtime-hooks", bin, &["status"]) {
        panic!("docs/flags.md drifted from runtime-hooks --help:\n{problems}");
    }
}
