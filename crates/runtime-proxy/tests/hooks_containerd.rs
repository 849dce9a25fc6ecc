//! Hook servers at work on real pods: what a hook answers ends up in the real container's cgroup
//! files and environment; failure policies, chaining, hot reload and bad files behave as
//! documented. The proxy and containerd are real processes; hook servers are the example program
//! or in-process fakes (for hangs, garbage and scripted answers).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::hooks::{register, Seen, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

struct Setup {
    env: Containerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
    rt: RuntimeServiceClient<Channel>,
}

fn setup() -> Setup {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-hookd").tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let rt = runtime_client(proxy.socket());
    Setup { env, dir, proxy, rt }
}

impl Setup {
    /// Registers `name` and waits until the proxy has taken it up.
    fn register(&self, name: &str, endpoint: &Path, policy: &str, stages: &[&str], extra: serde_json::Value) {
        let before = self.proxy.count_log(&["hook server", &format!("file={name}")]);
        register(self.dir.path(), name, endpoint, policy, stages, extra);
        assert!(
            self.proxy.wait_log(&["hook server", &format!("file={name}")], before),
            "registry did not take up {name}:\n{}",
            self.proxy.log()
        );
    }

    async fn pod(&mut self, annotations: &[(&str, &str)], labels: &[(&str, &str)]) -> Result<Pod, tonic::Status> {
        let to_map =
            |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        let sandbox = sandbox_config(&self.env, &unique("hooked"), to_map(labels), to_map(annotations));
        let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
        let container = container_config(&self.env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me")]);
        Pod::start(&mut self.rt, sandbox, container).await
    }

    async fn exec(&mut self, pod: &Pod, script: &str) -> String {
        let out = self
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: pod.container_id.clone(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 10,
            })
            .await
            .expect("ExecSync")
            .into_inner();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

#[tokio::test]
async fn example_hook_sets_cgroup_and_env_of_the_real_container() {
    let mut s = setup();
    let _hook = test_support::hooks::start_example_hook(s.dir.path(), &s.proxy);

    let pod = s.pod(&[("example.runtime-proxy.dev/cpu-shares", "700")], &[]).await.expect("pod");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700", "the hook's cpu shares, not kubelet's 512");
    assert_eq!(s.exec(&pod, "echo $HOOKED_BY $CPU_SHARES $KEEP").await, "annotation-hook 700 me");

    // PreUpdateContainerResources: kubelet asks for 256, the hook keeps 700.
    s.rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources {
            cpu_shares: 256,
            memory_limit_in_bytes: 96 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("update");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700");
    assert_eq!(
        pod.cgroup_file("memory", "memory.limit_in_bytes"),
        (96u64 << 20).to_string(),
        "kubelet's other values kept"
    );

    // A pod without the annotation is left alone.
    let plain = s.pod(&[], &[]).await.expect("plain pod");
    assert_eq!(plain.cgroup_file("cpu", "cpu.shares"), "512");
    assert_eq!(s.exec(&plain, "echo ${HOOKED_BY:-none}").await, "none");
    pod.remove(&mut s.rt).await;
    plain.remove(&mut s.rt).await;
}

/// A hook server run by another user than root or the proxy's is refused on connect
/// (SO_PEERCRED): under `Fail` the pod is refused naming the uid and pid; listed in the
/// registration's `allowed-uids`, the same server is used.
#[tokio::test]
async fn a_hook_server_run_by_another_user_is_refused_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let mut s = setup();
    let sockets = tempfile::Builder::new().prefix("rp-nobody").tempdir().unwrap();
    std::fs::set_permissions(sockets.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let hook_socket = sockets.path().join("nobody.sock");
    let child = test_support::hooks::example_hook_command(&hook_socket, None).uid(65534).gid(65534).spawn();
    let _hook = test_support::hooks::KillOnDrop(child.expect("start the example hook server as uid 65534"));
    assert!(test_support::wait_until(Duration::from_secs(10), || async { hook_socket.exists() }).await, "hook socket");

    s.register("nobody.json", &hook_socket, "Fail", &["PreCreateContainer"], json!({}));
    let err = s
        .pod(&[("example.runtime-proxy.dev/cpu-shares", "700")], &[])
        .await
        .expect_err("a hook server run by uid 65534");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "refused for who runs it, not for being down: {err:?}");
    for part in ["PreCreateContainer", "nobody.json", "uid 65534", "pid", "not by an allowed uid"] {
        assert!(err.message().contains(part), "{part:?} missing from {:?}", err.message());
    }

    s.register("nobody.json", &hook_socket, "Fail", &["PreCreateContainer"], json!({"allowed-uids": [65534]}));
    let pod = s.pod(&[("example.runtime-proxy.dev/cpu-shares", "700")], &[]).await.expect("allowed now");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700", "the hook's value");
    pod.remove(&mut s.rt).await;
}

#[tokio::test]
async fn fail_policy_refuses_the_call_naming_stage_server_and_cause() {
    let mut s = setup();
    let hook = TestHook::start(
        std::sync::Arc::new(|_, _| Err(tonic::Status::permission_denied("quota exhausted for this pod"))),
        std::sync::Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    s.register("strict.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let err = s.pod(&[], &[]).await.expect_err("CreateContainer refused");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    for part in ["PreCreateContainer", "strict.json", &hook.socket().display().to_string(), "quota exhausted", "Fail"] {
        assert!(err.message().contains(part), "{part:?} missing from {:?}", err.message());
    }
}

/// CreateContainer for a sandbox neither the store nor containerd knows, without a
/// `sandbox_config`: no hook is called (a Fail hook would otherwise answer with its own error),
/// and the client gets containerd's own answer, as without the proxy.
#[tokio::test]
async fn create_container_in_an_unknown_sandbox_gets_containerds_answer() {
    let mut s = setup();
    let hook = TestHook::start(
        std::sync::Arc::new(|_, _| Err(tonic::Status::permission_denied("hook must not be asked"))),
        std::sync::Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    s.register("strict.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let request = cri::CreateContainerRequest {
        pod_sandbox_id: "0123456789abcdef-no-such-sandbox".into(),
        config: Some(container_config(&s.env, "main", &["sleep", "1"], None, &[])),
        sandbox_config: None,
    };
    let direct = runtime_client(&s.env.socket).create_container(request.clone()).await.expect_err("unknown sandbox");
    let through = s.rt.create_container(request).await.expect_err("unknown sandbox");
    assert_eq!((through.code(), through.message()), (direct.code(), direct.message()), "containerd's answer");
    assert_eq!(through.code(), tonic::Code::NotFound, "{through:?}");
    assert!(hook.seen().is_empty(), "no hook called: {:?}", hook.seen());
}

#[tokio::test]
async fn ignore_policy_lets_pods_run_past_dead_slow_and_garbage_servers() {
    let mut s = setup();
    let dead = s.dir.path().join("nobody-listens.sock");
    let slow = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: test_support::fake_backend::grpc_frame(&[]),
        trailers: vec![("grpc-status".into(), "0".into())],
        delay: Duration::from_secs(30),
    })
    .await;
    let garbage = FakeBackend::start(Behaviour::ok(&[0xff, 0xff, 0xff, 0x07])).await;
    let hang = FakeBackend::start(Behaviour::Hang).await;
    let stages = ["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"];
    s.register("a-dead.json", &dead, "Ignore", &stages, json!({}));
    s.register("b-slow.json", slow.socket(), "Ignore", &stages, json!({"timeout-ms": 200}));
    s.register("c-garbage.json", garbage.socket(), "", &stages, json!({}));
    s.register("d-hang.json", hang.socket(), "Ignore", &stages, json!({"timeout-ms": 200}));

    let started = Instant::now();
    let pod = s.pod(&[], &[]).await.expect("the pod runs despite every hook failing");
    assert!(started.elapsed() < Duration::from_secs(20), "timeouts bounded the slow and hung servers");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512", "request unchanged");
    assert!(!slow.calls().is_empty() && !garbage.calls().is_empty() && !hang.calls().is_empty());
    let log = s.proxy.log();
    for file in ["a-dead.json", "b-slow.json", "c-garbage.json", "d-hang.json"] {
        assert!(
            log.lines().any(|l| l.contains(file) && l.contains("failure-policy Ignore")),
            "{file} failure not logged:\n{log}"
        );
    }
    assert!(log.contains("timed out after 200ms"), "{log}");
    // A timeout does not eject the server: the next pod calls it again.
    let calls = slow.calls().len();
    let second = s.pod(&[], &[]).await.expect("second pod");
    assert!(slow.calls().len() > calls);
    pod.remove(&mut s.rt).await;
    second.remove(&mut s.rt).await;
}

/// A hook that makes CreateContainer ~300 KB (three 100 KB env vars): the edited body is larger
/// than containerd's initial flow-control windows (64 KiB), so the proxy sends it on the call's
/// own stream in window-sized parts as containerd grants room; three pods in a row on one
/// client connection show the windows' books stay right (a proxy that overran a window would
/// get FLOW_CONTROL_ERROR, and one that lost credit would stall).
#[tokio::test]
async fn an_edited_request_larger_than_the_runtimes_window_reaches_it_whole() {
    let mut s = setup();
    let big = TestHook::echoing(|stage, resp| {
        if stage == "PreCreateContainer" {
            for (i, c) in ["a", "b", "c"].iter().enumerate() {
                resp.container_envs.insert(format!("BIG{i}"), c.repeat(100_000));
            }
        }
    })
    .await;
    s.register("big.json", big.socket(), "Fail", &["PreCreateContainer"], json!({}));
    for round in 0..3 {
        let pod = s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(
            s.exec(&pod, "echo ${#BIG0} ${#BIG1} ${#BIG2} ${BIG2:99990} $KEEP").await,
            "100000 100000 100000 cccccccccc me"
        );
        pod.remove(&mut s.rt).await;
    }
}

#[tokio::test]
async fn servers_chain_in_order_each_seeing_the_changes_before_it() {
    let mut s = setup();
    // "z-first" has order 1 and "a-second" order 2: the order key beats the file name.
    let (first, second) = TestHook::chain_pair().await;
    s.register("z-first.json", first.socket(), "Fail", &["PreCreateContainer"], json!({"order": 1}));
    s.register("a-second.json", second.socket(), "Fail", &["PreCreateContainer"], json!({"order": 2}));
    let pod = s.pod(&[], &[]).await.expect("pod");
    assert_eq!(s.exec(&pod, "echo $CHAIN $KEEP").await, "first,second me");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "300");
    let Seen::Container(_, seen_by_second) = &second.seen()[0] else { panic!("container stage expected") };
    assert_eq!(seen_by_second.container_resources.as_ref().unwrap().cpu_shares, 300, "second saw first's change");
    pod.remove(&mut s.rt).await;
}

#[tokio::test]
async fn registration_files_take_effect_without_a_restart() {
    let mut s = setup();
    let hook = TestHook::echoing(|_, resp| {
        resp.container_envs.insert("HOOKED".into(), "yes".into());
    })
    .await;
    let pod = s.pod(&[], &[]).await.unwrap();
    assert_eq!(s.exec(&pod, "echo ${HOOKED:-no}").await, "no", "no server registered yet");

    s.register("live.json", hook.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let added = s.pod(&[], &[]).await.unwrap();
    assert_eq!(s.exec(&added, "echo ${HOOKED:-no}").await, "yes", "added file takes effect");

    // Rewritten in place (koordlet's truncate + write) without PreCreateContainer.
    let before = s.proxy.count_log(&["hook server updated", "file=live.json"]);
    std::fs::write(
        s.dir.path().join("live.json"),
        json!({"remote-endpoint": hook.socket(), "runtime-hooks": ["PreStartContainer"]}).to_string(),
    )
    .unwrap();
    assert!(s.proxy.wait_log(&["hook server updated", "file=live.json"], before));
    let changed = s.pod(&[], &[]).await.unwrap();
    assert_eq!(s.exec(&changed, "echo ${HOOKED:-no}").await, "no", "changed file takes effect");

    s.register("live.json", hook.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let before = s.proxy.count_log(&["hook server removed", "file=live.json"]);
    std::fs::remove_file(s.dir.path().join("live.json")).unwrap();
    assert!(s.proxy.wait_log(&["hook server removed", "file=live.json"], before));
    let removed = s.pod(&[], &[]).await.unwrap();
    assert_eq!(s.exec(&removed, "echo ${HOOKED:-no}").await, "no", "removed file takes effect");
    for p in [pod, added, changed, removed] {
        p.remove(&mut s.rt).await;
    }
}

#[tokio::test]
async fn malformed_files_are_reported_and_survived() {
    let mut s = setup();
    let hook = TestHook::echoing(|_, resp| {
        resp.container_envs.insert("GOOD".into(), "1".into());
    })
    .await;
    s.register("good.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    // (A policy that cannot be read is not a rejection: the server is registered with Fail and a
    // WARN; this one lists no stage, so it is never called.)
    for (name, content, reported) in [
        ("garbage.json", "{{{ not json", "rejected"),
        ("empty.json", "", "rejected"),
        ("bad-policy.json", r#"{"remote-endpoint": "/x.sock", "failure-policy": "Sometimes"}"#, "so Fail is used"),
        ("no-endpoint.json", r#"{"runtime-hooks": ["PreCreateContainer"]}"#, "rejected"),
    ] {
        let before = s.proxy.count_log(&[reported, &format!("file={name}")]);
        std::fs::write(s.dir.path().join(name), content).unwrap();
        assert!(
            s.proxy.wait_log(&[reported, &format!("file={name}")], before),
            "{name} not reported:\n{}",
            s.proxy.log()
        );
    }
    // A good file rewritten half-way keeps its last good version.
    std::fs::write(s.dir.path().join("good.json"), "{\"remote-endpoint\": ").unwrap();
    assert!(s.proxy.wait_log(&["rejected", "file=good.json"], 0));
    let pod = s.pod(&[], &[]).await.expect("pod");
    assert_eq!(s.exec(&pod, "echo ${GOOD:-0}").await, "1", "last good version of good.json still called");
    pod.remove(&mut s.rt).await;
}

#[tokio::test]
async fn skip_label_exempts_hook_servers_own_pods() {
    let mut s = setup();
    let hook = TestHook::start(
        std::sync::Arc::new(|_, _| Err(tonic::Status::unavailable("refusing everything"))),
        std::sync::Arc::new(|_, _| Err(tonic::Status::unavailable("refusing everything"))),
    )
    .await;
    s.register(
        "refuse.json",
        hook.socket(),
        "Fail",
        &["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"],
        json!({}),
    );
    // In kube-system, one of --runtime-hook-server-namespaces' default namespaces (no_escape.rs
    // has the other namespaces).
    let labels = HashMap::from([("runtimeproxy.koordinator.sh/skip-hookserver".to_string(), "true".to_string())]);
    let mut sandbox = sandbox_config(&s.env, &unique("skip"), labels, HashMap::new());
    sandbox.metadata.as_mut().unwrap().namespace = "kube-system".into();
    let container = container_config(&s.env, "main", &["sleep", "3600"], None, &[]);
    let pod = Pod::start(&mut s.rt, sandbox, container).await.expect("a pod with the skip label runs");
    assert!(hook.seen().is_empty(), "no hook called: {:?}", hook.seen());
    assert!(s.pod(&[], &[]).await.is_err(), "other pods are refused");
    pod.remove(&mut s.rt).await;
}

#[tokio::test]
async fn id_only_stages_get_pod_and_container_info_from_the_store() {
    let mut s = setup();
    let hook = TestHook::echoing(|_, _| {}).await;
    let stages = [
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
        "PostStopPodSandbox",
    ];
    s.register("observer.json", hook.socket(), "Fail", &stages, json!({}));
    let pod = s.pod(&[("team", "storage")], &[("app", "db")]).await.expect("pod");
    s.rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 256, ..Default::default() }),
        ..Default::default()
    })
    .await
    .unwrap();
    let (cid, parent) = (pod.container_id.clone(), pod.cgroup_parent());
    pod.remove(&mut s.rt).await;

    let seen = hook.seen();
    let stages_seen: Vec<&str> = seen.iter().map(|s| s.stage()).collect();
    assert_eq!(stages_seen, stages, "every stage once, in life-cycle order");
    for call in &seen {
        match call {
            Seen::Container(stage, req) => {
                assert_eq!(req.container_meta.as_ref().unwrap().id, cid, "{stage}: bare container ID");
                assert_eq!(req.pod_cgroup_parent, parent, "{stage}");
                assert_eq!(req.pod_labels.get("app").map(String::as_str), Some("db"), "{stage}");
                assert_eq!(req.pod_annotations.get("team").map(String::as_str), Some("storage"), "{stage}");
                assert!(
                    req.container_envs.is_empty(),
                    "{stage}: envs only at PreCreateContainer: {:?}",
                    req.container_envs
                );
                let shares = req.container_resources.as_ref().unwrap().cpu_shares;
                let want =
                    if stage == "PreUpdateContainerResources" || stage == "PostStopContainer" { 256 } else { 512 };
                assert_eq!(shares, want, "{stage}: resources as last set");
            }
            Seen::Pod(stage, req) => {
                assert_eq!(req.cgroup_parent, parent, "{stage}");
                assert_eq!(req.labels.get("app").map(String::as_str), Some("db"), "{stage}");
            }
        }
    }
}

#[tokio::test]
async fn a_store_miss_asks_the_runtime_before_calling_hooks() {
    let mut s = setup();
    assert!(s.proxy.wait_log(&["store recovered"], 0), "start-up recovery done:\n{}", s.proxy.log());
    let hook = TestHook::echoing(|_, _| {}).await;
    s.register(
        "observer.json",
        hook.socket(),
        "Fail",
        &["PreUpdateContainerResources", "PostStopContainer"],
        json!({}),
    );

    // A pod created directly on containerd after the proxy started: its store has never seen it.
    let mut direct = runtime_client(&s.env.socket);
    let labels = [("app".to_string(), "direct".to_string())].into();
    let sandbox = sandbox_config(&s.env, &unique("direct"), labels, HashMap::new());
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me")]);
    let pod = Pod::start(&mut direct, sandbox, container).await.expect("pod on containerd");

    s.rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources { cpu_shares: 256, ..Default::default() }),
        ..Default::default()
    })
    .await
    .expect("update through the proxy");
    let (cid, parent) = (pod.container_id.clone(), pod.cgroup_parent());
    pod.remove(&mut s.rt).await;

    let seen = hook.seen();
    assert_eq!(
        seen.iter().map(Seen::stage).collect::<Vec<_>>(),
        ["PreUpdateContainerResources", "PostStopContainer"],
        "hooks not skipped"
    );
    let Seen::Container(_, req) = &seen[0] else { panic!("container stage expected") };
    assert_eq!(req.container_meta.as_ref().unwrap().id, cid);
    assert_eq!(req.pod_cgroup_parent, parent);
    assert_eq!(req.pod_labels.get("app").map(String::as_str), Some("direct"));
    assert!(req.container_envs.is_empty(), "envs are not recovered: {:?}", req.container_envs);
    assert_eq!(req.container_resources.as_ref().unwrap().cpu_shares, 256, "kubelet's update merged in");
    assert!(s.proxy.log().contains("store miss: container recovered from the runtime"));
}

