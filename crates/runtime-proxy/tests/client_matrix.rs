//! The real-client matrix: CRI clients that we did not write, each run once directly on the real
//! containerd and once through the real runtime-proxy, must give the same results.
//!
//! The clients (tests/clients/, installed by `tests/clients/setup.sh <workspace>/target/cri-clients`,
//! which scripts/test.sh runs and these tests run again, a no-op when it is up to date):
//!
//! * Python grpcio with default channel options: `:authority` is the percent-encoded socket path;
//! * Python grpcio with `grpc.default_authority` = the socket path: the raw path, as crictl 1.26
//!   and grpc-go-era kubelets send it;
//! * Node @grpc/grpc-js with the protos loaded by @grpc/proto-loader;
//! * raw HTTP/2 from Python's h2 package with no `:authority` at all.
//!
//! Each runs the scenario of tests/clients/cri_scenario.py (Version, a host-network pod with one
//! container, ExecSync, a NOT_FOUND, teardown, and on containerd 1.7 GetContainerEvents) over CRI
//! v1 and v1alpha2; the results must be equal but for the IDs. One more test runs the grpcio client
//! on a pod that the example hook changes, and checks the env and the real cgroup.
//!
//! The other side too: a hook server we did not write the gRPC side of, tests/clients/hook_server.py
//! (Python grpcio, stubs generated from crates/hook-api/proto by the same setup.sh), changes and
//! refuses real pods through the proxy.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use serde_json::{json, Value};
use test_support::clients::{clients_dir, python, setup_dir};
use test_support::containerd::{remove_sandbox, unique, Containerd};
use test_support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// The clients of the matrix (tonic, the client of every other test, is not repeated here).
#[derive(Clone, Copy, Debug)]
enum Client {
    GrpcioDefaultAuthority,
    GrpcioRawAuthority,
    GrpcJs,
    H2NoAuthority,
}

/// What one run does beyond the common scenario.
struct Scenario<'a> {
    api: &'a str,
    events: bool,
    annotations: &'a [&'a str],
    keep: bool,
}

/// What a client printed: its JSON result, its stderr and whether it exited 0.
struct Outcome {
    json: Value,
    stderr: String,
    ok: bool,
}

impl Client {
    /// The client's command line, without the scenario's arguments.
    fn command(self) -> Command {
        let dir = setup_dir();
        match self {
            Client::GrpcioDefaultAuthority => {
                let mut c = python("grpcio_client.py");
                c.args(["--authority", "default"]);
                c
            }
            Client::GrpcioRawAuthority => {
                let mut c = python("grpcio_client.py");
                c.args(["--authority", "raw"]);
                c
            }
            Client::H2NoAuthority => python("h2_client.py"),
            Client::GrpcJs => {
                let mut c = Command::new("node");
                c.arg(clients_dir().join("grpcjs_client.js")).env("NODE_PATH", dir.join("node/node_modules"));
                c
            }
        }
    }

    /// Starts the scenario on `socket` for a pod named `name` (unique: also its uid).
    fn spawn(self, env: &Containerd, socket: &Path, name: &str, s: &Scenario) -> Child {
        let mut c = self.command();
        c.arg("--socket")
            .arg(socket)
            .args(["--image", &env.test_image, "--cgroup-parent", &env.cgroup_parent, "--name", name, "--api", s.api])
            .arg("--log-dir")
            .arg(env.log_root.join(name));
        if s.events {
            c.arg("--events");
        }
        if s.keep {
            c.arg("--keep");
        }
        for a in s.annotations {
            c.args(["--annotation", a]);
        }
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap_or_else(|e| panic!("starting the {self:?} client: {e}"))
    }
}

/// Waits for a client (every call has a 30 s deadline, so it ends) and reads its JSON result.
fn finish(client: Client, child: Child) -> Outcome {
    let out = child.wait_with_output().expect("waiting for the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("{client:?} printed no JSON result ({e}), exit {}:\n{stdout}\nstderr:\n{stderr}", out.status)
    });
    Outcome { json, stderr, ok: out.status.success() }
}

