//! What a plugin asks for: a [`Change`].
//!
//! # Fields
//!
//! Every field is "no change" when empty (`None`, empty map, empty list), so a plugin states only
//! what it owns.
//!
//! # How a change is applied
//!
//! The framework merges the changes of a stage's plugins in order (a later plugin
//! wins per field) and then:
//!
//! * in proxy mode, overrides the echoed request with them (`resources` → `container_resources`
//!   or the pod's `resources`, `envs` → `container_envs`, `annotations` → container or pod
//!   annotations, `cgroup_parent` → `pod_cgroup_parent` or `cgroup_parent`), and writes
//!   `pod_cgroup` to the pod's cgroup directory itself, synchronously, as koordlet does, and
//!   answers its shares, quota, memory limit and cpuset in the pod's `resources` too (koordlet's
//!   `PodResponse.ProxyDone`; runtime-proxy, like koord, applies them to the pause container in
//!   Docker mode and nowhere in CRI mode);
//! * in standalone mode, writes `resources` (container stages) and `pod_cgroup` to the cgroup
//!   files of the running pod and container ([`Change::container_values`]); envs, annotations
//!   and cgroup parents cannot change after creation and are ignored there.
//!
//! # Devices and mounts
//!
//! `devices` and `mounts` (koordlet's `AddContainerDevices` / `AddContainerMounts` of
//! `protocol/container_context.go`, set by its `gpu` and `rdma` hooks) are **NRI-only**: NRI's
//! `ContainerAdjustment` carries them (`linux.devices`, `mounts`), the runtime.v1alpha1
//! `ContainerResourceHookResponse` has no field for them, so in proxy mode they are logged as
//! "not expressible in proxy mode" (once per call) and not applied, while the envs of the same
//! change still are; standalone mode cannot add them to a created container and ignores them,
//! like envs.

use std::collections::BTreeMap;
use std::fmt;

use hook_api::v1alpha1::LinuxContainerResources;

use crate::cgroup::CgroupValue;

/// Resource fields a plugin may set, with the units of CRI `LinuxContainerResources`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU shares (2..=262144).
    pub cpu_shares: Option<i64>,
    /// CFS quota in µs per period; −1 = unlimited.
    pub cpu_quota: Option<i64>,
    /// CFS period in µs.
    pub cpu_period: Option<i64>,
    /// Memory limit in bytes (> 0; runtime-proxy ignores −1, so "unlimited" cannot be asked
    /// for through the proxy).
    pub memory_limit_in_bytes: Option<i64>,
    /// CPU list; `""` = clear: the container runs on whatever its parent may use (the proxy takes
    /// `""` as "clear"; CPUSet answers it for BestEffort pods).
    pub cpuset_cpus: Option<String>,
}

impl Resources {
    /// True when nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == Resources::default()
    }

    /// `later`'s fields win over ours where set.
    pub fn merge(&mut self, later: &Resources) {
        let Resources { cpu_shares, cpu_quota, cpu_period, memory_limit_in_bytes, cpuset_cpus } = later;
        if cpu_shares.is_some() {
            self.cpu_shares = *cpu_shares;
        }
        if cpu_quota.is_some() {
            self.cpu_quota = *cpu_quota;
        }
        if cpu_period.is_some() {
            self.cpu_period = *cpu_period;
        }
        if memory_limit_in_bytes.is_some() {
            self.memory_limit_in_bytes = *memory_limit_in_bytes;
        }
        if cpuset_cpus.is_some() {
            self.cpuset_cpus.clone_from(cpuset_cpus);
        }
    }

    /// Overrides the set fields in hook-protocol resources (the echoed request).
    pub fn apply_to(&self, r: &mut LinuxContainerResources) {
        if let Some(v) = self.cpu_shares {
            r.cpu_shares = v;
        }
        if let Some(v) = self.cpu_quota {
            r.cpu_quota = v;
        }
        if let Some(v) = self.cpu_period {
            r.cpu_period = v;
        }
        if let Some(v) = self.memory_limit_in_bytes {
            r.memory_limit_in_bytes = v;
        }
        if let Some(v) = &self.cpuset_cpus {
            r.cpuset_cpus.clone_from(v);
        }
    }

    /// The set fields as cgroup values (period before quota, so v1 sees the new period first).
    pub fn to_cgroup_values(&self) -> Vec<CgroupValue> {
        let mut out = Vec::new();
        if let Some(v) = self.cpu_shares {
            out.push(CgroupValue::CpuShares(v));
        }
        if let Some(v) = self.cpu_period {
            out.push(CgroupValue::CfsPeriod(v));
        }
        if let Some(v) = self.cpu_quota {
            out.push(CgroupValue::CfsQuota(v));
        }
        if let Some(v) = self.memory_limit_in_bytes {
            out.push(CgroupValue::MemoryLimit(v));
        }
        if let Some(v) = &self.cpuset_cpus {
            out.push(CgroupValue::CpusetCpus(v.clone()));
        }
        out
    }
}

