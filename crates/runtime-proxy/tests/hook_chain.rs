//! The hook chain's rules on real pods: field ownership between two hook servers
//! (`--hook-conflict-policy`, a registration's `conflict-policy`) and required hook servers
//! (`--required-hook-servers`, the pod annotations). The proxy and containerd are real
//! processes; the hook servers are in-process fakes with scripted answers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const REQUIRED: &str = "runtimeproxy.koordinator.sh/required-hook-servers";
const TOLERATE: &str = "runtimeproxy.koordinator.sh/tolerate-missing-hook-servers";

struct Setup {
    env: Containerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
    rt: RuntimeServiceClient<Channel>,
}

fn setup(extra: &[&str]) -> Setup {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-chain").tempdir().unwrap();
    let mut args = vec!["--hook-config-dir", dir.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let proxy = ProxyProcess::start(BIN, &env.socket, &args);
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

    fn sandbox(&self, annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
        let map = annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
        sandbox_config(&self.env, &unique("chain"), HashMap::new(), map)
    }

    async fn pod(&mut self, annotations: &[(&str, &str)]) -> Result<Pod, tonic::Status> {
        let sandbox = self.sandbox(annotations);
        let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
        let container = container_config(&self.env, "main", &["sleep", "3600"], Some(resources), &[]);
        Pod::start(&mut self.rt, sandbox, container).await
    }

    /// The containers containerd has in the sandbox named `name` (by metadata), whatever their state.
    async fn containers_named(&mut self, pod_name: &str) -> usize {
        let pods = self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
            .expect("ListPodSandbox")
            .into_inner()
            .items;
        let mut n = 0;
        for p in pods.iter().filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == pod_name)) {
            let filter = cri::ContainerFilter { pod_sandbox_id: p.id.clone(), ..Default::default() };
            n += self
                .rt
                .list_containers(cri::ListContainersRequest { filter: Some(filter) })
                .await
                .expect("ListContainers")
                .into_inner()
                .containers
                .len();
        }
        n
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

/// A server whose every call fails with UNAVAILABLE.
async fn failing_hook() -> TestHook {
    TestHook::start(
        Arc::new(|_, _| Err(tonic::Status::unavailable("gpu agent not ready"))),
        Arc::new(|_, _| Err(tonic::Status::unavailable("gpu agent not ready"))),
    )
    .await
}

fn assert_names(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
}

/// Warn (the default): the later server's value is in the real cgroup, one log line names the
/// stage, the field, both servers and both values, and /metrics counts the conflict.
#[tokio::test]
async fn a_conflict_under_warn_keeps_the_later_value_logs_and_counts() {
    let mut s = setup(&[]);
    let (a, b) = (shares_hook(700).await, shares_hook(900).await);
    s.register("a.json", a.socket(), "Ignore", &["PreCreateContainer"], json!({"order": 1}));
    s.register("b.json", b.socket(), "Ignore", &["PreCreateContainer"], json!({"order": 2}));
    let pod = s.pod(&[]).await.expect("pod under Warn");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "900", "the later server's value");
    let line = [
        "PreCreateContainer conflict",
        "container_resources.cpu_shares",
        "a.json",
        "b.json",
        "700",
        "900",
        "conflict-policy Warn",
    ];
    assert_eq!(s.proxy.count_log(&line), 1, "one line per conflict:\n{}", s.proxy.log());
    let (_, metrics) = s.proxy.admin_get("/metrics");
    assert!(
        metrics.contains(
            r#"runtime_proxy_hook_conflicts_total{stage="PreCreateContainer",field="container_resources.cpu_shares"} 1"#
        ),
        "{metrics}"
    );
    pod.remove(&mut s.rt).await;

    // Both setting the same value is no conflict.
    let c = shares_hook(900).await;
    s.register("a.json", c.socket(), "Ignore", &["PreCreateContainer"], json!({"order": 1}));
    let pod = s.pod(&[]).await.expect("pod");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "900");
    let (_, metrics) = s.proxy.admin_get("/metrics");
    assert!(metrics.contains(r#"field="container_resources.cpu_shares"} 1"#), "still one: {metrics}");
    pod.remove(&mut s.rt).await;
}

/// Fail, from the node's flag and from the later server's own `conflict-policy`: CreateContainer
/// is refused with FAILED_PRECONDITION naming the field and both servers, and containerd never
/// sees the container.
#[tokio::test]
async fn a_conflict_under_fail_refuses_create_container_before_the_runtime() {
    for (flags, b_extra) in [
        (vec!["--hook-conflict-policy", "Fail"], json!({"order": 2})),
        (vec![], json!({"order": 2, "conflict-policy": "Fail"})),
    ] {
        let mut s = setup(&flags);
        let (a, b) = (shares_hook(700).await, shares_hook(900).await);
        s.register("a.json", a.socket(), "Ignore", &["PreCreateContainer"], json!({"order": 1}));
        s.register("b.json", b.socket(), "Ignore", &["PreCreateContainer"], b_extra.clone());
        let sandbox = s.sandbox(&[]);
        let name = sandbox.metadata.as_ref().unwrap().name.clone();
        let sandbox_id =
            s.rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(sandbox.clone()),
                runtime_handler: String::new(),
            })
            .await
            .expect("sandbox")
            .into_inner()
            .pod_sandbox_id;
        let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
        let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[]);
        let err =
            s.rt.create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(container),
                sandbox_config: Some(sandbox),
            })
            .await
            .expect_err("a conflict under Fail");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{flags:?} {b_extra}: {err:?}");
        assert_names(
            err.message(),
            &["PreCreateContainer", "container_resources.cpu_shares", "a.json", "b.json", "\"700\"", "\"900\""],
        );
        assert_eq!(s.containers_named(&name).await, 0, "containerd has no container for the refused call");
        test_support::containerd::remove_sandbox(&mut s.rt, &sandbox_id).await;
    }
}

