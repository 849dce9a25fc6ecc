//! In-process hook servers for tests: programmable answers (to show chaining and merge rules on
//! a real pod), and registration files written the way koordlet writes them.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hook_api::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse,
};
use hook_api::{RuntimeHookService, RuntimeHookServiceServer};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Answers container-level stages: `(stage, request) -> answer`. Stage names as koord's
/// (`PreCreateContainer`, …).
pub type ContainerFn =
    Arc<dyn Fn(&str, &ContainerResourceHookRequest) -> Result<ContainerResourceHookResponse, Status> + Send + Sync>;
/// Answers pod-level stages.
pub type PodFn = Arc<dyn Fn(&str, &PodSandboxHookRequest) -> Result<PodSandboxHookResponse, Status> + Send + Sync>;

/// Every call a [`TestHook`] received, in order.
#[derive(Clone, Debug)]
pub enum Seen {
    /// A pod-level stage: its name (`PreRunPodSandbox`) and the request.
    Pod(String, PodSandboxHookRequest),
    /// A container-level stage: its name (`PreCreateContainer`) and the request.
    Container(String, ContainerResourceHookRequest),
}

impl Seen {
    /// The stage name.
    pub fn stage(&self) -> &str {
        match self {
            Seen::Pod(s, _) | Seen::Container(s, _) => s,
        }
    }
}

/// A running in-process hook server; stops when dropped.
pub struct TestHook {
    socket: PathBuf,
    seen: Arc<Mutex<Vec<Seen>>>,
    concurrency: Arc<Concurrency>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

struct Service {
    container: ContainerFn,
    pod: PodFn,
    seen: Arc<Mutex<Vec<Seen>>>,
    delay: std::time::Duration,
    concurrency: Arc<Concurrency>,
}

/// Calls in flight now, and the most seen at once.
#[derive(Debug, Default)]
struct Concurrency {
    now: std::sync::atomic::AtomicUsize,
    max: std::sync::atomic::AtomicUsize,
}

/// Counts a call as in flight until dropped.
struct InFlight(Arc<Concurrency>);

impl InFlight {
    fn new(c: &Arc<Concurrency>) -> InFlight {
        use std::sync::atomic::Ordering::SeqCst;
        let now = c.now.fetch_add(1, SeqCst) + 1;
        c.max.fetch_max(now, SeqCst);
        InFlight(c.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Service {
    fn pod(
        &self,
        stage: &str,
        req: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        let req = req.into_inner();
        self.seen.lock().unwrap().push(Seen::Pod(stage.into(), req.clone()));
        (self.pod)(stage, &req).map(Response::new)
    }
    fn container(
        &self,
        stage: &str,
        req: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let req = req.into_inner();
        self.seen.lock().unwrap().push(Seen::Container(stage.into(), req.clone()));
        (self.container)(stage, &req).map(Response::new)
    }
}

#[tonic::async_trait]
impl RuntimeHookService for Service {
    async fn pre_run_pod_sandbox_hook(
        &self,
        r: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.pod("PreRunPodSandbox", r)
    }
    async fn post_stop_pod_sandbox_hook(
        &self,
        r: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.pod("PostStopPodSandbox", r)
    }
    async fn pre_create_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.container("PreCreateContainer", r)
    }
    async fn pre_start_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.container("PreStartContainer", r)
    }
    async fn post_start_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.container("PostStartContainer", r)
    }
    async fn post_stop_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.container("PostStopContainer", r)
    }
    async fn pre_update_container_resources_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        let _in_flight = InFlight::new(&self.concurrency);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.container("PreUpdateContainerResources", r)
    }
}

impl TestHook {
    /// Serves on a fresh socket; pod stages answer with `pod`, container stages with `container`.
    pub async fn start(container: ContainerFn, pod: PodFn) -> TestHook {
        TestHook::start_with_delay(container, pod, std::time::Duration::ZERO).await
    }

    /// Like [`start`](Self::start), but every call first waits `delay` (asynchronously: calls
    /// overlap, as in a real server).
    pub async fn start_with_delay(container: ContainerFn, pod: PodFn, delay: std::time::Duration) -> TestHook {
        TestHook::serve(container, pod, delay, None).await
    }

