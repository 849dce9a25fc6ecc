//! Faults beyond the happy path, each with the proxy's real outcome asserted:
//!
//! * **containerd killed (`kill -9` of the daemon, shims left running) and restarted under load**,
//!   on a containerd of the test's own (`scripts/containerd.sh up` in a fresh root, purged when
//!   the test ends, pass or fail), so the shared one other tests use is never disturbed: the
//!   event stream (1.7) ends promptly with an error status, a call in flight (ExecSync) and new
//!   ones fail `UNAVAILABLE` naming the socket and none hangs, calls succeed again once
//!   containerd is back, and the store is rebuilt on reconnect — a pod created directly on
//!   containerd while the proxy was cut off is known to it without any call for that pod (no
//!   store miss) and its hooks get the pod's labels and cgroup parent, as do the hooks of the pod
//!   created before the crash;
//! * **a hook server that accepts and never answers**, registered `Ignore` with a 200 ms
//!   timeout, in front of the fake runtime: bursts of 500 concurrent CreateContainer calls all
//!   complete, every hook call is cancelled, and the proxy's file descriptors, threads and
//!   memory stay at their baseline burst after burst;
//! * **10 000 pods created and removed** through the proxy (seven CRI calls each, an echoing hook
//!   at four stages) on the fake runtime: the store ends empty, the memory grows by no more than
//!   16 MiB and the hook's connection is reused (file descriptors flat).
//!
//! Two tests found proxy bugs, since fixed (see each test's doc): a stream whose backend dies
//! reached the client as `INTERNAL` without the backend's name, and a hook socket that accepts
//! and never reads made the proxy's memory grow with every call.
//!
//! The proxy's resident memory, threads and open file descriptors are read from `/proc/<pid>`
//! and printed (`--nocapture`) for the record. Every test is bounded in time: a hang fails it,
//! and its processes and containerd root are cleaned up.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use serde_json::json;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, OwnContainerd, Pod};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::hooks::{register, Seen, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

fn map<M: FromIterator<(String, String)>>(kv: &[(&str, &str)]) -> M {
    kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

// ---------------------------------------------------------------------------------------------
// The proxy process as the kernel sees it.

/// Resident memory, threads and open file descriptors of a process.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    rss_kib: u64,
    threads: u64,
    fds: usize,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RSS {:.1} MiB, {} threads, {} fds", self.rss_kib as f64 / 1024.0, self.threads, self.fds)
    }
}

/// `/proc/<pid>/status` (VmRSS, Threads) and the entries of `/proc/<pid>/fd`.
fn usage(pid: u32) -> Usage {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"));
    Usage { rss_kib: field("VmRSS:"), threads: field("Threads:"), fds }
}

/// CPU time (user + system) a process has used so far: `/proc/<pid>/stat` fields 14 and 15.
fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')').expect("stat") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf(3) has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let used: u64 = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    Duration::from_millis(used * 1000 / ticks)
}

/// Samples [`usage`] every 10 ms on a thread of its own until stopped; keeps the maxima.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Usage, usize)>,
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut peak, mut samples) = (Usage::default(), 0);
            while !flag.load(Ordering::Relaxed) {
                let u = usage(pid);
                peak = Usage {
                    rss_kib: peak.rss_kib.max(u.rss_kib),
                    threads: peak.threads.max(u.threads),
                    fds: peak.fds.max(u.fds),
                };
                samples += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            (peak, samples)
        });
        Sampler { stop, thread }
    }

    /// The maxima seen and the number of samples.
    fn finish(self) -> (Usage, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler thread")
    }
}

/// The sandbox and container IDs in the proxy's store (`/debug/store`, on `--debug-addr`).
fn store_ids(proxy: &ProxyProcess) -> (HashSet<String>, HashSet<String>) {
    let (status, body) = proxy.debug_get("/debug/store");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let ids = |k: &str| v[k].as_array().expect(k).iter().filter_map(|s| s.as_str().map(str::to_owned)).collect();
    (ids("pod_sandboxes"), ids("containers"))
}

/// Runs a test's scenario, failing it when it takes longer than `limit` (a hang becomes a
/// failure, and the scenario's guards — processes, containerd roots — are dropped).
async fn bounded(limit: Duration, scenario: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(limit, scenario).await.is_err() {
        panic!("the test did not finish within {limit:?}");
    }
}

/// Log lines containing every one of `parts`.
fn log_lines(proxy: &ProxyProcess, parts: &[&str]) -> Vec<String> {
    proxy.log().lines().filter(|l| parts.iter().all(|p| l.contains(p))).map(str::to_owned).collect()
}

// ---------------------------------------------------------------------------------------------
// 1. containerd killed and restarted under load.

/// One call of the load loop.
struct Outcome {
    started: Instant,
    method: &'static str,
    /// `None`: no answer within [`CALL_LIMIT`].
    result: Option<Result<(), tonic::Status>>,
}

