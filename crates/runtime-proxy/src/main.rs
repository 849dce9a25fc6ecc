//! The `runtime-proxy` binary: parses flags, sets up logging, runs [`runtime_proxy::run`] until
//! SIGTERM, SIGINT or SIGQUIT; SIGHUP rescans the hook config directory, SIGUSR1 and SIGUSR2 are
//! ignored (the table: [`daemon_support::signals`]); or, with `status`, prints a running proxy's
//! state ([`runtime_proxy::admin::status`]) and exits.
//!
//! One thread serves the calls: the proxy does little CPU work per call, and on a single-threaded
//! runtime a call's hand-offs between connections need no cross-thread wake-ups (measured with
//! `strace -c`: the multi-threaded runtime cost about 4.5 futex calls and 1.6 extra writes per
//! unary call). A second thread writes the log to stderr, so that a slow or broken stderr never
//! holds a call up ([`daemon_support::log`]).

use clap::Parser;
use daemon_support::signals::{self, Control, Signals};

use runtime_proxy::cli::{Args, Command};

/// The crates whose log level `--v` sets (koord's klog flag; see `daemon_support::klog`).
const CRATES: &[&str] = &["runtime_proxy"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(Command::Status(status)) = &args.command {
        // No log set-up: the table (or one line saying why there is none) is the whole output.
        let (out, err) = (&mut std::io::stdout(), &mut std::io::stderr());
        let render = runtime_proxy::admin::status::render;
        return daemon_support::status::run("runtime-proxy", args.metrics_addr, status, render, out, err).into();
    }
    // Never panics nor blocks on a broken or stalled stderr (daemon_support::log).
    let (logging, rust_log_set) = daemon_support::log::init(&args.klog.default_filter(CRATES));
    if let Some(notice) = args.klog.notice(CRATES, rust_log_set) {
        tracing::warn!("{notice}");
    }
    // Handlers installed now, before anything is served: a SIGTERM right after READY=1 drains too.
    let mut control = match Signals::install() {
        Ok(s) => signals::spawn(s, || runtime_proxy::notify_systemd(daemon_support::sd_notify::STOPPING)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle signals: SIGTERM and SIGHUP keep their default action (exit without a drain)");
            Control::inert()
        }
    };
    let reloads = control.take_reloads();
    let code = tokio::select! {
        result = runtime_proxy::run(args, control.stopping(), reloads) => match result {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                // Once, as the last line (it used to be printed twice).
                tracing::error!("{e:#}");
                std::process::ExitCode::from(2)
            }
        },
        // A second stop signal: the drain is cut short (the socket is gone already).
        () = control.stop_now() => std::process::ExitCode::SUCCESS,
    };
    // The lines still queued, the error above included, are written before the exit.
    logging.flush();
    code
}
