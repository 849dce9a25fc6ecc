//! Smoke test of the dockerd harness (`scripts/dockerd.sh`, `test_support::dockerd`): the Debian
//! docker CLI against dockerd directly, no proxy yet. Needs `RP_DOCKERD_ENV` (set by `make test`).

use std::process::Output;

use test_support::dockerd::Dockerd;

fn check(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn version_answers_with_the_harness_versions() {
    let env = Dockerd::from_env();
    let out = env
        .docker(&env.socket)
        .args(["version", "--format", "{{.Server.Version}} {{.Server.APIVersion}}"])
        .output()
        .expect("docker");
    let stdout = check("docker version", out);
    assert_eq!(stdout.trim(), format!("{} {}", env.version, env.api_version));
}

#[test]
fn run_prints_hi() {
    let env = Dockerd::from_env();
    let out = env
        .docker(&env.socket)
        .args(["run", "--rm", "--network", "none", &env.test_image, "echo", "hi"])
        .output()
        .expect("docker");
    assert_eq!(check("docker run", out), "hi\n");
}
