//! Standalone mode (and rule changes in proxy mode): make the cgroups of running pods what the
//! plugins want, without a proxy in the path.
//!
//! # One pass
//!
//! One pass ([`Reconciler::reconcile`]):
//!
//! 1. lists the READY pod sandboxes and RUNNING containers from the CRI runtime
//!    (`--runtime-endpoint`, CRI v1 `ListPodSandbox` / `ListContainers`), decoded through
//!    [`crate::lenient`]'s views: item by item (an item that does not decode at all is skipped
//!    with a WARN naming its index and ID), labels and annotations that are not UTF-8 left out
//!    of what the plugins see — so a pod author's bytes never stop a pass, and their pod is
//!    corrected like any other;
//! 2. learns each pod's cgroup parent and each container's cgroup and turns them into
//!    directories (see *Cgroup directories* below);
//! 3. asks the plugins what they would answer for the pod at PreRunPodSandbox and for each
//!    container at PreCreateContainer — the same functions proxy mode calls — and keeps the
//!    cgroup part: the pod-level values and the container resources;
//! 4. writes what differs ([`crate::cgroup::CgroupFs::apply`], retrying EINVAL after the other
//!    writes of the pod, see [`crate::framework::apply_all`]) and logs every correction:
//!    `drift corrected … file=… old=… new=…`. The pod sandbox (pause) container gets what the
//!    plugins answer for a container with an empty name (koordlet's SandboxLevel reconcilers:
//!    CPUSet's cpuset and unset CFS quota), in its own directory (`runtimeSpec.linux.cgroupsPath`
//!    of the sandbox's verbose status);
//! 5. with `--kubepods-cgroup`, also the kubelet QoS directories (`kubepods`, `…/burstable`,
//!    `…/besteffort`) from [`crate::plugin::Plugin::kube_qos`];
//! 6. the NodeSLO's host applications' directories, from [`crate::plugin::Plugin::host_app`];
//! 7. runs the plugins' node-level work ([`crate::plugin::Plugin::node`]) over the pods of the
//!    pass, with their cgroup directories.
//!
//! # Cgroup directories
//!
//! A pod's cgroup parent comes from `PodSandboxStatus` (verbose: `config.linux.cgroup_parent` in
//! containerd's `info`, as kubelet gave it), a container's cgroup from `ContainerStatus`
//! (verbose: the OCI spec's `linux.cgroupsPath`), both cached per ID (they never change); the
//! cgroup driver turns them into directories ([`crate::cgroup_path`]). What containerd reports,
//! by driver:
//!
//! | | pod `cgroup_parent` | container `cgroupsPath` | container directory |
//! |---|---|---|---|
//! | cgroupfs | `/kubepods/besteffort/pod<uid>` | `/kubepods/besteffort/pod<uid>/<id>` | the same |
//! | systemd | `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice` | `kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>` | `<pod dir>/cri-containerd-<id>.scope` |
//! | empty parent | none (the runtime's default) | `/k8s.io/<id>` | the same |
//!
//! containerd picks the systemd form by the parent's last component (`….slice`), whatever
//! runc's driver. A container without a reported path is `<pod dir>/<id>` (cgroupfs) or
//! `<pod dir>/cri-containerd-<id>.scope` (systemd).
//!
//! The verbose `info` is parsed once per object into just these fields ([`VerboseInfo`]): a
//! container's envs, which it holds twice, are skipped, not built. A `ContainerStatus` that
//! fails (an answer above 16 MiB: some 300 k envs) is logged once per container, and the
//! container gets the default directory above, so it and its pod's values are still corrected.
//!
//! A pod with an empty cgroup parent (the runtime's default cgroup) gets no pod-level values (a
//! debug line), its containers theirs; a pod whose runtime reports nothing about its cgroups (no
//! verbose `config`, no `cgroupsPath`) is skipped.
//!
//! # Schedule and idempotence
//!
//! A pass is idempotent: a second pass over unchanged pods writes nothing. [`Reconciler::run`]
//! repeats it every `--reconcile-interval` and at once when the rules change.
//!
//! Envs, annotations, devices, mounts and cgroup parents cannot be changed for running
//! containers and are not touched.
//!
//! # Errors
//!
//! Plugin failures and cgroup names that cannot be resolved are logged once (not every pass) and
//! never stop the pass for other pods.
//!
//! A pass that looks for its pods' cgroup directories and finds none of them — the cgroup root
//! is not the host's, or the version or driver is wrong — is a WARN, once, naming the root and
//! one missing directory (else every pass would quietly report `corrected=0`).

use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::cgroup::{CgroupError, Drift, Written};
use crate::cgroup_path::{self, CgroupDriver};
use crate::context::{ContainerContext, PodContext};
use crate::framework::{apply_all, Framework, Owned};
use crate::lenient::{cri as view, decode_items, entries_map, lossy, ViewCodec};

