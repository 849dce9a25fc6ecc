//! Cgroup drivers and layouts on real containerd: BE pods whose cgroup parents follow kubelet's
//! cgroupfs layout (`<root>/kubepods/besteffort/pod<uid>`) and its systemd layout
//! (`<root>/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice`, and
//! the bare slice name), and pods with an empty parent (the runtime's default), in proxy mode
//! through runtime-proxy and in standalone mode.
//!
//! The dev containerds run runc with the cgroupfs driver (systemd is not PID 1 here). containerd
//! still turns a parent whose last component ends in `.slice` into a systemd cgroups path
//! (`<slice>:cri-containerd:<id>`), which runc's cgroupfs driver then places relative to its own
//! cgroup; so the containers of slice-layout pods run in `/<slice>:cri-containerd:<id>`, not in
//! the pod's directory. The tests read a container's real cgroup from `/proc/<pid>/cgroup`, and
//! create the `cri-containerd-<id>.scope` directory where systemd would have put it when they
//! need the reconciler to find one. Bare slice names are tested with `--cgroup-root` on a temp
//! tree laid out as on a systemd node (the real hierarchy has no `/kubepods.slice`).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use test_support::containerd::{unique, Containerd, Pod};
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;
use tonic::transport::Channel;

/// The pod cgroup parent of a BE pod in kubelet's `layout`, below the harness's parent.
fn be_parent(env: &Containerd, layout: Layout, uid: &str) -> String {
    let uid = uid.replace('-', "_"); // kubelet escapes "-" in systemd unit names
    match layout {
        Layout::Cgroupfs => format!("{}/kubepods/besteffort/pod{uid}", env.cgroup_parent),
        Layout::Slice => {
            format!("{}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice", env.cgroup_parent)
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Cgroupfs,
    Slice,
}

/// A BE pod with the batch resources and `labels`, its parent set by `parent(uid)`.
fn be_configs(
    env: &Containerd,
    labels: &[(&str, &str)],
    parent: impl Fn(&str) -> String,
) -> (cri::PodSandboxConfig, cri::ContainerConfig) {
    let mut all = vec![(QOS, "BE")];
    all.extend_from_slice(labels);
    let (mut sandbox, container) = pod_configs(env, &all, &[(SPEC, BE_SPEC)]);
    let uid = sandbox.metadata.as_ref().unwrap().uid.clone();
    sandbox.linux.as_mut().unwrap().cgroup_parent = parent(&uid);
    (sandbox, container)
}

/// The directory of a running container's real cgroup for `controller`, from its
/// `/proc/<pid>/cgroup` (wherever runc put it).
async fn real_cgroup(rt: &mut RuntimeServiceClient<Channel>, container_id: &str, controller: &str) -> PathBuf {
    let status = rt
        .container_status(cri::ContainerStatusRequest { container_id: container_id.into(), verbose: true })
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_str(&status.into_inner().info["info"]).unwrap();
    let pid = info["pid"].as_i64().expect("pid in the verbose info");
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroups
        .lines()
        .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
        .find(|(ctrls, _)| ctrls.split(',').any(|c| c == controller))
        .map(|(_, p)| p.to_owned())
        .unwrap_or_else(|| panic!("no {controller} in {cgroups}"));
    Path::new("/sys/fs/cgroup").join(controller).join(path.trim_start_matches('/'))
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_else(|e| panic!("reading {}/{file}: {e}", dir.display()))
        .trim()
        .to_owned()
}

/// The BE values: (cpu.shares, cpu.cfs_period_us, cpu.cfs_quota_us, memory.limit_in_bytes).
fn be_values() -> (String, String, String, String) {
    ("512".into(), "100000".into(), "100000".into(), "134217728".into())
}

/// The BE values in v1 cgroup directories `cpu` and `memory`.
fn values_in(cpu: &Path, memory: &Path) -> (String, String, String, String) {
    (
        read(cpu, "cpu.shares"),
        read(cpu, "cpu.cfs_period_us"),
        read(cpu, "cpu.cfs_quota_us"),
        read(memory, "memory.limit_in_bytes"),
    )
}

/// The BE values of a pod parent (absolute) in the real hierarchy.
fn pod_values(parent: &str) -> (String, String, String, String) {
    (
        cgroup("cpu", parent, "cpu.shares"),
        cgroup("cpu", parent, "cpu.cfs_period_us"),
        cgroup("cpu", parent, "cpu.cfs_quota_us"),
        cgroup("memory", parent, "memory.limit_in_bytes"),
    )
}

/// Removes cgroup directories this test made (deepest first; best effort, only empty ones go).
fn remove_cgroups(dirs: &[&str]) {
    for dir in dirs {
        for ctrl in ["cpu", "memory"] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(ctrl).join(dir.trim_start_matches('/')));
        }
    }
}

