//! CheckpointPod / RestorePod (CRI v1, Kubernetes 1.37 alpha, KEP-5823) through the real proxy, on
//! the fake backend (no runtime implements them yet): a restored pod is created without
//! RunPodSandbox or CreateContainer, so RestorePod is refused where a PreRunPodSandbox or
//! PreCreateContainer hook server may not be skipped, forwarded with a WARN and a counter where
//! they all may, and the store learns the restored pod for the stages that follow.

use std::collections::HashMap;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use serde_json::json;
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend, RestoredPod};
use test_support::hooks::{next_seen, register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::raw;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const CHECKPOINT: &str = "/runtime.v1.RuntimeService/CheckpointPod";
const RESTORE: &str = "/runtime.v1.RuntimeService/RestorePod";
const SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
const CONTAINER_STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
const SANDBOX: &str = "restored-sandbox-1";
const CONTAINERS: [(&str, &str); 2] = [("app", "restored-app-1"), ("sidecar", "restored-sidecar-1")];
const UNHOOKED: &str = "runtime_proxy_restore_unhooked_total";

fn restored_pod() -> RestoredPod {
    RestoredPod {
        sandbox_id: SANDBOX.into(),
        metadata: cri::PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-restored".into(),
            namespace: "default".into(),
            attempt: 0,
        },
        labels: HashMap::from([("app".to_string(), "web".to_string())]),
        annotations: HashMap::from([("restored".to_string(), "yes".to_string())]),
        cgroup_parent: "/kubepods/burstable/poduid-restored".into(),
        containers: CONTAINERS.iter().map(|(n, i)| (n.to_string(), i.to_string())).collect(),
    }
}

/// A RestorePodRequest as api.proto numbers it (`k8s-cri` 0.11 does not know it):
/// `checkpoint_path` (1), `config` (2), `runtime_handler` (3), `options` (4),
/// `container_configs` (5), and a field no CRI version has (99), which must reach the runtime.
fn restore_request() -> Vec<u8> {
    use prost::encoding::{bytes, string};
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web".into(),
            uid: "uid-restored".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: [("app".to_string(), "web".to_string())].into(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/burstable/poduid-restored".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut out = Vec::new();
    string::encode(1, &"/var/lib/kubelet/checkpoints/web".to_string(), &mut out);
    bytes::encode(2, &config.encode_to_vec(), &mut out);
    string::encode(3, &"runc".to_string(), &mut out);
    for (name, _) in CONTAINERS {
        let c = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
            ..Default::default()
        };
        bytes::encode(5, &c.encode_to_vec(), &mut out);
    }
    string::encode(99, &"future".to_string(), &mut out);
    out
}

/// A CheckpointPodRequest: `pod_sandbox_id` (1), `output_path` (2), `container_ids` (3).
fn checkpoint_request() -> Vec<u8> {
    use prost::encoding::string;
    let mut out = Vec::new();
    string::encode(1, &"sandbox-0".to_string(), &mut out);
    string::encode(2, &"/var/lib/kubelet/checkpoints/web".to_string(), &mut out);
    string::encode(3, &"c-0".to_string(), &mut out);
    out
}

async fn call(proxy: &ProxyProcess, path: &'static str, body: &[u8]) -> Result<Bytes, tonic::Status> {
    let mut req = tonic::Request::new(Bytes::copy_from_slice(body));
    req.set_timeout(std::time::Duration::from_secs(30));
    raw::unary(test_support::channel(proxy.socket()), path, req).await.map(tonic::Response::into_inner)
}

/// A proxy on `fake` with hook servers registered in `dir` as `hooks` say (name, socket,
/// policy, stages), each taken up, and its start-up store recovery done, before it returns.
///
/// The waits yield: the fake backend and the hook servers are served by the test's runtime.
async fn proxy_with(
    fake: &FakeBackend,
    dir: &std::path::Path,
    hooks: &[(&str, &TestHook, &str, &[&str])],
) -> ProxyProcess {
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--hook-config-dir", dir.to_str().unwrap()]);
    // Its start-up recovery done first: the store counts below are the restore's alone.
    assert!(logged(&proxy, &["store recovered"]).await, "no start-up recovery");
    for (name, hook, policy, stages) in hooks {
        register(dir, name, hook.socket(), policy, stages, json!({}));
        assert!(logged(&proxy, &["hook server added", name]).await, "{name} not taken up");
    }
    proxy
}

