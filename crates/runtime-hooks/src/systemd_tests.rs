use super::*;

fn set(cpus: &[u32]) -> BTreeSet<u32> {
    cpus.iter().copied().collect()
}

#[test]
fn cpu_mask_is_little_endian_bytes() {
    assert_eq!(cpu_mask(&set(&[0, 1, 2, 9])), Some(vec![0x07, 0x02]));
    assert_eq!(cpu_mask(&set(&[])), Some(vec![]));
    assert_eq!(cpu_mask(&set(&[7])), Some(vec![0x80]));
    assert_eq!(cpu_mask(&set(&[8])), Some(vec![0x00, 0x01]));
    assert_eq!(cpu_mask(&set(&[2, 3, 64])), Some(vec![0x0c, 0, 0, 0, 0, 0, 0, 0, 0x01]));
    let last = cpu_mask(&set(&[CPU_LIMIT - 1])).unwrap();
    assert_eq!((last.len(), last[last.len() - 1]), (1024, 0x80));
    assert_eq!(cpu_mask(&set(&[0, CPU_LIMIT])), None);
    assert_eq!(cpu_mask(&set(&[u32::MAX])), None);
}

#[test]
fn cpu_mask_reads_back_as_systemd_reads_it() {
    // cpu_set_from_dbus: bit (cpu % 8) of byte (cpu / 8).
    let cpus = set(&[0, 3, 4, 15, 16, 63, 100, 8191]);
    let mask = cpu_mask(&cpus).unwrap();
    let back: BTreeSet<u32> =
        (0..mask.len() as u32 * 8).filter(|c| mask[*c as usize / 8] & (1 << (c % 8)) != 0).collect();
    assert_eq!(back, cpus);
}

#[test]
fn quota_per_sec_is_quota_times_a_million_over_period() {
    assert_eq!(cpu_quota_per_sec(Some(50_000), 100_000), Some(500_000));
    assert_eq!(cpu_quota_per_sec(Some(12_500), 100_000), Some(125_000));
    assert_eq!(cpu_quota_per_sec(Some(10_001), 30_000), Some(333_366)); // truncated
    assert_eq!(cpu_quota_per_sec(Some(400_000), 1_000_000), Some(400_000));
    assert_eq!(cpu_quota_per_sec(None, 100_000), Some(INFINITY));
    assert_eq!(cpu_quota_per_sec(Some(u64::MAX), 1_000), Some(INFINITY - 1), "never infinity by overflow");
    assert_eq!(cpu_quota_per_sec(Some(0), 100_000), None);
    assert_eq!(cpu_quota_per_sec(Some(1), 0), None);
    assert_eq!(cpu_quota_per_sec(Some(1), 999), None);
    assert_eq!(cpu_quota_per_sec(Some(1), 1_000_001), None);
    assert_eq!(cpu_quota_per_sec(None, 0), None);
}

#[test]
fn systemd_writes_cpu_max_by_its_rules() {
    let max = |q, p| CpuMax { quota_us: Some(q), period_us: p };
    // the usual case: the same quota and period
    assert_eq!(cpu_max_applied(Some(50_000), 100_000), Some(max(50_000, 100_000)));
    assert_eq!(cpu_max_applied(Some(12_500), 100_000), Some(max(12_500, 100_000)));
    // truncation of quota × 1e6 / period, then × period / 1e6
    assert_eq!(cpu_max_applied(Some(10_001), 30_000), Some(max(10_000, 30_000)));
    // a quota under 1 ms per period: the period is lengthened (1 ms × 1 s / per_sec) …
    assert_eq!(cpu_max_applied(Some(500), 100_000), Some(max(1_000, 200_000)));
    // … up to 1 s, and the quota is at least 1 ms
    assert_eq!(cpu_max_applied(Some(1), 1_000_000), Some(max(1_000, 1_000_000)));
    // unlimited: the default period, whatever was set
    assert_eq!(cpu_max_applied(None, 50_000), Some(CpuMax { quota_us: None, period_us: 100_000 }));
    assert_eq!(cpu_max_applied(Some(0), 100_000), None);
}

