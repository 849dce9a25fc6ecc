//! What hooks cost. Two measurements, each printed as a markdown table:
//!
//! 1. **Intercepted CreateContainer**: the latency one no-op hook server adds. An in-process fake
//!    backend answers every call at once; four paths are called in turn with the same
//!    kubelet-like request, call by call interleaved: (1) direct to the fake backend, (2) through
//!    a proxy with no hook server, (3) through a second proxy with one echoing hook server
//!    registered for PreCreateContainer, (4) that hook server's RPC alone, called directly with
//!    the hook request the proxy builds, (5) the same request through the proxy of (2) on a
//!    path it does not intercept (the pass-through). The hook server runs in a process of its
//!    own (this bench, started again), so (4) crosses the same process boundaries as the
//!    proxy's call to it; the fake backend runs in the bench's own thread, so (1) crosses
//!    none. The targets: intercepted without a hook, p50(2) − p50(5) ≤ 20 µs; with
//!    the no-op hook, p50(3) ≤ p50(5) + p50(4) + 40 µs.
//!
//!    The CRI calls are made the way kubelet's grpc-go makes them: HEADERS, then one DATA frame
//!    that carries the message *and* END_STREAM, with a 2-minute `grpc-timeout`. A tonic client
//!    instead sends END_STREAM in a separate empty DATA frame, written separately; the proxy
//!    must read a whole request before calling hooks, so it often wakes up twice per call,
//!    which adds the cost of one more cross-process wake-up that kubelet does not cause.
//!    `RP_BENCH_CLIENT=tonic` measures with tonic's client instead. The hook RPC (4) is always
//!    made with tonic's client (the proxy makes it with its own HTTP/2 client), with the
//!    proxy's default 2 s per-hook deadline.
//! 2. **50 pods concurrently**: against the real containerd, through a proxy with one hook
//!    server that takes 100 ms per call at PreRunPodSandbox, PreCreateContainer and
//!    PreStartContainer. Wall time of 1 pod alone and of 50 pods started at once
//!    (RunPodSandbox + CreateContainer + StartContainer each), also directly on containerd for
//!    comparison. A proxy that serialised hook calls would need ≥ 50 × 3 × 100 ms = 15 s.
//!
//! Run: `make bench` (starts containerd; or `RP_CONTAINERD_ENV=… cargo bench -p runtime-proxy
//! --bench hooks`; without `RP_CONTAINERD_ENV` only the first measurement runs).
//! `RP_BENCH_CALLS` sets the measured calls per path of the first (default 3000),
//! `RP_BENCH_CLIENT=tonic` its CRI client (default: kubelet-like framing, see above).
//! `RP_BENCH_PROXY_BIN` with `RP_BENCH_WRAP=plain` (or `hooked`) runs another program as the
//! proxy without hook (or with it), e.g. a script that execs it under valgrind; both proxies
//! are stopped with SIGTERM after the first measurement.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use common::{percentile, us, usage};
use hook_api::v1alpha1::{
    self as hook, ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest,
    PodSandboxHookResponse,
};
use hook_api::{RuntimeHookService, RuntimeHookServiceClient, RuntimeHookServiceServer};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use prost::Message;
use serde_json::json;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use test_support::fake_backend::{grpc_frame, Behaviour, FakeBackend};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The daemons' allocator here too, so that the bench's own processes (the client, the no-op
/// hook server, the fake backend) allocate as the proxy does: (4), the hook RPC alone, is then
/// made with the allocator the proxy's hook client has, and the comparison is of their work.
#[global_allocator]
static ALLOCATOR: daemon_support::alloc::Allocator = daemon_support::alloc::Allocator;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");
const WARM_UP: usize = 500;
const PODS: usize = 50;
const HOOK_DELAY: Duration = Duration::from_millis(100);
/// Label on every bench pod sandbox, so that leftovers can be found and removed.
const BENCH_LABEL: &str = "runtime-proxy-bench";

/// Set in the environment of the bench started again as the no-op hook server.
const HOOK_CHILD: &str = "RP_BENCH_HOOK_CHILD";

/// The no-op hook server's process: prints its socket, serves until its stdin closes, then
/// prints how many hook calls it answered.
async fn serve_noop_hook() {
    use tokio::io::AsyncReadExt;
    let noop = TestHook::echoing(|_, _| {}).await;
    println!("{}", noop.socket().display());
    let _ = tokio::io::stdin().read_to_end(&mut Vec::new()).await;
    println!("{}", noop.seen().len());
}

/// The bench started again as the no-op hook server ([`serve_noop_hook`]).
struct HookProcess {
    child: std::process::Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    socket: PathBuf,
}

impl HookProcess {
    fn start() -> HookProcess {
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("the bench's path");
        let mut child = std::process::Command::new(exe)
            .env(HOOK_CHILD, "1")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the hook server process");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("the hook server's socket");
        HookProcess { child, stdout, socket: PathBuf::from(line.trim()) }
    }

    /// Stops the server; how many hook calls it answered.
    fn stop(mut self) -> usize {
        use std::io::BufRead;
        drop(self.child.stdin.take());
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("the hook server's count");
        let _ = self.child.wait();
        line.trim().parse().expect("a count")
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let calls: usize = std::env::var("RP_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    // info: the registry's "hook server added" line, and no line per call.
    std::env::set_var("RP_TEST_LOG", "info");
    if std::env::var_os(HOOK_CHILD).is_some() {
        return serve_noop_hook().await;
    }
    intercepted_create(calls).await;
    println!();
    if std::env::var_os("RP_CONTAINERD_ENV").is_some() {
        concurrent_pods(&Containerd::from_env()).await;
    } else {
        println!("(50 pods concurrently: skipped, RP_CONTAINERD_ENV is not set; `make bench` sets it)");
    }
}

/// A temp dir to use as `--hook-config-dir`.
fn hook_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("rp-bench-hookd").tempdir().expect("temp dir")
}

/// Starts a proxy in front of `backend` watching `dir`; registers `hook` (if any) there for
/// `stages` and waits until the proxy has taken it up.
fn proxy(backend: &Path, dir: &Path, hook: Option<(&str, &Path, &[&str])>) -> ProxyProcess {
    // RP_BENCH_PROXY_BIN (with RP_BENCH_WRAP=plain or hooked): another program to start as
    // that proxy (e.g. a script that execs it under `valgrind --tool=callgrind`); it is stopped
    // with SIGTERM after the first measurement.
    let which = if hook.is_some() { "hooked" } else { "plain" };
    let wrapped =
        std::env::var("RP_BENCH_PROXY_BIN").ok().filter(|_| std::env::var("RP_BENCH_WRAP").as_deref() == Ok(which));
    let proxy = ProxyProcess::start(
        wrapped.as_deref().unwrap_or(BIN),
        backend,
        &["--hook-config-dir", dir.to_str().expect("utf-8 temp dir")],
    );
    if let Some((name, socket, stages)) = hook {
        register(dir, name, socket, "Fail", stages, json!({}));
        let file = format!("file={name}");
        assert!(proxy.wait_log(&["hook server added", &file], 0), "the proxy did not take up {name}:\n{}", proxy.log());
    }
    proxy
}

// ---------------------------------------------------------------------------------------------
// 1. Intercepted CreateContainer

/// A CreateContainerRequest as kubelet sends it for a Deployment's nginx container: service
/// account and /etc/hosts mounts, service envs, kubelet's labels and annotations, resources,
/// a security context with the masked and read-only paths, the full sandbox config.
fn kubelet_create_request() -> cri::CreateContainerRequest {
    let uid = "8f4e1c2a-3b5d-4e6f-9a7b-1c2d3e4f5a6b";
    let pod = "web-7d9c6b5f4-x2x8q";
    let map = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>();
    let pod_labels = map(&[
        ("app", "web"),
        ("pod-template-hash", "7d9c6b5f4"),
        ("io.kubernetes.pod.name", pod),
        ("io.kubernetes.pod.namespace", "default"),
        ("io.kubernetes.pod.uid", uid),
    ]);
    let pod_annotations = map(&[
        ("kubernetes.io/config.seen", "2024-05-01T10:00:00.000000000Z"),
        ("kubernetes.io/config.source", "api"),
        ("example.runtime-proxy.dev/cpu-shares", "700"),
    ]);
    let image = "registry.k8s.io/nginx@sha256:0f0f6a3ed6a4e2cbbba1c7b0d5bd0c3d5d7b3b5c6b1f5a4e3d2c1b0a9f8e7d6c";
    let mount = |container_path: &str, host_path: &str, readonly: bool| cri::Mount {
        container_path: container_path.into(),
        host_path: host_path.into(),
        readonly,
        ..Default::default()
    };
    let pod_dir = format!("/var/lib/kubelet/pods/{uid}");
    let config = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "nginx".into(), attempt: 0 }),
        image: Some(cri::ImageSpec {
            image: image.into(),
            user_specified_image: "nginx:1.25".into(),
            ..Default::default()
        }),
        command: vec!["/docker-entrypoint.sh".into()],
        args: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
        working_dir: String::new(),
        envs: [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("LOG_LEVEL", "info"),
        ]
        .iter()
        .map(|(k, v)| cri::KeyValue { key: k.to_string(), value: v.to_string() })
        .collect(),
        mounts: vec![
            mount(
                "/var/run/secrets/kubernetes.io/serviceaccount",
                &format!("{pod_dir}/volumes/kubernetes.io~projected/kube-api-access-9xk2p"),
                true,
            ),
            mount("/etc/hosts", &format!("{pod_dir}/etc-hosts"), false),
            mount("/dev/termination-log", &format!("{pod_dir}/containers/nginx/5f1e2d3c"), false),
        ],
        labels: map(&[
            ("io.kubernetes.container.name", "nginx"),
            ("io.kubernetes.pod.name", pod),
            ("io.kubernetes.pod.namespace", "default"),
            ("io.kubernetes.pod.uid", uid),
        ]),
        annotations: map(&[
            ("io.kubernetes.container.hash", "b1e3a0c4"),
            ("io.kubernetes.container.restartCount", "0"),
            ("io.kubernetes.container.terminationMessagePath", "/dev/termination-log"),
            ("io.kubernetes.container.terminationMessagePolicy", "File"),
            ("io.kubernetes.pod.terminationGracePeriod", "30"),
            ("io.kubernetes.container.ports", r#"[{"name":"http","containerPort":80,"protocol":"TCP"}]"#),
        ]),
        log_path: "nginx/0.log".into(),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 256 << 20,
                oom_score_adj: 968,
                unified: map(&[("memory.oom.group", "1")]),
                ..Default::default()
            }),
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: cri::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                run_as_user: Some(cri::Int64Value { value: 101 }),
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                }),
                masked_paths: [
                    "/proc/asound",
                    "/proc/acpi",
                    "/proc/kcore",
                    "/proc/keys",
                    "/proc/latency_stats",
                    "/proc/timer_list",
                    "/proc/timer_stats",
                    "/proc/sched_debug",
                    "/proc/scsi",
                    "/sys/firmware",
                    "/sys/devices/virtual/powercap",
                ]
                .map(String::from)
                .to_vec(),
                readonly_paths: ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
                    .map(String::from)
                    .to_vec(),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: pod.into(),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: pod.into(),
        log_directory: format!("/var/log/pods/default_{pod}_{uid}"),
        dns_config: Some(cri::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into(), "cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        port_mappings: vec![cri::PortMapping {
            protocol: cri::Protocol::Tcp as i32,
            container_port: 80,
            ..Default::default()
        }],
        labels: pod_labels,
        annotations: pod_annotations,
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/burstable/pod{uid}"),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    pid: cri::NamespaceMode::Container as i32,
                    ..Default::default()
                }),
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 256 << 20,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    cri::CreateContainerRequest {
        pod_sandbox_id: "0d8c5a3f4b2e1d7c9a6b5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c".into(),
        config: Some(config),
        sandbox_config: Some(sandbox_config),
    }
}

