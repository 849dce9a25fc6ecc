//! `runtime-proxy status` and `runtime-hooks status`, the client side: `GET /status` from a
//! running daemon's admin socket (`--admin-socket`) or, when asked, its TCP admin endpoint
//! (`--metrics-addr`), printed as a table for people or as the JSON document itself, with an
//! exit code scripts and probes can test.
//!
//! | exit code | meaning |
//! |---|---|
//! | [`EXIT_HEALTHY`] (0) | the daemon answered and says it is healthy |
//! | [`EXIT_UNHEALTHY`] (1) | the daemon answered, and something needs attention (its `problems`) |
//! | [`EXIT_UNREACHABLE`] (2) | no status could be read: the endpoint is off, refuses the connection, does not answer in time, is served by another user, or answers something other than this program's status document (the other daemon's endpoint: its `program` field names it) |
//!
//! # Who answers
//!
//! Any local user can bind the TCP port while the daemon is not holding it and answer
//! "healthy". The admin socket is mode 0600 in a directory only root writes
//! ([`crate::admin_http`]), and `status` checks that the process serving it runs as root or
//! as the user running `status` (`SO_PEERCRED`). So `status` asks the admin socket, and the TCP
//! endpoint only when `--metrics-addr` is on its command line ([`Endpoint::choose`]).
//!
//! # What is printed
//!
//! The document is the daemon's (each binary renders its own table); this module fetches it
//! over plain HTTP/1.1 (no client library needed), escapes the control characters in every
//! string of it before any renderer sees it (a hook server's error message, a pod's name:
//! [`crate::escape`]), and formats times. Errors are one line naming the address and the cause,
//! never a debug dump.

use std::io::{Read as _, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::addr::MetricsAddr;

/// The daemon answered and is healthy.
pub const EXIT_HEALTHY: u8 = 0;
/// The daemon answered; something is unhealthy.
pub const EXIT_UNHEALTHY: u8 = 1;
/// No status could be read.
pub const EXIT_UNREACHABLE: u8 = 2;

/// Largest status document read (a node has a handful of hook servers and rules; 4 MiB is far
/// beyond any real one, and keeps a confused peer from filling memory).
const MAX_BODY: u64 = 4 << 20;

/// How the status is printed (`--output`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table for people.
    Table,
    /// The JSON document as the daemon serves it (pretty-printed).
    Json,
}

/// The flags of the `status` subcommands (the address is the binary's own `--metrics-addr`).
#[derive(Clone, Debug, PartialEq, Eq, clap::Args)]
pub struct StatusArgs {
    /// `table` (for people) or `json` (the daemon's document, for scripts).
    #[arg(long, short = 'o', value_enum, default_value = "table")]
    pub output: Output,

    /// How long to wait for the connection and the answer (`500ms`, `5s`, `1m`; more than 0).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_timeout)]
    pub timeout: Duration,
}

/// `--timeout`: a duration as every duration flag reads it ([`crate::duration::parse_duration`]:
/// `500ms`, `5s`, `1m`, `1h`), more than zero.
///
/// Errors: as [`crate::duration::parse_duration`], and zero (status would give up before
/// connecting).
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = crate::duration::parse_duration(s)?;
    if d.is_zero() {
        return Err("a timeout of 0 would give up before the daemon could answer; give e.g. 500ms or 5s".to_owned());
    }
    Ok(d)
}

/// Where `status` reads the document from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// The admin socket (`--admin-socket`, or its default beside the daemon's socket).
    Socket(PathBuf),
    /// The TCP admin endpoint (`--metrics-addr`; `None`: `off`).
    Tcp(MetricsAddr),
}

impl Endpoint {
    /// The endpoint `status` asks: the admin socket given on the command line; else the TCP
    /// endpoint when `--metrics-addr` is on the command line (`tcp_given`); else the admin
    /// socket's default (`socket`: its path, `None` when `--admin-socket off`, then the TCP
    /// endpoint).
    pub fn choose(socket: Option<PathBuf>, socket_given: bool, metrics_addr: MetricsAddr, tcp_given: bool) -> Endpoint {
        match socket {
            Some(path) if socket_given || !tcp_given => Endpoint::Socket(path),
            _ => Endpoint::Tcp(metrics_addr),
        }
    }
}

