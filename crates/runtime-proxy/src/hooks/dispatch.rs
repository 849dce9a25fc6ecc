//! The dispatcher: calls every hook server registered for a stage, in order, each seeing the hook
//! request as changed by the ones before, within its own deadline, under its failure policy.
//!
//! Order: the registry's snapshot order (ascending `order`, then file name), fixed for the
//! call. Deadline per server: its `timeout-ms` (default 2 s), never more than what is left of the
//! kubelet's deadline. A failure (unreachable, timeout, an error status, an undecodable answer)
//! under `Fail` ends the stage with a status naming the stage, the server's file and endpoint
//! and the cause; under `Ignore` it is logged and the next server sees the request unchanged.
//! A timeout never ejects a server: the next call tries it again, on a new connection (the
//! timed-out call's connection is closed with it, and the server's idle ones are let go).
//!
//! Hook calls are made with [`HookClient`]: the call's future writes its request and reads its
//! answer itself, on the task of the CRI call, on a connection it holds alone for that time,
//! with no connection task between it and the socket; each new connection's peer is checked
//! against the server's allowed uids.
//!
//! Each call's outcome is also kept per server ([`HookHealth`]: last success, last error and
//! when, failures in a row) for `/status`; a success costs two atomic stores.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::grpc::hook_client::HookClient;
use crate::grpc::unary_call::Answer;
use crate::grpc::{self, Code, Status};
use crate::hooks::chain::{self, ChainMessage, ConflictPolicy, Kept, NodeChain, Required};
use crate::hooks::hook_health::HookHealth;
use crate::hooks::limits::HookLimits;
use crate::hooks::message::HookMessage;
use crate::hooks::registry::{FailurePolicy, HookServer, Snapshot, Stage};
use crate::metrics::{HookResult, Metrics};
use hook_api::owners::Owners;

/// One lazily connected channel: the hook server's endpoint, the uids allowed to serve it, its
/// serial number (so that a timed-out call drops only the channel it used) and the client.
struct Channel {
    endpoint: PathBuf,
    uids: Vec<u32>,
    serial: u64,
    client: Arc<HookClient>,
}

impl Channel {
    /// Whether this is the channel for `server`: compared as bytes, with no allocation (a
    /// `Path`'s own `==` parses both into components).
    fn serves(&self, server: &HookServer) -> bool {
        self.endpoint.as_os_str() == server.endpoint.as_os_str() && self.uids == allowed_uids(server)
    }
}

/// Calls hook servers; keeps one lazily connected channel per endpoint and set of allowed uids
/// (a handful per node: looked up in a list).
pub struct Dispatcher {
    channels: Mutex<Vec<Channel>>,
    serial: std::sync::atomic::AtomicU64,
    metrics: std::sync::Arc<Metrics>,
    limits: HookLimits,
    health: Arc<HookHealth>,
    chain: NodeChain,
}

impl Dispatcher {
    /// A dispatcher with no connections yet, recording into `metrics`; answers beyond `limits`
    /// are hook failures (`RESOURCE_EXHAUSTED`, naming the limit's flag).
    pub fn new(metrics: std::sync::Arc<Metrics>, limits: HookLimits) -> Self {
        Dispatcher {
            channels: Mutex::new(Vec::new()),
            serial: Default::default(),
            metrics,
            limits,
            health: Default::default(),
            chain: NodeChain::default(),
        }
    }

    /// This dispatcher with the node's chain settings (`--hook-conflict-policy`,
    /// `--required-hook-servers`; default: `Warn`, none).
    pub fn with_chain(mut self, chain: NodeChain) -> Self {
        self.chain = chain;
        self
    }

    /// The node's chain settings.
    pub fn chain(&self) -> &NodeChain {
        &self.chain
    }

    /// Each hook server's recent health (last success, last error), as this dispatcher's calls
    /// left it: what `/status` reports.
    pub fn health(&self) -> &Arc<HookHealth> {
        &self.health
    }

