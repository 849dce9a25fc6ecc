//! [`HookClient`] against hostile hook servers (raw HTTP/2 on a thread of their own): after an
//! answer they flood the connection with frames of every kind and never read. The client drops
//! the connection within its bounds, holds little memory meanwhile, and leaves the other tasks of
//! its single-threaded runtime on time; a call on such a connection does not wait on the flood;
//! ordinary keepalive PINGs keep a connection.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener as StdListener, UnixStream as StdStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use bytes::BufMut;

use super::*;
use crate::http2::frame::{flag, kind, Head};

const RPC: &str = "/runtime.v1alpha1.RuntimeHookService/PreCreateContainerHook";

/// How long a flooded idle connection may stay pooled (it is dropped within milliseconds).
const DROPPED_WITHIN: Duration = Duration::from_secs(5);
/// How late a 5 ms timer on the client's runtime may wake up during a flood.
const MAX_TIMER_LATENESS: Duration = Duration::from_millis(100);
/// How much the process's RSS may grow during a flood (without the bounds: gigabytes).
const MAX_RSS_GROWTH_KB: u64 = 200 << 10;
/// How large a pooled connection's read or write buffer may become during a flood.
const MAX_BUFFER: usize = 1 << 20;

fn own_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn socket() -> (tempfile::TempDir, PathBuf, StdListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hook.sock");
    let listener = StdListener::bind(&path).unwrap();
    (dir, path, listener)
}

async fn call(c: &HookClient) -> Result<Answer, Status> {
    c.call(RPC, Duration::from_secs(2), Bytes::from_static(&[0, 0, 0, 0, 1, 7]), "PreCreateContainerHook", 1 << 20)
        .await
}

/// Reads frames until `stream`'s request ends (after the client preface for stream 1).
fn read_request(s: &mut StdStream, stream: u32) -> std::io::Result<()> {
    if stream == 1 {
        s.read_exact(&mut [0; 24])?;
    }
    loop {
        let head = read_frame(s)?.0;
        if head.stream == stream && head.has(flag::END_STREAM) && matches!(head.kind, kind::DATA | kind::HEADERS) {
            return Ok(());
        }
    }
}

fn read_frame(s: &mut StdStream) -> std::io::Result<(Head, Vec<u8>)> {
    let mut h = [0; HEAD_LEN];
    s.read_exact(&mut h)?;
    let head = Head::parse(&h);
    let mut payload = vec![0; head.len];
    s.read_exact(&mut payload)?;
    Ok((head, payload))
}

use crate::http2::frame::{DEFAULT_MAX_FRAME, HEAD_LEN};

/// A gRPC answer on `stream` (the server's SETTINGS first on stream 1): head, one message,
/// trailers with `grpc-status: 0`.
fn answer(stream: u32) -> Vec<u8> {
    let mut out = BytesMut::new();
    if stream == 1 {
        frame::settings(&mut out, &[]);
    }
    let mut block = BytesMut::new();
    frame::put_status(&mut block, 200);
    frame::put_literal(&mut block, b"content-type", b"application/grpc");
    frame::put_headers(&mut out, stream, false, &block, DEFAULT_MAX_FRAME);
    frame::put_data(&mut out, stream, &Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1]), false, DEFAULT_MAX_FRAME);
    let mut trailers = BytesMut::new();
    frame::put_literal(&mut trailers, b"grpc-status", b"0");
    frame::put_headers(&mut out, stream, true, &trailers, DEFAULT_MAX_FRAME);
    out.to_vec()
}

/// Answers calls on `s` one after the other until the client closes it.
fn answer_calls(mut s: StdStream) {
    let mut stream = 1;
    while read_request(&mut s, stream).is_ok() && s.write_all(&answer(stream)).is_ok() {
        stream += 2;
    }
}

/// What a flooding server saw: when its writes failed (the client closed the connection) and
/// how many bytes it had written by then.
struct Flooded {
    closed: Instant,
    written: u64,
}