/// A pod requiring a server with no registration: RunPodSandbox fails with FAILED_PRECONDITION
/// naming it, though no hook server at all is registered; registered, the pod runs.
#[tokio::test]
async fn a_required_server_not_registered_fails_run_pod_sandbox() {
    let mut s = setup(&[]);
    let err = s.pod(&[(REQUIRED, "gpu.json")]).await.expect_err("gpu.json is not registered");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_names(err.message(), &["PreRunPodSandbox", "gpu.json", "not registered", REQUIRED]);
    // Registered for other stages only: fine at PreRunPodSandbox and the rest.
    let gpu = shares_hook(700).await;
    s.register("gpu.json", gpu.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let pod = s.pod(&[(REQUIRED, "gpu.json")]).await.expect("gpu.json registered");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700");
    pod.remove(&mut s.rt).await;
    // Without the annotation nothing is required.
    let plain = s.pod(&[]).await.expect("plain pod");
    plain.remove(&mut s.rt).await;
}

/// A required server gone between RunPodSandbox and CreateContainer, with no server left for
/// PreCreateContainer: the container's creation still fails (the proxy does not skip a stage no
/// server registered for while a stored pod requires servers).
#[tokio::test]
async fn a_required_server_unregistered_after_the_sandbox_fails_create_container() {
    let mut s = setup(&[]);
    let gpu = shares_hook(700).await;
    s.register("gpu.json", gpu.socket(), "Ignore", &["PreRunPodSandbox"], json!({}));
    let sandbox = s.sandbox(&[(REQUIRED, "gpu.json")]);
    let sandbox_id = s
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() })
        .await
        .expect("sandbox, gpu.json registered")
        .into_inner()
        .pod_sandbox_id;
    let before = s.proxy.count_log(&["hook server removed", "gpu.json"]);
    std::fs::remove_file(s.dir.path().join("gpu.json")).unwrap();
    assert!(
        s.proxy.wait_log(&["hook server removed", "gpu.json"], before),
        "registry did not drop gpu.json:\n{}",
        s.proxy.log()
    );
    let container = container_config(&s.env, "main", &["sleep", "3600"], None, &[]);
    let err =
        s.rt.create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(container),
            sandbox_config: Some(sandbox),
        })
        .await
        .expect_err("gpu.json is gone");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_names(err.message(), &["PreCreateContainer", "gpu.json", "not registered"]);
    test_support::containerd::remove_sandbox(&mut s.rt, &sandbox_id).await;
}