    /// Runs `stage` over the servers of `snapshot` registered for it, changing `req` with each
    /// answer, under the chain's rules ([`crate::hooks::chain`]): `required` names the servers
    /// the call's pod requires. `deadline` is when the kubelet's call expires, if it set one.
    /// `waited` grows by the time spent waiting on the servers' answers (their round trips,
    /// which the proxy's own time per call leaves out).
    ///
    /// Returns `req` as it was before the first answer that changed it, or `None` when no
    /// answer changed anything (then nothing was copied: the interceptor has no edits to look
    /// for).
    ///
    /// Errors (the request keeps the changes of the servers before): at a pre stage,
    /// `FAILED_PRECONDITION` when a required server is not registered (unless tolerated) or an
    /// answer conflicts with an earlier server's under conflict policy `Fail`; the failure of a
    /// required server, or of a server whose failure policy is `Fail` (at any stage).
    pub async fn run<R: HookMessage + ChainMessage>(
        &self,
        snapshot: &Snapshot,
        stage: Stage,
        req: &mut R,
        deadline: Option<Instant>,
        required: &Required,
        waited: &mut Duration,
    ) -> Result<Option<R>, Status> {
        if required.any() {
            self.check_missing(snapshot, stage, required)?;
        }
        let mut before = None;
        let mut owners = Owners::new();
        // Ownership matters only where a second server can change what a first one did: a stage
        // with one server (koordlet alone) lists no field changes.
        let chained = stage.is_pre() && snapshot.for_stage(stage).nth(1).is_some();
        let kept = req.answer_annotations().map(|a| Kept::of(a));
        for server in snapshot.for_stage(stage) {
            let started = Instant::now();
            let outcome = self.call(server, stage, req, deadline, waited).await;
            let result = match &outcome {
                Ok(_) => HookResult::Ok,
                Err(s) if s.code == Code::DEADLINE_EXCEEDED => HookResult::Timeout,
                Err(_) => HookResult::Error,
            };
            self.metrics.hook_call(stage.as_str(), &server.name, result, started.elapsed());
            let elapsed_us = started.elapsed().as_micros() as u64;
            match outcome {
                Ok(answer) => {
                    self.health.record_ok(server);
                    let changed = answer.is_some();
                    tracing::debug!(stage = stage.as_str(), server = %server.name, elapsed_us, changed, "hook called");
                    if let Some(answer) = answer {
                        if chained {
                            self.own(&mut owners, server, stage, req, &answer)?;
                        }
                        before.get_or_insert_with(|| req.clone());
                        req.apply(&answer);
                        if let (Some(kept), Some(annotations)) = (&kept, req.answer_annotations()) {
                            for key in kept.restore(annotations) {
                                tracing::warn!(stage = stage.as_str(), server = %server.name, annotation = key, "a hook server may not change this pod annotation; the pod's own value is kept");
                            }
                        }
                    }
                }
                Err(cause) => self.failed(server, stage, req, cause, elapsed_us, required)?,
            }
        }
        Ok(before)
    }

    /// Fails a pre stage when a server `required` names has no registration in `snapshot`, unless
    /// the pod tolerates that, or when the pod's list names too many servers (never tolerated);
    /// at a post stage only logs and counts. The message names at most
    /// [`crate::hooks::chain::NAMES_SHOWN`] servers and counts the rest.
    ///
    /// Errors: `FAILED_PRECONDITION` naming the servers and what requires them.
    fn check_missing(&self, snapshot: &Snapshot, stage: Stage, required: &Required) -> Result<(), Status> {
        if let Some(refusal) = required.refusal() {
            return self.refuse_requirement(stage, format!("{}: {refusal}", stage.as_str()));
        }
        let missing = required.missing(snapshot);
        if missing.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = missing
            .iter()
            .map(|(n, source)| format!("{} (required by {})", chain::shown(n), source.describe()))
            .collect();
        let message = format!(
            "{}: required hook server {} not registered (no registration file of that name)",
            stage.as_str(),
            chain::list_shown(&names)
        );
        if required.tolerate_missing {
            tracing::info!(stage = stage.as_str(), "{message}; the pod tolerates missing hook servers: going on");
            return Ok(());
        }
        self.refuse_requirement(stage, message)
    }

    /// A requirement that cannot be met (`message`): counted; a pre stage is refused, a post
    /// stage only logged.
    ///
    /// Errors: `FAILED_PRECONDITION` with `message`, at a pre stage.
    fn refuse_requirement(&self, stage: Stage, message: String) -> Result<(), Status> {
        self.metrics.required_missing(stage.as_str());
        if !stage.is_pre() {
            tracing::warn!(
                stage = stage.as_str(),
                "{message}; a post stage cannot fail the call (the runtime has done it)"
            );
            return Ok(());
        }
        tracing::warn!(stage = stage.as_str(), "{message}; refusing the call");
        Err(Status::new(Code::FAILED_PRECONDITION, message))
    }

