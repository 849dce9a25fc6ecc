//! Cgroup names → directories: the cgroup driver, systemd's slice expansion, and the one function
//! ([`resolve`]) that turns a cgroup parent as kubelet or the runtime gives it into a directory
//! below each controller's root. Pure: no file system, no I/O.
//!
//! # Drivers
//!
//! kubelet and the runtime name cgroups in one of two ways ([`CgroupDriver`]):
//!
//! * **cgroupfs**: a path below each controller's root, `/kubepods/besteffort/pod<uid>`; a
//!   container is `<pod parent>/<container id>`.
//! * **systemd**: units. kubelet passes the pod's slice *expanded* as a path
//!   (`/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`, its
//!   `CgroupName.ToSystemd()`); a bare slice name (`kubepods-besteffort-pod<uid>.slice`) is what
//!   Docker's `HostConfig.CgroupParent` and runc's systemd `cgroupsPath` carry, and what some
//!   clients pass as `cgroup_parent`; containerd gives runc a container's
//!   `cgroupsPath` as `<slice>:<prefix>:<name>` (`kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`),
//!   which systemd places at `<expanded slice>/<prefix>-<name>.scope`.
//!
//! # Expansion (runc's `ExpandSlice`, systemd's `unit_name_to_path` for slices)
//!
//! Each dash-separated prefix of a slice name is a parent slice:
//!
//! ```text
//! kubepods-besteffort-pod1234.slice
//!   → /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice
//! -.slice → /   (the root slice)
//! ```
//!
//! Invalid, as in runc: a name not ending in `.slice` or only `.slice`, one with a `/`, an empty
//! dash-separated part (`a--b.slice`, `-a.slice`, `a-.slice`). Every expanded component ends in
//! `.slice`, so an expansion never contains `..`.
//!
//! # Forms of a cgroup parent ([`resolve`])
//!
//! | form | example | directory |
//! |---|---|---|
//! | empty | `""` | none: the runtime's default (CRI allows it); nothing to write at pod level |
//! | absolute path | `/kubepods/besteffort/pod1`, `/kubepods.slice/…/…pod1.slice` | itself (any driver), normalized |
//! | slice name | `kubepods-besteffort-pod1.slice` | its expansion (driver systemd or auto) |
//! | systemd cgroups path | `kubepods-besteffort-pod1.slice:cri-containerd:abc` | `<expansion>/cri-containerd-abc.scope` (systemd or auto) |
//! | anything else relative | `kubepods/pod1` | refused |
//!
//! The root (`/`, `-.slice`) is treated like empty: not a pod's own directory, never written at
//! pod level. A `..` component is refused. Under an explicit cgroupfs driver the two systemd forms
//! are refused (runc with cgroupfs would put such a cgroup relative to its own, not there).
//!
//! # Auto
//!
//! With no driver given ([`resolve`]'s `None`), each name's form decides ([`infer_driver`]): a
//! systemd cgroups path or a last component ending in `.slice` is systemd, any other absolute path
//! cgroupfs. When the form cannot tell (an empty parent, the root), there is nothing to decide:
//! no pod-level directory. Where a driver matters for a name of no telling form — a container
//! whose runtime reported no cgroups path — auto follows the pod parent's form, as containerd does
//! (`getCgroupsPath`: a parent whose last component ends in `.slice` gets a systemd scope), and
//! falls back to cgroupfs. Before it falls back on the form, the binary asks the runtime
//! ([`crate::cgroup_driver`]: CRI `RuntimeConfig`), and uses its answer as if given.

use std::fmt;

use crate::context::KubeQos;

/// Suffix of systemd slice units.
pub const SLICE: &str = ".slice";
/// containerd's scope prefix for containers under the systemd driver (`cri-containerd-<id>.scope`).
pub const CONTAINERD_SCOPE_PREFIX: &str = "cri-containerd";

/// How cgroups are named on the node (kubelet's and the runtime's `--cgroup-driver`, CRI
/// `RuntimeConfig`'s `linux.cgroup_driver`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum CgroupDriver {
    /// systemd units: slices (`kubepods-besteffort-pod<uid>.slice`) and scopes.
    Systemd,
    /// Plain paths below each controller's root (`/kubepods/besteffort/pod<uid>`).
    Cgroupfs,
}

