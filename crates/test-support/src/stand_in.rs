//! Minimal servers on unix sockets that stand in for a backend of some kind, for the tests of
//! the proxy's health checks: a gRPC server, a Docker Engine API, any other HTTP/1.1 server.
//! Stopping one (dropping it) closes every connection it accepted, as a process that dies does,
//! and removes its socket.

use std::convert::Infallible;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixListener;

/// What a [`StandIn`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// HTTP/2 gRPC: every call is answered trailers-only `UNIMPLEMENTED` (12).
    Grpc,
    /// HTTP/1.1, as dockerd: `GET /_ping` answers `200` `OK` with `Api-Version: 1.41`; anything
    /// else `404`.
    Docker,
    /// HTTP/1.1 that is no Docker Engine API: every request answered `404`.
    Http1,
}

/// A stand-in server on a unix socket; stopped when dropped.
pub struct StandIn {
    socket: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Serves `kind` on `socket` (which must not exist) from the current tokio runtime.
    pub fn start(kind: Kind, socket: &Path) -> StandIn {
        let listener = UnixListener::bind(socket).unwrap_or_else(|e| panic!("binding {}: {e}", socket.display()));
        let task = tokio::spawn(async move {
            // Dropped with the task: aborts every connection's task.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                conns.spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                        Ok::<_, Infallible>(answer(kind, &req))
                    });
                    let io = TokioIo::new(stream);
                    let _ = match kind {
                        Kind::Grpc => {
                            hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(io, service)
                                .await
                        }
                        Kind::Docker | Kind::Http1 => {
                            hyper::server::conn::http1::Builder::new().serve_connection(io, service).await
                        }
                    };
                });
            }
        });
        StandIn { socket: socket.to_owned(), task }
    }

    /// The socket it serves.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

fn answer(kind: Kind, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let resp = match kind {
        Kind::Grpc => Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "12")
            .body(Full::default()),
        Kind::Docker if req.uri().path() == "/_ping" => Response::builder()
            .header("api-version", "1.41")
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"OK"))),
        Kind::Docker | Kind::Http1 => {
            Response::builder().status(404).body(Full::new(Bytes::from_static(b"page not found\n")))
        }
    };
    resp.unwrap_or_default()
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}
