//! What a plugin sees: typed pod and container contexts.
//!
//! # Sources
//!
//! The same types are built from a hook request (proxy mode: [`PodContext::from_pod_request`],
//! [`ContainerContext::from_request`]) and from the CRI runtime's view of a running pod
//! (standalone mode: the reconciler fills the fields itself), so a plugin has one code path for
//! both modes.
//!
//! # Classifications
//!
//! Two classifications are derived once, as koordlet derives them (koordinator
//! `apis/extension/qos.go` `GetQoSClassByAttrs`, `pkg/koordlet/util` `GetKubeQoSByCgroupParent`):
//!
//! * [`QosClass`], Koordinator's class, from the pod **label** `koordinator.sh/qosClass` only
//!   (`LSE`, `LSR`, `LS`, `BE`, `SYSTEM`), as koordinator's `GetQoSClassByAttrs` reads it. An
//!   annotation of the same key is ignored: a pod author writes annotations freely, and one
//!   saying `LSR` must not buy the pod bound CPUs and no CFS quota. Anything else (no label, an
//!   unknown value) is [`QosClass::None`].
//! * [`KubeQos`], Kubernetes' class, from the pod cgroup parent by substring: `besteffort` →
//!   BestEffort, `burstable` → Burstable, anything else → Guaranteed (kubelet puts Guaranteed pods
//!   directly under `kubepods`).

use std::collections::BTreeMap;
use std::fmt;

use hook_api::v1alpha1::{
    ContainerResourceHookRequest, LinuxContainerResources, PodSandboxHookRequest, PodSandboxMetadata,
};

/// Pod label holding the Koordinator QoS class (never read from an annotation).
pub const QOS_CLASS_KEY: &str = "koordinator.sh/qosClass";

/// Koordinator's QoS class of a pod (`koordinator.sh/qosClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QosClass {
    /// `LSE`: latency-sensitive exclusive (exclusive CPUs, no sharing even with BE).
    Lse,
    /// `LSR`: latency-sensitive reserved (bound CPUs).
    Lsr,
    /// `LS`: latency-sensitive, shared CPUs.
    Ls,
    /// `BE`: best effort, runs on batch resources.
    Be,
    /// `SYSTEM`: node system components.
    System,
    /// No (or an unknown) class.
    None,
}

impl QosClass {
    /// The class named by a label value; unknown values (and case variants) are [`QosClass::None`],
    /// as in koordinator's `GetPodQoSClassByName`.
    pub fn from_name(name: &str) -> QosClass {
        match name {
            "LSE" => QosClass::Lse,
            "LSR" => QosClass::Lsr,
            "LS" => QosClass::Ls,
            "BE" => QosClass::Be,
            "SYSTEM" => QosClass::System,
            _ => QosClass::None,
        }
    }

    /// The class of a pod with these labels: the label `koordinator.sh/qosClass` (koordinator's
    /// `GetQoSClassByAttrs`); no label is [`QosClass::None`]. Annotations are not an input.
    pub fn of(labels: &BTreeMap<String, String>) -> QosClass {
        labels.get(QOS_CLASS_KEY).map(|v| QosClass::from_name(v)).unwrap_or(QosClass::None)
    }

    /// The label value (`"LSE"`, …; `""` for none).
    pub fn as_str(&self) -> &'static str {
        match self {
            QosClass::Lse => "LSE",
            QosClass::Lsr => "LSR",
            QosClass::Ls => "LS",
            QosClass::Be => "BE",
            QosClass::System => "SYSTEM",
            QosClass::None => "",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if *self == QosClass::None { "none" } else { self.as_str() })
    }
}

/// Kubernetes' QoS class of a pod, as koordlet derives it from the cgroup parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KubeQos {
    /// Every container has equal requests and limits (cgroup directly under `kubepods`).
    Guaranteed,
    /// `kubepods/burstable/…`.
    Burstable,
    /// `kubepods/besteffort/…`.
    BestEffort,
}

