//! Proxy mode: the `runtime.v1alpha1.RuntimeHookService` server and its registration file.
//!
//! All seven RPCs are served; each runs the framework for its stage (a stage no plugin wants is
//! answered with the plain echo, as koordlet answers it). The server listens on a unix socket
//! and registers itself the way koordlet does, with a file in the hook config directory that
//! runtime-proxy (or koord-runtime-proxy) watches:
//!
//! ```json
//! { "remote-endpoint": "/var/run/runtime-hooks/runtime-hooks.sock",
//!   "failure-policy": "Ignore",
//!   "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"] }
//! ```
//!
//! `runtime-hooks` lists the stages the enabled plugins need, in a fixed order. Unlike koordlet
//! (which truncates and rewrites in place) the file is written to a hidden temp file and renamed,
//! so a reader never sees half of it. While the server runs the file is checked every second
//! and written again when it is missing, names another endpoint or is unreadable (each takeover
//! from another endpoint logged at warn with both endpoints). At shutdown, before the server
//! stops (so the proxy stops calling a server that is going away), it is removed — only if it
//! still names this server's endpoint. See [`Registration`].

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use hook_api::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse,
};
use hook_api::RuntimeHookService;
use tonic::{Request, Response, Status};

use crate::framework::Framework;
use crate::plugin::{FailurePolicy, Stage};

/// The hook service: every RPC is the framework at that RPC's stage.
#[derive(Clone, Debug)]
pub struct HookService {
    framework: Arc<Framework>,
}

impl HookService {
    /// A service over `framework`.
    pub fn new(framework: Arc<Framework>) -> HookService {
        HookService { framework }
    }

    /// The gRPC service for it ([`crate::proxy::hook_wire::HookServer`]): requests decoded without trusting their
    /// strings to be UTF-8, taken and answered up to [`MAX_MESSAGE_BYTES`](crate::proxy::hook_wire::MAX_MESSAGE_BYTES)
    /// (tonic's default, 4 MiB, would refuse a container whose kubelet request is larger: the proxy then applies its
    /// failure policy, and under `Ignore` the container runs without its values).
    pub fn into_server(self) -> crate::proxy::hook_wire::HookServer {
        crate::proxy::hook_wire::HookServer::new(self.framework)
    }

    fn pod(
        &self,
        stage: Stage,
        req: Request<PodSandboxHookRequest>,
    ) -> Result<Response<PodSandboxHookResponse>, Status> {
        self.framework.pod_hook_owned(stage, req.into_inner()).map(Response::new).map_err(Into::into)
    }

    fn container(
        &self,
        stage: Stage,
        req: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.framework.container_hook_owned(stage, req.into_inner()).map(Response::new).map_err(Into::into)
    }
}

type PodAnswer = Result<Response<PodSandboxHookResponse>, Status>;
type ContainerAnswer = Result<Response<ContainerResourceHookResponse>, Status>;

#[tonic::async_trait]
impl RuntimeHookService for HookService {
    async fn pre_run_pod_sandbox_hook(&self, r: Request<PodSandboxHookRequest>) -> PodAnswer {
        self.pod(Stage::PreRunPodSandbox, r)
    }
    async fn post_stop_pod_sandbox_hook(&self, r: Request<PodSandboxHookRequest>) -> PodAnswer {
        self.pod(Stage::PostStopPodSandbox, r)
    }
    async fn pre_create_container_hook(&self, r: Request<ContainerResourceHookRequest>) -> ContainerAnswer {
        self.container(Stage::PreCreateContainer, r)
    }
    async fn pre_start_container_hook(&self, r: Request<ContainerResourceHookRequest>) -> ContainerAnswer {
        self.container(Stage::PreStartContainer, r)
    }
    async fn post_start_container_hook(&self, r: Request<ContainerResourceHookRequest>) -> ContainerAnswer {
        self.container(Stage::PostStartContainer, r)
    }
    async fn post_stop_container_hook(&self, r: Request<ContainerResourceHookRequest>) -> ContainerAnswer {
        self.container(Stage::PostStopContainer, r)
    }
    async fn pre_update_container_resources_hook(&self, r: Request<ContainerResourceHookRequest>) -> ContainerAnswer {
        self.container(Stage::PreUpdateContainerResources, r)
    }
}

