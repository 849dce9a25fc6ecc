//! Proxy mode: runtime-hooks as a hook server that runtime-proxy (or koord-runtime-proxy) calls
//! before the runtime sees a CRI call.
//!
//! * [`server`] — the `runtime.v1alpha1.RuntimeHookService` handlers (the framework at each
//!   RPC's stage) and the registration file in the hook config directory;
//! * [`hook_wire`] — the gRPC service served by hand, its message limit and concurrency bound;
//! * [`hook_decode`] — the hook requests decoded in one pass, without trusting their strings to
//!   be UTF-8;
//! * [`serve`] — the mode's start: bind, register, serve until shutdown, unregister.

pub mod hook_decode;
pub mod hook_wire;
pub mod server;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use daemon_support::sd_notify::{notify_systemd, READY};

use crate::framework::Framework;
use crate::plugin::FailurePolicy;

/// Where proxy mode listens and how it registers: the flags `--listen`, `--hook-config-dir`,
/// `--hook-name` and `--failure-policy`.
#[derive(Clone, Debug)]
pub struct Options {
    /// The socket to serve on (made absolute: the proxy dials the registered path from its own
    /// working directory).
    pub listen: PathBuf,
    /// The directory of registration files runtime-proxy watches.
    pub hook_config_dir: PathBuf,
    /// The registration's name (its file is `<hook_config_dir>/<hook_name>.json`).
    pub hook_name: String,
    /// `failure-policy` written into the registration.
    pub failure_policy: FailurePolicy,
}

/// Serves the hook service on `options.listen` until `shutdown` resolves: binds the socket,
/// registers in the hook config directory, tells systemd it is ready, and keeps the
/// registration in place ([`server::Registration::keep`]); at shutdown removes the registration
/// first (if it still names this server), then stops serving and removes the socket (also when
/// this future is dropped mid-drain).
///
/// Errors: `listen` cannot be made absolute or bound, a hook name that is not a plain file name,
/// a registration that cannot be written, serving failing (`serving runtime hooks: …`).
pub async fn serve(
    options: &Options,
    framework: Arc<Framework>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    // Absolute: the proxy dials the registered path from its own working directory.
    let listen =
        std::path::absolute(&options.listen).with_context(|| format!("resolving {}", options.listen.display()))?;
    let listener = daemon_support::socket::bind_unix(&listen)?;
    // Removed however serving ends: also when a second stop signal drops this future mid-drain.
    let _socket = RemoveOnDrop(listen.clone());
    let stages = framework.stages();
    let registration = server::Registration::new(
        &options.hook_config_dir,
        &options.hook_name,
        &listen,
        options.failure_policy,
        &stages,
    )?;
    registration.register()?;
    tracing::info!(socket = %listen.display(), registration = %registration.file().display(), "serving runtime hooks");
    // The listener is bound and tonic serves it from the first poll below.
    notify_systemd(READY);
    let shutdown = async {
        // Keep the registration in place (restored when removed or taken) until shutdown.
        tokio::select! {
            () = shutdown => {}
            () = registration.keep(server::REGISTRATION_CHECK_INTERVAL) => {}
        }
        // Unregister first, so the proxy stops calling us while calls in flight finish.
        registration.unregister();
    };
    let served = tonic::transport::Server::builder()
        .add_service(server::HookService::new(framework).into_server())
        .serve_with_incoming_shutdown(server::Served::incoming(listener), shutdown)
        .await;
    // Also when serving failed; a file that no longer names us is left alone.
    registration.unregister();
    served.context("serving runtime hooks")
}

/// Removes a socket file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}
