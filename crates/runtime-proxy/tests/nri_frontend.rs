//! The NRI front end (`--frontend nri`) on a real containerd 1.7 or 2.1 with NRI on
//! (`RP_NRI=1 scripts/containerd.sh up 1.7 ROOT`; `scripts/test.sh` runs this target in its NRI
//! phase). No proxy in the CRI path: pods are created directly on containerd's CRI socket, and
//! containerd calls runtime-proxy as an NRI plugin, which calls the registered hook servers.
//!
//! The tests run one at a time (a lock): every NRI plugin sees every pod of its containerd.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, KillOnDrop, Seen, TestHook};
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// containerd with NRI, a hook config dir, and runtime-proxy as its NRI plugin.
struct Setup {
    env: Containerd,
    nri_socket: PathBuf,
    dir: tempfile::TempDir,
    log: PathBuf,
    debug: String,
    metrics: String,
    proxy: Option<KillOnDrop>,
    rt: RuntimeServiceClient<Channel>,
}

/// `None` (the test is skipped, loudly) when the containerd under test has no NRI.
fn setup() -> Option<Setup> {
    let env = Containerd::from_env();
    let file = std::env::var("RP_CONTAINERD_ENV").unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let Some(nri_socket) = text.lines().find_map(|l| l.strip_prefix("NRI_SOCKET=")).map(PathBuf::from) else {
        eprintln!(
            "SKIPPED: {file} has no NRI_SOCKET (start containerd with RP_NRI=1 scripts/containerd.sh up 1.7 ROOT)"
        );
        return None;
    };
    let dir = tempfile::Builder::new().prefix("rp-nri").tempdir().unwrap();
    let rt = runtime_client(&env.socket);
    let log = dir.path().join("proxy.log");
    Some(Setup {
        env,
        nri_socket,
        log,
        debug: test_support::free_loopback_addr(),
        metrics: test_support::free_loopback_addr(),
        proxy: None,
        rt,
        dir,
    })
}

impl Setup {
    /// The hook config dir (registrations go here).
    fn hooks_dir(&self) -> &Path {
        self.dir.path()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn count(&self, parts: &[&str]) -> usize {
        self.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).count()
    }