#[test]
fn daemon_reload_rounds_the_quota_down_to_whole_percent() {
    let max = |q, p| CpuMax { quota_us: Some(q), period_us: p };
    // 12.5 % → CPUQuota=12% → 12 000 µs per 100 ms
    assert_eq!(cpu_max_after_reload(Some(12_500), 100_000), Some(max(12_000, 100_000)));
    assert!(!quota_survives_reload(12_500, 100_000));
    // whole percent survives
    assert_eq!(cpu_max_after_reload(Some(250_000), 100_000), Some(max(250_000, 100_000)));
    assert!(quota_survives_reload(250_000, 100_000));
    assert!(quota_survives_reload(1_000, 100_000)); // 1 %
    assert!(quota_survives_reload(20_000, 1_000_000)); // 2 % at 1 s
    assert!(quota_survives_reload(3_000, 50_000)); // 6 % at 50 ms
                                                   // 0.9 % → CPUQuota=0%, which the reload ignores
    assert_eq!(cpu_max_after_reload(Some(900), 100_000), None);
    assert!(!quota_survives_reload(900, 100_000));
    // 1 % at 10 ms is 100 µs per period: systemd lengthens the period to 100 ms
    assert_eq!(cpu_max_after_reload(Some(100), 10_000), Some(max(1_000, 100_000)));
    assert!(!quota_survives_reload(100, 10_000));
    // a period that does not divide a second: 3 % of 30 ms is 900 µs: lengthened
    assert!(!quota_survives_reload(900, 30_000));
    assert!(quota_survives_reload(3_000, 30_000)); // 10 %
                                                   // unlimited stays unlimited, at the default period
    assert_eq!(cpu_max_after_reload(None, 100_000), Some(CpuMax { quota_us: None, period_us: 100_000 }));
    assert_eq!(cpu_max_after_reload(Some(1_000), 0), None);
    assert!(!quota_survives_reload(0, 100_000));
    assert!(!quota_survives_reload(u64::MAX, 1_000));
}

#[test]
fn survives_reload_means_applied_is_exact_too() {
    for period in [1_000, 10_000, 30_000, 50_000, 100_000, 333_333, 1_000_000] {
        for quota in (1..=4_000_000).step_by(997) {
            if quota_survives_reload(quota, period) {
                assert_eq!(
                    cpu_max_applied(Some(quota), period),
                    Some(CpuMax { quota_us: Some(quota), period_us: period })
                );
            }
        }
    }
}

#[test]
fn stable_quota_rounds_up_to_a_quota_that_survives() {
    assert_eq!(stable_quota(12_500, 100_000), Some(13_000));
    assert_eq!(stable_quota(13_000, 100_000), Some(13_000));
    assert_eq!(stable_quota(1, 100_000), Some(1_000)); // 1 %, and 1 ms
    assert_eq!(stable_quota(1, 10_000), Some(1_000)); // 10 %: 1 ms per 10 ms
    assert_eq!(stable_quota(1, 1_000), Some(1_000)); // a whole CPU at 1 ms
    assert_eq!(stable_quota(10_001, 30_000), Some(10_200)); // 34 % of 30 ms
    assert_eq!(stable_quota(1, 333_333), Some(333_333)); // 100 %: the first whole µs
    assert_eq!(stable_quota(0, 100_000), None);
    assert_eq!(stable_quota(1_000, 0), None);
    assert_eq!(stable_quota(u64::MAX, 1_000), None);
    // minimal and surviving, brute force
    for period in [1_000, 7_000, 10_000, 30_000, 100_000, 123_457, 1_000_000] {
        for quota in (1..=2_000_000).step_by(1_013) {
            let stable = stable_quota(quota, period).unwrap();
            assert!(stable >= quota && quota_survives_reload(stable, period), "{quota}/{period} → {stable}");
            assert!((quota..stable)
                .step_by(1 + (stable - quota) as usize / 50)
                .all(|q| !quota_survives_reload(q, period)));
        }
    }
}

