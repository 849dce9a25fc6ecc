//! The Debian docker CLI (`/usr/bin/docker`, 20.10) through the proxy in Docker mode, against the
//! real dockerd of `scripts/dockerd.sh`: every command gives what it gives directly against
//! dockerd — version, `run` output and exit codes, `exec` with and without a TTY (stdout, stderr,
//! exit code, stdin half-close: koord-runtime-proxy #437), `attach`, streamed `logs -f` and
//! `events`, `stats`, `cp` both ways, `rm -f` — and containers not named the Kubernetes way call
//! no hook server. Needs `RP_DOCKERD_ENV` (set by `make test`).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use test_support::containerd::unique;
use test_support::dockerd::Dockerd;
use test_support::hooks::{register, Seen, TestHook};
use test_support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// dockerd and a proxy in Docker mode in front of it (hook config dir: an empty temp dir).
struct Setup {
    env: Dockerd,
    dir: tempfile::TempDir,
    proxy: ProxyProcess,
}

fn setup() -> Setup {
    let env = Dockerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-dcli").tempdir().unwrap();
    let proxy = ProxyProcess::start(
        BIN,
        &env.socket,
        &["--backend-runtime-mode", "Docker", "--hook-config-dir", dir.path().to_str().unwrap()],
    );
    Setup { env, dir, proxy }
}

/// A command's outcome.
#[derive(Debug, PartialEq, Eq)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn out(cmd: &mut Command) -> Out {
    let o = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs `cmd` and returns its stdout; panics unless it exits 0.
fn ok(cmd: &mut Command) -> String {
    let o = out(cmd);
    assert_eq!(o.code, Some(0), "{cmd:?}: {o:?}");
    o.stdout
}

impl Setup {
    /// The CLI pointed at the proxy.
    fn docker(&self, args: &[&str]) -> Command {
        let mut c = self.env.docker(self.proxy.socket());
        c.args(args);
        c
    }
    /// The CLI pointed at dockerd itself.
    fn direct(&self, args: &[&str]) -> Command {
        let mut c = self.env.docker_direct();
        c.args(args);
        c
    }
    /// Starts a detached container (`--network none`) named `name` directly on dockerd, running
    /// `cmd` (the image's `sleep 3600` when empty); it is removed when the guard drops.
    fn container(&self, name: &str, extra: &[&str], cmd: &[&str]) -> Removed {
        let mut args = vec!["run", "-d", "--name", name, "--network", "none"];
        args.extend_from_slice(extra);
        args.push(&self.env.test_image);
        args.extend_from_slice(cmd);
        ok(&mut self.direct(&args));
        Removed(self.env.clone(), vec![name.to_owned()])
    }
    /// Whether dockerd has a container named exactly `name`.
    fn exists(&self, name: &str) -> bool {
        let names =
            ok(&mut self.direct(&["ps", "-a", "--filter", &format!("name=^/{name}$"), "--format", "{{.Names}}"]));
        names.lines().any(|n| n == name)
    }
}

