//! Pods laid out the dockershim / cri-dockerd way, driven over the Docker Engine API with raw
//! HTTP/1.1 the way cri-dockerd drives it (sandbox `k8s_POD_<pod>_<ns>_<uid>_0` on the pause
//! image with `io.kubernetes.docker.type=podsandbox`, annotations as `annotation.<key>` labels,
//! `HostConfig.CgroupParent` `<DOCKER_CGROUP_PARENT>/pod<uid>`, `OomScoreAdj -998`; container
//! `k8s_main_<pod>_<ns>_<uid>_0` in the sandbox's network namespace; start, update, stop,
//! remove), through the proxy in Docker mode in front of the real dockerd. What the hook servers
//! answer shows up in the real containers' cgroup files and environment; failure policies, the
//! skip label, short IDs and names, and a `kill -9` restart behave as in CRI mode.
//!
//! Negative `OomScoreAdj` values (the sandboxes' -998) are raised to 0 by the harness's runc
//! wrapper (`scripts/dockerd.sh`: no CAP_SYS_RESOURCE here); dockerd still reports -998.
//! Needs `RP_DOCKERD_ENV` (set by `make test`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hook_api::v1alpha1::{ContainerResourceHookRequest, PodSandboxHookRequest, PodSandboxHookResponse};
use serde_json::{json, Value};
use test_support::containerd::unique;
use test_support::dockerd::{api, api_raw, Dockerd};
use test_support::hooks::{assert_same_container, next_seen, register, Seen, TestHook};
use test_support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const SKIP_LABEL: &str = "runtimeproxy.koordinator.sh/skip-hookserver";
/// Every stage a Docker call can reach.
const ALL_STAGES: [&str; 7] = [
    "PreRunPodSandbox",
    "PostStopPodSandbox",
    "PreCreateContainer",
    "PreStartContainer",
    "PostStartContainer",
    "PreUpdateContainerResources",
    "PostStopContainer",
];

fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The proxy's flags for Docker mode with hook config dir `hooks`.
fn docker_mode(hooks: &Path) -> [&str; 4] {
    ["--backend-runtime-mode", "Docker", "--hook-config-dir", hooks.to_str().unwrap()]
}

/// dockerd and a proxy in Docker mode in front of it, with an empty hook config dir.
struct Setup {
    env: Dockerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
}

fn setup() -> Setup {
    let env = Dockerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-dpods").tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &docker_mode(dir.path()));
    Setup { env, dir, proxy }
}

impl Setup {
    /// Registers `name` (koordlet's keys) and waits until the proxy has taken it up.
    fn register(&self, name: &str, endpoint: &Path, policy: &str, stages: &[&str]) {
        let before = self.proxy.count_log(&["hook server", &format!("file={name}")]);
        register(self.dir.path(), name, endpoint, policy, stages, json!({}));
        assert!(
            self.proxy.wait_log(&["hook server", &format!("file={name}")], before),
            "registry did not take up {name}:\n{}",
            self.proxy.log()
        );
    }

    fn pod(&self, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        Pod::new(&self.env, self.proxy.socket(), labels, annotations)
    }
}

/// A pod laid out the dockershim way, driven over the Engine API on `socket` (the proxy's). When
/// dropped, its containers (found by the pod UID in their names) are removed directly on dockerd
/// and its cgroup directories deleted.
struct Pod {
    env: Dockerd,
    socket: PathBuf,
    name: String,
    namespace: String,
    uid: String,
    /// kubelet's pod cgroup parent: `<DOCKER_CGROUP_PARENT>/pod<uid>`.
    parent: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    sandbox_id: String,
    container_id: String,
}

/// kubelet's resources for the container `main` (cri-dockerd's HostConfig fields; MemorySwap 0
/// as cri-dockerd sends it).
fn resources(cpu_shares: i64) -> Value {
    json!({"CpuShares": cpu_shares, "MemorySwap": 0})
}

impl Pod {
    fn new(env: &Dockerd, socket: &Path, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
        let uid = unique("uid");
        Pod {
            env: env.clone(),
            socket: socket.to_owned(),
            name: unique("web"),
            namespace: "default".into(),
            parent: format!("{}/pod{uid}", env.cgroup_parent),
            uid,
            labels: map(labels),
            annotations: map(annotations),
            sandbox_id: String::new(),
            container_id: String::new(),
        }
    }