#[test]
fn unit_of_a_cgroup_directory() {
    let unit = |p: &str| unit_of(Path::new(p));
    assert_eq!(
        unit("/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice").as_deref(),
        Some("kubepods-besteffort-pod1.slice")
    );
    assert_eq!(
        unit("/kubepods.slice/kubepods-pod2.slice/cri-containerd-0123abcd.scope").as_deref(),
        Some("cri-containerd-0123abcd.scope")
    );
    assert_eq!(unit("/sys/fs/cgroup/cpu/kubepods.slice/").as_deref(), Some("kubepods.slice"));
    assert_eq!(unit("kubepods-burstable-pod3_4.slice").as_deref(), Some("kubepods-burstable-pod3_4.slice"));
    // cgroupfs driver, the root, no name before the suffix, other characters
    assert_eq!(unit("/kubepods/besteffort/pod1"), None);
    assert_eq!(unit("/kubepods/besteffort/pod1/0123abcd"), None);
    assert_eq!(unit("/"), None);
    assert_eq!(unit(""), None);
    assert_eq!(unit("/a/.slice"), None);
    assert_eq!(unit("/a/b.service"), None);
    assert_eq!(unit("/a/b c.slice"), None);
    assert_eq!(unit("/a/b.slice/.."), None);
    assert_eq!(unit(&format!("/{}.slice", "a".repeat(250))), None);
    use std::os::unix::ffi::OsStrExt;
    assert_eq!(unit_of(Path::new(std::ffi::OsStr::from_bytes(b"/a/\xff.slice"))), None);
}

#[test]
fn unit_names() {
    assert!(unit_name_valid("kubepods.slice"));
    assert!(unit_name_valid("a@b.service"));
    assert!(unit_name_valid(&format!("{}.slice", "a".repeat(249))));
    assert!(!unit_name_valid(&format!("{}.slice", "a".repeat(250))));
    for bad in ["", "slice", ".slice", "a.", "a b.slice", "a/b.slice", "a\0.slice", "é.slice", "a\n.slice"] {
        assert!(!unit_name_valid(bad), "{bad:?}");
    }
}

#[test]
fn properties_encode_to_systemds_names_and_types() {
    let wire = encode(
        "x.slice",
        &[
            UnitProperty::CpuWeight(39),
            UnitProperty::CpuShares(1024),
            UnitProperty::CpuQuota { quota_us: Some(25_000), period_us: 100_000 },
            UnitProperty::MemoryMax(Some(1 << 30)),
            UnitProperty::MemoryLimit(None),
            UnitProperty::AllowedCpus(set(&[0, 1, 2, 9])),
        ],
    )
    .unwrap();
    let shown: Vec<_> = wire.iter().map(|(n, v)| format!("{n} {} {v}", v.signature())).collect();
    assert_eq!(
        shown,
        [
            "CPUWeight t 39",
            "CPUShares t 1024",
            "CPUQuotaPerSecUSec t 250000",
            "CPUQuotaPeriodUSec t 100000",
            "MemoryMax t 1073741824",
            "MemoryLimit t infinity",
            "AllowedCPUs ay [0x07 0x02]",
        ]
    );
    let unlimited = encode(
        "x.slice",
        &[UnitProperty::CpuQuota { quota_us: None, period_us: 100_000 }, UnitProperty::MemoryMax(None)],
    );
    assert_eq!(
        unlimited.unwrap(),
        [
            ("CPUQuotaPerSecUSec", DbusValue::U64(u64::MAX)),
            ("CPUQuotaPeriodUSec", DbusValue::U64(100_000)),
            ("MemoryMax", DbusValue::U64(u64::MAX))
        ]
    );
    // each name once, the last value wins
    let twice =
        encode("x.slice", &[UnitProperty::CpuWeight(1), UnitProperty::MemoryMax(Some(5)), UnitProperty::CpuWeight(2)]);
    assert_eq!(twice.unwrap(), [("CPUWeight", DbusValue::U64(2)), ("MemoryMax", DbusValue::U64(5))]);
}

