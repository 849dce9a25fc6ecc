//! The two hook request types (pod-level and container-level) as the dispatcher and the chain's
//! rules handle them: each with its answer type, its merge rule ([`hook_api::merge`]), the check
//! of an answer's bytes ([`crate::hooks::answer_check`]), the limits on what an answer adds and
//! its encoding.

use hook_api::merge;
use hook_api::v1alpha1::{
    ContainerResourceHookRequest, ContainerResourceHookResponse, PodSandboxHookRequest, PodSandboxHookResponse,
};

use crate::hooks::answer_check;
use crate::hooks::limits::HookLimits;

/// A hook request type (pod-level or container-level) with its answer type and merge rule.
pub trait HookMessage: prost::Message + Clone + Default + Send + Sync + 'static {
    /// The answer type of the RPCs that take this request.
    type Answer: prost::Message + Default + Send + Sync + 'static;
    /// Applies an answer to the request (the merge rules of [`hook_api::merge`]).
    fn apply(&mut self, answer: &Self::Answer);
    /// Whether [`HookMessage::apply`] of `answer` would change the request at all (exact:
    /// [`hook_api::merge::container_response_changes`]).
    fn changed_by(&self, answer: &Self::Answer) -> bool;
    /// Whether `answer` (an answer message's bytes) surely changes nothing in the request,
    /// read without decoding it ([`crate::hooks::answer_check`]); `false` when unsure (then the
    /// answer is decoded and [`HookMessage::changed_by`] decides).
    fn unchanged_by_bytes(&self, answer: &[u8]) -> bool;
    /// Checks what the answer would add to the request's maps against `limits`.
    ///
    /// Errors: the first limit exceeded (see [`HookLimits::check_map`]).
    fn check(&self, answer: &Self::Answer, limits: &HookLimits) -> Result<(), String>;
    /// Appends the request's protobuf encoding to `out` ([`hook_api::encode`]: prost's bytes).
    fn encode_into(&self, out: &mut Vec<u8>);
}

impl HookMessage for PodSandboxHookRequest {
    type Answer = PodSandboxHookResponse;
    fn apply(&mut self, answer: &PodSandboxHookResponse) {
        merge::apply_pod_response(self, answer);
    }
    fn changed_by(&self, answer: &PodSandboxHookResponse) -> bool {
        merge::pod_response_changes(self, answer)
    }
    fn unchanged_by_bytes(&self, answer: &[u8]) -> bool {
        answer_check::pod_unchanged(self, answer)
    }
    fn check(&self, answer: &PodSandboxHookResponse, limits: &HookLimits) -> Result<(), String> {
        limits.check_map("labels", &self.labels, &answer.labels)?;
        limits.check_map("annotations", &self.annotations, &answer.annotations)
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        hook_api::encode::pod_request(self, out);
    }
}

impl HookMessage for ContainerResourceHookRequest {
    type Answer = ContainerResourceHookResponse;
    fn apply(&mut self, answer: &ContainerResourceHookResponse) {
        merge::apply_container_response(self, answer);
    }
    fn changed_by(&self, answer: &ContainerResourceHookResponse) -> bool {
        merge::container_response_changes(self, answer)
    }
    fn unchanged_by_bytes(&self, answer: &[u8]) -> bool {
        answer_check::container_unchanged(self, answer)
    }
    fn check(&self, answer: &ContainerResourceHookResponse, limits: &HookLimits) -> Result<(), String> {
        limits.check_map("container_envs", &self.container_envs, &answer.container_envs)?;
        limits.check_map("container_annotations", &self.container_annotations, &answer.container_annotations)
    }
    fn encode_into(&self, out: &mut Vec<u8>) {
        hook_api::encode::container_request(self, out);
    }
}
