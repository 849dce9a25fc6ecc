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
//! koord-runtime-proxy's `RuntimeHookConfig`, as koordlet writes it, plus two optional keys:
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

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context as _};
use arc_swap::ArcSwap;
use hook_api::MAX_SOCKET_PATH;
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher as _};
use serde_json::{Map, Value};
use tokio::sync::{watch, Notify};

/// Default per-call timeout of a hook server without `timeout-ms`: 2 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest accepted `timeout-ms`: 5 min (300 000 ms).
pub const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest config file read (bytes): 1 MiB. koordlet's file is about 200 bytes.
pub const MAX_FILE_SIZE: usize = 1 << 20;

/// Stage names koordlet registers that no proxy ever calls; accepted in `runtime-hooks` and
/// skipped without a warning.
pub const KNOWN_UNCALLED_STAGES: &[&str] = &["PreRemoveRunPodSandbox"];

/// The JSON keys, as koordlet writes them (the first three) and ours (the last two).
pub mod keys {
    /// Required: the hook server's unix socket.
    pub const REMOTE_ENDPOINT: &str = "remote-endpoint";
    /// `"Fail"`, `"Ignore"` or `""`.
    pub const FAILURE_POLICY: &str = "failure-policy";
    /// Array of stage names.
    pub const RUNTIME_HOOKS: &str = "runtime-hooks";
    /// Ours: per-call timeout in milliseconds.
    pub const TIMEOUT_MS: &str = "timeout-ms";
    /// Ours: call order, ascending.
    pub const ORDER: &str = "order";
    /// Ours: the uids the hook server process may run as (checked with SO_PEERCRED).
    pub const ALLOWED_UIDS: &str = "allowed-uids";
    /// Every key the proxy reads, in the order of the documentation.
    pub const ALL: [&str; 6] = [REMOTE_ENDPOINT, FAILURE_POLICY, RUNTIME_HOOKS, TIMEOUT_MS, ORDER, ALLOWED_UIDS];
}

/// The known key an unknown `key` probably means, if any: equal to it once case and separators
/// (`-`, `_`, `.`, spaces) are dropped (`failure_policy`, `failurePolicy`, `TIMEOUT_MS`), at most
/// two edits from it so compared (`failure-polcy`, `timout-ms`), or, from four letters on, a
/// part of it (`policy`, `timeout`, `hooks`, `uids`).
pub fn likely_key(key: &str) -> Option<&'static str> {
    fn squash(s: &str) -> String {
        s.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
    }
    let k = squash(key);
    if k.is_empty() {
        return None;
    }
    let mut best: Option<(usize, &'static str)> = None;
    for known in keys::ALL {
        let q = squash(known);
        let distance = if k.len() >= 4 && q.contains(&k) { 1 } else { strsim::levenshtein(&k, &q) };
        if distance <= 2 && best.is_none_or(|(d, _)| distance < d) {
            best = Some((distance, known));
        }
    }
    best.map(|(_, known)| known)
}

// ---------------------------------------------------------------------------------------------
// Stage and FailurePolicy
// ---------------------------------------------------------------------------------------------

pub use hook_api::{Stage, UnknownStage};

/// What a failed call to a hook server does to the CRI call (see also [`HookServer::policy_explicit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailurePolicy {
    /// A `Pre*` hook's error rejects the CRI call. Post hooks' errors are ignored anyway.
    Fail,
    /// The error is logged and the CRI call goes on unchanged. Also what `""` and an absent
    /// `failure-policy` mean (koord's `PolicyNone`, which behaves exactly like Ignore).
    Ignore,
}

impl FailurePolicy {
    /// `"Fail"` or `"Ignore"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------
// HookServer and parse
// ---------------------------------------------------------------------------------------------

/// One registered hook server: one config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookServer {
    /// The config file's name, e.g. `koordlet.json`; unique within a snapshot.
    pub name: String,
    /// The config file's path (in the directory; may be a symlink).
    pub file: PathBuf,
    /// The hook server's unix socket path (absolute, without `unix://`).
    pub endpoint: PathBuf,
    /// `Fail` or `Ignore`.
    pub failure_policy: FailurePolicy,
    /// False when `failure-policy` was absent, `null` or `""` (koord's `PolicyNone`), which acts
    /// as [`FailurePolicy::Ignore`]; kept for logs only.
    pub policy_explicit: bool,
    /// The stages this server is called at; empty means it is never called.
    pub stages: BTreeSet<Stage>,
    /// Per-call timeout: `timeout-ms`, default [`DEFAULT_TIMEOUT`], at most [`MAX_TIMEOUT`].
    pub timeout: Duration,
    /// `order`, default 0: servers are called in ascending `(order, name)`.
    pub order: i32,
    /// `allowed-uids`: the uids the hook server process may run as (SO_PEERCRED); empty means
    /// the default, root and the proxy's own uid.
    pub allowed_uids: Vec<u32>,
    /// What [`parse`] warned about (unknown keys, an unreadable failure policy taken as Fail,
    /// unknown stages, …), each naming the file; empty for a clean file. The registry logs
    /// them when it takes the file up, and `runtime_proxy_hook_config_warnings` counts the
    /// servers that have any.
    pub warnings: Vec<String>,
}

impl HookServer {
    /// Whether this server is called at `stage`.
    pub fn has_stage(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }

    /// The stages as a comma-separated list (for logs).
    pub fn stages_list(&self) -> String {
        let names: Vec<&str> = self.stages.iter().map(|s| s.as_str()).collect();
        names.join(",")
    }
}

/// Why a config file is rejected. The `Display` text is the reason logged and shown by
/// [`Snapshot::rejected`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is empty or only whitespace (for koordlet's files: caught mid-rewrite).
    #[error("empty file (being written?)")]
    Empty,
    /// Larger than [`MAX_FILE_SIZE`].
    #[error("file larger than {max} bytes")]
    TooLarge {
        /// The limit, bytes.
        max: usize,
    },
    /// Not valid JSON, with serde_json's message (`EOF while parsing … at line 1 column 40` for a
    /// half-written file).
    #[error("invalid JSON: {0}")]
    Json(String),
    /// Valid JSON, but not an object.
    #[error("expected a JSON object, found {0}")]
    NotAnObject(&'static str),
    /// A known key holds a value of the wrong JSON type.
    #[error("\"{key}\" must be {expected}, found {found}")]
    WrongType {
        /// The JSON key.
        key: &'static str,
        /// What it must be.
        expected: &'static str,
        /// What it is.
        found: &'static str,
    },
    /// A number outside its allowed range.
    #[error("\"{key}\" = {value} is out of range {range}")]
    OutOfRange {
        /// The JSON key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// The allowed range.
        range: &'static str,
    },
    /// `remote-endpoint` absent, `null` or `""`.
    #[error("\"remote-endpoint\" is missing or empty")]
    MissingEndpoint,
    /// `remote-endpoint` is not a usable unix socket path.
    #[error("\"remote-endpoint\" {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The value as written.
        endpoint: String,
        /// Why it is unusable.
        reason: &'static str,
    },
    /// `remote-endpoint` is one of the sockets no hook server may be: the proxy's own or the
    /// runtime's (see [`Registry::open_reserving`]). Never returned by [`parse`].
    #[error("\"remote-endpoint\" {endpoint} is {what}: hook calls sent there would never reach a hook server")]
    ReservedEndpoint {
        /// The endpoint as resolved from the file.
        endpoint: String,
        /// Whose socket it is, e.g. `the proxy's own socket (--koord-runtimeproxy-endpoint)`.
        what: String,
    },
    /// Not a regular file (a directory, FIFO, socket or device), after following symlinks;
    /// never opened. Never returned by [`parse`].
    #[error("not a regular file ({0}); only regular files (or symlinks to them) are read")]
    NotRegularFile(&'static str),
    /// A symlink whose target does not exist (its server, if it had one, is removed as for a
    /// deleted file). Never returned by [`parse`].
    #[error("dangling symlink to {0}: nothing to read")]
    DanglingSymlink(String),
    /// The file could not be opened or read. Never returned by [`parse`].
    #[error("cannot read: {0}")]
    Read(String),
    /// The file (after following symlinks) or its directory may be written by someone other
    /// than root and the proxy's own user: refused (see [`check_trust`]). Never returned by
    /// [`parse`].
    #[error("untrusted: {0}")]
    Untrusted(String),
}

/// Whether a registration file or the hook config directory may be trusted, by its metadata
/// (symlinks followed): owned by root or by the proxy's effective uid, and not writable by its
/// group or by others (sshd's StrictModes rule). A registration decides the cgroups, CPU and
/// memory of every pod on the node; whoever can write one can run code as root in effect.
///
/// Errors: the reason, naming the owner uid and the mode, e.g. `owner uid 1000 is neither root
/// nor the proxy's uid 0` or `mode 0666 is group- or world-writable`.
pub fn check_trust(meta: &std::fs::Metadata) -> Result<(), String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let own = unsafe { libc::geteuid() };
    let (uid, mode) = (meta.uid(), meta.mode() & 0o7777);
    if uid != 0 && uid != own {
        return Err(format!("owner uid {uid} is neither root nor the proxy's uid {own}"));
    }
    if mode & 0o022 != 0 {
        return Err(format!("mode {mode:04o} is group- or world-writable"));
    }
    Ok(())
}

/// What [`check_trust`]'s refusals add to the log: the rule and the way out.
const TRUST_RULE: &str = "registration files and their directory must be owned by root or the proxy's user and not group- or world-writable (--insecure-hook-config turns this check off)";

