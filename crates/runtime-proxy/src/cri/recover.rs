//! Restart recovery: rebuilds the [`Store`] from the runtime, so hooks for pods and containers
//! that existed before the proxy (re)started get the same request they would have got before.
//!
//! The store lives in memory only. koord-runtime-proxy rebuilds its store at start-up from `ListPodSandbox` /
//! `ListContainers` alone and so loses the pod cgroup parent, the container resources and the envs
//! (koord-runtime-proxy's `pkg/runtimeproxy/store/manager.go` keeps them in memory only): after a restart koordlet sees
//! every pod as Guaranteed and cannot merge resources on updates. (Envs are kept by neither store here: see
//! [`crate::hooks::store`].) [`rebuild`] also asks `PodSandboxStatus` and `ContainerStatus` with `verbose = true` and
//! reads containerd's verbose `info` (JSON) to recover every field exactly.
//!
//! # What containerd records (verified on 1.6.20 and 1.7.24)
//!
//! Both versions answer a verbose status with one `info` key holding a JSON object; the keys used
//! here are identical in 1.6 and 1.7 (samples in `tests/fixtures/containerd-1.{6,7}/`):
//!
//! * sandbox: `pid`, `processStatus`, `runtimeHandler`, `runtimeType`, `config` (the
//!   `PodSandboxConfig` of the RunPodSandbox call, Go `encoding/json` of the CRI struct: snake_case
//!   keys such as `linux.cgroup_parent`, enums as numbers, empty fields omitted) and
//!   `runtimeSpec` (the pause container's OCI spec; `linux.cgroupsPath` = `<cgroup parent>/<id>`);
//! * container: `sandboxID`, `pid`, `config` (the `ContainerConfig` of the CreateContainer call:
//!   `envs`, `annotations`, `linux.resources` as created) and `runtimeSpec` (`process.env`,
//!   `process.oomScoreAdj`, `linux.resources`, `linux.cgroupsPath`), the spec being updated by
//!   every `UpdateContainerResources`, the `config` not;
//! * `ContainerStatus.resources.linux` (typed) is containerd's conversion of the spec's current
//!   resources (after updates, swap defaulted, oom score clamped): all zero for a container created
//!   without resources.
//!
//! The key fact: `config` is not what kubelet sent but what containerd **received — from the
//! proxy**, which had already applied the PreRunPodSandbox / PreCreateContainer hooks' changes to
//! the request. So `config` holds exactly the hook-merged labels, annotations and cgroup parent
//! that the store held, and the spec and status hold what was applied since.
//!
//! # Where each field comes from
//!
//! The store held the hook requests *after* the hooks' changes; a recovered entry must equal it.
//! Rule: take what the runtime actually applied, from the most direct record of it.
//!
//! Pod sandbox entry (`PodSandboxHookRequest`):
//!
//! | field | source | why |
//! |---|---|---|
//! | `pod_meta` (name, uid, namespace, attempt) | `PodSandboxStatus.metadata` | hooks cannot change it |
//! | `runtime_handler` | `PodSandboxStatus.runtime_handler`, else `info.runtimeHandler` | as RunPodSandbox carried it |
//! | `labels`, `annotations` | `PodSandboxStatus.labels` / `.annotations` | containerd returns the maps it received: kubelet's plus the PreRunPodSandbox hooks' (= `info.config`) |
//! | `cgroup_parent` | `info.config.linux.cgroup_parent`; fallback: `info.runtimeSpec.linux.cgroupsPath` minus its last element (cgroupfs `/parent/<id>`, systemd `parent.slice:cri-containerd:<id>`) | the parent containerd put the pod under, after the hooks' change |
//! | `overhead`, `resources` | `info.config.linux.overhead` / `.resources` | built from the config at RunPodSandbox (hooks' answers for them are ignored) |
//!
//! Container entry (`ContainerResourceHookRequest`, plus its sandbox ID):
//!
//! | field | source | why |
//! |---|---|---|
//! | sandbox ID | `ListContainers` `pod_sandbox_id` | |
//! | `pod_meta`, `pod_labels`, `pod_annotations`, `pod_resources` | the pod entry in the store (recovered, or written by live traffic) | as at CreateContainer, which copies them from the pod entry |
//! | `pod_cgroup_parent` | the container's `info.runtimeSpec.linux.cgroupsPath` minus its last element, when it differs from the pod entry's parent (the pod entry's spelling otherwise; the pod entry's when the pod has none or the path cannot be parsed) | containerd puts the container under the `sandbox_config.linux.cgroup_parent` of the CreateContainer call (checked on 1.6 and 1.7), so a PreCreateContainer hook's change of it is applied — and was in the store |
//! | `container_meta.name`, `.attempt` | `ContainerStatus.metadata` | |
//! | `container_meta.id` | the container ID | |
//! | `container_annotations` | `ContainerStatus.annotations` | the CreateContainer annotations containerd received (kubelet's + PreCreateContainer hooks') |
//! | `container_resources` | `ContainerStatus.resources.linux`, swap normalised (below); fallback: `info.runtimeSpec` `linux.resources` + `process.oomScoreAdj` (the mapping containerd itself uses); last resort `info.config.linux.resources` (as created, without later updates) | applied resources, including every UpdateContainerResources — what the store had merged in |
//! | `container_envs` | none | the store keeps no envs ([`crate::hooks::store`]): the later stages send none |
//!
//! Values that legitimately differ from the pre-restart store:
//!
//! * `memory_swap_limit_in_bytes`: when none is requested, containerd sets swap = memory limit
//!   (swap controller present). Normalised back: if the created config asked for no swap and the
//!   applied swap equals the applied memory limit, it is reported as 0, as the store had it.
//!   A client that asks for a swap limit explicitly (even one equal to the memory limit) has it
//!   in the config, and the applied value is kept.
//! * `oom_score_adj`: the applied score. Differs from the requested one only where containerd
//!   clamps it (`restrict_oom_score_adj`, e.g. −998 → 0).
//! * `hugepage_limits`: the applied ones; containerd drops them where no hugetlb controller is
//!   available (on the test VMs it is only in the cgroup v2 hierarchy of a hybrid layout).
//! * Changes that never reached the runtime are lost: container annotations sent with
//!   UpdateContainerResources and a PreUpdateContainerResources hook's annotation changes (checked:
//!   containerd records neither), every PreStartContainer hook change (StartContainer carries
//!   nothing to apply them to), a PreUpdateContainerResources hook's `pod_cgroup_parent` (the
//!   container stays where it was created: the recovered value is the one in effect).
//!
//! An object whose fields cannot all be determined (no status, no metadata, no verbose info and
//! no fallback; a container without verbose info, whose cgroup parent cannot be told) is
//! skipped — logged and listed in the report — rather than recorded with empty values: a
//! missing entry makes the proxy skip that object's hooks, an entry with an empty
//! cgroup parent would make koordlet take wrong decisions. Fallbacks used are listed too.
//!
//! # Concurrency with live traffic
//!
//! The proxy serves while [`rebuild`] runs. Entries already in the store were written by live
//! calls and are newer than what the runtime reports, so they are kept; objects created after the
//! listing are not swept. (Checking and writing an entry are two store operations; a live write
//! landing in between is overwritten by the runtime's record of the same, just-created object.)
//! A call for an object not recovered yet asks the runtime for it alone ([`fetch_container`],
//! [`fetch_pod`]) before its hooks run.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hook_api::convert;
use hook_api::v1alpha1 as hook;
use k8s_cri::v1 as cri;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::cri::{hooked_fields, info_view};
use crate::hooks::store::{sweep, ContainerEntry, ContainerOwn, Store, RETRY_FIRST, RETRY_MAX, SWEEP_INTERVAL};