struct ProxySetup {
    env: Containerd,
    _dir: tempfile::TempDir,
    proxy: ProxyProcess,
    hooks: Hooks,
}

/// runtime-proxy with runtime-hooks registered, with `extra` flags.
fn proxy_setup(extra: &[&str]) -> ProxySetup {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-layout").tempdir().unwrap();
    let conf = dir.path().join("hookserver.d");
    std::fs::create_dir(&conf).unwrap();
    let proxy_bin = test_support::workspace_binary("runtime-proxy");
    let proxy =
        ProxyProcess::start(proxy_bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
    let socket = dir.path().join("runtime-hooks.sock");
    let mut args = vec!["--listen", socket.to_str().unwrap(), "--hook-config-dir", conf.to_str().unwrap()];
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        proxy.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
        "proxy did not take up runtime-hooks.json\nproxy:\n{}\nhooks:\n{}",
        proxy.log(),
        hooks.log()
    );
    ProxySetup { env, _dir: dir, proxy, hooks }
}

/// Proxy mode, both layouts as absolute parents (what kubelet passes with each driver): the pod
/// cgroup gets the BE values from runtime-hooks at PreRunPodSandbox, the container from the
/// hook answer, whatever the layout; with both failure policies Fail.
#[tokio::test]
async fn proxy_be_pods_on_the_cgroupfs_and_the_systemd_layout() {
    let s = proxy_setup(&["--plugin-failure-policy", "Fail", "--failure-policy", "Fail"]);
    assert!(s.hooks.log().contains("cgroup_driver=auto: each cgroup name's form decides"), "{}", s.hooks.log());
    let mut rt = runtime_client(s.proxy.socket());
    for layout in [Layout::Cgroupfs, Layout::Slice] {
        let (sandbox, container) = be_configs(&s.env, &[], |uid| be_parent(&s.env, layout, uid));
        let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
        precreate_pod_cgroup(&parent);
        let pod = Pod::start(&mut rt, sandbox, container)
            .await
            .unwrap_or_else(|e| panic!("{layout:?}: {e:?}\n{}", s.hooks.log()));
        assert_eq!(pod_values(&parent), be_values(), "{layout:?} pod {parent}\n{}", s.hooks.log());
        let (cpu, memory) = (
            real_cgroup(&mut rt, &pod.container_id, "cpu").await,
            real_cgroup(&mut rt, &pod.container_id, "memory").await,
        );
        assert_eq!(values_in(&cpu, &memory), be_values(), "{layout:?} container in {}", cpu.display());
        if let Layout::Cgroupfs = layout {
            assert_eq!(
                cpu,
                Path::new("/sys/fs/cgroup/cpu").join(parent.trim_start_matches('/')).join(&pod.container_id)
            );
        }
        pod.remove(&mut rt).await;
        remove_cgroups(&[&parent]);
    }
    let log = s.hooks.log();
    assert!(!log.contains("plugin-failure-policy"), "no plugin failed:\n{log}");
    assert_eq!(log.lines().filter(|l| l.contains("cpu.bvt_warp_ns") && l.contains("skipped")).count(), 1, "{log}");
}

