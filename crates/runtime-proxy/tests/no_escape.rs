//! No pod escapes its hook servers: on a real containerd, with a hook server whose gRPC side we
//! did not write (tests/clients/hook_server.py, Python grpcio: its protobuf runtime refuses a
//! request whose `string` holds bytes that are not UTF-8, as Go's does):
//!
//! * a container with an env value and a pod with an annotation value that are not UTF-8 (what
//!   kubelet sends for a Secret holding binary data) get their hooks, under `Fail` and under
//!   `Ignore`: the hook's label, env, annotation and cpu shares are applied, and the binary value
//!   reaches the container and containerd exactly as it does without the proxy;
//! * such a pod made around the proxy is still read from the runtime at a store miss;
//! * a request made undecodable on purpose (a truncated field) is refused with
//!   `INVALID_ARGUMENT` under `Fail`, and forwarded to the runtime under `Ignore`, with a WARN
//!   and `runtime_proxy_undecodable_requests_total`;
//! * the skip label is honoured only in the namespaces `--runtime-hook-server-namespaces` lists.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prost::Message;
use runtime_proxy::cri::hooked_fields;
use serde_json::json;
use test_support::clients::PyHookServer;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd};
use test_support::hooks::register;
use test_support::proxy::ProxyProcess;
use test_support::raw::{self, NOT_UTF8};
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// A proxy on the real containerd with tests/clients/hook_server.py registered.
struct Setup {
    env: Containerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
    hook: PyHookServer,
}

fn setup(policy: &str, stages: &[&str], extra_flags: &[&str]) -> Setup {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-escape").tempdir().unwrap();
    let configs = dir.path().join("hookserver.d");
    std::fs::create_dir(&configs).unwrap();
    let mut flags = vec!["--hook-config-dir", configs.to_str().unwrap()];
    flags.extend_from_slice(extra_flags);
    let proxy = ProxyProcess::start(BIN, &env.socket, &flags);
    let hook = PyHookServer::start(dir.path());
    let s = Setup { env, dir, proxy, hook };
    s.register(policy, stages);
    s
}

impl Setup {
    /// (Re-)registers the Python hook server with `policy` and waits until the proxy has it.
    fn register(&self, policy: &str, stages: &[&str]) {
        let seen = ["hook server", "file=py-hook.json", &format!("failure_policy={policy}")];
        let before = self.proxy.count_log(&seen);
        register(&self.dir.path().join("hookserver.d"), "py-hook.json", &self.hook.socket, policy, stages, json!({}));
        assert!(
            self.proxy.wait_log(&seen, before),
            "the proxy did not take up py-hook.json ({policy}):\n{}",
            self.proxy.log()
        );
    }

    fn context(&self) -> String {
        format!("proxy log:\n{}\nhook_server.py:\n{}", self.proxy.log(), self.hook.output())
    }

    fn metric(&self, line_start: &str) -> Option<String> {
        let (code, body) = self.proxy.admin_get("/metrics");
        assert_eq!(code, 200);
        body.lines().find(|l| l.starts_with(line_start)).map(str::to_owned)
    }
}