    /// Waits up to 15 s until more than `already` log lines hold every part.
    fn wait_log(&self, parts: &[&str], already: usize) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(15) {
            if self.count(parts) > already {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Starts (or restarts) runtime-proxy as an NRI plugin; waits until containerd synchronized it.
    fn start_proxy(&mut self) {
        self.proxy = None;
        let before = self.count(&["NRI Synchronize: store rebuilt"]);
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(BIN)
            .args(["--frontend", "nri", "--nri-socket"])
            .arg(&self.nri_socket)
            .args(["--nri-plugin-name", "runtime-proxy-test", "--nri-plugin-index", "20", "--hook-config-dir"])
            .arg(self.hooks_dir())
            .args(["--metrics-addr", &self.metrics, "--debug-addr", &self.debug, "--admin-socket"])
            .arg(self.dir.path().join("admin.sock"))
            .env("RUST_LOG", "info,runtime_proxy=debug,nri_plugin=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start runtime-proxy");
        self.proxy = Some(KillOnDrop(child));
        assert!(self.wait_log(&["NRI Synchronize: store rebuilt"], before), "not synchronized:\n{}", self.log());
    }

    /// Registers `name` while the proxy runs and waits until it has taken it up.
    fn register(&self, name: &str, endpoint: &Path, policy: &str, stages: &[&str], extra: serde_json::Value) {
        let before = self.count(&["hook server", &format!("file={name}")]);
        register(self.hooks_dir(), name, endpoint, policy, stages, extra);
        if self.proxy.is_some() {
            assert!(
                self.wait_log(&["hook server", &format!("file={name}")], before),
                "{name} not taken up:\n{}",
                self.log()
            );
        }
    }

    /// A pod (one `sleep` container with 512 shares and `KEEP=me`) created on containerd itself.
    async fn pod(&mut self, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Result<Pod, tonic::Status> {
        let to_map =
            |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        let sandbox = sandbox_config(&self.env, &unique("nri-front"), to_map(labels), to_map(annotations));
        let resources = cri::LinuxContainerResources { cpu_shares: 512, cpu_period: 100_000, ..Default::default() };
        let container = container_config(&self.env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me")]);
        Pod::start(&mut self.rt, sandbox, container).await
    }

    /// The container's environment as a process run in it sees it (ExecSync takes the container
    /// spec's env; its process 1 is the sandbox's pause in a shared PID namespace), one
    /// `KEY=VALUE` a line.
    async fn environ(&mut self, pod: &Pod) -> String {
        let out = self
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: pod.container_id.clone(),
                cmd: vec!["env".into()],
                timeout: 10,
            })
            .await
            .expect("ExecSync")
            .into_inner();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn name_of(pod: &Pod) -> String {
    pod.config.metadata.as_ref().unwrap().name.clone()
}

/// Waits up to 10 s for `f`.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The Python grpcio hook server (tests/clients/hook_server.py, not written for runtime-proxy)
/// registered for every stage: the pod created straight on containerd gets its env in the real
/// container and its 333 cpu shares in the real cgroup; its pod-level label (PreRunPodSandbox)
/// cannot be expressed through NRI and is logged once; the stages come in the pod's order,
/// post stages included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_hook_server_reaches_the_real_container_through_nri() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let py_dir = tempfile::Builder::new().prefix("rp-py").tempdir().unwrap();
    let py = test_support::clients::PyHookServer::start(py_dir.path());
    let stages = [
        "PreRunPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PostStopContainer",
        "PostStopPodSandbox",
    ];
    s.register("py.json", &py.socket, "Fail", &stages, json!({}));
    s.start_proxy();
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    let name = name_of(&pod);
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "333", "the server's cpu shares, not the 512 asked\n{}", s.log());
    let environ = s.environ(&pod).await;
    for var in ["PY_HOOK=grpcio", "KEEP=me"] {
        assert!(environ.lines().any(|l| l == var), "{var} missing from the container's environment:\n{environ}");
    }
    assert_eq!(s.count(&["NRI cannot express", "event=\"RunPodSandbox\"", &name, "fields=labels"]), 1, "{}", s.log());
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
    assert!(eventually(|| py.stages_of(&name).len() == stages.len()), "{:?}\n{}", py.stages_of(&name), s.log());
    assert_eq!(py.stages_of(&name), stages);
}

/// A `Fail` server refusing PreCreateContainer fails the container's creation on containerd
/// itself (NRI's error path), with the server's message; the same server under `Ignore`: the
/// container is created unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_through_nri() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let hook = TestHook::start(
        Arc::new(|_, _| Err(tonic::Status::permission_denied("quota exhausted for this pod"))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    s.register("strict.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    s.start_proxy();
    let err = s.pod(&[], &[]).await.expect_err("a Fail server refused the container");
    assert!(err.message().contains("quota exhausted for this pod"), "{err:?}");
    assert!(err.message().contains("PreCreateContainer"), "{err:?}");

    s.register("strict.json", hook.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("under Ignore: {e:?}\n{}", s.log()));
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "unchanged");
    assert!(hook.seen().len() >= 2, "both creations called the server");
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

/// Two servers in their registered order: the second sees the first's change, and both changes
/// reach the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_chain_in_order_through_nri() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let (first, second) = TestHook::chain_pair().await;
    s.register("z-first.json", first.socket(), "Fail", &["PreCreateContainer"], json!({"order": 1}));
    s.register("a-second.json", second.socket(), "Fail", &["PreCreateContainer"], json!({"order": 2}));
    s.start_proxy();
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    assert!(s.environ(&pod).await.lines().any(|l| l == "CHAIN=first,second"), "{}", s.log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "300");
    let Some(Seen::Container(_, seen)) = second.seen().into_iter().find(|c| c.stage() == "PreCreateContainer") else {
        panic!("the second server was not called")
    };
    assert_eq!(seen.container_resources.as_ref().unwrap().cpu_shares, 300, "second saw first's change");
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

/// runtime-proxy restarted while a pod runs: Synchronize rebuilds the store (`/debug/store`
/// lists the pod and its container again, before any event), runs no pre hook on the existing
/// container, and a later UpdateContainerResources runs PreUpdateContainerResources with the
/// pod's labels, whose answer reaches the real cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_rebuilds_the_store_from_synchronize() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let hook = TestHook::echoing(|stage, resp| {
        if stage == "PreUpdateContainerResources" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 777;
        }
    })
    .await;
    s.register("update.json", hook.socket(), "Fail", &["PreCreateContainer", "PreUpdateContainerResources"], json!({}));
    s.start_proxy();
    let pod = s.pod(&[("app", "restart-me")], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    let status: serde_json::Value = serde_json::from_str(&test_support::http_get(&s.metrics, "/status").1).unwrap();
    assert_eq!((&status["backend"]["mode"], &status["backend"]["up"]), (&json!("NRI"), &json!(true)), "{status}");
    s.start_proxy();
    let (code, store) = test_support::http_get(&s.debug, "/debug/store");
    assert_eq!(code, 200, "{store}");
    assert!(
        store.contains(&pod.sandbox_id) && store.contains(&pod.container_id),
        "the store after the restart:\n{store}"
    );
    let creates = hook.seen().iter().filter(|c| c.stage() == "PreCreateContainer").count();
    assert_eq!(creates, 1, "no pre hook ran again on the existing container");

    let update = cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 256, cpu_period: 100_000, ..Default::default() }),
        ..Default::default()
    };
    s.rt.update_container_resources(update).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    let Some(Seen::Container(_, req)) = hook.seen().into_iter().find(|c| c.stage() == "PreUpdateContainerResources")
    else {
        panic!("no PreUpdateContainerResources call:\n{}", s.log())
    };
    assert_eq!(req.pod_labels.get("app").map(String::as_str), Some("restart-me"));
    assert_eq!(req.container_resources.as_ref().unwrap().cpu_shares, 256, "kubelet's update");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "777", "the hook's answer, applied by containerd\n{}", s.log());
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