/// How often a running server checks its registration file (and restores it).
pub const REGISTRATION_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Longest `--hook-name` accepted, in bytes: `<name>.json` and the temp file written before the
/// rename (`.<name>.json.tmp-<pid>`, 21 bytes more at most) must fit in one file name (255
/// bytes on Linux), with room to spare.
pub const MAX_HOOK_NAME_LEN: usize = 200;

/// Checks a registration name (`--hook-name`): it becomes the file name `<name>.json` in the hook
/// config directory, so it must be a plain, visible file name.
///
/// Errors (the message says which rule): empty; contains `/` or NUL; is `.` or `..`; starts with
/// `.` (a hidden file, which runtime-proxy and koord-runtime-proxy never read); longer than
/// [`MAX_HOOK_NAME_LEN`] bytes.
pub fn check_hook_name(name: &str) -> Result<(), String> {
    let problem = if name.is_empty() {
        "must not be empty"
    } else if name.contains('/') {
        "must be a plain file name, without '/'"
    } else if name.contains('\0') {
        "must not contain NUL"
    } else if name == "." || name == ".." {
        "must be a plain file name, not . or .."
    } else if name.starts_with('.') {
        "must not start with '.': a hidden file is never read by the proxy"
    } else if name.len() > MAX_HOOK_NAME_LEN {
        "is too long (at most 200 bytes)"
    } else {
        return Ok(());
    };
    Err(format!("hook name {name:?} {problem} (it names the registration file <NAME>.json)"))
}

/// `--hook-name`'s value parser: [`check_hook_name`], then the name itself.
///
/// Errors: see [`check_hook_name`].
pub fn parse_hook_name(name: &str) -> Result<String, String> {
    check_hook_name(name).map(|()| name.to_owned())
}

/// Who the registration file says is registered under our name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The file names our endpoint.
    Us,
    /// There is no file; the directory exists.
    Missing,
    /// The hook config directory itself is missing (or is not a directory).
    NoDir,
    /// The file names another endpoint: its `remote-endpoint`, as written there.
    Other(String),
    /// The file cannot be read or parsed, or has no `remote-endpoint` string: why.
    Unreadable(String),
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Us => f.write_str("us"),
            Holder::Missing => f.write_str("no file"),
            Holder::NoDir => f.write_str("no directory"),
            Holder::Other(endpoint) => write!(f, "{endpoint}"),
            Holder::Unreadable(why) => write!(f, "unreadable file ({why})"),
        }
    }
}

/// What one [`Registration::check`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// The file names us: nothing written.
    Ours,
    /// The file was missing, named another endpoint or was unreadable (the holder found); it
    /// has been rewritten with our registration.
    Restored(Holder),
    /// The file is not ours and could not be rewritten (the holder found, and why); the next
    /// check tries again.
    Failed(Holder, String),
}

/// Our registration: the file `<dir>/<name>.json` naming our endpoint, the way koordlet
/// registers (its JSON keys), kept in place while we run and removed at exit only if it still
/// names us.
///
/// * [`Registration::register`] (start-up) creates the directory if needed and writes the file.
/// * [`Registration::keep`] (while running) checks the file every
///   [`REGISTRATION_CHECK_INTERVAL`] and rewrites it when it is missing, names another endpoint
///   or cannot be parsed. Taking it over from another endpoint (another instance with the same
///   `--hook-name`) is logged at warn with both endpoints, every time: two instances fighting
///   over one name keep taking it from each other, loudly. A missing directory is not recreated
///   (runtime-proxy owns it): logged once, and the file is written again when it is back.
/// * [`Registration::unregister`] (exit) removes the file only if it names our endpoint.
///
/// Every write goes to a hidden temp file in the same directory, then is renamed over the file,
/// so a reader never sees half of it. The endpoint read back is compared as a path (`unix://`
/// or `unix:` prefix dropped, repeated `/` ignored), with a UTF-8 BOM skipped and the key
/// matched case-insensitively, as runtime-proxy reads it.
#[derive(Debug)]
pub struct Registration {
    dir: PathBuf,
    name: String,
    file: PathBuf,
    endpoint: PathBuf,
    doc: Vec<u8>,
    /// The last problem logged by [`Registration::check`] (logged once until it changes).
    problem: Mutex<Option<String>>,
    /// Takeovers from other endpoints so far.
    takeovers: AtomicU64,
}