    /// `method /v<api version><path>` on the proxy.
    fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        api(&self.socket, method, &format!("/v{}{path}", self.env.api_version), body)
    }

    /// The same call directly on dockerd.
    fn direct(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        api(&self.env.socket, method, &format!("/v{}{path}", self.env.api_version), body)
    }

    fn sandbox_name(&self) -> String {
        format!("k8s_POD_{}_{}_{}_0", self.name, self.namespace, self.uid)
    }

    fn container_name(&self) -> String {
        format!("k8s_main_{}_{}_{}_0", self.name, self.namespace, self.uid)
    }

    /// The labels cri-dockerd puts on every container of the pod: kubelet's pod labels and the
    /// pod's identity.
    fn kube_labels(&self, container: &str, kind: &str) -> serde_json::Map<String, Value> {
        let mut labels = serde_json::Map::new();
        for (k, v) in [
            ("io.kubernetes.docker.type", kind),
            ("io.kubernetes.container.name", container),
            ("io.kubernetes.pod.name", &self.name),
            ("io.kubernetes.pod.namespace", &self.namespace),
            ("io.kubernetes.pod.uid", &self.uid),
        ] {
            labels.insert(k.into(), v.into());
        }
        labels
    }

    /// cri-dockerd's sandbox create body.
    fn sandbox_body(&self) -> Value {
        let mut labels = self.kube_labels("POD", "podsandbox");
        labels.extend(self.labels.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))));
        labels.extend(self.annotations.iter().map(|(k, v)| (format!("annotation.{k}"), Value::from(v.as_str()))));
        json!({
            "Hostname": self.name,
            "Image": self.env.pause_image,
            "Labels": labels,
            "HostConfig": {"CgroupParent": self.parent, "NetworkMode": "none", "OomScoreAdj": -998, "CpuShares": 2, "MemorySwap": 0},
        })
    }

    /// cri-dockerd's create body for the container `main` (`sleep 3600`) with these envs and
    /// HostConfig resource fields.
    fn container_body(&self, envs: &[&str], resources: Value) -> Value {
        let mut labels = self.kube_labels("main", "container");
        labels.insert("io.kubernetes.sandbox.id".into(), self.sandbox_id.clone().into());
        labels.insert(
            "io.kubernetes.container.logpath".into(),
            format!("/var/log/pods/{}_{}_{}/main/0.log", self.namespace, self.name, self.uid).into(),
        );
        labels.insert("annotation.io.kubernetes.container.hash".into(), "5e3d2c1b".into());
        labels.insert("annotation.io.kubernetes.container.restartCount".into(), "0".into());
        let mut host_config =
            json!({"CgroupParent": self.parent, "NetworkMode": format!("container:{}", self.sandbox_id)});
        host_config.as_object_mut().unwrap().extend(resources.as_object().cloned().unwrap_or_default());
        json!({
                        "Image": self.env.test_image,
            "Cmd": ["sleep", "3600"],
            "Env": envs,
            "Labels": labels,
            "HostConfig": host_config,
        })
    }

    /// Creates the sandbox through the proxy; records its ID on success.
    fn create_sandbox(&mut self) -> (u16, Value) {
        let (status, body) =
            self.api("POST", &format!("/containers/create?name={}", self.sandbox_name()), Some(&self.sandbox_body()));
        if status == 201 {
            self.sandbox_id = body["Id"].as_str().expect("Id").to_owned();
        }
        (status, body)
    }

    /// Creates the container through the proxy; records its ID on success.
    fn create_container(&mut self, envs: &[&str], resources: Value) -> (u16, Value) {
        let body = self.container_body(envs, resources);
        let (status, answer) =
            self.api("POST", &format!("/containers/create?name={}", self.container_name()), Some(&body));
        if status == 201 {
            self.container_id = answer["Id"].as_str().expect("Id").to_owned();
        }
        (status, answer)
    }

    /// `POST /containers/{id}/{action}` (`action` may carry a query: `stop?t=0`) through the
    /// proxy; panics unless it answers `want`.
    fn call(&self, action: &str, id: &str, body: Option<&Value>, want: u16) -> Value {
        let (status, answer) = self.api("POST", &format!("/containers/{id}/{action}"), body);
        assert_eq!(status, want, "{action} {id}: {answer}");
        answer
    }

    /// The whole pod through the proxy: sandbox created and started, container created and
    /// started. Errors: the step that failed, its status and answer.
    fn run(&mut self, envs: &[&str], resources: Value) -> Result<(), String> {
        let (status, body) = self.create_sandbox();
        if status != 201 {
            return Err(format!("create sandbox: {status} {body}"));
        }
        let (status, body) = self.api("POST", &format!("/containers/{}/start", self.sandbox_id), None);
        if status != 204 {
            return Err(format!("start sandbox: {status} {body}"));
        }
        let (status, body) = self.create_container(envs, resources);
        if status != 201 {
            return Err(format!("create container: {status} {body}"));
        }
        let (status, body) = self.api("POST", &format!("/containers/{}/start", self.container_id), None);
        if status != 204 {
            return Err(format!("start container: {status} {body}"));
        }
        Ok(())
    }

    /// kubelet's update: `UpdateContainerResources` as cri-dockerd sends it.
    fn update(&self, id: &str, body: Value) {
        let answer = self.call("update", id, Some(&body), 200);
        assert!(answer["Warnings"].is_array(), "dockerd's answer: {answer}");
    }

    /// Stops and removes the container and then the sandbox through the proxy (`sleep` ignores
    /// SIGTERM: the container is stopped with `t=0`).
    fn stop_and_remove(&self) {
        self.call("stop?t=0", &self.container_id, None, 204);
        self.call("stop?t=5", &self.sandbox_id, None, 204);
        for id in [&self.container_id, &self.sandbox_id] {
            let (status, body) = self.api("DELETE", &format!("/containers/{id}"), None);
            assert_eq!(status, 204, "remove {id}: {body}");
        }
    }

    /// dockerd's inspect of `id`.
    fn inspect(&self, id: &str) -> Value {
        let (status, body) = self.direct("GET", &format!("/containers/{id}/json"), None);
        assert_eq!(status, 200, "inspect {id}: {body}");
        body
    }

    /// A cgroup file of the container, below kubelet's pod parent.
    fn cgroup(&self, controller: &str, file: &str) -> String {
        cgroup(controller, &format!("{}/{}", self.parent, self.container_id), file)
    }

    /// Runs `script` in the container (`docker exec` directly on dockerd); its trimmed stdout.
    fn exec(&self, script: &str) -> String {
        let out = self
            .env
            .docker_direct()
            .args(["exec", &self.container_id, "sh", "-c", script])
            .output()
            .expect("docker exec");
        assert!(out.status.success(), "exec {script:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// The names of dockerd's containers of this pod (by its UID), running or not.
    fn containers_on_dockerd(&self) -> Vec<String> {
        let out = self
            .env
            .docker_direct()
            .args(["ps", "-a", "--filter", &format!("name={}", self.uid), "--format", "{{.Names}}"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect()).unwrap_or_default()
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let names = self.containers_on_dockerd();
        if !names.is_empty() {
            let _ = self
                .env
                .docker_direct()
                .arg("rm")
                .arg("-f")
                .args(&names)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // The pod directories dockerd created (and the hook-moved ones of the restart test).
        let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else { return };
        for c in controllers.flatten() {
            for dir in [self.parent.clone(), format!("{}-hooked", self.parent), format!("{}-c", self.parent)] {
                let _ = std::fs::remove_dir(c.path().join(dir.trim_start_matches('/')));
            }
        }
    }
}

/// Reads `/sys/fs/cgroup/<controller><dir>/<file>`, trimmed.
fn cgroup(controller: &str, dir: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{controller}{dir}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).trim().to_owned()
}

/// The example hook (`hook-api/examples/annotation_hook.rs`) on a dockershim pod: the pod
/// annotation `example.runtime-proxy.dev/cpu-shares=700` becomes the container's real
/// `cpu.shares` and its `HOOKED_BY`/`CPU_SHARES` envs (kubelet's kept); an update asking for
/// 256 keeps 700 and applies kubelet's memory limit; a pod without the annotation keeps 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_hook_sets_cgroup_and_env_of_the_real_container() {
    let s = setup();
    let _hook = test_support::hooks::start_example_hook(s.dir.path(), &s.proxy);

    let mut pod = s.pod(&[("app", "web")], &[("example.runtime-proxy.dev/cpu-shares", "700")]);
    pod.run(&["KEEP=me", "EQ=a=b"], resources(512)).expect("pod through the proxy");
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "700", "the hook's cpu shares, not kubelet's 512");
    assert_eq!(pod.exec("echo $HOOKED_BY $CPU_SHARES $KEEP $EQ"), "annotation-hook 700 me a=b");
    assert_eq!(pod.inspect(&pod.container_id)["HostConfig"]["CpuShares"], 700);

    // PreUpdateContainerResources: kubelet asks for 256 shares and 96 MiB; the hook keeps 700.
    let mib96 = 96i64 << 20;
    pod.update(&pod.container_id, json!({"CpuShares": 256, "Memory": mib96, "MemorySwap": mib96}));
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "700");
    assert_eq!(pod.cgroup("memory", "memory.limit_in_bytes"), mib96.to_string(), "kubelet's other values kept");
    assert_eq!(pod.cgroup("memory", "memory.memsw.limit_in_bytes"), mib96.to_string());

    // A pod without the annotation is left alone.
    let mut plain = s.pod(&[("app", "web")], &[]);
    plain.run(&["KEEP=me"], resources(512)).expect("plain pod");
    assert_eq!(plain.cgroup("cpu", "cpu.shares"), "512");
    assert_eq!(plain.exec("echo ${HOOKED_BY:-none} $KEEP"), "none me");
    pod.stop_and_remove();
    plain.stop_and_remove();
    assert!(pod.containers_on_dockerd().is_empty() && plain.containers_on_dockerd().is_empty());
}

