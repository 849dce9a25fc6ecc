//! The resources the stand-in serves, and how a request path names one.
//!
//! A fixed table: what runtime-hooks reads (NodeSLO, NodeResourceTopology, Node, Pod), what it
//! writes (core v1 Event), and what the recorded exchanges create besides (ServiceAccount) or a
//! scenario is likely to want (Namespace, ConfigMap). Any other group, version or resource answers
//! `404 page not found` as kube-apiserver does for a path nothing serves
//! (19-list-nodeslo-nocrd-group.txt).

/// One API resource the stand-in serves.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    /// API group, `""` for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    /// The lower-case plural in paths (`nodeslos`), also the `kind` in a Status's `details`.
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Served from a CustomResourceDefinition: the object gets `metadata.generation`, and a list
    /// keeps `apiVersion`/`kind` on every item and sends `metadata.continue` even when empty
    /// (04, 15); a built-in type's list items carry neither (18).
    pub custom: bool,
    /// Field-selector labels besides `metadata.name` and `metadata.namespace`, as the type's
    /// registry accepts them (dotted JSON paths into the object).
    pub fields: &'static [&'static str],
}

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "type",
];

const fn core(plural: &'static str, kind: &'static str, namespaced: bool, fields: &'static [&'static str]) -> Resource {
    Resource { group: "", version: "v1", plural, kind, namespaced, custom: false, fields }
}

const fn crd(group: &'static str, version: &'static str, plural: &'static str, kind: &'static str) -> Resource {
    Resource { group, version, plural, kind, namespaced: false, custom: true, fields: &[] }
}

/// Everything served. Plurals are unique across the table, so a plural names a resource.
pub(crate) static RESOURCES: &[Resource] = &[
    core("namespaces", "Namespace", false, &[]),
    core("nodes", "Node", false, &[]),
    core("pods", "Pod", true, POD_FIELDS),
    core("events", "Event", true, EVENT_FIELDS),
    core("serviceaccounts", "ServiceAccount", true, &[]),
    core("configmaps", "ConfigMap", true, &[]),
    crd("slo.koordinator.sh", "v1alpha1", "nodeslos", "NodeSLO"),
    crd("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies", "NodeResourceTopology"),
];

impl Resource {
    /// The resource with this plural; panics on one not served (test code passes a literal).
    pub fn by_plural(plural: &str) -> &'static Resource {
        RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap_or_else(|| panic!("kube_api: no resource {plural:?} is served"))
    }

    /// The resource an object with this `apiVersion` and `kind` belongs to.
    pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
        RESOURCES.iter().find(|r| r.kind == kind && r.api_version() == api_version)
    }

    /// The resource at `/api[s]/{group}/{version}/…/{plural}`.
    pub fn by_path(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (`nodeslos.slo.koordinator.sh`), or the plural alone in the core group: how
    /// kube-apiserver names the resource in a Status message (11, 13).
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_owned()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Whether `label` may be used in a field selector on this resource.
    pub fn selectable(&self, label: &str) -> bool {
        label == "metadata.name" || label == "metadata.namespace" || self.fields.contains(&label)
    }
}

/// What a request path names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// `GET /version`.
    Version,
    /// A collection: all of a cluster-scoped resource, or of a namespaced one in every namespace
    /// (`namespace: None`) or in one.
    Collection { resource: &'static Resource, namespace: Option<String> },
    /// One object.
    Object { resource: &'static Resource, namespace: Option<String>, name: String },
}

/// Parses a request path; `None` for a path nothing serves (answered `404 page not found`).
pub(crate) fn parse_path(path: &str) -> Option<Target> {
    if path == "/version" || path == "/version/" {
        return Some(Target::Version);
    }
    let segments: Vec<&str> = path.trim_start_matches('/').trim_end_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    if rest.iter().any(|s| s.is_empty()) {
        return None;
    }
    let found = |plural: &str| Resource::by_path(group, version, plural);
    match rest {
        [plural] => Some(Target::Collection { resource: found(plural)?, namespace: None }),
        [plural, name] => {
            let resource = found(plural).filter(|r| !r.namespaced)?;
            Some(Target::Object { resource, namespace: None, name: (*name).to_owned() })
        }
        ["namespaces", namespace, plural] => {
            let resource = found(plural).filter(|r| r.namespaced)?;
            Some(Target::Collection { resource, namespace: Some((*namespace).to_owned()) })
        }
        ["namespaces", namespace, plural, name] => {
            let resource = found(plural).filter(|r| r.namespaced)?;
            Some(Target::Object { resource, namespace: Some((*namespace).to_owned()), name: (*name).to_owned() })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let slo = Resource::by_plural("nodeslos");
        let pods = Resource::by_plural("pods");
        assert_eq!(
            parse_path("/apis/slo.koordinator.sh/v1alpha1/nodeslos"),
            Some(Target::Collection { resource: slo, namespace: None })
        );
        assert_eq!(
            parse_path("/apis/slo.koordinator.sh/v1alpha1/nodeslos/node-a"),
            Some(Target::Object { resource: slo, namespace: None, name: "node-a".into() })
        );
        assert_eq!(parse_path("/apis/slo.koordinator.sh/v1alpha2/nodeslos"), None);
        assert_eq!(parse_path("/api/v1/pods"), Some(Target::Collection { resource: pods, namespace: None }));
        assert_eq!(parse_path("/api/v1/pods/x"), None, "a namespaced object needs its namespace");
        assert_eq!(
            parse_path("/api/v1/namespaces/default/pods/x"),
            Some(Target::Object { resource: pods, namespace: Some("default".into()), name: "x".into() })
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/default"),
            Some(Target::Object {
                resource: Resource::by_plural("namespaces"),
                namespace: None,
                name: "default".into()
            })
        );
        assert_eq!(parse_path("/api/v1/namespaces/default/nodes"), None);
        assert_eq!(parse_path("/api/v2/pods"), None);
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(parse_path("/version"), Some(Target::Version));
        assert_eq!(slo.group_resource(), "nodeslos.slo.koordinator.sh");
        assert_eq!(pods.group_resource(), "pods");
        assert_eq!(Resource::by_kind("v1", "Pod"), Some(pods));
        assert_eq!(Resource::by_kind("slo.koordinator.sh/v1alpha1", "NodeSLO"), Some(slo));
    }
}
