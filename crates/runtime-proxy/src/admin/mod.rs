//! What the operator sees: [`metrics`] (Prometheus families and the admin endpoint: `/metrics`,
//! `/healthz`, `/status`), [`health`] (the backends checked in the background; a socket that
//! never appears repeated at WARN by [`missing_socket`]), [`status`] (the view behind `/status`
//! and `runtime-proxy status`, the hook servers' health; what the next pod meets, from
//! [`next_pod`]) and [`debug`] (`/debug/store` on a listener of its own).

pub mod debug;
pub mod health;
pub mod metrics;
pub mod missing_socket;
pub mod next_pod;
pub mod status;