#[path = "reconciler_info.rs"]
mod info;
use crate::plugin::{ContainerState, NodePods, PodState, Stage};
use crate::rules::host_app::HostAppBase;
use crate::standalone::pod_spec;
pub use info::{StatusInfo, VerboseInfo};

/// One corrected file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Correction {
    /// `namespace/pod`, `namespace/pod/container` or `kubepods QoS dir <dir>`.
    pub target: String,
    /// The plugin that wanted the value.
    pub plugin: &'static str,
    /// File, old and new value.
    pub drift: Drift,
}

/// What one pass did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Pods looked at (READY, matching the selector, with a known cgroup parent).
    pub pods: usize,
    /// Containers looked at (RUNNING).
    pub containers: usize,
    /// Files corrected.
    pub corrected: Vec<Correction>,
    /// Plugin failures and failed writes, one line each.
    pub failures: Vec<String>,
}

/// The reconciler's last pass, for `runtime-hooks status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LastPass {
    /// Passes run since start (those that failed included).
    pub passes: u64,
    /// When the last pass ended; `None` before the first.
    pub at: Option<std::time::SystemTime>,
    /// Why it ran: `start`, `interval` or `rules changed`.
    pub reason: &'static str,
    /// Pods looked at, as in its [`Report`].
    pub pods: usize,
    /// Containers looked at.
    pub containers: usize,
    /// Files corrected.
    pub corrected: usize,
    /// Per-pod failures (plugin failures, failed writes).
    pub failures: usize,
    /// Why the pass failed as a whole (the runtime could not be listed); `None` when it ran.
    pub error: Option<String>,
}

/// A READY pod sandbox as listed (strings a pod author controls decoded by [`crate::lenient`]).
struct ListedPod {
    id: String,
    name: String,
    namespace: String,
    uid: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    /// The API server's pod, when the cluster source has it: its spec gives the pods' and
    /// containers' resources ([`crate::standalone::pod_spec`]).
    api: Option<Arc<k8s_openapi::api::core::v1::Pod>>,
}

/// A RUNNING container as listed: no annotations, which no plugin reads of a container
/// ([`crate::plugins::POD_ANNOTATIONS_READ`]); a pod author's 13 MiB of them are not copied.
struct ListedContainer {
    id: String,
    pod_sandbox_id: String,
    name: String,
}

const LIST_POD_SANDBOX: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
const LIST_CONTAINERS: &str = "/runtime.v1.RuntimeService/ListContainers";
const POD_SANDBOX_STATUS: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
const CONTAINER_STATUS: &str = "/runtime.v1.RuntimeService/ContainerStatus";
/// Largest answer read from the runtime: containerd's default send limit, 16 MiB (a larger
/// one would not help: containerd fails its side first). A container's verbose status above it
/// (some 300 k envs) is handled without it ([`Reconciler::container_dir`]).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The standalone reconciler.
pub struct Reconciler {
    framework: Arc<Framework>,
    endpoint: PathBuf,
    channel: Channel,
    selector: Vec<(String, String)>,
    kubepods: Option<String>,
    cluster_pods: Option<Arc<crate::cluster::PodIndex>>,
    parents: BTreeMap<String, String>,
    /// The pod sandbox (pause) container's `cgroupsPath`, per sandbox ID, when reported.
    sandbox_paths: HashMap<String, Option<String>>,
    dirs: BTreeMap<String, String>,
    /// Containers whose last `ContainerStatus` failed (logged once each).
    status_failed: HashSet<String>,
    reported: HashSet<String>,
    last_pass: Arc<std::sync::Mutex<LastPass>>,
    /// Whether the last pass found none of its pods' cgroup directories (warned once).
    no_dirs_warned: bool,
}

/// What one pass found of its pods' and containers' cgroup directories.
#[derive(Default)]
struct DirsSeen {
    looked_for: usize,
    found: usize,
    /// One that was not there, for the warning.
    missing: Option<PathBuf>,
}

impl DirsSeen {
    /// Looks whether the cgroup `dir` exists below the root (`cgroups`' hierarchy of most values).
    /// Once one is found in a pass, the others are not looked at (a `statx` per pod and container
    /// saved): only a pass that finds none is reported.
    fn look(&mut self, cgroups: &crate::cgroup::CgroupFs, dir: &str) {
        if self.found > 0 {
            return;
        }
        let Ok(path) = cgroups.cgroup_dir(dir) else { return };
        self.looked_for += 1;
        if path.is_dir() {
            self.found += 1;
        } else if self.missing.is_none() {
            self.missing = Some(path);
        }
    }
}

