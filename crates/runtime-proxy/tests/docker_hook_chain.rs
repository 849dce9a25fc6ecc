//! The hook chain's rules in Docker mode, on the real dockerd: a field conflict under
//! `Fail` refuses the container's create in Docker's error shape, and a pod requiring a hook
//! server that is not registered cannot create its sandbox. Pods are laid out the dockershim /
//! cri-dockerd way (see `docker_pods.rs`; annotations as `annotation.<key>` labels).
//! Needs `RP_DOCKERD_ENV` (set by `make test`).

use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Map, Value};
use test_support::containerd::unique;
use test_support::dockerd::{api, Dockerd};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

struct Setup {
    env: Dockerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
}

fn setup(extra: &[&str]) -> Setup {
    let env = Dockerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-dchain").tempdir().unwrap();
    let mut args = vec!["--backend-runtime-mode", "Docker", "--hook-config-dir", dir.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let proxy = ProxyProcess::start(BIN, &env.socket, &args);
    Setup { env, dir, proxy }
}

impl Setup {
    fn register(&self, name: &str, endpoint: &Path, stages: &[&str], extra: Value) {
        let before = self.proxy.count_log(&["hook server", &format!("file={name}")]);
        register(self.dir.path(), name, endpoint, "Ignore", stages, extra);
        assert!(
            self.proxy.wait_log(&["hook server", &format!("file={name}")], before),
            "{name} not taken up:\n{}",
            self.proxy.log()
        );
    }

    fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        api(self.proxy.socket(), method, &format!("/v{}{path}", self.env.api_version), body)
    }
}

/// One pod's names and cri-dockerd's create bodies; its containers are removed from dockerd
/// directly when dropped.
struct Pod<'a> {
    env: &'a Dockerd,
    name: String,
    uid: String,
    annotations: Vec<(String, String)>,
}

impl<'a> Pod<'a> {
    fn new(env: &'a Dockerd, annotations: &[(&str, &str)]) -> Pod<'a> {
        let annotations = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Pod { env, name: unique("chain"), uid: unique("uid"), annotations }
    }

    fn labels(&self, container: &str, kind: &str) -> Map<String, Value> {
        let mut labels = Map::new();
        for (k, v) in [
            ("io.kubernetes.docker.type", kind),
            ("io.kubernetes.container.name", container),
            ("io.kubernetes.pod.name", &self.name),
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.pod.uid", &self.uid),
        ] {
            labels.insert(k.into(), v.into());
        }
        labels
    }

    fn parent(&self) -> String {
        format!("{}/pod{}", self.env.cgroup_parent, self.uid)
    }

    fn sandbox(&self) -> (String, Value) {
        let mut labels = self.labels("POD", "podsandbox");
        labels.extend(self.annotations.iter().map(|(k, v)| (format!("annotation.{k}"), Value::from(v.as_str()))));
        let body = json!({
            "Image": self.env.pause_image,
            "Labels": labels,
            "HostConfig": {"CgroupParent": self.parent(), "NetworkMode": "none", "CpuShares": 2, "MemorySwap": 0},
        });
        (format!("/containers/create?name=k8s_POD_{}_default_{}_0", self.name, self.uid), body)
    }

    fn container(&self, sandbox_id: &str) -> (String, Value) {
        let mut labels = self.labels("main", "container");
        labels.insert("io.kubernetes.sandbox.id".into(), sandbox_id.into());
        let body = json!({
            "Image": self.env.test_image,
            "Cmd": ["sleep", "3600"],
            "Labels": labels,
            "HostConfig": {"CgroupParent": self.parent(), "NetworkMode": format!("container:{sandbox_id}"), "CpuShares": 512, "MemorySwap": 0},
        });
        (format!("/containers/create?name=k8s_main_{}_default_{}_0", self.name, self.uid), body)
    }

    /// dockerd's containers of this pod (by its UID), running or not.
    fn on_dockerd(&self) -> Vec<String> {
        let out = self
            .env
            .docker_direct()
            .args(["ps", "-a", "--filter", &format!("name={}", self.uid), "--format", "{{.Names}}"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect()).unwrap_or_default()
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        let names = self.on_dockerd();
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
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in controllers.flatten() {
                let _ = std::fs::remove_dir(c.path().join(self.parent().trim_start_matches('/')));
            }
        }
    }
}

/// A koordlet-like server (echoes every request) that sets `cpu_shares` at PreCreateContainer.
async fn shares_hook(shares: i64) -> TestHook {
    TestHook::echoing(move |stage, resp| {
        if stage == "PreCreateContainer" {
            resp.container_resources.get_or_insert_with(Default::default).cpu_shares = shares;
        }
    })
    .await
}

/// Two servers setting CPU shares differently, the later one's `conflict-policy` Fail: the
/// container's create answers 409 with Docker's error shape naming the field and both servers,
/// and dockerd has only the sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_under_fail_refuses_the_container_create() {
    let s = setup(&[]);
    let (a, b) = (shares_hook(700).await, shares_hook(900).await);
    s.register("a.json", a.socket(), &["PreCreateContainer"], json!({"order": 1}));
    s.register("b.json", b.socket(), &["PreCreateContainer"], json!({"order": 2, "conflict-policy": "Fail"}));
    let pod = Pod::new(&s.env, &[]);
    let (path, body) = pod.sandbox();
    let (status, created) = s.api("POST", &path, Some(&body));
    assert_eq!(status, 201, "{created}");
    let sandbox_id = created["Id"].as_str().expect("Id").to_owned();
    let (status, _) = s.api("POST", &format!("/containers/{sandbox_id}/start"), None);
    assert_eq!(status, 204);

