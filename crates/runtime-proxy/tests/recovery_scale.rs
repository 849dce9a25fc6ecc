//! Restart recovery at node scale: 200 running containers (20 pods × 10) are read back from a real
//! containerd, every field right; and 200 pods × 4 containers from a stand-in runtime
//! (`test_support::fake_node`), every container with its own pod. (Their times are measured in
//! `benches/store.rs` and `benches/node_scale.rs`.)

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_cri::v1 as cri;
use runtime_proxy::cri::recover::rebuild;
use runtime_proxy::grpc::backend::Backend;
use runtime_proxy::hooks::store::Store;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::fake_node::{FakeNode, NodeShape};
use test_support::runtime_client;

const PODS: usize = 20;
const PER_POD: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_containers_recover_every_field() {
    let env = Containerd::from_env();
    // Pods in parallel, the containers of a pod one after the other.
    let mut tasks = Vec::new();
    for p in 0..PODS {
        let env = env.clone();
        tasks.push(tokio::spawn(async move {
            let mut rt = runtime_client(&env.socket);
            let labels = HashMap::from([("pod".to_string(), p.to_string())]);
            let config = sandbox_config(&env, &unique("scale"), labels, HashMap::new());
            let sid = rt
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                })
                .await
                .expect("RunPodSandbox")
                .into_inner()
                .pod_sandbox_id;
            let mut containers = Vec::new();
            for c in 0..PER_POD {
                let n = p * PER_POD + c;
                let resources = cri::LinuxContainerResources { cpu_shares: 2 + n as i64, ..Default::default() };
                let idx = n.to_string();
                let cc =
                    container_config(&env, &format!("c{c}"), &["sleep", "3600"], Some(resources), &[("IDX", &idx)]);
                let req = cri::CreateContainerRequest {
                    pod_sandbox_id: sid.clone(),
                    config: Some(cc),
                    sandbox_config: Some(config.clone()),
                };
                let cid = rt.create_container(req).await.expect("CreateContainer").into_inner().container_id;
                rt.start_container(cri::StartContainerRequest { container_id: cid.clone() })
                    .await
                    .expect("StartContainer");
                containers.push((cid, n));
            }
            (sid, config, containers)
        }));
    }
    let mut pods = Vec::new();
    for t in tasks {
        pods.push(t.await.expect("pod task"));
    }

    let runtime = std::sync::Arc::new(Backend::new(&env.socket));
    let mut times = Vec::new();
    for _ in 0..3 {
        let store = std::sync::Arc::new(Store::new());
        let report = rebuild(&runtime, &store).await.expect("rebuild");
        assert!(report.skipped.is_empty() && report.fallbacks.is_empty(), "{report:?}");
        times.push(report.elapsed);
        for (sid, config, containers) in &pods {
            let parent = &config.linux.as_ref().unwrap().cgroup_parent;
            assert_eq!(&store.pod(sid).expect("pod recovered").cgroup_parent, parent);
            for (cid, n) in containers {
                let c = store.container(cid).expect("container recovered");
                assert_eq!(&c.sandbox_id, sid);
                assert_eq!(&c.hook.pod_cgroup_parent, parent);
                assert!(c.hook.container_envs.is_empty(), "envs are not kept: {:?}", c.hook.container_envs);
                assert_eq!(c.hook.container_resources.as_ref().map(|r| r.cpu_shares), Some(2 + *n as i64));
            }
        }
        eprintln!(
            "rebuild: {} pod sandboxes, {} containers listed; {} + {} recovered in {:?}",
            report.listed.0, report.listed.1, report.pods, report.containers, report.elapsed
        );
    }
    // The proxy itself (one-thread runtime, as in production) logs its start-up recovery.
    let proxy = test_support::proxy::ProxyProcess::start(env!("CARGO_BIN_EXE_runtime-proxy"), &env.socket, &[]);
    assert!(proxy.wait_log(&["store recovered"], 0), "{}", proxy.log());
    let line = proxy.log().lines().find(|l| l.contains("store recovered")).unwrap_or_default().to_owned();
    eprintln!("proxy: {}", &line[line.find("store recovered").unwrap_or(0)..]);

    let mut rt = runtime_client(&env.socket);
    for (sid, _, _) in &pods {
        remove_sandbox(&mut rt, sid).await;
    }
    // How long it takes is measured by `make bench` (benches/store.rs), not asserted here.
    times.sort();
    eprintln!("median rebuild {:?} (all: {times:?}); target < 1 s", times[1]);
}

