//! `runtime-proxy status` (the real binary) against a running proxy on a real containerd: the
//! registered hook server with its policy, timeout and health, its last error after a failing
//! call, the backend, the store, calls per stage; exit codes 0 (healthy), 1 (unhealthy) and 2
//! (no status); and `/debug/store` on its own listener (`--debug-addr`).

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::hooks::{register, ContainerFn, PodFn, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// What one `runtime-proxy status …` printed, and its exit code.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn status(addr: &str, extra: &[&str]) -> Run {
    let out = Command::new(BIN)
        .args(["status", "--metrics-addr", addr])
        .args(extra)
        .output()
        .expect("run runtime-proxy status");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn status_json(addr: &str) -> Value {
    let run = status(addr, &["--output", "json"]);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}{}", run.stdout, run.stderr))
}

/// A hook server whose answers are the echo while `fail` is false, and PERMISSION_DENIED
/// "quota exhausted" once it is true.
async fn switchable_hook(fail: Arc<AtomicBool>) -> TestHook {
    let f = fail.clone();
    let container: ContainerFn = Arc::new(move |_, req| {
        if f.load(Ordering::SeqCst) {
            return Err(tonic::Status::permission_denied("quota exhausted"));
        }
        Ok(hook_api::merge::echo_container(req))
    });
    let pod: PodFn = Arc::new(move |_, req| {
        if fail.load(Ordering::SeqCst) {
            return Err(tonic::Status::permission_denied("quota exhausted"));
        }
        Ok(hook_api::merge::echo_pod(req))
    });
    TestHook::start(container, pod).await
}

