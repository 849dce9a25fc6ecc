//! runtime-proxy: a CRI proxy between kubelet and the container runtime.
//!
//! kubelet speaks CRI (gRPC over HTTP/2 on a unix socket) to the proxy; the proxy forwards every
//! call to containerd (or, in Docker mode, the Docker Engine API to dockerd), and runs the hook
//! servers' stages around the calls that create, start, update, stop and remove pods and
//! containers.
//!
//! # Parts
//!
//! * [`cri`] — the CRI front end: the frame relay, the router, the interceptor (CRI's side of the
//!   hook flow), the store's recovery from the runtime.
//! * [`docker`] — the Docker front end: the HTTP/1.1 pass-through, dockershim's names and labels,
//!   its routes mapped onto the same stages, the store's recovery from dockerd.
//! * [`nri`] — the NRI front end (`--frontend nri`): one NRI plugin of containerd calling the
//!   hook servers at the runtime's events (the `nri-plugin` crate's connection loop).
//! * [`hooks`] — what every front end shares: the one hook flow, the stage table, the registry,
//!   the dispatcher, the store and its per-pod locks, the skip label, the limits.
//! * [`http2`] — the HTTP/2 codec (frames as bytes, HPACK decoding) of the relay and the hook
//!   client.
//! * [`grpc`] — gRPC plumbing both the relay and the hook calls use: status codes, deadlines,
//!   messages, one unary call over a shared backend connection.
//! * [`metrics`] — the metric families every part writes.
//! * [`admin`] — the admin endpoint (`/metrics`, `/healthz`, `/status`), the backends' health
//!   checks, `runtime-proxy status`, `/debug/store`.
//! * [`cli`], [`listener`] — flags; the listening socket and the accept loop with its drain.
//!
//! # One call's path
//!
//! CRI: [`listener`] → [`cri::relay`] (frames relayed as they are) → [`cri::router`] (relayed,
//! intercepted or a unary call) → [`cri::intercept`] → [`hooks::flow::drive`] (pod lock, store,
//! skip label, pre stage, edits, send, commit, post stage) → the runtime. Docker:
//! [`listener`] → [`docker`] (HTTP/1.1) → [`docker::intercept`] → [`hooks::flow::drive`] → dockerd.

pub mod admin;
pub mod cli;
pub mod cri;
pub mod docker;
pub mod grpc;
pub mod hooks;
pub mod http2;
pub mod listener;
pub mod metrics;
pub mod nri;

use std::future::Future;
use std::sync::Arc;

use anyhow::{bail, Context};
use daemon_support::admin_http;
use daemon_support::signals::Reloads;

use crate::admin::endpoint::{self, Admin};
use crate::admin::health::Health;
use crate::admin::{debug, status};
use crate::cli::{Args, BackendRuntimeMode, Frontend};
use crate::cri::intercept::Interceptor;
use crate::cri::router::Router;
use crate::cri::{recover, server};
use crate::grpc::backend::Backend;
use crate::hooks::dispatch::Dispatcher;
use crate::hooks::registry;
use crate::hooks::registry::Registry;
use crate::hooks::store::Store;
use crate::hooks::Hooks;
use crate::metrics::Metrics;

/// Runs the proxy until `shutdown` resolves: binds the socket, serves, drains. Each item of
/// `reloads` (SIGHUP) rescans the hook config directory and sets its watch up anew
/// (`Shared::follow_reloads`).
///
/// Errors: the listening socket is a
/// backend socket (see [`listener::same_socket`]); the socket cannot be bound (see [`listener::bind`]).
pub async fn run(args: Args, shutdown: impl Future<Output = ()>, reloads: Option<Reloads>) -> anyhow::Result<()> {
    if args.frontend == Frontend::Nri {
        return run_nri(args, shutdown, reloads).await;
    }
    for (flag, backend) in [
        ("--remote-runtime-service-endpoint", &args.runtime_endpoint),
        ("--remote-image-service-endpoint", args.image_endpoint()),
    ] {
        if listener::same_socket(&args.listen, backend) {
            bail!(
                "--koord-runtimeproxy-endpoint {} and {flag} {} are the same socket: the proxy would forward every call to itself",
                args.listen.display(),
                backend.display()
            );
        }
    }
    if args.backend_runtime_mode == BackendRuntimeMode::Docker {
        return run_docker(args, shutdown, reloads).await;
    }
    let runtime = Arc::new(Backend::new(&args.runtime_endpoint));
    let image = if args.image_endpoint() == &args.runtime_endpoint {
        runtime.clone()
    } else {
        Arc::new(Backend::new(args.image_endpoint()))
    };
    let metrics = Arc::new(Metrics::new());
    let shared = Shared::start(&args, metrics.clone())?;
    let _reloads = shared.follow_reloads(reloads);
    // CRI mode asks the runtime about objects the store misses, on the shared connection.
    let interceptor = Arc::new(Interceptor { hooks: shared.hooks.clone(), runtime: runtime.clone() });
    let keeper = recover::keep_store(runtime.clone(), shared.hooks.store.clone());
    let router = Arc::new(Router::new(runtime, image, Some(interceptor), metrics));
    let listener = listener::bind(&args.listen, &args.runtime_endpoint)?;
    tracing::info!(
        listen = %args.listen.display(),
        runtime = %args.runtime_endpoint.display(),
        image = %args.image_endpoint().display(),
        hook_config_dir = %args.hook_config_dir.display(),
        "runtime-proxy serving"
    );
    // Rebuild the store from the runtime (retrying until it is reachable) while serving.
    let _keeper = AbortOnDrop(tokio::spawn(keeper));
    notify_systemd(daemon_support::sd_notify::READY);
    server::serve(listener, &args.listen, router, shutdown, args.drain_timeout, args.max_concurrent_streams.max(1))
        .await
}