const QOS: &str = "koordinator.sh/qosClass";
const SPEC: &str = "node.koordinator.sh/extended-resource-spec";
/// batch-cpu request 500, limit 1000 (milli-CPU), batch-memory limit 128 MiB.
const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

/// runtime-hooks in proxy mode (koordlet's hooks over runtime.v1alpha1) registered behind the
/// NRI front end: a BE pod created straight on containerd gets its batch values in its real
/// container cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_hooks_behind_the_nri_front_end_give_a_be_pod_its_batch_values() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let socket = s.hooks_dir().join("runtime-hooks.sock");
    let log = s.hooks_dir().join("runtime-hooks.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let _hooks = KillOnDrop(
        Command::new(test_support::workspace_binary("runtime-hooks"))
            .arg("--listen")
            .arg(&socket)
            .arg("--hook-config-dir")
            .arg(s.hooks_dir())
            .env("RUST_LOG", "info,runtime_hooks=debug")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("start runtime-hooks"),
    );
    let hooks_log = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(eventually(|| s.hooks_dir().join("runtime-hooks.json").exists()), "not registered:\n{}", hooks_log());
    s.start_proxy();
    assert!(s.count(&["hook server", "file=runtime-hooks.json"]) >= 1, "{}", s.log());

    let to_map =
        |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
    let sandbox = sandbox_config(&s.env, &unique("nri-be"), to_map(&[(QOS, "BE")]), to_map(&[(SPEC, BE_SPEC)]));
    // kubelet's BestEffort container: 2 shares, 100 ms period, no limits.
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[]);
    let pod = Pod::start(&mut s.rt, sandbox, container)
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}\n{}", s.log(), hooks_log()));
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "batch-cpu request 500\n{}\n{}", s.log(), hooks_log());
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "100000", "batch-cpu limit 1000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728", "batch-memory limit 128Mi");
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

/// The NRI socket is the only thing the front end needs: a proxy pointed at a socket where no
/// runtime listens keeps retrying, says in `/status` that it is not connected, and exits cleanly
/// on SIGTERM.
#[test]
fn waits_for_the_runtime_and_stops_on_sigterm() {
    let dir = tempfile::Builder::new().prefix("rp-nri").tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let file = std::fs::File::create(&log).unwrap();
    let metrics = test_support::free_loopback_addr();
    let mut child = Command::new(BIN)
        .args(["--frontend", "nri", "--nri-socket"])
        .arg(dir.path().join("absent.sock"))
        .arg("--hook-config-dir")
        .arg(dir.path())
        .args(["--metrics-addr", &metrics, "--admin-socket"])
        .arg(dir.path().join("admin.sock"))
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(eventually(|| read().contains("retrying")), "{}", read());
    let status: serde_json::Value = serde_json::from_str(&test_support::http_get(&metrics, "/status").1).unwrap();
    assert_eq!(
        (&status["backend"]["mode"], &status["backend"]["up"], &status["healthy"]),
        (&json!("NRI"), &json!(false), &json!(false))
    );
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "did not stop:\n{}", read());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}\n{}", read());
}

