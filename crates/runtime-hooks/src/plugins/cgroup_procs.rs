//! The processes and threads of a cgroup directory, for the node-level plugins that act on
//! tasks (CoreSched: cookies per process; Resctrl: threads into a group's `tasks`).
//!
//! Directories are named as [`crate::plugin::PodState::cgroup_dir`] names them (resolved,
//! relative to the cgroup root). The hierarchy is v2 when the root has `cgroup.controllers`,
//! else v1, whose `cpu` controller is read (every v1 controller lists the same tasks).

use std::io;
use std::path::{Path, PathBuf};

/// The directory of the cgroup `dir` under `root` (v2: `root/dir`; v1: `root/cpu/dir`).
pub fn dir_path(root: &Path, dir: &str) -> PathBuf {
    let rel = dir.trim_start_matches('/');
    if root.join("cgroup.controllers").exists() {
        root.join(rel)
    } else {
        root.join("cpu").join(rel)
    }
}

fn read_ids(path: &Path) -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    text.split_whitespace()
        .map(|t| {
            t.parse().map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}: {t:?} is not an id", path.display()))
            })
        })
        .collect()
}

/// The processes (thread group ids) of the cgroup `dir`: its `cgroup.procs` (koordlet's
/// `ReadCPUProcs`).
///
/// Errors: the file cannot be read (`NotFound`: the cgroup is gone) or holds a non-number.
pub fn procs(root: &Path, dir: &str) -> io::Result<Vec<u32>> {
    read_ids(&dir_path(root, dir).join("cgroup.procs"))
}

/// The threads of the cgroup `dir`: v2 `cgroup.threads`, v1 `tasks` (koordlet's container
/// task ids).
///
/// Errors: as [`procs`].
pub fn threads(root: &Path, dir: &str) -> io::Result<Vec<u32>> {
    let d = dir_path(root, dir);
    let file = if d.join("cgroup.threads").exists() { "cgroup.threads" } else { "tasks" };
    read_ids(&d.join(file))
}

/// The sub-directories of the pod cgroup `pod_dir` that are not one of `containers` (their
/// last path components): the sandbox (pause) container's, as names like `pod_dir`'s.
pub fn other_children(root: &Path, pod_dir: &str, containers: &[&str]) -> Vec<String> {
    let known: Vec<&str> = containers.iter().filter_map(|c| c.trim_end_matches('/').rsplit('/').next()).collect();
    let Ok(entries) = std::fs::read_dir(dir_path(root, pod_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !known.contains(&n.as_str()))
        .map(|n| format!("{}/{n}", pod_dir.trim_end_matches('/')))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_layouts() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("cpu/kubepods/pod1/c1")).unwrap();
        std::fs::create_dir_all(t.path().join("cpu/kubepods/pod1/sandbox")).unwrap();
        std::fs::write(t.path().join("cpu/kubepods/pod1/c1/cgroup.procs"), "5\n6\n").unwrap();
        std::fs::write(t.path().join("cpu/kubepods/pod1/c1/tasks"), "5\n6\n7\n").unwrap();
        assert_eq!(procs(t.path(), "/kubepods/pod1/c1").unwrap(), [5, 6]);
        assert_eq!(threads(t.path(), "/kubepods/pod1/c1").unwrap(), [5, 6, 7]);
        assert_eq!(other_children(t.path(), "/kubepods/pod1", &["/kubepods/pod1/c1"]), ["/kubepods/pod1/sandbox"]);
        assert_eq!(procs(t.path(), "/kubepods/gone").unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::write(t.path().join("cgroup.controllers"), "cpu\n").unwrap();
        std::fs::create_dir_all(t.path().join("kubepods/pod1/c1")).unwrap();
        std::fs::write(t.path().join("kubepods/pod1/c1/cgroup.threads"), "8\n9\n").unwrap();
        assert_eq!(threads(t.path(), "/kubepods/pod1/c1").unwrap(), [8, 9]);
    }
}
