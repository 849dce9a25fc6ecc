//! One NRI event as one call of the one hook flow ([`flow::Front`]): the hook request is built
//! from the event's pod and container ([`super::convert`]), the pre stage's changes become the
//! event's answer, and the store learns what the event says. Nothing is sent anywhere: the
//! "backend" of an NRI call is the runtime waiting for our answer, so [`flow::Front::send`]
//! only hands the answer back.

use std::collections::BTreeMap;

use hook_api::v1alpha1 as hook;
use nri_plugin::proto::api as nri;
use nri_plugin::Refusal;

use super::convert;
use crate::grpc::Status;
use crate::hooks::flow::{self, BeforeHooks, HookRequest};
use crate::hooks::registry::{Snapshot, Stage};
use crate::hooks::stages::{self, Method, MethodSpec};
use crate::hooks::store::{ContainerEntry, Store};
use crate::hooks::Hooks;

/// The NRI events the front end handles, each mapped onto a stage-table row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// RunPodSandbox (the sandbox exists): PreRunPodSandbox.
    RunPodSandbox,
    /// StopPodSandbox: PostStopPodSandbox.
    StopPodSandbox,
    /// RemovePodSandbox: the store forgets the pod (no stage).
    RemovePodSandbox,
    /// CreateContainer (before creation): PreCreateContainer.
    CreateContainer,
    /// StartContainer (before start): PreStartContainer.
    StartContainer,
    /// PostStartContainer: PostStartContainer.
    PostStartContainer,
    /// UpdateContainer (kubelet's UpdateContainerResources): PreUpdateContainerResources.
    UpdateContainer,
    /// StopContainer (stopped): PostStopContainer.
    StopContainer,
    /// RemoveContainer: the store forgets the container (no stage).
    RemoveContainer,
}

/// NRI's StartContainer comes before the start and PostStartContainer after it: the CRI row's
/// pre and post stage, each at its own event.
static START: MethodSpec = MethodSpec {
    method: Method::StartContainer,
    name: "StartContainer",
    pre: Some(Stage::PreStartContainer),
    post: None,
};
static POST_START: MethodSpec = MethodSpec {
    method: Method::StartContainer,
    name: "PostStartContainer",
    pre: None,
    post: Some(Stage::PostStartContainer),
};

impl Kind {
    /// The stage-table row the event runs.
    pub fn spec(self) -> &'static MethodSpec {
        match self {
            Kind::RunPodSandbox => stages::row(Method::RunPodSandbox),
            Kind::StopPodSandbox => stages::row(Method::StopPodSandbox),
            Kind::RemovePodSandbox => stages::row(Method::RemovePodSandbox),
            Kind::CreateContainer => stages::row(Method::CreateContainer),
            Kind::StartContainer => &START,
            Kind::PostStartContainer => &POST_START,
            Kind::UpdateContainer => stages::row(Method::UpdateContainerResources),
            Kind::StopContainer => stages::row(Method::StopContainer),
            Kind::RemoveContainer => stages::row(Method::RemoveContainer),
        }
    }

    /// Whether the event is about a container (else its pod).
    fn container_level(self) -> bool {
        !matches!(self, Kind::RunPodSandbox | Kind::StopPodSandbox | Kind::RemovePodSandbox)
    }
}

/// One NRI event: its kind, pod, container and (UpdateContainer) new resources.
pub struct NriCall {
    /// Which event.
    pub kind: Kind,
    /// The event's pod sandbox.
    pub pod: nri::PodSandbox,
    /// The event's container (container-level events).
    pub container: Option<nri::Container>,
    /// UpdateContainer's new resources.
    pub resources: Option<nri::LinuxResources>,
}

/// What the event answers: the CreateContainer adjustment, the UpdateContainer update of the
/// container, and updates to send with `Runtime.UpdateContainers` after answering (a
/// PreStartContainer's resources, sent once the container runs: StateChange has no answer).
#[derive(Debug, Default)]
pub struct NriAnswer {
    /// CreateContainer's adjustment.
    pub adjust: Option<nri::ContainerAdjustment>,
    /// UpdateContainer's update of the container.
    pub update: Vec<nri::ContainerUpdate>,
    /// Updates for `Runtime.UpdateContainers` once the event is answered.
    pub later: Vec<nri::ContainerUpdate>,
}

/// The loaded event: the hook request the stages run over. (The flow keeps it boxed; the
/// variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Loaded {
    /// A pod-level event: the sandbox ID, the request as NRI has it and the hooks' copy.
    Pod(String, hook::PodSandboxHookRequest, hook::PodSandboxHookRequest),
    /// A container-level event: the container ID and its entry.
    Container(String, ContainerEntry),
}

