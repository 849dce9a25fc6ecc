//! Unit tests of [`super`]: checks against in-process servers of each kind on real unix sockets.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::Full;
use tokio::net::UnixListener;

use super::*;

/// What an in-process server on a unix socket speaks.
#[derive(Clone, Copy)]
enum Kind {
    /// HTTP/2, every call answered trailers-only `UNIMPLEMENTED` (a gRPC server).
    Grpc,
    /// HTTP/1.1, `GET /_ping` answered `OK` with `Api-Version: 1.41` (a dockerd stand-in).
    Docker,
    /// HTTP/1.1, everything answered `404`.
    Http1,
    /// Accepts connections, never reads or writes.
    Silent,
}

/// A server on a socket; stopping it (or dropping it) closes every connection, as a process
/// that dies does.
struct Server {
    task: tokio::task::JoinHandle<()>,
    accepted: Arc<AtomicUsize>,
}

impl Server {
    fn start(kind: Kind, path: &Path) -> Server {
        let listener = UnixListener::bind(path).unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        let task = tokio::spawn(async move {
            // Dropped with the task: aborts every connection's task.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                conns.spawn(serve(kind, stream));
            }
        });
        Server { task, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(kind: Kind, stream: UnixStream) {
    match kind {
        Kind::Grpc => {
            let Ok(mut conn) = h2::server::handshake(stream).await else { return };
            while let Some(Ok((_req, mut respond))) = conn.accept().await {
                let head = http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "12")
                    .body(())
                    .unwrap();
                let _ = respond.send_response(head, true);
            }
        }
        Kind::Docker | Kind::Http1 => {
            let service = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| async move {
                let resp = if matches!(kind, Kind::Docker) && req.uri().path() == "/_ping" {
                    http::Response::builder().header("api-version", "1.41").body(Full::new(Bytes::from_static(b"OK")))
                } else {
                    http::Response::builder().status(404).body(Full::new(Bytes::from_static(b"page not found")))
                };
                Ok::<_, Infallible>(resp.unwrap())
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        }
        Kind::Silent => {
            let _held = stream;
            std::future::pending::<()>().await;
        }
    }
}

fn checker(path: &Path, protocol: Protocol) -> Checker {
    Checker { target: Target { role: Role::Runtime, path: path.to_owned(), protocol }, kept: None }
}

fn down(v: &Verdict) -> (Trouble, &str) {
    match v {
        Verdict::Down { trouble, reason } => (*trouble, reason),
        Verdict::Up => panic!("up, expected down"),
    }
}

#[tokio::test]
async fn grpc_checks_reuse_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.sock");
    let server = Server::start(Kind::Grpc, &path);
    let mut c = checker(&path, Protocol::Grpc);
    for _ in 0..5 {
        assert_eq!(c.check().await, Verdict::Up);
    }
    assert_eq!(server.accepted(), 1, "one connection for every check");
}

#[tokio::test]
async fn docker_checks_reuse_one_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.sock");
    let server = Server::start(Kind::Docker, &path);
    let mut c = checker(&path, Protocol::Docker);
    for _ in 0..5 {
        assert_eq!(c.check().await, Verdict::Up);
    }
    assert_eq!(server.accepted(), 1, "one connection for every check");
}

/// The kept connection dies with its server: the next check says so (not Up on the stale
/// connection), and the one after the server is back says Up.
#[tokio::test]
async fn a_dead_kept_connection_does_not_hide_a_dead_backend() {
    for protocol in [Protocol::Grpc, Protocol::Docker] {
        let kind = if protocol == Protocol::Grpc { Kind::Grpc } else { Kind::Docker };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.sock");
        let server = Server::start(kind, &path);
        let mut c = checker(&path, protocol);
        assert_eq!(c.check().await, Verdict::Up);
        drop(server);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let v = c.check().await;
        let (trouble, reason) = down(&v);
        assert_eq!(trouble, Trouble::Refused, "{reason}");
        assert!(reason.contains("ECONNREFUSED"), "{reason}");
        std::fs::remove_file(&path).unwrap();
        let v = c.check().await;
        let (trouble, reason) = down(&v);
        assert_eq!((trouble, reason.contains("ENOENT")), (Trouble::Missing, true), "{reason}");
        let _back = Server::start(kind, &path);
        assert_eq!(c.check().await, Verdict::Up);
    }
}

#[tokio::test]
async fn cri_mode_names_a_docker_engine_api_and_other_http1_servers() {
    let dir = tempfile::tempdir().unwrap();
    let docker = dir.path().join("docker.sock");
    let _d = Server::start(Kind::Docker, &docker);
    let v = checker(&docker, Protocol::Grpc).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::WrongKind, "{reason}");
    for want in ["Docker Engine API", "API 1.41", "--backend-runtime-mode Docker"] {
        assert!(reason.contains(want), "{want}: {reason}");
    }
    let web = dir.path().join("web.sock");
    let _w = Server::start(Kind::Http1, &web);
    let v = checker(&web, Protocol::Grpc).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::WrongKind, "{reason}");
    assert!(reason.contains("speaks HTTP/1.1 (GET /_ping: 404 Not Found)"), "{reason}");
}