/// PreStartContainer's resources cannot ride in StartContainer's answer (NRI has none): they
/// reach the running container through `Runtime.UpdateContainers` right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_start_resources_arrive_through_update_containers() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let hook = TestHook::echoing(|stage, resp| {
        if stage == "PreStartContainer" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 444;
        }
    })
    .await;
    s.register("start.json", hook.socket(), "Fail", &["PreStartContainer"], json!({}));
    s.start_proxy();
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    assert!(
        eventually(|| pod.cgroup_file("cpu", "cpu.shares") == "444"),
        "{}\n{}",
        pod.cgroup_file("cpu", "cpu.shares"),
        s.log()
    );
    assert!(s.count(&["NRI: containers updated with the PreStartContainer hooks' resources"]) >= 1, "{}", s.log());
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

/// A server slower than containerd's plugin timeout (2 s), registered with a longer timeout of
/// its own: the call's budget (1.8 s) ends it first, so the proxy answers in time. Under `Ignore`
/// the container is created unchanged within the budget and the plugin stays registered (the
/// next pod is hooked again); under `Fail` the creation fails with a deadline error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_budget_fits_containerds_plugin_timeout() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let slow = TestHook::start_with_delay(
        Arc::new(|_, req| {
            let mut resp = hook_api::merge::echo_container(req);
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 999;
            Ok(resp)
        }),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
        Duration::from_secs(3),
    )
    .await;
    s.register("slow.json", slow.socket(), "Ignore", &["PreCreateContainer"], json!({"timeout-ms": 5000}));
    s.start_proxy();
    for round in 0..2 {
        let start = Instant::now();
        let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("round {round}: {e:?}\n{}", s.log()));
        let took = start.elapsed();
        assert!(took < Duration::from_millis(2800), "round {round}: {took:?}");
        assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "round {round}: unchanged");
        let mut rt = s.rt.clone();
        pod.remove(&mut rt).await;
    }
    assert_eq!(
        s.count(&["server=slow.json", "failure-policy Ignore"]),
        2,
        "the plugin stayed registered: both pods were hooked\n{}",
        s.log()
    );
    s.register("slow.json", slow.socket(), "Fail", &["PreCreateContainer"], json!({"timeout-ms": 5000}));
    let err = s.pod(&[], &[]).await.expect_err("a Fail server out of time");
    assert!(err.message().contains("PreCreateContainer"), "{err:?}");
}

/// The skip label works as in CRI mode: a pod in an allowed namespace carrying it is not
/// hooked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_skip_label_exempts_a_pod() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let hook = TestHook::echoing(|stage, resp| {
        if stage == "PreCreateContainer" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 300;
        }
    })
    .await;
    s.register("skip.json", hook.socket(), "Fail", &["PreRunPodSandbox", "PreCreateContainer"], json!({}));
    s.start_proxy();
    let to_map =
        |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
    let mut sandbox = sandbox_config(
        &s.env,
        &unique("nri-skip"),
        to_map(&[("runtimeproxy.koordinator.sh/skip-hookserver", "true")]),
        HashMap::new(),
    );
    sandbox.metadata.as_mut().unwrap().namespace = "kube-system".into();
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[]);
    let pod = Pod::start(&mut s.rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "not hooked");
    assert!(hook.seen().is_empty(), "{:?}", hook.seen());
    let mut rt = s.rt.clone();
    pod.remove(&mut rt).await;
}