/// Whether the argument `id` (clap's id: `metrics_addr`) was given on the command line, before
/// or after the subcommand (a `global` flag).
pub fn given_on_command_line(matches: &clap::ArgMatches, id: &str) -> bool {
    let here = |m: &clap::ArgMatches| {
        m.try_get_raw(id).ok().flatten().is_some() && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
    };
    here(matches) || matches.subcommand().is_some_and(|(_, sub)| here(sub))
}

/// Runs a `status` subcommand: fetches `/status` from `endpoint` and prints it to `out`
/// (`render` makes the table from the document, its strings' control characters escaped
/// first), or one line to `err` (`program: status: why`) when no status can be read. Returns
/// the exit code (module table).
pub fn run(
    program: &str,
    endpoint: Endpoint,
    args: &StatusArgs,
    render: fn(&serde_json::Value) -> String,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> u8 {
    let (fetched, shown) = match &endpoint {
        Endpoint::Tcp(None) => {
            let _ = writeln!(
                err,
                "{program}: status: --metrics-addr is off: give the address {program} serves its admin endpoint on"
            );
            return EXIT_UNREACHABLE;
        }
        Endpoint::Tcp(Some(addr)) => (fetch(*addr, args.timeout), target(*addr).to_string()),
        Endpoint::Socket(path) => (fetch_socket(program, path, args.timeout), format!("unix:{}", path.display())),
    };
    let mut doc = match fetched {
        Ok(doc) => doc,
        Err(why) => {
            let _ = writeln!(err, "{program}: status: {}", crate::escape::escape_control(&why));
            return EXIT_UNREACHABLE;
        }
    };
    let Some(healthy) = doc.get("healthy").and_then(|h| h.as_bool()) else {
        let _ = writeln!(err, "{program}: status: {shown}: /status is not a status document (no \"healthy\")");
        return EXIT_UNREACHABLE;
    };
    if let Err(why) = check_program(program, &doc) {
        let _ = writeln!(err, "{program}: status: {shown}: {}", crate::escape::escape_control(&why));
        return EXIT_UNREACHABLE;
    }
    let text = match args.output {
        Output::Json => {
            crate::escape::escape_json_text(&serde_json::to_string_pretty(&doc).unwrap_or_default()).into_owned() + "\n"
        }
        Output::Table => {
            crate::escape::escape_json_strings(&mut doc);
            render(&doc)
        }
    };
    // A closed stdout (`| head`) is no reason for another exit code: the status was read.
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    if healthy {
        EXIT_HEALTHY
    } else {
        EXIT_UNHEALTHY
    }
}

/// Whether `doc` is `program`'s status document: its `program` field names it.
///
/// Errors: another program's document (`runtime-hooks` asked by `runtime-proxy status`: it
/// says which, and which command reads it), or a document without `program`.
pub fn check_program(program: &str, doc: &serde_json::Value) -> Result<(), String> {
    match doc.get("program").and_then(|p| p.as_str()) {
        Some(p) if p == program => Ok(()),
        Some(other) => Err(format!("this is {other}'s admin endpoint, not {program}'s (`{other} status` reads it)")),
        None => Err(format!("/status is not {program}'s status document (no \"program\")")),
    }
}

/// Where to connect for an admin endpoint bound to `addr`: an unspecified address (`:9318`
/// binds 0.0.0.0) is reached on loopback.
pub fn target(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], a.port())),
        SocketAddr::V6(a) if a.ip().is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port())),
        other => other,
    }
}

