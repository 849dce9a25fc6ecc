//! Where a call's work runs: the proxy's one thread, or — for a call whose request is large —
//! a thread of its own, so that what one pod author writes never holds up another pod's call.
//!
//! # The runtime model
//!
//! The proxy serves every connection on one thread (a current-thread tokio runtime: see the
//! binary's `main.rs` for why). Per call that thread does work in proportion to the request:
//! decoding it, building the hook request, encoding it for each hook server, merging the
//! answers and editing the request. For kubelet's usual calls (a few KiB) that is microseconds;
//! for a request of 16 MiB (`--max-request-bytes`: a container of a million env entries, from
//! `envFrom` on large ConfigMaps) it is most of a second, during which no other call would move.
//!
//! So a call whose request body is [`HEAVY_REQUEST_BYTES`] or more runs its whole hook flow on a
//! thread of the blocking pool (`tokio::task::spawn_blocking`), polled there with the
//! runtime's handle (`Handle::block_on`): its I/O and timers are still driven by the proxy's
//! thread, its CPU work is not. At most [`HEAVY_CALLS`] such calls run at once; more wait their
//! turn (without a thread), which bounds the memory large calls can hold at once to about
//! `HEAVY_CALLS` × their peak each. Small calls never leave the proxy's thread: no cross-thread
//! wake-up is paid on the common path.

use std::future::Future;

use tokio::sync::Semaphore;

/// The request body size (bytes, as received: compressed or not) from which a call runs off the
/// proxy's thread: 256 KiB, above any request kubelet sends for an ordinary pod (its largest are
/// CreateContainer requests of a few KiB to tens of KiB) and below what costs the thread more
/// than a few milliseconds to decode and re-encode.
pub const HEAVY_REQUEST_BYTES: usize = 256 << 10;

/// How many heavy calls run at once (each on a blocking-pool thread); the others wait their turn.
pub const HEAVY_CALLS: usize = 2;

/// Runs heavy calls off the proxy's thread, [`HEAVY_CALLS`] at a time (see the module doc).
#[derive(Debug)]
pub struct Offload {
    turns: Semaphore,
}

impl Default for Offload {
    fn default() -> Self {
        Offload { turns: Semaphore::new(HEAVY_CALLS) }
    }
}

impl Offload {
    /// Runs `work`, the rest of a call whose request body is `request_bytes` long: here when it
    /// is small, else on a blocking-pool thread once a turn is free. A panic in `work` is
    /// resumed here, as if it had run on this task.
    pub async fn run<F>(&self, request_bytes: usize, work: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        if request_bytes < HEAVY_REQUEST_BYTES {
            return work.await;
        }
        // The semaphore is never closed: `acquire` cannot fail.
        let _turn = self.turns.acquire().await.ok();
        let handle = tokio::runtime::Handle::current();
        match tokio::task::spawn_blocking(move || handle.block_on(work)).await {
            Ok(output) => output,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// On a current-thread runtime (the proxy's), a heavy call's CPU work does not hold up a
    /// timer on the runtime's thread, and its own I/O and timers still complete; a small call
    /// runs in place.
    #[test]
    fn heavy_work_leaves_the_runtime_thread_free() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let offload = std::sync::Arc::new(Offload::default());
            let runtime_thread = std::thread::current().id();
            let small = offload.run(10, async { std::thread::current().id() }).await;
            assert_eq!(small, runtime_thread, "a small call stays on the runtime's thread");
            let o = offload.clone();
            let heavy = tokio::spawn(async move {
                o.run(HEAVY_REQUEST_BYTES, async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    let busy = Instant::now();
                    while busy.elapsed() < Duration::from_millis(600) {
                        std::hint::spin_loop();
                    }
                    std::thread::current().id()
                })
                .await
            });
            // The runtime's thread keeps its timers while the heavy call spins.
            let mut slowest = Duration::ZERO;
            for _ in 0..20 {
                let t = Instant::now();
                tokio::time::sleep(Duration::from_millis(20)).await;
                slowest = slowest.max(t.elapsed());
            }
            let heavy_thread = heavy.await.unwrap();
            assert_ne!(heavy_thread, runtime_thread, "the heavy call ran elsewhere");
            assert!(slowest < Duration::from_millis(300), "a 20 ms timer took {slowest:?} while the heavy call spun");
        });
    }
}
