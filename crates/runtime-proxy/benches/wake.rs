//! The floor under every hop: how long a thread asleep on a unix socket takes to answer, by how
//! long it has been asleep.
//!
//! Two threads on two CPUs (pinned: on one CPU the kernel would run the echo in the caller's
//! place, with no wake-up of an idle CPU at all), a socket pair. The echo thread blocks in
//! `read(2)`, answers the byte it gets and blocks again. The caller waits `gap` µs after the
//! echo's last answer (spinning, so that only the echo's CPU idles), writes one byte and times
//! the round trip. The gaps take turns call by call, so the machine's state drifts alike for all.
//! Every hop of a proxied call is such a wake-up; on a VM whose idle CPUs halt, a longer-idle
//! peer answers later, and a hook call leaves the backend (and the proxy) idle for its whole
//! length (docs/benchmarks.md, "where (3) waits").
//!
//! Run: `cargo bench -p runtime-proxy --bench wake` (part of `make bench`; nothing else needed).
//! `RP_BENCH_CALLS` sets the round trips per gap (default 3000), after 300 warm-up rounds.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Idle times of the echo thread before each call, µs.
const GAPS_US: [u64; 7] = [0, 25, 50, 100, 200, 400, 800];
const WARM_UP: usize = 300;

fn main() {
    let calls: usize = std::env::var("RP_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let (mut caller, mut echo) = UnixStream::pair().expect("a socket pair");
    pin_to_cpu(0);
    let echo_thread = std::thread::spawn(move || {
        pin_to_cpu(1);
        let mut byte = [0u8; 1];
        while echo.read_exact(&mut byte).is_ok() {
            if echo.write_all(&byte).is_err() {
                break;
            }
        }
    });
    let mut rtts: Vec<Vec<Duration>> = vec![Vec::with_capacity(calls); GAPS_US.len()];
    let mut last = Instant::now();
    for round in 0..WARM_UP + calls {
        for k in 0..GAPS_US.len() {
            let g = (k + round) % GAPS_US.len();
            let until = last + Duration::from_micros(GAPS_US[g]);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            let started = Instant::now();
            caller.write_all(&[1]).expect("write to the echo thread");
            caller.read_exact(&mut [0u8; 1]).expect("the echo's answer");
            last = Instant::now();
            if round >= WARM_UP {
                rtts[g].push(last - started);
            }
        }
    }
    drop(caller);
    let _ = echo_thread.join();
    println!("### Wake-up after idle — `cargo bench -p runtime-proxy --bench wake` ({calls} round trips per gap, interleaved)\n");
    println!("One byte to a thread blocked in read(2) on a unix socket and back, after the thread has been idle for the gap.\n");
    println!("| idle before the call | round trip p50 | p90 | p99 |");
    println!("|---|---|---|---|");
    for (g, samples) in GAPS_US.iter().zip(rtts.iter_mut()) {
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_micros();
        println!("| {g} µs | {} µs | {} µs | {} µs |", at(0.5), at(0.9), at(0.99));
    }
}

/// Pins the calling thread to CPU `cpu` (`sched_setaffinity(2)`); a failure (fewer CPUs, a
/// cpuset without it) is reported and the bench goes on unpinned.
fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if r != 0 {
        eprintln!("cannot pin to CPU {cpu}: {}; unpinned", std::io::Error::last_os_error());
    }
}
