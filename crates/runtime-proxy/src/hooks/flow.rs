//! The one hook flow: every hooked call of every front end runs through [`drive`].
//!
//! # The sequence
//!
//! 1. The pod's turn: calls for the same pod sandbox (its containers included) run one at a
//!    time, from the store read to the post stage ([`crate::hooks::store::PodLocks`]); calls for
//!    different pods never wait on each other — there is no node-wide lock (koord mutates shared
//!    store entries without one).
//! 2. Decode and load ([`Front::load`]): the call, with what the store (or the backend) knows of
//!    its pod sandbox or container.
//! 3. The skip label ([`Hooks::skips`]).
//! 4. The pre stage, over the call's hook request ([`HookedCall::hook_request`]).
//! 5. Edits ([`Front::apply`]): what the hooks changed goes into the request; with no change the
//!    request goes on as it came, byte for byte.
//! 6. Send ([`Front::send`]).
//! 7. Commit ([`Front::commit`]): on success, what the store learns.
//! 8. The post stage ([`Post`]), still holding the pod's turn, run once the client has the
//!    answer; its answers are not applied.
//!
//! When no hook server is registered for the pre stage (or the call has none) and the front end
//! says the store already holds what loading reads ([`Front::send_first`]), the request is sent
//! on first, as it came, and decoded and loaded while the backend works on it.
//!
//! # What a front end supplies
//!
//! Only decode and load, edit-apply, send and commit, for one call ([`Front`]): CRI mode
//! ([`crate::cri::intercept`]) edits protobuf on the wire, Docker mode
//! ([`crate::docker::intercept`]) edits JSON.
//!
//! # Where koord-runtime-proxy differs
//!
//! (Koordinator v1.8.0's `pkg/runtimeproxy/server/cri/criserver.go` and `store/manager.go`.)
//! It calls post hooks even when the backend failed and deletes store entries at Stop (so a
//! second Stop finds nothing); here post hooks run only after success and entries live until
//! Remove. It re-sends a container's envs at every later container stage; here only
//! PreCreateContainer carries them (the store keeps none: [`crate::hooks::store`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hook_api::v1alpha1 as hook;

use super::stages::MethodSpec;
use super::Hooks;
use crate::grpc::Status;
use crate::hooks::chain::{ChainMessage, Required};
use crate::hooks::registry::{Snapshot, Stage};
use crate::hooks::store::{PodGuard, Store};

/// A copy of a call's hook request as it was before the pre stage's first answer that changed
/// it (what the front end's edits compare with); [`BeforeHooks::Unchanged`] when no answer
/// changed it. (Public for the fuzz targets in `fuzz/`.)
#[derive(Debug)]
pub enum BeforeHooks {
    /// A pod-level request before the hooks changed it.
    Pod(hook::PodSandboxHookRequest),
    /// A container-level request before the hooks changed it.
    Container(hook::ContainerResourceHookRequest),
    /// No answer changed the request: there is nothing to edit.
    Unchanged,
}

/// The hook request a stage runs over: pod-level or container-level.
pub enum HookRequest<'a> {
    /// Pod-level stages (PreRunPodSandbox, PostStopPodSandbox).
    Pod(&'a mut hook::PodSandboxHookRequest),
    /// Container-level stages (PreCreateContainer, PreStartContainer, PostStartContainer,
    /// PostStopContainer, PreUpdateContainerResources).
    Container(&'a mut hook::ContainerResourceHookRequest),
}

/// A decoded, loaded call: what the stages and the skip label see.
pub trait HookedCall: Send + 'static {
    /// The hook request the stages run over; `None` when the call has none (a pod or container
    /// nobody knows, a call that only keeps the store exact).
    fn hook_request(&mut self) -> Option<HookRequest<'_>>;
    /// The pod's labels (where the skip label is looked up) and metadata (its namespace).
    fn pod(&self) -> Option<(&BTreeMap<String, String>, Option<&hook::PodSandboxMetadata>)>;
}

/// One call of a front end: what [`drive`] cannot know — the call's encoding and its backend.
pub trait Front: Sync {
    /// The decoded call.
    type Call: HookedCall;
    /// What goes on to the backend (head and body, and how it is sent).
    type Request: Send;
    /// The backend's answer.
    type Answer: Send;
    /// What the client is answered with when the call fails (the front end's error shape).
    type Error: Send;

    /// The call's name in logs (a method, a route).
    fn name(&self) -> &str;

    /// Whether what [`Front::load`] reads is in the store already (no backend round trip), so
    /// that a call without a pre stage may go on before it is decoded. Default: no.
    fn send_first(&self, _hooks: &Hooks) -> bool {
        false
    }

