//! Intercepted calls whose gRPC message is compressed (`grpc-encoding`, compressed flag set):
//! decoded for the hooks, never read as plain bytes; an edited message goes on compressed the
//! same way; an encoding the proxy cannot decompress is refused by name. containerd 1.6 has no
//! decompressor and 1.7 has gzip: either way the client's answer is the same with and without
//! the proxy.

use std::io::{Read, Write};
use std::sync::Arc;

use bytes::{Buf, Bytes};
use k8s_cri::v1 as cri;
use prost::Message;
use serde_json::json;
use test_support::containerd::{sandbox_config, unique, Containerd};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::hooks::{register, Seen, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::{raw, runtime_client};

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";

fn gzip_frame(message: &[u8]) -> Bytes {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(message).unwrap();
    let data = e.finish().unwrap();
    let mut body = vec![1];
    body.extend_from_slice(&(data.len() as u32).to_be_bytes());
    body.extend_from_slice(&data);
    body.into()
}

#[tokio::test]
async fn gzip_run_pod_sandbox_is_hooked_and_answered_as_containerd_answers_it() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let hook = TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| {
            let mut resp = hook_api::merge::echo_pod(req);
            resp.labels.insert("hooked".into(), "yes".into());
            Ok(resp)
        }),
    )
    .await;
    register(dir.path(), "pods.json", hook.socket(), "Fail", &["PreRunPodSandbox"], json!({}));
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "file=pods.json"], 0), "{}", proxy.log());

    let gzip = tonic::codec::CompressionEncoding::Gzip;
    let (direct_name, proxied_name) = (unique("gzip"), unique("gzip"));
    let request = |name: &str| cri::RunPodSandboxRequest {
        config: Some(sandbox_config(&env, name, Default::default(), Default::default())),
        runtime_handler: String::new(),
    };
    let mut direct_client = runtime_client(&env.socket).send_compressed(gzip).accept_compressed(gzip);
    let mut proxied_client = runtime_client(proxy.socket()).send_compressed(gzip).accept_compressed(gzip);
    let direct = direct_client.run_pod_sandbox(request(&direct_name)).await;
    let through = proxied_client.run_pod_sandbox(request(&proxied_name)).await;

    // The hook saw the decoded request (the pod's real name).
    let seen = hook.seen();
    let Some(Seen::Pod(_, req)) = seen.first() else { panic!("no PreRunPodSandbox call: {seen:?}") };
    assert_eq!(req.pod_meta.as_ref().map(|m| m.name.as_str()), Some(proxied_name.as_str()));
    match (direct, through) {
        // containerd 1.6 has no gzip decompressor: the same refusal both ways (so the proxy's
        // edited message went on compressed too, or containerd would have taken it).
        (Err(direct), Err(through)) => {
            assert_eq!(
                (through.code(), through.message()),
                (direct.code(), direct.message()),
                "the same answer as containerd's"
            );
        }
        // containerd 1.7 decompresses gzip: both run, and the hook's label (written into the
        // message, compressed again) is on the sandbox.
        (Ok(direct), Ok(through)) => {
            let mut rt = runtime_client(&env.socket);
            let status = rt
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: through.get_ref().pod_sandbox_id.clone(),
                    verbose: false,
                })
                .await
                .expect("status")
                .into_inner();
            assert_eq!(
                status.status.map(|s| s.labels.get("hooked").cloned()),
                Some(Some("yes".to_string())),
                "the hook's edit reached containerd"
            );
            for id in [&direct.get_ref().pod_sandbox_id, &through.get_ref().pod_sandbox_id] {
                test_support::containerd::remove_sandbox(&mut rt, id).await;
            }
        }
        (direct, through) => panic!("different answers: direct {direct:?}, through the proxy {through:?}"),
    }
}

#[tokio::test]
async fn an_edited_gzip_message_goes_on_gzip_compressed_with_the_edit() {
    let fake =
        FakeBackend::start(Behaviour::ok(&cri::CreateContainerResponse { container_id: "c1".into() }.encode_to_vec()))
            .await;
    let dir = tempfile::tempdir().unwrap();
    let shares =
        TestHook::echoing(|_, resp| resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 2048)
            .await;
    register(dir.path(), "shares.json", shares.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "file=shares.json"], 0), "{}", proxy.log());

    let request = cri::CreateContainerRequest {
        pod_sandbox_id: "sb".into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: "app".into(), attempt: 0 }),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        // The pod as kubelet describes it (the fake backend knows no sandbox).
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "u".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
    };
    let answer =
        raw::http2_call(proxy.socket(), CREATE, &[("grpc-encoding", "gzip")], gzip_frame(&request.encode_to_vec()))
            .await
            .unwrap();
    assert_eq!(answer.grpc_status().as_deref(), Some("0"), "{answer:?}");
    assert_eq!(shares.seen().len(), 1, "the hook was called");

    let forwarded = fake.calls_to(CREATE).pop().expect("forwarded").body;
    assert_eq!(forwarded[0], 1, "compressed flag kept");
    let len = (&forwarded[1..5]).get_u32() as usize;
    let mut message = Vec::new();
    flate2::read::GzDecoder::new(&forwarded[5..5 + len]).read_to_end(&mut message).expect("gzip");
    let got = cri::CreateContainerRequest::decode(message.as_slice()).unwrap();
    let mut want = request;
    want.config.as_mut().unwrap().linux.as_mut().unwrap().resources.as_mut().unwrap().cpu_shares = 2048;
    assert_eq!(got, want);
}

#[tokio::test]
async fn an_encoding_the_proxy_cannot_decompress_is_refused_by_name() {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    // A StartContainer request flagged as compressed with an encoding the proxy lacks.
    let body = Bytes::from_static(&[1, 0, 0, 0, 3, 0xde, 0xad, 0x00]);
    for path in ["/runtime.v1.RuntimeService/StartContainer", "/runtime.v1alpha2.RuntimeService/StartContainer"] {
        let answer = raw::http2_call(proxy.socket(), path, &[("grpc-encoding", "zstd")], body.clone()).await.unwrap();
        assert_eq!(answer.grpc_status().as_deref(), Some("12"), "UNIMPLEMENTED: {answer:?}");
        let message = answer.grpc_message().unwrap_or_default();
        assert!(message.contains("zstd") && message.contains(path), "{message}");
    }
}
