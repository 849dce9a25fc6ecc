//! Tests of [`super`]: values, units and files per cgroup version, on temp trees.

use super::*;

/// A v1 tree: `<root>/{cpu,memory,cpuset}/pod/c` with kernel-like default contents.
fn v1_tree() -> (tempfile::TempDir, CgroupFs) {
    let t = tempfile::tempdir().unwrap();
    for (ctrl, files) in [
        ("cpu", &[("cpu.shares", "1024"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")][..]),
        ("memory", &[("memory.limit_in_bytes", "9223372036854771712")][..]),
        ("cpuset", &[("cpuset.cpus", "0-3")][..]),
    ] {
        for dir in ["", "pod", "pod/c"] {
            let d = t.path().join(ctrl).join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
    }
    let fs = CgroupFs::new(t.path(), CgroupVersion::V1);
    (t, fs)
}

fn read(t: &tempfile::TempDir, rel: &str) -> String {
    std::fs::read_to_string(t.path().join(rel)).unwrap().trim().to_owned()
}

#[test]
fn v1_writes_only_when_different_and_reports_drift() {
    let (t, fs) = v1_tree();
    let w = fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap();
    let Written::Corrected(d) = w else { panic!("{w:?}") };
    assert_eq!((d.old.as_str(), d.new.as_str()), ("1024", "512"));
    assert_eq!(d.path, t.path().join("cpu/pod/c/cpu.shares"));
    assert_eq!(read(&t, "cpu/pod/c/cpu.shares"), "512");
    assert_eq!(fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap(), Written::Unchanged);
    assert_eq!(fs.apply("/pod/c", &CgroupValue::CfsQuota(-1)).unwrap(), Written::Unchanged);
    assert!(matches!(fs.apply("/pod/c", &CgroupValue::CfsQuota(100_000)).unwrap(), Written::Corrected(_)));
    assert_eq!(read(&t, "cpu/pod/c/cpu.cfs_quota_us"), "100000");
    assert!(matches!(fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap(), Written::Corrected(_)));
    assert_eq!(read(&t, "cpu/pod/c/cpu.cfs_period_us"), "50000");
}

#[test]
fn v1_memory_unlimited_and_page_rounding() {
    let (t, fs) = v1_tree();
    assert_eq!(fs.apply("/pod", &CgroupValue::MemoryLimit(-1)).unwrap(), Written::Unchanged, "huge = unlimited");
    assert!(matches!(fs.apply("/pod", &CgroupValue::MemoryLimit(128 << 20)).unwrap(), Written::Corrected(_)));
    assert_eq!(read(&t, "memory/pod/memory.limit_in_bytes"), "134217728");
    // The kernel would read back a page-rounded value: not drift.
    std::fs::write(t.path().join("memory/pod/memory.limit_in_bytes"), "4096").unwrap();
    assert_eq!(fs.apply("/pod", &CgroupValue::MemoryLimit(4097)).unwrap(), Written::Unchanged);
    assert!(matches!(fs.apply("/pod", &CgroupValue::MemoryLimit(-1)).unwrap(), Written::Corrected(d) if d.new == "-1"));
}

#[test]
fn v1_cpuset_compares_sets_and_clears_to_parent() {
    let (t, fs) = v1_tree();
    std::fs::write(t.path().join("cpuset/pod/c/cpuset.cpus"), "0,1,2,3").unwrap();
    assert_eq!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("0-3".into())).unwrap(), Written::Unchanged);
    assert!(matches!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("2-3".into())).unwrap(), Written::Corrected(_)));
    assert_eq!(read(&t, "cpuset/pod/c/cpuset.cpus"), "2-3");
    // "" = the shared pool: the parent's CPUs.
    std::fs::write(t.path().join("cpuset/pod/cpuset.cpus"), "0-1").unwrap();
    let w = fs.apply("/pod/c", &CgroupValue::CpusetCpus(String::new())).unwrap();
    assert!(matches!(&w, Written::Corrected(d) if d.new == "0-1"), "{w:?}");
    assert!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("x".into())).is_err());
}

