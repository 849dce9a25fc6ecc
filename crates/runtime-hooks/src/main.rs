//! The `runtime-hooks` binary: parses flags, sets up logging, runs [`runtime_hooks::run`] until
//! SIGTERM, SIGINT or SIGQUIT (or, with `status`, prints a running server's state and exits);
//! SIGHUP re-reads the rules file, SIGUSR1 and SIGUSR2 are ignored (the table:
//! [`daemon_support::signals`]). Logs go to stderr through a writer thread, so that a slow or
//! broken stderr never stops or holds up the server ([`daemon_support::log`]).

use std::io::Write as _;

use clap::{CommandFactory, FromArgMatches};
use daemon_support::status::Endpoint;

use runtime_hooks::cli::{Args, Command};

/// The allocator: mimalloc (why: [`daemon_support::alloc`]).
#[global_allocator]
static ALLOCATOR: daemon_support::alloc::Allocator = daemon_support::alloc::Allocator;

/// The crates whose log level `--v` sets (koord's klog flag; see `daemon_support::klog`).
const CRATES: &[&str] = &["runtime_hooks"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    // koord's spellings of klog's flags (`-v 4`, `--logtostderr false`) as koord reads them;
    // a mistyped flag's suggestion the flag sharing its words (daemon_support::cli_args).
    let matches = daemon_support::cli_args::get_matches(Args::command());
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(Command::Status(status)) = &args.command {
        // No log set-up: the table (or one line saying why there is none) is the whole output.
        let (out, err) = (&mut std::io::stdout(), &mut std::io::stderr());
        let render = runtime_hooks::status::render;
        let tcp_given = daemon_support::status::given_on_command_line(&matches, "metrics_addr");
        let endpoint = Endpoint::choose(args.admin_socket(), args.admin_socket.is_some(), args.metrics_addr, tcp_given);
        return daemon_support::status::run("runtime-hooks", endpoint, status, render, out, err).into();
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
    // Logging, the signal table, the exit code: as for runtime-proxy (daemon_support::daemon).
    let klog = args.klog.clone();
    daemon_support::daemon::run("runtime-hooks", runtime_hooks::cli::VERSION, &klog, CRATES, |stopping, reloads| {
        runtime_hooks::run(args, stopping, reloads)
    })
    .await
}