/// Fail/Fail: a plain pod (no QoS class, no annotations) with an empty cgroup parent — valid CRI,
/// the runtime's default cgroup — starts; before, GroupIdentity failed it ("not an absolute
/// path") on this kernel that has no cpu.bvt_warp_ns. A BE pod with an empty parent starts too
/// and its container still gets its batch values from the hook answer.
#[tokio::test]
async fn proxy_fail_fail_pods_with_an_empty_parent_start() {
    let s = proxy_setup(&["--plugin-failure-policy", "Fail", "--failure-policy", "Fail"]);
    let mut rt = runtime_client(s.proxy.socket());
    let (mut sandbox, container) = pod_configs(&s.env, &[], &[]);
    sandbox.linux.as_mut().unwrap().cgroup_parent = String::new();
    let plain = Pod::start(&mut rt, sandbox, container)
        .await
        .unwrap_or_else(|e| panic!("plain pod refused: {e:?}\n{}", s.hooks.log()));
    let (sandbox, container) = be_configs(&s.env, &[], |_| String::new());
    let be = Pod::start(&mut rt, sandbox, container)
        .await
        .unwrap_or_else(|e| panic!("BE pod refused: {e:?}\n{}", s.hooks.log()));
    let (cpu, memory) =
        (real_cgroup(&mut rt, &be.container_id, "cpu").await, real_cgroup(&mut rt, &be.container_id, "memory").await);
    assert_eq!(values_in(&cpu, &memory), be_values(), "{}", cpu.display());
    let log = s.hooks.log();
    assert!(!log.contains("plugin-failure-policy"), "no plugin failed:\n{log}");
    assert!(
        log.contains("empty parent: the runtime's default cgroup"),
        "a debug line says why nothing was written:\n{log}"
    );
    plain.remove(&mut rt).await;
    be.remove(&mut rt).await;
}

