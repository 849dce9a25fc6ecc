//! What runtime-proxy and runtime-hooks share as node daemons, beyond the hook protocol:
//!
//! * [`log`] — logging to stderr that never stops or slows the daemon: a log pipe that breaks
//!   (the reader of `2>&1 | logger` gone, a log shipper restarted) or stalls costs log lines,
//!   counted, never a panic, a SIGPIPE death or a blocked request.
//! * [`klog`] — the klog flags koord-runtime-proxy's command line accepts (`--v=4`,
//!   `--logtostderr`, `--log-dir`, …): accepted, mapped or ignored, with one deprecation notice,
//!   so a unit written for koord starts these binaries unchanged.
//! * [`addr`] — the forms of `--metrics-addr` (and `--debug-addr`).
//! * [`status`] — `runtime-proxy status` / `runtime-hooks status`: `GET /status` from the admin
//!   endpoint, a table or JSON, exit codes 0 (healthy), 1 (unhealthy), 2 (no status).

#![warn(missing_docs)]

pub mod addr;
pub mod klog;
pub mod log;
pub mod status;
