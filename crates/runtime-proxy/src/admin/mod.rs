//! What the operator sees: [`metrics`] (Prometheus families and the admin endpoint: `/metrics`,
//! `/healthz`, `/status`), [`health`] (the backends checked in the background), [`status`] (the
//! view behind `/status` and `runtime-proxy status`, the hook servers' health) and [`debug`]
//! (`/debug/store` on a listener of its own).

pub mod debug;
pub mod health;
pub mod metrics;
pub mod status;
