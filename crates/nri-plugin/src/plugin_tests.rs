//! The loop against fake runtimes and a recording handler.

use super::*;
use hook_api::status::{Code, Status};

/// Records what it is given; answers each container of a Synchronize with an update.
#[derive(Default)]
struct Recorder {
    synced: Vec<(Vec<String>, Vec<String>)>,
    /// Events without an answer: (event, pod ID, container ID).
    events: Vec<(nri::Event, String, String)>,
    /// The mask `configure` answers (default: CreateContainer).
    mask: Option<i32>,
    /// What `wanted_events` answers.
    wanted: Option<i32>,
}

impl Handler for Recorder {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        self.mask.unwrap_or_else(|| crate::event_mask([nri::Event::CreateContainer]))
    }
    fn wanted_events(&mut self) -> Option<i32> {
        self.wanted
    }
    async fn synchronize(
        &mut self,
        pods: Vec<nri::PodSandbox>,
        containers: Vec<nri::Container>,
    ) -> Vec<nri::ContainerUpdate> {
        let update = containers
            .iter()
            .map(|c| nri::ContainerUpdate { container_id: c.id.clone(), ..Default::default() })
            .collect();
        self.synced.push((pods.into_iter().map(|p| p.id).collect(), containers.into_iter().map(|c| c.id).collect()));
        update
    }
    async fn create_container(
        &mut self,
        req: nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, Refusal> {
        match req.container.unwrap_or_default().name.as_str() {
            "refused" => Err(Status::new(Code::INTERNAL, "no")),
            _ => Ok(nri::CreateContainerResponse::default()),
        }
    }
    async fn update_container(
        &mut self,
        _req: nri::UpdateContainerRequest,
    ) -> Result<nri::UpdateContainerResponse, Refusal> {
        Ok(Default::default())
    }
    async fn stop_container(&mut self, _req: nri::StopContainerRequest) -> Result<nri::StopContainerResponse, Refusal> {
        Ok(Default::default())
    }
    async fn event(&mut self, evt: nri::StateChangeEvent) -> Result<(), Refusal> {
        let event = nri::Event::try_from(evt.event).unwrap_or(nri::Event::Unknown);
        self.events.push((event, evt.pod.unwrap_or_default().id, evt.container.unwrap_or_default().id));
        Ok(())
    }
}

fn options(socket: PathBuf) -> Options {
    Options { socket, name: "t".into(), index: "10".into(), program: "test" }
}

/// A Synchronize with one pod that is not protobuf at all: the others reach the handler and the
/// answer goes out.
#[tokio::test]
async fn synchronize_skips_what_does_not_decode() {
    let (mut handler, options) = (Recorder::default(), options("/nonexistent".into()));
    let mut session = Session::new(&mut handler, &options);
    let good = nri::PodSandbox { id: "s2".into(), ..Default::default() }.encode_to_vec();
    let broken = b"\x0a\x02s1\x12\x7f\x01".to_vec();
    let payload = SynchronizeItems { pods: vec![broken, good], containers: Vec::new(), more: false }.encode_to_vec();
    assert!(session.dispatch("Synchronize", &payload).await.is_ok());
    assert!(session.synchronized);
    assert_eq!(handler.synced, [(vec!["s2".to_owned()], vec![])]);
}

/// NRI 0.7+'s Synchronize in parts (a state over one 4 MiB ttrpc message: here 6 MiB of pods in
/// two parts of 3 MiB): each part but the last is answered with `more` and no update, the last
/// with the handler's updates over every part; a 0.6 runtime's single request (the next
/// connection's) starts afresh. Fails without split handling (the first part taken as the whole).
#[tokio::test]
async fn a_synchronize_in_parts_is_taken_whole() {
    let (mut handler, options) = (Recorder::default(), options("/nonexistent".into()));
    let pod = |id: &str| {
        let big = nri::BytesEntry { key: b"padding".to_vec(), value: vec![b'x'; 3 << 20] };
        nri::PodSandbox { id: id.into(), annotations: vec![big], ..Default::default() }.encode_to_vec()
    };
    let container = |id: &str, pod: &str| {
        nri::Container { id: id.into(), pod_sandbox_id: pod.into(), ..Default::default() }.encode_to_vec()
    };
    let part = |p: &str, c: &str, more: bool| {
        SynchronizeItems { pods: vec![pod(p)], containers: vec![container(c, p)], more }.encode_to_vec()
    };
    let first = part("p1", "c1", true);
    assert!(
        first.len() < crate::wire::MAX_MESSAGE && 2 * first.len() > crate::wire::MAX_MESSAGE,
        "{} bytes",
        first.len()
    );
    {
        let mut session = Session::new(&mut handler, &options);
        let answer =
            nri::SynchronizeResponse::decode(session.dispatch("Synchronize", &first).await.unwrap().as_slice())
                .unwrap();
        assert!(answer.more && answer.update.is_empty() && !session.synchronized, "{answer:?}");
        let last = session.dispatch("Synchronize", &part("p2", "c2", false)).await.unwrap();
        let answer = nri::SynchronizeResponse::decode(last.as_slice()).unwrap();
        assert!(!answer.more && session.synchronized);
        assert_eq!(answer.update.iter().map(|u| u.container_id.as_str()).collect::<Vec<_>>(), ["c1", "c2"]);
    }
    let mut session = Session::new(&mut handler, &options);
    let answer = session.dispatch("Synchronize", &part("p3", "c3", false)).await.unwrap();
    assert_eq!(nri::SynchronizeResponse::decode(answer.as_slice()).unwrap().update.len(), 1);
    assert_eq!(handler.synced.last().unwrap(), &(vec!["p3".to_owned()], vec!["c3".to_owned()]));
}

