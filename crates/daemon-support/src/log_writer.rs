//! The writer thread behind [`crate::log`]: log lines queued in memory, written to stderr in
//! batches.
//!
//! # Why batches
//!
//! A writer thread woken for every line costs each line a futex wake, a context switch and a
//! `write(2)` on the other CPU. On a hook server answering a call every 100 µs that was most of
//! its CPU per call (runtime-hooks' per-call info line: some 65 µs of 131 µs, measured with
//! `benches/hook_rtt.rs`). So the thread is woken only by the first line after it went idle;
//! it then waits [`LINGER`] for more, takes everything queued and writes it with one
//! `write_all`. A burst of lines costs one wake and one write; a lone line is on stderr
//! [`LINGER`] later; an idle daemon's writer thread never wakes.
//!
//! # Bounds and losses
//!
//! The queue holds at most a given number of lines ([`crate::log::QUEUE_LINES`]); a line past
//! that is dropped and counted, so a stalled stderr never stops a caller. A batch whose write
//! fails (`EPIPE`, `EBADF`, `ENOSPC`) is dropped and its lines counted. Lines logged after
//! [`BatchGuard`] was dropped are dropped and counted.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// How long the writer thread waits, once woken by a line, for more lines to write with it.
pub const LINGER: Duration = Duration::from_millis(10);

/// How long dropping a [`BatchGuard`] waits for the queued lines to be written (a stalled
/// stderr must not keep the process from exiting).
pub const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// Lines logged and not yet taken by the writer thread.
#[derive(Default)]
struct Queue {
    /// The lines, one after another, each as the subscriber formatted it (newline included).
    bytes: Vec<u8>,
    /// How many lines `bytes` holds.
    lines: usize,
    /// Set by [`BatchGuard`]'s drop: write what is queued and stop.
    stopping: bool,
    /// Set by the writer thread once it has stopped.
    stopped: bool,
}

/// What the loggers and the writer thread share.
struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when the queue goes from empty to not empty, and at stop.
    wake: Condvar,
    /// Signalled when the writer thread has stopped.
    done: Condvar,
    /// Most lines queued.
    limit: usize,
    /// Lines dropped because the queue was full or the writer had stopped.
    queue_drops: AtomicU64,
    /// Lines in batches whose write failed.
    write_failures: AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues one line; wakes the writer thread if the queue was empty.
    fn push(&self, line: &[u8]) {
        let mut q = self.lock();
        if q.stopped || q.lines >= self.limit {
            drop(q);
            self.queue_drops.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let was_empty = q.lines == 0;
        q.bytes.extend_from_slice(line);
        q.lines += 1;
        drop(q);
        if was_empty {
            self.wake.notify_one();
        }
    }
}

/// The loggers' side: a [`MakeWriter`] for `tracing_subscriber::fmt`, each event one line.
#[derive(Clone)]
pub struct BatchWriter {
    shared: Arc<Shared>,
}

/// Keeps the writer thread; dropping it writes out what is queued (waiting at most
/// [`FLUSH_WAIT`]) and stops the thread.
#[must_use = "dropping it stops the writer thread"]
pub struct BatchGuard {
    shared: Arc<Shared>,
}

impl BatchWriter {
    /// Starts a writer thread named `name` writing to `out`, queueing at most `limit` lines and
    /// waiting `linger` for more after the first.
    ///
    /// Errors: the thread cannot be spawned.
    pub fn spawn<W: Write + Send + 'static>(out: W, limit: usize, linger: Duration, name: &str) -> io::Result<(BatchWriter, BatchGuard)> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            done: Condvar::new(),
            limit,
            queue_drops: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
        });
        let thread = shared.clone();
        std::thread::Builder::new().name(name.to_owned()).spawn(move || write_batches(&thread, out, linger))?;
        Ok((BatchWriter { shared: shared.clone() }, BatchGuard { shared }))
    }

    /// Lines lost so far: dropped (queue full, or logged after the stop) or in a batch whose
    /// write failed.
    pub fn lost_lines(&self) -> u64 {
        self.shared.queue_drops.load(Ordering::Relaxed) + self.shared.write_failures.load(Ordering::Relaxed)
    }
}

