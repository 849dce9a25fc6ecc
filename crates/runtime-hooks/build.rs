//! Sets `GIT_REVISION` for `--version` (`runtime-hooks 0.1.0 (git 27cbb9f)`), as runtime-proxy
//! does (the shared step in `crates/git_revision.rs`), and compiles NRI's protocol
//! (`proto/nri/api.proto`) and ttrpc's envelope (`proto/nri/ttrpc.proto`) into prost message
//! types; the ttrpc framing and NRI's connection multiplexing are ours (`src/nri/wire.rs`).

include!("../git_revision.rs");

fn main() -> std::io::Result<()> {
    emit_git_revision();
    println!("cargo:rerun-if-changed=proto/nri");
    prost_build::Config::new().compile_protos(&["proto/nri/api.proto", "proto/nri/ttrpc.proto"], &["proto/nri"])
}
