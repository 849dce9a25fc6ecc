//! [`HookClient`] against h2's server (scripted answers: refusals, GOAWAY, large bodies) and raw
//! sockets (garbage, silence).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::RecvStream;
use http::{HeaderMap, HeaderValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

use super::*;
use crate::http2::frame::PREFACE;

const RPC: &str = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook";

fn own_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn socket() -> (tempfile::TempDir, PathBuf, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hook.sock");
    let listener = UnixListener::bind(&path).unwrap();
    (dir, path, listener)
}

fn client(path: &Path) -> HookClient {
    HookClient::new(path, vec![own_uid()])
}

/// What the server does with the `n`th request (counted from 0 over all connections) and on
/// which connection (counted from 0).
type Handler = Arc<dyn Fn(usize, usize, http::Request<RecvStream>, SendResponse<Bytes>) + Send + Sync>;

/// An h2 server on `listener` (its `SETTINGS_INITIAL_WINDOW_SIZE` the default 65,535 bytes):
/// returns how many connections it accepted.
fn serve(listener: UnixListener, handler: Handler) -> Arc<AtomicUsize> {
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let conn_no = counted.fetch_add(1, Ordering::SeqCst);
            let (handler, requests) = (handler.clone(), requests.clone());
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(stream).await else { return };
                while let Some(Ok((req, respond))) = conn.accept().await {
                    handler(requests.fetch_add(1, Ordering::SeqCst), conn_no, req, respond);
                }
            });
        }
    });
    connections
}

/// A handler that answers every request with its own body (read whole first).
fn echo() -> Handler {
    Arc::new(|_, _, req, respond| {
        tokio::spawn(async move {
            let body = read_all(req.into_body()).await;
            answer(respond, body);
        });
    })
}

async fn read_all(mut body: RecvStream) -> Bytes {
    let mut all = BytesMut::new();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        all.extend_from_slice(&chunk);
    }
    all.freeze()
}

/// A gRPC answer: head, `data`, trailers with `grpc-status: 0`.
fn answer(mut respond: SendResponse<Bytes>, data: Bytes) {
    let head = http::Response::builder().status(200).header("content-type", "application/grpc").body(()).unwrap();
    let mut send = respond.send_response(head, false).unwrap();
    send.send_data(data, false).unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    send.send_trailers(trailers).unwrap();
}

