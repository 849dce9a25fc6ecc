//! The `runtime-hooks` binary: parses flags, sets up logging, runs [`runtime_hooks::run`] until
//! SIGTERM or SIGINT.

use std::io::IsTerminal;

use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tracing_subscriber::EnvFilter;

use runtime_hooks::cli::Args;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if args.probe {
        return match runtime_hooks::probe(&args.listen, std::time::Duration::from_secs(2)).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("runtime-hooks: probe: {e:#}");
                std::process::ExitCode::from(1)
            }
        };
    }
    // Handlers installed now, before anything is served: a SIGTERM right after READY=1 drains too.
    let signals = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    let shutdown = async {
        let (mut term, mut int) = match signals {
            (Ok(t), Ok(i)) => (t, i),
            _ => return std::future::pending().await,
        };
        let which = tokio::select! { _ = term.recv() => "SIGTERM", _ = int.recv() => "SIGINT" };
        tracing::info!(signal = which, "shutting down");
        runtime_hooks::notify_systemd(hook_api::sd_notify::STOPPING);
    };
    match runtime_hooks::run(args, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("runtime-hooks: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
