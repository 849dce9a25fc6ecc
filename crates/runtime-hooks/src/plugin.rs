//! The plugin contract: a name, the stages it wants, and functions from a typed context to a
//! [`Change`].
//!
//! # What a plugin is
//!
//! A plugin is pure policy: it reads the context and the rules and says what it wants; it never
//! touches files or sockets (GroupIdentity alone reads one kernel parameter, its switch, as
//! koordlet does). The framework calls it in proxy mode (per hook call) and the
//! reconciler calls the very same functions in standalone mode, asking "what would you answer
//! for this pod at PreRunPodSandbox, for this container at PreCreateContainer".
//!
//! # Example
//!
//! ```
//! use runtime_hooks::change::{Change, Resources};
//! use runtime_hooks::context::ContainerContext;
//! use runtime_hooks::plugin::{Plugin, Stage};
//! use runtime_hooks::rules::Rules;
//!
//! /// CPU shares from a pod annotation.
//! struct Shares;
//!
//! impl Plugin for Shares {
//!     fn name(&self) -> &'static str { "Shares" }
//!     fn stages(&self) -> &'static [Stage] { &[Stage::PreCreateContainer] }
//!     fn container(&self, _: Stage, c: &ContainerContext, _: &Rules) -> anyhow::Result<Change> {
//!         let shares = c.pod.annotations.get("example/shares").map(|v| v.parse()).transpose()?;
//!         Ok(Change { resources: Resources { cpu_shares: shares, ..Default::default() }, ..Default::default() })
//!     }
//! }
//!
//! let mut c = ContainerContext::default();
//! c.pod.annotations.insert("example/shares".into(), "700".into());
//! let change = Shares.container(Stage::PreCreateContainer, &c, &Rules::default()).unwrap();
//! assert_eq!(change.resources.cpu_shares, Some(700));
//! ```

use std::str::FromStr;

use crate::cgroup::CgroupValue;
use crate::change::Change;
use crate::context::{ContainerContext, KubeQos, PodContext};
use crate::host::Host;
use crate::rules::host_app::HostApplication;
use crate::rules::Rules;

pub use hook_api::Stage;

/// What the framework does when a plugin fails (koordlet's
/// `--runtime-hooks-plugin-failure-policy`, and the `failure-policy` of the registration file).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Stop at the first failing plugin and answer the hook call with an error.
    #[value(name = "Fail")]
    Fail,
    /// Log the failure, drop that plugin's change, go on with the next plugin.
    #[default]
    #[value(name = "Ignore")]
    Ignore,
}

impl FailurePolicy {
    /// `"Fail"` or `"Ignore"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

impl FromStr for FailurePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "Fail" => Ok(FailurePolicy::Fail),
            "Ignore" => Ok(FailurePolicy::Ignore),
            _ => Err(format!("failure policy {s:?}: must be Fail or Ignore")),
        }
    }
}

/// A runtime hook plugin.
///
/// `pod` is called at the pod-level stages the plugin lists, `container` at the container-level
/// ones; the defaults ask for nothing. An `Err` is the plugin's failure (bad annotation, …),
/// handled by the [`FailurePolicy`]; it should say what input was wrong.
pub trait Plugin: Send + Sync + 'static {
    /// The plugin's name (`GroupIdentity`), used in logs, errors and `--plugins`.
    fn name(&self) -> &'static str;

    /// The stages the plugin wants; the server registers the union of its plugins' stages.
    fn stages(&self) -> &'static [Stage];

    /// The change for a pod at a pod-level stage.
    fn pod(&self, _stage: Stage, _pod: &PodContext, _rules: &Rules) -> anyhow::Result<Change> {
        Ok(Change::default())
    }

    /// The change for a container at a container-level stage.
    fn container(&self, _stage: Stage, _container: &ContainerContext, _rules: &Rules) -> anyhow::Result<Change> {
        Ok(Change::default())
    }

    /// Values for a kubelet QoS directory (`kubepods`, `kubepods/burstable`,
    /// `kubepods/besteffort`), written by the reconciler; default none.
    fn kube_qos(&self, _qos: KubeQos, _rules: &Rules) -> Vec<CgroupValue> {
        Vec::new()
    }

    /// Values for a host application's cgroup directory (the NodeSLO's `hostApplications`,
    /// koordlet's `RegisterHostAppReconciler`), written by the reconciler; default none.
    ///
    /// Errors: the application cannot get the plugin's value (e.g. CPUSet for a class other than
    /// LS, as koordlet refuses it); the reconciler logs it once.
    fn host_app(&self, _app: &HostApplication, _rules: &Rules) -> anyhow::Result<Vec<CgroupValue>> {
        Ok(Vec::new())
    }

    /// Node-level work: koordlet's rule callbacks and all-pods reconcilers (core-scheduling
    /// cookies, resctrl groups and their cleanup, tc classes, …), done through the [`Host`]'s
    /// facilities. Called with every pod the mode knows of — by the reconciler at each pass
    /// (standalone mode, proxy mode with `--runtime-endpoint`) and by NRI mode after Synchronize,
    /// a rules change, each pod's RunPodSandbox and RemovePodSandbox, and each container's
    /// PostStartContainer (when a plugin lists that stage: its processes exist). Must be idempotent;
    /// default nothing.
    ///
    /// `pods` are built on first use in a pass ([`NodePods`]): a plugin whose work under the
    /// rules and host needs no pods should return before reading them, so that a mode's events
    /// cost nothing per pod on the node.
    ///
    /// Errors: the plugin's failure (logged once per distinct message by the caller; never
    /// fails a pod).
    fn node(&self, _pods: &NodePods<'_>, _rules: &Rules, _host: &Host) -> anyhow::Result<()> {
        Ok(())
    }

    /// A pod is being removed: koordlet's `PreRemoveRunPodSandbox` stage, which no runtime proxy
    /// calls (it is not a [`Stage`]). NRI mode calls it at the RemovePodSandbox event, before
    /// forgetting the pod; in the other modes the pod's leftovers are cleaned by the next
    /// [`Plugin::node`] pass, which no longer sees it. Default nothing.
    ///
    /// Errors: the plugin's failure (logged by the caller; the pod is removed anyway).
    fn pod_removed(&self, _pod: &PodState, _rules: &Rules, _host: &Host) -> anyhow::Result<()> {
        Ok(())
    }
}

