use std::path::Path;
use std::sync::Arc;

use super::*;
use std::collections::BTreeSet;

use crate::host::resctrl::{make_fake_tree, DirResctrl, ResctrlFs, Vendor};
use crate::host::HostPaths;
use crate::plugin::ContainerState;

struct Node {
    _t: tempfile::TempDir,
    cgroups: std::path::PathBuf,
    resctrl: std::path::PathBuf,
    host: Host,
}

/// A fake resctrl tree (11 ways, cache ids 0 and 1, Intel) and a cgroup v2 tree.
fn node() -> Node {
    let t = tempfile::tempdir().unwrap();
    let (cgroups, resctrl) = (t.path().join("cgroup"), t.path().join("resctrl"));
    std::fs::create_dir_all(&cgroups).unwrap();
    std::fs::write(cgroups.join("cgroup.controllers"), "cpu\n").unwrap();
    make_fake_tree(&resctrl, "7ff", &[0, 1]).unwrap();
    let fs = DirResctrl::open(&resctrl, Vendor::Intel).unwrap();
    let host = Host {
        paths: HostPaths { cgroup_root: cgroups.clone(), resctrl_root: resctrl.clone(), ..Default::default() },
        resctrl: Some(Arc::new(fs)),
        ..Default::default()
    };
    Node { _t: t, cgroups, resctrl, host }
}

fn pod(root: &Path, uid: &str, annotation: Option<&str>, threads: &[u32]) -> PodState {
    let ctx = PodContext {
        uid: uid.into(),
        name: uid.into(),
        namespace: "default".into(),
        annotations: annotation.map(|a| (ANNOTATION.to_string(), a.to_string())).into_iter().collect(),
        cgroup_parent: format!("/kubepods/pod{uid}"),
        ..Default::default()
    };
    let dir = format!("/kubepods/pod{uid}/c1");
    std::fs::create_dir_all(root.join(dir.trim_start_matches('/'))).unwrap();
    let text: String = threads.iter().map(|t| format!("{t}\n")).collect();
    std::fs::write(root.join(dir.trim_start_matches('/')).join("cgroup.threads"), text).unwrap();
    PodState {
        pod: ctx.clone(),
        cgroup_dir: Some(format!("/kubepods/pod{uid}")),
        containers: vec![ContainerState {
            container: ContainerContext { pod: ctx, name: "c1".into(), id: "c1".into(), ..Default::default() },
            cgroup_dir: Some(dir),
        }],
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

const LLC_MB: &str = r#"{"llc":{"schemata":{"range":[0,30]}},"mb":{"schemata":{"percent":50}}}"#;

#[test]
fn groups_schemata_tasks_and_cleanup_on_a_fake_tree() {
    let n = node();
    let plugin = Resctrl::with_grace(Duration::ZERO);
    let a = pod(&n.cgroups, "a", Some(LLC_MB), &[100, 101]);
    let plain = pod(&n.cgroups, "p", None, &[200]);
    plugin.node(&NodePods::given(&[a.clone(), plain.clone()]), &Rules::default(), &n.host).unwrap();
    let g = n.resctrl.join("koordlet-a");
    assert_eq!(read(&g.join("schemata")), "L3:0=f;1=f;\nMB:0=50;1=50;\n");
    assert_eq!(read(&g.join("tasks")), "100\n101\n");
    assert!(!n.resctrl.join("koordlet-p").exists(), "no annotation, no group");

    // Idempotent; a new thread joins; drifted schemata rewritten.
    plugin.node(&NodePods::given(&[a.clone(), plain.clone()]), &Rules::default(), &n.host).unwrap();
    assert_eq!(read(&g.join("tasks")), "100\n101\n");
    let a = pod(&n.cgroups, "a", Some(LLC_MB), &[100, 101, 102]);
    std::fs::write(g.join("schemata"), "L3:0=7ff;1=7ff\nMB:0=100;1=100\n").unwrap();
    plugin.node(&NodePods::given(&[a.clone(), plain.clone()]), &Rules::default(), &n.host).unwrap();
    assert_eq!(read(&g.join("tasks")), "100\n101\n102\n");
    assert_eq!(read(&g.join("schemata")), "L3:0=f;1=f;\nMB:0=50;1=50;\n");

    // A group left by a pod that is gone (another koordlet-* group) is removed; others are not.
    std::fs::create_dir(n.resctrl.join("koordlet-gone")).unwrap();
    std::fs::create_dir(n.resctrl.join("someone-else")).unwrap();
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &Rules::default(), &n.host).unwrap();
    assert!(!n.resctrl.join("koordlet-gone").exists());
    assert!(n.resctrl.join("someone-else").exists() && g.exists());

    // Pod removal (koordlet's PreRemoveRunPodSandbox) removes the group at once.
    plugin.pod_removed(&a, &Rules::default(), &n.host).unwrap();
    assert!(!g.exists());
}

#[test]
fn unused_groups_wait_for_the_grace_period() {
    let n = node();
    std::fs::create_dir(n.resctrl.join("koordlet-new")).unwrap();
    let plugin = Resctrl::default();
    plugin.node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    assert!(n.resctrl.join("koordlet-new").exists(), "first seen just now");
}

/// With `--selector` the plugin sees some pods only: a group it does not know is never removed.
#[test]
fn a_partial_view_removes_no_unknown_group() {
    let n = node();
    std::fs::create_dir(n.resctrl.join("koordlet-other")).unwrap();
    let plugin = Resctrl { grace: Duration::ZERO, ..Resctrl::with_partial_view(true) };
    plugin.node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    plugin.node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    assert!(n.resctrl.join("koordlet-other").exists(), "may be a pod that is not selected");
    // A pod it saw, and that went: its group goes.
    let a = pod(&n.cgroups, "a", Some(LLC_MB), &[100]);
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &Rules::default(), &n.host).unwrap();
    let group = n.resctrl.join(format!("koordlet-{}", a.pod.uid));
    assert!(group.exists());
    plugin.node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    plugin.node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    assert!(!group.exists(), "seen, then gone: removed");
    assert!(n.resctrl.join("koordlet-other").exists());
    Resctrl::with_grace(Duration::ZERO).node(&NodePods::given(&[]), &Rules::default(), &n.host).unwrap();
    assert!(!n.resctrl.join("koordlet-other").exists(), "whole view: removed");
}

