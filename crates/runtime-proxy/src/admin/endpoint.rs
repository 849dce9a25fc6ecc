//! The admin endpoint (`--metrics-addr`, default `127.0.0.1:9318`, and the root-only `--admin-socket`;
//! both bounded as [`daemon_support::admin_http`] says): `GET /metrics` (OpenMetrics text of
//! [`crate::metrics`], the gauges read when scraped), `GET /healthz` (200 `ok`, or 503 naming each
//! backend endpoint that is down and why, from the background checks of [`crate::admin::health`]),
//! `GET /status` (JSON: an operator's view, [`crate::admin::status`]). `/debug/store` is served on
//! a listener of its own (`--debug-addr`, [`crate::admin::debug`]), so that a metrics scraper never
//! sees pod IDs; here it answers 404 saying so.

use std::sync::Arc;

use daemon_support::admin_http;
use hyper::Request;

use crate::admin::health::Health;
use crate::admin::status::{self, StatusInfo};
use crate::hooks::registry::FailurePolicy;
use crate::hooks::registry::Registry as HookRegistry;
use crate::hooks::store::Store;
use crate::metrics::{Gauges, KnownHook, Metrics};
use hook_api::Stage;

/// What the admin endpoint reads.
pub struct Admin {
    /// Every metric, rendered at `/metrics`.
    pub metrics: Arc<Metrics>,
    /// The hook registry (servers registered, files rejected).
    pub hooks: Arc<HookRegistry>,
    /// The store (its size; its IDs at `/debug/store`).
    pub store: Arc<Store>,
    /// The backends' health, checked in the background ([`Health::run`]).
    pub health: Arc<Health>,
    /// What `/status` reports beyond the above.
    pub status: StatusInfo,
}

/// Serves `/metrics`, `/healthz` and `/status` on `listener` (`--metrics-addr` or
/// `--admin-socket`, bound by [`daemon_support::admin_http`]) until the task is dropped, with
/// that module's bounds on connections, head size and time; logs where
/// (`admin endpoint listening on …`, useful with port 0; `admin socket listening on …`).
pub async fn serve_admin(listener: admin_http::Listener, admin: Arc<Admin>) {
    let what = match listener {
        admin_http::Listener::Tcp(_) => "admin endpoint",
        admin_http::Listener::Unix(_) => "admin socket",
    };
    tracing::info!("{what} listening on {}", listener.describe());
    admin_http::serve(listener, what, move |req| {
        let admin = admin.clone();
        async move { admin.answer(req).await }
    })
    .await
}

impl Admin {
    /// The gauges as their sources stand now: the registry's snapshot, the store's size, the
    /// backends' latest health checks.
    pub fn gauges(&self) -> Gauges {
        let snapshot = self.hooks.snapshot();
        let (pod_sandboxes, containers) = self.store.len();
        Gauges {
            hook_servers: snapshot.servers().len(),
            hook_config_rejected: snapshot.rejected().len(),
            hook_config_warnings: snapshot.servers().iter().filter(|s| !s.warnings.is_empty()).count(),
            pod_sandboxes,
            containers,
            backend_up: self.health.all_up(),
        }
    }

    /// Hands the registered hook servers, as the registry's snapshot calls them at each stage,
    /// to [`Metrics::known_hook_servers`], so their series exist (at 0) before their first call.
    fn known_hook_servers(&self) {
        let snapshot = self.hooks.snapshot();
        let hooks = Stage::ALL.into_iter().flat_map(|stage| {
            snapshot.for_stage(stage).map(move |server| KnownHook {
                stage: stage.as_str(),
                server: &server.name,
                refuses: server.failure_policy == FailurePolicy::Fail,
            })
        });
        self.metrics.known_hook_servers(snapshot.generation(), hooks);
    }

    async fn answer(&self, req: Request<hyper::body::Incoming>) -> admin_http::Reply {
        let reply = |status: u16, content_type: &str, body: String| admin_http::reply(status, content_type, body);
        match req.uri().path() {
            "/metrics" => {
                self.known_hook_servers();
                reply(
                    200,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    self.metrics.render(self.gauges()),
                )
            }
            "/status" => {
                let doc = status::document(&self.status, &self.metrics, &self.hooks, &self.store, &self.health).await;
                reply(200, "application/json", format!("{doc}\n"))
            }
            "/debug/store" => reply(404, "text/plain", self.status.debug.moved()),
            "/healthz" => {
                let (status, body) = self.health.healthz().await;
                reply(status, "text/plain", body)
            }
            _ => reply(404, "text/plain", "not found: try /metrics, /healthz or /status\n".into()),
        }
    }
}