/// Status calls in flight at once.
pub const CONCURRENCY: usize = 16;
/// Deadline of each list and status call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest list answer accepted: kubelet's 16 MiB.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Pod sandbox or container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A pod sandbox (`ListPodSandbox`, `PodSandboxStatus`).
    PodSandbox,
    /// A container (`ListContainers`, `ContainerStatus`).
    Container,
}

/// An object the report mentions: skipped (with the reason) or recovered with a fallback.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Whether the object is a pod sandbox or a container.
    pub kind: Kind,
    /// The object's ID.
    pub id: String,
    /// Why it was skipped, or which fallback recovered it.
    pub text: String,
}

/// What [`rebuild`] did.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// Pod sandboxes and containers listed by the runtime.
    pub listed: (usize, usize),
    /// Pod sandbox entries written.
    pub pods: usize,
    /// Container entries written.
    pub containers: usize,
    /// Entries left alone because live traffic had already written them.
    pub already_known: usize,
    /// Entries removed because the runtime no longer has the object (IDs).
    pub swept: (Vec<String>, Vec<String>),
    /// Objects not recovered, with the reason.
    pub skipped: Vec<Note>,
    /// Objects recovered, but with a field from a fallback source.
    pub fallbacks: Vec<Note>,
    /// Wall time of the whole rebuild.
    pub elapsed: Duration,
}

