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
use hook_api::v1alpha1::{ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse};

use crate::cgroup::{CgroupError, CgroupFs, CgroupValue, Written};
use crate::change::Change;
use crate::context::{ContainerContext, PodContext};
use crate::host::Host;
use crate::plugin::{FailurePolicy, Plugin, PodState, Stage};
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
    pub fn new(plugins: Vec<Arc<dyn Plugin>>, policy: FailurePolicy, rules: Arc<RulesStore>, cgroups: Arc<CgroupFs>) -> Framework {
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
    pub fn node_pass(&self, pods: &[PodState]) -> Vec<PluginFailure> {
        let rules = self.rules.current();
        let mut failures = Vec::new();
        for plugin in &self.plugins {
            if let Err(error) = plugin.node(pods, &rules, &self.host) {
                failures.push(PluginFailure { plugin: plugin.name(), stage: Stage::PreRunPodSandbox, target: "node".into(), error });
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
                failures.push(PluginFailure { plugin: plugin.name(), stage: Stage::PostStopPodSandbox, target: pod.pod.key(), error });
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
                    self.fail_or_keep(PluginFailure { plugin, stage, target: pod.key(), error }, &mut outcome.failures)?;
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
                    self.fail_or_keep(PluginFailure { plugin: w.owned.plugin, stage, target: pod.key(), error }, &mut outcome.failures)?;
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
    pub fn pod_hook_owned(&self, stage: Stage, mut req: PodSandboxHookRequest) -> Result<PodSandboxHookResponse, Status> {
        let resources = req.resources.take();
        let pod = PodContext::from(req);
        let outcome = self.pod_stage(stage, &pod).map_err(|f| failure_status(&f))?;
        let key = pod.key();
        // The echo (hook_api::merge::echo_pod of the request), of the moved parts.
        let mut resp =
            PodSandboxHookResponse { labels: pod.labels, annotations: pod.annotations, cgroup_parent: pod.cgroup_parent, resources };
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
    pub fn container_hook(&self, stage: Stage, req: &ContainerResourceHookRequest) -> Result<ContainerResourceHookResponse, Status> {
        self.container_hook_owned(stage, req.clone())
    }

    /// [`Framework::container_hook`] taking the request: its maps move into the plugins'
    /// context and from there into the echo, never copied (the servers' path).
    ///
    /// Errors: as [`Framework::container_hook`].
    pub fn container_hook_owned(&self, stage: Stage, req: ContainerResourceHookRequest) -> Result<ContainerResourceHookResponse, Status> {
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
mod tests {
    use super::*;
    use crate::cgroup::CgroupVersion;
    use crate::cgroup_path::CgroupDriver;
    use crate::change::Resources;
    use hook_api::merge::{echo_container, echo_pod};
    use hook_api::v1alpha1::{ContainerMetadata, LinuxContainerResources, PodSandboxMetadata};

    struct Fixed {
        name: &'static str,
        stages: &'static [Stage],
        change: Option<Change>,
    }

    impl Plugin for Fixed {
        fn name(&self) -> &'static str {
            self.name
        }
        fn stages(&self) -> &'static [Stage] {
            self.stages
        }
        fn pod(&self, _: Stage, _: &PodContext, _: &Rules) -> anyhow::Result<Change> {
            self.change.clone().ok_or_else(|| anyhow::anyhow!("{} broke", self.name))
        }
        fn container(&self, _: Stage, _: &ContainerContext, _: &Rules) -> anyhow::Result<Change> {
            self.change.clone().ok_or_else(|| anyhow::anyhow!("{} broke", self.name))
        }
    }

    fn framework(plugins: Vec<Fixed>, policy: FailurePolicy, root: &std::path::Path) -> Framework {
        let plugins = plugins.into_iter().map(|p| Arc::new(p) as Arc<dyn Plugin>).collect();
        Framework::new(plugins, policy, RulesStore::fixed(Rules::default()), Arc::new(CgroupFs::new(root, CgroupVersion::V2)))
    }

    fn shares(n: i64) -> Option<Change> {
        Some(Change { resources: Resources { cpu_shares: Some(n), ..Default::default() }, ..Default::default() })
    }

    fn container_req() -> ContainerResourceHookRequest {
        ContainerResourceHookRequest {
            pod_meta: Some(PodSandboxMetadata { name: "p".into(), namespace: "ns".into(), ..Default::default() }),
            container_meta: Some(ContainerMetadata { name: "c".into(), ..Default::default() }),
            container_resources: Some(LinuxContainerResources {
                cpu_shares: 2,
                cpu_period: 100_000,
                oom_score_adj: 1000,
                ..Default::default()
            }),
            container_envs: [("PATH".to_string(), "/bin".to_string())].into(),
            container_annotations: [("a".to_string(), "1".to_string())].into(),
            pod_cgroup_parent: "/kubepods/besteffort/pod1".into(),
            ..Default::default()
        }
    }

    /// Node-level work: every plugin runs, a failing one is reported and does not stop the rest.
    #[test]
    fn node_pass_runs_every_plugin_and_reports_failures() {
        struct Node(&'static str, bool, std::sync::Mutex<usize>);
        impl Plugin for Node {
            fn name(&self) -> &'static str {
                self.0
            }
            fn stages(&self) -> &'static [Stage] {
                &[]
            }
            fn node(&self, pods: &[PodState], _: &Rules, _: &Host) -> anyhow::Result<()> {
                *self.2.lock().unwrap() += pods.len();
                if self.1 {
                    Ok(())
                } else {
                    Err(anyhow::anyhow!("{} broke", self.0))
                }
            }
        }
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (Arc::new(Node("a", false, Default::default())), Arc::new(Node("b", true, Default::default())));
        let f = Framework::new(
            vec![a.clone(), b.clone()],
            FailurePolicy::Fail,
            RulesStore::fixed(Rules::default()),
            Arc::new(CgroupFs::new(t.path(), CgroupVersion::V2)),
        );
        let failures = f.node_pass(&[PodState::default(), PodState::default()]);
        assert_eq!(failures.len(), 1);
        assert_eq!((failures[0].plugin, failures[0].target.as_str()), ("a", "node"));
        assert_eq!((*a.2.lock().unwrap(), *b.2.lock().unwrap()), (2, 2), "both saw both pods");
    }

    #[test]
    fn stages_are_the_union_in_order() {
        let t = tempfile::tempdir().unwrap();
        let f = framework(
            vec![
                Fixed { name: "a", stages: &[Stage::PreUpdateContainerResources, Stage::PreCreateContainer], change: shares(3) },
                Fixed { name: "b", stages: &[Stage::PreRunPodSandbox, Stage::PreCreateContainer], change: shares(4) },
            ],
            FailurePolicy::Ignore,
            t.path(),
        );
        assert_eq!(f.stages(), vec![Stage::PreRunPodSandbox, Stage::PreCreateContainer, Stage::PreUpdateContainerResources]);
    }

    #[test]
    fn answer_is_the_echo_plus_changes_later_plugin_winning() {
        let t = tempfile::tempdir().unwrap();
        let mut envs = Change { envs: [("HOOKED".to_string(), "yes".to_string())].into(), ..shares(300).unwrap() };
        envs.annotations.insert("b".into(), "2".into());
        let f = framework(
            vec![
                Fixed { name: "first", stages: &[Stage::PreCreateContainer], change: Some(envs) },
                Fixed { name: "second", stages: &[Stage::PreCreateContainer], change: shares(512) },
                Fixed { name: "elsewhere", stages: &[Stage::PreStartContainer], change: shares(7) },
            ],
            FailurePolicy::Fail,
            t.path(),
        );
        let req = container_req();
        let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
        let r = resp.container_resources.unwrap();
        assert_eq!((r.cpu_shares, r.cpu_period, r.oom_score_adj), (512, 100_000, 1000), "later wins, the rest echoed");
        assert_eq!(resp.container_envs["PATH"], "/bin");
        assert_eq!(resp.container_envs["HOOKED"], "yes");
        assert_eq!(resp.container_annotations.len(), 2);
        assert_eq!(resp.pod_cgroup_parent, req.pod_cgroup_parent);
        // A stage no plugin wants: the pure echo.
        assert_eq!(f.container_hook(Stage::PostStopContainer, &req).unwrap(), echo_container(&req));
    }

    /// The answers built of the moved request are the echo of every field the answer has: a
    /// full request of each kind, at a stage no plugin wants.
    #[test]
    fn moved_requests_answer_the_whole_echo() {
        let t = tempfile::tempdir().unwrap();
        let f = framework(vec![], FailurePolicy::Fail, t.path());
        let res = LinuxContainerResources {
            cpu_shares: 2,
            cpuset_cpus: "0-1".into(),
            unified: [("a".into(), "b".into())].into(),
            ..Default::default()
        };
        let meta = PodSandboxMetadata { name: "p".into(), namespace: "ns".into(), uid: "u".into(), attempt: 1 };
        let map = |k: &str| -> std::collections::BTreeMap<String, String> { [(k.to_string(), "v".to_string())].into() };
        let req = ContainerResourceHookRequest {
            pod_meta: Some(meta.clone()),
            container_meta: Some(ContainerMetadata { name: "c".into(), attempt: 2, id: "id".into() }),
            container_annotations: map("ca"),
            container_resources: Some(res.clone()),
            pod_resources: Some(res.clone()),
            pod_annotations: map("pa"),
            pod_labels: map("pl"),
            pod_cgroup_parent: "/kubepods/pod1".into(),
            container_envs: map("E"),
        };
        assert_eq!(f.container_hook_owned(Stage::PreCreateContainer, req.clone()).unwrap(), echo_container(&req));
        let req = PodSandboxHookRequest {
            pod_meta: Some(meta),
            runtime_handler: "runc".into(),
            labels: map("l"),
            annotations: map("a"),
            cgroup_parent: "/kubepods/pod1".into(),
            overhead: Some(res.clone()),
            resources: Some(res),
        };
        assert_eq!(f.pod_hook_owned(Stage::PreRunPodSandbox, req.clone()).unwrap(), echo_pod(&req));
    }

    /// An answer that would pass the proxies' 4 MiB limit leaves out unchanged annotations
    /// (and envs when no plugin changed one); the plugins' changes stay.
    #[test]
    fn large_answers_leave_out_the_unchanged_echo() {
        let t = tempfile::tempdir().unwrap();
        let mut with_env = Change { envs: [("HOOKED".to_string(), "yes".to_string())].into(), ..shares(300).unwrap() };
        with_env.annotations.insert("b".into(), "2".into());
        let big = "x".repeat(ECHO_LIMIT_BYTES);
        let mut req = container_req();
        req.container_annotations.insert("big".into(), big.clone());
        let f =
            framework(vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: shares(512) }], FailurePolicy::Fail, t.path());
        let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
        assert!(resp.container_annotations.is_empty() && resp.container_envs.is_empty(), "{:?}", resp.container_envs);
        assert_eq!(resp.container_resources.unwrap().cpu_shares, 512);
        let f = framework(
            vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: Some(with_env) }],
            FailurePolicy::Fail,
            t.path(),
        );
        let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
        assert_eq!(resp.container_annotations, [("b".to_string(), "2".to_string())].into());
        assert_eq!(resp.container_envs.len(), 2, "a changed env keeps the whole env echoed");
        // Envs that are large are left out too when no plugin changed one.
        let mut req = container_req();
        req.container_envs.insert("BIG".into(), big);
        let f =
            framework(vec![Fixed { name: "p", stages: &[Stage::PreCreateContainer], change: shares(512) }], FailurePolicy::Fail, t.path());
        let resp = f.container_hook(Stage::PreCreateContainer, &req).unwrap();
        assert!(resp.container_envs.is_empty());
        assert!(prost::Message::encoded_len(&resp) < ECHO_LIMIT_BYTES);
    }

    #[test]
    fn fail_policy_stops_with_the_plugin_named() {
        let t = tempfile::tempdir().unwrap();
        let f = framework(
            vec![
                Fixed { name: "broken", stages: &[Stage::PreCreateContainer], change: None },
                Fixed { name: "fine", stages: &[Stage::PreCreateContainer], change: shares(512) },
            ],
            FailurePolicy::Fail,
            t.path(),
        );
        let err = f.container_hook(Stage::PreCreateContainer, &container_req()).unwrap_err();
        assert_eq!(err.code, Code::INTERNAL);
        for part in ["broken", "PreCreateContainer", "ns/p/c", "broken broke", "Fail"] {
            assert!(err.message.contains(part), "{part:?} in {:?}", err.message);
        }
    }

    #[test]
    fn ignore_policy_drops_only_the_failing_plugin() {
        let t = tempfile::tempdir().unwrap();
        let f = framework(
            vec![
                Fixed { name: "fine", stages: &[Stage::PreCreateContainer], change: shares(512) },
                Fixed { name: "broken", stages: &[Stage::PreCreateContainer], change: None },
            ],
            FailurePolicy::Ignore,
            t.path(),
        );
        let ctx = ContainerContext::from_request(&container_req());
        let outcome = f.run_container(Stage::PreCreateContainer, &ctx).unwrap();
        assert_eq!(outcome.change.resources.cpu_shares, Some(512));
        assert_eq!(outcome.failures.len(), 1);
        assert_eq!(outcome.failures[0].plugin, "broken");
        assert_eq!(outcome.container_values, vec![Owned { plugin: "fine", value: CgroupValue::CpuShares(512) }]);
    }

    #[test]
    fn pod_values_are_written_and_a_missing_kernel_file_is_no_failure() {
        let t = tempfile::tempdir().unwrap();
        let pod_dir = t.path().join("kubepods/pod1");
        std::fs::create_dir_all(&pod_dir).unwrap();
        std::fs::write(pod_dir.join("cpu.weight"), "100").unwrap();
        let change = Change { pod_cgroup: vec![CgroupValue::CpuShares(1024), CgroupValue::BvtWarpNs(-1)], ..Default::default() };
        let f = framework(
            vec![Fixed { name: "podlevel", stages: &[Stage::PreRunPodSandbox], change: Some(change) }],
            FailurePolicy::Fail,
            t.path(),
        );
        let req = PodSandboxHookRequest {
            cgroup_parent: "/kubepods/pod1".into(),
            labels: [("x".to_string(), "y".to_string())].into(),
            ..Default::default()
        };
        let resp = f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap();
        let shares = Some(LinuxContainerResources { cpu_shares: 1024, ..Default::default() });
        assert_eq!(
            resp,
            PodSandboxHookResponse { resources: shares.clone(), ..echo_pod(&req) },
            "the echo, and the pod's shares as koordlet answers them"
        );
        assert_eq!(std::fs::read_to_string(pod_dir.join("cpu.weight")).unwrap(), "100", "1024 shares, runc's formula");
        assert_eq!(f.cgroups().unsupported(), vec!["cpu.bvt_warp_ns".to_string()]);
        // The pod's directory does not exist yet: logged, not a failure (even under Fail).
        let early = PodSandboxHookRequest { cgroup_parent: "/kubepods/pod2".into(), ..Default::default() };
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &early).unwrap(), PodSandboxHookResponse { resources: shares, ..echo_pod(&early) });
        // A file that cannot be read or written is the owning plugin's failure (here: cpu.max is
        // a directory, which even root cannot write).
        std::fs::create_dir(pod_dir.join("cpu.max")).unwrap();
        let change = Change { pod_cgroup: vec![CgroupValue::CfsQuota(5000)], ..Default::default() };
        let f = framework(
            vec![Fixed { name: "quota", stages: &[Stage::PreRunPodSandbox], change: Some(change) }],
            FailurePolicy::Fail,
            t.path(),
        );
        let blocked = PodSandboxHookRequest { cgroup_parent: "/kubepods/pod1".into(), ..Default::default() };
        let err = f.pod_hook(Stage::PreRunPodSandbox, &blocked).unwrap_err();
        assert!(err.message.contains("plugin quota") && err.message.contains("cpu.max"), "{}", err.message);
    }

    /// The built-in plugins on a v1 tree laid out like a systemd node (`kubepods.slice/…`).
    fn builtin_on(root: &std::path::Path, driver: Option<CgroupDriver>, policy: FailurePolicy) -> Framework {
        let cgroups = CgroupFs::new(root, CgroupVersion::V1).with_driver(driver);
        Framework::new(crate::plugins::builtin(), policy, RulesStore::fixed(Rules::default()), Arc::new(cgroups))
    }

    const BE_SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

    fn be_pod(parent: &str) -> PodSandboxHookRequest {
        PodSandboxHookRequest {
            pod_meta: Some(PodSandboxMetadata { name: "be".into(), namespace: "ns".into(), uid: "1234".into(), attempt: 0 }),
            labels: [(crate::context::QOS_CLASS_KEY.to_string(), "BE".to_string())].into(),
            annotations: [(crate::plugins::batch_resource::EXTENDED_RESOURCE_SPEC.to_string(), BE_SPEC.to_string())].into(),
            cgroup_parent: parent.into(),
            ..Default::default()
        }
    }

    /// The answer to [`be_pod`]: the echo with BatchResource's pod values in `resources`, as
    /// koordlet fills them (shares, quota, memory limit; not the period).
    fn be_answer(req: &PodSandboxHookRequest) -> PodSandboxHookResponse {
        let resources =
            LinuxContainerResources { cpu_shares: 512, cpu_quota: 100_000, memory_limit_in_bytes: 128 << 20, ..Default::default() };
        PodSandboxHookResponse { resources: Some(resources), ..echo_pod(req) }
    }

    /// koordlet's PreRunPodSandbox answer (`PodResponse.ProxyDone`) carries the pod-level values
    /// its hooks computed: a BE pod's batch sums over the echoed request's resources (its CFS
    /// period kept: koordlet never answers one), a CPU-bound LSR pod's −1 quota; a pod no
    /// plugin sets a value for gets the plain echo, without a `resources` it did not send.
    #[test]
    fn pod_answers_carry_the_pod_values_as_koordlet_fills_them() {
        let t = tempfile::tempdir().unwrap();
        let f = builtin_on(t.path(), None, FailurePolicy::Fail);
        let mut be = be_pod("/kubepods/besteffort/pod1234");
        be.resources = Some(LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, oom_score_adj: -998, ..Default::default() });
        let resp = f.pod_hook(Stage::PreRunPodSandbox, &be).unwrap();
        let want = LinuxContainerResources {
            cpu_shares: 512,
            cpu_quota: 100_000,
            memory_limit_in_bytes: 128 << 20,
            ..be.resources.clone().unwrap()
        };
        assert_eq!(resp, PodSandboxHookResponse { resources: Some(want), ..echo_pod(&be) });
        // One container without a memory limit: the pod's is −1 (unlimited), answered as is.
        let open =
            r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000"}}}}"#;
        be.annotations.insert(crate::plugins::batch_resource::EXTENDED_RESOURCE_SPEC.into(), open.into());
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &be).unwrap().resources.unwrap().memory_limit_in_bytes, -1);
        let lsr = PodSandboxHookRequest {
            labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LSR".to_string())].into(),
            annotations: [(crate::plugins::cpuset::RESOURCE_STATUS.to_string(), r#"{"cpuset": "2-3"}"#.to_string())].into(),
            cgroup_parent: "/kubepods/pod5678".into(),
            ..Default::default()
        };
        let want = LinuxContainerResources { cpu_quota: -1, ..Default::default() };
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &lsr).unwrap(), PodSandboxHookResponse { resources: Some(want), ..echo_pod(&lsr) });
        let ls = PodSandboxHookRequest { labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LS".to_string())].into(), ..lsr };
        assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &ls).unwrap(), echo_pod(&ls), "GroupIdentity's bvt is no answer field");
    }

    /// Creates `<root>/{cpu,memory}/<dir>` with kernel-like defaults (no cpu.bvt_warp_ns: this
    /// kernel has no group identity).
    fn v1_dir(root: &std::path::Path, dir: &str) {
        for (ctrl, files) in [
            ("cpu", &[("cpu.shares", "2"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")][..]),
            ("memory", &[("memory.limit_in_bytes", "9223372036854771712")][..]),
        ] {
            let d = root.join(ctrl).join(dir.trim_start_matches('/'));
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), v).unwrap();
            }
        }
    }

    /// The issue: a systemd slice name as the pod's cgroup parent was refused ("not an absolute
    /// path"), failing every pod under Fail. It resolves to its expanded directory, where the BE
    /// values land.
    #[test]
    fn a_systemd_slice_parent_gets_the_be_values_in_its_expanded_directory() {
        let t = tempfile::tempdir().unwrap();
        let expanded = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice";
        v1_dir(t.path(), expanded);
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap().trim().to_owned();
        for driver in [Some(CgroupDriver::Systemd), None] {
            std::fs::write(t.path().join("cpu").join(expanded).join("cpu.shares"), "2").unwrap();
            let f = builtin_on(t.path(), driver, FailurePolicy::Fail);
            let req = be_pod("kubepods-besteffort-pod1234.slice");
            assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap(), be_answer(&req), "{driver:?}");
            assert_eq!(read(&format!("cpu/{expanded}/cpu.shares")), "512", "{driver:?}");
            assert_eq!(read(&format!("cpu/{expanded}/cpu.cfs_quota_us")), "100000");
            assert_eq!(read(&format!("cpu/{expanded}/cpu.cfs_period_us")), "100000");
            assert_eq!(read(&format!("memory/{expanded}/memory.limit_in_bytes")), "134217728");
            assert_eq!(f.cgroups().unsupported(), vec!["cpu.bvt_warp_ns".to_string()], "no group identity here: skipped");
        }
        // kubelet's own (expanded) form, under the cgroupfs driver too.
        std::fs::write(t.path().join("cpu").join(expanded).join("cpu.shares"), "2").unwrap();
        let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Fail);
        f.pod_hook(Stage::PreRunPodSandbox, &be_pod(&format!("/{expanded}"))).unwrap();
        assert_eq!(read(&format!("cpu/{expanded}/cpu.shares")), "512");
    }

    /// The cluster's NodeResourceTopology and Node reach the plugins through the rules store:
    /// an LS container gets the share pools in its answer, a BE pod's quota (its cgroup and its
    /// container's answer) is scaled by the normalization ratio and its cpuset cleared. And
    /// when the inputs go away, the answers go back.
    #[test]
    fn the_rules_stores_topology_and_node_reach_the_plugins() {
        use crate::rules::node::NodeRules;
        use crate::rules::topology::{CpuSharedPool, Topology};
        let t = tempfile::tempdir().unwrap();
        let pod_dir = "kubepods/besteffort/pod1234";
        v1_dir(t.path(), pod_dir);
        let store = RulesStore::fixed(Rules::default());
        let f = Framework::new(
            crate::plugins::builtin(),
            FailurePolicy::Fail,
            store.clone(),
            Arc::new(CgroupFs::new(t.path(), CgroupVersion::V1)),
        );
        let pools =
            vec![CpuSharedPool { socket: 0, node: 0, cpuset: "0-3".into() }, CpuSharedPool { socket: 1, node: 1, cpuset: "8-11".into() }];
        assert!(store.set_cluster_topology(Some(Topology { share_pools: pools, ..Default::default() })));
        assert!(store.set_cluster_node(Some(NodeRules { cpu_normalization_ratio: Some(1.2) })));

        let ls = ContainerResourceHookRequest {
            pod_labels: [(crate::context::QOS_CLASS_KEY.to_string(), "LS".to_string())].into(),
            pod_cgroup_parent: "/kubepods/burstable/pod5678".into(),
            ..container_req()
        };
        let answer =
            |req: &ContainerResourceHookRequest| f.container_hook(Stage::PreCreateContainer, req).unwrap().container_resources.unwrap();
        assert_eq!(answer(&ls).cpuset_cpus, "0-3,8-11");
        let pod = be_pod(&format!("/{pod_dir}"));
        f.pod_hook(Stage::PreRunPodSandbox, &pod).unwrap();
        let quota = || std::fs::read_to_string(t.path().join("cpu").join(pod_dir).join("cpu.cfs_quota_us")).unwrap();
        assert_eq!(quota(), "83334", "⌈100000 ÷ 1.2⌉");
        let be = ContainerResourceHookRequest {
            pod_labels: pod.labels.clone(),
            pod_annotations: pod.annotations.clone(),
            pod_cgroup_parent: pod.cgroup_parent.clone(),
            container_meta: Some(ContainerMetadata { name: "main".into(), ..Default::default() }),
            container_resources: Some(LinuxContainerResources { cpuset_cpus: "4-5".into(), ..Default::default() }),
            ..container_req()
        };
        let r = answer(&be);
        assert_eq!((r.cpu_quota, r.cpu_shares, r.cpuset_cpus.as_str()), (83_334, 512, ""));

        assert!(store.set_cluster_topology(None));
        assert!(store.set_cluster_node(None));
        assert_eq!(answer(&ls).cpuset_cpus, "", "no pools: unchanged (the request's empty cpuset echoed)");
        assert_eq!(answer(&ls), container_req().container_resources.unwrap(), "the echo");
        f.pod_hook(Stage::PreRunPodSandbox, &pod).unwrap();
        assert_eq!(quota(), "100000");
        let r = answer(&be);
        assert_eq!((r.cpu_quota, r.cpuset_cpus.as_str()), (100_000, ""), "BestEffort is still cleared");
    }

    /// Under the cgroupfs driver a slice name is refused: a failure of each plugin with pod
    /// values, naming the name and the driver; nothing written.
    #[test]
    fn a_slice_name_under_the_cgroupfs_driver_is_the_plugins_failure() {
        let t = tempfile::tempdir().unwrap();
        let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Fail);
        let err = f.pod_hook(Stage::PreRunPodSandbox, &be_pod("kubepods-besteffort-pod1234.slice")).unwrap_err();
        for part in ["GroupIdentity", "PreRunPodSandbox", "kubepods-besteffort-pod1234.slice", "cgroupfs"] {
            assert!(err.message.contains(part), "{part:?} in {:?}", err.message);
        }
        let f = builtin_on(t.path(), Some(CgroupDriver::Cgroupfs), FailurePolicy::Ignore);
        let pod = PodContext::from_pod_request(&be_pod("kubepods-besteffort-pod1234.slice"));
        let mut outcome = f.run_pod(Stage::PreRunPodSandbox, &pod).unwrap();
        f.write_pod_values(Stage::PreRunPodSandbox, &pod, &mut outcome).unwrap();
        let failed: Vec<&str> = outcome.failures.iter().map(|f| f.plugin).collect();
        assert_eq!(failed, ["GroupIdentity", "BatchResource"]);
        assert!(!t.path().join("cpu").exists(), "nothing written");
    }

    /// The issue: an empty cgroup parent (CRI: the runtime's default) failed GroupIdentity under
    /// Fail, for pods without a QoS class too, on a kernel without cpu.bvt_warp_ns. Nothing is
    /// written at pod level and nothing fails.
    #[test]
    fn an_empty_parent_is_the_runtime_default_never_a_failure() {
        let t = tempfile::tempdir().unwrap();
        for driver in [None, Some(CgroupDriver::Systemd), Some(CgroupDriver::Cgroupfs)] {
            let f = builtin_on(t.path(), driver, FailurePolicy::Fail);
            assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &be_pod("")).unwrap(), be_answer(&be_pod("")), "{driver:?}");
            for req in [PodSandboxHookRequest::default(), PodSandboxHookRequest { cgroup_parent: "/".into(), ..Default::default() }] {
                assert_eq!(f.pod_hook(Stage::PreRunPodSandbox, &req).unwrap(), echo_pod(&req), "{driver:?} {req:?}");
            }
        }
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 0, "nothing written");
    }
}