/// Waits (up to 10 s, yielding) until the proxy has logged a line containing every one of `parts`.
async fn logged(proxy: &ProxyProcess, parts: &[&str]) -> bool {
    test_support::wait_until(std::time::Duration::from_secs(10), || async { proxy.count_log(parts) > 0 }).await
}

/// The value of an unlabelled metric, or of one with these labels, in a scrape.
fn metric(proxy: &ProxyProcess, series: &str) -> Option<f64> {
    let (status, text) = proxy.admin_get("/metrics");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

fn stored(proxy: &ProxyProcess, kind: &str) -> Option<f64> {
    metric(proxy, &format!("runtime_proxy_store_objects{{kind=\"{kind}\"}}"))
}

/// (a) With no hook server, both calls reach the runtime byte for byte (an unknown field
/// included) and the runtime's answers reach the client as sent; the store learns the restored
/// pod and its containers all the same.
#[tokio::test]
async fn without_hook_servers_checkpoint_and_restore_pass_unchanged() {
    let fake = FakeBackend::start(Behaviour::restoring(restored_pod())).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = proxy_with(&fake, dir.path(), &[]).await;

    let checkpoint = checkpoint_request();
    let answer = call(&proxy, CHECKPOINT, &checkpoint).await.expect("CheckpointPod");
    assert!(answer.is_empty(), "CheckpointPodResponse is empty");
    assert_eq!(fake.calls_to(CHECKPOINT).iter().map(|c| c.body.clone()).collect::<Vec<_>>(), [grpc_frame(&checkpoint)]);

    let request = restore_request();
    let answer = call(&proxy, RESTORE, &request).await.expect("RestorePod");
    let direct = call_direct(&fake, RESTORE, &request).await;
    assert_eq!(answer, direct, "the runtime's answer, as it sent it");
    assert_eq!(fake.calls_to(RESTORE)[0].body, grpc_frame(&request), "forwarded byte for byte");
    assert_eq!(metric(&proxy, UNHOOKED), Some(0.0));
    assert_eq!(proxy.count_log(&["RestorePod forwarded without"]), 0);
    assert!(learned(&proxy).await, "the store learned the pod: {}", proxy.log());
}

/// Waits (up to 10 s) until the store holds the restored pod sandbox and its two containers.
async fn learned(proxy: &ProxyProcess) -> bool {
    let full = || async { (stored(proxy, "pod_sandbox"), stored(proxy, "container")) == (Some(1.0), Some(2.0)) };
    test_support::wait_until(std::time::Duration::from_secs(10), full).await
}

async fn call_direct(fake: &FakeBackend, path: &'static str, body: &[u8]) -> Bytes {
    raw::unary(test_support::channel(fake.socket()), path, tonic::Request::new(Bytes::copy_from_slice(body)))
        .await
        .expect("direct call")
        .into_inner()
}

/// (b) A PreRunPodSandbox hook server with failure-policy Fail: RestorePod is refused with
/// FAILED_PRECONDITION naming it and why; neither the runtime nor the hook server sees a call.
#[tokio::test]
async fn a_fail_pre_run_pod_sandbox_server_refuses_a_restore() {
    let fake = FakeBackend::start(Behaviour::restoring(restored_pod())).await;
    let dir = tempfile::tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    let proxy = proxy_with(&fake, dir.path(), &[("koordlet.json", &hook, "Fail", &["PreRunPodSandbox"])]).await;

    let err = call(&proxy, RESTORE, &restore_request()).await.expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    let msg = err.message();
    assert!(msg.contains("koordlet.json (PreRunPodSandbox: failure-policy Fail)"), "{msg}");
    assert!(msg.contains("pod default/web") && msg.contains("without RunPodSandbox or CreateContainer"), "{msg}");
    assert!(fake.calls_to(RESTORE).is_empty(), "the runtime never saw it");
    assert!(hook.seen().is_empty(), "no hook was called");
    assert_eq!(stored(&proxy, "pod_sandbox").unwrap_or(0.0), 0.0);

    // A client we did not write gets the same: Python grpcio, the call as raw bytes.
    // (Run without blocking the test's runtime: the fake backend and the hook server live on it.)
    let mut python = test_support::clients::python("raw_unary.py");
    python.arg("--socket").arg(proxy.socket()).args(["--method", RESTORE, "--request", &hex(&restore_request())]);
    let out = tokio::process::Command::from(python).output().await.expect("running raw_unary.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "raw_unary.py: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("JSON result");
    assert_eq!(
        (result["code"].as_str(), result["details"].as_str()),
        (Some("FAILED_PRECONDITION"), Some(msg)),
        "{result}"
    );
    assert!(fake.calls_to(RESTORE).is_empty());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// (c) Only failure-policy Ignore servers at the pre-create stages: RestorePod is forwarded
/// byte for byte, with a WARN naming them and `runtime_proxy_restore_unhooked_total` counted.
/// (d) The store then knows the restored pod, learned before the client has the answer: a
/// later StartContainer of a restored container calls PreStartContainer with the pod's
/// metadata, labels, annotations and cgroup parent and the container's, with no runtime lookup
/// of its own.
#[tokio::test]
async fn ignore_servers_let_a_restore_through_and_the_store_learns_the_pod() {
    let fake = FakeBackend::start(Behaviour::restoring(restored_pod())).await;
    let dir = tempfile::tempdir().unwrap();
    let (pre, start) = (TestHook::echoing(|_, _| {}).await, TestHook::echoing(|_, _| {}).await);
    let proxy = proxy_with(
        &fake,
        dir.path(),
        &[
            ("koordlet.json", &pre, "Ignore", &["PreRunPodSandbox", "PreCreateContainer"]),
            ("start.json", &start, "Fail", &["PreStartContainer"]),
        ],
    )
    .await;

    let request = restore_request();
    let answer = call(&proxy, RESTORE, &request).await.expect("RestorePod");
    assert_eq!(fake.calls_to(RESTORE)[0].body, grpc_frame(&request), "forwarded byte for byte");
    assert!(!answer.is_empty());
    assert_eq!(metric(&proxy, UNHOOKED), Some(1.0));
    let warned = proxy
        .log()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("RestorePod forwarded without"))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(warned[0].contains("koordlet.json") && warned[0].contains("namespace=\"default\""), "{}", warned[0]);
    assert!(pre.seen().is_empty(), "no stage for a restore");

    // (d) Learned at restore: the restored pod's and containers' statuses were asked.
    assert!(learned(&proxy).await, "the store learned the pod: {}", proxy.log());
    let asked = |path| fake.calls_to(path).len();
    assert_eq!(
        (asked(SANDBOX_STATUS), asked(CONTAINER_STATUS)),
        (1, 2),
        "learned from the runtime at restore: {}",
        proxy.log()
    );

    let (_, container_id) = CONTAINERS[1];
    let mut rt = test_support::runtime_client(proxy.socket());
    rt.start_container(cri::StartContainerRequest { container_id: container_id.into() }).await.expect("StartContainer");
    let seen = next_seen(&start, "PreStartContainer", 0).await.container();
    let meta = seen.pod_meta.clone().expect("pod metadata");
    assert_eq!((meta.name.as_str(), meta.namespace.as_str(), meta.uid.as_str()), ("web", "default", "uid-restored"));
    assert_eq!(seen.pod_labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(seen.pod_annotations.get("restored").map(String::as_str), Some("yes"));
    assert_eq!(seen.pod_cgroup_parent, "/kubepods/burstable/poduid-restored");
    let container = seen.container_meta.clone().expect("container metadata");
    assert_eq!((container.name.as_str(), container.id.as_str()), ("sidecar", container_id));
    assert_eq!(seen.container_resources.as_ref().map(|r| r.cpu_shares), Some(256));
    assert_eq!(
        (asked(SANDBOX_STATUS), asked(CONTAINER_STATUS)),
        (1, 2),
        "StartContainer found it in the store: {}",
        proxy.log()
    );
}
