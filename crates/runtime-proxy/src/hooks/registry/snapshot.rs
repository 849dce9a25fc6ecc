//! The registry: the directory scanned into immutable [`Snapshot`]s, swapped in whole (arc-swap).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::parse::*;

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
    pub fn new(
        mut servers: Vec<Arc<HookServer>>,
        rejected: Vec<Rejected>,
        generation: u64,
    ) -> (Snapshot, Vec<(PathBuf, Vec<String>)>) {
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
    /// sockets (compared with [`crate::listener::same_socket`]: symlinks and `..` resolved), each given
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
                    let r = Rejected {
                        name: display_name(&fname),
                        file: path,
                        error,
                        serving_last_good: last_good.is_some(),
                    };
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
        let (snapshot, shared) =
            Snapshot::new(good.values().cloned().collect(), rejected.values().cloned().collect(), st.generation);
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
        Ok((server, _)) if reserved.iter().any(|(p, _)| crate::listener::same_socket(&server.endpoint, p)) => {
            let what = reserved
                .iter()
                .find(|(p, _)| crate::listener::same_socket(&server.endpoint, p))
                .map(|(_, w)| w.clone())
                .unwrap_or_default();
            Loaded::Bad(ConfigError::ReservedEndpoint { endpoint: server.endpoint.display().to_string(), what })
        }
        Ok((server, warnings)) => Loaded::Good(server, warnings),
        Err(e) => Loaded::Bad(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::registry::test_util::*;

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use std::fs;

    use std::os::unix::fs::symlink;

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
        assert_eq!(
            snap.for_stage(Stage::PreRunPodSandbox).map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["koordlet.json"]
        );

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
                                                                           // unreadable (as root: only once
                                                                           // CAP_DAC_OVERRIDE is gone)
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
        let why = |name: &str| {
            reg.rejected().into_iter().find(|r| r.name == name).map(|r| r.error.to_string()).unwrap_or_default()
        };
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
        assert_eq!(
            display_name(std::ffi::OsStr::new("a\\xff.json")),
            "a\\\\xff.json",
            "a literal backslash is escaped too"
        );
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
}
