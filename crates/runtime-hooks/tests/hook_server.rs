//! The proxy-mode hook server of the real binary, called directly (no proxy, no containerd):
//! requests the default gRPC limits or a strict decoder would refuse.
//!
//! The binary runs with a temp cgroup root (`--cgroup-version v1`), so pod-level writes touch
//! nothing of the machine; the tests look at the hook answers.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use hook_api::v1alpha1::{
    ContainerMetadata, ContainerResourceHookRequest, LinuxContainerResources, PodSandboxHookRequest, PodSandboxMetadata,
};
use hook_api::RuntimeHookServiceClient;

struct Server {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    hooks: Hooks,
}

fn start() -> Server {
    start_with(&[])
}

/// [`start`] with more flags.
fn start_with(extra: &[&str]) -> Server {
    let dir = tempfile::Builder::new().prefix("rh-hook-server").tempdir().unwrap();
    let socket = dir.path().join("hooks.sock");
    let config = dir.path().join("hookserver.d");
    let cgroups = dir.path().join("cgroup");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(&cgroups).unwrap();
    let args = [
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        config.to_str().unwrap(),
        "--cgroup-root",
        cgroups.to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
        "--cgroup-driver",
        "cgroupfs",
    ];
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        eventually(Duration::from_secs(10), || config.join("runtime-hooks.json").exists()),
        "not registered:\n{}",
        hooks.log()
    );
    Server { _dir: dir, socket, hooks }
}

/// A PreCreateContainer request of the issue's BE pod, container "main".
fn be_container_request() -> ContainerResourceHookRequest {
    ContainerResourceHookRequest {
        pod_meta: Some(PodSandboxMetadata {
            name: "big".into(),
            namespace: "default".into(),
            uid: "uid-big".into(),
            attempt: 0,
        }),
        container_meta: Some(ContainerMetadata { name: "main".into(), attempt: 0, id: String::new() }),
        pod_labels: map(&[(QOS, "BE")]),
        pod_annotations: map(&[(SPEC, BE_SPEC)]),
        pod_cgroup_parent: "/kubepods/besteffort/poduid-big".into(),
        container_resources: Some(LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() }),
        ..Default::default()
    }
}

/// koordlet's PreRunPodSandbox answer (`protocol/pod_context.go` `PodResponse.ProxyDone`)
/// carries the pod-level values its hooks computed — for the BE pod BatchResource's sums — over
/// the echoed request's resources (Docker mode's pause container HostConfig); the CFS period is
/// not answered.
#[tokio::test]
async fn the_pod_answer_carries_the_pods_resources() {
    let server = start();
    let mut client = RuntimeHookServiceClient::new(hook_api::connect(&server.socket));
    let req = PodSandboxHookRequest {
        pod_meta: Some(PodSandboxMetadata {
            name: "be".into(),
            namespace: "default".into(),
            uid: "uid-be".into(),
            attempt: 0,
        }),
        labels: map(&[(QOS, "BE")]),
        annotations: map(&[(SPEC, BE_SPEC)]),
        cgroup_parent: "/kubepods/besteffort/poduid-be".into(),
        resources: Some(LinuxContainerResources { cpu_shares: 2, oom_score_adj: -998, ..Default::default() }),
        ..Default::default()
    };
    let answer = client
        .pre_run_pod_sandbox_hook(req)
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log()))
        .into_inner();
    let want = LinuxContainerResources {
        cpu_shares: 512,
        cpu_quota: 100_000,
        memory_limit_in_bytes: 128 << 20,
        oom_score_adj: -998,
        ..Default::default()
    };
    assert_eq!(answer.resources, Some(want), "{}", server.hooks.log());
}