    /// Takes ownership of the fields `server`'s `answer` changes in `req` and reports the
    /// conflicts with earlier servers: under the server's conflict policy (its
    /// `conflict-policy`, else the node's) `Warn`, one WARN line and one count per conflict.
    ///
    /// Errors: under `Fail`, `FAILED_PRECONDITION` naming every conflict (stage, field, both
    /// servers and values).
    fn own<R: ChainMessage>(
        &self,
        owners: &mut Owners,
        server: &HookServer,
        stage: Stage,
        req: &R,
        answer: &R::Answer,
    ) -> Result<(), Status> {
        let changes = req.changes(answer);
        let conflicts = owners.conflicts(&server.name, &changes);
        owners.record(&server.name, &changes);
        if conflicts.is_empty() {
            return Ok(());
        }
        let policy = server.conflict_policy.unwrap_or(self.chain.conflict_policy);
        for c in &conflicts {
            self.metrics.hook_conflict(stage.as_str(), c.field.name);
            let outcome = match policy {
                ConflictPolicy::Warn => format!("{}'s value is used", c.server),
                ConflictPolicy::Fail => "refusing the call".to_owned(),
            };
            tracing::warn!(stage = stage.as_str(), field = %c.field, owner = %c.owner, server = %c.server, "{} conflict: {c}; conflict-policy {policy}: {outcome}", stage.as_str());
        }
        if policy == ConflictPolicy::Warn {
            return Ok(());
        }
        let all: Vec<String> = conflicts.iter().map(ToString::to_string).collect();
        Err(Status::new(
            Code::FAILED_PRECONDITION,
            format!("{} conflict: {} (conflict-policy Fail of {})", stage.as_str(), all.join("; "), server.name),
        ))
    }

