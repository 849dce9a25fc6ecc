//! What an operator or a service manager can do to a running runtime-hooks, with the real
//! binary and no runtime needed: every signal (docs/operations.md, "Signals"), every numeric
//! and duration flag at its edges and every wrong `--cgroup-root` ("Flags at their edges").

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

/// Proxy mode in `dir`: socket `dir/run/h.sock`, registration in `dir/hooks`, cgroups a temp
/// tree (unchecked), plus `extra`; waits until registered.
fn start(dir: &Path, extra: &[&str]) -> Hooks {
    let cgroups = dir.join("cgroup");
    std::fs::create_dir_all(&cgroups).unwrap();
    let (socket, registrations) = (dir.join("run/h.sock"), dir.join("hooks"));
    let mut args = vec!["--listen", socket.to_str().unwrap(), "--hook-config-dir", registrations.to_str().unwrap()];
    args.extend(["--cgroup-root", cgroups.to_str().unwrap(), "--cgroup-version", "v1", "--unchecked-cgroup-root"]);
    args.extend(extra);
    let hooks = Hooks::start(&args, dir.join("hooks.log"));
    assert!(
        eventually(Duration::from_secs(10), || dir.join("hooks/runtime-hooks.json").exists()),
        "not registered:\n{}",
        hooks.log()
    );
    hooks
}

fn signal(hooks: &Hooks, sig: i32) {
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(hooks.pid(), sig) };
}

fn alive(hooks: &Hooks) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists (a zombie counts: the
    // child is reaped by `terminate` or on drop only).
    let exists = unsafe { libc::kill(hooks.pid(), 0) == 0 };
    exists && std::fs::read_to_string(format!("/proc/{}/stat", hooks.pid())).is_ok_and(|s| !s.contains(") Z "))
}