/// koordlet's `--disable-unset-cpu-quota`: a CPU-bound LSR pod keeps its CFS quota (the pod
/// answer has none to set, the container's is echoed); without it, −1 at both levels.
#[tokio::test]
async fn disable_unset_cpu_quota_keeps_the_quota_of_cpu_bound_pods() {
    let pod_req = PodSandboxHookRequest {
        pod_meta: Some(PodSandboxMetadata {
            name: "lsr".into(),
            namespace: "default".into(),
            uid: "uid-lsr".into(),
            attempt: 0,
        }),
        labels: map(&[(QOS, "LSR")]),
        annotations: map(&[("scheduling.koordinator.sh/resource-status", r#"{"cpuset": "0-1"}"#)]),
        cgroup_parent: "/kubepods/poduid-lsr".into(),
        ..Default::default()
    };
    let container_req = ContainerResourceHookRequest {
        pod_meta: pod_req.pod_meta.clone(),
        container_meta: Some(ContainerMetadata { name: "main".into(), attempt: 0, id: String::new() }),
        pod_labels: pod_req.labels.clone(),
        pod_annotations: pod_req.annotations.clone(),
        pod_cgroup_parent: pod_req.cgroup_parent.clone(),
        container_resources: Some(LinuxContainerResources {
            cpu_shares: 2048,
            cpu_period: 100_000,
            cpu_quota: 200_000,
            ..Default::default()
        }),
        ..Default::default()
    };
    for (flags, pod_quota, container_quota) in
        [(&[][..], Some(-1), -1), (&["--disable-unset-cpu-quota"][..], None, 200_000)]
    {
        let server = start_with(flags);
        let mut client = RuntimeHookServiceClient::new(hook_api::connect(&server.socket));
        let pod = client
            .pre_run_pod_sandbox_hook(pod_req.clone())
            .await
            .unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log()));
        assert_eq!(pod.into_inner().resources.map(|r| r.cpu_quota), pod_quota, "{flags:?}");
        let c = client
            .pre_create_container_hook(container_req.clone())
            .await
            .unwrap()
            .into_inner()
            .container_resources
            .unwrap();
        assert_eq!((c.cpuset_cpus.as_str(), c.cpu_quota), ("0-1", container_quota), "{flags:?}");
    }
}

/// kubelet's preStop annotation for a handler of `n` `<` characters: each JSON-escaped to
/// `\u003c`, six bytes.
fn pre_stop_annotation(n: usize) -> String {
    format!(r#"{{"exec":{{"command":["sh","-c","{}"]}}}}"#, r"\u003c".repeat(n))
}

/// A container whose request is over 4 MiB (tonic's default limit) is answered with its
/// values, in an answer the proxies' 4 MiB answer limit takes: the unchanged annotation is not
/// echoed (both proxies merge annotations per key, so it stays as kubelet sent it).
#[tokio::test]
async fn requests_over_four_mib_are_answered() {
    let server = start();
    let mut req = be_container_request();
    let annotation = pre_stop_annotation(1_000_000); // 6 MB of escapes
    req.container_annotations = map(&[("io.kubernetes.container.preStopHandler", &annotation)]);
    assert!(prost::Message::encoded_len(&req) > 5 << 20);
    let mut client = RuntimeHookServiceClient::new(hook_api::connect(&server.socket))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let answer = client
        .pre_create_container_hook(req)
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log()))
        .into_inner();
    let r = answer.container_resources.clone().expect("resources");
    assert_eq!(
        (r.cpu_shares, r.cpu_period, r.cpu_quota, r.memory_limit_in_bytes),
        (512, 100_000, 100_000, 134_217_728)
    );
    assert!(answer.container_annotations.is_empty(), "{:?}", answer.container_annotations.keys());
    assert!(prost::Message::encoded_len(&answer) < 4 << 20);
    // A small request's container annotations are not echoed either: no plugin reads them.
    let mut small = be_container_request();
    small.container_annotations = map(&[("io.kubernetes.container.preStopHandler", &pre_stop_annotation(10))]);
    let answer = client.pre_create_container_hook(small.clone()).await.unwrap().into_inner();
    assert!(answer.container_annotations.is_empty(), "{:?}", answer.container_annotations);
}

