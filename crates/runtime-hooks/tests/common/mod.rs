//! Shared by the integration tests: the runtime-hooks binary as a child process, pods with
//! Koordinator labels and annotations, cgroup files.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd};

pub const HOOKS_BIN: &str = env!("CARGO_BIN_EXE_runtime-hooks");
pub const QOS: &str = "koordinator.sh/qosClass";
pub const SPEC: &str = "node.koordinator.sh/extended-resource-spec";
pub const STATUS: &str = "scheduling.koordinator.sh/resource-status";

/// The issue's example: batch-cpu request 500, limit 1000 (milli-CPU), batch-memory limit 128 MiB.
pub const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

/// A running `runtime-hooks`; killed when dropped.
pub struct Hooks {
    child: Option<Child>,
    log: PathBuf,
}

impl Hooks {
    /// Starts the binary with `args`, logging (debug) to `log`.
    pub fn start(args: &[&str], log: PathBuf) -> Hooks {
        Hooks::start_logging(args, log, "info,runtime_hooks=debug")
    }

    /// Starts the binary with `args`, logging to `log` at `rust_log` (the `RUST_LOG` filter).
    /// Without `--listen` (standalone and NRI modes) nor `--admin-socket`, the admin socket is
    /// put beside `log` ([`Hooks::admin_socket`]), not in /var/run/runtime-hooks where every
    /// such test would want it.
    pub fn start_logging(args: &[&str], log: PathBuf, rust_log: &str) -> Hooks {
        let file = std::fs::File::create(&log).expect("log file");
        let own_socket = !args.iter().any(|a| *a == "--listen" || *a == "--admin-socket");
        let child = Command::new(test_support::workspace_binary("runtime-hooks"))
            .args(args)
            .args(if own_socket { vec!["--admin-socket".into(), Hooks::admin_socket_beside(&log)] } else { vec![] })
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start runtime-hooks");
        Hooks { child: Some(child), log }
    }

    /// The admin socket [`Hooks::start_logging`] gives a runtime-hooks started without
    /// `--listen` nor `--admin-socket`.
    pub fn admin_socket_beside(log: &Path) -> std::ffi::OsString {
        log.with_extension("admin.sock").into_os_string()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn count(&self, parts: &[&str]) -> usize {
        self.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).count()
    }

