//! runtime-hooks: the hook-server half of runtime-proxy, in the role of koordlet's runtime hooks.
//!
//! # Modes
//!
//! Plugins turn a pod's QoS class and Koordinator's annotations into cgroup settings. They reach
//! the pods in one of three modes:
//!
//! * **proxy**: a `runtime.v1alpha1.RuntimeHookService` server that runtime-proxy (or
//!   koord-runtime-proxy) calls before RunPodSandbox, CreateContainer and UpdateContainerResources;
//!   the answers change the CRI request before containerd sees it. Pod-level cgroup values are
//!   written by the server itself, as koordlet does.
//! * **standalone**: a reconciler that lists the pods of the CRI runtime and writes their cgroup
//!   files directly, on an interval and when the rules change.
//! * **nri**: an NRI plugin of the runtime (containerd >= 1.7), called before containers are
//!   created; the plugins' changes become NRI adjustments and updates ([`nri`]).
//!
//! # Module map
//!
//! The three modes are folders over the shared framework; each mode imports the shared modules,
//! never another mode. From the inputs to the outputs:
//!
//! * [`context`] — typed pod and container contexts (QoS class, kube QoS), from hook requests or
//!   the CRI runtime.
//! * [`quantity`] — Kubernetes resource quantities in annotations.
//! * [`rules`] — the node-level policy: koordlet's NodeSLO, NodeResourceTopology and Node
//!   inputs, from the rules file (hot-reloaded) or the cluster ([`cluster`]).
//! * [`plugin`] — the plugin trait, stages, failure policy.
//! * [`plugins`] — koordlet v1.8.0's ten runtime hooks (the `GATES` table of [`feature_gates`]).
//! * [`change`] — what a plugin asks for.
//! * [`framework`] — runs a stage's plugins in order, merges, builds koordlet-style answers.
//! * [`cgroup`] — cgroup v1/v2 files, units, idempotent writes, drift; [`cpu_weight`] — CPU
//!   shares → `cpu.weight`; [`systemd`] — values on systemd units.
//! * [`cgroup_path`] — cgroup drivers (systemd, cgroupfs), slice expansion: a cgroup parent as
//!   kubelet or the runtime gives it → its directory.
//! * [`host`] — the kernel facilities beyond cgroup files (sysctl, tc, core scheduling, resctrl).
//! * [`lenient`] — the runtime's answers decoded without trusting author-controlled strings to
//!   be UTF-8 (views with `bytes` fields, item by item).
//! * [`cluster`] — the rules' inputs from the Kubernetes API (kube-rs watches of the node's
//!   objects); [`metrics`] — the process's metrics.
//! * The modes: [`proxy`] (the hook server: handlers and registration, its gRPC service, its
//!   request decoder), [`standalone`] (the reconciler; also re-applies rule changes in proxy
//!   mode), [`nri`] (the plugin — its protocol and connection loop are the `nri-plugin`
//!   crate's — and the mapping between NRI's objects and the plugins' contexts and changes).
//! * Above the modes: [`status`] — the admin endpoint (`/metrics`, `/healthz`, `/status`: the
//!   operator's view, also behind `runtime-hooks status`); [`cli`] — flags; [`run`] wires
//!   everything for the binary.

pub mod cgroup;
pub mod cgroup_path;
pub mod change;
pub mod cli;
pub mod cluster;
pub mod context;
pub mod cpu_weight;
pub mod feature_gates;
pub mod framework;
pub mod host;
pub mod lenient;
pub mod metrics;
pub mod nri;
pub mod plugin;
pub mod plugins;
pub mod proxy;
pub mod quantity;
pub mod rules;
pub mod standalone;
pub mod status;
pub mod systemd;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum as _;
use daemon_support::signals::Reloads;

use crate::cgroup::CgroupFs;
use crate::cgroup_path::CgroupDriver;
use crate::cli::{Args, Mode};
use crate::framework::Framework;
use crate::rules::RulesStore;
use crate::standalone::reconciler::Reconciler;