/// The part of a result that must not depend on the path: everything but the client's name and
/// the IDs containerd chose.
fn comparable(result: &Value) -> Value {
    json!({
        "version": result["version"],
        "container_state": result["container_state"],
        "exec": result["exec"],
        "not_found": result["not_found"],
        "events": result["events"],
    })
}

/// The last lines of the proxy's log, for failure messages.
fn log_tail(proxy: &ProxyProcess) -> String {
    let log = proxy.log();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Held by every run that watches GetContainerEvents, so they go one at a time. containerd 1.7
/// has one event channel that every GetContainerEvents stream reads from (no broadcast: two
/// watchers at once each get only some of the events, containerd/containerd#7318, fixed in 2.0).
static EVENT_WATCHER: Mutex<()> = Mutex::new(());

/// [`test_support::containerd::drain_cancelled_event_streams`] on a runtime of its own, dropped
/// before it returns: the probe's connection is closed then, not left unread (and still taking
/// events) while the test waits for a client.
fn drain_cancelled_event_streams(env: &Containerd) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(test_support::containerd::drain_cancelled_event_streams(env));
}

/// Runs `client` directly on containerd and through a proxy over v1 (with the event stream on
/// containerd 1.7 and 2.1) and v1alpha2 (on 2.1, which has none: the same UNIMPLEMENTED both
/// ways), and compares. The two runs go at the same time, except those
/// watching events (see [`EVENT_WATCHER`]).
fn matrix(client: Client) {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &[]);
    for api in ["v1", "v1alpha2"] {
        let events = api == "v1" && env.has_container_events();
        let s = Scenario { api, events, annotations: &[], keep: false };
        let (direct, proxied) = if events {
            let _one_watcher = EVENT_WATCHER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            drain_cancelled_event_streams(&env);
            let direct = finish(client, client.spawn(&env, &env.socket, &unique("matrix"), &s));
            (direct, finish(client, client.spawn(&env, proxy.socket(), &unique("matrix"), &s)))
        } else {
            let direct = client.spawn(&env, &env.socket, &unique("matrix"), &s);
            let proxied = client.spawn(&env, proxy.socket(), &unique("matrix"), &s);
            (finish(client, direct), finish(client, proxied))
        };

        if api == "v1alpha2" && !direct.ok && env.major_minor() >= (2, 0) {
            // containerd 2.0 removed CRI v1alpha2: the client's first call gets containerd's own
            // UNIMPLEMENTED, and must get the same through the proxy.
            let error = direct.json["error"].as_str().unwrap_or_default();
            assert!(
                error.starts_with("Version: UNIMPLEMENTED"),
                "{client:?} v1alpha2 on containerd {}: {}",
                env.version,
                direct.json
            );
            assert!(!proxied.ok, "{client:?} v1alpha2 through the proxy: {}", proxied.json);
            assert_eq!(
                proxied.json["error"], direct.json["error"],
                "{client:?} v1alpha2: through the proxy (left), directly (right)"
            );
            continue;
        }
        assert!(
            direct.ok,
            "{client:?} {api} failed directly on containerd {}: {}\n{}",
            env.version, direct.json, direct.stderr
        );
        assert!(
            proxied.ok,
            "{client:?} {api} works directly on containerd {} but fails through the proxy: {}\n{}\nproxy log:\n{}",
            env.version,
            proxied.json,
            proxied.stderr,
            log_tail(&proxy)
        );
        assert_eq!(
            comparable(&direct.json),
            comparable(&proxied.json),
            "{client:?} {api}: direct (left) and through the proxy (right)"
        );

        // And what the scenario should give at all, so that two equal failures do not pass.
        let r = &direct.json;
        assert_eq!(r["version"]["runtime_name"], "containerd", "{r}");
        assert_eq!(r["version"]["runtime_api_version"], api, "{r}");
        assert_eq!(r["container_state"], "CONTAINER_RUNNING", "{r}");
        assert_eq!(r["exec"], json!({"exit_code": 0, "stdout": "hello\nnone\n"}), "{r}");
        assert_eq!(r["not_found"]["code"], "NOT_FOUND", "{r}");
        assert!(r["not_found"]["message"].as_str().unwrap_or_default().contains("no-such-container-id"), "{r}");
        let expected_events = if events {
            json!([
                "CONTAINER_CREATED_EVENT",
                "CONTAINER_STARTED_EVENT",
                "CONTAINER_STOPPED_EVENT",
                "CONTAINER_DELETED_EVENT"
            ])
        } else {
            Value::Null
        };
        assert_eq!(r["events"], expected_events, "{r}");
    }
    // With RP_TEST_LOG=debug the patched h2 logs each :authority it ignores; show them (--nocapture).
    let mut ignored: Vec<String> = proxy
        .log()
        .lines()
        .filter_map(|l| l.split_once("ignoring malformed authority").map(|(_, rest)| rest.to_owned()))
        .collect();
    ignored.sort();
    ignored.dedup();
    for line in ignored {
        eprintln!("{client:?}: the proxy ignored the malformed authority{line}");
    }
}

