//! Pass-through properties real containerd cannot show, proven with an in-process fake backend:
//! metadata in both directions, trailers and status details, byte-identical bodies, answers beyond
//! 16 MiB, an expiring deadline, a backend that is down, KEP-5825's list streams message by
//! message.

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
    let answer = raw::http2_call(
        proxy.socket(),
        "/runtime.v1.RuntimeService/Version",
        &[("grpc-timeout", "300m")],
        grpc_frame(&[]),
    )
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
    let fake = FakeBackend::start(Behaviour::ResetAfter {
        body: grpc_frame(&cri::VersionResponse::default().encode_to_vec()),
    })
    .await;
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
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut seen))
        .await
        .expect("the proxy closes the connection")
        .ok();
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
    let v =
        runtime_client(proxy.socket()).version(cri::VersionRequest::default()).await.expect("the proxy still serves");
    assert_eq!(v.into_inner().runtime_name, "fake");
}

/// KEP-5825's server-streaming lists (cri-api 1.36, kubelet's `CRIListStreaming`). `k8s-cri`
/// 0.11 does not know them: called with raw gRPC.
const LIST_STREAMS: [&str; 6] = [
    "/runtime.v1.RuntimeService/StreamPodSandboxes",
    "/runtime.v1.RuntimeService/StreamContainers",
    "/runtime.v1.RuntimeService/StreamContainerStats",
    "/runtime.v1.RuntimeService/StreamPodSandboxStats",
    "/runtime.v1.RuntimeService/StreamPodSandboxMetrics",
    "/runtime.v1.ImageService/StreamImages",
];

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The `i`th message a list stream of `path` sends: its item (field 1: a pod sandbox, a
/// container, their stats or metrics, an image) named `<method>-<i>`; message 1 also carries a
/// 256 KiB field no CRI version has, so it spans many DATA frames and more than a stream window.
fn streamed(path: &str, i: usize) -> Vec<u8> {
    use prost::encoding::message::encode;
    let method = path.rsplit('/').next().unwrap_or_default();
    let id = format!("{method}-{i}");
    let mut out = Vec::new();
    match method {
        "StreamPodSandboxes" => encode(1, &cri::PodSandbox { id, ..Default::default() }, &mut out),
        "StreamContainers" => {
            encode(1, &cri::Container { id, pod_sandbox_id: "sb-1".into(), ..Default::default() }, &mut out)
        }
        "StreamContainerStats" => {
            let attributes = Some(cri::ContainerAttributes { id, ..Default::default() });
            encode(1, &cri::ContainerStats { attributes, ..Default::default() }, &mut out)
        }
        "StreamPodSandboxStats" => {
            let attributes = Some(cri::PodSandboxAttributes { id, ..Default::default() });
            encode(1, &cri::PodSandboxStats { attributes, ..Default::default() }, &mut out)
        }
        "StreamPodSandboxMetrics" => {
            encode(1, &cri::PodSandboxMetrics { pod_sandbox_id: id, ..Default::default() }, &mut out)
        }
        _ => encode(1, &cri::Image { id, ..Default::default() }, &mut out),
    }
    if i == 1 {
        prost::encoding::bytes::encode(99, &vec![0x5a_u8; 256 << 10], &mut out);
    }
    out
}

/// The next message of `stream`, waiting at most 5 s (`what` names it in failures).
async fn next_message(stream: &mut tonic::Streaming<Bytes>, what: &str) -> Result<Option<Bytes>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap_or_else(|_| {
        panic!("{what}: nothing reached the client within 5 s while the runtime held back what comes next")
    })
}