impl Reconciler {
    /// A reconciler for the pods of the CRI runtime at `endpoint` (a unix socket; the connection
    /// is made lazily and re-made after failures). Must be called within a tokio runtime.
    pub fn new(framework: Arc<Framework>, endpoint: &Path) -> Reconciler {
        Reconciler {
            framework,
            endpoint: endpoint.to_owned(),
            channel: hook_api::connect(endpoint),
            selector: Vec::new(),
            kubepods: None,
            cluster_pods: None,
            parents: Default::default(),
            sandbox_paths: HashMap::new(),
            dirs: Default::default(),
            status_failed: HashSet::new(),
            reported: HashSet::new(),
            last_pass: Arc::default(),
            no_dirs_warned: false,
        }
    }

    /// What [`Reconciler::run`]'s last pass did, updated after each pass.
    pub fn last_pass(&self) -> Arc<std::sync::Mutex<LastPass>> {
        self.last_pass.clone()
    }

    /// Only pods whose labels hold every `key=value` of `selector` (empty: all pods).
    pub fn with_selector(mut self, selector: Vec<(String, String)>) -> Reconciler {
        self.selector = selector;
        self
    }

    /// Also reconcile the kubelet QoS directories below `root` (cgroupfs driver: `/kubepods`).
    pub fn with_kubepods(mut self, root: Option<String>) -> Reconciler {
        self.kubepods = root;
        self
    }

    /// Take pods' labels and annotations from the API server's view of them when it has the
    /// pod (same UID), as koordlet's reconciler reads pods from its statesinformer: an
    /// annotation changed after the pod was created (a resize's new batch resources, a new
    /// resource status) then reaches the pod's cgroups. Pods the API server does not have (yet)
    /// keep the runtime's labels and annotations (kubelet passes the pod's own to the runtime).
    pub fn with_cluster_pods(mut self, pods: Option<Arc<crate::cluster::PodIndex>>) -> Reconciler {
        self.cluster_pods = pods;
        self
    }

