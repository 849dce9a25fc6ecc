//! The metric families every part of the proxy writes (the front ends, the hook flow, the
//! dispatcher, the health checks); the admin endpoint ([`crate::admin`]) reads the gauges' sources
//! and renders them.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `runtime_proxy_cri_request_duration_seconds` | histogram | `method` | CRI call latency as kubelet sees it (hooks included) |
//! | `runtime_proxy_cri_requests_total` | counter | `method`, `code` | CRI calls by final gRPC code (`OK`, `NOT_FOUND`, …) |
//! | `runtime_proxy_hook_request_duration_seconds` | histogram | `stage`, `server` | one hook server call |
//! | `runtime_proxy_hooked_call_own_duration_seconds` | histogram | `stage` | the proxy's own time for a hooked call at its pre stage: from the call's turn for its pod to sending it on, less the hook servers' round trips ([`Metrics::hooked_call_own_time`]) |
//! | `runtime_proxy_hook_requests_total` | counter | `stage`, `server`, `result` | hook calls: `ok`, `error`, `timeout` |
//! | `runtime_proxy_hook_refusals_total` | counter | `stage`, `server` | CRI calls refused because a hook server with failure policy `Fail` failed |
//! | `runtime_proxy_hook_conflicts_total` | counter | `stage`, `field` | a later hook server changed a field an earlier one of the same chain had changed ([`crate::hooks::chain`]); `field` without the map key (`container_envs`, `container_resources.cpu_shares`) |
//! | `runtime_proxy_hook_required_failures_total` | counter | `stage`, `server` | calls a required hook server failed (refused at pre stages, only counted at post stages) |
//! | `runtime_proxy_required_hook_servers_missing_total` | counter | `stage` | calls whose pod required a hook server with no registration (refused at pre stages unless tolerated) |
//! | `runtime_proxy_tolerate_missing_ignored_total` | counter | | calls of pods with the tolerate-missing annotation outside --runtime-hook-server-namespaces (not honoured) |
//! | `runtime_proxy_restore_unhooked_total` | counter | | RestorePod calls forwarded although hook servers (all `Ignore`, none required) are registered for PreRunPodSandbox or PreCreateContainer, which a restored pod skips ([`crate::cri::restore`]) |
//! | `runtime_proxy_hook_servers` | gauge | | hook servers registered |
//! | `runtime_proxy_hook_config_rejected` | gauge | | registration files currently rejected |
//! | `runtime_proxy_hook_config_warnings` | gauge | | registered files with warnings (unknown keys, a failure policy that cannot be read and is taken as Fail, unknown stages) |
//! | `runtime_proxy_store_objects` | gauge | `kind` (`pod_sandbox`, `container`) | store entries |
//! | `runtime_proxy_backend_up` | gauge | | 1 when every backend endpoint passed its latest health check ([`crate::admin::health`]) |
//! | `runtime_proxy_backend_endpoint_up` | gauge | `endpoint` (`runtime`, `image`) | 1 when that endpoint passed its latest health check |
//! | `runtime_proxy_log_lines_dropped_total` | counter | | log lines lost: stderr too slow (queue full) or broken (a closed log pipe); see [`daemon_support::log`] |
//! | `runtime_proxy_build_info` | gauge | `version`, `revision` | always 1: the version and git revision `--version` prints |
//!
//! `method` is the gRPC path for CRI services (`/runtime.v1.RuntimeService/Version`) and `other`
//! for anything else, so clients cannot blow up the label set. `server` is the registration
//! file's name. Gauges are read when scraped.
//!
//! Series that exist before their first event (at 0), so that a dashboard shows 0 rather than
//! "No data" and `increase()` sees the first event after a start (Prometheus' advice for label
//! sets known in advance): `required_hook_servers_missing_total` for every stage from the start;
//! `hook_requests_total` (each `result`) and `hook_required_failures_total` for each registered
//! server at each stage it is called at, and `hook_refusals_total` for those of them whose failure
//! policy is `Fail`, from the first scrape after the server is registered
//! ([`Metrics::known_hook_servers`]; a scrape is the first moment Prometheus could see them).
//! The CRI families are not: methods × codes would be hundreds of series that stay at 0.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::grpc::Code;

