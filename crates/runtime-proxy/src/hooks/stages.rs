//! The stage table: every hooked call, named by its CRI RuntimeService method, with the hook stages it runs
//! (koord-runtime-proxy's `pkg/runtimeproxy/server/cri/criserver.go`, Koordinator v1.8.0). CRI mode looks its gRPC
//! paths up here ([`crate::cri::intercept::lookup`]); Docker mode maps its routes onto the same rows
//! ([`crate::docker::intercept::ROUTES`]), so both run the same stages for the same call.
//!
//! # Adding a stage
//!
//! Set it as a row's `pre` or `post`; [`crate::hooks::flow::drive`] runs it for every front
//! end that maps a call onto that row.

use crate::hooks::registry::Stage;

/// The hooked calls, by their CRI v1 RuntimeService method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `RunPodSandbox`: pre stage PreRunPodSandbox.
    RunPodSandbox,
    /// `StopPodSandbox`: post stage PostStopPodSandbox.
    StopPodSandbox,
    /// `RemovePodSandbox`: no stage.
    RemovePodSandbox,
    /// `CreateContainer`: pre stage PreCreateContainer.
    CreateContainer,
    /// `StartContainer`: pre stage PreStartContainer, post stage PostStartContainer.
    StartContainer,
    /// `StopContainer`: post stage PostStopContainer.
    StopContainer,
    /// `RemoveContainer`: no stage.
    RemoveContainer,
    /// `UpdateContainerResources`: pre stage PreUpdateContainerResources.
    UpdateContainerResources,
    /// `UpdatePodSandboxResources` (CRI v1 only, kubelet 1.33+): no stage.
    UpdatePodSandboxResources,
    /// `RestorePod` (CRI v1 only, kubelet 1.37+ alpha): no stage; it creates a pod without
    /// RunPodSandbox or CreateContainer, so CRI mode refuses it where their hooks may not be
    /// skipped ([`crate::cri::restore`]).
    RestorePod,
}

/// One row of the interception table: a CRI RuntimeService method, its name (the last part of its gRPC path) and its
/// hook stages (koord-runtime-proxy's `pkg/runtimeproxy/server/cri/criserver.go`, Koordinator v1.8.0).
#[derive(Debug)]
pub struct MethodSpec {
    /// The method this row is for.
    pub method: Method,
    /// The method's name, the last segment of its gRPC path (`RunPodSandbox`).
    pub name: &'static str,
    /// The stage run before the call goes to the runtime; its answers can change the request.
    pub pre: Option<Stage>,
    /// The stage run after the runtime carried the call out; its answers are not applied.
    pub post: Option<Stage>,
}

/// Every intercepted method. Remove* and UpdatePodSandboxResources have no stage (koord has none
/// for them); they are intercepted to keep the store exact. RestorePod has none either: it is
/// intercepted to guard the pre-create stages it would get around, and to teach the store the
/// pod it restored ([`crate::cri::restore`]).
pub const METHODS: [MethodSpec; 10] = [
    MethodSpec { method: Method::RunPodSandbox, name: "RunPodSandbox", pre: Some(Stage::PreRunPodSandbox), post: None },
    MethodSpec {
        method: Method::StopPodSandbox,
        name: "StopPodSandbox",
        pre: None,
        post: Some(Stage::PostStopPodSandbox),
    },
    MethodSpec { method: Method::RemovePodSandbox, name: "RemovePodSandbox", pre: None, post: None },
    MethodSpec {
        method: Method::CreateContainer,
        name: "CreateContainer",
        pre: Some(Stage::PreCreateContainer),
        post: None,
    },
    MethodSpec {
        method: Method::StartContainer,
        name: "StartContainer",
        pre: Some(Stage::PreStartContainer),
        post: Some(Stage::PostStartContainer),
    },
    MethodSpec {
        method: Method::StopContainer,
        name: "StopContainer",
        pre: None,
        post: Some(Stage::PostStopContainer),
    },
    MethodSpec { method: Method::RemoveContainer, name: "RemoveContainer", pre: None, post: None },
    MethodSpec {
        method: Method::UpdateContainerResources,
        name: "UpdateContainerResources",
        pre: Some(Stage::PreUpdateContainerResources),
        post: None,
    },
    MethodSpec { method: Method::UpdatePodSandboxResources, name: "UpdatePodSandboxResources", pre: None, post: None },
    MethodSpec { method: Method::RestorePod, name: "RestorePod", pre: None, post: None },
];

/// The row of `method` (every method has one).
pub fn row(method: Method) -> &'static MethodSpec {
    // METHODS lists every variant once, in declaration order, which the `rows_in_order` test checks.
    &METHODS[method as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_in_order() {
        for (i, spec) in METHODS.iter().enumerate() {
            assert_eq!(spec.method as usize, i, "{}", spec.name);
            assert_eq!(row(spec.method).name, spec.name);
        }
    }
}
