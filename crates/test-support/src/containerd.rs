//! The real containerd + runc started by `scripts/containerd.sh up VERSION ROOT`, and helpers to
//! run pods on it the way kubelet does (host-network sandboxes, cgroupfs parents).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// What the harness script wrote to `$ROOT/env`.
#[derive(Clone, Debug)]
pub struct Containerd {
    /// containerd's gRPC socket.
    pub socket: PathBuf,
    /// `containerd --version`'s version field, e.g. `1.6.20~ds1`.
    pub version: String,
    /// The local image every container runs (busybox).
    pub test_image: String,
    /// Pod cgroup parents go below this path (cgroupfs driver); with the systemd driver
    /// ([`Containerd::systemd_driver`]) the slice pods go below, `kubepods.slice`.
    pub cgroup_parent: String,
    /// Directory for pod log directories.
    pub log_root: PathBuf,
    /// The harness directory (`CONTAINERD_ROOT`; absent in env files of older harness versions).
    pub root: Option<PathBuf>,
    /// containerd's NRI socket (`NRI_SOCKET`), when the harness turned NRI on.
    pub nri_socket: Option<PathBuf>,
    /// The cgroup driver containerd's runc runs with (`CGROUP_DRIVER`): `systemd` in the cgroup v2
    /// guest of `scripts/v2vm.sh`; absent (cgroupfs) from `scripts/containerd.sh`.
    pub cgroup_driver: Option<String>,
    /// runc's version (`RUNC_VERSION`, e.g. `1.3.6+ds1`), where the harness wrote it (the guest).
    pub runc_version: Option<String>,
}

impl Containerd {
    /// Reads the env file named by `RP_CONTAINERD_ENV`.
    ///
    /// Panics (test code) with instructions when it is not set: integration tests run through
    /// `make test`, which starts containerd and sets it.
    pub fn from_env() -> Containerd {
        let file = std::env::var("RP_CONTAINERD_ENV").unwrap_or_else(|_| {
            panic!("RP_CONTAINERD_ENV is not set: run integration tests with `make test` (or `scripts/test.sh`), which starts a real containerd and sets it")
        });
        Containerd::from_file(std::path::Path::new(&file))
    }

    /// containerd's process ID, from `ROOT/containerd.pid` (written by `scripts/containerd.sh up`),
    /// if that process is alive; benches read its CPU time.
    pub fn pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.root.as_ref()?.join("containerd.pid")).ok()?.trim().parse().ok()?;
        std::path::Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// True when containerd's runc uses the systemd cgroup driver (`CGROUP_DRIVER=systemd`): pod
    /// cgroup parents are then slice names ([`crate::systemd`]), not paths.
    pub fn systemd_driver(&self) -> bool {
        self.cgroup_driver.as_deref() == Some("systemd")
    }

    /// True for containerd 1.7 and later (GetContainerEvents implemented).
    pub fn has_container_events(&self) -> bool {
        self.major_minor() >= (1, 7)
    }

    /// `(major, minor)` of [`Containerd::version`] (`1.6.20~ds1` → `(1, 6)`, `2.1.9+unknown` →
    /// `(2, 1)`); a part that is not a number reads 0.
    pub fn major_minor(&self) -> (u32, u32) {
        let mut parts = self.version.split(['.', '~', '-', '+']).map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    /// The harness's name for this containerd's series, the VERSION argument of
    /// `scripts/containerd.sh up VERSION ROOT` that starts another of the same kind: `"1.6"`,
    /// `"1.7"` or `"2.1"`.
    ///
    /// Panics (test code) for a series the harness does not start.
    pub fn series(&self) -> &'static str {
        match self.major_minor() {
            (1, 6) => "1.6",
            (1, 7) => "1.7",
            (2, 1) => "2.1",
            other => panic!(
                "containerd {} ({other:?}) is not a series scripts/containerd.sh starts (1.6, 1.7, 2.1)",
                self.version
            ),
        }
    }
}

