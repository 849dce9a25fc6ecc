//! The `runtime-proxy` binary: parses flags, sets up logging, runs [`runtime_proxy::run`] until
//! SIGTERM or SIGINT.
//!
//! One thread: the proxy does little CPU work per call, and on a single-threaded runtime a call's
//! hand-offs between connections need no cross-thread wake-ups (measured with `strace -c`: the
//! multi-threaded runtime cost about 4.5 futex calls and 1.6 extra writes per unary call).

use std::io::IsTerminal;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;

use runtime_proxy::cli::Args;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    // Handlers installed now, before anything is served: a SIGTERM right after READY=1 drains too.
    let signals = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    let shutdown = async {
        let (mut term, mut int) = match signals {
            (Ok(t), Ok(i)) => (t, i),
            _ => return std::future::pending().await,
        };
        let which = tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" };
        tracing::info!(signal = which, "shutting down");
        runtime_proxy::notify_systemd(hook_api::sd_notify::STOPPING);
    };
    match runtime_proxy::run(args, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("runtime-proxy: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
