//! kubelet's systemd cgroup driver, for tests in the cgroup v2 guest of `scripts/v2vm.sh` (systemd
//! as PID 1, containerd with `SystemdCgroup = true`): the pod slices made the way kubelet makes
//! them, and where their cgroups are.
//!
//! kubelet (cgroup driver `systemd`) asks systemd over D-Bus (`StartTransientUnit`) for
//! `kubepods.slice`, one slice per QoS class below it (`kubepods-burstable.slice`,
//! `kubepods-besteffort.slice`; Guaranteed pods go directly below `kubepods.slice`) and one slice
//! per pod, `kubepods-<qos>-pod<uid>.slice` with the UID's `-` written `_`. Each is a transient
//! unit that `Wants=` its parent, has default dependencies off, CPU, memory, IO and task
//! accounting on and the CPU weight of its CPU shares. The pod slice's name is the pod's CRI
//! `cgroup_parent`; containerd's runc then puts the sandbox and each container in a scope below
//! it, `cri-containerd-<id>.scope`. Here the same calls go through `busctl` and `systemctl`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;

use crate::containerd::{sandbox_config, Containerd};

/// Where the cgroup v2 hierarchy is mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The slice every pod goes below.
pub const KUBEPODS: &str = "kubepods.slice";

/// A pod's QoS class, which decides the slice its own slice goes below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    /// Requests equal limits for every container: directly below `kubepods.slice`.
    Guaranteed,
    /// Some request or limit: below `kubepods-burstable.slice`.
    Burstable,
    /// No requests nor limits: below `kubepods-besteffort.slice`.
    BestEffort,
}

impl Qos {
    /// The slice this class's pod slices go below: `kubepods.slice`,
    /// `kubepods-burstable.slice` or `kubepods-besteffort.slice`.
    pub fn parent_slice(self) -> &'static str {
        match self {
            Qos::Guaranteed => KUBEPODS,
            Qos::Burstable => "kubepods-burstable.slice",
            Qos::BestEffort => "kubepods-besteffort.slice",
        }
    }

    /// The slice kubelet names for the pod with UID `uid`: `kubepods-besteffort-pod<uid>.slice`
    /// (`kubepods-pod<uid>.slice` for Guaranteed), each `-` of the UID written `_` (a `-` in a
    /// slice name means "below").
    pub fn pod_slice(self, uid: &str) -> String {
        let uid = uid.replace('-', "_");
        format!("{}-pod{uid}.slice", self.parent_slice().trim_end_matches(".slice"))
    }
}

/// What a slice is given besides kubelet's fixed properties.
#[derive(Clone, Debug, Default)]
pub struct SliceResources {
    /// CPU shares (cgroup v1 units), set as `CPUWeight` ([`cpu_weight`]); kubelet gives a
    /// BestEffort pod and the BestEffort slice 2, the minimum.
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds of CPU time per second (`CPUQuotaPerSecUSec`).
    pub cpu_quota_per_sec_usec: Option<u64>,
    /// Memory limit in bytes (`MemoryMax`).
    pub memory_max: Option<u64>,
}

/// kubelet's CPU weight for `shares` on cgroup v2: the linear map of [2, 262144] onto [1, 10000],
/// `1 + (shares - 2) * 9999 / 262142` (2 → 1, 1024 → 39, 2048 → 79). runc 1.3 maps a container's
/// shares differently (512 → 59); containerd hands it those, not the weight.
pub fn cpu_weight(shares: u64) -> u64 {
    let shares = shares.clamp(2, 262_144);
    1 + (shares - 2) * 9999 / 262_142
}

/// The guest's containerd (`Containerd::from_env`), for the `v2_*` tests; panics (test code)
/// outside the guest — `RP_V2_GUEST` unset — saying where they run, and when the guest's
/// containerd is not on the systemd driver.
pub fn guest() -> Containerd {
    assert!(
        std::env::var_os("RP_V2_GUEST").is_some(),
        "RP_V2_GUEST is not set: the v2_* tests run inside the cgroup v2 guest, not on this machine: `scripts/v2vm.sh test <target>`"
    );
    let env = Containerd::from_env();
    assert!(env.systemd_driver(), "the guest's env file says CGROUP_DRIVER={:?}, not systemd", env.cgroup_driver);
    env
}

/// Runs `program args…`, returns its trimmed stdout; panics (test code) with its stderr when it
/// fails.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `systemctl show -p PROPERTY --value UNIT`: one property of a unit (e.g. `CPUWeight`,
/// `MemoryMax`, `ActiveState`, `ControlGroup`), as systemd reports it.
pub fn show(unit: &str, property: &str) -> String {
    run("systemctl", &["show", "-p", property, "--value", unit])
}

