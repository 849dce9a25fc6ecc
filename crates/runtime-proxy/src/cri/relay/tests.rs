//! The relay's unit tests: frames held both ways, WINDOW_UPDATEs inside open blocks, credit for taken bodies.

use super::*;
use crate::metrics::Metrics;

fn core() -> Core {
    let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-test.sock"));
    let router = Arc::new(Router::new(runtime.clone(), runtime, None, Arc::new(Metrics::new())));
    Core::new(router, TaskTracker::new(), 100, true, None)
}

/// The heads of the whole frames in `buf`.
fn heads(buf: &[u8]) -> Vec<Head> {
    let (mut at, mut out) = (0, Vec::new());
    while let Some((head, end)) = whole_frame(buf, at) {
        out.push(head);
        at = end;
    }
    out
}

/// The payload lengths of the DATA frames of `stream` in `buf`.
fn data_frames(buf: &[u8], stream: u32) -> Vec<usize> {
    heads(buf).into_iter().filter(|h| h.kind == kind::DATA && h.stream == stream).map(|h| h.len).collect()
}

/// A connection with a call on stream 1 (the `:path` block returned) whose next DATA frame
/// from each peer is held: both connection windows used up by bytes of the relay's own (an
/// edited request, a taken-over answer).
fn held_both_ways() -> (Core, BytesMut) {
    let mut core = core();
    let mut client = BytesMut::from(&PREFACE_AND_SETTINGS[..]);
    let mut block = BytesMut::new();
    frame::put_literal(&mut block, b":path", b"/runtime.v1.RuntimeService/Version");
    frame::put_headers(&mut client, 1, false, &block, frame::DEFAULT_MAX_FRAME);
    core.client_input(&client);
    let mut backend = BytesMut::new();
    frame::settings(&mut backend, &[]);
    frame::put_headers(&mut backend, 1, false, &[0x88], frame::DEFAULT_MAX_FRAME);
    core.backend_input(&backend);
    core.backend.window.room = 0;
    core.client.window.room = 0;
    let (mut client, mut backend) = (BytesMut::new(), BytesMut::new());
    frame::put_data(&mut client, 1, &Bytes::from_static(&[1; 10]), true, frame::DEFAULT_MAX_FRAME);
    frame::put_data(&mut backend, 1, &Bytes::from_static(&[2; 20]), false, frame::DEFAULT_MAX_FRAME);
    core.client_input(&client);
    core.backend_input(&backend);
    assert!(core.client.held.is_some() && core.backend.held.is_some());
    core.to_client.clear();
    core.to_backend.clear();
    (core, block)
}

#[test]
fn frames_held_both_ways_are_released_by_window_updates_queued_behind_them() {
    let (mut core, block) = held_both_ways();
    // Each peer's credit comes behind more of its own frames: a PING (and, from the client,
    // a new call whose header block spans three frames), then WINDOW_UPDATE; it comes in
    // two reads.
    let (mut client, mut backend) = (BytesMut::new(), BytesMut::new());
    frame::ping(&mut client, false, b"clientpi");
    frame::put_headers(&mut client, 3, true, &block, 16);
    core.client_input(&client);
    assert!(core.to_client.is_empty(), "nothing went on yet");
    client.clear();
    frame::window_update(&mut client, 0, 100);
    frame::ping(&mut backend, false, b"runtimep");
    frame::window_update(&mut backend, 0, 100);
    core.client_input(&client);
    assert_eq!(data_frames(&core.to_client, 1), vec![20], "the runtime's DATA went on with the client's credit");
    core.backend_input(&backend);
    assert_eq!(data_frames(&core.to_backend, 1), vec![10], "the client's DATA went on with the runtime's credit");
    assert!(core.client.held.is_none() && core.backend.held.is_none());
    // What came behind the held frames still went on, in order: the PINGs after the DATA.
    let pings = |buf: &[u8]| heads(buf).iter().filter(|h| h.kind == kind::PING).count();
    assert_eq!((pings(&core.to_backend), pings(&core.to_client)), (1, 1));
    assert!(core.streams.contains_key(&3), "the call behind the held frame was taken up");
}

#[test]
fn a_window_update_inside_an_open_header_block_is_not_taken_out() {
    let (mut core, block) = held_both_ways();
    // HEADERS without END_HEADERS, the WINDOW_UPDATE, then the CONTINUATION: a protocol
    // error once the block's turn comes, not credit to take early.
    let mut split = BytesMut::new();
    frame::put_headers(&mut split, 3, true, &block, 16);
    let first = HEAD_LEN + Head::parse(&split).len;
    let mut client = BytesMut::from(&split[..first]);
    frame::window_update(&mut client, 0, 100);
    client.extend_from_slice(&split[first..]);
    core.client_input(&client);
    assert!(core.backend.held.is_some(), "the runtime's DATA still waits");
    assert_eq!(core.client.window.room, 0);
}

