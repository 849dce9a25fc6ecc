//! Logging to stderr for a daemon on the request path of every pod start.
//!
//! # Never waits, never dies
//!
//! Log lines go through [`tracing`] to a writer thread ([`crate::log_writer`]) that writes them
//! to stderr in batches (the lines of up to [`crate::log_writer::LINGER`] in one write, so a
//! line per call costs no thread wake per call), so:
//!
//! * **nothing waits for stderr**: a log pipe whose reader stalls (a FIFO nobody reads, a
//!   frozen log shipper) fills a queue of at most [`QUEUE_LINES`] lines; past that, lines are
//!   dropped, and the daemon's calls go on at full speed;
//! * **nothing dies of stderr**: a write that fails (`EPIPE` once the reader of the pipe is gone,
//!   `EBADF`, `ENOSPC`) drops that batch of lines. Rust's runtime ignores `SIGPIPE` (a failed
//!   write returns `EPIPE` instead), and tracing-subscriber's own "unable to write" report,
//!   which would panic on a broken stderr, is turned off.
//!
//! # Lost lines
//!
//! Every line lost either way is counted: [`dropped_lines`] (runtime-proxy exports it as
//! `runtime_proxy_log_lines_dropped_total`).

use std::io::{self, IsTerminal};
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::log_writer::{BatchGuard, BatchWriter, LINGER};

/// Most log lines queued for the writer thread (lines, not bytes); more are dropped and counted.
/// At ~200 bytes a line, about 3 MiB.
pub const QUEUE_LINES: usize = 16 * 1024;

/// The installed writer (set by [`init`]), for its count of lost lines.
static WRITER: OnceLock<BatchWriter> = OnceLock::new();

/// Log lines lost since start: dropped because the writer thread's queue was full (stderr too
/// slow), or because writing them to stderr failed (a closed pipe). 0 before [`init`].
pub fn dropped_lines() -> u64 {
    WRITER.get().map_or(0, BatchWriter::lost_lines)
}

/// The running logger; dropping it (or [`Logging::flush`]) writes out the lines still queued,
/// waiting at most about a second for a stalled stderr.
#[must_use = "dropping it stops the writer thread: keep it for the life of the process"]
pub struct Logging {
    _guard: Option<BatchGuard>,
}

impl Logging {
    /// Writes out the queued lines and stops the writer thread; later log lines are lost. For
    /// the end of `main`, before the process exits.
    pub fn flush(self) {}
}

/// Installs the global subscriber: lines filtered by `RUST_LOG` when it is set, else by
/// `default_filter` (an [`EnvFilter`] directive such as `info` or `info,runtime_proxy=debug`),
/// written to stderr by a writer thread as the module docs say; colours only when stderr is a
/// terminal.
///
/// Returns whether `RUST_LOG` decided the filter, and the logger to keep. Calling it twice keeps
/// the first subscriber (the second only gets a writer thread of its own that nothing uses).
/// Should the writer thread not start (no thread can be created), lines go to stderr directly
/// from the logging thread, with the same counting of failed writes.
pub fn init(default_filter: &str) -> (Logging, bool) {
    let (filter, from_env) = match EnvFilter::try_from_env("RUST_LOG") {
        Ok(f) => (f, true),
        Err(_) => (EnvFilter::new(default_filter), false),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(io::stderr().is_terminal()).log_internal_errors(false);
    let guard = match BatchWriter::spawn(io::stderr(), QUEUE_LINES, LINGER, "log-writer") {
        Ok((writer, guard)) => {
            let installed = builder.with_writer(writer.clone()).try_init().is_ok();
            if installed {
                let _ = WRITER.set(writer);
            }
            Some(guard)
        }
        Err(_) => {
            let _ = builder.with_writer(io::stderr).try_init();
            None
        }
    };
    (Logging { _guard: guard }, from_env)
}
