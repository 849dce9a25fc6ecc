//! runtime-proxy: a CRI proxy between kubelet and the container runtime.
//!
//! kubelet speaks CRI (gRPC over HTTP/2 on a unix socket) to the proxy; the proxy forwards every
//! call to containerd. Module map, in the order a call flows through them:
//!
//! * [`cli`] — flags, compatible with koord-runtime-proxy's.
//! * [`listener`] — the listening socket (stale socket, parent dir, mode and owner).
//! * [`server`] — HTTP/2 accept loop and graceful drain.
//! * [`router`] — picks the backend (and later the interceptor) from the gRPC path; logs calls.
//! * [`passthrough`] — forwards a call frame by frame, streams included.
//! * [`backend`] — the lazily connected, self-healing HTTP/2 connection to a backend socket.
//! * [`grpc`] — status codes, `grpc-timeout`, trailers-only error responses.
//! * [`wire`] — edits to encoded protobuf messages that keep unknown fields.
//! * [`registry`] — the hook servers registered in `--hook-config-dir`, hot-reloaded.

pub mod backend;
pub mod cli;
pub mod grpc;
pub mod listener;
pub mod passthrough;
pub mod registry;
pub mod router;
pub mod server;
pub mod wire;

use std::future::Future;
use std::sync::Arc;

use anyhow::bail;

use crate::backend::Backend;
use crate::cli::{Args, BackendRuntimeMode};
use crate::router::Router;

/// Runs the proxy until `shutdown` resolves: binds the socket, serves, drains.
///
/// Errors: `--backend-runtime-mode Docker` (not supported yet), or the socket cannot be bound
/// (see [`listener::bind`]).
pub async fn run(args: Args, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if args.backend_runtime_mode == BackendRuntimeMode::Docker {
        bail!("--backend-runtime-mode Docker is not supported yet: only CRI runtimes (Containerd) are");
    }
    let runtime = Arc::new(Backend::new(&args.runtime_endpoint));
    let image = if args.image_endpoint() == &args.runtime_endpoint {
        runtime.clone()
    } else {
        Arc::new(Backend::new(args.image_endpoint()))
    };
    let router = Arc::new(Router::new(runtime, image));
    let listener = listener::bind(&args.listen, &args.runtime_endpoint)?;
    tracing::info!(
        listen = %args.listen.display(),
        runtime = %args.runtime_endpoint.display(),
        image = %args.image_endpoint().display(),
        hook_config_dir = %args.hook_config_dir.display(),
        "runtime-proxy serving"
    );
    server::serve(listener, &args.listen, router, shutdown, args.drain_timeout).await
}