/// Every answer-less event's NRI 0.12 call and its StateChange form reach `Handler::event` alike,
/// with the event, pod and container; the first such call decides the protocol level.
#[tokio::test]
async fn per_event_calls_and_state_change_reach_the_same_handler_method() {
    let (mut handler, options) = (Recorder::default(), options("/nonexistent".into()));
    let pod = nri::PodSandbox { id: "s1".into(), ..Default::default() };
    let container = nri::Container { id: "c1".into(), ..Default::default() };
    let notices: Vec<_> = crate::events::EVENTS.iter().filter(|s| s.call == crate::events::Call::Notice).collect();
    assert_eq!(notices.len(), 9);
    {
        let mut session = Session::new(&mut handler, &options);
        for spec in &notices {
            let payload = if spec.container {
                nri::StartContainerRequest { pod: Some(pod.clone()), container: Some(container.clone()) }
                    .encode_to_vec()
            } else {
                nri::RunPodSandboxRequest { pod: Some(pod.clone()) }.encode_to_vec()
            };
            assert_eq!(session.dispatch(spec.method, &payload).await.unwrap(), Vec::<u8>::new(), "{}", spec.method);
        }
        assert_eq!(session.protocol, Some(Protocol::PerEvent));
    }
    let mut session = Session::new(&mut handler, &options);
    for spec in &notices {
        let evt = nri::StateChangeEvent {
            event: spec.event as i32,
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        session.dispatch("StateChange", &evt.encode_to_vec()).await.unwrap();
    }
    assert_eq!(session.protocol, Some(Protocol::StateChange));
    let (per_event, state_change) = handler.events.split_at(notices.len());
    for (i, spec) in notices.iter().enumerate() {
        let want = (spec.event, "s1".to_owned(), if spec.container { "c1" } else { "" }.to_owned());
        assert_eq!(per_event[i], want, "{}", spec.method);
        assert_eq!(state_change[i].0, spec.event);
    }
}

/// The subscribed mask stays within what the runtime's NRI knows: PostUpdatePodSandbox (bit 12,
/// NRI 0.10+) is left out for a runtime that sent no NRI version (containerd 1.7, 2.1: a bit they
/// do not know fails the registration), kept for an NRI 0.12 one, which also fixes the protocol
/// level at Configure.
#[tokio::test]
async fn the_mask_stays_within_the_runtimes_nri() {
    let wanted = crate::event_mask([nri::Event::RunPodSandbox, nri::Event::PostUpdatePodSandbox]);
    let mut handler = Recorder { mask: Some(wanted), ..Default::default() };
    let options = options("/nonexistent".into());
    for (nri_version, mask, protocol) in [("", 1, None), ("v0.12.1", wanted, Some(Protocol::PerEvent))] {
        let mut session = Session::new(&mut handler, &options);
        let req = nri::ConfigureRequest {
            runtime_name: "fake".into(),
            nri_version: nri_version.into(),
            ..Default::default()
        };
        let answer = session.dispatch("Configure", &req.encode_to_vec()).await.unwrap();
        assert_eq!(nri::ConfigureResponse::decode(answer.as_slice()).unwrap().events, mask, "{nri_version:?}");
        assert_eq!(session.protocol, protocol);
    }
}

/// A wake re-registers only when the handler wants other events than the connection subscribed
/// to, of those the runtime's NRI knows: not for no answer, the same events, or a bit the runtime
/// would not take anyway (PostUpdatePodSandbox on a runtime before NRI 0.10).
#[tokio::test]
async fn resubscribing_needs_other_known_events() {
    let (create, stop) = (nri::Event::CreateContainer, nri::Event::StopContainer);
    let mut handler = Recorder { mask: Some(crate::event_mask([create])), ..Default::default() };
    let options = options("/nonexistent".into());
    let mut session = Session::new(&mut handler, &options);
    assert!(!session.resubscribe(), "not configured yet");
    let req = nri::ConfigureRequest { runtime_name: "fake".into(), ..Default::default() };
    session.dispatch("Configure", &req.encode_to_vec()).await.unwrap();
    for (wanted, again) in [
        (None, false),
        (Some(crate::event_mask([create])), false),
        (Some(crate::event_mask([create, nri::Event::PostUpdatePodSandbox])), false),
        (Some(crate::event_mask([create, stop])), true),
        (Some(crate::event_mask([stop])), true),
    ] {
        session.handler.wanted = wanted;
        assert_eq!(session.resubscribe(), again, "{:?}", wanted.map(events::names));
    }
}

/// A handler's refusal is the ttrpc error status the runtime fails its call with.
#[tokio::test]
async fn a_refusal_is_an_error_status() {
    let (mut handler, options) = (Recorder::default(), options("/nonexistent".into()));
    let mut session = Session::new(&mut handler, &options);
    let req = |name: &str| {
        let container = nri::Container { name: name.into(), ..Default::default() };
        let payload = nri::CreateContainerRequest { pod: None, container: Some(container) }.encode_to_vec();
        ttrpc::Request {
            service: PLUGIN_SERVICE.into(),
            method: "CreateContainer".into(),
            payload,
            ..Default::default()
        }
        .encode_to_vec()
    };
    let refused = session.handle(&req("refused")).await;
    assert_eq!(refused.status, Some(ttrpc::Status { code: 13, message: "no".into() }));
    assert_eq!(session.handle(&req("fine")).await.status, None);
    let unknown =
        ttrpc::Request { service: PLUGIN_SERVICE.into(), method: "Nope".into(), ..Default::default() }.encode_to_vec();
    assert_eq!(session.handle(&unknown).await.status.unwrap().code, 12);
}

/// A fake runtime registers the plugin, then closes the connection: right away (the plugin was
/// never configured: a plain close, as when containerd stops), or after Configure and before
/// Synchronize — what containerd 2.1 does to a plugin it cannot synchronize (1.7 keeps the
/// connection open instead: the deadline). That one is an error naming the failed
/// synchronization, so the plugin says why it registers again.
#[tokio::test]
async fn a_close_between_configure_and_synchronize_is_a_failed_synchronization() {
    for configure in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let socket = root.path().join("nri.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let runtime = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (read, write) = stream.into_split();
            let (mut rx, tx) = (Receiver::new(read), Sender::new(write));
            let register = rx.next().await.unwrap();
            assert_eq!((register.conn, register.kind), (RUNTIME_CONN, REQUEST));
            tx.send(RUNTIME_CONN, register.stream, RESPONSE, 0, &ttrpc::Response::default().encode_to_vec())
                .await
                .unwrap();
            if configure {
                let payload =
                    nri::ConfigureRequest { runtime_name: "fake".into(), ..Default::default() }.encode_to_vec();
                let req = ttrpc::Request {
                    service: PLUGIN_SERVICE.into(),
                    method: "Configure".into(),
                    payload,
                    ..Default::default()
                };
                tx.send(PLUGIN_CONN, 1, REQUEST, 0, &req.encode_to_vec()).await.unwrap();
                let answer = rx.next().await.unwrap();
                assert_eq!((answer.conn, answer.kind), (PLUGIN_CONN, RESPONSE));
            }
        });
        let (mut handler, options) = (Recorder::default(), options(socket));
        let mut session = Session::new(&mut handler, &options);
        let outcome = tokio::time::timeout(Duration::from_secs(2), session.serve(&mut None))
            .await
            .expect("the session ends at the close");
        runtime.await.unwrap();
        match (configure, outcome) {
            (false, outcome) => assert_eq!(outcome.ok(), Some(Ended::Closed)),
            (true, Err(e)) => {
                assert!(format!("{e:#}").contains("did not synchronize it: it closed the connection"), "{e:#}")
            }
            (true, Ok(_)) => panic!("a close after Configure taken for a plain close"),
        }
    }
}