/// A lenient peer's request with bytes that are not UTF-8 (a pod annotation, a container env
/// value): prost would refuse it; the server answers with the BE pod's values, and the answer
/// leaves those entries out (both proxies merge per key: they stay as kubelet sent them).
/// (With a plugin setting an env, the echo leaves it out too: `memory` below and hook_wire's
/// unit tests.)
#[tokio::test]
async fn requests_with_bytes_that_are_not_utf8_are_answered() {
    use prost::Message;
    use test_support::raw::{self, NOT_UTF8};
    let server = start();
    let mut req = be_container_request();
    req.pod_annotations.insert("note".into(), "PLACEHL1".into());
    req.container_envs = map(&[("TOKEN", "PLACEHL2"), ("PATH", "/bin")]);
    let wire = raw::with_bytes(&raw::with_bytes(&req.encode_to_vec(), "PLACEHL1", NOT_UTF8), "PLACEHL2", NOT_UTF8);
    assert!(ContainerResourceHookRequest::decode(wire.clone()).is_err(), "prost would refuse it");
    let channel = hook_api::connect(&server.socket);
    let path = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook";
    let answer = raw::unary(channel.clone(), path, tonic::Request::new(wire))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log()));
    let answer =
        hook_api::v1alpha1::ContainerResourceHookResponse::decode(answer.into_inner()).expect("a valid answer");
    let r = answer.container_resources.clone().expect("resources");
    assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes), (512, 100_000, 134_217_728));
    assert!(answer.container_envs.is_empty(), "no plugin sets an env: none echoed, the one with bytes neither");
    // Unknown methods are UNIMPLEMENTED, as tonic's generated server answers them.
    let e = raw::unary(channel, "/runtime.v1alpha1.RuntimeHookService/Nope", tonic::Request::new(Default::default()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
}

/// The same 6 MB request from Python's grpcio (gRPC C-core), a client we did not write the gRPC
/// side of (`tests/clients/big_hook_request.py`, run with the venv and stubs of runtime-proxy's
/// `tests/clients/setup.sh`: `test_support::clients::setup_dir`).
#[tokio::test]
async fn requests_over_four_mib_from_grpcio_are_answered() {
    let setup_dir = test_support::clients::setup_dir();
    let server = start();
    let out = std::process::Command::new(setup_dir.join("venv/bin/python"))
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/big_hook_request.py"))
        .arg("--socket")
        .arg(&server.socket)
        .args(["--n", "1000000"])
        .env("PYTHONPATH", setup_dir.join("gen"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("running big_hook_request.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let answer: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert!(answer["request_bytes"].as_u64().unwrap_or(0) > 5 << 20, "{answer}");
    assert_eq!(
        (&answer["cpu_shares"], &answer["cpu_period"], &answer["cpu_quota"], &answer["memory_limit_in_bytes"]),
        (&512.into(), &100_000.into(), &100_000.into(), &134_217_728.into()),
        "{answer}\n{}",
        server.hooks.log()
    );
    assert_eq!(answer["annotations"], 0, "the unchanged 6 MB annotation is not echoed: {answer}");
}

/// `--feature-gates` in koordlet's names: the gates that are off take their plugins' stages out
/// of the registration; an unknown name, or a gate koordlet has but runtime-hooks does not
/// implement yet, is refused at start with exit code 2 and a message naming it.
#[test]
fn feature_gates_choose_the_plugins_and_refuse_what_they_do_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hookserver.d");
    let cgroups = dir.path().join("cgroup");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(&cgroups).unwrap();
    let socket = dir.path().join("hooks.sock");
    let base = [
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        config.to_str().unwrap(),
        "--cgroup-root",
        cgroups.to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
    ];
    for (gates, needle) in [
        ("GroupIdentiy=true", "unknown feature gate \"GroupIdentiy\""),
        ("CPUNormalization=maybe", "\"maybe\" is not a boolean"),
    ] {
        let out = std::process::Command::new(HOOKS_BIN).args(base).args(["--feature-gates", gates]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{gates}: {stderr}");
        assert!(stderr.contains(needle), "{gates}: {stderr}");
    }
    let mut args = base.to_vec();
    args.extend(["--feature-gates", "BatchResource=false,CPUSetAllocator=false"]);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    let file = config.join("runtime-hooks.json");
    assert!(eventually(Duration::from_secs(10), || file.exists()), "not registered:\n{}", hooks.log());
    let registration: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(registration["runtime-hooks"], serde_json::json!(["PreRunPodSandbox"]), "GroupIdentity's stage only");
    assert!(
        hooks.log().contains("feature_gates=GroupIdentity=true,BatchResource=false,CPUSetAllocator=false"),
        "{}",
        hooks.log()
    );
}

/// The server's peak resident memory (`VmHWM`), bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).expect("VmHWM").trim().trim_end_matches(" kB").trim();
    kb.parse::<u64>().unwrap() * 1024
}

/// `n` envs of 5-byte names and 1-byte values: 12 bytes each on the wire, as the pod of
/// 1.3 M entries (`envFrom` large ConfigMaps) whose 14.9 MiB CreateContainer took runtime-hooks
/// from 18 to 180 MB.
fn many_envs(n: usize) -> std::collections::BTreeMap<String, String> {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    (0..n)
        .map(|i| {
            let name: String = (0..4).rev().map(|d| DIGITS[(i / 36usize.pow(d)) % 36] as char).collect();
            (format!("K{name}"), "1".to_string())
        })
        .collect()
}

/// runtime-hooks' memory is bounded by what its plugins read: a 14.9 MiB PreCreateContainer
/// request of 1.3 M envs, four at once, is answered with the BE values and no echo, and the
/// server's peak RSS stays far below the 180 MB one such request took when every env was
/// decoded into a map. With GPUEnvInject setting an env, the answer carries every env of the
/// request (koord-runtime-proxy replaces the whole env with the answer's), echoed from the
/// request's bytes. A request over the 20 MiB limit is refused with RESOURCE_EXHAUSTED, and the
/// server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_bounded_by_what_plugins_read() {
    let server = start_with(&["--feature-gates", "GPUEnvInject=true"]);
    let client = RuntimeHookServiceClient::new(hook_api::connect(&server.socket))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
    let mut req = be_container_request();
    req.container_envs = many_envs(1_300_000);
    let size = prost::Message::encoded_len(&req);
    assert!(size > 14 << 20 && size < 16 << 20, "{size}");
    let base = peak_rss(server.hooks.pid());
    let calls = (0..4).map(|_| {
        let (mut client, req) = (client.clone(), req.clone());
        tokio::spawn(async move { client.pre_create_container_hook(req).await })
    });
    for call in futures::future::join_all(calls).await {
        let answer = call.unwrap().unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log())).into_inner();
        let r = answer.container_resources.clone().expect("resources");
        assert_eq!((r.cpu_shares, r.cpu_quota, r.memory_limit_in_bytes), (512, 100_000, 134_217_728));
        assert!(answer.container_envs.is_empty() && answer.container_annotations.is_empty());
    }
    let peak = peak_rss(server.hooks.pid());
    eprintln!(
        "runtime-hooks VmHWM: {} MB at start, {} MB after four 14.9 MiB requests at once",
        base >> 20,
        peak >> 20
    );
    assert!(peak < 100 << 20, "peak RSS {} MB (base {} MB)", peak >> 20, base >> 20);

    // A plugin sets an env: every env of the request is echoed, the plugin's value over it.
    req.pod_annotations
        .insert("scheduling.koordinator.sh/device-allocated".into(), r#"{"gpu": [{"minor": 1}]}"#.into());
    req.container_envs.insert("NVIDIA_VISIBLE_DEVICES".into(), "all".into());
    req.container_envs.insert("TOKEN".into(), "PLACEHLD".into());
    let wire =
        test_support::raw::with_bytes(&prost::Message::encode_to_vec(&req), "PLACEHLD", test_support::raw::NOT_UTF8);
    let path = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook";
    let answer = test_support::raw::unary(hook_api::connect(&server.socket), path, tonic::Request::new(wire))
        .await
        .unwrap_or_else(|s| panic!("{s:?}\n{}", server.hooks.log()));
    let answer: hook_api::v1alpha1::ContainerResourceHookResponse =
        prost::Message::decode(answer.into_inner()).expect("valid UTF-8 protobuf");
    assert_eq!(answer.container_envs.len(), 1_300_001, "every env but the one with bytes");
    assert_eq!(answer.container_envs["NVIDIA_VISIBLE_DEVICES"], "1");
    assert_eq!(answer.container_envs["K0000"], "1");
    assert!(!answer.container_envs.contains_key("TOKEN"));
    let peak = peak_rss(server.hooks.pid());
    eprintln!("runtime-hooks VmHWM: {} MB after the answer echoing 1.3 M envs", peak >> 20);
    assert!(peak < 100 << 20, "peak RSS {} MB", peak >> 20);

    // Over the limit: refused before it is read, and the server goes on.
    let mut huge = be_container_request();
    huge.container_envs = map(&[("BIG", &"x".repeat(21 << 20))]);
    let e = client.clone().pre_create_container_hook(huge).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("20971520"), "{e:?}");
    let answer = client.clone().pre_create_container_hook(be_container_request()).await.unwrap().into_inner();
    assert_eq!(answer.container_resources.map(|r| r.cpu_shares), Some(512));
}
