//! `Type=notify` units: the real runtime-hooks binary, started with `NOTIFY_SOCKET` as systemd
//! starts it, sends `READY=1` once it is registered and its socket accepts connections (proxy
//! mode), its reconciler runs (standalone) or its plugin starts connecting (NRI mode, also while
//! the NRI socket is absent), and `STOPPING=1` at SIGTERM. Cgroups: an empty temp
//! tree; the runtime endpoint is missing. Also `--probe`, the liveness check, against the live
//! server and after it stopped.

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(dir: &Path, notify_socket: &Path, mode: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join("hooks.log")).unwrap();
    for d in ["hookserver.d", "cgroup"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    Command::new(env!("CARGO_BIN_EXE_runtime-hooks"))
        .args(mode)
        .arg("--listen")
        .arg(dir.join("run/hooks.sock"))
        .arg("--hook-config-dir")
        .arg(dir.join("hookserver.d"))
        .arg("--cgroup-root")
        .arg(dir.join("cgroup"))
        .args(["--cgroup-version", "v1", "--unchecked-cgroup-root", "--cgroup-driver", "cgroupfs"])
        .env("NOTIFY_SOCKET", notify_socket)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawning runtime-hooks")
}

fn receive(socket: &UnixDatagram, dir: &Path) -> String {
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).unwrap_or_else(|e| {
        panic!(
            "no notification within 10 s ({e}); log:\n{}",
            std::fs::read_to_string(dir.join("hooks.log")).unwrap_or_default()
        )
    });
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn stop(mut child: Child, listener: &UnixDatagram, dir: &Path) {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(receive(listener, dir), "STOPPING=1");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn proxy_mode_ready_when_registered_and_serving() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    let child = spawn(dir.path(), &notify, &[]);
    assert_eq!(receive(&listener, dir.path()), "READY=1");
    UnixStream::connect(dir.path().join("run/hooks.sock")).expect("the socket accepts when READY=1 arrives");
    assert!(dir.path().join("hookserver.d/runtime-hooks.json").exists(), "registered before READY=1");
    assert_eq!(probe(dir.path()), (0, String::new()), "--probe against the live server");
    stop(child, &listener, dir.path());
    assert!(!dir.path().join("hookserver.d/runtime-hooks.json").exists(), "unregistered at exit");
    let (code, stderr) = probe(dir.path());
    assert_eq!(code, 1, "--probe without a server: {stderr}");
    assert!(stderr.contains("runtime-hooks: probe:") && stderr.contains("hooks.sock"), "{stderr}");
    // One line for kubelet's probe event: the gRPC code's name and the cause, no debug dump.
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(": UNAVAILABLE: ") && !stderr.contains("MetadataMap") && !stderr.contains("details:"),
        "{stderr}"
    );
}

/// `runtime-hooks --probe --listen SOCKET`, the DaemonSet's liveness probe: exit code and stderr.
fn probe(dir: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_runtime-hooks"))
        .arg("--probe")
        .arg("--listen")
        .arg(dir.join("run/hooks.sock"))
        .stdin(Stdio::null())
        .output()
        .expect("running runtime-hooks --probe");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn standalone_ready() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    let missing = dir.path().join("missing-containerd.sock");
    let child = spawn(dir.path(), &notify, &["--mode", "standalone", "--runtime-endpoint", missing.to_str().unwrap()]);
    assert_eq!(receive(&listener, dir.path()), "READY=1");
    stop(child, &listener, dir.path());
}

/// NRI mode with no NRI socket yet (containerd not started, or NRI off): READY=1 all the same —
/// the plugin connects when the socket comes — so `systemctl start` does not wait for a timeout.
#[test]
fn nri_mode_ready_while_the_nri_socket_is_absent() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    let missing = dir.path().join("missing-nri.sock");
    let child = spawn(dir.path(), &notify, &["--mode", "nri", "--nri-socket", missing.to_str().unwrap()]);
    assert_eq!(receive(&listener, dir.path()), "READY=1");
    stop(child, &listener, dir.path());
}