/// A required server whose failure policy is Ignore still fails the call when its call fails;
/// for a pod that does not require it, Ignore holds.
#[tokio::test]
async fn a_required_ignore_policy_server_that_fails_fails_the_call() {
    let mut s = setup(&[]);
    let gpu = failing_hook().await;
    s.register("gpu.json", gpu.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let err = s.pod(&[(REQUIRED, "gpu.json")]).await.expect_err("required and failing");
    assert_eq!(err.code(), tonic::Code::Unavailable, "the failure's own code: {err:?}");
    assert_names(err.message(), &["PreCreateContainer", "gpu.json", "gpu agent not ready", "required by"]);
    let pod = s.pod(&[]).await.expect("not required: Ignore goes on");
    pod.remove(&mut s.rt).await;
}

/// The node flag requires a server for every pod.
#[tokio::test]
async fn the_node_flag_requires_a_server_for_every_pod() {
    let mut s = setup(&["--required-hook-servers", "koordlet.json"]);
    let err = s.pod(&[]).await.expect_err("koordlet.json not registered");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_names(err.message(), &["PreRunPodSandbox", "koordlet.json", "--required-hook-servers"]);
    let koordlet = shares_hook(800).await;
    s.register("koordlet.json", koordlet.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let pod = s.pod(&[]).await.expect("registered now");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "800");
    pod.remove(&mut s.rt).await;
}

/// tolerate-missing is honoured in a namespace allowed to use the skip label (here `default`),
/// and ignored — logged and counted — elsewhere; it never covers a registered server's failure.
#[tokio::test]
async fn tolerate_missing_is_honoured_only_in_allowed_namespaces() {
    let annotations = [(REQUIRED, "gpu.json"), (TOLERATE, "true")];
    let mut allowed = setup(&["--runtime-hook-server-namespaces", "default"]);
    let pod = allowed.pod(&annotations).await.expect("tolerated in default");
    pod.remove(&mut allowed.rt).await;
    let gpu = failing_hook().await;
    allowed.register("gpu.json", gpu.socket(), "Ignore", &["PreCreateContainer"], json!({}));
    let err = allowed.pod(&annotations).await.expect_err("a registered required server's failure is never tolerated");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");

    let mut elsewhere = setup(&[]);
    let err = elsewhere.pod(&annotations).await.expect_err("default is not an allowed namespace");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        elsewhere.proxy.count_log(&["tolerate-missing annotation ignored", "namespace=\"default\""]) >= 1,
        "{}",
        elsewhere.proxy.log()
    );
    let (_, metrics) = elsewhere.proxy.admin_get("/metrics");
    assert!(metrics.contains("runtime_proxy_tolerate_missing_ignored_total 1"), "{metrics}");
}

/// The skip label comes first: a skipped pod calls no server, so nothing is required.
#[tokio::test]
async fn the_skip_label_has_priority_over_required_servers() {
    let mut s = setup(&["--runtime-hook-server-namespaces", "default", "--required-hook-servers", "koordlet.json"]);
    let sandbox = {
        let mut c = s.sandbox(&[(REQUIRED, "gpu.json")]);
        c.labels.insert("runtimeproxy.koordinator.sh/skip-hookserver".into(), "true".into());
        c
    };
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    let container = container_config(&s.env, "main", &["sleep", "3600"], Some(resources), &[]);
    let pod = Pod::start(&mut s.rt, sandbox, container).await.expect("skipped pod");
    pod.remove(&mut s.rt).await;
}