/// A name unique in this machine's run: `<prefix>-<pid>-<counter>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// A host-network pod sandbox config (no CNI needed) with a unique UID, the pod cgroup parent
/// `<harness parent>/pod<uid>`, and the given labels and annotations.
pub fn sandbox_config(
    env: &Containerd,
    name: &str,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
) -> cri::PodSandboxConfig {
    let uid = unique("uid");
    let log_directory = env.log_root.join(&uid);
    std::fs::create_dir_all(&log_directory).expect("pod log dir");
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        log_directory: log_directory.display().to_string(),
        labels,
        annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("{}/pod{}", env.cgroup_parent, uid),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox container config running `command`, with the given resources and envs.
pub fn container_config(
    env: &Containerd,
    name: &str,
    command: &[&str],
    resources: Option<cri::LinuxContainerResources>,
    envs: &[(&str, &str)],
) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(cri::ImageSpec { image: env.test_image.clone(), ..Default::default() }),
        command: command.iter().map(|s| s.to_string()).collect(),
        envs: envs.iter().map(|(k, v)| cri::KeyValue { key: k.to_string(), value: v.to_string() }).collect(),
        log_path: format!("{name}.log"),
        linux: Some(cri::LinuxContainerConfig { resources, ..Default::default() }),
        ..Default::default()
    }
}

/// A pod with one running container, as kubelet creates it.
#[derive(Debug)]
pub struct Pod {
    /// The pod sandbox's ID.
    pub sandbox_id: String,
    /// Its one container's ID.
    pub container_id: String,
    /// The config the pod sandbox was run with.
    pub config: cri::PodSandboxConfig,
}

impl Pod {
    /// RunPodSandbox, CreateContainer, StartContainer through `client`.
    ///
    /// Errors: the first failing call's status.
    pub async fn start(
        client: &mut RuntimeServiceClient<Channel>,
        config: cri::PodSandboxConfig,
        container: cri::ContainerConfig,
    ) -> Result<Pod, tonic::Status> {
        let sandbox_id = client
            .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
            .await?
            .into_inner()
            .pod_sandbox_id;
        let created = client
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(container),
                sandbox_config: Some(config.clone()),
            })
            .await;
        let container_id = match created {
            Ok(r) => r.into_inner().container_id,
            Err(e) => {
                remove_sandbox(client, &sandbox_id).await;
                return Err(e);
            }
        };
        if let Err(e) = client.start_container(cri::StartContainerRequest { container_id: container_id.clone() }).await
        {
            remove_sandbox(client, &sandbox_id).await;
            return Err(e);
        }
        Ok(Pod { sandbox_id, container_id, config })
    }

    /// StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox; panics on failure.
    pub async fn remove(self, client: &mut RuntimeServiceClient<Channel>) {
        client
            .stop_container(cri::StopContainerRequest { container_id: self.container_id.clone(), timeout: 0 })
            .await
            .expect("StopContainer");
        client
            .remove_container(cri::RemoveContainerRequest { container_id: self.container_id.clone() })
            .await
            .expect("RemoveContainer");
        client
            .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: self.sandbox_id.clone() })
            .await
            .expect("StopPodSandbox");
        client
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: self.sandbox_id.clone() })
            .await
            .expect("RemovePodSandbox");
    }

    /// The pod cgroup parent this pod was created with.
    pub fn cgroup_parent(&self) -> String {
        self.config.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default()
    }

    /// Reads a cgroup v1 file of the container, e.g. `("cpu", "cpu.shares")`, trimmed.
    pub fn cgroup_file(&self, controller: &str, file: &str) -> String {
        let path = format!("/sys/fs/cgroup/{controller}{}/{}/{file}", self.cgroup_parent(), self.container_id);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).trim().to_owned()
    }
}

/// Best-effort StopPodSandbox + RemovePodSandbox (containers go with the sandbox).
pub async fn remove_sandbox(client: &mut RuntimeServiceClient<Channel>, sandbox_id: &str) {
    let _ = client.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.into() }).await;
    let _ = client.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id.into() }).await;
}