/// A plugin's answer for one pod or container at one stage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// New cgroup parent of the pod (`cgroup_parent` / `pod_cgroup_parent` in the response).
    pub cgroup_parent: Option<String>,
    /// Container resources (container stages) or the pod's response `resources` (pod stages).
    pub resources: Resources,
    /// Container env vars to set (container stages; PreCreateContainer is the only stage where
    /// the runtime can still apply them).
    pub envs: BTreeMap<String, String>,
    /// Annotations to set: the container's at container stages, the pod's at pod stages.
    pub annotations: BTreeMap<String, String>,
    /// Values the hook server writes to the **pod's** cgroup directory itself (koordlet's
    /// pod-level direct writes: group identity, pod CPU and memory limits).
    pub pod_cgroup: Vec<CgroupValue>,
    /// The container's RDT class (container stages): NRI's `LinuxResources.rdt_class` in the
    /// CreateContainer adjustment, which containerd makes the OCI `intelRdt.closID` (the resctrl
    /// group the runtime puts the container in). NRI mode only: the runtime proxy's protocol
    /// has no such field, and a running container cannot be moved by it.
    pub rdt_class: Option<String>,
    /// Linux devices to add to the container (PreCreateContainer; NRI mode only, see the module
    /// docs). One per container path: merging replaces a device of the same path.
    pub devices: Vec<Device>,
    /// Mounts to add to the container (PreCreateContainer; NRI mode only). One per
    /// destination: merging replaces a mount of the same destination.
    pub mounts: Vec<Mount>,
}

/// Kind of a Linux device node (OCI `linux.devices[].type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// `c`: character device (what koordlet's RDMA hook adds).
    Char,
    /// `b`: block device.
    Block,
}

impl DeviceKind {
    /// OCI's and NRI's letter: `"c"` or `"b"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            DeviceKind::Char => "c",
            DeviceKind::Block => "b",
        }
    }
}

/// A device node the runtime creates in the container (OCI `linux.devices[]`, NRI
/// `LinuxDevice`) and allows in its device cgroup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    /// Path inside the container, absolute (`/dev/infiniband/uverbs0`).
    pub path: String,
    /// `c` or `b`.
    pub kind: DeviceKind,
    /// Major device number (Linux `major(st_rdev)`).
    pub major: i64,
    /// Minor device number (Linux `minor(st_rdev)`).
    pub minor: i64,
    /// Permission bits of the node (`0o666`); `None`: the runtime's default.
    pub file_mode: Option<u32>,
    /// Owner uid of the node; `None`: the runtime's default (root).
    pub uid: Option<u32>,
    /// Owner gid of the node; `None`: the runtime's default (root).
    pub gid: Option<u32>,
}

/// A mount added to the container (OCI `mounts[]`, NRI `Mount`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// Absolute path inside the container.
    pub destination: String,
    /// Mount type (`bind`).
    pub kind: String,
    /// Host path (for a bind mount).
    pub source: String,
    /// Mount options (`rbind`, `ro`, …).
    pub options: Vec<String>,
}

impl Change {
    /// True when the change asks for nothing.
    pub fn is_empty(&self) -> bool {
        *self == Change::default()
    }

