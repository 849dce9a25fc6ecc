// The git revision build step shared by the binary crates' build.rs (`include!`d there, so both
// print the same `--version`; and by their `tests/git_revision.rs`): sets `GIT_REVISION` from the
// `GIT_REVISION` environment variable when set (release builds from a source tarball), else
// `git rev-parse --short HEAD` of the checkout with `-dirty` appended when the binary's sources
// have uncommitted changes to tracked files, else `unknown`.
//
// The binary's sources: the package's `src`, `build.rs` and `Cargo.toml`, the same of each path
// dependency in `[dependencies]` (followed through theirs), the workspace's `Cargo.toml`,
// `Cargo.lock` and `vendor/`. The step reruns when one of them changes, or HEAD or the branch it
// names moves; a change elsewhere in the tree (docs, tests, scripts) is not the binary's and does
// not make it dirty.

use std::path::{Path, PathBuf};

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The revision `--version` prints: `rev`, with `-dirty` when the sources had uncommitted changes.
fn format_revision(rev: &str, dirty: bool) -> String {
    if dirty {
        format!("{}-dirty", rev.trim())
    } else {
        rev.trim().to_owned()
    }
}

/// The `path = "…"` values of a Cargo.toml's `[dependencies]` table (one dependency per line, as
/// this workspace writes them; dev- and build-dependencies are not part of the binary).
fn path_dependencies(manifest: &str) -> Vec<String> {
    let mut in_dependencies = false;
    let mut paths = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if !in_dependencies {
            continue;
        }
        let Some(at) = line.find("path") else { continue };
        let rest = line[at + 4..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else { continue };
        let Some(rest) = rest.trim_start().strip_prefix('"') else { continue };
        if let Some(end) = rest.find('"') {
            paths.push(rest[..end].to_owned());
        }
    }
    paths
}

/// The binary's sources (see the file's header) for the package in `package_dir`, the workspace
/// root being `package_dir/../..`.
fn source_paths(package_dir: &Path) -> Vec<PathBuf> {
    let root = package_dir.join("../..");
    let root = root.canonicalize().unwrap_or(root);
    let canonical = |dir: PathBuf| dir.canonicalize().unwrap_or(dir);
    let mut packages = vec![canonical(package_dir.to_path_buf())];
    let mut i = 0;
    while i < packages.len() {
        let manifest = std::fs::read_to_string(packages[i].join("Cargo.toml")).unwrap_or_default();
        for dep in path_dependencies(&manifest) {
            let dir = canonical(packages[i].join(dep));
            if !packages.contains(&dir) {
                packages.push(dir);
            }
        }
        i += 1;
    }
    let mut paths = Vec::new();
    for package in &packages {
        for name in ["src", "build.rs", "Cargo.toml"] {
            paths.push(package.join(name));
        }
    }
    for name in ["Cargo.toml", "Cargo.lock", "vendor"] {
        paths.push(root.join(name));
    }
    paths.retain(|p| p.exists());
    paths
}

/// Whether git reports uncommitted changes to tracked files among `paths` (untracked files do not
/// count; `--no-optional-locks`: reading never rewrites the index). `None` outside a checkout.
fn sources_dirty(paths: &[PathBuf]) -> Option<bool> {
    let mut cmd = std::process::Command::new("git");
    cmd.args(["--no-optional-locks", "status", "--porcelain", "--untracked-files=no", "--"]).args(paths);
    let out = cmd.output().ok()?;
    out.status.success().then_some(!out.stdout.is_empty())
}

/// The revision of the package in `package_dir` as the build step computes it (no `GIT_REVISION`
/// override): `git rev-parse --short HEAD`, `-dirty` when its sources have uncommitted changes.
fn checkout_revision(package_dir: &Path) -> Option<String> {
    let rev = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty = sources_dirty(&source_paths(package_dir)).unwrap_or(false);
    Some(format_revision(&rev, dirty))
}

/// Prints the cargo directives for `GIT_REVISION` (see the file's header).
fn emit_git_revision() {
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
    let package_dir = Path::new(".");
    for path in source_paths(package_dir) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let revision = std::env::var("GIT_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| checkout_revision(package_dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=GIT_REVISION={}", revision.trim());
}
