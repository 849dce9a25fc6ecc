//! An external NRI plugin's side of the protocol, shared by the NRI plugins of this workspace
//! (runtime-hooks' NRI mode, runtime-proxy's NRI front end).
//!
//! * [`proto`] — NRI's messages (`proto/nri/api.proto`: a subset of containerd/nri 0.6.1's
//!   `pkg/api/api.proto` with what 0.7 to 0.12 added, field numbers exact, author-controlled
//!   strings as bytes) and ttrpc's envelope.
//! * [`wire`] — ttrpc over NRI's multiplexed socket, by hand.
//! * [`convert`] — NRI's pods and containers as the hook protocol reads them; [`answer`] — the one writer of
//!   NRI's answers (adjustments and updates, in parts under ttrpc's 4 MiB); [`applied`] — what of an update a
//!   container holds already (so that only what differs is sent).
//! * [`events`] — NRI's lifecycle events: which call delivers each at which NRI level (0.12's
//!   per-event calls, `StateChange` before), which mask bits a runtime knows, which handler
//!   method takes each.
//! * [`trim`] — what a handler reads of pods and containers ([`Reads`]); the rest is dropped
//!   from the encoded messages before they are decoded.
//! * [`plugin`] — the connection loop: dial the runtime's socket, `RegisterPlugin`, answer
//!   `Configure` with the handler's event mask, take `Synchronize` whole (NRI 0.7+ sends a big
//!   state in parts), pass each event to a [`plugin::Handler`] (per [`events::EVENTS`]), send
//!   `UpdateContainers` when the handler has updates of its own, reconnect with back-off, close
//!   at shutdown.
//!
//! What a plugin does with an event is its own ([`plugin::Handler`]); nothing here knows hooks
//! or cgroups.

pub mod answer;
pub mod applied;
pub mod convert;
pub mod events;
pub mod plugin;
pub mod trim;
pub mod wire;

pub use plugin::{run, Handler, Options, Refusal};
pub use trim::{Keys, Reads};

/// Generated protobuf types: NRI's API (subset) and ttrpc's envelope (`proto/nri/`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    /// `nri.pkg.api.v1alpha1` (NRI 0.6.1's `pkg/api/api.proto`, a subset, with later levels' additions).
    pub mod api {
        include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
    }
    /// `ttrpc` (`Request`, `Response`, `Status`).
    pub mod ttrpc {
        include!(concat!(env!("OUT_DIR"), "/ttrpc.rs"));
    }
}

use prost::Message;

/// The runtime's NRI socket unless configured otherwise (NRI's `DefaultSocketPath`).
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The service the runtime calls.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The service the plugin calls.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";

/// A plugin index (`--nri-plugin-index`): exactly two ASCII digits (NRI's `CheckPluginIndex`).
///
/// Errors: anything else, with a message naming the value.
pub fn parse_plugin_index(s: &str) -> Result<String, String> {
    if s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit()) {
        Ok(s.to_owned())
    } else {
        Err(format!("invalid NRI plugin index {s:?}: must be two digits, 00 to 99"))
    }
}

/// The `ConfigureResponse.events` mask of `events`: bit `event - 1` per event (NRI's
/// `EventMask`).
pub fn event_mask(events: impl IntoIterator<Item = proto::api::Event>) -> i32 {
    events.into_iter().fold(0, |mask, e| mask | (1 << (e as i32 - 1)))
}

/// Decodes each item of a repeated message field on its own: `Ok` items in order, and for each
/// item that does not decode, its index, its ID (field 1, when it can be read: every CRI and
/// NRI object carries its ID there; lossy text) and the cause.
pub fn decode_items<T: Message + Default>(items: &[Vec<u8>]) -> (Vec<T>, Vec<(usize, String, String)>) {
    let mut ok = Vec::with_capacity(items.len());
    let mut bad = Vec::new();
    for (i, item) in items.iter().enumerate() {
        match T::decode(item.as_slice()) {
            Ok(v) => ok.push(v),
            Err(e) => bad.push((i, leading_id(item).unwrap_or_default(), e.to_string())),
        }
    }
    (ok, bad)
}

/// Field 1 of an encoded message, when it comes first and is length-delimited (lossy text).
fn leading_id(mut item: &[u8]) -> Option<String> {
    if item.first() != Some(&0x0a) {
        return None;
    }
    item = &item[1..];
    let len = prost::encoding::decode_varint(&mut item).ok()?;
    let len = usize::try_from(len).ok()?;
    item.get(..len).map(|b| String::from_utf8_lossy(b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_index_is_two_digits() {
        assert_eq!(parse_plugin_index("05").unwrap(), "05");
        for bad in ["5", "005", "ab", "", "1a"] {
            assert!(parse_plugin_index(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn items_that_do_not_decode_are_named() {
        let good = proto::api::PodSandbox { id: "s2".into(), ..Default::default() }.encode_to_vec();
        let (ok, bad) = decode_items::<proto::api::PodSandbox>(&[b"\x0a\x02s1\x12\x7f\x01".to_vec(), good]);
        assert_eq!(ok.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["s2"]);
        assert_eq!((bad[0].0, bad[0].1.as_str()), (0, "s1"));
    }
}