/// A temp v1 tree laid out as on a systemd node, with kernel-like defaults and group identity
/// (`cpu.bvt_warp_ns`, as on Anolis): `kubepods.slice`, its QoS slices, and `pod_dirs` below.
fn systemd_tree(root: &Path, pod_dirs: &[String]) {
    let mut dirs = vec![
        "".to_owned(),
        "kubepods.slice".to_owned(),
        "kubepods.slice/kubepods-burstable.slice".to_owned(),
        "kubepods.slice/kubepods-besteffort.slice".to_owned(),
    ];
    dirs.extend(pod_dirs.iter().map(|d| d.trim_start_matches('/').to_owned()));
    for dir in &dirs {
        for (ctrl, files) in [
            (
                "cpu",
                &[
                    ("cpu.shares", "1024"),
                    ("cpu.cfs_quota_us", "-1"),
                    ("cpu.cfs_period_us", "100000"),
                    ("cpu.bvt_warp_ns", "0"),
                ][..],
            ),
            ("memory", &[("memory.limit_in_bytes", "9223372036854771712")][..]),
        ] {
            let d = root.join(ctrl).join(dir);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in files {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
    }
}

/// The expanded directory of a bare pod slice name, relative.
fn expanded(slice: &str) -> String {
    let stem = slice.trim_end_matches(".slice");
    let parts: Vec<&str> = stem.split('-').collect();
    (1..=parts.len()).map(|n| format!("{}.slice", parts[..n].join("-"))).collect::<Vec<_>>().join("/")
}

/// Proxy mode, a bare systemd slice name as the pod's parent (what runc and the runtime's status
/// use; the issue's `kubepods-besteffort-pod1234.slice`), with the systemd driver and Fail/Fail:
/// the pod starts and its values land in the expanded directory of a temp tree (`--cgroup-root`).
#[tokio::test]
async fn proxy_slice_name_parent_resolves_to_its_expanded_directory() {
    let root = tempfile::tempdir().unwrap();
    let rules = rules_file(root.path(), GROUP_IDENTITY_ON);
    let s = proxy_setup(&[
        "--rules",
        rules.to_str().unwrap(),
        "--plugin-failure-policy",
        "Fail",
        "--failure-policy",
        "Fail",
        "--cgroup-root",
        root.path().to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
        "--cgroup-driver",
        "systemd",
    ]);
    assert!(s.hooks.log().contains("cgroup_driver=systemd (--cgroup-driver)"), "{}", s.hooks.log());
    let mut rt = runtime_client(s.proxy.socket());
    let (sandbox, container) =
        be_configs(&s.env, &[], |uid| format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_")));
    let slice = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
    let dir = expanded(&slice);
    assert!(dir.starts_with("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"), "{dir}");
    systemd_tree(root.path(), std::slice::from_ref(&dir));
    let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{e:?}\n{}", s.hooks.log()));
    let (cpu, memory) = (root.path().join("cpu").join(&dir), root.path().join("memory").join(&dir));
    assert_eq!(values_in(&cpu, &memory), be_values(), "{}", s.hooks.log());
    assert_eq!(read(&cpu, "cpu.bvt_warp_ns"), "-1", "GroupIdentity: BE");
    let (real_cpu, real_memory) =
        (real_cgroup(&mut rt, &pod.container_id, "cpu").await, real_cgroup(&mut rt, &pod.container_id, "memory").await);
    assert_eq!(values_in(&real_cpu, &real_memory), be_values(), "the container, from the answer");
    assert!(!s.hooks.log().contains("plugin-failure-policy"), "{}", s.hooks.log());
    pod.remove(&mut rt).await;
}

struct Standalone {
    env: Containerd,
    label: (String, String),
    hooks: Hooks,
    _dir: tempfile::TempDir,
}

fn standalone(extra: &[&str]) -> Standalone {
    let env = Containerd::from_env();
    let dir = tempfile::Builder::new().prefix("rh-layout").tempdir().unwrap();
    let label = ("test".to_string(), unique("layout"));
    let selector = format!("{}={}", label.0, label.1);
    let mut args = vec![
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
    ];
    args.extend_from_slice(extra);
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        hooks.wait_log(&["reconciled", "reason=\"start\""], 0, Duration::from_secs(10)),
        "no first pass:\n{}",
        hooks.log()
    );
    Standalone { env, label, hooks, _dir: dir }
}

/// Standalone mode, BE pods created directly on containerd with both layouts' absolute parents, driver auto. containerd
/// 1.6/1.7 do not implement RuntimeConfig: the form decides, and both layouts run. containerd 2.x answers it (the
/// harness's runc runtime: `SystemdCgroup = false`, so cgroupfs): runtime-hooks takes the runtime's driver, and only
/// that driver's layout runs (a kubelet on the cgroupfs driver never sends a slice parent; the systemd layout under a
/// named driver is `proxy_slice_name_parent_resolves_to_its_expanded_directory`). The pod cgroups get the BE values;
/// the containers too: the cgroupfs one in `<parent>/<id>`, the systemd one in `<parent>/cri-containerd-<id>.scope`,
/// resolved from the `<slice>:cri-containerd:<id>` containerd reports (created here where systemd would have).
#[tokio::test]
async fn standalone_be_pods_on_the_cgroupfs_and_the_systemd_layout() {
    let s = standalone(&[]);
    let log = s.hooks.log();
    let mut rt = runtime_client(&s.env.socket);
    // Asked of the runtime directly, as runtime-hooks asks it at start.
    let layouts = match rt.runtime_config(cri::RuntimeConfigRequest {}).await {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unimplemented, "containerd {}: {status:?}", s.env.version);
            assert!(log.contains("cgroup_driver=auto: each cgroup name's form decides (RuntimeConfig:"), "{log}");
            vec![Layout::Cgroupfs, Layout::Slice]
        }
        Ok(answer) => {
            let driver = answer.into_inner().linux.map(|l| l.cgroup_driver).unwrap_or_default();
            let (name, layout) = if driver == cri::CgroupDriver::Cgroupfs as i32 {
                ("cgroupfs", Layout::Cgroupfs)
            } else {
                ("systemd", Layout::Slice)
            };
            assert!(log.contains(&format!("cgroup_driver={name} (the runtime's RuntimeConfig)")), "{log}");
            vec![layout]
        }
    };
    let mut pods = Vec::new();
    for layout in layouts {
        let (sandbox, container) =
            be_configs(&s.env, &[(&s.label.0, &s.label.1)], |uid| be_parent(&s.env, layout, uid));
        let parent = sandbox.linux.as_ref().unwrap().cgroup_parent.clone();
        precreate_pod_cgroup(&parent);
        let pod = Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("{layout:?}: {e:?}"));
        let container_dir = match layout {
            Layout::Cgroupfs => format!("{parent}/{}", pod.container_id),
            Layout::Slice => {
                let scope = format!("{parent}/cri-containerd-{}.scope", pod.container_id);
                precreate_pod_cgroup(&scope);
                scope
            }
        };
        pods.push((layout, pod, parent, container_dir));
    }
    for (layout, _, parent, container_dir) in &pods {
        let real = |ctrl: &str| Path::new("/sys/fs/cgroup").join(ctrl).join(container_dir.trim_start_matches('/'));
        assert!(
            eventually(Duration::from_secs(5), || pod_values(parent) == be_values()
                && values_in(&real("cpu"), &real("memory")) == be_values()),
            "{layout:?}: pod {:?} container {:?}\n{}",
            pod_values(parent),
            values_in(&real("cpu"), &real("memory")),
            s.hooks.log()
        );
        // The line follows the write it reports (and the log goes through runtime-hooks' writer
        // thread): wait for it rather than read the log at once.
        let corrected = ["drift corrected", &format!("{container_dir}/cpu.shares"), "new=512"];
        assert!(
            s.hooks.wait_log(&corrected, 0, Duration::from_secs(5)),
            "{layout:?}: no correction logged:\n{}",
            s.hooks.log()
        );
        assert_eq!(s.hooks.count(&corrected), 1, "{layout:?}: corrected once\n{}", s.hooks.log());
    }
    assert!(!s.hooks.log().contains("reconcile: "), "no failure:\n{}", s.hooks.log());
    for (_, pod, parent, container_dir) in pods {
        pod.remove(&mut rt).await;
        remove_cgroups(&[&container_dir, &parent]);
    }
}

