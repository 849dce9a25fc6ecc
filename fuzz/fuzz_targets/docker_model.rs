//! Docker mode's request rewriting (`runtime_proxy::docker::model`): a container name parsed the
//! dockershim way (`KubeName::parse`), a create body of arbitrary JSON read into hook requests
//! (`pod_request`, `container_request`), a hook's answer (prost-decoded) merged in, and the changes
//! written back into the body (`write_pod_changes`, `write_container_changes`). Never panics; a
//! parsed name prints back to itself; and reading the rewritten body gives the hook's values.
//!
//! Input: `split2` frame; the first part is the container name, the rest is
//! `[u16 LE n][n bytes of JSON body][hook answer]`.
#![no_main]

use hook_api::merge::{apply_container_response, apply_pod_response};
use hook_api::v1alpha1 as hook;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_proxy::docker::model::{self, KubeName};
use runtime_proxy_fuzz::split2;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((sel, name, rest)) = split2(data) else { return };
    let Ok(name) = std::str::from_utf8(name) else { return };
    let Some(kube) = KubeName::parse(name) else { return };
    let printed = format!("k8s_{}_{}_{}_{}_{}", kube.container, kube.pod, kube.namespace, kube.uid, kube.attempt);
    assert_eq!(KubeName::parse(&printed).as_ref(), Some(&kube));

    let Some((_, body, answer)) = split2(&[&[sel][..], rest].concat()).map(|(s, b, a)| (s, b.to_vec(), a.to_vec()))
    else {
        return;
    };
    let Ok(Value::Object(mut body)) = serde_json::from_slice::<Value>(&body) else { return };
    let config = Some(Value::Object(body.clone()));
    let labels = model::labels_of(config.as_ref());
    if model::is_sandbox(&labels, &kube) {
        let Ok(resp) = hook::PodSandboxHookResponse::decode(&answer[..]) else { return };
        let before = model::pod_request(&kube, config.as_ref(), body.get("HostConfig"));
        let mut after = before.clone();
        apply_pod_response(&mut after, &resp);
        let changed = model::write_pod_changes(&mut body, &before, &after);
        let body = Value::Object(body);
        let again = model::pod_request(&kube, Some(&body), body.get("HostConfig"));
        assert_eq!(again.cgroup_parent, after.cgroup_parent);
        // A label named `annotation.<key>` reads back as an annotation: dockershim's encoding
        // cannot tell them apart (cri-dockerd has the same ambiguity).
        for (k, v) in resp.labels.iter().filter(|(k, _)| !k.starts_with(model::ANNOTATION_PREFIX)) {
            assert_eq!(again.labels.get(k), Some(v), "label {k:?}");
        }
        for (k, v) in &resp.annotations {
            assert_eq!(again.annotations.get(k), Some(v), "annotation {k:?}");
        }
        if !changed {
            assert_eq!((again.labels, again.annotations), (before.labels, before.annotations));
        }
    } else {
        let Ok(resp) = hook::ContainerResourceHookResponse::decode(&answer[..]) else { return };
        let before = model::container_request(&kube, None, config.as_ref(), body.get("HostConfig"));
        let mut after = before.clone();
        apply_container_response(&mut after, &resp);
        model::write_container_changes(&mut body, &before, &after);
        let body = Value::Object(body);
        let again = model::container_request(&kube, None, Some(&body), body.get("HostConfig"));
        assert_eq!(again.pod_cgroup_parent, after.pod_cgroup_parent);
        for (k, v) in &resp.container_annotations {
            assert_eq!(again.container_annotations.get(k), Some(v), "annotation {k:?}");
        }
        // An env name with `=` (no valid name has one) becomes `K=E=V`, which reads back as `K`
        // = `E=V`: the same text containerd makes of it in CRI mode, so not checked here
        // (corpus/docker_model/regression-env-name-with-equals). An empty name is ignored by the
        // merge (corpus/docker_model/regression-env-empty-name).
        for (k, v) in resp.container_envs.iter().filter(|(k, _)| !k.is_empty() && !k.contains('=')) {
            assert_eq!(again.container_envs.get(k), Some(v), "env {k:?}");
        }
        // Resources: every field the hook changed now reads as the hook's value (the swap
        // limit as follow_swap keeps it in step with memory).
        let (b, a) = (before.container_resources.unwrap_or_default(), after.container_resources.unwrap_or_default());
        let mut a2 = a.clone();
        model::follow_swap(&b, &mut a2, false);
        let r = again.container_resources.unwrap_or_default();
        macro_rules! field {
            ($($f:ident),*) => {$( if b.$f != a2.$f { assert_eq!(r.$f, a2.$f, stringify!($f)); } )*};
        }
        field!(
            cpu_period,
            cpu_quota,
            cpu_shares,
            memory_limit_in_bytes,
            oom_score_adj,
            cpuset_cpus,
            cpuset_mems,
            memory_swap_limit_in_bytes
        );
    }
});
