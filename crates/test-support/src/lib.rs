//! Test support for runtime-proxy's integration tests and benchmarks.
//!
//! # Modules
//!
//! * [`clients`] — the gRPC clients and the hook server we did not write (Python grpcio, Node
//!   grpc-js, raw HTTP/2), set up by crates/runtime-proxy/tests/clients/setup.sh.
//! * [`cri_node`] — a CRI runtime stand-in serving a node of [`scale`] pods (lists and verbose
//!   statuses), for the standalone reconciler at scale.
//! * [`containerd`] — the real containerd + runc that `scripts/containerd.sh` started, and pods on
//!   it.
//! * [`dockerd`] — the real dockerd that `scripts/dockerd.sh` started, and its Debian CLI.
//! * [`flags_doc`] — docs/flags.md checked against the binaries' `--help`.
//! * [`proxy`] — the real `runtime-proxy` binary as a child process on a temp socket.
//! * [`fake_backend`] — an in-process HTTP/2 backend for what containerd cannot show (hangs,
//!   recorded metadata, huge answers); also a hook server that hangs or answers garbage.
//! * [`fake_node`] — a node's worth of running pods (1,000 × 4 containers) described as
//!   containerd describes them, for the fake backend, for store recovery at node scale.
//! * [`hooks`] — programmable in-process hook servers and registration files.
//! * [`nri_runtime`] — a protocol-level stand-in for a runtime's NRI side (NRI 0.12 as containerd
//!   2.3/2.4 speak it, with their `StateChange` fallback; or a runtime before 0.12), for the NRI
//!   plugins.
//! * [`stand_in`] — servers that stand in for a backend of some kind (gRPC, a Docker Engine API,
//!   other HTTP/1.1) and close every connection when stopped, for the health-check tests.
//! * [`kube_api`] — a loopback stand-in for kube-apiserver (list, watch, events) for kube-rs
//!   clients.
//! * [`systemd`] — kubelet's systemd-driver pod slices (transient units over D-Bus) and their
//!   cgroup v2 directories, in the cgroup v2 guest of `scripts/v2vm.sh`.
//! * [`envtest`] — a real etcd + kube-apiserver (envtest's `KUBEBUILDER_ASSETS` convention) with
//!   runtime-hooks' CRDs and RBAC, for tests of its cluster rule source; skipped without one.
//!
//! # Requirements
//!
//! Integration tests need a running containerd: `make test` starts one per version and points
//! `RP_CONTAINERD_ENV` at its env file; the Docker-mode tests (`tests/docker_*.rs`) need a running
//! dockerd, and `make test` points `RP_DOCKERD_ENV` at its env file. The `v2_*` targets run only
//! in the cgroup v2 guest (`scripts/v2vm.sh test v2_…`), which sets `RP_V2_GUEST=1` and points
//! `RP_CONTAINERD_ENV` at its containerd (systemd cgroup driver).

pub mod clients;
pub mod containerd;
pub mod cri_node;
pub mod dockerd;
pub mod envtest;
pub mod fake_backend;
pub mod fake_node;
pub mod flags_doc;
pub mod hooks;
pub mod kube_api;
pub mod nri_runtime;
pub mod proxy;
pub mod raw;
pub mod scale;
pub mod stand_in;
pub mod systemd;

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A gRPC channel to the unix socket at `path` (connects lazily; 16 MiB messages as kubelet).
pub fn channel(path: impl AsRef<Path>) -> Channel {
    let path: PathBuf = path.as_ref().to_owned();
    Endpoint::from_static("http://localhost").connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }))
}

/// A channel as [`channel`] whose client grants each stream only `window` bytes of HTTP/2 flow
/// control window at first (SETTINGS_INITIAL_WINDOW_SIZE), so a larger answer must wait for
/// the client's WINDOW_UPDATEs.
pub fn channel_with_stream_window(path: impl AsRef<Path>, window: u32) -> Channel {
    let path: PathBuf = path.as_ref().to_owned();
    Endpoint::from_static("http://localhost").initial_stream_window_size(window).connect_with_connector_lazy(
        tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }),
    )
}

/// A CRI v1 RuntimeService client with kubelet's 16 MiB message limits.
pub fn runtime_client(path: impl AsRef<Path>) -> k8s_cri::v1::runtime_service_client::RuntimeServiceClient<Channel> {
    runtime_client_from(channel(path))
}