/// The PreCreateContainer request the proxy builds from `req` for a pod it has not seen
/// (its fields from `sandbox_config`), as `intercept.rs` builds it.
fn hook_request(req: &cri::CreateContainerRequest) -> ContainerResourceHookRequest {
    let config = req.config.clone().unwrap_or_default();
    let sandbox = req.sandbox_config.clone().unwrap_or_default();
    let pod = sandbox.metadata.unwrap_or_default();
    let linux = sandbox.linux.unwrap_or_default();
    let meta = config.metadata.unwrap_or_default();
    let resources = config.linux.and_then(|l| l.resources).unwrap_or_default();
    ContainerResourceHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: pod.name,
            uid: pod.uid,
            namespace: pod.namespace,
            attempt: pod.attempt,
        }),
        container_meta: Some(hook::ContainerMetadata { name: meta.name, attempt: meta.attempt, id: String::new() }),
        container_annotations: config.annotations.into_iter().collect(),
        container_resources: Some(hook_api::convert::to_hook(&resources)),
        pod_resources: linux.resources.as_ref().map(hook_api::convert::to_hook),
        pod_annotations: sandbox.annotations.into_iter().collect(),
        pod_labels: sandbox.labels.into_iter().collect(),
        pod_cgroup_parent: linux.cgroup_parent,
        container_envs: config.envs.into_iter().map(|kv| (kv.key, kv.value)).collect(),
    }
}