    /// A failed call of `server`: recorded for `/status`, logged; the call's refusal when the
    /// server's failure policy is `Fail` or the pod requires it at a pre stage.
    ///
    /// Errors: the failure's own code, with a message naming the stage, the server and its
    /// endpoint, the cause and the rule that refuses.
    fn failed<R: HookMessage>(
        &self,
        server: &HookServer,
        stage: Stage,
        req: &R,
        cause: Status,
        elapsed_us: u64,
        required: &Required,
    ) -> Result<(), Status> {
        // A server (or the proxy) that refuses a message for its size: say which size
        // (a container's request can be MiBs: kubelet copies its preStop handler
        // into an annotation).
        let request_bytes = req.encoded_len();
        // (grpc-go answers RESOURCE_EXHAUSTED, tonic OUT_OF_RANGE.)
        let too_large = cause.code == Code::RESOURCE_EXHAUSTED || cause.code == Code::OUT_OF_RANGE;
        let size = if too_large { format!(" (the request was {request_bytes} bytes)") } else { String::new() };
        self.health.record_failure(server, stage, &format!("{}{size}", cause.message));
        let message = format!(
            "{} hook server {} (unix://{}) failed: {}{size}",
            stage.as_str(),
            server.name,
            server.endpoint.display(),
            cause.message
        );
        if server.failure_policy == FailurePolicy::Fail {
            self.metrics.hook_refusal(stage.as_str(), &server.name);
            if required.source(&server.name).is_some() {
                self.metrics.required_failure(stage.as_str(), &server.name);
            }
            tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, request_bytes, "{message}; failure-policy Fail: refusing the call");
            return Err(Status::new(cause.code, format!("{message} (failure-policy Fail)")));
        }
        if let Some(source) = required.source(&server.name) {
            self.metrics.required_failure(stage.as_str(), &server.name);
            if stage.is_pre() {
                tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, request_bytes, "{message}; required by {}: refusing the call", source.describe());
                return Err(Status::new(cause.code, format!("{message} (required by {})", source.describe())));
            }
            tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, request_bytes, "{message}; required by {}, but a post stage cannot fail the call (the runtime has done it)", source.describe());
            return Ok(());
        }
        tracing::warn!(stage = stage.as_str(), server = %server.name, elapsed_us, request_bytes, "{message}; failure-policy Ignore: going on");
        Ok(())
    }

    /// One hook call: `req` to `server`'s `stage` RPC, within the server's timeout capped by
    /// `deadline`; returns the server's answer, checked against the answer limits, or `None`
    /// when the answer changes nothing (an echo, or empty fields: nothing to check or apply).
    ///
    /// Errors (the message starts with the code's name, e.g. `Unavailable: `, then the cause):
    /// `DEADLINE_EXCEEDED` "timed out after …" when the budget runs out (then the connection is
    /// let go); `UNAVAILABLE` when the server cannot be reached, runs as a uid not allowed, or
    /// fails the call; the server's own status when not OK; `RESOURCE_EXHAUSTED` naming
    /// `--max-hook-answer-bytes` for an answer over it (or the flag of a map limit exceeded);
    /// `INTERNAL` for an answer that is not one message of the answer type.
    async fn call<R: HookMessage>(
        &self,
        server: &HookServer,
        stage: Stage,
        req: &R,
        deadline: Option<Instant>,
        waited: &mut Duration,
    ) -> Result<Option<R::Answer>, Status> {
        let budget = match deadline {
            Some(d) => server.timeout.min(d.saturating_duration_since(Instant::now())),
            None => server.timeout,
        };
        if budget.is_zero() {
            return Err(Status::new(Code::DEADLINE_EXCEEDED, "no time left of the CRI call's deadline"));
        }
        let (serial, client) = self.channel(server);
        let rpc = stage.rpc_path().rsplit('/').next().unwrap_or_default();
        let call = client.call(stage.rpc_path(), budget, framed(req), rpc, self.limits.max_answer_bytes);
        let started = Instant::now();
        // On timeout the call's streams are dropped here (reset), before the channel is let go.
        let outcome = tokio::time::timeout(budget, call).await;
        *waited += started.elapsed();
        if outcome.is_err() || started.elapsed() >= budget {
            self.forget(serial);
        }
        let answer = match outcome {
            // An answer that changes nothing (koordlet's echo) is not decoded.
            Ok(Ok(answer)) => match message(&answer, self.limits.max_answer_bytes) {
                Ok(m) if req.unchanged_by_bytes(&m) => return Ok(None),
                Ok(m) => decode_message::<R::Answer>(&m),
                Err(s) => Err(s),
            },
            // Only the answer's size makes the exchange itself fail with RESOURCE_EXHAUSTED.
            Ok(Err(s)) if s.code == Code::RESOURCE_EXHAUSTED => Err(Status::new(
                Code::RESOURCE_EXHAUSTED,
                format!("{} (--max-hook-answer-bytes)", describe(s.code, &s.message)),
            )),
            Ok(Err(s)) => Err(Status::new(s.code, describe(s.code, &s.message))),
            Err(_) => return Err(timed_out(budget, "no answer")),
        };
        match answer {
            Ok(answer) if !req.changed_by(&answer) => Ok(None),
            Ok(answer) => {
                req.check(&answer, &self.limits).map_err(|why| Status::new(Code::RESOURCE_EXHAUSTED, why))?;
                Ok(Some(answer))
            }
            Err(s) if started.elapsed() >= budget => Err(timed_out(budget, &s.message)),
            Err(s) => Err(s),
        }
    }

    /// The channel to `server`'s endpoint, whose connections are checked against its
    /// `allowed-uids` (default: root and the proxy's own uid).
    /// Returns the channel's serial number with it (for [`Dispatcher::forget`]).
    fn channel(&self, server: &HookServer) -> (u64, Arc<HookClient>) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.iter().find(|c| c.serves(server)) {
            return (c.serial, c.client.clone());
        }
        let serial = self.serial.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let uids = allowed_uids(server).to_vec();
        let client = Arc::new(HookClient::new(&server.endpoint, uids.clone()));
        channels.push(Channel { endpoint: server.endpoint.clone(), uids, serial, client: client.clone() });
        (serial, client)
    }

    /// Drops the channel `serial` after a call on it timed out: the next call connects anew. A
    /// channel made since by another timed-out call is kept.
    fn forget(&self, serial: u64) {
        self.channels.lock().unwrap_or_else(|p| p.into_inner()).retain(|c| c.serial != serial);
    }

    /// Drops the channels no server in `snapshot` uses any more.
    pub fn prune(&self, snapshot: &Snapshot) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.retain(|c| snapshot.servers().iter().any(|s| c.serves(s)));
    }
}

/// The uids `server` may run as: its `allowed-uids`, else root and the proxy's own uid (read
/// once).
fn allowed_uids(server: &HookServer) -> &[u32] {
    static DEFAULT: std::sync::LazyLock<Vec<u32>> = std::sync::LazyLock::new(|| {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let own = unsafe { libc::geteuid() };
        let mut uids = vec![0, own];
        uids.dedup();
        uids
    });
    if server.allowed_uids.is_empty() {
        &DEFAULT
    } else {
        &server.allowed_uids
    }
}

