//! RDMADeviceInject: the RDMA devices the scheduler allocated, as character devices of the
//! container (koordlet v1.8.0 `runtimehooks/hooks/rdma/rdma.go`, feature gate
//! `RDMADeviceInject`, alpha, off by default).
//!
//! # Stage
//!
//! PreCreateContainer (koordlet's only registration of this hook).
//!
//! # Inputs
//!
//! * pod annotation `scheduling.koordinator.sh/device-allocated`, its `rdma` list
//!   ([`super::devices`]); no annotation or no `rdma` entry: no change;
//! * the host, through [`RdmaHost`] (real: [`HostFs`] under `--device-host-root`, default `/`): for
//!   a PCI address, the first entry (by name) of `/sys/bus/pci/devices/<address>/infiniband_verbs/`
//!   is its verbs device (`uverbs0`), whose node is `/dev/infiniband/<name>`; a node's major and
//!   minor are read with `stat(2)`, as koordlet's `GetDeviceNumbers` does.
//!
//! # Outputs
//!
//! Devices only (NRI-only, [`crate::change`]: proxy mode logs them, not applied), all `c`
//! (character), mode `0666`, owner left to the runtime, at koordlet's container paths:
//!
//! 1. `/dev/infiniband/rdma_cm`, the RDMA connection manager;
//! 2. for each `rdma` allocation in order: when its `extension.vfs` is not empty, the verbs
//!    device of each VF's `busID` (not the PF's: koordlet never gives both); otherwise the
//!    verbs device of its `id`, the PF's PCI address.
//!
//! # Errors
//!
//! The plugin's failure, under the failure policy; each names the annotation:
//!
//! * the annotation is not a device allocation, an `rdma` entry is `null`;
//! * a PCI address (`id`, `busID`) that is empty or not `DOMAIN:BUS:DEVICE.FUNCTION` in hex
//!   (koordlet would join it into a sysfs path unchecked);
//! * a device without `infiniband_verbs` entries;
//! * a node that does not exist or is not a character device (koordlet reads any file's
//!   `st_rdev`, 0:0 for a regular one).
//!
//! A node without RDMA is not a kernel feature to detect at start: only pods the scheduler gave
//! RDMA devices ask, and for them koordlet fails the hook too.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

use crate::change::{Change, Device, DeviceKind};
use crate::context::ContainerContext;
use crate::plugin::{Plugin, Stage};
use crate::rules::Rules;

use super::devices::{device_allocations, DEVICE_ALLOCATED};

/// Container (and host) directory of the InfiniBand device nodes (koordlet's `IBDevDir`).
pub const IB_DEV_DIR: &str = "/dev/infiniband";
/// The RDMA connection manager's node (koordlet's `RdmaCmDir`).
pub const RDMA_CM: &str = "/dev/infiniband/rdma_cm";
/// The host's PCI devices in sysfs (koordlet's `SysBusPci`).
pub const SYS_BUS_PCI: &str = "/sys/bus/pci/devices";
/// Mode of the added nodes (koordlet's `FileModeValue`).
pub const DEVICE_MODE: u32 = 0o666;

/// What the plugin reads from the host, behind a trait so that tests can fake it.
pub trait RdmaHost: Send + Sync + 'static {
    /// The name of the verbs device of the PCI function `pci_address` (`uverbs0`): the first
    /// entry by name of `/sys/bus/pci/devices/<pci_address>/infiniband_verbs/`.
    ///
    /// Errors: the directory cannot be read or is empty (message names the path).
    fn verbs_device(&self, pci_address: &str) -> anyhow::Result<String>;

    /// `(major, minor)` of the character device node at `path` (a host path in the form
    /// `/dev/…`).
    ///
    /// Errors: the node cannot be stat'ed or is not a character device (message names it).
    fn device_numbers(&self, path: &str) -> anyhow::Result<(i64, i64)>;
}

/// The real host, its root file system seen at `root` (`/` on the node; a host mount, or a
/// test's temp dir, otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostFs {
    root: PathBuf,
}

impl HostFs {
    /// The host whose `/` is at `root`.
    pub fn new(root: impl Into<PathBuf>) -> HostFs {
        HostFs { root: root.into() }
    }