/// SIGUSR1, SIGUSR2 and SIGPIPE leave it serving (a line each for the first two); SIGHUP
/// re-reads the rules file at once — here a change its watcher cannot see (the file is a
/// symlink to another directory, whose target is rewritten), which would otherwise wait for
/// the 10 s re-read — logging the outcome, also for an unchanged and an invalid file; SIGQUIT
/// stops it gracefully: registration and socket removed, exit 0.
#[test]
fn sighup_rereads_the_rules_other_signals_do_not_kill_sigquit_stops() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let real = elsewhere.join("rules.yaml");
    std::fs::write(
        &real,
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nmetadata: {name: node-a}\nspec: {}\n",
    )
    .unwrap();
    let rules = dir.path().join("rules.yaml");
    std::os::unix::fs::symlink(&real, &rules).unwrap();
    let hooks = start(dir.path(), &["--rules", rules.to_str().unwrap()]);

    std::fs::write(&real, GROUP_IDENTITY_ON).unwrap();
    for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE] {
        signal(&hooks, sig);
    }
    assert!(hooks.wait_log(&["SIGUSR1 ignored"], 0, Duration::from_secs(5)), "{}", hooks.log());
    assert!(hooks.wait_log(&["SIGUSR2 ignored"], 0, Duration::from_secs(5)), "{}", hooks.log());
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(&hooks), "USR1, USR2, PIPE: still running\n{}", hooks.log());
    assert_eq!(hooks.count(&["rules changed"]), 0, "the watcher does not see the target's change:\n{}", hooks.log());

    signal(&hooks, libc::SIGHUP);
    assert!(
        hooks.wait_log(&["reloading: re-reading the rules file", "SIGHUP"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
    assert!(hooks.wait_log(&["rules changed"], 0, Duration::from_secs(5)), "{}", hooks.log());
    assert!(
        hooks.wait_log(&["reloaded: the rules file's new rules are in force"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
    signal(&hooks, libc::SIGHUP);
    assert!(
        hooks.wait_log(&["reloaded: the rules in force stay"], 0, Duration::from_secs(5)),
        "unchanged:\n{}",
        hooks.log()
    );
    std::fs::write(
        &real,
        "apiVersion: slo.koordinator.sh/v1alpha1\nkind: NodeSLO\nspec: {resourceUsedThresholdWithBE: {cpuSuppressPolicy: bogus}}\n",
    )
    .unwrap();
    signal(&hooks, libc::SIGHUP);
    assert!(
        hooks.wait_log(&["rules file invalid, keeping the rules in force"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
    assert!(
        hooks.wait_log(&["reloaded: the rules in force stay"], 1, Duration::from_secs(5)),
        "invalid:\n{}",
        hooks.log()
    );
    assert_eq!(hooks.count(&["rules changed"]), 1, "{}", hooks.log());
    assert!(alive(&hooks), "SIGHUP never stops it");
    // Fixed (the rules it had): said at INFO, once.
    std::fs::write(&real, GROUP_IDENTITY_ON).unwrap();
    signal(&hooks, libc::SIGHUP);
    assert!(
        hooks.wait_log(&["INFO", "rules file valid again: its rules are in force"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
    signal(&hooks, libc::SIGHUP);
    assert!(hooks.wait_log(&["reloaded: the rules in force stay"], 3, Duration::from_secs(5)), "{}", hooks.log());
    assert_eq!(hooks.count(&["rules file valid again"]), 1, "once:\n{}", hooks.log());

    signal(&hooks, libc::SIGQUIT);
    assert!(eventually(Duration::from_secs(10), || !alive(&hooks)), "SIGQUIT stops it\n{}", hooks.log());
    let mut hooks = hooks;
    assert_eq!(hooks.terminate(), Some(0), "{}", hooks.log());
    assert!(!dir.path().join("hooks/runtime-hooks.json").exists(), "unregistered");
    assert!(!dir.path().join("run/h.sock").exists(), "socket removed");
    assert!(
        hooks.log().contains("shutting down gracefully") && hooks.log().contains("signal=\"SIGQUIT\""),
        "{}",
        hooks.log()
    );
}

/// A default start on a host without resctrl (and, maybe, core scheduling) says so at INFO:
/// CoreSched and Resctrl are off, so their facilities are not missed (it was two WARNs).
#[test]
fn facilities_of_plugins_that_are_off_are_no_warn() {
    let dir = tempfile::tempdir().unwrap();
    let no_resctrl = dir.path().join("resctrl");
    std::fs::create_dir_all(&no_resctrl).unwrap();
    let hooks = start(dir.path(), &["--resctrl-root", no_resctrl.to_str().unwrap()]);
    assert!(
        hooks.wait_log(&["INFO", "no resctrl", "(the plugin is off)"], 0, Duration::from_secs(5)),
        "{}",
        hooks.log()
    );
    let log = hooks.log();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && (l.contains("resctrl") || l.contains("core scheduling")))
        .collect();
    assert!(warns.is_empty(), "{warns:#?}");
    // On, the lack is a WARN.
    let on = tempfile::tempdir().unwrap();
    let hooks = start(on.path(), &["--resctrl-root", no_resctrl.to_str().unwrap(), "--feature-gates", "Resctrl=true"]);
    assert!(hooks.wait_log(&["WARN", "no resctrl"], 0, Duration::from_secs(5)), "{}", hooks.log());
}

/// Without a rules file SIGHUP says there is nothing to re-read. A hook call whose request
/// never ends holds the graceful stop (SIGTERM: unregistered, waiting); a second SIGTERM
/// stops at once, exit 0, the socket removed.
#[test]
fn a_second_sigterm_stops_at_once() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let mut hooks = start(dir.path(), &[]);
    signal(&hooks, libc::SIGHUP);
    assert!(hooks.wait_log(&["there is no rules file to re-read"], 0, Duration::from_secs(5)), "{}", hooks.log());

    // A PreRunPodSandboxHook call that sends its head and never its body: HTTP/2 preface,
    // SETTINGS, HEADERS (HPACK literals, END_HEADERS, no END_STREAM).
    let mut conn = std::os::unix::net::UnixStream::connect(dir.path().join("run/h.sock")).unwrap();
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/runtime.v1alpha1.RuntimeHookService/PreRunPodSandboxHook"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.extend([0, name.len() as u8]);
        block.extend(name.as_bytes());
        block.push(value.len() as u8);
        block.extend(value.as_bytes());
    }
    let frame = |kind: u8, flags: u8, stream: u32, payload: &[u8]| {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    };
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(4, 0, 0, &[]));
    out.extend(frame(1, 0x4, 1, &block));
    conn.write_all(&out).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    signal(&hooks, libc::SIGTERM);
    assert!(
        eventually(Duration::from_secs(5), || !dir.path().join("hooks/runtime-hooks.json").exists()),
        "unregistered first"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(&hooks), "the graceful stop waits for the call in flight\n{}", hooks.log());
    signal(&hooks, libc::SIGTERM);
    assert!(eventually(Duration::from_secs(5), || !alive(&hooks)), "a second SIGTERM: at once\n{}", hooks.log());
    assert_eq!(hooks.terminate(), Some(0), "{}", hooks.log());
    assert!(hooks.log().contains("SIGTERM while shutting down: stopping at once"), "{}", hooks.log());
    assert!(!dir.path().join("run/h.sock").exists(), "socket removed");
    drop(conn);
}

enum Expect {
    Starts,
    Refused(&'static str),
}

/// The file system type of `path` as `stat -f` names it (`cgroup2fs`, `tmpfs`, `cgroupfs`).
fn fs_type(path: &str) -> String {
    Command::new("stat")
        .args(["-f", "-c", "%T", path])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// Every numeric and duration flag at 0, 1, its largest value, beyond it, negative, and in forms
/// it does not take; and `--cgroup-root` that is not what `--cgroup-version` says, not mounted
/// or not there: refused at start (exit 2, the reason named once) or a clean start, as
/// docs/operations.md's "Flags at their edges" says.
#[test]
fn flags_at_their_edges() {
    use Expect::*;
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.to_str().unwrap().to_owned();
    let max = u64::MAX;
    let beyond = "18446744073709551616";
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let reconcile = |value: String| {
        vec![
            "--runtime-endpoint".into(),
            "/nonexistent/containerd.sock".into(),
            format!("--reconcile-interval={value}"),
        ]
    };
    let mut cases: Vec<(Vec<String>, Expect)> = vec![
        (reconcile("0".into()), Starts),
        (reconcile("0s".into()), Starts),
        (reconcile("1ms".into()), Starts),
        (reconcile("1h".into()), Starts),
        (reconcile(format!("{max}s")), Starts),
        (reconcile(format!("{beyond}s")), Refused("too large")),
        (reconcile(format!("{}m", max / 59)), Refused("too large")),
        (reconcile("-1s".into()), Refused("invalid duration")),
        (reconcile("10".into()), Refused("no unit")),
        (reconcile("1.5s".into()), Refused("not a whole number")),
        (owned(&["--nri-plugin-index=00"]), Starts),
        (owned(&["--nri-plugin-index=99"]), Starts),
        (owned(&["--nri-plugin-index=0"]), Refused("must be two digits, 00 to 99")),
        (owned(&["--nri-plugin-index=100"]), Refused("must be two digits, 00 to 99")),
        (owned(&["--nri-plugin-index=-1"]), Refused("must be two digits, 00 to 99")),
        (owned(&["--metrics-addr", ":0"]), Starts),
        (owned(&["--metrics-addr", "off"]), Starts),
        (owned(&["--metrics-addr", ":65536"]), Refused("is not a number from 0 to 65535")),
        (owned(&["--v=0"]), Starts),
        (vec![format!("--v={}", u32::MAX)], Starts),
        (owned(&["--v=4294967296"]), Refused("--v")),
        (owned(&["--v=-1"]), Refused("--v")),
        (vec![format!("--hook-name={}", "x".repeat(200))], Starts),
        (vec![format!("--hook-name={}", "x".repeat(201))], Refused("--hook-name")),
        (owned(&["--selector=k="]), Starts),
        (owned(&["--selector==v"]), Refused("expected KEY=VALUE")),
        // --cgroup-root: what is there must be what --cgroup-version says, mounted and writable.
        (
            vec!["--cgroup-root".into(), empty.clone(), "--cgroup-version".into(), "v2".into()],
            Refused("an empty directory on"),
        ),
        (vec!["--cgroup-root".into(), empty.clone()], Refused("not a mounted cgroup file system")),
        (owned(&["--cgroup-root", "/nonexistent/cgroup"]), Refused("does not exist")),
        (
            vec!["--cgroup-root".into(), empty.clone(), "--unchecked-cgroup-root".into()],
            Refused("needs --cgroup-version v1 or v2"),
        ),
        (
            vec![
                "--cgroup-root".into(),
                empty.clone(),
                "--cgroup-version".into(),
                "v2".into(),
                "--unchecked-cgroup-root".into(),
            ],
            Starts,
        ),
    ];
    match fs_type("/sys/fs/cgroup").as_str() {
        // v1 or hybrid (this project's machines)
        "tmpfs" if fs_type("/sys/fs/cgroup/cpu") == "cgroupfs" => {
            cases.push((owned(&["--cgroup-root", "/sys/fs/cgroup"]), Starts));
            cases.push((owned(&["--cgroup-root", "/sys/fs/cgroup", "--cgroup-version", "v1"]), Starts));
            cases.push((
                owned(&["--cgroup-root", "/sys/fs/cgroup", "--cgroup-version", "v2"]),
                Refused("is a cgroup v1 hierarchy"),
            ));
            cases.push((owned(&["--cgroup-root", "/sys/fs/cgroup/cpu"]), Refused("one cgroup v1 controller's mount")));
            if fs_type("/sys/fs/cgroup/unified") == "cgroup2fs" {
                cases.push((
                    owned(&["--cgroup-root", "/sys/fs/cgroup/unified", "--cgroup-version", "v1"]),
                    Refused("is a cgroup2 (unified) mount"),
                ));
            }
        }
        "cgroup2fs" => {
            cases.push((owned(&["--cgroup-root", "/sys/fs/cgroup", "--cgroup-version", "v2"]), Starts));
            cases.push((
                owned(&["--cgroup-root", "/sys/fs/cgroup", "--cgroup-version", "v1"]),
                Refused("is a cgroup2 (unified) mount"),
            ));
        }
        _ => {}
    }
    let mut failures = Vec::new();
    for (i, (case, expect)) in cases.iter().enumerate() {
        let run = dir.path().join(format!("case{i}"));
        std::fs::create_dir_all(run.join("cgroup")).unwrap();
        let mut args: Vec<String> = vec![
            "--listen".into(),
            run.join("h.sock").display().to_string(),
            "--hook-config-dir".into(),
            run.join("hooks").display().to_string(),
        ];
        if !case.iter().any(|a| a.starts_with("--cgroup")) {
            args.extend(owned(&[
                "--cgroup-root",
                run.join("cgroup").to_str().unwrap(),
                "--cgroup-version",
                "v1",
                "--unchecked-cgroup-root",
            ]));
        }
        args.extend(case.iter().cloned());
        let shown = case.join(" ");
        match expect {
            Refused(why) => {
                let out =
                    Command::new(HOOKS_BIN).args(&args).env("RUST_LOG", "info").stdin(Stdio::null()).output().unwrap();
                let stderr = String::from_utf8_lossy(&out.stderr);
                if out.status.code() != Some(2) || !stderr.contains(why) {
                    failures.push(format!("{shown}: want exit 2 with {why:?}, got {:?}:\n{stderr}", out.status.code()));
                }
                // A refusal after parsing (the cgroup root) is the last log line, said once.
                if stderr.contains("runtime-hooks stopped:") {
                    let last = stderr.trim_end().lines().last().unwrap_or_default();
                    if !last.contains("runtime-hooks stopped:")
                        || !last.contains(why)
                        || stderr.matches(why).count() != 1
                    {
                        failures.push(format!("{shown}: the reason must be the last line, once:\n{stderr}"));
                    }
                }
                if run.join("h.sock").exists() || run.join("hooks/runtime-hooks.json").exists() {
                    failures.push(format!("{shown}: refused, yet it created its socket or registration"));
                }
            }
            Starts => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let mut hooks = Hooks::start(&args, run.join("hooks.log"));
                let registered = eventually(Duration::from_secs(10), || {
                    run.join("hooks").read_dir().is_ok_and(|mut d| d.next().is_some())
                });
                let code = hooks.terminate();
                if !registered || code != Some(0) {
                    failures.push(format!(
                        "{shown}: want a clean start and stop, got registered={registered} exit {code:?}:\n{}",
                        hooks.log()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
