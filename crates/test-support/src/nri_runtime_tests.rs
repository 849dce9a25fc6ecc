//! The stand-in against plugins built on the `nri-plugin` crate: a complete one, and one that
//! answers a per-event call `UNIMPLEMENTED` (as a plugin built for NRI before 0.12 does).

use super::*;
use hook_api::status::{Code, Status};
use nri_plugin::{Handler, Refusal};

/// Subscribes to every event; records the events without an answer; does not take `refuse` as
/// its own call (answered `UNIMPLEMENTED`, as by a plugin built before NRI 0.12). Answers
/// Synchronize with one update per container carrying `bulky` bytes (none when 0).
#[derive(Default)]
struct Limited {
    refuse: Option<Event>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Event>>>,
    bulky: usize,
    /// The pods and containers Synchronize handed over (all parts together).
    synced: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
}

impl Handler for Limited {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        nri_plugin::event_mask(LIFECYCLE)
    }
    async fn synchronize(
        &mut self,
        pods: Vec<nri::PodSandbox>,
        containers: Vec<nri::Container>,
    ) -> Vec<nri::ContainerUpdate> {
        *self.synced.lock().unwrap() = (pods.len(), containers.len());
        if self.bulky == 0 {
            return Vec::new();
        }
        let value = "x".repeat(self.bulky);
        let resources =
            |_| nri::LinuxResources { unified: [("memory.high".into(), value.clone())].into(), ..Default::default() };
        containers.iter().map(|c| nri_plugin::answer::update(&c.id, resources(c))).collect()
    }
    async fn create_container(
        &mut self,
        _req: nri::CreateContainerRequest,
    ) -> Result<nri::CreateContainerResponse, Refusal> {
        Ok(Default::default())
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
        let event = Event::try_from(evt.event).unwrap_or(Event::Unknown);
        self.seen.lock().unwrap().push(event);
        // A hook server's UNIMPLEMENTED through a plugin must not look like a missing call.
        if event == Event::StopPodSandbox {
            return Err(Status::new(Code::UNIMPLEMENTED, "a hook server's own UNIMPLEMENTED"));
        }
        Ok(())
    }
    fn per_event_call(&self, event: Event) -> bool {
        self.refuse != Some(event)
    }
}

/// Runs `handler` as the plugin `name` (index 50) of `runtime` in a task of its own, until the
/// returned sender sends (or is dropped); the task panics when `nri_plugin::run` fails.
fn spawn_plugin(
    runtime: &NriRuntime,
    name: &str,
    mut handler: Limited,
) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let options = nri_plugin::Options {
        socket: runtime.socket().to_owned(),
        name: name.into(),
        index: "50".into(),
        program: "test",
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        nri_plugin::run(&mut handler, &options, None, async {
            let _ = stopped.await;
        })
        .await
        .expect("the plugin ran until stopped")
    });
    (stop, task)
}

/// Runs `handler` against `runtime` through one pod's whole life; returns the plugin's side as
/// the stand-in saw it.
async fn life(runtime: NriRuntime, handler: Limited) -> Plugin {
    let (stop, task) = spawn_plugin(&runtime, "limited", handler);
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.expect("registered and synchronized");
    let p = pod("s1", &[], "/kubepods/pod1");
    let c = container("c1", &p);
    for event in LIFECYCLE {
        let container = (!pod_level(event)).then_some(&c);
        let answer = plugin.deliver(event, &p, container).await.expect("delivered");
        match event {
            // From its own call: UNKNOWN (an UNIMPLEMENTED there would make the runtime send it
            // again over StateChange); over StateChange the code does not matter to the runtime.
            Event::StopPodSandbox => {
                let want = if plugin.deprecated.is_empty() { 2 } else { UNIMPLEMENTED };
                assert!(matches!(&answer, Err(s) if s.code == want), "{answer:?}");
            }
            _ => assert!(matches!(answer, Ok(Delivered::Answered(..))), "{event:?}: {answer:?}"),
        }
    }
    let _ = stop.send(());
    task.await.unwrap();
    plugin
}

/// A plugin that serves every call: registered with its NRI version, every event its own call,
/// none `UNIMPLEMENTED`, nothing over StateChange.
#[tokio::test]
async fn a_complete_plugin_gets_every_event_as_its_own_call() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = Limited { seen: seen.clone(), ..Default::default() };
    let plugin = life(NriRuntime::v0_12().unwrap(), handler).await;
    assert_eq!(plugin.registered.nri_version, nri_plugin::events::SPOKEN);
    assert!(plugin.unimplemented().is_empty(), "{:?}", plugin.calls);
    assert!(plugin.deprecated.is_empty());
    assert!(!plugin.calls.iter().any(|(m, _)| m == "StateChange"), "{:?}", plugin.calls);
    assert_eq!(seen.lock().unwrap().len(), WITH_STATE_CHANGE_FORM.len());
}