/// A pod sandbox and container as kubelet asks for them, with a pod annotation `bin` and a container env `SECRET` whose
/// values are [`NOT_UTF8`], sent raw to `socket` (k8s-cri's `String`s cannot hold them): RunPodSandbox,
/// CreateContainer, StartContainer. Returns (sandbox ID, container ID, pod cgroup parent) or the first failing call's
/// status.
async fn binary_pod(env: &Containerd, socket: &Path, name: &str) -> Result<(String, String, String), tonic::Status> {
    let sandbox =
        sandbox_config(env, name, HashMap::new(), HashMap::from([("bin".to_string(), "PODPLACE".to_string())]));
    let parent = sandbox.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default();
    let run = cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() };
    let run = raw::with_bytes(&run.encode_to_vec(), "PODPLACE", NOT_UTF8);
    let answer =
        raw::unary(test_support::channel(socket), "/runtime.v1.RuntimeService/RunPodSandbox", tonic::Request::new(run))
            .await?;
    let sandbox_id =
        cri::RunPodSandboxResponse::decode(answer.into_inner()).expect("RunPodSandboxResponse").pod_sandbox_id;
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    let container =
        container_config(env, "main", &["sleep", "3600"], Some(resources), &[("SECRET", "ENVPLACE"), ("KEEP", "me")]);
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.clone(),
        config: Some(container),
        sandbox_config: Some(sandbox),
    };
    let create = raw::with_bytes(&raw::with_bytes(&create.encode_to_vec(), "ENVPLACE", NOT_UTF8), "PODPLACE", NOT_UTF8);
    let created = raw::unary(
        test_support::channel(socket),
        "/runtime.v1.RuntimeService/CreateContainer",
        tonic::Request::new(create),
    )
    .await;
    let mut rt = test_support::runtime_client(socket);
    let container_id = match created {
        Ok(a) => cri::CreateContainerResponse::decode(a.into_inner()).expect("CreateContainerResponse").container_id,
        Err(e) => {
            remove_sandbox(&mut rt, &sandbox_id).await;
            return Err(e);
        }
    };
    if let Err(e) = rt.start_container(cri::StartContainerRequest { container_id: container_id.clone() }).await {
        remove_sandbox(&mut rt, &sandbox_id).await;
        return Err(e);
    }
    Ok((sandbox_id, container_id, parent))
}

/// What containerd and the container itself report of a pod: the sandbox's labels and its
/// annotation `bin` as bytes, the container's annotations, its env (`printenv` of every
/// variable, as bytes) and its cpu shares.
#[derive(Debug)]
struct Seen {
    labels: std::collections::BTreeMap<String, Vec<u8>>,
    pod_bin: Option<Vec<u8>>,
    container_annotations: std::collections::BTreeMap<String, Vec<u8>>,
    env: Vec<u8>,
    secret: Vec<u8>,
    cpu_shares: String,
}

async fn seen(env: &Containerd, sandbox_id: &str, container_id: &str, cgroup_parent: &str) -> Seen {
    let direct = || test_support::channel(&env.socket);
    let status = cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.into(), verbose: false };
    let status = raw::unary(
        direct(),
        "/runtime.v1.RuntimeService/PodSandboxStatus",
        tonic::Request::new(Bytes::from(status.encode_to_vec())),
    )
    .await
    .expect("PodSandboxStatus");
    let status = hooked_fields::PodSandboxStatusResponse::decode(status.into_inner())
        .expect("status view")
        .status
        .unwrap_or_default();
    let container = cri::ContainerStatusRequest { container_id: container_id.into(), verbose: false };
    let container = raw::unary(
        direct(),
        "/runtime.v1.RuntimeService/ContainerStatus",
        tonic::Request::new(Bytes::from(container.encode_to_vec())),
    )
    .await
    .expect("ContainerStatus");
    let container = hooked_fields::ContainerStatusResponse::decode(container.into_inner())
        .expect("status view")
        .status
        .unwrap_or_default();
    let exec = |cmd: &[&str]| {
        let mut rt = test_support::runtime_client(&env.socket);
        let req = cri::ExecSyncRequest {
            container_id: container_id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            timeout: 10,
        };
        async move { rt.exec_sync(req).await.expect("ExecSync").into_inner().stdout }
    };
    let env_out = exec(&["env"]).await;
    let secret = exec(&["sh", "-c", "printf %s \"$SECRET\""]).await;
    let shares = format!("/sys/fs/cgroup/cpu{cgroup_parent}/{container_id}/cpu.shares");
    Seen {
        labels: status.labels,
        pod_bin: status.annotations.get("bin").cloned(),
        container_annotations: container.annotations,
        env: env_out,
        secret,
        cpu_shares: std::fs::read_to_string(&shares)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|e| format!("{shares}: {e}")),
    }
}

async fn remove(client: &mut RuntimeServiceClient<Channel>, sandbox_id: &str) {
    remove_sandbox(client, sandbox_id).await;
}