#[test]
fn values_systemd_refuses_are_refused_before_sending() {
    let refused = |p: UnitProperty| match encode("x.slice", std::slice::from_ref(&p)) {
        Err(SystemdError::Invalid { unit, reason }) => {
            assert_eq!(unit, "x.slice");
            reason
        }
        other => panic!("{p:?}: {other:?}"),
    };
    for p in [
        UnitProperty::CpuWeight(0),
        UnitProperty::CpuWeight(10_001),
        UnitProperty::CpuWeight(u64::MAX),
        UnitProperty::CpuShares(1),
        UnitProperty::CpuShares(262_145),
        UnitProperty::CpuQuota { quota_us: Some(0), period_us: 100_000 },
        UnitProperty::CpuQuota { quota_us: Some(1), period_us: 0 },
        UnitProperty::CpuQuota { quota_us: None, period_us: u64::MAX },
        UnitProperty::MemoryMax(Some(0)),
        UnitProperty::MemoryLimit(Some(0)),
        UnitProperty::AllowedCpus(set(&[1, 8192])),
    ] {
        refused(p);
    }
    assert!(refused(UnitProperty::AllowedCpus(set(&[1, 9000]))).contains("9000"));
    assert!(matches!(encode("a/b", &[]), Err(SystemdError::Invalid { .. })));
    assert!(matches!(encode("", &[UnitProperty::CpuWeight(1)]), Err(SystemdError::Invalid { .. })));
}

#[test]
fn memo_sends_only_what_changed() {
    let mut memo = Memo::default();
    let w = |v| ("CPUWeight", DbusValue::U64(v));
    let m = |v| ("MemoryMax", DbusValue::U64(v));
    assert_eq!(memo.pending("a.slice", vec![w(1), m(2)]), [w(1), m(2)]);
    memo.record("a.slice", vec![w(1), m(2)]);
    assert_eq!(memo.pending("a.slice", vec![w(1), m(2)]), []);
    assert_eq!(memo.pending("a.slice", vec![w(1), m(3)]), [m(3)]);
    assert_eq!(memo.pending("b.slice", vec![w(1)]), [w(1)], "per unit");
    memo.record("a.slice", vec![m(3)]);
    assert_eq!(memo.pending("a.slice", vec![w(1), m(3)]), []);
    memo.forget_names("a.slice", &["MemoryMax"]);
    assert_eq!(memo.pending("a.slice", vec![w(1), m(3)]), [m(3)], "only the forgotten name is sent again");
    memo.forget("a.slice");
    assert_eq!(memo.pending("a.slice", vec![w(1)]), [w(1)]);
}

#[test]
fn memo_is_bounded() {
    let mut memo = Memo::default();
    for i in 0..MEMO_MAX_UNITS {
        memo.record(&format!("u{i}.slice"), vec![("CPUWeight", DbusValue::U64(1))]);
    }
    memo.record("u0.slice", vec![("CPUWeight", DbusValue::U64(2))]);
    assert_eq!(memo.units.len(), MEMO_MAX_UNITS, "a known unit does not clear it");
    memo.record("new.slice", vec![("CPUWeight", DbusValue::U64(1))]);
    assert_eq!(memo.units.len(), 1);
}

#[test]
fn errors_name_the_unit_and_the_dbus_error() {
    let e = SystemdError::Refused {
        unit: "a.scope".into(),
        name: NO_SUCH_UNIT.into(),
        message: "Unit a.scope not found.".into(),
    };
    assert!(e.is_no_such_unit());
    assert_eq!(
        e.to_string(),
        "SetUnitProperties(a.scope): org.freedesktop.systemd1.NoSuchUnit: Unit a.scope not found."
    );
    let e = SystemdError::Timeout { unit: "a.slice".into(), timeout: Duration::from_secs(5) };
    assert!(e.is_timeout() && !e.is_no_such_unit());
    assert_eq!(e.to_string(), "SetUnitProperties(a.slice): no answer within 5000 ms");
    let e = SystemdError::Connect { unit: None, socket: "/run/x".into(), detail: "refused".into() };
    assert_eq!(e.to_string(), "connecting to the system bus at /run/x: refused");
}

/// A private `dbus-daemon` (Debian's dbus-daemon package) on a unix socket in a temp dir,
/// with a fake `org.freedesktop.systemd1` that records the calls.
mod bus {
    use std::io::BufRead as _;
    use std::process::{Child, Command, Stdio};
    use std::sync::{Arc, Mutex};

    use super::super::*;
    use zbus::zvariant::OwnedValue;