/// A plugin that answers RunPodSandbox's call `UNIMPLEMENTED`: the stand-in, as NRI 0.12 does,
/// delivers it over StateChange, and from then on every event with a StateChange form (marked
/// deprecated); the plugin still sees each event once.
#[tokio::test]
async fn an_unimplemented_call_falls_back_to_state_change() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = Limited { refuse: Some(Event::RunPodSandbox), seen: seen.clone(), ..Default::default() };
    let plugin = life(NriRuntime::v0_12().unwrap(), handler).await;
    // (StopPodSandbox's StateChange is answered with the handler's own UNIMPLEMENTED.)
    assert_eq!(plugin.unimplemented(), ["RunPodSandbox", "StateChange"]);
    let all: BTreeSet<&str> = WITH_STATE_CHANGE_FORM.iter().map(|(_, m)| *m).collect();
    assert_eq!(plugin.deprecated, all);
    assert_eq!(plugin.calls.iter().filter(|(m, _)| m == "StateChange").count(), WITH_STATE_CHANGE_FORM.len());
    assert_eq!(seen.lock().unwrap().len(), WITH_STATE_CHANGE_FORM.len());
}

/// A runtime before 0.12 (containerd 1.7, 2.0 to 2.2): the plugin subscribes only to what it
/// knows (else "invalid plugin events" would refuse it) and gets StateChange.
#[tokio::test]
async fn an_older_runtime_gets_a_mask_it_knows_and_state_change() {
    let runtime = NriRuntime::before_0_12().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (stop, task) = spawn_plugin(&runtime, "old", Limited { seen, ..Default::default() });
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.expect("registered: the mask is within 0.6's");
    assert_eq!(plugin.events & !runtime.valid_events(), 0);
    let p = pod("s1", &[], "/kubepods/pod1");
    assert!(
        matches!(plugin.deliver(Event::RunPodSandbox, &p, None).await.unwrap(), Ok(Delivered::Answered(m, _)) if m == "StateChange")
    );
    assert!(!plugin.subscribed(Event::PostUpdatePodSandbox));
    let _ = stop.send(());
    task.await.unwrap();
}

/// A node whose state passes one ttrpc message both ways: 2,000 containers with 3 KiB of
/// annotations each (6 MiB) reach the plugin whole, in parts; its 2,000 updates of 3 KiB each
/// come back as an answer under 4 MiB and the rest in `UpdateContainers` requests under 4 MiB,
/// none lost.
#[tokio::test]
async fn a_state_over_one_message_goes_in_parts_both_ways() {
    let runtime = NriRuntime::v0_12().unwrap();
    let synced = std::sync::Arc::new(std::sync::Mutex::new((0, 0)));
    let handler = Limited { bulky: 3 << 10, synced: synced.clone(), ..Default::default() };
    let (stop, task) = spawn_plugin(&runtime, "big", handler);
    let pods: Vec<_> = (0..500).map(|i| pod(&format!("s{i}"), &[], &format!("/kubepods/pod{i}"))).collect();
    let note = "n".repeat(3 << 10);
    let containers: Vec<_> = (0..2000)
        .map(|i| {
            let mut c = container(&format!("c{i}"), &pods[i % pods.len()]);
            c.annotations = vec![nri::BytesEntry { key: b"note".to_vec(), value: note.clone().into_bytes() }];
            c
        })
        .collect();
    let mut plugin = runtime.accept(pods, containers).await.expect("registered and synchronized");
    assert_eq!(*synced.lock().unwrap(), (500, 2000), "every part taken whole");
    let limit = nri_plugin::wire::MAX_MESSAGE;
    assert!(plugin.sync.request_bytes.len() > 1, "{:?}", plugin.sync.request_bytes);
    assert!(plugin.sync.request_bytes.iter().all(|b| *b < limit), "{:?}", plugin.sync.request_bytes);
    assert!(plugin.sync.answer_bytes < limit && !plugin.sync.answered.is_empty(), "{}", plugin.sync.answer_bytes);
    let mut got = plugin.sync.answered.len();
    while got < 2000 && plugin.take_plugin_calls(Duration::from_millis(500)).await.unwrap() > 0 {
        got = plugin.sync.answered.len() + plugin.updates.iter().map(|u| u.update.len()).sum::<usize>();
    }
    assert_eq!(
        got,
        2000,
        "answer {} + {:?}",
        plugin.sync.answered.len(),
        plugin.updates.iter().map(|u| u.update.len()).collect::<Vec<_>>()
    );
    assert!(plugin.updates.iter().all(|u| u.encoded_len() < limit));
    let _ = stop.send(());
    task.await.unwrap();
}