/// Longest a call of the load loop may take before it counts as hung.
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// Runs `tasks` loops of Version and ListContainers through `rt` until `stop`; every outcome.
fn load(
    rt: &cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    tasks: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Outcome>>> {
    (0..tasks)
        .map(|i| {
            let (mut rt, stop) = (rt.clone(), stop.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let (method, result) = if n % 2 == 0 {
                        (
                            "Version",
                            tokio::time::timeout(CALL_LIMIT, rt.version(cri::VersionRequest::default()))
                                .await
                                .map(|r| r.map(drop)),
                        )
                    } else {
                        let call = rt.list_containers(cri::ListContainersRequest::default());
                        ("ListContainers", tokio::time::timeout(CALL_LIMIT, call).await.map(|r| r.map(drop)))
                    };
                    out.push(Outcome { started, method, result: result.ok() });
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                out
            })
        })
        .collect()
}

/// What a GetContainerEvents stream through the proxy delivered.
enum StreamItem {
    Event(Box<cri::ContainerEventResponse>),
    /// The stream's end: `Ok` for a clean end (no error status), and when it came.
    End(Result<(), tonic::Status>, Instant),
}

/// Subscribes to GetContainerEvents through `rt` and forwards what arrives, once the stream is
/// live; `None` (after checking the UNIMPLEMENTED) when the runtime does not implement it
/// (containerd 1.6).
///
/// containerd 1.7 sends the response headers only with the first event, so the call is made in
/// a task of its own, and throwaway sandboxes are run directly on containerd until one of
/// their events arrives: from then on the stream sees every event.
async fn watch_events(
    rt: &cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    env: &Containerd,
) -> Option<tokio::sync::mpsc::UnboundedReceiver<StreamItem>> {
    if !env.has_container_events() {
        let err = rt
            .clone()
            .get_container_events(cri::GetEventsRequest {})
            .await
            .expect_err("containerd 1.6 has no GetContainerEvents");
        assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
        return None;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut rt = rt.clone();
    tokio::spawn(async move {
        let mut stream = match rt.get_container_events(cri::GetEventsRequest {}).await {
            Ok(s) => s.into_inner(),
            Err(e) => return drop(tx.send(StreamItem::End(Err(e), Instant::now()))),
        };
        loop {
            match stream.message().await {
                Ok(Some(ev)) => {
                    if tx.send(StreamItem::Event(Box::new(ev))).is_err() {
                        return;
                    }
                }
                Ok(None) => return drop(tx.send(StreamItem::End(Ok(()), Instant::now()))),
                Err(e) => return drop(tx.send(StreamItem::End(Err(e), Instant::now()))),
            }
        }
    });
    let mut direct = runtime_client(&env.socket);
    for _ in 0..20 {
        let config = sandbox_config(env, &unique("fault-probe"), HashMap::new(), HashMap::new());
        let req = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        let sandbox_id = direct.run_pod_sandbox(req).await.expect("a throwaway sandbox").into_inner().pod_sandbox_id;
        test_support::containerd::remove_sandbox(&mut direct, &sandbox_id).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(StreamItem::Event(ev))) if ev.container_id == sandbox_id => return Some(rx),
                Ok(Some(StreamItem::Event(_))) => {}
                Ok(Some(StreamItem::End(r, _))) => panic!("GetContainerEvents through the proxy ended at once: {r:?}"),
                Ok(None) => panic!("event stream task gone"),
                Err(_) => break,
            }
        }
    }
    panic!("no event of 20 throwaway sandboxes reached GetContainerEvents through the proxy");
}

/// Waits up to `limit` for an event of `container_id` of type `kind`.
async fn expect_event(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<StreamItem>,
    container_id: &str,
    kind: cri::ContainerEventType,
    limit: Duration,
) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(StreamItem::Event(ev)))
                if ev.container_id == container_id && ev.container_event_type == kind as i32 =>
            {
                return
            }
            Ok(Some(StreamItem::Event(_))) => {}
            Ok(Some(StreamItem::End(r, _))) => {
                panic!("event stream ended before the {kind:?} of {container_id}: {r:?}")
            }
            Ok(None) => panic!("event stream task gone"),
            Err(_) => panic!("no {kind:?} event of {container_id} within {limit:?}"),
        }
    }
}

