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

use clap::{CommandFactory, FromArgMatches};
use daemon_support::status::Endpoint;
use runtime_proxy::cli::{Args, Command};

/// The allocator: mimalloc (why: [`daemon_support::alloc`]).
#[global_allocator]
static ALLOCATOR: daemon_support::alloc::Allocator = daemon_support::alloc::Allocator;

/// The crates whose log level `--v` sets (koord's klog flag; see `daemon_support::klog`).
const CRATES: &[&str] = &["runtime_proxy"];

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    // koord's spellings of klog's flags (`-v 4`, `--logtostderr false`) as koord reads them;
    // a mistyped flag's suggestion the flag sharing its words (daemon_support::cli_args).
    let matches = daemon_support::cli_args::get_matches(Args::command());
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Some(Command::Status(status)) = &args.command {
        // No log set-up: the table (or one line saying why there is none) is the whole output.
        let (out, err) = (&mut std::io::stdout(), &mut std::io::stderr());
        let render = runtime_proxy::admin::status::render;
        let tcp_given = daemon_support::status::given_on_command_line(&matches, "metrics_addr");
        let endpoint = Endpoint::choose(args.admin_socket(), args.admin_socket.is_some(), args.metrics_addr, tcp_given);
        return daemon_support::status::run("runtime-proxy", endpoint, status, render, out, err).into();
    }
    // Logging, the signal table, the exit code: as for runtime-hooks (daemon_support::daemon).
    let klog = args.klog.clone();
    daemon_support::daemon::run("runtime-proxy", runtime_proxy::cli::VERSION, &klog, CRATES, |stopping, reloads| {
        runtime_proxy::run(args, stopping, reloads)
    })
    .await
}