async fn intercepted_create(calls: usize) {
    let request = kubelet_create_request();
    // The fake answers every call with this message; as a RunPodSandboxResponse (same field 1)
    // it carries the request's sandbox ID, so one RunPodSandbox through each proxy below makes
    // the pod known to its store, as it is on a node (no store miss on every CreateContainer).
    let answer = cri::CreateContainerResponse { container_id: request.pod_sandbox_id.clone() }.encode_to_vec();
    let backend = FakeBackend::start(Behaviour::ok(&answer)).await;
    let noop = HookProcess::start();
    let (plain_dir, hooked_dir) = (hook_dir(), hook_dir());
    let plain_proxy = proxy(backend.socket(), plain_dir.path(), None);
    let hooked_proxy =
        proxy(backend.socket(), hooked_dir.path(), Some(("noop.json", &noop.socket, &["PreCreateContainer"])));

    for proxy in [&plain_proxy, &hooked_proxy] {
        let run = cri::RunPodSandboxRequest { config: request.sandbox_config.clone(), runtime_handler: String::new() };
        test_support::raw::unary(
            test_support::channel(proxy.socket()),
            "/runtime.v1.RuntimeService/RunPodSandbox",
            tonic::Request::new(bytes::Bytes::from(run.encode_to_vec())),
        )
        .await
        .expect("RunPodSandbox through the proxy");
    }
    let hook_req = hook_request(&request);
    let kind = ClientKind::from_env();
    let mut clients = Vec::new();
    for socket in [backend.socket(), plain_proxy.socket(), hooked_proxy.socket()] {
        clients.push(CriClient::connect(kind, socket).await);
    }
    let mut hook_client = RuntimeHookServiceClient::new(hook_api::connect(&noop.socket));
    let body = grpc_frame(&request.encode_to_vec());

    // [path]: 0 direct, 1 proxy without hook, 2 proxy with the no-op hook, 3 the hook RPC alone,
    // 4 the same request through the proxy without hook on a path it does not intercept
    let mut samples: [Vec<Duration>; 5] = Default::default();
    let mut cpu_before = [Duration::ZERO; 2];
    for i in 0..(calls + WARM_UP) {
        if i == WARM_UP {
            cpu_before = [cpu_time(plain_proxy.pid()), cpu_time(hooked_proxy.pid())];
        }
        for (path, s) in samples.iter_mut().enumerate() {
            let took = if path < 3 || path == 4 {
                let (req, body) = (request.clone(), body.clone());
                let (client, grpc_path) = if path == 4 { (1, PASS_THROUGH) } else { (path, CREATE) };
                let start = Instant::now();
                let id = clients[client].create_container(req, body, grpc_path).await;
                let took = start.elapsed();
                assert_eq!(id, request.pod_sandbox_id, "path {path}");
                took
            } else {
                let mut req = Request::new(hook_req.clone());
                req.set_timeout(Duration::from_secs(2));
                let start = Instant::now();
                hook_client.pre_create_container_hook(req).await.expect("PreCreateContainerHook");
                start.elapsed()
            };
            if i >= WARM_UP {
                s.push(took);
            }
        }
    }
    let cpu = [cpu_time(plain_proxy.pid()) - cpu_before[0], cpu_time(hooked_proxy.pid()) - cpu_before[1]];
    if std::env::var_os("RP_BENCH_PROXY_BIN").is_some() {
        for mut proxy in [plain_proxy, hooked_proxy] {
            proxy.signal(libc::SIGTERM);
            proxy.wait_exit(Duration::from_secs(60));
        }
    }
    // The proxy without hook served paths (2) and (5): its CPU time is per call of either.
    let cpu_per_call = |i: usize| format!("{:.0} µs", us(cpu[i]) / (calls * if i == 0 { 2 } else { 1 }) as f64);
    // Every call through the hooked proxy and every direct hook call reached the hook.
    drop(hook_client);
    let seen = noop.stop();
    assert_eq!(seen, 2 * (calls + WARM_UP), "hook calls seen");
    assert_eq!(
        backend.calls_to("/runtime.v1.RuntimeService/CreateContainer").len(),
        3 * (calls + WARM_UP),
        "backend calls seen"
    );

    for s in samples.iter_mut() {
        s.sort();
    }
    let p50: Vec<f64> = samples.iter().map(|s| us(percentile(s, 0.5))).collect();
    let p99: Vec<f64> = samples.iter().map(|s| us(percentile(s, 0.99))).collect();
    println!(
        "### CreateContainer intercepted by one no-op hook — `cargo bench -p runtime-proxy --bench hooks` ({calls} calls per path, interleaved, after {WARM_UP} warm-up rounds)"
    );
    println!();
    println!(
        "Fake backend answering at once; one kubelet-like request ({} bytes) for every call, {}; hook server: `TestHook::echoing`, registered for PreCreateContainer, failure-policy Fail.",
        request.encoded_len(),
        kind.describe()
    );
    println!();
    println!("| path | p50 | p99 | proxy CPU time per call |");
    println!("|---|---|---|---|");
    let rows = [
        "(1) CreateContainer direct to the backend",
        "(2) CreateContainer through the proxy, no hook registered",
        "(3) CreateContainer through the proxy, no-op hook at PreCreateContainer",
        "(4) the hook RPC alone (PreCreateContainerHook, direct, to the hook server's process)",
        "(5) the same request through the proxy of (2) on a path it does not intercept (generic pass-through)",
    ];
    for (i, name) in rows.iter().enumerate() {
        let cpu = match i {
            1 | 2 => cpu_per_call(i - 1),
            4 => format!("{} (with (2))", cpu_per_call(0)),
            _ => "–".into(),
        };
        println!("| {name} | {:.0} µs | {:.0} µs | {cpu} |", p50[i], p99[i]);
    }
    println!("| added by the proxy without hooks: p50(2) − p50(1) | {:+.0} µs | | |", p50[1] - p50[0]);
    let extra = p50[1] - p50[4];
    println!(
        "| **intercepted without a hook vs pass-through: p50(2) − p50(5)** | **{extra:+.0} µs** | target ≤ 20 µs: {} | |",
        if extra <= 20.0 { "met" } else { "NOT met" }
    );
    let added = p50[2] - p50[4] - p50[3];
    println!(
        "| **with the no-op hook, beyond pass-through and the hook RPC: p50(3) − p50(5) − p50(4)** | **{added:+.0} µs** | target ≤ 40 µs: {} | |",
        if added <= 40.0 { "met" } else { "NOT met" }
    );
    println!();
    println!(
        "Proxy CPU time: all its threads' on-CPU time (/proc/PID/task/*/schedstat) over the measured calls, per call. \
         Latencies on a shared machine rise with its load (every hop is a wake-up of another process); CPU time \
         hardly does."
    );
}

