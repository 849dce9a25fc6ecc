//! A node's worth of pods for [`Behaviour::Node`](crate::fake_backend::Behaviour::Node): `pods`
//! pod sandboxes of `per_pod` running containers each, described by ListPodSandbox,
//! ListContainers, PodSandboxStatus and ContainerStatus as containerd 1.7 describes its own
//! (verbose `info` JSON with the `config` and a `runtimeSpec` of a kubelet container's size), for
//! store recovery at sizes a 2-core test machine cannot run for real (1,000 pods × 4 containers).
//!
//! Every answer is encoded once, when the node is made, so that answering costs the fake next to
//! nothing and what is measured is the client. Objects are immutable: no call creates or removes
//! one. IDs are 64 hex digits as containerd's.

use std::collections::HashMap;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;
use serde_json::{json, Value};

use crate::fake_backend::grpc_frame;

/// The shape of a [`FakeNode`]'s pods.
#[derive(Clone, Debug)]
pub struct NodeShape {
    /// Pod sandboxes.
    pub pods: usize,
    /// Running containers per pod sandbox.
    pub per_pod: usize,
    /// Bytes of extra annotation text per pod, besides kubelet's own (a pod author's annotations:
    /// 0 for a plain pod; Kubernetes allows 256 KiB), in one annotation `example.com/blob`.
    pub pod_annotation_bytes: usize,
}

/// One pod sandbox of a [`FakeNode`], as the runtime describes it.
#[derive(Clone, Debug)]
pub struct NodePod {
    /// Its sandbox ID.
    pub sandbox_id: String,
    /// Its metadata (name `pod-N`, uid `uid-N`, namespace `default`).
    pub metadata: cri::PodSandboxMetadata,
    /// Its labels (kubelet's three and `app`).
    pub labels: HashMap<String, String>,
    /// Its annotations (kubelet's and the extra blob, if any).
    pub annotations: HashMap<String, String>,
    /// Its cgroup parent, `/kubepods/besteffort/pod<uid>`.
    pub cgroup_parent: String,
    /// Its containers.
    pub containers: Vec<NodeContainer>,
}

/// One container of a [`NodePod`].
#[derive(Clone, Debug)]
pub struct NodeContainer {
    /// Its container ID.
    pub id: String,
    /// Its name, `c<index in the pod>`.
    pub name: String,
    /// Its annotations (kubelet's).
    pub annotations: HashMap<String, String>,
    /// Its applied CPU shares: unique on the node (2 + its number on the node), so that a test can
    /// tell containers apart by their recovered resources.
    pub cpu_shares: i64,
}

/// A node of immutable pods and the encoded answers describing them.
#[derive(Debug)]
pub struct FakeNode {
    /// The pods, in the order listed.
    pub pods: Vec<NodePod>,
    list_pods: Bytes,
    list_containers: Bytes,
    /// `PodSandboxStatus` answers by sandbox ID, `ContainerStatus` answers by container ID (framed).
    status: HashMap<String, Bytes>,
}

