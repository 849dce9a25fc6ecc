//! runtime-hooks' cgroup path resolver (`cgroup_path::resolve` and the functions around it): any
//! cgroup parent or cgroups path, under each driver, gives a directory or an error, never a panic;
//! a directory is absolute and normalized (no `//`, `.`, `..`, trailing `/` or NUL).
//!
//! Input: byte 0 picks the driver (auto, systemd, cgroupfs), the rest is split at the first NUL
//! into a name and a second name (pod directory / container ID).
#![no_main]

use libfuzzer_sys::fuzz_target;
use runtime_hooks::cgroup_path::{self, CgroupDriver};

fn normalized(dir: &str) {
    assert!(dir.starts_with('/'), "{dir:?} is not absolute");
    assert!(!dir.contains('\0'), "{dir:?} has a NUL");
    if dir != "/" {
        assert!(!dir.ends_with('/'), "{dir:?} ends with /");
        for c in dir[1..].split('/') {
            assert!(!c.is_empty() && c != "." && c != "..", "{dir:?} has component {c:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((sel, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let driver = [None, Some(CgroupDriver::Systemd), Some(CgroupDriver::Cgroupfs)][usize::from(sel % 3)];
    let (name, other) = text.split_once('\0').unwrap_or((text, ""));

    if let Ok(Some(dir)) = cgroup_path::resolve(name, driver) {
        normalized(&dir);
        // A resolved directory resolves to itself.
        assert_eq!(cgroup_path::resolve(&dir, driver), Ok(Some(dir.clone())));
        let _ = cgroup_path::default_container_dir(&dir, other, driver);
        if let Ok(c) = cgroup_path::container_dir(other, Some(&dir), driver) {
            assert!(c.starts_with('/'), "{c:?}");
        }
    }
    if let Ok(dirs) = cgroup_path::kube_qos_dirs(name, driver) {
        for (_, d) in dirs {
            normalized(&d);
        }
    }
    if let Ok(p) = cgroup_path::expand_slice(name) {
        assert!(p.starts_with('/') && !p.split('/').any(|c| c == ".."), "{name:?} expands to {p:?}");
    }
    let _ = cgroup_path::expand_systemd_path(name);
    let _ = cgroup_path::infer_driver(name);
    let _ = cgroup_path::container_dir(name, None, driver);
});