const QOS: &str = "koordinator.sh/qosClass";
const SPEC: &str = "node.koordinator.sh/extended-resource-spec";
/// batch-cpu request 500, limit 1000 (milli-CPU), batch-memory limit 128 MiB (as in
/// runtime-hooks' own tests).
const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

/// runtime-hooks (proxy mode, its defaults: `--cgroup-root /sys/fs/cgroup`, cgroup driver auto)
/// registered with the proxy: a BE pod's container gets its batch values in its real cgroup
/// (applied by the proxy into the create body), and the pod's own directory gets them too
/// (written by runtime-hooks at PreRunPodSandbox: the pod parent is a cgroupfs path, as with
/// containerd). kubelet's update with BestEffort values does not undo them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_hooks_give_a_be_pod_its_batch_resources() {
    let s = setup();
    let socket = s.dir.path().join("runtime-hooks.sock");
    let log = s.dir.path().join("runtime-hooks.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let _hooks = test_support::hooks::KillOnDrop(
        Command::new(test_support::workspace_binary("runtime-hooks"))
            .arg("--listen")
            .arg(&socket)
            .arg("--hook-config-dir")
            .arg(s.dir.path())
            .env("RUST_LOG", "info,runtime_hooks=debug")
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("start runtime-hooks"),
    );
    let hooks_log = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        s.proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "{}\n{}",
        s.proxy.log(),
        hooks_log()
    );

    let mut pod = s.pod(&[(QOS, "BE")], &[(SPEC, BE_SPEC)]);
    // kubelet creates the pod's cgroup before RunPodSandbox; no kubelet here.
    for controller in ["cpu", "memory"] {
        std::fs::create_dir_all(format!("/sys/fs/cgroup/{controller}{}", pod.parent)).unwrap();
    }
    // kubelet's BestEffort container: 2 shares, 100 ms period, no limits.
    pod.run(&[], json!({"CpuShares": 2, "CpuPeriod": 100_000, "MemorySwap": 0}))
        .unwrap_or_else(|e| panic!("{e}\n{}", hooks_log()));

    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "512", "batch-cpu request 500 → 500 × 1024 / 1000");
    assert_eq!(pod.cgroup("cpu", "cpu.cfs_period_us"), "100000");
    assert_eq!(pod.cgroup("cpu", "cpu.cfs_quota_us"), "100000", "batch-cpu limit 1000 → 1000 × 100000 / 1000");
    assert_eq!(pod.cgroup("memory", "memory.limit_in_bytes"), "134217728", "batch-memory limit 128Mi");
    let host_config = &pod.inspect(&pod.container_id)["HostConfig"];
    assert_eq!(
        (&host_config["CpuShares"], &host_config["CpuQuota"], &host_config["Memory"]),
        (&json!(512), &json!(100_000), &json!(134_217_728))
    );
    // Pod level: written by runtime-hooks itself at PreRunPodSandbox.
    assert_eq!(cgroup("cpu", &pod.parent, "cpu.shares"), "512", "{}", hooks_log());
    assert_eq!(cgroup("cpu", &pod.parent, "cpu.cfs_quota_us"), "100000");
    assert_eq!(cgroup("memory", &pod.parent, "memory.limit_in_bytes"), "134217728");
    // ... and answered in PreRunPodSandbox's `resources` (koordlet's PodResponse.ProxyDone),
    // which the proxy applies to the pause container, as koord-runtime-proxy does.
    let pause = &pod.inspect(&pod.sandbox_id)["HostConfig"];
    assert_eq!(
        (&pause["CpuShares"], &pause["CpuQuota"], &pause["Memory"], &pause["OomScoreAdj"]),
        (&json!(512), &json!(100_000), &json!(134_217_728), &json!(-998)),
        "{}",
        hooks_log()
    );

    // kubelet re-sends the BestEffort values; the policy holds.
    pod.update(&pod.container_id, json!({"CpuShares": 2, "CpuPeriod": 100_000}));
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "512");
    assert_eq!(pod.cgroup("cpu", "cpu.cfs_quota_us"), "100000");
    assert_eq!(pod.cgroup("memory", "memory.limit_in_bytes"), "134217728");
    let log = hooks_log();
    assert!(log.contains("PreCreateContainer") && log.contains("cpu_shares=512"), "the change is logged:\n{log}");
    pod.stop_and_remove();
}