// ---------------------------------------------------------------------------------------------
// A hook server that floods the proxy's pooled connections.

/// A hostile hook server on threads of its own, at `path`: on every connection it answers the
/// first call (an empty message: no changes), then sends 400 PINGs 50 µs apart — the proxy
/// acknowledges each alone until its socket is full — and then PINGs as fast as it can,
/// never reading, until the proxy closes the connection (or 60 s pass). Returns how many calls
/// it answered.
fn flooding_hook(path: &Path) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use runtime_proxy::http2::frame::{self, flag, kind, Head, DEFAULT_MAX_FRAME, HEAD_LEN};
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;

    fn read_request(s: &mut std::os::unix::net::UnixStream) -> std::io::Result<()> {
        s.read_exact(&mut [0; 24])?;
        loop {
            let mut h = [0; HEAD_LEN];
            s.read_exact(&mut h)?;
            let head = Head::parse(&h);
            s.read_exact(&mut vec![0; head.len])?;
            if head.stream == 1 && head.has(flag::END_STREAM) {
                return Ok(());
            }
        }
    }
    fn ping(out: &mut bytes::BytesMut) {
        frame::ping(out, false, &[7; 8]);
    }

    let mut answer = bytes::BytesMut::new();
    frame::settings(&mut answer, &[]);
    let mut block = bytes::BytesMut::new();
    frame::put_status(&mut block, 200);
    frame::put_literal(&mut block, b"content-type", b"application/grpc");
    frame::put_headers(&mut answer, 1, false, &block, DEFAULT_MAX_FRAME);
    frame::put_data(&mut answer, 1, &bytes::Bytes::from_static(&[0; 5]), false, DEFAULT_MAX_FRAME);
    let mut trailers = bytes::BytesMut::new();
    frame::put_literal(&mut trailers, b"grpc-status", b"0");
    frame::put_headers(&mut answer, 1, true, &trailers, DEFAULT_MAX_FRAME);
    let (mut one, mut flood) = (bytes::BytesMut::new(), bytes::BytesMut::new());
    ping(&mut one);
    (0..64).for_each(|_| ping(&mut flood));
    assert_eq!(Head::parse(&one).kind, kind::PING);

    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = answered.clone();
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let (answer, one, flood, counted) = (answer.clone(), one.clone(), flood.clone(), counted.clone());
            std::thread::spawn(move || {
                if read_request(&mut s).is_err() || s.write_all(&answer).is_err() {
                    return;
                }
                counted.fetch_add(1, Ordering::SeqCst);
                for _ in 0..400 {
                    if s.write_all(&one).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(60) && s.write_all(&flood).is_ok() {}
            });
        }
    });
    answered
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap()
}

