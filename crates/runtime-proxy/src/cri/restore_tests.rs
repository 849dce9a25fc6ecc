use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::hooks::chain::{REQUIRED_ANNOTATION, TOLERATE_ANNOTATION};
use crate::hooks::registry::{HookServer, DEFAULT_TIMEOUT};

fn server(name: &str, policy: FailurePolicy, stages: &[Stage]) -> Arc<HookServer> {
    Arc::new(HookServer {
        name: name.into(),
        file: PathBuf::from(format!("/etc/runtime/hookserver.d/{name}")),
        endpoint: PathBuf::from(format!("/run/{name}.sock")),
        failure_policy: policy,
        policy_explicit: true,
        stages: stages.iter().copied().collect::<BTreeSet<_>>(),
        timeout: DEFAULT_TIMEOUT,
        order: 0,
        allowed_uids: vec![],
        conflict_policy: None,
        warnings: vec![],
    })
}

fn snapshot(servers: Vec<Arc<HookServer>>) -> Snapshot {
    Snapshot::new(servers, Vec::new(), 1).0
}

fn skip() -> SkipLabel {
    SkipLabel { key: "skip".into(), value: "true".into(), namespaces: vec!["kube-system".into()] }
}

fn pod(namespace: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> hook::PodSandboxHookRequest {
    let map = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    hook::PodSandboxHookRequest {
        pod_meta: Some(hook::PodSandboxMetadata {
            name: "web".into(),
            namespace: namespace.into(),
            ..Default::default()
        }),
        labels: map(labels),
        annotations: map(annotations),
        ..Default::default()
    }
}

fn refusal(v: Verdict) -> String {
    match v {
        Verdict::Refuse(s) => {
            assert_eq!(s.code, Code::FAILED_PRECONDITION);
            s.message
        }
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn servers_of_other_stages_do_not_matter() {
    let m = Metrics::new();
    let snap = snapshot(vec![server(
        "start.json",
        FailurePolicy::Fail,
        &[Stage::PreStartContainer, Stage::PostStopContainer],
    )]);
    assert_eq!(verdict(&snap, &[], &skip(), Some(&pod("default", &[], &[])), &m), Verdict::Pass);
    assert_eq!(verdict(&snapshot(vec![]), &[], &skip(), None, &m), Verdict::Pass);
}

#[test]
fn ignore_servers_are_named_once_in_call_order() {
    let m = Metrics::new();
    let snap = snapshot(vec![
        server("b.json", FailurePolicy::Ignore, &[Stage::PreCreateContainer]),
        server("a.json", FailurePolicy::Ignore, &[Stage::PreRunPodSandbox, Stage::PreCreateContainer]),
    ]);
    let v = verdict(&snap, &[], &skip(), Some(&pod("default", &[], &[])), &m);
    assert_eq!(v, Verdict::Unhooked(vec!["a.json".into(), "b.json".into()]));
    assert_eq!(
        verdict(&snap, &[], &skip(), None, &m),
        Verdict::Unhooked(vec!["a.json".into(), "b.json".into()]),
        "undecodable"
    );
}

#[test]
fn a_fail_server_refuses_naming_it_and_its_stages() {
    let m = Metrics::new();
    let snap = snapshot(vec![
        server("koordlet.json", FailurePolicy::Fail, &[Stage::PreRunPodSandbox, Stage::PreCreateContainer]),
        server("other.json", FailurePolicy::Ignore, &[Stage::PreCreateContainer]),
    ]);
    let msg = refusal(verdict(&snap, &[], &skip(), Some(&pod("default", &[], &[])), &m));
    assert!(msg.starts_with("RestorePod of pod default/web refused"), "{msg}");
    assert!(msg.contains("koordlet.json (PreRunPodSandbox/PreCreateContainer: failure-policy Fail)"), "{msg}");
    assert!(!msg.contains("other.json"), "an Ignore server is not a reason: {msg}");
    // Undecodable: the failure policy still holds.
    assert!(refusal(verdict(&snap, &[], &skip(), None, &m)).contains("koordlet.json"));
}

#[test]
fn a_required_ignore_server_refuses_by_the_node_flag_or_the_pods_annotation() {
    let m = Metrics::new();
    let snap = snapshot(vec![server("gpu.json", FailurePolicy::Ignore, &[Stage::PreCreateContainer])]);
    let node = vec!["gpu.json".to_owned()];
    let msg = refusal(verdict(&snap, &node, &skip(), Some(&pod("default", &[], &[])), &m));
    assert!(msg.contains("gpu.json (PreCreateContainer: required by --required-hook-servers)"), "{msg}");
    assert!(
        refusal(verdict(&snap, &node, &skip(), None, &m)).contains("gpu.json"),
        "undecodable: the node's requirement holds"
    );

    let annotated = pod("default", &[], &[(REQUIRED_ANNOTATION, "gpu.json")]);
    let msg = refusal(verdict(&snap, &[], &skip(), Some(&annotated), &m));
    assert!(msg.contains(&format!("gpu.json (PreCreateContainer: required by {REQUIRED_ANNOTATION})")), "{msg}");
}

#[test]
fn a_required_server_without_registration_refuses_unless_tolerated() {
    let m = Metrics::new();
    let snap = snapshot(vec![]);
    let node = vec!["koordlet.json".to_owned()];
    let msg = refusal(verdict(&snap, &node, &skip(), Some(&pod("default", &[], &[])), &m));
    assert!(msg.contains("koordlet.json (required by --required-hook-servers, not registered)"), "{msg}");
    let tolerating = pod("kube-system", &[], &[(TOLERATE_ANNOTATION, "true")]);
    assert_eq!(verdict(&snap, &node, &skip(), Some(&tolerating), &m), Verdict::Pass);
    let elsewhere = pod("default", &[], &[(TOLERATE_ANNOTATION, "true")]);
    assert!(
        matches!(verdict(&snap, &node, &skip(), Some(&elsewhere), &m), Verdict::Refuse(_)),
        "tolerate not honoured there"
    );
}

#[test]
fn the_skip_label_is_honoured_only_where_allowed() {
    let m = Metrics::new();
    let snap = snapshot(vec![server("koordlet.json", FailurePolicy::Fail, &[Stage::PreRunPodSandbox])]);
    let skipping = pod("kube-system", &[("skip", "true")], &[]);
    assert_eq!(verdict(&snap, &["koordlet.json".into()], &skip(), Some(&skipping), &m), Verdict::Skipped);
    let elsewhere = pod("default", &[("skip", "true")], &[]);
    assert!(matches!(verdict(&snap, &[], &skip(), Some(&elsewhere), &m), Verdict::Refuse(_)));
    assert!(m.render_for_tests().contains("runtime_proxy_skip_label_ignored_total 1"));
}

#[test]
fn a_refusal_lists_a_few_reasons_and_counts_the_rest() {
    let m = Metrics::new();
    let names: Vec<String> = (0..10).map(|i| format!("missing-{i}.json")).collect();
    let annotated = pod("default", &[], &[(REQUIRED_ANNOTATION, &names.join(","))]);
    let msg = refusal(verdict(&snapshot(vec![]), &[], &skip(), Some(&annotated), &m));
    assert!(msg.contains("missing-2.json") && !msg.contains("missing-3.json") && msg.ends_with("and 7 more"), "{msg}");
}