/// Makes sure no cancelled GetContainerEvents stream is left on containerd 1.7 to swallow the
/// events of the next run.
///
/// containerd 1.7 serves the stream as `for event := range containerEventsChan { if Send fails,
/// return }`: a stream whose client went away (directly or through the proxy) stays on the
/// channel until it receives one more event, which is then lost. Receivers are served in the
/// order they started waiting, so this watches too and runs throwaway sandboxes (three events
/// each) until it receives an event of one of them: every older stream has had its last event by
/// then. Its own stream then swallows one more event when it is dropped (a later throwaway event
/// or the next run's sandbox start, which the scenario does not look at), and so does each
/// run's own stream after it (the next run's sandbox start).
///
/// Panics (test code) on containerd 1.6, which has no GetContainerEvents: call it only where
/// [`Containerd::has_container_events`].
pub async fn drain_cancelled_event_streams(env: &Containerd) {
    use prost::Message;
    let mut rt = crate::runtime_client(&env.socket);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let channel = crate::channel(&env.socket);
    let probe = tokio::spawn(async move {
        // Events are read raw, for their `container_id` (field 1) alone: an event of an earlier
        // test's pod whose annotations are not UTF-8 (tests/no_escape.rs) would end a k8s-cri
        // stream with a decode error, and the drain with it.
        let request = tonic::Request::new(bytes::Bytes::from(cri::GetEventsRequest {}.encode_to_vec()));
        let mut events =
            crate::raw::server_streaming(channel, "/runtime.v1.RuntimeService/GetContainerEvents", request)
                .await
                .expect("GetContainerEvents")
                .into_inner();
        while let Ok(Some(event)) = events.message().await {
            let id = crate::raw::string_field_1(&event);
            if tx.send(id).is_err() {
                break;
            }
        }
    });
    for _ in 0..20 {
        let config = sandbox_config(env, &unique("events-drain"), HashMap::new(), HashMap::new());
        let sandbox_id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() })
            .await
            .expect("a throwaway sandbox")
            .into_inner()
            .pod_sandbox_id;
        remove_sandbox(&mut rt, &sandbox_id).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while let Ok(Some(id)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            if id == sandbox_id {
                probe.abort();
                return;
            }
        }
    }
    panic!("no event of 20 throwaway sandboxes reached a fresh GetContainerEvents stream");
}

impl Containerd {
    /// Reads a harness env file (`ROOT/env`, as `scripts/containerd.sh up` writes it) directly,
    /// for a test that runs a containerd of its own next to the shared one.
    ///
    /// Panics (test code) when the file cannot be read or lacks a key.
    pub fn from_file(file: &std::path::Path) -> Containerd {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| vars.get(k).unwrap_or_else(|| panic!("{} has no {k}", file.display())).to_string();
        Containerd {
            socket: get("CONTAINERD_SOCK").into(),
            version: get("CONTAINERD_VERSION"),
            test_image: get("CRI_TEST_IMAGE"),
            cgroup_parent: get("CRI_CGROUP_PARENT"),
            log_root: get("CRI_LOG_ROOT").into(),
            root: vars.get("CONTAINERD_ROOT").map(PathBuf::from),
            nri_socket: vars.get("NRI_SOCKET").map(PathBuf::from),
            cgroup_driver: vars.get("CGROUP_DRIVER").map(|v| v.to_string()),
            runc_version: vars.get("RUNC_VERSION").map(|v| v.to_string()),
        }
    }
}

/// A containerd of a test's own, started by `scripts/containerd.sh up VERSION ROOT` in a fresh
/// short root under /tmp; `purge`d (every task killed, mounts and cgroups removed, root deleted)
/// when dropped, also when the test fails.
pub struct OwnContainerd {
    version: &'static str,
    /// What its `ROOT/env` says (socket, version, images, cgroup parent).
    pub env: Containerd,
    root: Purge,
}

/// Runs `containerd.sh purge ROOT` when dropped.
struct Purge(PathBuf);

impl Drop for Purge {
    fn drop(&mut self) {
        let out = std::process::Command::new(containerd_sh()).arg("purge").arg(&self.0).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "containerd.sh purge {}: {}\n{}",
                self.0.display(),
                o.status,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("containerd.sh purge {}: {e}", self.0.display()),
        }
    }
}

fn containerd_sh() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/containerd.sh")
}

