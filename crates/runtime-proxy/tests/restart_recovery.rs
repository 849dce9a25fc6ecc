//! Restart recovery: after the proxy is killed and started again, hooks for pods and containers
//! created before the restart get the same requests as before it — pod cgroup parent, labels and
//! annotations (as the hooks changed them), container ID and resources (no envs: the store keeps
//! none) — because the new proxy rebuilds its store from containerd's verbose status
//! (`src/cri/recover.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hook_api::v1alpha1::{PodSandboxHookRequest, PodSandboxHookResponse};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{assert_same_container, next_seen, register, Seen, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

const STAGES: [&str; 5] = [
    "PreRunPodSandbox",
    "PreCreateContainer",
    "PreUpdateContainerResources",
    "PostStopContainer",
    "PostStopPodSandbox",
];

fn map<M: FromIterator<(String, String)>>(kv: &[(&str, &str)]) -> M {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The pod hook's answer: the request echoed, plus a label, an annotation and a new cgroup
/// parent at PreRunPodSandbox (so recovery must find the hook-merged values, not kubelet's).
fn pod_answer(stage: &str, req: &PodSandboxHookRequest) -> PodSandboxHookResponse {
    let mut resp = hook_api::merge::echo_pod(req);
    if stage == "PreRunPodSandbox" {
        resp.labels.insert("hooked-label".into(), "yes".into());
        resp.annotations.insert("hooked-annotation".into(), "yes".into());
        resp.cgroup_parent = format!("{}-hooked", req.cgroup_parent);
    }
    resp
}

/// A koordlet-like hook server: at PreCreateContainer it adds an env and a container annotation,
/// sets cpu shares and moves the container to a cgroup parent of its own (`<pod parent>-c`).
async fn hook() -> TestHook {
    TestHook::start(
        Arc::new(|stage, req| {
            let mut resp = hook_api::merge::echo_container(req);
            if stage == "PreCreateContainer" {
                resp.container_envs.insert("HOOKED".into(), "yes".into());
                resp.container_annotations.insert("hooked-container".into(), "yes".into());
                resp.container_resources.get_or_insert_with(Default::default).cpu_shares = 700;
                resp.pod_cgroup_parent = format!("{}-c", req.pod_cgroup_parent);
            }
            Ok(resp)
        }),
        Arc::new(|stage, req| Ok(pod_answer(stage, req))),
    )
    .await
}

/// A proxy on `socket` with hook config dir `hooks`, logging to `log`, ready and with the hook
/// server registered.
fn proxy(socket: &Path, backend: &Path, hooks: &Path, log: PathBuf) -> ProxyProcess {
    let mut p = ProxyProcess::spawn(BIN, socket, backend, &["--hook-config-dir", hooks.to_str().unwrap()], log);
    p.wait_ready();
    assert!(p.wait_log(&["hook server added", "file=recover.json"], 0), "hook server not registered:\n{}", p.log());
    p
}

fn update_request(container_id: &str) -> cri::UpdateContainerResourcesRequest {
    cri::UpdateContainerResourcesRequest {
        container_id: container_id.into(),
        linux: Some(cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 40_000,
            cpu_shares: 300,
            memory_limit_in_bytes: 96 << 20,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn start_pod(env: &Containerd, rt: &mut RuntimeServiceClient<Channel>) -> Pod {
    let sandbox = sandbox_config(env, &unique("recover"), map(&[("app", "db")]), map(&[("team", "storage")]));
    let resources = cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        cpuset_cpus: "0".into(),
        cpuset_mems: "0".into(),
        oom_score_adj: 500,
        ..Default::default()
    };
    let container =
        container_config(env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me"), ("EQ", "a=b")]);
    Pod::start(rt, sandbox, container).await.expect("pod through the proxy")
}

fn read_cgroup(controller: &str, parent: &str, id: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{controller}{parent}/{id}/{file}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}")).trim().to_owned()
}

#[tokio::test]
async fn hooks_after_a_kill_9_restart_see_what_they_saw_before() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-recover").tempdir().unwrap();
    let (socket, hooks) = (dir.path().join("run/rp.sock"), dir.path().join("hooks"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = hook().await;
    register(&hooks, "recover.json", hook.socket(), "Fail", &STAGES, json!({}));

    // Proxy A: the pod is created and updated through it.
    let mut a = proxy(&socket, &env.socket, &hooks, dir.path().join("a.log"));
    let mut rt = runtime_client(&socket);
    let pod = start_pod(&env, &mut rt).await;
    let Seen::Pod(_, run_req) = next_seen(&hook, "PreRunPodSandbox", 0).await else { panic!("pod stage expected") };
    let parent = format!("{}-hooked", pod.cgroup_parent());
    let container_parent = format!("{parent}-c");
    assert_eq!(
        read_cgroup("cpu", &container_parent, &pod.container_id, "cpu.shares"),
        "700",
        "hooked parent and shares applied"
    );
    let n = hook.seen().len();
    rt.update_container_resources(update_request(&pod.container_id)).await.expect("update through A");
    let before = next_seen(&hook, "PreUpdateContainerResources", n).await.container();
    assert_eq!(before.pod_cgroup_parent, container_parent);
    assert!(before.container_envs.is_empty(), "envs only at PreCreateContainer: {:?}", before.container_envs);
    assert_eq!(before.container_annotations, map(&[("hooked-container", "yes")]));
    assert_eq!(
        before.container_resources.as_ref().map(|r| (r.cpu_shares, r.memory_limit_in_bytes)),
        Some((300, 96 << 20))
    );

    // kill -9 A; B starts on the same socket and hook directory.
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(5));
    let b = proxy(&socket, &env.socket, &hooks, dir.path().join("b.log"));
    assert!(b.wait_log(&["store recovered"], 0), "no recovery logged:\n{}", b.log());
    let line = b.log().lines().find(|l| l.contains("store recovered")).unwrap().to_owned();
    eprintln!("proxy B: {line}");

    // The same update through B: the hooks see the same request.
    let mut rt = runtime_client(&socket);
    // (Each step waits for a call made after it: without recovery B would call no hook at all.)
    let n = hook.seen().len();
    rt.update_container_resources(update_request(&pod.container_id)).await.expect("update through B");
    let after_update = next_seen(&hook, "PreUpdateContainerResources", n).await.container();
    assert_same_container(&before, &after_update, "PreUpdateContainerResources after the restart");

    let n = hook.seen().len();
    rt.stop_container(cri::StopContainerRequest { container_id: pod.container_id.clone(), timeout: 0 })
        .await
        .expect("stop");
    let post_stop = next_seen(&hook, "PostStopContainer", n).await.container();
    assert_same_container(&before, &post_stop, "PostStopContainer after the restart");

    rt.remove_container(cri::RemoveContainerRequest { container_id: pod.container_id.clone() }).await.expect("remove");
    let n = hook.seen().len();
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: pod.sandbox_id.clone() }).await.expect("stop pod");
    let Seen::Pod(_, stop_req) = next_seen(&hook, "PostStopPodSandbox", n).await else { panic!("pod stage expected") };
    // What the store held before the restart: the PreRunPodSandbox request with the hook's answer.
    let mut stored_pod = run_req.clone();
    hook_api::merge::apply_pod_response(&mut stored_pod, &pod_answer("PreRunPodSandbox", &run_req));
    assert_eq!(stop_req.pod_meta, stored_pod.pod_meta, "pod_meta");
    assert_eq!(stop_req.cgroup_parent, parent, "cgroup_parent");
    assert_eq!(stop_req.labels, map(&[("app", "db"), ("hooked-label", "yes")]), "labels");
    assert_eq!(stop_req.annotations, map(&[("team", "storage"), ("hooked-annotation", "yes")]), "annotations");
    assert_eq!(stop_req, stored_pod, "PostStopPodSandbox after the restart: whole request");
    assert_eq!(
        (&before.pod_labels, &before.pod_annotations, &before.pod_meta),
        (&stop_req.labels, &stop_req.annotations, &stop_req.pod_meta)
    );
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: pod.sandbox_id.clone() })
        .await
        .expect("remove pod");
}

