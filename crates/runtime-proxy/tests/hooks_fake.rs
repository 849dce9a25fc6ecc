//! Hook behaviour real containerd cannot show, with an in-process fake backend recording the
//! exact bytes the proxy forwards: byte-identical forwarding of fields no hook changed (unknown
//! ones included), a hook server process that crashes, and the kubelet's deadline capping hooks.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use serde_json::json;
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::raw;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
/// Field 99 of CreateContainerRequest, unknown to every CRI version: a string "future".
const UNKNOWN_FIELD: [u8; 9] = [0x9a, 0x06, 6, b'f', b'u', b't', b'u', b'r', b'e'];

fn create_request() -> Vec<u8> {
    let req = cri::CreateContainerRequest {
        pod_sandbox_id: "sandbox-1".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 0 }),
            image: Some(cri::ImageSpec { image: "localhost/busybox:local".into(), ..Default::default() }),
            command: vec!["sleep".into(), "3600".into()],
            envs: vec![
                cri::KeyValue { key: "B".into(), value: "2".into() },
                cri::KeyValue { key: "A".into(), value: "1".into() },
            ],
            annotations: [("io.kubernetes.container.hash".to_string(), "abc".to_string())].into(),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_shares: 512,
                    memory_limit_in_bytes: 64 << 20,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "uid-1".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/burstable/poduid-1".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    let mut bytes = req.encode_to_vec();
    bytes.extend_from_slice(&UNKNOWN_FIELD);
    bytes
}

async fn backend() -> FakeBackend {
    FakeBackend::start(Behaviour::ok(&cri::CreateContainerResponse { container_id: "c1".into() }.encode_to_vec())).await
}

fn proxy(backend: &FakeBackend, dir: &std::path::Path) -> ProxyProcess {
    ProxyProcess::start(BIN, backend.socket(), &["--hook-config-dir", dir.to_str().unwrap()])
}

async fn create(proxy: &ProxyProcess, body: &[u8]) -> Result<tonic::Response<Bytes>, tonic::Status> {
    raw::unary(test_support::channel(proxy.socket()), CREATE, tonic::Request::new(Bytes::copy_from_slice(body))).await
}

#[tokio::test]
async fn untouched_requests_are_forwarded_byte_for_byte_and_edits_keep_unknown_fields() {
    let fake = backend().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let request = create_request();

    // A hook that echoes only: nothing changes, the original bytes go through.
    let echo = TestHook::echoing(|_, _| {}).await;
    let n = proxy.count_log(&["hook server added"]);
    register(dir.path(), "echo.json", echo.socket(), "Fail", &["PreCreateContainer"], json!({}));
    assert!(proxy.wait_log(&["hook server added"], n));
    create(&proxy, &request).await.expect("CreateContainer");
    assert_eq!(fake.calls_to(CREATE)[0].body, grpc_frame(&request), "byte-identical with an echoing hook");
    assert_eq!(echo.seen().len(), 1);

    // A hook that changes the CPU shares: only that field changes; the unknown field stays.
    let shares = TestHook::echoing(|_, resp| {
        resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 2048;
    })
    .await;
    let n = proxy.count_log(&["hook server added"]);
    register(dir.path(), "shares.json", shares.socket(), "Fail", &["PreCreateContainer"], json!({}));
    assert!(proxy.wait_log(&["hook server added"], n));
    create(&proxy, &request).await.expect("CreateContainer");
    let forwarded = fake.calls_to(CREATE)[1].body.slice(5..);
    assert!(forwarded.ends_with(&UNKNOWN_FIELD), "unknown field kept");
    let mut want = cri::CreateContainerRequest::decode(request.as_slice()).unwrap();
    want.config.as_mut().unwrap().linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_shares = 2048;
    assert_eq!(cri::CreateContainerRequest::decode(forwarded.clone()).unwrap(), want);
    // 512 and 2048 are both two-byte varints: everything else is in place, byte for byte.
    assert_eq!(forwarded.len(), request.len());
    let differing = forwarded.iter().zip(&request).filter(|(a, b)| a != b).count();
    assert_eq!(differing, 1, "only the second byte of the cpu_shares varint differs");
}