impl Registration {
    /// The registration of the server at `endpoint` (an absolute socket path) under `name` in
    /// `dir`, listing `stages` with `policy` as its `failure-policy`. Nothing is written yet.
    ///
    /// Errors: `name` breaks [`check_hook_name`].
    pub fn new(
        dir: &Path,
        name: &str,
        endpoint: &Path,
        policy: FailurePolicy,
        stages: &[Stage],
    ) -> anyhow::Result<Registration> {
        check_hook_name(name).map_err(anyhow::Error::msg)?;
        let doc = serde_json::json!({
            "remote-endpoint": endpoint,
            "failure-policy": policy.as_str(),
            "runtime-hooks": stages.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        });
        Ok(Registration {
            dir: dir.to_owned(),
            name: name.to_owned(),
            file: dir.join(format!("{name}.json")),
            endpoint: endpoint.to_owned(),
            doc: serde_json::to_vec_pretty(&doc)?,
            problem: Mutex::new(None),
            takeovers: AtomicU64::new(0),
        })
    }

    /// The registration file, `<dir>/<name>.json`.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The endpoint registered.
    pub fn endpoint(&self) -> &Path {
        &self.endpoint
    }

    /// Start-up: creates the directory (and parents) if missing, then writes the file; a file
    /// naming another endpoint is taken over, with a warning naming it.
    ///
    /// Errors: the directory cannot be created, or the file cannot be written.
    pub fn register(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        if let Holder::Other(theirs) = self.holder() {
            let n = self.takeovers.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                file = %self.file.display(),
                ours = %self.endpoint.display(),
                theirs = %theirs,
                takeovers = n,
                "registration file named another endpoint (another server with the same --hook-name?); taking it over"
            );
        }
        self.write().with_context(|| format!("writing {}", self.file.display()))
    }

    /// Reads the file back: who is registered under our name.
    pub fn holder(&self) -> Holder {
        use std::io::Read as _;
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&self.file).and_then(|f| f.take(MAX_READ_BACK + 1).read_to_end(&mut bytes));
        match read {
            Ok(_) if bytes.len() as u64 > MAX_READ_BACK => {
                Holder::Unreadable(format!("larger than {MAX_READ_BACK} bytes"))
            }
            Ok(_) => match endpoint_in(&bytes) {
                Ok(theirs) if same_endpoint(&theirs, &self.endpoint) => Holder::Us,
                Ok(theirs) => Holder::Other(theirs),
                Err(why) => Holder::Unreadable(why),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => {
                if self.dir.is_dir() {
                    Holder::Missing
                } else {
                    Holder::NoDir
                }
            }
            Err(e) => Holder::Unreadable(e.to_string()),
        }
    }

    /// One check: reads the file back and, unless it names us, rewrites it (never creating the
    /// directory). Logs what it found and did: each takeover from another endpoint at warn with
    /// both endpoints; a removed or unreadable file at warn; a problem that persists (missing
    /// directory, failing write) once, until it changes; the end of a problem at info.
    pub fn check(&self) -> Checked {
        let holder = self.holder();
        if holder == Holder::Us {
            self.problem_solved(None);
            return Checked::Ours;
        }
        if holder == Holder::NoDir {
            self.problem(
                "hook config directory is missing; not recreating it (runtime-proxy owns it), registering again when it is back".into(),
            );
            return Checked::Failed(holder, format!("{} is missing", self.dir.display()));
        }
        if let Err(e) = self.write() {
            let why = format!("writing {}: {e}", self.file.display());
            self.problem(format!("cannot restore the registration ({holder}): {why}; retrying"));
            return Checked::Failed(holder, why);
        }
        let (file, ours) = (self.file.display(), self.endpoint.display());
        // After a logged problem (the directory was missing), its end is the news, not the file.
        let after_problem = self.problem.lock().unwrap_or_else(|e| e.into_inner()).is_some();
        match &holder {
            Holder::Other(theirs) => {
                let n = self.takeovers.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    file = %file,
                    ours = %ours,
                    theirs = %theirs,
                    takeovers = n,
                    "registration file named another endpoint (another server with the same --hook-name?); took it over"
                );
            }
            Holder::Missing if after_problem => {}
            Holder::Missing => {
                tracing::warn!(file = %file, endpoint = %ours, "registration file was removed; registered again")
            }
            Holder::Unreadable(why) => {
                tracing::warn!(file = %file, endpoint = %ours, reason = %why, "registration file was unreadable; rewritten")
            }
            Holder::Us | Holder::NoDir => {}
        }
        self.problem_solved(Some(&holder));
        Checked::Restored(holder)
    }

    /// Runs [`Registration::check`] every `every` (the first one after `every`), forever; stop
    /// it by dropping the future.
    pub async fn keep(&self, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.check();
        }
    }

    /// Exit: removes the file if it names our endpoint, leaves it otherwise (another instance
    /// registered under the same name keeps its registration). Returns the holder found.
    ///
    /// Reading and removing are two steps: a file replaced between them is removed, and its
    /// owner's next [`Registration::check`] writes it again.
    pub fn unregister(&self) -> Holder {
        let holder = self.holder();
        match &holder {
            Holder::Us => match std::fs::remove_file(&self.file) {
                Ok(()) => tracing::info!(file = %self.file.display(), "registration removed"),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(file = %self.file.display(), "removing registration: {e}"),
            },
            Holder::Other(theirs) => {
                tracing::info!(file = %self.file.display(), theirs = %theirs, "registration file names another endpoint; left in place")
            }
            Holder::Unreadable(why) => {
                tracing::warn!(file = %self.file.display(), reason = %why, "registration file unreadable, not ours to remove; left in place")
            }
            Holder::Missing | Holder::NoDir => {}
        }
        holder
    }

    /// Writes the file: a hidden temp file in the directory, then renamed over the file.
    fn write(&self) -> io::Result<()> {
        // Hidden and not ending in "json": neither runtime-proxy nor koord-runtime-proxy reads it.
        let tmp = self.dir.join(format!(".{}.json.tmp-{}", self.name, std::process::id()));
        hook_api::write_registration(&tmp, &self.file, &self.doc)
    }

    /// Logs `what` at warn unless it is the problem already logged.
    fn problem(&self, what: String) {
        let mut last = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() != Some(what.as_str()) {
            tracing::warn!(file = %self.file.display(), "{what}");
            *last = Some(what);
        }
    }

    /// Forgets the logged problem, saying at info that it is over (`restored`: what the file was
    /// before it was written again, if it was).
    fn problem_solved(&self, restored: Option<&Holder>) {
        let mut last = self.problem.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(what) = last.take() {
            let how = if restored.is_some() { "registered again" } else { "the file names us again" };
            tracing::info!(file = %self.file.display(), was = %what, "registration problem over: {how}");
        }
    }
}