/// A hostile hook server: on its first connection it answers the first call, writes `pieces`
/// one at a time a millisecond apart, then writes `flood` over and over, never reading, until
/// the client closes the connection (or 60 s pass); later connections answer every call.
fn flooding_server(listener: StdListener, pieces: Vec<Vec<u8>>, flood: Vec<u8>) -> mpsc::Receiver<Flooded> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut incoming = listener.incoming();
        let Some(Ok(mut s)) = incoming.next() else { return };
        if read_request(&mut s, 1).is_ok() && s.write_all(&answer(1)).is_ok() {
            let (start, mut written) = (Instant::now(), 0u64);
            let mut open = true;
            for piece in &pieces {
                open = open && s.write_all(piece).is_ok();
                written += piece.len() as u64;
                std::thread::sleep(Duration::from_millis(1));
            }
            while open && start.elapsed() < Duration::from_secs(60) && s.write_all(&flood).is_ok() {
                written += flood.len() as u64;
            }
            let _ = tx.send(Flooded { closed: Instant::now(), written });
        }
        for s in incoming.flatten() {
            std::thread::spawn(move || answer_calls(s));
        }
    });
    rx
}

/// The process's resident set, in KiB.
fn vm_rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A task on the current runtime that sleeps 5 ms over and over: the most it woke up late, in µs.
fn timer_lateness() -> (Arc<AtomicU64>, tokio::task::AbortHandle) {
    let worst = Arc::new(AtomicU64::new(0));
    let w = worst.clone();
    let task = tokio::spawn(async move {
        loop {
            let start = Instant::now();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let late = start.elapsed().saturating_sub(Duration::from_millis(5));
            w.fetch_max(late.as_micros() as u64, Ordering::Relaxed);
        }
    });
    (worst, task.abort_handle())
}

