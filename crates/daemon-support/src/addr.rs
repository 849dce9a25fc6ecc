//! `--metrics-addr`: where a daemon's admin endpoint (`/metrics`, `/healthz`) listens, and
//! `--admin-socket`, the root-only unix socket serving the same routes; the same forms for
//! runtime-proxy and runtime-hooks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the admin endpoint listens (`--metrics-addr`); `None`: nowhere (`off`).
pub type MetricsAddr = Option<SocketAddr>;

/// `--metrics-addr`: `IP:PORT`, `[IPv6]:PORT`, `localhost:PORT` (127.0.0.1), `:PORT` (0.0.0.0,
/// every interface, as Go's `net.Listen` reads it), `off` or `""` (no admin endpoint).
///
/// Errors: anything else (another host name: none is resolved), naming the forms.
pub fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(Some(addr));
    }
    let port = |p: &str| p.parse::<u16>().map_err(|_| format!("{s:?}: the port {p:?} is not a number from 0 to 65535"));
    if let Some(p) = s.strip_prefix("localhost:") {
        return Ok(Some(SocketAddr::from(([127, 0, 0, 1], port(p)?))));
    }
    if let Some(p) = s.strip_prefix(':') {
        return Ok(Some(SocketAddr::from(([0, 0, 0, 0], port(p)?))));
    }
    Err(format!("{s:?}: expected IP:PORT, [IPv6]:PORT, localhost:PORT, :PORT or off"))
}

/// `--admin-socket` as given: a path, or `off` / `""` (no admin socket). Absent, each daemon
/// puts its admin socket beside its own socket ([`AdminSocketFlag::resolve`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminSocketFlag {
    /// No admin socket (`off`).
    Off,
    /// The admin socket's path.
    Path(PathBuf),
}

impl AdminSocketFlag {
    /// The admin socket's path, `None` when off: `flag`'s path when given, else beside the
    /// daemon's own socket `beside` (`--koord-runtimeproxy-endpoint`, `--listen`), named after
    /// it: `runtimeproxy.sock` → `runtimeproxy-admin.sock` (so two daemons with sockets of their
    /// own in one directory get admin sockets of their own too).
    pub fn resolve(flag: Option<&AdminSocketFlag>, beside: &Path) -> Option<PathBuf> {
        match flag {
            Some(AdminSocketFlag::Off) => None,
            Some(AdminSocketFlag::Path(p)) => Some(p.clone()),
            None => {
                let name = beside.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let stem = name.strip_suffix(".sock").unwrap_or(&name);
                Some(beside.with_file_name(format!("{stem}-admin.sock")))
            }
        }
    }
}

/// Longest unix socket path, in bytes (`sun_path` holds 108 with the terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// `--admin-socket`: an absolute path (`unix://` prefix optional) of at most
/// [`MAX_SOCKET_PATH`] bytes, or `off` / `""` (no admin socket).
///
/// Errors: a relative path, or one too long for a unix socket, naming the value.
pub fn parse_admin_socket(s: &str) -> Result<AdminSocketFlag, String> {
    let t = s.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("off") {
        return Ok(AdminSocketFlag::Off);
    }
    let path = t.strip_prefix("unix://").unwrap_or(t);
    if !path.starts_with('/') {
        return Err(format!("{s:?}: the admin socket's path must be absolute (or `off`)"));
    }
    if path.len() > MAX_SOCKET_PATH {
        return Err(format!(
            "{s:?}: socket path is {} bytes; a unix socket address holds at most {MAX_SOCKET_PATH}",
            path.len()
        ));
    }
    Ok(AdminSocketFlag::Path(PathBuf::from(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addr_forms() {
        let addr = |s: &str| parse_metrics_addr(s).map(|a| a.map(|a| a.to_string()));
        assert_eq!(addr("127.0.0.1:9318"), Ok(Some("127.0.0.1:9318".into())));
        assert_eq!(addr("[::1]:9318"), Ok(Some("[::1]:9318".into())));
        assert_eq!(addr("localhost:9318"), Ok(Some("127.0.0.1:9318".into())));
        assert_eq!(addr(":9318"), Ok(Some("0.0.0.0:9318".into())));
        assert_eq!(addr("off"), Ok(None));
        assert_eq!(addr(""), Ok(None));
        for bad in ["example.com:9318", "localhost:x", ":70000", "9318"] {
            assert!(parse_metrics_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn admin_socket_forms_and_default() {
        let p = |s: &str| parse_admin_socket(s);
        assert_eq!(p("/run/x/admin.sock"), Ok(AdminSocketFlag::Path("/run/x/admin.sock".into())));
        assert_eq!(p("unix:///run/x/admin.sock"), Ok(AdminSocketFlag::Path("/run/x/admin.sock".into())));
        assert_eq!((p("off"), p("")), (Ok(AdminSocketFlag::Off), Ok(AdminSocketFlag::Off)));
        assert!(p("run/admin.sock").unwrap_err().contains("absolute"));
        assert!(p(&format!("/{}", "a".repeat(107))).unwrap_err().contains("at most 107"));
        let beside = Path::new("/var/run/koord-runtimeproxy/runtimeproxy.sock");
        let resolve = |f: Option<&AdminSocketFlag>| AdminSocketFlag::resolve(f, beside);
        assert_eq!(resolve(None), Some(PathBuf::from("/var/run/koord-runtimeproxy/runtimeproxy-admin.sock")));
        assert_eq!(AdminSocketFlag::resolve(None, Path::new("/run/h/b")), Some(PathBuf::from("/run/h/b-admin.sock")));
        assert_eq!(resolve(Some(&AdminSocketFlag::Off)), None);
        assert_eq!(resolve(Some(&AdminSocketFlag::Path("/a.sock".into()))), Some(PathBuf::from("/a.sock")));
    }
}
