//! The signals a service manager or an operator may send, and what both daemons do with each.
//!
//! # Signals
//!
//! | signal | what the daemon does |
//! |---|---|
//! | `SIGTERM` (systemd's `KillSignal`, kubelet), `SIGINT` (Ctrl-C), `SIGQUIT` | graceful stop: one log line naming the signal, `STOPPING=1` to systemd, then the daemon's own shutdown (runtime-proxy: socket removed, GOAWAY, drain; runtime-hooks: registration removed, then the socket) and exit 0 |
//! | a second `SIGTERM`, `SIGINT` or `SIGQUIT` while stopping | stop at once: a WARN, the drain cut short, the log flushed, exit 0 |
//! | `SIGHUP` (`systemctl reload`: the units' `ExecReload`) | reload what can be reloaded (runtime-proxy: rescan the hook config directory; runtime-hooks: re-read the rules file), logged; never an exit |
//! | `SIGUSR1`, `SIGUSR2` | ignored, one log line each (their default action would kill the daemon) |
//! | `SIGPIPE` | ignored (Rust's runtime sets it to `SIG_IGN` before `main`: a write to a closed pipe or socket fails with `EPIPE` instead, see [`crate::log`]) |
//!
//! # Why `SIGQUIT` drains
//!
//! `SIGQUIT` stops gracefully, like `SIGTERM`, rather than at once: it is what some operators'
//! tooling sends for "quit", and a proxy on kubelet's path must not drop calls in flight for it
//! (the Go runtime of koord-runtime-proxy would have died with a goroutine dump and no drain).
//! For an immediate stop there is `SIGKILL` (which still touches no container), or a second
//! signal. Every other signal keeps its default action.
//!
//! # Use
//!
//! [`Signals::install`] takes the signals over (before anything is served, so a `SIGTERM` right
//! after `READY=1` drains too); [`spawn`] runs the table above and hands the daemon a
//! [`Control`]: futures for "stop" and "stop at once", and a stream of reload requests.

use std::future::Future;
use std::io;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{mpsc, watch};

/// A signal the daemons handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// `SIGTERM`: stop gracefully.
    Term,
    /// `SIGINT`: stop gracefully.
    Int,
    /// `SIGQUIT`: stop gracefully.
    Quit,
    /// `SIGHUP`: reload.
    Hup,
    /// `SIGUSR1`: ignored.
    Usr1,
    /// `SIGUSR2`: ignored.
    Usr2,
}

impl Received {
    /// The signal's name, e.g. `SIGTERM`.
    pub fn name(self) -> &'static str {
        match self {
            Received::Term => "SIGTERM",
            Received::Int => "SIGINT",
            Received::Quit => "SIGQUIT",
            Received::Hup => "SIGHUP",
            Received::Usr1 => "SIGUSR1",
            Received::Usr2 => "SIGUSR2",
        }
    }

    /// Whether it asks the daemon to stop.
    pub fn stops(self) -> bool {
        matches!(self, Received::Term | Received::Int | Received::Quit)
    }
}

/// The signals of [`Received`], taken over from their default actions.
pub struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
    hup: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    /// Installs handlers for every signal of [`Received`]: from now on none of them has its
    /// default action (death, for all six). Must be called within a tokio runtime.
    ///
    /// Errors: a handler cannot be installed (no tokio runtime with signal support).
    pub fn install() -> io::Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }

    /// The next signal received.
    pub async fn recv(&mut self) -> Received {
        tokio::select! {
            _ = self.term.recv() => Received::Term,
            _ = self.int.recv() => Received::Int,
            _ = self.quit.recv() => Received::Quit,
            _ = self.hup.recv() => Received::Hup,
            _ = self.usr1.recv() => Received::Usr1,
            _ = self.usr2.recv() => Received::Usr2,
        }
    }
}

/// Where a daemon is in its life, as the signals have moved it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Running,
    Stopping,
    StopNow,
}

/// What [`spawn`] gives the daemon: when to stop, when to stop at once, and the reload requests.
pub struct Control {
    phase: watch::Receiver<Phase>,
    reloads: Option<Reloads>,
    /// Keeps the phase channel open when no task drives it ([`Control::inert`]).
    _sender: Option<watch::Sender<Phase>>,
}

impl Control {
    /// A control that never stops nor reloads: for a daemon whose signals could not be taken
    /// over (they keep their default actions then).
    pub fn inert() -> Control {
        let (tx, rx) = watch::channel(Phase::Running);
        let (_, reloads) = mpsc::unbounded_channel();
        Control { phase: rx, reloads: Some(Reloads(reloads)), _sender: Some(tx) }
    }