/// The map as the store keeps it (sorted).
fn sorted(m: &HashMap<String, String>) -> BTreeMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[tokio::test]
async fn a_stand_in_node_recovers_every_container_with_its_own_pod() {
    let node = Arc::new(FakeNode::new(&NodeShape { pods: 200, per_pod: 4, pod_annotation_bytes: 100 }));
    let fake = FakeBackend::start(Behaviour::Node(node.clone())).await;
    let store = std::sync::Arc::new(Store::new());
    let report = rebuild(&std::sync::Arc::new(Backend::new(fake.socket())), &store).await.expect("rebuild");
    assert_eq!(report.listed, (200, 800), "{report:?}");
    assert_eq!((report.pods, report.containers), (200, 800), "{report:?}");
    assert!(report.skipped.is_empty() && report.fallbacks.is_empty(), "{report:?}");
    assert_eq!(store.len(), (200, 800));
    for pod in &node.pods {
        let got = store.pod(&pod.sandbox_id).expect("pod recovered");
        let meta = got.pod_meta.as_ref().expect("pod metadata");
        assert_eq!((&meta.name, &meta.uid), (&pod.metadata.name, &pod.metadata.uid));
        assert_eq!(got.labels, sorted(&pod.labels));
        assert_eq!(got.annotations, sorted(&pod.annotations));
        assert_eq!(got.cgroup_parent, pod.cgroup_parent);
        for c in &pod.containers {
            let entry = store.container(&c.id).unwrap_or_else(|| panic!("container {} not recovered", c.id));
            assert_eq!(entry.sandbox_id, pod.sandbox_id, "container {} under its own pod", c.id);
            let hook = entry.hook;
            assert_eq!(hook.pod_meta, got.pod_meta, "container {}: its pod's metadata", c.id);
            assert_eq!(hook.pod_labels, got.labels, "container {}: its pod's labels", c.id);
            assert_eq!(hook.pod_annotations, got.annotations, "container {}: its pod's annotations", c.id);
            assert_eq!(hook.pod_cgroup_parent, pod.cgroup_parent, "container {}: its pod's cgroup parent", c.id);
            let meta = hook.container_meta.as_ref().expect("container metadata");
            assert_eq!((meta.name.as_str(), meta.id.as_str()), (c.name.as_str(), c.id.as_str()));
            assert_eq!(hook.container_annotations, sorted(&c.annotations));
            assert_eq!(hook.container_resources.as_ref().map(|r| r.cpu_shares), Some(c.cpu_shares));
        }
    }
}

/// A status answer that is not a protobuf message is reported with the reason and skipped (the
/// pod's containers with it), and every other object is recovered: the answers are decoded on the
/// recording thread, whose failures are the report's, never the rebuild's.
#[tokio::test]
async fn a_status_answer_that_is_not_protobuf_skips_that_object_alone() {
    let mut node = FakeNode::new(&NodeShape { pods: 20, per_pod: 2, pod_annotation_bytes: 0 });
    let bad_pod = node.pods[3].clone();
    let bad_container = node.pods[7].containers[1].id.clone();
    node.garble_status(&bad_pod.sandbox_id);
    node.garble_status(&bad_container);
    let fake = FakeBackend::start(Behaviour::Node(Arc::new(node))).await;
    let store = std::sync::Arc::new(Store::new());
    let report = rebuild(&std::sync::Arc::new(Backend::new(fake.socket())), &store).await.expect("rebuild");
    assert_eq!(report.listed, (20, 40), "{report:?}");
    assert_eq!((report.pods, report.containers), (19, 37), "{report:?}");
    let reason = |id: &str| report.skipped.iter().find(|n| n.id == id).map(|n| n.text.clone()).unwrap_or_default();
    assert!(reason(&bad_pod.sandbox_id).contains("PodSandboxStatus answer cannot be decoded"), "{report:?}");
    assert!(reason(&bad_container).contains("ContainerStatus answer cannot be decoded"), "{report:?}");
    for c in &bad_pod.containers {
        assert!(reason(&c.id).contains("was not recovered"), "{report:?}");
    }
    assert_eq!(report.skipped.len(), 4, "{report:?}");
    assert!(store.pod(&bad_pod.sandbox_id).is_none() && store.container(&bad_container).is_none());
    assert_eq!(store.len(), (19, 37));
}