/// The binary values go through the hook path untouched, and the hooks apply: under `policy`.
async fn binary_values_keep_their_hooks(policy: &str) {
    let s = setup(policy, &["PreRunPodSandbox", "PreCreateContainer"], &[]);
    let (through, direct) = (unique("bin-proxy"), unique("bin-direct"));
    let (sb, c, parent) = binary_pod(&s.env, s.proxy.socket(), &through)
        .await
        .unwrap_or_else(|e| panic!("the pod through the proxy ({policy}): {e:?}\n{}", s.context()));
    let (dsb, dc, direct_parent) =
        binary_pod(&s.env, &s.env.socket, &direct).await.expect("the same pod directly on containerd");
    let got = seen(&s.env, &sb, &c, &parent).await;
    let want = seen(&s.env, &dsb, &dc, &direct_parent).await;
    let mut rt = test_support::runtime_client(&s.env.socket);
    remove(&mut rt, &sb).await;
    remove(&mut rt, &dsb).await;

    // The hook server was called at both stages and answered; its changes are on the pod.
    assert_eq!(s.hook.stages_of(&through), ["PreRunPodSandbox", "PreCreateContainer"], "{}", s.context());
    let create = s
        .hook
        .calls()
        .into_iter()
        .find(|c| c["pod"] == through.as_str() && c["stage"] == "PreCreateContainer")
        .unwrap();
    assert_eq!(create["envs"], json!(["KEEP"]), "the binary env is left out of the hook request, the rest is there");
    assert!(!create["pod_annotations"].as_array().unwrap().iter().any(|a| a == "bin"), "{create}");
    assert_eq!(got.labels.get("py-hook").map(Vec::as_slice), Some(&b"yes"[..]), "the hook's label: {got:?}");
    assert_eq!(got.container_annotations.get("py-hook/annotated").map(Vec::as_slice), Some(&b"yes"[..]), "{got:?}");
    assert_eq!(got.cpu_shares, "333", "the hook's cpu shares, not the 512 asked for");
    let env = String::from_utf8_lossy(&got.env);
    assert!(env.lines().any(|l| l == "PY_HOOK=grpcio") && env.lines().any(|l| l == "KEEP=me"), "{env}");
    // ... and the binary values reached containerd and the container as they do without the proxy.
    assert_eq!(got.secret, want.secret, "SECRET in the container: through the proxy vs directly");
    assert!(!got.secret.is_empty());
    assert_eq!(got.pod_bin, want.pod_bin, "the pod annotation as containerd stores it");
    assert!(want.pod_bin.is_some());
    eprintln!(
        "{policy}: SECRET in the container {:?}; annotation as containerd reports it {:?}",
        got.secret, got.pod_bin
    );
    assert!(want.cpu_shares == "512" && !want.labels.contains_key("py-hook"), "the direct pod is unhooked: {want:?}");
}

#[tokio::test]
async fn binary_values_keep_their_hooks_under_fail() {
    binary_values_keep_their_hooks("Fail").await;
}

#[tokio::test]
async fn binary_values_keep_their_hooks_under_ignore() {
    binary_values_keep_their_hooks("Ignore").await;
}