/// The first `stage` call `hook` received after its first `from` calls (waits up to 10 s: post
/// stages run after the proxy has answered).
async fn next_seen(hook: &TestHook, stage: &str, from: usize) -> Seen {
    let find = || hook.seen().into_iter().skip(from).find(|s| s.stage() == stage);
    test_support::wait_until(Duration::from_secs(10), || async { find().is_some() }).await;
    find().unwrap_or_else(|| panic!("no {stage} call after the first {from}: {:?}", hook.seen()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn containerd_killed_and_restarted_under_load() {
    bounded(Duration::from_secs(180), kill_and_restart()).await;
}

async fn kill_and_restart() {
    let t0 = Instant::now();
    let version = Containerd::from_env().series();
    let ctrd = Arc::new(tokio::task::spawn_blocking(move || OwnContainerd::up(version)).await.expect("containerd up"));
    let env = ctrd.env.clone();
    let socket = env.socket.display().to_string();
    eprintln!("own containerd {} on {socket} up in {:?}", env.version, t0.elapsed());

    let dir = tempfile::Builder::new().prefix("rp-faults").tempdir().unwrap();
    let hook = TestHook::echoing(|_, _| {}).await;
    let stages = ["PreRunPodSandbox", "PreCreateContainer", "PostStopContainer", "PostStopPodSandbox"];
    register(dir.path(), "faults.json", hook.socket(), "Fail", &stages, json!({}));
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    assert!(proxy.wait_log(&["hook server added", "faults.json"], 0), "{}", proxy.log());
    assert!(proxy.wait_log(&["store recovered", "start-up"], 0), "start-up recovery:\n{}", proxy.log());
    let mut rt = runtime_client(proxy.socket());

    // The event stream first (1.7), so that it sees pod A's events: it is live through the proxy.
    let mut events = watch_events(&rt, &env).await;
    if events.is_none() {
        eprintln!(
            "containerd {}: no GetContainerEvents (UNIMPLEMENTED); the event-stream part is skipped",
            env.version
        );
    }

    // Pod A, through the proxy, before the crash.
    let sandbox_a = sandbox_config(&env, &unique("fault-a"), map(&[("app", "before-crash")]), map(&[("note", "a")]));
    let pod_a = Pod::start(&mut rt, sandbox_a, container_config(&env, "main", &["sleep", "3600"], None, &[]))
        .await
        .expect("pod A");
    if let Some(rx) = events.as_mut() {
        expect_event(rx, &pod_a.container_id, cri::ContainerEventType::ContainerStartedEvent, Duration::from_secs(10))
            .await;
    }

    // Load: 4 loops of Version / ListContainers through the proxy.
    let stop = Arc::new(AtomicBool::new(false));
    let loops = load(&rt, 4, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A call that is surely in flight at the kill: ExecSync of a 30 s sleep in pod A.
    let exec = tokio::spawn({
        let mut rt = rt.clone();
        let req = cri::ExecSyncRequest {
            container_id: pod_a.container_id.clone(),
            cmd: vec!["sleep".into(), "30".into()],
            timeout: 60,
        };
        async move { rt.exec_sync(req).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!exec.is_finished(), "ExecSync still running");

    // The crash: kill -9 of the daemon alone.
    let killed_at = Instant::now();
    let pid = tokio::task::spawn_blocking({
        let ctrd = ctrd.clone();
        move || ctrd.kill_daemon()
    })
    .await
    .expect("kill");
    let dead_at = Instant::now();
    eprintln!("containerd pid {pid} killed (dead after {:?})", dead_at - killed_at);

    // The event stream ends with a status, promptly.
    if let Some(mut rx) = events.take() {
        let end = async {
            loop {
                match rx.recv().await {
                    Some(StreamItem::Event(_)) => {}
                    Some(StreamItem::End(result, at)) => return (result, at),
                    None => panic!("event stream task gone"),
                }
            }
        };
        let (result, at) = tokio::time::timeout(Duration::from_secs(10), end)
            .await
            .expect("the event stream ended within 10 s of the kill");
        eprintln!("event stream ended {:?} after the kill: {result:?}", at.saturating_duration_since(killed_at));
        let status =
            result.expect_err("the event stream ends with an error status, not as if containerd had finished it");
        assert!(matches!(status.code(), Code::Unavailable | Code::Internal), "UNAVAILABLE or INTERNAL: {status:?}");
        // Whether it names the backend (it does not yet): the ignored test
        // `event_stream_ends_unavailable_naming_the_backend_when_containerd_dies`.
        for line in log_lines(&proxy, &["GetContainerEvents"]) {
            eprintln!("proxy: {line}");
        }
    }

    // The call in flight fails promptly, naming the socket.
    let in_flight =
        tokio::time::timeout(Duration::from_secs(10), exec).await.expect("ExecSync answered within 10 s of the kill");
    let err = in_flight.expect("task").expect_err("ExecSync in flight at the kill");
    eprintln!("ExecSync in flight at the kill: {:?}: {}", err.code(), err.message());
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains(&socket), "names the socket: {err:?}");

    // Calls while containerd is down.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let err = rt.version(cri::VersionRequest::default()).await.expect_err("containerd is down");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains(&socket), "names the socket: {err:?}");
    let n = hook.seen().len();
    let err = rt
        .stop_container(cri::StopContainerRequest { container_id: pod_a.container_id.clone(), timeout: 0 })
        .await
        .expect_err("StopContainer while containerd is down");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains(&socket), "names the socket: {err:?}");
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for l in loops {
        outcomes.extend(l.await.expect("load loop"));
    }
    let hung: Vec<_> = outcomes.iter().filter(|o| o.result.is_none()).map(|o| o.method).collect();
    assert!(hung.is_empty(), "{} calls got no answer within {CALL_LIMIT:?}: {hung:?}", hung.len());
    let before: Vec<_> = outcomes.iter().filter(|o| o.started < killed_at).collect();
    let after: Vec<_> = outcomes.iter().filter(|o| o.started > dead_at).collect();
    let ok_before = before.iter().filter(|o| matches!(o.result, Some(Ok(())))).count();
    let mut unexpected = Vec::new();
    for o in &before {
        match &o.result {
            Some(Ok(())) => {}
            // In flight at the kill.
            Some(Err(s)) if s.code() == Code::Unavailable && s.message().contains(&socket) => {}
            other => unexpected.push(format!("{} (before the kill): {other:?}", o.method)),
        }
    }
    for o in &after {
        match &o.result {
            Some(Err(s)) if s.code() == Code::Unavailable && s.message().contains(&socket) => {}
            other => unexpected.push(format!("{} (containerd dead): {other:?}", o.method)),
        }
    }
    let in_flight = before.iter().filter(|o| matches!(o.result, Some(Err(_)))).count();
    eprintln!(
        "load: {} calls; before the kill {} ({ok_before} OK, {in_flight} in flight failed UNAVAILABLE); while down {}, all UNAVAILABLE",
        outcomes.len(),
        before.len(),
        after.len()
    );
    assert!(unexpected.is_empty(), "calls that did not fail cleanly:\n{}", unexpected.join("\n"));
    assert!(ok_before > 0 && !after.is_empty(), "the load ran before and after the kill");
    if let Some(Err(s)) = after.first().and_then(|o| o.result.as_ref()) {
        eprintln!("a call while down: {:?}: {}", s.code(), s.message());
    }
    assert!(
        hook.seen().iter().skip(n).all(|s| s.stage() != "PostStopContainer"),
        "no post stage for a StopContainer containerd never got"
    );

    // containerd comes back. Nothing calls the proxy until pod B exists.
    let connected_before = proxy.count_log(&["connected to backend"]);
    let recovered_before = proxy.count_log(&["store recovered"]);
    // The proxy's first backend connection, made by the first call after start-up, is no
    // reconnection: the only rebuild so far is the start-up one.
    let reconnect_rebuilds = proxy.count_log(&["store recovered", "backend reconnected"]);
    assert_eq!(reconnect_rebuilds, 0, "no rebuild for the first connection:\n{}", proxy.log());
    let restarted = Instant::now();
    tokio::task::spawn_blocking({
        let ctrd = ctrd.clone();
        move || ctrd.restart()
    })
    .await
    .expect("restart");
    eprintln!("containerd restarted in {:?}", restarted.elapsed());

    // Pod B, directly on containerd while the proxy is still cut off from it: only a rebuild can
    // teach the proxy's store about it.
    let mut direct = runtime_client(&env.socket);
    let sandbox_b = sandbox_config(&env, &unique("fault-b"), map(&[("app", "after-crash")]), map(&[("note", "b")]));
    let pod_b = Pod::start(&mut direct, sandbox_b, container_config(&env, "main", &["sleep", "3600"], None, &[]))
        .await
        .expect("pod B");
    let (pods, containers) = store_ids(&proxy);
    assert!(
        !pods.contains(&pod_b.sandbox_id) && !containers.contains(&pod_b.container_id),
        "pod B unknown before the reconnect"
    );
    assert!(
        pods.contains(&pod_a.sandbox_id) && containers.contains(&pod_a.container_id),
        "pod A kept through the outage"
    );
    assert_eq!(proxy.count_log(&["store recovered"]), recovered_before, "no rebuild while cut off");

    // The first call through the proxy reconnects.
    let first = Instant::now();
    let mut attempts = 0;
    let version_answer = loop {
        attempts += 1;
        match rt.version(cri::VersionRequest::default()).await {
            Ok(v) => break v.into_inner(),
            Err(e) if first.elapsed() < Duration::from_secs(10) => {
                eprintln!("after the restart, attempt {attempts}: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no successful call within 10 s of containerd's restart: {e:?}"),
        }
    };
    assert_eq!(version_answer.runtime_name, "containerd");
    eprintln!("first call after the restart succeeded at attempt {attempts} ({:?})", first.elapsed());
    assert!(proxy.wait_log(&["connected to backend"], connected_before), "a new backend connection:\n{}", proxy.log());
    assert!(
        proxy.wait_log(&["store recovered", "backend reconnected"], reconnect_rebuilds),
        "no rebuild on reconnect:\n{}",
        proxy.log()
    );
    for line in log_lines(&proxy, &["store recovered"]) {
        eprintln!("proxy: {}", &line[line.find("store recovered").unwrap_or(0)..]);
    }
    let (pods, containers) = store_ids(&proxy);
    assert!(
        pods.contains(&pod_b.sandbox_id) && containers.contains(&pod_b.container_id),
        "pod B learnt by the rebuild"
    );
    assert!(pods.contains(&pod_a.sandbox_id) && containers.contains(&pod_a.container_id), "pod A still known");

    // (1.7) A new event stream through the proxy works.
    let mut events = watch_events(&rt, &env).await;

    // StopContainer of both pods: their hooks get the full pod info, from the store.
    for (pod, app) in [(&pod_b, "after-crash"), (&pod_a, "before-crash")] {
        let n = hook.seen().len();
        rt.stop_container(cri::StopContainerRequest { container_id: pod.container_id.clone(), timeout: 0 })
            .await
            .unwrap_or_else(|e| panic!("StopContainer of the {app} pod: {e:?}"));
        let Seen::Container(_, req) = next_seen(&hook, "PostStopContainer", n).await else {
            panic!("container stage expected")
        };
        assert_eq!(req.container_meta.as_ref().map(|m| m.id.as_str()), Some(pod.container_id.as_str()), "{app}");
        assert_eq!(req.pod_labels.get("app").map(String::as_str), Some(app), "{app}: labels");
        assert_eq!(req.pod_cgroup_parent, pod.cgroup_parent(), "{app}: cgroup parent");
        assert_eq!(
            req.pod_meta.as_ref().map(|m| m.name.as_str()),
            pod.config.metadata.as_ref().map(|m| m.name.as_str()),
            "{app}: pod name"
        );
    }
    if let Some(rx) = events.as_mut() {
        expect_event(rx, &pod_b.container_id, cri::ContainerEventType::ContainerStoppedEvent, Duration::from_secs(10))
            .await;
    }
    let misses: Vec<_> = log_lines(&proxy, &["store miss"])
        .into_iter()
        .filter(|l| {
            [&pod_a.sandbox_id, &pod_a.container_id, &pod_b.sandbox_id, &pod_b.container_id]
                .iter()
                .any(|id| l.contains(id.as_str()))
        })
        .collect();
    assert!(misses.is_empty(), "pod A and B were served from the store, not by store misses:\n{}", misses.join("\n"));

    let ids = [
        (pod_a.sandbox_id.clone(), pod_a.container_id.clone()),
        (pod_b.sandbox_id.clone(), pod_b.container_id.clone()),
    ];
    pod_a.remove(&mut rt).await;
    pod_b.remove(&mut rt).await;
    let (pods, containers) = store_ids(&proxy);
    assert!(ids.iter().all(|(s, c)| !pods.contains(s) && !containers.contains(c)), "both pods gone from the store");
    drop(proxy);
    drop(ctrd);
    eprintln!("test took {:?}", t0.elapsed());
}

/// When containerd dies under a GetContainerEvents stream, the response headers went out
/// already, so the proxy ends the call with trailers `grpc-status: 14` and a message naming the
/// backend socket, as unary calls get (`… backend unix://… failed the call: …`). This test found
/// it passing on only `RST_STREAM(INTERNAL_ERROR)`, which tonic reports as `INTERNAL: h2
/// protocol error` — neither the retryable code nor the backend's name (`passthrough::forward`
/// now ends a broken download with trailers; a stream the backend resets is still reset).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_stream_ends_unavailable_naming_the_backend_when_containerd_dies() {
    bounded(Duration::from_secs(120), event_stream_end()).await;
}

async fn event_stream_end() {
    let version = Containerd::from_env().series();
    let ctrd = Arc::new(tokio::task::spawn_blocking(move || OwnContainerd::up(version)).await.expect("containerd up"));
    let socket = ctrd.env.socket.display().to_string();
    let proxy = ProxyProcess::start(BIN, &ctrd.env.socket, &[]);
    let rt = runtime_client(proxy.socket());
    let Some(mut rx) = watch_events(&rt, &ctrd.env).await else {
        eprintln!(
            "containerd {}: no GetContainerEvents; UNIMPLEMENTED passed through, nothing more to check",
            ctrd.env.version
        );
        return;
    };
    let killed_at = Instant::now();
    tokio::task::spawn_blocking({
        let ctrd = ctrd.clone();
        move || ctrd.kill_daemon()
    })
    .await
    .expect("kill");
    let end = async {
        loop {
            match rx.recv().await {
                Some(StreamItem::Event(_)) => {}
                Some(StreamItem::End(result, _)) => return result,
                None => panic!("event stream task gone"),
            }
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(10), end)
        .await
        .expect("the event stream ended within 10 s of the kill");
    eprintln!("event stream ended {:?} after the kill: {result:?}", killed_at.elapsed());
    for line in log_lines(&proxy, &["GetContainerEvents"]) {
        eprintln!("proxy: {line}");
    }
    let status = result.expect_err("an error status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains(&socket), "the status names the backend {socket}: {status:?}");
}

// ---------------------------------------------------------------------------------------------
// 2. A hook server that accepts and never answers.

const CREATE_BURST: usize = 500;
/// Bursts measured after the warm-up burst.
const BURSTS: usize = 8;

/// A CreateContainer request for sandbox `sandbox_id` (unknown to the runtime: the proxy builds
/// the hook request from `sandbox_config`).
fn create_request(sandbox_id: &str, i: usize) -> cri::CreateContainerRequest {
    let uid = format!("uid-{sandbox_id}");
    cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: format!("c{i}"), attempt: 0 }),
            image: Some(cri::ImageSpec { image: "localhost/busybox:local".into(), ..Default::default() }),
            command: vec!["sleep".into(), "3600".into()],
            envs: vec![cri::KeyValue { key: "I".into(), value: i.to_string() }],
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    cpu_shares: 512,
                    memory_limit_in_bytes: 64 << 20,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        sandbox_config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("p{i}"),
                uid: uid.clone(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: map(&[("app", "burst")]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/pod{uid}"),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// `count` CreateContainer calls at once through `rt`, each for a pod sandbox of its own (calls
/// for one pod run one at a time by design); returns the container IDs and the wall time.
async fn create_burst(
    rt: &cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    tag: &str,
    count: usize,
) -> (Vec<String>, Duration) {
    let started = Instant::now();
    let calls: Vec<_> = (0..count)
        .map(|i| {
            let mut rt = rt.clone();
            let req = create_request(&format!("{tag}-sandbox-{i}"), i);
            tokio::spawn(async move { tokio::time::timeout(Duration::from_secs(30), rt.create_container(req)).await })
        })
        .collect();
    let mut ids = Vec::new();
    for (i, c) in calls.into_iter().enumerate() {
        let answer = c
            .await
            .expect("call task")
            .unwrap_or_else(|_| panic!("{tag}: CreateContainer {i} got no answer within 30 s"));
        ids.push(answer.unwrap_or_else(|e| panic!("{tag}: CreateContainer {i}: {e:?}")).into_inner().container_id);
    }
    (ids, started.elapsed())
}

/// How the hook server misbehaves.
enum Hang {
    /// An HTTP/2 server that takes every call and never answers.
    Http2(FakeBackend),
    /// A socket that accepts connections and never reads from them (the HTTP/2 handshake never
    /// completes). Holds the accepted connections.
    Silent {
        socket: PathBuf,
        accepted: Arc<Mutex<Vec<tokio::net::UnixStream>>>,
        _dir: tempfile::TempDir,
        task: tokio::task::JoinHandle<()>,
    },
}

impl Hang {
    async fn silent() -> Hang {
        let dir = tempfile::Builder::new().prefix("rp-silent").tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let accepted = Arc::new(Mutex::new(Vec::new()));
        let held = accepted.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                held.lock().unwrap().push(stream);
            }
        });
        Hang::Silent { socket, accepted, _dir: dir, task }
    }

    fn socket(&self) -> &Path {
        match self {
            Hang::Http2(f) => f.socket(),
            Hang::Silent { socket, .. } => socket,
        }
    }

    /// Connections (silent) or calls (HTTP/2) it received, for the record.
    fn describe(&self) -> String {
        match self {
            Hang::Http2(f) => {
                format!("{} hook calls received, {} of them cancelled by the proxy", f.calls().len(), f.abandoned())
            }
            Hang::Silent { accepted, .. } => {
                format!("{} connections accepted (never read)", accepted.lock().unwrap().len())
            }
        }
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        if let Hang::Silent { task, .. } = self {
            task.abort();
        }
    }
}

async fn hanging_hook_burst(hang: Hang, what: &str) {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--hook-config-dir", dir.path().to_str().unwrap()]);
    register(dir.path(), "hang.json", hang.socket(), "Ignore", &["PreCreateContainer"], json!({"timeout-ms": 200}));
    assert!(proxy.wait_log(&["hook server added", "hang.json"], 0), "{}", proxy.log());
    let rt = runtime_client(proxy.socket());

    let pid = proxy.pid();
    let cold = usage(pid);

    // Warm-up: one burst of the same size, so that the client, backend and hook connections
    // exist and the allocator has grown to what 500 calls in flight need. That first burst
    // raises the proxy's RSS by ~27 MiB whether or not a hook is registered (measured: no hook,
    // an echoing hook and this hung one alike), and further bursts do not raise it again: a
    // high-water mark, not a leak. The baseline is taken after it.
    let (warm, took) = create_burst(&rt, &format!("{what}-warm"), CREATE_BURST).await;
    assert!(took >= Duration::from_millis(200), "the warm-up calls waited for the hook's timeout: {took:?}");
    remove_containers(&rt, &warm).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = usage(pid);

    let sampler = Sampler::start(pid);
    let (mut times, mut rss) = (Vec::new(), Vec::new());
    for round in 0..BURSTS {
        let (ids, took) = create_burst(&rt, &format!("{what}-{round}"), CREATE_BURST).await;
        assert_eq!(
            ids.iter().collect::<HashSet<_>>().len(),
            CREATE_BURST,
            "every call answered with its own container ID"
        );
        assert!(ids.iter().all(|id| id.starts_with("fake-container-")));
        assert!(took >= Duration::from_millis(200), "the calls waited for the hook's timeout: {took:?}");
        let (_, stored) = store_ids(&proxy);
        assert!(ids.iter().all(|id| stored.contains(id)), "every container recorded");
        remove_containers(&rt, &ids).await;
        times.push(took);
        rss.push(usage(pid).rss_kib / 1024);
    }
    let (peak, samples) = sampler.finish();
    assert_eq!(store_ids(&proxy), (HashSet::new(), HashSet::new()), "store empty after RemoveContainer");
    let calls = CREATE_BURST * (BURSTS + 1);
    let ignored = log_lines(&proxy, &["PreCreateContainer hook server hang.json", "failure-policy Ignore: going on"]);
    let other: Vec<_> = ignored.iter().filter(|l| !l.contains("timed out after 200ms")).collect();
    for l in other.iter().take(3) {
        eprintln!("{what}: a hook failure other than the timeout: {l}");
    }
    assert_eq!(ignored.len(), calls, "every hook call failed and was ignored");
    assert!(other.len() * 10 <= calls, "{} of {calls} hook failures were not the 200 ms timeout", other.len());

    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = usage(pid);
    eprintln!(
        "{what}: {BURSTS} × {CREATE_BURST} concurrent CreateContainer past a hung hook (Ignore, 200 ms) in {times:?} \
         (warm-up burst: {took:?})\n  at start  {cold}\n  baseline  {baseline} (after the warm-up burst)\n  \
         peak      {peak} ({samples} samples)\n  2 s after {after}\n  RSS after each burst (MiB): {rss:?}\n  \
         hook server: {}",
        hang.describe()
    );
    assert!(after.fds <= baseline.fds + 8, "fds back near the baseline: {} → {}", baseline.fds, after.fds);
    // The allocator keeps some of what a 500-connection burst freed (+6–8.5 MiB here, the most
    // on a loaded machine); a leak would grow burst over burst, which the second check catches.
    assert!(after.rss_kib <= baseline.rss_kib + 12 * 1024, "RSS back near the baseline: {baseline} → {after}");
    // Burst over burst, RSS moves by a few MiB either way with no trend (30 bursts here: 40–46
    // MiB, the last 42; CI runs: 35–42 and 35–45, from below the baseline up to the allocator's
    // high-water mark). A leak raises the level without bound: the later half's median may not
    // pass the highest of the baseline and the earlier half by more than 4 MiB. (A leak of 4 KiB
    // per call, 2 MiB per burst, fails it; the noise leaves no room to catch much less.)
    let (first, last) = rss.split_at(BURSTS / 2);
    let level = first.iter().copied().chain([baseline.rss_kib / 1024]).max().unwrap_or_default();
    assert!(median(last) <= level as f64 + 4.0, "RSS grows burst over burst (MiB): {rss:?}, baseline {baseline}");
    assert!(after.threads <= baseline.threads + 2, "threads: {baseline} → {after}");
    if let Hang::Http2(f) = &hang {
        // Every hook call that reached the server was cancelled when its 200 ms were up: the
        // proxy keeps no stream open to a hung server.
        let all_cancelled =
            test_support::wait_until(Duration::from_secs(5), || async { f.abandoned() == f.calls().len() }).await;
        assert!(all_cancelled, "hook calls cancelled by the proxy: {}", hang.describe());
    }
    // The proxy still serves normally.
    let mut rt = rt.clone();
    rt.version(cri::VersionRequest::default()).await.expect("Version after the burst");
}

/// The median of `values` (the mean of the two middle ones for an even count; 0 for none).
fn median(values: &[u64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2] as f64,
        n => (sorted[n / 2 - 1] + sorted[n / 2]) as f64 / 2.0,
    }
}

async fn remove_containers(
    rt: &cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    ids: &[String],
) {
    let calls: Vec<_> = ids
        .iter()
        .map(|id| {
            let mut rt = rt.clone();
            let req = cri::RemoveContainerRequest { container_id: id.clone() };
            tokio::spawn(async move { rt.remove_container(req).await })
        })
        .collect();
    for c in calls {
        c.await.expect("task").expect("RemoveContainer");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_server_that_never_answers_500_calls_complete_and_nothing_leaks() {
    let hang = Hang::Http2(FakeBackend::start(Behaviour::Hang).await);
    bounded(Duration::from_secs(120), hanging_hook_burst(hang, "http2-never-answers")).await;
}

/// A hook server whose socket accepts and never reads — a frozen hook process (SIGSTOP, cgroup
/// freezer) looks like this, as the kernel completes connections into the listen backlog. This
/// test found the proxy's memory growing by about 9 KB per hook call, without bound (42 → 79 MiB
/// over 12 bursts of 500 calls): every timed-out call left what it queued on the one connection,
/// which could not drain. Fixed in the dispatcher: a call that times out lets its connection go
/// (closed once the calls still on it end) and the next call connects anew. Measured after the
/// fix: 42.5 MiB after the warm-up burst, 45.2 MiB after 8 more, flat from burst to burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_socket_that_accepts_and_never_reads_500_calls_complete_and_nothing_leaks() {
    bounded(Duration::from_secs(120), hanging_hook_burst(Hang::silent().await, "accepts-never-reads")).await;
}

// ---------------------------------------------------------------------------------------------
// 3. 10 000 pods created and removed.

const PODS: usize = 10_000;
const WARM_UP_PODS: usize = 100;
const IN_FLIGHT: usize = 32;
const POD_STAGES: [&str; 4] = ["PreRunPodSandbox", "PreCreateContainer", "PostStopContainer", "PostStopPodSandbox"];

/// One pod's life through the proxy, as kubelet runs it: RunPodSandbox, CreateContainer,
/// StartContainer, StopContainer, RemoveContainer, StopPodSandbox, RemovePodSandbox.
async fn pod_life(rt: &mut cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>, i: usize) {
    let uid = format!("uid-{i}");
    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("pod-{i}"),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        labels: map(&[("app", "churn"), ("i", &i.to_string())]),
        annotations: map(&[("team", "storage")]),
        linux: Some(cri::LinuxPodSandboxConfig { cgroup_parent: format!("/kubepods/pod{uid}"), ..Default::default() }),
        ..Default::default()
    };
    let what = |call: &str| format!("pod {i}: {call}");
    let sid = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("RunPodSandbox")))
        .into_inner()
        .pod_sandbox_id;
    let mut req = create_request(&sid, i);
    req.sandbox_config = Some(config);
    let cid = rt
        .create_container(req)
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("CreateContainer")))
        .into_inner()
        .container_id;
    rt.start_container(cri::StartContainerRequest { container_id: cid.clone() })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("StartContainer")));
    rt.stop_container(cri::StopContainerRequest { container_id: cid.clone(), timeout: 0 })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("StopContainer")));
    rt.remove_container(cri::RemoveContainerRequest { container_id: cid })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("RemoveContainer")));
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sid.clone() })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("StopPodSandbox")));
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sid })
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("RemovePodSandbox")));
}

