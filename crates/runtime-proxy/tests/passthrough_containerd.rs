//! Transparent pass-through against a real containerd + runc: every call kubelet makes goes
//! through the proxy and behaves exactly as it does against containerd directly.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use prost::Message;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::{image_client, raw, runtime_client};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

fn setup() -> (Containerd, ProxyProcess) {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    (env, proxy)
}

#[tokio::test]
async fn pod_life_cycle_sets_real_cgroups() {
    let (env, proxy) = setup();
    let mut rt = runtime_client(proxy.socket());
    let resources = cri::LinuxContainerResources {
        cpu_shares: 512,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let sandbox = sandbox_config(&env, &unique("lifecycle"), HashMap::new(), HashMap::new());
    let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[("GREETING", "hello")]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod through the proxy");

    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "512");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "50000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "67108864");

    let status = rt
        .container_status(cri::ContainerStatusRequest { container_id: pod.container_id.clone(), verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status.unwrap().state, cri::ContainerState::ContainerRunning as i32);

    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter { id: pod.sandbox_id.clone(), ..Default::default() }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].state, cri::PodSandboxState::SandboxReady as i32);

    let sandbox_id = pod.sandbox_id.clone();
    pod.remove(&mut rt).await;
    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter { id: sandbox_id, ..Default::default() }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(listed.items.is_empty(), "sandbox removed: {listed:?}");
}

#[tokio::test]
async fn exec_sync_and_update_resources() {
    let (env, proxy) = setup();
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("exec"), HashMap::new(), HashMap::new());
    let container = container_config(&env, "main", &["sleep", "3600"], None, &[("GREETING", "hello from env")]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod");

    let out = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: pod.container_id.clone(),
            cmd: vec!["sh".into(), "-c".into(), "echo $GREETING; echo oops >&2; exit 3".into()],
            timeout: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello from env\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    assert_eq!(out.exit_code, 3);

    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(cri::LinuxContainerResources {
            cpu_shares: 256,
            cpu_period: 100_000,
            cpu_quota: 20_000,
            memory_limit_in_bytes: 128 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("UpdateContainerResources");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "256");
    assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "20000");
    assert_eq!(pod.cgroup_file("memory", "memory.limit_in_bytes"), "134217728");
    pod.remove(&mut rt).await;
}

/// ImageStatus of an image nobody has: an answer without an image, not an error.
async fn assert_unknown_image_has_no_status(img: &mut ImageServiceClient<tonic::transport::Channel>) {
    let missing = img
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec { image: "localhost/no-such-image:1".into(), ..Default::default() }),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(missing.image.is_none());
}

#[tokio::test]
async fn image_service_list_and_status() {
    let (env, proxy) = setup();
    let mut img = image_client(proxy.socket());
    let images = img.list_images(cri::ListImagesRequest { filter: None }).await.unwrap().into_inner().images;
    assert!(images.iter().any(|i| i.repo_tags.contains(&env.test_image)), "{} not listed: {images:?}", env.test_image);
    let status = img
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec { image: env.test_image.clone(), ..Default::default() }),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(status.image.unwrap().repo_tags.contains(&env.test_image));
    assert_unknown_image_has_no_status(&mut img).await;
}