    /// Adds `later` on top of this change: its set fields and keys win; pod cgroup values
    /// replace ours of the same kind.
    pub fn merge(&mut self, later: &Change) {
        if later.cgroup_parent.is_some() {
            self.cgroup_parent.clone_from(&later.cgroup_parent);
        }
        self.resources.merge(&later.resources);
        self.envs.extend(later.envs.iter().map(|(k, v)| (k.clone(), v.clone())));
        self.annotations.extend(later.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
        for v in &later.pod_cgroup {
            self.pod_cgroup.retain(|old| old.kind() != v.kind());
            self.pod_cgroup.push(v.clone());
        }
        if later.rdt_class.is_some() {
            self.rdt_class.clone_from(&later.rdt_class);
        }
        for d in &later.devices {
            self.add_device(d.clone());
        }
        for m in &later.mounts {
            self.add_mount(m.clone());
        }
    }

    /// Adds `device`, replacing one of the same container path (the later wins).
    pub fn add_device(&mut self, device: Device) {
        self.devices.retain(|old| old.path != device.path);
        self.devices.push(device);
    }

    /// Adds `mount`, replacing one of the same destination (the later wins).
    pub fn add_mount(&mut self, mount: Mount) {
        self.mounts.retain(|old| old.destination != mount.destination);
        self.mounts.push(mount);
    }

    /// What of this change the runtime.v1alpha1 answer cannot carry (devices and mounts), for
    /// the proxy's log line; `None` when there is none.
    pub fn proxy_inexpressible(&self) -> Option<String> {
        if self.devices.is_empty() && self.mounts.is_empty() {
            return None;
        }
        let mut parts: Vec<String> = self.devices.iter().map(Device::describe).collect();
        parts.extend(self.mounts.iter().map(Mount::describe));
        Some(parts.join(" "))
    }

    /// The container-level cgroup values of this change (its `resources`).
    pub fn container_values(&self) -> Vec<CgroupValue> {
        self.resources.to_cgroup_values()
    }

    /// A short description of what is set, for logs: `cpu_shares=512 cpu_quota=100000 …`
    /// (the [`fmt::Display`] text, as a `String`).
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

/// Writes items separated by single spaces, straight into a formatter (no `String` per item).
struct Spaced<'a, 'b> {
    f: &'a mut fmt::Formatter<'b>,
    first: bool,
}

impl Spaced<'_, '_> {
    fn item(&mut self, item: impl fmt::Display) -> fmt::Result {
        if !std::mem::take(&mut self.first) {
            self.f.write_str(" ")?;
        }
        write!(self.f, "{item}")
    }
}

/// What is set, for logs: `cpu_shares=512 cpu_quota=100000 cpuset_cpus="" env K=V annotation
/// K=V pod bvt-warp-ns=-1 device … mount … rdt_class=C`, in this order, unset fields left
/// out (empty for an empty change). Written straight into the formatter: the per-call log line
/// builds no strings.
impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = Spaced { f, first: true };
        let r = &self.resources;
        for (name, v) in [
            ("cpu_shares", r.cpu_shares),
            ("cpu_period", r.cpu_period),
            ("cpu_quota", r.cpu_quota),
            ("memory_limit_in_bytes", r.memory_limit_in_bytes),
        ] {
            if let Some(v) = v {
                out.item(format_args!("{name}={v}"))?;
            }
        }
        if let Some(c) = &r.cpuset_cpus {
            out.item(format_args!("cpuset_cpus={c:?}"))?;
        }
        if let Some(p) = &self.cgroup_parent {
            out.item(format_args!("cgroup_parent={p}"))?;
        }
        for (k, v) in &self.envs {
            out.item(format_args!("env {k}={v}"))?;
        }
        for (k, v) in &self.annotations {
            out.item(format_args!("annotation {k}={v}"))?;
        }
        for v in &self.pod_cgroup {
            out.item(format_args!("pod {v}"))?;
        }
        for d in &self.devices {
            out.item(d)?;
        }
        for m in &self.mounts {
            out.item(m)?;
        }
        if let Some(c) = &self.rdt_class {
            out.item(format_args!("rdt_class={c}"))?;
        }
        Ok(())
    }
}

impl Device {
    /// `device /dev/infiniband/uverbs0 c 231:192 mode 0666`, for logs (the [`fmt::Display`]
    /// text).
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} {} {}:{}", self.path, self.kind.as_str(), self.major, self.minor)?;
        if let Some(m) = self.file_mode {
            write!(f, " mode {m:04o}")?;
        }
        if let Some(u) = self.uid {
            write!(f, " uid {u}")?;
        }
        if let Some(g) = self.gid {
            write!(f, " gid {g}")?;
        }
        Ok(())
    }
}

impl Mount {
    /// `mount /tmp/vgpulock:/tmp/vgpulock bind rbind`, for logs (source:destination; the
    /// [`fmt::Display`] text).
    pub fn describe(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mount {}:{} {} {}", self.source, self.destination, self.kind, self.options.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_wins_per_field_and_pod_values_by_kind() {
        let mut a = Change {
            resources: Resources { cpu_shares: Some(2), cpuset_cpus: Some("0-1".into()), ..Default::default() },
            envs: [("A".to_string(), "1".to_string())].into(),
            pod_cgroup: vec![CgroupValue::BvtWarpNs(2), CgroupValue::CpuShares(2)],
            ..Default::default()
        };
        let b = Change {
            resources: Resources { cpu_shares: Some(512), cpu_quota: Some(-1), ..Default::default() },
            envs: [("A".to_string(), "2".to_string()), ("B".to_string(), "3".to_string())].into(),
            pod_cgroup: vec![CgroupValue::BvtWarpNs(-1)],
            cgroup_parent: Some("/x".into()),
            ..Default::default()
        };
        a.merge(&b);
        assert_eq!(
            a.resources,
            Resources {
                cpu_shares: Some(512),
                cpu_quota: Some(-1),
                cpuset_cpus: Some("0-1".into()),
                ..Default::default()
            }
        );
        assert_eq!(a.envs["A"], "2");
        assert_eq!(a.envs["B"], "3");
        assert_eq!(a.pod_cgroup, vec![CgroupValue::CpuShares(2), CgroupValue::BvtWarpNs(-1)]);
        assert_eq!(a.cgroup_parent.as_deref(), Some("/x"));
        assert!(Change::default().is_empty() && !a.is_empty());
    }

