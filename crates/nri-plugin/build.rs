//! Compiles NRI's protocol (`proto/nri/api.proto`, a subset) and ttrpc's envelope
//! (`proto/nri/ttrpc.proto`) into prost message types; the ttrpc framing and NRI's connection
//! multiplexing are ours (`src/wire.rs`).

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=proto/nri");
    prost_build::Config::new().compile_protos(&["proto/nri/api.proto", "proto/nri/ttrpc.proto"], &["proto/nri"])
}
