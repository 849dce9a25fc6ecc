//! Helpers shared by the fuzz targets (`fuzz_targets/`), and the seed corpus writer.
//!
//! Targets that read two blobs (a request and an answer, a JSON body and a name) take them in one
//! simple frame, so seeds are easy to write: `[selector byte][u16 LE length n][n bytes][rest]`.

use k8s_cri::v1 as cri;

/// Splits `[selector][u16 LE n][n bytes][rest]`; `None` when shorter than the frame says.
pub fn split2(data: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&sel, rest) = data.split_first()?;
    let n = u16::from_le_bytes([*rest.first()?, *rest.get(1)?]) as usize;
    let rest = &rest[2..];
    (rest.len() >= n).then(|| (sel, &rest[..n], &rest[n..]))
}

/// The inverse of [`split2`].
pub fn join2(sel: u8, a: &[u8], b: &[u8]) -> Vec<u8> {
    let n = u16::try_from(a.len()).expect("first part under 64 KiB");
    let mut out = vec![sel];
    out.extend_from_slice(&n.to_le_bytes());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// An absent message and a default one are the same after a wire edit (an edit creates the
/// parents of the field it sets): maps every empty parent on the edited paths to `None`.
pub fn normalize_create(mut r: cri::CreateContainerRequest) -> cri::CreateContainerRequest {
    if let Some(c) = r.config.as_mut() {
        if c.metadata == Some(Default::default()) {
            c.metadata = None;
        }
        if let Some(l) = c.linux.as_mut() {
            if l.resources == Some(Default::default()) {
                l.resources = None;
            }
        }
        if c.linux == Some(Default::default()) {
            c.linux = None;
        }
    }
    if r.config == Some(Default::default()) {
        r.config = None;
    }
    if let Some(s) = r.sandbox_config.as_mut() {
        if s.linux == Some(Default::default()) {
            s.linux = None;
        }
    }
    if r.sandbox_config == Some(Default::default()) {
        r.sandbox_config = None;
    }
    r
}

/// Same as [`normalize_create`] for a RunPodSandbox request.
pub fn normalize_run(mut r: cri::RunPodSandboxRequest) -> cri::RunPodSandboxRequest {
    if let Some(c) = r.config.as_mut() {
        if c.linux == Some(Default::default()) {
            c.linux = None;
        }
    }
    if r.config == Some(Default::default()) {
        r.config = None;
    }
    r
}

/// Applies `edits` to a request three ways and returns the two results that must decode to the
/// edited request:
///
/// * `msg`, the bytes as they came (result not checked, only that nothing panics): prost is more
///   lenient than the wire format, so its reading of a malformed message can differ from the wire
///   editor's. It skips deprecated groups (wire types 3/4) and reads a map field's record as
///   length-delimited whatever its wire type: `0x31 0x00` in a PodSandboxConfig is
///   `labels {"": ""}` to prost and a truncated fixed64 to the wire editor (the proxy answers such
///   a request INTERNAL), and `0x30 0x21 0x0a …` is a 33-byte label entry to prost but a varint
///   and then a metadata record to the editor (and to containerd's Go decoder, which then rejects
///   the request).
/// * `canonical`, prost's encoding of the decoded request: valid by construction, must edit.
/// * the same, made non-canonical the ways a newer or another client's encoder may write it
///   ([`noncanonical`]: unknown fields, embedded messages split over several records).
pub fn edit_checked(
    msg: &[u8],
    canonical: &[u8],
    message_fields: &[u32],
    edits: &[(u32, runtime_proxy::cri::proto_edit::Edit)],
) -> [Vec<u8>; 2] {
    let _ = runtime_proxy::cri::proto_edit::apply(msg, edits);
    let variant = noncanonical(canonical, message_fields, msg);
    [canonical, &variant[..]].map(|m| {
        runtime_proxy::cri::proto_edit::apply(m, edits)
            .unwrap_or_else(|e| panic!("a valid encoding could not be edited: {e}"))
    })
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The records of a valid encoding: (field, wire type, whole record, payload).
fn records(buf: &[u8]) -> Vec<(u32, u8, &[u8], &[u8])> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let start = pos;
        let key = varint(buf, &mut pos).expect("valid encoding");
        let body = pos;
        match key & 7 {
            0 => drop(varint(buf, &mut pos)),
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let len = varint(buf, &mut pos).expect("valid encoding") as usize;
                let b = pos;
                pos += len;
                out.push(((key >> 3) as u32, 2, &buf[start..pos], &buf[b..pos]));
                continue;
            }
            _ => unreachable!("prost writes no groups"),
        }
        out.push(((key >> 3) as u32, (key & 7) as u8, &buf[start..pos], &buf[body..pos]));
    }
    out
}