/// Parses one config file's contents. `file` names the server (its file name) and is kept in
/// [`HookServer::file`]; nothing is read from disk and nothing is logged above debug.
///
/// Returns the server and warnings, each naming the file: unknown stage names (skipped), no
/// usable stage, a socket path too long for `sun_path`.
///
/// Errors: see [`ConfigError`]; never [`ConfigError::NotRegularFile`] or [`ConfigError::Read`].
/// Never panics, whatever the bytes.
pub fn parse(file: &Path, bytes: &[u8]) -> Result<(HookServer, Vec<String>), ConfigError> {
    let name = file_name_of(file);
    if bytes.len() > MAX_FILE_SIZE {
        return Err(ConfigError::TooLarge { max: MAX_FILE_SIZE });
    }
    // A UTF-8 BOM (some editors add one) is not JSON; skip it rather than reject the file.
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ConfigError::Empty);
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| ConfigError::Json(e.to_string()))?;
    let Value::Object(obj) = value else {
        return Err(ConfigError::NotAnObject(json_kind(&value)));
    };
    let mut warnings = Vec::new();

    let endpoint = match field(&obj, keys::REMOTE_ENDPOINT) {
        None => return Err(ConfigError::MissingEndpoint),
        Some(Value::String(s)) => parse_endpoint(s)?,
        Some(v) => return Err(wrong_type(keys::REMOTE_ENDPOINT, "a string", v)),
    };
    if endpoint.as_os_str().len() > MAX_SOCKET_PATH {
        warnings.push(format!(
            "{name}: remote-endpoint {} is longer than {MAX_SOCKET_PATH} bytes; connecting to it will fail",
            endpoint.display()
        ));
    }

    let mut unreadable_policy = |why: String| {
        warnings.push(format!("{name}: {why}; the failure policy cannot be read, so Fail is used (fail closed) until the file is fixed"));
        (FailurePolicy::Fail, false)
    };
    let (failure_policy, policy_explicit) = match field(&obj, keys::FAILURE_POLICY) {
        None => match obj.keys().find(|k| !k.eq_ignore_ascii_case(keys::FAILURE_POLICY) && likely_key(k) == Some(keys::FAILURE_POLICY)) {
            Some(typo) => unreadable_policy(format!("key {typo:?} is not \"failure-policy\"")),
            None => (FailurePolicy::Ignore, false),
        },
        Some(Value::String(s)) => match s.as_str() {
            "" => (FailurePolicy::Ignore, false),
            "Fail" => (FailurePolicy::Fail, true),
            "Ignore" => (FailurePolicy::Ignore, true),
            other => unreadable_policy(format!("\"failure-policy\" {other:?} is neither \"Fail\" nor \"Ignore\" (case matters)")),
        },
        Some(v) => unreadable_policy(format!("\"failure-policy\" is {}, not a string", json_kind(v))),
    };
    for key in obj.keys().filter(|k| !keys::ALL.iter().any(|known| k.eq_ignore_ascii_case(known))) {
        warnings.push(match likely_key(key) {
            Some(known) => format!("{name}: unknown key {key:?} ignored; did you mean {known:?}?"),
            None => format!("{name}: unknown key {key:?} ignored (known keys: {})", keys::ALL.join(", ")),
        });
    }

    let mut stages = BTreeSet::new();
    match field(&obj, keys::RUNTIME_HOOKS) {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                let Value::String(s) = item else {
                    return Err(wrong_type(keys::RUNTIME_HOOKS, "an array of strings", item));
                };
                match s.parse::<Stage>() {
                    Ok(stage) => {
                        stages.insert(stage);
                    }
                    Err(_) if KNOWN_UNCALLED_STAGES.contains(&s.as_str()) => {
                        tracing::debug!(file = %name, stage = %s, "runtime hook stage never called by a proxy; skipped");
                    }
                    Err(_) => warnings.push(format!("{name}: unknown runtime hook {s:?} skipped")),
                }
            }
        }
        Some(v) => return Err(wrong_type(keys::RUNTIME_HOOKS, "an array of strings", v)),
    }
    if stages.is_empty() {
        warnings.push(format!("{name}: no usable runtime-hooks; this hook server is never called"));
    }

    let max_ms = u64::try_from(MAX_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
    let timeout = match integer_field(&obj, keys::TIMEOUT_MS, "an integer (milliseconds)", "1..=300000", |n| {
        n.as_u64().filter(|ms| (1..=max_ms).contains(ms))
    })? {
        None => DEFAULT_TIMEOUT,
        Some(ms) => Duration::from_millis(ms),
    };
    let order =
        integer_field(&obj, keys::ORDER, "an integer", "a 32-bit signed integer", |n| n.as_i64().and_then(|i| i32::try_from(i).ok()))?
            .unwrap_or(0);

    let mut allowed_uids = Vec::new();
    match field(&obj, keys::ALLOWED_UIDS) {
        None => {}
        Some(Value::Array(items)) => {
            for item in items {
                match item.as_u64().and_then(|n| u32::try_from(n).ok()) {
                    Some(uid) => allowed_uids.push(uid),
                    None => return Err(wrong_type(keys::ALLOWED_UIDS, "an array of uids (0..=4294967295)", item)),
                }
            }
        }
        Some(v) => return Err(wrong_type(keys::ALLOWED_UIDS, "an array of uids (0..=4294967295)", v)),
    }
    allowed_uids.sort_unstable();
    allowed_uids.dedup();

    let server = HookServer {
        name,
        file: file.to_path_buf(),
        endpoint,
        failure_policy,
        policy_explicit,
        stages,
        timeout,
        order,
        allowed_uids,
        warnings: warnings.clone(),
    };
    Ok((server, warnings))
}

/// The value of `key`, `null` counting as absent. Like Go's `encoding/json`: an exact match
/// first, else a key equal ignoring ASCII case.
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).or_else(|| obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v)).filter(|v| !v.is_null())
}

/// An optional integer key: `None` when absent or `null`; [`ConfigError::WrongType`] for a
/// non-number or a fraction, [`ConfigError::OutOfRange`] when `convert` refuses the integer.
fn integer_field<T>(
    obj: &Map<String, Value>,
    key: &'static str,
    expected: &'static str,
    range: &'static str,
    convert: impl FnOnce(&serde_json::Number) -> Option<T>,
) -> Result<Option<T>, ConfigError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Number(n)) if !n.is_f64() => {
            convert(n).map(Some).ok_or_else(|| ConfigError::OutOfRange { key, value: n.to_string(), range })
        }
        Some(v) => Err(wrong_type(key, expected, v)),
    }
}

fn wrong_type(key: &'static str, expected: &'static str, found: &Value) -> ConfigError {
    ConfigError::WrongType { key, expected, found: json_kind(found) }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `remote-endpoint` → the absolute socket path ([`hook_api::unix_socket_path`]).
fn parse_endpoint(raw: &str) -> Result<PathBuf, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::MissingEndpoint);
    }
    hook_api::unix_socket_path(raw).map(PathBuf::from).map_err(|reason| ConfigError::BadEndpoint { endpoint: raw.to_owned(), reason })
}

fn file_name_of(file: &Path) -> String {
    match file.file_name() {
        Some(n) => display_name(n),
        None => file.display().to_string(),
    }
}