/// Runs the binary until `shutdown` resolves.
///
/// Proxy mode: binds `--listen`, registers in `--hook-config-dir`, serves, and keeps the
/// registration in place ([`proxy::server::Registration`]); at shutdown removes the registration first
/// (if it still names this server), then stops serving and removes the socket. Standalone mode (or proxy
/// mode with `--runtime-endpoint`): runs the reconciler.
///
/// The cgroup driver comes from `--cgroup-driver`, else from the runtime ([`cgroup_driver`]);
/// it is logged at start.
///
/// Each item of `reloads` (SIGHUP) re-reads the rules file, logged ([`follow_reloads`]).
///
/// Errors: bad flags (unknown plugin, a `--kubepods-cgroup` that is relative and not a slice
/// name under the systemd or auto driver), an invalid rules file, a cgroup root that is not a
/// mounted, writable cgroup file system of `--cgroup-version` ([`cgroup::check_root`]; with
/// `--unchecked-cgroup-root`, a version not given), a socket that cannot be bound, a
/// registration that cannot be written.
pub async fn run(args: Args, shutdown: impl Future<Output = ()>, reloads: Option<Reloads>) -> anyhow::Result<()> {
    let plugins = select_plugins(&args)?;
    let cgroup_version = cgroup_version(&args)?;
    let rules = rules_store(&args)?;
    let node_name = args.node_name.clone().unwrap_or_default();
    let cluster = follow_cluster(&args, &node_name, &rules).await?;
    let status = Arc::new(status::StatusSource::new(
        args.mode,
        rules.clone(),
        cluster.as_ref().map(|c| (node_name.clone(), c.status.clone())),
    ));
    status::serve(args.metrics_addr, args.admin_socket().as_deref(), status.clone())?;
    let (framework, driver_source) = build_framework(&args, plugins, cgroup_version, rules.clone()).await?;
    log_start(&args, &framework, &driver_source, cluster.as_ref().map(|_| node_name.as_str()));

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (reconciler, last_pass) = match start_reconciler(&args, &framework, &rules, cluster.as_ref(), stop_rx) {
        Some((task, last_pass)) => (Some(task), Some(last_pass)),
        None => (None, None),
    };
    status.set_running(running_status(&args, &framework, last_pass, driver_source));
    let reload_task = reloads.map(|reloads| tokio::spawn(follow_reloads(reloads, rules.clone(), args.rules.clone())));

    let result = match args.mode {
        Mode::Proxy => proxy::serve(&proxy_options(&args), framework, shutdown).await,
        Mode::Standalone => {
            notify_systemd(daemon_support::sd_notify::READY);
            shutdown.await;
            Ok(())
        }
        Mode::Nri => run_nri(&args, framework, shutdown).await,
    };
    let _ = stop_tx.send(true);
    if let Some(task) = reload_task {
        task.abort();
    }
    if let Some(task) = reconciler {
        let _ = task.await;
    }
    // The last line, "runtime-hooks stopped" (or why), is the binary's (daemon_support::daemon).
    result
}

/// The reconciler's socket, interval and last pass, as `/status` shows them.
type ReconcilerStatus = (PathBuf, Option<Duration>, Arc<std::sync::Mutex<standalone::reconciler::LastPass>>);

/// The plugins to run: `--feature-gates` (koordlet's gates), or the deprecated `--plugins` list
/// (logged as deprecated).
///
/// Errors: a `--plugins` name that is not a plugin.
fn select_plugins(args: &Args) -> anyhow::Result<Vec<Arc<dyn plugin::Plugin>>> {
    let plugin_options = plugins::PluginOptions {
        devices: plugins::devices::DeviceOptions {
            host_root: args.device_host_root.clone(),
            hami_core_library: args.hami_core_library_directory_path.clone(),
        },
        be_cpu_manager: false,
        partial_view: !args.selector.is_empty(),
        proc_sys: "/proc/sys".into(),
    };
    match &args.plugins {
        Some(names) => {
            tracing::warn!(
                "--plugins is deprecated: use --feature-gates (GroupIdentity, BatchResource, CPUSetAllocator; koordlet's names)"
            );
            plugins::select(names).map_err(anyhow::Error::msg)
        }
        None => Ok(args.feature_gates.plugins(&plugin_options)),
    }
}

