//! What every front end shares: the hook servers and the one hook flow.
//!
//! # Parts
//!
//! * [`Hooks`] — the shared state: the watched registry, the store, the dispatcher, the per-pod
//!   locks, the skip label and the limits. One value per process, whatever the front end.
//! * [`stages`] — the stage table: which hooked call runs which pre and post stage (koord-runtime-proxy's
//!   `pkg/runtimeproxy/server/cri/criserver.go`, Koordinator v1.8.0). CRI methods are its rows; Docker routes map onto
//!   the same rows.
//! * [`flow`] — the one hook flow every front end drives a call through: pod lock, load from the
//!   store, skip label, pre stage, edits, send, commit, post stage.
//! * [`answer_check`] — whether a hook server's answer changes the hook request, read from its
//!   bytes (an echo, koordlet's usual answer, is never decoded).
//! * [`changes`] — what the hooks changed in a request's maps and envs, merged as koord merges
//!   them, for every front end to write back.
//! * [`body`] — reading a request body whole, under the size and idle limits ([`limits`]).
//! * [`registry`] — the hook servers' registration files: parsed, validated, watched, served as
//!   immutable snapshots.
//! * [`dispatch`] — a stage's hook calls: ordered, chained, deadline-bound, under each server's
//!   failure policy.
//! * [`hook_health`] — each hook server's recent health (last success, last error), as the
//!   dispatcher records it and `/status` reports it.
//! * [`message`] — the pod-level and container-level hook requests: answer type, merge rule,
//!   answer check, limits, encoding.
//! * [`chain`] — the chain's rules beyond the merge: field ownership (conflicts between hook
//!   servers, `--hook-conflict-policy`) and required hook servers.
//! * [`store`] — what the proxy knows of each pod sandbox and container, the per-pod locks, and
//!   the sweep both front ends' recovery uses.
//! * [`skip_label`] — the label that exempts a pod (the hook servers' own) from every hook.
//! * [`offload`] — where a call's work runs: a call with a large request runs off the proxy's
//!   one thread, so that it holds no other pod's call up.
//!
//! # Adding a front end
//!
//! Implement [`flow::Front`] (decode and load, apply the hooks' changes, send, commit) for one
//! call of it, map its calls onto rows of [`stages::METHODS`], and hand each call to
//! [`flow::drive`].

pub mod answer_check;
pub mod body;
pub mod chain;
pub mod changes;
pub mod dispatch;
pub mod flow;
pub mod hook_health;
pub mod limits;
pub mod message;
pub mod offload;
pub mod registry;
pub mod skip_label;
pub mod stages;
pub mod store;

use std::collections::BTreeMap;
use std::sync::Arc;

use hook_api::v1alpha1 as hook;

use crate::hooks::dispatch::Dispatcher;
use crate::hooks::limits::Limits;
use crate::hooks::registry::Registry;
use crate::hooks::skip_label::SkipLabel;
use crate::hooks::store::{PodLocks, Store};
use crate::metrics::Metrics;

/// The hook state both front ends (CRI and Docker) share: built once at start
/// (`crate::run`), never copied.
pub struct Hooks {
    /// The hook servers registered in `--hook-config-dir`, kept up to date by its watcher.
    pub registry: Arc<Registry>,
    /// What the proxy knows of each pod sandbox and container (the hook requests they were
    /// created with, the hooks' changes included).
    pub store: Arc<Store>,
    /// Calls the hook servers of a stage in turn and merges their answers.
    pub dispatcher: Dispatcher,
    /// Pods whose labels hold this key and value skip every hook, in the namespaces allowed to
    /// (`--runtime-hook-server-key/-val/-namespaces`).
    pub skip_label: SkipLabel,
    /// Where undecodable requests and ignored skip labels are counted (the dispatcher records
    /// the hook calls).
    pub metrics: Arc<Metrics>,
    /// Orders calls for the same pod ([`flow`]: from the store read to the post stage).
    pub pod_locks: Arc<PodLocks>,
    /// Request size and idle bounds (and the hook answer bounds the dispatcher applies).
    pub limits: Limits,
    /// Runs calls with large requests off the proxy's thread ([`offload`]).
    pub offload: offload::Offload,
}

impl Hooks {
    /// Whether the pod (`labels`, `meta`) skips every hook (see [`SkipLabel::skips`]; `call`
    /// names the call in its log line).
    pub fn skips(
        &self,
        labels: &BTreeMap<String, String>,
        meta: Option<&hook::PodSandboxMetadata>,
        call: &str,
    ) -> bool {
        self.skip_label.skips(labels, meta, call, &self.metrics)
    }
}