/// Docker mode: the Docker Engine API on the listening socket, forwarded to dockerd at
/// `--remote-runtime-service-endpoint`, with the same hook state as CRI mode ([`docker`]).
async fn run_docker(args: Args, shutdown: impl Future<Output = ()>, reloads: Option<Reloads>) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let shared = Shared::start(&args, metrics.clone())?;
    let _reloads = shared.follow_reloads(reloads);
    let front =
        Arc::new(docker::DockerFront { backend: args.runtime_endpoint.clone(), hooks: shared.hooks.clone(), metrics });
    let listener = listener::bind(&args.listen, &args.runtime_endpoint)?;
    tracing::info!(
        listen = %args.listen.display(),
        dockerd = %args.runtime_endpoint.display(),
        hook_config_dir = %args.hook_config_dir.display(),
        "runtime-proxy serving the Docker Engine API"
    );
    let store = shared.hooks.store.clone();
    let _keeper = AbortOnDrop(tokio::spawn(docker::recover::keep_store(args.runtime_endpoint.clone(), store)));
    notify_systemd(daemon_support::sd_notify::READY);
    docker::serve(listener, &args.listen, front, shutdown, args.drain_timeout).await
}

/// NRI mode: one NRI plugin of the runtime at `--nri-socket`, with the same hook state as CRI
/// mode ([`nri`]); no listening socket, no backend endpoint (and no backend health checks).
async fn run_nri(args: Args, shutdown: impl Future<Output = ()>, reloads: Option<Reloads>) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let shared = Shared::start(&args, metrics)?;
    let _reloads = shared.follow_reloads(reloads);
    let options = nri_plugin::Options {
        socket: args.nri_socket.clone(),
        name: args.nri_plugin_name.clone(),
        index: args.nri_plugin_index.clone(),
        program: "runtime-proxy",
    };
    tracing::info!(
        nri_socket = %args.nri_socket.display(),
        name = %args.nri_plugin_name,
        index = %args.nri_plugin_index,
        hook_config_dir = %args.hook_config_dir.display(),
        "runtime-proxy serving as an NRI plugin"
    );
    notify_systemd(daemon_support::sd_notify::READY);
    nri::run(shared.hooks.clone(), shared.nri_connected.clone(), options, shutdown).await
}

/// What the front ends share: the watched registry, the store, the dispatcher, the per-pod
/// locks and skip label (in one [`Hooks`]), the backends' health checks and the admin and
/// debug endpoints. Background tasks end when it is dropped.
struct Shared {
    hooks: Arc<Hooks>,
    watcher: Arc<registry::WatchHandle>,
    /// `--frontend nri`: connected and synchronized now (for `/status`).
    nri_connected: Arc<std::sync::atomic::AtomicBool>,
    _health: AbortOnDrop,
    _admin: Vec<AbortOnDrop>,
    _debug: AbortOnDrop,
}

