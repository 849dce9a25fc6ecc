//! The hook requests a CRI call's hooks see, built from the request's fields
//! ([`crate::cri::hooked_fields`]) and, for a container, its pod in the store (koord-runtime-proxy's
//! `pkg/runtimeproxy/resexecutor/cri/`). Label, annotation and env values that are not UTF-8 are
//! left out: the hook protocol cannot carry them; they go on to the runtime unchanged.

use std::collections::BTreeMap;

use hook_api::convert;
use hook_api::v1alpha1 as hook;

use crate::cri::hooked_fields;
use crate::hooks::store::Store;

/// The PreRunPodSandbox request (`pkg/runtimeproxy/resexecutor/cri/pod.go`), plus the pod's attempt, overhead and
/// resources, which koord leaves empty. Label and annotation values that are not UTF-8 are left
/// out: the hook protocol cannot carry them ([`hooked_fields`]); they go on to the runtime unchanged.
pub fn pod_hook_request(
    config: Option<&hooked_fields::PodSandboxConfig>,
    runtime_handler: &str,
) -> hook::PodSandboxHookRequest {
    let Some(config) = config else {
        return hook::PodSandboxHookRequest {
            runtime_handler: runtime_handler.to_owned(),
            pod_meta: Some(Default::default()),
            ..Default::default()
        };
    };
    let meta = config.metadata.as_ref();
    let linux = config.linux.as_ref();
    hook::PodSandboxHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: meta.map(|m| m.name.clone()).unwrap_or_default(),
            uid: meta.map(|m| m.uid.clone()).unwrap_or_default(),
            namespace: meta.map(|m| m.namespace.clone()).unwrap_or_default(),
            attempt: meta.map(|m| m.attempt).unwrap_or_default(),
        }),
        runtime_handler: runtime_handler.to_owned(),
        labels: hooked_fields::utf8_entries(&config.labels),
        annotations: hooked_fields::utf8_entries(&config.annotations),
        cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
        overhead: linux.and_then(|l| l.overhead.as_ref()).map(convert::to_hook),
        resources: linux.and_then(|l| l.resources.as_ref()).map(convert::to_hook),
    }
}

/// The PreCreateContainer request (`pkg/runtimeproxy/resexecutor/cri/container.go`). Pod fields come from the store
/// (they include the PreRunPodSandbox hooks' changes); for a pod the store does not know, from the request's
/// `sandbox_config`. `None` when there is neither: the sandbox is unknown to everyone, so the call goes on without
/// hooks and the runtime answers it (NOT_FOUND), as for the ID-only methods — a hook must not replace that answer with
/// its own error. Env and annotation values that are not UTF-8 are left out (see [`pod_hook_request`]).
///
/// Errors: the request's `sandbox_config`, needed and not decodable.
pub fn container_hook_request(
    req: &hooked_fields::CreateContainerRequest,
    store: &Store,
) -> Result<Option<hook::ContainerResourceHookRequest>, prost::DecodeError> {
    let pod = match store.pod(&req.pod_sandbox_id) {
        Some(pod) => pod,
        None => match req.sandbox_config()? {
            Some(c) => pod_hook_request(Some(&c), ""),
            None => return Ok(None),
        },
    };
    let config = req.config.as_ref();
    let meta = config.and_then(|c| c.metadata.as_ref());
    let resources = config.and_then(|c| c.linux.as_ref()).and_then(|l| l.resources.as_ref());
    Ok(Some(hook::ContainerResourceHookRequest {
        pod_meta: pod.pod_meta,
        container_meta: Some(hook::ContainerMetadata {
            name: meta.map(|m| m.name.clone()).unwrap_or_default(),
            attempt: meta.map(|m| m.attempt).unwrap_or_default(),
            id: String::new(),
        }),
        container_annotations: config.map(|c| hooked_fields::utf8_entries(&c.annotations)).unwrap_or_default(),
        container_resources: Some(resources.map(convert::to_hook).unwrap_or_default()),
        pod_resources: pod.resources,
        pod_annotations: pod.annotations,
        pod_labels: pod.labels,
        pod_cgroup_parent: pod.cgroup_parent,
        container_envs: config.map(|c| utf8_envs(&c.envs)).unwrap_or_default(),
    }))
}

/// The container's envs as the hook protocol carries them: by name, the last of a name deciding
/// (as in the container), left out when that value is not UTF-8 ([`hook_api::utf8`]).
fn utf8_envs(envs: &[hooked_fields::KeyValue]) -> BTreeMap<String, String> {
    hook_api::utf8::utf8_map(envs.iter().map(|kv| (kv.key.as_bytes(), &kv.value[..])))
}
