//! `Type=notify` units: the real binary, started with `NOTIFY_SOCKET` as systemd starts it, sends
//! `READY=1` once its socket accepts connections and `STOPPING=1` when SIGTERM starts the drain.
//! The backend is missing: the proxy serves without it (every call would be UNAVAILABLE).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

fn spawn(dir: &Path, notify_socket: &str, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join("proxy.log")).unwrap();
    std::fs::create_dir_all(dir.join("hookserver.d")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_runtime-proxy"))
        .arg("--koord-runtimeproxy-endpoint")
        .arg(dir.join("run/proxy.sock"))
        .arg("--remote-runtime-service-endpoint")
        .arg(dir.join("missing-backend.sock"))
        .arg("--hook-config-dir")
        .arg(dir.join("hookserver.d"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(extra)
        .env("NOTIFY_SOCKET", notify_socket)
        .env("RUST_LOG", "info,runtime_proxy=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawning runtime-proxy")
}

fn receive(socket: &UnixDatagram, dir: &Path) -> String {
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 512];
    let n = socket.recv(&mut buf).unwrap_or_else(|e| {
        panic!(
            "no notification within 10 s ({e}); log:\n{}",
            std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
        )
    });
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn terminate(mut child: Child) -> i32 {
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap().code().unwrap_or(-1)
}

/// The states a unit sees, in order: READY=1 when the socket serves, STOPPING=1 at SIGTERM.
fn ready_then_stopping(mode: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    let child = spawn(dir.path(), notify.to_str().unwrap(), mode);
    assert_eq!(receive(&listener, dir.path()), "READY=1");
    // Ready means serving: the socket is there and accepts at once.
    UnixStream::connect(dir.path().join("run/proxy.sock")).expect("the socket accepts when READY=1 arrives");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(receive(&listener, dir.path()), "STOPPING=1");
    let mut child = child;
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn cri_mode_ready_then_stopping() {
    ready_then_stopping(&[]);
}

#[test]
fn docker_mode_ready_then_stopping() {
    ready_then_stopping(&["--backend-runtime-mode", "Docker"]);
}

/// systemd's usual form: `@/org/freedesktop/systemd1/notify/…` in the abstract namespace.
#[test]
fn abstract_notify_socket() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("runtime-proxy-test/notify/{}", std::process::id());
    let listener = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    let child = spawn(dir.path(), &format!("@{name}"), &[]);
    assert_eq!(receive(&listener, dir.path()), "READY=1");
    assert_eq!(terminate(child), 0);
}

/// A notification that cannot be delivered is a warning, not a reason to stop serving.
#[test]
fn undeliverable_notification_is_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(dir.path(), dir.path().join("nobody-listens.sock").to_str().unwrap(), &[]);
    let socket = dir.path().join("run/proxy.sock");
    let mut up = false;
    for _ in 0..500 {
        if UnixStream::connect(&socket).is_ok() {
            up = true;
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "exited: {}",
            std::fs::read_to_string(dir.path().join("proxy.log")).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(up, "never served");
    let log = std::fs::read_to_string(dir.path().join("proxy.log")).unwrap();
    assert!(log.contains("could not notify systemd"), "{log}");
    assert_eq!(terminate(child), 0);
}
