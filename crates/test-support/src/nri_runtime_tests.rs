//! The stand-in against plugins built on the `nri-plugin` crate: a complete one, and one that
//! answers a per-event call `UNIMPLEMENTED` (as a plugin built for NRI before 0.12 does).

use super::*;
use hook_api::status::{Code, Status};
use nri_plugin::{Handler, Refusal};

/// Subscribes to every event; records the events without an answer; does not take `refuse` as
/// its own call (answered `UNIMPLEMENTED`, as by a plugin built before NRI 0.12).
struct Limited {
    refuse: Option<Event>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Event>>>,
}

impl Handler for Limited {
    fn configure(&mut self, _req: &nri::ConfigureRequest) -> i32 {
        nri_plugin::event_mask(LIFECYCLE)
    }
    async fn synchronize(
        &mut self,
        _pods: Vec<nri::PodSandbox>,
        _containers: Vec<nri::Container>,
    ) -> Vec<nri::ContainerUpdate> {
        Vec::new()
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

/// Runs `handler` against `runtime` through one pod's whole life; returns the plugin's side as
/// the stand-in saw it.
async fn life(runtime: NriRuntime, handler: Limited) -> Plugin {
    let options = nri_plugin::Options {
        socket: runtime.socket().to_owned(),
        name: "limited".into(),
        index: "50".into(),
        program: "test",
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut handler = handler;
        nri_plugin::run(&mut handler, &options, None, async {
            let _ = stopped.await;
        })
        .await
    });
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
    task.await.unwrap().unwrap();
    plugin
}

/// A plugin that serves every call: registered with its NRI version, every event its own call,
/// none `UNIMPLEMENTED`, nothing over StateChange.
#[tokio::test]
async fn a_complete_plugin_gets_every_event_as_its_own_call() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = Limited { refuse: None, seen: seen.clone() };
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
    let handler = Limited { refuse: Some(Event::RunPodSandbox), seen: seen.clone() };
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
    let options = nri_plugin::Options {
        socket: runtime.socket().to_owned(),
        name: "old".into(),
        index: "50".into(),
        program: "test",
    };
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut handler = Limited { refuse: None, seen };
        nri_plugin::run(&mut handler, &options, None, async {
            let _ = stopped.await;
        })
        .await
    });
    let mut plugin = runtime.accept(Vec::new(), Vec::new()).await.expect("registered: the mask is within 0.6's");
    assert_eq!(plugin.events & !runtime.valid_events(), 0);
    let p = pod("s1", &[], "/kubepods/pod1");
    assert!(
        matches!(plugin.deliver(Event::RunPodSandbox, &p, None).await.unwrap(), Ok(Delivered::Answered(m, _)) if m == "StateChange")
    );
    assert!(!plugin.subscribed(Event::PostUpdatePodSandbox));
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
