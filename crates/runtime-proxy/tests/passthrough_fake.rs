//! Pass-through properties real containerd cannot show, proven with an in-process fake backend:
//! metadata in both directions, trailers and status details, byte-identical bodies, answers beyond
//! 16 MiB, an expiring deadline, a backend that is down.

use std::time::Duration;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend};
use test_support::proxy::ProxyProcess;
use test_support::{raw, runtime_client};
use tonic::metadata::{BinaryMetadataValue, MetadataValue};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

#[tokio::test]
async fn metadata_status_details_and_trailers_pass_unchanged() {
    let reply = cri::VersionResponse { version: "0.1.0".into(), runtime_name: "fake".into(), ..Default::default() };
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![("x-backend-header".into(), "from-backend".into())],
        body: grpc_frame(&reply.encode_to_vec()),
        trailers: vec![("grpc-status".into(), "0".into()), ("x-backend-trailer".into(), "trailer-value".into())],
        delay: Duration::ZERO,
    })
    .await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);

    let request = cri::VersionRequest { version: "v1".into() };
    let mut req = tonic::Request::new(request.clone());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    req.metadata_mut().insert("traceparent", MetadataValue::from_static(traceparent));
    req.metadata_mut().insert_bin("x-blob-bin", BinaryMetadataValue::from_bytes(&[0, 1, 2, 255]));
    req.set_timeout(Duration::from_secs(30));
    let resp = runtime_client(proxy.socket()).version(req).await.expect("Version through the proxy");

    assert_eq!(resp.metadata().get("x-backend-header").unwrap(), "from-backend");
    assert_eq!(resp.metadata().get("x-backend-trailer").unwrap(), "trailer-value");
    assert_eq!(resp.get_ref(), &reply);

    // Only this test's call: the proxy's start-up store recovery calls the backend too.
    let calls = fake.calls_to("/runtime.v1.RuntimeService/Version");
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.path, "/runtime.v1.RuntimeService/Version");
    assert_eq!(call.headers["traceparent"], traceparent);
    assert_eq!(call.headers["x-blob-bin"], "AAEC/w", "binary metadata as sent (unpadded base64)");
    assert!(call.headers.contains_key("grpc-timeout"), "deadline forwarded: {:?}", call.headers);
    assert_eq!(call.body, grpc_frame(&request.encode_to_vec()), "request body byte-identical");
}

#[tokio::test]
async fn error_status_with_details_passes_unchanged() {
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: Bytes::new(),
        trailers: vec![
            ("grpc-status".into(), "5".into()),
            ("grpc-message".into(), "container %22x%22 not found".into()),
            ("grpc-status-details-bin".into(), "CAUSBGJvb20".into()),
        ],
        delay: Duration::ZERO,
    })
    .await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let err = runtime_client(proxy.socket())
        .container_status(cri::ContainerStatusRequest { container_id: "x".into(), verbose: false })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert_eq!(err.message(), "container \"x\" not found");
    assert_eq!(err.details(), b"\x08\x05\x12\x04boom".as_slice());
    // The relay records a call once the answer is written, so the line may follow the answer.
    assert!(proxy.wait_log(&["CRI call failed"], 0), "failure logged at warn:\n{}", proxy.log());
}

#[tokio::test]
async fn messages_beyond_16_mib_pass_both_ways() {
    // 20 MiB: above both grpc-go's 4 MiB default and kubelet's 16 MiB.
    let big = vec![7u8; 20 << 20];
    let fake = FakeBackend::start(Behaviour::ok(&big)).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let request: Bytes = (0..(20u32 << 20)).map(|i| (i % 251) as u8).collect();
    let resp = raw::unary(
        test_support::channel(proxy.socket()),
        "/runtime.v1.RuntimeService/ListContainers",
        tonic::Request::new(request.clone()),
    )
    .await
    .expect("20 MiB answer");
    assert_eq!(resp.get_ref().len(), big.len());
    assert!(resp.get_ref().iter().all(|b| *b == 7));
    // (the proxy's start-up store recovery sends its own, empty, ListContainers)
    assert!(fake.calls().iter().any(|c| c.body == grpc_frame(&request)), "20 MiB request arrived intact");
}

