//! systemd's service notification protocol (`sd_notify(3)`), for `Type=notify` units: a state
//! such as `READY=1` or `STOPPING=1` is one datagram sent to the unix socket named by
//! `$NOTIFY_SOCKET`, a path or, with a leading `@`, a name in the abstract namespace.
//!
//! Both binaries send `READY=1` once their socket is bound and serving and `STOPPING=1` when a
//! signal starts their shutdown. Outside systemd (`NOTIFY_SOCKET` unset) nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// `READY=1`: start-up is finished (systemd then starts the units ordered after this one).
pub const READY: &str = "READY=1";
/// `STOPPING=1`: shutdown has begun.
pub const STOPPING: &str = "STOPPING=1";

/// Sends `state` to `$NOTIFY_SOCKET`. `Ok(false)` when the variable is unset or empty (not
/// started by systemd with `Type=notify`), `Ok(true)` when sent.
///
/// Errors: an address that is neither absolute nor `@abstract` (systemd's `vsock:` form is not
/// supported), or the send failing (no one listening).
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(addr) if !addr.is_empty() => notify_to(addr.as_bytes(), state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends `state` to the notification socket `addr` (`/path` or `@abstract-name`).
pub fn notify_to(addr: &[u8], state: &str) -> io::Result<()> {
    let addr = if let Some(name) = addr.strip_prefix(b"@") {
        SocketAddr::from_abstract_name(name)?
    } else if addr.starts_with(b"/") {
        SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(addr))?
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NOTIFY_SOCKET {:?}: not an absolute path or @abstract name", String::from_utf8_lossy(addr)),
        ));
    };
    let socket = UnixDatagram::unbound()?;
    let sent = socket.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(io::Error::new(io::ErrorKind::WriteZero, format!("sent {sent} of {} bytes", state.len())));
    }
    Ok(())
}

/// Tells systemd `state` ([`READY`] once the socket is bound and served, [`STOPPING`]) when
/// started by a `Type=notify` unit; a failure is logged (WARN), never fatal. Both binaries use
/// it (`runtime_proxy::notify_systemd`, `runtime_hooks::notify_systemd`).
pub fn notify_systemd(state: &str) {
    match notify(state) {
        Ok(true) => tracing::debug!(state, "notified systemd"),
        Ok(false) => {}
        Err(e) => tracing::warn!(state, error = %e, "could not notify systemd (NOTIFY_SOCKET)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn receive(socket: &UnixDatagram) -> String {
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn to_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str().as_bytes(), READY).unwrap();
        assert_eq!(receive(&listener), "READY=1");
    }

    #[test]
    fn to_an_abstract_name() {
        let name = format!("hook-api-sd-notify-test-{}", std::process::id());
        let listener = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        notify_to(format!("@{name}").as_bytes(), STOPPING).unwrap();
        assert_eq!(receive(&listener), "STOPPING=1");
    }

    #[test]
    fn bad_addresses() {
        let err = notify_to(b"relative.sock", READY).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("relative.sock"), "{err}");
        assert!(notify_to(b"vsock:2:1234", READY).is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(notify_to(dir.path().join("nobody.sock").as_os_str().as_bytes(), READY).is_err(), "no one listening");
    }
}