/// The cgroup version of `--cgroup-root`: checked to be a mounted, writable cgroup file system
/// ([`cgroup::check_root`], its warnings logged), or `--cgroup-version` as given under
/// `--unchecked-cgroup-root` (logged at warn).
///
/// Errors: the root fails the check; `--unchecked-cgroup-root` without a version.
fn cgroup_version(args: &Args) -> anyhow::Result<cgroup::CgroupVersion> {
    if args.unchecked_cgroup_root {
        let Some(v) = args.cgroup_version.version() else {
            anyhow::bail!(
                "--unchecked-cgroup-root needs --cgroup-version v1 or v2: there is no mount to detect the version from"
            )
        };
        tracing::warn!(
            cgroup_root = %args.cgroup_root.display(),
            "--unchecked-cgroup-root: the cgroup root is not checked to be a mounted cgroup file system (for tests)"
        );
        return Ok(v);
    }
    let (v, warnings) =
        cgroup::check_root(&args.cgroup_root, args.cgroup_version.version()).map_err(anyhow::Error::msg)?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(v)
}

/// The rules: from `--rules` (watched; when the watch cannot be set up, re-read every 10 s,
/// logged) or koordlet's defaults, with the command line's rule flags applied.
///
/// Errors: the rules file cannot be read or is invalid.
fn rules_store(args: &Args) -> anyhow::Result<Arc<RulesStore>> {
    let rules = match &args.rules {
        Some(path) => {
            let store = RulesStore::open(path)?;
            if let Err(e) = store.watch() {
                tracing::warn!(file = %path.display(), "not watching the rules file (re-read every 10 s instead): {e:#}");
            }
            store
        }
        None => RulesStore::defaults(),
    };
    rules.set_flags(rules::RuleFlags { disable_unset_cpu_quota: args.disable_unset_cpu_quota });
    Ok(rules)
}

/// The cluster as a rule source, when there is a kubeconfig (`--kubeconfig`, or in a pod): the
/// watches of node `node_name`'s objects, feeding `rules`. `None` without one.
///
/// Errors: a kubeconfig that cannot be loaded ([`cluster::client`]); a cluster without a node
/// name (`--node-name`, `$NODE_NAME`).
async fn follow_cluster(
    args: &Args,
    node_name: &str,
    rules: &Arc<RulesStore>,
) -> anyhow::Result<Option<cluster::ClusterSource>> {
    let config = cluster::ClusterConfig { kubeconfig: args.kubeconfig.clone(), node_name: node_name.to_owned() };
    match cluster::client(&config).await? {
        Some(client) if node_name.is_empty() => {
            drop(client);
            anyhow::bail!(
                "rules from the cluster need the node's name: --node-name, or $NODE_NAME (the DaemonSet sets it from spec.nodeName)"
            )
        }
        Some(client) => Ok(Some(cluster::spawn(client, node_name.to_owned(), rules.clone()))),
        None => Ok(None),
    }
}

/// The framework every mode runs: the plugins over the cgroup files (version `version`, the
/// node's cgroup driver, the `cpu.weight` formula, systemd's bus) and the host's kernel
/// facilities, with the rules in force; and where the driver came from ([`cgroup_driver`]).
/// Logs the enabled plugins that do nothing on cgroup v2 ([`v1_only_plugins`]).
///
/// Errors: a `--kubepods-cgroup` that the driver cannot place.
async fn build_framework(
    args: &Args,
    plugins: Vec<Arc<dyn plugin::Plugin>>,
    version: cgroup::CgroupVersion,
    rules: Arc<RulesStore>,
) -> anyhow::Result<(Arc<Framework>, String)> {
    let cgroups = CgroupFs::new(&args.cgroup_root, version);
    let (driver, driver_source) = cgroup_driver(args).await;
    if let Some(kubepods) = &args.kubepods_cgroup {
        cgroup_path::kube_qos_dirs(kubepods, driver).map_err(|e| anyhow::anyhow!("--kubepods-cgroup: {e}"))?;
    }
    let cgroups = cgroups
        .with_driver(driver)
        .with_weight_formula(args.cpu_weight_formula.formula())
        .with_systemd(systemd_bus(driver));
    let on = |name: &str| plugins.iter().any(|p| p.name() == name);
    let uses = host::Uses { core_sched: on(plugins::CoreSched::NAME), resctrl: on(plugins::Resctrl::NAME) };
    let host = Arc::new(host::Host::detect_for(
        host::HostPaths {
            cgroup_root: args.cgroup_root.clone(),
            proc_sys: "/proc/sys".into(),
            terway_qos_dir: args.terway_qos_dir.clone(),
            resctrl_root: args.resctrl_root.clone(),
        },
        uses,
    ));
    let framework =
        Arc::new(Framework::new(plugins, args.plugin_failure_policy, rules, Arc::new(cgroups)).with_host(host));
    for name in v1_only_plugins(&framework) {
        tracing::warn!(
            plugin = name,
            "{name} works on cgroup v1 only (koordlet runs it only there: net_cls has no cgroup v2 counterpart); on this cgroup v2 host it writes no net_cls classids and no pod fails for it"
        );
    }
    Ok((framework, driver_source))
}