impl KubeQos {
    /// By substring of the pod cgroup parent: `besteffort`, `burstable`, else Guaranteed
    /// (koordlet's `GetKubeQoSByCgroupParent`).
    pub fn from_cgroup_parent(parent: &str) -> KubeQos {
        if parent.contains("besteffort") {
            KubeQos::BestEffort
        } else if parent.contains("burstable") {
            KubeQos::Burstable
        } else {
            KubeQos::Guaranteed
        }
    }
}

/// A pod, as plugins see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodContext {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod UID.
    pub uid: String,
    /// Pod labels (kubelet passes the pod's labels).
    pub labels: BTreeMap<String, String>,
    /// Pod annotations (kubelet passes the pod's annotations; Koordinator's scheduler and
    /// manager write their decisions here).
    pub annotations: BTreeMap<String, String>,
    /// The pod cgroup parent as kubelet passes it in `cgroup_parent` or the runtime reports it:
    /// cgroupfs `/kubepods/besteffort/pod<uid>`; systemd
    /// `/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice` or the bare
    /// slice name. Turned into a directory by [`crate::cgroup::CgroupFs::resolve`]. May be empty:
    /// the runtime's default cgroup (valid CRI), or a parent the proxy lost.
    pub cgroup_parent: String,
    /// The pod's resources (CPU shares, CFS quota in µs, memory limit in bytes) as its spec sets
    /// them, where the mode knows them: the reconciler with the API server's pod (koordlet's
    /// `PodContext.Request.Resources`, "currently only reconciler mode provides Resources");
    /// `None` in proxy and NRI modes.
    pub resources: Option<LinuxContainerResources>,
}

impl PodContext {
    /// From a PreRunPodSandbox / PostStopPodSandbox request (copied; [`PodContext::from`] moves).
    pub fn from_pod_request(req: &PodSandboxHookRequest) -> PodContext {
        PodContext::from(req.clone())
    }

    /// The pod part of a container request (copied).
    pub fn from_container_request(req: &ContainerResourceHookRequest) -> PodContext {
        let meta = req.pod_meta.clone().unwrap_or_default();
        PodContext::of_parts(meta, req.pod_labels.clone(), req.pod_annotations.clone(), req.pod_cgroup_parent.clone())
    }

    /// A pod of a request's parts (`resources`: `None`, as proxy and NRI modes have none).
    fn of_parts(
        meta: PodSandboxMetadata,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
        cgroup_parent: String,
    ) -> PodContext {
        PodContext {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            labels,
            annotations,
            cgroup_parent,
            resources: None,
        }
    }

    /// Koordinator's QoS class of the pod, from its label only ([`QosClass::of`]).
    pub fn qos(&self) -> QosClass {
        QosClass::of(&self.labels)
    }

    /// Kubernetes' QoS class, from the cgroup parent.
    pub fn kube_qos(&self) -> KubeQos {
        KubeQos::from_cgroup_parent(&self.cgroup_parent)
    }

    /// `namespace/name`, for logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A container, as plugins see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerContext {
    /// The container's pod.
    pub pod: PodContext,
    /// Kubernetes container name (the key of per-container annotations such as
    /// `node.koordinator.sh/extended-resource-spec`).
    pub name: String,
    /// Bare runtime container ID; empty at PreCreateContainer (not created yet).
    pub id: String,
    /// Container annotations.
    pub annotations: BTreeMap<String, String>,
    /// Container environment (proxy mode only; the reconciler cannot see or change it).
    pub envs: BTreeMap<String, String>,
    /// The container's resources as kubelet asked for them (proxy mode), or as the runtime
    /// reports them (standalone, when it does).
    pub resources: Option<LinuxContainerResources>,
}

impl ContainerContext {
    /// From a container-level hook request (copied; [`ContainerContext::from`] moves).
    pub fn from_request(req: &ContainerResourceHookRequest) -> ContainerContext {
        ContainerContext::from(req.clone())
    }