    pub struct Bus {
        child: Child,
        pub socket: PathBuf,
        _dir: Option<tempfile::TempDir>,
    }

    impl Bus {
        pub fn start() -> Bus {
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("bus");
            let mut bus = Bus::start_at(&socket);
            bus._dir = Some(dir);
            bus
        }

        /// A daemon listening on `socket` (in a directory that outlives it).
        pub fn start_at(socket: &Path) -> Bus {
            let config = socket.with_extension("conf");
            std::fs::write(
                &config,
                format!(
                    r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>custom</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
<allow user="*"/>
<allow own="*"/>
<allow send_destination="*"/>
<allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
                    socket.display()
                ),
            )
            .unwrap();
            let mut child = Command::new("dbus-daemon")
                .arg(format!("--config-file={}", config.display()))
                .args(["--nofork", "--nopidfile", "--print-address"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .expect("dbus-daemon (Debian package dbus-daemon, in scripts/lib.sh's RP_PKGS) must be installed");
            let mut address = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut address).unwrap();
            assert!(address.starts_with("unix:path="), "dbus-daemon printed {address:?}");
            Bus { child, socket: socket.to_path_buf(), _dir: None }
        }

        pub fn stop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.socket);
        }
    }

    impl Drop for Bus {
        fn drop(&mut self) {
            self.stop();
        }
    }

    /// One SetUnitProperties call as the fake received it.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Call {
        pub body_signature: String,
        pub unit: String,
        pub runtime: bool,
        /// (name, the variant's signature, the value shown)
        pub props: Vec<(String, String, String)>,
    }

    #[derive(Debug, zbus::DBusError)]
    #[zbus(prefix = "org.freedesktop.systemd1")]
    enum FakeError {
        #[zbus(error)]
        ZBus(zbus::Error),
        NoSuchUnit(String),
    }

    struct FakeManager {
        calls: Arc<Mutex<Vec<Call>>>,
    }

    #[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
    impl FakeManager {
        #[zbus(name = "SetUnitProperties")]
        async fn set_unit_properties(
            &self,
            #[zbus(header)] header: zbus::message::Header<'_>,
            name: String,
            runtime: bool,
            properties: Vec<(String, OwnedValue)>,
        ) -> Result<(), FakeError> {
            if name.starts_with("hang") {
                async_io::Timer::after(Duration::from_secs(60)).await;
            }
            let props = properties
                .into_iter()
                .map(|(n, v)| {
                    let shown = match &*v {
                        Value::U64(x) => x.to_string(),
                        Value::Array(a) => {
                            format!("{:?}", a.iter().map(|b| u8::try_from(b).unwrap_or(0)).collect::<Vec<u8>>())
                        }
                        other => format!("{other:?}"),
                    };
                    (n, v.value_signature().to_string(), shown)
                })
                .collect();
            // The header's SIGNATURE field as sent (zbus writes it without the outer parentheses
            // that zvariant's Display adds to a multi-argument body).
            let call =
                Call { body_signature: header.signature().to_string_no_parens(), unit: name.clone(), runtime, props };
            self.calls.lock().unwrap().push(call);
            if name.starts_with("gone") {
                return Err(FakeError::NoSuchUnit(format!("Unit {name} not found.")));
            }
            Ok(())
        }
    }

    /// The fake, served on `socket` until the returned connection is dropped.
    pub fn fake_systemd(socket: &Path) -> (zbus::Connection, Arc<Mutex<Vec<Call>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let manager = FakeManager { calls: calls.clone() };
        let address = zbus::Address::from(Transport::Unix(Unix::new(UnixSocket::File(socket.to_path_buf()))));
        let connection = async_io::block_on(async {
            zbus::connection::Builder::address(address)?
                .name(DESTINATION)?
                .serve_at(OBJECT_PATH, manager)?
                .build()
                .await
        })
        .expect("serving the fake systemd");
        (connection, calls)
    }
}

use bus::{fake_systemd, Bus, Call};

fn calls(c: &std::sync::Mutex<Vec<Call>>) -> Vec<Call> {
    c.lock().unwrap().clone()
}

fn prop(name: &str, sig: &str, value: &str) -> (String, String, String) {
    (name.into(), sig.into(), value.into())
}

