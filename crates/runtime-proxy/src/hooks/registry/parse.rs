//! One registration file parsed and validated (the format: see [`super`]).

use std::collections::BTreeSet;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hook_api::MAX_SOCKET_PATH;
use serde_json::{Map, Value};

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
    /// Ours: `"Warn"` or `"Fail"`, what a field conflict this server causes does to the call
    /// (absent: `--hook-conflict-policy`).
    pub const CONFLICT_POLICY: &str = "conflict-policy";
    /// Every key the proxy reads, in the order of the documentation.
    pub const ALL: [&str; 7] =
        [REMOTE_ENDPOINT, FAILURE_POLICY, RUNTIME_HOOKS, TIMEOUT_MS, ORDER, ALLOWED_UIDS, CONFLICT_POLICY];
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

/// What a field conflict in a hook chain does to the call (see [`crate::hooks::chain`]):
/// `--hook-conflict-policy`, or a registration file's `conflict-policy` for the conflicts its
/// server causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
#[value(rename_all = "verbatim")]
pub enum ConflictPolicy {
    /// The later server's value wins (as without ownership); the conflict is logged and counted.
    #[default]
    Warn,
    /// The call is refused with `FAILED_PRECONDITION` before the runtime sees it.
    Fail,
}

impl ConflictPolicy {
    /// `"Warn"` or `"Fail"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConflictPolicy::Warn => "Warn",
            ConflictPolicy::Fail => "Fail",
        }
    }
}

impl fmt::Display for ConflictPolicy {
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
    /// `conflict-policy`: what a field conflict this server causes does to the call; `None`
    /// (absent, `null` or `""`): the node's `--hook-conflict-policy`. A value that cannot be read
    /// is [`ConflictPolicy::Fail`] with a warning (fail closed, as for `failure-policy`).
    pub conflict_policy: Option<ConflictPolicy>,
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
/// [`Snapshot::rejected`](super::Snapshot::rejected).
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
    /// runtime's (see [`Registry::open_reserving`](super::Registry::open_reserving)). Never returned by [`parse`].
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
pub(super) const TRUST_RULE: &str = "registration files and their directory must be owned by root or the proxy's user and not group- or world-writable (--insecure-hook-config turns this check off)";

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

    let fail_policy = [("Fail", FailurePolicy::Fail), ("Ignore", FailurePolicy::Ignore)];
    let (failure_policy, policy_explicit) =
        match policy(&obj, &name, keys::FAILURE_POLICY, "failure", fail_policy, &mut warnings) {
            Policy::Unset => (FailurePolicy::Ignore, false),
            Policy::Set(p) => (p, true),
            Policy::Unreadable => (FailurePolicy::Fail, false),
        };
    let conflict_choices = [("Warn", ConflictPolicy::Warn), ("Fail", ConflictPolicy::Fail)];
    let conflict_policy = match policy(&obj, &name, keys::CONFLICT_POLICY, "conflict", conflict_choices, &mut warnings)
    {
        Policy::Unset => None,
        Policy::Set(p) => Some(p),
        Policy::Unreadable => Some(ConflictPolicy::Fail),
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
    let order = integer_field(&obj, keys::ORDER, "an integer", "a 32-bit signed integer", |n| {
        n.as_i64().and_then(|i| i32::try_from(i).ok())
    })?
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
        conflict_policy,
        warnings: warnings.clone(),
    };
    Ok((server, warnings))
}

/// A policy key as read from a registration file.
enum Policy<T> {
    /// Absent, `null` or `""`: the default.
    Unset,
    /// One of the choices, spelled exactly (case matters).
    Set(T),
    /// Anything else, or a key that looks like a typo of it: the caller fails closed; a warning
    /// naming the file and what is wrong is in `warnings`.
    Unreadable,
}

/// Reads the policy `key` (`failure-policy`, `conflict-policy`; `what` names it in the warning:
/// "failure", "conflict") as one of the two `choices`.
fn policy<T: Copy>(
    obj: &Map<String, Value>,
    name: &str,
    key: &str,
    what: &str,
    choices: [(&str, T); 2],
    warnings: &mut Vec<String>,
) -> Policy<T> {
    let why = match field(obj, key) {
        None => match obj.keys().find(|k| !k.eq_ignore_ascii_case(key) && likely_key(k) == Some(key)) {
            Some(typo) => format!("key {typo:?} is not \"{key}\""),
            None => return Policy::Unset,
        },
        Some(Value::String(s)) if s.is_empty() => return Policy::Unset,
        Some(Value::String(s)) => match choices.iter().find(|(spelled, _)| spelled == s) {
            Some(&(_, p)) => return Policy::Set(p),
            None => format!("\"{key}\" {s:?} is neither \"{}\" nor \"{}\" (case matters)", choices[0].0, choices[1].0),
        },
        Some(v) => format!("\"{key}\" is {}, not a string", json_kind(v)),
    };
    warnings.push(format!(
        "{name}: {why}; the {what} policy cannot be read, so Fail is used (fail closed) until the file is fixed"
    ));
    Policy::Unreadable
}