/// On-CPU time of every thread of process `pid` so far (`/proc/PID/task/*/schedstat`).
fn cpu_time(pid: u32) -> Duration {
    Duration::from_nanos(usage(pid, false).0)
}

/// How the CRI calls of the first measurement are made.
#[derive(Clone, Copy)]
enum ClientKind {
    /// Like kubelet (grpc-go): END_STREAM on the message's DATA frame.
    Kubelet,
    /// tonic's client: END_STREAM in a separate empty DATA frame.
    Tonic,
}

impl ClientKind {
    fn from_env() -> ClientKind {
        match std::env::var("RP_BENCH_CLIENT").as_deref() {
            Ok("tonic") => ClientKind::Tonic,
            Ok("") | Ok("kubelet") | Err(_) => ClientKind::Kubelet,
            Ok(other) => panic!("RP_BENCH_CLIENT={other:?}: want `kubelet` (default) or `tonic`"),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ClientKind::Kubelet => {
                "framed as kubelet's grpc-go frames it (END_STREAM on the DATA frame, `grpc-timeout` 2 min)"
            }
            ClientKind::Tonic => {
                "sent with tonic's client (END_STREAM in a separate empty DATA frame, `grpc-timeout` 2 min)"
            }
        }
    }
}

/// A CRI client on one HTTP/2 connection, of either kind.
enum CriClient {
    Kubelet(h2::client::SendRequest<Bytes>),
    Tonic(RuntimeServiceClient<Channel>, Channel),
}