/// Rebuilds the store from the CRI runtime behind `channel`.
///
/// Lists every pod sandbox and container (all states), asks each one's verbose status (at most
/// [`CONCURRENCY`] at a time), writes an entry for every object the store does not know yet, and
/// sweeps entries whose object the runtime no longer lists. One object that cannot be read is
/// logged and skipped.
///
/// Errors: the status of a failed `ListPodSandbox` / `ListContainers` (e.g. `UNAVAILABLE` while
/// the runtime is down); the store is then unchanged.
pub async fn rebuild(channel: &Channel, store: &Store) -> Result<RecoveryReport, Status> {
    let start = Instant::now();
    let (pods_before, containers_before) = store.ids();

    let sandboxes = list_pod_sandboxes(channel).await?;
    let containers = list_containers(channel, cri::ContainerFilter::default()).await?;
    let mut report = RecoveryReport { listed: (sandboxes.len(), containers.len()), ..Default::default() };

    let mut live_pods: HashSet<String> = HashSet::new();
    let mut live_containers: HashSet<String> = HashSet::new();
    // Pod sandboxes first: a container's entry shares its pod's. Each answer is recorded as it
    // comes, so that at most CONCURRENCY of them (4–10 KB of verbose info each) are held at once.
    let pod_ids = sandboxes.into_iter().map(|s| s.id);
    let status = |channel: Channel, id: String| async move { pod_sandbox_status(&channel, &id).await };
    each_status(channel, pod_ids, status, |id, answer| {
        let answer = match listed(&mut report, Kind::PodSandbox, &id, answer) {
            Listed::Gone => return,
            Listed::Unreadable => None,
            Listed::Read(_) if store.has_pod(&id) => {
                report.already_known += 1;
                None
            }
            Listed::Read(answer) => Some(answer),
        };
        if let Some(answer) = answer {
            match pod_entry(answer) {
                Ok((pod, notes)) => {
                    note_fallbacks(&mut report, Kind::PodSandbox, &id, notes);
                    store.put_pod(&id, pod);
                    report.pods += 1;
                }
                Err(why) => skip(&mut report, Kind::PodSandbox, &id, why),
            }
        }
        live_pods.insert(id);
    })
    .await;

    let sandbox_of: HashMap<String, String> = containers.into_iter().map(|c| (c.id, c.pod_sandbox_id)).collect();
    let status = |channel: Channel, id: String| async move { container_status(&channel, &id).await };
    each_status(channel, sandbox_of.keys().cloned(), status, |id, answer| {
        let answer = match listed(&mut report, Kind::Container, &id, answer) {
            Listed::Gone => return,
            Listed::Unreadable => None,
            Listed::Read(_) if store.has_container(&id) => {
                report.already_known += 1;
                None
            }
            Listed::Read(answer) => Some(answer),
        };
        if let Some(answer) = answer {
            let sandbox_id = &sandbox_of[&id];
            let not_stored = || format!("its pod sandbox {sandbox_id} was not recovered");
            // The pod's fields are shared with its stored entry, not copied per container.
            let own = match store.pod_cgroup_parent(sandbox_id) {
                Some(pod_parent) => container_own(answer, &id, &pod_parent),
                None => Err(not_stored()),
            };
            match own.map(|(own, notes)| (store.put_container_of_pod(&id, sandbox_id, own), notes)) {
                Ok((true, notes)) => {
                    note_fallbacks(&mut report, Kind::Container, &id, notes);
                    report.containers += 1;
                }
                Ok((false, _)) => skip(&mut report, Kind::Container, &id, not_stored()),
                Err(why) => skip(&mut report, Kind::Container, &id, why),
            }
        }
        live_containers.insert(id);
    })
    .await;

    // Entries live traffic wrote since the listing began are live too.
    let (pods_now, containers_now) = store.ids();
    let (pods_before, containers_before): (HashSet<_>, HashSet<_>) =
        (pods_before.into_iter().collect(), containers_before.into_iter().collect());
    live_pods.extend(pods_now.into_iter().filter(|id| !pods_before.contains(id)));
    live_containers.extend(containers_now.into_iter().filter(|id| !containers_before.contains(id)));
    report.swept = sweep(store, &live_pods, &live_containers);
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The store's keeper, for the proxy's lifetime: rebuilds the store from the runtime behind
/// `channel` at start-up (retrying with backoff, [`RETRY_FIRST`] doubling to [`RETRY_MAX`],
/// while the runtime is not reachable), again whenever the proxy's backend connection is
/// re-established (`connections` counts them: the runtime may have restarted), and every
/// [`SWEEP_INTERVAL`]. Stops only when the runtime does not implement CRI v1.
pub async fn keep_store(endpoint: PathBuf, store: Arc<Store>, mut connections: tokio::sync::watch::Receiver<u64>) {
    let channel = hook_api::connect(&endpoint);
    if !rebuild_until_done(&endpoint, &channel, &store, "start-up").await {
        return;
    }
    // Connections made before or during the first rebuild need no second one.
    connections.borrow_and_update();
    loop {
        let why = tokio::select! {
            changed = connections.changed() => match changed {
                // The proxy's first backend connection (made lazily, by the first call) is no
                // reconnection: the start-up rebuild saw that runtime already.
                Ok(()) if *connections.borrow_and_update() <= 1 => continue,
                Ok(()) => "backend reconnected",
                Err(_) => return,
            },
            () = tokio::time::sleep(SWEEP_INTERVAL) => "periodic sweep",
        };
        if !rebuild_until_done(&endpoint, &channel, &store, why).await {
            return;
        }
    }
}

/// Rebuilds until it succeeds; false when the runtime does not serve CRI v1 (give up).
async fn rebuild_until_done(endpoint: &Path, channel: &Channel, store: &Store, why: &str) -> bool {
    let mut delay = RETRY_FIRST;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match rebuild(channel, store).await {
            Ok(r) => {
                tracing::info!(
                    why,
                    listed_pods = r.listed.0,
                    listed_containers = r.listed.1,
                    already_known = r.already_known,
                    swept = r.swept.0.len() + r.swept.1.len(),
                    skipped = r.skipped.len(),
                    fallbacks = r.fallbacks.len(),
                    attempts,
                    "store recovered: {} pod sandboxes, {} containers in {} ms",
                    r.pods,
                    r.containers,
                    r.elapsed.as_millis()
                );
                return true;
            }
            Err(e) if e.code() == Code::Unimplemented => {
                tracing::warn!(runtime = %endpoint.display(), error = %e.message(), "runtime does not serve CRI v1; store not recovered");
                return false;
            }
            Err(e) => {
                if attempts == 1 {
                    tracing::info!(
                        runtime = %endpoint.display(), code = hook_api::code_name(e.code()), error = %e.message(), why,
                        "runtime not ready; store recovery retries until it is"
                    );
                } else {
                    tracing::debug!(
                        runtime = %endpoint.display(), code = hook_api::code_name(e.code()), error = %e.message(),
                        attempts,
                        "store recovery: runtime still not ready"
                    );
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}

/// For a store miss at an ID-only CRI call: asks the runtime for pod sandbox `sandbox_id`
/// (verbose status) and records it. Returns it, or `Ok(None)` when the runtime does not know it
/// (`NOT_FOUND`) or cannot be reached (`UNAVAILABLE`): the call goes on, and the runtime answers
/// it as it would without the proxy.
///
/// Errors: the runtime knows the pod sandbox but what it says cannot be read: the status call's
/// failure, or why its answer is unusable ([`pod_entry`]).
pub async fn fetch_pod(
    channel: &Channel,
    store: &Store,
    sandbox_id: &str,
) -> Result<Option<hook::PodSandboxHookRequest>, String> {
    let answer = match pod_sandbox_status(channel, sandbox_id).await {
        Ok(a) => a,
        Err(e) if e.code() == Code::NotFound => {
            tracing::debug!(sandbox_id, error = %e.message(), "store miss: runtime has no such pod sandbox");
            return Ok(None);
        }
        Err(e) if e.code() == Code::Unavailable => return Ok(unreachable_runtime(sandbox_id, &e)),
        Err(e) => {
            return Err(format!(
                "pod sandbox {sandbox_id}: PodSandboxStatus failed: {}: {}",
                hook_api::code_name(e.code()),
                e.message()
            ))
        }
    };
    match pod_entry(answer) {
        Ok((pod, _)) => {
            store.put_pod(sandbox_id, pod.clone());
            tracing::info!(sandbox_id, "store miss: pod sandbox recovered from the runtime");
            Ok(Some(pod))
        }
        Err(why) => Err(format!("pod sandbox {sandbox_id}: its status from the runtime is unusable: {why}")),
    }
}

/// For a store miss at an ID-only CRI call: asks the runtime for container `container_id`
/// (its sandbox from ListContainers, then both verbose statuses) and records it.
/// Returns it, or `Ok(None)` as [`fetch_pod`] does.
///
/// Errors: as [`fetch_pod`], for the container or its pod sandbox.
pub async fn fetch_container(
    channel: &Channel,
    store: &Store,
    container_id: &str,
) -> Result<Option<ContainerEntry>, String> {
    let filter = cri::ContainerFilter { id: container_id.to_owned(), ..Default::default() };
    let sandbox_id = match list_containers(channel, filter).await {
        Ok(c) if !c.is_empty() => c[0].pod_sandbox_id.clone(),
        Ok(_) => {
            tracing::debug!(container_id, "store miss: runtime has no such container");
            return Ok(None);
        }
        Err(e) if e.code() == Code::Unavailable => return Ok(unreachable_runtime(container_id, &e)),
        Err(e) => {
            return Err(format!(
                "container {container_id}: ListContainers failed: {}: {}",
                hook_api::code_name(e.code()),
                e.message()
            ))
        }
    };
    let pod = match store.pod(&sandbox_id) {
        Some(p) => p,
        None => match fetch_pod(channel, store, &sandbox_id).await? {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let answer = match container_status(channel, container_id).await {
        Ok(a) => a,
        Err(e) if e.code() == Code::NotFound => {
            tracing::debug!(container_id, error = %e.message(), "store miss: container gone");
            return Ok(None);
        }
        Err(e) if e.code() == Code::Unavailable => return Ok(unreachable_runtime(container_id, &e)),
        Err(e) => {
            return Err(format!(
                "container {container_id}: ContainerStatus failed: {}: {}",
                hook_api::code_name(e.code()),
                e.message()
            ))
        }
    };
    match container_entry(answer, container_id, &pod) {
        Ok((hook, _)) => {
            let entry = ContainerEntry { sandbox_id, hook };
            store.put_container(container_id, entry.clone());
            tracing::info!(container_id, "store miss: container recovered from the runtime");
            Ok(Some(entry))
        }
        Err(why) => Err(format!("container {container_id}: its status from the runtime is unusable: {why}")),
    }
}

/// A store miss while the runtime cannot be reached: logged; the call goes on (and the runtime,
/// still unreachable, answers it `UNAVAILABLE` as it would without the proxy).
fn unreachable_runtime<T>(id: &str, e: &Status) -> Option<T> {
    tracing::warn!(id, error = %e.message(), "store miss: the runtime cannot be reached; the call goes on without hooks");
    None
}

/// One CRI v1 RuntimeService call (`path`) whose answer is read through the view `A`
/// ([`crate::cri::hooked_fields`]): label, annotation and info values that are not UTF-8 never make it
/// unreadable, and fields the proxy does not read are skipped. Deadline [`CALL_TIMEOUT`];
/// answers up to [`MAX_MESSAGE_BYTES`].
///
/// Errors: the call's status (`UNAVAILABLE` when the runtime cannot be reached).
async fn call<Q, A>(channel: &Channel, path: &'static str, req: Q) -> Result<A, Status>
where
    Q: prost::Message + Send + Sync + 'static,
    A: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
    grpc.ready().await.map_err(|e| Status::unavailable(format!("runtime not reachable: {e}")))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(with_timeout(req), path, tonic_prost::ProstCodec::<Q, A>::default())
        .await
        .map(tonic::Response::into_inner)
}

/// Every pod sandbox the runtime lists (IDs only).
async fn list_pod_sandboxes(channel: &Channel) -> Result<Vec<hooked_fields::ListedPodSandbox>, Status> {
    let answer: hooked_fields::ListPodSandboxResponse =
        call(channel, "/runtime.v1.RuntimeService/ListPodSandbox", cri::ListPodSandboxRequest { filter: None }).await?;
    Ok(answer.items)
}

/// The containers the runtime lists under `filter` (IDs and sandbox IDs only).
async fn list_containers(
    channel: &Channel,
    filter: cri::ContainerFilter,
) -> Result<Vec<hooked_fields::ListedContainer>, Status> {
    let req = cri::ListContainersRequest { filter: Some(filter) };
    let answer: hooked_fields::ListContainersResponse =
        call(channel, "/runtime.v1.RuntimeService/ListContainers", req).await?;
    Ok(answer.containers)
}

/// Pod sandbox `id`'s verbose status: the fields recovery reads
/// ([`hooked_fields::PodSandboxStatusResponse`]).
async fn pod_sandbox_status(channel: &Channel, id: &str) -> Result<hooked_fields::PodSandboxStatusResponse, Status> {
    let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id.to_owned(), verbose: true };
    call(channel, "/runtime.v1.RuntimeService/PodSandboxStatus", req).await
}

/// Container `id`'s verbose status: the fields recovery reads
/// ([`hooked_fields::ContainerStatusResponse`]).
async fn container_status(channel: &Channel, id: &str) -> Result<hooked_fields::ContainerStatusResponse, Status> {
    let req = cri::ContainerStatusRequest { container_id: id.to_owned(), verbose: true };
    call(channel, "/runtime.v1.RuntimeService/ContainerStatus", req).await
}

/// What the status call of a listed object said.
enum Listed<A> {
    /// `NOT_FOUND`: removed between the listing and the call; not live.
    Gone,
    /// The call failed otherwise (logged and reported as skipped): live, not recorded.
    Unreadable,
    /// Its status.
    Read(A),
}

/// The [`Listed`] for a status call's result (`None`: its task failed); a failure is reported.
fn listed<A>(report: &mut RecoveryReport, kind: Kind, id: &str, answer: Option<Result<A, Status>>) -> Listed<A> {
    let call = if kind == Kind::PodSandbox { "PodSandboxStatus" } else { "ContainerStatus" };
    match answer {
        Some(Ok(answer)) => Listed::Read(answer),
        Some(Err(e)) if e.code() == Code::NotFound => Listed::Gone,
        Some(Err(e)) => {
            skip(report, kind, id, format!("{call} failed: {}: {}", hook_api::code_name(e.code()), e.message()));
            Listed::Unreadable
        }
        None => {
            skip(report, kind, id, format!("{call} task failed"));
            Listed::Unreadable
        }
    }
}

/// Reports the object `id` as not recovered, for the reason `text`.
fn skip(report: &mut RecoveryReport, kind: Kind, id: &str, text: String) {
    tracing::warn!(kind = ?kind, id, reason = %text, "recovery: object skipped");
    report.skipped.push(Note { kind, id: id.to_owned(), text });
}

/// Calls `status` for each of `ids`, [`CONCURRENCY`] at a time, and hands each answer to `take`
/// as it comes: the ID and the call's result, or `None` when the call's task failed.
async fn each_status<A, F, Fut>(
    channel: &Channel,
    ids: impl Iterator<Item = String>,
    status: F,
    mut take: impl FnMut(String, Option<Result<A, Status>>),
) where
    A: Send + 'static,
    F: Fn(Channel, String) -> Fut,
    Fut: std::future::Future<Output = Result<A, Status>> + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut calls = JoinSet::new();
    let mut unanswered = HashMap::new();
    for id in ids {
        let (call, limit) = (status(channel.clone(), id.clone()), limit.clone());
        let task = calls.spawn(async move {
            let _permit = limit.acquire_owned().await;
            call.await
        });
        unanswered.insert(task.id(), id);
    }
    while let Some(done) = calls.join_next_with_id().await {
        match done {
            Ok((task, answer)) => {
                if let Some(id) = unanswered.remove(&task) {
                    take(id, Some(answer));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "recovery: a status call task failed");
                if let Some(id) = unanswered.remove(&e.id()) {
                    take(id, None);
                }
            }
        }
    }
}

fn with_timeout<T>(message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.set_timeout(CALL_TIMEOUT);
    req
}

fn note_fallbacks(report: &mut RecoveryReport, kind: Kind, id: &str, notes: Vec<String>) {
    for text in notes {
        tracing::debug!(kind = ?kind, id, fallback = %text, "recovery: field from a fallback source");
        report.fallbacks.push(Note { kind, id: id.to_owned(), text });
    }
}

/// The pod sandbox entry for a verbose `PodSandboxStatus` answer, and the fallbacks used. Label and
/// annotation values that are not UTF-8 are left out, as in hook requests ([`hooked_fields::utf8_entries`]).
///
/// Errors: why the entry cannot be built (no status or metadata, no cgroup parent source).
pub fn pod_entry(
    answer: hooked_fields::PodSandboxStatusResponse,
) -> Result<(hook::PodSandboxHookRequest, Vec<String>), String> {
    let status = answer.status.ok_or("no status in PodSandboxStatus")?;
    let meta = status.metadata.as_ref().ok_or("no metadata in PodSandboxStatus")?;
    let info = verbose_info(&answer.info);
    let config = info.as_ref().and_then(|i| obj(i, "config"));
    let linux = config.and_then(|c| obj(c, "linux"));
    let mut notes = Vec::new();

    let cgroup_parent = match (config, linux) {
        (Some(_), Some(l)) => string(l, "cgroup_parent").unwrap_or_default(),
        (Some(_), None) => String::new(),
        (None, _) => {
            let spec_path =
                info.as_ref().and_then(|i| path(i, &["runtimeSpec", "linux", "cgroupsPath"])).and_then(Value::as_str);
            match spec_path.and_then(|p| cgroup_parent_of(p, &status.id)) {
                Some(p) => {
                    notes.push(format!("cgroup parent from the runtime spec's cgroupsPath {:?}", spec_path.unwrap_or("")));
                    p
                }
                None if info.is_none() => return Err("no verbose info: cannot tell the pod cgroup parent".into()),
                None => {
                    return Err(
                        "verbose info has neither config nor runtimeSpec.linux.cgroupsPath: cannot tell the pod cgroup parent".into()
                    )
                }
            }
        }
    };
    let runtime_handler = if status.runtime_handler.is_empty() {
        info.as_ref().and_then(|i| string(i, "runtimeHandler")).unwrap_or_default()
    } else {
        status.runtime_handler.clone()
    };
    let pod = hook::PodSandboxHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: meta.name.clone(),
            uid: meta.uid.clone(),
            namespace: meta.namespace.clone(),
            attempt: meta.attempt,
        }),
        runtime_handler,
        labels: hooked_fields::into_utf8_entries(status.labels),
        annotations: hooked_fields::into_utf8_entries(status.annotations),
        cgroup_parent,
        overhead: linux.and_then(|l| obj(l, "overhead")).map(cri_resources),
        resources: linux.and_then(|l| obj(l, "resources")).map(cri_resources),
    };
    Ok((pod, notes))
}

/// The container hook request for a verbose `ContainerStatus` answer of container `id` in
/// `pod`, and the fallbacks used: [`container_own`] with the pod's fields.
///
/// Errors: as [`container_own`].
pub fn container_entry(
    answer: hooked_fields::ContainerStatusResponse,
    id: &str,
    pod: &hook::PodSandboxHookRequest,
) -> Result<(hook::ContainerResourceHookRequest, Vec<String>), String> {
    let (own, notes) = container_own(answer, id, &pod.cgroup_parent)?;
    let hook = hook::ContainerResourceHookRequest {
        pod_meta: pod.pod_meta.clone(),
        container_meta: own.container_meta,
        container_annotations: own.container_annotations,
        container_resources: own.container_resources,
        pod_resources: pod.resources.clone(),
        pod_annotations: pod.annotations.clone(),
        pod_labels: pod.labels.clone(),
        pod_cgroup_parent: own.cgroup_parent,
        // Not kept (see `crate::hooks::store`).
        container_envs: BTreeMap::new(),
    };
    Ok((hook, notes))
}

/// The container's own fields for a verbose `ContainerStatus` answer of container `id` whose pod
/// sandbox has the cgroup parent `pod_parent`, and the fallbacks used.
///
/// Annotation values that are not UTF-8 are left out, as in hook requests.
///
/// Errors: why the entry cannot be built (no status or metadata, no source for resources, no
/// verbose info to tell the container's cgroup parent by).
pub fn container_own(
    answer: hooked_fields::ContainerStatusResponse,
    id: &str,
    pod_parent: &str,
) -> Result<(ContainerOwn, Vec<String>), String> {
    let status = answer.status.ok_or("no status in ContainerStatus")?;
    let meta = status.metadata.as_ref().ok_or("no metadata in ContainerStatus")?;
    let info = verbose_info(&answer.info);
    let config = info.as_ref().and_then(|i| obj(i, "config"));
    let spec = info.as_ref().and_then(|i| obj(i, "runtimeSpec"));
    let requested = config.and_then(|c| path(c, &["linux", "resources"])).and_then(Value::as_object).map(cri_resources);
    let mut notes = Vec::new();

    let applied = status.resources.as_ref().and_then(|r| r.linux.as_ref()).map(convert::to_hook);
    let mut resources = match (applied, spec.and_then(spec_resources), &requested) {
        (Some(r), _, _) => r,
        (None, Some(r), _) => {
            notes.push("resources from the runtime spec (ContainerStatus has none)".into());
            r
        }
        (None, None, Some(r)) if config.is_some() => {
            notes.push("resources as created (no applied resources reported: later updates are missing)".into());
            r.clone()
        }
        _ => return Err("no resources in ContainerStatus and no verbose info to read them from".into()),
    };
    if config.is_some() {
        // The swap the CreateContainer config asked for (absent = 0).
        normalise_swap(&mut resources, requested.as_ref().map_or(0, |r| r.memory_swap_limit_in_bytes));
    }

    if info.is_none() {
        // A PreCreateContainer hook may have moved the container: only the spec tells.
        return Err("no verbose info: cannot tell the container's cgroup parent".into());
    }

    let own = ContainerOwn {
        container_meta: Some(hook::ContainerMetadata {
            name: meta.name.clone(),
            attempt: meta.attempt,
            id: id.to_owned(),
        }),
        container_annotations: hooked_fields::into_utf8_entries(status.annotations),
        container_resources: Some(resources),
        cgroup_parent: container_cgroup_parent(spec, id, pod_parent),
    };
    Ok((own, notes))
}

/// The parent the container's cgroup was created under (its spec's `cgroupsPath` without the
/// last element), when it differs from the pod's `pod_parent`; `pod_parent` otherwise, and when
/// the pod has none (containerd then uses a default location nobody chose) or the path cannot
/// be parsed.
fn container_cgroup_parent(spec: Option<&Map<String, Value>>, id: &str, pod_parent: &str) -> String {
    let applied = spec
        .and_then(|s| path(s, &["linux", "cgroupsPath"]))
        .and_then(Value::as_str)
        .and_then(|p| cgroup_parent_of(p, id));
    match applied {
        Some(p) if !pod_parent.is_empty() && p.trim_end_matches('/') != pod_parent.trim_end_matches('/') => p,
        _ => pod_parent.to_owned(),
    }
}

/// Undoes containerd's swap default: with no swap requested (`asked` = 0) containerd applies
/// swap = memory limit, which the store never had.
fn normalise_swap(r: &mut hook::LinuxContainerResources, asked: i64) {
    if asked == 0 && r.memory_limit_in_bytes > 0 && r.memory_swap_limit_in_bytes == r.memory_limit_in_bytes {
        r.memory_swap_limit_in_bytes = 0;
    }
}

/// The JSON object of a verbose `info` map: containerd's single `info` key, else the first
/// value that is a JSON object (other runtimes). None when there is none. Only the keys read
/// here are kept ([`info_view::WANTED`]).
fn verbose_info(info: &hooked_fields::Text) -> Option<Map<String, Value>> {
    // Read lossily: containerd writes JSON, which is UTF-8 (then nothing is copied). `from_utf8`
    // first: its check is several times faster than `from_utf8_lossy`'s on valid text (+4 % of
    // recovery's instructions at 1,000 pods × 4, counted with callgrind).
    let parse = |v: &Vec<u8>| {
        let text = std::str::from_utf8(v).map_or_else(|_| String::from_utf8_lossy(v), Cow::Borrowed);
        info_view::parse_object(&text, info_view::WANTED)
    };
    if let Some(m) = info.get("info").and_then(parse) {
        return Some(m);
    }
    info.values().find_map(parse)
}

/// The parent of an OCI `cgroupsPath` for the object `id`: cgroupfs `/a/b/<id>` → `/a/b`,
/// systemd `parent.slice:prefix:<id>` → `parent.slice`. None when the path does not end in the
/// object's own element.
fn cgroup_parent_of(cgroups_path: &str, id: &str) -> Option<String> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    if parts.len() == 3 && !parts[0].contains('/') {
        return (parts[2] == id || parts[2].contains(id)).then(|| parts[0].to_owned());
    }
    let (parent, last) = cgroups_path.rsplit_once('/')?;
    (!id.is_empty() && last.contains(id)).then(|| parent.to_owned())
}

