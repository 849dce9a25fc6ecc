//! Standalone mode: runtime-hooks without a proxy in the path, making the cgroups of the CRI
//! runtime's running pods what the plugins want (also run in proxy mode with
//! `--runtime-endpoint`, to re-apply rule changes).
//!
//! * [`reconciler`] — the passes: list the runtime's pods and containers, ask the plugins, write
//!   and correct their cgroup files; the runtime's cgroup driver;
//! * [`pod_spec`] — the pod spec's resources the reconciler hands the plugins where the hook
//!   path would have the request's.

pub mod pod_spec;
pub mod reconciler;