/// Sends `to_send` at its first wake; wants the events in `wanted` (0: no answer).
struct Updater {
    wanted: std::sync::Arc<std::sync::atomic::AtomicI32>,
    to_send: Vec<nri::ContainerUpdate>,
}

impl Handler for Updater {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        crate::event_mask([nri::Event::CreateContainer])
    }
    fn wanted_events(&mut self) -> Option<i32> {
        Some(self.wanted.load(std::sync::atomic::Ordering::SeqCst)).filter(|&m| m != 0)
    }
    async fn synchronize(&mut self, _: Vec<nri::PodSandbox>, _: Vec<nri::Container>) -> Vec<nri::ContainerUpdate> {
        Vec::new()
    }
    async fn create_container(
        &mut self,
        _: nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, Refusal> {
        Ok(Default::default())
    }
    async fn update_container(
        &mut self,
        _: nri::UpdateContainerRequest,
    ) -> Result<nri::UpdateContainerResponse, Refusal> {
        Ok(Default::default())
    }
    async fn stop_container(&mut self, _: nri::StopContainerRequest) -> Result<nri::StopContainerResponse, Refusal> {
        Ok(Default::default())
    }
    async fn event(&mut self, _: nri::StateChangeEvent) -> Result<(), Refusal> {
        Ok(())
    }
    async fn refresh(&mut self) -> Vec<nri::ContainerUpdate> {
        std::mem::take(&mut self.to_send)
    }
}

