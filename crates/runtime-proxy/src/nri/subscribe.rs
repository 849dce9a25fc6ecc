//! Which NRI events the front end subscribes to: those the registered hook servers' stages need,
//! and what keeps the store bounded and a pod's required hook servers enforced — not every event
//! it can handle, since containerd waits for a subscribed plugin's answer at each (a ttrpc round
//! trip per event, hook server or not).
//!
//! | stage | events |
//! |---|---|
//! | PreRunPodSandbox | RunPodSandbox |
//! | PreCreateContainer | CreateContainer |
//! | PreStartContainer | StartContainer, PostStartContainer (its resources are sent once the container runs) |
//! | PostStartContainer | PostStartContainer |
//! | PreUpdateContainerResources | UpdateContainer |
//! | PostStopContainer | StopContainer |
//! | PostStopPodSandbox | StopPodSandbox |
//!
//! and, whatever the stages:
//!
//! * **a creation gate**: when none of RunPodSandbox, CreateContainer and StartContainer is in
//!   the set (an empty registry, or only post stages or PreUpdateContainerResources),
//!   RunPodSandbox is added: a pod whose annotation requires a hook server that is not registered
//!   ([`crate::hooks::chain`]) must be refused before any container of it runs, as in CRI mode;
//!   at RunPodSandbox the pre stage runs with no server registered for it, for that check.
//!   (NRI reads an empty mask as every event, so the set is never empty.)
//! * **RemovePodSandbox**: every set has an event that records a pod in the store (RunPodSandbox,
//!   or a container event, which records its pod too); the store forgets a pod, with its
//!   containers, there.
//! * **RemoveContainer**, when CreateContainer, StartContainer or UpdateContainer is in the set
//!   (they record the container): a crash-looping container is a new container at each restart,
//!   and the store would grow with them until the pod is removed; PreStartContainer's pending
//!   resources are dropped there too.
//!
//! Each Synchronize (at every connect) also sweeps the store down to what the runtime has.
//!
//! Where this differs from CRI mode: a pre stage no server registered for is not run at its
//! event (the event is not subscribed), so a required server that goes away after its pod was
//! created is enforced only at the events still subscribed, where CRI mode refuses every later
//! pre stage of that pod.

use nri_plugin::proto::api::Event;

use crate::hooks::registry::{Snapshot, Stage};

/// The NRI events `stage` needs: those whose call runs it.
pub fn stage_events(stage: Stage) -> &'static [Event] {
    match stage {
        Stage::PreRunPodSandbox => &[Event::RunPodSandbox],
        Stage::PreCreateContainer => &[Event::CreateContainer],
        // The resources are sent with UpdateContainers once the container runs.
        Stage::PreStartContainer => &[Event::StartContainer, Event::PostStartContainer],
        Stage::PostStartContainer => &[Event::PostStartContainer],
        Stage::PreUpdateContainerResources => &[Event::UpdateContainer],
        Stage::PostStopContainer => &[Event::StopContainer],
        Stage::PostStopPodSandbox => &[Event::StopPodSandbox],
    }
}

/// The events before any container of a pod runs, at which a pod can be refused.
const GATES: [Event; 3] = [Event::RunPodSandbox, Event::CreateContainer, Event::StartContainer];
/// The events whose call records a container in the store.
const CONTAINER_RECORDS: [Event; 3] = [Event::CreateContainer, Event::StartContainer, Event::UpdateContainer];

/// The `ConfigureResponse.events` mask for hook servers registered at `stages` (duplicates are
/// fine): the stages' events ([`stage_events`]), RunPodSandbox when no other creation gate is
/// among them, RemovePodSandbox, and RemoveContainer when a container event is subscribed (see the
/// module docs). Never 0.
pub fn events_for(stages: impl IntoIterator<Item = Stage>) -> i32 {
    let bit = |e: Event| nri_plugin::event_mask([e]);
    let mut mask = nri_plugin::event_mask(stages.into_iter().flat_map(|s| stage_events(s).iter().copied()));
    if GATES.iter().all(|&e| mask & bit(e) == 0) {
        mask |= bit(Event::RunPodSandbox);
    }
    mask |= bit(Event::RemovePodSandbox);
    if CONTAINER_RECORDS.iter().any(|&e| mask & bit(e) != 0) {
        mask |= bit(Event::RemoveContainer);
    }
    mask
}

