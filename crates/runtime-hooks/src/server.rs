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
//! so a reader never sees half of it; it is removed at shutdown, before the server stops, so the
//! proxy stops calling a server that is going away.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use hook_api::v1alpha1::{ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse};
use hook_api::{RuntimeHookService, RuntimeHookServiceServer};
use tokio::net::UnixListener;
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

    /// The tonic server for it.
    pub fn into_server(self) -> RuntimeHookServiceServer<HookService> {
        RuntimeHookServiceServer::new(self)
    }

    fn pod(&self, stage: Stage, req: Request<PodSandboxHookRequest>) -> Result<Response<PodSandboxHookResponse>, Status> {
        self.framework.pod_hook(stage, &req.into_inner()).map(Response::new)
    }

    fn container(
        &self,
        stage: Stage,
        req: Request<ContainerResourceHookRequest>,
    ) -> Result<Response<ContainerResourceHookResponse>, Status> {
        self.framework.container_hook(stage, &req.into_inner()).map(Response::new)
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

/// Binds the unix socket `path`: creates the parent directory (0755), removes a stale socket
/// (one nobody accepts on), and refuses to steal a live one.
///
/// Errors: a live server on `path`, `path` is not a socket, or bind fails.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            bail!("{} exists and is not a socket; not removing it", path.display());
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!("another server is listening on {}", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

/// Writes the registration file `<dir>/<name>.json` atomically (hidden temp file in the same
/// directory, then rename; the directory is created if missing). Returns the file's path.
///
/// Errors: the directory cannot be created or written.
pub fn register(dir: &Path, name: &str, endpoint: &Path, policy: FailurePolicy, stages: &[Stage]) -> anyhow::Result<PathBuf> {
    let doc = serde_json::json!({
        "remote-endpoint": endpoint,
        "failure-policy": policy.as_str(),
        "runtime-hooks": stages.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file = dir.join(format!("{name}.json"));
    // Hidden and not ending in "json": neither runtime-proxy nor koord-runtime-proxy reads it.
    let tmp = dir.join(format!(".{name}.json.tmp-{}", std::process::id()));
    let write = std::fs::write(&tmp, serde_json::to_vec_pretty(&doc)?).and_then(|()| std::fs::rename(&tmp, &file));
    if let Err(e) = write {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", file.display()));
    }
    Ok(file)
}

/// Removes the registration file; a file already gone is fine.
pub fn unregister(file: &Path) {
    match std::fs::remove_file(file) {
        Ok(()) => tracing::info!(file = %file.display(), "registration removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %file.display(), "removing registration: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_is_atomic_and_lists_stages() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("hookserver.d");
        let file = register(
            &sub,
            "runtime-hooks",
            Path::new("/run/rh.sock"),
            FailurePolicy::Ignore,
            &[Stage::PreRunPodSandbox, Stage::PreCreateContainer],
        )
        .unwrap();
        assert_eq!(file, sub.join("runtime-hooks.json"));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(json["remote-endpoint"], "/run/rh.sock");
        assert_eq!(json["failure-policy"], "Ignore");
        assert_eq!(json["runtime-hooks"], serde_json::json!(["PreRunPodSandbox", "PreCreateContainer"]));
        assert_eq!(std::fs::read_dir(&sub).unwrap().count(), 1, "no temp file left");
        unregister(&file);
        assert!(!file.exists());
        unregister(&file); // already gone: fine
    }

    #[tokio::test]
    async fn bind_replaces_stale_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/x.sock");
        let live = bind(&path).unwrap();
        assert!(bind(&path).unwrap_err().to_string().contains("another server"));
        drop(live);
        let _again = bind(&path).expect("stale socket replaced");
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(bind(&file).unwrap_err().to_string().contains("not a socket"));
    }
}