/// The most of a registration file read back, in bytes: runtime-proxy's limit (1 MiB); a larger
/// file is nobody's registration.
const MAX_READ_BACK: u64 = 1 << 20;

/// The `remote-endpoint` of a registration file's bytes: a UTF-8 BOM skipped, the key matched
/// exactly or else case-insensitively (Go's encoding/json, as koord reads it).
///
/// Errors: not a JSON object, no such key, or not a non-empty string; the message says which.
fn endpoint_in(bytes: &[u8]) -> Result<String, String> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let serde_json::Value::Object(obj) = value else { return Err("not a JSON object".into()) };
    let field = obj
        .get("remote-endpoint")
        .or_else(|| obj.iter().find(|(k, _)| k.eq_ignore_ascii_case("remote-endpoint")).map(|(_, v)| v));
    match field {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        _ => Err("no remote-endpoint string".into()),
    }
}

/// Whether a `remote-endpoint` value names the socket `ours`: `unix://` or `unix:` prefix
/// dropped, then compared as paths (component by component, so `//` and a trailing `/` do not
/// matter).
fn same_endpoint(theirs: &str, ours: &Path) -> bool {
    let path = theirs.strip_prefix("unix://").or_else(|| theirs.strip_prefix("unix:")).unwrap_or(theirs);
    Path::new(path) == ours
}

