//! Compiles `proto/runtime/v1alpha1/api.proto` into Rust types, a client and a server.

fn main() -> std::io::Result<()> {
    tonic_prost_build::configure()
        .btree_map(".")
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/runtime/v1alpha1/api.proto"], &["proto"])
}
