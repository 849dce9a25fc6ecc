//! What runtime-proxy and runtime-hooks share as node daemons, beyond the hook protocol.
//!
//! # Modules
//!
//! * [`alloc`] — the allocator both daemons use (mimalloc), and why.
//! * [`log`] — logging to stderr that never stops or slows the daemon: a log pipe that breaks
//!   (the reader of `2>&1 | logger` gone, a log shipper restarted) or stalls costs log lines,
//!   counted, never a panic, a SIGPIPE death or a blocked request.
//! * [`klog`] — the klog flags koord-runtime-proxy's command line accepts (`--v=4`,
//!   `--logtostderr`, `--log-dir`, …): accepted, mapped or ignored, with one deprecation notice,
//!   so a unit written for koord starts these binaries unchanged.
//! * [`cli_args`] — the command line read: koord's klog spellings, then clap, a mistyped flag's
//!   suggestion the flag sharing its words (`--backend-runtime-endpoint`: did you mean
//!   `--remote-runtime-service-endpoint`?).
//! * [`signals`] — what every signal a service manager or an operator may send does: graceful
//!   stop, stop at once, reload, ignored.
//! * [`daemon`] — the part of `main` both daemons share: logging, signals, run, exit code.
//! * [`duration`] — the duration flags' syntax (`500ms`, `10s`, `2m`, `1h`, `0`).
//! * [`addr`] — the forms of `--metrics-addr` (and `--debug-addr`).
//! * [`sd_notify`] — systemd's readiness notification (`READY=1`, `STOPPING=1`) and
//!   [`sd_notify::notify_systemd`], which both binaries call.
//! * [`socket`] — binding a listening unix socket: its directory made, a stale socket replaced,
//!   a live one or a non-socket never touched.
//! * [`uds`] — a unix stream socket registered with tokio's reactor for readability only, so
//!   that a peer reading what we wrote does not wake us (the proxy's client, runtime and hook
//!   connections; runtime-hooks' served connections).
//! * [`status`] — `runtime-proxy status` / `runtime-hooks status`: `GET /status` from the admin
//!   socket (or, when asked, the TCP admin endpoint), a table or JSON with control characters
//!   escaped, exit codes 0 (healthy), 1 (unhealthy), 2 (no status).
//! * [`admin_http`] — the admin endpoints' listeners and serve loop, with bounded connections,
//!   head size and time; the root-only admin socket.
//! * [`rlimit`] — the open files limit raised from soft to hard at start.
//! * [`escape`] — control characters (ESC, CR, C1, …) made visible in `status` and the log.

pub mod addr;
pub mod admin_http;
pub mod alloc;
pub mod cli_args;
pub mod daemon;
pub mod duration;
pub mod escape;
pub mod klog;
pub mod log;
pub mod rlimit;
pub mod sd_notify;
pub mod signals;
pub mod socket;
pub mod status;
pub mod uds;