/// A 64-hex-digit ID, unique per (kind, n).
fn id(kind: u8, n: usize) -> String {
    format!("{kind:02x}{:062x}", (n as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995)
}

/// What kubelet puts into every container's runtime spec besides the process: mounts,
/// capabilities, masked and read-only paths (about 4 KB of JSON, as containerd's verbose info).
fn spec_bulk(sandbox_pid: u64) -> Value {
    let caps: Vec<&str> = vec![
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE",
    ];
    let mount = |dest: &str, kind: &str, source: &str| json!({ "destination": dest, "type": kind, "source": source, "options": ["nosuid", "noexec", "nodev", "rw"] });
    json!({
        "mounts": [
            mount("/proc", "proc", "proc"),
            mount("/dev", "tmpfs", "tmpfs"),
            mount("/dev/pts", "devpts", "devpts"),
            mount("/dev/mqueue", "mqueue", "mqueue"),
            mount("/sys", "sysfs", "sysfs"),
            mount("/sys/fs/cgroup", "cgroup", "cgroup"),
            mount("/etc/hosts", "bind", "/var/lib/kubelet/pods/uid/etc-hosts"),
            mount("/dev/termination-log", "bind", "/var/lib/kubelet/pods/uid/containers/c/0"),
            mount("/etc/hostname", "bind", "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/x/hostname"),
            mount("/etc/resolv.conf", "bind", "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/x/resolv.conf"),
            mount("/dev/shm", "bind", "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/x/shm"),
            mount("/var/run/secrets/kubernetes.io/serviceaccount", "bind", "/var/lib/kubelet/pods/uid/volumes/kube-api-access"),
        ],
        "capabilities": { "bounding": caps, "effective": caps, "permitted": caps },
        "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
            "/sys/devices/virtual/powercap"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        "namespaces": [
            { "type": "pid", "path": format!("/proc/{sandbox_pid}/ns/pid") },
            { "type": "ipc", "path": format!("/proc/{sandbox_pid}/ns/ipc") },
            { "type": "uts", "path": format!("/proc/{sandbox_pid}/ns/uts") },
            { "type": "mount" },
            { "type": "network", "path": format!("/proc/{sandbox_pid}/ns/net") },
        ],
    })
}

impl FakeNode {
    /// A node of `shape`'s pods, every answer encoded.
    pub fn new(shape: &NodeShape) -> FakeNode {
        let mut pods = Vec::with_capacity(shape.pods);
        let mut status = HashMap::new();
        let mut listed_pods = Vec::new();
        let mut listed_containers = Vec::new();
        for p in 0..shape.pods {
            let sandbox_id = id(1, p);
            let (name, uid) = (format!("pod-{p}"), format!("uid-{p:08}-0000-4000-8000-{p:012}"));
            let metadata = cri::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.clone(),
                namespace: "default".into(),
                attempt: 0,
            };
            let labels: HashMap<String, String> = HashMap::from([
                ("io.kubernetes.pod.name".into(), name.clone()),
                ("io.kubernetes.pod.namespace".into(), "default".into()),
                ("io.kubernetes.pod.uid".into(), uid.clone()),
                ("app".into(), format!("app-{}", p % 50)),
            ]);
            let mut annotations: HashMap<String, String> = HashMap::from([
                ("kubernetes.io/config.seen".into(), "2026-12-06T08:00:00.000000000Z".into()),
                ("kubernetes.io/config.source".into(), "api".into()),
                ("koordinator.sh/qosClass".into(), "LS".into()),
            ]);
            if shape.pod_annotation_bytes > 0 {
                annotations.insert("example.com/blob".into(), "x".repeat(shape.pod_annotation_bytes));
            }
            let cgroup_parent = format!("/kubepods/besteffort/pod{uid}");
            let pid = 10_000 + p as u64;
            let sandbox_info = json!({
                "pid": pid,
                "processStatus": "running",
                "runtimeHandler": "",
                "runtimeType": "io.containerd.runc.v2",
                "config": {
                    "metadata": { "name": name, "uid": uid, "namespace": "default" },
                    "labels": labels,
                    "annotations": annotations,
                    "linux": { "cgroup_parent": cgroup_parent, "security_context": { "namespace_options": { "network": 2 } } },
                },
                "runtimeSpec": {
                    "process": { "args": ["/pause"], "oomScoreAdj": -998 },
                    "linux": {
                        "resources": { "cpu": { "shares": 2 } },
                        "cgroupsPath": format!("{cgroup_parent}/{sandbox_id}"),
                    },
                },
            });
            let sandbox_status = cri::PodSandboxStatusResponse {
                status: Some(cri::PodSandboxStatus {
                    id: sandbox_id.clone(),
                    metadata: Some(metadata.clone()),
                    state: cri::PodSandboxState::SandboxReady as i32,
                    created_at: 1_700_000_000_000_000_000,
                    labels: labels.clone(),
                    annotations: annotations.clone(),
                    ..Default::default()
                }),
                info: [("info".to_owned(), sandbox_info.to_string())].into(),
                ..Default::default()
            };
            status.insert(sandbox_id.clone(), grpc_frame(&sandbox_status.encode_to_vec()));
            listed_pods.push(cri::PodSandbox {
                id: sandbox_id.clone(),
                metadata: Some(metadata.clone()),
                state: cri::PodSandboxState::SandboxReady as i32,
                created_at: 1_700_000_000_000_000_000,
                labels: labels.clone(),
                annotations: annotations.clone(),
                runtime_handler: String::new(),
            });

            let mut containers = Vec::with_capacity(shape.per_pod);
            for c in 0..shape.per_pod {
                let n = p * shape.per_pod + c;
                let (cid, cname) = (id(2, n), format!("c{c}"));
                let cpu_shares = 2 + n as i64;
                let annotations: HashMap<String, String> = HashMap::from([
                    ("io.kubernetes.container.hash".into(), format!("{:08x}", n)),
                    ("io.kubernetes.container.restartCount".into(), "0".into()),
                    ("io.kubernetes.container.terminationMessagePath".into(), "/dev/termination-log".into()),
                    ("io.kubernetes.container.terminationMessagePolicy".into(), "File".into()),
                    ("io.kubernetes.pod.terminationGracePeriod".into(), "30".into()),
                ]);
                let clabels: HashMap<String, String> = HashMap::from([
                    ("io.kubernetes.container.name".into(), cname.clone()),
                    ("io.kubernetes.pod.name".into(), name.clone()),
                    ("io.kubernetes.pod.namespace".into(), "default".into()),
                    ("io.kubernetes.pod.uid".into(), uid.clone()),
                ]);
                let mut spec = spec_bulk(pid);
                let spec_obj = spec.as_object_mut().expect("an object");
                spec_obj.insert(
                    "process".into(),
                    json!({ "args": ["sleep", "3600"], "env": ["PATH=/usr/bin:/bin", format!("IDX={n}")], "oomScoreAdj": 1000 }),
                );
                spec_obj.insert(
                    "linux".into(),
                    json!({
                        "resources": { "cpu": { "shares": cpu_shares, "period": 100000 } },
                        "cgroupsPath": format!("{cgroup_parent}/{cid}"),
                    }),
                );
                let info = json!({
                    "sandboxID": sandbox_id,
                    "pid": pid + 1 + c as u64,
                    "runtimeType": "io.containerd.runc.v2",
                    "config": {
                        "metadata": { "name": cname },
                        "image": { "image": "registry.example/app:1.0" },
                        "command": ["sleep", "3600"],
                        "envs": [{ "key": "IDX", "value": n.to_string() }],
                        "labels": clabels,
                        "annotations": annotations,
                        "linux": { "resources": { "cpu_shares": cpu_shares, "cpu_period": 100000, "oom_score_adj": 1000 } },
                    },
                    "runtimeSpec": spec,
                });
                let resources = cri::LinuxContainerResources {
                    cpu_shares,
                    cpu_period: 100_000,
                    oom_score_adj: 1000,
                    ..Default::default()
                };
                let container_status = cri::ContainerStatusResponse {
                    status: Some(cri::ContainerStatus {
                        id: cid.clone(),
                        metadata: Some(cri::ContainerMetadata { name: cname.clone(), attempt: 0 }),
                        state: cri::ContainerState::ContainerRunning as i32,
                        created_at: 1_700_000_000_000_000_000,
                        started_at: 1_700_000_000_100_000_000,
                        image: Some(cri::ImageSpec { image: "registry.example/app:1.0".into(), ..Default::default() }),
                        image_ref: format!("sha256:{}", id(3, 0)),
                        labels: clabels.clone(),
                        annotations: annotations.clone(),
                        log_path: format!("/var/log/pods/default_{name}_{uid}/{cname}/0.log"),
                        resources: Some(cri::ContainerResources { linux: Some(resources), ..Default::default() }),
                        ..Default::default()
                    }),
                    info: [("info".to_owned(), info.to_string())].into(),
                };
                status.insert(cid.clone(), grpc_frame(&container_status.encode_to_vec()));
                listed_containers.push(cri::Container {
                    id: cid.clone(),
                    pod_sandbox_id: sandbox_id.clone(),
                    metadata: Some(cri::ContainerMetadata { name: cname.clone(), attempt: 0 }),
                    image: Some(cri::ImageSpec { image: "registry.example/app:1.0".into(), ..Default::default() }),
                    image_ref: format!("sha256:{}", id(3, 0)),
                    state: cri::ContainerState::ContainerRunning as i32,
                    created_at: 1_700_000_000_000_000_000,
                    labels: clabels,
                    annotations: annotations.clone(),
                    ..Default::default()
                });
                containers.push(NodeContainer { id: cid, name: cname, annotations, cpu_shares });
            }
            pods.push(NodePod { sandbox_id, metadata, labels, annotations, cgroup_parent, containers });
        }
        let list_pods = grpc_frame(&cri::ListPodSandboxResponse { items: listed_pods }.encode_to_vec());
        let list_containers =
            grpc_frame(&cri::ListContainersResponse { containers: listed_containers }.encode_to_vec());
        FakeNode { pods, list_pods, list_containers, status }
    }

    /// Makes the status answer of pod sandbox or container `id` a gRPC frame whose message is
    /// not protobuf (a field of wire type 7, which does not exist): a runtime answering garbage.
    pub fn garble_status(&mut self, id: &str) {
        self.status.insert(id.to_owned(), grpc_frame(&[0x0f, 0xff, 0xff]));
    }

    /// Containers on the node.
    pub fn containers(&self) -> usize {
        self.pods.iter().map(|p| p.containers.len()).sum()
    }

    /// The answer to a call on `path` with the (gRPC-framed) request `body`: `Some(Ok(framed
    /// message))`, `Some(Err(()))` for an object the node does not have (`NOT_FOUND`), `None` for
    /// a method it does not describe (answered as [`Behaviour::Cri`](crate::fake_backend::Behaviour::Cri)).
    /// A filtered ListPodSandbox / ListContainers is answered as an unfiltered one, except for a
    /// container ID filter (the proxy's store-miss lookup).
    pub fn answer(&self, path: &str, body: &[u8]) -> Option<Result<Bytes, ()>> {
        let request = body.get(5..).unwrap_or_default();
        match path.rsplit('/').next().unwrap_or_default() {
            "ListPodSandbox" => Some(Ok(self.list_pods.clone())),
            "ListContainers" => {
                let filter = cri::ListContainersRequest::decode(request).ok()?.filter.unwrap_or_default();
                if filter.id.is_empty() {
                    return Some(Ok(self.list_containers.clone()));
                }
                let listed = cri::ListContainersResponse::decode(self.list_containers.get(5..)?).ok()?;
                let containers = listed.containers.into_iter().filter(|c| c.id == filter.id).collect();
                Some(Ok(grpc_frame(&cri::ListContainersResponse { containers }.encode_to_vec())))
            }
            "PodSandboxStatus" => {
                let id = cri::PodSandboxStatusRequest::decode(request).ok()?.pod_sandbox_id;
                Some(self.status.get(&id).cloned().ok_or(()))
            }
            "ContainerStatus" => {
                let id = cri::ContainerStatusRequest::decode(request).ok()?.container_id;
                Some(self.status.get(&id).cloned().ok_or(()))
            }
            _ => None,
        }
    }
}
