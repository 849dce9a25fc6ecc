//! What the interceptor reads of a CreateContainer request: a view of
//! `runtime.v1.CreateContainerRequest` (and of the same v1alpha2 message, whose layout is the
//! same) with only the fields a hook request is built from or edited in, by their CRI field
//! numbers (`api.proto`). prost skips every other field without allocating: kubelet's image,
//! command, mounts, labels and security context were half of its decoding (callgrind), and the
//! request goes on as its original bytes (or edited on the wire, [`crate::wire`]), so nothing
//! skipped is lost. The messages inside come from `k8s-cri`.

use std::collections::HashMap;

use bytes::Bytes;
use k8s_cri::v1 as cri;
use prost::Message;

/// `CreateContainerRequest`: fields 1–3.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    /// `pod_sandbox_id` (1).
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// `config` (2), in part.
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    /// `sandbox_config` (3), undecoded, every occurrence (protobuf merges a message field that
    /// occurs more than once): read only for a pod sandbox the store does not know
    /// ([`CreateContainerRequest::sandbox_config`]).
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub sandbox_config: Vec<Bytes>,
}

/// `ContainerConfig`: `metadata` (1), `envs` (6), `annotations` (10), `linux` (15).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    /// `metadata` (1): the container's name and attempt.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<cri::ContainerMetadata>,
    /// `envs` (6), in order.
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<cri::KeyValue>,
    /// `annotations` (10).
    #[prost(map = "string, string", tag = "10")]
    pub annotations: HashMap<String, String>,
    /// `linux` (15), in part.
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

/// `LinuxContainerConfig`: `resources` (1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    /// `resources` (1): CFS period and quota in microseconds, CPU shares, bytes.
    #[prost(message, optional, tag = "1")]
    pub resources: Option<cri::LinuxContainerResources>,
}

impl CreateContainerRequest {
    /// The request's `sandbox_config`, decoded (its occurrences merged in order); `None` when
    /// absent or when it does not decode.
    pub fn sandbox_config(&self) -> Option<cri::PodSandboxConfig> {
        if self.sandbox_config.is_empty() {
            return None;
        }
        let mut config = cri::PodSandboxConfig::default();
        for part in &self.sandbox_config {
            config.merge(part.clone()).ok()?;
        }
        Some(config)
    }
}

/// The view of a whole request (for tests and the fuzz targets, which start from `k8s-cri`
/// messages).
impl From<&cri::CreateContainerRequest> for CreateContainerRequest {
    fn from(req: &cri::CreateContainerRequest) -> Self {
        let config = req.config.as_ref().map(|c| ContainerConfig {
            metadata: c.metadata.clone(),
            envs: c.envs.clone(),
            annotations: c.annotations.clone(),
            linux: c.linux.as_ref().map(|l| LinuxContainerConfig { resources: l.resources.clone() }),
        });
        CreateContainerRequest {
            pod_sandbox_id: req.pod_sandbox_id.clone(),
            config,
            sandbox_config: req.sandbox_config.iter().map(|s| Bytes::from(s.encode_to_vec())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding the view of a full request gives what the view of the decoded request holds:
    /// the field numbers are CRI's, and skipped fields do not disturb the others.
    #[test]
    fn the_view_reads_the_cri_fields() {
        let full = cri::CreateContainerRequest {
            pod_sandbox_id: "sb".into(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata { name: "c".into(), attempt: 2 }),
                image: Some(cri::ImageSpec { image: "busybox".into(), ..Default::default() }),
                command: vec!["sleep".into()],
                envs: vec![cri::KeyValue { key: "B".into(), value: "2".into() }, cri::KeyValue { key: "A".into(), value: "1".into() }],
                mounts: vec![cri::Mount { container_path: "/x".into(), ..Default::default() }],
                labels: [("l".to_string(), "1".to_string())].into(),
                annotations: [("a".to_string(), "1".to_string())].into(),
                log_path: "c.log".into(),
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(cri::LinuxContainerResources { cpu_shares: 512, cpuset_cpus: "0-1".into(), ..Default::default() }),
                    security_context: Some(cri::LinuxContainerSecurityContext {
                        masked_paths: vec!["/proc/kcore".into()],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            sandbox_config: Some(cri::PodSandboxConfig { hostname: "h".into(), ..Default::default() }),
        };
        let view = CreateContainerRequest::decode(full.encode_to_vec().as_slice()).unwrap();
        assert_eq!(view, CreateContainerRequest::from(&full));
        let config = view.config.as_ref().unwrap();
        assert_eq!(config.metadata.as_ref().unwrap().name, "c");
        assert_eq!(config.envs[0].key, "B", "envs keep their order");
        assert_eq!(config.annotations["a"], "1");
        assert_eq!(config.linux.as_ref().unwrap().resources.as_ref().unwrap().cpu_shares, 512);
        assert_eq!(view.sandbox_config().unwrap().hostname, "h");
        // Field 3 twice: merged, as protobuf does (and containerd with it).
        let mut twice = full.encode_to_vec();
        twice.extend(
            cri::CreateContainerRequest {
                sandbox_config: Some(cri::PodSandboxConfig { log_directory: "/l".into(), ..Default::default() }),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let merged = CreateContainerRequest::decode(twice.as_slice()).unwrap().sandbox_config().unwrap();
        assert_eq!((merged.hostname.as_str(), merged.log_directory.as_str()), ("h", "/l"));
        let broken = CreateContainerRequest { sandbox_config: vec![Bytes::from_static(&[0xff])], ..view };
        assert_eq!(broken.sandbox_config(), None, "a sandbox_config that does not decode is none");
    }
}