/// Standalone mode, a BE pod with an empty parent: containerd runs it in its namespace's cgroup
/// (`/k8s.io/<id>`) and reports no parent. Its container gets the BE values; `/k8s.io`, the parent
/// of every such pod, is left alone (before, the reconciler took the sandbox's `/k8s.io/<id>` for
/// `<parent>/<id>` and would have limited `/k8s.io` itself).
#[tokio::test]
async fn standalone_empty_parent_pod_gets_container_values_only() {
    let s = standalone(&[]);
    let shared = |ctrl: &str, file: &str| cgroup(ctrl, "/k8s.io", file);
    let before =
        (shared("cpu", "cpu.shares"), shared("cpu", "cpu.cfs_quota_us"), shared("memory", "memory.limit_in_bytes"));
    let mut rt = runtime_client(&s.env.socket);
    let (sandbox, container) = be_configs(&s.env, &[(&s.label.0, &s.label.1)], |_| String::new());
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("BE pod with an empty parent");
    let (cpu, memory) =
        (real_cgroup(&mut rt, &pod.container_id, "cpu").await, real_cgroup(&mut rt, &pod.container_id, "memory").await);
    assert!(cpu.starts_with("/sys/fs/cgroup/cpu/k8s.io"), "{}", cpu.display());
    assert!(
        eventually(Duration::from_secs(5), || values_in(&cpu, &memory) == be_values()),
        "{:?}\n{}",
        values_in(&cpu, &memory),
        s.hooks.log()
    );
    assert!(
        s.hooks.wait_log(&["empty cgroup parent", "pod-level values not written"], 0, Duration::from_secs(2)),
        "{}",
        s.hooks.log()
    );
    assert_eq!(
        (shared("cpu", "cpu.shares"), shared("cpu", "cpu.cfs_quota_us"), shared("memory", "memory.limit_in_bytes")),
        before
    );
    assert!(!s.hooks.log().contains("reconcile: "), "no failure:\n{}", s.hooks.log());
    pod.remove(&mut rt).await;
}

