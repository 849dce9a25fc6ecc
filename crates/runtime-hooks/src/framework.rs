//! The framework: runs a stage's plugins in order, merges their changes, applies the plugin
//! failure policy, and turns the result into a koordlet-style hook answer.
//!
//! # Order
//!
//! Plugins run in the order they were given to [`Framework::new`] (the binary uses
//! GroupIdentity, BatchResource, CPUSet); each sees the unchanged request, and where two set the
//! same field the later one wins ([`Change::merge`]).
//!
//! # Answers
//!
//! Like koordlet's `proxyserver/service.go`, every answer starts as the request echoed
//! ([`hook_api::merge::echo_pod`], [`hook_api::merge::echo_container`]) and the merged change
//! overrides the fields it sets, so runtime-proxy's merge rules ("the answer wins") leave
//! everything else as kubelet sent it. The request is what the caller decoded: the gRPC server
//! decodes only the labels and annotations plugins read and no container annotations or envs
//! ([`crate::proxy::hook_decode`]), so its answers echo only those (both proxies merge these maps per
//! key: what is not echoed stays), and it adds the request's envs itself when a plugin sets one
//! ([`crate::proxy::hook_wire::ContainerAnswer`]). A change's devices and mounts ([`Change::devices`],
//! [`Change::mounts`]) have no field in the answer: they are logged once per call as "not
//! expressible in proxy mode" and not applied (the envs of the same change are).
//!
//! # Pod-level cgroup values
//!
//! Pod-level cgroup values ([`Change::pod_cgroup`]) are written to the pod's cgroup directory
//! before answering, synchronously, as koordlet does.
//!
//! They also go into a pod-level answer's `resources`, as koordlet v1.8.0 fills them
//! (`protocol/pod_context.go` `PodResponse.ProxyDone`): `cpu_shares`, `cpu_quota`,
//! `memory_limit_in_bytes` and `cpuset_cpus` from the pod values of those kinds (BatchResource's
//! pod sums, CPUSet's −1 quota of a CPU-bound pod), over the echoed request's `resources` (an
//! empty message when the request had none); not the CFS period, which koordlet never answers.
//! Nothing when no plugin set one of them. runtime-proxy applies them to the pod sandbox's
//! (pause) container in Docker mode and nowhere in CRI mode, as koord-runtime-proxy does.
//!
//! # Failures
//!
//! Failures ([`PluginFailure`]) name the plugin, the stage and the pod or container. Under
//! [`FailurePolicy::Fail`] the first one ends the call with an `INTERNAL` status (runtime-proxy
//! then applies the registration's own failure policy); under `Ignore` it is logged at warn, the
//! plugin's change is dropped and the next plugin runs. A cgroup write that fails counts as a
//! failure of the plugin that asked for the value, and so does a pod cgroup parent that cannot be
//! resolved ([`CgroupFs::resolve`]: `..`, a relative name that is not a systemd name, a systemd
//! name under the cgroupfs driver).
//!
//! Never failures: a write the kernel does not support (skipped, logged once); an empty cgroup
//! parent, the runtime's default cgroup, valid in CRI (nothing written at pod level, a debug line);
//! a pod cgroup directory that does not exist yet (kubelet creates it before RunPodSandbox; other
//! clients leave it to runc) — that is logged at warn.

use std::fmt;
use std::sync::Arc;

use hook_api::status::{Code, Status};
use hook_api::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse,
};

use crate::cgroup::{CgroupError, CgroupFs, CgroupValue, Written};
use crate::change::Change;
use crate::context::{ContainerContext, PodContext};
use crate::host::Host;
use crate::plugin::{FailurePolicy, NodePods, Plugin, PodState, Stage};
use crate::rules::{Rules, RulesStore};

/// A plugin that failed for one pod or container.
#[derive(Debug)]
pub struct PluginFailure {
    /// The plugin's name.
    pub plugin: &'static str,
    /// The stage (for the reconciler: the stage whose answer it computes).
    pub stage: Stage,
    /// `namespace/pod` or `namespace/pod/container`.
    pub target: String,
    /// What went wrong.
    pub error: anyhow::Error,
}