/// A hook server cannot un-require a server: a PreRunPodSandbox answer emptying the pod's
/// required-hook-servers annotation is undone, so the container's stage still requires gpu.json
/// (whose failure then refuses CreateContainer although its policy is Ignore).
#[tokio::test]
async fn a_hook_server_cannot_change_the_required_annotation() {
    let mut s = setup(&[]);
    let eraser = TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| {
            let mut answer = hook_api::merge::echo_pod(req);
            answer.annotations.insert(REQUIRED.into(), String::new());
            Ok(answer)
        }),
    )
    .await;
    let gpu = TestHook::start(
        Arc::new(|_, _| Err(tonic::Status::unavailable("gpu agent not ready"))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await;
    s.register("eraser.json", eraser.socket(), "Ignore", &["PreRunPodSandbox"], json!({}));
    s.register("gpu.json", gpu.socket(), "Ignore", &["PreRunPodSandbox", "PreCreateContainer"], json!({}));
    let err = s.pod(&[(REQUIRED, "gpu.json")]).await.expect_err("still required at PreCreateContainer");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_names(err.message(), &["PreCreateContainer", "gpu.json", "required by"]);
    assert!(s.proxy.count_log(&["eraser.json", "may not change this pod annotation"]) >= 1, "{}", s.proxy.log());
}

/// A hook server cannot add the skip label: an `Ignore` server adding it at PreRunPodSandbox to a
/// pod of a namespace where the label is honoured is undone, so the `Fail` server is still called
/// at PreCreateContainer (and its failure refuses the container).
#[tokio::test]
async fn a_hook_server_cannot_add_the_skip_label() {
    let mut s = setup(&["--runtime-hook-server-namespaces", "default"]);
    let adder = TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| {
            let mut answer = hook_api::merge::echo_pod(req);
            answer.labels.insert("runtimeproxy.koordinator.sh/skip-hookserver".into(), "true".into());
            Ok(answer)
        }),
    )
    .await;
    let gate = failing_hook().await;
    s.register("adder.json", adder.socket(), "Ignore", &["PreRunPodSandbox"], json!({}));
    s.register("gate.json", gate.socket(), "Fail", &["PreCreateContainer"], json!({}));
    let err = s.pod(&[]).await.expect_err("the Fail server is still called at PreCreateContainer");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert_names(err.message(), &["PreCreateContainer", "gate.json"]);
    assert!(
        s.proxy.count_log(&["PreRunPodSandbox", "may not add, change or remove the skip label"]) >= 1,
        "{}",
        s.proxy.log()
    );
}

/// At a post stage a required server's failure cannot fail the call (the runtime has done it):
/// the pod runs, the failure is logged and counted.
#[tokio::test]
async fn a_required_server_failing_at_a_post_stage_is_only_logged_and_counted() {
    let mut s = setup(&[]);
    let gpu = failing_hook().await;
    s.register("gpu.json", gpu.socket(), "Ignore", &["PostStartContainer"], json!({}));
    let pod = s.pod(&[(REQUIRED, "gpu.json")]).await.expect("a post stage never refuses");
    let logged = || s.proxy.count_log(&["PostStartContainer", "gpu.json", "a post stage cannot fail the call"]);
    assert!(
        test_support::wait_until(std::time::Duration::from_secs(5), || async { logged() >= 1 }).await,
        "{}",
        s.proxy.log()
    );
    let (_, metrics) = s.proxy.admin_get("/metrics");
    assert!(
        metrics
            .contains(r#"runtime_proxy_hook_required_failures_total{stage="PostStartContainer",server="gpu.json"} 1"#),
        "{metrics}"
    );
    pod.remove(&mut s.rt).await;
}