/// A `Fail` hook refusing PreCreateContainer (PERMISSION_DENIED): the create answers 403 in
/// Docker's error shape, the message naming the stage, the registration file, the server and the
/// cause, and dockerd has no such container. The same server under `Ignore`: the pod runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_on_container_create() {
    let s = setup();
    let hook = TestHook::start(
        Arc::new(|_, _| Err(tonic::Status::permission_denied("quota exhausted for this pod"))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    s.register("strict.json", hook.socket(), "Fail", &["PreCreateContainer"]);
    let mut pod = s.pod(&[], &[]);
    let (status, body) = pod.create_sandbox();
    assert_eq!(status, 201, "{body}");
    pod.call("start", &pod.sandbox_id, None, 204);

    let (status, body) = pod.create_container(&["KEEP=me"], resources(512));
    assert_eq!(status, 403, "PERMISSION_DENIED → 403: {body}");
    let message = body["message"].as_str().unwrap_or_else(|| panic!("Docker's error shape: {body}"));
    for part in [
        "PreCreateContainer",
        "strict.json",
        &hook.socket().display().to_string(),
        "quota exhausted for this pod",
        "Fail",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
    assert_eq!(body.as_object().map(|o| o.len()), Some(1), "only `message`: {body}");
    assert_eq!(pod.containers_on_dockerd(), [pod.sandbox_name()], "no container created");
    let (status, _) = pod.direct("GET", &format!("/containers/{}/json", pod.container_name()), None);
    assert_eq!(status, 404);

    s.register("strict.json", hook.socket(), "Ignore", &["PreCreateContainer"]);
    let (status, body) = pod.create_container(&["KEEP=me"], resources(512));
    assert_eq!(status, 201, "runs under Ignore: {body}");
    pod.call("start", &pod.container_id, None, 204);
    assert_eq!(pod.inspect(&pod.container_id)["State"]["Running"], true);
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "512", "kubelet's request unchanged");
    assert_eq!(pod.exec("echo $KEEP"), "me");
    let calls = hook.seen().iter().filter(|c| c.stage() == "PreCreateContainer").count();
    assert_eq!(calls, 2, "the server was asked both times");
    assert!(
        s.proxy.log().lines().any(|l| l.contains("strict.json") && l.contains("failure-policy Ignore")),
        "the ignored failure is logged:\n{}",
        s.proxy.log()
    );
    pod.stop_and_remove();
}

/// A koordlet-like container answer: at PreCreateContainer an env, a container annotation, CPU
/// shares and a cgroup parent of the container's own (`<pod parent>-c`).
fn koordlet_like(stage: &str, req: &ContainerResourceHookRequest) -> hook_api::v1alpha1::ContainerResourceHookResponse {
    let mut resp = hook_api::merge::echo_container(req);
    if stage == "PreCreateContainer" {
        resp.container_envs.insert("HOOKED".into(), "yes".into());
        resp.container_annotations.insert("hooked-container".into(), "yes".into());
        resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 700;
        resp.pod_cgroup_parent = format!("{}-c", req.pod_cgroup_parent);
    }
    resp
}

/// The pod answer: echo, plus a label and an annotation at PreRunPodSandbox.
fn pod_answer(stage: &str, req: &PodSandboxHookRequest) -> PodSandboxHookResponse {
    let mut resp = hook_api::merge::echo_pod(req);
    if stage == "PreRunPodSandbox" {
        resp.labels.insert("hooked-label".into(), "yes".into());
        resp.annotations.insert("hooked-annotation".into(), "yes".into());
    }
    resp
}

/// `kill -9` of the proxy and a new one on the same socket: it rebuilds its store from dockerd
/// (`src/docker/recover.rs`), and the PostStopContainer request after the restart carries what
/// the PreStartContainer request before it carried — pod metadata, labels and annotations (as the
/// hook changed them), cgroup parent, container name and ID, resources (no envs: the store keeps
/// none).
///
/// (Failed before recovery mapped dockerd's reported `MemorySwap` = 2 × `Memory` back to the
/// `MemorySwap: 0` cri-dockerd sent.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_after_a_kill_9_restart_see_what_they_saw_before() {
    let env = Dockerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-drecover").tempdir().unwrap();
    let (socket, hooks) = (dir.path().join("run/rp.sock"), dir.path().join("hooks"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = TestHook::start(
        Arc::new(|stage, req| Ok(koordlet_like(stage, req))),
        Arc::new(|stage, req| Ok(pod_answer(stage, req))),
    )
    .await;
    let stages =
        ["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer", "PostStopContainer", "PostStopPodSandbox"];
    register(&hooks, "recover.json", hook.socket(), "Fail", &stages, json!({}));
    let start_proxy = |log: &str| {
        let mut p = ProxyProcess::spawn(BIN, &socket, &env.socket, &docker_mode(&hooks), dir.path().join(log));
        p.wait_ready();
        assert!(p.wait_log(&["hook server added", "file=recover.json"], 0), "hook server not registered:\n{}", p.log());
        p
    };

    // Proxy A: the pod is created and started through it.
    let mut a = start_proxy("a.log");
    let mut pod = Pod::new(&env, &socket, &[("app", "db")], &[("team", "storage")]);
    let kubelet = json!({"CpuShares": 512, "CpuPeriod": 100_000, "CpuQuota": 50_000, "Memory": 64 << 20, "MemorySwap": 0, "CpusetCpus": "0", "OomScoreAdj": 500});
    pod.run(&["KEEP=me", "EQ=a=b"], kubelet).expect("pod through proxy A");
    let before = next_seen(&hook, "PreStartContainer", 0).await.container();
    let container_parent = format!("{}-c", pod.parent);
    assert_eq!(
        cgroup("cpu", &format!("{container_parent}/{}", pod.container_id), "cpu.shares"),
        "700",
        "hooked parent and shares applied"
    );
    assert_eq!(
        before.container_meta.as_ref().map(|m| (m.name.as_str(), m.id.as_str())),
        Some(("main", pod.container_id.as_str()))
    );
    assert_eq!(before.pod_cgroup_parent, container_parent);
    assert_eq!(before.pod_labels.get("hooked-label").map(String::as_str), Some("yes"));
    assert_eq!(before.pod_annotations, map(&[("team", "storage"), ("hooked-annotation", "yes")]));
    assert!(before.container_envs.is_empty(), "envs only at PreCreateContainer: {:?}", before.container_envs);
    let r = before.container_resources.clone().unwrap_or_default();
    assert_eq!(
        (r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes, r.cpuset_cpus.as_str()),
        (700, 50_000, 64 << 20, "0")
    );

    // kill -9 A; B starts on the same socket and hook directory.
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(5));
    let b = start_proxy("b.log");
    assert!(b.wait_log(&["store recovered"], 0), "no recovery logged:\n{}", b.log());

    let n = hook.seen().len();
    pod.call("stop?t=0", &pod.container_id, None, 204);
    let after = next_seen(&hook, "PostStopContainer", n).await.container();
    assert_same_container(&before, &after, "PostStopContainer after the restart");

    let Seen::Pod(_, run_req) = next_seen(&hook, "PreRunPodSandbox", 0).await else { panic!("pod stage expected") };
    let n = hook.seen().len();
    pod.call("stop?t=5", &pod.sandbox_id, None, 204);
    let Seen::Pod(_, stop_req) = next_seen(&hook, "PostStopPodSandbox", n).await else { panic!("pod stage expected") };
    let mut stored = run_req.clone();
    hook_api::merge::apply_pod_response(&mut stored, &pod_answer("PreRunPodSandbox", &run_req));
    assert_eq!(stop_req.labels, stored.labels, "PostStopPodSandbox after the restart: labels");
    assert_eq!(stop_req.annotations, stored.annotations, "PostStopPodSandbox after the restart: annotations");
    assert_eq!(stop_req, stored, "PostStopPodSandbox after the restart: whole request");
    for id in [&pod.container_id, &pod.sandbox_id] {
        assert_eq!(pod.api("DELETE", &format!("/containers/{id}"), None).0, 204);
    }
    drop(b);
}

/// Start, update and stop by short ID and by name: the proxy resolves them (dockerd's inspect)
/// and the hooks get the same full request as for the full ID. Calls about a container dockerd
/// does not know get dockerd's own answer, byte for byte, and call no hook.
///
/// (Failed before a short ID or name was looked up by its full ID in the store after inspect,
/// instead of the entry being rebuilt from inspect.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_ids_and_names_resolve_and_unknown_ids_get_dockerds_answer() {
    let s = setup();
    let hook = TestHook::echoing(|_, _| {}).await;
    let stages = [
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
        "PostStopPodSandbox",
    ];
    s.register("observer.json", hook.socket(), "Fail", &stages);
    let mut pod = s.pod(&[("app", "web")], &[("team", "storage")]);
    let (status, body) = pod.create_sandbox();
    assert_eq!(status, 201, "{body}");
    pod.call("start", &pod.sandbox_id, None, 204);
    // kubelet's limits for a container with a memory limit (cri-dockerd sends MemorySwap 0).
    let (status, body) =
        pod.create_container(&["KEEP=me"], json!({"CpuShares": 512, "Memory": 64 << 20, "MemorySwap": 0}));
    assert_eq!(status, 201, "{body}");
    let (full, short, name) = (pod.container_id.clone(), pod.container_id[..12].to_owned(), pod.container_name());

    // By full ID (the store's entry from the create): the reference request.
    pod.call("start", &full, None, 204);
    let reference = next_seen(&hook, "PreStartContainer", 0).await.container();
    assert_eq!(reference.container_meta.as_ref().map(|m| m.id.as_str()), Some(full.as_str()));
    assert_eq!(reference.pod_labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(reference.pod_annotations, map(&[("team", "storage")]));
    assert_eq!(reference.pod_cgroup_parent, pod.parent);
    assert!(reference.container_envs.is_empty(), "envs only at PreCreateContainer: {:?}", reference.container_envs);
    next_seen(&hook, "PostStartContainer", 0).await;

    let n = hook.seen().len();
    pod.call("stop?t=0", &short, None, 204);
    assert_same_container(
        &reference,
        &next_seen(&hook, "PostStopContainer", n).await.container(),
        "PostStopContainer by short ID",
    );

    let n = hook.seen().len();
    pod.call("start", &name, None, 204);
    assert_same_container(
        &reference,
        &next_seen(&hook, "PreStartContainer", n).await.container(),
        "PreStartContainer by name",
    );
    next_seen(&hook, "PostStartContainer", n).await;

    let n = hook.seen().len();
    pod.update(&short, json!({"CpuShares": 256}));
    let update = next_seen(&hook, "PreUpdateContainerResources", n).await.container();
    assert_eq!(update.container_resources.as_ref().map(|r| r.cpu_shares), Some(256), "kubelet's update merged in");
    let mut want = reference.clone();
    want.container_resources.get_or_insert_with(Default::default).cpu_shares = 256;
    assert_same_container(&want, &update, "PreUpdateContainerResources by short ID");
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "256");

    let n = hook.seen().len();
    pod.call("stop?t=0", &name, None, 204);
    assert_same_container(
        &want,
        &next_seen(&hook, "PostStopContainer", n).await.container(),
        "PostStopContainer by name",
    );

    let n = hook.seen().len();
    pod.call("stop?t=5", &pod.sandbox_name(), None, 204);
    let Seen::Pod(_, stop) = next_seen(&hook, "PostStopPodSandbox", n).await else { panic!("pod stage expected") };
    assert_eq!(
        stop.pod_meta.as_ref().map(|m| (m.name.as_str(), m.uid.as_str())),
        Some((pod.name.as_str(), pod.uid.as_str()))
    );
    assert_eq!(
        (stop.cgroup_parent.as_str(), stop.labels.get("app").map(String::as_str)),
        (pod.parent.as_str(), Some("web"))
    );

    // Unknown containers: dockerd's answer, byte for byte; no hook called.
    let n = hook.seen().len();
    let v = format!("/v{}", s.env.api_version);
    let unknown = "0123456789ab-no-such-container";
    let k8s_unknown = format!("k8s_main_nosuch_default_{}_0", unique("uid"));
    for (method, path, body) in [
        ("POST", format!("{v}/containers/{unknown}/stop?t=0"), None),
        ("POST", format!("{v}/containers/{k8s_unknown}/stop"), None),
        ("POST", format!("{v}/containers/{unknown}/start"), None),
        ("POST", format!("{v}/containers/{unknown}/update"), Some(&br#"{"CpuShares":256}"#[..])),
        ("DELETE", format!("{v}/containers/{unknown}"), None),
    ] {
        let through = api_raw(s.proxy.socket(), method, &path, body);
        let direct = api_raw(&s.env.socket, method, &path, body);
        assert_eq!(
            (through.0, String::from_utf8_lossy(&through.1)),
            (direct.0, String::from_utf8_lossy(&direct.1)),
            "{method} {path}: as dockerd answers"
        );
        assert_eq!(through.0, 404, "{method} {path}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hook.seen().len(), n, "no hook called for unknown containers: {:?}", &hook.seen()[n..]);
    for id in [&full, &pod.sandbox_id] {
        assert_eq!(pod.api("DELETE", &format!("/containers/{id}"), None).0, 204);
    }
}

/// A pod labelled `runtimeproxy.koordinator.sh/skip-hookserver=true` (the hook servers' own
/// pods) goes through its whole life without a hook call, although the only registered server
/// refuses every stage under `Fail`; a pod without the label is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_label_calls_no_hook() {
    let s = setup();
    let hook = TestHook::start(
        Arc::new(|_, _| Err(tonic::Status::unavailable("refusing everything"))),
        Arc::new(|_, _| Err(tonic::Status::unavailable("refusing everything"))),
    )
    .await;
    s.register("refuse.json", hook.socket(), "Fail", &ALL_STAGES);

    // In kube-system, one of --runtime-hook-server-namespaces' default namespaces.
    let mut skipped = s.pod(&[(SKIP_LABEL, "true"), ("app", "hook-server")], &[]);
    skipped.namespace = "kube-system".into();
    skipped.run(&["KEEP=me"], resources(512)).expect("a pod with the skip label runs");
    assert_eq!(skipped.cgroup("cpu", "cpu.shares"), "512");
    skipped.update(&skipped.container_id, json!({"CpuShares": 300}));
    assert_eq!(skipped.cgroup("cpu", "cpu.shares"), "300");
    skipped.stop_and_remove();
    tokio::time::sleep(Duration::from_millis(300)).await; // post stages would run after the answers
    assert!(hook.seen().is_empty(), "no hook called: {:?}", hook.seen().iter().map(Seen::stage).collect::<Vec<_>>());

    // The label in `default` is ignored (WARN, counted): the hooks decide, and refuse.
    let mut labelled = s.pod(&[(SKIP_LABEL, "true"), ("app", "web")], &[]);
    assert_eq!(labelled.create_sandbox().0, 503, "the skip label outside the allowed namespaces skips nothing");
    assert!(s.proxy.log().contains("skip label ignored"), "{}", s.proxy.log());
    let mut other = s.pod(&[("app", "web")], &[]);
    let (status, body) = other.create_sandbox();
    assert_eq!(status, 503, "UNAVAILABLE → 503: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("refusing everything") && m.contains("PreRunPodSandbox")),
        "{body}"
    );
    let seen = hook.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let Seen::Pod(stage, req) = &seen[1] else { panic!("pod stage expected: {seen:?}") };
    assert_eq!(
        (stage.as_str(), req.pod_meta.as_ref().map(|m| m.uid.as_str())),
        ("PreRunPodSandbox", Some(other.uid.as_str()))
    );
    assert!(other.containers_on_dockerd().is_empty(), "refused sandbox not created");
}

/// A hook that raises a container's memory limit at PreUpdateContainerResources (kubelet's update
/// asks only for CPU shares): the update succeeds and the new limit is in the real cgroup.
/// dockerd gave the container `MemorySwap` = 2 × its first limit; a new limit above that needs a
/// matching `MemorySwap` in the update body, or dockerd refuses the update.
///
/// (Failed — dockerd answered 409 "Memory limit should be smaller than already set memoryswap
/// limit" — before the proxy wrote a `MemorySwap` that follows the hook's memory limit.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_hook_raising_the_memory_limit_reaches_the_cgroup() {
    let s = setup();
    let mib200 = 200i64 << 20;
    let hook = TestHook::echoing(move |stage, resp| {
        if stage == "PreUpdateContainerResources" {
            resp.container_resources.get_or_insert_with(Default::default).memory_limit_in_bytes = mib200;
        }
    })
    .await;
    s.register("memory.json", hook.socket(), "Fail", &["PreUpdateContainerResources"]);
    let mut pod = s.pod(&[], &[]);
    pod.run(&["KEEP=me"], json!({"CpuShares": 512, "Memory": 64 << 20, "MemorySwap": 0})).expect("pod");
    assert_eq!(pod.cgroup("memory", "memory.limit_in_bytes"), (64i64 << 20).to_string());
    pod.update(&pod.container_id, json!({"CpuShares": 300}));
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "300");
    assert_eq!(pod.cgroup("memory", "memory.limit_in_bytes"), mib200.to_string(), "the hook's limit");
    pod.stop_and_remove();
}

/// Calls for one pod do not interleave between their stages in Docker mode either: a second call
/// for the pod (an update) sent while StartContainer is in its pre stage waits until
/// StartContainer's post stage is done, as in CRI mode. Every hook call takes 1 s, so the update
/// is waiting for the pod's turn when the start is answered.
///
/// (Failed before Docker mode used the one hook flow: its start released the pod's turn after
/// dockerd's answer and took it again in a task of its own for PostStartContainer, so the
/// waiting update ran its PreUpdateContainerResources first — seen order PreStartContainer,
/// PreUpdateContainerResources, PostStartContainer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_for_the_pod_waits_for_the_post_stage() {
    let s = setup();
    let echo_container: test_support::hooks::ContainerFn = Arc::new(|_, req| {
        Ok(hook_api::v1alpha1::ContainerResourceHookResponse {
            container_annotations: req.container_annotations.clone(),
            container_resources: req.container_resources.clone(),
            ..Default::default()
        })
    });
    let hook = TestHook::start_with_delay(
        echo_container,
        Arc::new(|_, _| Ok(PodSandboxHookResponse::default())),
        Duration::from_secs(1),
    )
    .await;
    let stages = ["PreStartContainer", "PostStartContainer", "PreUpdateContainerResources"];
    s.register("slow.json", hook.socket(), "Ignore", &stages);
    let mut pod = s.pod(&[("app", "web")], &[]);
    assert_eq!(pod.create_sandbox().0, 201);
    pod.call("start", &pod.sandbox_id, None, 204);
    assert_eq!(pod.create_container(&["KEEP=me"], resources(512)).0, 201);
    let pod = Arc::new(pod);
    let start = {
        let pod = pod.clone();
        std::thread::spawn(move || pod.call("start", &pod.container_id, None, 204))
    };
    // The start is in its 1 s pre stage, holding the pod's turn; the update waits for it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let update = {
        let pod = pod.clone();
        std::thread::spawn(move || pod.update(&pod.container_id, json!({"CpuShares": 300})))
    };
    start.join().expect("start");
    update.join().expect("update");
    let order: Vec<String> = hook.seen().iter().map(|s| s.stage().to_owned()).collect();
    assert_eq!(order, stages, "the update's pre stage ran between the start's stages");
    assert_eq!(pod.cgroup("cpu", "cpu.shares"), "300", "the update reached the container");
    pod.stop_and_remove();
}