#[test]
fn grpcio_default_options() {
    matrix(Client::GrpcioDefaultAuthority);
}

#[test]
fn grpcio_raw_socket_path_authority() {
    matrix(Client::GrpcioRawAuthority);
}

#[test]
fn grpc_js() {
    matrix(Client::GrpcJs);
}

#[test]
fn raw_h2_without_authority() {
    matrix(Client::H2NoAuthority);
}

/// grpcio (default options) through the proxy with the example hook registered: the hook's env and
/// its cpu shares (256, not the 512 asked for) reach the real container. The client keeps the pod
/// (`--keep`) so that its cgroup can be read; the test removes it.
#[tokio::test]
async fn grpcio_pod_changed_by_the_example_hook() {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rp-matrix-hook").tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let _hook = test_support::hooks::start_example_hook(dir.path(), &proxy);

    let name = unique("matrix-hook");
    let client = Client::GrpcioDefaultAuthority;
    let s =
        Scenario { api: "v1", events: false, annotations: &["example.runtime-proxy.dev/cpu-shares=256"], keep: true };
    let out = finish(client, client.spawn(&env, proxy.socket(), &name, &s));

    // Read the cgroup, remove the pod the client kept, then judge.
    let container_id = out.json["container_id"].as_str().unwrap_or_default().to_owned();
    let cpu_shares = format!("/sys/fs/cgroup/cpu{}/pod{name}/{container_id}/cpu.shares", env.cgroup_parent);
    let shares = std::fs::read_to_string(&cpu_shares).map(|s| s.trim().to_owned());
    if let Some(sandbox_id) = out.json["sandbox_id"].as_str() {
        remove_sandbox(&mut test_support::runtime_client(&env.socket), sandbox_id).await;
    }

    assert!(
        out.ok,
        "grpcio through the proxy with the hook failed: {}\n{}\nproxy log:\n{}",
        out.json,
        out.stderr,
        log_tail(&proxy)
    );
    assert_eq!(
        out.json["exec"],
        json!({"exit_code": 0, "stdout": "hello\nannotation-hook\n"}),
        "the hook's HOOKED_BY env"
    );
    assert_eq!(
        shares.unwrap_or_else(|e| panic!("reading {cpu_shares}: {e}")),
        "256",
        "the hook's cpu shares, not the 512 asked for"
    );
}