#[test]
fn sends_set_unit_properties_as_systemd_expects() {
    let bus = Bus::start();
    let (_fake, recorded) = fake_systemd(&bus.socket);
    let systemd = Systemd::connect_at(&bus.socket).unwrap();
    let props = [
        UnitProperty::CpuWeight(39),
        UnitProperty::CpuQuota { quota_us: Some(25_000), period_us: 100_000 },
        UnitProperty::MemoryMax(Some(1 << 30)),
        UnitProperty::AllowedCpus(set(&[0, 1, 2, 9])),
    ];
    assert_eq!(systemd.set_properties("kubepods-besteffort-pod1.slice", &props), Ok(5));
    let expected = Call {
        body_signature: "sba(sv)".into(),
        unit: "kubepods-besteffort-pod1.slice".into(),
        runtime: true,
        props: vec![
            prop("CPUWeight", "t", "39"),
            prop("CPUQuotaPerSecUSec", "t", "250000"),
            prop("CPUQuotaPeriodUSec", "t", "100000"),
            prop("MemoryMax", "t", "1073741824"),
            prop("AllowedCPUs", "ay", "[7, 2]"),
        ],
    };
    assert_eq!(calls(&recorded), [expected]);

    // the memo: the same values again send nothing; a change sends only itself
    assert_eq!(systemd.set_properties("kubepods-besteffort-pod1.slice", &props), Ok(0));
    assert_eq!(calls(&recorded).len(), 1);
    let changed = [UnitProperty::CpuWeight(40), UnitProperty::CpuQuota { quota_us: None, period_us: 100_000 }];
    assert_eq!(systemd.set_properties("kubepods-besteffort-pod1.slice", &changed), Ok(2));
    let last = calls(&recorded).pop().unwrap();
    assert_eq!(
        last.props,
        [prop("CPUWeight", "t", "40"), prop("CPUQuotaPerSecUSec", "t", &u64::MAX.to_string())],
        "the period did not change"
    );
    // forget: everything again; the empty set is an empty `ay`, the v1 names
    systemd.forget("kubepods-besteffort-pod1.slice");
    assert_eq!(systemd.set_properties("kubepods-besteffort-pod1.slice", &props), Ok(5));
    let v1 = [UnitProperty::CpuShares(2), UnitProperty::MemoryLimit(None), UnitProperty::AllowedCpus(BTreeSet::new())];
    assert_eq!(systemd.set_properties("cri-containerd-abc.scope", &v1), Ok(3));
    assert_eq!(
        calls(&recorded).pop().unwrap().props,
        [prop("CPUShares", "t", "2"), prop("MemoryLimit", "t", &u64::MAX.to_string()), prop("AllowedCPUs", "ay", "[]")]
    );
    assert_eq!(calls(&recorded).len(), 4);
}

#[test]
fn no_such_unit_is_told_and_forgets_the_unit() {
    let bus = Bus::start();
    let (_fake, recorded) = fake_systemd(&bus.socket);
    let systemd = Systemd::connect_at(&bus.socket).unwrap();
    let e = systemd.set_properties("gone-1.scope", &[UnitProperty::CpuWeight(5)]).unwrap_err();
    assert!(e.is_no_such_unit(), "{e}");
    assert_eq!(e.dbus_error_name(), Some(NO_SUCH_UNIT));
    assert_eq!(
        e.to_string(),
        "SetUnitProperties(gone-1.scope): org.freedesktop.systemd1.NoSuchUnit: Unit gone-1.scope not found."
    );
    // nothing was recorded: the same call is sent again
    assert!(systemd.set_properties("gone-1.scope", &[UnitProperty::CpuWeight(5)]).unwrap_err().is_no_such_unit());
    assert_eq!(calls(&recorded).len(), 2);
    // an invalid name never reaches the bus
    assert!(matches!(
        systemd.set_properties("a b.slice", &[UnitProperty::CpuWeight(5)]),
        Err(SystemdError::Invalid { .. })
    ));
    assert_eq!(calls(&recorded).len(), 2);
}

