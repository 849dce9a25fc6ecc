//! The `runtime.v1alpha1` runtime hook protocol spoken between runtime-proxy and hook servers
//! (koordlet's `RuntimeHookService`).
//!
//! Empty for now: the protocol, its client and server, and the merge rules arrive with the hooks
//! issue (see `../shared/docs/koordinator.md` §2 for the wire contract).
