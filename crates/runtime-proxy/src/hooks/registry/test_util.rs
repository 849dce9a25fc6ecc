//! Helpers the registry's tests share.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

/// koordlet's file as `proxyserver.Register()` writes it (Go `json.Marshal` of
/// `RuntimeHookConfig`), with the manifest's double slash and stages in random order.
pub(super) const KOORDLET_JSON: &str = r#"{"remote-endpoint":"/var/run/koordlet//koordlet.sock","failure-policy":"Ignore","runtime-hooks":["PreUpdateContainerResources","PreRunPodSandbox","PreRemoveRunPodSandbox","PreCreateContainer","PreStartContainer","PostStopPodSandbox"]}"#;

pub(super) fn p(json: &str) -> Result<(HookServer, Vec<String>), ConfigError> {
    parse(Path::new("/etc/runtime/hookserver.d/test.json"), json.as_bytes())
}

pub(super) fn ok(json: &str) -> HookServer {
    match p(json) {
        Ok((s, _)) => s,
        Err(e) => panic!("{json}: {e}"),
    }
}

pub(super) fn server_json(endpoint: &str, extra: &str) -> String {
    format!(
        r#"{{"remote-endpoint":"{endpoint}","failure-policy":"Fail","runtime-hooks":["PreCreateContainer"]{extra}}}"#
    )
}

pub(super) fn write(dir: &Path, name: &str, content: &str) {
    fs::write(dir.join(name), content).unwrap();
}

pub(super) fn names(snap: &Snapshot) -> Vec<&str> {
    snap.servers().iter().map(|s| s.name.as_str()).collect()
}

pub(super) fn endpoint_of(snap: &Snapshot, name: &str) -> Option<PathBuf> {
    snap.get(name).map(|s| s.endpoint.clone())
}
