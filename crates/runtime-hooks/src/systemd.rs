//! systemd units' cgroup properties, through systemd's D-Bus API, so that systemd does not revert
//! the cgroup files runtime-hooks writes.
//!
//! # Why
//!
//! Under the systemd cgroup driver, pod slices (`kubepods-besteffort-pod<uid>.slice`) and
//! container scopes (`cri-containerd-<id>.scope`) are systemd units, and systemd writes a unit's
//! own properties into its cgroup files whenever it (re)applies the unit: when its cgroup is
//! realized again (a slice's first child starting), after `systemctl daemon-reload`, and right
//! when a property changes. A value that runtime-hooks only wrote to the file comes back as the
//! unit's property. The remedy kubelet and runc use: set the value as the unit's property too,
//! `org.freedesktop.systemd1.Manager.SetUnitProperties(in s name, in b runtime, in a(sv)
//! properties)` with `runtime` = true ([`Systemd::set_properties`]). systemd keeps runtime
//! properties until reboot, as drop-ins: `/run/systemd/transient/<unit>.d/50-<Name>.conf` for a
//! transient unit (kubelet's pod slices, runc's scopes; removed with the unit), otherwise
//! `/run/systemd/system.control/<unit>.d/50-<Name>.conf` (`unit_drop_in_dir`, src/core/unit.c).
//!
//! # The properties, by cgroup version (systemd 252, Debian bookworm)
//!
//! From systemd v252's `bus_cgroup_set_property` (src/core/dbus-cgroup.c) and
//! `cgroup_context_apply` (src/core/cgroup.c):
//!
//! | [`UnitProperty`] | D-Bus name (type) | systemd accepts | v2 file | v1 file |
//! |---|---|---|---|---|
//! | [`CpuWeight`](UnitProperty::CpuWeight) | `CPUWeight` (t) | 1..=10000 (also 0 = `idle`, not sent) | `cpu.weight` as is | `cpu.shares` = weight × 1024 / 100 |
//! | [`CpuShares`](UnitProperty::CpuShares) | `CPUShares` (t) | 2..=262144 | `cpu.weight` = shares × 100 / 1024 | `cpu.shares` as is |
//! | [`CpuQuota`](UnitProperty::CpuQuota) | `CPUQuotaPerSecUSec` (t), `CPUQuotaPeriodUSec` (t) | > 0; `u64::MAX` = none | `cpu.max` | `cpu.cfs_quota_us`, `cpu.cfs_period_us` |
//! | [`MemoryMax`](UnitProperty::MemoryMax) | `MemoryMax` (t) | ≥ 1; `u64::MAX` = infinity | `memory.max` | `memory.limit_in_bytes` |
//! | [`MemoryLimit`](UnitProperty::MemoryLimit) | `MemoryLimit` (t) | ≥ 1; `u64::MAX` = infinity | `memory.max` | `memory.limit_in_bytes` |
//! | [`AllowedCpus`](UnitProperty::AllowedCpus) | `AllowedCPUs` (ay) | CPUs < 8192 | `cpuset.cpus` | none (never applied) |
//!
//! So send **`CPUWeight` and `MemoryMax` on v2, `CPUShares` and `MemoryLimit` on v1**:
//!
//! * systemd's shares↔weight conversion (`cgroup_cpu_shares_to_weight`: shares × 100 / 1024,
//!   clamped to 1..=10000) is not runc's (1 + (shares − 2) × 9999 / 262142) that
//!   [`crate::cgroup`] writes, so `CPUShares` on a v2 host would come back as another
//!   `cpu.weight`; and a unit that has `CPUWeight` at all uses it, on v1 too, and ignores
//!   `CPUShares` (`cgroup_context_has_cpu_weight` is checked first on both versions).
//! * a unit with any v2 memory setting (`MemoryMax`, `MemoryHigh`, `MemorySwapMax`, `MemoryLow`,
//!   `MemoryMin`) ignores `MemoryLimit` on both versions (`unit_has_unified_memory_config`);
//!   kubelet's libcontainer sets `MemoryLimit` on v1 and `MemoryMax` on v2.
//! * `CPUShares` and `MemoryLimit` are deprecated since v252 (systemd.resource-control(5),
//!   "History": the legacy hierarchy's options are "fully deprecated") but still accepted and
//!   applied by v252 (and by v256-rc4, read in its dbus-cgroup.c).
//! * `AllowedCPUs` is applied on the unified hierarchy only (systemd.resource-control(5): "This
//!   setting is supported only with the unified control group hierarchy"): `CGROUP_MASK_V1`
//!   (src/basic/cgroup-util.h) has no cpuset, so on v1 and hybrid hosts systemd stores the
//!   property and never writes `cpuset.cpus` — nor does it revert that file there. On v2 it is
//!   applied when the kernel's root `cgroup.controllers` lists `cpuset`
//!   (`cg_mask_supported_subtree`); the property then puts `cpuset` in the unit's own mask, so
//!   systemd itself enables the controller (`+cpuset` in `cgroup.subtree_control`) in every
//!   ancestor slice as it realizes the unit (`unit_realize_cgroup_now_enable`,
//!   `unit_get_enable_mask`), and keeps it enabled while a unit needs it. Without `cpuset` in
//!   the root's `cgroup.controllers` the property is stored, silently unused.
//! * An empty `AllowedCPUs` (`ay` of length 0) resets it: `cpu_set_from_dbus` makes an empty
//!   set, the drop-in gets `AllowedCPUs=`, and `cpuset.cpus` is written empty (= inherit) where
//!   systemd still writes it.
//!
//! # systemd rewrites every controller of the unit
//!
//! Whenever systemd re-applies a unit — a property set through D-Bus included
//! (`unit_invalidate_cgroup`, then `bus_slice_commit_properties`/`bus_scope_commit_properties` →
//! `unit_realize_cgroup`) — `unit_update_cgroup` calls `cgroup_context_apply` with the unit's
//! whole target mask (the controllers the unit, its children or its siblings use) and writes
//! every file of those controllers from the unit's properties, or systemd's defaults where it
//! has none: v2 `cpu.weight`, `cpu.idle` (0 unless `CPUWeight=idle`) and `cpu.max`; v1
//! `cpu.shares`, `cpu.cfs_period_us`, `cpu.cfs_quota_us`; v2 `memory.min`, `.low`, `.high`,
//! `.max`, `.swap.max`, `.oom.group`; v1 `memory.limit_in_bytes`; v2 `cpuset.cpus` and
//! `cpuset.mems`. Hence every value runtime-hooks manages on a unit must be one of its properties
//! (a value only in the file is overwritten at the unit's next change, runtime-hooks' own
//! `SetUnitProperties` included), and the files are best written after the call. A `cpu.idle`
//! written by runtime-hooks (CoreSched's [`crate::cgroup::CgroupValue::CpuIdle`]) has no property
//! here and goes back to 0 whenever systemd re-applies that unit.
//!
//! # CPU quota: systemd's units and rounding
//!
//! systemd keeps a quota as µs of CPU time per second of wall time (`CPUQuotaPerSecUSec`) and a
//! period; [`UnitProperty::CpuQuota`] sends `quota_us × 1 000 000 / period_us` (truncated, as
//! kubelet's libcontainer does) and the period. From the unit, systemd writes (cgroup.c
//! `cgroup_apply_unified_cpu_quota`, `cgroup_cpu_adjust_period`):
//!
//! * period' = min(max(period, 1 ms, 1 ms × 1 s / quota_per_sec), 1 s): clamped to the kernel's
//!   [1 ms, 1 s] and lengthened so that one period's quota is at least 1 ms;
//! * quota' = max(quota_per_sec × period' / 1 s, 1 ms);
//! * no quota: `max 100000` on v2 (`-1` and a 100 ms period on v1): the default period, whatever
//!   period was set.
//!
//! [`cpu_max_applied`] computes that. **daemon-reload rounds**: the runtime drop-in stores the
//! quota as `CPUQuota=<whole percent>%`, `quota_per_sec / 10000` truncated
//! (`bus_cgroup_set_property`, "config_parse_cpu_quota() requires an integer, so truncating
//! division is used on purpose here"), and `config_parse_cpu_quota` reads it back as percent ×
//! 10000. So after a reload a quota that is not a whole percent of a CPU comes back rounded
//! down, and one under 1 % is written as `CPUQuota=0%`, which the reload refuses ("Invalid CPU
//! quota '0%', ignoring"): the unit's earlier `CPUQuota=` (of its transient file, kubelet's) or
//! no quota applies instead. [`cpu_max_after_reload`] computes the cpu.max after a reload,
//! [`quota_survives_reload`] tells whether it is the one runtime-hooks writes. runc instead rounds
//! the quota **up** to whole percent, and writes that quota to the file as well
//! (opencontainers/cgroups `systemd/common.go` `addCPUQuota`), so that a reload changes nothing
//! and never lowers a parent below its children (v1 refuses a child's quota above its parent's);
//! this module sends the value it is given and leaves the choice to the caller: [`stable_quota`]
//! is runc's rounding, for the file and the property alike. The period is stored exactly
//! (`CPUQuotaPeriodSec=` with µs accuracy).
//!
//! # Units systemd does not know
//!
//! `SetUnitProperties` loads the unit first (`method_set_unit_properties`, src/core/dbus-manager.c:
//! `GENERIC_UNIT_LOAD|GENERIC_UNIT_VALIDATE_LOADED`). A scope that is not running does not load:
//! `org.freedesktop.systemd1.NoSuchUnit` ([`SystemdError::is_no_such_unit`]). A slice needs no
//! unit file (`slice_load` → `unit_load_fragment_and_dropin(u, false)`), so any slice name loads
//! as an empty slice, takes the properties as drop-ins in `/run/systemd/system.control` (kept
//! until reboot), and is realized (`bus_slice_commit_properties` → `unit_realize_cgroup`), i.e.
//! its cgroup is created. So call only for a unit whose cgroup directory exists (after writing
//! its files), and [`Systemd::forget`] a pod's units when the pod is removed.
//!
//! A property systemd does not know is `org.freedesktop.DBus.Error.PropertyReadOnly` ("Cannot set
//! property X, or unknown property."); a value out of range is `org.freedesktop.DBus.Error.InvalidArgs`.
//! systemd checks every property before it applies any (`bus_unit_set_properties` runs twice, the
//! first time without effect), so one call sets all or none. The caller must be root (else polkit:
//! `org.freedesktop.DBus.Error.AccessDenied` or `InteractiveAuthorizationRequired`).
//!
//! # Threads, timeouts, reconnection
//!
//! [`Systemd`] is synchronous: each call blocks the calling thread until systemd answers or the
//! timeout ([`DEFAULT_TIMEOUT`], 5 s) passes. It runs on zbus's async API with zbus's own executor
//! thread (the `async-io` backend), driven by `async_io::block_on`, so it needs no tokio runtime
//! and neither panics nor deadlocks on a tokio worker thread or inside a current-thread runtime
//! (tested below); it does hold that thread while it waits, so async code should call it through
//! `spawn_blocking`. A connection found closed, or failing with a transport error, is replaced by
//! a new one and the call sent once more (setting properties twice is harmless); a timeout drops
//! the connection, and the next call connects anew.
//!
//! # Memo
//!
//! The reconciler passes over every pod every few seconds; [`Systemd`] remembers what it set on
//! each unit (after systemd accepted it) and sends only the properties whose values differ. A
//! unit's memo goes with [`Systemd::forget`] (a pod removed, or its file found changed by someone
//! else, e.g. kubelet updating the same unit: then forget and send again), with a
//! `NoSuchUnit` answer, and all at once when it exceeds [`MEMO_MAX_UNITS`] units.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use zbus::address::transport::{Transport, Unix, UnixSocket};
use zbus::zvariant::Value;