    /// Waits up to `timeout` until more than `already` lines contain all `parts`.
    pub fn wait_log(&self, parts: &[&str], already: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.count(parts) > already {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// SIGTERM, then waits for the exit code (None after 10 s).
    pub fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Some(status) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Hooks {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// runtime-hooks in NRI mode on the NRI socket `socket` (a stand-in runtime's), with the default
/// rules (`dir/rules.yaml`), over a v1 cgroup tree at `dir/cgroup` (its `cpu` and `memory`
/// directories made), logging to `dir/hooks.log` at `rust_log`.
pub fn start_nri_v1(socket: &Path, dir: &Path, rust_log: &str) -> Hooks {
    let rules = dir.join("rules.yaml");
    std::fs::write(&rules, "cpu: {}\n").unwrap();
    let cgroups = dir.join("cgroup");
    std::fs::create_dir_all(cgroups.join("cpu")).unwrap();
    std::fs::create_dir_all(cgroups.join("memory")).unwrap();
    let args = [
        "--mode",
        "nri",
        "--nri-socket",
        socket.to_str().unwrap(),
        "--nri-plugin-name",
        "runtime-hooks-test",
        "--nri-plugin-index",
        "10",
        "--rules",
        rules.to_str().unwrap(),
        "--cgroup-root",
        cgroups.to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
    ];
    Hooks::start_logging(&args, dir.join("hooks.log"), rust_log)
}

/// Removes every pod sandbox labelled `label` = this process's ID, directly on `containerd`
/// (containers go with their sandbox), all at once. Best effort; returns how many there were.
/// For benches that label their pods to find them again, also after a failure.
pub async fn remove_labelled_pods(
    containerd: &k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    label: &str,
) -> usize {
    let filter = cri::PodSandboxFilter {
        label_selector: std::collections::HashMap::from([(label.to_owned(), std::process::id().to_string())]),
        ..Default::default()
    };
    let Ok(list) = containerd.clone().list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await
    else {
        return 0;
    };
    let ids: Vec<String> = list.into_inner().items.into_iter().map(|s| s.id).collect();
    let mut set = tokio::task::JoinSet::new();
    for id in ids.clone() {
        let mut c = containerd.clone();
        set.spawn(async move { test_support::containerd::remove_sandbox(&mut c, &id).await });
    }
    while set.join_next().await.is_some() {}
    ids.len()
}

pub fn map<M: FromIterator<(String, String)>>(kv: &[(&str, &str)]) -> M {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A pod sandbox config with these labels/annotations and a container "main" running `sleep`,
/// with the resources kubelet gives a BestEffort container (2 shares, 100 ms period).
pub fn pod_configs(
    env: &Containerd,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let sandbox = sandbox_config(env, &unique("rh"), map(labels), map(annotations));
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
    (sandbox, container)
}

/// The sandbox moved below `besteffort` in the harness's cgroup parent
/// (`<parent>/besteffort/pod<uid>`), where kubelet puts a BestEffort pod: koordlet, and so
/// CPUSet, tell a pod's Kubernetes QoS class by that part of its cgroup parent.
pub fn besteffort(mut sandbox: cri::PodSandboxConfig) -> cri::PodSandboxConfig {
    let linux = sandbox.linux.as_mut().expect("a linux config");
    let (parent, pod) = linux.cgroup_parent.rsplit_once('/').expect("<parent>/pod<uid>");
    linux.cgroup_parent = format!("{parent}/besteffort/{pod}");
    sandbox
}

/// Creates the pod's cgroup directories for the controllers runtime-hooks writes at the pod
/// level, as kubelet does before RunPodSandbox (without kubelet, runc would create them later).
pub fn precreate_pod_cgroup(parent: &str) {
    for ctrl in ["cpu", "memory"] {
        let dir = Path::new("/sys/fs/cgroup").join(ctrl).join(parent.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    }
}

/// Reads `/sys/fs/cgroup/<controller><dir>/<file>`, trimmed.
pub fn cgroup(controller: &str, dir: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{controller}{dir}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).trim().to_owned()
}

/// Polls until `check` holds or `timeout` passes; returns the last result.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if check() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Placeholder for a pod annotation value in [`start_pod_with_bytes`] (8 bytes, as
/// `test_support::raw::NOT_UTF8`).
pub const ANNOTATION_BYTES: &str = "ANNOTPLH";
/// Placeholder for a container env value in [`start_pod_with_bytes`].
pub const ENV_BYTES: &str = "ENVPLHLD";
/// What replaces [`ENV_BYTES`]: not UTF-8 and without the NUL of `raw::NOT_UTF8`, which runc
/// refuses in an env value (`environment variable value can't contain null`).
pub const ENV_NOT_UTF8: &[u8; 8] = b"\xff\xfebin\x80\xc3!";

/// Starts a pod the way kubelet would for a pod author who wrote bytes that are not UTF-8:
/// `sandbox` must hold [`ANNOTATION_BYTES`] once (an annotation value) and `container`
/// [`ENV_BYTES`] once (an env value, as from a Secret with binary data); they become
/// `raw::NOT_UTF8` and [`ENV_NOT_UTF8`] on the wire of RunPodSandbox and CreateContainer (whose `sandbox_config`
/// carries the annotation too), sent raw since prost would refuse to encode them.
pub async fn start_pod_with_bytes(
    socket: &Path,
    sandbox: cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> test_support::containerd::Pod {
    // containerd 1.7 with NRI on refuses such a pod while an NRI plugin is registered, and also
    // the first one after a plugin went away (it tries to send the event before it drops the
    // closed plugin): `NRI RunPodSandbox failed: string field contains invalid UTF-8`. Another
    // test's plugin may have just left; the next attempt goes through.
    let start = Instant::now();
    loop {
        match try_start_pod_with_bytes(socket, sandbox.clone(), container.clone()).await {
            Ok(pod) => return pod,
            Err(e) if e.message().contains("NRI") && start.elapsed() < Duration::from_secs(5) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("pod with bytes: {e:?}"),
        }
    }
}

/// [`start_pod_with_bytes`], returning the first failing call's status (the sandbox removed).
pub async fn try_start_pod_with_bytes(
    socket: &Path,
    sandbox: cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> Result<test_support::containerd::Pod, tonic::Status> {
    use prost::Message;
    use test_support::raw::{self, NOT_UTF8};
    let channel = test_support::channel(socket);
    let run =
        cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() }.encode_to_vec();
    let run = raw::with_bytes(&run, ANNOTATION_BYTES, NOT_UTF8);
    let answer =
        raw::unary(channel.clone(), "/runtime.v1.RuntimeService/RunPodSandbox", tonic::Request::new(run)).await?;
    let sandbox_id = cri::RunPodSandboxResponse::decode(answer.into_inner()).expect("answer").pod_sandbox_id;
    let mut rt = test_support::runtime_client(socket);
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.clone(),
        config: Some(container),
        sandbox_config: Some(sandbox.clone()),
    }
    .encode_to_vec();
    let create = raw::with_bytes(&raw::with_bytes(&create, ANNOTATION_BYTES, NOT_UTF8), ENV_BYTES, ENV_NOT_UTF8);
    let container_id =
        match raw::unary(channel, "/runtime.v1.RuntimeService/CreateContainer", tonic::Request::new(create)).await {
            Ok(answer) => cri::CreateContainerResponse::decode(answer.into_inner()).expect("answer").container_id,
            Err(e) => {
                test_support::containerd::remove_sandbox(&mut rt, &sandbox_id).await;
                return Err(e);
            }
        };
    if let Err(e) = rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() }).await {
        test_support::containerd::remove_sandbox(&mut rt, &sandbox_id).await;
        return Err(e);
    }
    Ok(test_support::containerd::Pod { sandbox_id, container_id, config: sandbox })
}

/// A NodeSLO with every class's CPU QoS on at koordlet's values (LSR/LS 2, BE −1): group
/// identity is off without one (koordlet's default).
pub const GROUP_IDENTITY_ON: &str =
    "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec:\n  \
    resourceQOSStrategy:\n    lsrClass: {cpuQOS: {enable: true}}\n    lsClass: {cpuQOS: {enable: true}}\
    \n    beClass: {cpuQOS: {enable: true}}\n";

/// Writes `text` as `<dir>/rules.yaml` and returns its path (for `--rules`).
pub fn rules_file(dir: &std::path::Path, text: &str) -> PathBuf {
    let path = dir.join("rules.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Pod annotation with the scheduler's device allocation (GPUEnvInject, RDMADeviceInject).
pub const DEVICE_ALLOCATED: &str = "scheduling.koordinator.sh/device-allocated";

/// A fake RDMA host under `root` (for `--device-host-root`): real character nodes made with
/// mknod(2) at `root/dev/infiniband/rdma_cm` (10:58) and `root/dev/infiniband/uverbs0`
/// (231:192), and the sysfs entry naming `uverbs0` the verbs device of PCI function
/// `0000:09:00.0`. Needs root (the tests run as root, for containerd).
pub fn fake_rdma_host(root: &Path) {
    let dev = root.join("dev/infiniband");
    std::fs::create_dir_all(&dev).unwrap();
    for (name, major, minor) in [("rdma_cm", 10, 58), ("uverbs0", 231, 192)] {
        let path = std::ffi::CString::new(dev.join(name).to_str().unwrap()).unwrap();
        // SAFETY: mknod(2) with a valid NUL-terminated path.
        let rc = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(major, minor)) };
        assert_eq!(rc, 0, "mknod {name}: {}", std::io::Error::last_os_error());
    }
    std::fs::create_dir_all(root.join("sys/bus/pci/devices/0000:09:00.0/infiniband_verbs/uverbs0")).unwrap();
}

/// Runs `script` with `sh -c` in a running container (CRI ExecSync); its stdout, or panics.
pub async fn exec(
    rt: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    id: &str,
    script: &str,
) -> String {
    let cmd = vec!["sh".into(), "-c".into(), script.into()];
    let out = rt
        .exec_sync(cri::ExecSyncRequest { container_id: id.into(), cmd, timeout: 5 })
        .await
        .expect("ExecSync")
        .into_inner();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
