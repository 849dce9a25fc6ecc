//! The dispatcher: calls every hook server registered for a stage, in order, each seeing the hook
//! request as changed by the ones before, within its own deadline, under its failure policy.
//!
//! Order: the registry's snapshot order (ascending `order`, then file name), fixed for the
//! call. Deadline per server: its `timeout-ms` (default 2 s), never more than what is left of the
//! kubelet's deadline. A failure (unreachable, timeout, an error status, an undecodable answer)
//! under `Fail` ends the stage with a status naming the stage, the server's file and endpoint
//! and the cause; under `Ignore` it is logged and the next server sees the request unchanged.
//! A timeout never ejects a server: the next call tries it again, on a new connection (the
//! timed-out one is let go once the calls still on it end), so that a connection the server
//! stopped reading (a frozen process whose socket buffer is full) cannot keep accumulating what
//! cancelled calls left queued on it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hook_api::merge;
use hook_api::v1alpha1::{ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse};
use http::uri::PathAndQuery;
use tonic::transport::Channel;

use crate::grpc::{Code, Status};
use crate::limits::HookLimits;
use crate::metrics::{HookResult, Metrics};
use crate::registry::{FailurePolicy, HookServer, Snapshot, Stage};

/// A hook request type (pod-level or container-level) with its answer type and merge rule.
pub trait HookMessage: prost::Message + Clone + Default + Send + Sync + 'static {
    /// The answer type of the RPCs that take this request.
    type Answer: prost::Message + Default + Send + Sync + 'static;
    /// Applies an answer to the request (the merge rules of [`hook_api::merge`]).
    fn apply(&mut self, answer: &Self::Answer);
    /// Checks what the answer would add to the request's maps against `limits`.
    ///
    /// Errors: the first limit exceeded (see [`HookLimits::check_map`]).
    fn check(&self, answer: &Self::Answer, limits: &HookLimits) -> Result<(), String>;
}

impl HookMessage for PodSandboxHookRequest {
    type Answer = PodSandboxHookResponse;
    fn apply(&mut self, answer: &PodSandboxHookResponse) {
        merge::apply_pod_response(self, answer);
    }
    fn check(&self, answer: &PodSandboxHookResponse, limits: &HookLimits) -> Result<(), String> {
        limits.check_map("labels", &self.labels, &answer.labels)?;
        limits.check_map("annotations", &self.annotations, &answer.annotations)
    }
}

impl HookMessage for ContainerResourceHookRequest {
    type Answer = ContainerResourceHookResponse;
    fn apply(&mut self, answer: &ContainerResourceHookResponse) {
        merge::apply_container_response(self, answer);
    }
    fn check(&self, answer: &ContainerResourceHookResponse, limits: &HookLimits) -> Result<(), String> {
        limits.check_map("container_envs", &self.container_envs, &answer.container_envs)?;
        limits.check_map("container_annotations", &self.container_annotations, &answer.container_annotations)
    }
}

/// A channel's key: the hook server's endpoint and the uids allowed to serve it.
type ChannelKey = (PathBuf, Vec<u32>);

/// Calls hook servers; keeps one lazily connected channel per endpoint and set of allowed uids,
/// each with a serial number (so that a timed-out call drops only the channel it used).
pub struct Dispatcher {
    channels: Mutex<HashMap<ChannelKey, (u64, Channel)>>,
    serial: std::sync::atomic::AtomicU64,
    metrics: std::sync::Arc<Metrics>,
    limits: HookLimits,
}

impl Dispatcher {
    /// A dispatcher with no connections yet, recording into `metrics`; answers beyond `limits`
    /// are hook failures (`RESOURCE_EXHAUSTED`, naming the limit's flag).
    pub fn new(metrics: std::sync::Arc<Metrics>, limits: HookLimits) -> Self {
        Dispatcher { channels: Mutex::new(HashMap::new()), serial: Default::default(), metrics, limits }
    }