/// kubelet's deadline for CreateContainer (`--runtime-request-timeout`, 2 min), as grpc-go
/// encodes it.
const KUBELET_TIMEOUT: &str = "120000m";

/// The intercepted CreateContainer.
const CREATE: &str = "/runtime.v1.RuntimeService/CreateContainer";
/// A path the proxy does not intercept (an unknown service): the same request there goes
/// through the generic pass-through, for comparison.
const PASS_THROUGH: &str = "/bench.PassThrough/CreateContainer";

impl CriClient {
    async fn connect(kind: ClientKind, socket: &Path) -> CriClient {
        match kind {
            ClientKind::Tonic => CriClient::Tonic(runtime_client(socket), test_support::channel(socket)),
            ClientKind::Kubelet => {
                let stream = UnixStream::connect(socket).await.expect("connect");
                let (send, conn) = h2::client::Builder::new()
                    .initial_window_size(4 << 20)
                    .initial_connection_window_size(16 << 20)
                    .handshake(stream)
                    .await
                    .expect("HTTP/2 handshake");
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                CriClient::Kubelet(send)
            }
        }
    }

    /// CreateContainer with `request` (`body`: the same, encoded and framed) on gRPC path
    /// `path`; returns the container ID. Panics on any failure.
    async fn create_container(
        &mut self,
        request: cri::CreateContainerRequest,
        body: Bytes,
        path: &'static str,
    ) -> String {
        match self {
            CriClient::Tonic(_, channel) if path != CREATE => {
                let mut request = Request::new(Bytes::from(request.encode_to_vec()));
                request.set_timeout(Duration::from_secs(120));
                let answer = test_support::raw::unary(channel.clone(), path, request)
                    .await
                    .expect("CreateContainer")
                    .into_inner();
                cri::CreateContainerResponse::decode(answer).expect("CreateContainerResponse").container_id
            }
            CriClient::Tonic(client, _) => {
                let mut request = Request::new(request);
                request.set_timeout(Duration::from_secs(120));
                client.create_container(request).await.expect("CreateContainer").into_inner().container_id
            }
            CriClient::Kubelet(send) => {
                let head = http::Request::post(format!("http://localhost{path}"))
                    .header("content-type", "application/grpc")
                    .header("te", "trailers")
                    .header("grpc-timeout", KUBELET_TIMEOUT)
                    .header("user-agent", "grpc-go/1.65.0")
                    .body(())
                    .expect("request head");
                let mut send = send.clone().ready().await.expect("connection ready");
                let (response, mut upstream) = send.send_request(head, false).expect("send request");
                upstream.send_data(body, true).expect("send body");
                let mut recv = response.await.expect("response").into_body();
                let mut data = BytesMut::new();
                while let Some(chunk) = recv.data().await {
                    let chunk = chunk.expect("response body");
                    let _ = recv.flow_control().release_capacity(chunk.len());
                    data.extend_from_slice(&chunk);
                }
                let trailers = recv.trailers().await.expect("trailers").unwrap_or_default();
                let status = trailers.get("grpc-status").map(|v| v.to_str().unwrap_or("?").to_owned());
                assert_eq!(status.as_deref(), Some("0"), "CreateContainer failed: {trailers:?}");
                let mut data = data.freeze();
                assert!(data.len() >= 5 && data[0] == 0, "not one uncompressed gRPC message");
                data.advance(5);
                cri::CreateContainerResponse::decode(data).expect("CreateContainerResponse").container_id
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. 50 pods concurrently

/// A hook server that answers every call after an async `delay` (the runtime stays free),
/// echoing the request like koordlet; counts calls and the most in flight at once.
#[derive(Clone)]
struct SlowHook {
    delay: Duration,
    calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl SlowHook {
    async fn wait(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    async fn pod(&self, r: Request<PodSandboxHookRequest>) -> Result<Response<PodSandboxHookResponse>, Status> {
        self.wait().await;
        Ok(Response::new(hook_api::merge::echo_pod(r.get_ref())))
    }

    async fn container(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.wait().await;
        Ok(Response::new(hook_api::merge::echo_container(r.get_ref())))
    }

    fn reset(&self) {
        self.calls.store(0, Ordering::SeqCst);
        self.max_in_flight.store(0, Ordering::SeqCst);
    }

    /// Serves on `socket` until the returned task is aborted.
    fn serve(&self, socket: &Path) -> tokio::task::JoinHandle<()> {
        let incoming = UnixListenerStream::new(UnixListener::bind(socket).expect("bind hook socket"));
        let service = RuntimeHookServiceServer::new(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
        })
    }
}

#[tonic::async_trait]
impl RuntimeHookService for SlowHook {
    async fn pre_run_pod_sandbox_hook(
        &self,
        r: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        self.pod(r).await
    }
    async fn post_stop_pod_sandbox_hook(
        &self,
        r: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        self.pod(r).await
    }
    async fn pre_create_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.container(r).await
    }
    async fn pre_start_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.container(r).await
    }
    async fn post_start_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.container(r).await
    }
    async fn post_stop_container_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.container(r).await
    }
    async fn pre_update_container_resources_hook(
        &self,
        r: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.container(r).await
    }
}

/// Wall time of one batch, the time each pod took, and the pods to remove afterwards.
struct Batch {
    wall: Duration,
    per_pod: Vec<Duration>,
    pods: Vec<Pod>,
    failures: Vec<Status>,
}

/// Starts `n` busybox `sleep 3600` pods at once through `client`.
async fn start_pods(env: &Containerd, client: &RuntimeServiceClient<Channel>, n: usize) -> Batch {
    let label = HashMap::from([(BENCH_LABEL.to_owned(), std::process::id().to_string())]);
    let work: Vec<_> = (0..n)
        .map(|_| {
            let mut client = client.clone();
            let sandbox = sandbox_config(env, &unique("bench"), label.clone(), HashMap::new());
            let resources =
                cri::LinuxContainerResources { cpu_shares: 512, memory_limit_in_bytes: 64 << 20, ..Default::default() };
            let container = container_config(env, "sleeper", &["sleep", "3600"], Some(resources), &[("BENCH", "1")]);
            async move {
                let start = Instant::now();
                let pod = Pod::start(&mut client, sandbox, container).await;
                (start.elapsed(), pod)
            }
        })
        .collect();
    let start = Instant::now();
    let done = futures::future::join_all(work).await;
    let wall = start.elapsed();
    let mut batch = Batch { wall, per_pod: vec![], pods: vec![], failures: vec![] };
    for (took, pod) in done {
        batch.per_pod.push(took);
        match pod {
            Ok(p) => batch.pods.push(p),
            Err(e) => batch.failures.push(e),
        }
    }
    batch.per_pod.sort();
    batch
}

/// Removes every pod sandbox carrying this process's bench label, directly on containerd
/// (containers go with their sandbox). Best effort; returns how many there were.
async fn remove_bench_pods(containerd: &mut RuntimeServiceClient<Channel>) -> usize {
    let filter = cri::PodSandboxFilter {
        label_selector: HashMap::from([(BENCH_LABEL.to_owned(), std::process::id().to_string())]),
        ..Default::default()
    };
    let Ok(list) = containerd.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }).await else {
        return 0;
    };
    let ids: Vec<String> = list.into_inner().items.into_iter().map(|s| s.id).collect();
    let removals = ids.iter().map(|id| {
        let mut c = containerd.clone();
        async move { remove_sandbox(&mut c, id).await }
    });
    futures::future::join_all(removals).await;
    ids.len()
}