    /// One unary CRI call whose answer is read as the view `D` ([`crate::lenient`]).
    async fn call<E, D>(&self, path: &'static str, request: E) -> Result<D, tonic::Status>
    where
        E: prost::Message + Send + Sync + 'static,
        D: prost::Message + Default + Send + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone()).max_decoding_message_size(MAX_ANSWER_BYTES);
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        Ok(grpc.unary(tonic::Request::new(request), path, ViewCodec::<E, D>::default()).await?.into_inner())
    }

    /// The READY sandboxes, each decoded on its own: one that does not decode at all is logged
    /// (WARN, with its index and ID) and skipped; values that are not UTF-8 are left out.
    ///
    /// Errors: the call fails, or its answer is not a list.
    async fn list_pods(&self) -> anyhow::Result<Vec<ListedPod>> {
        let state = Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 });
        let request =
            cri::ListPodSandboxRequest { filter: Some(cri::PodSandboxFilter { state, ..Default::default() }) };
        let answer: view::ListPodSandboxResponse = self.call(LIST_POD_SANDBOX, request).await.map_err(|s| {
            anyhow::anyhow!("ListPodSandbox on {}: {}: {}", self.endpoint.display(), s.code(), s.message())
        })?;
        let (items, bad) = decode_items::<view::PodSandbox>(&answer.items);
        for (index, id, why) in bad {
            tracing::warn!(index, sandbox = %id, "ListPodSandbox: a pod sandbox that does not decode is skipped: {why}");
        }
        Ok(items
            .into_iter()
            .map(|s| {
                let meta = s.metadata.unwrap_or_default();
                let uid = lossy(&meta.uid);
                let (mut labels, mut annotations) = (entries_map(&s.labels), entries_map(&s.annotations));
                let api = self.cluster_pods.as_ref().and_then(|p| p.get(&uid));
                if let Some(api) = &api {
                    labels = api.metadata.labels.clone().unwrap_or_default().into_iter().collect();
                    annotations = api.metadata.annotations.clone().unwrap_or_default().into_iter().collect();
                }
                ListedPod {
                    id: lossy(&s.id),
                    name: lossy(&meta.name),
                    namespace: lossy(&meta.namespace),
                    uid,
                    labels,
                    annotations,
                    api,
                }
            })
            .collect())
    }

    /// The RUNNING containers, each decoded on its own (as [`Reconciler::list_pods`]).
    ///
    /// Errors: the call fails, or its answer is not a list.
    async fn list_containers(&self) -> anyhow::Result<Vec<ListedContainer>> {
        let state = Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 });
        let request = cri::ListContainersRequest { filter: Some(cri::ContainerFilter { state, ..Default::default() }) };
        let answer: view::ListContainersResponse = self.call(LIST_CONTAINERS, request).await.map_err(|s| {
            anyhow::anyhow!("ListContainers on {}: {}: {}", self.endpoint.display(), s.code(), s.message())
        })?;
        let (items, bad) = decode_items::<view::Container>(&answer.containers);
        for (index, id, why) in bad {
            tracing::warn!(index, container = %id, "ListContainers: a container that does not decode is skipped: {why}");
        }
        Ok(items
            .into_iter()
            .map(|c| ListedContainer {
                id: lossy(&c.id),
                pod_sandbox_id: lossy(&c.pod_sandbox_id),
                name: c.metadata.map(|m| lossy(&m.name)).unwrap_or_default(),
            })
            .collect())
    }

    /// One pass over every pod (see the module documentation).
    ///
    /// Errors: the runtime cannot be listed (per-pod problems are in [`Report::failures`]).
    pub async fn reconcile(&mut self) -> anyhow::Result<Report> {
        let sandboxes = self.list_pods().await?;
        let containers = self.list_containers().await?;
        // Forget cached paths of what is gone.
        let live_pods: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
        self.parents.retain(|id, _| live_pods.contains(id.as_str()));
        self.sandbox_paths.retain(|id, _| live_pods.contains(id.as_str()));
        let live_containers: HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        self.dirs.retain(|id, _| live_containers.contains(id.as_str()));
        self.status_failed.retain(|id| live_containers.contains(id.as_str()));

        let mut by_pod: HashMap<&str, Vec<&ListedContainer>> = HashMap::new();
        for c in &containers {
            by_pod.entry(c.pod_sandbox_id.as_str()).or_default().push(c);
        }
        self.learn_weight_formula(&sandboxes, &by_pod).await;
        let mut report = Report::default();
        let mut failures_now = HashSet::new();
        let mut seen = DirsSeen::default();
        let mut states: Vec<PodState> = Vec::new();
        for sandbox in &sandboxes {
            if !self.selector.iter().all(|(k, v)| sandbox.labels.get(k) == Some(v)) {
                continue;
            }
            let Some(parent) = self.pod_parent(&sandbox.id).await else {
                continue;
            };
            let pod = PodContext {
                name: sandbox.name.clone(),
                namespace: sandbox.namespace.clone(),
                uid: sandbox.uid.clone(),
                labels: sandbox.labels.clone(),
                annotations: sandbox.annotations.clone(),
                cgroup_parent: parent.clone(),
                resources: sandbox.api.as_deref().and_then(pod_spec::pod),
            };
            report.pods += 1;
            // The pod's own directory: none for the runtime's default (empty parent).
            let pod_dir = match self.framework.cgroups().resolve(&parent) {
                Ok(dir) => dir,
                Err(e) => {
                    failures_now.insert(format!("{}: pod cgroup: {e}", pod.key()));
                    None
                }
            };
            if let Some(dir) = &pod_dir {
                seen.look(self.framework.cgroups(), dir);
            }
            let mut state = PodState { pod: pod.clone(), cgroup_dir: pod_dir.clone(), containers: Vec::new() };
            let mut writes: Vec<(String, String, Owned)> = Vec::new(); // (target, dir, value)
            match self.framework.run_pod(Stage::PreRunPodSandbox, &pod) {
                Ok(outcome) => {
                    failures_now.extend(outcome.failures.iter().map(|f| f.to_string()));
                    match &pod_dir {
                        Some(dir) => writes.extend(outcome.pod_values.into_iter().map(|o| (pod.key(), dir.clone(), o))),
                        None if parent.is_empty() && !outcome.pod_values.is_empty() => {
                            tracing::debug!(pod = %pod.key(), "empty cgroup parent (the runtime's default cgroup): pod-level values not written")
                        }
                        None => {}
                    }
                }
                Err(f) => {
                    failures_now.insert(f.to_string());
                }
            }
            // The sandbox (pause) container, as koordlet's SandboxLevel reconcilers see it: a
            // container with an empty name (CPUSet gives it the pod's CPUs).
            if let Some(path) = self.sandbox_paths.get(&sandbox.id).cloned().flatten() {
                match cgroup_path::container_dir(&path, pod_dir.as_deref(), self.framework.cgroups().driver()) {
                    Ok(dir) => {
                        let pause = ContainerContext { pod: pod.clone(), id: sandbox.id.clone(), ..Default::default() };
                        match self.framework.run_container(Stage::PreCreateContainer, &pause) {
                            Ok(outcome) => writes.extend(
                                outcome
                                    .container_values
                                    .into_iter()
                                    .map(|o| (format!("{} sandbox", pod.key()), dir.clone(), o)),
                            ),
                            Err(f) => {
                                failures_now.insert(format!("{} sandbox: {f}", pod.key()));
                            }
                        }
                    }
                    Err(e) => {
                        failures_now.insert(format!("{} sandbox: cgroup {path:?}: {e}", pod.key()));
                    }
                }
            }
            for c in by_pod.get(sandbox.id.as_str()).into_iter().flatten() {
                let dir = match self.container_dir(&c.id, pod_dir.as_deref()).await {
                    Ok(Some(dir)) => dir,
                    Ok(None) => continue,
                    Err(e) => {
                        failures_now.insert(format!("{}/{}: container cgroup: {e}", pod.key(), c.name));
                        continue;
                    }
                };
                seen.look(self.framework.cgroups(), &dir);
                let container = ContainerContext {
                    pod: pod.clone(),
                    name: c.name.clone(),
                    id: c.id.clone(),
                    annotations: Default::default(),
                    envs: Default::default(),
                    resources: sandbox.api.as_deref().and_then(|p| pod_spec::container_of(p, &c.name)),
                };
                report.containers += 1;
                state.containers.push(ContainerState { container: container.clone(), cgroup_dir: Some(dir.clone()) });
                match self.framework.run_container(Stage::PreCreateContainer, &container) {
                    Ok(outcome) => {
                        failures_now.extend(outcome.failures.iter().map(|f| f.to_string()));
                        if let Some(pod_dir) = &pod_dir {
                            writes.extend(outcome.pod_values.into_iter().map(|o| (pod.key(), pod_dir.clone(), o)));
                        }
                        writes.extend(outcome.container_values.into_iter().map(|o| (container.key(), dir.clone(), o)));
                    }
                    Err(f) => {
                        failures_now.insert(f.to_string());
                    }
                }
            }
            self.write(writes, &mut report, &mut failures_now);
            states.push(state);
        }
        if let Some(root) = self.kubepods.clone() {
            self.kube_qos_dirs(&root, &mut report, &mut failures_now);
        }
        self.host_app_dirs(&mut report, &mut failures_now);
        failures_now.extend(self.framework.node_pass(&NodePods::given(&states)).iter().map(|f| f.to_string()));
        self.check_dirs_seen(&seen, report.pods);
        // Log each failure once, when it first appears; forget the ones that went away.
        for f in failures_now.difference(&self.reported) {
            tracing::warn!("reconcile: {f}");
        }
        report.failures = failures_now.iter().cloned().collect();
        report.failures.sort();
        self.reported = failures_now;
        Ok(report)
    }

    /// Warns once when a pass looked for its pods' cgroup directories and found none of them:
    /// the cgroup root is not the host's (a DaemonSet without the host's cgroup mount, or in
    /// its own cgroup namespace), or `--cgroup-version` / `--cgroup-driver` name them wrongly.
    /// Each write would otherwise fail quietly (a missing directory is a pod gone away, debug),
    /// pass after pass, with `corrected=0`. Says so again when directories are found again.
    fn check_dirs_seen(&mut self, seen: &DirsSeen, pods: usize) {
        if seen.looked_for > 0 && seen.found == 0 {
            if !self.no_dirs_warned {
                let cgroups = self.framework.cgroups();
                let version = match cgroups.version() {
                    crate::cgroup::CgroupVersion::V1 => "v1",
                    crate::cgroup::CgroupVersion::V2 => "v2",
                };
                tracing::warn!(
                    cgroup_root = %cgroups.root().display(),
                    missing = %seen.missing.as_deref().unwrap_or(Path::new("")).display(),
                    pods,
                    directories = seen.looked_for,
                    "none of the pods' cgroup directories exist below --cgroup-root for a whole pass: nothing can be corrected. \
                     Is the host's cgroup file system mounted there (a DaemonSet: hostPath /sys/fs/cgroup, e.g. at /host/sys/fs/cgroup), \
                     and are --cgroup-version ({version}) and --cgroup-driver right?"
                );
                self.no_dirs_warned = true;
            }
        } else if seen.found > 0 && self.no_dirs_warned {
            tracing::info!(cgroup_root = %self.framework.cgroups().root().display(), found = seen.found, "pods' cgroup directories found again");
            self.no_dirs_warned = false;
        }
    }

    fn write(&self, writes: Vec<(String, String, Owned)>, report: &mut Report, failures: &mut HashSet<String>) {
        let targets: HashMap<(String, &'static str), String> =
            writes.iter().map(|(t, d, o)| ((d.clone(), o.value.kind()), t.clone())).collect();
        let batch = writes.into_iter().map(|(_, d, o)| (d, o)).collect();
        for w in apply_all(self.framework.cgroups(), batch) {
            let target = targets.get(&(w.dir.clone(), w.owned.value.kind())).cloned().unwrap_or_default();
            match w.result {
                Ok(Written::Corrected(drift)) => {
                    tracing::info!(
                        on = %target, plugin = w.owned.plugin, file = %drift.path.display(), old = %drift.old,
                        new = %drift.new, "drift corrected"
                    );
                    report.corrected.push(Correction { target, plugin: w.owned.plugin, drift });
                }
                Ok(Written::Unchanged | Written::Unsupported) => {}
                // Gone between the listing and the write (or the QoS dir does not exist).
                Err(CgroupError::NoDir(dir)) => {
                    tracing::debug!(on = %target, "cgroup {} is gone", dir.display())
                }
                Err(e) => {
                    failures.insert(format!("{target}: plugin {}: setting {}: {e}", w.owned.plugin, w.owned.value));
                }
            }
        }
    }

    fn kube_qos_dirs(&self, root: &str, report: &mut Report, failures: &mut HashSet<String>) {
        let dirs = match cgroup_path::kube_qos_dirs(root, self.framework.cgroups().driver()) {
            Ok(dirs) => dirs,
            Err(e) => {
                failures.insert(format!("kubepods QoS dirs: {e}"));
                return;
            }
        };
        let rules = self.framework.rules().current();
        let mut writes = Vec::new();
        for (qos, dir) in dirs {
            for plugin in self.framework.plugins() {
                for value in plugin.kube_qos(qos, &rules) {
                    writes.push((
                        format!("kubepods QoS dir {dir}"),
                        dir.clone(),
                        Owned { plugin: plugin.name(), value },
                    ));
                }
            }
        }
        self.write(writes, report, failures);
    }

    /// The NodeSLO's host applications: each plugin's [`crate::plugin::Plugin::host_app`] values
    /// written to the application's directory. A `Kubepods*` base is below `--kubepods-cgroup`
    /// (kubelet's default `kubepods` / `kubepods.slice` by the driver when not given). A
    /// directory that does not exist (the application is not running) is skipped.
    fn host_app_dirs(&self, report: &mut Report, failures: &mut HashSet<String>) {
        let rules = self.framework.rules().current();
        if rules.host_applications.is_empty() {
            return;
        }
        let driver = self.framework.cgroups().driver();
        let kubepods = self.kubepods.clone().unwrap_or_else(|| match driver {
            Some(CgroupDriver::Systemd) => "kubepods.slice".to_owned(),
            _ => "/kubepods".to_owned(),
        });
        let qos_dirs = cgroup_path::kube_qos_dirs(&kubepods, driver);
        let mut writes = Vec::new();
        for app in &rules.host_applications {
            let target = format!("host application {}", app.name);
            let base = match (app.base, &qos_dirs) {
                (HostAppBase::CgroupRoot, _) => String::new(),
                (_, Err(e)) => {
                    failures.insert(format!("{target}: kubepods QoS dirs: {e}"));
                    continue;
                }
                (HostAppBase::Kubepods, Ok(d)) => d[0].1.clone(),
                (HostAppBase::KubepodsBurstable, Ok(d)) => d[1].1.clone(),
                (HostAppBase::KubepodsBesteffort, Ok(d)) => d[2].1.clone(),
            };
            let dir = format!("{}/{}", base.trim_end_matches('/'), app.path);
            for plugin in self.framework.plugins() {
                match plugin.host_app(app, &rules) {
                    Ok(values) => writes.extend(
                        values
                            .into_iter()
                            .map(|value| (target.clone(), dir.clone(), Owned { plugin: plugin.name(), value })),
                    ),
                    Err(e) => {
                        failures.insert(format!("{target}: plugin {}: {e:#}", plugin.name()));
                    }
                }
            }
        }
        self.write(writes, report, failures);
    }

    /// The pod's cgroup parent, from the cache or `PodSandboxStatus` (verbose).
    async fn pod_parent(&mut self, id: &str) -> Option<String> {
        if let Some(p) = self.parents.get(id) {
            return Some(p.clone());
        }
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: id.into(), verbose: true };
        let status: StatusInfo = self.call(POD_SANDBOX_STATUS, request).await.ok()?;
        let info = status.verbose();
        let parent = info.as_ref().and_then(VerboseInfo::sandbox_cgroup_parent);
        match &parent {
            Some(p) => {
                self.parents.insert(id.to_owned(), p.clone());
                self.sandbox_paths.insert(id.to_owned(), info.as_ref().and_then(VerboseInfo::container_cgroup_dir));
            }
            None => tracing::debug!(sandbox = id, "the runtime reports no cgroup parent; pod skipped"),
        }
        parent
    }

    /// While the node's `cpu.weight` formula is still to be learned ([`crate::cpu_weight`]), looks
    /// up every listed container's directory first ([`Reconciler::container_dir`] learns from each
    /// one it sees for the first time), so that no value of this pass is written in the wrong
    /// formula. The lookups are cached: the pass makes no more runtime calls for it.
    async fn learn_weight_formula(&mut self, sandboxes: &[ListedPod], by_pod: &HashMap<&str, Vec<&ListedContainer>>) {
        for sandbox in sandboxes {
            if !self.framework.cgroups().weight().learning() {
                return;
            }
            let Some(parent) = self.pod_parent(&sandbox.id).await else { continue };
            let pod_dir = self.framework.cgroups().resolve(&parent).ok().flatten();
            for c in by_pod.get(sandbox.id.as_str()).into_iter().flatten() {
                let _ = self.container_dir(&c.id, pod_dir.as_deref()).await;
            }
        }
    }

    /// The container's cgroup directory, from the cache or `ContainerStatus` (verbose): its
    /// `cgroupsPath` resolved with the pod's directory `pod_dir` and the driver
    /// ([`cgroup_path::container_dir`]); when the runtime reports none, or the status call fails,
    /// [`cgroup_path::default_container_dir`] below `pod_dir`. `Ok(None)`: nothing to go by (no
    /// path and no pod directory), skipped this pass.
    ///
    /// A failed status call is logged once per container (WARN, until a call succeeds again).
    /// An answer above [`MAX_ANSWER_BYTES`] (`RESOURCE_EXHAUSTED`, ours or containerd's own
    /// 16 MiB send limit: a container of some 300 k envs, which the verbose info holds twice)
    /// will never fit: the default directory is then kept, not asked for again; other failures
    /// are asked again next pass.
    ///
    /// Errors: the reported path cannot be resolved (see [`cgroup_path::resolve`]).
    async fn container_dir(&mut self, id: &str, pod_dir: Option<&str>) -> Result<Option<String>, String> {
        if let Some(d) = self.dirs.get(id) {
            return Ok(Some(d.clone()));
        }
        let driver = self.framework.cgroups().driver();
        let request = cri::ContainerStatusRequest { container_id: id.into(), verbose: true };
        let (info, lasting) = match self.call::<_, StatusInfo>(CONTAINER_STATUS, request).await {
            Ok(status) => {
                self.status_failed.remove(id);
                (status.verbose(), true)
            }
            Err(s) => {
                if self.status_failed.insert(id.to_owned()) {
                    tracing::warn!(
                        container = id,
                        code = ?s.code(),
                        "ContainerStatus failed: {}; the container's cgroup is taken as the runtime's default below its pod's \
                         (logged once per container)",
                        s.message()
                    );
                }
                (None, s.code() == tonic::Code::ResourceExhausted)
            }
        };
        let dir = match info.as_ref().and_then(VerboseInfo::container_cgroup_dir) {
            Some(path) => {
                cgroup_path::container_dir(&path, pod_dir, driver).map_err(|e| format!("refusing {path:?}: {e}"))?
            }
            None => match pod_dir {
                Some(pod_dir) => cgroup_path::default_container_dir(pod_dir, id, driver),
                None => {
                    tracing::debug!(
                        container = id,
                        "the runtime reports no cgroup and the pod has no directory of its own; skipped"
                    );
                    return Ok(None);
                }
            },
        };
        // First sight, before this process wrote anything to it: what runc made of the
        // container's shares tells the node's cpu.weight formula (crate::cpu_weight).
        if let Some(shares) = info.as_ref().and_then(VerboseInfo::container_cpu_shares) {
            self.framework.cgroups().learn_weight_formula(&dir, shares);
        }
        if lasting {
            self.dirs.insert(id.to_owned(), dir.clone());
        }
        Ok(Some(dir))
    }

    /// Runs passes until `shutdown`: one at once, then every `interval` (none: only on rule
    /// changes) and whenever `rules_changed` sees a change.
    pub async fn run(
        mut self,
        interval: Option<Duration>,
        mut rules_changed: watch::Receiver<u64>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut last_error: Option<String> = None;
        let mut reason = "start";
        loop {
            let outcome = self.reconcile().await;
            {
                let mut last = self.last_pass.lock().unwrap_or_else(|e| e.into_inner());
                let (passes, at) = (last.passes + 1, Some(std::time::SystemTime::now()));
                *last = match &outcome {
                    Ok(r) => LastPass {
                        passes,
                        at,
                        reason,
                        pods: r.pods,
                        containers: r.containers,
                        corrected: r.corrected.len(),
                        failures: r.failures.len(),
                        error: None,
                    },
                    Err(e) => LastPass { passes, at, reason, error: Some(format!("{e:#}")), ..Default::default() },
                };
            }
            match outcome {
                Ok(report) => {
                    if last_error.take().is_some() {
                        tracing::info!(endpoint = %self.endpoint.display(), "runtime reachable again");
                    }
                    let n = report.corrected.len();
                    if n > 0 || reason != "interval" {
                        tracing::info!(
                            reason,
                            pods = report.pods,
                            containers = report.containers,
                            corrected = n,
                            "reconciled"
                        );
                    } else {
                        tracing::debug!(
                            reason,
                            pods = report.pods,
                            containers = report.containers,
                            corrected = n,
                            "reconciled"
                        );
                    }
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    if last_error.as_deref() != Some(msg.as_str()) {
                        tracing::warn!("reconcile: {msg}");
                        last_error = Some(msg);
                    }
                }
            }
            let tick = async {
                match interval {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick => reason = "interval",
                changed = rules_changed.changed() => {
                    if changed.is_err() {
                        // The rules store is gone: only the interval is left.
                        rules_changed = watch::channel(0).1;
                    }
                    reason = "rules changed";
                }
                _ = &mut shutdown => return,
            }
        }
    }
}