/// The start-up line: mode, plugins, gates, stages, cgroups, the `cpu.weight` formula, the
/// host's facilities, the rule sources (`cluster_node`: the node followed, when the cluster is one).
fn log_start(args: &Args, framework: &Framework, driver_source: &str, cluster_node: Option<&str>) {
    let stages = framework.stages();
    tracing::info!(
        mode = %args.mode.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default(),
        plugins = %framework.plugins().iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
        feature_gates = %args.feature_gates.describe(),
        stages = %stages.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(","),
        cgroup = %match framework.cgroups().version() { cgroup::CgroupVersion::V1 => "v1", cgroup::CgroupVersion::V2 => "v2" },
        cgroup_root = %framework.cgroups().root().display(),
        cgroup_driver = %driver_source,
        cpu_weight_formula = %match args.cpu_weight_formula.formula() {
            Some(f) => f.as_str().to_owned(),
            None => format!("auto (learned from the runtime; {} until then)", cpu_weight::DEFAULT_FORMULA.as_str()),
        },
        host = %framework.host().describe(),
        rules = %args.rules.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "koordlet's defaults".into()),
        cluster = %match cluster_node {
            Some(node) => format!("node {node} (NodeSLO, NodeResourceTopology, Node, pods)"),
            None => "none (no --kubeconfig, not in a pod)".into(),
        },
        "runtime-hooks running"
    );
}

