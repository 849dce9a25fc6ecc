//! The `runtime-hooks` binary: parses flags, sets up logging, runs [`runtime_hooks::run`] until
//! SIGTERM, SIGINT or SIGQUIT (or, with `status`, prints a running server's state and exits);
//! SIGHUP re-reads the rules file, SIGUSR1 and SIGUSR2 are ignored (the table:
//! [`daemon_support::signals`]). Logs go to stderr through a writer thread, so that a slow or
//! broken stderr never stops or holds up the server ([`daemon_support::log`]).

use std::io::Write as _;

use clap::Parser;
use daemon_support::signals::{self, Control, Signals};

use runtime_hooks::cli::{Args, Command};

/// The crates whose log level `--v` sets (koord's klog flag; see `daemon_support::klog`).
const CRATES: &[&str] = &["runtime_hooks"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(Command::Status(status)) = &args.command {
        // No log set-up: the table (or one line saying why there is none) is the whole output.
        let (out, err) = (&mut std::io::stdout(), &mut std::io::stderr());
        let render = runtime_hooks::status::render;
        return daemon_support::status::run("runtime-hooks", args.metrics_addr, status, render, out, err).into();
    }
    if args.probe {
        // One plain line on failure (kubelet shows it in the liveness probe's event), nothing on
        // success; no log set-up, so nothing else reaches the probe's output.
        return match runtime_hooks::probe(&args.listen, std::time::Duration::from_secs(2)).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                // A probe whose stderr is gone still exits 1; the write's failure is irrelevant.
                let _ = writeln!(std::io::stderr(), "runtime-hooks: probe: {e}");
                std::process::ExitCode::from(1)
            }
        };
    }
    // Never panics nor blocks on a broken or stalled stderr (daemon_support::log).
    let (logging, rust_log_set) = daemon_support::log::init(&args.klog.default_filter(CRATES));
    if let Some(notice) = args.klog.notice(CRATES, rust_log_set) {
        tracing::warn!("{notice}");
    }
    // Handlers installed now, before anything is served: a SIGTERM right after READY=1 drains too.
    let mut control = match Signals::install() {
        Ok(s) => signals::spawn(s, || runtime_hooks::notify_systemd(daemon_support::sd_notify::STOPPING)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle signals: SIGTERM and SIGHUP keep their default action (exit at once)");
            Control::inert()
        }
    };
    let reloads = control.take_reloads();
    let code = tokio::select! {
        result = runtime_hooks::run(args, control.stopping(), reloads) => match result {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                // Once, as the last line (it used to be printed twice, after "stopped").
                tracing::error!("runtime-hooks stopped: {e:#}");
                std::process::ExitCode::from(2)
            }
        },
        // A second stop signal: calls in flight are cut (the registration is gone already; the
        // socket is removed as the server is dropped).
        () = control.stop_now() => std::process::ExitCode::SUCCESS,
    };
    // The lines still queued, the error above included, are written before the exit.
    logging.flush();
    code
}
