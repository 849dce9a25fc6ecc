//! A minimal runtime hook server: sets a container's CPU shares from a pod annotation.
//!
//! A pod annotated `example.runtime-proxy.dev/cpu-shares: "512"` gets `cpu_shares = 512` in its
//! containers' resources at PreCreateContainer and PreUpdateContainerResources, and at
//! PreCreateContainer also the env vars `HOOKED_BY=annotation-hook` and `CPU_SHARES=512`. Like
//! koordlet, every answer starts as a copy of the request and then overrides what this hook owns;
//! all other RPCs just echo. A value that is not an integer in 2..=262144 fails the call with
//! INVALID_ARGUMENT (the proxy then applies the registration's failure policy, here "Ignore").
//!
//! Run it next to runtime-proxy (both as root on the node):
//!
//! ```text
//! cargo run -p hook-api --example annotation_hook -- \
//!     --listen /run/annotation-hook.sock --hook-config-dir /etc/runtime/hookserver.d
//! runtime-proxy --hook-config-dir /etc/runtime/hookserver.d ...
//! ```
//!
//! With `--hook-config-dir` it registers itself by writing `annotation-hook.json` there
//! (atomically) and removes the file on SIGTERM/SIGINT. Each call logs one line to stderr.

use std::path::{Path, PathBuf};

use hook_api::merge::{echo_container as echo, echo_pod};
use hook_api::v1alpha1::{
    ContainerResourceHookRequest as ContainerReq, ContainerResourceHookResponse as ContainerResp,
    PodSandboxHookRequest as PodReq, PodSandboxHookResponse as PodResp, PodSandboxMetadata,
};
use hook_api::{RuntimeHookService, RuntimeHookServiceServer};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const NAME: &str = "annotation-hook";
const ANNOTATION: &str = "example.runtime-proxy.dev/cpu-shares";
const USAGE: &str = "usage: annotation_hook --listen SOCKET [--hook-config-dir DIR]";

/// The hook itself: echo (koordlet's pattern: every answer starts as a copy of the request), then set CPU shares (and
/// at PreCreateContainer the envs) if the pod has the annotation.
fn apply_annotation(req: &ContainerReq, pre_create: bool) -> Result<ContainerResp, Status> {
    let mut resp = echo(req);
    let Some(value) = req.pod_annotations.get(ANNOTATION) else {
        return Ok(resp);
    };
    let shares = parse_shares(value)?;
    resp.container_resources.get_or_insert_default().cpu_shares = shares;
    if pre_create {
        let envs = &mut resp.container_envs;
        envs.insert("HOOKED_BY".into(), NAME.into());
        envs.insert("CPU_SHARES".into(), shares.to_string());
    }
    Ok(resp)
}

/// CPU shares as the kernel accepts them (cgroup v1 `cpu.shares`: 2..=262144).
fn parse_shares(value: &str) -> Result<i64, Status> {
    match value.trim().parse() {
        Ok(shares) if (2..=262_144).contains(&shares) => Ok(shares),
        _ => Err(Status::invalid_argument(format!(
            "pod annotation {ANNOTATION}={value:?}: want an integer number of CPU shares in 2..=262144"
        ))),
    }
}

fn pod_name(pod: &Option<PodSandboxMetadata>) -> String {
    let pod = pod.clone().unwrap_or_default();
    format!("{}/{}", pod.namespace, pod.name)
}

fn container_name(req: &ContainerReq) -> String {
    let container = req.container_meta.clone().unwrap_or_default();
    format!("{}/{}", pod_name(&req.pod_meta), container.name)
}

/// One line on stderr. Unlike `eprintln!`, which panics when stderr is a closed pipe, a line
/// that cannot be written is lost: a hook server must not die with its log pipe.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Logs the call (one line: RPC, pod or container, outcome) and wraps the answer.
fn reply<A>(rpc: &str, who: String, result: Result<A, Status>) -> Answer<A> {
    match &result {
        Ok(_) => say(format_args!("{rpc} {who}: ok")),
        Err(status) => say(format_args!("{rpc} {who}: {}", hook_api::status_line(status))),
    }
    result.map(Response::new)
}

type Answer<A> = Result<Response<A>, Status>;

struct Hook;

#[tonic::async_trait]
impl RuntimeHookService for Hook {
    async fn pre_run_pod_sandbox_hook(&self, r: Request<PodReq>) -> Answer<PodResp> {
        let r = r.into_inner();
        reply("PreRunPodSandbox", pod_name(&r.pod_meta), Ok(echo_pod(&r)))
    }
    async fn post_stop_pod_sandbox_hook(&self, r: Request<PodReq>) -> Answer<PodResp> {
        let r = r.into_inner();
        reply("PostStopPodSandbox", pod_name(&r.pod_meta), Ok(echo_pod(&r)))
    }
    async fn pre_create_container_hook(&self, r: Request<ContainerReq>) -> Answer<ContainerResp> {
        let r = r.into_inner();
        let answer = apply_annotation(&r, true);
        reply("PreCreateContainer", container_name(&r), answer)
    }
    async fn pre_start_container_hook(&self, r: Request<ContainerReq>) -> Answer<ContainerResp> {
        let r = r.into_inner();
        reply("PreStartContainer", container_name(&r), Ok(echo(&r)))
    }
    async fn post_start_container_hook(&self, r: Request<ContainerReq>) -> Answer<ContainerResp> {
        let r = r.into_inner();
        reply("PostStartContainer", container_name(&r), Ok(echo(&r)))
    }
    async fn post_stop_container_hook(&self, r: Request<ContainerReq>) -> Answer<ContainerResp> {
        let r = r.into_inner();
        reply("PostStopContainer", container_name(&r), Ok(echo(&r)))
    }
    async fn pre_update_container_resources_hook(&self, r: Request<ContainerReq>) -> Answer<ContainerResp> {
        let r = r.into_inner();
        let answer = apply_annotation(&r, false);
        reply("PreUpdateContainerResources", container_name(&r), answer)
    }
}