/// Removes these containers directly on dockerd when dropped (the dev dockerd stays clean).
struct Removed(Dockerd, Vec<String>);
impl Drop for Removed {
    fn drop(&mut self) {
        let _ = self
            .0
            .docker_direct()
            .arg("rm")
            .arg("-f")
            .args(&self.1)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process killed when dropped, with its stdout lines arriving on a channel.
struct Streaming {
    child: Child,
    lines: Receiver<(Instant, String)>,
}

impl Streaming {
    fn spawn(mut cmd: Command) -> Streaming {
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("spawn");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send((Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Streaming { child, lines }
    }

    /// The next line, if one comes within `timeout`.
    fn next(&self, timeout: Duration) -> Option<(Instant, String)> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Whether the process is still running.
    fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn version_is_dockerds() {
    let s = setup();
    let format = ["version", "--format", "{{.Server.Version}} {{.Server.APIVersion}} {{.Server.Os}}"];
    let through = ok(&mut s.docker(&format));
    assert_eq!(through, ok(&mut s.direct(&format)));
    assert_eq!(through.trim(), format!("{} {} linux", s.env.version, s.env.api_version));
}

#[test]
fn run_rm_prints_output_and_exit_code() {
    let s = setup();
    let script = "echo out; echo err >&2; exit 5";
    let run = |mut c: Command| out(c.args(["run", "--rm", "--network", "none", &s.env.test_image, "sh", "-c", script]));
    let through = run(s.env.docker(s.proxy.socket()));
    assert_eq!(through, Out { code: Some(5), stdout: "out\n".into(), stderr: "err\n".into() });
    assert_eq!(through, run(s.env.docker_direct()), "as directly against dockerd");
}

/// koord-runtime-proxy #437: `docker exec` without `-t` lost its output and exited 126 behind
/// koord's proxy. Through this one stdout, stderr and the exit code all come back.
#[test]
fn exec_without_tty_returns_stdout_stderr_and_exit_code() {
    let s = setup();
    let name = unique("cli-exec");
    let _c = s.container(&name, &[], &[]);
    let args = ["exec", &name, "sh", "-c", "echo out; echo err >&2; exit 3"];
    let through = out(&mut s.docker(&args));
    assert_eq!(through, Out { code: Some(3), stdout: "out\n".into(), stderr: "err\n".into() });
    assert_eq!(through, out(&mut s.direct(&args)), "as directly against dockerd");
    // Larger output than one read: all of it arrives before the exit code.
    let big = ["exec", &name, "sh", "-c", "seq 1 20000; exit 7"];
    let through = out(&mut s.docker(&big));
    assert_eq!(through.code, Some(7));
    assert_eq!(through.stdout.lines().count(), 20000);
    assert_eq!(through.stdout.lines().last(), Some("20000"));
}

/// `echo hello | docker exec -i c cat`: the CLI closes its write side when stdin ends; the
/// shutdown must reach dockerd (cat ends) and cat's output must still come back.
#[test]
fn exec_with_stdin_half_closes() {
    let s = setup();
    let name = unique("cli-stdin");
    let _c = s.container(&name, &[], &[]);
    let run = |mut c: Command| {
        let mut child = c
            .args(["exec", "-i", &name, "sh", "-c", "cat; echo done >&2"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"hello\nsecond line\n").unwrap(); // dropped: EOF
        let started = Instant::now();
        let o = child.wait_with_output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(20), "exec did not end after stdin closed");
        Out {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    };
    let through = run(s.env.docker(s.proxy.socket()));
    assert_eq!(through, Out { code: Some(0), stdout: "hello\nsecond line\n".into(), stderr: "done\n".into() });
    assert_eq!(through, run(s.env.docker_direct()), "as directly against dockerd");
}

#[test]
fn exec_with_tty() {
    let s = setup();
    let name = unique("cli-tty");
    let _c = s.container(&name, &[], &[]);
    let args = ["exec", "-t", &name, "sh", "-c", "tty; echo x; exit 2"];
    let through = out(&mut s.docker(&args));
    let direct = out(&mut s.direct(&args));
    assert_eq!(through.code, Some(2), "{through:?}");
    // A terminal: its device, and CR LF line ends from the pty.
    assert!(through.stdout.starts_with("/dev/pts/") && through.stdout.ends_with("\r\nx\r\n"), "{through:?}");
    // The same but for the pty's number.
    let after_device = |o: &Out| (o.code, o.stdout.split_once('\r').map(|(_, rest)| rest.to_owned()));
    assert_eq!(after_device(&through), after_device(&direct), "as directly against dockerd: {direct:?}");
}

/// `docker attach` to a container that waits for a line on stdin, then prints three lines at
/// 0.2 s intervals and exits 4: the line goes in, the output comes out, the exit code is the
/// container's. (Stdin stays open until the end: the CLI itself may drop output that follows
/// the end of its stdin, with or without the proxy.)
#[test]
fn attach_sends_stdin_and_streams_output() {
    let s = setup();
    for through_proxy in [true, false] {
        let name = unique("cli-attach");
        let _c = s.container(
            &name,
            &["-i"],
            &["sh", "-c", "read x; echo got $x; for i in 1 2 3; do echo $i; sleep 0.2; done; exit 4"],
        );
        let mut cmd = if through_proxy { s.env.docker(s.proxy.socket()) } else { s.env.docker_direct() };
        let mut child = cmd
            .args(["attach", &name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        let mut stdout = String::new();
        child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
        let status = child.wait().unwrap();
        drop(stdin);
        assert_eq!(
            (status.code(), stdout.as_str()),
            (Some(4), "got go\n1\n2\n3\n"),
            "through the proxy: {through_proxy}"
        );
    }
}

/// `docker logs -f` on a container that prints a line every 0.2 s and never ends: lines arrive
/// one by one while it runs (nothing waits for the stream's end or a full buffer).
#[test]
fn logs_follow_streams_line_by_line() {
    let s = setup();
    let name = unique("cli-logs");
    let _c = s.container(&name, &[], &["sh", "-c", "i=0; while :; do i=$((i+1)); echo line$i; sleep 0.2; done"]);
    let mut logs = Streaming::spawn(s.docker(&["logs", "-f", &name]));
    let mut arrivals = Vec::new();
    for i in 1..=8 {
        let (at, line) =
            logs.next(Duration::from_secs(10)).unwrap_or_else(|| panic!("line {i} did not arrive within 10 s"));
        assert_eq!(line, format!("line{i}"));
        arrivals.push(at);
    }
    assert!(logs.running(), "logs -f still following");
    // The last lines were written after logs -f started: they came as they were written.
    let spread = arrivals[7] - arrivals[0];
    assert!(
        spread >= Duration::from_millis(600),
        "8 lines written 0.2 s apart arrived within {spread:?}: not streamed"
    );
    let direct = ok(&mut s.direct(&["logs", &name]));
    assert!(direct.starts_with("line1\nline2\nline3\nline4\nline5\nline6\nline7\nline8\n"), "{direct}");
}

/// `docker events` is an endless stream: the events of a container created after it started
/// arrive while it runs; a bounded `--since/--until` query gives the same as directly.
#[test]
fn events_stream_and_bounded_query() {
    let s = setup();
    let name = unique("cli-events");
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs().to_string();
    let filter = format!("container={name}");
    let mut events =
        Streaming::spawn(s.docker(&["events", "--since", &since, "--filter", &filter, "--format", "{{.Action}}"]));
    std::thread::sleep(Duration::from_millis(300));
    ok(&mut s.direct(&["run", "--rm", "--name", &name, "--network", "none", &s.env.test_image, "true"]));
    let mut seen = Vec::new();
    while !seen.contains(&"destroy".to_string()) {
        let (_, action) =
            events.next(Duration::from_secs(10)).unwrap_or_else(|| panic!("events stopped after {seen:?}"));
        seen.push(action);
    }
    assert_eq!(seen, ["create", "attach", "start", "die", "destroy"]);
    assert!(events.running(), "the stream goes on");

    let until = (SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() + 1).to_string();
    std::thread::sleep(Duration::from_millis(1100)); // --until in the past: the query ends by itself
    let bounded = [
        "events",
        "--since",
        &since,
        "--until",
        &until,
        "--filter",
        &filter,
        "--format",
        "{{.Action}} {{.Actor.Attributes.name}}",
    ];
    let through = ok(&mut s.docker(&bounded));
    assert_eq!(through, ok(&mut s.direct(&bounded)));
    assert_eq!(through.lines().map(|l| l.split(' ').next().unwrap()).collect::<Vec<_>>(), seen);
    assert!(through.lines().all(|l| l.ends_with(&name)), "{through}");
}

#[test]
fn stats_no_stream() {
    let s = setup();
    let name = unique("cli-stats");
    let _c = s.container(&name, &["--memory", "64m"], &[]);
    let args = ["stats", "--no-stream", "--format", "{{.Name}} {{.PIDs}} {{.MemUsage}}", &name];
    let through = ok(&mut s.docker(&args));
    let direct = ok(&mut s.direct(&args));
    let fields = |o: &str| o.split_whitespace().filter(|f| !f.ends_with("iB")).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(fields(&through), [name.as_str(), "1", "/"], "{through}");
    assert_eq!(fields(&through), fields(&direct));
    assert!(through.trim_end().ends_with("64MiB"), "the container's memory limit: {through}");
}

#[test]
fn cp_both_ways() {
    let s = setup();
    let name = unique("cli-cp");
    let _c = s.container(&name, &[], &[]);
    let tmp = tempfile::tempdir().unwrap();
    // 300 KiB that are not text: more than one frame each way.
    let payload: Vec<u8> = (0..300 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let src = tmp.path().join("payload.bin");
    std::fs::write(&src, &payload).unwrap();

    ok(&mut s.docker(&["cp", src.to_str().unwrap(), &format!("{name}:/tmp/in.bin")]));
    let inside = ok(&mut s.direct(&["exec", &name, "sh", "-c", "wc -c < /tmp/in.bin; md5sum /tmp/in.bin"]));
    let host_md5 = ok(Command::new("md5sum").arg(&src));
    assert_eq!(inside.lines().next().map(str::trim), Some((300 * 1024).to_string().as_str()));
    assert_eq!(
        inside.lines().nth(1).and_then(|l| l.split_whitespace().next()),
        host_md5.split_whitespace().next(),
        "same bytes inside"
    );

    ok(&mut s.direct(&["exec", &name, "sh", "-c", "cp /tmp/in.bin /tmp/out.bin; echo tail >> /tmp/out.bin"]));
    let (through, direct) = (tmp.path().join("through.bin"), tmp.path().join("direct.bin"));
    ok(&mut s.docker(&["cp", &format!("{name}:/tmp/out.bin"), through.to_str().unwrap()]));
    ok(&mut s.direct(&["cp", &format!("{name}:/tmp/out.bin"), direct.to_str().unwrap()]));
    let mut want = payload.clone();
    want.extend_from_slice(b"tail\n");
    assert!(std::fs::read(&through).unwrap() == want, "copied out through the proxy: other bytes");
    assert!(std::fs::read(&direct).unwrap() == want);
}

#[test]
fn rm_force_removes_a_running_container_and_unknown_ones_are_reported_like_dockerd() {
    let s = setup();
    let name = unique("cli-rm");
    let _c = s.container(&name, &[], &[]);
    assert_eq!(ok(&mut s.direct(&["inspect", "--format", "{{.State.Running}}", &name])).trim(), "true");
    assert_eq!(ok(&mut s.docker(&["rm", "-f", &name])).trim(), name);
    assert!(!s.exists(&name), "removed on dockerd");
    let missing = unique("cli-missing");
    let through = out(&mut s.docker(&["rm", &missing]));
    assert_eq!(through.code, Some(1), "{through:?}");
    assert!(through.stderr.contains(&format!("No such container: {missing}")), "{through:?}");
    assert_eq!(through, out(&mut s.direct(&["rm", &missing])), "as directly against dockerd");
    // `-f` ignores a missing container (dockerd's 404 is not an error for it), also through the proxy.
    assert_eq!(out(&mut s.docker(&["rm", "-f", &missing])), out(&mut s.direct(&["rm", "-f", &missing])));
}

/// Containers not named the Kubernetes way pass through untouched: a hook server registered
/// for every stage with failure policy Fail, refusing every call, is never asked while plain
/// containers are run, updated, stopped, started and removed. (The same server refuses a
/// container named like a pod sandbox: it is live.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_docker_run_calls_no_hook() {
    let s = setup();
    let refuse = || tonic::Status::permission_denied("this hook refuses everything");
    let hook = TestHook::start(Arc::new(move |_, _| Err(refuse())), Arc::new(move |_, _| Err(refuse()))).await;
    let stages = [
        "PreRunPodSandbox",
        "PostStopPodSandbox",
        "PreCreateContainer",
        "PreStartContainer",
        "PostStartContainer",
        "PreUpdateContainerResources",
        "PostStopContainer",
    ];
    register(s.dir.path(), "refuse.json", hook.socket(), "Fail", &stages, json!({}));
    assert!(s.proxy.wait_log(&["hook server", "file=refuse.json"], 0), "{}", s.proxy.log());

    let run = out(&mut s.docker(&["run", "--rm", "--network", "none", &s.env.test_image, "echo", "hi"]));
    assert_eq!(run, Out { code: Some(0), stdout: "hi\n".into(), stderr: String::new() });
    let name = unique("cli-plain");
    let _c = Removed(s.env.clone(), vec![name.clone()]);
    ok(&mut s.docker(&["run", "-d", "--name", &name, "--network", "none", "--cpu-shares", "512", &s.env.test_image]));
    ok(&mut s.docker(&["update", "--cpu-shares", "300", &name]));
    assert_eq!(ok(&mut s.direct(&["inspect", "--format", "{{.HostConfig.CpuShares}}", &name])).trim(), "300");
    ok(&mut s.docker(&["stop", "-t", "0", &name]));
    ok(&mut s.docker(&["start", &name]));
    ok(&mut s.docker(&["rm", "-f", &name]));
    tokio::time::sleep(Duration::from_millis(300)).await; // post stages would run after the answers
    assert!(hook.seen().is_empty(), "no hook called: {:?}", hook.seen().iter().map(Seen::stage).collect::<Vec<_>>());

    let sandbox = format!("k8s_POD_cli_default_{}_0", unique("uid"));
    let _s = Removed(s.env.clone(), vec![sandbox.clone()]);
    let refused = out(&mut s.docker(&["create", "--name", &sandbox, "--network", "none", &s.env.pause_image]));
    assert_ne!(refused.code, Some(0));
    assert!(
        refused.stderr.contains("this hook refuses everything") && refused.stderr.contains("PreRunPodSandbox"),
        "{refused:?}"
    );
    assert_eq!(hook.seen().iter().map(Seen::stage).collect::<Vec<_>>(), ["PreRunPodSandbox"]);
    assert!(!s.exists(&sandbox));
}