#[test]
fn shared_cpus_from_the_pod_then_the_root() {
    let (t, fs) = v1_tree();
    std::fs::remove_file(t.path().join("cpuset/cpuset.cpus")).unwrap();
    std::fs::remove_file(t.path().join("cpuset/pod/cpuset.cpus")).unwrap();
    assert_eq!(fs.shared_cpus(Some("/pod")), None, "nothing readable");
    std::fs::write(t.path().join("cpuset/cpuset.cpus"), "0-3\n").unwrap();
    assert_eq!(fs.shared_cpus(Some("/pod")).as_deref(), Some("0-3"), "the root when the pod has none");
    std::fs::write(t.path().join("cpuset/pod/cpuset.cpus"), "0,1\n").unwrap();
    assert_eq!(fs.shared_cpus(Some("/pod")).as_deref(), Some("0-1"));
    assert_eq!(fs.shared_cpus(None).as_deref(), Some("0-3"));
    assert_eq!(fs.shared_cpus(Some("../x")).as_deref(), Some("0-3"), "a bad name falls back to the root");
}

#[test]
fn missing_file_is_unsupported_missing_dir_is_an_error() {
    let (_t, fs) = v1_tree();
    assert_eq!(fs.apply("/pod", &CgroupValue::BvtWarpNs(-1)).unwrap(), Written::Unsupported);
    assert_eq!(fs.apply("/pod/c", &CgroupValue::BvtWarpNs(2)).unwrap(), Written::Unsupported);
    assert_eq!(fs.unsupported(), vec!["cpu.bvt_warp_ns".to_string()]);
    let e = fs.apply("/gone", &CgroupValue::CpuShares(2)).unwrap_err();
    assert!(matches!(e, CgroupError::NoDir(_)), "{e}");
}

#[test]
fn net_cls_classid_only_where_the_hierarchy_is() {
    let (t, fs) = v1_tree();
    let id = CgroupValue::NetClsClassId(0x10003);
    assert_eq!(fs.apply("/pod", &id).unwrap(), Written::Unsupported, "no net_cls hierarchy");
    assert_eq!(fs.unsupported(), vec!["net_cls.classid".to_string()]);
    std::fs::create_dir_all(t.path().join("net_cls/pod")).unwrap();
    std::fs::write(t.path().join("net_cls/pod/net_cls.classid"), "0").unwrap();
    assert!(matches!(fs.apply("/pod", &id).unwrap(), Written::Corrected(_)));
    assert_eq!(read(&t, "net_cls/pod/net_cls.classid"), "65539");
    assert_eq!(fs.apply("/pod", &id).unwrap(), Written::Unchanged, "read back in decimal");
    let v2 = CgroupFs::new(t.path(), CgroupVersion::V2);
    assert_eq!(v2.apply("/pod", &id).unwrap(), Written::Unsupported, "v2 has no net_cls");
}

#[test]
fn refuses_relative_and_dotdot_dirs() {
    let (t, fs) = v1_tree();
    for bad in ["pod", "/pod/../../etc", "/..", "a--b.slice", "kubepods/pod1"] {
        assert!(matches!(fs.apply(bad, &CgroupValue::CpuShares(2)), Err(CgroupError::BadDir(..))), "{bad:?}");
    }
    // Empty (the runtime's default) and the root: no directory of their own, never written.
    for none in ["", "/", "-.slice"] {
        assert!(matches!(fs.apply(none, &CgroupValue::CpuShares(2)), Err(CgroupError::NoOwnDir(_))), "{none:?}");
    }
    assert_eq!(read(&t, "cpu/cpu.shares"), "1024");
}

