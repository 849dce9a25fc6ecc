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
//! Where each field of an entry comes from, and what containerd records: [`crate::cri::status_entry`].
//! Reading the answers is half of recovery's work, done on a thread of its own ([`rebuild`]).
//!
//! # Concurrency with live traffic
//!
//! The proxy serves while [`rebuild`] runs. Entries already in the store were written by live
//! calls and are newer than what the runtime reports, so they are kept; objects created after the
//! listing are not swept. (Checking and writing an entry are two store operations; a live write
//! landing in between is overwritten by the runtime's record of the same, just-created object.)
//! A call for an object not recovered yet asks the runtime for it alone ([`fetch_container`],
//! [`fetch_pod`]) before its hooks run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hook_api::v1alpha1 as hook;
use k8s_cri::v1 as cri;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::cri::hooked_fields;
use crate::cri::status_entry::{container_entry, container_own, pod_entry};
use crate::grpc::backend::Backend;
use crate::grpc::unary_call::own_call;
use crate::grpc::{Code, Status};
use crate::hooks::store::{sweep, ContainerEntry, Store, RETRY_FIRST, RETRY_MAX, SWEEP_INTERVAL};

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

impl Kind {
    /// The CRI call that tells an object's status: `PodSandboxStatus` or `ContainerStatus`.
    pub fn status_call(self) -> &'static str {
        match self {
            Kind::PodSandbox => "PodSandboxStatus",
            Kind::Container => "ContainerStatus",
        }
    }
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

