//! A log pipe that goes away never takes runtime-hooks down: with stderr a pipe whose reader is
//! closed before the start, or a FIFO whose reader goes away while it runs, it keeps answering
//! hook calls, and on SIGTERM exits 0 and removes its registration file and socket (so the proxy
//! never keeps calling a dead server). And koord's klog flags (`--v=4`, `--logtostderr`, …) are
//! accepted with one deprecation notice, `--v` setting the log level.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hook_api::v1alpha1 as hooks;

/// A pipe: (read end, write end).
fn pipe() -> (File, File) {
    let mut fds = [0; 2];
    // SAFETY: pipe2(2) fills the two-element array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0, "pipe2");
    // SAFETY: both descriptors were just created and are owned by the two Files only.
    unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) }
}

/// runtime-hooks in proxy mode on `dir/run/hooks.sock`, registering in `dir/hookserver.d`,
/// cgroups in an empty temp tree, at debug level (a line per hook call), with `stderr`.
fn spawn(dir: &Path, stderr: Stdio) -> Child {
    spawn_with(dir, stderr, &[], Some("debug"))
}

/// [`spawn`] with `extra` flags and `RUST_LOG` (`None`: unset).
fn spawn_with(dir: &Path, stderr: Stdio, extra: &[&str], rust_log: Option<&str>) -> Child {
    for d in ["hookserver.d", "cgroup"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    Command::new(env!("CARGO_BIN_EXE_runtime-hooks"))
        .arg("--listen")
        .arg(dir.join("run/hooks.sock"))
        .arg("--hook-config-dir")
        .arg(dir.join("hookserver.d"))
        .arg("--cgroup-root")
        .arg(dir.join("cgroup"))
        .args(["--cgroup-version", "v1", "--unchecked-cgroup-root", "--cgroup-driver", "cgroupfs"])
        .args(extra)
        .env_remove("RUST_LOG")
        .envs(rust_log.map(|l| ("RUST_LOG", l)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawning runtime-hooks")
}

/// Waits until the registration file exists and the socket accepts; panics after 10 s or if the
/// process exits.
fn wait_serving(child: &mut Child, dir: &Path) {
    let start = Instant::now();
    while !(dir.join("hookserver.d/runtime-hooks.json").exists()
        && std::os::unix::net::UnixStream::connect(dir.join("run/hooks.sock")).is_ok())
    {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("runtime-hooks exited with {status}");
        }
        assert!(start.elapsed() < Duration::from_secs(10), "runtime-hooks not serving within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `n` hook calls (PreRunPodSandbox of a BE pod: the plugins act and log), each answered.
async fn hook_calls_answered(dir: &Path, n: usize) {
    let mut client = hook_api::RuntimeHookServiceClient::new(hook_api::connect(dir.join("run/hooks.sock")));
    for i in 0..n {
        let request = hooks::PodSandboxHookRequest {
            pod_meta: Some(hooks::PodSandboxMetadata {
                name: format!("p{i}"),
                namespace: "default".into(),
                uid: format!("u{i}"),
                attempt: 0,
            }),
            labels: [("koordinator.sh/qosClass".to_owned(), "BE".to_owned())].into(),
            cgroup_parent: format!("/kubepods/besteffort/podu{i}"),
            ..Default::default()
        };
        client.pre_run_pod_sandbox_hook(request).await.unwrap_or_else(|e| panic!("hook call #{i}: {e}"));
    }
}

/// SIGTERM, then a clean exit within 10 s, registration file and socket gone. Waits on a
/// blocking thread: the test's client must go on running to close its connection when asked.
async fn stop(child: Child, dir: &Path) {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || stop_blocking(child, &dir)).await.unwrap();
}

fn stop_blocking(mut child: Child, dir: &Path) {
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("runtime-hooks still running 10 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0), "clean exit on SIGTERM, without its log pipe: {status}");
    assert!(!dir.join("hookserver.d/runtime-hooks.json").exists(), "registration file removed");
    assert!(!dir.join("run/hooks.sock").exists(), "socket removed");
}

#[tokio::test]
async fn stderr_closed_before_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = pipe();
    drop(reader);
    let mut child = spawn(dir.path(), Stdio::from(writer));
    wait_serving(&mut child, dir.path());
    hook_calls_answered(dir.path(), 20).await;
    stop(child, dir.path()).await;
}

#[tokio::test]
async fn stderr_fifo_whose_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stderr.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let mut reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let mut child = spawn(dir.path(), Stdio::from(writer));
    wait_serving(&mut child, dir.path());
    let mut seen = String::new();
    let start = Instant::now();
    while !seen.contains("serving runtime hooks") {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        match reader.read(&mut buf) {
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("reading the FIFO: {e}"),
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no start-up line on the FIFO:\n{seen}");
    }
    hook_calls_answered(dir.path(), 2).await;
    drop(reader);
    hook_calls_answered(dir.path(), 20).await;
    stop(child, dir.path()).await;
}

/// koord's klog flags, as a unit written for koord's components passes them: accepted (they
/// were refused with exit 2), named in one notice; `--v=4` logs each hook call at debug level.
#[tokio::test]
async fn klog_flags_are_accepted_with_one_notice() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks.log");
    let flags = [
        "--v=4",
        "--logtostderr",
        "--alsologtostderr=false",
        "--log-dir",
        "/var/log/koord",
        "--log_file_max_size=1800",
    ];
    let mut child = spawn_with(dir.path(), Stdio::from(File::create(&log).unwrap()), &flags, None);
    wait_serving(&mut child, dir.path());
    hook_calls_answered(dir.path(), 1).await;
    // A pod without a cgroup parent: logged at debug.
    let mut client = hook_api::RuntimeHookServiceClient::new(hook_api::connect(dir.path().join("run/hooks.sock")));
    client.pre_run_pod_sandbox_hook(hooks::PodSandboxHookRequest::default()).await.expect("plain pod");
    drop(client);
    stop(child, dir.path()).await;
    let text = std::fs::read_to_string(&log).unwrap();
    let notices: Vec<&str> = text.lines().filter(|l| l.contains("deprecated klog flags")).collect();
    assert_eq!(notices.len(), 1, "{text}");
    for part in [
        "--v=4 sets the log level info,runtime_hooks=debug",
        "--logtostderr is ignored",
        "--log-dir=/var/log/koord is ignored",
    ] {
        assert!(notices[0].contains(part), "{part:?} missing from {}", notices[0]);
    }
    assert!(
        text.lines().any(|l| l.contains("DEBUG") && l.contains("runtime_hooks")),
        "--v=4: debug lines of runtime_hooks:\n{text}"
    );
}

/// A start-up failure is said once, as the last line, and "stopped" does not come before the
/// reason (it used to: "runtime-hooks stopped", then the error, then the error again).
#[test]
fn a_start_up_error_is_the_last_line_said_once() {
    let dir = tempfile::tempdir().unwrap();
    // The socket's directory cannot be created: a regular file is in the way.
    std::fs::write(dir.path().join("run"), "not a directory").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_runtime-hooks"))
        .arg("--listen")
        .arg(dir.path().join("run/hooks.sock"))
        .arg("--hook-config-dir")
        .arg(dir.path().join("hookserver.d"))
        .arg("--cgroup-root")
        .arg(dir.path())
        .args(["--cgroup-version", "v1", "--unchecked-cgroup-root", "--cgroup-driver", "cgroupfs"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let socket_dir = dir.path().join("run").display().to_string();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(&socket_dir)).collect();
    assert_eq!(lines.len(), 1, "the error once:\n{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("ERROR") && last.contains("runtime-hooks stopped: ") && last.contains(&socket_dir),
        "last line: {last}\n{stderr}"
    );
}
