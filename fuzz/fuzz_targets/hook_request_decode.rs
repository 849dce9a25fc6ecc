//! runtime-hooks' lenient hook-request decoder (`runtime_hooks::proxy::hook_decode::Lenient`): any bytes
//! give a request or an error, never a panic; a request keeps only what plugins read (no envs, no
//! container annotations, only the pod labels and annotations of the plugins' lists), and where
//! prost decodes the same bytes the fields plugins read are the same.
#![no_main]

use hook_api::v1alpha1::ContainerResourceHookRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use runtime_hooks::plugins::{POD_ANNOTATIONS_READ, POD_LABELS_READ};
use runtime_hooks::proxy::hook_decode::Lenient;

fuzz_target!(|data: &[u8]| {
    let Ok(Lenient(req)) = Lenient::<ContainerResourceHookRequest>::decode(data) else { return };
    assert!(req.container_envs.is_empty(), "envs are never materialised");
    assert!(req.container_annotations.is_empty(), "container annotations are never materialised");
    assert!(req.pod_labels.keys().all(|k| POD_LABELS_READ.contains(&k.as_str())), "{:?}", req.pod_labels);
    assert!(
        req.pod_annotations.keys().all(|k| POD_ANNOTATIONS_READ.contains(&k.as_str())),
        "{:?}",
        req.pod_annotations
    );
    if let Ok(strict) = ContainerResourceHookRequest::decode(data) {
        assert_eq!(req.pod_meta, strict.pod_meta);
        assert_eq!(req.container_meta, strict.container_meta);
        assert_eq!(req.container_resources, strict.container_resources);
        assert_eq!(req.pod_cgroup_parent, strict.pod_cgroup_parent);
        for k in POD_LABELS_READ {
            assert_eq!(req.pod_labels.get(*k), strict.pod_labels.get(*k), "label {k}");
        }
    }
});
