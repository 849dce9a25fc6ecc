// The git revision build step shared by the binary crates' build.rs (`include!`d there, so both
// print the same `--version`): sets `GIT_REVISION` from the `GIT_REVISION` environment variable
// when set (release builds from a source tarball), else `git rev-parse --short HEAD` of the
// checkout, else `unknown`; reruns when HEAD or the branch it names moves.

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Prints the cargo directives for `GIT_REVISION` (see the file's header).
fn emit_git_revision() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../git_revision.rs");
    println!("cargo:rerun-if-env-changed=GIT_REVISION");
    // HEAD, the ref it points to (loose or packed), in the right directory also in a worktree.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if std::path::Path::new(&path).exists() {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    let revision = std::env::var("GIT_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=GIT_REVISION={}", revision.trim());
}