/// ImageService on another socket (`--remote-image-service-endpoint`, here a symlink to the same
/// containerd): the proxy takes image calls over and sends them there whole, interleaved with
/// runtime calls relayed on the same client connection; a client that grants each stream only
/// 64 bytes of window still gets every answer whole and as containerd gives it.
#[tokio::test]
async fn image_service_on_another_socket_is_served_there() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let images = dir.path().join("images.sock");
    std::os::unix::fs::symlink(&env.socket, &images).unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--remote-image-service-endpoint", images.to_str().unwrap()]);
    let channel = test_support::channel_with_stream_window(proxy.socket(), 64);
    let mut img = ImageServiceClient::new(channel.clone());
    let mut img2 = img.clone();
    let mut rt = test_support::runtime_client_from(channel);
    let status_request = || cri::ImageStatusRequest {
        image: Some(cri::ImageSpec { image: env.test_image.clone(), ..Default::default() }),
        verbose: false,
    };
    let direct = image_client(&env.socket).image_status(status_request()).await.unwrap().into_inner();
    assert!(direct.encoded_len() > 64, "the answer needs more than one window: {} bytes", direct.encoded_len());
    for round in 0..3 {
        let (listed, version, status) = tokio::join!(
            img.list_images(cri::ListImagesRequest { filter: None }),
            rt.version(cri::VersionRequest::default()),
            img2.image_status(status_request())
        );
        let listed = listed.unwrap_or_else(|e| panic!("round {round}: ListImages: {e:?}")).into_inner().images;
        assert!(
            listed.iter().any(|i| i.repo_tags.contains(&env.test_image)),
            "{} not listed: {listed:?}",
            env.test_image
        );
        assert_eq!(version.expect("Version").into_inner().runtime_name, "containerd");
        assert_eq!(status.expect("ImageStatus").into_inner(), direct, "round {round}: the same answer as directly");
    }
    assert_unknown_image_has_no_status(&mut img).await;
}

#[tokio::test]
async fn errors_come_back_exactly_as_containerd_sends_them() {
    let (env, proxy) = setup();
    // NOT_FOUND for an unknown container ID, with containerd's own message.
    let direct = runtime_client(&env.socket)
        .container_status(cri::ContainerStatusRequest { container_id: "no-such-container".into(), verbose: false })
        .await
        .unwrap_err();
    let proxied = runtime_client(proxy.socket())
        .container_status(cri::ContainerStatusRequest { container_id: "no-such-container".into(), verbose: false })
        .await
        .unwrap_err();
    assert_eq!(proxied.code(), Code::NotFound);
    assert_eq!(proxied.message(), direct.message());

    // A method no CRI version has: containerd's UNIMPLEMENTED, word for word.
    const PATH: &str = "/runtime.v1.RuntimeService/NoSuchMethod";
    let direct =
        raw::unary(test_support::channel(&env.socket), PATH, tonic::Request::new(Bytes::new())).await.unwrap_err();
    let proxied =
        raw::unary(test_support::channel(proxy.socket()), PATH, tonic::Request::new(Bytes::new())).await.unwrap_err();
    assert_eq!(proxied.code(), Code::Unimplemented);
    assert_eq!(proxied.message(), direct.message());
    assert!(proxied.message().contains("NoSuchMethod"), "{}", proxied.message());
}

#[tokio::test]
async fn v1alpha2_version() {
    let (env, proxy) = setup();
    if !test_support::containerd::serves_v1alpha2(&env, proxy.socket()).await {
        return; // containerd 2.x: its UNIMPLEMENTED came through (checked by serves_v1alpha2)
    }
    let mut alpha =
        k8s_cri::v1alpha2::runtime_service_client::RuntimeServiceClient::new(test_support::channel(proxy.socket()));
    let v = alpha.version(k8s_cri::v1alpha2::VersionRequest { version: "0.1.0".into() }).await.unwrap().into_inner();
    assert_eq!(v.runtime_api_version, "v1alpha2");
    assert_eq!(v.runtime_name, "containerd");
}

#[tokio::test]
async fn unknown_fields_reach_containerd() {
    // A Version request with a field number no CRI version defines: the proxy does not decode,
    // so containerd gets (and ignores) it, and the answer is the real one.
    let (_env, proxy) = setup();
    let mut req = cri::VersionRequest { version: "v1".into() }.encode_to_vec();
    req.extend_from_slice(&[0xf8, 0x06, 0x2a]); // field 111, varint 42
    let resp = raw::unary(
        test_support::channel(proxy.socket()),
        "/runtime.v1.RuntimeService/Version",
        tonic::Request::new(Bytes::from(req)),
    )
    .await
    .unwrap();
    let v = cri::VersionResponse::decode(resp.into_inner()).unwrap();
    assert_eq!(v.runtime_api_version, "v1");
}

