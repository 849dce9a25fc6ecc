//! Logging to stderr for a daemon on the request path of every pod start.
//!
//! # Never waits, never dies
//!
//! Log lines go through [`tracing`] to a writer thread (tracing-appender's non-blocking writer
//! in lossy mode) that writes them to stderr, so:
//!
//! * **nothing waits for stderr**: a log pipe whose reader stalls (a FIFO nobody reads, a
//!   frozen log shipper) fills a queue of at most [`QUEUE_LINES`] lines; past that, lines are
//!   dropped, and the daemon's calls go on at full speed;
//! * **nothing dies of stderr**: a write that fails (`EPIPE` once the reader of the pipe is gone,
//!   `EBADF`, `ENOSPC`) drops that line. Rust's runtime ignores `SIGPIPE` (a failed write returns
//!   `EPIPE` instead), and tracing-subscriber's own "unable to write" report, which would panic
//!   on a broken stderr, is turned off.
//!
//! # Control characters
//!
//! A field or message may carry text from elsewhere (a hook server's error, a pod's name).
//! tracing-subscriber writes ESC, BEL, BS, FF, DEL and C1 controls in them as escapes (`\x1b`,
//! `\u{9b}`); the writer here escapes the C0 controls it leaves raw, CR above all (`\r`: a CR
//! returns a terminal, or `journalctl` shown in one, to the start of the line, where the rest
//! overwrites what came before), as `\r` and `\xNN` ([`crate::escape`]). TAB and the line
//! feeds are kept, and ESC too, which only the formatter's own colours (on a terminal) carry.
//!
//! # Lost lines
//!
//! Every line lost either way is counted: [`dropped_lines`] (runtime-proxy exports it as
//! `runtime_proxy_log_lines_dropped_total`).

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Most log lines queued for the writer thread (lines, not bytes); more are dropped and counted.
/// At ~200 bytes a line, about 3 MiB.
pub const QUEUE_LINES: usize = 16 * 1024;

/// Lines the writer thread could not write (the write failed).
static WRITE_FAILURES: AtomicU64 = AtomicU64::new(0);
/// Lines dropped because the queue was full (set by [`init`]).
static QUEUE_DROPS: OnceLock<ErrorCounter> = OnceLock::new();

/// Log lines lost since start: dropped because the writer thread's queue was full (stderr too
/// slow), or because writing them to stderr failed (a closed pipe). 0 before [`init`].
pub fn dropped_lines() -> u64 {
    let queued = QUEUE_DROPS.get().map_or(0, |c| c.dropped_lines() as u64);
    queued + WRITE_FAILURES.load(Ordering::Relaxed)
}

/// The running logger; dropping it (or [`Logging::flush`]) writes out the lines still queued,
/// waiting at most about a second for a stalled stderr.
#[must_use = "dropping it stops the writer thread: keep it for the life of the process"]
pub struct Logging {
    _guard: WorkerGuard,
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
pub fn init(default_filter: &str) -> (Logging, bool) {
    let (filter, from_env) = match EnvFilter::try_from_env("RUST_LOG") {
        Ok(f) => (f, true),
        Err(_) => (EnvFilter::new(default_filter), false),
    };
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUE_LINES)
        .thread_name("log-writer")
        .finish(ForgivingWriter(io::stderr()));
    let _ = QUEUE_DROPS.set(writer.error_counter());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(io::stderr().is_terminal())
        .log_internal_errors(false)
        .try_init();
    (Logging { _guard: guard }, from_env)
}

/// A writer whose writes always succeed: a line that cannot be written is counted in
/// [`WRITE_FAILURES`] and dropped. The writer thread gets each line in one `write_all`; its
/// control characters are escaped first ([`escape_line`]).
struct ForgivingWriter<W>(W);

/// Whether the log writer escapes byte `b` (see the module docs): a C0 control but TAB, LF and
/// ESC. Bytes of a multi-byte UTF-8 character are never below 0x80, so escaping bytes is
/// escaping characters.
fn escaped_in_log(b: u8) -> bool {
    b < 0x20 && !matches!(b, b'\t' | b'\n' | 0x1b)
}

/// `line` with the bytes [`escaped_in_log`] written as `\r` or `\xNN`; borrowed when there are
/// none (the usual case: one pass over the line).
fn escape_line(line: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if !line.iter().any(|&b| escaped_in_log(b)) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = Vec::with_capacity(line.len() + 8);
    for &b in line {
        match b {
            b'\r' => out.extend_from_slice(b"\\r"),
            b if escaped_in_log(b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            b => out.push(b),
        }
    }
    std::borrow::Cow::Owned(out)
}

impl<W: Write> Write for ForgivingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.0.write_all(&escape_line(buf)).is_err() {
            WRITE_FAILURES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// A pipe whose reader is closed: every write fails with EPIPE (SIGPIPE is ignored in Rust
    /// programs, the test harness included); the writer reports success and counts the line.
    #[test]
    fn a_write_to_a_closed_pipe_is_counted_not_failed() {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-element array it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created and are owned here, each closed once.
        let (reader, writer) = unsafe { (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1])) };
        drop(reader);
        let mut raw = &writer;
        assert_eq!(raw.write(b"x\n").unwrap_err().raw_os_error(), Some(libc::EPIPE), "the pipe is broken");
        let before = WRITE_FAILURES.load(Ordering::Relaxed);
        let mut w = ForgivingWriter(&writer);
        assert_eq!(w.write(b"a log line\n").unwrap(), 11);
        w.flush().unwrap();
        assert_eq!(WRITE_FAILURES.load(Ordering::Relaxed), before + 1);
    }

    /// A CR (and the other C0 controls tracing-subscriber leaves raw) reaches stderr escaped;
    /// TAB, LF and ESC do not change.
    #[test]
    fn carriage_returns_are_escaped() {
        let mut out = Vec::new();
        let mut w = ForgivingWriter(&mut out);
        let line = b"WARN hook failed error=\"quota\rINFO all good\x00\x0b\" \x1b[2mdim\x1b[0m\ttab\n";
        assert_eq!(w.write(line).unwrap(), line.len(), "the whole line counts as written");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "WARN hook failed error=\"quota\\rINFO all good\\x00\\x0b\" \x1b[2mdim\x1b[0m\ttab\n"
        );
        assert!(matches!(escape_line("ünïcode ok\n".as_bytes()), std::borrow::Cow::Borrowed(_)));
    }
}