/// A file name for logs and metric labels, losslessly: a UTF-8 name without `\` as it is,
/// any other with Rust's escapes (`\xFF` for a byte that is not UTF-8, `\\` for a backslash), so
/// two different names never look the same (`to_string_lossy` maps every bad byte to U+FFFD).
pub fn display_name(name: &std::ffi::OsStr) -> String {
    match name.to_str() {
        Some(s) if !s.contains('\\') => s.to_owned(),
        _ => {
            let debug = format!("{name:?}");
            debug[1..debug.len() - 1].to_owned()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Snapshot
// ---------------------------------------------------------------------------------------------

/// A config file currently rejected (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The file's name, e.g. `koordlet.json`.
    pub name: String,
    /// The file's path.
    pub file: PathBuf,
    /// Why; its `Display` is the reason.
    pub error: ConfigError,
    /// Whether an earlier good version of this file is still registered in its place.
    pub serving_last_good: bool,
}

/// An immutable view of the registry: the hook servers in call order and the rejected files.
#[derive(Debug, Default)]
pub struct Snapshot {
    servers: Vec<Arc<HookServer>>,
    /// Per stage (indexed by `Stage as usize`), the servers called there: in call order, each
    /// endpoint once.
    by_stage: [Vec<Arc<HookServer>>; Stage::ALL.len()],
    rejected: Vec<Rejected>,
    generation: u64,
}

impl Snapshot {
    /// A snapshot of `servers` (sorted into call order here) and `rejected` files.
    ///
    /// An endpoint registered by several files is called once per stage, as the first of those
    /// files in call order registers it; each such endpoint is returned with its files' names
    /// (in call order) so the caller can warn.
    pub fn new(mut servers: Vec<Arc<HookServer>>, rejected: Vec<Rejected>, generation: u64) -> (Snapshot, Vec<(PathBuf, Vec<String>)>) {
        servers.sort_by(|a, b| (a.order, &a.name, &a.file).cmp(&(b.order, &b.name, &b.file)));
        let mut by_stage: [Vec<Arc<HookServer>>; Stage::ALL.len()] = Default::default();
        for stage in Stage::ALL {
            for server in servers.iter().filter(|s| s.has_stage(stage)) {
                let list = &mut by_stage[stage as usize];
                if !list.iter().any(|s| s.endpoint == server.endpoint) {
                    list.push(server.clone());
                }
            }
        }
        let mut shared: Vec<(PathBuf, Vec<String>)> = Vec::new();
        for server in &servers {
            match shared.iter_mut().find(|(e, _)| *e == server.endpoint) {
                Some((_, names)) => names.push(server.name.clone()),
                None => shared.push((server.endpoint.clone(), vec![server.name.clone()])),
            }
        }
        shared.retain(|(_, names)| names.len() > 1);
        (Snapshot { servers, by_stage, rejected, generation }, shared)
    }

    /// Every registered server, sorted by ascending `(order, name)`.
    pub fn servers(&self) -> &[Arc<HookServer>] {
        &self.servers
    }

    /// The servers called at `stage`, in call order, each endpoint once (see [`Snapshot::new`]).
    pub fn for_stage(&self, stage: Stage) -> impl Iterator<Item = &Arc<HookServer>> + '_ {
        self.by_stage[stage as usize].iter()
    }

    /// The server registered by the file named `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Arc<HookServer>> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// True when no server is registered (rejected files do not count).
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The files rejected at the time of this snapshot, sorted by name.
    pub fn rejected(&self) -> &[Rejected] {
        &self.rejected
    }

    /// The generation this snapshot was published at (the value [`Registry::changed`] carries);
    /// 0 before the first scan.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

/// The hook servers registered in one directory, reloaded by [`Registry::rescan`] and the watcher.
pub struct Registry {
    dir: PathBuf,
    /// Whether [`check_trust`] applies (off with `--insecure-hook-config`).
    strict: bool,
    /// Sockets no hook server may be, with whose they are (see [`Registry::open_reserving`]).
    reserved: Vec<(PathBuf, String)>,
    current: ArcSwap<Snapshot>,
    /// Serialises scans; what the last one found, per file name.
    state: Mutex<ScanState>,
    generation: watch::Sender<u64>,
}

#[derive(Default)]
struct ScanState {
    /// The registered server per file name: the file's current version, or its last good one.
    good: BTreeMap<OsString, Arc<HookServer>>,
    rejected: BTreeMap<OsString, Rejected>,
    generation: u64,
    /// The directory problem last logged, so it is logged once rather than every scan.
    dir_problem: Option<String>,
    /// Entries that are not registration files by their name (logged once while they exist).
    ignored: BTreeSet<OsString>,
}

/// What reading one directory entry gave.
enum Loaded {
    /// Gone (deleted between listing and opening, or a dangling symlink).
    Absent,
    Good(HookServer, Vec<String>),
    Bad(ConfigError),
}

impl Registry {
    /// A registry of the directory `dir` that refuses untrusted files ([`check_trust`]);
    /// see [`Registry::open`].
    pub fn new(dir: impl Into<PathBuf>) -> Arc<Registry> {
        Registry::open(dir, true)
    }

    /// A registry of the directory `dir`, scanned once before returning; `strict`: refuse
    /// registration files that fail [`check_trust`], and every file while the directory does.
    ///
    /// A missing directory is created (mode 0755, parents too); if that fails, it is logged and
    /// the registry is empty until the directory appears (a watcher notices it within its rescan
    /// interval).
    pub fn open(dir: impl Into<PathBuf>, strict: bool) -> Arc<Registry> {
        Registry::open_reserving(dir, strict, Vec::new())
    }

    /// [`Registry::open`], rejecting every file whose `remote-endpoint` is one of the `reserved`
    /// sockets (compared with [`crate::same_socket`]: symlinks and `..` resolved), each given
    /// with whose it is, e.g. `the proxy's own socket (--koord-runtimeproxy-endpoint)`: the
    /// reason names it ([`ConfigError::ReservedEndpoint`]).
    pub fn open_reserving(dir: impl Into<PathBuf>, strict: bool, reserved: Vec<(PathBuf, String)>) -> Arc<Registry> {
        let dir = dir.into();
        if let Err(e) = std::fs::metadata(&dir) {
            if e.kind() == io::ErrorKind::NotFound {
                // The directory itself gets 0755 whatever the umask; missing parents get 0755 less
                // the umask (koord's MkdirAll(0755) applies the umask to both).
                let created = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&dir)
                    .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)));
                match created {
                    Ok(()) => tracing::info!(dir = %dir.display(), "created hook config directory"),
                    Err(e) => tracing::warn!(
                        dir = %dir.display(),
                        error = %e,
                        "cannot create hook config directory; no hook servers until it exists"
                    ),
                }
            }
        }
        let (generation, _) = watch::channel(0);
        if !strict {
            tracing::warn!(dir = %dir.display(), "--insecure-hook-config: registration files are trusted whoever owns or may write them");
        }
        let reg = Arc::new(Registry {
            dir,
            strict,
            reserved,
            current: ArcSwap::from_pointee(Snapshot::default()),
            state: Mutex::new(ScanState::default()),
            generation,
        });
        reg.rescan();
        reg
    }

    /// The directory scanned.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current snapshot: one atomic load, no lock; hold it for the whole CRI call.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// The files currently rejected, with reasons (a copy of [`Snapshot::rejected`]).
    pub fn rejected(&self) -> Vec<Rejected> {
        self.snapshot().rejected.clone()
    }

    /// A receiver of the generation counter, bumped each time a new snapshot is published (its
    /// servers or its rejected files changed). Rescans that change nothing do not bump it.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Re-reads every config file now and publishes a new snapshot if anything changed; logs
    /// what did (info: added, updated, removed; warn: rejected). Blocking file I/O: from async
    /// code, call it in `spawn_blocking`.
    ///
    /// A missing directory counts as empty. Any other error listing it (permissions, too many
    /// open files) keeps the current snapshot.
    pub fn rescan(&self) {
        let mut st = lock(&self.state);
        let entries = match list_dir(&self.dir) {
            Ok((entries, ignored)) => {
                if st.dir_problem.take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "hook config directory readable again");
                }
                for name in ignored.difference(&st.ignored) {
                    let shown = display_name(name);
                    if name.as_bytes().starts_with(b".") {
                        // ConfigMap volumes' `..data`, atomic writers' and editors' temp files.
                        tracing::debug!(file = %shown, "hidden entry in the hook config directory ignored");
                    } else {
                        tracing::info!(
                            file = %shown,
                            "not a registration file (its name does not end in json), ignored; registrations are named like koordlet.json"
                        );
                    }
                }
                st.ignored = ignored;
                entries
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let problem = "missing".to_owned();
                if st.dir_problem.as_ref() != Some(&problem) {
                    tracing::warn!(dir = %self.dir.display(), "hook config directory missing; no hook servers");
                    st.dir_problem = Some(problem);
                }
                Vec::new()
            }
            Err(e) => {
                let problem = e.to_string();
                if st.dir_problem.as_ref() != Some(&problem) {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        error = %e,
                        "cannot list hook config directory; keeping the current hook servers"
                    );
                    st.dir_problem = Some(problem);
                }
                return;
            }
        };

        // An untrusted directory taints every file in it (anyone may swap them).
        let dir_distrust = match std::fs::metadata(&self.dir) {
            Ok(m) if self.strict => check_trust(&m).err().map(|why| format!("directory {}: {why}", self.dir.display())),
            _ => None,
        };
        let mut good = BTreeMap::new();
        let mut rejected = BTreeMap::new();
        for (fname, path) in entries {
            let loaded = match &dir_distrust {
                Some(why) => Loaded::Bad(ConfigError::Untrusted(why.clone())),
                None => load(&path, self.strict, &self.reserved),
            };
            match loaded {
                Loaded::Absent => {}
                Loaded::Good(server, warnings) => {
                    let old = st.good.get(&fname);
                    let server = match old {
                        Some(old) if **old == server => old.clone(),
                        _ => {
                            log_registered(old.map(|o| &**o), &server, &warnings);
                            Arc::new(server)
                        }
                    };
                    if st.rejected.contains_key(&fname) {
                        tracing::info!(file = %server.name, "hook server config valid again");
                    }
                    good.insert(fname, server);
                }
                Loaded::Bad(error) => {
                    // An untrusted file is not served at all, not even its last good version; a
                    // dangling symlink is a file deleted (a ConfigMap key removed).
                    let last_good = st
                        .good
                        .get(&fname)
                        .cloned()
                        .filter(|_| !matches!(error, ConfigError::Untrusted(_) | ConfigError::DanglingSymlink(_)));
                    let r = Rejected { name: display_name(&fname), file: path, error, serving_last_good: last_good.is_some() };
                    if st.rejected.get(&fname) != Some(&r) {
                        if matches!(r.error, ConfigError::Untrusted(_)) {
                            tracing::warn!(file = %r.name, reason = %r.error, rule = TRUST_RULE, "hook server config refused");
                        }
                        match &last_good {
                            Some(prev) => tracing::warn!(
                                file = %r.name,
                                reason = %r.error,
                                endpoint = %prev.endpoint.display(),
                                "hook server config rejected; keeping its last good version"
                            ),
                            None => {
                                tracing::warn!(file = %r.name, reason = %r.error, "hook server config rejected")
                            }
                        }
                    }
                    if let Some(prev) = last_good {
                        good.insert(fname.clone(), prev);
                    }
                    rejected.insert(fname, r);
                }
            }
        }
        for (fname, old) in &st.good {
            if !good.contains_key(fname) {
                tracing::info!(
                    file = %old.name,
                    endpoint = %old.endpoint.display(),
                    "hook server removed"
                );
            }
        }
        for (fname, r) in &st.rejected {
            if !rejected.contains_key(fname) && !good.contains_key(fname) {
                tracing::debug!(file = %r.name, "rejected hook server config removed");
            }
        }

        if good == st.good && rejected == st.rejected {
            return;
        }
        st.generation += 1;
        let (snapshot, shared) = Snapshot::new(good.values().cloned().collect(), rejected.values().cloned().collect(), st.generation);
        for (endpoint, files) in shared {
            tracing::warn!(
                endpoint = %endpoint.display(),
                files = %files.join(", "),
                "one hook server endpoint registered by several files: called once per stage, with the settings of the first file in call order"
            );
        }
        st.good = good;
        st.rejected = rejected;
        tracing::debug!(
            generation = st.generation,
            servers = snapshot.servers.len(),
            rejected = snapshot.rejected.len(),
            "hook server snapshot published"
        );
        self.current.store(Arc::new(snapshot));
        self.generation.send_replace(st.generation);
    }

    /// Starts watching the directory with [`WatchOptions::default`]; see
    /// [`Registry::spawn_watcher_with`].
    pub fn spawn_watcher(self: &Arc<Self>) -> anyhow::Result<WatchHandle> {
        self.spawn_watcher_with(WatchOptions::default())
    }

    /// Starts a task on the current tokio runtime that rescans after every burst of inotify
    /// events in the directory (once it has been quiet for `debounce`, or `max_delay` after the
    /// first event of a continuous stream) and every `rescan_interval`. It rescans once at start,
    /// too. Dropping the handle stops it.
    ///
    /// If the watch cannot be set up (directory missing, inotify limits), that is logged and the
    /// task still rescans periodically, retrying the watch each time; the same happens if the
    /// directory is removed or replaced later.
    ///
    /// Errors: no tokio runtime is running; `rescan_interval` is zero.
    pub fn spawn_watcher_with(self: &Arc<Self>, opts: WatchOptions) -> anyhow::Result<WatchHandle> {
        let rt = tokio::runtime::Handle::try_current().context("the hook config watcher needs a tokio runtime")?;
        if opts.rescan_interval.is_zero() {
            bail!("hook config rescan interval must be > 0");
        }
        let signal = Arc::new(Signal::default());
        let mut dir_watch = DirWatch { dir: self.dir.clone(), signal: signal.clone(), watcher: None, id: None, problem: None };
        dir_watch.ensure(false);
        let task = rt.spawn(watch_loop(self.clone(), dir_watch, signal.clone(), opts));
        Ok(WatchHandle { task, signal })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn log_registered(old: Option<&HookServer>, new: &HookServer, warnings: &[String]) {
    for w in warnings {
        tracing::warn!(file = %new.name, "{w}");
    }
    let what = if old.is_some() { "hook server updated" } else { "hook server added" };
    tracing::info!(
        file = %new.name,
        endpoint = %new.endpoint.display(),
        stages = %new.stages_list(),
        failure_policy = %new.failure_policy,
        policy_explicit = new.policy_explicit,
        timeout_ms = new.timeout.as_millis() as u64,
        order = new.order,
        "{what}"
    );
}

/// Whether a directory entry's name is a config file: ends with `json` (koord's rule) and is not
/// hidden.
fn is_config_name(name: &std::ffi::OsStr) -> bool {
    let b = name.as_bytes();
    b.ends_with(b"json") && !b.starts_with(b".")
}

/// A directory's listing: its config files (name and path), sorted by name, and the names of
/// the other entries.
type Listing = (Vec<(OsString, PathBuf)>, BTreeSet<OsString>);

/// The config files in `dir`, sorted by name, and the names of the other entries (ignored).
/// Any error (also on one entry) fails the listing, so a half-read directory never removes
/// servers.
fn list_dir(dir: &Path) -> io::Result<Listing> {
    let (mut out, mut ignored) = (Vec::new(), BTreeSet::new());
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if is_config_name(&name) {
            out.push((name, entry.path()));
        } else {
            ignored.insert(name);
        }
    }
    out.sort();
    Ok((out, ignored))
}