/// A temp dir (`prefix`) holding `hookserver.d`, and the proxy on the real containerd watching it.
fn proxy_with_hook_dir(env: &Containerd, prefix: &str) -> (tempfile::TempDir, std::path::PathBuf, ProxyProcess) {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let configs = dir.path().join("hookserver.d");
    std::fs::create_dir(&configs).unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", configs.to_str().unwrap()]);
    (dir, configs, proxy)
}

/// Registers the hook server at `socket` as `file` (failure policy Fail, PreRunPodSandbox and
/// PreCreateContainer, `extra` keys) and waits until the proxy has taken the file up.
fn register_and_wait(proxy: &ProxyProcess, configs: &Path, file: &str, socket: &Path, extra: Value) {
    let seen = ["hook server added", &format!("file={file}")];
    let before = proxy.count_log(&seen);
    test_support::hooks::register(configs, file, socket, "Fail", &["PreRunPodSandbox", "PreCreateContainer"], extra);
    assert!(proxy.wait_log(&seen, before), "the proxy did not take up {file}:\n{}", log_tail(proxy));
}

/// A running pod's container as it is: its env (ExecSync `env`) and its `cpu.shares` in the real
/// cgroup. Errors: the call or the read that failed.
async fn env_and_cpu_shares(
    rt: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>,
    pod: &test_support::containerd::Pod,
) -> Result<(String, String), String> {
    let exec = rt
        .exec_sync(k8s_cri::v1::ExecSyncRequest {
            container_id: pod.container_id.clone(),
            cmd: vec!["env".into()],
            timeout: 10,
        })
        .await
        .map_err(|e| format!("ExecSync env: {e:?}"))?
        .into_inner();
    if exec.exit_code != 0 {
        return Err(format!("env exited {}: {}", exec.exit_code, String::from_utf8_lossy(&exec.stderr)));
    }
    let path = format!("/sys/fs/cgroup/cpu{}/{}/cpu.shares", pod.cgroup_parent(), pod.container_id);
    let shares = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    Ok((String::from_utf8_lossy(&exec.stdout).into_owned(), shares.trim().to_owned()))
}