/// The system bus's socket (`DBUS_SYSTEM_BUS_DEFAULT_ADDRESS`, `unix:path=/run/dbus/system_bus_socket`).
pub const SYSTEM_BUS_SOCKET: &str = "/run/dbus/system_bus_socket";

/// How long one connection attempt or one call may take before it fails ([`SystemdError::Timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// CPUs systemd accepts in `AllowedCPUs`: below 8192 (`cpu_set_add`, src/shared/cpu-set-util.c;
/// `CONFIG_NR_CPUS` can be 8192 on PowerPC).
pub const CPU_LIMIT: u32 = 8192;

/// Units the memo holds at most; past that it is cleared (a leak of units never forgotten must
/// not grow without bound), and the next pass sends their properties again.
pub const MEMO_MAX_UNITS: usize = 65_536;

/// systemd's "no value" for `t` properties: `USEC_INFINITY`, `CGROUP_LIMIT_MAX` (`u64::MAX`).
pub const INFINITY: u64 = u64::MAX;

const DESTINATION: &str = "org.freedesktop.systemd1";
const OBJECT_PATH: &str = "/org/freedesktop/systemd1";
const INTERFACE: &str = "org.freedesktop.systemd1.Manager";
const METHOD: &str = "SetUnitProperties";
/// The D-Bus error systemd answers for a unit that cannot be loaded (`BUS_ERROR_NO_SUCH_UNIT`).
pub const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