/// Every pod a mode knows of, as node-level work sees them ([`Plugin::node`]): given whole, or
/// built on first use (then once per pass, whatever the number of plugins reading it), so a
/// pass whose plugins read no pods costs nothing per pod. Derefs to `[PodState]`.
pub struct NodePods<'a> {
    given: Option<&'a [PodState]>,
    build: Option<&'a dyn Fn() -> Vec<PodState>>,
    built: std::sync::OnceLock<Vec<PodState>>,
}

impl<'a> NodePods<'a> {
    /// The pods `pods`, as they are.
    pub fn given(pods: &'a [PodState]) -> Self {
        NodePods { given: Some(pods), build: None, built: std::sync::OnceLock::new() }
    }

    /// The pods `build` returns, called the first time they are read (if ever).
    pub fn lazy(build: &'a dyn Fn() -> Vec<PodState>) -> Self {
        NodePods { given: None, build: Some(build), built: std::sync::OnceLock::new() }
    }

    /// Whether the pods were read (built) in this pass.
    pub fn were_read(&self) -> bool {
        self.given.is_some() || self.built.get().is_some()
    }
}

impl std::ops::Deref for NodePods<'_> {
    type Target = [PodState];

    fn deref(&self) -> &[PodState] {
        match (self.given, self.build) {
            (Some(pods), _) => pods,
            (None, Some(build)) => self.built.get_or_init(build),
            (None, None) => &[],
        }
    }
}

impl<'b> IntoIterator for &'b NodePods<'_> {
    type Item = &'b PodState;
    type IntoIter = std::slice::Iter<'b, PodState>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// A pod as node-level work sees it ([`Plugin::node`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodState {
    /// The pod.
    pub pod: PodContext,
    /// Its cgroup directory, in kubelet's form relative to the cgroup root (as
    /// [`crate::cgroup::CgroupFs::resolve`] gives it); `None` when the pod has none of its own
    /// (empty parent) or it is not known.
    pub cgroup_dir: Option<String>,
    /// Its created or running containers.
    pub containers: Vec<ContainerState>,
}

/// A container of a [`PodState`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerState {
    /// The container (its `pod` is the pod's context).
    pub container: ContainerContext,
    /// Its cgroup directory, as [`PodState::cgroup_dir`]; `None` when not known.
    pub cgroup_dir: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Stage::ALL {
            assert!(!s.as_str().is_empty());
        }
        assert_eq!(Stage::PreRunPodSandbox.to_string(), "PreRunPodSandbox");
        assert!(Stage::PostStopPodSandbox.is_pod_level() && !Stage::PreCreateContainer.is_pod_level());
        assert_eq!("Fail".parse::<FailurePolicy>().unwrap(), FailurePolicy::Fail);
        assert!("fail".parse::<FailurePolicy>().is_err(), "case-sensitive, as koordlet");
        assert_eq!(FailurePolicy::default(), FailurePolicy::Ignore);
    }
}