/// Asks the CRI runtime at `endpoint` for its cgroup driver: CRI v1 `RuntimeConfig`
/// (`linux.cgroup_driver`: SYSTEMD = 0, CGROUPFS = 1), waiting at most `timeout`. containerd
/// implements it from 2.0, CRI-O from 1.28; containerd 1.6 and 1.7 answer UNIMPLEMENTED.
///
/// Errors (a message for the start-up line): no answer in time, UNIMPLEMENTED or another status,
/// an answer without a `linux` section ([`driver_of`]).
pub async fn runtime_cgroup_driver(endpoint: &Path, timeout: Duration) -> Result<CgroupDriver, String> {
    let mut client = RuntimeServiceClient::new(hook_api::connect(endpoint));
    match tokio::time::timeout(timeout, client.runtime_config(cri::RuntimeConfigRequest {})).await {
        Err(_) => Err(format!("no answer from {} within {timeout:?}", endpoint.display())),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
            Err(format!("{} does not implement it", endpoint.display()))
        }
        Ok(Err(s)) => Err(format!("{}: {}: {}", endpoint.display(), s.code(), s.message())),
        Ok(Ok(resp)) => driver_of(&resp.into_inner()).ok_or_else(|| "the answer has no linux section".to_owned()),
    }
}

/// The driver in a `RuntimeConfig` answer: `linux.cgroup_driver` (proto3: an unset field is 0,
/// SYSTEMD, as CRI defines it); `None` without a `linux` section or for an unknown value.
pub fn driver_of(resp: &cri::RuntimeConfigResponse) -> Option<CgroupDriver> {
    match cri::CgroupDriver::try_from(resp.linux.as_ref()?.cgroup_driver).ok()? {
        cri::CgroupDriver::Systemd => Some(CgroupDriver::Systemd),
        cri::CgroupDriver::Cgroupfs => Some(CgroupDriver::Cgroupfs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_from_runtime_config() {
        let answer = |d: Option<i32>| cri::RuntimeConfigResponse {
            linux: d.map(|cgroup_driver| cri::LinuxRuntimeConfiguration { cgroup_driver }),
        };
        assert_eq!(driver_of(&answer(Some(cri::CgroupDriver::Systemd as i32))), Some(CgroupDriver::Systemd));
        assert_eq!(driver_of(&answer(Some(cri::CgroupDriver::Cgroupfs as i32))), Some(CgroupDriver::Cgroupfs));
        assert_eq!(driver_of(&answer(Some(7))), None);
        assert_eq!(driver_of(&answer(None)), None);
    }

    /// `RuntimeConfig` against a fake runtime: each answer, UNIMPLEMENTED (containerd 1.6/1.7),
    /// a runtime that never answers, no runtime at all.
    #[tokio::test]
    async fn driver_detection_over_cri() {
        use prost::Message;
        use test_support::fake_backend::{Behaviour, FakeBackend};
        let timeout = Duration::from_millis(300);
        for (driver, want) in
            [(cri::CgroupDriver::Cgroupfs, CgroupDriver::Cgroupfs), (cri::CgroupDriver::Systemd, CgroupDriver::Systemd)]
        {
            let body = cri::RuntimeConfigResponse {
                linux: Some(cri::LinuxRuntimeConfiguration { cgroup_driver: driver as i32 }),
            }
            .encode_to_vec();
            let fake = FakeBackend::start(Behaviour::ok(&body)).await;
            assert_eq!(runtime_cgroup_driver(fake.socket(), timeout).await, Ok(want));
            assert_eq!(fake.calls_to("/runtime.v1.RuntimeService/RuntimeConfig").len(), 1);
        }
        let unimplemented = Behaviour::Reply {
            headers: vec![],
            body: Default::default(),
            trailers: vec![
                ("grpc-status".into(), "12".into()),
                ("grpc-message".into(), "unknown method RuntimeConfig".into()),
            ],
            delay: Duration::ZERO,
        };
        let fake = FakeBackend::start(unimplemented).await;
        let e = runtime_cgroup_driver(fake.socket(), timeout).await.unwrap_err();
        assert!(e.contains("does not implement it"), "{e}");
        let fake = FakeBackend::start(Behaviour::Hang).await;
        let e = runtime_cgroup_driver(fake.socket(), timeout).await.unwrap_err();
        assert!(e.contains("no answer"), "{e}");
        let e = runtime_cgroup_driver(Path::new("/nonexistent/runtime.sock"), timeout).await.unwrap_err();
        assert!(e.contains("/nonexistent/runtime.sock"), "{e}");
    }
}
