//! Sets `GIT_REVISION` for `--version` (`runtime-proxy 0.1.0 (git 27cbb9f)`, `27cbb9f-dirty` when
//! built from uncommitted sources), as runtime-hooks does: the shared step in
//! `crates/git_revision.rs`.

include!("../git_revision.rs");

fn main() {
    emit_git_revision();
}
