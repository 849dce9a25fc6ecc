//! The real Docker engine (Debian's dockerd 20.10) started by `scripts/dockerd.sh up ROOT`, and
//! its CLI, for the tests of the proxy's Docker mode.
//!
//! The daemon has no bridge network (containers need `--network none` or `container:<id>`), no
//! registry, and a test-only default runtime that turns a negative `OomScoreAdj` into 0 in the
//! OCI spec (the test machines lack CAP_SYS_RESOURCE); `docker inspect` still reports the
//! requested value.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What `scripts/dockerd.sh` wrote to `$ROOT/env`.
#[derive(Clone, Debug)]
pub struct Dockerd {
    /// dockerd's Engine API socket (`DOCKER_SOCK`).
    pub socket: PathBuf,
    /// Debian's docker client, `/usr/bin/docker` (`DOCKER_CLI`; not the newer client that comes
    /// first on PATH).
    pub cli: PathBuf,
    /// `docker version`'s server version, e.g. `20.10.24+dfsg1` (`DOCKERD_VERSION`).
    pub version: String,
    /// The daemon's Engine API version, e.g. `1.41` (`DOCKER_API_VERSION`).
    pub api_version: String,
    /// The local busybox image every test container runs; its CMD is `sleep 3600`
    /// (`DOCKER_TEST_IMAGE`).
    pub test_image: String,
    /// A local pause-like image for pod sandboxes: sleeps, exits 0 on SIGTERM
    /// (`DOCKER_PAUSE_IMAGE`).
    pub pause_image: String,
    /// Container cgroup parents go below this cgroupfs path; it is also the daemon's default
    /// parent (`DOCKER_CGROUP_PARENT`).
    pub cgroup_parent: String,
    /// The harness directory (`DOCKER_ROOT`): data, exec root, logs.
    pub root: PathBuf,
}

impl Dockerd {
    /// Reads the env file named by `RP_DOCKERD_ENV`.
    ///
    /// Panics (test code) with instructions when it is not set: Docker-mode tests run through
    /// `make test`, which starts dockerd and sets it.
    pub fn from_env() -> Dockerd {
        let file = std::env::var("RP_DOCKERD_ENV").unwrap_or_else(|_| {
            panic!(
                "RP_DOCKERD_ENV is not set: run Docker-mode tests with `make test` (or `scripts/test.sh`), which starts a real dockerd and sets it; \
                 by hand: `scripts/dockerd.sh up /tmp/rp-dev-dockerd` and RP_DOCKERD_ENV=/tmp/rp-dev-dockerd/env"
            )
        });
        Dockerd::from_file(Path::new(&file))
    }

    /// Reads an env file written by `scripts/dockerd.sh up`; panics (test code) when it cannot be
    /// read or lacks a key.
    pub fn from_file(file: &Path) -> Dockerd {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| vars.get(k).unwrap_or_else(|| panic!("{} has no {k}", file.display())).to_string();
        Dockerd {
            socket: get("DOCKER_SOCK").into(),
            cli: get("DOCKER_CLI").into(),
            version: get("DOCKERD_VERSION"),
            api_version: get("DOCKER_API_VERSION"),
            test_image: get("DOCKER_TEST_IMAGE"),
            pause_image: get("DOCKER_PAUSE_IMAGE"),
            cgroup_parent: get("DOCKER_CGROUP_PARENT"),
            root: get("DOCKER_ROOT").into(),
        }
    }

    /// The Debian docker CLI preset with `-H unix://<socket>`: point it at the proxy's socket or
    /// at [`Dockerd::socket`]. `DOCKER_HOST`, `DOCKER_CONTEXT` and `DOCKER_API_VERSION` are
    /// removed from its environment so that only `-H` and API negotiation decide; its
    /// configuration directory is the harness's own (no `~/.docker`).
    pub fn docker(&self, socket: &Path) -> Command {
        let mut cmd = Command::new(&self.cli);
        cmd.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_CONTEXT")
            .env_remove("DOCKER_API_VERSION")
            .env("DOCKER_CONFIG", self.root.join("cli-config"))
            .arg("-H")
            .arg(format!("unix://{}", socket.display()));
        cmd
    }

    /// [`Dockerd::docker`] pointed at dockerd itself.
    pub fn docker_direct(&self) -> Command {
        self.docker(&self.socket)
    }
}