/// A pod whose annotation is not UTF-8, made around the proxy, is read from the runtime at the
/// proxy's store miss (its status decodes: the log line says so), so its container's hooks run.
/// (The request keeps its `sandbox_config`, as kubelet's always does: containerd 1.6 dereferences
/// it without a check.)
#[tokio::test]
async fn a_binary_pod_made_around_the_proxy_is_read_from_the_runtime() {
    let s = setup("Fail", &["PreCreateContainer"], &[]);
    let name = unique("bin-miss");
    // The sandbox directly on containerd, the container through the proxy.
    let sandbox =
        sandbox_config(&s.env, &name, HashMap::new(), HashMap::from([("bin".to_string(), "PODPLACE".to_string())]));
    let run = cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() };
    let run = raw::with_bytes(&run.encode_to_vec(), "PODPLACE", NOT_UTF8);
    let answer = raw::unary(
        test_support::channel(&s.env.socket),
        "/runtime.v1.RuntimeService/RunPodSandbox",
        tonic::Request::new(run),
    )
    .await
    .expect("RunPodSandbox on containerd");
    let sandbox_id = cri::RunPodSandboxResponse::decode(answer.into_inner()).unwrap().pod_sandbox_id;
    let container = container_config(&s.env, "main", &["sleep", "3600"], None, &[("KEEP", "me")]);
    let create = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.clone(),
        config: Some(container),
        sandbox_config: Some(sandbox),
    };
    let create = raw::with_bytes(&create.encode_to_vec(), "PODPLACE", NOT_UTF8);
    let created = raw::unary(
        test_support::channel(s.proxy.socket()),
        "/runtime.v1.RuntimeService/CreateContainer",
        tonic::Request::new(create),
    )
    .await;
    let mut rt = test_support::runtime_client(&s.env.socket);
    remove(&mut rt, &sandbox_id).await;
    created.unwrap_or_else(|e| panic!("CreateContainer through the proxy: {e:?}\n{}", s.context()));
    assert_eq!(
        s.hook.stages_of(&name),
        ["PreCreateContainer"],
        "the hook got the pod from the runtime\n{}",
        s.context()
    );
    assert!(s.proxy.log().contains("store miss: pod sandbox recovered from the runtime"), "{}", s.context());
}

/// A CreateContainer whose `config` ends in a truncated field: no one can decode it.
fn truncated_create(sandbox_id: &str, env: &Containerd) -> Bytes {
    let container = container_config(env, "main", &["sleep", "3600"], None, &[]);
    let mut bytes = cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.into(),
        config: Some(container),
        sandbox_config: None,
    }
    .encode_to_vec();
    // One more `config` record (field 2) holding an `annotations` record (field 10) that claims
    // 5 bytes and has none: protobuf merges it into the config, and reading it runs out.
    bytes.extend_from_slice(&[0x12, 0x02, 0x52, 0x05]);
    Bytes::from(bytes)
}

#[tokio::test]
async fn an_undecodable_request_is_refused_under_fail_and_forwarded_under_ignore() {
    let s = setup("Fail", &["PreCreateContainer"], &[]);
    let mut rt = test_support::runtime_client(s.proxy.socket());
    let sandbox = sandbox_config(&s.env, &unique("truncated"), HashMap::new(), HashMap::new());
    let sandbox_id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox), runtime_handler: String::new() })
        .await
        .expect("RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let create = |socket: &Path| {
        let channel = test_support::channel(socket);
        let body = truncated_create(&sandbox_id, &s.env);
        async move { raw::unary(channel, "/runtime.v1.RuntimeService/CreateContainer", tonic::Request::new(body)).await }
    };

    // Fail: refused by the proxy, naming the method, the server, the field and the reason.
    let refused = create(s.proxy.socket()).await.expect_err("refused under Fail");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    for part in ["CreateContainer", "py-hook.json", "failure-policy Fail", "ContainerConfig.annotations", &sandbox_id] {
        assert!(refused.message().contains(part), "{part:?} missing from {:?}", refused.message());
    }
    assert!(s.hook.calls().iter().all(|c| c["stage"] != "PreCreateContainer"), "no hook was called");

    // Ignore: forwarded unchanged; the runtime answers it as it answers it directly.
    s.register("Ignore", &["PreCreateContainer"]);
    let forwarded = create(s.proxy.socket()).await;
    let direct = create(&s.env.socket).await;
    let mut direct_rt = test_support::runtime_client(&s.env.socket);
    remove(&mut direct_rt, &sandbox_id).await;
    let (forwarded, direct) = (forwarded.map(|a| a.into_inner()), direct.map(|a| a.into_inner()));
    match (&forwarded, &direct) {
        (Err(f), Err(d)) => assert_eq!((f.code(), f.message()), (d.code(), d.message()), "the runtime's own answer"),
        _ => panic!("containerd accepted a truncated request? through the proxy {forwarded:?}, directly {direct:?}"),
    }
    assert!(
        s.proxy.log().lines().any(|l| l.contains("WARN")
            && l.contains("cannot decode the request: forwarded unchanged")
            && l.contains(&sandbox_id)),
        "{}",
        s.context()
    );
    assert_eq!(
        s.metric("runtime_proxy_undecodable_requests_total{method=\"CreateContainer\"}").as_deref(),
        Some("runtime_proxy_undecodable_requests_total{method=\"CreateContainer\"} 2"),
        "one refused, one forwarded"
    );
}