#[tokio::test]
async fn container_events_stream() {
    let (env, proxy) = setup();
    let mut rt = runtime_client(proxy.socket());
    if env.has_container_events() {
        // Cancelled streams of earlier tests would each swallow one of our events (containerd 1.7).
        test_support::containerd::drain_cancelled_event_streams(&env).await;
    }
    let subscribed = rt.get_container_events(cri::GetEventsRequest {}).await;
    if !env.has_container_events() {
        // containerd 1.6 does not implement it: its own UNIMPLEMENTED comes through.
        let direct = runtime_client(&env.socket).get_container_events(cri::GetEventsRequest {}).await.unwrap_err();
        let proxied = subscribed.unwrap_err();
        assert_eq!(proxied.code(), Code::Unimplemented);
        assert_eq!(proxied.message(), direct.message());
        return;
    }
    let mut events = subscribed.expect("GetContainerEvents through the proxy").into_inner();
    let sandbox = sandbox_config(&env, &unique("events"), HashMap::new(), HashMap::new());
    let container = container_config(&env, "main", &["sleep", "3600"], None, &[]);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod");
    let cid = pod.container_id.clone();
    pod.remove(&mut rt).await;

    let mut seen = Vec::new();
    let collect = async {
        while let Some(ev) = events.message().await.expect("event stream") {
            if ev.container_id == cid {
                seen.push(ev.container_event_type);
                if ev.container_event_type == cri::ContainerEventType::ContainerDeletedEvent as i32 {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), collect).await.expect("events within 20 s");
    use cri::ContainerEventType::*;
    let want =
        [ContainerCreatedEvent, ContainerStartedEvent, ContainerStoppedEvent, ContainerDeletedEvent].map(|e| e as i32);
    let mut it = seen.iter();
    for w in want {
        assert!(it.any(|e| *e == w), "event {w} missing or out of order in {seen:?}");
    }
}

/// Every `:authority` grpc-go (containerd) accepts is accepted: none, empty, `localhost`, the raw
/// socket path (crictl 1.26, grpc-go-era kubelets, grpc-java), the percent-encoded path (gRPC
/// C-core ≥ 1.57: Python, C++, Ruby), any printable text. Without the h2 patch in vendor/ the
/// proxy reset all but `localhost` with PROTOCOL_ERROR.
#[tokio::test]
async fn any_authority_is_accepted() {
    use test_support::raw::{handmade_call, HandmadeAnswer};
    let (env, proxy) = setup();
    // containerd 2.x serves no v1alpha2: its UNIMPLEMENTED (an answer with no message) is what the
    // v1alpha2 call must get then, whatever the authority.
    let alpha = test_support::containerd::serves_v1alpha2(&env, proxy.socket()).await;
    let path = proxy.socket().display().to_string();
    let encoded = path.trim_start_matches('/').replace('/', "%2F");
    let authorities: [Option<&[u8]>; 6] = [
        None,
        Some(b""),
        Some(b"localhost"),
        Some(path.as_bytes()),
        Some(encoded.as_bytes()),
        Some(b"any printable {text} here!"),
    ];
    let request = cri::VersionRequest { version: "v1".into() }.encode_to_vec();
    for authority in authorities {
        let what = authority.map(String::from_utf8_lossy);
        for method in ["/runtime.v1.RuntimeService/Version", "/runtime.v1alpha2.RuntimeService/Version"] {
            let answer = handmade_call(proxy.socket(), authority, method, &request)
                .await
                .unwrap_or_else(|e| panic!("{what:?} {method}: {e}"));
            let HandmadeAnswer::Answered(body) = answer else {
                panic!("authority {what:?}, {method}: {answer:?}\n{}", proxy.log())
            };
            if !alpha && method.contains("v1alpha2") {
                assert!(
                    body.is_empty(),
                    "authority {what:?}, {method}: containerd {} has no v1alpha2: {body:?}",
                    env.version
                );
                continue;
            }
            let version = cri::VersionResponse::decode(body.get(5..).unwrap_or_default()).expect("VersionResponse");
            assert_eq!(version.runtime_name, "containerd", "authority {what:?}, {method}");
        }
        // An intercepted method too (unknown container: containerd's NOT_FOUND comes back).
        let stop = cri::StopContainerRequest { container_id: "no-such-container".into(), timeout: 0 }.encode_to_vec();
        let answer =
            handmade_call(proxy.socket(), authority, "/runtime.v1.RuntimeService/StopContainer", &stop).await.unwrap();
        assert!(matches!(answer, HandmadeAnswer::Answered(_)), "authority {what:?}, StopContainer: {answer:?}");
    }
}

/// What a raw server-streaming call ended with: every message, or the status.
async fn stream_outcome(channel: tonic::transport::Channel, path: &str) -> Result<Vec<Bytes>, (Code, String)> {
    let failed = |s: tonic::Status| (s.code(), s.message().to_owned());
    let mut stream =
        raw::server_streaming(channel, path, tonic::Request::new(Bytes::new())).await.map_err(failed)?.into_inner();
    let mut messages = Vec::new();
    while let Some(m) = stream.message().await.map_err(failed)? {
        messages.push(m);
    }
    Ok(messages)
}

/// The methods of newer kubelets (1.33–1.36) that containerd 1.6 and 1.7 do not implement —
/// KEP-5825's list streams and UpdatePodSandboxResources — get containerd's own UNIMPLEMENTED
/// through the proxy, word for word, as directly (kubelet then falls back to the List* calls,
/// and treats the resize call as best effort).
#[tokio::test]
async fn newer_kubelet_methods_get_containerds_own_answer() {
    let (env, proxy) = setup();
    let streams = [
        "/runtime.v1.RuntimeService/StreamPodSandboxes",
        "/runtime.v1.RuntimeService/StreamContainers",
        "/runtime.v1.RuntimeService/StreamContainerStats",
        "/runtime.v1.RuntimeService/StreamPodSandboxStats",
        "/runtime.v1.RuntimeService/StreamPodSandboxMetrics",
        "/runtime.v1.ImageService/StreamImages",
    ];
    // Before 2.0 none of them exists (a later containerd's answers are compared all the same).
    let old = env.version.split('.').next().and_then(|m| m.parse::<u32>().ok()).is_some_and(|major| major < 2);
    for path in streams {
        let direct = stream_outcome(test_support::channel(&env.socket), path).await;
        let proxied = stream_outcome(test_support::channel(proxy.socket()), path).await;
        assert_eq!(proxied, direct, "{path} on containerd {}", env.version);
        if old {
            let (code, message) = proxied.expect_err("UNIMPLEMENTED");
            assert_eq!(code, Code::Unimplemented, "{path}: {message}");
            assert!(message.contains(path.rsplit('/').next().unwrap()), "{path}: {message}");
        }
    }
    const RESIZE: &str = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";
    let request = Bytes::from(vec![0x0a, 7, b'n', b'o', b'-', b'p', b'o', b'd', b'!']);
    let outcome = |r: Result<tonic::Response<Bytes>, tonic::Status>| {
        r.map(|r| r.into_inner()).map_err(|s| (s.code(), s.message().to_owned()))
    };
    let direct =
        outcome(raw::unary(test_support::channel(&env.socket), RESIZE, tonic::Request::new(request.clone())).await);
    let proxied =
        outcome(raw::unary(test_support::channel(proxy.socket()), RESIZE, tonic::Request::new(request)).await);
    assert_eq!(proxied, direct, "UpdatePodSandboxResources on containerd {}", env.version);
    if old {
        let (code, message) = proxied.expect_err("UNIMPLEMENTED");
        assert_eq!(code, Code::Unimplemented, "{message}");
        assert!(message.contains("UpdatePodSandboxResources"), "{message}");
    }
}
