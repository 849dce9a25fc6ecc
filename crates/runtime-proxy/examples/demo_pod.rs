//! One pod's life through runtime-proxy, driven the way kubelet drives it, with a short report:
//! Version, RunPodSandbox, CreateContainer (busybox `sleep 3600` with CPU and memory limits),
//! StartContainer, ContainerStatus, the container's real cgroup files, ExecSync, then the teardown.
//!
//! The pod is annotated `example.runtime-proxy.dev/cpu-shares: "700"` while its container asks
//! for 512 CPU shares: with the example hook server (hook-api's `annotation_hook`) registered,
//! the container runs with 700 shares and the envs `HOOKED_BY`/`CPU_SHARES` the hook added; the
//! report says which of the two values the cgroup holds.
//!
//! `make demo` runs it (scripts/demo.sh starts containerd, the hook server and the proxy). By hand:
//!
//! ```text
//! RP_CONTAINERD_ENV=/tmp/rp-demo-ctrd/env \
//!   cargo run --release -p runtime-proxy --example demo_pod -- --endpoint /tmp/rp-demo/runtimeproxy.sock
//! ```
//!
//! `RP_CONTAINERD_ENV` names the env file of `scripts/containerd.sh up` (test image, cgroup parent).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, remove_sandbox, sandbox_config, unique, Containerd, Pod};
use tonic::transport::Channel;

const USAGE: &str = "usage: RP_CONTAINERD_ENV=ENV_FILE demo_pod --endpoint SOCKET";
/// The example hook server's pod annotation, and the CPU shares the demo pod asks of it.
const ANNOTATION: (&str, &str) = ("example.runtime-proxy.dev/cpu-shares", "700");
/// The CPU shares kubelet asks for in the container's own resources.
const KUBELET_SHARES: i64 = 512;

fn endpoint() -> Result<PathBuf> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag, socket] if flag == "--endpoint" => Ok(socket.into()),
        [arg] if arg.starts_with("--endpoint=") => Ok(arg["--endpoint=".len()..].into()),
        _ => bail!("{USAGE}"),
    }
}

/// Awaits one CRI call and returns its answer and how long it took, in milliseconds.
async fn timed<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    name: &str,
) -> Result<(T, f64)> {
    let start = Instant::now();
    let answer = call.await.with_context(|| format!("{name} through the proxy"))?;
    Ok((answer.into_inner(), start.elapsed().as_secs_f64() * 1e3))
}