/// Pods `from..to`, [`IN_FLIGHT`] at a time, on one client connection (as kubelet).
async fn run_pods(
    rt: &cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    from: usize,
    to: usize,
) -> Duration {
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(from));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (mut rt, next) = (rt.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= to {
                        return;
                    }
                    pod_life(&mut rt, i).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.expect("pod worker");
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_pods_created_and_removed_leave_an_empty_store_and_flat_memory() {
    bounded(Duration::from_secs(400), ten_thousand_pods()).await;
}

async fn ten_thousand_pods() {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, fake.socket(), &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let hook = TestHook::echoing(|_, _| {}).await;
    register(dir.path(), "echo.json", hook.socket(), "Fail", &POD_STAGES, json!({}));
    assert!(proxy.wait_log(&["hook server added", "echo.json"], 0), "{}", proxy.log());
    let rt = runtime_client(proxy.socket());
    let pid = proxy.pid();
    let start = usage(pid);

    let warm = run_pods(&rt, 0, WARM_UP_PODS).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = usage(pid);
    assert_eq!(store_ids(&proxy), (HashSet::new(), HashSet::new()), "store empty after the warm-up");

    let sampler = Sampler::start(pid);
    let cpu_before = (cpu_time(&pid.to_string()), cpu_time("self"));
    let took = run_pods(&rt, WARM_UP_PODS, WARM_UP_PODS + PODS).await;
    let cpu = (cpu_time(&pid.to_string()) - cpu_before.0, cpu_time("self") - cpu_before.1);
    let (peak, samples) = sampler.finish();
    let (pods, containers) = store_ids(&proxy);
    assert!(
        pods.is_empty() && containers.is_empty(),
        "store empty: {} pod sandboxes, {} containers left",
        pods.len(),
        containers.len()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = usage(pid);

    // The hook saw every pod, with the pod's info from the store at the ID-only stages.
    let seen = hook.seen();
    let total = WARM_UP_PODS + PODS;
    for stage in POD_STAGES {
        assert_eq!(seen.iter().filter(|s| s.stage() == stage).count(), total, "{stage} calls");
    }
    let mut checked = 0;
    for s in &seen {
        if let Seen::Container(stage, req) = s {
            if stage == "PostStopContainer" {
                let uid = req.pod_meta.as_ref().map(|m| m.uid.clone()).unwrap_or_default();
                assert_eq!(req.pod_cgroup_parent, format!("/kubepods/pod{uid}"), "{stage}: cgroup parent of {uid}");
                assert_eq!(req.pod_labels.get("app").map(String::as_str), Some("churn"));
                assert!(req.container_meta.as_ref().is_some_and(|m| m.id.starts_with("fake-container-")));
                checked += 1;
            }
        }
    }
    assert_eq!(checked, total);
    for m in [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "RemoveContainer",
        "StopPodSandbox",
        "RemovePodSandbox",
    ] {
        assert_eq!(
            fake.calls_to(&format!("/runtime.v1.RuntimeService/{m}")).len(),
            total,
            "{m} calls reaching the runtime"
        );
    }

    let per_pod = took / PODS as u32;
    eprintln!(
        "{PODS} pods ({} CRI calls, {} hook calls), {IN_FLIGHT} at a time: {took:?} ({per_pod:?} per pod); warm-up of {WARM_UP_PODS}: {warm:?}\n  \
         CPU: proxy {:?}, test process (client, hook server, fake runtime) {:?}\n  \
         at start {start}\n  idle     {idle} (after the warm-up)\n  peak     {peak} ({samples} samples)\n  2 s after {after}\n  \
         RSS growth {:+.1} MiB",
        PODS * 7,
        PODS * POD_STAGES.len(),
        cpu.0,
        cpu.1,
        (after.rss_kib as f64 - idle.rss_kib as f64) / 1024.0
    );
    assert!(after.rss_kib <= idle.rss_kib + 16 * 1024, "RSS growth ≤ 16 MiB: {idle} → {after}");
    // One client connection, one backend connection, and a hook connection per hook call in
    // flight (at most one per pod in flight; up to 16 kept idle between calls): bounded by the
    // concurrency, not by the number of calls.
    assert!(peak.fds <= idle.fds + IN_FLIGHT + 8, "fds bounded during the run: idle {}, peak {}", idle.fds, peak.fds);
    assert!(after.fds <= idle.fds + 2, "fds after: {} → {}", idle.fds, after.fds);
}
