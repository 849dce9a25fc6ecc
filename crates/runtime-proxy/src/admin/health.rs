//! The backends' health, checked in the background: what `/healthz` and `runtime_proxy_backend_up`
//! report.
//!
//! # Checks
//!
//! Every [`CHECK_INTERVAL`] each backend endpoint — the runtime
//! (`--remote-runtime-service-endpoint`) and, when it is another socket, the image service
//! (`--remote-image-service-endpoint`) — is checked, whether or not CRI calls flow, and each check
//! gets at most [`CHECK_TIMEOUT`]:
//!
//! * **CRI mode**: a `/runtime.v1.RuntimeService/Version` call over HTTP/2. Any gRPC answer counts
//!   (`UNIMPLEMENTED` from a runtime without CRI v1, or from an image-only server, included): the
//!   socket accepts connections and speaks gRPC.
//! * **Docker mode**: `GET /_ping` over HTTP/1.1, answered `200 OK` with body `OK`.
//!
//! # Connections
//!
//! One connection per endpoint is kept for the checks (the checker's own: the CRI connections
//! stay untouched). When a check on it fails in any way the connection is dropped and the same
//! check is made at once on a fresh one, so a dead kept connection never hides a dead backend and
//! a backend that came back is seen on the next check.
//!
//! # Failures
//!
//! A failure is named ([`Trouble`]): the socket missing (`ENOENT`), nothing listening
//! (`ECONNREFUSED` on a socket), permission denied (`EACCES`), a path that is not a socket (a
//! regular file, a directory), no answer in time, or a backend of the **wrong kind**: in CRI
//! mode a socket that answers HTTP/1.1 (dockerd's Engine API), in Docker mode one that speaks
//! HTTP/2 gRPC (containerd). To tell those apart, a failed check tries the other protocol on a
//! connection of its own.
//!
//! # Logging
//!
//! Each change of an endpoint's verdict is logged once: ERROR for a wrong kind, permission denied
//! or not a socket; WARN for a backend gone or not answering; INFO for a socket not there yet
//! (never up so far), repeated at WARN while it lasts ([`super::missing_socket`]), and for a
//! backend up.

use std::fmt;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::sync::watch;

use crate::cli::BackendRuntimeMode;
use crate::metrics::Metrics;

/// Time from the start of one check of an endpoint to the start of the next: 500 ms.
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// Longest one check may take, connection and answer included, before the endpoint counts as
/// not answering: 1 s. With [`CHECK_INTERVAL`], a backend that goes away or comes back is seen
/// within 1.5 s.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// The CRI call a check makes in CRI mode: cheap, served by every CRI runtime.
const VERSION_PATH: &str = "/runtime.v1.RuntimeService/Version";

/// Most answer bytes a check reads (a Version answer or `_ping` body is a few dozen).
const MAX_ANSWER: usize = 64 << 10;

/// Which backend endpoint a check is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// `--remote-runtime-service-endpoint` (dockerd's socket in Docker mode).
    Runtime,
    /// `--remote-image-service-endpoint`, when it names another socket than the runtime's.
    Image,
}

impl Role {
    /// The `endpoint` label and the word `/healthz` and the log use: `runtime` or `image`.
    pub fn label(self) -> &'static str {
        match self {
            Role::Runtime => "runtime",
            Role::Image => "image",
        }
    }
}

/// The protocol an endpoint must speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// CRI: gRPC over HTTP/2 (containerd, CRI-O).
    Grpc,
    /// The Docker Engine API: HTTP/1.1 (dockerd).
    Docker,
}

/// Why an endpoint is down, for the log level and for tests; the words are in
/// [`Verdict::Down`]'s reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trouble {
    /// Nothing at the socket path (`ENOENT`).
    Missing,
    /// A socket nobody accepts connections on (`ECONNREFUSED`): its process is gone.
    Refused,
    /// The proxy may not connect (`EACCES`, `EPERM`).
    PermissionDenied,
    /// The path is a regular file, a directory or anything else but a socket.
    NotASocket,
    /// The socket speaks the other mode's protocol (dockerd in CRI mode, a CRI runtime in Docker
    /// mode).
    WrongKind,
    /// Connected, but no answer within [`CHECK_TIMEOUT`].
    NoAnswer,
    /// An answer, but not the one expected (a broken connection, an HTTP error, another protocol).
    Protocol,
    /// Any other error connecting.
    Unreachable,
}

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The endpoint answered as it should.
    Up,
    /// It did not.
    Down {
        /// What went wrong.
        trouble: Trouble,
        /// Why, in words: the OS error by name, what is at the path, what the socket speaks.
        reason: String,
    },
}