/// One connection the hook service serves: the accepted socket registered for readability only
/// ([`daemon_support::uds::Socket`]). tokio's own `UnixStream` is also registered for
/// writability, so the proxy reading each answer woke runtime-hooks once more per hook call
/// (the kernel signals "writable" when the peer reads, `unix_write_space`), for nothing to do.
pub struct Served(daemon_support::uds::Socket);

impl Served {
    /// The connections accepted on `listener`, each taken over as a readability-only socket.
    /// An accept error, or a socket that cannot be registered again, is logged at warn and
    /// passed on as the stream's error (tonic then skips it and goes on accepting).
    pub fn incoming(listener: tokio::net::UnixListener) -> impl futures::Stream<Item = io::Result<Served>> {
        use futures::StreamExt as _;
        tokio_stream::wrappers::UnixListenerStream::new(listener).map(|accepted| {
            let served = accepted.and_then(daemon_support::uds::Socket::new).map(Served);
            if let Err(e) = &served {
                tracing::warn!(error = %e, "accepting a hook connection failed");
            }
            served
        })
    }
}

impl tonic::transport::server::Connected for Served {
    /// Nothing: no service reads the peer's address or credentials.
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for Served {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut tokio::io::ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Served {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAGES: [Stage; 2] = [Stage::PreRunPodSandbox, Stage::PreCreateContainer];

    fn registration(dir: &Path, endpoint: &str) -> Registration {
        Registration::new(dir, "runtime-hooks", Path::new(endpoint), FailurePolicy::Ignore, &STAGES).unwrap()
    }

    fn endpoint_of(file: &Path) -> String {
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        json["remote-endpoint"].as_str().unwrap().to_owned()
    }

    #[test]
    fn registration_is_atomic_and_lists_stages() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("hookserver.d");
        let reg = registration(&sub, "/run/rh.sock");
        reg.register().unwrap();
        assert_eq!(reg.file(), sub.join("runtime-hooks.json"));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(reg.file()).unwrap()).unwrap();
        assert_eq!(json["remote-endpoint"], "/run/rh.sock");
        assert_eq!(json["failure-policy"], "Ignore");
        assert_eq!(json["runtime-hooks"], serde_json::json!(["PreRunPodSandbox", "PreCreateContainer"]));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temp file left");
        assert_eq!(reg.holder(), Holder::Us);
        assert_eq!(reg.unregister(), Holder::Us);
        assert!(!reg.file().exists());
        assert_eq!(reg.unregister(), Holder::Missing, "already gone: fine");
    }

    #[test]
    fn exit_leaves_another_endpoints_file() {
        let dir = tempfile::tempdir().unwrap();
        let first = registration(dir.path(), "/run/a.sock");
        let second = registration(dir.path(), "/run/b.sock");
        first.register().unwrap();
        second.register().unwrap(); // takes it over
        assert_eq!(first.holder(), Holder::Other("/run/b.sock".into()));
        assert_eq!(first.unregister(), Holder::Other("/run/b.sock".into()));
        assert_eq!(endpoint_of(second.file()), "/run/b.sock", "the second instance stays registered");
        // Garbage is nobody's: left in place too.
        std::fs::write(second.file(), "{not json").unwrap();
        assert!(matches!(first.unregister(), Holder::Unreadable(_)));
        assert!(second.file().exists());
    }

    #[test]
    fn check_restores_a_removed_taken_or_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registration(dir.path(), "/run/a.sock");
        reg.register().unwrap();
        assert_eq!(reg.check(), Checked::Ours);
        let before = std::fs::metadata(reg.file()).unwrap().modified().unwrap();
        assert_eq!(reg.check(), Checked::Ours);
        assert_eq!(std::fs::metadata(reg.file()).unwrap().modified().unwrap(), before, "ours: not rewritten");

