//! Proxy mode: runtime-hooks as a hook server that runtime-proxy (or koord-runtime-proxy) calls
//! before the runtime sees a CRI call.
//!
//! * [`server`] — the `runtime.v1alpha1.RuntimeHookService` handlers (the framework at each
//!   RPC's stage) and the registration file in the hook config directory;
//! * [`hook_wire`] — the gRPC service served by hand, its message limit and concurrency bound;
//! * [`hook_decode`] — the hook requests decoded in one pass, without trusting their strings to
//!   be UTF-8.

pub mod hook_decode;
pub mod hook_wire;
pub mod server;
