//! `RestorePod` (CRI v1, Kubernetes 1.37 alpha, KEP-5823) in CRI mode: a way around the
//! pre-create hooks, guarded.
//!
//! # Why
//!
//! A restored pod sandbox and its containers are created by the runtime from a checkpoint,
//! without RunPodSandbox or CreateContainer ([`crate::cri::newer_cri`]): the PreRunPodSandbox and
//! PreCreateContainer hook servers never see the pod, so whatever they enforce at creation
//! (koordlet's cgroup parent, resources, envs) is skipped. The request carries the pod's sandbox
//! config (labels, annotations) and the containers' configs, but there is no hook stage for a
//! restore, and a hook's edit of a restored process is not what its author checked.
//!
//! # What the proxy does
//!
//! Per call, from the registry's snapshot and the pod's sandbox config ([`verdict`]):
//!
//! * no hook server registered for PreRunPodSandbox or PreCreateContainer, or a pod that skips
//!   every hook (the skip label, honoured in `--runtime-hook-server-namespaces` only): forwarded
//!   as it came;
//! * such a server has failure-policy `Fail`, or is required (`--required-hook-servers`, or the
//!   pod's `runtimeproxy.koordinator.sh/required-hook-servers` annotation, read from the
//!   request's `config` as RunPodSandbox would read it), or a required server has no
//!   registration at all (RunPodSandbox would be refused for it too, unless the pod may tolerate
//!   that): refused with `FAILED_PRECONDITION` naming the servers and why; the runtime never sees
//!   the call;
//! * otherwise (every such server `Ignore`, none required): forwarded, with a WARN naming the
//!   servers whose hooks the pod skips, counted in `runtime_proxy_restore_unhooked_total`.
//!
//! A request that cannot be decoded is judged without its pod (no skip label, no annotation;
//! the node's requirement and the failure policies still apply) and counted in
//! `runtime_proxy_undecodable_requests_total{method="RestorePod"}`.
//!
//! After a successful restore (whatever the verdict), the store learns the restored pod sandbox
//! and each restored container from the runtime, as restart recovery does
//! ([`recover::fetch_pod`], [`recover::fetch_container`]: verbose statuses), so PreStartContainer
//! (kubelet's next call) and every later stage get the pod's data ([`learn`]). The relay gives
//! kubelet the runtime's answer as it comes; the learning starts at the same time and holds the
//! turn of the restored sandbox and of each container, so a StartContainer that comes in after
//! it took them waits for the store (one that comes in before asks the runtime itself, as for
//! any store miss: the same data). It takes at most [`LEARN_BUDGET`] (and never more than half of
//! what is left of the caller's deadline); what is not learned by then is asked of the runtime
//! on the first call that needs it.
//!
//! `CheckpointPod` creates nothing: it is relayed, never intercepted. Docker mode has no
//! equivalent, and in NRI mode containerd drives the hooks itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hook_api::v1alpha1 as hook;
use prost::Message;

use crate::cri::hook_request::pod_hook_request;
use crate::cri::newer_cri::{RestorePodRequest, RestorePodResponse};
use crate::cri::recover;
use crate::grpc::backend::Backend;
use crate::grpc::unary_call::{self, Onward};
use crate::grpc::{self, Code, Status};
use crate::hooks::chain::{list_shown, shown, Required};
use crate::hooks::registry::{FailurePolicy, Snapshot, Stage};
use crate::hooks::skip_label::SkipLabel;
use crate::hooks::Hooks;
use crate::metrics::Metrics;

/// The pre-create stages a restore gets around.
pub const BYPASSED_STAGES: [Stage; 2] = [Stage::PreRunPodSandbox, Stage::PreCreateContainer];

/// Longest the store's learning of a restored pod may take (and hold its turn), also capped at
/// half of what is left of the caller's deadline when the runtime answered.
pub const LEARN_BUDGET: Duration = Duration::from_secs(2);

/// Most restored containers of one RestorePod answer the store learns at once (a pod has a
/// handful); the others are learned as any store miss, when a call needs them.
pub const MAX_LEARNED_CONTAINERS: usize = 64;

/// Most bytes read (decompressed) of a RestorePod answer: a pod sandbox ID and one name and ID
/// per container.
const ANSWER_BYTES: usize = 1 << 20;

/// What becomes of one RestorePod call.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// No hook server would have seen the pod at its creation: forwarded as it came.
    Pass,
    /// The pod skips every hook (the skip label, in a namespace that may use it): forwarded.
    Skipped,
    /// Forwarded without the hooks of these servers (registration names, each once, in call
    /// order): each has failure-policy `Ignore` and none is required.
    Unhooked(Vec<String>),
    /// Refused with this status (`FAILED_PRECONDITION`).
    Refuse(Status),
}