#[test]
fn no_systemd_on_the_bus_is_a_dbus_error() {
    let bus = Bus::start();
    let systemd = Systemd::connect_at(&bus.socket).unwrap();
    let e = systemd.set_properties("a.slice", &[UnitProperty::CpuWeight(5)]).unwrap_err();
    assert_eq!(e.dbus_error_name(), Some("org.freedesktop.DBus.Error.ServiceUnknown"), "{e}");
}

#[test]
fn a_call_without_answer_times_out() {
    let bus = Bus::start();
    let (_fake, recorded) = fake_systemd(&bus.socket);
    let systemd = Systemd::connect_with(&bus.socket, Duration::from_millis(300)).unwrap();
    let started = std::time::Instant::now();
    let e = systemd.set_properties("hang.slice", &[UnitProperty::CpuWeight(5)]).unwrap_err();
    assert!(matches!(e, SystemdError::Timeout { .. }) && e.is_timeout(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(e.to_string(), "SetUnitProperties(hang.slice): no answer within 300 ms");
    assert!(calls(&recorded).is_empty());
}

#[test]
fn a_bus_that_never_answers_the_handshake_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("mute");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let started = std::time::Instant::now();
    let e = Systemd::connect_with(&socket, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(&e, SystemdError::Connect { unit: None, .. }) && e.is_timeout(), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_eq!(e.to_string(), format!("connecting to the system bus at {}: no answer within 300 ms", socket.display()));
}

#[test]
fn no_bus_is_a_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Systemd::connect_at(&dir.path().join("none")).unwrap_err();
    assert!(matches!(&e, SystemdError::Connect { .. }) && !e.is_timeout(), "{e}");
}

#[test]
fn reconnects_after_the_bus_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bus");
    let mut first = Bus::start_at(&socket);
    let (fake, _) = fake_systemd(&socket);
    let systemd = Systemd::connect_with(&socket, Duration::from_secs(2)).unwrap();
    assert_eq!(systemd.set_properties("a.slice", &[UnitProperty::CpuWeight(1)]), Ok(1));
    first.stop();
    drop(fake);
    // the bus is gone: an error, no hang, no panic
    let e = systemd.set_properties("a.slice", &[UnitProperty::CpuWeight(2)]).unwrap_err();
    assert!(matches!(e, SystemdError::Connect { unit: Some(_), .. } | SystemdError::Bus { .. }), "{e}");
    // a new bus on the same socket: the next call connects to it
    let _second = Bus::start_at(&socket);
    let (_fake, recorded) = fake_systemd(&socket);
    assert_eq!(systemd.set_properties("a.slice", &[UnitProperty::CpuWeight(2)]), Ok(1));
    assert_eq!(calls(&recorded)[0].props, [prop("CPUWeight", "t", "2")]);
}

fn call_from_async_code(systemd: &Systemd, recorded: &std::sync::Mutex<Vec<Call>>) {
    assert_eq!(systemd.set_properties("a.slice", &[UnitProperty::MemoryMax(Some(4096))]), Ok(1));
    assert!(systemd.set_properties("gone.scope", &[UnitProperty::CpuWeight(1)]).unwrap_err().is_no_such_unit());
    assert_eq!(calls(recorded).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_work_on_a_tokio_worker() {
    let bus = Bus::start();
    let (_fake, recorded) = fake_systemd(&bus.socket);
    let systemd = Systemd::connect_at(&bus.socket).unwrap();
    call_from_async_code(&systemd, &recorded);
    // and from several tasks at once
    let systemd = std::sync::Arc::new(systemd);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let s = systemd.clone();
            tokio::spawn(async move { s.set_properties(&format!("p{i}.slice"), &[UnitProperty::CpuWeight(1 + i)]) })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Ok(1));
    }
    assert_eq!(calls(&recorded).len(), 10);
}

#[tokio::test(flavor = "current_thread")]
async fn blocking_calls_work_in_a_current_thread_runtime() {
    let bus = Bus::start();
    let (_fake, recorded) = fake_systemd(&bus.socket);
    let systemd = Systemd::connect_at(&bus.socket).unwrap();
    call_from_async_code(&systemd, &recorded);
    // a timer of this runtime still runs after the blocking calls
    tokio::time::sleep(Duration::from_millis(10)).await;
}