impl Verdict {
    fn down(trouble: Trouble, reason: impl Into<String>) -> Verdict {
        Verdict::Down { trouble, reason: reason.into() }
    }

    /// True for [`Verdict::Up`].
    pub fn is_up(&self) -> bool {
        matches!(self, Verdict::Up)
    }
}

/// One endpoint to check.
#[derive(Clone, Debug)]
pub struct Target {
    /// Which endpoint this is.
    pub role: Role,
    /// Its unix socket.
    pub path: PathBuf,
    /// What it must speak.
    pub protocol: Protocol,
}

impl fmt::Display for Target {
    /// "runtime endpoint unix://PATH", as `/healthz` names it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} endpoint unix://{}", self.role.label(), self.path.display())
    }
}

/// The endpoints' latest verdicts, kept up to date by [`Health::run`].
pub struct Health {
    endpoints: Vec<Endpoint>,
    metrics: Arc<Metrics>,
}

struct Endpoint {
    target: Target,
    /// `None` until the first check ends.
    verdict: watch::Sender<Option<Verdict>>,
}

impl Health {
    /// The backend endpoints of `mode`: the `runtime` socket (`--remote-runtime-service-endpoint`),
    /// in the mode's protocol, and in CRI mode the `image` socket
    /// (`--remote-image-service-endpoint`, the runtime's when not given) when it is another socket
    /// (not merely another spelling of the runtime's, [`crate::listener::same_socket`]).
    pub fn for_backends(mode: BackendRuntimeMode, runtime: &Path, image: &Path, metrics: Arc<Metrics>) -> Arc<Health> {
        let protocol = match mode {
            BackendRuntimeMode::Docker => Protocol::Docker,
            BackendRuntimeMode::Containerd => Protocol::Grpc,
        };
        let mut targets = vec![Target { role: Role::Runtime, path: runtime.to_path_buf(), protocol }];
        if protocol == Protocol::Grpc && !crate::listener::same_socket(image, runtime) {
            targets.push(Target { role: Role::Image, path: image.to_path_buf(), protocol });
        }
        Health::new(targets, metrics)
    }

    /// Health for `targets`, none checked yet.
    pub fn new(targets: Vec<Target>, metrics: Arc<Metrics>) -> Arc<Health> {
        let endpoints =
            targets.into_iter().map(|target| Endpoint { target, verdict: watch::Sender::new(None) }).collect();
        Arc::new(Health { endpoints, metrics })
    }

    /// Checks every endpoint every [`CHECK_INTERVAL`], for ever (until the task is dropped),
    /// recording each verdict and logging its changes; the first checks start at once.
    pub async fn run(self: Arc<Health>) {
        // A set of its own: dropping this future (its task aborted) aborts every check.
        let mut checks = tokio::task::JoinSet::new();
        for i in 0..self.endpoints.len() {
            let health = self.clone();
            checks.spawn(async move { health.watch(i).await });
        }
        while checks.join_next().await.is_some() {}
    }