/// The runtime is woken once per intercepted call, for the whole request: the head of a call
/// whose pre stage is running waits in the proxy for its body, so it reaches the runtime with
/// it, not a hook's latency earlier.
#[tokio::test]
async fn an_intercepted_calls_head_reaches_the_runtime_with_its_body() {
    let fake = backend().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let echo = |_: &str, req: &_| Ok(hook_api::merge::echo_container(req));
    let slow = TestHook::start_with_delay(
        std::sync::Arc::new(echo),
        std::sync::Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
        Duration::from_millis(400),
    )
    .await;
    let n = proxy.count_log(&["hook server added"]);
    register(dir.path(), "slow.json", slow.socket(), "Fail", &["PreCreateContainer"], json!({}));
    assert!(proxy.wait_log(&["hook server added"], n));
    // The second call on the connection (the first one's head goes with the connection's
    // preface and SETTINGS, which go on at once).
    let channel = test_support::channel(proxy.socket());
    for _ in 0..2 {
        let started = Instant::now();
        raw::unary(channel.clone(), CREATE, tonic::Request::new(Bytes::from(create_request())))
            .await
            .expect("CreateContainer");
        assert!(started.elapsed() >= Duration::from_millis(400), "the hook ran");
    }
    let call = &fake.calls_to(CREATE)[1];
    let apart = call.whole_at - call.head_at;
    assert!(apart < Duration::from_millis(200), "head {apart:?} before the body: it went on while the hook ran");
}