// The CRI labels are `&'static str` (method paths interned once, see [`method_label`]), so
// recording a call allocates nothing.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    stage: String,
    server: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookResultLabels {
    stage: String,
    server: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConflictLabels {
    stage: &'static str,
    field: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

/// How a hook server call ended, for `runtime_proxy_hook_requests_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HookResult {
    /// The server answered OK (`ok`).
    Ok,
    /// The call failed with any status but DEADLINE_EXCEEDED (`error`).
    Error,
    /// The call failed with DEADLINE_EXCEEDED: its deadline passed (`timeout`).
    Timeout,
}

/// 1 µs … ~16 ms, factor √2 (29 buckets): the proxy's own time for a hooked call is tens of
/// microseconds, and a factor of 2 (16–32 µs in one bucket) told a p50 of 18 µs from one of 28 µs
/// only by interpolation.
fn own_time_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000001, std::f64::consts::SQRT_2, 29))
}

/// The version `runtime_proxy_build_info` carries: the package's, as `--version` prints it.
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git revision `runtime_proxy_build_info` carries, as `--version` prints it
/// (`27cbb9f`, `27cbb9f-dirty`, `unknown`; set by `crates/git_revision.rs`).
pub const BUILD_REVISION: &str = env!("GIT_REVISION");

/// A registered hook server called at a stage: the series [`Metrics::known_hook_servers`] creates at 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownHook<'a> {
    /// The stage's name (`PreCreateContainer`).
    pub stage: &'static str,
    /// The registration file's name (`a.json`), the `server` label.
    pub server: &'a str,
    /// The server's failure policy is `Fail`: its failures refuse calls (`hook_refusals_total`).
    pub refuses: bool,
}

fn latency_histogram() -> Histogram {
    // 50 µs … ~26 s, factor 2.
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

/// The gauges' values, read from their sources when the metrics are scraped: the hook registry's
/// snapshot, the store's size, the backends' latest health checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Hook servers registered: `runtime_proxy_hook_servers`.
    pub hook_servers: usize,
    /// Registration files currently rejected: `runtime_proxy_hook_config_rejected`.
    pub hook_config_rejected: usize,
    /// Registered files with warnings: `runtime_proxy_hook_config_warnings`.
    pub hook_config_warnings: usize,
    /// Pod sandboxes in the store: `runtime_proxy_store_objects{kind="pod_sandbox"}`.
    pub pod_sandboxes: usize,
    /// Containers in the store: `runtime_proxy_store_objects{kind="container"}`.
    pub containers: usize,
    /// Every backend endpoint passed its latest health check: `runtime_proxy_backend_up`.
    pub backend_up: bool,
}