const USEC_PER_SEC: u64 = 1_000_000;
const USEC_PER_MSEC: u64 = 1_000;
/// systemd's period when none is set, and always for an unlimited quota (`CGROUP_CPU_QUOTA_DEFAULT_PERIOD_USEC`).
const DEFAULT_PERIOD_US: u64 = 100_000;
/// `CPUQuota=` is stored in whole percent: 1 % of a CPU is 10 000 µs per second.
const USEC_PER_SEC_PER_PERCENT: u64 = 10_000;

/// One cgroup value to set as a systemd unit's property (see the module's table for which to
/// send on which cgroup version).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum UnitProperty {
    /// cgroup v2 `cpu.weight`, 1..=10000 → `CPUWeight` (t). Out of range: [`SystemdError::Invalid`].
    CpuWeight(u64),
    /// cgroup v1 `cpu.shares`, 2..=262144 → `CPUShares` (t). Out of range: [`SystemdError::Invalid`].
    CpuShares(u64),
    /// CFS bandwidth: `quota_us` µs of CPU time per `period_us` µs (None = unlimited) →
    /// `CPUQuotaPerSecUSec` (t) = quota_us × 1 000 000 / period_us truncated, [`INFINITY`] when
    /// unlimited; and `CPUQuotaPeriodUSec` (t) = period_us. `period_us` must be 1000..=1000000 (the
    /// kernel's range) and `quota_us` not 0 (systemd refuses a zero quota; unlimited is None),
    /// else [`SystemdError::Invalid`]. See the module docs for what systemd writes from it and
    /// how a daemon-reload rounds it.
    CpuQuota {
        /// Quota in µs per period; None = unlimited.
        quota_us: Option<u64>,
        /// Period in µs.
        period_us: u64,
    },
    /// cgroup v2 `memory.max` in bytes (None = unlimited) → `MemoryMax` (t; [`INFINITY`] when
    /// unlimited). Some(0): [`SystemdError::Invalid`] (systemd wants ≥ 1).
    MemoryMax(Option<u64>),
    /// cgroup v1 `memory.limit_in_bytes` in bytes (None = unlimited) → `MemoryLimit` (t;
    /// [`INFINITY`] when unlimited). Some(0): [`SystemdError::Invalid`].
    MemoryLimit(Option<u64>),
    /// cgroup v2 `cpuset.cpus` → `AllowedCPUs` (ay), the bitmask of [`cpu_mask`]; the empty set
    /// resets the property (the parent's CPUs). A CPU ≥ [`CPU_LIMIT`]: [`SystemdError::Invalid`].
    /// [`crate::cgroup::parse_cpu_list`] turns a `cpuset.cpus` list into the set.
    AllowedCpus(BTreeSet<u32>),
}