    /// Serves with tonic's limit on the messages it reads and writes set to `max_bytes` (tonic's
    /// default, like grpc-go's, is 4 MiB: a server that keeps it refuses larger requests with
    /// RESOURCE_EXHAUSTED).
    pub async fn start_with_limit(container: ContainerFn, pod: PodFn, max_bytes: usize) -> TestHook {
        TestHook::serve(container, pod, std::time::Duration::ZERO, Some(max_bytes)).await
    }

    async fn serve(
        container: ContainerFn,
        pod: PodFn,
        delay: std::time::Duration,
        max_bytes: Option<usize>,
    ) -> TestHook {
        let dir = tempfile::Builder::new().prefix("rp-hook").tempdir().expect("temp dir");
        let socket = dir.path().join("hook.sock");
        let listener = UnixListener::bind(&socket).expect("bind hook socket");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let concurrency = Arc::new(Concurrency::default());
        let service = Service { container, pod, seen: seen.clone(), delay, concurrency: concurrency.clone() };
        let task = tokio::spawn(async move {
            let mut server = RuntimeHookServiceServer::new(service);
            if let Some(max) = max_bytes {
                server = server.max_decoding_message_size(max).max_encoding_message_size(max);
            }
            let _ = tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await;
        });
        TestHook { socket, seen, concurrency, task, _dir: dir }
    }

    /// Two koordlet-like servers for chaining tests, at PreCreateContainer: the first sets env
    /// `CHAIN=first` and cpu shares 300, the second appends `,second` to the `CHAIN` it sees —
    /// so `CHAIN=first,second` in the container means both ran, in that order, the second seeing
    /// the first's change.
    pub async fn chain_pair() -> (TestHook, TestHook) {
        let first = TestHook::echoing(|stage, resp| {
            if stage == "PreCreateContainer" {
                resp.container_envs.insert("CHAIN".into(), "first".into());
                resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 300;
            }
        })
        .await;
        let second = TestHook::echoing(|stage, resp| {
            if stage == "PreCreateContainer" {
                let before = resp.container_envs.get("CHAIN").cloned().unwrap_or_default();
                resp.container_envs.insert("CHAIN".into(), format!("{before},second"));
            }
        })
        .await;
        (first, second)
    }

    /// A koordlet-like server: echoes every request, then lets `change` edit container answers.
    pub async fn echoing(
        change: impl Fn(&str, &mut ContainerResourceHookResponse) + Send + Sync + 'static,
    ) -> TestHook {
        let container: ContainerFn = Arc::new(move |stage, req| {
            let mut resp = hook_api::merge::echo_container(req);
            change(stage, &mut resp);
            Ok(resp)
        });
        TestHook::start(container, Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req)))).await
    }

    /// The server's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The most calls this server had in flight at once.
    pub fn max_concurrent(&self) -> usize {
        self.concurrency.max.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Calls received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TestHook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes a registration file `dir/name` atomically (temp file + rename), with koordlet's keys
/// and any `extra` JSON keys (e.g. `"timeout-ms": 300`).
pub fn register(dir: &Path, name: &str, endpoint: &Path, policy: &str, stages: &[&str], extra: serde_json::Value) {
    let mut doc = serde_json::json!({
        "remote-endpoint": endpoint.display().to_string(),
        "failure-policy": policy,
        "runtime-hooks": stages,
    });
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        d.extend(e.clone());
    }
    let tmp = dir.join(format!(".{name}.tmp"));
    hook_api::write_registration(&tmp, &dir.join(name), &serde_json::to_vec_pretty(&doc).unwrap())
        .expect("write registration");
}