/// The verdict on a RestorePod of `pod` (the hook request RunPodSandbox would have built from
/// the request's `config` and `runtime_handler`; `None` when the request cannot be decoded),
/// with `snapshot` registered, `node_required` (`--required-hook-servers`) and `skip` (the skip
/// label and its namespaces). A skip label or tolerate annotation the pod may not use is logged
/// and counted in `metrics`, as at RunPodSandbox. See the module docs for the rules.
pub fn verdict(
    snapshot: &Snapshot,
    node_required: &[String],
    skip: &SkipLabel,
    pod: Option<&hook::PodSandboxHookRequest>,
    metrics: &Metrics,
) -> Verdict {
    let method = "RestorePod";
    let meta = pod.and_then(|p| p.pod_meta.as_ref());
    if pod.is_some_and(|p| skip.skips(&p.labels, meta, method, metrics)) {
        return Verdict::Skipped;
    }
    let none = BTreeMap::new();
    let annotations = pod.map_or(&none, |p| &p.annotations);
    let required = Required::of_pod(node_required, annotations, meta, &skip.namespaces, method, metrics, true);

    // The servers a restore gets around, each once (a server of both stages is named with both).
    let mut bypassed: Vec<(&str, FailurePolicy, Vec<&'static str>)> = Vec::new();
    for stage in BYPASSED_STAGES {
        for server in snapshot.for_stage(stage) {
            match bypassed.iter_mut().find(|(name, ..)| *name == server.name) {
                Some((.., stages)) => stages.push(stage.as_str()),
                None => bypassed.push((&server.name, server.failure_policy, vec![stage.as_str()])),
            }
        }
    }
    let mut reasons: Vec<String> = Vec::new();
    for (name, policy, stages) in &bypassed {
        let mut why = Vec::new();
        if *policy == FailurePolicy::Fail {
            why.push("failure-policy Fail".to_owned());
        }
        if let Some(source) = required.source(name) {
            why.push(format!("required by {}", source.describe()));
        }
        if !why.is_empty() {
            reasons.push(format!("{} ({}: {})", shown(name), stages.join("/"), why.join("; ")));
        }
    }
    if let Some(why) = required.refusal() {
        reasons.push(why);
    } else if !required.tolerate_missing {
        for (name, source) in required.missing(snapshot) {
            reasons.push(format!("{} (required by {}, not registered)", shown(name), source.describe()));
        }
    }
    if !reasons.is_empty() {
        let pod = match meta {
            Some(m) if !m.name.is_empty() || !m.namespace.is_empty() => format!(" of pod {}/{}", m.namespace, m.name),
            _ => String::new(),
        };
        return Verdict::Refuse(Status::new(
            Code::FAILED_PRECONDITION,
            format!(
                "{method}{pod} refused: a restored pod is created without RunPodSandbox or CreateContainer, so it would skip the \
                 PreRunPodSandbox and PreCreateContainer hooks, and these hook servers may not be skipped: {}",
                list_shown(&reasons)
            ),
        ));
    }
    if bypassed.is_empty() {
        return Verdict::Pass;
    }
    Verdict::Unhooked(bypassed.into_iter().map(|(name, ..)| name.to_owned()).collect())
}

/// Runs one RestorePod call (`method`: its gRPC path; `parts` and `body`: the request as the
/// front end received it, the body whole) up to the runtime's answer, which `onward` sends it
/// for: judged ([`verdict`]), forwarded as it came unless refused, and on success the store
/// learns the restored pod ([`learn`]) before this returns.
///
/// Errors: the refusal (`FAILED_PRECONDITION`), the body's (`RESOURCE_EXHAUSTED` beyond
/// `--max-request-bytes`, `UNIMPLEMENTED` for a compression the proxy cannot read), `onward`'s
/// (`UNAVAILABLE`, `DEADLINE_EXCEEDED`); each names the method.
pub async fn restore_pod(
    hooks: &Hooks,
    runtime: &Arc<Backend>,
    method: &str,
    onward: Onward<'_>,
    mut parts: http::request::Parts,
    body: Bytes,
) -> Result<unary_call::Answer, Status> {
    let deadline = grpc::parse_timeout(&parts.headers).map(|d| Instant::now() + d);
    let in_method = |s: Status| Status::new(s.code, format!("{method}: {}", s.message));
    let message = grpc::unary_message(&body, parts.headers.get("grpc-encoding"), hooks.limits.max_request_bytes)
        .map_err(in_method)?;
    let request = match message {
        Some(m) => RestorePodRequest::decode(m).map_err(|e| format!("RestorePodRequest: {e}")),
        None => Err("the body is not one gRPC message".to_owned()),
    };
    let pod = request.as_ref().ok().map(|r| pod_hook_request(r.config.as_ref(), &r.runtime_handler));
    if let Err(why) = &request {
        hooks.metrics.undecodable_request("RestorePod");
        tracing::warn!(method, error = %why, "cannot decode the request: judged without its pod (no skip label, no pod annotations)");
    }
    let snapshot = hooks.registry.snapshot();
    let (name, namespace) =
        pod.as_ref().and_then(|p| p.pod_meta.as_ref()).map_or(("", ""), |m| (m.name.as_str(), m.namespace.as_str()));
    match verdict(&snapshot, &hooks.dispatcher.chain().required, &hooks.skip_label, pod.as_ref(), &hooks.metrics) {
        Verdict::Pass => {}
        Verdict::Skipped => {
            tracing::debug!(method, pod = name, namespace, "RestorePod of a pod that skips every hook: forwarded")
        }
        Verdict::Unhooked(servers) => {
            hooks.metrics.restore_unhooked();
            tracing::warn!(
                method,
                pod = name,
                namespace,
                servers = %servers.join(","),
                "RestorePod forwarded without the PreRunPodSandbox and PreCreateContainer hooks of these servers (a restored pod is created without RunPodSandbox or CreateContainer; each has failure-policy Ignore and none is required)"
            );
        }
        Verdict::Refuse(status) => {
            tracing::warn!(method, pod = name, namespace, message = %status.message, "RestorePod refused");
            return Err(status);
        }
    }
    if let Some(d) = deadline {
        parts.headers.insert("grpc-timeout", grpc::timeout_value(d.saturating_duration_since(Instant::now())));
    }
    let answer = onward(parts, body, deadline).await?;
    if answer.status().code == Code::OK {
        let left = deadline.map_or(LEARN_BUDGET, |d| d.saturating_duration_since(Instant::now()) / 2);
        learn(hooks, runtime, &answer, LEARN_BUDGET.min(left)).await;
    }
    Ok(answer)
}

/// Teaches the store the pod sandbox and containers a successful RestorePod `answer` names, from
/// the runtime's verbose statuses, within `budget`, holding the turn ([`crate::hooks::store::PodLocks`])
/// of the sandbox and of each container meanwhile: a call for one of them that comes in after
/// the turns were taken waits, then finds the store up to date. At most [`MAX_LEARNED_CONTAINERS`]
/// containers (each ID once). Returns how many objects it recorded. What cannot be learned (an
/// answer without a sandbox ID, a status that is unusable, the budget spent) is logged (WARN)
/// and left to the store misses of later calls, which ask the runtime as for any object the
/// store does not know.
pub async fn learn(hooks: &Hooks, runtime: &Arc<Backend>, answer: &unary_call::Answer, budget: Duration) -> usize {
    let resp = match answer.message(ANSWER_BYTES).map(|m| m.map(RestorePodResponse::decode)) {
        Ok(Some(Ok(resp))) if !resp.pod_sandbox_id.is_empty() => resp,
        _ => {
            tracing::warn!("RestorePod answer without a pod sandbox ID; the restored pod is not recorded");
            return 0;
        }
    };
    let sandbox_id = resp.pod_sandbox_id.as_str();
    let mut container_ids: Vec<&str> = Vec::new();
    for c in &resp.restored_containers {
        if !c.container_id.is_empty()
            && c.container_id != sandbox_id
            && !container_ids.contains(&c.container_id.as_str())
        {
            container_ids.push(&c.container_id);
        }
    }
    if container_ids.len() > MAX_LEARNED_CONTAINERS {
        tracing::warn!(
            sandbox_id,
            containers = container_ids.len(),
            max = MAX_LEARNED_CONTAINERS,
            "RestorePod: more restored containers than the store learns at once; the others are learned when a call needs them"
        );
        container_ids.truncate(MAX_LEARNED_CONTAINERS);
    }
    let work = async {
        let mut turns = Vec::with_capacity(1 + container_ids.len());
        turns.push(hooks.pod_locks.lock(sandbox_id).await);
        for id in &container_ids {
            turns.push(hooks.pod_locks.lock(id).await);
        }
        match recover::fetch_pod(runtime, &hooks.store, sandbox_id).await {
            Ok(Some(_)) => {}
            Ok(None) => return 0,
            Err(why) => {
                tracing::warn!(sandbox_id, error = %why, "RestorePod: the restored pod sandbox is not recorded");
                return 0;
            }
        }
        // The containers at once (each asks ListContainers, then ContainerStatus); the tasks are
        // aborted with the set if the budget runs out.
        let mut containers = tokio::task::JoinSet::new();
        for id in &container_ids {
            let (runtime, store, container_id) = (runtime.clone(), hooks.store.clone(), id.to_string());
            let sandbox_id = sandbox_id.to_owned();
            containers.spawn(async move {
                match recover::fetch_container(&runtime, &store, &container_id).await {
                    Ok(Some(_)) => 1,
                    Ok(None) => 0,
                    Err(why) => {
                        tracing::warn!(sandbox_id, container_id, error = %why, "RestorePod: a restored container is not recorded");
                        0
                    }
                }
            });
        }
        let mut recorded = 1;
        while let Some(done) = containers.join_next().await {
            recorded += done.unwrap_or(0);
        }
        drop(turns);
        recorded
    };
    match tokio::time::timeout(budget, work).await {
        Ok(recorded) => {
            tracing::info!(
                sandbox_id,
                containers = container_ids.len(),
                recorded,
                "RestorePod: the store learned the restored pod from the runtime"
            );
            recorded
        }
        Err(_) => {
            tracing::warn!(
                sandbox_id,
                budget_ms = budget.as_millis() as u64,
                "RestorePod: the runtime did not describe the restored pod in time; later calls ask it again"
            );
            0
        }
    }
}

#[cfg(test)]
#[path = "restore_tests.rs"]
mod tests;