/// Removes a batch's pods and anything else left with the bench label; panics after cleaning
/// up if a pod failed to start.
async fn finish(batch: &Batch, what: &str, containerd: &mut RuntimeServiceClient<Channel>) {
    remove_bench_pods(containerd).await;
    if let Some(e) = batch.failures.first() {
        panic!("{what}: {} of {} pods failed to start; first: {e:?}", batch.failures.len(), batch.per_pod.len());
    }
}

/// Runs every batch, then removes whatever is left even if a batch failed.
async fn concurrent_pods(env: &Containerd) {
    let mut containerd = runtime_client(&env.socket);
    let hook_dir = hook_dir();
    let hook_socket: PathBuf = hook_dir.path().join("slow-hook.sock");
    let hook = SlowHook {
        delay: HOOK_DELAY,
        calls: Default::default(),
        in_flight: Default::default(),
        max_in_flight: Default::default(),
    };
    let server = hook.serve(&hook_socket);
    let stages = ["PreRunPodSandbox", "PreCreateContainer", "PreStartContainer"];
    let proxy = proxy(&env.socket, hook_dir.path(), Some(("slow.json", &hook_socket, &stages)));
    let proxied = runtime_client(proxy.socket());

    let outcome = tokio::spawn({
        let (env, hook, direct) = (env.clone(), hook.clone(), containerd.clone());
        async move { batches(&env, &hook, &direct, &proxied).await }
    })
    .await;
    let left = remove_bench_pods(&mut containerd).await;
    server.abort();
    match outcome {
        Ok(()) => {}
        Err(e) => panic!("50 pods concurrently failed (removed {left} pods left behind): {e}"),
    }
}