/// `message` encoded as a unary gRPC body (uncompressed, see [`grpc::frame`]), in one buffer.
fn framed(message: &impl HookMessage) -> bytes::Bytes {
    let mut body = vec![0; 5];
    message.encode_into(&mut body);
    let len = (body.len() - 5) as u32;
    body[1..5].copy_from_slice(&len.to_be_bytes());
    body.into()
}

/// The message of a hook server's answer, decoded as `A`.
///
/// Errors (messages start with the code's name, see [`describe`]): the answer's status when
/// it is not OK (its message percent-decoded; a code outside gRPC's 0–16 is `UNKNOWN`); without
/// `grpc-status`, the code gRPC maps the HTTP status to, else `INTERNAL`; `RESOURCE_EXHAUSTED`
/// naming `--max-hook-answer-bytes` for a message over `limit` bytes once decompressed;
/// `INTERNAL` for a body that is not one message, or a message that does not decode as `A`.
#[cfg(test)]
fn decode<A: prost::Message + Default>(answer: &Answer, limit: usize) -> Result<A, Status> {
    decode_message(&message(answer, limit)?)
}

/// The one message of a hook server's answer, undecoded.
///
/// Errors: as [`decode`], but for the message's own decode.
fn message(answer: &Answer, limit: usize) -> Result<bytes::Bytes, Status> {
    match answer.grpc_status() {
        Some(s) if s.code == Code::OK => {}
        Some(s) => {
            let code = if s.code.0 > 16 { Code::UNKNOWN } else { s.code };
            return Err(Status::new(code, describe(code, &grpc::percent_decode(&s.message))));
        }
        None => {
            let http = answer.head.status();
            // gRPC's HTTP to gRPC status mapping (doc/http-grpc-status-mapping.md).
            let code = match http.as_u16() {
                200 | 400 => Code::INTERNAL,
                401 => Code(16),
                403 => Code(7),
                404 => Code::UNIMPLEMENTED,
                429 | 502 | 503 | 504 => Code::UNAVAILABLE,
                _ => Code::UNKNOWN,
            };
            return Err(Status::new(code, describe(code, &format!("answer without grpc-status (HTTP status {http})"))));
        }
    }
    let message = match answer.message(limit) {
        Ok(Some(m)) => m,
        Ok(None) => {
            let why = format!("answer is not one gRPC message ({} bytes of body)", answer.data.len());
            return Err(Status::new(Code::INTERNAL, describe(Code::INTERNAL, &why)));
        }
        Err(s) if s.code == Code::RESOURCE_EXHAUSTED => {
            return Err(Status::new(s.code, format!("{} (--max-hook-answer-bytes)", describe(s.code, &s.message))))
        }
        Err(s) => return Err(Status::new(s.code, describe(s.code, &s.message))),
    };
    Ok(message)
}

/// An answer's message decoded as `A`.
///
/// Errors: `INTERNAL` "answer does not decode as …" naming the type and prost's error.
fn decode_message<A: prost::Message + Default>(message: &[u8]) -> Result<A, Status> {
    A::decode(message).map_err(|e| {
        let name = std::any::type_name::<A>().rsplit("::").next().unwrap_or_default();
        Status::new(Code::INTERNAL, describe(Code::INTERNAL, &format!("answer does not decode as {name}: {e}")))
    })
}

fn timed_out(budget: Duration, detail: &str) -> Status {
    Status::new(Code::DEADLINE_EXCEEDED, format!("timed out after {budget:?} ({detail})"))
}

