//! NRI's lifecycle events as the plugin sees them: for each event, the call that delivers it, the
//! NRI level that call and the event's mask bit need, and which [`crate::Handler`] method takes
//! it. One table ([`EVENTS`]) for both plugins of this workspace, for the per-event calls and for
//! `StateChange` alike.
//!
//! | event | bit known since | dedicated call since | before that | handler |
//! |---|---|---|---|---|
//! | CreateContainer, UpdateContainer, StopContainer | 0.6 | 0.6 | – | `create_container`, `update_container`, `stop_container` |
//! | RunPodSandbox, StopPodSandbox, RemovePodSandbox, PostCreateContainer, StartContainer, PostStartContainer, PostUpdateContainer, RemoveContainer | 0.6 | 0.12 | `StateChange` | `event` |
//! | UpdatePodSandbox | 0.10 | 0.10 | – | `update_pod_sandbox` |
//! | PostUpdatePodSandbox | 0.10 | 0.12 | `StateChange` | `event` |
//!
//! Sources (facts, NRI's `pkg/api/api.proto`, `event.go` and `pkg/adaptation/plugin_type.go`
//! at v0.12.0/v0.12.1): a runtime refuses a plugin whose event mask has a bit it does not know
//! ("invalid plugin events: 0x…" at Configure); an NRI 0.12 runtime calls the dedicated call of
//! each event the plugin subscribed to and, when a plugin answers one with `UNIMPLEMENTED`,
//! delivers that event and every other event with a `StateChange` form over `StateChange` from
//! then on (and logs the plugin as using a deprecated interface). ValidateContainerAdjustment
//! (0.10, bit 14) is a validator's event: no plugin here subscribes to it, and it is not served.

use crate::proto::api::Event;

/// An NRI release level, `(minor, patch)` of `v0.minor.patch` (NRI has no 1.x yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Level(pub u32, pub u32);

impl Level {
    /// NRI 0.6 (containerd 1.7 up to 1.7.25): StateChange for the answer-less events.
    pub const V0_6: Level = Level(6, 0);
    /// NRI 0.10: UpdatePodSandbox, PostUpdatePodSandbox and ValidateContainerAdjustment events.
    pub const V0_10: Level = Level(10, 0);
    /// NRI 0.12: one call per event, the NRI version exchanged (containerd 2.3, 2.4).
    pub const V0_12: Level = Level(12, 0);

    /// The level of an NRI version string as runtimes send it (`v0.12.1`, `0.12.0`, `v0.12.0-rc.1`,
    /// a Go pseudo-version `v0.12.1-0.20260101…`): `None` for anything else (a runtime may send
    /// `unknown`).
    pub fn parse(version: &str) -> Option<Level> {
        let v = version.trim().trim_start_matches('v');
        let mut parts = v.split(['.', '-', '+']);
        let major: u32 = parts.next()?.parse().ok()?;
        let minor: u32 = parts.next()?.parse().ok()?;
        let patch: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        // NRI 1.x would know at least what 0.12 knows.
        Some(if major > 0 { Level(u32::MAX, 0) } else { Level(minor, patch) })
    }
}

/// The level this crate speaks, sent in `RegisterPluginRequest.nri_version` (the runtime logs it).
pub const SPOKEN: &str = "v0.12.0";

/// Which [`crate::Handler`] method takes an event, and what the call answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `Handler::create_container`; answers a `CreateContainerResponse`.
    Create,
    /// `Handler::update_container`; answers an `UpdateContainerResponse`.
    Update,
    /// `Handler::stop_container`; answers a `StopContainerResponse`.
    Stop,
    /// `Handler::update_pod_sandbox`; answers an (empty) `UpdatePodSandboxResponse`.
    UpdatePod,
    /// `Handler::event` (the event, its pod, its container); answers an empty message, from the
    /// dedicated call or from `StateChange`.
    Notice,
}

/// One lifecycle event: how it reaches the plugin.
#[derive(Clone, Copy, Debug)]
pub struct EventSpec {
    /// The event (its mask bit is `event - 1`).
    pub event: Event,
    /// Its dedicated call on the `Plugin` service (ttrpc method name).
    pub method: &'static str,
    /// The handler method.
    pub call: Call,
    /// Whether the request's field 2 is the event's container (field 1 is always its pod).
    pub container: bool,
    /// The first NRI level whose runtimes know the event's mask bit.
    pub bit_since: Level,
    /// The first NRI level whose runtimes call [`EventSpec::method`]; before it, the event comes
    /// over `StateChange` ([`Call::Notice`] only).
    pub call_since: Level,
}

impl EventSpec {
    /// Whether a runtime before [`EventSpec::call_since`] delivers the event over `StateChange`.
    pub fn has_state_change_form(&self) -> bool {
        self.call == Call::Notice
    }
}

const fn spec(
    event: Event,
    method: &'static str,
    call: Call,
    container: bool,
    bit_since: Level,
    call_since: Level,
) -> EventSpec {
    EventSpec { event, method, call, container, bit_since, call_since }
}