/// Standalone mode, a bare slice name as the parent of a pod created directly on containerd,
/// `--cgroup-driver systemd` and `--kubepods-cgroup kubepods.slice`, on a temp tree laid out as on
/// a systemd node: the pod's values land in the slice's expanded directory, the container's in
/// `cri-containerd-<id>.scope` below it, group identity in the QoS slices.
#[tokio::test]
async fn standalone_slice_name_parent_resolves_to_its_expanded_directory() {
    let root = tempfile::tempdir().unwrap();
    let env = Containerd::from_env();
    let label = ("test".to_string(), unique("slice"));
    let mut rt = runtime_client(&env.socket);
    let (sandbox, container) = be_configs(&env, &[(&label.0, &label.1)], |uid| {
        format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"))
    });
    let dir = expanded(&sandbox.linux.as_ref().unwrap().cgroup_parent);
    let pod = Pod::start(&mut rt, sandbox, container).await.expect("pod with a slice name parent");
    let scope = format!("{dir}/cri-containerd-{}.scope", pod.container_id);
    systemd_tree(root.path(), &[dir.clone(), scope.clone()]);
    let rules = rules_file(root.path(), GROUP_IDENTITY_ON);
    let selector = format!("{}={}", label.0, label.1);
    let args = [
        "--mode",
        "standalone",
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
        "--cgroup-root",
        root.path().to_str().unwrap(),
        "--cgroup-version",
        "v1",
        "--unchecked-cgroup-root",
        "--cgroup-driver",
        "systemd",
        "--rules",
        rules.to_str().unwrap(),
        "--kubepods-cgroup",
        "kubepods.slice",
    ];
    let hooks = Hooks::start(&args, root.path().join("hooks.log"));
    let at = |ctrl: &str, d: &str| root.path().join(ctrl).join(d);
    assert!(
        eventually(Duration::from_secs(5), || values_in(&at("cpu", &scope), &at("memory", &scope)) == be_values()),
        "container {:?}\n{}",
        values_in(&at("cpu", &scope), &at("memory", &scope)),
        hooks.log()
    );
    assert_eq!(values_in(&at("cpu", &dir), &at("memory", &dir)), be_values(), "pod");
    assert_eq!(read(&at("cpu", &dir), "cpu.bvt_warp_ns"), "-1");
    assert_eq!(read(&at("cpu", "kubepods.slice"), "cpu.bvt_warp_ns"), "0");
    assert_eq!(read(&at("cpu", "kubepods.slice/kubepods-burstable.slice"), "cpu.bvt_warp_ns"), "2");
    assert_eq!(read(&at("cpu", "kubepods.slice/kubepods-besteffort.slice"), "cpu.bvt_warp_ns"), "-1");
    assert!(hooks.log().contains("cgroup_driver=systemd (--cgroup-driver)"), "{}", hooks.log());
    assert!(!hooks.log().contains("reconcile: "), "no failure:\n{}", hooks.log());
    pod.remove(&mut rt).await;
}

/// `--kubepods-cgroup` is checked at start: a relative value is refused (exit 2, naming it)
/// unless it is a slice name under the systemd (or auto) driver.
#[test]
fn kubepods_cgroup_is_checked_at_start() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("cpu")).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--mode",
            "standalone",
            "--runtime-endpoint",
            "/nonexistent/containerd.sock",
            "--cgroup-root",
            root.path().to_str().unwrap(),
            "--cgroup-version",
            "v1",
            "--unchecked-cgroup-root",
        ];
        args.extend_from_slice(extra);
        let log = root.path().join(format!("hooks-{}.log", unique("k")));
        Hooks::start(&args, log)
    };
    for (bad, why) in [
        (&["--kubepods-cgroup", "kubepods"][..], "neither an absolute path nor a systemd slice name"),
        (&["--kubepods-cgroup", "kubepods.slice", "--cgroup-driver", "cgroupfs"][..], "cgroup driver is cgroupfs"),
        (&["--kubepods-cgroup", "kubepods/besteffort", "--cgroup-driver", "systemd"][..], "neither"),
        (&["--kubepods-cgroup", "/", "--cgroup-driver", "systemd"][..], "not a cgroup below the root"),
    ] {
        let mut h = run(bad);
        assert!(
            h.wait_log(&["runtime-hooks stopped: --kubepods-cgroup", why], 0, Duration::from_secs(5)),
            "{bad:?}\n{}",
            h.log()
        );
        assert_eq!(h.terminate(), Some(2), "{bad:?}: exited\n{}", h.log());
    }
    for good in [
        &["--kubepods-cgroup", "kubepods.slice", "--cgroup-driver", "systemd"][..],
        &["--kubepods-cgroup", "kubepods.slice"][..],
        &["--kubepods-cgroup", "/kubepods", "--cgroup-driver", "cgroupfs"][..],
    ] {
        let mut h = run(good);
        // The reconciler's first words come after the signal handlers are in place.
        assert!(
            h.wait_log(&["ListPodSandbox", "/nonexistent/containerd.sock"], 0, Duration::from_secs(5)),
            "{good:?}\n{}",
            h.log()
        );
        assert_eq!(h.terminate(), Some(0), "{good:?}\n{}", h.log());
    }
}
