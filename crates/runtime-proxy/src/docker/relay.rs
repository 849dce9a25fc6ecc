//! The Docker Engine API pass-through: HTTP/1.1 requests from one client connection are sent on,
//! unchanged, over one connection to dockerd (opened with the client's and closed with it, so
//! keep-alive works as without the proxy), and the answers stream back without buffering:
//! chunked and endless bodies (`logs?follow=1`, `events`, `stats?stream=1`, image pull progress)
//! go frame by frame, and there is no size limit of the proxy's own.
//!
//! Hijacked connections (`POST /containers/{id}/attach`, `POST /exec/{id}/start` with
//! `Connection: Upgrade`, `Upgrade: tcp`; dockerd answers `101 UPGRADED`) become a raw byte relay
//! in both directions. When the client shuts its write side (stdin closed), the shutdown is passed
//! to dockerd and dockerd's output keeps flowing until dockerd closes: `docker exec` without `-t`
//! gets all its output and its exit code (koord-runtime-proxy #437).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// The body type of every answer the Docker front end gives: a backend's streamed body or one
/// the proxy built.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// An answer in Docker's error shape, `{"message": "..."}`, which every Docker client prints.
pub fn error(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "message": message }).to_string();
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    resp
}

/// The connection to dockerd that serves one client connection, dialled on its first request
/// and re-dialled if dockerd closed it.
pub struct Upstream {
    path: PathBuf,
    sender: Option<SendRequest<Body>>,
}

impl Upstream {
    /// An upstream to the dockerd socket at `path`; nothing is dialled yet.
    pub fn new(path: &Path) -> Self {
        Upstream { path: path.to_owned(), sender: None }
    }

    /// The dockerd socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends `req` to dockerd and returns its answer head with the body streaming.
    ///
    /// Errors: a `502 Bad Gateway` answer in Docker's error shape, naming the socket, when dockerd
    /// cannot be reached or fails the request.
    pub async fn send(&mut self, req: Request<Body>) -> Result<Response<Incoming>, Response<Body>> {
        let sender = self.ready().await?;
        sender.send_request(req).await.map_err(|e| {
            self.sender = None;
            self.bad_gateway("request failed", &e)
        })
    }

    async fn ready(&mut self) -> Result<&mut SendRequest<Body>, Response<Body>> {
        if let Some(s) = self.sender.as_mut() {
            if s.ready().await.is_err() {
                self.sender = None;
            }
        }
        if self.sender.is_none() {
            let stream = UnixStream::connect(&self.path).await.map_err(|e| self.bad_gateway("cannot connect", &e))?;
            let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| self.bad_gateway("handshake failed", &e))?;
            let path = self.path.clone();
            tokio::spawn(async move {
                if let Err(e) = conn.with_upgrades().await {
                    tracing::debug!(backend = %path.display(), error = %e, "dockerd connection ended with an error");
                }
            });
            self.sender = Some(sender);
        }
        let path = self.path.clone();
        let sender = self
            .sender
            .as_mut()
            .ok_or_else(|| error(StatusCode::BAD_GATEWAY, &format!("backend unix://{}", path.display())))?;
        Ok(sender)
    }

    fn bad_gateway(&self, what: &str, err: &dyn std::fmt::Display) -> Response<Body> {
        error(StatusCode::BAD_GATEWAY, &format!("runtime-proxy: dockerd unix://{}: {what}: {err}", self.path.display()))
    }
}

/// Forwards `req` as it is and streams the answer back; a `101` answer turns both connections
/// into a raw relay (see the module docs).
pub async fn forward(upstream: &mut Upstream, mut req: Request<Incoming>) -> Response<Body> {
    let client_upgrade = is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let req = req.map(|b| b.boxed());
    let mut resp = match upstream.send(req).await {
        Ok(resp) => resp,
        Err(answer) => return answer,
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let backend_upgrade = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, backend_upgrade) {
                    Ok((client, backend)) => {
                        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
                        // Copies both ways; EOF on one side shuts down the other's write half
                        // and the opposite direction goes on until it ends too.
                        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
                            tracing::debug!(error = %e, "hijacked stream ended with an error");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "hijacked stream could not be set up"),
                }
            });
        }
    }
    resp.map(|b| b.boxed())
}

/// Whether a request asks to take over the connection (`Connection: Upgrade`).
fn is_upgrade(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .any(|v| v.to_str().is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade"))))
}