    async fn watch(&self, i: usize) {
        let Some(endpoint) = self.endpoints.get(i) else { return };
        let target = &endpoint.target;
        let mut checker = Checker { target: target.clone(), kept: None };
        let mut ticks = tokio::time::interval(CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ever_up = false;
        let mut still_missing = crate::admin::missing_socket::StillMissing::default();
        loop {
            ticks.tick().await;
            let verdict = checker.check().await;
            let previous = endpoint.verdict.borrow().clone();
            log_change(target, previous.as_ref(), &verdict, ever_up);
            still_missing.observe(target, &verdict, ever_up, std::time::Instant::now());
            ever_up |= verdict.is_up();
            self.metrics.backend_endpoint_up(target.role.label(), verdict.is_up());
            endpoint.verdict.send_replace(Some(verdict));
        }
    }

    /// True when every endpoint passed its latest check (false before the first).
    pub fn all_up(&self) -> bool {
        self.endpoints.iter().all(|e| e.verdict.borrow().as_ref().is_some_and(Verdict::is_up))
    }

    /// The latest verdict of each endpoint (`None`: not checked yet).
    pub fn verdicts(&self) -> Vec<(Target, Option<Verdict>)> {
        self.endpoints.iter().map(|e| (e.target.clone(), e.verdict.borrow().clone())).collect()
    }

    /// What `/healthz` answers: `200` and `ok`, or `503` and one line per endpoint that is down
    /// ("runtime endpoint unix://PATH: REASON"). Right after start-up it waits for the first
    /// checks to end (at most [`CHECK_TIMEOUT`] and a little more).
    pub async fn healthz(&self) -> (u16, String) {
        let first = async {
            for e in &self.endpoints {
                let _ = e.verdict.subscribe().wait_for(Option::is_some).await;
            }
        };
        let _ = tokio::time::timeout(CHECK_TIMEOUT + Duration::from_millis(200), first).await;
        let mut down = String::new();
        for (target, verdict) in self.verdicts() {
            match verdict {
                Some(Verdict::Up) => {}
                Some(Verdict::Down { reason, .. }) => down.push_str(&format!("{target}: {reason}\n")),
                None => down.push_str(&format!("{target}: not checked yet\n")),
            }
        }
        if down.is_empty() {
            (200, "ok\n".to_owned())
        } else {
            (503, down)
        }
    }
}

/// Logs a change of verdict once, at the level its kind deserves.
fn log_change(target: &Target, previous: Option<&Verdict>, verdict: &Verdict, ever_up: bool) {
    if previous == Some(verdict) {
        return;
    }
    let (endpoint, socket) = (target.role.label(), target.path.display());
    match verdict {
        Verdict::Up if ever_up => tracing::info!(endpoint, socket = %socket, "backend up again"),
        Verdict::Up => tracing::info!(endpoint, socket = %socket, "backend up"),
        Verdict::Down { trouble, reason } => match trouble {
            Trouble::Missing if !ever_up => {
                tracing::info!(endpoint, socket = %socket, "backend socket not there yet: {reason}")
            }
            Trouble::WrongKind => tracing::error!(endpoint, socket = %socket, "backend of the wrong kind: {reason}"),
            Trouble::PermissionDenied | Trouble::NotASocket => {
                tracing::error!(endpoint, socket = %socket, "backend socket unusable: {reason}")
            }
            _ => tracing::warn!(endpoint, socket = %socket, "backend down: {reason}"),
        },
    }
}

/// Checks one endpoint, keeping one connection to it between checks.
struct Checker {
    target: Target,
    kept: Option<Kept>,
}

/// The connection kept between checks, and its task (aborted when dropped).
struct Kept {
    sender: Sender,
    _task: AbortOnDrop,
}

/// A kept connection's sending side, in the endpoint's protocol.
enum Sender {
    Grpc(h2::client::SendRequest<Bytes>),
    Docker(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a backend answered a probe in the protocol asked.
#[derive(Debug)]
enum Answer {
    /// The expected answer (Docker: the `Api-Version` header, if any).
    Expected(Option<String>),
    /// The protocol, but not the expected answer (an HTTP status, a body).
    Unexpected(String),
}

impl Checker {
    /// One check within [`CHECK_TIMEOUT`].
    async fn check(&mut self) -> Verdict {
        match tokio::time::timeout(CHECK_TIMEOUT, self.check_now()).await {
            Ok(verdict) => verdict,
            Err(_) => {
                self.kept = None;
                let asked = match self.target.protocol {
                    Protocol::Grpc => "a CRI Version call",
                    Protocol::Docker => "GET /_ping",
                };
                Verdict::down(
                    Trouble::NoAnswer,
                    format!("accepts connections but gave no answer to {asked} within {CHECK_TIMEOUT:?}"),
                )
            }
        }
    }

    async fn check_now(&mut self) -> Verdict {
        let on_kept = match self.kept.as_mut().map(|k| &mut k.sender) {
            Some(Sender::Grpc(sender)) => grpc_version(sender).await.is_ok_and(|a| matches!(a, Answer::Expected(_))),
            Some(Sender::Docker(sender)) => docker_ping(sender).await.is_ok_and(|a| matches!(a, Answer::Expected(_))),
            None => false,
        };
        if on_kept {
            return Verdict::Up;
        }
        // Whatever went wrong on the kept connection (the backend restarted, or is gone), the
        // verdict is a fresh connection's.
        self.kept = None;
        let path = &self.target.path;
        let stream = match UnixStream::connect(path).await {
            Ok(s) => s,
            Err(e) => return connect_failure(path, &e),
        };
        match self.target.protocol {
            Protocol::Grpc => match grpc_open(stream).await {
                Ok((mut sender, task)) => match grpc_version(&mut sender).await {
                    Ok(Answer::Expected(_)) => {
                        self.kept = Some(Kept { sender: Sender::Grpc(sender), _task: task });
                        Verdict::Up
                    }
                    Ok(Answer::Unexpected(what)) => {
                        Verdict::down(Trouble::Protocol, format!("speaks HTTP/2 but not gRPC: {what}"))
                    }
                    Err(e) => self.identify(e).await,
                },
                Err(e) => self.identify(e).await,
            },
            Protocol::Docker => match docker_open(stream).await {
                Ok((mut sender, task)) => match docker_ping(&mut sender).await {
                    Ok(Answer::Expected(_)) => {
                        self.kept = Some(Kept { sender: Sender::Docker(sender), _task: task });
                        Verdict::Up
                    }
                    Ok(Answer::Unexpected(what)) => {
                        Verdict::down(Trouble::Protocol, format!("answers GET /_ping with {what}, not dockerd's OK"))
                    }
                    Err(e) => self.identify(e).await,
                },
                Err(e) => self.identify(e).await,
            },
        }
    }

    /// After `failure` in the expected protocol: tries the other one on a connection of its
    /// own, to name a backend of the wrong kind; else the failure.
    async fn identify(&self, failure: String) -> Verdict {
        let path = &self.target.path;
        let Ok(stream) = UnixStream::connect(path).await else { return Verdict::down(Trouble::Protocol, failure) };
        match self.target.protocol {
            Protocol::Grpc => match docker_open(stream).await {
                Ok((mut sender, _task)) => match docker_ping(&mut sender).await {
                    Ok(Answer::Expected(api)) => Verdict::down(
                        Trouble::WrongKind,
                        format!(
                            "speaks the Docker Engine API (GET /_ping: OK{}), not CRI gRPC: use --backend-runtime-mode Docker",
                            api.map(|v| format!(", API {v}")).unwrap_or_default()
                        ),
                    ),
                    Ok(Answer::Unexpected(what)) => Verdict::down(
                        Trouble::WrongKind,
                        format!("speaks HTTP/1.1 (GET /_ping: {what}), not HTTP/2 gRPC: not a CRI runtime's socket"),
                    ),
                    Err(_) => Verdict::down(Trouble::Protocol, format!("no gRPC answer: {failure}")),
                },
                Err(_) => Verdict::down(Trouble::Protocol, format!("no gRPC answer: {failure}")),
            },
            Protocol::Docker => match grpc_open(stream).await {
                Ok((mut sender, _task)) => match grpc_version(&mut sender).await {
                    Ok(Answer::Expected(_)) => Verdict::down(
                        Trouble::WrongKind,
                        "speaks HTTP/2 gRPC (a CRI runtime such as containerd), not the Docker Engine API: use --backend-runtime-mode Containerd",
                    ),
                    Ok(Answer::Unexpected(what)) => {
                        Verdict::down(Trouble::WrongKind, format!("speaks HTTP/2 ({what}), not the Docker Engine API (HTTP/1.1)"))
                    }
                    Err(_) => Verdict::down(Trouble::Protocol, format!("no Docker Engine API answer: {failure}")),
                },
                Err(_) => Verdict::down(Trouble::Protocol, format!("no Docker Engine API answer: {failure}")),
            },
        }
    }
}

/// The verdict for a connection to `path` that failed with `err`: the OS error by name, and
/// for `ECONNREFUSED` whether the path is a socket at all (connecting to a regular file or a
/// directory fails that way too).
fn connect_failure(path: &Path, err: &io::Error) -> Verdict {
    let errno = err.raw_os_error().unwrap_or(0);
    let name = errno_name(errno);
    match errno {
        libc::ENOENT => Verdict::down(Trouble::Missing, format!("no such socket ({name})")),
        libc::EACCES | libc::EPERM => {
            // SAFETY: geteuid(2) has no preconditions and cannot fail.
            let uid = unsafe { libc::geteuid() };
            let what = match std::fs::metadata(path) {
                Ok(m) => format!("the socket's mode is {:04o}, owner {}:{}", m.mode() & 0o7777, m.uid(), m.gid()),
                Err(_) => "a directory on its path may not be searched".to_owned(),
            };
            Verdict::down(Trouble::PermissionDenied, format!("permission denied ({name}) for uid {uid}: {what}"))
        }
        libc::ECONNREFUSED | libc::ENOTSOCK => match std::fs::metadata(path) {
            Ok(m) if !m.file_type().is_socket() => {
                Verdict::down(Trouble::NotASocket, format!("is {}, not a socket (connect: {name})", file_kind(&m)))
            }
            _ => Verdict::down(
                Trouble::Refused,
                format!("nothing accepts connections on the socket ({name}): its server is gone"),
            ),
        },
        _ => Verdict::down(Trouble::Unreachable, format!("cannot connect: {err}")),
    }
}

/// "a regular file", "a directory", …, for a path that is not a socket.
fn file_kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a socket"
    }
}

/// The symbolic name of the errors a connect can end with, with its text:
/// "EACCES: Permission denied".
fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::ENOTDIR => "ENOTDIR",
        libc::ELOOP => "ELOOP",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::EAGAIN => "EAGAIN",
        _ => return io::Error::from_raw_os_error(errno).to_string(),
    };
    let text = io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or_default().to_owned();
    format!("{name}: {text}")
}