    /// Decodes the call and loads what the store (or the backend) knows of its pod sandbox or
    /// container; called once it is the call's turn for its pod. `Ok(None)`: the call goes on
    /// without hooks, as it came (the store learns nothing from it).
    ///
    /// Errors: the front end's refusal of a request it cannot read.
    fn load(
        &self,
        hooks: &Hooks,
        snapshot: &Snapshot,
    ) -> impl Future<Output = Result<Option<Box<Self::Call>>, Self::Error>> + Send;

    /// `request` with what the hooks changed in `call` (compared with `before`) written into it.
    ///
    /// Errors: the changes cannot be written into the request.
    fn apply(
        &self,
        call: &Self::Call,
        before: &BeforeHooks,
        request: Self::Request,
    ) -> Result<Self::Request, Self::Error>;

    /// Sends `request` to the backend and returns its answer.
    ///
    /// Errors: the backend could not be reached or did not answer in time.
    fn send(&self, request: Self::Request) -> impl Future<Output = Result<Self::Answer, Self::Error>> + Send;

    /// Whether the backend carried the call out (then the store learns from it and the post
    /// stage runs).
    fn succeeded(&self, answer: &Self::Answer) -> bool;

    /// Records what a successful call taught the store; `post`: a post stage follows, which needs
    /// the call's hook request still.
    fn commit(&self, call: &mut Self::Call, answer: &Self::Answer, store: &Store, post: bool);

    /// A hook failure under the `Fail` policy as the front end's answer.
    fn refuse(&self, status: Status) -> Self::Error;
}

/// A post stage still to run, holding the pod's turn until it is done.
pub struct Post<C> {
    hooks: Arc<Hooks>,
    stage: Stage,
    call: Box<C>,
    _turn: Option<PodGuard>,
}

impl<C: HookedCall> Post<C> {
    /// Runs the post stage (its answers are not applied; a failure is only logged by the
    /// dispatcher), then gives the pod's turn to its next call.
    pub async fn run(mut self) {
        let snapshot = self.hooks.registry.snapshot();
        let mut waited = Duration::ZERO;
        let _ = run_stage(&self.hooks, &snapshot, self.stage, self.call.hook_request(), None, &mut waited).await;
    }
}

/// Drives one call of `front` through the flow of `spec`'s row (see the module docs): `key` is
/// the pod sandbox whose calls it must not interleave with (`None`: no pod yet, as for
/// RunPodSandbox), `request` what goes on, `deadline` the caller's, which bounds the pre stage.
/// Returns the backend's answer and the post stage, to run once the client has the answer.
///
/// Errors: the front end's ([`Front::load`], [`Front::apply`], [`Front::send`]) and a pre-stage
/// hook failure under `Fail` ([`Front::refuse`]).
pub async fn drive<F: Front>(
    hooks: &Arc<Hooks>,
    spec: &'static MethodSpec,
    front: &F,
    key: Option<&str>,
    request: F::Request,
    deadline: Option<Instant>,
) -> Result<(F::Answer, Option<Post<F::Call>>), F::Error> {
    let turn = match key {
        Some(key) => Some(hooks.pod_locks.lock(key).await),
        None => None,
    };
    // The proxy's own time for a hooked call runs from its turn to its send, less the hook
    // servers' round trips.
    let (started, mut waited) = (Instant::now(), Duration::ZERO);
    let snapshot = hooks.registry.snapshot();
    // A pre stage with no server registered for it runs only where a server may be required
    // (`crate::hooks::chain`): by the node, by a stored pod, or by the pod a RunPodSandbox
    // creates (its annotations are in the call). Otherwise the call goes on without it.
    let pre = spec.pre.filter(|&stage| {
        snapshot.for_stage(stage).next().is_some()
            || stage == Stage::PreRunPodSandbox
            || !hooks.dispatcher.chain().required.is_empty()
            || hooks.store.any_pod_requires_servers()
    });
    // Whether the call's pod skips the hooks (the skip label), once its call is decoded.
    let mut skipped = None;
    let (answer, call) = match pre {
        None if front.send_first(hooks) => {
            // The store is read while the backend works on the call (after letting the tasks
            // woken by `send` — the relay's — write it first).
            let load = async {
                after_woken_tasks().await;
                front.load(hooks, &snapshot).await
            };
            let (answer, call) = tokio::join!(front.send(request), load);
            (answer?, call?)
        }
        None => {
            // What the store does not know is asked of the backend first, before the call can
            // answer and the pod's next call come.
            let call = front.load(hooks, &snapshot).await?;
            (front.send(request).await?, call)
        }
        Some(stage) => {
            let Some(mut call) = front.load(hooks, &snapshot).await? else {
                return front.send(request).await.map(|a| (a, None));
            };
            let skips = skips(hooks, &*call, front.name());
            skipped = Some(skips);
            let before = if skips {
                BeforeHooks::Unchanged
            } else {
                // The hook request is copied only once an answer changes it.
                run_stage(hooks, &snapshot, stage, call.hook_request(), deadline, &mut waited)
                    .await
                    .map_err(|s| front.refuse(s))?
            };
            let request = match before {
                BeforeHooks::Unchanged => request,
                _ => front.apply(&call, &before, request)?,
            };
            hooks.metrics.hooked_call_own_time(stage.as_str(), started.elapsed().saturating_sub(waited));
            (front.send(request).await?, Some(call))
        }
    };
    let Some(mut call) = call.filter(|_| front.succeeded(&answer)) else {
        return Ok((answer, None));
    };
    let hooked = spec.post.is_some() && !skipped.unwrap_or_else(|| skips(hooks, &*call, front.name()));
    front.commit(&mut call, &answer, &hooks.store, hooked);
    let post = spec.post.filter(|_| hooked).map(|stage| Post { hooks: hooks.clone(), stage, call, _turn: turn });
    Ok((answer, post))
}

