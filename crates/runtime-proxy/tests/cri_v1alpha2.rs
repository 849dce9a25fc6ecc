//! CRI v1alpha2 (kubelet 1.23–1.25, served by containerd 1.6 and 1.7) gets the same hooks as v1,
//! on the real containerd: a pod made over v1alpha2 gets the example hook's cgroup values and
//! env; pods made over one version and stopped over the other get their post-stop hooks with
//! full pod and container info; a kill -9 restart recovers pods of either version.
//!
//! containerd 2.0 removed CRI v1alpha2: on 2.1 each test asks the runtime first
//! ([`test_support::containerd::serves_v1alpha2`]), checks that its own `UNIMPLEMENTED` comes
//! through the proxy unchanged, and ends there — there is no v1alpha2 pod to make.

use std::sync::Arc;
use std::time::Duration;

use hook_api::v1alpha1::ContainerResourceHookRequest;
use k8s_cri::v1 as cri;
use k8s_cri::v1alpha2 as a2;
use k8s_cri::v1alpha2::runtime_service_client::RuntimeServiceClient as ClientA2;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::hooks::{register, start_example_hook, Seen, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::{runtime_client, runtime_client_v1alpha2, transcode};
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const SHARES_ANNOTATION: &str = "example.runtime-proxy.dev/cpu-shares";
const ALL_STAGES: [&str; 7] = [
    "PreRunPodSandbox",
    "PreCreateContainer",
    "PreStartContainer",
    "PostStartContainer",
    "PreUpdateContainerResources",
    "PostStopContainer",
    "PostStopPodSandbox",
];

fn map<M: FromIterator<(String, String)>>(kv: &[(&str, &str)]) -> M {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// A pod config and a container config (cpu shares 512, env KEEP=me) as kubelet would send them.
fn configs(env: &Containerd, annotations: &[(&str, &str)]) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let sandbox = sandbox_config(env, &unique("alpha"), map(&[("app", "alpha")]), map(annotations));
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    (sandbox, container_config(env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me")]))
}

/// RunPodSandbox, CreateContainer, StartContainer over CRI v1alpha2.
async fn start_v1alpha2(
    rt: &mut ClientA2<Channel>,
    sandbox: cri::PodSandboxConfig,
    container: cri::ContainerConfig,
) -> Pod {
    let sandbox_id = rt
        .run_pod_sandbox(a2::RunPodSandboxRequest { config: Some(transcode(&sandbox)), runtime_handler: String::new() })
        .await
        .expect("v1alpha2 RunPodSandbox")
        .into_inner()
        .pod_sandbox_id;
    let container_id = rt
        .create_container(a2::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(transcode(&container)),
            sandbox_config: Some(transcode(&sandbox)),
        })
        .await
        .expect("v1alpha2 CreateContainer")
        .into_inner()
        .container_id;
    rt.start_container(a2::StartContainerRequest { container_id: container_id.clone() })
        .await
        .expect("v1alpha2 StartContainer");
    Pod { sandbox_id, container_id, config: sandbox }
}

/// StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox over CRI v1alpha2.
async fn remove_v1alpha2(rt: &mut ClientA2<Channel>, pod: &Pod) {
    rt.stop_container(a2::StopContainerRequest { container_id: pod.container_id.clone(), timeout: 0 })
        .await
        .expect("v1alpha2 StopContainer");
    rt.remove_container(a2::RemoveContainerRequest { container_id: pod.container_id.clone() })
        .await
        .expect("v1alpha2 RemoveContainer");
    rt.stop_pod_sandbox(a2::StopPodSandboxRequest { pod_sandbox_id: pod.sandbox_id.clone() })
        .await
        .expect("v1alpha2 StopPodSandbox");
    rt.remove_pod_sandbox(a2::RemovePodSandboxRequest { pod_sandbox_id: pod.sandbox_id.clone() })
        .await
        .expect("v1alpha2 RemovePodSandbox");
}

async fn exec_v1alpha2(rt: &mut ClientA2<Channel>, container_id: &str, script: &str) -> String {
    let out = rt
        .exec_sync(a2::ExecSyncRequest {
            container_id: container_id.into(),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        })
        .await
        .expect("v1alpha2 ExecSync")
        .into_inner();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn v1alpha2_pod_gets_the_example_hooks_cgroup_values_and_env() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-alpha").tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let _hook = start_example_hook(dir.path(), &proxy);
    if !test_support::containerd::serves_v1alpha2(&env, proxy.socket()).await {
        return; // containerd 2.x: CRI v1 only, no v1alpha2 pod to make
    }
    let mut rt = runtime_client_v1alpha2(proxy.socket());

    let (sandbox, container) = configs(&env, &[(SHARES_ANNOTATION, "700")]);
    let pod = start_v1alpha2(&mut rt, sandbox, container).await;
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700", "the hook's cpu shares, not kubelet's 512");
    assert_eq!(
        exec_v1alpha2(&mut rt, &pod.container_id, "echo $HOOKED_BY $CPU_SHARES $KEEP").await,
        "annotation-hook 700 me"
    );

    // PreUpdateContainerResources over v1alpha2: kubelet asks for 256 shares, the hook keeps 700.
    rt.update_container_resources(a2::UpdateContainerResourcesRequest {
        container_id: pod.container_id.clone(),
        linux: Some(a2::LinuxContainerResources {
            cpu_shares: 256,
            memory_limit_in_bytes: 96 << 20,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .expect("v1alpha2 UpdateContainerResources");
    assert_eq!(pod.cgroup_file("cpu", "cpu.shares"), "700");
    assert_eq!(
        pod.cgroup_file("memory", "memory.limit_in_bytes"),
        (96u64 << 20).to_string(),
        "kubelet's other values kept"
    );

    // Without the annotation the hook leaves the pod alone (and the call log names v1alpha2).
    let (sandbox, container) = configs(&env, &[]);
    let plain = start_v1alpha2(&mut rt, sandbox, container).await;
    assert_eq!(plain.cgroup_file("cpu", "cpu.shares"), "512");
    assert!(proxy.count_log(&["/runtime.v1alpha2.RuntimeService/CreateContainer"]) >= 2, "{}", proxy.log());
    remove_v1alpha2(&mut rt, &pod).await;
    remove_v1alpha2(&mut rt, &plain).await;
}

/// A hook server that records every stage and echoes.
async fn recording_hook() -> TestHook {
    TestHook::start(
        Arc::new(|_, req| Ok(hook_api::merge::echo_container(req))),
        Arc::new(|_, req| Ok(hook_api::merge::echo_pod(req))),
    )
    .await
}

/// The first `stage` call for `container_id` (container stages) or any (pod stages) the hook has
/// seen, waiting up to 5 s (post stages run after the client's answer).
async fn seen(hook: &TestHook, stage: &str, container_id: Option<&str>) -> Seen {
    let matches = |s: &Seen| {
        s.stage() == stage
            && match (s, container_id) {
                (Seen::Container(_, r), Some(id)) => r.container_meta.as_ref().is_some_and(|m| m.id == id),
                _ => true,
            }
    };
    let find = || hook.seen().into_iter().find(|s| matches(s));
    test_support::wait_until(Duration::from_secs(5), || async { find().is_some() }).await;
    find().unwrap_or_else(|| panic!("no {stage} call for {container_id:?}: {:?}", hook.seen()))
}

/// Asserts a post-stop container request carries the pod's and the container's full info.
fn assert_full_info(req: &ContainerResourceHookRequest, pod: &Pod, what: &str) {
    let meta = req.pod_meta.as_ref().expect("pod_meta");
    let config_meta = pod.config.metadata.as_ref().unwrap();
    assert_eq!(
        (meta.name.as_str(), meta.uid.as_str()),
        (config_meta.name.as_str(), config_meta.uid.as_str()),
        "{what}: pod_meta"
    );
    assert_eq!(
        req.container_meta.as_ref().map(|m| (m.name.as_str(), m.id.as_str())),
        Some(("main", pod.container_id.as_str())),
        "{what}"
    );
    assert_eq!(req.pod_cgroup_parent, pod.cgroup_parent(), "{what}: pod_cgroup_parent");
    assert_eq!(req.pod_labels, map(&[("app", "alpha")]), "{what}: pod_labels");
    assert_eq!(req.pod_annotations, map(&[("team", "x")]), "{what}: pod_annotations");
    assert!(
        req.container_envs.is_empty(),
        "{what}: container_envs only at PreCreateContainer: {:?}",
        req.container_envs
    );
    assert_eq!(req.container_resources.as_ref().map(|r| r.cpu_shares), Some(512), "{what}: container_resources");
}

#[tokio::test]
async fn pods_made_over_one_version_and_stopped_over_the_other_get_full_post_stop_hooks() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-alpha-mixed").tempdir().unwrap();
    let hook = recording_hook().await;
    register(dir.path(), "record.json", hook.socket(), "Fail", &ALL_STAGES, json!({}));
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "file=record.json"], 0), "{}", proxy.log());
    if !test_support::containerd::serves_v1alpha2(&env, proxy.socket()).await {
        return; // containerd 2.x: CRI v1 only, nothing to stop over v1alpha2
    }
    let (mut v1, mut alpha) = (runtime_client(proxy.socket()), runtime_client_v1alpha2(proxy.socket()));

    // Made over v1, stopped and removed over v1alpha2.
    let (sandbox, container) = configs(&env, &[("team", "x")]);
    let over_v1 = Pod::start(&mut v1, sandbox, container).await.expect("pod over v1");
    // Made over v1alpha2, stopped and removed over v1.
    let (sandbox, container) = configs(&env, &[("team", "x")]);
    let over_alpha = start_v1alpha2(&mut alpha, sandbox, container).await;
    for pod in [&over_v1, &over_alpha] {
        let Seen::Container(_, pre_start) = seen(&hook, "PreStartContainer", Some(&pod.container_id)).await else {
            unreachable!()
        };
        assert_full_info(&pre_start, pod, "PreStartContainer");
    }

    remove_v1alpha2(&mut alpha, &over_v1).await;
    let over_alpha_parent = over_alpha.cgroup_parent();
    let over_alpha_id = over_alpha.container_id.clone();
    over_alpha.remove(&mut v1).await;
    let Seen::Container(_, stop) = seen(&hook, "PostStopContainer", Some(&over_v1.container_id)).await else {
        unreachable!()
    };
    assert_full_info(&stop, &over_v1, "v1 pod, PostStopContainer over v1alpha2");
    let Seen::Container(_, stop) = seen(&hook, "PostStopContainer", Some(&over_alpha_id)).await else { unreachable!() };
    let Seen::Container(_, created) = seen(&hook, "PreStartContainer", Some(&over_alpha_id)).await else {
        unreachable!()
    };
    assert_eq!(stop, created, "v1alpha2 pod, PostStopContainer over v1: what PreStartContainer saw");
    assert_eq!(stop.pod_cgroup_parent, over_alpha_parent);

    let pod_stops = || -> Vec<_> {
        hook.seen()
            .into_iter()
            .filter_map(
                |s| if let Seen::Pod(stage, r) = s { (stage == "PostStopPodSandbox").then_some(r) } else { None },
            )
            .collect()
    };
    test_support::wait_until(Duration::from_secs(5), || async { pod_stops().len() >= 2 }).await;
    let pod_stops = pod_stops();
    for parent in [over_v1.cgroup_parent(), over_alpha_parent] {
        let stop = pod_stops
            .iter()
            .find(|r| r.cgroup_parent == parent)
            .unwrap_or_else(|| panic!("no PostStopPodSandbox for {parent}: {pod_stops:?}"));
        assert_eq!(stop.labels, map(&[("app", "alpha")]));
        assert_eq!(stop.annotations, map(&[("team", "x")]));
        assert!(stop.pod_meta.as_ref().is_some_and(|m| !m.name.is_empty() && !m.uid.is_empty()), "{stop:?}");
    }
}

#[tokio::test]
async fn kill_9_restart_recovers_pods_made_over_either_version() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-alpha-recover").tempdir().unwrap();
    let (socket, hooks) = (dir.path().join("run/rp.sock"), dir.path().join("hooks"));
    std::fs::create_dir_all(&hooks).unwrap();
    let hook = recording_hook().await;
    register(&hooks, "record.json", hook.socket(), "Fail", &ALL_STAGES, json!({}));
    let extra = ["--hook-config-dir", hooks.to_str().unwrap()];

    let mut a = ProxyProcess::spawn(BIN, &socket, &env.socket, &extra, dir.path().join("a.log"));
    a.wait_ready();
    assert!(a.wait_log(&["hook server added", "file=record.json"], 0), "{}", a.log());
    if !test_support::containerd::serves_v1alpha2(&env, &socket).await {
        return; // containerd 2.x: CRI v1 only, no v1alpha2 pod to recover
    }
    let (sandbox, container) = configs(&env, &[("team", "x")]);
    let over_v1 = Pod::start(&mut runtime_client(&socket), sandbox, container).await.expect("pod over v1");
    let (sandbox, container) = configs(&env, &[("team", "x")]);
    let over_alpha = start_v1alpha2(&mut runtime_client_v1alpha2(&socket), sandbox, container).await;

    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(5));
    let mut b = ProxyProcess::spawn(BIN, &socket, &env.socket, &extra, dir.path().join("b.log"));
    b.wait_ready();
    assert!(b.wait_log(&["store recovered"], 0), "no recovery logged:\n{}", b.log());

    // Each pod stopped over the other version after the restart: full info from the rebuilt store.
    let (mut v1, mut alpha) = (runtime_client(&socket), runtime_client_v1alpha2(&socket));
    alpha
        .stop_container(a2::StopContainerRequest { container_id: over_v1.container_id.clone(), timeout: 0 })
        .await
        .expect("stop");
    v1.stop_container(cri::StopContainerRequest { container_id: over_alpha.container_id.clone(), timeout: 0 })
        .await
        .expect("stop");
    for pod in [&over_v1, &over_alpha] {
        let Seen::Container(_, stop) = seen(&hook, "PostStopContainer", Some(&pod.container_id)).await else {
            unreachable!()
        };
        assert_full_info(&stop, pod, "PostStopContainer after the restart");
    }
    test_support::containerd::remove_sandbox(&mut v1, &over_v1.sandbox_id).await;
    test_support::containerd::remove_sandbox(&mut v1, &over_alpha.sandbox_id).await;
}