impl fmt::Display for PluginFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "plugin {} failed at {} for {}: {:#}", self.plugin, self.stage, self.target, self.error)
    }
}

/// A cgroup value and the plugin that asked for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owned {
    /// The plugin's name.
    pub plugin: &'static str,
    /// The value.
    pub value: CgroupValue,
}

/// The merged result of one stage's plugins.
#[derive(Debug, Default)]
pub struct Outcome {
    /// All plugins' changes merged in order.
    pub change: Change,
    /// Pod-level cgroup values (one per kind, the last plugin's), with their plugin.
    pub pod_values: Vec<Owned>,
    /// Container-level cgroup values from the merged resources, with their plugin.
    pub container_values: Vec<Owned>,
    /// Failures ignored under [`FailurePolicy::Ignore`] (already logged).
    pub failures: Vec<PluginFailure>,
}

impl Outcome {
    fn add(&mut self, plugin: &'static str, change: Change) {
        for v in &change.pod_cgroup {
            set_owned(&mut self.pod_values, plugin, v);
        }
        for v in change.container_values() {
            set_owned(&mut self.container_values, plugin, &v);
        }
        self.change.merge(&change);
    }
}

fn set_owned(list: &mut Vec<Owned>, plugin: &'static str, v: &CgroupValue) {
    list.retain(|o| o.value.kind() != v.kind());
    list.push(Owned { plugin, value: v.clone() });
}

/// One cgroup write of a batch, and how it went.
#[derive(Debug)]
pub struct WriteResult {
    /// The cgroup directory (kubelet's form).
    pub dir: String,
    /// The value and its plugin.
    pub owned: Owned,
    /// The outcome.
    pub result: Result<Written, CgroupError>,
}

/// Applies `(dir, value)` pairs in order. Writes the kernel refuses with EINVAL are retried
/// after the others, up to three passes: cgroup v1 refuses a child CFS quota above its parent's,
/// so lowering a pod's limits must go container-first and raising them pod-first; retrying
/// covers both without knowing which.
pub fn apply_all(cgroups: &CgroupFs, writes: Vec<(String, Owned)>) -> Vec<WriteResult> {
    let mut done = Vec::new();
    let mut pending = writes;
    for pass in 0..3 {
        let mut retry = Vec::new();
        for (dir, owned) in pending {
            let result = cgroups.apply(&dir, &owned.value);
            match result {
                Err(e) if e.is_invalid_argument() && pass < 2 => retry.push((dir, owned)),
                result => done.push(WriteResult { dir, owned, result }),
            }
        }
        if retry.is_empty() {
            break;
        }
        pending = retry;
    }
    done
}

/// The plugins, their failure policy, the rules and the cgroup file system.
pub struct Framework {
    plugins: Vec<Arc<dyn Plugin>>,
    policy: FailurePolicy,
    rules: Arc<RulesStore>,
    cgroups: Arc<CgroupFs>,
    host: Arc<Host>,
}

impl fmt::Debug for Framework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Framework")
            .field("plugins", &self.plugins.iter().map(|p| p.name()).collect::<Vec<_>>())
            .field("policy", &self.policy)
            .field("cgroups", &self.cgroups)
            .field("host", &self.host)
            .finish()
    }
}

impl Framework {
    /// A framework running `plugins` in this order.
    pub fn new(
        plugins: Vec<Arc<dyn Plugin>>,
        policy: FailurePolicy,
        rules: Arc<RulesStore>,
        cgroups: Arc<CgroupFs>,
    ) -> Framework {
        Framework { plugins, policy, rules, cgroups, host: Arc::new(Host::default()) }
    }

    /// The same framework acting on `host`'s kernel facilities in node-level work (default: a
    /// [`Host`] with none).
    pub fn with_host(mut self, host: Arc<Host>) -> Framework {
        self.host = host;
        self
    }

    /// The node's kernel facilities.
    pub fn host(&self) -> &Arc<Host> {
        &self.host
    }