/// The skip label: honoured in `kube-system` (one of the default namespaces), ignored with a
/// WARN and a count in `default`, where the `Fail` hook server then decides.
#[tokio::test]
async fn the_skip_label_works_only_in_the_allowed_namespaces() {
    let s = setup("Fail", &["PreRunPodSandbox", "PreCreateContainer"], &[]);
    let mut rt = test_support::runtime_client(s.proxy.socket());
    let skip = HashMap::from([("runtimeproxy.koordinator.sh/skip-hookserver".to_string(), "true".to_string())]);
    let mut pods = Vec::new();
    for namespace in ["kube-system", "default"] {
        let name = unique("skip");
        let mut sandbox = sandbox_config(&s.env, &name, skip.clone(), HashMap::new());
        sandbox.metadata.as_mut().unwrap().namespace = namespace.into();
        let id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox), runtime_handler: String::new() })
            .await
            .unwrap_or_else(|e| panic!("{namespace}: {e:?}"))
            .into_inner()
            .pod_sandbox_id;
        pods.push((namespace, name, id));
    }
    let labels = |id: &str| {
        let mut direct = test_support::runtime_client(&s.env.socket);
        let id = id.to_owned();
        async move {
            direct
                .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: id, verbose: false })
                .await
                .unwrap()
                .into_inner()
                .status
                .unwrap()
                .labels
        }
    };
    let (kube_system, default) = (labels(&pods[0].2).await, labels(&pods[1].2).await);
    // One RunPodSandbox in `default` so far (each later call of that pod counts too).
    let ignored = s.metric("runtime_proxy_skip_label_ignored_total");
    for (_, _, id) in &pods {
        remove(&mut rt, id).await;
    }
    assert!(s.hook.stages_of(&pods[0].1).is_empty() && !kube_system.contains_key("py-hook"), "kube-system may skip");
    assert_eq!(s.hook.stages_of(&pods[1].1), ["PreRunPodSandbox"], "default may not");
    assert_eq!(default.get("py-hook").map(String::as_str), Some("yes"));
    assert!(
        s.proxy
            .log()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("skip label ignored") && l.contains("namespace=\"default\"")),
        "{}",
        s.context()
    );
    assert_eq!(ignored.as_deref(), Some("runtime_proxy_skip_label_ignored_total 1"));
}

/// `--runtime-hook-server-namespaces ""`: no namespace may skip.
#[tokio::test]
async fn no_namespace_may_skip_when_none_is_listed() {
    let s = setup("Fail", &["PreRunPodSandbox"], &["--runtime-hook-server-namespaces", ""]);
    let mut rt = test_support::runtime_client(s.proxy.socket());
    let name = unique("skip-none");
    let skip = HashMap::from([("runtimeproxy.koordinator.sh/skip-hookserver".to_string(), "true".to_string())]);
    let mut sandbox = sandbox_config(&s.env, &name, skip, HashMap::new());
    sandbox.metadata.as_mut().unwrap().namespace = "koordinator-system".into();
    let id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox), runtime_handler: String::new() })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    remove(&mut rt, &id).await;
    assert_eq!(s.hook.stages_of(&name), ["PreRunPodSandbox"]);
}