/// Every metric the proxy records.
pub struct Metrics {
    registry: Registry,
    cri_duration: Family<MethodLabels, Histogram, fn() -> Histogram>,
    cri_requests: Family<CodeLabels, Counter>,
    hook_duration: Family<HookLabels, Histogram, fn() -> Histogram>,
    hook_requests: Family<HookResultLabels, Counter>,
    hook_refusals: Family<HookLabels, Counter>,
    hook_servers: Gauge,
    hook_rejected: Gauge,
    hook_warnings: Gauge,
    store_objects: Family<KindLabels, Gauge>,
    backend_up: Gauge,
    backend_endpoint_up: Family<EndpointLabels, Gauge>,
    undecodable: Family<MethodLabels, Counter>,
    skip_label_ignored: Counter,
    log_lines_dropped: Counter,
    hook_conflicts: Family<ConflictLabels, Counter>,
    required_failures: Family<HookLabels, Counter>,
    required_missing: Family<StageLabels, Counter>,
    tolerate_missing_ignored: Counter,
    restore_unhooked: Counter,
    hooked_call_own: Family<StageLabels, Histogram, fn() -> Histogram>,
    /// The registry generation whose servers [`Metrics::known_hook_servers`] last created series for.
    known_generation: std::sync::Mutex<Option<u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All families registered, all values zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("runtime_proxy");
        let cri_duration = Family::<MethodLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let cri_requests = Family::<CodeLabels, Counter>::default();
        let hook_duration = Family::<HookLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let hook_requests = Family::<HookResultLabels, Counter>::default();
        let (hook_servers, hook_rejected, backend_up) = (Gauge::default(), Gauge::default(), Gauge::default());
        let store_objects = Family::<KindLabels, Gauge>::default();
        let (undecodable, skip_label_ignored) = (Family::<MethodLabels, Counter>::default(), Counter::default());
        registry.register_with_unit(
            "cri_request_duration",
            "CRI call latency as kubelet sees it",
            Unit::Seconds,
            cri_duration.clone(),
        );
        registry.register("cri_requests", "CRI calls by method and final gRPC code", cri_requests.clone());
        registry.register_with_unit(
            "hook_request_duration",
            "Latency of one hook server call",
            Unit::Seconds,
            hook_duration.clone(),
        );
        registry.register(
            "hook_requests",
            "Hook server calls by stage, server and result (ok, error, timeout)",
            hook_requests.clone(),
        );
        registry.register("hook_servers", "Hook servers registered", hook_servers.clone());
        registry.register("hook_config_rejected", "Registration files currently rejected", hook_rejected.clone());
        registry.register("store_objects", "Store entries by kind", store_objects.clone());
        registry.register(
            "backend_up",
            "1 when every backend endpoint passed its latest health check",
            backend_up.clone(),
        );
        let backend_endpoint_up = Family::<EndpointLabels, Gauge>::default();
        registry.register(
            "backend_endpoint_up",
            "1 when the backend endpoint (runtime, image) passed its latest health check",
            backend_endpoint_up.clone(),
        );
        registry.register(
            "undecodable_requests",
            "Intercepted CRI requests the proxy could not decode (or read only in part) and forwarded without hooks, by method",
            undecodable.clone(),
        );
        registry.register(
            "skip_label_ignored",
            "Calls of pods carrying the skip label outside --runtime-hook-server-namespaces (hooks called anyway)",
            skip_label_ignored.clone(),
        );
        let hook_warnings = Gauge::default();
        registry.register(
            "hook_config_warnings",
            "Registered hook server files with warnings: unknown keys, a failure policy that cannot be read (taken as Fail), unknown stages",
            hook_warnings.clone(),
        );
        let hook_refusals = Family::<HookLabels, Counter>::default();
        registry.register(
            "hook_refusals",
            "CRI calls refused because a hook server with failure-policy Fail failed, by stage and server",
            hook_refusals.clone(),
        );
        let log_lines_dropped = Counter::default();
        registry.register(
            "log_lines_dropped",
            "Log lines lost because stderr was too slow (queue full) or broken (a closed log pipe)",
            log_lines_dropped.clone(),
        );
        let hook_conflicts = Family::<ConflictLabels, Counter>::default();
        registry.register(
            "hook_conflicts",
            "Fields a later hook server of a chain changed after an earlier one had, by stage and field (without the map key)",
            hook_conflicts.clone(),
        );
        let required_failures = Family::<HookLabels, Counter>::default();
        registry.register(
            "hook_required_failures",
            "Calls a required hook server failed, by stage and server (refused at pre stages)",
            required_failures.clone(),
        );
        let required_missing = Family::<StageLabels, Counter>::default();
        registry.register(
            "required_hook_servers_missing",
            "Calls whose pod required a hook server with no registration, by stage",
            required_missing.clone(),
        );
        let tolerate_missing_ignored = Counter::default();
        registry.register(
            "tolerate_missing_ignored",
            "Calls of pods with the tolerate-missing-hook-servers annotation outside --runtime-hook-server-namespaces (not honoured)",
            tolerate_missing_ignored.clone(),
        );
        let restore_unhooked = Counter::default();
        registry.register(
            "restore_unhooked",
            "RestorePod calls forwarded although Ignore hook servers are registered for PreRunPodSandbox or PreCreateContainer, which a restored pod skips",
            restore_unhooked.clone(),
        );
        let hooked_call_own = Family::<StageLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            own_time_histogram as fn() -> Histogram,
        );
        registry.register_with_unit(
            "hooked_call_own_duration",
            "The proxy's own time for a hooked call at its pre stage, by stage: from the call's turn for its pod to sending it on, \
             less the hook servers' round trips",
            Unit::Seconds,
            hooked_call_own.clone(),
        );
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info.get_or_create(&BuildLabels { version: BUILD_VERSION, revision: BUILD_REVISION }).set(1);
        registry.register(
            "build_info",
            "Always 1: the version and git revision of this runtime-proxy (as --version prints them)",
            build_info,
        );
        for stage in hook_api::Stage::ALL {
            drop(required_missing.get_or_create(&StageLabels { stage: stage.as_str() }));
        }
        Metrics {
            hooked_call_own,
            known_generation: std::sync::Mutex::new(None),
            restore_unhooked,
            hook_conflicts,
            required_failures,
            required_missing,
            tolerate_missing_ignored,
            registry,
            cri_duration,
            cri_requests,
            hook_duration,
            hook_requests,
            hook_refusals,
            hook_servers,
            hook_rejected,
            hook_warnings,
            store_objects,
            backend_up,
            backend_endpoint_up,
            undecodable,
            skip_label_ignored,
            log_lines_dropped,
        }
    }

    /// Counts an intercepted request of `method` (e.g. `CreateContainer`) forwarded without its
    /// hooks because it could not be decoded: `runtime_proxy_undecodable_requests_total{method}`.
    pub fn undecodable_request(&self, method: &'static str) {
        self.undecodable.get_or_create(&MethodLabels { method }).inc();
    }

    /// Counts a call whose pod carries the skip label in a namespace that may not use it:
    /// `runtime_proxy_skip_label_ignored_total`.
    pub fn skip_label_ignored(&self) {
        self.skip_label_ignored.inc();
    }

    /// Counts a field conflict in a hook chain: `runtime_proxy_hook_conflicts_total{stage, field}`
    /// (`field` a name of [`hook_api::owners::Field`], without the key).
    pub fn hook_conflict(&self, stage: &'static str, field: &'static str) {
        self.hook_conflicts.get_or_create(&ConflictLabels { stage, field }).inc();
    }

    /// Counts a call a required hook server failed: `runtime_proxy_hook_required_failures_total{stage, server}`.
    pub fn required_failure(&self, stage: &str, server: &str) {
        self.required_failures.get_or_create(&HookLabels { stage: stage.to_owned(), server: server.to_owned() }).inc();
    }

    /// Counts a call whose pod required a hook server with no registration:
    /// `runtime_proxy_required_hook_servers_missing_total{stage}` (no server label: the names
    /// come from pod annotations).
    pub fn required_missing(&self, stage: &'static str) {
        self.required_missing.get_or_create(&StageLabels { stage }).inc();
    }

    /// Counts a call whose pod carries the tolerate-missing annotation in a namespace that may
    /// not use it: `runtime_proxy_tolerate_missing_ignored_total`.
    pub fn tolerate_missing_ignored(&self) {
        self.tolerate_missing_ignored.inc();
    }

    /// Records the proxy's own time for a hooked call at its pre `stage` (decode, store read,
    /// hook requests encoded and answers decoded and merged, the request edited):
    /// `runtime_proxy_hooked_call_own_duration_seconds{stage}`. Leaves out the wait for the
    /// call's turn (its pod's earlier calls), the hook servers' round trips and the runtime; a
    /// store miss's lookup at the runtime is in it.
    pub fn hooked_call_own_time(&self, stage: &'static str, own: Duration) {
        self.hooked_call_own.get_or_create(&StageLabels { stage }).observe(own.as_secs_f64());
    }

    /// Counts a RestorePod forwarded without the pre-create hooks of the `Ignore` hook servers
    /// registered for them: `runtime_proxy_restore_unhooked_total`.
    pub fn restore_unhooked(&self) {
        self.restore_unhooked.inc();
    }

    /// Records the latest health check of a backend endpoint (`runtime`, `image`):
    /// `runtime_proxy_backend_endpoint_up{endpoint}`.
    pub fn backend_endpoint_up(&self, endpoint: &'static str, up: bool) {
        self.backend_endpoint_up.get_or_create(&EndpointLabels { endpoint }).set(i64::from(up));
    }

    /// Records one finished CRI call.
    pub fn cri_call(&self, path: &str, code: Code, elapsed: Duration) {
        let method = method_label(path);
        self.cri_duration.get_or_create(&MethodLabels { method }).observe(elapsed.as_secs_f64());
        self.cri_requests.get_or_create(&CodeLabels { method, code: code.name() }).inc();
    }

    /// Records one finished Docker Engine API call (Docker mode) in the same families as CRI
    /// calls: `method` is the route's label (a fixed set: `docker POST /containers/create`, …,
    /// `docker other`), `code` the HTTP status (`201`, `404`).
    pub fn docker_call(&self, route: &'static str, status: u16, elapsed: Duration) {
        let method = route;
        self.cri_duration.get_or_create(&MethodLabels { method }).observe(elapsed.as_secs_f64());
        self.cri_requests.get_or_create(&CodeLabels { method, code: intern(&status.to_string()) }).inc();
    }

    /// Records one hook server call.
    pub fn hook_call(&self, stage: &str, server: &str, result: HookResult, elapsed: Duration) {
        let labels = HookLabels { stage: stage.to_owned(), server: server.to_owned() };
        self.hook_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
        let result = match result {
            HookResult::Ok => "ok",
            HookResult::Error => "error",
            HookResult::Timeout => "timeout",
        };
        self.hook_requests
            .get_or_create(&HookResultLabels { stage: labels.stage, server: labels.server, result: result.to_owned() })
            .inc();
    }

    /// Creates at 0 the series of the registered hook servers `hooks` (the registry's snapshot
    /// of `generation`) that their first event would create: `hook_requests_total` for each
    /// result, `hook_required_failures_total`, and `hook_refusals_total` when the server
    /// [`KnownHook::refuses`]. Does nothing when `generation` is the one it last saw, so it can
    /// run on every scrape. Series of servers no longer registered stay, with their counts.
    pub fn known_hook_servers<'a>(&self, generation: u64, hooks: impl IntoIterator<Item = KnownHook<'a>>) {
        let mut known = self.known_generation.lock().unwrap_or_else(|p| p.into_inner());
        if *known == Some(generation) {
            return;
        }
        for hook in hooks {
            let labels = HookLabels { stage: hook.stage.to_owned(), server: hook.server.to_owned() };
            for result in ["ok", "error", "timeout"] {
                let with_result = HookResultLabels {
                    stage: labels.stage.clone(),
                    server: labels.server.clone(),
                    result: result.to_owned(),
                };
                drop(self.hook_requests.get_or_create(&with_result));
            }
            drop(self.required_failures.get_or_create(&labels));
            if hook.refuses {
                drop(self.hook_refusals.get_or_create(&labels));
            }
        }
        *known = Some(generation);
    }

    /// Counts a CRI call refused because `server`, whose failure policy is `Fail`, failed at
    /// `stage`: `runtime_proxy_hook_refusals_total{stage, server}`.
    pub fn hook_refusal(&self, stage: &str, server: &str) {
        self.hook_refusals.get_or_create(&HookLabels { stage: stage.to_owned(), server: server.to_owned() }).inc();
    }

    /// CRI calls refused so far because `server` failed at `stage` (for `/status`).
    pub fn hook_refusals(&self, stage: &str, server: &str) -> u64 {
        self.hook_refusals
            .get(&HookLabels { stage: stage.to_owned(), server: server.to_owned() })
            .map(|c| c.get())
            .unwrap_or(0)
    }

    /// Hook calls of `server` at `stage` so far: `[ok, error, timeout]` (for `/status`).
    pub fn hook_counts(&self, stage: &str, server: &str) -> [u64; 3] {
        let count = |result: &str| {
            let labels =
                HookResultLabels { stage: stage.to_owned(), server: server.to_owned(), result: result.to_owned() };
            self.hook_requests.get(&labels).map(|c| c.get()).unwrap_or(0)
        };
        [count("ok"), count("error"), count("timeout")]
    }

    /// The OpenMetrics text of every metric, the gauges set to `gauges` (read from their
    /// sources by the caller: the admin endpoint, when scraped) and the dropped log lines read
    /// from [`daemon_support::log`].
    pub fn render(&self, gauges: Gauges) -> String {
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.hook_servers.set(as_gauge(gauges.hook_servers));
        self.hook_rejected.set(as_gauge(gauges.hook_config_rejected));
        self.hook_warnings.set(as_gauge(gauges.hook_config_warnings));
        self.store_objects
            .get_or_create(&KindLabels { kind: "pod_sandbox".into() })
            .set(as_gauge(gauges.pod_sandboxes));
        self.store_objects.get_or_create(&KindLabels { kind: "container".into() }).set(as_gauge(gauges.containers));
        self.backend_up.set(i64::from(gauges.backend_up));
        let dropped = daemon_support::log::dropped_lines();
        self.log_lines_dropped.inc_by(dropped.saturating_sub(self.log_lines_dropped.get()));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The metrics as they stand, without refreshing the gauges (unit tests).
    #[cfg(test)]
    pub(crate) fn render_for_tests(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The `method` label: the gRPC path of a CRI service method, else `other`.
///
/// Interned: each distinct path is copied once for the life of the process (the same strings
/// the metric families keep as keys anyway; at most 64 alphanumeric characters per method).
pub fn method_label(path: &str) -> &'static str {
    let known = [
        "/runtime.v1.RuntimeService/",
        "/runtime.v1.ImageService/",
        "/runtime.v1alpha2.RuntimeService/",
        "/runtime.v1alpha2.ImageService/",
    ];
    let ok = known.iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|m| !m.is_empty() && m.len() <= 64 && m.bytes().all(|b| b.is_ascii_alphanumeric()))
    });
    if ok {
        intern(path)
    } else {
        "other"
    }
}