#[tokio::test]
async fn status_shows_the_hook_server_its_policy_and_its_last_error() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let chain = ["--hook-conflict-policy", "Fail", "--required-hook-servers", "strict.json"];
    let proxy = ProxyProcess::start(
        BIN,
        &env.socket,
        &[&["--hook-config-dir", dir.path().to_str().unwrap()][..], &chain].concat(),
    );
    let fail = Arc::new(AtomicBool::new(false));
    let hook = switchable_hook(fail.clone()).await;
    let before = proxy.count_log(&["hook server added", "strict.json"]);
    let extra = json!({"timeout-ms": 1500, "conflict-policy": "Warn"});
    register(dir.path(), "strict.json", hook.socket(), "Fail", &["PreRunPodSandbox", "PreCreateContainer"], extra);
    assert!(proxy.wait_log(&["hook server added", "strict.json"], before), "{}", proxy.log());
    let addr = proxy.admin_addr();

    // Registered, never called: healthy.
    let run = status(&addr, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    for want in [
        "strict.json",
        &hook.socket().display().to_string(),
        "PreRunPodSandbox,PreCreateContainer",
        "Fail",
        "1500ms",
        "not called yet",
        "conflicts: Fail; required servers: strict.json",
    ] {
        assert!(run.stdout.contains(want), "{want:?} missing:\n{}", run.stdout);
    }
    assert!(run.stdout.contains(&format!("Containerd unix://{}: up", env.socket.display())), "{}", run.stdout);

    // A pod through the hook: its calls counted, the store holds the pod.
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("status"), HashMap::new(), HashMap::new());
    let pod =
        Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap();
    let doc = status_json(&addr);
    assert_eq!(doc["healthy"], true, "{doc:#}");
    let server = &doc["hook_servers"][0];
    assert_eq!((server["name"].as_str(), server["health"].as_str()), (Some("strict.json"), Some("ok")), "{doc:#}");
    assert_eq!(server["failure_policy"], "Fail");
    // The registration's own conflict policy over the node's.
    assert_eq!(
        (server["conflict_policy"].as_str(), server["conflict_policy_explicit"].as_bool()),
        (Some("Warn"), Some(true)),
        "{doc:#}"
    );
    assert_eq!(
        (doc["hook_conflict_policy"].as_str(), &doc["required_hook_servers"]),
        (Some("Fail"), &json!(["strict.json"])),
        "{doc:#}"
    );
    assert_eq!(server["timeout_ms"], 1500);
    assert_eq!((server["calls"].as_u64(), server["failures"].as_u64()), (Some(2), Some(0)), "{doc:#}");
    assert!(
        doc["store"]["pod_sandboxes"].as_u64().unwrap() >= 1 && doc["store"]["containers"].as_u64().unwrap() >= 1,
        "{doc:#}"
    );
    let stage = doc["stages"].as_array().unwrap().iter().find(|s| s["stage"] == "PreRunPodSandbox").unwrap().clone();
    assert_eq!(
        (stage["servers"].as_u64(), stage["calls"].as_u64(), stage["failures"].as_u64()),
        (Some(1), Some(1), Some(0))
    );
    assert_eq!(doc["backend"]["up"], true);
    assert_eq!(doc["backend"]["mode"], "Containerd");
    assert!(doc["version"].as_str().unwrap().starts_with(env!("CARGO_PKG_VERSION")));

    // The hook refuses: the Fail server failing makes the proxy unhealthy, with the error.
    fail.store(true, Ordering::SeqCst);
    let refused = sandbox_config(&env, &unique("status-refused"), HashMap::new(), HashMap::new());
    let err =
        Pod::start(&mut rt, refused, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap_err();
    assert!(err.message().contains("quota exhausted"), "{err:?}");
    let run = status(&addr, &[]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    for want in
        ["UNHEALTHY", "FAILING (1 in a row)", "PreRunPodSandbox: PermissionDenied: quota exhausted", "1/3", "problems"]
    {
        assert!(run.stdout.contains(want), "{want:?} missing:\n{}", run.stdout);
    }
    let doc = status_json(&addr);
    assert_eq!(doc["healthy"], false);
    let server = &doc["hook_servers"][0];
    assert_eq!(server["last_error"], "PreRunPodSandbox: PermissionDenied: quota exhausted", "{doc:#}");
    assert!(server["last_error_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{doc:#}");
    assert!(doc["problems"][0].as_str().unwrap().contains("strict.json (failure-policy Fail)"), "{doc:#}");
    let stage = doc["stages"].as_array().unwrap().iter().find(|s| s["stage"] == "PreRunPodSandbox").unwrap().clone();
    assert_eq!(
        (stage["calls"].as_u64(), stage["failures"].as_u64(), stage["refused"].as_u64()),
        (Some(2), Some(1), Some(1)),
        "{doc:#}"
    );
    let (_, metrics) = proxy.admin_get("/metrics");
    let refusals = "runtime_proxy_hook_refusals_total{stage=\"PreRunPodSandbox\",server=\"strict.json\"} 1";
    assert!(metrics.contains(refusals), "{metrics}");

    // It answers again: healthy, the last error kept with its time.
    fail.store(false, Ordering::SeqCst);
    pod.remove(&mut rt).await;
    let again = sandbox_config(&env, &unique("status-again"), HashMap::new(), HashMap::new());
    let pod = Pod::start(&mut rt, again, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap();
    let run = status(&addr, &[]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("quota exhausted") && run.stdout.contains(" ago: "), "{}", run.stdout);
    pod.remove(&mut rt).await;
}

/// A backend that cannot be reached is unhealthy (exit 1), and says why.
#[test]
fn status_is_1_when_the_backend_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("runtime.sock");
    let proxy = ProxyProcess::start(BIN, &missing, &["--hook-config-dir", dir.path().join("hooks").to_str().unwrap()]);
    let run = status(&proxy.admin_addr(), &[]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("DOWN") && run.stdout.contains(&missing.display().to_string()), "{}", run.stdout);
    assert!(
        run.stdout.contains("- backend down: ") && run.stdout.contains("hook servers: none registered"),
        "{}",
        run.stdout
    );
}

/// What the next pod meets is a problem before any pod fails: a `--required-hook-servers`
/// entry not registered (every pod's pre stages are refused), a `Fail` server whose socket is
/// gone (its next call fails); an unreachable `Ignore` server is a warning.
// Multi-threaded: the fake runtime answers the health checks while `status` runs blocking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_foresees_refusals_before_a_pod_fails() {
    let fake = FakeBackend::start(Behaviour::Cri).await;
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    let gone = dir.path().join("gone.sock");
    register(&hooks, "strict.json", &gone, "Fail", &["PreCreateContainer"], json!({}));
    register(&hooks, "lenient.json", &dir.path().join("lenient.sock"), "Ignore", &["PreRunPodSandbox"], json!({}));
    let flags = ["--hook-config-dir", hooks.to_str().unwrap(), "--required-hook-servers", "absent.json"];
    let proxy = ProxyProcess::start(BIN, fake.socket(), &flags);
    let addr = proxy.admin_addr();
    let doc = status_json(&addr);
    assert_eq!(doc["backend"]["up"], true, "{doc:#}");
    let problems: Vec<&str> = doc["problems"].as_array().unwrap().iter().filter_map(|p| p.as_str()).collect();
    assert_eq!(problems.len(), 2, "{doc:#}");
    assert!(
        problems[0].contains("required hook server absent.json (--required-hook-servers) is not registered")
            && problems[0]
                .contains("RunPodSandbox (PreRunPodSandbox), CreateContainer (PreCreateContainer), StartContainer (PreStartContainer)")
            && problems[0].contains("FAILED_PRECONDITION"),
        "{doc:#}"
    );
    assert!(
        problems[1].contains("hook server strict.json (failure-policy Fail) is unreachable at")
            && problems[1].contains("no socket there")
            && problems[1].contains("calls at PreCreateContainer will be refused"),
        "{doc:#}"
    );
    let warnings = doc["warnings"].to_string();
    assert!(
        warnings.contains("hook server lenient.json (failure-policy Ignore) is unreachable")
            && warnings.contains("pods go on without it"),
        "{doc:#}"
    );
    let strict = doc["hook_servers"].as_array().unwrap().iter().find(|s| s["name"] == "strict.json").unwrap().clone();
    assert_eq!(strict["health"], "unreachable", "{doc:#}");
    let run = status(&addr, &[]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("UNHEALTHY") && run.stdout.contains("UNREACHABLE"), "{}", run.stdout);

    // The server comes up and the required one is registered: healthy again, no call made.
    let _listener = tokio::net::UnixListener::bind(&gone).unwrap();
    let before = proxy.count_log(&["hook server added", "absent.json"]);
    register(&hooks, "absent.json", &gone, "Fail", &["PreCreateContainer"], json!({}));
    assert!(proxy.wait_log(&["hook server added", "absent.json"], before), "{}", proxy.log());
    let doc = status_json(&addr);
    assert_eq!(doc["problems"], json!([]), "{doc:#}");
    assert_eq!(status(&addr, &[]).code, 0);
}

/// Nothing listening, or the endpoint off: exit 2, one line naming the address and the error,
/// no debug dump, nothing on stdout.
#[test]
fn status_is_2_when_there_is_no_endpoint() {
    let free = test_support::free_loopback_addr();
    let run = status(&free, &[]);
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(
        run.stderr.starts_with(&format!("runtime-proxy: status: cannot reach the admin endpoint at {free}: ")),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("refused") && !run.stderr.contains("Os {") && !run.stderr.contains("kind:"),
        "{}",
        run.stderr
    );
    let run = status("off", &[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--metrics-addr is off"), "{}", run.stderr);
    // Something else on the port (not a status document): exit 2 too.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = other.local_addr().unwrap().to_string();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut conn, _) = other.accept().unwrap();
        let (mut request, mut buf) = (Vec::new(), [0u8; 1024]);
        while !request.ends_with(b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 10\r\nconnection: close\r\n\r\nnot found\n");
    });
    let run = status(&addr, &[]);
    server.join().unwrap();
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("HTTP 404") && run.stderr.contains(&addr), "{}", run.stderr);
}

/// `/debug/store` is served on `--debug-addr` only: the metrics listener answers 404 saying
/// where it moved, and shows no pod ID in `/metrics` or `/status`.
#[tokio::test]
async fn debug_store_has_a_listener_of_its_own() {
    let env = Containerd::from_env();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--debug-addr", "127.0.0.1:0"]);
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("debug"), HashMap::new(), HashMap::new());
    let pod =
        Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap();

    let (code, body) = proxy.debug_get("/debug/store");
    assert_eq!(code, 200, "{body}");
    let ids: Value = serde_json::from_str(&body).unwrap();
    assert!(ids["pod_sandboxes"].as_array().unwrap().iter().any(|id| id == &json!(pod.sandbox_id)), "{ids}");
    assert!(ids["containers"].as_array().unwrap().iter().any(|id| id == &json!(pod.container_id)), "{ids}");

    let (code, body) = proxy.admin_get("/debug/store");
    assert_eq!(code, 404, "{body}");
    let debug_addr = proxy
        .log()
        .lines()
        .find_map(|l| l.split("(/debug/store) listening on ").nth(1).map(|a| a.trim().to_owned()))
        .unwrap();
    assert!(body.contains("moved") && body.contains(&debug_addr), "{body}");
    for path in ["/metrics", "/status"] {
        let (_, body) = proxy.admin_get(path);
        assert!(!body.contains(&pod.sandbox_id) && !body.contains(&pod.container_id), "{path} shows a pod ID:\n{body}");
    }
    assert!(proxy.admin_get("/status").1.contains(&format!("\"debug_endpoint\":\"{debug_addr}\"")));
    pod.remove(&mut rt).await;

    let off = ProxyProcess::start(BIN, &env.socket, &["--debug-addr", "off"]);
    let (code, body) = off.admin_get("/debug/store");
    assert_eq!(code, 404);
    assert!(body.contains("off") && body.contains("--debug-addr"), "{body}");
}

