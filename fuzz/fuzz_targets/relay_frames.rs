//! The relay's frame handling (`runtime_proxy::cri::relay::Core`, the part of a relayed connection
//! that reads and writes frames, without its sockets): any bytes from the client and from the
//! runtime, split anywhere and interleaved in any order, with well-formed calls and answers mixed
//! in, the runtime connection lost and the connection stopped at any point, never make it panic
//! or loop, and what it has to write to either side is always whole HTTP/2 frames (after the
//! client preface it passes on).
#![no_main]

use std::sync::{Arc, OnceLock};

use arbitrary::Arbitrary;
use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use runtime_proxy::cri::relay::Core;
use runtime_proxy::cri::router::Router;
use runtime_proxy::grpc::backend::Backend;
use runtime_proxy::http2::frame::{self, Head, HEAD_LEN, PREFACE};
use runtime_proxy::metrics::Metrics;

#[derive(Arbitrary, Debug)]
enum Op {
    Client(Vec<u8>),
    Backend(Vec<u8>),
    ClientFrame {
        kind: u8,
        flags: u8,
        stream: u8,
        payload: Vec<u8>,
    },
    BackendFrame {
        kind: u8,
        flags: u8,
        stream: u8,
        payload: Vec<u8>,
    },
    /// A call's head (a literal header block), with or without END_STREAM and `grpc-timeout`.
    ClientCall {
        stream: u8,
        path: u8,
        timeout: bool,
        end_stream: bool,
    },
    /// An answer's head (`:status` 200) or its trailers (`grpc-status`).
    BackendHead {
        stream: u8,
        trailers: Option<u8>,
        end_stream: bool,
    },
    BackendLost,
    Stop,
    /// Let the calls' tasks run, then do what they asked.
    Tasks,
}

const PATHS: [&str; 5] = [
    "/runtime.v1.RuntimeService/Version",
    "/runtime.v1.RuntimeService/GetContainerEvents",
    "/runtime.v1.ImageService/ListImages",
    "/runtime.v1alpha2.RuntimeService/ListContainers",
    "/x.Y/Z",
];

fn router() -> Arc<Router> {
    static ROUTER: OnceLock<Arc<Router>> = OnceLock::new();
    ROUTER
        .get_or_init(|| {
            let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-fuzz.sock"));
            Arc::new(Router::new(runtime.clone(), runtime, None, Arc::new(Metrics::new())))
        })
        .clone()
}

/// Whether `buf` is whole frames.
fn whole_frames(buf: &[u8]) -> bool {
    let mut at = 0;
    while at < buf.len() {
        if buf.len() - at < HEAD_LEN {
            return false;
        }
        at += HEAD_LEN + Head::parse(&buf[at..]).len;
    }
    at == buf.len()
}

fn frame_bytes(kind: u8, flags: u8, stream: u8, payload: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    Head { len: payload.len(), kind, flags, stream: u32::from(stream) }.put(&mut b);
    b.extend_from_slice(payload);
    b
}

fuzz_target!(|ops: Vec<Op>| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    rt.block_on(async {
        let mut core = Core::new(router(), tokio_util::task::TaskTracker::new(), 8, true, None);
        core.client_input(PREFACE);
        assert_eq!(&core.to_backend[..], PREFACE, "the preface goes on first");
        core.to_backend.clear();
        for op in ops {
            match op {
                Op::Client(b) => core.client_input(&b),
                Op::Backend(b) => core.backend_input(&b),
                Op::ClientFrame { kind, flags, stream, payload } => {
                    core.client_input(&frame_bytes(kind, flags, stream, &payload))
                }
                Op::BackendFrame { kind, flags, stream, payload } => {
                    core.backend_input(&frame_bytes(kind, flags, stream, &payload))
                }
                Op::ClientCall { stream, path, timeout, end_stream } => {
                    let mut block = BytesMut::new();
                    block.extend_from_slice(&[0x83, 0x86]); // :method POST, :scheme http
                    block.extend_from_slice(&[0x04]); // :path, literal value, indexed name
                    let path = PATHS[usize::from(path) % PATHS.len()];
                    block.extend_from_slice(&[path.len() as u8]);
                    block.extend_from_slice(path.as_bytes());
                    frame::put_literal(&mut block, b"content-type", b"application/grpc");
                    if timeout {
                        frame::put_literal(&mut block, b"grpc-timeout", b"1m");
                    }
                    let mut b = BytesMut::new();
                    frame::put_headers(&mut b, u32::from(stream), end_stream, &block, frame::DEFAULT_MAX_FRAME);
                    core.client_input(&b);
                }
                Op::BackendHead { stream, trailers, end_stream } => {
                    let mut block = BytesMut::new();
                    match trailers {
                        None => {
                            frame::put_status(&mut block, 200);
                            frame::put_literal(&mut block, b"content-type", b"application/grpc");
                        }
                        Some(code) => {
                            frame::put_literal(&mut block, b"grpc-status", (code % 17).to_string().as_bytes())
                        }
                    }
                    let mut b = BytesMut::new();
                    frame::put_headers(&mut b, u32::from(stream), end_stream, &block, frame::DEFAULT_MAX_FRAME);
                    core.backend_input(&b);
                }
                Op::BackendLost => core.backend_lost("fuzz".into()),
                Op::Stop => core.stop(),
                Op::Tasks => {
                    for _ in 0..4 {
                        tokio::task::yield_now().await;
                    }
                    core.run_commands();
                }
            }
            assert!(whole_frames(&core.to_client), "partial frame to the client: {:?}", core.to_client);
            assert!(whole_frames(&core.to_backend), "partial frame to the runtime: {:?}", core.to_backend);
            core.to_client.clear();
            core.to_backend.clear();
            core.after_write();
            if core.finished() {
                break;
            }
        }
        core.finish();
    });
});