/// Connection credit for bodies the relay takes (here: calls taken over, ImageService on a
/// socket of its own) goes to the client with the next bytes it is written, or once
/// [`CREDIT_BATCH`] is owed, not in a write of its own per call.
#[tokio::test]
async fn credit_for_taken_bodies_waits_for_the_next_write_or_a_batch() {
    let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-test.sock"));
    let image = Arc::new(Backend::new("/nonexistent/runtime-proxy-test-images.sock"));
    let router = Arc::new(Router::new(runtime, image, None, Arc::new(Metrics::new())));
    let mut core = Core::new(router, TaskTracker::new(), 100, true, None);
    core.client_input(&PREFACE_AND_SETTINGS);
    core.to_client.clear();
    let mut block = BytesMut::new();
    frame::put_literal(&mut block, b":path", b"/runtime.v1.ImageService/ListImages");
    let credit = |buf: &[u8]| -> Vec<u32> {
        let (mut at, mut out) = (0, Vec::new());
        while let Some((head, end)) = whole_frame(buf, at) {
            if head.kind == kind::WINDOW_UPDATE && head.stream == 0 {
                out.push(increment(&head, &buf[at..end]).unwrap_or(0));
            }
            at = end;
        }
        out
    };
    let call = |core: &mut Core, id: u32| {
        let mut client = BytesMut::new();
        frame::put_headers(&mut client, id, false, &block, frame::DEFAULT_MAX_FRAME);
        frame::put_data(&mut client, id, &Bytes::from(vec![0; 1000]), true, frame::DEFAULT_MAX_FRAME);
        core.client_input(&client);
    };
    call(&mut core, 1);
    assert_eq!(credit(&core.to_client), Vec::<u32>::new(), "owed, not written alone");
    core.settle_credit();
    assert_eq!(credit(&core.to_client), vec![1000], "settled with the next write");
    core.to_client.clear();
    let mut id = 3;
    while credit(&core.to_client).is_empty() {
        call(&mut core, id);
        id += 2;
    }
    let calls = (id - 3) / 2;
    assert_eq!(credit(&core.to_client), vec![calls * 1000], "written once a batch is owed");
    assert_eq!(calls, CREDIT_BATCH.div_ceil(1000));
}

const PREFACE_AND_SETTINGS: [u8; 33] = {
    let mut b = [0u8; 33];
    let mut i = 0;
    while i < 24 {
        b[i] = frame::PREFACE[i];
        i += 1;
    }
    b[27] = kind::SETTINGS;
    b
};

/// A taken-over call's answer (ImageService on a socket of its own) on a connection whose client
/// lowered SETTINGS_INITIAL_WINDOW_SIZE: its DATA waits until the runtime's ACK of those SETTINGS
/// went to the client, and then fits the new window. (h2's client applies the new window only
/// on the ACK; DATA before it is counted against the old window, and its WINDOW_UPDATE never
/// came: the call hung.)
#[tokio::test]
async fn taken_over_data_waits_for_the_ack_of_the_clients_settings() {
    let runtime = Arc::new(Backend::new("/nonexistent/runtime-proxy-test.sock"));
    let image = Arc::new(Backend::new("/nonexistent/runtime-proxy-test-images.sock"));
    let router = Arc::new(Router::new(runtime, image, None, Arc::new(Metrics::new())));
    let answer = || Answer {
        head: Response::new(()),
        data: Bytes::from(vec![7; 200]),
        trailers: Some(HeaderMap::from_iter([(
            http::HeaderName::from_static("grpc-status"),
            http::HeaderValue::from_static("0"),
        )])),
    };
    for lost in [false, true] {
        let mut core = Core::new(router.clone(), TaskTracker::new(), 100, true, None);
        let mut client = BytesMut::from(&frame::PREFACE[..]);
        frame::settings(&mut client, &[(setting::INITIAL_WINDOW_SIZE, 64)]);
        let mut block = BytesMut::new();
        frame::put_literal(&mut block, b":path", b"/runtime.v1.ImageService/ListImages");
        frame::put_headers(&mut client, 1, false, &block, frame::DEFAULT_MAX_FRAME);
        frame::put_data(&mut client, 1, &Bytes::from_static(&[0; 5]), true, frame::DEFAULT_MAX_FRAME);
        core.client_input(&client);
        core.on_reply(1, Ok(answer()));
        assert_eq!(data_frames(&core.to_client, 1), Vec::<usize>::new(), "no DATA before the ACK");
        core.to_client.clear();
        if lost {
            core.backend_lost("gone".into());
        } else {
            let mut ack = BytesMut::new();
            frame::settings_ack(&mut ack);
            core.backend_input(&ack);
        }
        let sent = heads(&core.to_client);
        let ack_at =
            sent.iter().position(|h| h.kind == kind::SETTINGS && h.has(flag::ACK)).expect("the ACK went to the client");
        let data_at = sent.iter().position(|h| h.kind == kind::DATA).expect("then the DATA");
        assert!(ack_at < data_at, "the ACK before the DATA: {sent:?}");
        assert_eq!(data_frames(&core.to_client, 1), vec![64], "as much as the new window takes (lost: {lost})");
    }
}