    /// Every plugin's node-level work ([`Plugin::node`]) over `pods`, in plugin order. A
    /// failing plugin does not stop the others (node-level work never fails a pod).
    ///
    /// Returns the failures, with [`Stage`] the reconciler's (PreRunPodSandbox) and target
    /// `node`; the caller logs them.
    pub fn node_pass(&self, pods: &NodePods<'_>) -> Vec<PluginFailure> {
        let rules = self.rules.current();
        let mut failures = Vec::new();
        for plugin in &self.plugins {
            if let Err(error) = plugin.node(pods, &rules, &self.host) {
                failures.push(PluginFailure {
                    plugin: plugin.name(),
                    stage: Stage::PreRunPodSandbox,
                    target: "node".into(),
                    error,
                });
            }
        }
        failures
    }

    /// Every plugin's pod-removal work ([`Plugin::pod_removed`], koordlet's
    /// PreRemoveRunPodSandbox) for `pod`, in plugin order; a failing plugin does not stop the
    /// others.
    ///
    /// Returns the failures (stage PostStopPodSandbox, the nearest [`Stage`]); the caller logs them.
    pub fn pod_removed(&self, pod: &PodState) -> Vec<PluginFailure> {
        // The pod's slice goes with it: what was sent to systemd for it is forgotten.
        self.cgroups.forget_unit(&pod.pod.cgroup_parent);
        let rules = self.rules.current();
        let mut failures = Vec::new();
        for plugin in &self.plugins {
            if let Err(error) = plugin.pod_removed(pod, &rules, &self.host) {
                failures.push(PluginFailure {
                    plugin: plugin.name(),
                    stage: Stage::PostStopPodSandbox,
                    target: pod.pod.key(),
                    error,
                });
            }
        }
        failures
    }

    /// The plugins, in order.
    pub fn plugins(&self) -> &[Arc<dyn Plugin>] {
        &self.plugins
    }

    /// The stages at least one plugin wants, in [`Stage::ALL`] order: what the server registers.
    pub fn stages(&self) -> Vec<Stage> {
        Stage::ALL.into_iter().filter(|s| self.plugins.iter().any(|p| p.stages().contains(s))).collect()
    }

    /// The rules store.
    pub fn rules(&self) -> &Arc<RulesStore> {
        &self.rules
    }

    /// The cgroup file system.
    pub fn cgroups(&self) -> &Arc<CgroupFs> {
        &self.cgroups
    }

    /// The plugin failure policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// `target` names the pod or container in a failure (built only when one fails).
    fn run(
        &self,
        stage: Stage,
        target: impl Fn() -> String,
        call: impl Fn(&dyn Plugin, &Rules) -> anyhow::Result<Change>,
    ) -> Result<Outcome, PluginFailure> {
        let rules = self.rules.current();
        let mut outcome = Outcome::default();
        for plugin in self.plugins.iter().filter(|p| p.stages().contains(&stage)) {
            match call(plugin.as_ref(), &rules) {
                Ok(change) => outcome.add(plugin.name(), change),
                Err(error) => {
                    let failure = PluginFailure { plugin: plugin.name(), stage, target: target(), error };
                    self.fail_or_keep(failure, &mut outcome.failures)?;
                }
            }
        }
        Ok(outcome)
    }

    /// Under `Fail` returns the failure; under `Ignore` keeps it in `ignored` (the caller logs).
    fn fail_or_keep(&self, failure: PluginFailure, ignored: &mut Vec<PluginFailure>) -> Result<(), PluginFailure> {
        match self.policy {
            FailurePolicy::Fail => Err(failure),
            FailurePolicy::Ignore => {
                ignored.push(failure);
                Ok(())
            }
        }
    }

    /// Runs the plugins that want `stage` (a pod-level stage) for `pod`. Computes only; ignored
    /// failures are in [`Outcome::failures`], not logged.
    ///
    /// Errors: the first plugin failure under [`FailurePolicy::Fail`].
    pub fn run_pod(&self, stage: Stage, pod: &PodContext) -> Result<Outcome, PluginFailure> {
        self.run(stage, || pod.key(), |p, rules| p.pod(stage, pod, rules))
    }

