//! What `/status` says will happen to the next pod, beyond what past calls showed: a
//! `--required-hook-servers` entry with no registration (the proxy refuses every pod's pre
//! stages, [`crate::hooks::chain`]), and a hook server whose failure refuses pods — failure
//! policy `Fail`, or required by the node — whose socket cannot be connected to now (its next
//! call fails, although no call has failed yet).
//!
//! The sockets are probed when `/status` is read: one `connect(2)` per registered server, all at
//! once, each within [`PROBE_TIMEOUT`], the connection closed at once (no gRPC is spoken: the
//! server sees a connection open and close).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use crate::hooks::chain::{self, NodeChain};
use crate::hooks::registry::{FailurePolicy, HookServer, Snapshot};
use crate::hooks::stages::METHODS;

/// Longest a probe's `connect(2)` may take before the server counts as unreachable: 500 ms (a
/// unix socket connects at once or fails at once; only a full listen backlog makes it wait).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The problems `--required-hook-servers` causes with `snapshot`: one line per required server
/// with no registration, naming the calls the proxy refuses for every pod (each pre stage of
/// [`METHODS`], as the hook flow checks the node's requirement at each). Empty when every
/// required server is registered.
pub fn missing_required(chain: &NodeChain, snapshot: &Snapshot) -> Vec<String> {
    let refused: Vec<String> =
        METHODS.iter().filter_map(|m| m.pre.map(|stage| format!("{} ({})", m.name, stage.as_str()))).collect();
    chain
        .required
        .iter()
        .filter(|name| !snapshot.servers().iter().any(|s| s.name == **name))
        .map(|name| {
            format!(
                "required hook server {} (--required-hook-servers) is not registered (no registration file of that name in the hook config directory): every pod's {} calls are refused with FAILED_PRECONDITION, except pods with the skip label",
                chain::shown(name),
                refused.join(", ")
            )
        })
        .collect()
}

/// Whether a failed call to `server` refuses the CRI call: failure policy `Fail`, or the node
/// requires it (`--required-hook-servers`; at its pre stages).
pub fn refuses(server: &HookServer, chain: &NodeChain) -> bool {
    server.failure_policy == FailurePolicy::Fail || chain.required.contains(&server.name)
}

/// Why no connection to the hook server socket at `endpoint` can be made now, or `Ok` when one
/// can (it is closed at once).
///
/// Errors, one line: no socket there, nothing listening (a stale socket), permission denied,
/// not a socket, or no connection within `timeout`.
pub async fn probe(endpoint: &Path, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, tokio::net::UnixStream::connect(endpoint)).await {
        Ok(Ok(_conn)) => Ok(()),
        Ok(Err(e)) => Err(match e.kind() {
            std::io::ErrorKind::NotFound => "no socket there".to_owned(),
            std::io::ErrorKind::ConnectionRefused => "connection refused (nothing listening on the socket)".to_owned(),
            _ => format!("cannot connect: {e}"),
        }),
        Err(_) => Err(format!("no connection within {}", daemon_support::status::show_duration(timeout))),
    }
}

/// Probes every server of `snapshot` at once ([`probe`], within `timeout` each); the servers
/// that cannot be reached, by registration name, with why.
pub async fn unreachable(snapshot: &Snapshot, timeout: Duration) -> HashMap<String, String> {
    let mut probes = tokio::task::JoinSet::new();
    for server in snapshot.servers() {
        let (name, endpoint) = (server.name.clone(), server.endpoint.clone());
        probes.spawn(async move { (name, probe(&endpoint, timeout).await) });
    }
    let mut unreachable = HashMap::new();
    while let Some(done) = probes.join_next().await {
        if let Ok((name, Err(why))) = done {
            unreachable.insert(name, why);
        }
    }
    unreachable
}

/// The line `/status` lists for `server`, unreachable because of `why`, and whether it is a
/// problem (the next call at its stages is refused: [`refuses`]) rather than a warning.
pub fn unreachable_line(server: &HookServer, chain: &NodeChain, why: &str) -> (bool, String) {
    let stages: Vec<&str> = server.stages.iter().map(|s| s.as_str()).collect();
    let what = format!(
        "hook server {} (failure-policy {}) is unreachable at {}: {why}",
        server.name,
        server.failure_policy,
        server.endpoint.display()
    );
    if refuses(server, chain) {
        let by =
            if server.failure_policy == FailurePolicy::Fail { "" } else { " (required by --required-hook-servers)" };
        (true, format!("{what}; the next pod's calls at {} will be refused{by}", stages.join(", ")))
    } else {
        (false, format!("{what}; pods go on without it"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_probe_names_why_a_socket_cannot_be_reached() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hook.sock");
        assert_eq!(probe(&path, PROBE_TIMEOUT).await, Err("no socket there".to_owned()));
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        assert_eq!(probe(&path, PROBE_TIMEOUT).await, Ok(()));
        drop(listener);
        let e = probe(&path, PROBE_TIMEOUT).await.unwrap_err();
        assert!(e.contains("connection refused"), "{e}");
    }
}