/// A property's value on the wire: D-Bus `t` or `ay`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DbusValue {
    /// `t`: an unsigned 64-bit integer.
    U64(u64),
    /// `ay`: an array of bytes.
    Bytes(Vec<u8>),
}

impl DbusValue {
    /// The D-Bus signature of the value: `t` or `ay`.
    pub fn signature(&self) -> &'static str {
        match self {
            DbusValue::U64(_) => "t",
            DbusValue::Bytes(_) => "ay",
        }
    }

    fn to_value(&self) -> Value<'static> {
        match self {
            DbusValue::U64(v) => Value::U64(*v),
            DbusValue::Bytes(b) => Value::from(b.clone()),
        }
    }
}

impl fmt::Display for DbusValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbusValue::U64(INFINITY) => f.write_str("infinity"),
            DbusValue::U64(v) => write!(f, "{v}"),
            DbusValue::Bytes(b) => {
                f.write_str("[")?;
                for (i, byte) in b.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{byte:#04x}")?;
                }
                f.write_str("]")
            }
        }
    }
}

impl UnitProperty {
    /// The D-Bus properties (name, value) this value is sent as, in order: one, or two for
    /// [`UnitProperty::CpuQuota`].
    ///
    /// Errors: a value systemd or the kernel would refuse (see each variant), as a sentence.
    pub fn dbus(&self) -> Result<Vec<(&'static str, DbusValue)>, String> {
        let one = |name, v| Ok(vec![(name, DbusValue::U64(v))]);
        match self {
            UnitProperty::CpuWeight(w @ 1..=10_000) => one("CPUWeight", *w),
            UnitProperty::CpuWeight(w) => Err(format!("CPUWeight {w} is out of range 1..=10000")),
            UnitProperty::CpuShares(s @ 2..=262_144) => one("CPUShares", *s),
            UnitProperty::CpuShares(s) => Err(format!("CPUShares {s} is out of range 2..=262144")),
            UnitProperty::CpuQuota { quota_us, period_us } => {
                let Some(per_sec) = cpu_quota_per_sec(*quota_us, *period_us) else {
                    return Err(match quota_us {
                        Some(0) => "a CPU quota of 0 µs (systemd refuses it; unlimited is None)".to_owned(),
                        _ => format!("a CPU quota period of {period_us} µs (the kernel's range is 1000..=1000000)"),
                    });
                };
                Ok(vec![
                    ("CPUQuotaPerSecUSec", DbusValue::U64(per_sec)),
                    ("CPUQuotaPeriodUSec", DbusValue::U64(*period_us)),
                ])
            }
            UnitProperty::MemoryMax(Some(0)) => Err("MemoryMax 0 (systemd wants at least 1 byte)".to_owned()),
            UnitProperty::MemoryMax(v) => one("MemoryMax", v.unwrap_or(INFINITY)),
            UnitProperty::MemoryLimit(Some(0)) => Err("MemoryLimit 0 (systemd wants at least 1 byte)".to_owned()),
            UnitProperty::MemoryLimit(v) => one("MemoryLimit", v.unwrap_or(INFINITY)),
            UnitProperty::AllowedCpus(cpus) => match cpu_mask(cpus) {
                Some(mask) => Ok(vec![("AllowedCPUs", DbusValue::Bytes(mask))]),
                None => Err(format!(
                    "AllowedCPUs with CPU {} (systemd takes CPUs below {CPU_LIMIT})",
                    cpus.last().copied().unwrap_or(0)
                )),
            },
        }
    }
}

/// The `AllowedCPUs` bitmask of a CPU set, as systemd's `cpu_set_from_dbus` reads it (and
/// `cpu_set_to_dbus` writes it, src/shared/cpu-set-util.c): CPU n is bit n % 8 of byte n / 8,
/// as many bytes as the highest CPU needs; the empty set is the empty array. E.g. {0, 1, 2, 9}
/// → `[0x07, 0x02]`.
///
/// None when a CPU is ≥ [`CPU_LIMIT`] (systemd answers `ERANGE`).
pub fn cpu_mask(cpus: &BTreeSet<u32>) -> Option<Vec<u8>> {
    let Some(&last) = cpus.last() else { return Some(Vec::new()) };
    if last >= CPU_LIMIT {
        return None;
    }
    let mut mask = vec![0u8; last as usize / 8 + 1];
    for &cpu in cpus {
        mask[cpu as usize / 8] |= 1 << (cpu % 8);
    }
    Some(mask)
}

