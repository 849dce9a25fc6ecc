//! What the operator sees, the roof of the proxy: it reads the metric families
//! ([`crate::metrics`]) and the hook flow's state (registry, store, hook servers' health) and
//! writes nothing the request path reads. [`endpoint`] (the admin endpoint: `/metrics`,
//! `/healthz`, `/status`), [`health`] (the backends checked in the background; a socket that
//! never appears repeated at WARN by [`missing_socket`]), [`status`] (the view behind `/status`
//! and `runtime-proxy status`; what the next pod meets, from [`next_pod`]) and [`debug`]
//! (`/debug/store` on a listener of its own).

pub mod debug;
pub mod endpoint;
pub mod health;
pub mod missing_socket;
pub mod next_pod;
pub mod status;
