//! The HTTP/2 codec written for the proxy: frames as bytes ([`frame`]: the frame header, the
//! frames the proxy writes of its own, a header block encoder that never touches the HPACK
//! dynamic table) and an HPACK decoder that follows a peer's table and hands fields out as bytes
//! ([`hpack`]). Two users: the CRI frame relay ([`crate::cri::relay`]), which forwards frames as
//! they came and decodes header blocks only to learn each stream's path, and the hook client
//! ([`crate::grpc::hook_client`]), which writes and reads one hook call's frames on the calling
//! task. It imports nothing else of the crate.

pub mod frame;
pub mod hpack;