/// Rebuilds the store from the CRI runtime `runtime` (its shared connection).
///
/// Lists every pod sandbox and container (all states), asks each one's verbose status (at most
/// [`CONCURRENCY`] at a time), writes an entry for every object the store does not know yet, and
/// sweeps entries whose object the runtime no longer lists. One object that cannot be read is
/// logged and skipped.
///
/// The work is split over two threads: the calling task keeps the status calls going, and a
/// thread of the blocking pool (the recorder) decodes each answer, reads its verbose info and
/// records the entry. Reading the answers is half of recovery's CPU time (the info's JSON alone is
/// 30 % of its instructions at 1,000 pods × 4 containers), so the proxy's one thread, which also
/// serves the live calls, does half the work, and the two halves overlap.
///
/// Errors: the status of a failed `ListPodSandbox` / `ListContainers` (e.g. `UNAVAILABLE` while
/// the runtime is down), the store then unchanged; `INTERNAL` when the recording thread failed.
pub async fn rebuild(runtime: &Arc<Backend>, store: &Arc<Store>) -> Result<RecoveryReport, Status> {
    let start = Instant::now();
    let (pods_before, containers_before) = store.ids();

    let sandboxes = list_pod_sandboxes(runtime).await?;
    let containers = list_containers(runtime, cri::ContainerFilter::default()).await?;
    let report = RecoveryReport { listed: (sandboxes.len(), containers.len()), ..Default::default() };
    let container_ids: Vec<String> = containers.iter().map(|c| c.id.clone()).collect();
    let sandbox_of: HashMap<String, String> = containers.into_iter().map(|c| (c.id, c.pod_sandbox_id)).collect();

    // At most RECORDER_QUEUE answers (4–10 KB of verbose info each) wait for the recorder.
    let (answers, queue) = mpsc::channel(RECORDER_QUEUE);
    let recorder = Recorder {
        store: store.clone(),
        sandbox_of,
        report,
        live_pods: HashSet::new(),
        live_containers: HashSet::new(),
    };
    let recording = tokio::task::spawn_blocking(move || recorder.record_all(queue));
    // Pod sandboxes first: a container's entry shares its pod's. The recorder takes the answers
    // in the order they are queued, so every pod sandbox is recorded before the first container.
    let pod_ids = sandboxes.into_iter().map(|s| s.id);
    each_status(runtime, Kind::PodSandbox, pod_ids, &answers).await;
    each_status(runtime, Kind::Container, container_ids.into_iter(), &answers).await;
    drop(answers);
    let Recorder { mut report, mut live_pods, mut live_containers, .. } = recording
        .await
        .map_err(|e| Status::new(Code::INTERNAL, format!("store recovery's recording thread failed: {e}")))?;

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

/// Status answers queued for the [`Recorder`] at most; the status calls wait while it is full.
const RECORDER_QUEUE: usize = CONCURRENCY;

/// One status call's outcome, queued for the [`Recorder`]: the object, and its encoded answer or
/// the call's failure (`None`: the call's task failed).
struct Answer {
    kind: Kind,
    id: String,
    answer: Option<Result<Bytes, Status>>,
}

/// The recording half of [`rebuild`], on a thread of its own: decodes each status answer, builds
/// the entry from it and writes it to the store, and keeps the report and the IDs found live.
struct Recorder {
    store: Arc<Store>,
    /// Each listed container's sandbox ID.
    sandbox_of: HashMap<String, String>,
    report: RecoveryReport,
    live_pods: HashSet<String>,
    live_containers: HashSet<String>,
}

impl Recorder {
    /// Records the queued answers in their order until the queue is closed.
    fn record_all(mut self, mut queue: mpsc::Receiver<Answer>) -> Self {
        while let Some(Answer { kind, id, answer }) = queue.blocking_recv() {
            match kind {
                Kind::PodSandbox => self.pod(id, answer),
                Kind::Container => self.container(id, answer),
            }
        }
        self
    }

    fn pod(&mut self, id: String, answer: Option<Result<Bytes, Status>>) {
        let answer = match listed(&mut self.report, Kind::PodSandbox, &id, answer) {
            Listed::Gone => return,
            Listed::Unreadable => None,
            Listed::Read(_) if self.store.has_pod(&id) => {
                self.report.already_known += 1;
                None
            }
            Listed::Read(bytes) => decoded(&mut self.report, Kind::PodSandbox, &id, bytes),
        };
        if let Some(answer) = answer {
            match pod_entry(answer) {
                Ok((pod, notes)) => {
                    note_fallbacks(&mut self.report, Kind::PodSandbox, &id, notes);
                    self.store.put_pod(&id, pod);
                    self.report.pods += 1;
                }
                Err(why) => skip(&mut self.report, Kind::PodSandbox, &id, why),
            }
        }
        self.live_pods.insert(id);
    }

    fn container(&mut self, id: String, answer: Option<Result<Bytes, Status>>) {
        let report = &mut self.report;
        let answer = match listed(report, Kind::Container, &id, answer) {
            Listed::Gone => return,
            Listed::Unreadable => None,
            Listed::Read(_) if self.store.has_container(&id) => {
                report.already_known += 1;
                None
            }
            Listed::Read(bytes) => decoded(report, Kind::Container, &id, bytes),
        };
        if let Some(answer) = answer {
            let sandbox_id = self.sandbox_of.get(&id).map_or("", String::as_str);
            let not_stored = || format!("its pod sandbox {sandbox_id} was not recovered");
            // The pod's fields are shared with its stored entry, not copied per container.
            let own = match self.store.pod_cgroup_parent(sandbox_id) {
                Some(pod_parent) => container_own(answer, &id, &pod_parent),
                None => Err(not_stored()),
            };
            match own.map(|(own, notes)| (self.store.put_container_of_pod(&id, sandbox_id, own), notes)) {
                Ok((true, notes)) => {
                    note_fallbacks(report, Kind::Container, &id, notes);
                    report.containers += 1;
                }
                Ok((false, _)) => skip(report, Kind::Container, &id, not_stored()),
                Err(why) => skip(report, Kind::Container, &id, why),
            }
        }
        self.live_containers.insert(id);
    }
}

/// The store's keeper, for the proxy's lifetime: rebuilds the store from `runtime` at start-up
/// (retrying with backoff, [`RETRY_FIRST`] doubling to [`RETRY_MAX`], while the runtime is not
/// reachable), again whenever the proxy's connection to it is re-established
/// ([`Backend::connections`]: the runtime may have restarted), and every [`SWEEP_INTERVAL`].
/// Stops only when the runtime does not implement CRI v1.
pub async fn keep_store(runtime: Arc<Backend>, store: Arc<Store>) {
    let mut connections = runtime.connections();
    if !rebuild_until_done(&runtime, &store, "start-up").await {
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
        if !rebuild_until_done(&runtime, &store, why).await {
            return;
        }
    }
}

/// Rebuilds until it succeeds; false when the runtime does not serve CRI v1 (give up).
async fn rebuild_until_done(runtime: &Arc<Backend>, store: &Arc<Store>, why: &str) -> bool {
    let endpoint = runtime.path();
    let mut delay = RETRY_FIRST;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match rebuild(runtime, store).await {
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
            Err(e) if e.code == Code::UNIMPLEMENTED => {
                tracing::warn!(runtime = %endpoint.display(), error = %e.message, "runtime does not serve CRI v1; store not recovered");
                return false;
            }
            Err(e) => {
                if attempts == 1 {
                    tracing::info!(
                        runtime = %endpoint.display(), code = e.code.name(), error = %e.message, why,
                        "runtime not ready; store recovery retries until it is"
                    );
                } else {
                    tracing::debug!(
                        runtime = %endpoint.display(), code = e.code.name(), error = %e.message,
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
    runtime: &Backend,
    store: &Store,
    sandbox_id: &str,
) -> Result<Option<hook::PodSandboxHookRequest>, String> {
    let answer = match pod_sandbox_status(runtime, sandbox_id).await {
        Ok(a) => a,
        Err(e) if e.code == Code::NOT_FOUND => {
            tracing::debug!(sandbox_id, error = %e.message, "store miss: runtime has no such pod sandbox");
            return Ok(None);
        }
        Err(e) if e.code == Code::UNAVAILABLE => return Ok(unreachable_runtime(sandbox_id, &e)),
        Err(e) => {
            return Err(format!("pod sandbox {sandbox_id}: PodSandboxStatus failed: {}: {}", e.code.name(), e.message))
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
    runtime: &Backend,
    store: &Store,
    container_id: &str,
) -> Result<Option<ContainerEntry>, String> {
    let filter = cri::ContainerFilter { id: container_id.to_owned(), ..Default::default() };
    let sandbox_id = match list_containers(runtime, filter).await {
        Ok(c) if !c.is_empty() => c[0].pod_sandbox_id.clone(),
        Ok(_) => {
            tracing::debug!(container_id, "store miss: runtime has no such container");
            return Ok(None);
        }
        Err(e) if e.code == Code::UNAVAILABLE => return Ok(unreachable_runtime(container_id, &e)),
        Err(e) => {
            return Err(format!("container {container_id}: ListContainers failed: {}: {}", e.code.name(), e.message))
        }
    };
    let pod = match store.pod(&sandbox_id) {
        Some(p) => p,
        None => match fetch_pod(runtime, store, &sandbox_id).await? {
            Some(p) => p,
            None => return Ok(None),
        },
    };
    let answer = match container_status(runtime, container_id).await {
        Ok(a) => a,
        Err(e) if e.code == Code::NOT_FOUND => {
            tracing::debug!(container_id, error = %e.message, "store miss: container gone");
            return Ok(None);
        }
        Err(e) if e.code == Code::UNAVAILABLE => return Ok(unreachable_runtime(container_id, &e)),
        Err(e) => {
            return Err(format!("container {container_id}: ContainerStatus failed: {}: {}", e.code.name(), e.message))
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
    tracing::warn!(id, error = %e.message, "store miss: the runtime cannot be reached; the call goes on without hooks");
    None
}

/// One CRI v1 RuntimeService call (`path`) with `req`, over the runtime's shared connection
/// ([`own_call`]): its answer, still encoded. Deadline [`CALL_TIMEOUT`]; answers up to
/// [`MAX_MESSAGE_BYTES`].
///
/// Errors: as [`own_call`]: the runtime's status, `UNAVAILABLE` when it cannot be reached.
async fn call(runtime: &Backend, path: &'static str, req: &impl prost::Message) -> Result<Bytes, Status> {
    own_call(runtime, path, &req.encode_to_vec(), CALL_TIMEOUT, MAX_MESSAGE_BYTES).await
}

/// [`call`], its answer decoded into the view `A` ([`crate::cri::hooked_fields`]: label,
/// annotation and info values that are not UTF-8 never make it unreadable, and fields the proxy
/// does not read are skipped).
///
/// Errors: as [`call`]; `INTERNAL` when the answer is not a message of that shape.
async fn call_view<A: prost::Message + Default>(
    runtime: &Backend,
    path: &'static str,
    req: &impl prost::Message,
) -> Result<A, Status> {
    let answer = call(runtime, path, req).await?;
    A::decode(answer).map_err(|e| Status::new(Code::INTERNAL, format!("{path}: the answer cannot be decoded: {e}")))
}

/// Every pod sandbox the runtime lists (IDs only).
async fn list_pod_sandboxes(runtime: &Backend) -> Result<Vec<hooked_fields::ListedPodSandbox>, Status> {
    let answer: hooked_fields::ListPodSandboxResponse =
        call_view(runtime, "/runtime.v1.RuntimeService/ListPodSandbox", &cri::ListPodSandboxRequest { filter: None })
            .await?;
    Ok(answer.items)
}

/// The containers the runtime lists under `filter` (IDs and sandbox IDs only).
async fn list_containers(
    runtime: &Backend,
    filter: cri::ContainerFilter,
) -> Result<Vec<hooked_fields::ListedContainer>, Status> {
    let req = cri::ListContainersRequest { filter: Some(filter) };
    let answer: hooked_fields::ListContainersResponse =
        call_view(runtime, "/runtime.v1.RuntimeService/ListContainers", &req).await?;
    Ok(answer.containers)
}

/// The verbose status (`PodSandboxStatus` or `ContainerStatus`) of the pod sandbox or container
/// `id`, still encoded: [`decode_status`] reads it.
///
/// Errors: the call's status.
async fn encoded_status(runtime: &Backend, kind: Kind, id: String) -> Result<Bytes, Status> {
    match kind {
        Kind::PodSandbox => {
            let req = cri::PodSandboxStatusRequest { pod_sandbox_id: id, verbose: true };
            call(runtime, "/runtime.v1.RuntimeService/PodSandboxStatus", &req).await
        }
        Kind::Container => {
            let req = cri::ContainerStatusRequest { container_id: id, verbose: true };
            call(runtime, "/runtime.v1.RuntimeService/ContainerStatus", &req).await
        }
    }
}

/// A status answer of `kind` decoded into the view `A` (the fields recovery reads:
/// [`hooked_fields::PodSandboxStatusResponse`], [`hooked_fields::ContainerStatusResponse`]).
///
/// Errors: why it is not a protobuf message of that shape.
fn decode_status<A: prost::Message + Default>(kind: Kind, answer: Bytes) -> Result<A, String> {
    A::decode(answer).map_err(|e| format!("the {} answer cannot be decoded: {e}", kind.status_call()))
}

/// Pod sandbox `id`'s verbose status, decoded ([`encoded_status`], [`decode_status`]).
async fn pod_sandbox_status(runtime: &Backend, id: &str) -> Result<hooked_fields::PodSandboxStatusResponse, Status> {
    let answer = encoded_status(runtime, Kind::PodSandbox, id.to_owned()).await?;
    decode_status(Kind::PodSandbox, answer).map_err(|why| Status::new(Code::INTERNAL, why))
}

/// Container `id`'s verbose status, decoded ([`encoded_status`], [`decode_status`]).
async fn container_status(runtime: &Backend, id: &str) -> Result<hooked_fields::ContainerStatusResponse, Status> {
    let answer = encoded_status(runtime, Kind::Container, id.to_owned()).await?;
    decode_status(Kind::Container, answer).map_err(|why| Status::new(Code::INTERNAL, why))
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
    let call = kind.status_call();
    match answer {
        Some(Ok(answer)) => Listed::Read(answer),
        Some(Err(e)) if e.code == Code::NOT_FOUND => Listed::Gone,
        Some(Err(e)) => {
            skip(report, kind, id, format!("{call} failed: {}: {}", e.code.name(), e.message));
            Listed::Unreadable
        }
        None => {
            skip(report, kind, id, format!("{call} task failed"));
            Listed::Unreadable
        }
    }
}

/// The status answer `answer` of object `id` decoded ([`decode_status`]), or None when it cannot be
/// (reported as skipped).
fn decoded<A: prost::Message + Default>(report: &mut RecoveryReport, kind: Kind, id: &str, answer: Bytes) -> Option<A> {
    decode_status(kind, answer).map_err(|why| skip(report, kind, id, why)).ok()
}

/// Reports the object `id` as not recovered, for the reason `text`.
fn skip(report: &mut RecoveryReport, kind: Kind, id: &str, text: String) {
    tracing::warn!(kind = ?kind, id, reason = %text, "recovery: object skipped");
    report.skipped.push(Note { kind, id: id.to_owned(), text });
}

/// Calls the verbose status of each of `ids` (objects of `kind`), [`CONCURRENCY`] at a time, and
/// queues each answer for the [`Recorder`] as it comes (or `None` when the call's task failed). A
/// call keeps its turn until its answer is queued, so at most [`CONCURRENCY`] answers wait beside
/// the queue's. Returns when every answer is queued, or when the recorder has gone.
async fn each_status(
    runtime: &Arc<Backend>,
    kind: Kind,
    ids: impl Iterator<Item = String>,
    answers: &mpsc::Sender<Answer>,
) {
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut calls = JoinSet::new();
    let mut unanswered = HashMap::new();
    for id in ids {
        let (runtime, limit, answers, call_id) = (runtime.clone(), limit.clone(), answers.clone(), id.clone());
        let task = calls.spawn(async move {
            let _turn = limit.acquire_owned().await;
            let answer = encoded_status(&runtime, kind, call_id.clone()).await;
            // A closed queue: the recorder has gone, and `rebuild` reports why.
            let _ = answers.send(Answer { kind, id: call_id, answer: Some(answer) }).await;
        });
        unanswered.insert(task.id(), id);
    }
    while let Some(done) = calls.join_next_with_id().await {
        match done {
            Ok((task, ())) => drop(unanswered.remove(&task)),
            Err(e) => {
                tracing::warn!(error = %e, "recovery: a status call task failed");
                let Some(id) = unanswered.remove(&e.id()) else { continue };
                if answers.send(Answer { kind, id, answer: None }).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn note_fallbacks(report: &mut RecoveryReport, kind: Kind, id: &str, notes: Vec<String>) {
    for text in notes {
        tracing::debug!(kind = ?kind, id, fallback = %text, "recovery: field from a fallback source");
        report.fallbacks.push(Note { kind, id: id.to_owned(), text });
    }
}