/// A container whose request is over 4 MiB (kubelet copies the preStop handler into the
/// `io.kubernetes.container.preStopHandler` annotation, each `<` JSON-escaped to six bytes): a
/// koordlet-like hook server that accepts 16 MiB, as kubelet sends, echoes it all back and its
/// change applies (the proxy's answer limit is 16 MiB too); one that keeps gRPC's default 4 MiB
/// refuses it, and its failure policy decides: the pod runs under `Ignore`, is refused under
/// `Fail`, and both the log line and the status name the request's size.
#[tokio::test]
async fn requests_over_4_mib_reach_hooks_and_a_refusal_is_the_policys() {
    use std::sync::Arc;
    use test_support::hooks::TestHook;

    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-large").tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let registered = |name: &str, socket: &Path, policy: &str| {
        let seen = ["hook server", &format!("file={name}"), &format!("failure_policy={policy}")];
        let before = proxy.count_log(&seen);
        register(dir.path(), name, socket, policy, &["PreCreateContainer"], json!({}));
        assert!(proxy.wait_log(&seen, before), "{name} not taken up:\n{}", proxy.log());
    };
    let echo_700: test_support::hooks::ContainerFn = Arc::new(|_, req| {
        let mut resp = hook_api::merge::echo_container(req);
        resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 700;
        Ok(resp)
    });
    let echo_pod: test_support::hooks::PodFn = Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req)));
    let large = TestHook::start_with_limit(echo_700.clone(), echo_pod.clone(), 16 << 20).await;
    let small = TestHook::start(echo_700, echo_pod).await;
    let pre_stop = format!("{{\"exec\":{{\"command\":[\"sh\",\"-c\",\"{}\"]}}}}", "\\u003c".repeat((5 << 20) / 6 + 1));
    let mut rt = test_support::runtime_client(proxy.socket());
    let pod = |name: &str| {
        let sandbox = sandbox_config(&env, &unique(name), HashMap::new(), HashMap::new());
        let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
        let mut container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[]);
        container.annotations.insert("io.kubernetes.container.preStopHandler".into(), pre_stop.clone());
        (sandbox, container)
    };

    // 16 MiB server, Fail: the hook's cpu shares on a > 5 MiB request.
    registered("large.json", large.socket(), "Fail");
    let (sandbox, container) = pod("large");
    let started = test_support::containerd::Pod::start(&mut rt, sandbox, container).await;
    let started = started
        .unwrap_or_else(|e| panic!("a 5 MiB request through a 16 MiB hook server: {:?}\n{}", e.code(), proxy.log()));
    assert_eq!(started.cgroup_file("cpu", "cpu.shares"), "700");
    started.remove(&mut rt).await;
    let removed = ["hook server removed", "file=large.json"];
    let before = proxy.count_log(&removed);
    std::fs::remove_file(dir.path().join("large.json")).unwrap();
    assert!(proxy.wait_log(&removed, before), "{}", proxy.log());

    // 4 MiB server, Ignore: the pod runs without its change, the log names the size.
    registered("small.json", small.socket(), "Ignore");
    let (sandbox, container) = pod("small-ignore");
    let started =
        test_support::containerd::Pod::start(&mut rt, sandbox, container).await.expect("Ignore: the pod runs");
    assert_eq!(started.cgroup_file("cpu", "cpu.shares"), "512");
    started.remove(&mut rt).await;
    let warned = proxy.log().lines().any(|l| {
        l.contains("WARN") && l.contains("small.json") && l.contains("the request was") && l.contains("request_bytes=")
    });
    assert!(warned, "{}", proxy.log());

    // 4 MiB server, Fail: refused, the status names the size.
    registered("small.json", small.socket(), "Fail");
    let (sandbox, container) = pod("small-fail");
    let err = test_support::containerd::Pod::start(&mut rt, sandbox, container).await.expect_err("Fail: refused");
    // The server's own code: tonic says OUT_OF_RANGE, grpc-go RESOURCE_EXHAUSTED.
    assert!(matches!(err.code(), tonic::Code::ResourceExhausted | tonic::Code::OutOfRange), "{err:?}");
    assert!(err.message().contains("the request was") && err.message().contains("small.json"), "{}", err.message());
}