    /// Runs the plugins that want `stage` (a container-level stage) for `container`. Computes
    /// only; ignored failures are in [`Outcome::failures`], not logged.
    ///
    /// Errors: the first plugin failure under [`FailurePolicy::Fail`].
    pub fn run_container(&self, stage: Stage, container: &ContainerContext) -> Result<Outcome, PluginFailure> {
        self.run(stage, || container.key(), |p, rules| p.container(stage, container, rules))
    }

    /// Writes an outcome's pod-level values to the pod's cgroup (proxy mode), its parent resolved
    /// with the cgroup driver. A failed write, or a parent that cannot be resolved, is the owning
    /// plugin's failure; an empty parent (the runtime's default) is skipped.
    fn write_pod_values(&self, stage: Stage, pod: &PodContext, outcome: &mut Outcome) -> Result<(), PluginFailure> {
        if outcome.pod_values.is_empty() {
            return Ok(());
        }
        let dir = match self.cgroups.resolve(&pod.cgroup_parent) {
            Ok(Some(dir)) => dir,
            Ok(None) => {
                tracing::debug!(
                    pod = %pod.key(),
                    parent = %pod.cgroup_parent,
                    "no pod cgroup of its own (empty parent: the runtime's default cgroup); pod-level values not written"
                );
                return Ok(());
            }
            Err(e) => {
                // One failure per plugin that wanted a pod-level value.
                let mut plugins: Vec<&'static str> = Vec::new();
                for o in &outcome.pod_values {
                    if !plugins.contains(&o.plugin) {
                        plugins.push(o.plugin);
                    }
                }
                for plugin in plugins {
                    let error = anyhow::anyhow!("pod cgroup: {e}");
                    self.fail_or_keep(
                        PluginFailure { plugin, stage, target: pod.key(), error },
                        &mut outcome.failures,
                    )?;
                }
                return Ok(());
            }
        };
        let writes = outcome.pod_values.iter().map(|o| (dir.clone(), o.clone())).collect();
        for w in apply_all(&self.cgroups, writes) {
            match w.result {
                Ok(Written::Corrected(drift)) => {
                    tracing::info!(plugin = w.owned.plugin, pod = %pod.key(), "pod cgroup set: {drift}")
                }
                Ok(Written::Unchanged | Written::Unsupported) => {}
                Err(CgroupError::NoOwnDir(_)) => {}
                // kubelet creates the pod cgroup before RunPodSandbox; a client that does not
                // (crictl, tests) leaves it to runc. Not the plugin's fault: say so and go on.
                Err(CgroupError::NoDir(dir)) => tracing::warn!(
                    plugin = w.owned.plugin,
                    pod = %pod.key(),
                    "pod cgroup {} does not exist yet (kubelet creates it before RunPodSandbox); {} not written here (the reconciler writes it once the pod runs, if it is enabled)",
                    dir.display(),
                    w.owned.value
                ),
                Err(e) => {
                    let error = anyhow::anyhow!("setting pod cgroup {}: {e}", w.owned.value);
                    self.fail_or_keep(
                        PluginFailure { plugin: w.owned.plugin, stage, target: pod.key(), error },
                        &mut outcome.failures,
                    )?;
                }
            }
        }
        Ok(())
    }

    /// A pod event in any mode that sees pods as they are created (proxy: PreRunPodSandbox; NRI:
    /// RunPodSandbox): runs the stage's plugins and writes their pod-level values. Ignored
    /// failures are logged here; the caller turns the rest of the change into its answer.
    ///
    /// Errors: the first plugin failure under [`FailurePolicy::Fail`] (not logged).
    pub fn pod_stage(&self, stage: Stage, pod: &PodContext) -> Result<Outcome, PluginFailure> {
        let mut outcome = self.run_pod(stage, pod)?;
        self.write_pod_values(stage, pod, &mut outcome)?;
        log_ignored(&outcome);
        Ok(outcome)
    }