/// What a file type is, for [`ConfigError::NotRegularFile`].
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

/// Reads and parses one config file, following symlinks (a ConfigMap's file is judged by its
/// target).
///
/// Nothing but a regular file is ever opened: the target's type is looked at first (`stat`),
/// because opening a FIFO blocks until a writer comes and opening a device can act (a tape
/// rewinds, a watchdog arms). A file larger than [`MAX_FILE_SIZE`] is refused by its size.
/// The open itself is `O_NONBLOCK` and the opened file's type checked again, so an entry
/// swapped for a FIFO in between cannot block the scan either. `strict`: refuses a file that
/// fails [`check_trust`]; a file naming a `reserved` socket is refused
/// ([`ConfigError::ReservedEndpoint`]). A dangling symlink is [`ConfigError::DanglingSymlink`];
/// an entry gone since the listing is [`Loaded::Absent`].
fn load(path: &Path, strict: bool, reserved: &[(PathBuf, String)]) -> Loaded {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return match std::fs::read_link(path) {
                Ok(target) => Loaded::Bad(ConfigError::DanglingSymlink(target.display().to_string())),
                Err(_) => Loaded::Absent,
            };
        }
        // ELOOP (a symlink loop), EACCES on a directory on the way, …
        Err(e) => return Loaded::Bad(ConfigError::Read(e.to_string())),
    };
    if !meta.is_file() {
        return Loaded::Bad(ConfigError::NotRegularFile(kind_of(meta.file_type())));
    }
    if meta.len() > MAX_FILE_SIZE as u64 {
        return Loaded::Bad(ConfigError::TooLarge { max: MAX_FILE_SIZE });
    }
    let file = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Loaded::Absent,
        Err(e) => return Loaded::Bad(ConfigError::Read(e.to_string())),
    };
    let meta = match file.metadata() {
        Ok(m) if m.is_file() => m,
        Ok(m) => return Loaded::Bad(ConfigError::NotRegularFile(kind_of(m.file_type()))),
        Err(e) => return Loaded::Bad(ConfigError::Read(e.to_string())),
    };
    if strict {
        if let Err(why) = check_trust(&meta) {
            return Loaded::Bad(ConfigError::Untrusted(why));
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FILE_SIZE as u64 + 1).read_to_end(&mut bytes) {
        return Loaded::Bad(ConfigError::Read(e.to_string()));
    }
    match parse(path, &bytes) {
        Ok((server, _)) if reserved.iter().any(|(p, _)| crate::same_socket(&server.endpoint, p)) => {
            let what = reserved.iter().find(|(p, _)| crate::same_socket(&server.endpoint, p)).map(|(_, w)| w.clone()).unwrap_or_default();
            Loaded::Bad(ConfigError::ReservedEndpoint { endpoint: server.endpoint.display().to_string(), what })
        }
        Ok((server, warnings)) => Loaded::Good(server, warnings),
        Err(e) => Loaded::Bad(e),
    }
}

// ---------------------------------------------------------------------------------------------
// Watcher
// ---------------------------------------------------------------------------------------------

/// Timing of [`Registry::spawn_watcher_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchOptions {
    /// Quiet time after the last event before rescanning; default 75 ms.
    pub debounce: Duration,
    /// Longest wait from the first event of a continuous stream; default 1 s.
    pub max_delay: Duration,
    /// Periodic full rescan (and watch health check); default 30 s; must be > 0.
    pub rescan_interval: Duration,
    /// While there is no watch (the directory is missing, e.g. deleted to be recreated), how often
    /// to try again; default 250 ms, so a recreated directory is served within about a second.
    pub retry_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            debounce: Duration::from_millis(75),
            max_delay: Duration::from_secs(1),
            rescan_interval: Duration::from_secs(30),
            retry_interval: Duration::from_millis(250),
        }
    }
}

/// Stops the watcher task (and its inotify watch) when dropped.
pub struct WatchHandle {
    task: tokio::task::JoinHandle<()>,
    signal: Arc<Signal>,
}

impl fmt::Debug for WatchHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchHandle").field("task", &self.task).finish_non_exhaustive()
    }
}

impl WatchHandle {
    /// Has the watcher task set up its inotify watch anew and rescan (SIGHUP): for when the
    /// watch may have missed something (an inotify queue overflow, a symlink's target outside
    /// the directory rewritten) and the next periodic rescan is too far off.
    pub fn rewatch(&self) {
        self.signal.rewatch.store(true, Ordering::Relaxed);
        self.signal.wake.notify_one();
    }
}

impl Drop for WatchHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Shared between notify's thread and the watcher task.
#[derive(Default)]
struct Signal {
    /// Something happened in the directory.
    wake: Notify,
    /// The directory itself went away or the watch reported an error: set up the watch anew.
    rewatch: AtomicBool,
}

/// The inotify watch on the directory, re-created when the directory is replaced.
struct DirWatch {
    dir: PathBuf,
    signal: Arc<Signal>,
    watcher: Option<notify::RecommendedWatcher>,
    /// `(dev, ino)` of the directory the watch was set up on.
    id: Option<(u64, u64)>,
    /// The problem last logged, so it is logged once.
    problem: Option<String>,
}

impl DirWatch {
    /// Makes sure a watch is set up on the directory as it is now (`force`: set it up anew).
    /// Returns true if a new watch was set up.
    fn ensure(&mut self, force: bool) -> bool {
        let id = std::fs::metadata(&self.dir).ok().map(|m| (m.dev(), m.ino()));
        if !force && self.watcher.is_some() && id.is_some() && id == self.id {
            return false;
        }
        self.watcher = None;
        self.id = id;
        if id.is_none() {
            self.report("directory missing".to_owned());
            return false;
        }
        match self.watch() {
            Ok(w) => {
                if self.problem.take().is_some() {
                    tracing::info!(dir = %self.dir.display(), "watching hook config directory again");
                } else {
                    tracing::debug!(dir = %self.dir.display(), "watching hook config directory");
                }
                self.watcher = Some(w);
                true
            }
            Err(e) => {
                self.report(e.to_string());
                false
            }
        }
    }

    fn watch(&self) -> notify::Result<notify::RecommendedWatcher> {
        let signal = self.signal.clone();
        let dir = self.dir.clone();
        let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| match res {
            Ok(ev) => {
                // Opens and read-only closes, our own scans' included: no change, and waking on
                // them would make every scan trigger the next.
                if let EventKind::Access(kind) = ev.kind {
                    if kind != AccessKind::Close(AccessMode::Write) {
                        return;
                    }
                }
                if matches!(ev.kind, EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))) && ev.paths.iter().any(|p| p == &dir) {
                    signal.rewatch.store(true, Ordering::Relaxed);
                }
                signal.wake.notify_one();
            }
            Err(e) => {
                tracing::debug!(error = %e, "hook config watch error; rescanning");
                signal.rewatch.store(true, Ordering::Relaxed);
                signal.wake.notify_one();
            }
        })?;
        w.watch(&self.dir, RecursiveMode::NonRecursive)?;
        Ok(w)
    }

    fn report(&mut self, problem: String) {
        if self.problem.as_ref() != Some(&problem) {
            tracing::warn!(
                dir = %self.dir.display(),
                problem = %problem,
                "cannot watch hook config directory; rescanning it periodically"
            );
            self.problem = Some(problem);
        }
    }
}