/// `CPUQuotaPerSecUSec` for a quota of `quota_us` µs per `period_us` µs: quota_us × 1 000 000 /
/// period_us, truncated (kubelet's libcontainer does the same), at most `u64::MAX − 1`; [`INFINITY`]
/// for None (unlimited).
///
/// None for a period outside 1000..=1000000 µs or a quota of 0.
pub fn cpu_quota_per_sec(quota_us: Option<u64>, period_us: u64) -> Option<u64> {
    if !(USEC_PER_MSEC..=USEC_PER_SEC).contains(&period_us) {
        return None;
    }
    match quota_us {
        None => Some(INFINITY),
        Some(0) => None,
        Some(q) => {
            let per_sec = u128::from(q) * u128::from(USEC_PER_SEC) / u128::from(period_us);
            Some(u64::try_from(per_sec).unwrap_or(INFINITY).min(INFINITY - 1))
        }
    }
}

/// A CFS bandwidth limit as systemd writes it: v2 `cpu.max` = "`quota_us` `period_us`" (`max`
/// when None); v1 `cpu.cfs_quota_us` (−1 when None) and `cpu.cfs_period_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuMax {
    /// Quota in µs per period; None = unlimited (`max`, −1).
    pub quota_us: Option<u64>,
    /// Period in µs.
    pub period_us: u64,
}

/// What systemd writes to `cpu.max` (or v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`) for a
/// unit whose `CPUQuotaPerSecUSec` is `per_sec` ([`INFINITY`]: none) and `CPUQuotaPeriodUSec` is
/// `period_us` (systemd v252 `cgroup_apply_unified_cpu_quota`, `cgroup_apply_legacy_cpu_quota`,
/// `cgroup_cpu_adjust_period_and_log`): without a quota, `max` with the default 100 ms period; with
/// one, the period clamped to [1 ms, 1 s] and lengthened to at least 1 ms × 1 s / per_sec, and the
/// quota per_sec × period / 1 s, at least 1 ms. A per_sec of 0 (which systemd refuses) is taken as none.
fn systemd_cpu_max(per_sec: u64, period_us: u64) -> CpuMax {
    if per_sec == INFINITY || per_sec == 0 {
        return CpuMax { quota_us: None, period_us: DEFAULT_PERIOD_US };
    }
    let period = period_us.max(USEC_PER_MSEC).max(USEC_PER_MSEC * USEC_PER_SEC / per_sec).min(USEC_PER_SEC);
    let quota = u128::from(per_sec) * u128::from(period) / u128::from(USEC_PER_SEC);
    let quota = u64::try_from(quota).unwrap_or(u64::MAX).max(USEC_PER_MSEC);
    CpuMax { quota_us: Some(quota), period_us: period }
}

/// The CFS limit systemd writes when it re-applies a unit after [`UnitProperty::CpuQuota`] {
/// `quota_us`, `period_us` } was set on it, until the next daemon-reload (the module's "CPU
/// quota" section). Equal to (`quota_us`, `period_us`) when the period divides a second (e.g. 100 ms)
/// and the quota is at least 1 ms; with other periods the truncations of quota × 1 000 000 /
/// period and back may lose 1 µs; a quota under 1 ms gets a longer period; an unlimited quota
/// gets the default 100 ms period whatever `period_us` is.
///
/// None for a value [`UnitProperty::dbus`] refuses.
pub fn cpu_max_applied(quota_us: Option<u64>, period_us: u64) -> Option<CpuMax> {
    Some(systemd_cpu_max(cpu_quota_per_sec(quota_us, period_us)?, period_us))
}

/// The CFS limit systemd writes after a daemon-reload for a unit whose runtime drop-in came
/// from [`UnitProperty::CpuQuota`] { `quota_us`, `period_us` }: the drop-in keeps the quota in
/// whole percent of a CPU, rounded down (`CPUQuota=%0.f%%` of per_sec / 10000), and the period
/// exactly.
///
/// None when the reload drops the quota: under 1 % of a CPU (`CPUQuota=0%`, refused by
/// `config_parse_cpu_quota`; the unit's earlier `CPUQuota=` or none applies), or a value
/// [`UnitProperty::dbus`] refuses. `Some(CpuMax { quota_us: None, .. })` for an unlimited quota.
pub fn cpu_max_after_reload(quota_us: Option<u64>, period_us: u64) -> Option<CpuMax> {
    let per_sec = cpu_quota_per_sec(quota_us, period_us)?;
    if per_sec == INFINITY {
        return Some(systemd_cpu_max(INFINITY, period_us));
    }
    let percent = per_sec / USEC_PER_SEC_PER_PERCENT;
    if percent == 0 {
        return None;
    }
    Some(systemd_cpu_max(percent * USEC_PER_SEC_PER_PERCENT, period_us))
}