#[test]
fn systemd_names_land_in_their_expanded_directory() {
    let (t, _) = v1_tree();
    let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice";
    for ctrl in ["cpu", "memory"] {
        std::fs::create_dir_all(t.path().join(ctrl).join(pod).join("cri-containerd-c1.scope")).unwrap();
    }
    std::fs::write(t.path().join("cpu").join(pod).join("cpu.shares"), "2").unwrap();
    std::fs::write(t.path().join("cpu").join(pod).join("cri-containerd-c1.scope/cpu.shares"), "2").unwrap();
    // Auto (the form says systemd), then the systemd driver; each writes a new value.
    for (driver, shares) in [(None, 512), (Some(CgroupDriver::Systemd), 513)] {
        let fs = CgroupFs::new(t.path(), CgroupVersion::V1).with_driver(driver);
        let w = fs.apply("kubepods-besteffort-pod1.slice", &CgroupValue::CpuShares(shares)).unwrap();
        let Written::Corrected(d) = w else { panic!("{w:?}") };
        assert_eq!(d.path, t.path().join("cpu").join(pod).join("cpu.shares"));
        let scope = "kubepods-besteffort-pod1.slice:cri-containerd:c1";
        assert!(matches!(fs.apply(scope, &CgroupValue::CpuShares(shares)).unwrap(), Written::Corrected(_)));
        assert_eq!(read(&t, &format!("cpu/{pod}/cri-containerd-c1.scope/cpu.shares")), shares.to_string());
    }
    // The cgroupfs driver refuses a slice name, saying why.
    let strict = CgroupFs::new(t.path(), CgroupVersion::V1).with_driver(Some(CgroupDriver::Cgroupfs));
    let e = strict.apply("kubepods-besteffort-pod1.slice", &CgroupValue::CpuShares(2)).unwrap_err();
    assert!(e.to_string().contains("kubepods-besteffort-pod1.slice") && e.to_string().contains("cgroupfs"), "{e}");
    // kubelet's expanded form works under every driver.
    assert_eq!(strict.apply(&format!("/{pod}"), &CgroupValue::CpuShares(513)).unwrap(), Written::Unchanged);
}

#[test]
fn unsupported_errnos() {
    let bvt = CgroupValue::BvtWarpNs(-1);
    let shares = CgroupValue::CpuShares(2);
    for errno in [libc::EOPNOTSUPP, libc::ENOENT, libc::EINVAL, libc::ENODEV] {
        assert!(unsupported_errno(&bvt, errno), "bvt errno {errno}");
    }
    assert!(unsupported_errno(&shares, libc::EOPNOTSUPP) && unsupported_errno(&shares, libc::ENOENT));
    assert!(!unsupported_errno(&shares, libc::EINVAL), "EINVAL on a core file is a refusal (retried)");
    assert!(!unsupported_errno(&bvt, libc::EACCES) && !unsupported_errno(&bvt, libc::EBUSY));
}

/// A kernel whose `cpu.bvt_warp_ns` exists but refuses the value with EINVAL: skipped, logged
/// once, never an error. The EINVAL is the real kernel's: the file is a symlink to a real
/// cgroup's `cpu.cfs_period_us`, which refuses "-1". Needs a writable cgroup v1 cpu
/// hierarchy at /sys/fs/cgroup/cpu (root); skipped elsewhere.
#[test]
fn einval_on_an_optional_feature_is_unsupported() {
    let scratch = Path::new("/sys/fs/cgroup/cpu").join(format!("rh-unit-einval-{}", std::process::id()));
    if std::fs::create_dir(&scratch).is_err() {
        eprintln!("no writable cgroup v1 cpu hierarchy: skipped");
        return;
    }
    let (t, fs) = v1_tree();
    std::os::unix::fs::symlink(scratch.join("cpu.cfs_period_us"), t.path().join("cpu/pod/cpu.bvt_warp_ns")).unwrap();
    let bvt = fs.apply("/pod", &CgroupValue::BvtWarpNs(-1));
    // The same kernel refusal on a core file is an error.
    std::os::unix::fs::symlink(scratch.join("cpu.cfs_period_us"), t.path().join("cpu/pod/c/cpu.cfs_period_us.link"))
        .unwrap();
    std::fs::remove_file(t.path().join("cpu/pod/c/cpu.cfs_period_us")).unwrap();
    std::fs::rename(t.path().join("cpu/pod/c/cpu.cfs_period_us.link"), t.path().join("cpu/pod/c/cpu.cfs_period_us"))
        .unwrap();
    let period = fs.apply("/pod/c", &CgroupValue::CfsPeriod(5));
    let _ = std::fs::remove_dir(&scratch);
    assert_eq!(bvt.unwrap(), Written::Unsupported);
    assert_eq!(fs.unsupported(), vec!["cpu.bvt_warp_ns".to_string()]);
    assert!(period.as_ref().is_err_and(|e| e.is_invalid_argument()), "{period:?}");
}