/// Every event the plugins here can subscribe to, in NRI's enum order.
pub const EVENTS: [EventSpec; 13] = [
    spec(Event::RunPodSandbox, "RunPodSandbox", Call::Notice, false, Level::V0_6, Level::V0_12),
    spec(Event::StopPodSandbox, "StopPodSandbox", Call::Notice, false, Level::V0_6, Level::V0_12),
    spec(Event::RemovePodSandbox, "RemovePodSandbox", Call::Notice, false, Level::V0_6, Level::V0_12),
    spec(Event::CreateContainer, "CreateContainer", Call::Create, true, Level::V0_6, Level::V0_6),
    spec(Event::PostCreateContainer, "PostCreateContainer", Call::Notice, true, Level::V0_6, Level::V0_12),
    spec(Event::StartContainer, "StartContainer", Call::Notice, true, Level::V0_6, Level::V0_12),
    spec(Event::PostStartContainer, "PostStartContainer", Call::Notice, true, Level::V0_6, Level::V0_12),
    spec(Event::UpdateContainer, "UpdateContainer", Call::Update, true, Level::V0_6, Level::V0_6),
    spec(Event::PostUpdateContainer, "PostUpdateContainer", Call::Notice, true, Level::V0_6, Level::V0_12),
    spec(Event::StopContainer, "StopContainer", Call::Stop, true, Level::V0_6, Level::V0_6),
    spec(Event::RemoveContainer, "RemoveContainer", Call::Notice, true, Level::V0_6, Level::V0_12),
    spec(Event::UpdatePodSandbox, "UpdatePodSandbox", Call::UpdatePod, false, Level::V0_10, Level::V0_10),
    spec(Event::PostUpdatePodSandbox, "PostUpdatePodSandbox", Call::Notice, false, Level::V0_10, Level::V0_12),
];

/// The table row of the dedicated call `method`, if it is one.
pub fn by_method(method: &str) -> Option<&'static EventSpec> {
    EVENTS.iter().find(|s| s.method == method)
}

/// The table row of `event`, if the plugins can subscribe to it.
pub fn by_event(event: Event) -> Option<&'static EventSpec> {
    EVENTS.iter().find(|s| s.event == event)
}

/// The runtime's NRI level as its `ConfigureRequest.nri_version` says: `None` when it sent none
/// (NRI before 0.12, which cannot say whether it is 0.6 or 0.11).
pub fn runtime_level(nri_version: &str) -> Option<Level> {
    if nri_version.trim().is_empty() {
        return None;
    }
    // A 0.12+ runtime sends the field; a value that does not parse still comes from one.
    Some(Level::parse(nri_version).unwrap_or(Level::V0_12))
}

/// The mask bits a runtime of `level` accepts (`None`: one that sent no NRI version, taken as
/// the oldest, 0.6: a bit it did not know would fail the registration).
pub fn known_mask(level: Option<Level>) -> i32 {
    let level = level.unwrap_or(Level::V0_6);
    EVENTS.iter().filter(|s| s.bit_since <= level).fold(0, |m, s| m | (1 << (s.event as i32 - 1)))
}

/// The events of `mask`, by name, for log lines.
pub fn names(mask: i32) -> Vec<&'static str> {
    EVENTS.iter().filter(|s| mask & (1 << (s.event as i32 - 1)) != 0).map(|s| s.method).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_as_runtimes_send_them() {
        assert_eq!(Level::parse("v0.12.1"), Some(Level(12, 1)));
        assert_eq!(Level::parse("0.10.0"), Some(Level(10, 0)));
        assert_eq!(Level::parse("v0.12.0-rc.1"), Some(Level(12, 0)));
        assert_eq!(Level::parse("v0.12.2-0.20260801120000-abcdef012345"), Some(Level(12, 2)));
        assert!(Level::parse("v1.0.0").unwrap() > Level::V0_12);
        assert_eq!(Level::parse("unknown"), None);
        assert_eq!(runtime_level(""), None);
        assert_eq!(runtime_level("unknown"), Some(Level::V0_12));
    }

    /// The table follows NRI's enum (each event once, in order) and its methods are unique.
    #[test]
    fn the_table_is_nris_enum() {
        let numbers: Vec<i32> = EVENTS.iter().map(|s| s.event as i32).collect();
        let mut sorted = numbers.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), EVENTS.len());
        assert!(sorted.iter().all(|n| (1..Event::ValidateContainerAdjustment as i32).contains(n)));
        for s in &EVENTS {
            assert_eq!(by_method(s.method).unwrap().event, s.event);
            assert_eq!(s.event.as_str_name().replace('_', ""), s.method.to_uppercase(), "{}", s.method);
        }
    }

    /// NRI 0.6-0.9 accept bits 0..=10 (ValidEvents of LAST = 12); 0.10+ also 11 and 12.
    #[test]
    fn the_mask_stays_within_what_the_runtime_knows() {
        assert_eq!(known_mask(None), (1 << 11) - 1);
        assert_eq!(known_mask(Some(Level(8, 0))), (1 << 11) - 1);
        assert_eq!(known_mask(Some(Level::V0_12)), (1 << 13) - 1);
        assert_eq!(names(1 | 1 << 12), ["RunPodSandbox", "PostUpdatePodSandbox"]);
    }
}