    fn host_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

impl RdmaHost for HostFs {
    fn verbs_device(&self, pci_address: &str) -> anyhow::Result<String> {
        let dir = self.host_path(SYS_BUS_PCI).join(pci_address).join("infiniband_verbs");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names.into_iter().next().ok_or_else(|| anyhow::anyhow!("{} is empty: no verbs device", dir.display()))
    }

    fn device_numbers(&self, path: &str) -> anyhow::Result<(i64, i64)> {
        let host = self.host_path(path);
        let meta = std::fs::metadata(&host).with_context(|| format!("stat {}", host.display()))?;
        anyhow::ensure!(meta.file_type().is_char_device(), "{} is not a character device", host.display());
        let rdev = meta.rdev();
        Ok((i64::from(libc::major(rdev)), i64::from(libc::minor(rdev))))
    }
}

/// The RDMADeviceInject plugin.
#[derive(Clone)]
pub struct RdmaDeviceInject {
    host: Arc<dyn RdmaHost>,
}

impl std::fmt::Debug for RdmaDeviceInject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RdmaDeviceInject")
    }
}

impl RdmaDeviceInject {
    /// Reading the host through `host`.
    pub fn new(host: Arc<dyn RdmaHost>) -> RdmaDeviceInject {
        RdmaDeviceInject { host }
    }

    /// The container device of the verbs device of `pci_address`.
    fn verbs(&self, pci_address: &str) -> anyhow::Result<Device> {
        check_pci_address(pci_address)?;
        let name = self.host.verbs_device(pci_address)?;
        anyhow::ensure!(
            !name.is_empty() && !name.contains('/') && name != "..",
            "verbs device name {name:?} is not a file name"
        );
        self.device(&format!("{IB_DEV_DIR}/{name}"))
    }

    fn device(&self, path: &str) -> anyhow::Result<Device> {
        let (major, minor) = self.host.device_numbers(path)?;
        Ok(Device {
            path: path.to_owned(),
            kind: DeviceKind::Char,
            major,
            minor,
            file_mode: Some(DEVICE_MODE),
            uid: None,
            gid: None,
        })
    }
}

/// `DOMAIN:BUS:DEVICE.FUNCTION`, hex: a domain of 4 to 8 digits, then 2, 2 and 1 (0–7)
/// (`0000:09:00.0`), the names of `/sys/bus/pci/devices/`.
///
/// Errors: anything else, quoted.
pub fn check_pci_address(address: &str) -> anyhow::Result<()> {
    let hex =
        |s: &str, min: usize, max: usize| (min..=max).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = match address.split(':').collect::<Vec<_>>()[..] {
        [domain, bus, devfn] => match devfn.split_once('.') {
            Some((dev, func)) => {
                hex(domain, 4, 8) && hex(bus, 2, 2) && hex(dev, 2, 2) && matches!(func.as_bytes(), [b'0'..=b'7'])
            }
            None => false,
        },
        _ => false,
    };
    anyhow::ensure!(ok, "{address:?} is not a PCI address (DOMAIN:BUS:DEVICE.FUNCTION, e.g. 0000:09:00.0)");
    Ok(())
}

