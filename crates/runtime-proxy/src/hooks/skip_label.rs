//! The skip label: a pod labelled `--runtime-hook-server-key=--runtime-hook-server-val`
//! (koord's `runtimeproxy.koordinator.sh/skip-hookserver=true`) skips every hook server, whatever
//! their failure policies, so that a hook server's own pod (koordlet's DaemonSet) never waits for
//! itself (`pkg/runtimeproxy/server/cri/criserver.go`, Koordinator v1.8.0).
//!
//! koord-runtime-proxy honours the label on any pod, so any pod author could leave the node's
//! policy (a BE pod escaping its batch limits) by adding one label. Here it is honoured only for
//! pods in the namespaces of `--runtime-hook-server-namespaces` (default
//! [`DEFAULT_NAMESPACES`]: where koordlet and runtime-hooks run); elsewhere the label is
//! ignored — the hooks are called — with a WARN naming the pod and its namespace, counted in
//! `runtime_proxy_skip_label_ignored_total`. deploy/'s admission policy refuses such pods in the
//! cluster before they reach a node.

use std::collections::BTreeMap;

use hook_api::v1alpha1::PodSandboxMetadata;

use crate::metrics::Metrics;

/// The namespaces whose pods may skip the hooks by default (`--runtime-hook-server-namespaces`).
pub const DEFAULT_NAMESPACES: &str = "koordinator-system,kube-system,runtime-hooks";

/// The skip label and where it is honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkipLabel {
    /// The label's key (`--runtime-hook-server-key`).
    pub key: String,
    /// The label's value (`--runtime-hook-server-val`).
    pub value: String,
    /// The namespaces whose pods may use it (`--runtime-hook-server-namespaces`); empty: none.
    pub namespaces: Vec<String>,
}

impl SkipLabel {
    /// Whether a pod with `labels` and metadata `pod` skips every hook: it carries the label and
    /// its namespace may use it. A pod that carries the label in another namespace does not
    /// skip: that is logged (WARN, naming the pod, its namespace and `call`) and counted in
    /// `metrics`.
    pub fn skips(
        &self,
        labels: &BTreeMap<String, String>,
        pod: Option<&PodSandboxMetadata>,
        call: &str,
        metrics: &Metrics,
    ) -> bool {
        if labels.get(&self.key) != Some(&self.value) {
            return false;
        }
        let (name, namespace) = pod.map_or(("", ""), |m| (m.name.as_str(), m.namespace.as_str()));
        if self.namespaces.iter().any(|n| n == namespace) {
            return true;
        }
        metrics.skip_label_ignored();
        tracing::warn!(
            pod = name,
            namespace,
            call,
            label = %format_args!("{}={}", self.key, self.value),
            "skip label ignored: the pod's namespace is not in --runtime-hook-server-namespaces; hooks are called"
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(namespace: &str) -> PodSandboxMetadata {
        PodSandboxMetadata { name: "p".into(), namespace: namespace.into(), ..Default::default() }
    }

    #[test]
    fn honoured_only_in_the_allowed_namespaces() {
        let skip = SkipLabel {
            key: "k".into(),
            value: "true".into(),
            namespaces: vec!["koordinator-system".into(), "kube-system".into()],
        };
        let metrics = Metrics::new();
        let labelled: BTreeMap<String, String> = [("k".to_string(), "true".to_string())].into();
        assert!(skip.skips(&labelled, Some(&meta("koordinator-system")), "RunPodSandbox", &metrics));
        assert!(skip.skips(&labelled, Some(&meta("kube-system")), "RunPodSandbox", &metrics));
        assert!(!skip.skips(&labelled, Some(&meta("default")), "RunPodSandbox", &metrics));
        assert!(!skip.skips(&labelled, None, "RunPodSandbox", &metrics), "no metadata: no namespace may use it");
        let other: BTreeMap<String, String> = [("k".to_string(), "false".to_string())].into();
        assert!(!skip.skips(&other, Some(&meta("kube-system")), "RunPodSandbox", &metrics));
        let none = SkipLabel { namespaces: Vec::new(), ..skip };
        assert!(!none.skips(&labelled, Some(&meta("kube-system")), "RunPodSandbox", &metrics));
        let text = metrics.render_for_tests();
        assert!(text.contains("runtime_proxy_skip_label_ignored_total 3"), "{text}");
    }
}