/// A valid, non-canonical encoding of the same message as `canonical` (a prost encoding), steered
/// by the bytes of `noise`: unknown fields (numbers 900–949, varint or length-delimited) between
/// records and inside embedded messages, and records of the embedded message fields
/// `message_fields` split in two at a record boundary (a reader merges them back).
pub fn noncanonical(canonical: &[u8], message_fields: &[u32], noise: &[u8]) -> Vec<u8> {
    let mut n = noise.iter().copied().chain(std::iter::repeat(0));
    let unknown = |out: &mut Vec<u8>, b: u8| {
        let field = 900 + u64::from(b % 50);
        if b & 1 == 0 {
            put_varint(field << 3, out);
            put_varint(u64::from(b), out);
        } else {
            put_varint(field << 3 | 2, out);
            out.extend_from_slice(&[2, b, b]);
        }
    };
    let mut out = Vec::with_capacity(canonical.len() * 2);
    for (field, wire_type, all, payload) in records(canonical) {
        let b = n.next().unwrap_or(0);
        if b & 0x80 != 0 {
            unknown(&mut out, b);
        }
        if wire_type == 2 && message_fields.contains(&field) && b & 0x40 != 0 {
            let inner = records(payload);
            let at = usize::from(n.next().unwrap_or(0)) % (inner.len() + 1);
            let mut first: Vec<u8> = inner[..at].iter().flat_map(|r| r.2.iter().copied()).collect();
            unknown(&mut first, b);
            let second: Vec<u8> = inner[at..].iter().flat_map(|r| r.2.iter().copied()).collect();
            for part in [first, second] {
                put_varint(u64::from(field) << 3 | 2, &mut out);
                put_varint(part.len() as u64, &mut out);
                out.extend_from_slice(&part);
            }
        } else {
            out.extend_from_slice(all);
        }
    }
    if let Some(b) = n.next().filter(|b| b & 0x20 != 0) {
        unknown(&mut out, b);
    }
    out
}

/// The seed corpus (`fuzz/corpus/<target>/seed-*`): small valid inputs of each target, written by
/// `FUZZ_WRITE_SEEDS=1 cargo test --lib` in `fuzz/` (the files are committed; this only makes them
/// again after a format change).
#[cfg(test)]
mod seeds {
    use super::*;
    use hook_api::v1alpha1 as hook;
    use prost::Message;
    use std::io::Write;