/// Writes `<dir>/annotation-hook.json` via a temp file and rename, so the proxy never reads half a
/// file. The temp name does not end in "json": koord-runtime-proxy would load it otherwise.
fn register(dir: &Path, endpoint: &Path) -> std::io::Result<PathBuf> {
    let config = serde_json::json!({
        "remote-endpoint": endpoint,
        "failure-policy": "Ignore",
        "runtime-hooks": ["PreCreateContainer", "PreUpdateContainerResources"],
    });
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!("{NAME}.json"));
    let tmp = dir.join(format!(".{NAME}.json.tmp"));
    hook_api::write_registration(&tmp, &file, &serde_json::to_vec_pretty(&config)?)?;
    Ok(file)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut listen, mut config_dir) = (None, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--listen" => &mut listen,
            "--hook-config-dir" => &mut config_dir,
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}").into()),
        };
        *slot = Some(PathBuf::from(args.next().ok_or(USAGE)?));
    }
    // Absolute, because the proxy dials the registered path from its own working directory.
    let listen = std::path::absolute(listen.ok_or(USAGE)?)?;

    let _ = std::fs::remove_file(&listen); // a stale socket from an earlier run
    let incoming = UnixListenerStream::new(UnixListener::bind(&listen)?);
    let registration = config_dir.map(|dir| register(&dir, &listen)).transpose()?;
    match &registration {
        Some(file) => say(format_args!("{NAME}: listening on {}, registered in {}", listen.display(), file.display())),
        None => say(format_args!("{NAME}: listening on {}, not registered (no --hook-config-dir)", listen.display())),
    }

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let shutdown = async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        // Unregister first, so the proxy stops calling us while in-flight calls finish.
        if let Some(file) = registration {
            if let Err(e) = std::fs::remove_file(&file) {
                say(format_args!("{NAME}: removing {}: {e}", file.display()));
            }
        }
    };
    tonic::transport::Server::builder()
        .add_service(RuntimeHookServiceServer::new(Hook))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    let _ = std::fs::remove_file(&listen);
    say(format_args!("{NAME}: stopped"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hook_api::v1alpha1::LinuxContainerResources;

    fn request(annotation: Option<&str>) -> ContainerReq {
        ContainerReq {
            pod_annotations: annotation.map(|v| [(ANNOTATION.into(), v.into())].into()).unwrap_or_default(),
            container_resources: Some(LinuxContainerResources {
                cpu_shares: 2,
                cpuset_cpus: "0-1".into(),
                oom_score_adj: -997,
                ..Default::default()
            }),
            container_envs: [("PATH".into(), "/bin".into())].into(),
            container_annotations: [("a".into(), "b".into())].into(),
            pod_cgroup_parent: "/kubepods/burstable/pod1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn pre_create_sets_shares_and_envs_and_echoes_the_rest() {
        let req = request(Some("512"));
        let resp = apply_annotation(&req, true).unwrap();
        let res = resp.container_resources.unwrap();
        assert_eq!((res.cpu_shares, res.cpuset_cpus.as_str(), res.oom_score_adj), (512, "0-1", -997));
        assert_eq!(resp.container_envs["HOOKED_BY"], "annotation-hook");
        assert_eq!(resp.container_envs["CPU_SHARES"], "512");
        assert_eq!(resp.container_envs["PATH"], "/bin");
        assert_eq!(resp.container_annotations, req.container_annotations);
        assert_eq!(resp.pod_cgroup_parent, req.pod_cgroup_parent);
    }

    #[test]
    fn update_sets_shares_only_and_creates_missing_resources() {
        let req = ContainerReq { container_resources: None, ..request(Some(" 1024 ")) };
        let resp = apply_annotation(&req, false).unwrap();
        assert_eq!(resp.container_resources.unwrap().cpu_shares, 1024);
        assert_eq!(resp.container_envs, req.container_envs);
    }

    #[test]
    fn without_the_annotation_everything_is_echoed() {
        let req = request(None);
        assert_eq!(apply_annotation(&req, true).unwrap(), echo(&req));
        assert_eq!(echo(&req).container_resources, req.container_resources);
        assert_eq!(echo(&req).container_envs, req.container_envs);
    }

    #[test]
    fn invalid_values_are_invalid_argument_naming_annotation_and_value() {
        for bad in ["abc", "1.5", "", "1", "0", "-5", "262145"] {
            let err = apply_annotation(&request(Some(bad)), true).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            let named = format!("{ANNOTATION}={bad:?}");
            assert!(err.message().contains(&named), "{}", err.message());
        }
    }

    #[test]
    fn registration_file_is_written_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let file = register(dir.path(), Path::new("/run/hook.sock")).unwrap();
        assert_eq!(file, dir.path().join("annotation-hook.json"));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(json["remote-endpoint"], "/run/hook.sock");
        assert_eq!(json["failure-policy"], "Ignore");
        let hooks = serde_json::json!(["PreCreateContainer", "PreUpdateContainerResources"]);
        assert_eq!(json["runtime-hooks"], hooks);
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 1, "no temp file left behind");
    }
}