/// `GET /status` from the admin endpoint at `addr` (see [`target`]), within `timeout` for the
/// connection and again for the answer; the JSON document.
///
/// Errors, one line each naming the address: the connection is refused or times out, no
/// complete answer in time, an HTTP status other than 200 (with the first line of the body),
/// a body that is not JSON.
pub fn fetch(addr: SocketAddr, timeout: Duration) -> Result<serde_json::Value, String> {
    let to = target(addr);
    let conn = TcpStream::connect_timeout(&to, timeout)
        .map_err(|e| format!("cannot reach the admin endpoint at {to}: {e}"))?;
    let shown = to.to_string();
    let set = conn.set_read_timeout(Some(timeout)).and_then(|()| conn.set_write_timeout(Some(timeout)));
    set.map_err(|e| format!("reading GET /status from {shown}: {e}"))?;
    exchange(conn, &shown, &shown, timeout)
}

/// `GET /status` from the admin socket at `path`, within `timeout` for the answer, after
/// checking that the process serving it runs as root or as this process's user.
///
/// Errors, one line each naming the socket: no socket there (`program` is not running, or
/// its admin socket is elsewhere or off), permission denied (not root), the connection is
/// refused (a stale socket), the socket is served by another user, then as [`fetch`].
pub fn fetch_socket(program: &str, path: &Path, timeout: Duration) -> Result<serde_json::Value, String> {
    let shown = format!("unix:{}", path.display());
    let conn = UnixStream::connect(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no admin socket at {}: is {program} running? (it serves one there unless --admin-socket says otherwise; --metrics-addr ADDR asks its TCP endpoint instead)",
            path.display()
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "cannot reach the admin socket {}: {e} (it is root's: run status as root, or ask the TCP endpoint with --metrics-addr ADDR)",
            path.display()
        ),
        _ => format!("cannot reach the admin endpoint at {shown}: {e}"),
    })?;
    let uid = peer_uid(&conn).map_err(|e| format!("{shown}: cannot tell who serves it: {e}"))?;
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if uid != 0 && uid != me {
        return Err(format!("{shown} is served by uid {uid}, neither root nor you: not {program}'s, not asking it"));
    }
    let set = conn.set_read_timeout(Some(timeout)).and_then(|()| conn.set_write_timeout(Some(timeout)));
    set.map_err(|e| format!("reading GET /status from {shown}: {e}"))?;
    exchange(conn, &shown, "localhost", timeout)
}

