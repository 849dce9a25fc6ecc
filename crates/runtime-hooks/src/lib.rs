//! runtime-hooks: the hook-server half of runtime-proxy, in the role of koordlet's runtime hooks.
//!
//! Plugins turn a pod's QoS class and Koordinator's annotations into cgroup settings. They reach
//! the pods in one of two modes:
//!
//! * **proxy**: a `runtime.v1alpha1.RuntimeHookService` server that runtime-proxy (or
//!   koord-runtime-proxy) calls before RunPodSandbox, CreateContainer and
//!   UpdateContainerResources; the answers change the CRI request before containerd sees it.
//!   Pod-level cgroup values are written by the server itself, as koordlet does.
//! * **standalone**: a reconciler that lists the pods of the CRI runtime and writes their cgroup
//!   files directly, on an interval and when the rules change.
//!
//! Module map, from the inputs to the outputs:
//!
//! * [`context`] — typed pod and container contexts (QoS class, kube QoS), from hook requests or
//!   the CRI runtime.
//! * [`quantity`] — Kubernetes resource quantities in annotations.
//! * [`rules`] — the node-level policy file (NodeSLO's role), hot-reloaded.
//! * [`plugin`] — the plugin trait, stages, failure policy.
//! * [`plugins`] — GroupIdentity, BatchResource, CPUSet.
//! * [`change`] — what a plugin asks for.
//! * [`framework`] — runs a stage's plugins in order, merges, builds koordlet-style answers.
//! * [`cgroup`] — cgroup v1/v2 files, units, idempotent writes, drift.
//! * [`server`] — proxy mode: the gRPC service and the registration file.
//! * [`reconciler`] — standalone mode (and rule changes in proxy mode).
//! * [`cli`] — flags; [`run`] wires everything for the binary.

#![warn(missing_docs)]

pub mod cgroup;
pub mod change;
pub mod cli;
pub mod context;
pub mod framework;
pub mod plugin;
pub mod plugins;
pub mod quantity;
pub mod reconciler;
pub mod rules;
pub mod server;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use tokio_stream::wrappers::UnixListenerStream;

use crate::cgroup::CgroupFs;
use crate::cli::{Args, Mode};
use crate::framework::Framework;
use crate::reconciler::Reconciler;
use crate::rules::RulesStore;
use crate::server::HookService;

/// Runs the binary until `shutdown` resolves.
///
/// Proxy mode: binds `--listen`, registers in `--hook-config-dir`, serves; at shutdown removes
/// the registration first, then stops serving and removes the socket. Standalone mode (or proxy
/// mode with `--runtime-endpoint`): runs the reconciler.
///
/// Errors: bad flags (unknown plugin), an invalid rules file, an undetectable cgroup root, a
/// socket that cannot be bound, a registration that cannot be written.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let plugins = plugins::select(&args.plugins).map_err(anyhow::Error::msg)?;
    let rules = match &args.rules {
        Some(path) => {
            let store = RulesStore::open(path)?;
            if let Err(e) = store.watch() {
                tracing::warn!(file = %path.display(), "not watching the rules file (re-read every 10 s instead): {e:#}");
            }
            store
        }
        None => RulesStore::fixed(Default::default()),
    };
    let cgroups = match args.cgroup_version.version() {
        Some(v) => CgroupFs::new(&args.cgroup_root, v),
        None => CgroupFs::detect(&args.cgroup_root)
            .with_context(|| format!("detecting the cgroup version of {}", args.cgroup_root.display()))?,
    };
    let framework = Arc::new(Framework::new(plugins, args.plugin_failure_policy, rules.clone(), Arc::new(cgroups)));
    let stages = framework.stages();
    tracing::info!(
        mode = ?args.mode,
        plugins = %framework.plugins().iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
        stages = %stages.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","),
        cgroup = ?framework.cgroups().version(),
        cgroup_root = %framework.cgroups().root().display(),
        rules = %args.rules.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "built-in defaults".into()),
        "runtime-hooks starting"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let reconciler = args.reconcile_endpoint().map(|endpoint| {
        let r =
            Reconciler::new(framework.clone(), &endpoint).with_selector(args.selector.clone()).with_kubepods(args.kubepods_cgroup.clone());
        tracing::info!(endpoint = %endpoint.display(), interval = ?args.interval(), "reconciler running");
        tokio::spawn(r.run(args.interval(), rules.subscribe(), stopped()))
    });

    let result = match args.mode {
        Mode::Proxy => serve(&args, framework, shutdown).await,
        Mode::Standalone => {
            shutdown.await;
            Ok(())
        }
    };
    let _ = stop_tx.send(true);
    if let Some(task) = reconciler {
        let _ = task.await;
    }
    tracing::info!("runtime-hooks stopped");
    result
}

async fn serve(args: &Args, framework: Arc<Framework>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    // Absolute: the proxy dials the registered path from its own working directory.
    let listen = std::path::absolute(&args.listen).with_context(|| format!("resolving {}", args.listen.display()))?;
    let listener = server::bind(&listen)?;
    let stages = framework.stages();
    let registration = server::register(&args.hook_config_dir, &args.hook_name, &listen, args.failure_policy, &stages)?;
    tracing::info!(socket = %listen.display(), registration = %registration.display(), "serving runtime hooks");
    let shutdown = {
        let registration = registration.clone();
        async move {
            shutdown.await;
            // Unregister first, so the proxy stops calling us while calls in flight finish.
            server::unregister(&registration);
        }
    };
    let served = tonic::transport::Server::builder()
        .add_service(HookService::new(framework).into_server())
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    server::unregister(&registration);
    let _ = std::fs::remove_file(&listen);
    served.context("serving runtime hooks")
}