/// An HTTP/2 client connection on `stream`, its task spawned.
async fn grpc_open(stream: UnixStream) -> Result<(h2::client::SendRequest<Bytes>, AbortOnDrop), String> {
    let (sender, conn) = h2::client::handshake(stream).await.map_err(|e| format!("HTTP/2 handshake failed: {e}"))?;
    let task = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    Ok((sender, task))
}

/// One CRI Version call: `Expected` for any gRPC answer (whatever its status), `Unexpected` for
/// an HTTP/2 answer that is not gRPC.
///
/// Errors: the connection failed or was closed (an HTTP/1.1 server answers the HTTP/2 preface
/// with bytes that are no HTTP/2 frame).
async fn grpc_version(sender: &mut h2::client::SendRequest<Bytes>) -> Result<Answer, String> {
    let ready = sender.clone().ready().await.map_err(|e| format!("HTTP/2 connection failed: {e}"))?;
    *sender = ready;
    let head = http::Request::post(format!("http://localhost{VERSION_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("user-agent", "runtime-proxy-health")
        .body(())
        .map_err(|e| e.to_string())?;
    let (response, mut body) = sender.send_request(head, false).map_err(|e| format!("HTTP/2 request failed: {e}"))?;
    // An empty VersionRequest: a gRPC message of 0 bytes.
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), true).map_err(|e| format!("HTTP/2 request failed: {e}"))?;
    let response = response.await.map_err(|e| format!("no HTTP/2 answer: {e}"))?;
    let (head, mut recv) = response.into_parts();
    let grpc = head
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/grpc"));
    let mut read = 0;
    while let Some(chunk) = recv.data().await {
        let chunk = chunk.map_err(|e| format!("HTTP/2 answer broken: {e}"))?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        read += chunk.len();
        if read > MAX_ANSWER {
            return Ok(Answer::Unexpected(format!("an answer of more than {MAX_ANSWER} bytes")));
        }
    }
    let trailers = recv.trailers().await.map_err(|e| format!("HTTP/2 answer broken: {e}"))?;
    let status = trailers.as_ref().and_then(|t| t.get("grpc-status")).or_else(|| head.headers.get("grpc-status"));
    if head.status == http::StatusCode::OK && (grpc || status.is_some()) {
        Ok(Answer::Expected(None))
    } else {
        Ok(Answer::Unexpected(format!("HTTP status {} to {VERSION_PATH}", head.status)))
    }
}