/// CRI `LinuxContainerResources` as Go's `encoding/json` writes it (snake_case, as containerd's
/// `config`); protobuf JSON's camelCase names are accepted too. Missing or odd values are 0.
fn cri_resources(r: &Map<String, Value>) -> hook::LinuxContainerResources {
    let int = |names: &[&str]| names.iter().find_map(|n| r.get(*n).and_then(int_of)).unwrap_or(0);
    let text = |names: &[&str]| names.iter().find_map(|n| r.get(*n).and_then(Value::as_str)).unwrap_or("").to_owned();
    let hugepages = ["hugepage_limits", "hugepageLimits"].iter().find_map(|n| r.get(*n).and_then(Value::as_array));
    hook::LinuxContainerResources {
        cpu_period: int(&["cpu_period", "cpuPeriod"]),
        cpu_quota: int(&["cpu_quota", "cpuQuota"]),
        cpu_shares: int(&["cpu_shares", "cpuShares"]),
        memory_limit_in_bytes: int(&["memory_limit_in_bytes", "memoryLimitInBytes"]),
        oom_score_adj: int(&["oom_score_adj", "oomScoreAdj"]),
        cpuset_cpus: text(&["cpuset_cpus", "cpusetCpus"]),
        cpuset_mems: text(&["cpuset_mems", "cpusetMems"]),
        hugepage_limits: hugepages.map(|l| hugepage_limits(l, &["page_size", "pageSize"])).unwrap_or_default(),
        unified: string_map(r.get("unified")),
        memory_swap_limit_in_bytes: int(&["memory_swap_limit_in_bytes", "memorySwapLimitInBytes"]),
    }
}