    fn map<M: FromIterator<(String, String)>>(pairs: &[(&str, &str)]) -> M {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A pod sandbox config as kubelet sends it for a BestEffort pod.
    fn sandbox_config() -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "4c1d-9a".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: "web".into(),
            log_directory: "/var/log/pods/default_web_4c1d-9a".into(),
            labels: map(&[("app", "web"), ("io.kubernetes.pod.name", "web")]),
            annotations: map(&[("kubernetes.io/config.source", "api"), ("node.koordinator.sh/batch-cpu", "500")]),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods/besteffort/pod4c1d-9a".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A CreateContainerRequest as kubelet sends it, plus a field newer than our proto (99).
    fn create_request() -> Vec<u8> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: "8f3e0c".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "main".into(), attempt: 0 }),
                image: Some(cri::ImageSpec { image: "docker.io/library/busybox:1.36".into(), ..Default::default() }),
                command: vec!["sleep".into(), "3600".into()],
                envs: vec![
                    cri::KeyValue { key: "PATH".into(), value: "/bin".into() },
                    cri::KeyValue { key: "A".into(), value: "1".into() },
                ],
                labels: map(&[("io.kubernetes.container.name", "main")]),
                annotations: map(&[("io.kubernetes.container.hash", "1a2b")]),
                log_path: "main/0.log".into(),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources {
                        cpu_period: 100_000,
                        cpu_quota: -1,
                        cpu_shares: 2,
                        memory_limit_in_bytes: 0,
                        oom_score_adj: 1000,
                        cpuset_cpus: "0-1".into(),
                        hugepage_limits: vec![cri::HugepageLimit { page_size: "2MB".into(), limit: 0 }],
                        unified: map(&[("memory.oom.group", "1")]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config()),
        };
        let mut bytes = req.encode_to_vec();
        bytes.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']);
        bytes
    }

    fn run_request() -> Vec<u8> {
        cri::RunPodSandboxRequest { config: Some(sandbox_config()), runtime_handler: "runc".into() }.encode_to_vec()
    }

    /// koordlet's answer: the request echoed with its changes (batch resources, cpuset cleared).
    fn container_answer() -> hook::ContainerResourceHookResponse {
        hook::ContainerResourceHookResponse {
            container_annotations: map(&[("io.kubernetes.container.hash", "1a2b"), ("hooked", "yes")]),
            container_resources: Some(hook::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: 50_000,
                cpu_shares: 512,
                memory_limit_in_bytes: 128 << 20,
                oom_score_adj: 1000,
                cpuset_cpus: String::new(),
                unified: map(&[("memory.oom.group", "1"), ("memory.high", "100000000")]),
                ..Default::default()
            }),
            pod_cgroup_parent: "/kubepods/besteffort/pod4c1d-9a".into(),
            container_envs: map(&[("PATH", "/bin"), ("A", "2"), ("HOOKED", "1")]),
        }
    }

    fn pod_answer() -> hook::PodSandboxHookResponse {
        hook::PodSandboxHookResponse {
            labels: map(&[("app", "web"), ("hooked", "yes")]),
            annotations: map(&[("node.koordinator.sh/batch-cpu", "500")]),
            cgroup_parent: "/kubepods-besteffort.slice".into(),
            resources: None,
        }
    }

    fn frame(enc: u8, flag: u8, message: &[u8]) -> Vec<u8> {
        let data = match flag {
            0 => message.to_vec(),
            _ => compressed(message, if enc == 1 { "gzip" } else { "deflate" }),
        };
        let mut out = vec![enc, 255, flag];
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(&data);
        out
    }

    /// `m` compressed the way the proxy compresses (`grpc::reframe`), without the 5-byte prefix.
    fn compressed(m: &[u8], encoding: &'static str) -> Vec<u8> {
        let body = bytes::Bytes::from_static(&[1, 0, 0, 0, 0]);
        runtime_proxy::grpc::reframe(m, &body, Some(&http::HeaderValue::from_static(encoding)))[5..].to_vec()
    }

    fn docker(name: &str, body: serde_json::Value, answer: &[u8]) -> Vec<u8> {
        let body = body.to_string();
        join2(0, name.as_bytes(), &join2(0, body.as_bytes(), answer)[1..])
    }

    #[test]
    fn write_seeds() {
        if std::env::var_os("FUZZ_WRITE_SEEDS").is_none() {
            return;
        }
        let create = create_request();
        let container_req = hook::ContainerResourceHookRequest {
            pod_meta: Some(hook::PodSandboxMetadata {
                name: "web".into(),
                namespace: "default".into(),
                uid: "4c1d-9a".into(),
                attempt: 0,
            }),
            container_meta: Some(hook::ContainerMetadata { name: "main".into(), attempt: 0, id: String::new() }),
            container_annotations: map(&[("io.kubernetes.container.hash", "1a2b")]),
            container_resources: Some(hook::LinuxContainerResources {
                cpu_shares: 2,
                cpu_quota: -1,
                cpu_period: 100_000,
                ..Default::default()
            }),
            pod_labels: map(&[("app", "web")]),
            pod_cgroup_parent: "/kubepods/besteffort/pod4c1d-9a".into(),
            container_envs: map(&[("PATH", "/bin")]),
            ..Default::default()
        };
        let pod_req = hook::PodSandboxHookRequest {
            pod_meta: container_req.pod_meta.clone(),
            runtime_handler: "runc".into(),
            labels: map(&[("app", "web")]),
            cgroup_parent: "/kubepods/besteffort/pod4c1d-9a".into(),
            ..Default::default()
        };
        let sandbox_body = serde_json::json!({
            "Image": "registry.k8s.io/pause:3.9",
            "Labels": {"io.kubernetes.docker.type": "podsandbox", "app": "web", "annotation.kubernetes.io/config.source": "api"},
            "HostConfig": {"CgroupParent": "/kubepods/besteffort/pod4c1d-9a", "CpuShares": 2, "Memory": 0, "MemorySwap": 0}
        });
        let container_body = serde_json::json!({
            "Image": "busybox:1.36", "Cmd": ["sleep", "3600"], "Env": ["PATH=/bin", "A=1"],
            "Labels": {"io.kubernetes.docker.type": "container", "io.kubernetes.sandbox.id": "8f3e0c", "annotation.io.kubernetes.container.hash": "1a2b"},
            "HostConfig": {"CgroupParent": "/kubepods/besteffort/pod4c1d-9a", "CpuShares": 2, "CpuQuota": -1, "CpuPeriod": 100000, "Memory": 67108864, "MemorySwap": 67108864, "OomScoreAdj": 1000, "CpusetCpus": "0-1"}
        });
        let rules_yaml = "groupIdentity:\n  enable: true\n  lsr: 2\n  ls: 2\n  be: -1\n  none: 0\ncpu:\n  cfsPeriodUs: 100000\nbatchResource:\n  enable: true\n  cfsQuota: true\ncpuset:\n  enable: true\n  unsetCfsQuota: true\n";
        let seeds: Vec<(&str, &str, Vec<u8>)> = vec![
            ("wire_edit", "create-container", join2(0, &create, b"")),
            ("wire_edit", "create-container-edits", join2(0, &create, b"\x01\x02\x03\x01\x0a\x01\x01\x01abc\x01\x05\x01\x01\x01\x00\x00\x01\x00\x01\x07")),
            ("wire_edit", "run-pod-sandbox", join2(0, &run_request(), b"")),
            ("hook_answer", "create-container", join2(0, &create, &container_answer().encode_to_vec())),
            ("hook_answer", "run-pod-sandbox", join2(1, &run_request(), &pod_answer().encode_to_vec())),
            ("hook_merge", "container", join2(0, &container_req.encode_to_vec(), &container_answer().encode_to_vec())),
            ("hook_merge", "pod", join2(1, &pod_req.encode_to_vec(), &pod_answer().encode_to_vec())),
            ("registry_parse", "koordlet", br#"{"remote-endpoint":"/var/run/koordlet/koordlet.sock","failure-policy":"Ignore","runtime-hooks":["PreRunPodSandbox","PreCreateContainer","PreStartContainer","PreUpdateContainerResources","PreRemoveRunPodSandbox"]}"#.to_vec()),
            ("registry_parse", "ours", br#"{"remote-endpoint":"unix:///run/hook.sock","failure-policy":"Fail","runtime-hooks":["PreCreateContainer","PostStopContainer"],"timeout-ms":500,"order":-1}"#.to_vec()),
            ("grpc_timeout", "hours", b"1H".to_vec()),
            ("grpc_timeout", "millis", b"250m".to_vec()),
            ("grpc_timeout", "max", b"99999999u".to_vec()),
            ("grpc_unary_message", "plain", frame(0, 0, &create)),
            ("grpc_unary_message", "gzip", frame(1, 1, &create)),
            ("grpc_unary_message", "deflate", frame(2, 1, &create)),
            ("rules_parse", "defaults-yaml", [b"\x00", rules_yaml.as_bytes()].concat()),
            ("rules_parse", "json", br#"{"groupIdentity":{"be":0},"cpu":{"cfsPeriodUs":50000},"cpuset":{"enable":false}}"#.iter().fold(vec![1u8], |mut v, b| { v.push(*b); v })),
            ("quantity_parse", "milli", b"500m".to_vec()),
            ("quantity_parse", "binary", b"128Mi".to_vec()),
            ("quantity_parse", "decimal", b"1.5".to_vec()),
            ("quantity_parse", "exponent", b"-1e3".to_vec()),
            ("quantity_parse", "json-number", b"2.25".to_vec()),
            ("cgroup_path", "cgroupfs", b"\x00/kubepods/besteffort/pod4c1d-9a\x008f3e0c".to_vec()),
            ("cgroup_path", "slice", b"\x01kubepods-besteffort-pod4c1d_9a.slice\x008f3e0c".to_vec()),
            ("cgroup_path", "systemd-path", b"\x00kubepods-besteffort-pod4c1d_9a.slice:cri-containerd:8f3e0c".to_vec()),
            ("cpu_list", "ranges", b"0-3,6,8-11".to_vec()),
            ("cpu_list", "single", b"0".to_vec()),
            ("docker_model", "sandbox", docker("k8s_POD_web_default_4c1d-9a_0", sandbox_body, &pod_answer().encode_to_vec())),
            ("docker_model", "container", docker("/k8s_main_web_default_4c1d-9a_1", container_body, &container_answer().encode_to_vec())),
            ("docker_route", "create", b"\x00/v1.41/containers/create?name=k8s_POD_web_default_4c1d-9a_0".to_vec()),
            ("docker_route", "start", b"\x00/v1.41/containers/8f3e0c/start".to_vec()),
            ("docker_route", "delete", b"\x01/containers/k8s_main_web_default_4c1d-9a_1?force=1&v=1".to_vec()),
        ];
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        for (target, name, data) in seeds {
            let dir = root.join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::File::create(dir.join(format!("seed-{name}"))).unwrap().write_all(&data).unwrap();
        }
    }
}
