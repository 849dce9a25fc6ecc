//! The admin endpoint scraped after real traffic: per-method CRI latency and codes, per-hook
//! latency, errors and timeouts, store size, registered servers and rejected files, health.

use k8s_cri::v1 as cri;
use serde_json::json;
use std::collections::HashMap;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use test_support::fake_backend::{Behaviour, FakeBackend};
use test_support::hooks::{register, TestHook};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const BIN: &str = env!("CARGO_BIN_EXE_runtime-proxy");

/// The value of the sample whose line starts with `series` (name and labels).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series).and_then(|rest| rest.trim().split(' ').next()).and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
}

#[tokio::test]
async fn metrics_and_health_reflect_real_traffic() {
    let env = Containerd::from_env();
    let dir = tempfile::tempdir().unwrap();
    let proxy = ProxyProcess::start(BIN, &env.socket, &["--hook-config-dir", dir.path().to_str().unwrap()]);
    let ok = TestHook::echoing(|_, _| {}).await;
    let hang = FakeBackend::start(Behaviour::Hang).await;
    for (name, socket, extra) in
        [("ok.json", ok.socket(), json!({})), ("hang.json", hang.socket(), json!({"timeout-ms": 100}))]
    {
        let n = proxy.count_log(&["hook server added", name]);
        register(dir.path(), name, socket, "Ignore", &["PreCreateContainer"], extra);
        assert!(proxy.wait_log(&["hook server added", name], n));
    }
    std::fs::write(dir.path().join("broken.json"), "{").unwrap();
    assert!(proxy.wait_log(&["rejected", "broken.json"], 0));

    let mut rt = runtime_client(proxy.socket());
    let sandbox = sandbox_config(&env, &unique("metrics"), HashMap::new(), HashMap::new());
    let pod =
        Pod::start(&mut rt, sandbox, container_config(&env, "main", &["sleep", "3600"], None, &[])).await.unwrap();
    let _ = rt.container_status(cri::ContainerStatusRequest { container_id: "nope".into(), verbose: false }).await;

    let (status, text) = proxy.admin_get("/metrics");
    assert_eq!(status, 200);
    let create = "/runtime.v1.RuntimeService/CreateContainer";
    assert_eq!(sample(&text, &format!("runtime_proxy_cri_requests_total{{method=\"{create}\",code=\"OK\"}}")), 1.0);
    assert_eq!(sample(&text, &format!("runtime_proxy_cri_request_duration_seconds_count{{method=\"{create}\"}}")), 1.0);
    assert!(sample(&text, &format!("runtime_proxy_cri_request_duration_seconds_sum{{method=\"{create}\"}}")) > 0.0);
    assert_eq!(
        sample(&text, "runtime_proxy_cri_requests_total{method=\"/runtime.v1.RuntimeService/ContainerStatus\",code=\"NOT_FOUND\"}"),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"ok.json\",result=\"ok\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "runtime_proxy_hook_requests_total{stage=\"PreCreateContainer\",server=\"hang.json\",result=\"timeout\"}"
        ),
        1.0
    );
    let hang_time = sample(
        &text,
        "runtime_proxy_hook_request_duration_seconds_sum{stage=\"PreCreateContainer\",server=\"hang.json\"}",
    );
    assert!((0.1..5.0).contains(&hang_time), "the 100 ms timeout: {hang_time}");
    // The proxy's own time leaves the hook servers' round trips out: not the 100 ms of hang.json.
    let own = "runtime_proxy_hooked_call_own_duration_seconds";
    assert_eq!(
        sample(&text, &format!("{own}_count{{stage=\"PreCreateContainer\"}}")),
        1.0,
        "one hooked CreateContainer"
    );
    let own_time = sample(&text, &format!("{own}_sum{{stage=\"PreCreateContainer\"}}"));
    assert!(own_time > 0.0 && own_time < 0.05, "the proxy's own time, without the hook servers' 100 ms: {own_time}");
    assert_eq!(sample(&text, "runtime_proxy_hook_servers"), 2.0);
    assert_eq!(sample(&text, "runtime_proxy_hook_config_rejected"), 1.0);
    assert!(sample(&text, "runtime_proxy_store_objects{kind=\"container\"}") >= 1.0);
    assert!(sample(&text, "runtime_proxy_store_objects{kind=\"pod_sandbox\"}") >= 1.0);
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 1.0);
    assert!(text.trim_end().ends_with("# EOF"), "OpenMetrics text");

    let (status, body) = proxy.admin_get("/healthz");
    assert_eq!((status, body.trim()), (200, "ok"));
    pod.remove(&mut rt).await;
}