/// A v2 tree laid out as cgroupfs does: `<root>/pod/c` with the unified file names.
fn v2_tree() -> (tempfile::TempDir, CgroupFs) {
    let t = tempfile::tempdir().unwrap();
    for dir in ["", "pod", "pod/c"] {
        let d = t.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [("cpu.weight", "100"), ("cpu.max", "max 100000"), ("memory.max", "max"), ("cpuset.cpus", "")] {
            std::fs::write(d.join(f), format!("{v}\n")).unwrap();
        }
    }
    let fs = CgroupFs::new(t.path(), CgroupVersion::V2);
    (t, fs)
}

#[test]
fn v2_files_and_units() {
    let (t, fs) = v2_tree();
    fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap();
    assert_eq!(read(&t, "pod/c/cpu.weight"), "59", "runc's formula until the node's is learned");
    fs.apply("/pod/c", &CgroupValue::CfsQuota(100_000)).unwrap();
    assert_eq!(read(&t, "pod/c/cpu.max"), "100000 100000");
    fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap();
    assert_eq!(read(&t, "pod/c/cpu.max"), "100000 50000");
    assert_eq!(fs.apply("/pod/c", &CgroupValue::CfsPeriod(50_000)).unwrap(), Written::Unchanged);
    fs.apply("/pod/c", &CgroupValue::CfsQuota(-1)).unwrap();
    assert_eq!(read(&t, "pod/c/cpu.max"), "max 50000");
    fs.apply("/pod/c", &CgroupValue::MemoryLimit(128 << 20)).unwrap();
    assert_eq!(read(&t, "pod/c/memory.max"), "134217728");
    fs.apply("/pod/c", &CgroupValue::MemoryLimit(-1)).unwrap();
    assert_eq!(read(&t, "pod/c/memory.max"), "max");
    fs.apply("/pod/c", &CgroupValue::CpusetCpus("1".into())).unwrap();
    assert_eq!(read(&t, "pod/c/cpuset.cpus"), "1");
    fs.apply("/pod/c", &CgroupValue::CpusetCpus(String::new())).unwrap();
    assert_eq!(read(&t, "pod/c/cpuset.cpus"), "", "v2: empty = inherit");
    assert_eq!(fs.apply("/pod", &CgroupValue::BvtWarpNs(2)).unwrap(), Written::Unsupported);
}

#[test]
fn cpu_weight_is_written_and_compared_in_the_formula_learned_from_the_runtime() {
    let (t, fs) = v2_tree();
    // runc < 1.3.2 created the container with 512 shares and wrote weight 20 (linear).
    std::fs::write(t.path().join("pod/c/cpu.weight"), "20\n").unwrap();
    fs.learn_weight_formula("/pod/c", 512);
    assert_eq!(fs.weight().learned(), Some(WeightFormula::Linear));
    assert_eq!(
        fs.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap(),
        Written::Unchanged,
        "no drift against the runtime's own value"
    );
    fs.apply("/pod", &CgroupValue::CpuShares(1024)).unwrap();
    assert_eq!(read(&t, "pod/cpu.weight"), "39");
    // A forced formula is never relearned.
    let forced = CgroupFs::new(t.path(), CgroupVersion::V2).with_weight_formula(Some(WeightFormula::Runc));
    forced.learn_weight_formula("/pod/c", 512);
    assert_eq!(forced.weight().learned(), None);
    assert_eq!(
        forced.apply("/pod/c", &CgroupValue::CpuShares(512)).unwrap(),
        Written::Corrected(Drift { path: t.path().join("pod/c/cpu.weight"), old: "20".into(), new: "59".into() })
    );
}

#[test]
fn cpu_lists() {
    assert_eq!(parse_cpu_list("0-2,5").unwrap(), BTreeSet::from([0, 1, 2, 5]));
    assert_eq!(parse_cpu_list("").unwrap(), BTreeSet::new());
    assert!(parse_cpu_list("3-1").is_err());
    assert!(parse_cpu_list("a").is_err());
    assert!(parse_cpu_list("0-100000").is_err());
}

