//! NRI trimming (`nri_plugin::trim`): any bytes give a trimmed copy or an error, never a panic;
//! when the bytes are a `PodSandbox` / `Container` prost decodes, the copy decodes too, holds only
//! the entries the handler reads, and holds them as the original did.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nri_plugin::proto::api::{BytesEntry, Container, PodSandbox};
use nri_plugin::{Keys, Reads};
use prost::Message;

const KEPT: [&str; 2] = ["a", "koordinator.sh/qosClass"];

/// The entries of `entries` whose key is kept, in wire order.
fn kept(entries: &[BytesEntry]) -> Vec<BytesEntry> {
    entries.iter().filter(|e| KEPT.iter().any(|k| k.as_bytes() == e.key)).cloned().collect()
}

fuzz_target!(|data: &[u8]| {
    let only = || Keys::Only(KEPT.iter().map(|k| k.to_string()).collect());
    let reads = Reads {
        pod_labels: only(),
        pod_annotations: Keys::Only(Vec::new()),
        container_labels: only(),
        container_annotations: Keys::All,
        container_args: false,
        container_env: false,
    };
    if let (Ok(trimmed), Ok(original)) = (reads.pod(data), PodSandbox::decode(data)) {
        let t = PodSandbox::decode(&trimmed[..]).expect("a trimmed pod decodes");
        assert_eq!(t.labels, kept(&original.labels), "only the kept labels, as they were");
        assert!(t.annotations.is_empty());
        assert_eq!((t.id, t.name, t.uid, t.namespace), (original.id, original.name, original.uid, original.namespace));
    }
    if let (Ok(trimmed), Ok(original)) = (reads.container(data), Container::decode(data)) {
        let t = Container::decode(&trimmed[..]).expect("a trimmed container decodes");
        assert!(t.env.is_empty() && t.args.is_empty());
        assert_eq!(t.annotations, original.annotations, "annotations are all read");
        assert_eq!(t.labels, kept(&original.labels), "only the kept labels, as they were");
        assert_eq!((t.id, t.pod_sandbox_id, t.name), (original.id, original.pod_sandbox_id, original.name));
    }
    let _ = reads.request(data, 1, 2);
    assert!(Reads::ALL.is_all());
});