impl Shared {
    /// Scans and watches `--hook-config-dir`, starts the backends' health checks (which run
    /// with or without an admin endpoint: they log what is wrong) and serves the admin endpoint,
    /// the admin socket and the debug endpoint.
    ///
    /// Errors: the directory watcher cannot start (no tokio runtime); `--metrics-addr`,
    /// `--admin-socket` or `--debug-addr` cannot be bound (each error names its flag).
    fn start(args: &Args, metrics: Arc<Metrics>) -> anyhow::Result<Shared> {
        // A hook server on the proxy's own socket or the runtime's would never be a hook server.
        let mut reserved = vec![
            (args.listen.clone(), "the proxy's own socket (--koord-runtimeproxy-endpoint)".to_owned()),
            (args.runtime_endpoint.clone(), "the runtime's socket (--remote-runtime-service-endpoint)".to_owned()),
        ];
        if let Some(image) = args.image_endpoint.as_ref().filter(|i| **i != args.runtime_endpoint) {
            reserved.push((image.clone(), "the image service's socket (--remote-image-service-endpoint)".to_owned()));
        }
        let nri = args.frontend == Frontend::Nri;
        let nri_connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
        if nri {
            reserved = vec![(args.nri_socket.clone(), "the runtime's NRI socket (--nri-socket)".to_owned())];
        }
        let registry = Registry::open_reserving(&args.hook_config_dir, !args.insecure_hook_config, reserved);
        let watcher = registry.spawn_watcher().context("watching the hook config directory")?;
        let store = Arc::new(Store::new());
        // An NRI plugin has no backend to check: the runtime calls it.
        let health = if nri {
            Health::new(Vec::new(), metrics.clone())
        } else {
            Health::for_backends(
                args.backend_runtime_mode,
                &args.runtime_endpoint,
                args.image_endpoint(),
                metrics.clone(),
            )
        };
        let checks = AbortOnDrop(tokio::spawn(health.clone().run()));
        let chain = crate::hooks::chain::NodeChain {
            conflict_policy: args.hook_conflict_policy,
            required: args.required_hook_servers()?,
        };
        let dispatcher = Dispatcher::new(metrics.clone(), args.limits().hooks).with_chain(chain.clone());
        let debug = Arc::new(debug::DebugEndpoint::new(args.debug_addr));
        let status = status::StatusInfo {
            started: std::time::SystemTime::now(),
            started_at: std::time::Instant::now(),
            mode: args.backend_runtime_mode,
            runtime_endpoint: if nri { args.nri_socket.clone() } else { args.runtime_endpoint.clone() },
            image_endpoint: if nri { args.nri_socket.clone() } else { args.image_endpoint().clone() },
            hook_config_dir: args.hook_config_dir.clone(),
            debug: debug.clone(),
            hook_health: dispatcher.health().clone(),
            nri_connected: nri.then(|| nri_connected.clone()),
            chain,
        };
        let admin =
            Arc::new(Admin { metrics: metrics.clone(), hooks: registry.clone(), store: store.clone(), health, status });
        // Bound here, before the proxy's socket: an address that cannot be bound stops the
        // start (exit 2) instead of leaving the port to whoever took it.
        let tcp = args.metrics_addr.map(|addr| admin_http::bind_tcp("--metrics-addr", addr)).transpose()?;
        let socket = args.admin_socket().map(|path| admin_http::bind_socket("--admin-socket", &path)).transpose()?;
        let debug_listener = debug::bind(&debug)?;
        if tcp.is_none() {
            tracing::info!("admin endpoint off (--metrics-addr off): no /metrics, /healthz, /status over TCP");
        }
        let listeners = tcp.map(admin_http::Listener::Tcp).into_iter().chain(socket.map(admin_http::Listener::Unix));
        let admin: Vec<AbortOnDrop> =
            listeners.map(|l| AbortOnDrop(tokio::spawn(endpoint::serve_admin(l, admin.clone())))).collect();
        let debug_store = store.clone();
        let debug = AbortOnDrop(tokio::spawn(async move {
            if let Some(listener) = debug_listener {
                debug::serve(listener, debug_store).await
            }
        }));
        let hooks = Arc::new(Hooks {
            registry,
            store,
            dispatcher,
            metrics,
            limits: args.limits(),
            skip_label: args.skip_label(),
            pod_locks: Default::default(),
            offload: Default::default(),
        });
        Ok(Shared { hooks, watcher: Arc::new(watcher), nri_connected, _health: checks, _admin: admin, _debug: debug })
    }

    /// Acts on each reload request (SIGHUP) until the task is dropped: rescans the hook config
    /// directory at once (what changed is logged as on any rescan: added, updated, removed,
    /// rejected), sets its inotify watch up anew, and logs what is registered. Flags are not
    /// re-read: they take a restart.
    fn follow_reloads(&self, reloads: Option<Reloads>) -> Option<AbortOnDrop> {
        let mut reloads = reloads?;
        let (registry, watcher) = (self.hooks.registry.clone(), self.watcher.clone());
        Some(AbortOnDrop(tokio::spawn(async move {
            while let Some(signal) = reloads.next().await {
                tracing::info!(signal = signal.name(), dir = %registry.dir().display(), "reloading: rescanning the hook config directory");
                let r = registry.clone();
                if tokio::task::spawn_blocking(move || r.rescan()).await.is_err() {
                    return; // the runtime is shutting down
                }
                watcher.rewatch();
                let snapshot = registry.snapshot();
                let names = |it: &mut dyn Iterator<Item = &str>| it.collect::<Vec<_>>().join(",");
                tracing::info!(
                    signal = signal.name(),
                    servers = %names(&mut snapshot.servers().iter().map(|s| s.name.as_str())),
                    rejected = %names(&mut snapshot.rejected().iter().map(|r| r.name.as_str())),
                    "reloaded: hook config directory rescanned"
                );
            }
        })))
    }
}

pub use daemon_support::sd_notify::notify_systemd;

/// Aborts a background task when dropped (the admin endpoint and recovery end with [`run`]).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