/// Whether the call's pod skips every hook (see [`Hooks::skips`]).
fn skips<C: HookedCall>(hooks: &Hooks, call: &C, name: &str) -> bool {
    call.pod().is_some_and(|(labels, meta)| hooks.skips(labels, meta, name))
}

/// Runs `stage` over `request`, if there is one; `waited` grows by the time spent waiting on the
/// hook servers' answers. Returns the hook request as it was before the first answer that
/// changed it, or [`BeforeHooks::Unchanged`].
///
/// Errors: a hook failure under `Fail` (see [`crate::hooks::dispatch::Dispatcher::run`]).
pub async fn run_stage(
    hooks: &Hooks,
    snapshot: &Snapshot,
    stage: Stage,
    request: Option<HookRequest<'_>>,
    deadline: Option<Instant>,
    waited: &mut Duration,
) -> Result<BeforeHooks, Status> {
    let dispatcher = &hooks.dispatcher;
    Ok(match request {
        Some(HookRequest::Pod(p)) => {
            let required = required(hooks, stage, p);
            let skip = p.labels.get(&hooks.skip_label.key).cloned();
            let before = dispatcher.run(snapshot, stage, p, deadline, &required, waited).await?;
            keep_skip_label(&hooks.skip_label.key, skip, &mut p.labels, stage);
            before.map_or(BeforeHooks::Unchanged, BeforeHooks::Pod)
        }
        Some(HookRequest::Container(c)) => {
            let required = required(hooks, stage, c);
            dispatcher
                .run(snapshot, stage, c, deadline, &required, waited)
                .await?
                .map_or(BeforeHooks::Unchanged, BeforeHooks::Container)
        }
        None => BeforeHooks::Unchanged,
    })
}

/// Puts the pod's own value of the skip label `key` (`before`: absent or its value before the
/// chain) back into `labels` after a pod-level chain: a hook answer may not add, change or remove
/// it, or one `Ignore` server could switch every later stage's servers off for that pod (the
/// label is stored with the pod), as it may not change the requirement annotations
/// ([`crate::hooks::chain`]). Logged at WARN when undone.
fn keep_skip_label(key: &str, before: Option<String>, labels: &mut BTreeMap<String, String>, stage: Stage) {
    if labels.get(key) == before.as_ref() {
        return;
    }
    tracing::warn!(
        stage = stage.as_str(),
        label = key,
        "a hook answer may not add, change or remove the skip label; the pod's own value is kept"
    );
    match before {
        Some(v) => labels.insert(key.to_owned(), v),
        None => labels.remove(key),
    };
}

/// The hook servers the pod of `request` requires at `stage` (see [`Required::of_pod`]); an
/// ignored tolerate annotation is reported at pre stages only (once per call).
fn required(hooks: &Hooks, stage: Stage, request: &impl ChainMessage) -> Required {
    let (annotations, meta) = request.pod();
    let node = &hooks.dispatcher.chain().required;
    Required::of_pod(
        node,
        annotations,
        meta,
        &hooks.skip_label.namespaces,
        stage.as_str(),
        &hooks.metrics,
        stage.is_pre(),
    )
}

/// Lets the tasks woken so far run before this one goes on: the task wakes itself and returns
/// `Pending` once, so the scheduler queues it behind them. (`tokio::task::yield_now` would
/// also have a current-thread runtime poll the I/O driver first: one more `epoll_wait` per
/// call.)
async fn after_woken_tasks() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}