async fn watch_loop(reg: Arc<Registry>, mut dir_watch: DirWatch, signal: Arc<Signal>, opts: WatchOptions) {
    let mut tick = tokio::time::interval(opts.rescan_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // The first tick is immediate: catches changes made before the watch was set up.
            _ = tick.tick() => {
                dir_watch.ensure(false);
            }
            // No watch: the directory is missing (or could not be watched). Retry soon rather
            // than at the next tick, and rescan once it is back.
            () = tokio::time::sleep(opts.retry_interval), if dir_watch.watcher.is_none() => {
                if !dir_watch.ensure(false) {
                    continue;
                }
            }
            () = signal.wake.notified() => {
                let start = tokio::time::Instant::now();
                loop {
                    tokio::select! {
                        () = signal.wake.notified() => {
                            if start.elapsed() >= opts.max_delay {
                                break;
                            }
                        }
                        () = tokio::time::sleep(opts.debounce) => break,
                    }
                }
                if signal.rewatch.swap(false, Ordering::Relaxed) {
                    dir_watch.ensure(true);
                }
            }
        }
        let r = reg.clone();
        // A JoinError here means the runtime is shutting down; the next loop ends with it.
        let _ = tokio::task::spawn_blocking(move || r.rescan()).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write as _;
    use std::os::unix::fs::symlink;

    use proptest::prelude::*;

    /// koordlet's file as `proxyserver.Register()` writes it (Go `json.Marshal` of
    /// `RuntimeHookConfig`), with the manifest's double slash and stages in random order.
    const KOORDLET_JSON: &str = r#"{"remote-endpoint":"/var/run/koordlet//koordlet.sock","failure-policy":"Ignore","runtime-hooks":["PreUpdateContainerResources","PreRunPodSandbox","PreRemoveRunPodSandbox","PreCreateContainer","PreStartContainer","PostStopPodSandbox"]}"#;

    fn p(json: &str) -> Result<(HookServer, Vec<String>), ConfigError> {
        parse(Path::new("/etc/runtime/hookserver.d/test.json"), json.as_bytes())
    }

    fn ok(json: &str) -> HookServer {
        match p(json) {
            Ok((s, _)) => s,
            Err(e) => panic!("{json}: {e}"),
        }
    }

    fn server_json(endpoint: &str, extra: &str) -> String {
        format!(r#"{{"remote-endpoint":"{endpoint}","failure-policy":"Fail","runtime-hooks":["PreCreateContainer"]{extra}}}"#)
    }

    // ---- parse ----

    #[test]
    fn parses_koordlets_file() {
        let (s, warnings) = p(KOORDLET_JSON).unwrap();
        assert_eq!(s.name, "test.json");
        assert_eq!(s.file, Path::new("/etc/runtime/hookserver.d/test.json"));
        assert_eq!(s.endpoint, Path::new("/var/run/koordlet//koordlet.sock"));
        assert_eq!(s.failure_policy, FailurePolicy::Ignore);
        assert!(s.policy_explicit);
        assert_eq!(
            s.stages.iter().copied().collect::<Vec<_>>(),
            [
                Stage::PreRunPodSandbox,
                Stage::PostStopPodSandbox,
                Stage::PreCreateContainer,
                Stage::PreStartContainer,
                Stage::PreUpdateContainerResources
            ]
        );
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        assert_eq!(s.order, 0);
        // PreRemoveRunPodSandbox is silently skipped.
        assert!(warnings.is_empty(), "{warnings:?}");

        // The same, pretty-printed (json.MarshalIndent) with a trailing newline.
        let v: Value = serde_json::from_str(KOORDLET_JSON).unwrap();
        let pretty = serde_json::to_string_pretty(&v).unwrap() + "\n";
        assert_eq!(ok(&pretty), s);
    }

    #[test]
    fn stage_names_round_trip() {
        for st in Stage::ALL {
            assert_eq!(st.as_str().parse::<Stage>().unwrap(), st);
            assert_eq!(st.to_string(), st.as_str());
            assert_eq!(st.is_pre(), st.as_str().starts_with("Pre"));
        }
        assert!("PreRemoveRunPodSandbox".parse::<Stage>().is_err());
        assert!("prerunpodsandbox".parse::<Stage>().is_err());
    }

    #[test]
    fn unknown_and_duplicate_stages() {
        let (s, warnings) =
            p(r#"{"remote-endpoint":"/s.sock","runtime-hooks":["PostStopContainer","PreFutureThing","PostStopContainer",""]}"#).unwrap();
        assert_eq!(s.stages.iter().copied().collect::<Vec<_>>(), [Stage::PostStopContainer]);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("test.json") && warnings[0].contains("PreFutureThing"), "{warnings:?}");
    }

    #[test]
    fn no_usable_stage_registers_a_server_never_called() {
        for json in [
            r#"{"remote-endpoint":"/s.sock"}"#,
            r#"{"remote-endpoint":"/s.sock","runtime-hooks":[]}"#,
            r#"{"remote-endpoint":"/s.sock","runtime-hooks":null}"#,
            r#"{"remote-endpoint":"/s.sock","runtime-hooks":["PreRemoveRunPodSandbox"]}"#,
        ] {
            let (s, warnings) = p(json).unwrap();
            assert!(s.stages.is_empty());
            assert!(warnings.iter().any(|w| w.contains("never called")), "{json}: {warnings:?}");
        }
    }

    #[test]
    fn failure_policies() {
        let s = ok(r#"{"remote-endpoint":"/s.sock","failure-policy":"Fail"}"#);
        assert_eq!((s.failure_policy, s.policy_explicit), (FailurePolicy::Fail, true));
        for json in [
            r#"{"remote-endpoint":"/s.sock"}"#,
            r#"{"remote-endpoint":"/s.sock","failure-policy":""}"#,
            r#"{"remote-endpoint":"/s.sock","failure-policy":null}"#,
        ] {
            let s = ok(json);
            assert_eq!((s.failure_policy, s.policy_explicit), (FailurePolicy::Ignore, false), "{json}");
        }
    }

    /// A failure policy that cannot be read is Fail (fail closed), with a warning naming what
    /// was read: koord would make each of these Ignore, and a fail-closed server fail-open.
    #[test]
    fn an_unreadable_failure_policy_is_fail() {
        for (entry, says) in [
            (r#""failure-policy":"fail""#, r#""failure-policy" "fail" is neither "Fail" nor "Ignore""#),
            (r#""failure-policy":"IGNORE""#, r#""IGNORE" is neither"#),
            (r#""failure-policy":" Fail""#, r#"" Fail" is neither"#),
            (r#""failure-policy":1"#, r#""failure-policy" is a number, not a string"#),
            (r#""failure-policy":true"#, "is a boolean"),
            (r#""failure_policy":"Fail""#, r#"key "failure_policy" is not "failure-policy""#),
            (r#""failurePolicy":"Ignore""#, r#"key "failurePolicy" is not"#),
            (r#""failure-polcy":"Fail""#, r#"key "failure-polcy" is not"#),
            (r#""policy":"Fail""#, r#"key "policy" is not"#),
        ] {
            let json = format!(r#"{{"remote-endpoint":"/s.sock","runtime-hooks":["PreCreateContainer"],{entry}}}"#);
            let (server, warnings) = p(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(server.failure_policy, FailurePolicy::Fail, "{json}");
            assert!(warnings.iter().any(|w| w.contains(says) && w.contains("Fail is used")), "{json}: {warnings:?}");
            assert_eq!(server.warnings, warnings, "kept with the server");
        }
        // Spelt right but in another case: Go's encoding/json reads it, so do we.
        let s = ok(r#"{"remote-endpoint":"/s.sock","FAILURE-POLICY":"Fail"}"#);
        assert_eq!(s.failure_policy, FailurePolicy::Fail);
        // The right key wins over a look-alike; the look-alike is still reported.
        let (s, w) = p(r#"{"remote-endpoint":"/s.sock","failure-policy":"Ignore","failure_policy":"Fail"}"#).unwrap();
        assert_eq!(s.failure_policy, FailurePolicy::Ignore);
        assert!(w.iter().any(|w| w.contains(r#"unknown key "failure_policy" ignored; did you mean "failure-policy"?"#)), "{w:?}");
    }

    /// Every unknown key is a warning naming it and the key it probably means.
    #[test]
    fn unknown_keys_are_named_with_the_key_they_may_mean() {
        let (s, w) =
            p(r#"{"remote-endpoint":"/s.sock","runtime-hooks":["PreCreateContainer"],"timeout_ms":500,"Order ":3,"comment":"x"}"#).unwrap();
        assert_eq!((s.timeout, s.order), (DEFAULT_TIMEOUT, 0), "unknown keys are not read");
        let has = |part: &str| w.iter().any(|w| w.starts_with("test.json: ") && w.contains(part));
        assert!(has(r#"unknown key "timeout_ms" ignored; did you mean "timeout-ms"?"#), "{w:?}");
        assert!(has(r#"unknown key "Order " ignored; did you mean "order"?"#), "{w:?}");
        assert!(
            has(
                r#"unknown key "comment" ignored (known keys: remote-endpoint, failure-policy, runtime-hooks, timeout-ms, order, allowed-uids)"#
            ),
            "{w:?}"
        );
        for (typo, meant) in [
            ("timeoutMs", "timeout-ms"),
            ("timout-ms", "timeout-ms"),
            ("timeout", "timeout-ms"),
            ("remote_endpoint", "remote-endpoint"),
            ("runtimeHooks", "runtime-hooks"),
            ("hooks", "runtime-hooks"),
            ("allowed_uids", "allowed-uids"),
            ("uids", "allowed-uids"),
            ("oder", "order"),
        ] {
            assert_eq!(likely_key(typo), Some(meant), "{typo}");
        }
        for unrelated in ["comment", "name", "", "--", "x", "version"] {
            assert_eq!(likely_key(unrelated), None, "{unrelated}");
        }
        assert!(ok(KOORDLET_JSON).warnings.is_empty(), "koordlet's file is clean");
    }

    #[test]
    fn endpoints() {
        assert_eq!(ok(r#"{"remote-endpoint":"unix:///run/k.sock"}"#).endpoint, Path::new("/run/k.sock"));
        assert_eq!(ok(r#"{"remote-endpoint":"unix:/run/k.sock"}"#).endpoint, Path::new("/run/k.sock"));
        assert_eq!(ok(r#"{"remote-endpoint":"/run/k.sock"}"#).endpoint, Path::new("/run/k.sock"));
        for missing in [r#"{}"#, r#"{"remote-endpoint":""}"#, r#"{"remote-endpoint":null}"#, r#"{"failure-policy":"Fail"}"#] {
            assert_eq!(p(missing).unwrap_err(), ConfigError::MissingEndpoint, "{missing}");
        }
        for bad in ["unix://", "run/k.sock", "tcp://127.0.0.1:9000", "unix://run/k.sock", "/a\\u0000b"] {
            let json = format!(r#"{{"remote-endpoint":"{bad}"}}"#);
            assert!(matches!(p(&json), Err(ConfigError::BadEndpoint { .. })), "{bad}: {:?}", p(&json));
        }
        assert!(matches!(
            p(r#"{"remote-endpoint":["/run/k.sock"]}"#),
            Err(ConfigError::WrongType { key: "remote-endpoint", found: "an array", .. })
        ));
        let long = format!(r#"{{"remote-endpoint":"/{}","runtime-hooks":["PreStartContainer"]}}"#, "x".repeat(120));
        let (_, warnings) = p(&long).unwrap();
        assert!(warnings.iter().any(|w| w.contains("longer than")), "{warnings:?}");
    }

    #[test]
    fn allowed_uids() {
        assert!(ok(&server_json("/s.sock", "")).allowed_uids.is_empty(), "default: root and the proxy's uid");
        assert_eq!(ok(&server_json("/s.sock", r#","allowed-uids":[1000,0,1000]"#)).allowed_uids, [0, 1000]);
        for bad in [r#","allowed-uids":[-1]"#, r#","allowed-uids":["0"]"#, r#","allowed-uids":0"#, r#","allowed-uids":[4294967296]"#] {
            assert!(matches!(p(&server_json("/s.sock", bad)), Err(ConfigError::WrongType { key: "allowed-uids", .. })), "{bad}");
        }
    }

    #[test]
    fn timeout_and_order() {
        let s = ok(&server_json("/s.sock", r#","timeout-ms":500,"order":-5"#));
        assert_eq!((s.timeout, s.order), (Duration::from_millis(500), -5));
        let s = ok(&server_json("/s.sock", r#","timeout-ms":300000,"order":2147483647"#));
        assert_eq!((s.timeout, s.order), (MAX_TIMEOUT, i32::MAX));
        let s = ok(&server_json("/s.sock", r#","timeout-ms":null,"order":null"#));
        assert_eq!((s.timeout, s.order), (DEFAULT_TIMEOUT, 0));
        for (extra, key) in [
            (r#","timeout-ms":0"#, "timeout-ms"),
            (r#","timeout-ms":300001"#, "timeout-ms"),
            (r#","timeout-ms":-1"#, "timeout-ms"),
            (r#","timeout-ms":1e30"#, "timeout-ms"),
            (r#","order":2147483648"#, "order"),
            (r#","order":-99999999999999999999"#, "order"),
        ] {
            match p(&server_json("/s.sock", extra)) {
                Err(ConfigError::OutOfRange { key: k, .. }) | Err(ConfigError::WrongType { key: k, .. }) => {
                    assert_eq!(k, key, "{extra}")
                }
                other => panic!("{extra}: {other:?}"),
            }
        }
        for extra in [r#","timeout-ms":"2s""#, r#","timeout-ms":1.5"#, r#","order":"1""#, r#","order":0.5"#] {
            assert!(matches!(p(&server_json("/s.sock", extra)), Err(ConfigError::WrongType { .. })), "{extra}");
        }
    }

    #[test]
    fn garbage_empty_and_half_written() {
        assert_eq!(p("").unwrap_err(), ConfigError::Empty);
        assert_eq!(p(" \n\t").unwrap_err(), ConfigError::Empty);
        for n in 1..KOORDLET_JSON.len() {
            assert!(matches!(p(&KOORDLET_JSON[..n]), Err(ConfigError::Json(_))), "prefix {n}");
        }
        assert!(matches!(p("\u{0}\u{1}garbage"), Err(ConfigError::Json(_))));
        assert!(matches!(parse(Path::new("x.json"), &[0xff, 0xfe, 0x7b]), Err(ConfigError::Json(_))));
        assert_eq!(p("[1,2]").unwrap_err(), ConfigError::NotAnObject("an array"));
        assert_eq!(p("null").unwrap_err(), ConfigError::NotAnObject("null"));
        assert!(matches!(p(&format!("{KOORDLET_JSON}}}")), Err(ConfigError::Json(_))), "trailing bytes");
        assert!(matches!(p(&"[".repeat(10_000)), Err(ConfigError::Json(_))), "deep nesting");
        let big = format!(r#"{{"remote-endpoint":"/s.sock","pad":"{}"}}"#, " ".repeat(MAX_FILE_SIZE));
        assert_eq!(p(&big).unwrap_err(), ConfigError::TooLarge { max: MAX_FILE_SIZE });
        assert!(matches!(
            p(r#"{"remote-endpoint":"/s.sock","runtime-hooks":"PreCreateContainer"}"#),
            Err(ConfigError::WrongType { key: "runtime-hooks", .. })
        ));
        assert!(matches!(
            p(r#"{"remote-endpoint":"/s.sock","runtime-hooks":["PreCreateContainer",7]}"#),
            Err(ConfigError::WrongType { key: "runtime-hooks", .. })
        ));
    }

    #[test]
    fn go_json_leniencies() {
        // Unknown keys ignored, case-insensitive keys, last duplicate wins, BOM skipped.
        let s = ok("\u{feff}{\"Remote-Endpoint\":\"/a.sock\",\"FAILURE-POLICY\":\"Fail\",\"x\":{\"y\":[1]}}");
        assert_eq!((s.endpoint.as_path(), s.failure_policy), (Path::new("/a.sock"), FailurePolicy::Fail));
        let s = ok(r#"{"remote-endpoint":"/a.sock","remote-endpoint":"/b.sock"}"#);
        assert_eq!(s.endpoint, Path::new("/b.sock"));
        let s = ok(r#"{"REMOTE-ENDPOINT":"/a.sock","remote-endpoint":"/b.sock"}"#);
        assert_eq!(s.endpoint, Path::new("/b.sock"), "an exact match wins");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop_oneof![
                Just("".to_owned()),
                Just("Fail".to_owned()),
                Just("Ignore".to_owned()),
                Just("PreCreateContainer".to_owned()),
                Just("PreRemoveRunPodSandbox".to_owned()),
                Just("unix:///run/x.sock".to_owned()),
                Just("/run/x.sock".to_owned()),
                ".*",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn check_invariants(file: &Path, bytes: &[u8]) {
        if let Ok((s, _)) = parse(file, bytes) {
            assert!(s.endpoint.is_absolute());
            assert!(!s.timeout.is_zero() && s.timeout <= MAX_TIMEOUT);
            assert_eq!(s.name, "fuzz.json");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn parse_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            check_invariants(Path::new("/d/fuzz.json"), &bytes);
        }

        #[test]
        fn parse_never_panics_on_mutated_koordlet_file(
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8)
        ) {
            let mut bytes = KOORDLET_JSON.as_bytes().to_vec();
            for (at, byte, op) in edits {
                if bytes.is_empty() { break; }
                let i = at.index(bytes.len());
                match op {
                    0 => bytes[i] = byte,
                    1 => { bytes.remove(i); }
                    _ => bytes.insert(i, byte),
                }
            }
            check_invariants(Path::new("/d/fuzz.json"), &bytes);
        }

        #[test]
        fn parse_never_panics_on_json_values(
            fields in prop::collection::vec((
                prop_oneof![
                    Just("remote-endpoint".to_owned()),
                    Just("failure-policy".to_owned()),
                    Just("runtime-hooks".to_owned()),
                    Just("timeout-ms".to_owned()),
                    Just("order".to_owned()),
                    Just("ORDER".to_owned()),
                    ".{0,12}",
                ],
                arb_json(),
            ), 0..8),
            top in arb_json(),
        ) {
            let obj: Map<String, Value> = fields.into_iter().collect();
            check_invariants(Path::new("/d/fuzz.json"), serde_json::to_string(&Value::Object(obj)).unwrap().as_bytes());
            check_invariants(Path::new("/d/fuzz.json"), serde_json::to_string(&top).unwrap().as_bytes());
        }
    }

    // ---- Registry::rescan, synchronous ----

    fn write(dir: &Path, name: &str, content: &str) {
        fs::write(dir.join(name), content).unwrap();
    }

    fn names(snap: &Snapshot) -> Vec<&str> {
        snap.servers().iter().map(|s| s.name.as_str()).collect()
    }

    fn endpoint_of(snap: &Snapshot, name: &str) -> Option<PathBuf> {
        snap.get(name).map(|s| s.endpoint.clone())
    }

    #[test]
    fn missing_dir_is_created_0755() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("etc/runtime/hookserver.d");
        let reg = Registry::new(&dir);
        assert!(reg.snapshot().is_empty());
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn uncreatable_dir_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "file", "");
        let reg = Registry::new(tmp.path().join("file/sub"));
        assert!(reg.snapshot().is_empty());
        assert!(reg.rejected().is_empty());
        reg.rescan();
        assert_eq!(reg.snapshot().generation(), 0);
    }

    #[test]
    fn reserved_sockets_are_refused_however_spelt() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("hookserver.d");
        fs::create_dir(&d).unwrap();
        let run = tmp.path().join("run");
        fs::create_dir(&run).unwrap();
        let proxy = run.join("proxy.sock");
        let _live = std::os::unix::net::UnixListener::bind(&proxy).unwrap();
        symlink(&run, tmp.path().join("alias")).unwrap();
        let alias = tmp.path().join("alias/../run/./proxy.sock");
        write(&d, "loop.json", &server_json(alias.to_str().unwrap(), ""));
        write(&d, "runtime.json", &server_json(&format!("unix://{}", run.join("containerd.sock").display()), ""));
        write(&d, "fine.json", &server_json(run.join("hook.sock").to_str().unwrap(), ""));
        let reserved = vec![
            (proxy.clone(), "the proxy's own socket (--koord-runtimeproxy-endpoint)".to_owned()),
            (run.join("containerd.sock"), "the runtime's socket (--remote-runtime-service-endpoint)".to_owned()),
        ];
        let reg = Registry::open_reserving(&d, true, reserved);
        assert_eq!(names(&reg.snapshot()), ["fine.json"]);
        let why: Vec<(String, String)> = reg.rejected().into_iter().map(|r| (r.name, r.error.to_string())).collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert_eq!(why[0].0, "loop.json");
        assert!(why[0].1.contains("is the proxy's own socket (--koord-runtimeproxy-endpoint)"), "{why:?}");
        assert_eq!(why[1].0, "runtime.json");
        assert!(why[1].1.contains("is the runtime's socket (--remote-runtime-service-endpoint)"), "{why:?}");
    }

    #[test]
    fn scans_only_config_files() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "koordlet.json", KOORDLET_JSON);
        write(d, "nodot-json", &server_json("/nodot.sock", "")); // ends with "json": koord takes it
        write(d, ".hidden.json", &server_json("/hidden.sock", ""));
        write(d, "koordlet.json.swp", "garbage");
        write(d, "koordlet.json~", "garbage");
        write(d, "README", "garbage");
        fs::create_dir(d.join("..2024_01_01")).unwrap();
        write(&d.join("..2024_01_01"), "inner.json", &server_json("/inner.sock", ""));
        let reg = Registry::new(d);
        let snap = reg.snapshot();
        assert_eq!(names(&snap), ["koordlet.json", "nodot-json"]);
        assert!(snap.rejected().is_empty(), "{:?}", snap.rejected());
        assert_eq!(snap.generation(), 1);
        assert_eq!(snap.for_stage(Stage::PreCreateContainer).count(), 2);
        assert_eq!(snap.for_stage(Stage::PostStopContainer).count(), 0);
        assert_eq!(snap.for_stage(Stage::PreRunPodSandbox).map(|s| s.name.as_str()).collect::<Vec<_>>(), ["koordlet.json"]);

        // Nothing changed: no new generation, same Arcs.
        reg.rescan();
        let again = reg.snapshot();
        assert_eq!(again.generation(), 1);
        assert!(Arc::ptr_eq(&snap.servers()[0], &again.servers()[0]));
    }

    #[test]
    fn bad_rewrite_keeps_last_good_version() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "a.json", &server_json("/a1.sock", ""));
        write(d, "bad.json", "{not json");
        let reg = Registry::new(d);
        let snap = reg.snapshot();
        assert_eq!(names(&snap), ["a.json"]);
        let r = reg.rejected();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "bad.json");
        assert_eq!(r[0].file, d.join("bad.json"));
        assert!(matches!(r[0].error, ConfigError::Json(_)));
        assert!(!r[0].serving_last_good);

        for bad in ["", "{\"remote-endpoint\":\"/a2.s", r#"{"remote-endpoint":"/a2.sock","timeout-ms":"soon"}"#] {
            write(d, "a.json", bad);
            reg.rescan();
            let snap = reg.snapshot();
            assert_eq!(endpoint_of(&snap, "a.json").unwrap(), Path::new("/a1.sock"), "{bad:?}");
            let r = &snap.rejected()[0];
            assert_eq!((r.name.as_str(), r.serving_last_good), ("a.json", true));
        }
        write(d, "a.json", &server_json("/a2.sock", ""));
        reg.rescan();
        assert_eq!(endpoint_of(&reg.snapshot(), "a.json").unwrap(), Path::new("/a2.sock"));
        assert_eq!(reg.rejected().iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["bad.json"]);

        // Deleting a file whose current version is bad removes the last good one too.
        write(d, "a.json", "");
        reg.rescan();
        assert!(reg.snapshot().get("a.json").is_some());
        fs::remove_file(d.join("a.json")).unwrap();
        fs::remove_file(d.join("bad.json")).unwrap();
        reg.rescan();
        assert!(reg.snapshot().is_empty());
        assert!(reg.rejected().is_empty());
    }

    /// Drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the calling thread's effective set
    /// (capabilities are per thread on Linux), so root reads files as their modes say; call it on
    /// a thread of its own. Returns false when capget/capset are refused.
    fn drop_dac_override_on_this_thread() -> bool {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        let mut header = Header { version: VERSION_3, pid: 0 };
        let mut data = [Data::default(); 2];
        // SAFETY: capget/capset with a version-3 header and two data structs, as capget(2) says.
        unsafe {
            if libc::syscall(libc::SYS_capget, &mut header as *mut Header, data.as_mut_ptr()) != 0 {
                return false;
            }
            data[0].effective &= !((1 << 1) | (1 << 2)); // CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) == 0
        }
    }

    /// Every kind of entry a hook config directory can hold: what is registered, what is
    /// rejected (and why, naming it), what is ignored; nothing blocks, nothing is opened that
    /// is not a regular file.
    #[test]
    fn every_kind_of_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("hookserver.d");
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir_all(&d).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        // registered: a plain file, a symlink to a file (followed, as in ConfigMap volumes)
        write(&d, "plain.json", &server_json("/plain.sock", ""));
        write(&elsewhere, "target.json", &server_json("/linked.sock", ""));
        symlink(elsewhere.join("target.json"), d.join("linked.json")).unwrap();
        // rejected, by type or state, without being opened
        fs::create_dir(d.join("dir.json")).unwrap();
        symlink(&elsewhere, d.join("dirlink.json")).unwrap();
        symlink(elsewhere.join("gone.json"), d.join("dangling.json")).unwrap();
        symlink("loop.json", d.join("loop.json")).unwrap();
        let fifo = std::ffi::CString::new(d.join("fifo.json").as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let _socket = std::os::unix::net::UnixListener::bind(d.join("socket.json")).unwrap();
        symlink("/dev/null", d.join("null.json")).unwrap();
        let node = std::ffi::CString::new(d.join("node.json").as_os_str().as_bytes()).unwrap();
        // A real device node where mknod is allowed (root, not in a restricted container).
        let have_node = unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) } == 0;
        let huge = fs::File::create(d.join("huge.json")).unwrap();
        huge.set_len(2 << 20).unwrap(); // sparse: 2 MiB by its size
        write(&d, "empty.json", "");
        write(&d, "partial.json", r#"{"remote-endpoint": "/partial.so"#);
        // ignored by name: not ending in json, hidden, editors' files
        for name in ["README", "koordlet.conf", "x.json~", "x.json.bak", ".hidden.json", ".x.json.swp", "#x.json#"] {
            write(&d, name, &server_json("/ignored.sock", ""));
        }
        symlink("root@host.1234:1700000000", d.join(".#x.json")).unwrap(); // Emacs' lock: dangling, hidden
                                                                           // unreadable (as root: only once CAP_DAC_OVERRIDE is gone)
        write(&d, "secret.json", &server_json("/secret.sock", ""));
        fs::set_permissions(d.join("secret.json"), fs::Permissions::from_mode(0o000)).unwrap();

        let reg = Registry::new(&d);
        let snap = reg.snapshot();
        assert_eq!(names(&snap), ["linked.json", "plain.json", "secret.json"], "root reads the 0000 file");
        assert_eq!(endpoint_of(&snap, "linked.json").unwrap(), Path::new("/linked.sock"));
        let why = |snap: &Snapshot| -> BTreeMap<String, String> {
            snap.rejected().iter().map(|r| (r.name.clone(), r.error.to_string())).collect()
        };
        let r = why(&snap);
        let mut expected = vec![
            ("dangling.json", "dangling symlink to"),
            ("dir.json", "not a regular file (a directory)"),
            ("dirlink.json", "not a regular file (a directory)"),
            ("empty.json", "empty file"),
            ("fifo.json", "not a regular file (a FIFO)"),
            ("huge.json", "file larger than 1048576 bytes"),
            ("loop.json", "cannot read"),
            ("null.json", "not a regular file (a character device)"),
            ("partial.json", "invalid JSON: EOF while parsing"),
            ("socket.json", "not a regular file (a socket)"),
        ];
        if have_node {
            expected.push(("node.json", "not a regular file (a character device)"));
        }
        assert_eq!(r.len(), expected.len(), "{r:#?}");
        for (name, reason) in expected {
            assert!(r.get(name).is_some_and(|w| w.contains(reason)), "{name}: want {reason:?}, got {:?}", r.get(name));
        }
        assert!(r["dangling.json"].contains("gone.json"), "names the target: {}", r["dangling.json"]);
        assert!(r["loop.json"].contains("symbolic links"), "{}", r["loop.json"]);

        // The partial file completed (the writer's next write): registered.
        write(&d, "partial.json", &server_json("/partial.sock", ""));
        // The linked file's target removed: its server goes, the link is rejected as dangling.
        fs::remove_file(elsewhere.join("target.json")).unwrap();
        reg.rescan();
        let snap = reg.snapshot();
        assert_eq!(names(&snap), ["partial.json", "plain.json", "secret.json"]);
        assert!(why(&snap)["linked.json"].contains("dangling symlink"), "{:?}", why(&snap));
        assert!(!snap.rejected().iter().any(|r| r.name == "partial.json"));

        // Without CAP_DAC_OVERRIDE (a proxy not run as root), the 0000 file cannot be read: it is
        // rejected, naming the reason, and its last good version stays.
        let reg2 = reg.clone();
        let dropped = std::thread::spawn(move || {
            if !drop_dac_override_on_this_thread() {
                return false;
            }
            reg2.rescan();
            true
        })
        .join()
        .unwrap();
        if dropped {
            let snap = reg.snapshot();
            let r = why(&snap);
            assert!(r["secret.json"].contains("cannot read: Permission denied"), "{r:?}");
            assert!(snap.rejected().iter().any(|r| r.name == "secret.json" && r.serving_last_good));
            assert!(snap.get("secret.json").is_some(), "last good version kept");
        }
    }

    #[test]
    fn order_then_name() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(d, "a.json", &server_json("/a.sock", r#","order":10"#));
        write(d, "b.json", &server_json("/b.sock", ""));
        write(d, "c.json", &server_json("/c.sock", r#","order":-1"#));
        write(d, "d.json", &server_json("/d.sock", ""));
        let reg = Registry::new(d);
        assert_eq!(names(&reg.snapshot()), ["c.json", "b.json", "d.json", "a.json"]);
    }

    // ---- the watcher, with real files and inotify ----

    /// Long enough that only inotify events (and the immediate first tick) drive these tests.
    fn test_opts() -> WatchOptions {
        WatchOptions { rescan_interval: Duration::from_secs(3600), ..WatchOptions::default() }
    }

    /// Waits (up to 10 s) on `changed()` until `cond` holds for the current snapshot.
    async fn wait_for(reg: &Registry, rx: &mut watch::Receiver<u64>, what: &str, cond: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let snap = reg.snapshot();
            if cond(&snap) {
                return snap;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => panic!("timed out waiting for {what}; snapshot: {snap:#?}"),
            }
        }
    }

    fn has_endpoint(name: &'static str, endpoint: &'static str) -> impl Fn(&Snapshot) -> bool {
        move |s| endpoint_of(s, name).as_deref() == Some(Path::new(endpoint))
    }

    #[tokio::test]
    async fn watcher_follows_create_rewrite_half_write_rename_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let reg = Registry::new(&d);
        let mut rx = reg.changed();
        let _w = reg.spawn_watcher_with(test_opts()).unwrap();

        // Created.
        write(&d, "koordlet.json", KOORDLET_JSON);
        wait_for(&reg, &mut rx, "created", has_endpoint("koordlet.json", "/var/run/koordlet//koordlet.sock")).await;

        // Rewritten in place (os.WriteFile: O_TRUNC then write).
        write(&d, "koordlet.json", &server_json("/v2.sock", ""));
        let snap = wait_for(&reg, &mut rx, "rewritten", has_endpoint("koordlet.json", "/v2.sock")).await;
        assert_eq!(snap.get("koordlet.json").unwrap().failure_policy, FailurePolicy::Fail);

        // Half-written: truncated, then part of the new content; the last good version stays.
        let full = server_json("/v3.sock", r#","order":3"#);
        let mut f = fs::OpenOptions::new().write(true).open(d.join("koordlet.json")).unwrap();
        f.set_len(0).unwrap();
        let snap = wait_for(&reg, &mut rx, "empty file rejected", |s| {
            s.rejected().iter().any(|r| r.name == "koordlet.json" && r.error == ConfigError::Empty)
        })
        .await;
        assert!(has_endpoint("koordlet.json", "/v2.sock")(&snap));
        f.write_all(&full.as_bytes()[..20]).unwrap();
        let snap = wait_for(&reg, &mut rx, "partial file rejected", |s| {
            s.rejected().iter().any(|r| r.name == "koordlet.json" && matches!(r.error, ConfigError::Json(_)))
        })
        .await;
        assert!(has_endpoint("koordlet.json", "/v2.sock")(&snap));
        let r = reg.rejected();
        assert_eq!((r.len(), r[0].name.as_str(), r[0].serving_last_good), (1, "koordlet.json", true));
        // ... then completed.
        f.write_all(&full.as_bytes()[20..]).unwrap();
        drop(f);
        let snap = wait_for(&reg, &mut rx, "completed", has_endpoint("koordlet.json", "/v3.sock")).await;
        assert!(snap.rejected().is_empty());
        assert_eq!(snap.get("koordlet.json").unwrap().order, 3);

        // Replaced by rename (atomic write through a hidden temp file).
        write(&d, ".koordlet.json.tmp", &server_json("/v4.sock", ""));
        fs::rename(d.join(".koordlet.json.tmp"), d.join("koordlet.json")).unwrap();
        wait_for(&reg, &mut rx, "renamed over", has_endpoint("koordlet.json", "/v4.sock")).await;

        // Deleted.
        fs::remove_file(d.join("koordlet.json")).unwrap();
        wait_for(&reg, &mut rx, "deleted", |s| s.is_empty()).await;
    }

    #[tokio::test]
    async fn watcher_follows_configmap_data_swap() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        // The layout kubelet gives a ConfigMap volume.
        fs::create_dir(d.join("..2024_01_01_00_00_00.1")).unwrap();
        write(&d.join("..2024_01_01_00_00_00.1"), "x.json", &server_json("/cm1.sock", ""));
        symlink("..2024_01_01_00_00_00.1", d.join("..data")).unwrap();
        symlink("..data/x.json", d.join("x.json")).unwrap();
        let reg = Registry::new(&d);
        assert_eq!(endpoint_of(&reg.snapshot(), "x.json").unwrap(), Path::new("/cm1.sock"));
        assert_eq!(names(&reg.snapshot()), ["x.json"]);
        let mut rx = reg.changed();
        let _w = reg.spawn_watcher_with(test_opts()).unwrap();

        // Update: new timestamped dir, `..data_tmp` symlink to it renamed over `..data`, old dir
        // removed. Nothing named *.json changes in the watched directory itself.
        fs::create_dir(d.join("..2024_01_01_00_01_00.2")).unwrap();
        write(&d.join("..2024_01_01_00_01_00.2"), "x.json", &server_json("/cm2.sock", ""));
        symlink("..2024_01_01_00_01_00.2", d.join("..data_tmp")).unwrap();
        fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        fs::remove_dir_all(d.join("..2024_01_01_00_00_00.1")).unwrap();
        let snap = wait_for(&reg, &mut rx, "..data swapped", has_endpoint("x.json", "/cm2.sock")).await;
        assert_eq!(names(&snap), ["x.json"]);
        assert_eq!(snap.get("x.json").unwrap().file, d.join("x.json"));
    }

    #[tokio::test]
    async fn watcher_orders_a_second_file() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        write(&d, "koordlet.json", KOORDLET_JSON);
        let reg = Registry::new(&d);
        let mut rx = reg.changed();
        let _w = reg.spawn_watcher_with(test_opts()).unwrap();

        write(&d, "another.json", &server_json("/other.sock", r#","order":1"#));
        let snap = wait_for(&reg, &mut rx, "second file", |s| s.servers().len() == 2).await;
        assert_eq!(names(&snap), ["koordlet.json", "another.json"]);
        assert_eq!(
            snap.for_stage(Stage::PreCreateContainer).map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["koordlet.json", "another.json"]
        );

        write(&d, "another.json", &server_json("/other.sock", r#","order":-1"#));
        let snap = wait_for(&reg, &mut rx, "reordered", |s| names(s) == ["another.json", "koordlet.json"]).await;
        assert_eq!(snap.for_stage(Stage::PreCreateContainer).next().unwrap().name, "another.json");
    }

    #[tokio::test]
    async fn own_scans_do_not_trigger_rescans() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        write(&d, "koordlet.json", KOORDLET_JSON);
        let reg = Registry::new(&d);
        let signal = Arc::new(Signal::default());
        let mut dw = DirWatch { dir: d.clone(), signal: signal.clone(), watcher: None, id: None, problem: None };
        assert!(dw.ensure(false));
        // Let the watch settle, drop any pending permit, then scan: opens and reads of the
        // directory and the file must not wake the watcher.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = tokio::time::timeout(Duration::from_millis(1), signal.wake.notified()).await;
        reg.rescan();
        assert!(tokio::time::timeout(Duration::from_millis(300), signal.wake.notified()).await.is_err());
        // A real change does.
        write(&d, "koordlet.json", &server_json("/x.sock", ""));
        assert!(tokio::time::timeout(Duration::from_secs(5), signal.wake.notified()).await.is_ok());
    }

    #[tokio::test]
    async fn watcher_survives_directory_recreation() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("hookserver.d");
        let reg = Registry::new(&d);
        let mut rx = reg.changed();
        let opts = WatchOptions { rescan_interval: Duration::from_millis(200), ..WatchOptions::default() };
        let _w = reg.spawn_watcher_with(opts).unwrap();
        write(&d, "a.json", &server_json("/a.sock", ""));
        wait_for(&reg, &mut rx, "a.json", |s| s.get("a.json").is_some()).await;

        fs::remove_dir_all(&d).unwrap();
        wait_for(&reg, &mut rx, "dir removed", |s| s.is_empty()).await;
        fs::create_dir(&d).unwrap();
        write(&d, "b.json", &server_json("/b.sock", ""));
        wait_for(&reg, &mut rx, "b.json in the new dir", |s| s.get("b.json").is_some()).await;
    }

    /// With the default 30 s rescan, a deleted and recreated directory is still taken up within
    /// about a second (the watch is retried every 250 ms while the directory is missing).
    #[tokio::test]
    async fn recreated_directory_is_rewatched_within_a_second() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("hookserver.d");
        fs::create_dir(&d).unwrap();
        let reg = Registry::new(&d);
        let mut rx = reg.changed();
        let _w = reg.spawn_watcher_with(WatchOptions::default()).unwrap();
        write(&d, "a.json", &server_json("/a.sock", ""));
        wait_for(&reg, &mut rx, "a.json", |s| s.get("a.json").is_some()).await;
        fs::remove_dir_all(&d).unwrap();
        wait_for(&reg, &mut rx, "dir removed", |s| s.is_empty()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        fs::create_dir(&d).unwrap();
        write(&d, "b.json", &server_json("/b.sock", ""));
        let start = std::time::Instant::now();
        let back =
            tokio::time::timeout(Duration::from_millis(1500), wait_for(&reg, &mut rx, "b.json", |s| s.get("b.json").is_some())).await;
        assert!(back.is_ok(), "not taken up within 1.5 s of the directory's return");
        eprintln!("taken up {:?} after the directory came back", start.elapsed());
    }

    /// StrictModes: a registration file writable by its group or others, or owned by another
    /// user, is refused (its target judged for a symlink), and so is every file of a directory
    /// that is; `Registry::open(dir, false)` (`--insecure-hook-config`) accepts them.
    #[test]
    fn untrusted_files_and_directories_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let chmod = |p: &Path, mode| fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("hookserver.d");
        fs::create_dir(&d).unwrap();
        chmod(&d, 0o755);
        for name in ["ok.json", "group.json", "world.json", "other-owner.json"] {
            fs::write(d.join(name), server_json(&format!("/{name}.sock"), "")).unwrap();
            chmod(&d.join(name), 0o644);
        }
        chmod(&d.join("group.json"), 0o664);
        chmod(&d.join("world.json"), 0o646);
        std::os::unix::fs::chown(d.join("other-owner.json"), Some(65534), None).unwrap();
        // A ConfigMap-style symlink is judged by its target (the link itself is always 0777).
        let data = tmp.path().join("data");
        fs::create_dir(&data).unwrap();
        fs::write(data.join("target.json"), server_json("/link.sock", "")).unwrap();
        chmod(&data.join("target.json"), 0o644);
        symlink(data.join("target.json"), d.join("link.json")).unwrap();
        fs::write(data.join("open.json"), server_json("/open.sock", "")).unwrap();
        chmod(&data.join("open.json"), 0o666);
        symlink(data.join("open.json"), d.join("open-link.json")).unwrap();

        let reg = Registry::new(&d);
        assert_eq!(names(&reg.snapshot()), ["link.json", "ok.json"]);
        let why = |name: &str| reg.rejected().into_iter().find(|r| r.name == name).map(|r| r.error.to_string()).unwrap_or_default();
        assert!(why("group.json").contains("mode 0664 is group- or world-writable"), "{}", why("group.json"));
        assert!(why("world.json").contains("mode 0646"), "{}", why("world.json"));
        assert!(why("other-owner.json").contains("owner uid 65534"), "{}", why("other-owner.json"));
        assert!(why("open-link.json").contains("mode 0666"), "{}", why("open-link.json"));
        assert_eq!(names(&Registry::open(&d, false).snapshot()).len(), 6, "--insecure-hook-config accepts all");

        // A group-writable directory taints every file in it; fixed, they count again.
        chmod(&d, 0o775);
        reg.rescan();
        assert!(reg.snapshot().is_empty(), "{:?}", names(&reg.snapshot()));
        assert!(why("ok.json").contains("directory") && why("ok.json").contains("0775"), "{}", why("ok.json"));
        chmod(&d, 0o755);
        reg.rescan();
        assert_eq!(names(&reg.snapshot()), ["link.json", "ok.json"]);
    }

    /// Two names that differ only in bytes that are not UTF-8 stay two names in logs, the
    /// snapshot and metric labels (they were both `bad\u{FFFD}.json`).
    #[test]
    fn names_that_are_not_utf8_are_shown_losslessly() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (std::ffi::OsStr::from_bytes(b"bad\xff.json"), std::ffi::OsStr::from_bytes(b"bad\xfe.json"));
        fs::write(tmp.path().join(a), server_json("/a.sock", "")).unwrap();
        fs::write(tmp.path().join(b), server_json("/b.sock", "")).unwrap();
        let reg = Registry::new(tmp.path());
        let names: Vec<String> = reg.snapshot().servers().iter().map(|s| s.name.clone()).collect();
        assert_eq!(names, ["bad\\xFE.json", "bad\\xFF.json"]);
        assert_eq!(display_name(std::ffi::OsStr::new("koordlet.json")), "koordlet.json");
        assert_eq!(display_name(std::ffi::OsStr::new("a\\xff.json")), "a\\\\xff.json", "a literal backslash is escaped too");
    }

    /// One endpoint in two files is called once per stage (the first file in call order wins
    /// where both name the stage; the other's extra stages still count).
    #[test]
    fn an_endpoint_in_several_files_is_called_once_per_stage() {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "a.json", &server_json("/same.sock", ""));
        write(
            tmp.path(),
            "b.json",
            r#"{"remote-endpoint":"unix:///same.sock","runtime-hooks":["PreCreateContainer","PostStopPodSandbox"]}"#,
        );
        write(tmp.path(), "c.json", &server_json("/other.sock", ""));
        let reg = Registry::new(tmp.path());
        let snap = reg.snapshot();
        let at = |stage| snap.for_stage(stage).map(|s| s.name.as_str()).collect::<Vec<_>>();
        assert_eq!(at(Stage::PreCreateContainer), ["a.json", "c.json"]);
        assert_eq!(at(Stage::PostStopPodSandbox), ["b.json"], "b.json's own stage");
        let (_, shared) = Snapshot::new(snap.servers().to_vec(), Vec::new(), 0);
        assert_eq!(shared, [(PathBuf::from("/same.sock"), vec!["a.json".to_string(), "b.json".to_string()])]);
    }

    #[tokio::test]
    async fn dropping_the_handle_stops_watching() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().to_path_buf();
        let reg = Registry::new(&d);
        let w = reg.spawn_watcher_with(test_opts()).unwrap();
        drop(w);
        tokio::time::sleep(Duration::from_millis(50)).await;
        write(&d, "a.json", &server_json("/a.sock", ""));
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(reg.snapshot().is_empty());
        assert!(Arc::strong_count(&reg) == 1, "the task released the registry");
    }

    #[test]
    fn spawn_watcher_needs_a_runtime() {
        let tmp = tempfile::tempdir().unwrap();
        let reg = Registry::new(tmp.path());
        assert!(reg.spawn_watcher().is_err());
    }
}