fn body(len: usize) -> Bytes {
    (0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
}

async fn call(c: &HookClient, body: Bytes) -> Result<Answer, Status> {
    c.call(RPC, Duration::from_secs(2), body, "PreCreateContainerHook", 64 << 20).await
}

#[tokio::test]
async fn sequential_calls_share_one_connection() {
    let (_dir, path, listener) = socket();
    let connections = serve(listener, echo());
    let c = client(&path);
    for n in 0..3 {
        let sent = body(100 + n);
        let got = call(&c, sent.clone()).await.expect("answered");
        assert_eq!(got.data, sent);
        assert_eq!(got.status().code, Code::OK);
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn concurrent_calls_use_a_connection_each_and_the_idle_ones_are_reused() {
    let (_dir, path, listener) = socket();
    // Held until three requests are in: three calls at once need three connections.
    let held = Arc::new(Mutex::new(Vec::new()));
    let holding = held.clone();
    let connections = serve(
        listener,
        Arc::new(move |n, _, req, respond| {
            let mut h = holding.lock().unwrap();
            h.push((req, respond));
            if n >= 2 {
                for (req, respond) in h.drain(..) {
                    tokio::spawn(async move { answer(respond, read_all(req.into_body()).await) });
                }
            }
        }),
    );
    let c = client(&path);
    let (a, b, d) = tokio::join!(call(&c, body(10)), call(&c, body(20)), call(&c, body(30)));
    assert_eq!((a.unwrap().data.len(), b.unwrap().data.len(), d.unwrap().data.len()), (10, 20, 30));
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    assert_eq!(c.idle.conns.lock().unwrap().len(), 3, "all three kept idle");
    let (a, b, d) = tokio::join!(call(&c, body(1)), call(&c, body(2)), call(&c, body(3)));
    assert!(a.is_ok() && b.is_ok() && d.is_ok());
    assert_eq!(connections.load(Ordering::SeqCst), 3, "the idle connections were taken again");
}

#[tokio::test]
async fn large_requests_and_answers_flow_within_the_windows() {
    let (_dir, path, listener) = socket();
    let connections = serve(listener, echo());
    let c = client(&path);
    // The server's windows are 65,535 bytes: the request waits for its WINDOW_UPDATEs. The
    // answer passes half the client's 4 MiB stream window: the client's WINDOW_UPDATEs.
    for len in [1 << 20, 6 << 20, 70_000] {
        let sent = body(len);
        let got = call(&c, sent.clone()).await.expect("answered");
        assert!(got.data == sent, "{len} bytes echoed");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn answers_over_the_limit_are_resource_exhausted() {
    let (_dir, path, listener) = socket();
    serve(listener, echo());
    let c = client(&path);
    let err = c.call(RPC, Duration::from_secs(2), body(1000), "PreCreateContainerHook", 100).await.unwrap_err();
    assert_eq!(err.code, Code::RESOURCE_EXHAUSTED);
    assert_eq!(
        err.message,
        format!(
            "PreCreateContainerHook: answer from hook server unix://{} larger than one message of 100 bytes",
            path.display()
        )
    );
}

#[tokio::test]
async fn a_refused_stream_is_sent_again_once_on_a_new_connection() {
    let (_dir, path, listener) = socket();
    // The first request is refused; the rest answered.
    let connections = serve(
        listener,
        Arc::new(|n, _, req, mut respond| {
            if n == 0 {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            } else {
                tokio::spawn(async move { answer(respond, read_all(req.into_body()).await) });
            }
        }),
    );
    let c = client(&path);
    assert_eq!(call(&c, body(7)).await.expect("answered on the second try").data, body(7));
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_server_that_always_refuses_fails_the_call_after_one_retry() {
    let (_dir, path, listener) = socket();
    let connections = serve(listener, Arc::new(|_, _, _, mut respond| respond.send_reset(h2::Reason::REFUSED_STREAM)));
    let err = call(&client(&path), body(7)).await.unwrap_err();
    assert_eq!(err.code, Code::UNAVAILABLE);
    assert_eq!(
        err.message,
        format!(
            "PreCreateContainerHook: hook server unix://{} failed the call: stream reset by the server: REFUSED_STREAM",
            path.display()
        )
    );
    assert_eq!(connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn other_resets_are_not_retried() {
    let (_dir, path, listener) = socket();
    let connections = serve(listener, Arc::new(|_, _, _, mut respond| respond.send_reset(h2::Reason::INTERNAL_ERROR)));
    let err = call(&client(&path), body(7)).await.unwrap_err();
    assert!(err.message.ends_with("failed the call: stream reset by the server: INTERNAL_ERROR"), "{}", err.message);
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

/// A connection the server closes while it is idle (GOAWAY, then the end) is not used again.
#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced() {
    let (_dir, path, listener) = socket();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(stream).await.unwrap();
                if let Some(Ok((req, respond))) = conn.accept().await {
                    answer(respond, read_all(req.into_body()).await);
                }
                // One call per connection, then a graceful close.
                conn.graceful_shutdown();
                while conn.accept().await.is_some() {}
            });
        }
    });
    let c = client(&path);
    for n in 1..=3 {
        assert!(call(&c, body(5)).await.is_ok(), "call {n}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

/// A call given up (its future dropped, as at a hook timeout) closes its connection: the
/// server sees the end.
#[tokio::test]
async fn a_call_given_up_closes_its_connection() {
    let (_dir, path, listener) = socket();
    let c = client(&path);
    let server = tokio::spawn(async move {
        let (mut peer, _) = listener.accept().await.unwrap();
        let mut seen = Vec::new();
        let _ = peer.read_to_end(&mut seen).await;
        seen
    });
    let gave_up = tokio::time::timeout(Duration::from_millis(100), call(&c, body(3))).await;
    assert!(gave_up.is_err(), "no answer");
    let seen = tokio::time::timeout(Duration::from_secs(2), server).await.expect("the server saw the end").unwrap();
    assert!(seen.starts_with(PREFACE), "it got the preface and the request first");
    assert!(c.idle.conns.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_server_that_is_not_http2_fails_the_call() {
    let (_dir, path, listener) = socket();
    tokio::spawn(async move {
        let (mut peer, _) = listener.accept().await.unwrap();
        let _ = peer.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n").await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let err = call(&client(&path), body(3)).await.unwrap_err();
    assert_eq!(err.code, Code::UNAVAILABLE);
    assert!(err.message.contains("failed the call: frame of"), "{}", err.message);
}

#[tokio::test]
async fn a_trailers_only_answer_carries_its_status() {
    let (_dir, path, listener) = socket();
    serve(
        listener,
        Arc::new(|_, _, _, mut respond| {
            let head = http::Response::builder()
                .status(200)
                .header("content-type", "application/grpc")
                .header("grpc-status", "9")
                .header("grpc-message", "no%20thanks")
                .body(())
                .unwrap();
            respond.send_response(head, true).unwrap();
        }),
    );
    let got = call(&client(&path), body(3)).await.expect("an answer");
    assert_eq!(got.status(), Status::new(Code::FAILED_PRECONDITION, "no%20thanks"));
    assert!(got.data.is_empty() && got.trailers.is_none());
}

#[tokio::test]
async fn a_peer_run_by_a_uid_not_allowed_is_refused_naming_uid_and_pid() {
    let (_dir, path, listener) = socket();
    serve(listener, echo());
    let own = own_uid();
    let other = own.wrapping_add(1);
    let refused = call(&HookClient::new(&path, vec![other]), body(1)).await.expect_err("refused");
    assert_eq!(refused.code, Code::PERMISSION_DENIED, "the server is there but may not serve");
    let want = format!(
        "hook server unix://{} is run by uid {own} (pid {}), not by an allowed uid [{other}]",
        path.display(),
        std::process::id()
    );
    assert_eq!(refused.message, want);
    assert!(call(&HookClient::new(&path, vec![other, own]), body(1)).await.is_ok());
}

#[tokio::test]
async fn an_absent_server_is_unavailable_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.sock");
    let err = call(&client(&path), body(1)).await.unwrap_err();
    assert_eq!(err.code, Code::UNAVAILABLE);
    assert!(
        err.message.starts_with(&format!("hook server unix://{}: cannot connect: ", path.display())),
        "{}",
        err.message
    );
}

#[test]
fn the_request_head_is_a_grpc_unary_call_with_the_timeout() {
    use h2::hpack::{Decoder, Header};
    let mut block = request_block(RPC, Duration::from_millis(1500));
    let mut fields = Vec::new();
    Decoder::new(4096)
        .decode(&mut std::io::Cursor::new(&mut block), |h| {
            fields.push(match h {
                Header::Method(m) => (":method".to_owned(), m.to_string()),
                Header::Scheme(s) => (":scheme".to_owned(), s.to_string()),
                Header::Path(p) => (":path".to_owned(), p.to_string()),
                Header::Authority(a) => (":authority".to_owned(), a.to_string()),
                Header::Field { name, value } => (name.to_string(), value.to_str().unwrap().to_owned()),
                other => panic!("unexpected {other:?}"),
            });
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    let want = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", RPC),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", "1500m"),
        ("user-agent", USER_AGENT),
    ];
    assert_eq!(fields, want.map(|(n, v)| (n.to_owned(), v.to_owned())));
}

/// h2's graceful shutdown sends GOAWAY and a PING, and closes once the PING is acknowledged: a
/// connection idle in the proxy's pool answers it (the watcher) and is closed, so the server's
/// shutdown ends at once (before the watcher, it waited for ever: a hook server's SIGTERM hung).
#[tokio::test]
async fn an_idle_connection_lets_the_server_shut_down_gracefully() {
    let (_dir, path, listener) = socket();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(stream).await.unwrap();
        if let Some(Ok((req, respond))) = conn.accept().await {
            let body = read_all(req.into_body());
            let (body, _) = tokio::join!(body, async {});
            answer(respond, body);
        }
        // The answer goes out while the connection is driven towards its end.
        tokio::time::sleep(Duration::from_millis(200)).await;
        conn.graceful_shutdown();
        let ended = tokio::time::timeout(Duration::from_secs(3), std::future::poll_fn(|cx| conn.poll_closed(cx))).await;
        let _ = closed_tx.send(ended.is_ok());
    });
    let c = client(&path);
    assert!(call(&c, body(5)).await.is_ok());
    assert!(closed.await.unwrap(), "the server's graceful shutdown ended within 3 s");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(c.idle.conns.lock().unwrap().is_empty(), "the connection the server closed is not kept");
}
