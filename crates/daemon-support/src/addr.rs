//! `--metrics-addr`: where a daemon's admin endpoint (`/metrics`, `/healthz`) listens; the same
//! forms for runtime-proxy and runtime-hooks.

use std::net::SocketAddr;

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
}