#[tokio::test]
async fn deadline_expires_and_backend_call_is_cancelled() {
    // A raw HTTP/2 client: it sends grpc-timeout but does not enforce it, so the answer shows
    // the proxy's own enforcement.
    let fake = FakeBackend::start(Behaviour::Hang).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let started = std::time::Instant::now();
    let answer = raw::http2_call(proxy.socket(), "/runtime.v1.RuntimeService/Version", &[("grpc-timeout", "300m")], grpc_frame(&[]))
        .await
        .expect("an answer, not a hang");
    assert_eq!(answer.grpc_status().as_deref(), Some("4"), "DEADLINE_EXCEEDED: {answer:?}");
    let message = answer.grpc_message().unwrap_or_default();
    assert!(message.contains("/runtime.v1.RuntimeService/Version") && message.contains("deadline"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5), "answered near the deadline, not hung");
    assert!(
        test_support::wait_until(Duration::from_secs(5), || async { fake.abandoned() == 1 }).await,
        "the backend's stream was reset when the deadline passed"
    );

    // A tonic client enforcing its own deadline and giving up: the proxy cancels the backend call.
    let mut req = tonic::Request::new(cri::VersionRequest::default());
    req.set_timeout(Duration::from_millis(200));
    let err = runtime_client(proxy.socket()).version(req).await.unwrap_err();
    assert!(matches!(err.code(), Code::Cancelled | Code::DeadlineExceeded), "{err:?}");
    assert!(
        test_support::wait_until(Duration::from_secs(5), || async { fake.abandoned() == 2 }).await,
        "the client's cancellation reached the backend"
    );
}

#[tokio::test]
async fn backend_down_is_unavailable_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-runtime.sock");
    let proxy = ProxyProcess::start(BIN, &missing, &[]);
    let err = runtime_client(proxy.socket()).version(cri::VersionRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains(&missing.display().to_string()), "{}", err.message());
}

#[tokio::test]
async fn a_call_the_backend_resets_is_reset_for_the_client_too() {
    // The backend sends the response head and a message, then RST_STREAM(INTERNAL_ERROR): the
    // client must see what it would see directly (a reset, not a status the proxy made up; a
    // broken backend *connection* instead ends the call UNAVAILABLE, tests/faults.rs).
    let fake = FakeBackend::start(Behaviour::ResetAfter { body: grpc_frame(&cri::VersionResponse::default().encode_to_vec()) }).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let direct = runtime_client(fake.socket()).version(cri::VersionRequest::default()).await.unwrap_err();
    let proxied = runtime_client(proxy.socket()).version(cri::VersionRequest::default()).await.unwrap_err();
    assert_eq!(direct.code(), Code::Internal, "{direct:?}");
    assert_eq!(proxied.code(), direct.code(), "through the proxy: {proxied:?}; direct: {direct:?}");
    assert!(!proxied.message().contains("backend unix://"), "a reset, not the proxy's own status: {proxied:?}");
}

/// A header block that decodes to 32 000 fields (each one byte on the wire: HPACK static index
/// 16) ends that client's connection with GOAWAY(PROTOCOL_ERROR), not a panic or gigabytes of
/// decoded headers; the proxy goes on serving other connections.
#[tokio::test]
async fn a_header_block_of_too_many_fields_ends_the_connection_not_the_proxy() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let reply = cri::VersionResponse { version: "0.1.0".into(), runtime_name: "fake".into(), ..Default::default() };
    let fake = FakeBackend::start(Behaviour::ok(&reply.encode_to_vec())).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    };
    let path = b"/runtime.v1.RuntimeService/Version";
    let mut block = vec![0x83, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path);
    block.extend(std::iter::repeat_n(0x90u8, 16_000));
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    out.extend(frame(1, 0, 1, &block)); // HEADERS, no END_HEADERS
    out.extend(frame(9, 0x4, 1, &[0x90u8; 16_000])); // CONTINUATION, END_HEADERS
    let mut conn = tokio::net::UnixStream::connect(proxy.socket()).await.unwrap();
    conn.write_all(&out).await.unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut seen)).await.expect("the proxy closes the connection").ok();
    let mut goaway = None;
    let mut at = 0;
    while at + 9 <= seen.len() {
        let len = u32::from_be_bytes([0, seen[at], seen[at + 1], seen[at + 2]]) as usize;
        if seen[at + 3] == 7 && len >= 8 && at + 9 + len <= seen.len() {
            goaway = Some(u32::from_be_bytes(seen[at + 13..at + 17].try_into().unwrap()));
        }
        at += 9 + len;
    }
    assert_eq!(goaway, Some(1), "GOAWAY(PROTOCOL_ERROR) before the close: {seen:?}");
    let v = runtime_client(proxy.socket()).version(cri::VersionRequest::default()).await.expect("the proxy still serves");
    assert_eq!(v.into_inner().runtime_name, "fake");
}