/// The writer thread: waits for a line, lingers, writes everything queued in one `write_all`;
/// until stopped.
fn write_batches<W: Write>(shared: &Shared, mut out: W, linger: Duration) {
    let mut batch = Vec::new();
    loop {
        let mut q = shared.lock();
        while q.lines == 0 && !q.stopping {
            q = shared.wake.wait(q).unwrap_or_else(|e| e.into_inner());
        }
        // Linger for more lines (cut short by a stop).
        q = shared.wake.wait_timeout_while(q, linger, |q| !q.stopping).unwrap_or_else(|e| e.into_inner()).0;
        batch.clear();
        std::mem::swap(&mut batch, &mut q.bytes);
        let (lines, stopping) = (std::mem::take(&mut q.lines), q.stopping);
        drop(q);
        if lines > 0 && out.write_all(&batch).and_then(|()| out.flush()).is_err() {
            shared.write_failures.fetch_add(lines as u64, Ordering::Relaxed);
        }
        if stopping {
            shared.lock().stopped = true;
            shared.done.notify_all();
            return;
        }
    }
}

impl Drop for BatchGuard {
    fn drop(&mut self) {
        let mut q = self.shared.lock();
        q.stopping = true;
        self.shared.wake.notify_one();
        let deadline = Instant::now() + FLUSH_WAIT;
        while !q.stopped {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { break };
            q = self.shared.done.wait_timeout(q, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// One event's writer: the subscriber hands it the whole formatted line in one `write_all`.
pub struct LineWriter<'a>(&'a Shared);

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BatchWriter {
    type Writer = LineWriter<'a>;
    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter(&self.shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A writer recording each `write_all` (as one batch) and reporting it on a channel; blocked
    /// until `gate` lets it go, when there is a gate.
    struct Recorder {
        batches: mpsc::Sender<Vec<u8>>,
        gate: Option<mpsc::Receiver<()>>,
    }

    impl Write for Recorder {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(gate) = &self.gate {
                let _ = gate.recv_timeout(Duration::from_secs(5));
            }
            let _ = self.batches.send(buf.to_vec());
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn line(w: &BatchWriter, text: &str) {
        w.make_writer().write_all(text.as_bytes()).unwrap();
    }

    /// Lines logged close together reach the output in one write, in order; the guard's drop
    /// writes what is still queued.
    #[test]
    fn a_burst_is_one_write_and_the_drop_flushes() {
        let (tx, rx) = mpsc::channel();
        let (w, guard) = BatchWriter::spawn(Recorder { batches: tx, gate: None }, 100, Duration::from_millis(200), "t").unwrap();
        for i in 0..5 {
            line(&w, &format!("line {i}\n"));
        }
        let first = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(String::from_utf8(first).unwrap(), "line 0\nline 1\nline 2\nline 3\nline 4\n");
        line(&w, "last\n");
        drop(guard);
        assert_eq!(rx.try_recv().unwrap(), b"last\n", "written before the drop returned");
        line(&w, "after the stop\n");
        assert_eq!(w.lost_lines(), 1, "a line after the stop is counted");
    }

    /// With the output stalled, the queue takes `limit` lines and counts the rest as lost; the
    /// loggers never wait.
    #[test]
    fn a_stalled_output_drops_and_counts_past_the_limit() {
        let (tx, rx) = mpsc::channel();
        let (open, gate) = mpsc::channel();
        let (w, guard) = BatchWriter::spawn(Recorder { batches: tx, gate: Some(gate) }, 3, Duration::ZERO, "t").unwrap();
        line(&w, "first\n");
        // Wait until the writer thread has taken the first line and is blocked writing it.
        let start = Instant::now();
        while w.shared.lock().lines > 0 {
            assert!(start.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(1));
        }
        for i in 0..5 {
            line(&w, &format!("queued {i}\n"));
        }
        assert_eq!(w.lost_lines(), 2, "3 queued, 2 dropped");
        open.send(()).unwrap();
        open.send(()).unwrap();
        drop(guard);
        let got: Vec<Vec<u8>> = rx.try_iter().collect();
        assert_eq!(got, vec![b"first\n".to_vec(), b"queued 0\nqueued 1\nqueued 2\n".to_vec()]);
    }

    /// A pipe whose reader is closed: the batch's write fails (EPIPE; SIGPIPE is ignored in Rust
    /// programs, the test harness included) and its lines are counted.
    #[test]
    fn a_failed_write_counts_its_lines() {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-element array it is given.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both descriptors were just created and are owned here, each closed once.
        let (reader, writer) = unsafe {
            use std::os::fd::FromRawFd;
            (std::fs::File::from_raw_fd(fds[0]), std::fs::File::from_raw_fd(fds[1]))
        };
        drop(reader);
        let (w, guard) = BatchWriter::spawn(writer, 100, Duration::from_millis(50), "t").unwrap();
        line(&w, "a\n");
        line(&w, "b\n");
        drop(guard);
        assert_eq!(w.lost_lines(), 2);
    }
}
