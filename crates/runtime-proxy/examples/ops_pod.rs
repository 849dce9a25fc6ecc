//! Pod steps for the operations test (`scripts/test-operations.sh`), one CRI client call sequence
//! per subcommand, through whatever socket is given (the installed runtime-proxy, or containerd
//! itself), so that a pod can outlive the proxy process that created it:
//!
//! ```text
//! ops_pod run    --endpoint SOCK --state FILE --expect-shares N   # RunPodSandbox, CreateContainer, StartContainer
//! ops_pod check  --endpoint SOCK --state FILE --expect-shares N   # the same container still running, unrestarted
//! ops_pod update --endpoint SOCK --state FILE --expect-shares N   # UpdateContainerResources as kubelet sends it
//! ops_pod remove --endpoint SOCK --state FILE                     # the pod's teardown
//! ```
//!
//! The pod is annotated `example.runtime-proxy.dev/cpu-shares: "700"` and its container asks for 512
//! CPU shares (as in `demo_pod`): with the example hook server registered, the container's
//! `cpu.shares` is 700 and its env has `HOOKED_BY=annotation-hook`; without, 512 and no such env.
//! `--expect-shares` is what the cgroup must hold after the step. `run` writes FILE (sandbox and
//! container IDs, cgroup parent, the container's pid and start time); the others read it.
//! `RP_CONTAINERD_ENV` names the env file of `scripts/containerd.sh up`. Prints one line per step.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, ensure, Context, Result};
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{container_config, sandbox_config, unique, Containerd, Pod};
use tonic::transport::Channel;

const USAGE: &str = "usage: ops_pod run|check|update|remove --endpoint SOCKET --state FILE [--expect-shares N]";
const ANNOTATION: (&str, &str) = ("example.runtime-proxy.dev/cpu-shares", "700");
const KUBELET_SHARES: i64 = 512;

struct Opts {
    command: String,
    endpoint: PathBuf,
    state: PathBuf,
    expect_shares: Option<String>,
}

fn opts() -> Result<Opts> {
    let mut args = std::env::args().skip(1);
    let command = args.next().context(USAGE)?;
    let (mut endpoint, mut state, mut expect_shares) = (None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--endpoint" => endpoint = Some(PathBuf::from(value)),
            "--state" => state = Some(PathBuf::from(value)),
            "--expect-shares" => expect_shares = Some(value),
            _ => bail!("unknown flag {flag}; {USAGE}"),
        }
    }
    Ok(Opts { command, endpoint: endpoint.context(USAGE)?, state: state.context(USAGE)?, expect_shares })
}

/// The pod as `run` recorded it.
struct State(BTreeMap<String, String>);

impl State {
    fn read(path: &PathBuf) -> Result<State> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Ok(State(text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()))
    }
    fn get(&self, key: &str) -> Result<&str> {
        self.0.get(key).map(String::as_str).with_context(|| format!("state file has no {key}"))
    }
    fn cgroup_file(&self, controller: &str, file: &str) -> Result<String> {
        let path = format!("/sys/fs/cgroup/{controller}{}/{}/{file}", self.get("PARENT")?, self.get("CONTAINER")?);
        Ok(std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?.trim().to_owned())
    }
}

/// The container's state name, pid (from the verbose info) and start time.
async fn status(rt: &mut RuntimeServiceClient<Channel>, id: &str) -> Result<(String, u64, i64)> {
    let status =
        rt.container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: true }).await?.into_inner();
    let s = status.status.context("ContainerStatus without status")?;
    let state =
        cri::ContainerState::try_from(s.state).map(|s| s.as_str_name().to_owned()).unwrap_or_else(|_| "unknown".into());
    let pid = status
        .info
        .get("info")
        .and_then(|info| serde_json::from_str::<serde_json::Value>(info).ok())
        .and_then(|info| info["pid"].as_u64())
        .unwrap_or(0);
    Ok((state, pid, s.started_at))
}