/// An HTTP/1.1 client connection on `stream`, its task spawned.
async fn docker_open(
    stream: UnixStream,
) -> Result<(hyper::client::conn::http1::SendRequest<Empty<Bytes>>, AbortOnDrop), String> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake failed: {e}"))?;
    let task = AbortOnDrop(tokio::spawn(async move {
        let _ = conn.await;
    }));
    Ok((sender, task))
}

/// `GET /_ping`: `Expected` (with the `Api-Version` header) for `200` and body `OK`,
/// `Unexpected` for any other HTTP/1.x answer.
///
/// Errors: the connection failed or was closed, or the answer is not HTTP/1.x (an HTTP/2 server
/// answers with its SETTINGS frame, then closes).
async fn docker_ping(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) -> Result<Answer, String> {
    sender.ready().await.map_err(|e| format!("HTTP/1.1 connection failed: {e}"))?;
    let req = http::Request::get("/_ping")
        .header(http::header::HOST, "docker")
        .header(http::header::USER_AGENT, "runtime-proxy-health")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| format!("no HTTP/1.1 answer to GET /_ping: {e}"))?;
    let status = resp.status();
    let api = resp.headers().get("api-version").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("GET /_ping: answer broken: {e}"))?
        .to_bytes();
    if status == http::StatusCode::OK && body.as_ref() == b"OK" {
        Ok(Answer::Expected(api))
    } else {
        Ok(Answer::Unexpected(status.to_string()))
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