#[test]
fn cpu_lists_whitespace_and_strictness() {
    for (text, canonical) in [
        (" 0 - 1 ", "0-1"),
        ("0-1,4,6-7", "0-1,4,6-7"),
        ("\t6-7 , 4,\n0 -1\n", "0-1,4,6-7"),
        ("3,2,1,0", "0-3"),
        ("0-2,1-3", "0-3"),
        ("5", "5"),
        ("8191", "8191"),
        ("", ""),
        ("  ", ""),
    ] {
        let set = parse_cpu_list(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(format_cpu_list(&set), canonical, "{text:?}");
        assert_eq!(parse_cpu_list(canonical).unwrap(), set, "{canonical:?} reads back");
    }
    for (bad, why) in [
        ("0,,1", "empty element"),
        ("1,", "empty element"),
        (",1", "empty element"),
        (",", "empty element"),
        ("3-1", "descending"),
        ("a", "not a CPU"),
        ("+1", "not a CPU"),
        ("-1", "not a CPU"),
        ("1-", "not a CPU"),
        ("1-2-3", "not a CPU"),
        ("0x1", "not a CPU"),
        ("1:2", "not a CPU"),
        ("0-7:2/4", "not a CPU"),
        ("8192", "out of range"),
        ("0-99999999999999999999", "out of range"),
        ("١", "not a CPU"),
    ] {
        let e = parse_cpu_list(bad).unwrap_err();
        assert!(e.contains(why), "{bad:?}: {e}");
    }
    assert_eq!(format_cpu_list(&BTreeSet::from([0, 2, 4])), "0,2,4");
    assert_eq!(format_cpu_list(&BTreeSet::from([u32::MAX - 1, u32::MAX])), format!("{}-{}", u32::MAX - 1, u32::MAX));
    // The file gets the canonical form, whatever spelling the value had.
    let (t, fs) = v1_tree();
    let w = fs.apply("/pod/c", &CgroupValue::CpusetCpus(" 3, 1 - 2 ".into())).unwrap();
    assert!(matches!(&w, Written::Corrected(d) if d.new == "1-3"), "{w:?}");
    assert_eq!(read(&t, "cpuset/pod/c/cpuset.cpus"), "1-3");
    assert!(matches!(fs.apply("/pod/c", &CgroupValue::CpusetCpus("1,,2".into())), Err(CgroupError::BadValue(_))));
}

#[test]
fn detects_this_machine() {
    // The project's machines are cgroup v1 (hybrid); a cgroup2-only machine would say V2.
    if Path::new("/sys/fs/cgroup").exists() {
        let v = detect_version(Path::new("/sys/fs/cgroup")).unwrap();
        let unified = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .any(|l| l.contains(" /sys/fs/cgroup ") && l.contains(" - cgroup2 "));
        assert_eq!(v == CgroupVersion::V2, unified);
    }
    assert!(detect_version(&tempfile::tempdir().unwrap().path().join("none")).is_err());
}

/// The start-up check on temp trees (never a cgroup mount) and on this machine's own root.
#[test]
fn check_root_refuses_what_is_not_a_mounted_cgroup_fs() {
    let root = Path::new("/sys/fs/cgroup");
    let t = tempfile::tempdir().unwrap();
    let e = check_root(&t.path().join("none"), Some(CgroupVersion::V2)).unwrap_err();
    assert!(e.contains("does not exist") && e.contains("hostPath"), "{e}");
    let e = check_root(t.path(), Some(CgroupVersion::V2)).unwrap_err();
    assert!(e.contains("an empty directory on") && e.contains("expected a cgroup2 mount (--cgroup-version v2)"), "{e}");
    assert!(e.contains(&t.path().display().to_string()), "names the root: {e}");
    let (_tree, fs) = v1_tree();
    let e = check_root(fs.root(), None).unwrap_err();
    assert!(
        e.contains("a directory on") && e.contains("not a mounted cgroup file system"),
        "a tree laid out like v1: {e}"
    );
    if detect_version(root).ok() == Some(CgroupVersion::V1)
        && fs_type(&root.join("cpu")).ok() == Some(CGROUP_SUPER_MAGIC)
    {
        let e = check_root(&root.join("cpu"), None).unwrap_err();
        assert!(e.contains("one cgroup v1 controller's mount") && e.contains("use its parent (/sys/fs/cgroup)"), "{e}");
    }
    std::fs::write(t.path().join("file"), "").unwrap();
    assert!(check_root(&t.path().join("file"), None).unwrap_err().contains("not a directory"));

    // This machine: what its /sys/fs/cgroup is, the check says, and refuses the other version.
    let Ok(actual) = detect_version(root) else { return };
    let mounted_rw = check_root(root, None);
    if let Ok((v, _)) = &mounted_rw {
        assert_eq!(*v, actual);
        assert_eq!(check_root(root, Some(actual)).unwrap().0, actual);
    }
    let other = match actual {
        CgroupVersion::V1 => CgroupVersion::V2,
        CgroupVersion::V2 => CgroupVersion::V1,
    };
    let e = check_root(root, Some(other)).unwrap_err();
    assert!(e.contains("--cgroup-root /sys/fs/cgroup") && e.contains("use --cgroup-version"), "{e}");
    if actual == CgroupVersion::V1 && root.join("unified").is_dir() {
        assert!(e.contains("hybrid"), "{e}");
        // The hybrid host's cgroup2 part, taken for v1, is refused the other way round.
        if detect_version(&root.join("unified")).ok() == Some(CgroupVersion::V2) {
            let e = check_root(&root.join("unified"), Some(CgroupVersion::V1)).unwrap_err();
            assert!(e.contains("is a cgroup2 (unified) mount"), "{e}");
        }
    }
}

#[test]
fn unit_properties_per_cgroup_version() {
    use crate::systemd::UnitProperty as P;
    // v1 (a systemd-driver node on cgroup v1): the v1 properties, the quota with the period file's
    // value, no cpuset (systemd never writes v1 cpusets).
    let (t, v1) = v1_tree();
    let d1 = t.path().join("cpu/pod");
    assert_eq!(v1.unit_property(&d1, &CgroupValue::CpuShares(512), "1024"), Some(P::CpuShares(512)));
    assert_eq!(
        v1.unit_property(&d1, &CgroupValue::CfsQuota(50_000), "-1"),
        Some(P::CpuQuota { quota_us: Some(50_000), period_us: 100_000 })
    );
    assert_eq!(
        v1.unit_property(&d1, &CgroupValue::CfsQuota(-1), "50000"),
        Some(P::CpuQuota { quota_us: None, period_us: 100_000 })
    );
    assert_eq!(
        v1.unit_property(&d1, &CgroupValue::MemoryLimit(128 << 20), "-1"),
        Some(P::MemoryLimit(Some(128 << 20)))
    );
    assert_eq!(v1.unit_property(&d1, &CgroupValue::CpusetCpus("1".into()), "0-3"), None);
    // v2: the weight in the node's formula, the quota with cpu.max's other half.
    let (t, v2) = v2_tree();
    let d2 = t.path().join("pod");
    assert_eq!(v2.unit_property(&d2, &CgroupValue::CpuShares(512), "100"), Some(P::CpuWeight(59)));
    assert_eq!(
        v2.unit_property(&d2, &CgroupValue::CfsQuota(100_000), "max 50000"),
        Some(P::CpuQuota { quota_us: Some(100_000), period_us: 50_000 })
    );
    assert_eq!(
        v2.unit_property(&d2, &CgroupValue::CfsPeriod(200_000), "30000 100000"),
        Some(P::CpuQuota { quota_us: Some(30_000), period_us: 200_000 })
    );
    assert_eq!(v2.unit_property(&d2, &CgroupValue::MemoryLimit(-1), "1024"), Some(P::MemoryMax(None)));
    assert_eq!(
        v2.unit_property(&d2, &CgroupValue::CpusetCpus("0-1,3".into()), ""),
        Some(P::AllowedCpus([0, 1, 3].into()))
    );
    assert_eq!(v2.unit_property(&d2, &CgroupValue::CpuIdle(1), "0"), None, "systemd has no cpu.idle property");
    // Without a bus nothing is sent and the files are still written.
    assert!(!v2.sets_unit_properties());
    assert_eq!(
        v2.apply("/pod", &CgroupValue::MemoryLimit(64 << 20)).unwrap(),
        Written::Corrected(Drift {
            path: t.path().join("pod/memory.max"),
            old: "max".into(),
            new: (64 << 20).to_string()
        })
    );
}