/// A hook server whose gRPC side we did not write: tests/clients/hook_server.py, Python grpcio
/// (C-core) serving `runtime.v1alpha1.RuntimeHookService` with stubs that grpc_tools.protoc
/// generated from crates/hook-api/proto, registered by a JSON file (`failure-policy` Fail,
/// `timeout-ms` 7000) for PreRunPodSandbox and PreCreateContainer. Through the proxy (tonic) on
/// the real containerd, this proves that:
///
/// * its PreRunPodSandbox answer (the label `py-hook: yes`) is on the sandbox as containerd itself
///   reports it (PodSandboxStatus asked of containerd directly);
/// * its PreCreateContainer answer reaches the running container: the env PY_HOOK=grpcio, the env
///   PY_HOOK_POD_LABEL=yes (the label it set at PreRunPodSandbox, handed back to it by the
///   proxy's store), kubelet's own env kept (ExecSync `env`), and cpu shares 333, not the 512
///   asked for, in the container's real cgroup;
/// * its PERMISSION_DENIED "quota 100% used" (a `%` that grpc-message carries percent-encoded)
///   refuses RunPodSandbox with that code and a message naming the stage, the registration file
///   and the endpoint and quoting the server's message decoded; containerd never sees that pod;
/// * every call carried a `grpc-timeout`: the deadline the server saw was at most the 7 s
///   registered, and more than the 2 s default (so it is this registration's `timeout-ms`).
#[tokio::test]
async fn grpcio_hook_server_changes_and_refuses_real_pods() {
    use std::collections::HashMap;

    use k8s_cri::v1 as cri;
    use test_support::containerd::{container_config, sandbox_config, Pod};

    let env = Containerd::from_env();
    let (dir, configs, proxy) = proxy_with_hook_dir(&env, "rp-pyhook");
    let server = test_support::clients::PyHookServer::start(dir.path());
    let (socket, record) = (&server.socket, &server.record);
    let server_output = || server.output();
    register_and_wait(&proxy, &configs, "py-hook.json", socket, json!({"timeout-ms": 7000}));
    let context = || format!("proxy log:\n{}\nhook_server.py:\n{}", log_tail(&proxy), server_output());

    // A pod the server changes. Read what containerd and the container report, remove, then judge.
    let mut rt = test_support::runtime_client(proxy.socket());
    let name = unique("py-hook");
    let sandbox = sandbox_config(&env, &name, HashMap::new(), HashMap::new());
    let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
    let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[("KEEP", "me")]);
    let pod = Pod::start(&mut rt, sandbox, container)
        .await
        .unwrap_or_else(|e| panic!("the pod through the proxy: {e:?}\n{}", context()));
    let status = test_support::runtime_client(&env.socket)
        .pod_sandbox_status(cri::PodSandboxStatusRequest { pod_sandbox_id: pod.sandbox_id.clone(), verbose: false })
        .await
        .map(|r| r.into_inner().status.unwrap_or_default().labels);
    let seen_in_container = env_and_cpu_shares(&mut rt, &pod).await;
    pod.remove(&mut rt).await;

    let labels = status.unwrap_or_else(|e| panic!("PodSandboxStatus on containerd: {e:?}"));
    assert_eq!(
        labels.get("py-hook").map(String::as_str),
        Some("yes"),
        "the hook's label as containerd reports it: {labels:?}\n{}",
        context()
    );
    let (stdout, shares) = seen_in_container.unwrap_or_else(|e| panic!("{e}\n{}", context()));
    let envs: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    for (key, value) in [("PY_HOOK", "grpcio"), ("PY_HOOK_POD_LABEL", "yes"), ("KEEP", "me")] {
        assert_eq!(envs.get(key).copied(), Some(value), "{key} in the container's env:\n{stdout}\n{}", context());
    }
    assert_eq!(shares, "333", "the hook's cpu shares, not the 512 asked for");

    // A pod the server refuses: RunPodSandbox fails, and containerd never sees the pod.
    let denied = unique("py-hook-denied");
    let labels = HashMap::from([("py-hook/quota".to_owned(), "exhausted".to_owned())]);
    let request = cri::RunPodSandboxRequest {
        config: Some(sandbox_config(&env, &denied, labels, HashMap::new())),
        runtime_handler: String::new(),
    };
    let err = match rt.run_pod_sandbox(request).await {
        Ok(r) => {
            remove_sandbox(&mut rt, &r.into_inner().pod_sandbox_id).await;
            panic!("RunPodSandbox of a pod whose quota is exhausted succeeded\n{}", context());
        }
        Err(e) => e,
    };
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}\n{}", context());
    let endpoint = socket.display().to_string();
    for part in ["PreRunPodSandbox", "py-hook.json", &endpoint, "quota 100% used", "failure-policy Fail"] {
        assert!(err.message().contains(part), "{part:?} missing from {:?}", err.message());
    }
    let sandboxes = test_support::runtime_client(&env.socket)
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap();
    let reached: Vec<_> = sandboxes
        .into_inner()
        .items
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.name == denied))
        .collect();
    assert!(reached.is_empty(), "the refused pod reached containerd: {reached:?}");

    // What the server recorded: each call, with the deadline it had left.
    let calls: Vec<Value> = std::fs::read_to_string(record)
        .unwrap_or_else(|e| panic!("reading {}: {e}\n{}", record.display(), server_output()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let stages = |pod: &str| -> Vec<String> {
        calls.iter().filter(|c| c["pod"] == pod).map(|c| c["stage"].as_str().unwrap_or_default().to_owned()).collect()
    };
    assert_eq!(stages(&name), ["PreRunPodSandbox", "PreCreateContainer"], "{calls:?}");
    assert_eq!(stages(&denied), ["PreRunPodSandbox"], "{calls:?}");
    let deadlines = Value::Array(calls.iter().map(|c| c["time_remaining"].clone()).collect());
    eprintln!("hook_server.py: refused with {:?}; seconds left when its handlers ran: {deadlines}", err.message());
    for call in &calls {
        let remaining =
            call["time_remaining"].as_f64().unwrap_or_else(|| panic!("a call without grpc-timeout: {call}"));
        assert!(remaining > 2.0 && remaining <= 7.0, "the deadline the server saw is not the registered 7 s: {call}");
    }
}

/// A hook server on Node's HTTP/2 (tests/clients/grpcjs_hook_server.js: @grpc/grpc-js, nghttp2),
/// registered for PreRunPodSandbox and PreCreateContainer (`failure-policy` Fail), and four pods
/// started at once through the proxy on the real containerd, so the hook calls overlap (one
/// connection each, then taken again idle). Each container gets the server's env JS_HOOK=grpc-js
/// (ExecSync `env`) and its cpu shares 444 in the real cgroup, not the 512 asked for; the server
/// saw each pod at both stages.
#[tokio::test]
async fn grpcjs_hook_server_changes_pods_started_at_once() {
    use std::collections::HashMap;

    use k8s_cri::v1 as cri;
    use test_support::containerd::{container_config, sandbox_config, Pod};
    use test_support::hooks::KillOnDrop;

    let env = Containerd::from_env();
    let (dir, configs, proxy) = proxy_with_hook_dir(&env, "rp-jshook");
    let (socket, log) = (dir.path().join("js-hook.sock"), dir.path().join("js-hook.log"));
    let out = std::fs::File::create(&log).unwrap();
    let mut server = Command::new("node");
    server.arg(clients_dir().join("grpcjs_hook_server.js")).arg("--socket").arg(&socket);
    server
        .env("NODE_PATH", setup_dir().join("node/node_modules"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    let _server = KillOnDrop(server.spawn().expect("starting tests/clients/grpcjs_hook_server.js"));
    let server_output = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "grpcjs_hook_server.js did not listen:\n{}",
            server_output()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    register_and_wait(&proxy, &configs, "js-hook.json", &socket, json!({}));
    let context = || format!("proxy log:\n{}\ngrpcjs_hook_server.js:\n{}", log_tail(&proxy), server_output());

    let names: Vec<String> = (0..4).map(|_| unique("js-hook")).collect();
    let starts = names.iter().map(|name| {
        let (env, socket) = (&env, proxy.socket());
        async move {
            let mut rt = test_support::runtime_client(socket);
            let sandbox = sandbox_config(env, name, HashMap::new(), HashMap::new());
            let resources = cri::LinuxContainerResources { cpu_shares: 512, ..Default::default() };
            let container = container_config(env, "main", &["sleep", "3600"], Some(resources), &[]);
            let pod = Pod::start(&mut rt, sandbox, container).await;
            let pod = pod.map_err(|e| format!("{name}: {e:?}"))?;
            let seen = env_and_cpu_shares(&mut rt, &pod).await;
            pod.remove(&mut rt).await;
            seen.map_err(|e| format!("{name}: {e}"))
        }
    });
    for (name, result) in names.iter().zip(futures::future::join_all(starts).await) {
        let (env_out, shares) = result.unwrap_or_else(|e| panic!("{e}\n{}", context()));
        assert!(
            env_out.lines().any(|l| l == "JS_HOOK=grpc-js"),
            "{name}: the hook's env in the container:\n{env_out}\n{}",
            context()
        );
        assert_eq!(shares, "444", "{name}: the hook's cpu shares in the real cgroup\n{}", context());
        for stage in ["PreRunPodSandboxHook", "PreCreateContainerHook"] {
            assert!(
                server_output().contains(&format!("call {stage} {name}\n")),
                "{name}: {stage} not called\n{}",
                context()
            );
        }
    }
}