/// The resources of an OCI runtime spec (`linux.resources`, `process.oomScoreAdj`), mapped as
/// containerd maps them to `ContainerStatus.resources`. None without `linux.resources`.
fn spec_resources(spec: &Map<String, Value>) -> Option<hook::LinuxContainerResources> {
    let res = path(spec, &["linux", "resources"])?.as_object()?;
    let cpu = obj(res, "cpu");
    let mem = obj(res, "memory");
    let int = |m: Option<&Map<String, Value>>, k: &str| m.and_then(|m| m.get(k)).and_then(int_of).unwrap_or(0);
    let text = |m: Option<&Map<String, Value>>, k: &str| m.and_then(|m| string(m, k)).unwrap_or_default();
    Some(hook::LinuxContainerResources {
        cpu_period: int(cpu, "period"),
        cpu_quota: int(cpu, "quota"),
        cpu_shares: int(cpu, "shares"),
        memory_limit_in_bytes: int(mem, "limit"),
        oom_score_adj: path(spec, &["process", "oomScoreAdj"]).and_then(int_of).unwrap_or(0),
        cpuset_cpus: text(cpu, "cpus"),
        cpuset_mems: text(cpu, "mems"),
        hugepage_limits: res
            .get("hugepageLimits")
            .and_then(Value::as_array)
            .map(|l| hugepage_limits(l, &["pageSize"]))
            .unwrap_or_default(),
        unified: string_map(res.get("unified")),
        memory_swap_limit_in_bytes: int(mem, "swap"),
    })
}

fn hugepage_limits(list: &[Value], size_keys: &[&str]) -> Vec<hook::HugepageLimit> {
    list.iter()
        .filter_map(Value::as_object)
        .filter_map(|h| {
            let page_size = size_keys.iter().find_map(|k| string(h, k))?;
            let limit = h.get("limit").and_then(int_of).map(|l| l.max(0) as u64).unwrap_or(0);
            Some(hook::HugepageLimit { page_size, limit })
        })
        .collect()
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

/// An integer from a JSON number (saturated to i64) or a decimal string (protobuf JSON writes
/// 64-bit integers as strings).
fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|u| i64::try_from(u).unwrap_or(i64::MAX)))
            .or_else(|| n.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn obj<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Map<String, Value>> {
    m.get(key).and_then(Value::as_object)
}

fn string(m: &Map<String, Value>, key: &str) -> Option<String> {
    m.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn path<'a>(m: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a Value> {
    let (last, inner) = keys.split_last()?;
    let mut cur = m;
    for k in inner {
        cur = obj(cur, k)?;
    }
    cur.get(*last)
}

#[cfg(test)]
#[path = "recover_tests.rs"]
mod tests;