    /// Resolves at the first `SIGTERM`, `SIGINT` or `SIGQUIT` (after [`spawn`]'s `on_stop` ran).
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        Self::reached(self.phase.clone(), Phase::Stopping)
    }

    /// Resolves at a second `SIGTERM`, `SIGINT` or `SIGQUIT`: stop at once, without waiting for
    /// what is in flight.
    pub fn stop_now(&self) -> impl Future<Output = ()> + Send + 'static {
        Self::reached(self.phase.clone(), Phase::StopNow)
    }

    /// The reload requests (`SIGHUP`), once; `None` when taken already. While nobody holds them
    /// (never taken, or dropped) a `SIGHUP` is logged as having nothing to reload.
    pub fn take_reloads(&mut self) -> Option<Reloads> {
        self.reloads.take()
    }

    async fn reached(mut phase: watch::Receiver<Phase>, at: Phase) {
        if phase.wait_for(|p| *p >= at).await.is_err() {
            // The signal task is gone (it never ends while the runtime runs): never.
            std::future::pending::<()>().await;
        }
    }
}

/// The `SIGHUP`s to act on, one item per signal (signals that arrive while one is being
/// handled are coalesced by the kernel and tokio into one more).
pub struct Reloads(mpsc::UnboundedReceiver<Received>);

impl Reloads {
    /// The next reload request; `None` never comes while the signal task runs.
    pub async fn next(&mut self) -> Option<Received> {
        self.0.recv().await
    }
}

/// Runs the module's table for `signals` on a task of the current tokio runtime, logging each
/// signal once; `on_stop` runs at the first stop signal, before [`Control::stopping`] resolves
/// (tell systemd `STOPPING=1` there).
pub fn spawn(mut signals: Signals, on_stop: impl Fn() + Send + 'static) -> Control {
    let (phase_tx, phase) = watch::channel(Phase::Running);
    let (reload_tx, reloads) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let sig = signals.recv().await;
            let name = sig.name();
            match sig {
                Received::Term | Received::Int | Received::Quit => {
                    if *phase_tx.borrow() == Phase::Running {
                        tracing::info!(
                            signal = name,
                            "shutting down gracefully (SIGTERM, SIGINT or SIGQUIT again: stop at once, without waiting for calls in flight)"
                        );
                        on_stop();
                        phase_tx.send_replace(Phase::Stopping);
                    } else {
                        tracing::warn!(
                            signal = name,
                            "{name} while shutting down: stopping at once, without waiting for calls in flight"
                        );
                        phase_tx.send_replace(Phase::StopNow);
                    }
                }
                Received::Hup => {
                    if reload_tx.send(sig).is_err() {
                        tracing::info!(signal = name, "SIGHUP: nothing to reload");
                    }
                }
                Received::Usr1 | Received::Usr2 => {
                    tracing::info!(
                        signal = name,
                        "{name} ignored: it has no meaning here (SIGHUP reloads, SIGTERM stops)"
                    )
                }
            }
        }
    });
    Control { phase, reloads: Some(Reloads(reloads)), _sender: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn raise(sig: i32) {
        // SAFETY: kill(2) of our own process with a signal whose handler tokio installed.
        assert_eq!(unsafe { libc::kill(libc::getpid(), sig) }, 0);
    }

    /// The table, in one process (the test binary's own signals): USR1/USR2 and HUP never stop
    /// it, HUP is a reload, the first stop signal stops, the second stops at once.
    #[tokio::test]
    async fn the_table() {
        let stops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = stops.clone();
        let mut control = spawn(Signals::install().unwrap(), move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let mut reloads = control.take_reloads().unwrap();
        assert!(control.take_reloads().is_none(), "taken once");
        let stopping = control.stopping();
        let stop_now = control.stop_now();
        tokio::pin!(stopping, stop_now);
        let quiet = Duration::from_millis(200);

        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE] {
            raise(sig);
        }
        raise(libc::SIGHUP);
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), reloads.next()).await.unwrap(), Some(Received::Hup));
        assert!(tokio::time::timeout(quiet, &mut stopping).await.is_err(), "USR1, USR2, PIPE and HUP do not stop");

        raise(libc::SIGQUIT);
        tokio::time::timeout(Duration::from_secs(5), &mut stopping).await.expect("SIGQUIT stops");
        assert_eq!(stops.load(std::sync::atomic::Ordering::SeqCst), 1, "on_stop ran once");
        assert!(tokio::time::timeout(quiet, &mut stop_now).await.is_err(), "not at once yet");
        raise(libc::SIGTERM);
        tokio::time::timeout(Duration::from_secs(5), &mut stop_now).await.expect("a second stop signal: at once");
        assert_eq!(stops.load(std::sync::atomic::Ordering::SeqCst), 1, "on_stop still once");
    }

    #[tokio::test]
    async fn inert_never_resolves() {
        let mut c = Control::inert();
        assert!(tokio::time::timeout(Duration::from_millis(50), c.stopping()).await.is_err());
        assert!(tokio::time::timeout(Duration::from_millis(50), c.take_reloads().unwrap().next())
            .await
            .is_ok_and(|r| r.is_none()));
        assert_eq!(Received::Quit.name(), "SIGQUIT");
        assert!(Received::Quit.stops() && !Received::Hup.stops());
    }
}