impl Plugin for RdmaDeviceInject {
    fn name(&self) -> &'static str {
        "RDMADeviceInject"
    }

    fn stages(&self) -> &'static [Stage] {
        &[Stage::PreCreateContainer]
    }

    fn container(&self, _stage: Stage, c: &ContainerContext, _rules: &Rules) -> anyhow::Result<Change> {
        let allocations = device_allocations(&c.pod.annotations, "rdma")?;
        if allocations.is_empty() {
            return Ok(Change::default());
        }
        let mut change = Change::default();
        change.add_device(
            self.device(RDMA_CM)
                .with_context(|| format!("pod annotation {DEVICE_ALLOCATED} allocates rdma: {RDMA_CM}"))?,
        );
        for (i, a) in allocations.iter().enumerate() {
            let vfs = a.extension.as_ref().map(|e| e.vfs.as_slice()).unwrap_or_default();
            if vfs.is_empty() {
                let d = self
                    .verbs(&a.id)
                    .with_context(|| format!("pod annotation {DEVICE_ALLOCATED}: rdma entry {i} id {:?}", a.id))?;
                change.add_device(d);
            }
            for (j, vf) in vfs.iter().enumerate() {
                let d = self.verbs(&vf.bus_id).with_context(|| {
                    format!("pod annotation {DEVICE_ALLOCATED}: rdma entry {i} vf {j} busID {:?}", vf.bus_id)
                })?;
                change.add_device(d);
            }
        }
        Ok(change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::PodContext;
    use std::collections::HashMap;
    use std::path::Path;

    /// Verbs devices by PCI address, numbers by path.
    struct Fake {
        verbs: HashMap<&'static str, &'static str>,
        numbers: HashMap<&'static str, (i64, i64)>,
    }

    impl RdmaHost for Fake {
        fn verbs_device(&self, pci: &str) -> anyhow::Result<String> {
            self.verbs.get(pci).map(|s| s.to_string()).ok_or_else(|| anyhow::anyhow!("no infiniband_verbs for {pci}"))
        }
        fn device_numbers(&self, path: &str) -> anyhow::Result<(i64, i64)> {
            self.numbers.get(path).copied().ok_or_else(|| anyhow::anyhow!("stat {path}: no such file"))
        }
    }

    fn fake() -> RdmaDeviceInject {
        RdmaDeviceInject::new(Arc::new(Fake {
            verbs: [
                ("0000:09:00.0", "uverbs0"),
                ("0000:09:00.2", "uverbs2"),
                ("0000:09:00.3", "uverbs3"),
                ("0000:0a:00.0", "evil/.."),
            ]
            .into(),
            numbers: [
                (RDMA_CM, (10, 58)),
                ("/dev/infiniband/uverbs0", (231, 192)),
                ("/dev/infiniband/uverbs2", (231, 194)),
                ("/dev/infiniband/uverbs3", (231, 195)),
            ]
            .into(),
        }))
    }

    fn run(p: &RdmaDeviceInject, annotation: Option<&str>) -> anyhow::Result<Change> {
        let pod = PodContext {
            annotations: annotation.map(|a| (DEVICE_ALLOCATED.to_string(), a.to_string())).into_iter().collect(),
            ..Default::default()
        };
        p.container(
            Stage::PreCreateContainer,
            &ContainerContext { pod, name: "main".into(), ..Default::default() },
            &Rules::default(),
        )
    }

    fn paths(c: &Change) -> Vec<(&str, i64, i64)> {
        c.devices.iter().map(|d| (d.path.as_str(), d.major, d.minor)).collect()
    }

    #[test]
    fn rdma_cm_then_each_pf_or_its_vfs() {
        let text = r#"{"gpu": [{"minor": 0}], "rdma": [{"minor": 0, "id": "0000:09:00.0"},
                       {"minor": 1, "id": "0000:0b:00.0", "extension": {"vfs": [{"minor": 2, "busID": "0000:09:00.2"}, {"busID": "0000:09:00.3"}]}}]}"#;
        let change = run(&fake(), Some(text)).unwrap();
        assert_eq!(
            paths(&change),
            [
                (RDMA_CM, 10, 58),
                ("/dev/infiniband/uverbs0", 231, 192),
                ("/dev/infiniband/uverbs2", 231, 194),
                ("/dev/infiniband/uverbs3", 231, 195)
            ]
        );
        assert!(change
            .devices
            .iter()
            .all(|d| d.kind == DeviceKind::Char && d.file_mode == Some(0o666) && d.uid.is_none()));
        assert!(change.envs.is_empty() && change.mounts.is_empty());
        assert!(run(&fake(), None).unwrap().is_empty());
        assert!(run(&fake(), Some(r#"{"gpu": [{"minor": 0}]}"#)).unwrap().is_empty(), "no rdma: not even rdma_cm");
    }

    #[test]
    fn bad_allocations_and_missing_devices_are_errors_naming_them() {
        for (text, needle) in [
            (r#"{"rdma": [{"minor": 0}]}"#, r#"rdma entry 0 id "": "" is not a PCI address"#),
            (r#"{"rdma": [{"id": "../../../etc"}]}"#, "is not a PCI address"),
            (
                r#"{"rdma": [{"id": "0000:09:00.0"}, {"id": "0000:0c:00.0"}]}"#,
                "rdma entry 1 id \"0000:0c:00.0\": no infiniband_verbs",
            ),
            (
                r#"{"rdma": [{"id": "0000:09:00.0", "extension": {"vfs": [{"busID": "0000:09:00.7"}]}}]}"#,
                "vf 0 busID \"0000:09:00.7\"",
            ),
            (r#"{"rdma": [{"id": "0000:0a:00.0"}]}"#, "is not a file name"),
            (r#"{"rdma": {}}"#, "not a device allocation"),
        ] {
            let e = format!("{:#}", run(&fake(), Some(text)).unwrap_err());
            assert!(e.contains(DEVICE_ALLOCATED) && e.contains(needle), "{text}: {e}");
        }
        let no_cm = RdmaDeviceInject::new(Arc::new(Fake { verbs: HashMap::new(), numbers: HashMap::new() }));
        let e = format!("{:#}", run(&no_cm, Some(r#"{"rdma": [{"id": "0000:09:00.0"}]}"#)).unwrap_err());
        assert!(e.contains("rdma_cm") && e.contains("no such file"), "{e}");
    }

    #[test]
    fn pci_addresses() {
        for ok in ["0000:09:00.0", "10000:af:1f.7", "ABCD:0A:00.1"] {
            check_pci_address(ok).unwrap();
        }
        for bad in [
            "",
            "0000:09:00",
            "0000:09:00.8",
            "000:09:00.0",
            "0000:9:00.0",
            "0000:09:00.0/..",
            "0000:09:00.00",
            "a:b:c:d",
        ] {
            assert!(check_pci_address(bad).is_err(), "{bad:?}");
        }
    }

    /// Creates `<root>/sys/bus/pci/devices/<pci>/infiniband_verbs/<name>` (a directory, as sysfs
    /// has it), for tests of [`HostFs`] with a device node made elsewhere.
    fn fake_sysfs_verbs(root: &Path, pci: &str, name: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(
            root.join(SYS_BUS_PCI.trim_start_matches('/')).join(pci).join("infiniband_verbs").join(name),
        )
    }

    /// The real host reader on a temp dir: sysfs entries are directories, the first by name
    /// wins; a regular file is refused; a real node's numbers (made with mknod, as root) are
    /// read with stat.
    #[test]
    fn host_fs_reads_sysfs_and_stats_nodes() {
        let t = tempfile::tempdir().unwrap();
        let host = HostFs::new(t.path());
        fake_sysfs_verbs(t.path(), "0000:09:00.0", "uverbs1").unwrap();
        fake_sysfs_verbs(t.path(), "0000:09:00.0", "uverbs0").unwrap();
        assert_eq!(host.verbs_device("0000:09:00.0").unwrap(), "uverbs0");
        assert!(format!("{:#}", host.verbs_device("0000:0a:00.0").unwrap_err()).contains("infiniband_verbs"));
        std::fs::create_dir_all(t.path().join("sys/bus/pci/devices/0000:0b:00.0/infiniband_verbs")).unwrap();
        assert!(format!("{:#}", host.verbs_device("0000:0b:00.0").unwrap_err()).contains("is empty"));
        let dev = t.path().join("dev/infiniband");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("plain"), "").unwrap();
        assert!(format!("{:#}", host.device_numbers("/dev/infiniband/plain").unwrap_err())
            .contains("not a character device"));
        assert!(format!("{:#}", host.device_numbers("/dev/infiniband/none").unwrap_err()).contains("stat"));
        // The host's /dev/null, through a root of "/": 1:3 on every Linux.
        assert_eq!(HostFs::new("/").device_numbers("/dev/null").unwrap(), (1, 3));
        let node = std::ffi::CString::new(dev.join("uverbs0").to_str().unwrap()).unwrap();
        // SAFETY: mknod(2) with a valid NUL-terminated path.
        if unsafe { libc::mknod(node.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(231, 192)) } == 0 {
            assert_eq!(host.device_numbers("/dev/infiniband/uverbs0").unwrap(), (231, 192));
        } else {
            eprintln!("mknod not permitted here (not root): the real-node case is left to tests/nri_mode.rs");
        }
    }
}