async fn batches(
    env: &Containerd,
    hook: &SlowHook,
    direct: &RuntimeServiceClient<Channel>,
    proxied: &RuntimeServiceClient<Channel>,
) {
    let mut containerd = direct.clone();
    // Warm-up: one pod each way (snapshots, the proxy's connections, containerd's caches).
    for client in [direct, proxied] {
        let warm = start_pods(env, client, 1).await;
        finish(&warm, "warm-up", &mut containerd).await;
    }

    // (client, pods, hooked)
    let runs = [(direct, 1, false), (proxied, 1, true), (direct, PODS, false), (proxied, PODS, true)];
    let mut rows = vec![];
    for (client, n, hooked) in runs {
        hook.reset();
        let batch = start_pods(env, client, n).await;
        let (calls, max) = (hook.calls.load(Ordering::SeqCst), hook.max_in_flight.load(Ordering::SeqCst));
        finish(&batch, &format!("{n} pods"), &mut containerd).await;
        if hooked {
            assert_eq!(calls, 3 * n, "every pod went through the hook at its three stages");
        }
        rows.push((
            n,
            hooked,
            batch.wall,
            percentile(&batch.per_pod, 0.5),
            percentile(&batch.per_pod, 1.0),
            calls,
            max,
        ));
    }

    println!(
        "### {PODS} pods concurrently through a hook that takes {} ms per call — `cargo bench -p runtime-proxy --bench hooks` (containerd {})",
        HOOK_DELAY.as_millis(),
        env.version
    );
    println!();
    println!(
        "Each pod: RunPodSandbox + CreateContainer + StartContainer (busybox `sleep 3600`), all pods started at once on one connection; the hook server (failure-policy Fail) sleeps {} ms at PreRunPodSandbox, PreCreateContainer and PreStartContainer.",
        HOOK_DELAY.as_millis()
    );
    println!();
    println!("| path | pods | wall time | per pod p50 | per pod max | hook calls | most hook calls in flight |");
    println!("|---|---|---|---|---|---|---|");
    for (n, hooked, wall, p50, max, calls, in_flight) in &rows {
        let path = if *hooked { "through the proxy + 100 ms hook" } else { "direct to containerd, no hook" };
        let (calls, in_flight) =
            if *hooked { (calls.to_string(), in_flight.to_string()) } else { ("–".into(), "–".into()) };
        println!(
            "| {path} | {n} | {:.2} s | {:.2} s | {:.2} s | {calls} | {in_flight} |",
            secs(*wall),
            secs(*p50),
            secs(*max)
        );
    }
    let (one, many) = (rows[1].2, rows[3].2);
    let serial = HOOK_DELAY * 3 * PODS as u32;
    println!();
    println!(
        "Through the proxy: {PODS} pods took {:.2} s, {:.1}× one pod alone ({:.2} s); serialised hook calls alone would take ≥ {:.0} s. \
         Direct to containerd the same {PODS} pods took {:.2} s ({:.1}× one pod).",
        secs(many),
        secs(many) / secs(one),
        secs(one),
        secs(serial),
        secs(rows[2].2),
        secs(rows[2].2) / secs(rows[0].2)
    );
}