fn step(name: &str, ms: f64, what: impl std::fmt::Display) {
    println!("  {name:<21}{ms:>7.1} ms   {what}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo_pod: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let socket = endpoint()?;
    let env = Containerd::from_env();
    let mut rt = test_support::runtime_client(&socket);
    println!(
        "A pod annotated {}: \"{}\" through runtime-proxy at {}, as kubelet would run it:\n",
        ANNOTATION.0,
        ANNOTATION.1,
        socket.display()
    );

    let (v, ms) = timed(rt.version(cri::VersionRequest { version: "v1".into() }), "Version").await?;
    step("Version", ms, format!("{} {}, CRI API {}", v.runtime_name, v.runtime_version, v.runtime_api_version));

    let labels = HashMap::from([("app".to_owned(), "runtime-proxy-demo".to_owned())]);
    let annotations = HashMap::from([(ANNOTATION.0.to_owned(), ANNOTATION.1.to_owned())]);
    let config = sandbox_config(&env, &unique("demo"), labels, annotations);
    let request = cri::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
    let (sandbox, ms) = timed(rt.run_pod_sandbox(request), "RunPodSandbox").await?;
    step("RunPodSandbox", ms, format!("sandbox   {}", sandbox.pod_sandbox_id));

    let pod = Pod { sandbox_id: sandbox.pod_sandbox_id, container_id: String::new(), config };
    let result = with_sandbox(&mut rt, &env, pod).await;
    if let Err((_, sandbox_id)) = &result {
        // Leave nothing behind when a step failed half-way.
        remove_sandbox(&mut rt, sandbox_id).await;
    }
    result.map_err(|(e, _)| e)
}

/// Everything after RunPodSandbox; on error also returns the sandbox ID to clean up.
async fn with_sandbox(
    rt: &mut RuntimeServiceClient<Channel>,
    env: &Containerd,
    mut pod: Pod,
) -> Result<(), (anyhow::Error, String)> {
    let sandbox_id = pod.sandbox_id.clone();
    let resources = cri::LinuxContainerResources {
        cpu_shares: KUBELET_SHARES,
        cpu_period: 100_000,
        cpu_quota: 50_000,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    let container = container_config(env, "app", &["sleep", "3600"], Some(resources), &[]);
    let steps = async {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: pod.sandbox_id.clone(),
            config: Some(container),
            sandbox_config: Some(pod.config.clone()),
        };
        let (created, ms) = timed(rt.create_container(request), "CreateContainer").await?;
        step("CreateContainer", ms, format!("container {}", created.container_id));
        pod.container_id = created.container_id;
        let id = pod.container_id.clone();

        let (_, ms) =
            timed(rt.start_container(cri::StartContainerRequest { container_id: id.clone() }), "StartContainer")
                .await?;
        step("StartContainer", ms, format!("{} `sleep 3600`", env.test_image));

        let request = cri::ContainerStatusRequest { container_id: id.clone(), verbose: true };
        let (status, ms) = timed(rt.container_status(request), "ContainerStatus").await?;
        let state = status.status.as_ref().map(|s| s.state).unwrap_or_default();
        let state = cri::ContainerState::try_from(state).map(|s| s.as_str_name()).unwrap_or("unknown state");
        let pid = status
            .info
            .get("info")
            .and_then(|info| serde_json::from_str::<serde_json::Value>(info).ok())
            .and_then(|info| info["pid"].as_u64())
            .map(|pid| format!(", pid {pid}"))
            .unwrap_or_default();
        step("ContainerStatus", ms, format!("{state}{pid}"));

        println!(
            "\n  cgroup files of the container: /sys/fs/cgroup/<controller>{}/<container ID>/",
            pod.cgroup_parent()
        );
        let shares = pod.cgroup_file("cpu", "cpu.shares");
        let why = if shares == ANNOTATION.1 {
            format!("set by the annotation hook; kubelet asked {KUBELET_SHARES}")
        } else {
            format!("asked {KUBELET_SHARES} (no hook changed it)")
        };
        println!("    {:<24}{shares:<12}{why}", "cpu.shares");
        for (controller, file, asked) in
            [("cpu", "cpu.cfs_quota_us", "50000 (per 100000 µs period)"), ("memory", "memory.limit_in_bytes", "64 MiB")]
        {
            println!("    {file:<24}{:<12}asked {asked}", pod.cgroup_file(controller, file));
        }

        let script = "echo $HOOKED_BY $CPU_SHARES";
        let request = cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["sh".into(), "-c".into(), script.into()],
            timeout: 10,
        };
        let (out, ms) = timed(rt.exec_sync(request), "ExecSync").await?;
        println!();
        step("ExecSync", ms, format!("sh -c '{script}'"));
        for line in String::from_utf8_lossy(&out.stdout).lines().chain(String::from_utf8_lossy(&out.stderr).lines()) {
            println!("{:34}→ {line}", "");
        }
        println!("{:34}→ exit code {}", "", out.exit_code);

        println!();
        let start = Instant::now();
        timed(rt.stop_container(cri::StopContainerRequest { container_id: id.clone(), timeout: 0 }), "StopContainer")
            .await?;
        timed(rt.remove_container(cri::RemoveContainerRequest { container_id: id }), "RemoveContainer").await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        step("Stop+RemoveContainer", ms, "container stopped and removed");
        let start = Instant::now();
        let sandbox_id = pod.sandbox_id.clone();
        timed(rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox_id.clone() }), "StopPodSandbox")
            .await?;
        timed(
            rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox_id.clone() }),
            "RemovePodSandbox",
        )
        .await?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let filter = cri::PodSandboxFilter { id: sandbox_id, ..Default::default() };
        let (left, _) =
            timed(rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) }), "ListPodSandbox").await?;
        if !left.items.is_empty() {
            bail!("the sandbox is still listed after RemovePodSandbox: {:?}", left.items);
        }
        step("Stop+RemoveSandbox", ms, "sandbox stopped and removed; ListPodSandbox no longer shows it");
        println!("\nTorn down: nothing of the demo pod is left in containerd.");
        Ok(())
    };
    steps.await.map_err(|e: anyhow::Error| (e, sandbox_id))
}