/// Most distinct label values [`intern`] keeps; beyond, new ones are counted as `other`, so a
/// client calling ever new method names cannot grow the proxy's memory (or the metric families).
const MAX_INTERNED: usize = 512;

/// `s` as a string that lives for the rest of the process, copied (leaked) the first time only;
/// `other` once [`MAX_INTERNED`] values exist.
fn intern(s: &str) -> &'static str {
    static NAMES: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    let mut names = NAMES.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(name) = names.get(s) {
        return name;
    }
    if names.len() >= MAX_INTERNED {
        return "other";
    }
    let name: &'static str = Box::leak(s.into());
    names.insert(name);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(method_label("/runtime.v1.RuntimeService/Version"), "/runtime.v1.RuntimeService/Version");
        assert_eq!(
            method_label("/runtime.v1alpha2.ImageService/PullImage"),
            "/runtime.v1alpha2.ImageService/PullImage"
        );
        assert_eq!(method_label("/evil/x"), "other");
        assert_eq!(method_label("/runtime.v1.RuntimeService/a-b"), "other");
        assert_eq!(method_label("/runtime.v1.RuntimeService/"), "other");
    }

    #[test]
    fn renders_conventional_names() {
        let m = Metrics::new();
        m.cri_call("/runtime.v1.RuntimeService/Version", Code::OK, Duration::from_micros(120));
        m.cri_call("/runtime.v1.RuntimeService/ContainerStatus", Code::NOT_FOUND, Duration::from_micros(80));
        m.hook_call("PreCreateContainer", "a.json", HookResult::Timeout, Duration::from_millis(2));
        let text = m.render(Gauges { backend_up: true, ..Gauges::default() });
        for want in [
            "runtime_proxy_cri_request_duration_seconds_count{method=\"/runtime.v1.RuntimeService/Version\"} 1",
            "runtime_proxy_cri_requests_total{method=\"/runtime.v1.RuntimeService/ContainerStatus\",code=\"NOT_FOUND\"} 1",
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"a.json\",result=\"timeout\"} 1",
            "runtime_proxy_hook_servers 0",
            "runtime_proxy_store_objects{kind=\"container\"} 0",
            "runtime_proxy_backend_up 1",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
    }

    /// Before any call: the build info, the required-missing series of every stage, and, once
    /// the registry is handed in, the registered servers' hook series, all at 0; an `Ignore`
    /// server has no refusal series (it cannot refuse).
    #[test]
    fn known_label_sets_exist_at_zero_before_their_first_event() {
        let m = Metrics::new();
        let text = m.render(Gauges::default());
        let build = format!("runtime_proxy_build_info{{version=\"{BUILD_VERSION}\",revision=\"{BUILD_REVISION}\"}} 1");
        assert!(text.contains(&build), "{build} missing:\n{text}");
        for stage in hook_api::Stage::ALL {
            let want = format!("runtime_proxy_required_hook_servers_missing_total{{stage=\"{}\"}} 0", stage.as_str());
            assert!(text.contains(&want), "{want} missing:\n{text}");
        }
        assert!(!text.contains("runtime_proxy_hook_requests_total{"), "no server registered yet:\n{text}");

        let hooks = [
            KnownHook { stage: "PreCreateContainer", server: "fail.json", refuses: true },
            KnownHook { stage: "PreCreateContainer", server: "ignore.json", refuses: false },
        ];
        m.known_hook_servers(1, hooks);
        let text = m.render(Gauges::default());
        for want in [
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"fail.json\",result=\"ok\"} 0",
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"fail.json\",result=\"error\"} 0",
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"ignore.json\",result=\"timeout\"} 0",
            "runtime_proxy_hook_refusals_total{stage=\"PreCreateContainer\",server=\"fail.json\"} 0",
            "runtime_proxy_hook_required_failures_total{stage=\"PreCreateContainer\",server=\"ignore.json\"} 0",
        ] {
            assert!(text.contains(want), "{want} missing:\n{text}");
        }
        assert!(
            !text.contains("runtime_proxy_hook_refusals_total{stage=\"PreCreateContainer\",server=\"ignore.json\"}"),
            "{text}"
        );

        // The same generation again is not looked at; a new one is.
        m.known_hook_servers(1, [KnownHook { stage: "PreStartContainer", server: "late.json", refuses: true }]);
        assert!(!m.render(Gauges::default()).contains("server=\"late.json\""));
        m.known_hook_servers(2, [KnownHook { stage: "PreStartContainer", server: "late.json", refuses: true }]);
        let text = m.render(Gauges::default());
        assert!(
            text.contains("runtime_proxy_hook_refusals_total{stage=\"PreStartContainer\",server=\"late.json\"} 0"),
            "{text}"
        );
        assert!(text.contains("server=\"fail.json\",result=\"ok\"} 0"), "series of servers gone stay:\n{text}");
    }

    /// `deploy/grafana-dashboard.json` is JSON and queries only metrics the proxy exports (as
    /// the metrics text names them): a renamed metric fails here, not on an operator's screen.
    #[test]
    fn the_dashboard_queries_only_metrics_the_proxy_exports() {
        let dashboard = include_str!("../../../deploy/grafana-dashboard.json");
        let used = daemon_support::status::dashboard_names(dashboard, "runtime_proxy_").unwrap();
        // A family shows in the metrics text once it has a series: record one of each.
        let m = Metrics::new();
        m.cri_call("/runtime.v1.RuntimeService/Version", Code::OK, Duration::from_millis(1));
        m.hook_call("PreCreateContainer", "a.json", HookResult::Error, Duration::from_millis(1));
        m.hook_refusal("PreCreateContainer", "a.json");
        m.undecodable_request("CreateContainer");
        m.skip_label_ignored();
        m.backend_endpoint_up("runtime", true);
        m.hook_conflict("PreCreateContainer", "container_envs");
        m.required_failure("PreCreateContainer", "a.json");
        let text = m.render(Gauges { backend_up: true, ..Gauges::default() });
        let exported = daemon_support::status::exposed_names(&text);
        assert!(used.len() >= 10, "{used:?}");
        let unknown: Vec<&String> = used.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "the dashboard uses metrics runtime-proxy does not export: {unknown:?}; it exports {exported:?}"
        );
        // The hook chain's panels and the version table.
        for family in [
            "runtime_proxy_hook_refusals_total",
            "runtime_proxy_hook_required_failures_total",
            "runtime_proxy_required_hook_servers_missing_total",
            "runtime_proxy_hook_conflicts_total",
            "runtime_proxy_tolerate_missing_ignored_total",
            "runtime_proxy_restore_unhooked_total",
            "runtime_proxy_build_info",
        ] {
            assert!(used.contains(family), "the dashboard has no panel for {family}");
        }
    }
}