#[tokio::test]
async fn a_crashed_hook_server_process_follows_its_failure_policy() {
    let fake = backend().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let socket = dir.path().join("hook.sock");
    let n = proxy.count_log(&["hook server added", "annotation-hook.json"]);
    let mut hook = Command::new(test_support::example_binary("annotation_hook"))
        .arg("--listen")
        .arg(&socket)
        .arg("--hook-config-dir")
        .arg(dir.path())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(proxy.wait_log(&["hook server added", "annotation-hook.json"], n));
    create(&proxy, &create_request()).await.expect("served by the live hook");
    hook.kill().unwrap(); // SIGKILL: the registration file stays, the socket is dead
    hook.wait().unwrap();

    // Ignore (the example's policy): the call goes on unchanged.
    create(&proxy, &create_request()).await.expect("Ignore: call goes on");
    assert!(proxy.log().lines().any(|l| l.contains("annotation-hook.json") && l.contains("failure-policy Ignore")));

    // The same registration with Fail: UNAVAILABLE naming the server.
    let n = proxy.count_log(&["hook server updated", "annotation-hook.json"]);
    register(dir.path(), "annotation-hook.json", &socket, "Fail", &["PreCreateContainer"], json!({}));
    assert!(proxy.wait_log(&["hook server updated", "annotation-hook.json"], n));
    let err = create(&proxy, &create_request()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("annotation-hook.json") && err.message().contains("PreCreateContainer"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn the_kubelet_deadline_caps_a_hook_servers_timeout() {
    let fake = backend().await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let hang = FakeBackend::start(Behaviour::Hang).await;
    let n = proxy.count_log(&["hook server added"]);
    register(dir.path(), "slow.json", hang.socket(), "Fail", &["PreCreateContainer"], json!({"timeout-ms": 60000}));
    assert!(proxy.wait_log(&["hook server added"], n));

    let started = Instant::now();
    let answer = raw::http2_call(proxy.socket(), CREATE, &[("grpc-timeout", "400m")], grpc_frame(&create_request()))
        .await
        .unwrap();
    assert_eq!(answer.grpc_status().as_deref(), Some("4"), "DEADLINE_EXCEEDED: {answer:?}");
    let message = answer.grpc_message().unwrap_or_default();
    assert!(message.contains("PreCreateContainer") && message.contains("slow.json"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(10), "bounded by the kubelet's 400 ms, not the hook's 60 s");
    assert!(fake.calls_to(CREATE).is_empty(), "refused calls never reach the runtime");
}

/// A hooked call whose HEADERS already end the stream (no message at all: not what gRPC
/// clients send, but valid HTTP/2): nothing may follow that END_STREAM to the runtime, so the
/// call goes on as it came and the client gets the runtime's answer — here one that takes
/// 200 ms, so the interceptor is done long before it.
#[tokio::test]
async fn a_hooked_call_without_a_body_gets_the_runtimes_answer() {
    let reply = cri::StartContainerResponse::default().encode_to_vec();
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: grpc_frame(&reply),
        trailers: vec![("grpc-status".into(), "0".into())],
        delay: Duration::from_millis(200),
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let start = "/runtime.v1.RuntimeService/StartContainer";
    let answer = raw::http2_call(proxy.socket(), start, &[], Bytes::new()).await.expect("an answer, not a reset");
    assert_eq!(answer.grpc_status().as_deref(), Some("0"), "{answer:?}");
    let calls = fake.calls_to(start);
    assert_eq!(calls.len(), 1);
    assert!(calls[0].body.is_empty(), "the runtime got the call as the client sent it");
}

const RESIZE: &str = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";

fn resources(cpu_shares: i64, memory_limit_in_bytes: i64) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources { cpu_shares, memory_limit_in_bytes, ..Default::default() }
}

/// Runs a pod with overhead 10 CPU shares and resources 512 shares / 128 MiB through `rt`;
/// returns its sandbox ID.
async fn run_resizable_pod(rt: &mut RuntimeClient) -> String {
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/burstable/poduid-1".into(),
            overhead: Some(resources(10, 0)),
            resources: Some(resources(512, 128 << 20)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let run = cri::RunPodSandboxRequest { config: Some(sandbox_config), runtime_handler: String::new() };
    rt.run_pod_sandbox(run).await.expect("RunPodSandbox").into_inner().pod_sandbox_id
}

type RuntimeClient = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

/// An UpdatePodSandboxResourcesRequest (`k8s-cri` 0.11 does not know it), with a field this
/// proxy does not read (4: an annotation map entry).
fn resize_request(
    sandbox_id: &str,
    overhead: &cri::LinuxContainerResources,
    resources: &cri::LinuxContainerResources,
) -> Vec<u8> {
    let mut request = Vec::new();
    prost::encoding::string::encode(1, &sandbox_id.to_owned(), &mut request);
    prost::encoding::message::encode(2, overhead, &mut request);
    prost::encoding::message::encode(3, resources, &mut request);
    request.extend_from_slice(&[0x22, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
    request
}

/// The pod request the PostStopPodSandbox hook gets when `sandbox_id` is stopped: the stored pod.
async fn stored_pod(
    rt: &mut RuntimeClient,
    hook: &TestHook,
    sandbox_id: &str,
) -> hook_api::v1alpha1::PodSandboxHookRequest {
    use test_support::hooks::{next_seen, Seen};
    let from = hook.seen().len();
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.to_owned() })
        .await
        .expect("StopPodSandbox");
    let Seen::Pod(_, pod) = next_seen(hook, "PostStopPodSandbox", from).await else { panic!("a pod stage") };
    pod
}

/// UpdatePodSandboxResources (kubelet 1.33+, in-place pod resize) reaches no hook stage and
/// goes to the runtime byte for byte; once the runtime accepted it, the stored pod has the new
/// overhead and resources, and so do later hook requests: the pod's (PostStopPodSandbox) and
/// its containers' `pod_resources`, for a container created before the resize
/// (PreUpdateContainerResources) and after it (PreCreateContainer).
#[tokio::test]
async fn a_pod_resize_reaches_the_runtime_unchanged_and_updates_the_store() {
    use test_support::hooks::next_seen;
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let hook = TestHook::echoing(|_, _| {}).await;
    let n = proxy.count_log(&["hook server added"]);
    let stages = ["PreCreateContainer", "PreUpdateContainerResources", "PostStopPodSandbox"];
    register(dir.path(), "echo.json", hook.socket(), "Fail", &stages, json!({}));
    assert!(proxy.wait_log(&["hook server added"], n));
    let mut rt = test_support::runtime_client(proxy.socket());
    let sandbox_id = run_resizable_pod(&mut rt).await;
    let container = |name: &str| cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.clone(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
            ..Default::default()
        }),
        sandbox_config: None,
    };
    let from = hook.seen().len();
    let container_id =
        rt.create_container(container("before")).await.expect("CreateContainer").into_inner().container_id;
    let seen = next_seen(&hook, "PreCreateContainer", from).await.container();
    assert_eq!(seen.pod_resources.map(|r| r.cpu_shares), Some(512), "the pod as run");

    let (overhead, resized) = (resources(20, 0), resources(1024, 256 << 20));
    let request = resize_request(&sandbox_id, &overhead, &resized);
    let from = hook.seen().len();
    raw::unary(test_support::channel(proxy.socket()), RESIZE, tonic::Request::new(Bytes::from(request.clone())))
        .await
        .expect("UpdatePodSandboxResources");
    let calls = fake.calls_to(RESIZE);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].body, grpc_frame(&request), "forwarded byte for byte");
    assert_eq!(hook.seen().len(), from, "no hook stage for it");

    let to_hook = |r: &cri::LinuxContainerResources| Some(hook_api::convert::to_hook(r));
    let update =
        cri::UpdateContainerResourcesRequest { container_id, linux: Some(resources(256, 0)), ..Default::default() };
    rt.update_container_resources(update).await.expect("UpdateContainerResources");
    let seen = next_seen(&hook, "PreUpdateContainerResources", from).await.container();
    assert_eq!(seen.pod_resources, to_hook(&resized), "a container created before the resize");
    let from = hook.seen().len();
    rt.create_container(container("after")).await.expect("CreateContainer");
    let seen = next_seen(&hook, "PreCreateContainer", from).await.container();
    assert_eq!(seen.pod_resources, to_hook(&resized), "a container created after the resize");
    let pod = stored_pod(&mut rt, &hook, &sandbox_id).await;
    assert_eq!((pod.overhead, pod.resources), (to_hook(&overhead), to_hook(&resized)), "the stored pod");
    assert_eq!(pod.cgroup_parent, "/kubepods/burstable/poduid-1", "the rest of the pod as it was");
}

