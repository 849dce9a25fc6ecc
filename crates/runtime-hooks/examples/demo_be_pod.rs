//! A BE pod with batch resources, run the way kubelet runs it, and its real cgroup values.
//!
//! The pod is labelled `koordinator.sh/qosClass: BE` and annotated with
//! `node.koordinator.sh/extended-resource-spec` (batch-cpu request 500 and limit 1000 milli-CPU,
//! batch-memory limit 128Mi); its container asks for what kubelet gives a BestEffort container
//! (2 CPU shares, no quota, no memory limit). The program prints, per cgroup file, what kubelet
//! asked for and what the container got.
//!
//! * `--endpoint` the runtime-proxy socket: runtime-hooks answers the hooks, so the values are
//!   right from creation.
//! * `--endpoint` containerd's own socket with `--watch SECONDS`: no proxy; the program polls
//!   until runtime-hooks in standalone mode has corrected the files (or the time is up).
//!
//! `scripts/demo-hooks.sh` (`make demo-hooks`) runs both. By hand:
//!
//! ```text
//! RP_CONTAINERD_ENV=/tmp/rp-demo-hooks-ctrd/env \
//!   cargo run --release -p runtime-hooks --example demo_be_pod -- --endpoint /tmp/rp-demo-hooks/runtimeproxy.sock
//! ```

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_cri::v1 as cri;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};

const USAGE: &str = "usage: RP_CONTAINERD_ENV=ENV_FILE demo_be_pod --endpoint SOCKET [--watch SECONDS]";
const SPEC: &str = r#"{"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "500"}, "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "128Mi"}}}}"#;

fn args() -> Result<(PathBuf, Option<u64>)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut endpoint, mut watch) = (None, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--endpoint" => endpoint = it.next().map(PathBuf::from),
            "--watch" => watch = Some(it.next().context(USAGE)?.parse().context("--watch SECONDS")?),
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    Ok((endpoint.context(USAGE)?, watch))
}

/// (label, controller, file, what kubelet asked)
const FILES: [(&str, &str, &str, &str); 4] = [
    ("CPU shares", "cpu", "cpu.shares", "2"),
    ("CFS period (µs)", "cpu", "cpu.cfs_period_us", "100000"),
    ("CFS quota (µs)", "cpu", "cpu.cfs_quota_us", "-1 (none)"),
    ("memory limit (bytes)", "memory", "memory.limit_in_bytes", "none"),
];
const WANT: [&str; 4] = ["512", "100000", "100000", "134217728"];

fn current(pod: &Pod) -> Vec<String> {
    FILES.iter().map(|(_, ctrl, file, _)| pod.cgroup_file(ctrl, file)).collect()
}

fn table(pod: &Pod, title: &str) {
    println!(
        "\n  {title}\n  container cgroup /sys/fs/cgroup/<controller>{}/{}/",
        pod.cgroup_parent(),
        pod.container_id
    );
    println!("    {:<22}{:<24}{:<12}container", "", "file", "kubelet");
    for ((label, _, file, asked), value) in FILES.iter().zip(current(pod)) {
        println!("    {label:<22}{file:<24}{asked:<12}{value}");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo_be_pod: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    let (endpoint, watch) = args()?;
    let env = Containerd::from_env();
    let mut rt = test_support::runtime_client(&endpoint);
    let labels = HashMap::from([("koordinator.sh/qosClass".to_owned(), "BE".to_owned())]);
    let annotations = HashMap::from([("node.koordinator.sh/extended-resource-spec".to_owned(), SPEC.to_owned())]);
    let sandbox = sandbox_config(&env, &unique("be-demo"), labels, annotations);
    // kubelet creates the pod cgroup before RunPodSandbox; runtime-hooks writes pod-level values there.
    let parent = sandbox.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default();
    for ctrl in ["cpu", "memory"] {
        std::fs::create_dir_all(format!("/sys/fs/cgroup/{ctrl}{parent}")).context("creating the pod cgroup")?;
    }
    let resources = cri::LinuxContainerResources { cpu_shares: 2, cpu_period: 100_000, ..Default::default() };
    let container = container_config(&env, "main", &["sleep", "3600"], Some(resources), &[]);
    println!("BE pod via {}:", endpoint.display());
    println!("  label       koordinator.sh/qosClass: BE");
    println!("  annotation  node.koordinator.sh/extended-resource-spec: {SPEC}");
    let pod = Pod::start(&mut rt, sandbox, container).await.context("starting the pod")?;
    let result = report(&pod, watch).await;
    pod.remove(&mut rt).await;
    result
}

async fn report(pod: &Pod, watch: Option<u64>) -> Result<()> {
    match watch {
        None => table(pod, "right after creation (runtime-hooks answered the proxy's hooks):"),
        Some(secs) => {
            table(pod, "right after creation (no proxy: containerd did what kubelet asked):");
            let start = Instant::now();
            while current(pod) != WANT && start.elapsed() < Duration::from_secs(secs) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let title = format!(
                "{:.1} s later (runtime-hooks --mode standalone corrected the files):",
                start.elapsed().as_secs_f64()
            );
            table(pod, &title);
        }
    }
    let parent = pod.cgroup_parent();
    let read = |ctrl: &str, file: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{ctrl}{parent}/{file}")).unwrap_or_default().trim().to_owned()
    };
    println!(
        "  pod cgroup: cpu.shares {}, cpu.cfs_quota_us {}, memory.limit_in_bytes {}",
        read("cpu", "cpu.shares"),
        read("cpu", "cpu.cfs_quota_us"),
        read("memory", "memory.limit_in_bytes")
    );
    if current(pod) != WANT {
        bail!("the container's cgroup does not hold the BE policy's values {WANT:?}");
    }
    Ok(())
}