#[tokio::test]
async fn list_streams_pass_message_by_message_unbuffered() {
    let (behaviour, feeds) = Behaviour::streams(&LIST_STREAMS, &[("x-backend-header", "from-backend")]);
    let fake = FakeBackend::start(behaviour).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let channel = test_support::channel(proxy.socket());
    for (path, feed) in LIST_STREAMS.iter().zip(&feeds) {
        // The List* twin's filter (field 1, an ID in it) and a field no CRI version has.
        let mut request = Vec::new();
        prost::encoding::message::encode(
            1,
            &cri::ContainerFilter { id: "filter-id".into(), ..Default::default() },
            &mut request,
        );
        request.extend_from_slice(&[0xf8, 0x06, 0x2a]);
        let mut req = tonic::Request::new(Bytes::from(request.clone()));
        req.metadata_mut().insert("traceparent", MetadataValue::from_static(TRACEPARENT));
        req.set_timeout(Duration::from_secs(30));
        let opened =
            tokio::time::timeout(Duration::from_secs(10), raw::server_streaming(channel.clone(), path, req)).await;
        let resp =
            opened.unwrap_or_else(|_| panic!("{path}: no response head")).unwrap_or_else(|e| panic!("{path}: {e:?}"));
        assert_eq!(
            resp.metadata().get("x-backend-header").map(|v| v.to_str().unwrap()),
            Some("from-backend"),
            "{path}"
        );
        let mut stream = resp.into_inner();
        // Each message is sent only once the client has the one before: a proxy that held
        // messages back (until the end of the stream, or until more bytes came) fails here.
        for i in 0..3 {
            let message = streamed(path, i);
            assert!(feed.message(&message), "{path}: the runtime's stream is still open");
            let got = next_message(&mut stream, &format!("{path} message {i}")).await;
            let got = got
                .unwrap_or_else(|e| panic!("{path}: {e:?}"))
                .unwrap_or_else(|| panic!("{path}: ended after {i} messages"));
            assert!(got == message, "{path}: message {i} byte for byte ({} bytes, want {})", got.len(), message.len());
        }
        let method = path.rsplit('/').next().unwrap();
        assert!(feed.end(&[("grpc-status", "0"), ("x-backend-trailer", method)]));
        let end = next_message(&mut stream, &format!("{path} end")).await;
        assert!(matches!(end, Ok(None)), "{path}: the stream ends OK: {end:?}");
        let trailers = stream.trailers().await.unwrap_or_else(|e| panic!("{path}: {e:?}")).expect("trailers");
        assert_eq!(trailers.get("x-backend-trailer").map(|v| v.to_str().unwrap()), Some(method), "{path}");

        let calls = fake.calls_to(path);
        assert_eq!(calls.len(), 1, "{path}: one call reached the runtime");
        assert_eq!(calls[0].body, grpc_frame(&request), "{path}: request byte-identical");
        assert_eq!(calls[0].headers["traceparent"], TRACEPARENT, "{path}");
        assert!(calls[0].headers.contains_key("grpc-timeout"), "{path}: deadline forwarded: {:?}", calls[0].headers);
    }
}

/// A list stream the runtime fails after a message ends with the runtime's status (kubelet
/// discards what it got and retries), and a client that gives up mid-stream has the runtime's
/// stream reset.
#[tokio::test]
async fn a_list_stream_ends_with_the_runtimes_status_or_the_clients_reset() {
    let paths = ["/runtime.v1.RuntimeService/StreamContainers", "/runtime.v1.RuntimeService/StreamPodSandboxes"];
    let (behaviour, feeds) = Behaviour::streams(&paths, &[]);
    let fake = FakeBackend::start(behaviour).await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    let channel = test_support::channel(proxy.socket());

    let mut stream =
        raw::server_streaming(channel.clone(), paths[0], tonic::Request::new(Bytes::new())).await.unwrap().into_inner();
    let message = streamed(paths[0], 0);
    feeds[0].message(&message);
    assert_eq!(next_message(&mut stream, "first message").await.unwrap().as_deref(), Some(&message[..]));
    feeds[0].end(&[("grpc-status", "13"), ("grpc-message", "listing failed: boom")]);
    let err = next_message(&mut stream, "failed end").await.unwrap_err();
    assert_eq!((err.code(), err.message()), (Code::Internal, "listing failed: boom"), "{err:?}");

    let mut stream =
        raw::server_streaming(channel.clone(), paths[1], tonic::Request::new(Bytes::new())).await.unwrap().into_inner();
    feeds[1].message(&streamed(paths[1], 0));
    assert!(next_message(&mut stream, "first message").await.unwrap().is_some());
    assert!(!feeds[1].closed(), "the runtime's stream is open while the client reads");
    drop(stream);
    assert!(
        test_support::wait_until(Duration::from_secs(5), || async { feeds[1].closed() }).await,
        "the client's reset reached the runtime's stream"
    );
}