/// A resize the runtime refuses reaches the client as the runtime's status and teaches the
/// store nothing: the pod's hooks still get the overhead and resources it was run with.
#[tokio::test]
async fn a_refused_pod_resize_leaves_the_store_as_it_was() {
    let fake = FakeBackend::start(Behaviour::CriRefusing(vec![RESIZE.into()])).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy(&fake, dir.path());
    let hook = TestHook::echoing(|_, _| {}).await;
    let n = proxy.count_log(&["hook server added"]);
    register(dir.path(), "echo.json", hook.socket(), "Fail", &["PostStopPodSandbox"], json!({}));
    assert!(proxy.wait_log(&["hook server added"], n));
    let mut rt = test_support::runtime_client(proxy.socket());
    let sandbox_id = run_resizable_pod(&mut rt).await;

    let request = resize_request(&sandbox_id, &resources(20, 0), &resources(1024, 256 << 20));
    let err = raw::unary(test_support::channel(proxy.socket()), RESIZE, tonic::Request::new(Bytes::from(request)))
        .await
        .expect_err("the runtime refuses it");
    assert_eq!((err.code(), err.message()), (tonic::Code::FailedPrecondition, "fake backend: refused"));
    assert_eq!(fake.calls_to(RESIZE).len(), 1, "it reached the runtime");
    let pod = stored_pod(&mut rt, &hook, &sandbox_id).await;
    let to_hook = |r: cri::LinuxContainerResources| Some(hook_api::convert::to_hook(&r));
    assert_eq!(
        (pod.overhead, pod.resources),
        (to_hook(resources(10, 0)), to_hook(resources(512, 128 << 20))),
        "as run"
    );
}