#[tokio::test]
async fn health_names_an_unreachable_backend() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("runtime.sock");
    let proxy = ProxyProcess::start(BIN, &missing, &[]);
    let (status, body) = proxy.admin_get("/healthz");
    assert_eq!(status, 503);
    assert!(body.contains(&missing.display().to_string()), "{body}");
    let (_, text) = proxy.admin_get("/metrics");
    assert_eq!(sample(&text, "runtime_proxy_backend_up"), 0.0);
}

/// Right after start, before any pod (and with no backend at all): the series a dashboard and
/// `increase()` need are there at 0 for the registered hook servers, the required-missing
/// series of every stage, and the build info with the version `--version` prints.
#[test]
fn the_first_scrape_has_the_known_series_at_zero_and_the_build_info() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks");
    std::fs::create_dir(&hooks).unwrap();
    register(
        &hooks,
        "fail.json",
        &dir.path().join("fail.sock"),
        "Fail",
        &["PreRunPodSandbox", "PreCreateContainer"],
        json!({}),
    );
    register(&hooks, "ignore.json", &dir.path().join("ignore.sock"), "Ignore", &["PreCreateContainer"], json!({}));
    let proxy =
        ProxyProcess::start(BIN, &dir.path().join("runtime.sock"), &["--hook-config-dir", hooks.to_str().unwrap()]);
    let (status, text) = proxy.admin_get("/metrics");
    assert_eq!(status, 200);
    assert_eq!(sample(&text, "runtime_proxy_hook_servers"), 2.0, "both registered");
    for stage in ["PreRunPodSandbox", "PreCreateContainer"] {
        for result in ["ok", "error", "timeout"] {
            let series = format!(
                "runtime_proxy_hook_requests_total{{stage=\"{stage}\",server=\"fail.json\",result=\"{result}\"}}"
            );
            assert_eq!(sample(&text, &series), 0.0);
        }
        assert_eq!(
            sample(&text, &format!("runtime_proxy_hook_refusals_total{{stage=\"{stage}\",server=\"fail.json\"}}")),
            0.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("runtime_proxy_hook_required_failures_total{{stage=\"{stage}\",server=\"fail.json\"}}")
            ),
            0.0
        );
        assert_eq!(
            sample(&text, &format!("runtime_proxy_required_hook_servers_missing_total{{stage=\"{stage}\"}}")),
            0.0
        );
    }
    let ignore = "stage=\"PreCreateContainer\",server=\"ignore.json\"";
    assert_eq!(sample(&text, &format!("runtime_proxy_hook_requests_total{{{ignore},result=\"error\"}}")), 0.0);
    assert!(
        !text.contains(&format!("runtime_proxy_hook_refusals_total{{{ignore}}}")),
        "an Ignore server refuses nothing:\n{text}"
    );
    assert!(
        !text.contains("stage=\"PreRunPodSandbox\",server=\"ignore.json\""),
        "a stage the server is not called at:\n{text}"
    );

    let version = std::process::Command::new(BIN).arg("--version").output().unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    // `runtime-proxy 0.1.0 (git 27cbb9f)`
    let (package, revision) =
        version.trim().strip_prefix("runtime-proxy ").and_then(|v| v.split_once(" (git ")).unwrap();
    let revision = revision.trim_end_matches(')');
    assert_eq!(
        sample(&text, &format!("runtime_proxy_build_info{{version=\"{package}\",revision=\"{revision}\"}}")),
        1.0,
        "{version}"
    );
}