    let (path, body) = pod.container(&sandbox_id);
    let (status, answer) = s.api("POST", &path, Some(&body));
    assert_eq!(status, 409, "FAILED_PRECONDITION → 409: {answer}");
    let message = answer["message"].as_str().unwrap_or_else(|| panic!("Docker's error shape: {answer}"));
    for part in [
        "PreCreateContainer",
        "container_resources.cpu_shares",
        "a.json",
        "b.json",
        "700",
        "900",
        "conflict-policy Fail",
    ] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
    assert_eq!(pod.on_dockerd().len(), 1, "only the sandbox: {:?}", pod.on_dockerd());
}

/// A pod requiring a hook server that is not registered: its sandbox's create answers 409
/// naming the server; dockerd has nothing of the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_server_not_registered_refuses_the_sandbox_create() {
    let s = setup(&[]);
    let pod = Pod::new(&s.env, &[("runtimeproxy.koordinator.sh/required-hook-servers", "gpu.json")]);
    let (path, body) = pod.sandbox();
    let (status, answer) = s.api("POST", &path, Some(&body));
    assert_eq!(status, 409, "{answer}");
    let message = answer["message"].as_str().unwrap_or_else(|| panic!("Docker's error shape: {answer}"));
    for part in ["PreRunPodSandbox", "gpu.json", "not registered"] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
    assert!(pod.on_dockerd().is_empty(), "{:?}", pod.on_dockerd());
}

/// A container create of a million `Env` entries (a ≈ 13 MB body, as cri-dockerd sends for
/// `envFrom` on large ConfigMaps) with a hook server registered for PreCreateContainer, so that
/// the proxy parses it, builds the hook request and sends it: meanwhile another client's
/// `GET /_ping`, every 20 ms on its own connection, answers within ~100 ms of its quiet time (150 ms asserted)
/// (the call runs off the proxy's thread: `hooks/offload.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_env_heavy_container_create_holds_nobody_up() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    let s = setup(&[]);
    let hook = TestHook::start_with_limit(
        std::sync::Arc::new(|_, _| Err(tonic::Status::permission_denied("no env-heavy containers here"))),
        std::sync::Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
        64 << 20,
    )
    .await;
    register(s.dir.path(), "strict.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    assert!(s.proxy.wait_log(&["hook server", "file=strict.json"], 0), "{}", s.proxy.log());
    let pod = Pod::new(&s.env, &[]);
    let (path, body) = pod.sandbox();
    let (status, created) = s.api("POST", &path, Some(&body));
    assert_eq!(status, 201, "{created}");
    let sandbox_id = created["Id"].as_str().expect("Id").to_owned();
    let (path, mut body) = pod.container(&sandbox_id);
    body["Env"] = Value::Array((0..1_000_000).map(|i| Value::String(format!("K{i}=v"))).collect());
    let probe = |stop: std::sync::Arc<AtomicBool>, socket: std::path::PathBuf| {
        std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            let mut calls = 0;
            while !stop.load(Ordering::Relaxed) {
                let start = Instant::now();
                let (status, _) = test_support::dockerd::api_raw(&socket, "GET", "/_ping", None);
                assert_eq!(status, 200);
                slowest = slowest.max(start.elapsed());
                calls += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (slowest, calls)
        })
    };
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let quiet = probe(stop.clone(), s.proxy.socket().to_owned());
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let (quiet, _) = quiet.join().unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let attacked = probe(stop.clone(), s.proxy.socket().to_owned());
    let (status, answer) = s.api("POST", &path, Some(&body));
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let (attacked, calls) = attacked.join().unwrap();
    assert!(status >= 400, "the Fail hook server refuses it: {status} {answer}");
    assert!(calls >= 5, "the probe ran {calls} times");
    eprintln!("slowest _ping {attacked:?} (quiet: {quiet:?})");
    // ~100 ms is the target (measured: 41 ms); 150 ms leaves room for a loaded CI machine.
    assert!(
        attacked <= quiet + Duration::from_millis(150),
        "another client's _ping took {attacked:?} (quiet: {quiet:?})"
    );
}