/// The user ID of the process at the other end of `conn` (`SO_PEERCRED`: who bound the socket).
fn peer_uid(conn: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt(2) writes at most `len` bytes into `cred`, which lives across the call.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// One `GET /status` over `conn` (its timeouts set), `shown` naming the endpoint in errors and
/// `host` the `Host` header.
fn exchange(
    mut conn: impl std::io::Read + Write,
    shown: &str,
    host: &str,
    timeout: Duration,
) -> Result<serde_json::Value, String> {
    let io = |e: std::io::Error| {
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            format!("{shown} did not answer GET /status within {}", show_duration(timeout))
        } else {
            format!("reading GET /status from {shown}: {e}")
        }
    };
    // One write: a peer that answers after the first bytes and closes must not make it fail.
    let request =
        format!("GET /status HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    conn.take(MAX_BODY).read_to_end(&mut raw).map_err(io)?;
    let (code, body) = parse_response(&raw).map_err(|why| format!("{shown}: {why}"))?;
    if code != 200 {
        let first = String::from_utf8_lossy(&body).lines().next().unwrap_or_default().trim().to_owned();
        return Err(format!(
            "{shown} answered HTTP {code} to GET /status ({first}): an older version, or not this program's admin endpoint?"
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{shown}: /status is not JSON: {e}"))
}

/// The status code and body of an HTTP/1.1 response read to its end (`Connection: close`);
/// a chunked body is decoded.
///
/// Errors: no status line, or a chunked body that is cut short.
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("the answer is not HTTP (no end of headers)")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let code = lines
        .next()
        .filter(|l| l.starts_with("HTTP/1."))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or("the answer is not HTTP (no status line)")?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
        })
    });
    if !chunked {
        return Ok((code, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").ok_or("chunked body cut short")?;
        let size = std::str::from_utf8(&rest[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let size = size.ok_or("chunked body: bad chunk size")?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok((code, out));
        }
        if rest.len() < size {
            return Err("chunked body cut short".into());
        }
        out.extend_from_slice(&rest[..size]);
        rest = rest.get(size + 2..).unwrap_or_default();
    }
}

/// Milliseconds since the Unix epoch (0 for a time before it).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `unix_ms` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-25T08:03:09.120Z`.
pub fn rfc3339(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days, for days since 1970-01-01 (never negative here).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A duration the way an operator reads it: `850ms`, `42s`, `3m05s`, `2h07m`, `3d04h`.
pub fn show_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// How long before `now_ms` the time `then_ms` was, as [`show_duration`] with ` ago`.
pub fn ago(now_ms: u64, then_ms: u64) -> String {
    format!("{} ago", show_duration(Duration::from_millis(now_ms.saturating_sub(then_ms))))
}

/// The `problems` and `warnings` string arrays of a `/status` document, each under its title as
/// `- item` lines after a blank line; nothing for an absent or empty array.
pub fn problem_lists(doc: &serde_json::Value) -> String {
    let mut out = String::new();
    for key in ["problems", "warnings"] {
        let items = doc[key].as_array().cloned().unwrap_or_default();
        if !items.is_empty() {
            out.push_str(&format!("\n{key}\n"));
            for item in items {
                out.push_str(&format!("- {}\n", item.as_str().unwrap_or_default()));
            }
        }
    }
    out
}

/// Columns padded to their widest cell (counted in characters), two spaces apart; the last
/// column is not padded. One line per row, the header first.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                let pad = widths.get(i).copied().unwrap_or(0).saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            } else {
                line.push_str(cell);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The string at `key` of `doc`, `""` when absent or not a string (tables show what there is).
pub fn str_of<'a>(doc: &'a serde_json::Value, key: &str) -> &'a str {
    doc.get(key).and_then(|v| v.as_str()).unwrap_or_default()
}

/// The metric names an exposition (Prometheus text or OpenMetrics) offers, from its `# TYPE`
/// lines: each family's name, and the names of its samples (`_total` of a counter, `_bucket`,
/// `_sum` and `_count` of a histogram or summary); for checking that a dashboard queries only
/// metrics a program exports.
pub fn exposed_names(exposition: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let mut words = line.split_whitespace();
        if (words.next(), words.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else { continue };
        let name = name.strip_suffix("_total").filter(|_| kind == "counter").unwrap_or(name);
        names.insert(name.to_owned());
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" | "summary" => &["_bucket", "_sum", "_count"],
            _ => &[],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

/// The metric names starting with `prefix` (e.g. `runtime_proxy_`) that a Grafana dashboard's
/// JSON mentions anywhere (queries, variables, descriptions); a name ends at the first
/// character that cannot be part of one, and a prefix followed by a regex (`runtime_hooks_.+`)
/// is no name.
///
/// Errors: the text is not JSON.
pub fn dashboard_names(dashboard: &str, prefix: &str) -> Result<std::collections::BTreeSet<String>, String> {
    serde_json::from_str::<serde_json::Value>(dashboard).map_err(|e| format!("the dashboard is not JSON: {e}"))?;
    let mut names = std::collections::BTreeSet::new();
    let mut rest = dashboard;
    while let Some(at) = rest.find(prefix) {
        let preceded = dashboard.len() - rest.len() + at;
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let before = dashboard[..preceded].chars().next_back();
        if end > prefix.len() && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.insert(tail[..end].to_owned());
        }
        rest = &tail[end.max(prefix.len())..];
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_read_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z", "a leap day");
        assert_eq!(rfc3339(1_795_000_000_000), "2026-11-18T11:06:40.000Z");
        assert_eq!(show_duration(Duration::from_millis(850)), "850ms");
        assert_eq!(show_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(show_duration(Duration::from_secs(7620)), "2h07m");
        assert_eq!(show_duration(Duration::from_secs(273_600)), "3d04h");
        assert_eq!(ago(10_000, 4_000), "6s ago");
        assert_eq!(ago(1, 5), "0ms ago", "a clock step back is not negative");
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&["NAME", "POLICY"], &[vec!["a.json".into(), "Fail".into()], vec!["bb".into(), "Ignore".into()]]);
        assert_eq!(t, "NAME    POLICY\na.json  Fail\nbb      Ignore\n");
    }

    #[test]
    fn responses_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), (200, b"{\"a\":1}".to_vec()));
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nabc").is_err());
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_timeout("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_timeout("1m"), Ok(Duration::from_secs(60)), "the form of every duration flag");
        assert_eq!(parse_timeout("1h"), Ok(Duration::from_secs(3600)));
        for zero in ["0", "0s", "0ms"] {
            assert!(parse_timeout(zero).unwrap_err().contains("a timeout of 0 would give up"), "{zero}");
        }
        assert!(parse_timeout("5").unwrap_err().contains("no unit"));
    }

    /// Nothing listening: exit 2, one line naming the address, nothing on stdout.
    #[test]
    fn an_unreachable_endpoint_is_exit_2_with_one_line() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let args = StatusArgs { output: Output::Table, timeout: Duration::from_secs(2) };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run("prog", Endpoint::Tcp(Some(free)), &args, |_| String::new(), &mut out, &mut err);
        let err = String::from_utf8(err).unwrap();
        assert_eq!(code, EXIT_UNREACHABLE);
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("prog: status: cannot reach the admin endpoint at ") && err.contains(&free.to_string()),
            "{err}"
        );
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(run("prog", Endpoint::Tcp(None), &args, |_| String::new(), &mut out, &mut err), EXIT_UNREACHABLE);
        assert!(String::from_utf8(err).unwrap().contains("--metrics-addr is off"));
        let missing = std::env::temp_dir().join(format!("no-such-{}.sock", std::process::id()));
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(
            run("prog", Endpoint::Socket(missing.clone()), &args, |_| String::new(), &mut out, &mut err),
            EXIT_UNREACHABLE
        );
        let err = String::from_utf8(err).unwrap();
        assert!(
            err.starts_with(&format!("prog: status: no admin socket at {}: is prog running?", missing.display())),
            "{err}"
        );
    }

    /// The socket is asked unless `--metrics-addr` alone is on the command line.
    #[test]
    fn the_admin_socket_first_tcp_when_asked() {
        let (sock, addr) = (Some(PathBuf::from("/run/a.sock")), Some("127.0.0.1:9318".parse().unwrap()));
        assert_eq!(
            Endpoint::choose(sock.clone(), false, addr, false),
            Endpoint::Socket("/run/a.sock".into()),
            "defaults: the socket"
        );
        assert_eq!(Endpoint::choose(sock.clone(), false, addr, true), Endpoint::Tcp(addr), "--metrics-addr given");
        assert_eq!(
            Endpoint::choose(sock.clone(), true, addr, true),
            Endpoint::Socket("/run/a.sock".into()),
            "both given"
        );
        assert_eq!(Endpoint::choose(None, true, addr, false), Endpoint::Tcp(addr), "--admin-socket off");
    }

    /// An admin endpoint on `listener` answering one connection per body in `bodies`, in order,
    /// each with `200 OK` and that body.
    fn serve_documents(listener: std::os::unix::net::UnixListener, bodies: Vec<String>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for body in bodies {
                let (mut conn, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                conn.write_all(head.as_bytes()).unwrap();
                conn.write_all(body.as_bytes()).unwrap();
            }
        })
    }

    /// A status document served on a unix socket by this user: read, and its control
    /// characters escaped in the table and in the JSON output.
    #[test]
    fn a_document_from_the_socket_is_printed_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let body =
            serde_json::json!({"healthy": true, "last_error": "bad\x1b[2K\rok\u{9b}1m\u{7f}", "program": "prog"})
                .to_string();
        let server = serve_documents(listener, vec![body.clone(), body]);
        let render: fn(&serde_json::Value) -> String = |doc| format!("last error: {}\n", str_of(doc, "last_error"));
        for (output, want) in [
            (Output::Table, "last error: bad\\x1b[2K\\rok\\u{9b}1m\\x7f\n"),
            (
                Output::Json,
                "{\n  \"healthy\": true,\n  \"last_error\": \"bad\\u001b[2K\\rok\\u009b1m\\u007f\",\n  \"program\": \"prog\"\n}\n",
            ),
        ] {
            let args = StatusArgs { output, timeout: Duration::from_secs(5) };
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = run("prog", Endpoint::Socket(path.clone()), &args, render, &mut out, &mut err);
            let (out, err) = (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap());
            assert_eq!((code, err.as_str()), (EXIT_HEALTHY, ""), "{out}");
            assert_eq!(out, want);
            assert!(!out.chars().any(|c| c != '\n' && crate::escape::is_escaped(c)), "{out:?}");
        }
        server.join().unwrap();
    }

    /// The other daemon's endpoint (a healthy document naming another program), or a document
    /// naming none: exit 2, one line saying whose it is, nothing on stdout.
    #[test]
    fn another_programs_document_is_exit_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let bodies = [
            r#"{"healthy": true, "program": "other"}"#,
            r#"{"healthy": true}"#,
            r#"{"healthy": true, "program": "prog"}"#,
        ];
        let server = serve_documents(listener, bodies.map(String::from).to_vec());
        let args = StatusArgs { output: Output::Table, timeout: Duration::from_secs(5) };
        let shown = format!("prog: status: unix:{}: ", path.display());
        for (want_code, want_err) in [
            (
                EXIT_UNREACHABLE,
                format!("{shown}this is other's admin endpoint, not prog's (`other status` reads it)\n"),
            ),
            (EXIT_UNREACHABLE, format!("{shown}/status is not prog's status document (no \"program\")\n")),
            (EXIT_HEALTHY, String::new()),
        ] {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = run("prog", Endpoint::Socket(path.clone()), &args, |_| "table\n".to_owned(), &mut out, &mut err);
            let (out, err) = (String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap());
            assert_eq!((code, err), (want_code, want_err));
            assert_eq!(out, if want_code == EXIT_HEALTHY { "table\n" } else { "" });
        }
        server.join().unwrap();
    }

    #[test]
    fn names_in_expositions_and_dashboards() {
        let text =
            "# HELP a_requests x\n# TYPE a_requests counter\n# TYPE a_seconds histogram\n# TYPE a_up gauge\n# TYPE b_total counter\n";
        let names: Vec<String> = exposed_names(text).into_iter().collect();
        assert_eq!(
            names,
            [
                "a_requests",
                "a_requests_total",
                "a_seconds",
                "a_seconds_bucket",
                "a_seconds_count",
                "a_seconds_sum",
                "a_up",
                "b",
                "b_total"
            ]
        );
        let dash = serde_json::json!({
            "expr": "rate(a_requests_total{x=\"1\"}[5m]) / a_up",
            "q": "label_values({__name__=~\"a_.+\"}, i)",
            "d": "see xa_up",
        })
        .to_string();
        let found: Vec<String> = dashboard_names(&dash, "a_").unwrap().into_iter().collect();
        assert_eq!(found, ["a_requests_total", "a_up"]);
        assert!(dashboard_names("{", "a_").is_err());
    }

    #[test]
    fn unspecified_addresses_are_reached_on_loopback() {
        assert_eq!(target("0.0.0.0:9318".parse().unwrap()).to_string(), "127.0.0.1:9318");
        assert_eq!(target("[::]:9318".parse().unwrap()).to_string(), "[::1]:9318");
        assert_eq!(target("10.1.2.3:9318".parse().unwrap()).to_string(), "10.1.2.3:9318");
    }
}
