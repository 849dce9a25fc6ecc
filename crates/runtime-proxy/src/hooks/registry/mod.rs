//! Hook-server registry: the JSON files in the hook config directory (`--hook-config-dir`,
//! default `/etc/runtime/hookserver.d`), validated and hot-reloaded into an immutable
//! [`Snapshot`] that the dispatcher loads once per CRI call.
//!
//! # Files
//!
//! Every entry of the directory (not recursive) whose name ends with `json` — koord's own rule, so
//! `koordlet.json` and also `foojson` — and does not start with `.` is one hook server, named by
//! its file name. Hidden names are skipped so that ConfigMap volumes (`..data`,
//! `..2024_01_01_00_00_00.123`) and editors' or atomic writers' temp files (`.x.json.swp`,
//! `.#x.json`, `.tmpAbC`) are never read; so are other names (`x.json~`, `x.json.bak`,
//! `README`), each logged once (info; hidden ones at debug). Symlinks are followed (ConfigMap
//! volumes: `x.json -> ..data/x.json`).
//!
//! Only regular files are opened: an entry named like a registration that is a directory, a
//! FIFO (opening one for reading would block until a writer comes), a socket or a device (opening
//! one can act on it), or a symlink to one of those, is rejected by its type without being
//! opened; so is a dangling symlink (and a symlink loop, a file over [`MAX_FILE_SIZE`] by its
//! size, a file that cannot be read).
//!
//! # Format
//!
//! koord-runtime-proxy's `RuntimeHookConfig`, as koordlet writes it, plus optional keys of ours:
//!
//! ```json
//! { "remote-endpoint": "/var/run/koordlet/koordlet.sock",
//!   "failure-policy": "Ignore",
//!   "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
//!   "timeout-ms": 2000,
//!   "order": 0 }
//! ```
//!
//! * `remote-endpoint` (required): the hook server's unix socket, `PATH`, `unix://PATH` or
//!   `unix:PATH`; the path must be absolute.
//! * `failure-policy`: `"Fail"`, `"Ignore"`, `""` or absent (both = Ignore, as koord's `PolicyNone`).
//!   A policy that cannot be read — any other value, a value that is not a string, or the key
//!   itself misspelt (`failure_policy`, `failurePolicy`, `failure-polcy`) while `failure-policy`
//!   is absent — is taken as **Fail**, with a warning (koord would silently treat it as Ignore,
//!   so a fail-closed server would become fail-open; koordlet itself refuses to start with any
//!   other value, so only hand-written files are affected). Rejecting the file instead would
//!   leave a new server uncalled, which is Ignore again.
//! * `runtime-hooks`: stage names ([`Stage`]), in any order; duplicates collapse. An unknown
//!   name is skipped with a warning, `PreRemoveRunPodSandbox` (which koordlet registers but no
//!   proxy calls) is skipped silently. A file without any usable stage still registers a server
//!   that is never called.
//! * `timeout-ms` (ours): per-call timeout in milliseconds, `1..=300000`, default 2000.
//! * `order` (ours): a 32-bit signed integer, default 0. Servers are called in ascending
//!   `(order, file name)`.
//! * `allowed-uids` (ours): the uids the process serving the socket may run as, checked on
//!   every new connection with `SO_PEERCRED`; default root and the proxy's own uid. A server
//!   run by anyone else fails its calls (under its failure policy), naming the uid and pid.
//! * `conflict-policy` (ours): `"Warn"`, `"Fail"`, `""` or absent (= `--hook-conflict-policy`):
//!   what a field conflict this server causes in a hook chain does to the call
//!   ([`crate::hooks::chain`]). Read like `failure-policy`: a value that cannot be read, or the
//!   key misspelt, is **Fail** with a warning.
//!
//! Unknown keys are ignored with a warning naming the key and the known key it probably means
//! ([`likely_key`]: the same letters with other separators or case, or a couple of typos away),
//! so `"timeout_ms": 500` does not pass for the default 2000 ms unseen. `null` counts as absent.
//! As in Go's `encoding/json`, a key that matches none exactly is matched ignoring ASCII case,
//! and the last of duplicate keys wins.
//!
//! # Reserved sockets
//!
//! [`Registry::open_reserving`] is given the sockets no hook server may be: the proxy's own
//! (every hook call would come back to the proxy as a CRI call it cannot serve) and the
//! runtime's (containerd would be sent hook calls). A file naming one, however spelt (symlinks,
//! `..`), is rejected ([`ConfigError::ReservedEndpoint`]).
//!
//! # Bad files
//!
//! A file that cannot be used (bad JSON — including a half-written one — empty, wrong types,
//! missing endpoint, not a regular file, over 1 MiB, unreadable) is logged at warn with its name
//! and reason once (again only when the reason changes), listed in [`Snapshot::rejected`] (so
//! counted by `runtime_proxy_hook_config_rejected`), and skipped; if an earlier version of it
//! was good, **that version stays registered** until the file is fixed or deleted. koordlet
//! rewrites `koordlet.json` in place (truncate, then write), so readers do see empty and partial
//! files; the write that completes the file is the next inotify event, and it is read again.
//! Deleting a file removes its server; so does a symlink whose target is deleted (rejected as
//! dangling until it is removed too).
//!
//! # Reload
//!
//! [`Registry::rescan`] re-reads the whole directory and swaps in a new snapshot if anything
//! (servers or rejections) changed. [`Registry::spawn_watcher`] runs it after every burst of
//! inotify events in the directory (debounced) and every 30 s as a safety net; the latter also
//! catches what inotify cannot see, such as symlink targets outside the directory being rewritten.
//! A directory removed and recreated is watched (and rescanned) again within 250 ms of its return.

//!
//! # Parts
//!
//! * [`parse`](mod@parse) — one registration file: its keys, values and errors.
//! * [`snapshot`] — the directory scanned into immutable snapshots ([`Registry::rescan`]).
//! * [`watch`] — inotify and the periodic rescan ([`Registry::spawn_watcher_with`]).

pub mod parse;
pub mod snapshot;
pub mod watch;

pub use parse::*;
pub use snapshot::*;
pub use watch::*;

#[cfg(test)]
mod test_util;