/// A hook server's error message with terminal controls in it (erase the line, return to its
/// start, a C1 CSI, a bidi override): `status` prints them escaped, in the table and in the
/// JSON, read from the admin socket (no --metrics-addr).
#[tokio::test]
async fn status_escapes_control_characters_from_a_hook_server() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let hostile = "quota\x1b[2K\rhealthy \u{9b}32mok\x08\x7f\u{202e}";
    let container: ContainerFn = Arc::new(move |_, _| Err(tonic::Status::permission_denied(hostile)));
    let pod: PodFn = Arc::new(move |_, _| Err(tonic::Status::permission_denied(hostile)));
    let hook = TestHook::start(container, pod).await;
    register(dir.path(), "evil.json", hook.socket(), "Ignore", &["PreRunPodSandbox"], json!({}));
    assert!(proxy.wait_log(&["hook server added", "evil.json"], 0), "{}", proxy.log());
    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("escape"), HashMap::new(), HashMap::new());
    let pod =
        Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap();
    let by_socket = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("--koord-runtimeproxy-endpoint")
            .arg(proxy.socket())
            .arg("status")
            .args(extra)
            .output()
            .unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let raw = |text: &str| text.chars().any(|c| c != '\n' && daemon_support::escape::is_escaped(c));
    let (table, err) = by_socket(&[]);
    assert!(table.contains("quota\\x1b[2K\\rhealthy \\u{9b}32mok\\x08\\x7f\\u{202e}"), "{table}{err}");
    assert!(!raw(&table), "raw control characters in the table: {table:?}");
    let (json, err) = by_socket(&["-o", "json"]);
    assert!(!raw(&json), "raw control characters in the JSON: {json:?}");
    let doc: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}{err}"));
    assert_eq!(
        doc["hook_servers"][0]["last_error"],
        format!("PreRunPodSandbox: PermissionDenied: {hostile}"),
        "the document itself unchanged"
    );
    // The log has the message too, its CR escaped (ESC and the rest by tracing-subscriber).
    let log = proxy.log();
    let line = log.lines().find(|l| l.contains("quota")).unwrap_or_else(|| panic!("no hook error logged:\n{log}"));
    assert!(line.contains("quota\\x1b[2K\\rhealthy"), "{line:?}");
    pod.remove(&mut rt).await;
}
