//! `connect` against a real hook server on a unix socket: the channel is lazy, survives a server
//! that starts late, and carries every RPC to the right method.

use hook_api::v1alpha1::{
    ContainerMetadata, ContainerResourceHookRequest as ContainerReq, ContainerResourceHookResponse as ContainerResp,
    LinuxContainerResources, PodSandboxHookRequest as PodReq, PodSandboxHookResponse as PodResp,
};
use hook_api::{connect, RuntimeHookService, RuntimeHookServiceClient, RuntimeHookServiceServer};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

/// Answers every RPC with its own name, so the test can tell which method ran.
struct NameTheRpc;

fn pod(rpc: &str) -> Result<Response<PodResp>, Status> {
    Ok(Response::new(PodResp { cgroup_parent: rpc.into(), ..Default::default() }))
}

fn container(rpc: &str, req: Request<ContainerReq>) -> Result<Response<ContainerResp>, Status> {
    let req = req.into_inner();
    Ok(Response::new(ContainerResp {
        pod_cgroup_parent: rpc.into(),
        container_resources: req.container_resources,
        container_envs: [("ID".into(), req.container_meta.unwrap_or_default().id)].into(),
        ..Default::default()
    }))
}

#[tonic::async_trait]
impl RuntimeHookService for NameTheRpc {
    async fn pre_run_pod_sandbox_hook(&self, _: Request<PodReq>) -> Result<Response<PodResp>, Status> {
        pod("PreRunPodSandboxHook")
    }
    async fn post_stop_pod_sandbox_hook(&self, _: Request<PodReq>) -> Result<Response<PodResp>, Status> {
        pod("PostStopPodSandboxHook")
    }
    async fn pre_create_container_hook(&self, r: Request<ContainerReq>) -> Result<Response<ContainerResp>, Status> {
        container("PreCreateContainerHook", r)
    }
    async fn pre_start_container_hook(&self, r: Request<ContainerReq>) -> Result<Response<ContainerResp>, Status> {
        container("PreStartContainerHook", r)
    }
    async fn post_start_container_hook(&self, r: Request<ContainerReq>) -> Result<Response<ContainerResp>, Status> {
        container("PostStartContainerHook", r)
    }
    async fn post_stop_container_hook(&self, r: Request<ContainerReq>) -> Result<Response<ContainerResp>, Status> {
        container("PostStopContainerHook", r)
    }
    async fn pre_update_container_resources_hook(
        &self,
        r: Request<ContainerReq>,
    ) -> Result<Response<ContainerResp>, Status> {
        container("PreUpdateContainerResourcesHook", r)
    }
}

#[tokio::test]
async fn lazy_channel_reaches_a_late_server_and_every_rpc() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("hook.sock");
    let mut client = RuntimeHookServiceClient::new(connect(&socket));

    // No server yet: connect() itself succeeded (lazy), the call fails as UNAVAILABLE.
    let err = client.pre_run_pod_sandbox_hook(PodReq::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");

    let incoming = UnixListenerStream::new(UnixListener::bind(&socket).unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeHookServiceServer::new(NameTheRpc))
            .serve_with_incoming(incoming),
    );

    let pod_rpcs = [
        client.pre_run_pod_sandbox_hook(PodReq::default()).await,
        client.post_stop_pod_sandbox_hook(PodReq::default()).await,
    ];
    let pod_names: Vec<_> = pod_rpcs.map(|r| r.unwrap().into_inner().cgroup_parent).into();
    assert_eq!(pod_names, ["PreRunPodSandboxHook", "PostStopPodSandboxHook"]);

    let req = ContainerReq {
        container_meta: Some(ContainerMetadata { id: "abc123".into(), ..Default::default() }),
        container_resources: Some(LinuxContainerResources { cpu_shares: 512, ..Default::default() }),
        ..Default::default()
    };
    let container_rpcs = [
        client.pre_create_container_hook(req.clone()).await,
        client.pre_start_container_hook(req.clone()).await,
        client.post_start_container_hook(req.clone()).await,
        client.post_stop_container_hook(req.clone()).await,
        client.pre_update_container_resources_hook(req.clone()).await,
    ];
    let mut names = Vec::new();
    for resp in container_rpcs {
        let resp = resp.unwrap().into_inner();
        assert_eq!(resp.container_resources.unwrap().cpu_shares, 512);
        assert_eq!(resp.container_envs["ID"], "abc123");
        names.push(resp.pod_cgroup_parent);
    }
    assert_eq!(
        names,
        [
            "PreCreateContainerHook",
            "PreStartContainerHook",
            "PostStartContainerHook",
            "PostStopContainerHook",
            "PreUpdateContainerResourcesHook"
        ]
    );
}