/// Spawns the reconciler when there is a runtime to reconcile ([`Args::reconcile_endpoint`]:
/// standalone mode, or `--runtime-endpoint`): passes at start, every `--reconcile-interval`
/// and on rule changes, until `stop` turns true. Returns its task and what `/status` shows of it.
fn start_reconciler(
    args: &Args,
    framework: &Arc<Framework>,
    rules: &RulesStore,
    cluster: Option<&cluster::ClusterSource>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Option<(tokio::task::JoinHandle<()>, ReconcilerStatus)> {
    let endpoint = args.reconcile_endpoint()?;
    let r = Reconciler::new(framework.clone(), &endpoint)
        .with_selector(args.selector.clone())
        .with_kubepods(args.kubepods_cgroup.clone())
        .with_cluster_pods(cluster.map(|c| c.pods.clone()));
    let interval = match args.interval() {
        Some(d) => format!("{} ms", d.as_millis()),
        None => "none (at start and on rule changes only)".to_owned(),
    };
    tracing::info!(endpoint = %endpoint.display(), %interval, "reconciler running");
    let last_pass = (endpoint, args.interval(), r.last_pass());
    let mut stop = stop;
    let stopped = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    Some((tokio::spawn(r.run(args.interval(), rules.subscribe(), stopped)), last_pass))
}

/// Proxy mode's flags.
fn proxy_options(args: &Args) -> proxy::Options {
    proxy::Options {
        listen: args.listen.clone(),
        hook_config_dir: args.hook_config_dir.clone(),
        hook_name: args.hook_name.clone(),
        failure_policy: args.failure_policy,
    }
}

/// NRI mode: runs the NRI plugin ([`nri::run`]) until `shutdown` resolves, ready for systemd at
/// once (it connects, and reconnects, in the background).
///
/// Errors: those of [`nri::run`].
async fn run_nri(args: &Args, framework: Arc<Framework>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let options = nri::Options {
        socket: args.nri_socket.clone(),
        name: args.nri_plugin_name.clone(),
        index: args.nri_plugin_index.clone(),
        selector: args.selector.clone(),
    };
    tracing::info!(socket = %options.socket.display(), "NRI plugin starting");
    // Ready once the plugin runs: it connects (and reconnects) in the background, so a
    // runtime that is not there yet must not hold `systemctl start` until its timeout.
    notify_systemd(daemon_support::sd_notify::READY);
    nri::run(framework, options, shutdown).await
}

/// What `/status` reports once the plugins are set up: the plugins and their stages, the
/// registration (proxy mode; its file read back when asked) or the NRI plugin, the reconciler.
fn running_status(
    args: &Args,
    framework: &Framework,
    reconciler: Option<ReconcilerStatus>,
    driver: String,
) -> status::Running {
    let stages = framework.stages();
    // The registration proxy::serve writes: the same directory, name, absolute endpoint and stages.
    let registration = match args.mode {
        Mode::Proxy => std::path::absolute(&args.listen).ok().and_then(|l| {
            proxy::server::Registration::new(&args.hook_config_dir, &args.hook_name, &l, args.failure_policy, &stages)
                .ok()
        }),
        Mode::Standalone | Mode::Nri => None,
    };
    let version = match framework.cgroups().version() {
        cgroup::CgroupVersion::V1 => "v1",
        cgroup::CgroupVersion::V2 => "v2",
    };
    status::Running {
        plugins: framework.plugins().iter().map(|p| p.name()).collect(),
        plugin_failure_policy: args.plugin_failure_policy,
        stages,
        registration,
        failure_policy: args.failure_policy,
        nri: (args.mode == Mode::Nri)
            .then(|| (args.nri_socket.clone(), args.nri_plugin_name.clone(), args.nri_plugin_index.clone())),
        reconciler,
        cgroups: format!("{version} at {}, driver {driver}", framework.cgroups().root().display()),
    }
}

/// Acts on each reload request (SIGHUP): re-reads the rules file (`path`, `--rules`) now, as
/// its watcher would (an invalid version is logged and the rules in force kept; a change is
/// logged, announced and re-applied to running pods as any change), and logs the outcome.
/// Without a rules file there is nothing to re-read, which is logged too. Flags and the
/// cluster's watches are not touched: flags take a restart, the watches follow the API server.
pub async fn follow_reloads(mut reloads: Reloads, rules: Arc<RulesStore>, path: Option<std::path::PathBuf>) {
    while let Some(signal) = reloads.next().await {
        let Some(path) = &path else {
            tracing::info!(
                signal = signal.name(),
                "reload: there is no rules file to re-read (no --rules: koordlet's defaults, or the cluster's objects, are in force)"
            );
            continue;
        };
        tracing::info!(signal = signal.name(), file = %path.display(), "reloading: re-reading the rules file");
        let store = rules.clone();
        let Ok(changed) = tokio::task::spawn_blocking(move || store.reload()).await else {
            return; // the runtime is shutting down
        };
        if changed {
            tracing::info!(signal = signal.name(), file = %path.display(), "reloaded: the rules file's new rules are in force");
        } else {
            tracing::info!(
                signal = signal.name(),
                file = %path.display(),
                "reloaded: the rules in force stay (the file holds the same rules, or a version that is invalid: see above)"
            );
        }
    }
}

/// `--probe`: one PostStopPodSandboxHook call, with an empty request, to the server listening
/// on `listen` (no plugin acts at that stage: the answer is the echo), within `timeout`.
///
/// Errors, each one line for the probe's output: no answer within `timeout`, the socket refusing
/// the connection or an error status (`hook call to PATH: UNAVAILABLE: …`,
/// [`hook_api::status_line`]).
pub async fn probe(listen: &std::path::Path, timeout: std::time::Duration) -> anyhow::Result<()> {
    let mut client = hook_api::RuntimeHookServiceClient::new(hook_api::connect(listen));
    let call = client.post_stop_pod_sandbox_hook(hook_api::v1alpha1::PodSandboxHookRequest::default());
    match tokio::time::timeout(timeout, call).await {
        Err(_) => anyhow::bail!("no answer from {} within {} ms", listen.display(), timeout.as_millis()),
        Ok(Err(status)) => anyhow::bail!("hook call to {}: {}", listen.display(), hook_api::status_line(&status)),
        Ok(Ok(_)) => Ok(()),
    }
}

pub use daemon_support::sd_notify::notify_systemd;

/// The enabled plugins that do nothing on this node's cgroup version: TCNetworkQoS and TerwayQoS
/// on cgroup v2 (both classify pods by `net_cls.classid`, a cgroup v1 controller).
pub fn v1_only_plugins(framework: &Framework) -> Vec<&'static str> {
    if framework.cgroups().version() != cgroup::CgroupVersion::V2 {
        return Vec::new();
    }
    let v1_only = [plugins::tc::TcNetworkQos::NAME, plugins::terway_qos::TerwayQos::NAME];
    framework.plugins().iter().map(|p| p.name()).filter(|n| v1_only.contains(n)).collect()
}