impl NriCall {
    /// `"ns/name"` or `"ns/name/container"`, for log lines.
    fn target(&self) -> String {
        match &self.container {
            Some(c) => format!("{}/{}/{}", self.pod.namespace, self.pod.name, c.name),
            None => format!("{}/{}", self.pod.namespace, self.pod.name),
        }
    }

    /// One line per call naming what NRI could not take of the hooks' answer.
    fn log_unexpressed(&self, fields: &[&str]) {
        if !fields.is_empty() {
            tracing::warn!(
                event = self.kind.spec().name,
                on = %self.target(),
                fields = %fields.join(","),
                "NRI cannot express these changes of the hooks' answer at this event; not applied"
            );
        }
    }
}

impl flow::Front for NriCall {
    type Call = Loaded;
    type Request = NriAnswer;
    type Answer = NriAnswer;
    type Error = Refusal;

    fn name(&self) -> &str {
        self.kind.spec().name
    }

    async fn load(&self, _hooks: &Hooks, _snapshot: &Snapshot) -> Result<Option<Box<Loaded>>, Refusal> {
        let loaded = match (&self.container, self.kind.container_level()) {
            (Some(c), true) => {
                let hook = convert::container_request(&self.pod, c, self.resources.as_ref());
                Loaded::Container(c.id.clone(), ContainerEntry { sandbox_id: self.pod.id.clone(), hook })
            }
            (None, true) => return Ok(None),
            (_, false) => {
                let pod = convert::pod_request(&self.pod);
                Loaded::Pod(self.pod.id.clone(), pod.clone(), pod)
            }
        };
        Ok(Some(Box::new(loaded)))
    }

    fn apply(&self, call: &Loaded, before: &BeforeHooks, mut out: NriAnswer) -> Result<NriAnswer, Refusal> {
        match (call, before) {
            (Loaded::Pod(_, _, after), BeforeHooks::Pod(before)) => {
                self.log_unexpressed(&convert::pod_changes(before, after))
            }
            (Loaded::Container(id, entry), BeforeHooks::Container(before)) => {
                let changes = convert::container_changes(before, &entry.hook, self.kind != Kind::CreateContainer);
                self.log_unexpressed(&changes.unexpressed);
                match self.kind {
                    Kind::CreateContainer => out.adjust = changes.adjustment(),
                    Kind::UpdateContainer => out.update.extend(changes.update(id)),
                    Kind::StartContainer => out.later.extend(changes.update(id)),
                    _ => {}
                }
            }
            _ => {}
        }
        Ok(out)
    }

    async fn send(&self, out: NriAnswer) -> Result<NriAnswer, Refusal> {
        Ok(out)
    }

    fn succeeded(&self, _answer: &NriAnswer) -> bool {
        true
    }

    fn commit(&self, call: &mut Loaded, _answer: &NriAnswer, store: &Store, _post: bool) {
        match (self.kind, call) {
            // The pod as the runtime has it: NRI cannot change an existing sandbox.
            (Kind::RunPodSandbox, Loaded::Pod(id, original, _)) => store.put_pod(id, original.clone()),
            (Kind::RemovePodSandbox, Loaded::Pod(id, ..)) => store.remove_pod(id),
            (Kind::CreateContainer | Kind::StartContainer | Kind::UpdateContainer, Loaded::Container(id, entry)) => {
                if !store.has_pod(&entry.sandbox_id) {
                    store.put_pod(&entry.sandbox_id, convert::pod_request(&self.pod));
                }
                store.put_container(id, entry.clone());
            }
            (Kind::RemoveContainer, Loaded::Container(id, _)) => store.remove_container(id),
            _ => {}
        }
    }

    fn refuse(&self, status: Status) -> Refusal {
        Status::new(status.code, format!("runtime-proxy: {}", status.message))
    }
}

impl flow::HookedCall for Loaded {
    fn hook_request(&mut self) -> Option<HookRequest<'_>> {
        Some(match self {
            Loaded::Pod(_, _, pod) => HookRequest::Pod(pod),
            Loaded::Container(_, entry) => HookRequest::Container(&mut entry.hook),
        })
    }

    fn pod(&self) -> Option<(&BTreeMap<String, String>, Option<&hook::PodSandboxMetadata>)> {
        Some(match self {
            Loaded::Pod(_, _, p) => (&p.labels, p.pod_meta.as_ref()),
            Loaded::Container(_, e) => (&e.hook.pod_labels, e.hook.pod_meta.as_ref()),
        })
    }
}
