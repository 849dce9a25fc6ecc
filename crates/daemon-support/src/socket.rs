//! Binding a daemon's listening unix socket, the same way in both binaries (runtime-proxy's CRI
//! or Docker socket, runtime-hooks' hook server socket).
//!
//! # Rules
//!
//! * the parent directory is created (mode 0755, as koord-runtime-proxy creates its socket
//!   directory) when missing;
//! * a stale socket left by a previous run (nobody accepts on it) is removed;
//! * a socket some live process still accepts on is never taken over;
//! * a path that is not a socket is never deleted.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::Path;

use anyhow::{bail, Context};
use tokio::net::UnixListener;

/// Binds a listening unix socket at `path` under the rules of this module (a removed stale
/// socket is logged at INFO). Must be called within a tokio runtime.
///
/// Errors (each names the path): the parent directory cannot be created; `path` exists and is
/// not a socket; another process accepts on `path`; it cannot be inspected, removed or bound.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("creating socket directory {}", parent.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                bail!("another process is serving on {}; refusing to take over its socket", path.display());
            }
            std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
            tracing::info!(socket = %path.display(), "removed stale socket");
        }
        Ok(_) => bail!("{} exists and is not a socket; refusing to remove it", path.display()),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("inspecting {}", path.display())),
    }
    UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn replaces_stale_sockets_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/x.sock");
        let live = bind_unix(&path).unwrap();
        let mode = std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755, "the directory is made 0755");
        let err = bind_unix(&path).unwrap_err().to_string();
        assert!(err.contains("another process is serving"), "{err}");
        drop(live);
        let _again = bind_unix(&path).expect("stale socket replaced");

        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let err = bind_unix(&file).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert!(file.exists(), "a regular file is never removed");
    }
}