/// The stages some hook server of `snapshot` is registered for.
pub fn registered_stages(snapshot: &Snapshot) -> impl Iterator<Item = Stage> + '_ {
    Stage::ALL.into_iter().filter(|&stage| snapshot.for_stage(stage).next().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nri_plugin::events::names;

    fn events(stages: &[Stage]) -> Vec<&'static str> {
        names(events_for(stages.iter().copied()))
    }

    /// One PreCreateContainer server: CreateContainer, and the removes that keep the store
    /// bounded; no RunPodSandbox (CreateContainer is the gate), no stop or start events.
    #[test]
    fn one_pre_create_server_needs_create_and_the_removes() {
        assert_eq!(events(&[Stage::PreCreateContainer]), ["RemovePodSandbox", "CreateContainer", "RemoveContainer"]);
    }

    #[test]
    fn each_stage_brings_its_events() {
        assert_eq!(events(&[Stage::PreRunPodSandbox]), ["RunPodSandbox", "RemovePodSandbox"]);
        assert_eq!(
            events(&[Stage::PreStartContainer]),
            ["RemovePodSandbox", "StartContainer", "PostStartContainer", "RemoveContainer"]
        );
        assert_eq!(events(&[Stage::PostStartContainer]), ["RunPodSandbox", "RemovePodSandbox", "PostStartContainer"]);
        assert_eq!(
            events(&[Stage::PreUpdateContainerResources]),
            ["RunPodSandbox", "RemovePodSandbox", "UpdateContainer", "RemoveContainer"]
        );
        assert_eq!(events(&[Stage::PostStopContainer]), ["RunPodSandbox", "RemovePodSandbox", "StopContainer"]);
        assert_eq!(events(&[Stage::PostStopPodSandbox]), ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"]);
    }

    /// An empty registry still gates pod creation (a pod may require a server that is not
    /// registered) and lets the store forget the pods it records: never 0, which NRI reads as
    /// every event.
    #[test]
    fn an_empty_registry_keeps_the_gate_and_the_pod_remove() {
        assert_eq!(events(&[]), ["RunPodSandbox", "RemovePodSandbox"]);
        assert_ne!(events_for([]), 0);
    }

    /// Every stage together is the nine events the front end handles; duplicates change nothing.
    #[test]
    fn every_stage_is_every_handled_event() {
        let all = events_for(Stage::ALL);
        assert_eq!(all, nri_plugin::event_mask(crate::nri::EVENTS));
        assert_eq!(events_for(Stage::ALL.into_iter().chain(Stage::ALL)), all);
    }

    /// Whatever the stages, the set has a gate, RemovePodSandbox, and RemoveContainer whenever a
    /// container-recording event is in it.
    #[test]
    fn every_set_keeps_the_store_bounded_and_gates_creation() {
        let bit = |e: Event| nri_plugin::event_mask([e]);
        for subset in 0u32..(1 << Stage::ALL.len()) {
            let stages: Vec<Stage> =
                Stage::ALL.iter().enumerate().filter(|(i, _)| subset & (1 << i) != 0).map(|(_, &s)| s).collect();
            let mask = events_for(stages.iter().copied());
            assert!(GATES.iter().any(|&e| mask & bit(e) != 0), "{stages:?}");
            assert_ne!(mask & bit(Event::RemovePodSandbox), 0, "{stages:?}");
            if CONTAINER_RECORDS.iter().any(|&e| mask & bit(e) != 0) {
                assert_ne!(mask & bit(Event::RemoveContainer), 0, "{stages:?}");
            }
            for stage in &stages {
                assert!(stage_events(*stage).iter().all(|&e| mask & bit(e) != 0), "{stage:?}");
            }
        }
    }
}