#[tokio::test]
async fn recovery_waits_for_the_runtime_and_covers_pods_the_proxy_never_saw() {
    let env = Containerd::from_env();
    // A pod created directly on containerd, before any proxy runs.
    let mut direct = runtime_client(&env.socket);
    let sandbox = sandbox_config(&env, &unique("direct"), map(&[("app", "direct")]), map(&[("a", "1")]));
    let resources =
        cri::LinuxContainerResources { cpu_shares: 256, memory_limit_in_bytes: 32 << 20, ..Default::default() };
    let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[("FROM", "containerd")]);
    let pod = Pod::start(&mut direct, sandbox, container).await.expect("pod on containerd");

    // The proxy starts while its backend socket does not exist yet.
    let dir = tempfile::Builder::new().prefix("rp-recover-late").tempdir().unwrap();
    let (socket, hooks, late) =
        (dir.path().join("run/rp.sock"), dir.path().join("hooks"), dir.path().join("late.sock"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = hook().await;
    register(&hooks, "recover.json", hook.socket(), "Fail", &STAGES, json!({}));
    let p = proxy(&socket, &late, &hooks, dir.path().join("p.log"));
    assert!(p.wait_log(&["runtime not ready", "store recovery retries"], 0), "{}", p.log());
    let mut rt = runtime_client(&socket);
    let err = rt.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await.expect_err("no runtime yet");
    assert_eq!(err.code(), tonic::Code::Unavailable, "the proxy serves meanwhile: {err:?}");

    std::os::unix::fs::symlink(&env.socket, &late).unwrap();
    assert!(p.wait_log(&["store recovered"], 0), "no recovery once the runtime is up:\n{}", p.log());

    rt.stop_container(cri::StopContainerRequest { container_id: pod.container_id.clone(), timeout: 0 })
        .await
        .expect("stop");
    let req = next_seen(&hook, "PostStopContainer", 0).await.container();
    assert_eq!(
        req.container_meta.as_ref().map(|m| (m.name.as_str(), m.id.as_str())),
        Some(("main", pod.container_id.as_str()))
    );
    assert_eq!(req.pod_cgroup_parent, pod.cgroup_parent());
    assert_eq!(req.pod_labels, map(&[("app", "direct")]));
    assert_eq!(req.pod_annotations, map(&[("a", "1")]));
    assert!(req.container_envs.is_empty(), "envs are not recovered: {:?}", req.container_envs);
    let r = req.container_resources.unwrap();
    assert_eq!((r.cpu_shares, r.memory_limit_in_bytes, r.memory_swap_limit_in_bytes), (256, 32 << 20, 0));
    let parent = pod.cgroup_parent();
    pod.remove(&mut rt).await;
    let Seen::Pod(_, stop) = next_seen(&hook, "PostStopPodSandbox", 0).await else { panic!("pod stage expected") };
    assert_eq!(stop.cgroup_parent, parent);
}