/// Runs `containerd.sh ARGS…`; panics with its stderr when it fails.
fn run_containerd_sh(args: &[&str]) {
    let out = std::process::Command::new(containerd_sh()).args(args).output().expect("running scripts/containerd.sh");
    assert!(out.status.success(), "containerd.sh {args:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
}

impl OwnContainerd {
    /// Starts containerd `version` (`1.6`, `1.7` or `2.1`) in `/tmp/rpf-<pid>-<n>` (short: the socket
    /// path must stay under 100 bytes).
    pub fn up(version: &'static str) -> OwnContainerd {
        let root = PathBuf::from(format!("/tmp/{}", unique("rpf")));
        assert!(!root.exists(), "{} exists already", root.display());
        // The guard exists before `up` runs, so a failing `up` is cleaned up too.
        let root = Purge(root);
        run_containerd_sh(&["up", version, root.0.to_str().unwrap()]);
        let env = Containerd::from_file(&root.0.join("env"));
        assert!(env.socket.starts_with(&root.0), "own socket {} under {}", env.socket.display(), root.0.display());
        OwnContainerd { version, env, root }
    }

    /// SIGKILLs the daemon only (the shims, and so the containers, keep running, as in a crash),
    /// and waits until it is gone (not even a zombie). Returns its PID.
    pub fn kill_daemon(&self) -> i32 {
        let root = &self.root.0;
        let text = std::fs::read_to_string(root.join("containerd.pid")).expect("ROOT/containerd.pid");
        let pid: i32 = text.trim().parse().expect("a PID");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(String::from_utf8_lossy(&cmdline).contains(root.to_str().unwrap()), "PID {pid} is our containerd");
        // SAFETY: kill(2) has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill -9 {pid}");
        let start = std::time::Instant::now();
        // Dead once /proc/PID is gone or shows state Z (init reaps orphans with a delay).
        let alive = || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z"));
        while alive() {
            assert!(start.elapsed() < Duration::from_secs(10), "containerd {pid} still alive 10 s after SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
        pid
    }

    /// `containerd.sh up` again on the same root: its daemon is dead, so the script starts a new
    /// one on the same config and state (containerd reconnects to the running shims) and waits
    /// until its CRI plugin answers.
    pub fn restart(&self) {
        run_containerd_sh(&["up", self.version, self.root.0.to_str().unwrap()]);
    }
}

/// Whether `env`'s containerd serves CRI v1alpha2, asked of it directly with a v1alpha2 `Version`
/// call (containerd 1.6 and 1.7 serve it; 2.0 removed it and answers `UNIMPLEMENTED` "unknown
/// service runtime.v1alpha2.RuntimeService"). When it does not, the same call through the proxy
/// at `proxy_socket` must get that answer too — same code, containerd's own message — and the
/// caller's v1alpha2 checks have nothing to run against: `false`, said on stderr.
///
/// Panics (test code): the direct call fails otherwise; the proxy's answer differs; a containerd
/// before 2.0 does not serve v1alpha2.
pub async fn serves_v1alpha2(env: &Containerd, proxy_socket: &std::path::Path) -> bool {
    use k8s_cri::v1alpha2::VersionRequest;
    let request = || VersionRequest { version: "0.1.0".into() };
    let direct = match crate::runtime_client_v1alpha2(&env.socket).version(request()).await {
        Ok(_) => return true,
        Err(status) => status,
    };
    assert_eq!(direct.code(), tonic::Code::Unimplemented, "v1alpha2 Version on containerd {}: {direct:?}", env.version);
    assert!(env.major_minor() >= (2, 0), "containerd {} (before 2.0) must serve v1alpha2: {direct:?}", env.version);
    let proxied =
        crate::runtime_client_v1alpha2(proxy_socket).version(request()).await.expect_err("the runtime's UNIMPLEMENTED");
    assert_eq!(
        (proxied.code(), proxied.message()),
        (direct.code(), direct.message()),
        "through the proxy (left), directly (right)"
    );
    eprintln!(
        "containerd {} serves no CRI v1alpha2: its own {:?} came through the proxy",
        env.version,
        direct.message()
    );
    false
}