/// The system bus, to set values on systemd units ([`cgroup`], "systemd units"), unless the
/// driver is cgroupfs. Without it, under the systemd driver, values runtime-hooks writes to pod
/// slices are reverted by systemd at the next `daemon-reload`: a WARN says so and names the
/// socket to mount (a DaemonSet: the host's `/run/dbus/system_bus_socket`).
fn systemd_bus(driver: Option<CgroupDriver>) -> Option<systemd::Systemd> {
    if driver == Some(CgroupDriver::Cgroupfs) {
        return None;
    }
    match systemd::Systemd::connect() {
        Ok(bus) => {
            tracing::info!(socket = %bus.socket().display(), "systemd's bus: values on slices and scopes are also set as their units' properties");
            Some(bus)
        }
        Err(e) if driver == Some(CgroupDriver::Systemd) => {
            tracing::warn!("systemd cgroup driver, but systemd's bus cannot be reached ({e}): values written to pod slices are reverted by systemd at its next daemon-reload; give runtime-hooks the host's /run/dbus/system_bus_socket");
            None
        }
        Err(e) => {
            tracing::debug!("no systemd bus ({e}); cgroup files only");
            None
        }
    }
}

/// The node's cgroup driver and where it came from (for the start-up line): `--cgroup-driver`
/// when given; under `auto`, the runtime's answer to CRI `RuntimeConfig` (asked once, 2 s at
/// most, when there is a runtime endpoint: `--runtime-endpoint`, or standalone's default);
/// otherwise `None`, each cgroup name's form deciding ([`cgroup_path::infer_driver`]).
/// containerd implements `RuntimeConfig` from 2.0 (1.6 and 1.7 answer UNIMPLEMENTED).
pub async fn cgroup_driver(args: &Args) -> (Option<CgroupDriver>, String) {
    const FORM: &str = "auto: each cgroup name's form decides";
    if let Some(d) = args.cgroup_driver.driver() {
        return (Some(d), format!("{d} (--cgroup-driver)"));
    }
    let Some(endpoint) = args.reconcile_endpoint() else {
        return (None, format!("{FORM} (no --runtime-endpoint to ask)"));
    };
    match standalone::reconciler::runtime_cgroup_driver(&endpoint, std::time::Duration::from_secs(2)).await {
        Ok(d) => (Some(d), format!("{d} (the runtime's RuntimeConfig)")),
        Err(e) => (None, format!("{FORM} (RuntimeConfig: {e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::{FailurePolicy, Plugin};

    #[test]
    fn net_cls_plugins_are_named_on_cgroup_v2_only() {
        let t = tempfile::tempdir().unwrap();
        let plugins: Vec<Arc<dyn Plugin>> = vec![
            Arc::new(plugins::tc::TcNetworkQos::default()),
            Arc::new(plugins::terway_qos::TerwayQos::default()),
            Arc::new(plugins::batch_resource::BatchResource),
        ];
        let on = |version| {
            let cgroups = Arc::new(CgroupFs::new(t.path(), version));
            Framework::new(plugins.clone(), FailurePolicy::Ignore, RulesStore::fixed(rules::Rules::default()), cgroups)
        };
        assert_eq!(v1_only_plugins(&on(cgroup::CgroupVersion::V2)), vec!["TCNetworkQoS", "TerwayQoS"]);
        assert!(v1_only_plugins(&on(cgroup::CgroupVersion::V1)).is_empty());
    }
}
