//! The CRI front end: kubelet's CRI calls (gRPC over HTTP/2, CRI v1 and v1alpha2) relayed to the
//! runtime, the hooked ones run through the one hook flow ([`crate::hooks::flow`]).
//!
//! # Parts
//!
//! * [`server`] — serves each client connection with a relay.
//! * [`relay`] — each client connection relayed frame by frame over a runtime connection of its own; the calls hooks
//!   need (and those it cannot relay) taken over, with the HTTP/2 codec of [`crate::http2`] (frames as bytes, the HPACK
//!   decoder). The client and runtime sockets are [`daemon_support::uds::Socket`]s (registered for readability only).
//! * [`router`] — which calls are relayed, intercepted or sent on as unary calls; logs calls.
//! * [`intercept`] — CRI's side of the hook flow: decode, load, wire edits, send, commit.
//!   [`hooked_fields`] — the CRI messages with only the fields hooks read;
//!   [`hook_request`] — the hook requests built from them (and the store);
//!   [`proto_edit`] — edits to encoded protobuf messages that keep unknown fields;
//!   [`newer_cri`] — CRI methods newer than the compiled proto;
//!   [`restore`] — RestorePod, which creates a pod without the pre-create hooks: guarded.
//! * [`recover`] — the store rebuilt from the runtime (start-up, reconnects, sweeps, misses);
//!   [`status_entry`] — a store entry read from a verbose status answer (where each field comes from);
//!   [`info_view`] — the keys of a verbose status's `info` JSON it reads, parsed without the rest.

pub mod hook_request;
pub mod hooked_fields;
pub mod info_view;
pub mod intercept;
pub mod newer_cri;
pub mod proto_edit;
pub mod recover;
pub mod relay;
pub mod restore;
pub mod router;
pub mod server;
pub mod status_entry;