/// runtime-proxy (`bin`) as an NRI plugin (`--frontend nri`, name `runtime-proxy-test`, index 20)
/// of the runtime whose NRI socket is `nri_socket`, with `dir` as its hook config directory, its
/// admin socket `dir/admin.sock`, `extra` flags (e.g. `--metrics-addr`), logging to
/// `dir/proxy.log` at `rust_log`; killed when dropped.
pub fn start_nri_front(bin: &str, nri_socket: &Path, dir: &Path, extra: &[&str], rust_log: &str) -> KillOnDrop {
    let log = std::fs::File::create(dir.join("proxy.log")).expect("proxy log file");
    let child = std::process::Command::new(bin)
        .args(["--frontend", "nri", "--nri-socket"])
        .arg(nri_socket)
        .args(["--nri-plugin-name", "runtime-proxy-test", "--nri-plugin-index", "20", "--hook-config-dir"])
        .arg(dir)
        .args(extra)
        .arg("--admin-socket")
        .arg(dir.join("admin.sock"))
        .env("RUST_LOG", rust_log)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("proxy log file"))
        .stderr(log)
        .spawn()
        .expect("start runtime-proxy");
    KillOnDrop(child)
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The command that runs the example hook server (`hook-api/examples/annotation_hook.rs`) on
/// `socket`, registering itself in `register_in` if given; stderr discarded. Callers may add
/// to it (e.g. a uid) before spawning.
pub fn example_hook_command(socket: &Path, register_in: Option<&Path>) -> std::process::Command {
    let mut cmd = std::process::Command::new(crate::example_binary("annotation_hook"));
    cmd.arg("--listen").arg(socket).stderr(std::process::Stdio::null());
    if let Some(dir) = register_in {
        cmd.arg("--hook-config-dir").arg(dir);
    }
    cmd
}

/// Starts the example hook server on `dir/annotation-hook.sock`, registered in `dir`, and waits
/// until `proxy` has taken up its registration. Panics (test code) otherwise.
pub fn start_example_hook(dir: &Path, proxy: &crate::proxy::ProxyProcess) -> KillOnDrop {
    let seen = ["hook server added", "file=annotation-hook.json"];
    let before = proxy.count_log(&seen);
    let child = example_hook_command(&dir.join("annotation-hook.sock"), Some(dir))
        .spawn()
        .expect("start the example hook server");
    let hook = KillOnDrop(child);
    assert!(proxy.wait_log(&seen, before), "the proxy did not take up the example hook:\n{}", proxy.log());
    hook
}

/// The first `stage` call `hook` received after its first `from` calls, waiting up to 5 s for it
/// (post stages run after the proxy has answered). Panics (test code) when there is none.
pub async fn next_seen(hook: &TestHook, stage: &str, from: usize) -> Seen {
    let find = || hook.seen().into_iter().skip(from).find(|s| s.stage() == stage);
    crate::wait_until(std::time::Duration::from_secs(5), || async { find().is_some() }).await;
    find().unwrap_or_else(|| panic!("no {stage} call after the first {from}: {:?}", hook.seen()))
}

impl Seen {
    /// The container request of a container stage. Panics (test code) for a pod stage.
    pub fn container(self) -> ContainerResourceHookRequest {
        match self {
            Seen::Container(_, r) => r,
            other => panic!("container stage expected: {other:?}"),
        }
    }
}

/// Asserts `after` equals `before` field by field (clear messages), then as a whole.
pub fn assert_same_container(before: &ContainerResourceHookRequest, after: &ContainerResourceHookRequest, what: &str) {
    assert_eq!(after.pod_meta, before.pod_meta, "{what}: pod_meta");
    assert_eq!(after.pod_cgroup_parent, before.pod_cgroup_parent, "{what}: pod_cgroup_parent");
    assert_eq!(after.pod_labels, before.pod_labels, "{what}: pod_labels");
    assert_eq!(after.pod_annotations, before.pod_annotations, "{what}: pod_annotations");
    assert_eq!(after.pod_resources, before.pod_resources, "{what}: pod_resources");
    assert_eq!(after.container_meta, before.container_meta, "{what}: container_meta (name, attempt, ID)");
    assert_eq!(after.container_annotations, before.container_annotations, "{what}: container_annotations");
    assert_eq!(after.container_envs, before.container_envs, "{what}: container_envs");
    assert_eq!(after.container_resources, before.container_resources, "{what}: container_resources");
    assert_eq!(after, before, "{what}: whole request");
}
