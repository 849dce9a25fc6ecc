//! The part of `main` both daemons share once their flags are parsed: logging set up, the
//! signal table installed ([`crate::signals`]), the daemon run until it ends or is stopped, and
//! the exit code.
//!
//! # Exit codes
//!
//! The first log line is `<name> <version> starting` (INFO, with the process ID), the last:
//!
//! | how the daemon ended | exit code | last log line |
//! |---|---|---|
//! | a stop signal, after the daemon's own graceful shutdown | 0 | `<name> stopped` (INFO) |
//! | a second stop signal while stopping (the drain cut short) | 0 | `<name> stopped` (INFO), after the signal's WARN |
//! | an error (a flag refused at start, a socket or an admin address that cannot be bound, …) | 2 | `<name> stopped: <why>`, once |

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use crate::klog::KlogFlags;
use crate::signals::{self, Control, Reloads, Signals};

/// The future that resolves when the daemon is asked to stop gracefully (the first `SIGTERM`,
/// `SIGINT` or `SIGQUIT`).
pub type Stopping = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs a daemon: sets up logging (the default filter from `klog`'s verbosity for `crates`,
/// [`crate::log::init`]; the klog deprecation notice once), raises the open files limit to its
/// hard limit ([`crate::rlimit`]), installs the signal handlers
/// before anything is served (a `SIGTERM` right after `READY=1` drains too), tells systemd
/// `STOPPING=1` at a stop signal, and runs `run(stopping, reloads)` until it returns or a
/// second stop signal comes. `name` (`runtime-proxy`, `runtime-hooks`) and `version` (its
/// `--version`) start the first line; `name` starts the last.
///
/// Returns the exit code of the table above; the log lines still queued are written first.
pub async fn run<F, Fut>(name: &str, version: &str, klog: &KlogFlags, crates: &[&str], run: F) -> ExitCode
where
    F: FnOnce(Stopping, Option<Reloads>) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    // Never panics nor blocks on a broken or stalled stderr (crate::log).
    let (logging, rust_log_set) = crate::log::init(&klog.default_filter(crates));
    tracing::info!(pid = std::process::id(), "{name} {version} starting");
    if let Some(notice) = klog.notice(crates, rust_log_set) {
        tracing::warn!("{notice}");
    }
    // Descriptors for every connection kubelet, the hook servers and the admin clients open.
    crate::rlimit::raise_nofile_and_log();
    let mut control = match Signals::install() {
        Ok(s) => signals::spawn(s, || crate::sd_notify::notify_systemd(crate::sd_notify::STOPPING)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle signals: SIGTERM and SIGHUP keep their default action (exit at once, without a graceful stop)");
            Control::inert()
        }
    };
    let reloads = control.take_reloads();
    let code = tokio::select! {
        result = run(Box::pin(control.stopping()), reloads) => match result {
            Ok(()) => {
                tracing::info!("{name} stopped");
                ExitCode::SUCCESS
            }
            Err(e) => {
                // Once, as the last line.
                tracing::error!("{name} stopped: {e:#}");
                ExitCode::from(2)
            }
        },
        // A second stop signal: the graceful stop is cut short.
        () = control.stop_now() => {
            tracing::info!("{name} stopped");
            ExitCode::SUCCESS
        }
    };
    logging.flush();
    code
}