/// Whether `unit` is active now.
pub fn is_active(unit: &str) -> bool {
    show(unit, "ActiveState") == "active"
}

/// `systemctl daemon-reload`: systemd reloads its units and writes every unit's own properties to
/// its cgroup again (values written to those cgroup files behind systemd's back are reverted).
pub fn daemon_reload() {
    run("systemctl", &["daemon-reload"]);
}

/// Starts the transient slice `name` below `parent` as kubelet does (D-Bus `StartTransientUnit`
/// through `busctl`): `Description=libcontainer container <name>`, `Wants=<parent>`,
/// `DefaultDependencies=no`, CPU, memory, IO and task accounting on, and `resources`; waits (up to
/// 10 s) until it is active, then enables every controller in the `cgroup.subtree_control` of each
/// cgroup above it ([`enable_controllers_above`]).
///
/// Panics (test code) when systemd refuses it (e.g. it exists already) or it does not come up.
pub fn start_slice(name: &str, parent: &str, resources: &SliceResources) {
    // (name, D-Bus signature, value as busctl's arguments: an array is its length, then its items)
    let mut props: Vec<(&str, &str, Vec<String>)> = vec![
        ("Description", "s", vec![format!("libcontainer container {name}")]),
        ("Wants", "as", vec!["1".into(), parent.into()]),
        ("DefaultDependencies", "b", vec!["false".into()]),
        ("MemoryAccounting", "b", vec!["true".into()]),
        ("CPUAccounting", "b", vec!["true".into()]),
        ("IOAccounting", "b", vec!["true".into()]),
        ("TasksAccounting", "b", vec!["true".into()]),
    ];
    if let Some(shares) = resources.cpu_shares {
        props.push(("CPUWeight", "t", vec![cpu_weight(shares).to_string()]));
    }
    if let Some(quota) = resources.cpu_quota_per_sec_usec {
        props.push(("CPUQuotaPerSecUSec", "t", vec![quota.to_string()]));
    }
    if let Some(max) = resources.memory_max {
        props.push(("MemoryMax", "t", vec![max.to_string()]));
    }
    let count = props.len().to_string();
    let mut args = vec![
        "--", // a value such as "-.slice" is no option
        "call",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "StartTransientUnit",
        "ssa(sv)a(sa(sv))",
        name,
        "replace",
        &count,
    ];
    for (key, signature, value) in &props {
        args.extend([*key, *signature]);
        args.extend(value.iter().map(String::as_str));
    }
    args.push("0"); // no auxiliary units
    run("busctl", &args);
    let start = Instant::now();
    while !is_active(name) {
        assert!(start.elapsed() < Duration::from_secs(10), "{name} not active 10 s after StartTransientUnit");
        std::thread::sleep(Duration::from_millis(20));
    }
    enable_controllers_above(&slice_dir(name));
}

/// Writes every controller the root cgroup offers (`cgroup.controllers`: cpuset, cpu, io, memory,
/// pids, …) to the `cgroup.subtree_control` of each cgroup from the root down to `dir`'s parent,
/// as kubelet's (and runc's) libcontainer does after systemd made a unit (`fs2.CreateCgroupPath`):
/// `dir` then has every controller's files. A controller the kernel refuses at some level is
/// skipped, as libcontainer skips it.
pub fn enable_controllers_above(dir: &std::path::Path) {
    let root = std::path::Path::new(CGROUP_ROOT);
    let controllers = cgroup_file(root, "cgroup.controllers");
    let all: String = controllers.split_whitespace().map(|c| format!("+{c} ")).collect();
    let below = dir.strip_prefix(root).unwrap_or_else(|_| panic!("{} is not below {CGROUP_ROOT}", dir.display()));
    let mut levels = vec![root.to_path_buf()];
    for part in below.parent().map(|p| p.components()).into_iter().flatten() {
        let next = levels[levels.len() - 1].join(part);
        levels.push(next);
    }
    for level in levels {
        let control = level.join("cgroup.subtree_control");
        if std::fs::write(&control, all.trim_end()).is_err() {
            for c in controllers.split_whitespace() {
                let _ = std::fs::write(&control, format!("+{c}"));
            }
        }
    }
}

