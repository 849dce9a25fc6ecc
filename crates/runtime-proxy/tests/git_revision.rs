//! `--version`'s git revision (the build step in `crates/git_revision.rs`): `-dirty` after the
//! revision when the binary's sources had uncommitted changes, and the binary prints what the
//! step computes for the checkout as it is. No runtime needed.

#[allow(dead_code)] // emit_git_revision is the build script's
mod build {
    include!("../../git_revision.rs");

    use std::process::Command;

    #[test]
    fn dirty_is_a_suffix() {
        assert_eq!(format_revision("27cbb9f", false), "27cbb9f");
        assert_eq!(format_revision("27cbb9f\n", true), "27cbb9f-dirty");
    }

    #[test]
    fn path_dependencies_are_the_dependencies_table_s() {
        let manifest =
            "[package]\nname = \"x\"\n[lib]\npath = \"src/lib.rs\"\n[dependencies]\nanyhow.workspace = true\n\
                        hook-api = { path = \"../hook-api\" }\nnri = { version = \"1\", path=\"../nri-plugin\" }\n\
                        [dev-dependencies]\ntest-support = { path = \"../test-support\" }\n";
        assert_eq!(path_dependencies(manifest), ["../hook-api", "../nri-plugin"]);
    }

    #[test]
    fn sources_are_the_package_and_its_path_dependencies() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let paths = source_paths(dir);
        let crates = dir.join("..").canonicalize().unwrap();
        for want in [
            "runtime-proxy/src",
            "runtime-proxy/build.rs",
            "hook-api/src",
            "daemon-support/src",
            "nri-plugin/Cargo.toml",
        ] {
            assert!(paths.contains(&crates.join(want)), "{want} missing from {paths:?}");
        }
        assert!(!paths.iter().any(|p| p.starts_with(crates.join("test-support"))), "a dev-dependency: {paths:?}");
        assert!(!paths.iter().any(|p| p.starts_with(crates.join("runtime-hooks"))), "{paths:?}");
        assert!(paths.contains(&crates.join("../Cargo.lock").canonicalize().unwrap()), "{paths:?}");
    }

    /// The binary prints the revision the step computes for the checkout now (the build that
    /// `cargo test` just made); skipped with `GIT_REVISION` set or outside a git checkout.
    #[test]
    fn version_names_the_checkout_s_revision() {
        if std::env::var_os("GIT_REVISION").is_some() {
            return;
        }
        let Some(revision) = checkout_revision(Path::new(env!("CARGO_MANIFEST_DIR"))) else {
            return;
        };
        let out = Command::new(env!("CARGO_BIN_EXE_runtime-proxy")).arg("--version").output().unwrap();
        let version = String::from_utf8(out.stdout).unwrap();
        assert_eq!(version.trim(), format!("runtime-proxy {} (git {revision})", env!("CARGO_PKG_VERSION")));
    }
}