        std::fs::remove_file(reg.file()).unwrap();
        assert_eq!(reg.check(), Checked::Restored(Holder::Missing));
        assert_eq!(endpoint_of(reg.file()), "/run/a.sock");

        std::fs::write(reg.file(), r#"{"remote-endpoint": "unix:///run/b.sock"}"#).unwrap();
        assert_eq!(reg.check(), Checked::Restored(Holder::Other("unix:///run/b.sock".into())));
        assert_eq!(endpoint_of(reg.file()), "/run/a.sock");
        assert_eq!(reg.takeovers.load(Ordering::Relaxed), 1);

        std::fs::write(reg.file(), "").unwrap();
        assert!(matches!(reg.check(), Checked::Restored(Holder::Unreadable(_))));
        assert_eq!(reg.holder(), Holder::Us);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
    }

    #[test]
    fn endpoints_compare_as_paths_as_the_proxy_reads_them() {
        let ours = Path::new("/run/rh/a.sock");
        for same in ["/run/rh/a.sock", "unix:///run/rh/a.sock", "unix:/run/rh/a.sock", "/run//rh/a.sock"] {
            assert!(same_endpoint(same, ours), "{same}");
        }
        for other in ["/run/rh/b.sock", "run/rh/a.sock", "unix://run/rh/a.sock"] {
            assert!(!same_endpoint(other, ours), "{other}");
        }
        assert_eq!(
            endpoint_in(b"\xEF\xBB\xBF{\"Remote-Endpoint\": \"/x.sock\"}"),
            Ok("/x.sock".into()),
            "BOM, key case"
        );
        for bad in [&b"[]"[..], b"{}", br#"{"remote-endpoint": 5}"#, br#"{"remote-endpoint": ""}"#, b"\xff"] {
            assert!(endpoint_in(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_missing_directory_is_waited_for_not_recreated() {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("hookserver.d");
        let reg = registration(&dir, "/run/a.sock");
        reg.register().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        for _ in 0..3 {
            assert!(matches!(reg.check(), Checked::Failed(Holder::NoDir, _)));
            assert!(!dir.exists(), "not recreated");
        }
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(reg.check(), Checked::Restored(Holder::Missing));
        assert_eq!(reg.holder(), Holder::Us);
        // A file where the directory should be: the same.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&dir, "x").unwrap();
        assert!(matches!(reg.check(), Checked::Failed(Holder::NoDir, _)));
    }

    #[tokio::test]
    async fn keep_restores_within_an_interval() {
        let dir = tempfile::tempdir().unwrap();
        let reg = registration(dir.path(), "/run/a.sock");
        reg.register().unwrap();
        let keep = reg.keep(Duration::from_millis(20));
        let poke = async {
            std::fs::remove_file(reg.file()).unwrap();
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if reg.holder() == Holder::Us {
                    return true;
                }
            }
            false
        };
        let restored = tokio::select! { () = keep => unreachable!("keep never ends"), r = poke => r };
        assert!(restored, "file written again");
    }

    #[test]
    fn hook_names_must_be_plain_visible_file_names() {
        for good in ["runtime-hooks", "koordlet", "a.b", "x y", "ü"] {
            assert_eq!(parse_hook_name(good).as_deref(), Ok(good));
        }
        let long = "a".repeat(MAX_HOOK_NAME_LEN + 1);
        for (bad, why) in [
            ("", "empty"),
            ("../../etc/evil", "'/'"),
            ("a/b", "'/'"),
            ("/abs", "'/'"),
            (".", ". or .."),
            ("..", ". or .."),
            (".hidden", "hidden"),
            ("a\0b", "NUL"),
            (long.as_str(), "too long"),
        ] {
            let e = parse_hook_name(bad).unwrap_err();
            assert!(e.contains(why) && e.contains("hook name"), "{bad:?}: {e}");
        }
        assert!(Registration::new(Path::new("/d"), "../x", Path::new("/s"), FailurePolicy::Ignore, &STAGES).is_err());
    }
}