/// `<CodeName>: <message>`, the code named in CamelCase (`PermissionDenied`), as hook failures
/// have always been described (it was tonic's `Debug` of the code).
fn describe(code: Code, message: &str) -> String {
    // From the canonical name (`PERMISSION_DENIED`); codes outside 0..=16 read as `Unknown`.
    let canonical = if code.0 <= 16 { code.name() } else { Code::UNKNOWN.name() };
    let mut name = String::with_capacity(canonical.len());
    for word in canonical.split('_') {
        let (first, rest) = word.split_at(1);
        name.push_str(first);
        name.push_str(&rest.to_ascii_lowercase());
    }
    format!("{name}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use hook_api::v1alpha1::{PodSandboxHookRequest, PodSandboxHookResponse};
    use http::{HeaderMap, Response};
    use prost::Message;

    fn answer(http: u16, head: &[(&str, &str)], data: Bytes, trailers: Option<&[(&str, &str)]>) -> Answer {
        let map = |kv: &[(&str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in kv {
                h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap());
            }
            h
        };
        let mut resp = Response::new(());
        *resp.status_mut() = http::StatusCode::from_u16(http).unwrap();
        *resp.headers_mut() = map(head);
        Answer { head: resp, data, trailers: trailers.map(map) }
    }

    fn pod_answer() -> PodSandboxHookResponse {
        PodSandboxHookResponse { labels: [("a".to_string(), "b".to_string())].into(), ..Default::default() }
    }

    #[test]
    fn an_ok_answer_decodes() {
        let ok = answer(200, &[], grpc::frame(&pod_answer().encode_to_vec()), Some(&[("grpc-status", "0")]));
        assert_eq!(decode::<PodSandboxHookResponse>(&ok, 1 << 20).unwrap(), pod_answer());
    }

    #[test]
    fn an_error_status_keeps_its_code_and_decoded_message() {
        let denied =
            answer(200, &[("grpc-status", "7"), ("grpc-message", "quota 100%25 used %E2%9C%97")], Bytes::new(), None);
        let err = decode::<PodSandboxHookResponse>(&denied, 1 << 20).unwrap_err();
        assert_eq!(err, Status::new(Code(7), "PermissionDenied: quota 100% used ✗"));
        let odd = answer(200, &[], Bytes::new(), Some(&[("grpc-status", "99"), ("grpc-message", "what")]));
        assert_eq!(
            decode::<PodSandboxHookResponse>(&odd, 1 << 20).unwrap_err(),
            Status::new(Code::UNKNOWN, "Unknown: what")
        );
    }

    #[test]
    fn answers_that_are_not_one_message_of_the_type_are_internal() {
        let ok = Some(&[("grpc-status", "0")][..]);
        let cases = [
            (answer(200, &[], Bytes::new(), ok), "not one gRPC message"),
            (answer(200, &[], grpc::frame(&[0xff, 0xff]), ok), "does not decode as PodSandboxHookResponse"),
            (answer(200, &[], grpc::frame(b""), None), "without grpc-status"),
        ];
        for (a, want) in cases {
            let err = decode::<PodSandboxHookResponse>(&a, 1 << 20).unwrap_err();
            assert_eq!(err.code, Code::INTERNAL, "{err}");
            assert!(err.message.starts_with("Internal: ") && err.message.contains(want), "{err}");
        }
        let not_found = decode::<PodSandboxHookResponse>(&answer(404, &[], Bytes::new(), None), 1 << 20).unwrap_err();
        assert_eq!(not_found.code, Code::UNIMPLEMENTED, "{not_found}");
        assert!(not_found.message.contains("HTTP status 404"), "{not_found}");
    }

    #[test]
    fn an_answer_over_the_limit_names_the_flag() {
        let big = PodSandboxHookResponse { labels: [("a".to_string(), "x".repeat(2000))].into(), ..Default::default() };
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gzip, &big.encode_to_vec()).unwrap();
        let data = gzip.finish().unwrap();
        let mut body = vec![1];
        body.extend_from_slice(&(data.len() as u32).to_be_bytes());
        body.extend_from_slice(&data);
        let a = answer(200, &[("grpc-encoding", "gzip")], body.into(), Some(&[("grpc-status", "0")]));
        assert_eq!(
            decode::<PodSandboxHookResponse>(&a, 4096).unwrap(),
            big,
            "compressed, within the limit once decompressed"
        );
        let err = decode::<PodSandboxHookResponse>(&a, 1000).unwrap_err();
        assert_eq!(err.code, Code::RESOURCE_EXHAUSTED);
        assert!(
            err.message.starts_with("ResourceExhausted: ") && err.message.ends_with("(--max-hook-answer-bytes)"),
            "{err}"
        );
    }

    #[test]
    fn codes_are_described_in_camel_case() {
        assert_eq!(describe(Code::OK, "m"), "Ok: m");
        assert_eq!(describe(Code(7), "m"), "PermissionDenied: m");
        assert_eq!(describe(Code::DEADLINE_EXCEEDED, "m"), "DeadlineExceeded: m");
        assert_eq!(describe(Code(16), "m"), "Unauthenticated: m");
        assert_eq!(describe(Code(42), "m"), "Unknown: m");
    }

    #[test]
    fn a_framed_request_is_the_message_behind_its_prefix() {
        let req = PodSandboxHookRequest { runtime_handler: "runc".into(), ..Default::default() };
        assert_eq!(framed(&req), grpc::frame(&req.encode_to_vec()));
    }
}