#[tokio::test]
async fn docker_mode_names_a_grpc_server_and_refuses_a_non_docker_http1_server() {
    let dir = tempfile::tempdir().unwrap();
    let grpc = dir.path().join("containerd.sock");
    let _g = Server::start(Kind::Grpc, &grpc);
    let v = checker(&grpc, Protocol::Docker).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::WrongKind, "{reason}");
    for want in ["HTTP/2 gRPC", "--backend-runtime-mode Containerd"] {
        assert!(reason.contains(want), "{want}: {reason}");
    }
    let web = dir.path().join("web.sock");
    let _w = Server::start(Kind::Http1, &web);
    let v = checker(&web, Protocol::Docker).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::Protocol, "{reason}");
    assert!(reason.contains("404 Not Found"), "{reason}");
}

#[tokio::test]
async fn a_server_that_never_answers_is_down_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let _s = Server::start(Kind::Silent, &path);
    for protocol in [Protocol::Grpc, Protocol::Docker] {
        let start = std::time::Instant::now();
        let v = checker(&path, protocol).check().await;
        let (trouble, reason) = down(&v);
        assert_eq!(trouble, Trouble::NoAnswer, "{reason}");
        assert!(start.elapsed() < CHECK_TIMEOUT + Duration::from_millis(300), "{:?}", start.elapsed());
    }
}

#[tokio::test]
async fn paths_that_are_no_sockets_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file.sock");
    std::fs::write(&file, b"").unwrap();
    let v = checker(&file, Protocol::Grpc).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::NotASocket);
    assert_eq!(reason, "is a regular file, not a socket (connect: ECONNREFUSED: Connection refused)");
    let sub = dir.path().join("dir.sock");
    std::fs::create_dir(&sub).unwrap();
    let v = checker(&sub, Protocol::Docker).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::NotASocket);
    assert!(reason.starts_with("is a directory, not a socket"), "{reason}");
    let v = checker(&file.join("below"), Protocol::Grpc).check().await;
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::Unreachable);
    assert!(reason.contains("Not a directory"), "{reason}");
}

/// EACCES cannot be had for real by root (the tests' user here): the classification of the OS
/// error, on a real socket path. (tests/health.rs runs the proxy as `nobody` for the real one.)
#[test]
fn permission_denied_names_the_error_and_the_sockets_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.sock");
    let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let v = connect_failure(&path, &io::Error::from_raw_os_error(libc::EACCES));
    let (trouble, reason) = down(&v);
    assert_eq!(trouble, Trouble::PermissionDenied);
    assert!(reason.starts_with("permission denied (EACCES: Permission denied) for uid "), "{reason}");
    assert!(reason.contains(": the socket's mode is 0000, owner "), "{reason}");
    let v = connect_failure(&dir.path().join("hidden/x.sock"), &io::Error::from_raw_os_error(libc::EACCES));
    assert!(down(&v).1.ends_with("a directory on its path may not be searched"), "{v:?}");
    let v = connect_failure(&path, &io::Error::from_raw_os_error(libc::ENOTSOCK));
    assert_eq!(down(&v).0, Trouble::Refused, "a socket after all");
}

#[tokio::test]
async fn healthz_names_each_endpoint_that_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = dir.path().join("runtime.sock");
    let image = dir.path().join("image.sock");
    let _r = Server::start(Kind::Grpc, &runtime);
    let metrics = Arc::new(Metrics::new());
    let health = Health::new(
        vec![
            Target { role: Role::Runtime, path: runtime.clone(), protocol: Protocol::Grpc },
            Target { role: Role::Image, path: image.clone(), protocol: Protocol::Grpc },
        ],
        metrics.clone(),
    );
    assert!(!health.all_up(), "not checked yet");
    let task = tokio::spawn(health.clone().run());
    let (status, body) = health.healthz().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        format!("image endpoint unix://{}: no such socket (ENOENT: No such file or directory)\n", image.display())
    );
    let text = metrics.render_for_tests();
    assert!(text.contains("runtime_proxy_backend_endpoint_up{endpoint=\"runtime\"} 1"), "{text}");
    assert!(text.contains("runtime_proxy_backend_endpoint_up{endpoint=\"image\"} 0"), "{text}");

    let _i = Server::start(Kind::Grpc, &image);
    let start = std::time::Instant::now();
    while !health.all_up() {
        assert!(start.elapsed() < CHECK_INTERVAL * 3, "image endpoint not up");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(health.healthz().await, (200, "ok\n".to_owned()));
    task.abort();
}