/// A pod author's worst requirement annotation (65,000 names, ≈ 300 KB) under `--frontend nri`:
/// the pod is refused at once with a short message, within containerd's 2 s plugin timeout, so
/// the plugin is not dropped, and the pods created next (four at once) are all hooked by the
/// `Fail` server. (On a proxy that spent seconds on the annotation containerd dropped the plugin
/// and the next pods started without their `Fail` server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_requirement_annotation_is_refused_and_the_next_pods_are_hooked() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let hook = TestHook::echoing(|stage, resp| {
        if stage == "PreCreateContainer" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 300;
        }
    })
    .await;
    s.register("strict.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    s.start_proxy();
    let synchronized = s.count(&["NRI Synchronize: store rebuilt"]);
    let names = (0..65_000).map(|i| format!("{i:x}")).collect::<Vec<_>>().join(",");
    let start = Instant::now();
    let err = s
        .pod(&[], &[("runtimeproxy.koordinator.sh/required-hook-servers", &names)])
        .await
        .expect_err("a pod requiring 65,000 hook servers is refused");
    let took = start.elapsed();
    assert!(err.message().contains("more than 64"), "{err:?}");
    assert!(err.message().len() < 2048, "a refusal counts, it does not list: {} bytes", err.message().len());
    assert!(took < Duration::from_secs(2), "refused in {took:?}");
    let pods = futures::future::join_all((0..4).map(|_| {
        let (env, mut rt) = (s.env.clone(), s.rt.clone());
        async move {
            let sandbox = sandbox_config(&env, &unique("nri-after"), HashMap::new(), HashMap::new());
            let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
            let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[]);
            Pod::start(&mut rt, sandbox, container).await
        }
    }))
    .await;
    for pod in pods {
        let pod = pod.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
        assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "300", "hooked by the Fail server");
        let mut rt = s.rt.clone();
        pod.remove(&mut rt).await;
    }
    assert_eq!(
        s.count(&["NRI Synchronize: store rebuilt"]),
        synchronized,
        "the plugin was never dropped:\n{}",
        s.log()
    );
}

/// The events subscribed follow the registry: one PreCreateContainer server, and containerd
/// sends CreateContainer and the remove events only (its stop stages are not called: nothing is
/// registered there); a server added at PostStopContainer makes the plugin register again with
/// StopContainer (containerd resynchronizes it) and is called when the next pod's container
/// stops; removed, the plugin registers again without it. Fails while every event is subscribed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_follows_the_registry() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(mut s) = setup() else { return };
    let create = TestHook::echoing(|_, _| {}).await;
    let stop = TestHook::echoing(|_, _| {}).await;
    s.register("create.json", create.socket(), "Fail", &["PreCreateContainer"], json!({}));
    s.start_proxy();
    let configured = |events: &str| format!("subscribed={events}");
    let create_only = configured("RemovePodSandbox,CreateContainer,RemoveContainer");
    assert_eq!(s.count(&["NRI: configured", &create_only]), 1, "{}", s.log());
    let mut rt = s.rt.clone();
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    pod.remove(&mut rt).await;
    let stages = |hook: &TestHook| hook.seen().iter().map(|s| s.stage().to_owned()).collect::<Vec<_>>();
    assert_eq!(stages(&create), ["PreCreateContainer"]);

    let (again, synced) = (s.count(&["the plugin needs other events"]), s.count(&["NRI Synchronize: store rebuilt"]));
    s.register("stop.json", stop.socket(), "Ignore", &["PostStopContainer"], json!({}));
    assert!(s.wait_log(&["the plugin needs other events"], again), "{}", s.log());
    assert!(s.wait_log(&["NRI Synchronize: store rebuilt"], synced), "not resynchronized:\n{}", s.log());
    let with_stop = configured("RemovePodSandbox,CreateContainer,StopContainer,RemoveContainer");
    assert_eq!(s.count(&["NRI: configured", &with_stop]), 1, "{}", s.log());
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    pod.remove(&mut rt).await;
    assert!(eventually(|| stages(&stop) == ["PostStopContainer"]), "{:?}\n{}", stages(&stop), s.log());

    let (again, synced) = (s.count(&["the plugin needs other events"]), s.count(&["NRI Synchronize: store rebuilt"]));
    std::fs::remove_file(s.hooks_dir().join("stop.json")).unwrap();
    assert!(s.wait_log(&["the plugin needs other events"], again), "{}", s.log());
    assert!(s.wait_log(&["NRI Synchronize: store rebuilt"], synced), "not resynchronized:\n{}", s.log());
    assert_eq!(s.count(&["NRI: configured", &create_only]), 2, "{}", s.log());
    let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.log()));
    pod.remove(&mut rt).await;
    assert_eq!(stages(&create), ["PreCreateContainer"; 3]);
    assert_eq!(stages(&stop), ["PostStopContainer"], "the removed server is no longer called");
}