async fn env_hooked_by(rt: &mut RuntimeServiceClient<Channel>, id: &str) -> Result<String> {
    let request = cri::ExecSyncRequest {
        container_id: id.into(),
        cmd: vec!["sh".into(), "-c".into(), "echo $HOOKED_BY".into()],
        timeout: 10,
    };
    let out = rt.exec_sync(request).await.context("ExecSync")?.into_inner();
    ensure!(out.exit_code == 0, "ExecSync exit code {}: {}", out.exit_code, String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn expect_shares(o: &Opts, state: &State) -> Result<()> {
    let shares = state.cgroup_file("cpu", "cpu.shares")?;
    println!("  cpu.shares {shares}");
    if let Some(want) = &o.expect_shares {
        ensure!(&shares == want, "cpu.shares is {shares}, expected {want}");
    }
    Ok(())
}

async fn run(o: &Opts) -> Result<()> {
    let mut rt = test_support::runtime_client(&o.endpoint);
    match o.command.as_str() {
        "run" => {
            let env = Containerd::from_env();
            let annotations = HashMap::from([(ANNOTATION.0.to_owned(), ANNOTATION.1.to_owned())]);
            let labels = HashMap::from([("app".to_owned(), "ops-test".to_owned())]);
            let config = sandbox_config(&env, &unique("ops"), labels, annotations);
            let resources = cri::LinuxContainerResources { cpu_shares: KUBELET_SHARES, ..Default::default() };
            let container = container_config(&env, "app", &["sleep", "3600"], Some(resources), &[]);
            let pod = Pod::start(&mut rt, config, container).await.context("starting the pod")?;
            let (state, pid, started) = status(&mut rt, &pod.container_id).await?;
            println!("  pod {} container {} {state} pid {pid}", pod.sandbox_id, pod.container_id);
            let text = format!(
                "SANDBOX={}\nCONTAINER={}\nPARENT={}\nPID={pid}\nSTARTED={started}\n",
                pod.sandbox_id,
                pod.container_id,
                pod.cgroup_parent()
            );
            std::fs::write(&o.state, text).with_context(|| format!("writing {}", o.state.display()))?;
            let state = State::read(&o.state)?;
            expect_shares(o, &state)?;
            let hooked = env_hooked_by(&mut rt, &pod.container_id).await?;
            println!("  env HOOKED_BY={hooked:?}");
            let want = if o.expect_shares.as_deref() == Some(ANNOTATION.1) { "annotation-hook" } else { "" };
            ensure!(o.expect_shares.is_none() || hooked == want, "HOOKED_BY is {hooked:?}, expected {want:?}");
        }
        "check" => {
            let state = State::read(&o.state)?;
            let (s, pid, started) = status(&mut rt, state.get("CONTAINER")?).await?;
            println!("  container {} {s} pid {pid}", state.get("CONTAINER")?);
            ensure!(s == "CONTAINER_RUNNING", "container is {s}");
            ensure!(
                pid.to_string() == state.get("PID")?,
                "pid {pid}, was {} at run: the container was restarted",
                state.get("PID")?
            );
            ensure!(started.to_string() == state.get("STARTED")?, "started_at changed: the container was restarted");
            expect_shares(o, &state)?;
        }
        "update" => {
            let state = State::read(&o.state)?;
            let resources = cri::LinuxContainerResources { cpu_shares: KUBELET_SHARES, ..Default::default() };
            let request = cri::UpdateContainerResourcesRequest {
                container_id: state.get("CONTAINER")?.into(),
                linux: Some(resources),
                ..Default::default()
            };
            rt.update_container_resources(request).await.context("UpdateContainerResources")?;
            println!("  UpdateContainerResources cpu_shares {KUBELET_SHARES}");
            expect_shares(o, &state)?;
        }
        "remove" => {
            let state = State::read(&o.state)?;
            let pod = Pod {
                sandbox_id: state.get("SANDBOX")?.into(),
                container_id: state.get("CONTAINER")?.into(),
                config: Default::default(),
            };
            pod.remove(&mut rt).await;
            println!("  pod {} removed", state.get("SANDBOX")?);
        }
        other => bail!("unknown command {other}; {USAGE}"),
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let o = match opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ops_pod: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(&o).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ops_pod {}: {e:#}", o.command);
            ExitCode::FAILURE
        }
    }
}
