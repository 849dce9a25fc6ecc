//! A node's worth of pods for scale tests and benchmarks: N pods × M containers with the mix of a
//! Koordinator node — half BE (batch resources in the extended-resource-spec annotation, in the
//! `besteffort` QoS cgroup), four in ten LS (burstable), one in ten LSR (guaranteed, with a cpuset
//! in the resource-status annotation) — labelled and annotated as kubelet and koord-scheduler do,
//! with the resources kubelet gives each container. Pod `i` is always the same pod.
//!
//! [`nri_node`] describes them as an NRI runtime does (Synchronize, events), [`hook_pod`] and
//! [`hook_container`] as runtime-proxy asks its hook servers about them;
//! [`cgroup_v1_tree`] makes their pod cgroup directories in a v1 tree for a plugin to write to,
//! [`cgroup_v1_node`] their containers' too; [`crate::cri_node`] serves them as a CRI runtime.

use std::path::Path;

use hook_api::v1alpha1 as hook;
use nri_plugin::proto::api as nri;

/// A pod's Koordinator QoS class (`koordinator.sh/qosClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qos {
    /// Best effort, on batch resources.
    Be,
    /// Latency sensitive (burstable).
    Ls,
    /// Latency sensitive, reserved CPUs (guaranteed, own cpuset).
    Lsr,
}

impl Qos {
    /// The class of pod `i`: 5 in 10 BE, 4 in 10 LS, 1 in 10 LSR.
    pub fn of(i: usize) -> Qos {
        match i % 10 {
            0..=4 => Qos::Be,
            5..=8 => Qos::Ls,
            _ => Qos::Lsr,
        }
    }

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Qos::Be => "BE",
            Qos::Ls => "LS",
            Qos::Lsr => "LSR",
        }
    }

    /// kubelet's pod cgroup parent (cgroupfs driver) for a pod of this class with `uid`.
    pub fn cgroup_parent(self, uid: &str) -> String {
        match self {
            Qos::Be => format!("/kubepods/besteffort/pod{uid}"),
            Qos::Ls => format!("/kubepods/burstable/pod{uid}"),
            Qos::Lsr => format!("/kubepods/pod{uid}"),
        }
    }
}

/// Pod `i`'s UID.
pub fn uid(i: usize) -> String {
    format!("0000{i:04x}-5ca1-4e00-8000-00000000{i:04x}")
}

fn entry(k: &str, v: &str) -> nri::BytesEntry {
    nri::BytesEntry { key: k.as_bytes().to_vec(), value: v.as_bytes().to_vec() }
}