    /// Runs `stage` over the servers of `snapshot` registered for it, changing `req` with each
    /// answer. `deadline` is when the kubelet's call expires, if it set one.
    ///
    /// Errors: the first failure of a server whose policy is `Fail` (the request keeps the
    /// changes of the servers before it).
    pub async fn run<R: HookMessage>(
        &self,
        snapshot: &Snapshot,
        stage: Stage,
        req: &mut R,
        deadline: Option<Instant>,
    ) -> Result<(), Status> {
        for server in snapshot.for_stage(stage) {
            let started = Instant::now();
            let outcome = self.call(server, stage, req, deadline).await;
            let result = match &outcome {
                Ok(_) => HookResult::Ok,
                Err(s) if s.code == Code::DEADLINE_EXCEEDED => HookResult::Timeout,
                Err(_) => HookResult::Error,
            };
            self.metrics.hook_call(stage.as_str(), &server.name, result, started.elapsed());
            let elapsed_us = started.elapsed().as_micros() as u64;
            match outcome {
                Ok(answer) => {
                    tracing::debug!(stage = stage.as_str(), server = %server.name, elapsed_us, "hook called");
                    req.apply(&answer);
                }
                Err(cause) => {
                    let message = format!(
                        "{} hook server {} (unix://{}) failed: {}",
                        stage.as_str(),
                        server.name,
                        server.endpoint.display(),
                        cause.message
                    );
                    if server.failure_policy == FailurePolicy::Fail {
                        tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, "{message}; failure-policy Fail: refusing the call");
                        return Err(Status::new(cause.code, format!("{message} (failure-policy Fail)")));
                    }
                    tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, "{message}; failure-policy Ignore: going on");
                }
            }
        }
        Ok(())
    }

    async fn call<R: HookMessage>(
        &self,
        server: &HookServer,
        stage: Stage,
        req: &R,
        deadline: Option<Instant>,
    ) -> Result<R::Answer, Status> {
        let budget = match deadline {
            Some(d) => server.timeout.min(d.saturating_duration_since(Instant::now())),
            None => server.timeout,
        };
        if budget.is_zero() {
            return Err(Status::new(Code::DEADLINE_EXCEEDED, "no time left of the CRI call's deadline"));
        }
        let (key, serial, channel) = self.channel(server);
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(self.limits.max_answer_bytes);
        let mut request = tonic::Request::new(req.clone());
        request.set_timeout(budget);
        let codec = tonic_prost::ProstCodec::<R, R::Answer>::default();
        let call = async {
            grpc.ready().await.map_err(|e| tonic::Status::unavailable(format!("connecting: {}", error_chain(&e))))?;
            grpc.unary(request, PathAndQuery::from_static(stage.rpc_path()), codec).await
        };
        let started = Instant::now();
        let outcome = tokio::time::timeout(budget, call).await;
        if outcome.is_err() || started.elapsed() >= budget {
            self.forget(&key, serial);
        }
        match outcome {
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                req.check(&answer, &self.limits).map_err(|why| Status::new(Code::RESOURCE_EXHAUSTED, why))?;
                Ok(answer)
            }
            Ok(Err(s)) if started.elapsed() >= budget => Err(timed_out(budget, &s.to_string())),
            // tonic's decoder refusing an answer over `max_decoding_message_size` (OUT_OF_RANGE).
            Ok(Err(s)) if s.message().contains("message length too large") => {
                Err(Status::new(Code::RESOURCE_EXHAUSTED, format!("{} (--max-hook-answer-bytes)", describe(&s))))
            }
            Ok(Err(s)) => Err(Status::new(Code(s.code() as u16), describe(&s))),
            Err(_) => Err(timed_out(budget, "no answer")),
        }
    }

    /// The channel to `server`'s endpoint, whose connections are checked against its
    /// `allowed-uids` (default: root and the proxy's own uid).
    /// Returns the channel's key and serial number with it (for [`Dispatcher::forget`]).
    fn channel(&self, server: &HookServer) -> (ChannelKey, u64, Channel) {
        let key = (server.endpoint.clone(), allowed_uids(server));
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((serial, c)) = channels.get(&key) {
            return (key, *serial, c.clone());
        }
        let serial = self.serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let c = hook_api::connect_checked(&key.0, key.1.clone());
        channels.insert(key.clone(), (serial, c.clone()));
        (key, serial, c)
    }

    /// Drops the channel `serial` of `key` after a call on it timed out: the next call connects
    /// anew. A channel made since by another timed-out call is kept.
    fn forget(&self, key: &ChannelKey, serial: u64) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if channels.get(key).is_some_and(|(s, _)| *s == serial) {
            channels.remove(key);
        }
    }

    /// Drops the channels no server in `snapshot` uses any more.
    pub fn prune(&self, snapshot: &Snapshot) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.retain(|(endpoint, uids), _| snapshot.servers().iter().any(|s| &s.endpoint == endpoint && allowed_uids(s) == *uids));
    }
}

/// The uids `server` may run as: its `allowed-uids`, else root and the proxy's own uid.
fn allowed_uids(server: &HookServer) -> Vec<u32> {
    if !server.allowed_uids.is_empty() {
        return server.allowed_uids.clone();
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    let mut uids = vec![0, own];
    uids.dedup();
    uids
}

/// An error and its sources, `: `-separated (tonic's transport error alone says only
/// "transport error").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn timed_out(budget: Duration, detail: &str) -> Status {
    Status::new(Code::DEADLINE_EXCEEDED, format!("timed out after {budget:?} ({detail})"))
}

fn describe(s: &tonic::Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}