    fn dev(path: &str, minor: i64) -> Device {
        Device {
            path: path.into(),
            kind: DeviceKind::Char,
            major: 231,
            minor,
            file_mode: Some(0o666),
            uid: None,
            gid: None,
        }
    }

    fn bind(dst: &str, src: &str) -> Mount {
        Mount { destination: dst.into(), kind: "bind".into(), source: src.into(), options: vec!["rbind".into()] }
    }

    /// Every kind of field in the log text, in its order, one space apart; nothing for an empty
    /// change.
    #[test]
    fn the_log_text_names_every_field_set() {
        let change = Change {
            cgroup_parent: Some("/kubepods/x".into()),
            resources: Resources {
                cpu_shares: Some(512),
                cpu_quota: Some(-1),
                cpu_period: Some(100_000),
                memory_limit_in_bytes: Some(1 << 20),
                cpuset_cpus: Some(String::new()),
            },
            envs: [("A".to_string(), "1".to_string())].into(),
            annotations: [("k".to_string(), "v".to_string())].into(),
            pod_cgroup: vec![CgroupValue::BvtWarpNs(-1)],
            rdt_class: Some("BE".into()),
            devices: vec![dev("/dev/a", 1)],
            mounts: vec![bind("/x", "/h")],
        };
        assert_eq!(
            change.describe(),
            "cpu_shares=512 cpu_period=100000 cpu_quota=-1 memory_limit_in_bytes=1048576 cpuset_cpus=\"\" \
             cgroup_parent=/kubepods/x env A=1 annotation k=v pod bvt-warp-ns=-1 device /dev/a c 231:1 mode 0666 \
             mount /h:/x bind rbind rdt_class=BE"
        );
        assert_eq!(Change::default().describe(), "");
        let one = Change { pod_cgroup: vec![CgroupValue::CpuShares(2)], ..Default::default() };
        assert_eq!(one.to_string(), "pod cpu-shares=2");
    }

    /// Two plugins adding the same device path or mount destination: the later wins, in place
    /// of the earlier; other entries stay in order.
    #[test]
    fn devices_and_mounts_merge_by_path_later_wins() {
        let mut a = Change {
            devices: vec![dev("/dev/a", 1), dev("/dev/b", 2)],
            mounts: vec![bind("/x", "/h1")],
            ..Default::default()
        };
        let b = Change {
            devices: vec![dev("/dev/a", 9)],
            mounts: vec![bind("/x", "/h2"), bind("/y", "/h3")],
            ..Default::default()
        };
        a.merge(&b);
        assert_eq!(a.devices, vec![dev("/dev/b", 2), dev("/dev/a", 9)]);
        assert_eq!(a.mounts, vec![bind("/x", "/h2"), bind("/y", "/h3")]);
        let text = a.describe();
        assert!(text.contains("device /dev/a c 231:9 mode 0666") && text.contains("mount /h3:/y bind rbind"), "{text}");
        assert_eq!(a.proxy_inexpressible().as_deref(), Some(text.as_str()));
        assert_eq!(
            Change { envs: [("A".into(), "1".into())].into(), ..Default::default() }.proxy_inexpressible(),
            None
        );
    }

    #[test]
    fn resources_override_only_set_fields() {
        let mut r = LinuxContainerResources {
            cpu_shares: 2,
            cpu_period: 100_000,
            memory_limit_in_bytes: 5,
            cpuset_cpus: "0".into(),
            oom_score_adj: 1000,
            ..Default::default()
        };
        Resources { cpu_shares: Some(512), cpuset_cpus: Some(String::new()), ..Default::default() }.apply_to(&mut r);
        assert_eq!(
            (r.cpu_shares, r.cpu_period, r.memory_limit_in_bytes, r.cpuset_cpus.as_str(), r.oom_score_adj),
            (512, 100_000, 5, "", 1000)
        );
    }

    #[test]
    fn cgroup_values_put_period_before_quota() {
        let r = Resources { cpu_quota: Some(50_000), cpu_period: Some(50_000), ..Default::default() };
        assert_eq!(r.to_cgroup_values(), vec![CgroupValue::CfsPeriod(50_000), CgroupValue::CfsQuota(50_000)]);
        assert!(Resources::default().to_cgroup_values().is_empty());
    }
}
