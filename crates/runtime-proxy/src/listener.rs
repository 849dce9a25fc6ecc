//! The proxy's listening socket, whatever the front end: made ready the way kubelet expects a
//! runtime socket to be ([`bind`]), the accept loop with its drain ([`accept_and_drain`]), and
//! whether two socket paths are one socket ([`same_socket`]: the listening socket must not be a
//! backend's, a hook server's must be neither).
//!
//! * the parent directory is created, a stale socket replaced, a live one or a path that is not
//!   a socket never touched ([`daemon_support::socket`], as runtime-hooks binds its socket);
//! * the new socket gets the backend socket's mode and owner, so whoever may talk to containerd
//!   may talk to the proxy, and nobody else.

use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use std::future::Future;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

/// Binds the listening socket at `path`, mirroring mode and owner from `backend` when that
/// socket exists (otherwise the socket keeps the default mode and a line is logged: INFO when
/// there is nothing at the path yet, WARN when it is not a socket or cannot be inspected).
///
/// Errors: the parent directory cannot be created; `path` exists and is not a socket; another
/// process is serving on `path`; bind, chmod or chown fails. Each names the path.
pub fn bind(path: &Path, backend: &Path) -> anyhow::Result<UnixListener> {
    let listener = daemon_support::socket::bind_unix(path)?;
    match std::fs::metadata(backend) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode() & 0o7777))
                .with_context(|| format!("chmod {}", path.display()))?;
            std::os::unix::fs::chown(path, Some(m.uid()), Some(m.gid()))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        Ok(_) => tracing::warn!(
            socket = %path.display(), backend = %backend.display(),
            "backend path is not a socket; listen socket keeps its default mode and owner"
        ),
        Err(e) if e.kind() == ErrorKind::NotFound => tracing::info!(
            socket = %path.display(), backend = %backend.display(), error = %e,
            "backend socket not there yet; listen socket keeps its default mode and owner"
        ),
        Err(e) => tracing::warn!(
            socket = %path.display(), backend = %backend.display(), error = %e,
            "backend socket cannot be inspected; listen socket keeps its default mode and owner"
        ),
    }
    Ok(listener)
}

/// The accept loop both front ends share (CRI here, Docker in [`crate::docker`]): each accepted
/// connection runs `serve_conn(stream, stop, tasks)` as a task of `tasks` (where it may spawn
/// per-call tasks too; `stop` turns true at shutdown, when it should finish what is in flight and
/// close). When `shutdown` resolves: stop accepting, remove the socket at `socket_path` (new
/// clients fail fast instead of hanging), signal `stop`, and wait up to `drain_timeout` for the
/// tasks. Accept errors are logged and retried after 50 ms.
pub async fn accept_and_drain<F, Fut>(
    listener: UnixListener,
    socket_path: &Path,
    shutdown: impl Future<Output = ()>,
    drain_timeout: Duration,
    mut serve_conn: F,
) where
    F: FnMut(UnixStream, watch::Receiver<bool>, TaskTracker) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tasks = TaskTracker::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tasks.spawn(serve_conn(stream, stop_rx.clone(), tasks.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if let Err(e) = std::fs::remove_file(socket_path) {
        tracing::warn!(socket = %socket_path.display(), error = %e, "could not remove socket");
    }
    let _ = stop_tx.send(true);
    tasks.close();
    tracing::info!(tasks = tasks.len(), "draining in-flight calls");
    if tokio::time::timeout(drain_timeout, tasks.wait()).await.is_err() {
        tracing::warn!(?drain_timeout, open = tasks.len(), "drain timeout reached; exiting with calls still open");
    }
}

/// Whether two socket paths name the same socket: equal once symlinks, `.`, `..` and repeated
/// slashes are resolved (the socket itself need not exist yet: then its directory is resolved).
pub fn same_socket(a: &Path, b: &Path) -> bool {
    fn resolved(p: &Path) -> PathBuf {
        if let Ok(real) = std::fs::canonicalize(p) {
            return real;
        }
        match (p.parent(), p.file_name()) {
            (Some(dir), Some(name)) => {
                std::fs::canonicalize(dir).map(|d| d.join(name)).unwrap_or_else(|_| p.components().collect())
            }
            _ => p.components().collect(),
        }
    }
    resolved(a) == resolved(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn prepares_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let backend = dir.path().join("backend.sock");
        let _b = std::os::unix::net::UnixListener::bind(&backend).unwrap();
        std::fs::set_permissions(&backend, std::fs::Permissions::from_mode(0o640)).unwrap();

        let path = dir.path().join("a/b/proxy.sock");
        // A stale socket: bound once, nobody listening any more.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let l = bind(&path, &backend).unwrap();
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o640, "mode mirrored from the backend socket");

        // A live socket is not stolen.
        let err = bind(&path, &backend).unwrap_err().to_string();
        assert!(err.contains("another process is serving"), "{err}");
        drop(l);

        // A regular file is never removed.
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = bind(&file, &backend).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert!(file.exists());

        // A backend path that is no socket lends the new socket neither its mode nor its owner.
        let other = dir.path().join("other.sock");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let _l = bind(&other, &file).unwrap();
        assert_ne!(std::fs::metadata(&other).unwrap().mode() & 0o7777, 0o600, "not mirrored from a regular file");
    }

    #[test]
    fn same_socket_sees_through_spelling_and_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("run")).unwrap();
        let sock = d.join("run/c.sock");
        assert!(same_socket(&sock, &d.join("run/./c.sock")), "not there yet, other spelling");
        assert!(same_socket(&sock, &d.join("run/../run//c.sock")));
        assert!(!same_socket(&sock, &d.join("run/p.sock")));
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::symlink(&sock, d.join("link.sock")).unwrap();
        assert!(same_socket(&d.join("link.sock"), &sock), "a symlink to the socket");
        std::os::unix::fs::symlink(d.join("run"), d.join("rundir")).unwrap();
        assert!(same_socket(&d.join("rundir/new.sock"), &d.join("run/new.sock")), "a symlinked directory");
    }
}