/// A hook server (failure policy `Fail`, at PreRunPodSandbox) that floods each connection with PINGs once it has
/// answered and never reads: while four pods start through it, Version and ListPodSandbox keep answering within a
/// second, the proxy's RSS stays under 200 MB, each flooded connection is dropped with a WARN (within milliseconds,
/// long before the next pod), and every pod's hook call — each on a new connection — succeeds. Before the hook client
/// bounded what a server can make it hold, the proxy's memory grew by gigabytes within a minute and CRI calls stalled
/// for seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_server_flooding_its_idle_connections_is_cut_off() {
    let mut s = setup();
    let socket = s.dir.path().join("flood.sock");
    let answered = flooding_hook(&socket);
    s.register("flood.json", &socket, "Fail", &["PreRunPodSandbox"], json!({"timeout-ms": 5000}));

    let pid = s.proxy.pid();
    let rss_before = vm_rss_kib(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probing = done.clone();
    let mut probe_rt = runtime_client(s.proxy.socket());
    let probe = tokio::spawn(async move {
        let (mut slowest, mut max_rss, mut calls) = (Duration::ZERO, 0, 0);
        while !probing.load(std::sync::atomic::Ordering::SeqCst) {
            let started = Instant::now();
            probe_rt.version(cri::VersionRequest::default()).await.expect("Version");
            probe_rt.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await.expect("ListPodSandbox");
            slowest = slowest.max(started.elapsed());
            max_rss = max_rss.max(vm_rss_kib(pid));
            calls += 1;
            assert!(max_rss < 200 << 10, "the proxy's RSS reached {max_rss} KiB");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (slowest, max_rss, calls)
    });

    let mut pods = Vec::new();
    for n in 1..=4 {
        pods.push(s.pod(&[], &[]).await.unwrap_or_else(|e| panic!("pod {n}: {e:?}\n{}", s.proxy.log())));
    }
    // The last connection's flood, as the pods' did.
    tokio::time::sleep(Duration::from_secs(1)).await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (slowest, max_rss, calls) = probe.await.expect("the probe's assertions held");
    for pod in pods {
        pod.remove(&mut s.rt).await;
    }
    let log = s.proxy.log();
    let drops: Vec<&str> =
        log.lines().filter(|l| l.contains("idle hook server connection dropped") && l.contains("flood.sock")).collect();
    let dropped = drops.len();
    eprintln!("{}", drops.join("\n"));
    eprintln!(
        "{calls} probes, slowest {slowest:?}; RSS {rss_before} KiB before, at most {max_rss} KiB; {} hook calls answered, \
         {dropped} connections dropped",
        answered.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(slowest < Duration::from_secs(1), "a Version + ListPodSandbox probe took {slowest:?}");
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 4, "a hook call a pod, each on a new connection");
    assert!(dropped >= 4, "flooded connections dropped with a WARN:\n{}", s.proxy.log());
}
