//! The seven hook stages: where in a CRI call a hook server is called. Names are koord's exactly,
//! as written in registration files (`runtime-hooks`) and used in the RPC names
//! (`<Stage>Hook`).

use std::fmt;
use std::str::FromStr;

/// A hook point. Declared (and ordered) roughly in pod life-cycle order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Before RunPodSandbox is forwarded (pod level).
    PreRunPodSandbox,
    /// After StopPodSandbox returned (pod level).
    PostStopPodSandbox,
    /// Before CreateContainer is forwarded.
    PreCreateContainer,
    /// Before StartContainer is forwarded.
    PreStartContainer,
    /// After StartContainer returned.
    PostStartContainer,
    /// Before UpdateContainerResources is forwarded.
    PreUpdateContainerResources,
    /// After StopContainer returned.
    PostStopContainer,
}

impl Stage {
    /// Every stage, in declaration order.
    pub const ALL: [Stage; 7] = [
        Stage::PreRunPodSandbox,
        Stage::PostStopPodSandbox,
        Stage::PreCreateContainer,
        Stage::PreStartContainer,
        Stage::PostStartContainer,
        Stage::PreUpdateContainerResources,
        Stage::PostStopContainer,
    ];

    /// koord's name of the stage (`"PreCreateContainer"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::PreRunPodSandbox => "PreRunPodSandbox",
            Stage::PostStopPodSandbox => "PostStopPodSandbox",
            Stage::PreCreateContainer => "PreCreateContainer",
            Stage::PreStartContainer => "PreStartContainer",
            Stage::PostStartContainer => "PostStartContainer",
            Stage::PreUpdateContainerResources => "PreUpdateContainerResources",
            Stage::PostStopContainer => "PostStopContainer",
        }
    }

    /// The full gRPC path of the stage's RPC (`/runtime.v1alpha1.RuntimeHookService/<Stage>Hook`).
    pub const fn rpc_path(self) -> &'static str {
        match self {
            Stage::PreRunPodSandbox => crate::PRE_RUN_POD_SANDBOX_HOOK_PATH,
            Stage::PostStopPodSandbox => crate::POST_STOP_POD_SANDBOX_HOOK_PATH,
            Stage::PreCreateContainer => crate::PRE_CREATE_CONTAINER_HOOK_PATH,
            Stage::PreStartContainer => crate::PRE_START_CONTAINER_HOOK_PATH,
            Stage::PostStartContainer => crate::POST_START_CONTAINER_HOOK_PATH,
            Stage::PreUpdateContainerResources => crate::PRE_UPDATE_CONTAINER_RESOURCES_HOOK_PATH,
            Stage::PostStopContainer => crate::POST_STOP_CONTAINER_HOOK_PATH,
        }
    }

    /// True for the `Pre*` stages (called before the CRI call is forwarded; their failure can
    /// reject it under `Fail`), false for `Post*` (called after; errors are only logged).
    pub const fn is_pre(self) -> bool {
        matches!(
            self,
            Stage::PreRunPodSandbox
                | Stage::PreCreateContainer
                | Stage::PreStartContainer
                | Stage::PreUpdateContainerResources
        )
    }

    /// True for the two pod-level stages (they carry a `PodSandboxHookRequest`).
    pub const fn is_pod_level(self) -> bool {
        matches!(self, Stage::PreRunPodSandbox | Stage::PostStopPodSandbox)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`Stage::from_str`]: the name is not one of the seven callable stages (this includes
/// `PreRemoveRunPodSandbox`, which koordlet registers but no proxy calls).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStage(pub String);

impl fmt::Display for UnknownStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown runtime hook stage {:?}", self.0)
    }
}

impl std::error::Error for UnknownStage {}

impl FromStr for Stage {
    type Err = UnknownStage;

    /// Exact, case-sensitive match of koord's names (koord compares strings the same way).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Stage::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| UnknownStage(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_paths_and_parsing_agree() {
        for s in Stage::ALL {
            assert_eq!(s.as_str().parse::<Stage>(), Ok(s));
            assert_eq!(s.rpc_path(), format!("/runtime.v1alpha1.RuntimeHookService/{}Hook", s.as_str()));
            assert_eq!(s.is_pre(), s.as_str().starts_with("Pre"));
        }
        assert!("PreRemoveRunPodSandbox".parse::<Stage>().is_err());
        assert!("precreatecontainer".parse::<Stage>().is_err());
    }
}