/// The value of `key`, `null` counting as absent. Like Go's `encoding/json`: an exact match
/// first, else a key equal ignoring ASCII case.
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key)
        .or_else(|| obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v))
        .filter(|v| !v.is_null())
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
    hook_api::unix_socket_path(raw)
        .map(PathBuf::from)
        .map_err(|reason| ConfigError::BadEndpoint { endpoint: raw.to_owned(), reason })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::registry::test_util::*;

    use std::path::Path;

    use serde_json::{Map, Value};
    use std::time::Duration;

    use proptest::prelude::*;

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
        assert!(
            w.iter().any(|w| w.contains(r#"unknown key "failure_policy" ignored; did you mean "failure-policy"?"#)),
            "{w:?}"
        );
    }

    /// `conflict-policy`: absent or empty is the node's flag; Warn and Fail as written; anything
    /// else is Fail (fail closed) with a warning naming the file and what was read.
    #[test]
    fn conflict_policies() {
        for (json, want) in [
            (r#"{"remote-endpoint":"/s.sock"}"#, None),
            (r#"{"remote-endpoint":"/s.sock","conflict-policy":""}"#, None),
            (r#"{"remote-endpoint":"/s.sock","conflict-policy":null}"#, None),
            (r#"{"remote-endpoint":"/s.sock","conflict-policy":"Warn"}"#, Some(ConflictPolicy::Warn)),
            (r#"{"remote-endpoint":"/s.sock","conflict-policy":"Fail"}"#, Some(ConflictPolicy::Fail)),
            (r#"{"remote-endpoint":"/s.sock","CONFLICT-POLICY":"Warn"}"#, Some(ConflictPolicy::Warn)),
        ] {
            assert_eq!(ok(json).conflict_policy, want, "{json}");
        }
        for (entry, says) in [
            (
                r#""conflict-policy":"warn""#,
                r#"test.json: "conflict-policy" "warn" is neither "Warn" nor "Fail" (case matters)"#,
            ),
            (r#""conflict-policy":"Ignore""#, r#""Ignore" is neither"#),
            (r#""conflict-policy":1"#, r#""conflict-policy" is a number, not a string"#),
            (r#""conflict_policy":"Warn""#, r#"key "conflict_policy" is not "conflict-policy""#),
            (r#""conflictPolicy":"Warn""#, r#"key "conflictPolicy" is not"#),
            (r#""conflict-polcy":"Warn""#, r#"key "conflict-polcy" is not"#),
        ] {
            let json = format!(r#"{{"remote-endpoint":"/s.sock","runtime-hooks":["PreCreateContainer"],{entry}}}"#);
            let (server, warnings) = p(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(server.conflict_policy, Some(ConflictPolicy::Fail), "{json}");
            assert_eq!(server.failure_policy, FailurePolicy::Ignore, "{json}: the failure policy is not touched");
            assert!(
                warnings
                    .iter()
                    .any(|w| w.contains(says) && w.contains("the conflict policy cannot be read, so Fail is used")),
                "{json}: {warnings:?}"
            );
        }
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
                r#"unknown key "comment" ignored (known keys: remote-endpoint, failure-policy, runtime-hooks, timeout-ms, order, allowed-uids, conflict-policy)"#
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
        for missing in
            [r#"{}"#, r#"{"remote-endpoint":""}"#, r#"{"remote-endpoint":null}"#, r#"{"failure-policy":"Fail"}"#]
        {
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
        for bad in [
            r#","allowed-uids":[-1]"#,
            r#","allowed-uids":["0"]"#,
            r#","allowed-uids":0"#,
            r#","allowed-uids":[4294967296]"#,
        ] {
            assert!(
                matches!(p(&server_json("/s.sock", bad)), Err(ConfigError::WrongType { key: "allowed-uids", .. })),
                "{bad}"
            );
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
}
