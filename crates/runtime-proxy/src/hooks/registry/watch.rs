//! Watching the hook config directory: inotify events (debounced) and a periodic rescan.

use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::Notify;

use super::snapshot::*;

impl Registry {
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
        let mut dir_watch =
            DirWatch { dir: self.dir().to_path_buf(), signal: signal.clone(), watcher: None, id: None, problem: None };
        dir_watch.ensure(false);
        let task = rt.spawn(watch_loop(self.clone(), dir_watch, signal.clone(), opts));
        Ok(WatchHandle { task, signal })
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
                if matches!(ev.kind, EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_)))
                    && ev.paths.iter().any(|p| p == &dir)
                {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::registry::test_util::*;
    use crate::hooks::registry::*;

    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use std::fs;
    use std::io::Write as _;
    use std::os::unix::fs::symlink;
    use tokio::sync::watch;

    // ---- the watcher, with real files and inotify ----

    /// Long enough that only inotify events (and the immediate first tick) drive these tests.
    fn test_opts() -> WatchOptions {
        WatchOptions { rescan_interval: Duration::from_secs(3600), ..WatchOptions::default() }
    }

    /// Waits (up to 10 s) on `changed()` until `cond` holds for the current snapshot.
    async fn wait_for(
        reg: &Registry,
        rx: &mut watch::Receiver<u64>,
        what: &str,
        cond: impl Fn(&Snapshot) -> bool,
    ) -> Arc<Snapshot> {
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
        let back = tokio::time::timeout(
            Duration::from_millis(1500),
            wait_for(&reg, &mut rx, "b.json", |s| s.get("b.json").is_some()),
        )
        .await;
        assert!(back.is_ok(), "not taken up within 1.5 s of the directory's return");
        eprintln!("taken up {:?} after the directory came back", start.elapsed());
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