/// Pod `i` with `containers` containers named `c0`, `c1`, … as an NRI runtime describes it.
pub fn nri_pod(i: usize, containers: usize) -> nri::PodSandbox {
    let (qos, uid) = (Qos::of(i), uid(i));
    let name = format!("scale-{i}");
    let mut labels = vec![
        entry("io.kubernetes.pod.name", &name),
        entry("io.kubernetes.pod.namespace", "default"),
        entry("io.kubernetes.pod.uid", &uid),
        entry("app", &format!("app-{}", i % 20)),
        entry("pod-template-hash", "5d4b8c7f9"),
        entry("koordinator.sh/qosClass", qos.label()),
    ];
    labels.sort_by(|a, b| a.key.cmp(&b.key));
    let mut annotations = vec![
        entry("kubernetes.io/config.seen", "2026-12-06T09:00:00.000000000Z"),
        entry("kubernetes.io/config.source", "api"),
    ];
    match qos {
        Qos::Be => {
            let per: Vec<String> = (0..containers)
                .map(|c| {
                    format!(
                        r#""c{c}": {{"requests": {{"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"}}, "limits": {{"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "512Mi"}}}}"#
                    )
                })
                .collect();
            annotations.push(entry(
                "node.koordinator.sh/extended-resource-spec",
                &format!(r#"{{"containers": {{{}}}}}"#, per.join(", ")),
            ));
        }
        Qos::Lsr => {
            let cpus = format!("{}-{}", 2 * (i % 8), 2 * (i % 8) + 1);
            annotations.push(entry("scheduling.koordinator.sh/resource-status", &format!(r#"{{"cpuset": "{cpus}"}}"#)));
        }
        Qos::Ls => {}
    }
    nri::PodSandbox {
        id: format!("sandbox-{i:04}"),
        name,
        uid: uid.clone(),
        namespace: "default".into(),
        labels,
        annotations,
        linux: Some(nri::LinuxPodSandbox { cgroup_parent: qos.cgroup_parent(&uid), ..Default::default() }),
        ..Default::default()
    }
}

/// Container `c` of pod `i` (running), with the resources kubelet gives it: BE 2 shares and no
/// limit; LS 1 CPU requested, 2 CPUs and 512 MiB limit; LSR 2 CPUs and 1 GiB, requests = limits.
pub fn nri_container(i: usize, c: usize, pod: &nri::PodSandbox) -> nri::Container {
    let qos = Qos::of(i);
    let (shares, quota, limit) = match qos {
        Qos::Be => (2, None, None),
        Qos::Ls => (1024, Some(200_000), Some(512 << 20)),
        Qos::Lsr => (2048, Some(200_000), Some(1 << 30)),
    };
    let id = format!("container-{i:04}-{c}");
    let parent = pod.linux.as_ref().map(|l| l.cgroup_parent.as_str()).unwrap_or_default();
    let resources = nri::LinuxResources {
        cpu: Some(nri::LinuxCpu {
            shares: Some(nri::OptionalUInt64 { value: shares }),
            quota: quota.map(|value| nri::OptionalInt64 { value }),
            period: Some(nri::OptionalUInt64 { value: 100_000 }),
            ..Default::default()
        }),
        memory: limit.map(|value| nri::LinuxMemory { limit: Some(nri::OptionalInt64 { value }), ..Default::default() }),
        ..Default::default()
    };
    nri::Container {
        id: id.clone(),
        pod_sandbox_id: pod.id.clone(),
        name: format!("c{c}"),
        state: nri::ContainerState::ContainerRunning as i32,
        labels: vec![
            entry("io.kubernetes.container.name", &format!("c{c}")),
            entry("io.kubernetes.pod.name", &pod.name),
            entry("io.kubernetes.pod.namespace", "default"),
            entry("io.kubernetes.pod.uid", &pod.uid),
        ],
        annotations: vec![entry("io.kubernetes.container.restartCount", "0")],
        args: vec!["sleep".into(), "infinity".into()],
        env: vec![b"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_vec()],
        linux: Some(nri::LinuxContainer { cgroups_path: format!("{parent}/{id}"), resources: Some(resources) }),
        ..Default::default()
    }
}

fn text_map(entries: &[nri::BytesEntry]) -> std::collections::BTreeMap<String, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    entries.iter().map(|e| (text(&e.key), text(&e.value))).collect()
}

/// `pod` as runtime-proxy's PreRunPodSandbox hook request carries it: metadata, labels,
/// annotations, cgroup parent (no resources: kubelet sends pod resources only with the
/// pod-level resources feature).
pub fn hook_pod(pod: &nri::PodSandbox) -> hook::PodSandboxHookRequest {
    hook::PodSandboxHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
        }),
        runtime_handler: "runc".into(),
        labels: text_map(&pod.labels),
        annotations: text_map(&pod.annotations),
        cgroup_parent: pod.linux.as_ref().map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// `container` of `pod` as runtime-proxy's PreCreateContainer hook request carries it: the pod's
/// fields, the container's name, ID, annotations and the resources kubelet gave it (CPU shares,
/// CFS quota and period in microseconds, memory limit in bytes).
pub fn hook_container(container: &nri::Container, pod: &nri::PodSandbox) -> hook::ContainerResourceHookRequest {
    let pod_request = hook_pod(pod);
    let r = container.linux.as_ref().and_then(|l| l.resources.as_ref());
    let cpu = r.and_then(|r| r.cpu.as_ref());
    let resources = hook::LinuxContainerResources {
        cpu_shares: cpu.and_then(|c| c.shares.as_ref()).map_or(0, |v| v.value as i64),
        cpu_quota: cpu.and_then(|c| c.quota.as_ref()).map_or(0, |v| v.value),
        cpu_period: cpu.and_then(|c| c.period.as_ref()).map_or(0, |v| v.value as i64),
        memory_limit_in_bytes: r.and_then(|r| r.memory.as_ref()?.limit.as_ref()).map_or(0, |v| v.value),
        ..Default::default()
    };
    hook::ContainerResourceHookRequest {
        pod_meta: pod_request.pod_meta,
        container_meta: Some(hook::ContainerMetadata {
            name: container.name.clone(),
            attempt: 0,
            id: container.id.clone(),
        }),
        container_annotations: text_map(&container.annotations),
        container_resources: Some(resources),
        pod_annotations: pod_request.annotations,
        pod_labels: pod_request.labels,
        pod_cgroup_parent: pod_request.cgroup_parent,
        ..Default::default()
    }
}

/// `pods` pods (0 to `pods - 1`) with `per_pod` containers each, as an NRI runtime describes
/// them.
pub fn nri_node(pods: usize, per_pod: usize) -> (Vec<nri::PodSandbox>, Vec<nri::Container>) {
    let pods: Vec<_> = (0..pods).map(|i| nri_pod(i, per_pod)).collect();
    let containers =
        pods.iter().enumerate().flat_map(|(i, p)| (0..per_pod).map(move |c| nri_container(i, c, p))).collect();
    (pods, containers)
}

/// `containers` with `updates` applied over their resources, as the runtime reports them once it
/// applied them ([`nri_plugin::applied::applied`]).
pub fn updated(containers: &mut [nri::Container], updates: &[nri::ContainerUpdate]) {
    let by_id: std::collections::HashMap<&str, &nri::LinuxResources> =
        updates.iter().filter_map(|u| Some((u.container_id.as_str(), u.linux.as_ref()?.resources.as_ref()?))).collect();
    for c in containers {
        if let Some(sent) = by_id.get(c.id.as_str()) {
            let linux = c.linux.get_or_insert_with(Default::default);
            linux.resources = Some(nri_plugin::applied::applied(linux.resources.as_ref(), sent));
        }
    }
}

/// The pod cgroup directories of `pods` in a v1 tree at `root` (`cpu`, `cpuacct`, `memory`,
/// `cpuset` controllers), with kubelet's `cpu.shares`, CFS quota and period and no memory limit;
/// the QoS directories above them too.
///
/// Errors: a directory or file cannot be made.
pub fn cgroup_v1_tree(root: &Path, pods: &[nri::PodSandbox]) -> std::io::Result<()> {
    for controller in ["cpu", "cpuacct", "memory", "cpuset"] {
        for pod in pods {
            let parent = pod.linux.as_ref().map(|l| l.cgroup_parent.trim_start_matches('/')).unwrap_or_default();
            let dir = root.join(controller).join(parent);
            std::fs::create_dir_all(&dir)?;
            let files: &[(&str, &str)] = match controller {
                "cpu" if parent.contains("besteffort") => {
                    &[("cpu.shares", "2"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")]
                }
                "cpu" => &[("cpu.shares", "1024"), ("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")],
                "memory" => &[("memory.limit_in_bytes", "9223372036854771712")],
                _ => &[],
            };
            for (file, value) in files {
                std::fs::write(dir.join(file), value)?;
            }
        }
    }
    Ok(())
}

/// The whole v1 tree of a node for the standalone reconciler at `root`: [`cgroup_v1_tree`]'s pod
/// directories, plus each pod's sandbox (pause) container directory (`<parent>/<sandbox id>`, as
/// [`crate::cri_node`] reports it) and each container's (its `cgroups_path`) in every controller,
/// holding what runc gave them (the container's `cpu.shares`, CFS quota and period, memory
/// limit); `cpuset.cpus` `0-15` at the root and in every directory below it; `cpu.bvt_warp_ns`
/// (group identity, Anolis kernels) `0` in every pod and container directory.
///
/// Errors: a directory or file cannot be made.
pub fn cgroup_v1_node(root: &Path, pods: &[nri::PodSandbox], containers: &[nri::Container]) -> std::io::Result<()> {
    cgroup_v1_tree(root, pods)?;
    let cpus = "0-15";
    std::fs::write(root.join("cpuset/cpuset.cpus"), cpus)?;
    for qos in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
        std::fs::write(root.join("cpuset").join(qos).join("cpuset.cpus"), cpus)?;
    }
    for pod in pods {
        let parent = pod.linux.as_ref().map(|l| l.cgroup_parent.trim_start_matches('/')).unwrap_or_default();
        std::fs::write(root.join("cpu").join(parent).join("cpu.bvt_warp_ns"), "0")?;
        std::fs::write(root.join("cpuset").join(parent).join("cpuset.cpus"), cpus)?;
    }
    let sandboxes = pods.iter().map(|p| (crate::cri_node::sandbox_cgroup(p), (2, -1, -1)));
    let containers = containers.iter().map(|c| {
        let linux = c.linux.as_ref();
        let res = linux.and_then(|l| l.resources.as_ref());
        let cpu = res.and_then(|r| r.cpu.as_ref());
        let shares = cpu.and_then(|c| c.shares.as_ref()).map_or(2, |s| s.value as i64);
        let quota = cpu.and_then(|c| c.quota.as_ref()).map_or(-1, |q| q.value);
        let limit = res.and_then(|r| r.memory.as_ref()?.limit.as_ref()).map_or(-1, |l| l.value);
        (linux.map(|l| l.cgroups_path.clone()).unwrap_or_default(), (shares, quota, limit))
    });
    for (path, (shares, quota, limit)) in sandboxes.chain(containers) {
        let rel = path.trim_start_matches('/');
        let limit = if limit < 0 { "9223372036854771712".to_owned() } else { limit.to_string() };
        let files: [(&str, &str, String); 7] = [
            ("cpu", "cpu.shares", shares.to_string()),
            ("cpu", "cpu.cfs_quota_us", quota.to_string()),
            ("cpu", "cpu.cfs_period_us", "100000".into()),
            ("cpu", "cpu.bvt_warp_ns", "0".into()),
            ("memory", "memory.limit_in_bytes", limit),
            ("cpuset", "cpuset.cpus", cpus.into()),
            ("cpuacct", "cpuacct.usage", "0".into()),
        ];
        for (controller, file, value) in files {
            let dir = root.join(controller).join(rel);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join(file), value)?;
        }
    }
    Ok(())
}