/// A runtime that lacks the newer methods (containerd 1.7, 2.0) answers UNIMPLEMENTED; the
/// client gets that status, word for word, as it gets it directly (kubelet then falls back to
/// the List* calls).
#[tokio::test]
async fn unimplemented_newer_methods_come_back_as_the_runtimes_own_status() {
    let fake = FakeBackend::start(Behaviour::Reply {
        headers: vec![],
        body: Bytes::new(),
        trailers: vec![
            ("grpc-status".into(), "12".into()),
            ("grpc-message".into(), "unknown method for service runtime.v1".into()),
        ],
        delay: Duration::ZERO,
    })
    .await;
    let proxy = ProxyProcess::start(BIN, fake.socket(), &[]);
    for path in LIST_STREAMS {
        let direct =
            raw::server_streaming(test_support::channel(fake.socket()), path, tonic::Request::new(Bytes::new())).await;
        let proxied =
            raw::server_streaming(test_support::channel(proxy.socket()), path, tonic::Request::new(Bytes::new())).await;
        // The fake answers with an empty DATA frame before its trailers: a stream that ends
        // at once with the status.
        let status = |r: Result<tonic::Response<tonic::Streaming<Bytes>>, tonic::Status>| async move {
            match r {
                Err(status) => status,
                Ok(resp) => resp.into_inner().message().await.expect_err("an error status"),
            }
        };
        let (direct, proxied) = (status(direct).await, status(proxied).await);
        assert_eq!(proxied.code(), Code::Unimplemented, "{path}: {proxied:?}");
        assert_eq!((proxied.code(), proxied.message()), (direct.code(), direct.message()), "{path}");
    }
    let path = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";
    let direct =
        raw::unary(test_support::channel(fake.socket()), path, tonic::Request::new(Bytes::new())).await.unwrap_err();
    let proxied =
        raw::unary(test_support::channel(proxy.socket()), path, tonic::Request::new(Bytes::new())).await.unwrap_err();
    assert_eq!(proxied.code(), Code::Unimplemented, "{proxied:?}");
    assert_eq!((proxied.code(), proxied.message()), (direct.code(), direct.message()));
}

/// On a client connection whose runtime connection is gone, a list stream is answered
/// UNAVAILABLE (as GetContainerEvents), never taken over as one unary call whose messages would
/// wait for its end; once the runtime is back the client's next connection streams.
#[tokio::test]
async fn a_list_stream_is_never_taken_over_whole() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("runtime.sock");
    let proxy = ProxyProcess::start(BIN, &socket, &[]);
    let channel = test_support::channel(proxy.socket());
    // The connection is made while the runtime is down: it has no runtime connection.
    let err = runtime_client(proxy.socket()).version(cri::VersionRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    let down =
        raw::server_streaming(channel.clone(), LIST_STREAMS[1], tonic::Request::new(Bytes::new())).await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");

    let (behaviour, feeds) = Behaviour::streams(&LIST_STREAMS[1..2], &[]);
    let fake = FakeBackend::start_at(behaviour, &socket).await;
    let started = std::time::Instant::now();
    let mut stream = loop {
        let opened = tokio::time::timeout(
            Duration::from_secs(5),
            raw::server_streaming(channel.clone(), LIST_STREAMS[1], tonic::Request::new(Bytes::new())),
        )
        .await
        .expect("an answer or a response head within 5 s, not a stream held back whole");
        match opened {
            Ok(resp) => break resp.into_inner(),
            Err(e) if e.code() == Code::Unavailable && started.elapsed() < Duration::from_secs(10) => {
                assert!(fake.calls_to(LIST_STREAMS[1]).is_empty(), "UNAVAILABLE without calling the runtime");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    let message = streamed(LIST_STREAMS[1], 0);
    feeds[0].message(&message);
    assert_eq!(
        next_message(&mut stream, "first message").await.unwrap().as_deref(),
        Some(&message[..]),
        "relayed, not held"
    );
    feeds[0].end(&[("grpc-status", "0")]);
    assert!(matches!(next_message(&mut stream, "end").await, Ok(None)));
}