/// The handler needs other events while the plugin's UpdateContainers is under way: the
/// connection stays open until the runtime answered it, then closes ([`Ended::Resubscribe`]).
/// Fails when the close cuts the call.
#[tokio::test]
async fn a_resubscribe_waits_for_the_plugins_call_under_way() {
    let root = tempfile::tempdir().unwrap();
    let socket = root.path().join("nri.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let (update_tx, update_rx) = tokio::sync::oneshot::channel();
    let runtime = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, write) = stream.into_split();
        let (mut rx, tx) = (Receiver::new(read), Sender::new(write));
        let register = rx.next().await.unwrap();
        tx.send(RUNTIME_CONN, register.stream, RESPONSE, 0, &ttrpc::Response::default().encode_to_vec()).await.unwrap();
        let calls = [
            ("Configure", nri::ConfigureRequest { runtime_name: "fake".into(), ..Default::default() }.encode_to_vec()),
            ("Synchronize", nri::SynchronizeRequest::default().encode_to_vec()),
        ];
        for (stream, (method, payload)) in calls.into_iter().enumerate() {
            let req =
                ttrpc::Request { service: PLUGIN_SERVICE.into(), method: method.into(), payload, ..Default::default() };
            tx.send(PLUGIN_CONN, 2 * stream as u32 + 1, REQUEST, 0, &req.encode_to_vec()).await.unwrap();
            let answer = rx.next().await.unwrap();
            assert_eq!((answer.conn, answer.kind), (PLUGIN_CONN, RESPONSE), "{method}");
        }
        synced_tx.send(()).unwrap();
        let update = rx.next().await.unwrap();
        assert_eq!((update.conn, update.kind), (RUNTIME_CONN, REQUEST), "UpdateContainers");
        update_tx.send(()).unwrap();
        // The handler now needs other events; the plugin's call is not answered yet.
        let early = tokio::time::timeout(Duration::from_millis(300), rx.next()).await;
        assert!(early.is_err(), "the connection closed (or spoke) before its call was answered: {early:?}");
        let answer = nri::UpdateContainersResponse::default().encode_to_vec();
        let resp = ttrpc::Response { status: None, payload: answer };
        tx.send(RUNTIME_CONN, update.stream, RESPONSE, 0, &resp.encode_to_vec()).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(2), rx.next()).await.expect("closed after the answer");
        assert_eq!(closed.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    });
    let wanted = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let update = nri::ContainerUpdate { container_id: "c1".into(), ..Default::default() };
    let mut handler = Updater { wanted: wanted.clone(), to_send: vec![update] };
    let options = options(socket);
    let (wake_tx, wake_rx) = watch::channel(0u64);
    let mut wake = Some(wake_rx);
    let mut session = Session::new(&mut handler, &options);
    let drive = async {
        synced_rx.await.unwrap();
        wake_tx.send(1).unwrap();
        update_rx.await.unwrap();
        wanted.store(crate::event_mask([nri::Event::StopContainer]), std::sync::atomic::Ordering::SeqCst);
        wake_tx.send(2).unwrap();
    };
    let (outcome, ()) =
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(session.serve(&mut wake), drive) })
            .await
            .expect("the session ends");
    assert_eq!(outcome.unwrap(), Ended::Resubscribe);
    runtime.await.unwrap();
}