/// True when, after a daemon-reload, systemd writes back exactly `quota_us` per `period_us`
/// ([`cpu_max_after_reload`]): the quota is a whole percent of a CPU (quota_us × 100 a multiple
/// of period_us, e.g. any multiple of 1000 µs at the 100 ms period) and at least 1 ms and 1 %.
/// Such a quota is also what systemd writes before a reload ([`cpu_max_applied`]).
pub fn quota_survives_reload(quota_us: u64, period_us: u64) -> bool {
    cpu_max_after_reload(Some(quota_us), period_us) == Some(CpuMax { quota_us: Some(quota_us), period_us })
}

/// The smallest quota ≥ `quota_us` per `period_us` that survives a daemon-reload
/// ([`quota_survives_reload`]): a whole percent of a CPU, at least 1 ms. Writing this quota to
/// the file and sending it as [`UnitProperty::CpuQuota`] leaves systemd nothing to change, before
/// or after a reload — what runc does (opencontainers/cgroups `systemd/common.go` `addCPUQuota`
/// rounds `CPUQuotaPerSecUSec` up to the next 10 000 and writes the quota that gives to cgroupfs
/// too). E.g. 12 500 µs per 100 ms (12.5 %) → 13 000.
///
/// None for a period outside 1000..=1000000 µs, a quota of 0, or a quota too large to round.
pub fn stable_quota(quota_us: u64, period_us: u64) -> Option<u64> {
    cpu_quota_per_sec(Some(quota_us), period_us)?;
    let (q, p) = (u128::from(quota_us), u128::from(period_us));
    // whole percent k: k × period / 100 µs per period; at least the quota, and at least 1 ms
    let first = (q * 100).div_ceil(p).max(100_000u128.div_ceil(p));
    // k × period must be a multiple of 100 for the quota to be whole µs: within 100 steps
    (first..first + 100)
        .filter(|k| k * p % 100 == 0)
        .filter_map(|k| u64::try_from(k * p / 100).ok())
        .find(|&quota| quota_survives_reload(quota, period_us))
}

/// The systemd unit owning a cgroup directory: its last component when that is a slice or scope
/// unit's name (`…/kubepods-besteffort-pod<uid>.slice` → `kubepods-besteffort-pod<uid>.slice`,
/// `…/cri-containerd-<id>.scope`). None for a cgroupfs-driver directory (`/kubepods/besteffort/pod<uid>`),
/// the root, or a last component that is not a valid unit name ([`unit_name_valid`]).
pub fn unit_of(dir: &Path) -> Option<String> {
    let name = dir.file_name()?.to_str()?;
    let stem = name.strip_suffix(".slice").or_else(|| name.strip_suffix(".scope"))?;
    (!stem.is_empty() && unit_name_valid(name)).then(|| name.to_owned())
}

/// A unit name systemd would take (`unit_name_is_valid`, src/basic/unit-name.c, without the
/// template rules): 1..=255 bytes of ASCII letters, digits and `:-_.\@`, with a non-empty name
/// before the last `.` and a non-empty type suffix after it.
pub fn unit_name_valid(name: &str) -> bool {
    let valid_chars = name.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b));
    let suffixed = matches!(name.rsplit_once('.'), Some((stem, suffix)) if !stem.is_empty() && !suffix.is_empty());
    (1..256).contains(&name.len()) && valid_chars && suffixed
}