/// kubelet's node-level slices, started unless they are active already: `kubepods.slice` (the CPU
/// shares of all the node's CPUs, 1024 each, as kubelet gives it the node's allocatable CPU),
/// `kubepods-burstable.slice` and `kubepods-besteffort.slice` (2 shares each, kubelet's value with
/// no pods).
pub fn ensure_kubepods() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    for (slice, parent, shares) in [
        (KUBEPODS, "-.slice", cpus * 1024),
        (Qos::Burstable.parent_slice(), KUBEPODS, 2),
        (Qos::BestEffort.parent_slice(), KUBEPODS, 2),
    ] {
        if !is_active(slice) {
            start_slice(slice, parent, &SliceResources { cpu_shares: Some(shares), ..Default::default() });
        }
    }
}

/// Makes the slices for the pod with UID `uid` and class `qos` as kubelet does
/// ([`ensure_kubepods`], then the pod's own slice with `resources`) and returns the pod slice's
/// name, the pod's CRI `cgroup_parent` (`kubepods-besteffort-pod<uid>.slice`).
pub fn make_pod_slice(uid: &str, qos: Qos, resources: &SliceResources) -> String {
    ensure_kubepods();
    let slice = qos.pod_slice(uid);
    start_slice(&slice, qos.parent_slice(), resources);
    slice
}

/// Stops `slice` (`systemctl stop`, which waits: what still runs below it is stopped with it),
/// as kubelet does when a pod is gone; systemd then forgets the transient unit.
pub fn stop_slice(slice: &str) {
    run("systemctl", &["stop", slice]);
}

/// The cgroup v2 directory of `slice`: systemd nests a slice in the slices its name's
/// `-`-separated prefixes name, so `kubepods-besteffort-pod<uid>.slice` is
/// `/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`.
pub fn slice_dir(slice: &str) -> PathBuf {
    let mut dir = PathBuf::from(CGROUP_ROOT);
    let stem = slice.strip_suffix(".slice").unwrap_or_else(|| panic!("{slice} is not a slice"));
    if stem == "-" {
        return dir;
    }
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        dir.push(format!("{prefix}.slice"));
    }
    dir
}

/// The cgroup v2 directory of a sandbox's or container's scope below the pod slice `slice`
/// (`…/cri-containerd-<id>.scope`: containerd's cgroup path `<slice>:cri-containerd:<id>`).
pub fn scope_dir(slice: &str, id: &str) -> PathBuf {
    slice_dir(slice).join(format!("cri-containerd-{id}.scope"))
}

/// A cgroup file in `dir` (e.g. `cpu.weight`), trimmed; panics (test code) when it cannot be read.
pub fn cgroup_file(dir: &std::path::Path, file: &str) -> String {
    let path = dir.join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())).trim().to_owned()
}

/// [`sandbox_config`] for containerd with the systemd driver: the same host-network pod with a
/// unique UID, whose `cgroup_parent` is its own pod slice of class `qos`, made here as kubelet
/// makes it ([`make_pod_slice`], the minimum of 2 CPU shares; stop it with [`stop_slice`] once the
/// pod is removed).
pub fn sandbox_config_systemd(
    env: &Containerd,
    name: &str,
    labels: HashMap<String, String>,
    annotations: HashMap<String, String>,
    qos: Qos,
) -> cri::PodSandboxConfig {
    let mut config = sandbox_config(env, name, labels, annotations);
    let uid = config.metadata.as_ref().map(|m| m.uid.clone()).unwrap_or_default();
    let slice = make_pod_slice(&uid, qos, &SliceResources { cpu_shares: Some(2), ..Default::default() });
    config.linux.get_or_insert_with(Default::default).cgroup_parent = slice;
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_dirs_as_kubelet_and_systemd() {
        assert_eq!(Qos::BestEffort.pod_slice("1234-ab-cd"), "kubepods-besteffort-pod1234_ab_cd.slice");
        assert_eq!(Qos::Burstable.pod_slice("u"), "kubepods-burstable-podu.slice");
        assert_eq!(Qos::Guaranteed.pod_slice("u-1"), "kubepods-podu_1.slice");
        assert_eq!(
            slice_dir("kubepods-besteffort-podu_1.slice"),
            PathBuf::from("/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podu_1.slice")
        );
        assert_eq!(slice_dir("-.slice"), PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(
            scope_dir("kubepods-podx.slice", "ab"),
            PathBuf::from("/sys/fs/cgroup/kubepods.slice/kubepods-podx.slice/cri-containerd-ab.scope")
        );
    }

    #[test]
    fn kubelet_cpu_weights() {
        assert_eq!(
            [cpu_weight(0), cpu_weight(2), cpu_weight(1024), cpu_weight(2048), cpu_weight(1 << 20)],
            [1, 1, 39, 79, 10000]
        );
    }
}