/// A CRI v1 RuntimeService client on an existing channel (calls share its connection).
pub fn runtime_client_from(channel: Channel) -> k8s_cri::v1::runtime_service_client::RuntimeServiceClient<Channel> {
    k8s_cri::v1::runtime_service_client::RuntimeServiceClient::new(channel)
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

/// A CRI v1alpha2 RuntimeService client (kubelet 1.23–1.25) with kubelet's 16 MiB message limits.
pub fn runtime_client_v1alpha2(
    path: impl AsRef<Path>,
) -> k8s_cri::v1alpha2::runtime_service_client::RuntimeServiceClient<Channel> {
    k8s_cri::v1alpha2::runtime_service_client::RuntimeServiceClient::new(channel(path))
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

/// `message` re-read as another message type with the same wire layout (a CRI v1 config as its
/// v1alpha2 twin). Panics (test code) when the bytes do not decode.
pub fn transcode<T: prost::Message + Default>(message: &impl prost::Message) -> T {
    T::decode(message.encode_to_vec().as_slice()).expect("same wire layout")
}

/// A CRI v1 ImageService client with kubelet's 16 MiB message limits.
pub fn image_client(path: impl AsRef<Path>) -> k8s_cri::v1::image_service_client::ImageServiceClient<Channel> {
    k8s_cri::v1::image_service_client::ImageServiceClient::new(channel(path))
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

/// Polls `check` every 20 ms until it returns true or `timeout` passes; returns the last result.
pub async fn wait_until<F, Fut>(timeout: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Path of a cargo example binary of this workspace (`target/<profile>/examples/NAME`), next to
/// the running test binary (`target/<profile>/deps/…`). Built by `cargo test` / `cargo build
/// --all-targets`.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join("examples").join(name);
    assert!(path.exists(), "{} not built: run `cargo build --workspace --all-targets`", path.display());
    path
}

/// Path of a binary of this workspace (`target/<profile>/NAME`), next to the running test binary
/// (`target/<profile>/deps/…`), for tests of one crate that start another crate's program (e.g.
/// runtime-hooks' tests start runtime-proxy). Built by `cargo build --workspace` / `cargo test
/// --workspace`.
pub fn workspace_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>");
    let path = profile_dir.join(name);
    assert!(path.exists(), "{} not built: run `cargo build --workspace`", path.display());
    path
}

/// Nanoseconds on CPU of every thread of process `pid` so far (the first field of each
/// `/proc/PID/task/*/schedstat`); 0 when the process is gone. For benchmarks: CPU time does not
/// follow the machine's load as wall time does.
pub fn cpu_ns(pid: impl std::fmt::Display) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// `VmRSS` of process `pid` (`/proc/PID/status`), KiB; 0 when the process is gone.
pub fn rss_kib(pid: impl std::fmt::Display) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `GET path` over plain HTTP/1.1 to `addr` (`IP:PORT`, an admin or debug endpoint), reading
/// to the end (`Connection: close`); returns the status code and the body. Panics (test code)
/// when the connection fails.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(conn, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, body.to_owned())
}

/// A loopback address, `127.0.0.1:PORT`, whose port is free now, for a server the test starts
/// next with it (`--metrics-addr`, `--debug-addr`): [`free_loopback_port`]'s port.
pub fn free_loopback_addr() -> String {
    format!("127.0.0.1:{}", free_loopback_port())
}

/// A TCP port free on 127.0.0.1 now, for a server the test starts next with it.
///
/// The port lies below the kernel's ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`,
/// 32768 by default), from which outgoing connections and `bind(…:0)` take theirs: a port from
/// `bind(127.0.0.1:0)`, released, could go to any connection made before the server binds it (a
/// proxy's admin endpoint once failed to bind so in a `make test` run). Ports handed out in one
/// process differ.
///
/// Panics (test code) when no port from 10000 up to the range is free.
pub fn free_loopback_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low: u32 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .filter(|low| (10_100..=65_535).contains(low))
        .unwrap_or(32768);
    let span = low - 10_000;
    // Spread over the span by process, then one step per call, so that processes and calls
    // rarely try the same port.
    let start = std::process::id().wrapping_mul(7919) + NEXT.fetch_add(101, Ordering::Relaxed);
    (0..span)
        .map(|i| (10_000 + (start + i) % span) as u16)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .unwrap_or_else(|| panic!("no free port on 127.0.0.1 from 10000 to {low}"))
}