/// A call answered, then the server floods its idle connection: `pieces` a millisecond apart,
/// then `flood` repeated: the connection is dropped within [`DROPPED_WITHIN`], its buffers stay under
/// [`MAX_BUFFER`] and the process's RSS grows less than [`MAX_RSS_GROWTH_KB`] meanwhile, a timer
/// on the same runtime is never [`MAX_TIMER_LATENESS`] late, and the next call works (on a new
/// connection).
async fn flood_is_bounded(what: &str, pieces: Vec<Vec<u8>>, flood: Vec<u8>) {
    let (_dir, path, listener) = socket();
    let flooded = flooding_server(listener, pieces, flood);
    let c = HookClient::new(&path, vec![own_uid()]);
    let (lateness, ticker) = timer_lateness();
    let rss_before = vm_rss_kb();
    call(&c).await.unwrap_or_else(|e| panic!("{what}: the first call: {e:?}"));
    let answered = Instant::now();
    let (mut max_out, mut max_read, mut max_rss) = (0, 0, rss_before);
    loop {
        {
            let conns = c.idle.conns.lock().unwrap();
            if conns.is_empty() {
                break;
            }
            for conn in conns.iter() {
                max_out = max_out.max(conn.out.capacity());
                max_read = max_read.max(conn.read.capacity());
            }
        }
        max_rss = max_rss.max(vm_rss_kb());
        assert!(max_rss - rss_before < MAX_RSS_GROWTH_KB, "{what}: RSS grew from {rss_before} KiB to {max_rss} KiB");
        assert!(
            answered.elapsed() < DROPPED_WITHIN,
            "{what}: the flooded connection is still pooled after {DROPPED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let dropped = answered.elapsed();
    // The server's writes fail once the client closed its end.
    let seen = loop {
        match flooded.try_recv() {
            Ok(seen) => break seen,
            Err(mpsc::TryRecvError::Empty) if answered.elapsed() < DROPPED_WITHIN * 2 => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("{what}: the server never saw the connection closed: {e}"),
        }
    };
    ticker.abort();
    let late = Duration::from_micros(lateness.load(Ordering::Relaxed));
    eprintln!(
        "{what}: dropped after {dropped:?} (closed {:?} after the answer), {} KiB flooded; buffers out {max_out} B, read {max_read} B; \
         RSS +{} KiB; timer at most {late:?} late",
        seen.closed.saturating_duration_since(answered),
        seen.written >> 10,
        max_rss - rss_before
    );
    assert!(max_out <= MAX_BUFFER && max_read <= MAX_BUFFER, "{what}: buffers out {max_out} B, read {max_read} B");
    assert!(late < MAX_TIMER_LATENESS, "{what}: a 5 ms timer on the same runtime woke up {late:?} late");
    assert_eq!(call(&c).await.unwrap_or_else(|e| panic!("{what}: the next call: {e:?}")).status().code, Code::OK);
}

/// `n` copies of one frame.
fn frames(n: usize, head: Head, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for _ in 0..n {
        Head { len: payload.len(), ..head }.put(&mut out);
        out.put_slice(payload);
    }
    out.to_vec()
}

fn head(kind: u8, flags: u8, stream: u32) -> Head {
    Head { len: 0, kind, flags, stream }
}

/// PINGs one at a time first: the client writes each acknowledgement alone (17 bytes, each taking
/// far more of the socket's buffer) until the socket is full and its writes wait, then the
/// flood (before the bounds the acknowledgements piled up in memory: gigabytes).
#[tokio::test]
async fn a_ping_flood_on_an_idle_connection_is_bounded() {
    let one = frames(1, head(kind::PING, 0, 0), &[7; 8]);
    flood_is_bounded("PING", vec![one; 400], frames(64, head(kind::PING, 0, 0), &[7; 8])).await;
}

#[tokio::test]
async fn a_settings_flood_with_many_parameters_is_bounded() {
    // 2,730 parameters a frame (16,380 bytes), of an identifier nobody knows.
    let params: Vec<u8> = (0..2730).flat_map(|_| [0x0f, 0xf0, 0, 0, 0, 1]).collect();
    flood_is_bounded("SETTINGS", vec![], frames(4, head(kind::SETTINGS, 0, 0), &params)).await;
}

#[tokio::test]
async fn a_window_update_flood_is_bounded() {
    let mut flood = frames(32, head(kind::WINDOW_UPDATE, 0, 0), &1u32.to_be_bytes());
    flood.extend(frames(32, head(kind::WINDOW_UPDATE, 0, 1), &1u32.to_be_bytes()));
    flood_is_bounded("WINDOW_UPDATE", Vec::new(), flood).await;
}

#[tokio::test]
async fn a_headers_flood_for_streams_not_open_is_bounded() {
    // `:status: 200` (static table entry 8), for a stream the client never opened.
    flood_is_bounded(
        "HEADERS",
        Vec::new(),
        frames(64, head(kind::HEADERS, flag::END_HEADERS | flag::END_STREAM, 101), &[0x88]),
    )
    .await;
}

#[tokio::test]
async fn an_endless_header_block_is_bounded() {
    let prefix = frames(1, head(kind::HEADERS, 0, 101), &[0x88]);
    flood_is_bounded("CONTINUATION", vec![prefix], frames(4, head(kind::CONTINUATION, 0, 101), &[0x88; 4096])).await;
}

#[tokio::test]
async fn a_data_flood_for_a_closed_stream_is_bounded() {
    flood_is_bounded("DATA", Vec::new(), frames(4, head(kind::DATA, 0, 1), &[0; DEFAULT_MAX_FRAME])).await;
}

#[tokio::test]
async fn a_priority_flood_is_bounded() {
    flood_is_bounded("PRIORITY", Vec::new(), frames(64, head(kind::PRIORITY, 0, 1), &[0, 0, 0, 0, 16])).await;
}

#[tokio::test]
async fn a_flood_of_unknown_frame_types_is_bounded() {
    flood_is_bounded("unknown type", Vec::new(), frames(64, head(0xfa, 0, 0), &[1; 100])).await;
}

#[tokio::test]
async fn a_reset_flood_for_closed_streams_is_bounded() {
    flood_is_bounded("RST_STREAM", Vec::new(), frames(64, head(kind::RST_STREAM, 0, 1), &8u32.to_be_bytes())).await;
}

/// A server that floods PINGs once a call is on the connection, and never reads: the call fails
/// at once instead of waiting for its deadline (before the bounds, it waited on writing the
/// acknowledgements the server never read).
#[tokio::test]
async fn a_call_does_not_wait_on_a_flood() {
    let (_dir, path, listener) = socket();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        read_request(&mut s, 1).unwrap();
        s.write_all(&answer(1)).unwrap();
        read_request(&mut s, 3).unwrap();
        let flood = frames(64, head(kind::PING, 0, 0), &[7; 8]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) && s.write_all(&flood).is_ok() {}
    });
    let c = HookClient::new(&path, vec![own_uid()]);
    call(&c).await.expect("the first call is answered");
    let start = Instant::now();
    let err =
        tokio::time::timeout(Duration::from_secs(5), call(&c)).await.expect("the call ended within 5 s").unwrap_err();
    let took = start.elapsed();
    eprintln!("the call failed after {took:?}: {}", err.message);
    assert_eq!(err.code, Code::UNAVAILABLE);
    assert!(
        err.message.contains("than a call takes") || err.message.contains("acknowledgements unwritten"),
        "{}",
        err.message
    );
    assert!(took < Duration::from_secs(1), "the call waited {took:?} on the flood");
    assert!(c.idle.conns.lock().unwrap().is_empty(), "the flooded connection is not kept");
}