    /// A container event (proxy: PreCreateContainer, PreUpdateContainerResources; NRI:
    /// CreateContainer, UpdateContainer): runs the stage's plugins and writes pod-level values if
    /// any plugin asks for them here. Ignored failures are logged here.
    ///
    /// Errors: the first plugin failure under [`FailurePolicy::Fail`] (not logged).
    pub fn container_stage(&self, stage: Stage, container: &ContainerContext) -> Result<Outcome, PluginFailure> {
        let mut outcome = self.run_container(stage, container)?;
        self.write_pod_values(stage, &container.pod, &mut outcome)?;
        log_ignored(&outcome);
        Ok(outcome)
    }

    /// Answers a pod-level hook call: echo the request, override with the plugins' change,
    /// write pod-level cgroup values.
    ///
    /// Errors: a plugin failure under [`FailurePolicy::Fail`], as `INTERNAL`.
    pub fn pod_hook(&self, stage: Stage, req: &PodSandboxHookRequest) -> Result<PodSandboxHookResponse, Status> {
        self.pod_hook_owned(stage, req.clone())
    }

    /// [`Framework::pod_hook`] taking the request: its maps move into the plugins' context and
    /// from there into the echo, never copied (the servers' path).
    ///
    /// Errors: as [`Framework::pod_hook`].
    pub fn pod_hook_owned(
        &self,
        stage: Stage,
        mut req: PodSandboxHookRequest,
    ) -> Result<PodSandboxHookResponse, Status> {
        let resources = req.resources.take();
        let pod = PodContext::from(req);
        let outcome = self.pod_stage(stage, &pod).map_err(|f| failure_status(&f))?;
        let key = pod.key();
        // The echo (hook_api::merge::echo_pod of the request), of the moved parts.
        let mut resp = PodSandboxHookResponse {
            labels: pod.labels,
            annotations: pod.annotations,
            cgroup_parent: pod.cgroup_parent,
            resources,
        };
        let change = &outcome.change;
        if let Some(parent) = &change.cgroup_parent {
            resp.cgroup_parent.clone_from(parent);
        }
        resp.annotations.extend(change.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        if !change.resources.is_empty() {
            change.resources.apply_to(resp.resources.get_or_insert_with(Default::default));
        }
        answer_pod_values(&outcome.pod_values, &mut resp.resources);
        if prost::Message::encoded_len(&resp) > ECHO_LIMIT_BYTES {
            // Labels and annotations are merged per key by both proxies: what is left out stays.
            resp.labels.clear();
            resp.annotations = change.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        log_call(stage, &key, change);
        log_inexpressible(stage, &key, change);
        Ok(resp)
    }

    /// Answers a container-level hook call: echo the request, override with the plugins'
    /// change (pod-level values, if any plugin asks for them here, are written too).
    ///
    /// Errors: a plugin failure under [`FailurePolicy::Fail`], as `INTERNAL`.
    pub fn container_hook(
        &self,
        stage: Stage,
        req: &ContainerResourceHookRequest,
    ) -> Result<ContainerResourceHookResponse, Status> {
        self.container_hook_owned(stage, req.clone())
    }

    /// [`Framework::container_hook`] taking the request: its maps move into the plugins'
    /// context and from there into the echo, never copied (the servers' path).
    ///
    /// Errors: as [`Framework::container_hook`].
    pub fn container_hook_owned(
        &self,
        stage: Stage,
        req: ContainerResourceHookRequest,
    ) -> Result<ContainerResourceHookResponse, Status> {
        let container = ContainerContext::from(req);
        let outcome = self.container_stage(stage, &container).map_err(|f| failure_status(&f))?;
        let key = container.key();
        // The echo (hook_api::merge::echo_container of the request), of the moved parts.
        let mut resp = ContainerResourceHookResponse {
            container_annotations: container.annotations,
            container_resources: container.resources,
            pod_cgroup_parent: container.pod.cgroup_parent,
            container_envs: container.envs,
        };
        let change = &outcome.change;
        if let Some(parent) = &change.cgroup_parent {
            resp.pod_cgroup_parent.clone_from(parent);
        }
        resp.container_annotations.extend(change.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        resp.container_envs.extend(change.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        if !change.resources.is_empty() {
            change.resources.apply_to(resp.container_resources.get_or_insert_with(Default::default));
        }
        if prost::Message::encoded_len(&resp) > ECHO_LIMIT_BYTES {
            // Annotations are merged per key by both proxies, so unchanged ones can be left out;
            // envs only when no plugin changed one (koord-runtime-proxy replaces the whole env
            // map with a non-empty answer's, and takes an empty one as "no change").
            resp.container_annotations = change.annotations.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            if change.envs.is_empty() {
                resp.container_envs.clear();
            }
        }
        log_call(stage, &key, change);
        log_inexpressible(stage, &key, change);
        Ok(resp)
    }
}

/// Puts the pod-level values koordlet answers into a pod answer's `resources` (see the module
/// documentation, "Pod-level cgroup values"; koordlet v1.8.0 `protocol/pod_context.go`
/// `PodResponse.ProxyDone`: CPU shares, CFS quota, memory limit, cpuset; the message is made
/// when one is set and the request had none).
fn answer_pod_values(values: &[Owned], resources: &mut Option<hook_api::v1alpha1::LinuxContainerResources>) {
    for o in values {
        match &o.value {
            CgroupValue::CpuShares(v) => resources.get_or_insert_with(Default::default).cpu_shares = *v,
            CgroupValue::CfsQuota(v) => resources.get_or_insert_with(Default::default).cpu_quota = *v,
            CgroupValue::MemoryLimit(v) => resources.get_or_insert_with(Default::default).memory_limit_in_bytes = *v,
            CgroupValue::CpusetCpus(v) => resources.get_or_insert_with(Default::default).cpuset_cpus.clone_from(v),
            _ => {}
        }
    }
}

/// Above this size (bytes) an answer leaves out the echo of unchanged labels, annotations (and
/// envs, when no plugin changed one): 4 MiB, the answer limit of koord-runtime-proxy (grpc-go's
/// default receive size) and of runtime-proxy with `--max-hook-answer-bytes` that low (its
/// default is 16 MiB), which would otherwise refuse the answer of a container with a large
/// request (kubelet's preStop handler annotation) and apply their failure policy. Both proxies
/// merge these maps per key, so what is left out stays as the request had it.
pub const ECHO_LIMIT_BYTES: usize = 4 << 20;

/// A plugin failure under `--plugin-failure-policy Fail` as the status both proxy mode (through
/// tonic) and NRI mode (as ttrpc's `Status`) answer with: `INTERNAL`, naming the plugin, the
/// stage, the pod or container and the cause; logged once as a WARN.
pub(crate) fn failure_status(f: &PluginFailure) -> Status {
    tracing::warn!(plugin = f.plugin, stage = %f.stage, on = %f.target, "{f} (plugin-failure-policy Fail)");
    Status::new(Code::INTERNAL, format!("runtime-hooks: {f} (plugin-failure-policy Fail)"))
}

fn log_ignored(outcome: &Outcome) {
    for f in &outcome.failures {
        tracing::warn!(plugin = f.plugin, stage = %f.stage, on = %f.target, "{f} (plugin-failure-policy Ignore)");
    }
}

/// Proxy mode: the devices and mounts of a change, which the runtime.v1alpha1 answer has no
/// field for, in one info line per call (never dropped silently). NRI mode applies them.
fn log_inexpressible(stage: Stage, target: &str, change: &Change) {
    if let Some(what) = change.proxy_inexpressible() {
        tracing::info!(%stage, on = target, "not expressible in proxy mode (the runtime.v1alpha1 answer has no devices or mounts; NRI mode applies them), not applied: {what}");
    }
}

/// Logs what a hook call changed, or that it changed nothing, at debug: koordlet logs its hooks'
/// results only at verbosity 4–5, and at info a node starting pods would pay a log line (and the
/// log writer thread's wake-up) per hook call — about as much CPU as the rest of the call
/// (docs/benchmarks.md).
pub(crate) fn log_call(stage: Stage, target: &str, change: &Change) {
    if change.is_empty() {
        tracing::debug!(%stage, on = target, "no change");
    } else {
        tracing::debug!(%stage, on = target, "{change}");
    }
}

#[cfg(test)]
#[path = "framework_tests.rs"]
mod tests;