impl CgroupDriver {
    /// `"systemd"` or `"cgroupfs"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            CgroupDriver::Systemd => "systemd",
            CgroupDriver::Cgroupfs => "cgroupfs",
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a cgroup name names no directory.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// Not a valid systemd slice name (runc's `ExpandSlice` rules).
    #[error("invalid systemd slice name {0:?}: {1}")]
    BadSlice(String, &'static str),
    /// Not `<slice>:<prefix>:<name>` (runc's systemd `cgroupsPath`).
    #[error("invalid systemd cgroups path {0:?}: {1}")]
    BadSystemdPath(String, &'static str),
    /// A `..` component.
    #[error("{0:?} has a \"..\" component")]
    DotDot(String),
    /// Relative, and not a systemd name this driver accepts.
    #[error("{0:?} is relative and {1}")]
    Relative(String, &'static str),
    /// A QoS cgroup root that is empty or the root itself.
    #[error("{0:?} is not a cgroup below the root")]
    NotBelowRoot(String),
}

/// Expands a systemd slice name into its cgroup path: `a-b-c.slice` →
/// `/a.slice/a-b.slice/a-b-c.slice`; `-.slice` → `/` (runc's `ExpandSlice`).
///
/// Errors: [`PathError::BadSlice`] for a name not ending in `.slice` (or only `.slice`), with a
/// `/`, or with an empty dash-separated part (`a--b.slice`, `-a.slice`, `a-.slice`).
pub fn expand_slice(name: &str) -> Result<String, PathError> {
    let bad = |why| Err(PathError::BadSlice(name.to_owned(), why));
    let Some(stem) = name.strip_suffix(SLICE) else {
        return bad("does not end in .slice");
    };
    if name.contains('/') {
        return bad("contains a /");
    }
    if name.contains('\0') {
        return bad("contains a NUL");
    }
    if stem == "-" {
        return Ok("/".to_owned());
    }
    let mut path = String::with_capacity(name.len() * 2);
    let mut prefix = String::with_capacity(stem.len());
    for part in stem.split('-') {
        if part.is_empty() {
            return bad(if stem.is_empty() {
                "is only .slice"
            } else {
                "has an empty dash-separated part (--, or a leading or trailing -)"
            });
        }
        path.push('/');
        path.push_str(&prefix);
        path.push_str(part);
        path.push_str(SLICE);
        prefix.push_str(part);
        prefix.push('-');
    }
    Ok(path)
}

/// A systemd `cgroupsPath` (`<slice>:<prefix>:<name>`, as containerd gives runc under the systemd
/// driver) split into its slice and its unit: `<prefix>-<name>.scope`, or `<name>` when it is a
/// slice itself (runc's rule). An empty slice is runc's default, `system.slice`.
///
/// Errors: [`PathError::BadSystemdPath`] for anything but three `:`-separated parts, an empty
/// name, an empty prefix for a scope, or a unit with a `/`.
pub fn split_systemd_path(path: &str) -> Result<(&str, String), PathError> {
    let bad = |why| Err(PathError::BadSystemdPath(path.to_owned(), why));
    let mut parts = path.split(':');
    let (Some(slice), Some(prefix), Some(name), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return bad("expected <slice>:<prefix>:<name>");
    };
    if name.is_empty() {
        return bad("empty name");
    }
    if prefix.contains('/') || name.contains('/') || name.contains('\0') || prefix.contains('\0') {
        return bad("a unit name cannot contain / or NUL");
    }
    let unit = if name.ends_with(SLICE) {
        name.to_owned()
    } else if prefix.is_empty() {
        return bad("empty prefix");
    } else {
        format!("{prefix}-{name}.scope")
    };
    Ok((if slice.is_empty() { "system.slice" } else { slice }, unit))
}

/// The directory of a systemd `cgroupsPath`: `kubepods-besteffort-pod1.slice:cri-containerd:abc`
/// → `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-abc.scope`.
///
/// Errors: see [`split_systemd_path`] and [`expand_slice`].
pub fn expand_systemd_path(path: &str) -> Result<String, PathError> {
    let (slice, unit) = split_systemd_path(path)?;
    let dir = expand_slice(slice)?;
    Ok(join(&dir, &unit))
}

/// True for `<slice>:<prefix>:<name>`: relative, with a `:` (no cgroupfs name kubelet or
/// containerd makes has one).
pub fn is_systemd_path(name: &str) -> bool {
    !name.starts_with('/') && name.contains(':')
}

/// The driver a name's form implies: systemd for a systemd cgroups path or a last component
/// ending in `.slice`; cgroupfs for any other absolute path; `None` when the form cannot tell
/// (empty, the root, other relative names).
pub fn infer_driver(name: &str) -> Option<CgroupDriver> {
    if is_systemd_path(name) {
        return Some(CgroupDriver::Systemd);
    }
    let last = name.rsplit('/').find(|c| !c.is_empty() && *c != ".").unwrap_or("");
    if last.ends_with(SLICE) {
        Some(CgroupDriver::Systemd)
    } else if name.starts_with('/') && !last.is_empty() {
        Some(CgroupDriver::Cgroupfs)
    } else {
        None
    }
}

/// Turns a cgroup parent as kubelet or the runtime gives it into the directory below each
/// controller's root (`/kubepods.slice/…`), normalized (no `//`, no `.`, no trailing `/`). See the
/// module documentation for the forms. `driver`: the node's driver, `None` for auto (the name's
/// form decides).
///
/// Returns `Ok(None)` for an empty name (the runtime's default) and for the root (`/`,
/// `-.slice`): no directory of its own.
///
/// Errors: a `..` component, an invalid systemd name, a systemd name under the cgroupfs driver,
/// any other relative name.
pub fn resolve(name: &str, driver: Option<CgroupDriver>) -> Result<Option<String>, PathError> {
    if name.is_empty() {
        return Ok(None);
    }
    let expanded = if name.starts_with('/') {
        name.to_owned()
    } else if driver == Some(CgroupDriver::Cgroupfs) {
        let why = if infer_driver(name) == Some(CgroupDriver::Systemd) {
            "a systemd name, but the cgroup driver is cgroupfs (--cgroup-driver systemd or auto accepts it)"
        } else {
            "not a cgroup path (cgroupfs names are absolute)"
        };
        return Err(PathError::Relative(name.to_owned(), why));
    } else if is_systemd_path(name) {
        expand_systemd_path(name)?
    } else if name.ends_with(SLICE) {
        expand_slice(name)?
    } else {
        return Err(PathError::Relative(name.to_owned(), "neither an absolute path nor a systemd slice name"));
    };
    let mut out = String::with_capacity(expanded.len());
    for c in expanded.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(PathError::DotDot(name.to_owned()));
        }
        if c.contains('\0') {
            return Err(PathError::Relative(name.to_owned(), "contains a NUL"));
        }
        out.push('/');
        out.push_str(c);
    }
    Ok(if out.is_empty() { None } else { Some(out) })
}

/// A container's cgroup directory from the `linux.cgroupsPath` the runtime reports, given its
/// pod's resolved directory (`pod_dir`, from [`resolve`]).
///
/// A systemd cgroups path whose slice is the last component of `pod_dir` is placed in the pod's
/// directory (`<pod dir>/cri-containerd-<id>.scope`): the same as the slice's expansion on a
/// systemd node, and right where kubelet's parent says when that parent is a slice path below
/// some other root. Anything else goes through [`resolve`].
///
/// Errors: see [`resolve`]; an empty path or the root is [`PathError::NotBelowRoot`].
pub fn container_dir(
    cgroups_path: &str,
    pod_dir: Option<&str>,
    driver: Option<CgroupDriver>,
) -> Result<String, PathError> {
    if is_systemd_path(cgroups_path) && driver != Some(CgroupDriver::Cgroupfs) {
        let (slice, unit) = split_systemd_path(cgroups_path)?;
        if let Some(pod) = pod_dir.filter(|p| p.rsplit('/').next() == Some(slice)) {
            return Ok(join(pod, &unit));
        }
    }
    resolve(cgroups_path, driver)?.ok_or_else(|| PathError::NotBelowRoot(cgroups_path.to_owned()))
}

/// A container's cgroup directory when the runtime reports none: `<pod dir>/<id>` (cgroupfs) or
/// `<pod dir>/cri-containerd-<id>.scope` (systemd; containerd's unit name). Under auto the pod
/// directory's form decides (containerd's `getCgroupsPath`: a last component ending in `.slice`
/// is systemd).
pub fn default_container_dir(pod_dir: &str, id: &str, driver: Option<CgroupDriver>) -> String {
    match driver.or_else(|| infer_driver(pod_dir)) {
        Some(CgroupDriver::Systemd) => join(pod_dir, &format!("{CONTAINERD_SCOPE_PREFIX}-{id}.scope")),
        _ => join(pod_dir, id),
    }
}

/// kubelet's QoS directories below its pods' root `kubepods` (`--kubepods-cgroup`), in the order
/// Guaranteed (the root itself), Burstable, BestEffort:
///
/// * cgroupfs: `/kubepods`, `/kubepods/burstable`, `/kubepods/besteffort`;
/// * systemd (the resolved root's last component ends in `.slice`): `/kubepods.slice`,
///   `/kubepods.slice/kubepods-burstable.slice`, `/kubepods.slice/kubepods-besteffort.slice`
///   (kubelet's `CgroupName{…, "burstable"}.ToSystemd()`).
///
/// `kubepods` may be any form [`resolve`] accepts (`kubepods.slice` under systemd or auto).
///
/// Errors: what [`resolve`] refuses (a relative name other than a slice under systemd/auto), and
/// an empty value or the root ([`PathError::NotBelowRoot`]).
pub fn kube_qos_dirs(kubepods: &str, driver: Option<CgroupDriver>) -> Result<[(KubeQos, String); 3], PathError> {
    let root = resolve(kubepods, driver)?.ok_or_else(|| PathError::NotBelowRoot(kubepods.to_owned()))?;
    let last = root.rsplit('/').next().unwrap_or_default();
    let (burstable, besteffort) = match last.strip_suffix(SLICE) {
        Some(stem) => (format!("{stem}-burstable{SLICE}"), format!("{stem}-besteffort{SLICE}")),
        None => ("burstable".to_owned(), "besteffort".to_owned()),
    };
    Ok([
        (KubeQos::Guaranteed, root.clone()),
        (KubeQos::Burstable, join(&root, &burstable)),
        (KubeQos::BestEffort, join(&root, &besteffort)),
    ])
}

fn join(dir: &str, child: &str) -> String {
    format!("{}/{child}", dir.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use CgroupDriver::{Cgroupfs, Systemd};

    #[test]
    fn expands_kubelet_slices() {
        assert_eq!(
            expand_slice("kubepods-besteffort-pod1234.slice").unwrap(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234.slice"
        );
        assert_eq!(expand_slice("kubepods.slice").unwrap(), "/kubepods.slice");
        assert_eq!(expand_slice("-.slice").unwrap(), "/");
        assert_eq!(expand_slice("a_b-c.d.slice").unwrap(), "/a_b.slice/a_b-c.d.slice");
        for bad in [
            "",
            ".slice",
            "a",
            "a.scope",
            "a--b.slice",
            "-a.slice",
            "a-.slice",
            "--.slice",
            "a/b.slice",
            "/a.slice",
            "a.slice.x",
        ] {
            assert!(matches!(expand_slice(bad), Err(PathError::BadSlice(..))), "{bad:?}");
        }
    }

    #[test]
    fn systemd_cgroups_paths() {
        let id = "0123abcd";
        assert_eq!(
            expand_systemd_path(&format!("kubepods-besteffort-pod1.slice:cri-containerd:{id}")).unwrap(),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-{id}.scope"
            )
        );
        assert_eq!(expand_systemd_path("a.slice:x:b.slice").unwrap(), "/a.slice/b.slice", "a slice name is used as is");
        assert_eq!(expand_systemd_path(":docker:1").unwrap(), "/system.slice/docker-1.scope", "runc's default slice");
        for bad in
            ["a.slice:b", "a.slice:b:c:d", "a.slice:b:", "a.slice::c", "a--b.slice:p:c", "a.slice:p:c/d", "x:p:c"]
        {
            assert!(expand_systemd_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resolve_every_form() {
        let pod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        for driver in [None, Some(Systemd), Some(Cgroupfs)] {
            assert_eq!(resolve("", driver).unwrap(), None, "empty: the runtime's default");
            assert_eq!(resolve("/", driver).unwrap(), None, "root: not a pod's own");
            assert_eq!(
                resolve("/kubepods/besteffort/pod1", driver).unwrap().as_deref(),
                Some("/kubepods/besteffort/pod1")
            );
            assert_eq!(resolve("//kubepods/./pod1/", driver).unwrap().as_deref(), Some("/kubepods/pod1"), "normalized");
            assert_eq!(resolve(pod, driver).unwrap().as_deref(), Some(pod), "kubelet's expanded systemd parent");
            assert!(matches!(resolve("/kubepods/../etc", driver), Err(PathError::DotDot(_))));
            assert!(matches!(resolve("kubepods/pod1", driver), Err(PathError::Relative(..))));
        }
        for driver in [None, Some(Systemd)] {
            assert_eq!(resolve("kubepods-besteffort-pod1.slice", driver).unwrap().as_deref(), Some(pod));
            assert_eq!(
                resolve("kubepods-besteffort-pod1.slice:cri-containerd:c1", driver).unwrap(),
                Some(format!("{pod}/cri-containerd-c1.scope"))
            );
            assert_eq!(resolve("-.slice", driver).unwrap(), None);
            assert!(matches!(resolve("kubepods--pod1.slice", driver), Err(PathError::BadSlice(..))));
        }
        let e = resolve("kubepods-besteffort-pod1.slice", Some(Cgroupfs)).unwrap_err();
        assert!(e.to_string().contains("cgroup driver is cgroupfs"), "{e}");
        assert!(resolve("a.slice:p:c", Some(Cgroupfs)).is_err());
    }

    #[test]
    fn driver_inference_from_the_form() {
        assert_eq!(infer_driver("kubepods-besteffort-pod1.slice"), Some(Systemd));
        assert_eq!(infer_driver("/kubepods.slice/kubepods-pod1.slice"), Some(Systemd));
        assert_eq!(infer_driver("/kubepods.slice/kubepods-pod1.slice/"), Some(Systemd));
        assert_eq!(infer_driver("kubepods-pod1.slice:cri-containerd:abc"), Some(Systemd));
        assert_eq!(infer_driver("/kubepods/besteffort/pod1"), Some(Cgroupfs));
        assert_eq!(infer_driver("/kubepods.slice/x"), Some(Cgroupfs), "the last component decides, as in containerd");
        for unknown in ["", "/", "kubepods", "kubepods/pod1"] {
            assert_eq!(infer_driver(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn container_dirs() {
        let slice_pod = "/rp-test/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
        let systemd = "kubepods-besteffort-pod1.slice:cri-containerd:c1";
        // The slice is the pod's directory: the scope goes in it, whatever root it is below.
        assert_eq!(
            container_dir(systemd, Some(slice_pod), None).unwrap(),
            format!("{slice_pod}/cri-containerd-c1.scope")
        );
        assert_eq!(
            container_dir(systemd, Some(slice_pod), Some(Systemd)).unwrap(),
            format!("{slice_pod}/cri-containerd-c1.scope")
        );
        // Otherwise the expansion.
        assert_eq!(
            container_dir(systemd, Some("/other"), None).unwrap(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-c1.scope"
        );
        assert_eq!(container_dir("/kubepods/pod1/c1", Some("/kubepods/pod1"), None).unwrap(), "/kubepods/pod1/c1");
        assert!(
            container_dir(systemd, Some(slice_pod), Some(Cgroupfs)).is_err(),
            "runc with cgroupfs puts it elsewhere"
        );
        assert!(matches!(container_dir("", None, None), Err(PathError::NotBelowRoot(_))));
        // No cgroups path reported.
        assert_eq!(default_container_dir("/kubepods/pod1", "c1", None), "/kubepods/pod1/c1");
        assert_eq!(default_container_dir(slice_pod, "c1", None), format!("{slice_pod}/cri-containerd-c1.scope"));
        assert_eq!(
            default_container_dir("/kubepods/pod1", "c1", Some(Systemd)),
            "/kubepods/pod1/cri-containerd-c1.scope"
        );
        assert_eq!(default_container_dir(slice_pod, "c1", Some(Cgroupfs)), format!("{slice_pod}/c1"));
    }

    #[test]
    fn qos_dirs_per_layout() {
        let dirs = |k: &str, d| kube_qos_dirs(k, d).map(|a| a.map(|(_, d)| d));
        assert_eq!(dirs("/kubepods", None).unwrap(), ["/kubepods", "/kubepods/burstable", "/kubepods/besteffort"]);
        let systemd = [
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "/kubepods.slice/kubepods-besteffort.slice",
        ];
        assert_eq!(dirs("kubepods.slice", Some(Systemd)).unwrap(), systemd);
        assert_eq!(dirs("kubepods.slice", None).unwrap(), systemd, "auto: the form says systemd");
        assert_eq!(dirs("/kubepods.slice", Some(Cgroupfs)).unwrap(), systemd, "absolute: fine under any driver");
        assert_eq!(
            dirs("custom-kubepods.slice", None).unwrap()[2],
            "/custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice",
            "kubelet's ToSystemd of [custom kubepods besteffort]"
        );
        assert!(dirs("kubepods.slice", Some(Cgroupfs)).is_err(), "relative under cgroupfs");
        assert!(dirs("kubepods", None).is_err() && dirs("kubepods", Some(Systemd)).is_err());
        for root in ["", "/", "-.slice"] {
            assert!(matches!(kube_qos_dirs(root, None), Err(PathError::NotBelowRoot(_))), "{root:?}");
        }
    }

    /// Valid slice names: 1..6 dash-separated parts of systemd unit characters.
    fn slice_parts() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec("[a-zA-Z0-9_.:\\\\]{1,10}", 1..6)
            .prop_filter("':' makes a cgroups path, not a slice name", |p| p.iter().all(|s| !s.contains(':')))
    }

    proptest! {
        #[test]
        fn expansion_of_valid_names(parts in slice_parts()) {
            let name = format!("{}{SLICE}", parts.join("-"));
            let path = expand_slice(&name).unwrap();
            let comps: Vec<&str> = path.split('/').skip(1).collect();
            prop_assert_eq!(comps.len(), parts.len());
            prop_assert_eq!(*comps.last().unwrap(), name.as_str(), "ends with the leaf");
            for w in comps.windows(2) {
                let stem = w[0].strip_suffix(SLICE).unwrap();
                prop_assert!(w[1].starts_with(&format!("{stem}-")), "{} is a prefix of {}", w[0], w[1]);
            }
            prop_assert!(comps.iter().all(|c| *c != ".." && *c != "." && !c.is_empty()));
            // Round trip: the leaf names the path; resolving it again changes nothing.
            prop_assert_eq!(resolve(&name, None).unwrap(), Some(path.clone()));
            prop_assert_eq!(resolve(&path, Some(Systemd)).unwrap(), Some(path.clone()));
            prop_assert_eq!(infer_driver(&path), Some(Systemd));
            let scope = format!("{name}:cri-containerd:abc");
            let expected_scope = format!("{path}/cri-containerd-abc.scope");
            prop_assert_eq!(expand_systemd_path(&scope).unwrap(), expected_scope.clone());
            prop_assert_eq!(container_dir(&scope, Some(&path), None).unwrap(), expected_scope);
        }

        #[test]
        fn invalid_names_are_errors(parts in slice_parts(), at in 0usize..6, how in 0u8..3) {
            // An empty part: "--" inside, or a leading or trailing dash.
            let mut parts = parts;
            match how {
                0 => parts.insert(at.min(parts.len()), String::new()),
                1 => parts.insert(0, String::new()),
                _ => parts.push(String::new()),
            }
            let name = format!("{}{SLICE}", parts.join("-"));
            prop_assume!(name != "-.slice");
            prop_assert!(matches!(expand_slice(&name), Err(PathError::BadSlice(..))), "{:?}", name);
            prop_assert!(resolve(&name, None).is_err());
        }

        /// Whatever the input: no panic; a directory is absolute, normalized, without "..".
        #[test]
        fn never_panics_and_never_escapes(name in "\\PC{0,40}|[a-z./:-]{0,24}", driver in prop_oneof![Just(None), Just(Some(Systemd)), Just(Some(Cgroupfs))]) {
            let _ = expand_slice(&name);
            let _ = expand_systemd_path(&name);
            let _ = infer_driver(&name);
            let _ = default_container_dir("/p", &name, driver);
            let _ = kube_qos_dirs(&name, driver);
            let _ = container_dir(&name, Some("/kubepods.slice"), driver);
            if let Ok(Some(dir)) = resolve(&name, driver) {
                prop_assert!(dir.starts_with('/') && !dir.ends_with('/') && !dir.contains("//"), "{:?} → {:?}", name, dir);
                prop_assert!(dir.split('/').all(|c| c != ".." && c != "."), "{:?} → {:?}", name, dir);
                prop_assert_eq!(resolve(&dir, driver).unwrap(), Some(dir.clone()), "a directory resolves to itself");
            }
        }
    }
}