/// Keepalive PINGs every 50 ms (grpc-go's shortest is one a second), each read back, keep an
/// idle connection: the next call is made on it.
#[tokio::test]
async fn keepalive_pings_keep_an_idle_connection() {
    let (_dir, path, listener) = socket();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            std::thread::spawn(move || {
                read_request(&mut s, 1).unwrap();
                s.write_all(&answer(1)).unwrap();
                for n in 0..30u8 {
                    std::thread::sleep(Duration::from_millis(50));
                    s.write_all(&frames(1, head(kind::PING, 0, 0), &[n; 8])).unwrap();
                    // Its acknowledgement (a SETTINGS acknowledgement may come first).
                    while read_frame(&mut s).unwrap() != (Head { len: 8, ..head(kind::PING, flag::ACK, 0) }, vec![n; 8])
                    {
                    }
                }
                read_request(&mut s, 3).unwrap();
                s.write_all(&answer(3)).unwrap();
                let _ = s.read(&mut [0; 1]);
            });
        }
    });
    let c = HookClient::new(&path, vec![own_uid()]);
    call(&c).await.expect("the first call is answered");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    assert_eq!(c.idle.conns.lock().unwrap().len(), 1, "the connection is still pooled");
    call(&c).await.expect("the second call is answered on the same connection");
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

/// One end of a socket pair as a client connection whose socket buffer is as small as Linux
/// allows (a few KiB), and the other end, blocking.
fn small_conn() -> (Conn, StdStream) {
    let (ours, theirs) = StdStream::pair().unwrap();
    let one: libc::c_int = 1;
    // SAFETY: setsockopt(2) on an open socket with a c_int option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    ours.set_nonblocking(true).unwrap();
    let io = Socket::new(tokio::net::UnixStream::from_std(ours).unwrap()).unwrap();
    (Conn::new(io), theirs)
}

/// PINGs whose acknowledgements are never read: once the socket takes no more, at most
/// [`MAX_PENDING_ACKS`] (plus one wake-up's frames) wait unwritten, then the connection is unfit.
#[tokio::test]
async fn unwritten_acknowledgements_are_capped() {
    let (mut conn, mut peer) = small_conn();
    let pings = frames(64, head(kind::PING, 0, 0), &[7; 8]);
    for round in 0..14 {
        peer.write_all(&pings).unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        match std::future::poll_fn(|cx| Poll::Ready(conn.tend(cx))).await {
            Ok(()) => assert!(conn.acks <= MAX_PENDING_ACKS, "round {round}: {} acknowledgements unwritten", conn.acks),
            Err(unfit) => {
                assert!(unfit.bound, "{unfit:?}");
                assert!(unfit.why.contains("acknowledgements unwritten"), "{unfit:?}");
                assert!(conn.out.len() <= (MAX_PENDING_ACKS + 64) * 17, "{} bytes unwritten", conn.out.len());
                return;
            }
        }
    }
    panic!("{} acknowledgements unwritten, {} bytes, and the connection still kept", conn.acks, conn.out.len());
}

/// A pooled connection whose acknowledgements the server stops reading, and that then goes
/// quiet, is dropped by the watcher once its write has been blocked for [`WRITE_STALL`].
#[tokio::test]
async fn an_idle_connection_whose_writes_stay_blocked_is_dropped() {
    let (conn, mut peer) = small_conn();
    let idle =
        Arc::new(Idle { conns: Mutex::new(vec![conn]), put_back: tokio::sync::Notify::new(), server: "test".into() });
    let watcher = tokio::spawn(watch(idle.clone()));
    let pings = frames(8, head(kind::PING, 0, 0), &[7; 8]);
    let start = Instant::now();
    let blocked = loop {
        peer.write_all(&pings).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let conns = idle.conns.lock().unwrap();
        let conn = conns.first().expect("kept while its writes are not blocked long");
        if conn.blocked_since.is_some() {
            assert!(conn.acks <= 16, "{} acknowledgements unwritten", conn.acks);
            break Instant::now();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the socket never filled");
    };
    while !idle.conns.lock().unwrap().is_empty() {
        assert!(blocked.elapsed() < WRITE_STALL * 2, "still kept {:?} after its write blocked", blocked.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waited = blocked.elapsed();
    eprintln!("dropped {waited:?} after its write blocked");
    assert!(waited + Duration::from_millis(100) >= WRITE_STALL, "dropped after {waited:?}, before {WRITE_STALL:?}");
    watcher.abort();
}
