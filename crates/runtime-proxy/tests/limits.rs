//! The resource limits (src/limits.rs), each set low by its flag and exceeded: a clear status
//! naming the limit, nothing else disturbed. The backend is the in-process fake (what is
//! measured here is the proxy's own bound, not containerd's); hook servers are test hooks.

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

fn create_request(envs: usize) -> Vec<u8> {
    cri::CreateContainerRequest {
        pod_sandbox_id: "sb".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 0 }),
            envs: (0..envs).map(|i| cri::KeyValue { key: format!("K{i}"), value: "v".into() }).collect(),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
    }
    .encode_to_vec()
}

async fn backend() -> FakeBackend {
    FakeBackend::start(Behaviour::ok(&cri::CreateContainerResponse { container_id: "c1".into() }.encode_to_vec())).await
}

/// A proxy in front of `fake` with a hook adding envs (`change`) registered under `Fail`.
async fn with_hook(
    fake: &FakeBackend,
    flags: &[&str],
    change: impl Fn(&str, &mut hook_api::v1alpha1::ContainerResourceHookResponse) + Send + Sync + 'static,
) -> (ProxyProcess, TestHook, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let hook = TestHook::echoing(change).await;
    register(dir.path(), "hook.json", hook.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let mut args = vec!["--hook-config-dir", dir.path().to_str().unwrap()];
    args.extend_from_slice(flags);
    let proxy = ProxyProcess::start(BIN, fake.socket(), &args);
    assert!(proxy.wait_log(&["hook server added"], 0), "{}", proxy.log());
    (proxy, hook, dir)
}

async fn create(proxy: &ProxyProcess, body: Vec<u8>) -> Result<tonic::Response<Bytes>, tonic::Status> {
    raw::unary(test_support::channel(proxy.socket()), CREATE, tonic::Request::new(Bytes::from(body))).await
}

#[tokio::test]
async fn a_hook_answer_larger_than_the_limit_is_a_hook_failure() {
    let fake = backend().await;
    let (proxy, _hook, _dir) = with_hook(&fake, &["--max-hook-answer-bytes", "65536"], |_, resp| {
        resp.container_envs.insert("BIG".into(), "x".repeat(100_000));
    })
    .await;
    let err = create(&proxy, create_request(1)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("--max-hook-answer-bytes") && err.message().contains("hook.json"),
        "{}",
        err.message()
    );
    assert!(fake.calls_to(CREATE).is_empty(), "nothing reached the backend");
}

#[tokio::test]
async fn a_hook_answer_adding_too_many_or_too_large_entries_is_a_hook_failure() {
    let fake = backend().await;
    let (proxy, _hook, _dir) = with_hook(&fake, &[], |_, resp| {
        for i in 0..2000 {
            resp.container_envs.insert(format!("ADDED{i}"), "1".into());
        }
    })
    .await;
    let err = create(&proxy, create_request(1)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("adds 2000 container_envs entries, more than 1024 (--max-hook-added-entries)"),
        "{}",
        err.message()
    );

    // An echoed request with 2000 envs of its own is fine: only what the hook adds counts.
    let fake = backend().await;
    let (proxy, _hook, _dir) = with_hook(&fake, &["--max-hook-entry-bytes", "100"], |_, _| {}).await;
    create(&proxy, create_request(2000)).await.expect("an echo adds nothing");
    let (proxy, _hook, _dir) = with_hook(&fake, &["--max-hook-entry-bytes", "100"], |_, resp| {
        resp.container_envs.insert("LONG".into(), "y".repeat(200));
    })
    .await;
    let err = create(&proxy, create_request(1)).await.expect_err("refused");
    assert!(
        err.message().contains("\"LONG\" of 204 bytes, more than 100 (--max-hook-entry-bytes)"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn an_intercepted_request_over_the_size_limit_is_refused() {
    let fake = backend().await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--max-request-bytes", "1000"]);
    let err = create(&proxy, create_request(200)).await.expect_err("refused");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("request larger than 1000 bytes (--max-request-bytes)"), "{}", err.message());
    create(&proxy, create_request(1)).await.expect("a small one goes through");
}

/// A client that sends a request's head and never its body does not hold the call forever.
#[tokio::test]
async fn a_stalled_request_body_times_out() {
    let fake = backend().await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--request-idle-timeout", "300ms"]);
    let stream = tokio::net::UnixStream::connect(proxy.socket()).await.unwrap();
    let (mut send, conn) = h2::client::handshake(stream).await.unwrap();
    tokio::spawn(conn);
    let req = http::Request::post(format!("http://localhost{CREATE}"))
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let started = Instant::now();
    let (response, _body_never_sent) = send.send_request(req, false).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), response).await.expect("answered in time").unwrap();
    assert!(started.elapsed() >= Duration::from_millis(290), "not before the idle timeout: {:?}", started.elapsed());
    assert_eq!(
        response.headers().get("grpc-status").map(|v| v.to_str().unwrap()),
        Some("4"),
        "DEADLINE_EXCEEDED: {response:?}"
    );
    let message = response.headers().get("grpc-message").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    assert!(message.contains("--request-idle-timeout"), "{message}");
}

/// `--max-concurrent-streams 1`: two calls on one connection run one after the other.
#[tokio::test]
async fn concurrent_streams_per_connection_are_capped() {
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: grpc_frame(&cri::VersionResponse::default().encode_to_vec()),
        trailers: vec![("grpc-status".into(), "0".into())],
        delay: Duration::from_millis(300),
    })
    .await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--max-concurrent-streams", "1"]);
    let channel = test_support::channel(proxy.socket());
    let call = |c: tonic::transport::Channel| async move {
        test_support::runtime_client_from(c).version(cri::VersionRequest::default()).await.map(drop)
    };
    // One call first, so the client knows the server's SETTINGS (a stream opened before them,
    // beyond the limit, is refused with REFUSED_STREAM, as HTTP/2 has it).
    call(channel.clone()).await.expect("warm-up");
    let started = Instant::now();
    let (a, b) = tokio::join!(call(channel.clone()), call(channel.clone()));
    a.expect("first");
    b.expect("second");
    assert!(started.elapsed() >= Duration::from_millis(590), "two 300 ms calls ran at once: {:?}", started.elapsed());
}