/// What failed in a [`Systemd`] call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SystemdError {
    /// A unit name or value refused before anything was sent (no valid unit name, a value out of
    /// systemd's range: see [`UnitProperty`]).
    #[error("systemd unit {unit:?}: {reason}")]
    Invalid {
        /// The unit name as given.
        unit: String,
        /// Why, as a sentence.
        reason: String,
    },
    /// No connection to the bus: the socket missing or refusing, the handshake failing, or no
    /// answer within the timeout.
    #[error("{}connecting to the system bus at {}: {detail}", .unit.as_ref().map(|u| format!("SetUnitProperties({u}): ")).unwrap_or_default(), .socket.display())]
    Connect {
        /// The unit of the call that needed the connection; None when connecting up front.
        unit: Option<String>,
        /// The bus socket.
        socket: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// systemd (or the bus) answered the call with a D-Bus error: e.g. [`NO_SUCH_UNIT`],
    /// `org.freedesktop.DBus.Error.InvalidArgs`, `…PropertyReadOnly` (an unknown property),
    /// `…AccessDenied`, `…ServiceUnknown` (no systemd on the bus).
    #[error("SetUnitProperties({unit}): {name}: {message}")]
    Refused {
        /// The unit.
        unit: String,
        /// The D-Bus error name.
        name: String,
        /// The error's message (empty when it had none).
        message: String,
    },
    /// No answer within the timeout; the connection was dropped (the next call connects anew).
    #[error("SetUnitProperties({unit}): no answer within {} ms", .timeout.as_millis())]
    Timeout {
        /// The unit.
        unit: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection failed during the call, twice (the second time on a new connection).
    #[error("SetUnitProperties({unit}): {detail}")]
    Bus {
        /// The unit.
        unit: String,
        /// What went wrong.
        detail: String,
    },
}

impl SystemdError {
    /// True for systemd's [`NO_SUCH_UNIT`] answer: the unit is not loaded (a scope that is not
    /// running; for a slice systemd does not answer this, see the module docs).
    pub fn is_no_such_unit(&self) -> bool {
        matches!(self, SystemdError::Refused { name, .. } if name == NO_SUCH_UNIT)
    }

    /// True when the bus or systemd did not answer in time ([`SystemdError::Timeout`], or a
    /// [`SystemdError::Connect`] that timed out).
    pub fn is_timeout(&self) -> bool {
        match self {
            SystemdError::Timeout { .. } => true,
            SystemdError::Connect { detail, .. } => detail.starts_with(NO_ANSWER),
            _ => false,
        }
    }

    /// The D-Bus error name of a [`SystemdError::Refused`].
    pub fn dbus_error_name(&self) -> Option<&str> {
        match self {
            SystemdError::Refused { name, .. } => Some(name),
            _ => None,
        }
    }
}

const NO_ANSWER: &str = "no answer within";

/// A connection to systemd's D-Bus API on the system bus, setting units' cgroup properties
/// ([`Systemd::set_properties`]) with a memo of what it set (the module docs).
///
/// Shared between threads (`&self` methods); the connection is made up front
/// ([`Systemd::connect`]) and again whenever it was lost.
pub struct Systemd {
    socket: PathBuf,
    timeout: Duration,
    connection: Mutex<Option<zbus::Connection>>,
    memo: Mutex<Memo>,
}

impl fmt::Debug for Systemd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Systemd").field("socket", &self.socket).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

impl Systemd {
    /// Connects to the system bus ([`SYSTEM_BUS_SOCKET`]) with the [`DEFAULT_TIMEOUT`].
    ///
    /// Errors: [`SystemdError::Connect`] (no bus: the socket missing, e.g. a node without D-Bus;
    /// no answer within the timeout).
    pub fn connect() -> Result<Self, SystemdError> {
        Self::connect_at(Path::new(SYSTEM_BUS_SOCKET))
    }

    /// Connects to the bus listening on the unix socket `socket` (a test's private bus) with the
    /// [`DEFAULT_TIMEOUT`]. Errors: as [`Systemd::connect`].
    pub fn connect_at(socket: &Path) -> Result<Self, SystemdError> {
        Self::connect_with(socket, DEFAULT_TIMEOUT)
    }

    /// Connects to the bus on `socket`; each later connection attempt and each call may take
    /// `timeout` at most. Errors: as [`Systemd::connect`].
    pub fn connect_with(socket: &Path, timeout: Duration) -> Result<Self, SystemdError> {
        let systemd = Systemd {
            socket: socket.to_path_buf(),
            timeout,
            connection: Mutex::new(None),
            memo: Mutex::new(Memo::default()),
        };
        let connection = systemd.open(None)?;
        *lock(&systemd.connection) = Some(connection);
        Ok(systemd)
    }

    /// The bus socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sets `props` on the unit `unit` (e.g. from [`unit_of`]) as runtime properties (until
    /// reboot): one `SetUnitProperties(unit, true, a(sv))` call with the properties whose values
    /// differ from what this process last set on the unit (the memo), each name once (the last
    /// value given wins). Returns how many D-Bus properties were sent: 0 when all were set
    /// already (no call). Blocks the calling thread until systemd answers, up to the timeout.
    ///
    /// Errors, each naming the unit: [`SystemdError::Invalid`] (the unit name or a value, before
    /// anything is sent); [`SystemdError::Connect`]; [`SystemdError::Refused`] with systemd's
    /// D-Bus error ([`SystemdError::is_no_such_unit`]: the unit's memo is forgotten);
    /// [`SystemdError::Timeout`]; [`SystemdError::Bus`]. The memo changes only on success.
    pub fn set_properties(&self, unit: &str, props: &[UnitProperty]) -> Result<usize, SystemdError> {
        let wire = encode(unit, props)?;
        let pending = lock(&self.memo).pending(unit, wire);
        if pending.is_empty() {
            return Ok(0);
        }
        self.call(unit, &pending)?;
        tracing::debug!(
            unit,
            properties = %pending.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(" "),
            "systemd: unit properties set"
        );
        let sent = pending.len();
        lock(&self.memo).record(unit, pending);
        Ok(sent)
    }

    /// Forgets what was set on `unit` (its pod removed, or its values changed by someone else):
    /// the next [`Systemd::set_properties`] for it sends every property.
    pub fn forget(&self, unit: &str) {
        lock(&self.memo).forget(unit);
    }

    /// Forgets what was set on `unit` for the D-Bus properties of `props` only (their file found
    /// changed: the next [`Systemd::set_properties`] sends them again, and only them).
    pub fn forget_properties(&self, unit: &str, props: &[UnitProperty]) {
        let names: Vec<&'static str> =
            props.iter().filter_map(|p| p.dbus().ok()).flatten().map(|(name, _)| name).collect();
        lock(&self.memo).forget_names(unit, &names);
    }

    /// Forgets what was set on every unit.
    pub fn forget_all(&self) {
        lock(&self.memo).units.clear();
    }

    fn call(&self, unit: &str, props: &[(&'static str, DbusValue)]) -> Result<(), SystemdError> {
        let body = (unit, true, props.iter().map(|(name, v)| (*name, v.to_value())).collect::<Vec<_>>());
        let mut last_error = String::new();
        for _attempt in 0..2 {
            let connection = self.connection(unit)?;
            let call = connection.call_method(Some(DESTINATION), OBJECT_PATH, Some(INTERFACE), METHOD, &body);
            match within(self.timeout, call) {
                None => {
                    self.disconnect();
                    return Err(SystemdError::Timeout { unit: unit.to_owned(), timeout: self.timeout });
                }
                Some(Ok(_)) => return Ok(()),
                Some(Err(zbus::Error::MethodError(name, message, _))) => {
                    let error = SystemdError::Refused {
                        unit: unit.to_owned(),
                        name: name.to_string(),
                        message: message.unwrap_or_default(),
                    };
                    if error.is_no_such_unit() {
                        self.forget(unit);
                    }
                    return Err(error);
                }
                Some(Err(e)) => {
                    // The connection broke (or the message could not be sent): once more on a
                    // new one; setting the same properties twice is harmless.
                    self.disconnect();
                    last_error = e.to_string();
                }
            }
        }
        Err(SystemdError::Bus { unit: unit.to_owned(), detail: last_error })
    }

    /// The connection, made anew when there is none or it was closed.
    fn connection(&self, unit: &str) -> Result<zbus::Connection, SystemdError> {
        let mut slot = lock(&self.connection);
        if let Some(c) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        *slot = None;
        let connection = self.open(Some(unit))?;
        *slot = Some(connection.clone());
        Ok(connection)
    }

    fn disconnect(&self) {
        lock(&self.connection).take();
    }

    fn open(&self, unit: Option<&str>) -> Result<zbus::Connection, SystemdError> {
        let address = zbus::Address::from(Transport::Unix(Unix::new(UnixSocket::File(self.socket.clone()))));
        let connect = async move { zbus::connection::Builder::address(address)?.build().await };
        let error = |detail: String| SystemdError::Connect {
            unit: unit.map(str::to_owned),
            socket: self.socket.clone(),
            detail,
        };
        match within(self.timeout, connect) {
            Some(Ok(c)) => Ok(c),
            Some(Err(e)) => Err(error(e.to_string())),
            None => Err(error(format!("{NO_ANSWER} {} ms", self.timeout.as_millis()))),
        }
    }
}

/// Runs `future` to completion on this thread, or gives up after `timeout` (None). async-io's
/// executor: no tokio runtime needed, and none disturbed when this thread is a tokio worker.
fn within<T>(timeout: Duration, future: impl Future<Output = T>) -> Option<T> {
    async_io::block_on(futures_lite::future::or(async { Some(future.await) }, async {
        async_io::Timer::after(timeout).await;
        None
    }))
}

/// The unit name checked and the properties encoded, each D-Bus name once (the last wins).
fn encode(unit: &str, props: &[UnitProperty]) -> Result<Vec<(&'static str, DbusValue)>, SystemdError> {
    let invalid = |reason: String| SystemdError::Invalid { unit: unit.to_owned(), reason };
    if !unit_name_valid(unit) {
        return Err(invalid(
            "not a valid unit name (1..=255 bytes of letters, digits, \":-_.\\@\", with a type suffix)".to_owned(),
        ));
    }
    let mut wire: Vec<(&'static str, DbusValue)> = Vec::new();
    for prop in props {
        for (name, value) in prop.dbus().map_err(invalid)? {
            match wire.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => wire.push((name, value)),
            }
        }
    }
    Ok(wire)
}

/// What this process set on each unit: unit → D-Bus name → value.
#[derive(Debug, Default)]
struct Memo {
    units: HashMap<String, HashMap<&'static str, DbusValue>>,
}

impl Memo {
    /// The properties of `wire` whose values differ from the ones recorded for `unit`.
    fn pending(&self, unit: &str, wire: Vec<(&'static str, DbusValue)>) -> Vec<(&'static str, DbusValue)> {
        let known = self.units.get(unit);
        wire.into_iter().filter(|(name, value)| known.and_then(|k| k.get(name)) != Some(value)).collect()
    }

    fn record(&mut self, unit: &str, sent: Vec<(&'static str, DbusValue)>) {
        if !self.units.contains_key(unit) && self.units.len() >= MEMO_MAX_UNITS {
            tracing::debug!(units = self.units.len(), "systemd: the memo of unit properties is full; cleared");
            self.units.clear();
        }
        self.units.entry(unit.to_owned()).or_default().extend(sent);
    }

    fn forget(&mut self, unit: &str) {
        self.units.remove(unit);
    }

    fn forget_names(&mut self, unit: &str, names: &[&'static str]) {
        if let Some(known) = self.units.get_mut(unit) {
            known.retain(|name, _| !names.contains(name));
        }
    }
}

/// A mutex's guard, also when a thread panicked holding it (the data stays consistent: every
/// update is a single insert or replace).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
#[path = "systemd_tests.rs"]
mod tests;