#[test]
fn a_bad_annotation_fails_only_this_plugin_and_only_that_pod() {
    let n = node();
    let plugin = Resctrl::with_grace(Duration::ZERO);
    let bad = pod(&n.cgroups, "bad", Some(r#"{"llc":{"schemata":{"range":"0-30"}}}"#), &[300]);
    let good = pod(&n.cgroups, "good", Some(r#"{"llc":{"schemata":{"range":[30,100]}}}"#), &[400]);
    let e = plugin.node(&NodePods::given(&[bad.clone(), good]), &Rules::default(), &n.host).unwrap_err().to_string();
    assert!(e.contains("default/bad") && e.contains(ANNOTATION), "{e}");
    assert_eq!(read(&n.resctrl.join("koordlet-good/schemata")), "L3:0=7f0;1=7f0;\n");
    assert!(!n.resctrl.join("koordlet-bad").exists());
    let e = plugin.pod(Stage::PreRunPodSandbox, &bad.pod, &Rules::default()).unwrap_err();
    assert!(e.to_string().contains(ANNOTATION));
    assert!(plugin
        .pod(Stage::PreRunPodSandbox, &pod(&n.cgroups, "ok", Some(LLC_MB), &[]).pod, &Rules::default())
        .is_ok());
}

#[test]
fn no_resctrl_means_nothing_done() {
    let mut n = node();
    n.host.resctrl = None;
    let a = pod(&n.cgroups, "a", Some(LLC_MB), &[100]);
    Resctrl::default().node(&NodePods::given(std::slice::from_ref(&a)), &Rules::default(), &n.host).unwrap();
    Resctrl::default().pod_removed(&a, &Rules::default(), &n.host).unwrap();
    assert!(!n.resctrl.join("koordlet-a").exists());
}

/// A test tree that claims to be the kernel's mount (for the RDT class).
struct KernelLike(DirResctrl);

impl ResctrlFs for KernelLike {
    fn root(&self) -> &Path {
        self.0.root()
    }
    fn vendor(&self) -> Vendor {
        self.0.vendor()
    }
    fn cbm_mask(&self) -> std::io::Result<String> {
        self.0.cbm_mask()
    }
    fn root_schemata(&self) -> std::io::Result<String> {
        self.0.root_schemata()
    }
    fn groups(&self) -> std::io::Result<Vec<String>> {
        self.0.groups()
    }
    fn create_group(&self, group: &str) -> std::io::Result<bool> {
        self.0.create_group(group)
    }
    fn read_schemata(&self, group: &str) -> std::io::Result<String> {
        self.0.read_schemata(group)
    }
    fn write_schemata(&self, group: &str, schemata: &str) -> std::io::Result<()> {
        self.0.write_schemata(group, schemata)
    }
    fn tasks(&self, group: &str) -> std::io::Result<BTreeSet<u32>> {
        self.0.tasks(group)
    }
    fn add_task(&self, group: &str, tid: u32) -> std::io::Result<()> {
        self.0.add_task(group, tid)
    }
    fn remove_group(&self, group: &str) -> std::io::Result<()> {
        self.0.remove_group(group)
    }
    fn is_kernel(&self) -> bool {
        true
    }
}

#[test]
fn rdt_class_only_for_groups_on_the_kernels_mount() {
    let mut n = node();
    let plugin = Resctrl::with_grace(Duration::ZERO);
    let a = pod(&n.cgroups, "a", Some(LLC_MB), &[100]);
    let c = &a.containers[0].container;
    assert_eq!(
        plugin.container(Stage::PreCreateContainer, c, &Rules::default()).unwrap(),
        Change::default(),
        "no group yet"
    );
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &Rules::default(), &n.host).unwrap();
    assert_eq!(
        plugin.container(Stage::PreCreateContainer, c, &Rules::default()).unwrap().rdt_class,
        None,
        "a test tree: the runtime would not find the group"
    );
    n.host.resctrl = Some(Arc::new(KernelLike(DirResctrl::open(&n.resctrl, Vendor::Intel).unwrap())));
    plugin.node(&NodePods::given(std::slice::from_ref(&a)), &Rules::default(), &n.host).unwrap();
    let change = plugin.container(Stage::PreCreateContainer, c, &Rules::default()).unwrap();
    assert_eq!(change.rdt_class.as_deref(), Some("koordlet-a"));
    let plain = pod(&n.cgroups, "p", None, &[200]);
    assert_eq!(
        plugin.container(Stage::PreCreateContainer, &plain.containers[0].container, &Rules::default()).unwrap(),
        Change::default()
    );
    plugin.pod_removed(&a, &Rules::default(), &n.host).unwrap();
    assert_eq!(
        plugin.container(Stage::PreCreateContainer, c, &Rules::default()).unwrap().rdt_class,
        None,
        "group removed"
    );
}