    /// `namespace/pod/container`, for logs.
    pub fn key(&self) -> String {
        format!("{}/{}", self.pod.key(), self.name)
    }
}

/// A pod request's pod, its maps and strings moved, not copied (the request's `resources`
/// dropped: see [`PodContext::resources`]).
impl From<PodSandboxHookRequest> for PodContext {
    fn from(req: PodSandboxHookRequest) -> PodContext {
        PodContext::of_parts(req.pod_meta.unwrap_or_default(), req.labels, req.annotations, req.cgroup_parent)
    }
}

/// A container request's container and pod, its maps and strings moved, not copied (the
/// request's `pod_resources` dropped: see [`PodContext::resources`]).
impl From<ContainerResourceHookRequest> for ContainerContext {
    fn from(req: ContainerResourceHookRequest) -> ContainerContext {
        let meta = req.container_meta.unwrap_or_default();
        ContainerContext {
            pod: PodContext::of_parts(
                req.pod_meta.unwrap_or_default(),
                req.pod_labels,
                req.pod_annotations,
                req.pod_cgroup_parent,
            ),
            name: meta.name,
            id: meta.id,
            annotations: req.container_annotations,
            envs: req.container_envs,
            resources: req.container_resources,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hook_api::v1alpha1::ContainerMetadata;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn qos_class_from_the_label_only() {
        assert_eq!(QosClass::of(&map(&[(QOS_CLASS_KEY, "BE")])), QosClass::Be);
        for (v, c) in
            [("LSE", QosClass::Lse), ("SYSTEM", QosClass::System), ("be", QosClass::None), ("", QosClass::None)]
        {
            assert_eq!(QosClass::from_name(v), c, "{v:?}");
        }
        assert_eq!(QosClass::of(&map(&[])), QosClass::None);
        // A pod author's annotation is not a class: no label, no class.
        let pod = PodContext { annotations: map(&[(QOS_CLASS_KEY, "LSR")]), ..Default::default() };
        assert_eq!(pod.qos(), QosClass::None);
        let pod = PodContext {
            labels: map(&[(QOS_CLASS_KEY, "LS")]),
            annotations: map(&[(QOS_CLASS_KEY, "LSE")]),
            ..Default::default()
        };
        assert_eq!(pod.qos(), QosClass::Ls);
    }

    #[test]
    fn kube_qos_from_cgroup_parent() {
        assert_eq!(KubeQos::from_cgroup_parent("/kubepods/besteffort/pod1"), KubeQos::BestEffort);
        assert_eq!(KubeQos::from_cgroup_parent("/kubepods.slice/kubepods-burstable.slice/x"), KubeQos::Burstable);
        assert_eq!(KubeQos::from_cgroup_parent("/kubepods/pod1"), KubeQos::Guaranteed);
        assert_eq!(KubeQos::from_cgroup_parent(""), KubeQos::Guaranteed);
    }

    #[test]
    fn contexts_from_requests() {
        let req = ContainerResourceHookRequest {
            pod_meta: Some(PodSandboxMetadata {
                name: "p".into(),
                namespace: "ns".into(),
                uid: "u".into(),
                attempt: 0,
            }),
            container_meta: Some(ContainerMetadata { name: "c".into(), attempt: 0, id: "abc".into() }),
            pod_labels: map(&[(QOS_CLASS_KEY, "BE")]),
            pod_cgroup_parent: "/kubepods/besteffort/podu".into(),
            ..Default::default()
        };
        let c = ContainerContext::from_request(&req);
        assert_eq!((c.name.as_str(), c.id.as_str(), c.key()), ("c", "abc", "ns/p/c".to_string()));
        assert_eq!(c.pod.qos(), QosClass::Be);
        assert_eq!(c.pod.kube_qos(), KubeQos::BestEffort);
        let pod = PodContext::from_pod_request(&PodSandboxHookRequest::default());
        assert_eq!(pod, PodContext::default(), "absent metadata is empty, not a panic");
    }
}
