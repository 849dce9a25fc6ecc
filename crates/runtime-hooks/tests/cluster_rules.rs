//! Rules from the cluster, end to end: real containerd, the real runtime-hooks binary started with
//! `--kubeconfig` pointing at the loopback API stand-in (`test_support::kube_api`, which answers
//! as the recorded kube-apiserver v1.31 does), in proxy mode (behind the real runtime-proxy) and
//! standalone mode. A NodeSLO change reaches a running pod's cgroup files; an NRT share-pool
//! change moves an LS pod's cpuset; the API server going away and coming back keeps the rules
//! and resumes the watches. (NRI mode: `nri_mode.rs`, which runs against a containerd with NRI.)

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use test_support::containerd::{unique, Containerd, Pod};
use test_support::kube_api::KubeApi;
use test_support::proxy::ProxyProcess;
use test_support::runtime_client;

const NODE: &str = "node-a";

fn node_slo(policy: &str) -> Value {
    json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": NODE},
        "spec": {"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressThresholdPercent": 65, "cpuSuppressPolicy": policy}}})
}

fn nrt(pools: &str) -> Value {
    json!({"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
        "metadata": {"name": NODE, "annotations": {
            "node.koordinator.sh/cpu-shared-pools": format!(r#"[{{"socket":0,"node":0,"cpuset":"{pools}"}}]"#),
            "kubelet.koordinator.sh/cpu-manager-policy": r#"{"policy":"none"}"#}},
        "topologyPolicies": ["None"], "zones": []})
}

/// The API stand-in with the node, and runtime-hooks pointed at it (mode flags in `mode`), its
/// pods selected by a unique label; returns once the NodeSLO watch is up.
struct Cluster {
    api: KubeApi,
    env: Containerd,
    dir: tempfile::TempDir,
    hooks: Hooks,
    proxy: Option<ProxyProcess>,
    label: (String, String),
}

async fn start(proxy: bool, objects: &[Value]) -> Cluster {
    let env = Containerd::from_env();
    let api = KubeApi::start().await;
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    for o in objects {
        api.create(o.clone());
    }
    let dir = tempfile::Builder::new().prefix("rh-cluster").tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let label = ("test".to_string(), unique("cluster"));
    let selector = format!("{}={}", label.0, label.1);
    let conf = dir.path().join("hookserver.d");
    let socket = dir.path().join("runtime-hooks.sock");
    let mut args = vec![
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--selector",
        &selector,
    ];
    let proxy = if proxy {
        std::fs::create_dir(&conf).unwrap();
        let bin = test_support::workspace_binary("runtime-proxy");
        let p = ProxyProcess::start(bin.to_str().unwrap(), &env.socket, &["--hook-config-dir", conf.to_str().unwrap()]);
        // Only at start and on rule changes: what moves a running pod here is the rule callback.
        args.extend([
            "--listen",
            socket.to_str().unwrap(),
            "--hook-config-dir",
            conf.to_str().unwrap(),
            "--reconcile-interval",
            "0s",
        ]);
        Some(p)
    } else {
        args.extend(["--mode", "standalone", "--reconcile-interval", "1s"]);
        None
    };
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(
        hooks.wait_log(&["watching the node's NodeSLO"], 0, Duration::from_secs(15)),
        "no NodeSLO watch:\n{}",
        hooks.log()
    );
    if let Some(p) = &proxy {
        assert!(
            p.wait_log(&["hook server added", "file=runtime-hooks.json"], 0),
            "proxy did not take up runtime-hooks.json\n{}",
            p.log()
        );
    }
    Cluster { api, env, dir, hooks, proxy, label }
}

impl Cluster {
    /// A pod with the test's label, through the proxy when there is one, else on containerd.
    async fn pod(&self, labels: &[(&str, &str)], annotations: &[(&str, &str)], besteffort_parent: bool) -> Pod {
        let socket = self.proxy.as_ref().map(|p| p.socket().to_owned()).unwrap_or_else(|| self.env.socket.clone());
        let mut rt = runtime_client(&socket);
        let mut labels = labels.to_vec();
        labels.push((&self.label.0, &self.label.1));
        let (mut sandbox, container) = pod_configs(&self.env, &labels, annotations);
        if besteffort_parent {
            sandbox = besteffort(sandbox);
        }
        precreate_pod_cgroup(&sandbox.linux.as_ref().unwrap().cgroup_parent);
        Pod::start(&mut rt, sandbox, container).await.unwrap_or_else(|e| panic!("pod: {e:?}\n{}", self.hooks.log()))
    }

    async fn remove(&self, pod: Pod) {
        pod.remove(&mut runtime_client(&self.env.socket)).await;
    }

    /// Waits until the pod's container and pod cgroup both have `want` as CFS quota.
    fn quota_becomes(&self, pod: &Pod, want: &str, what: &str) {
        let parent = pod.cgroup_parent();
        let ok = eventually(Duration::from_secs(5), || {
            pod.cgroup_file("cpu", "cpu.cfs_quota_us") == want && cgroup("cpu", &parent, "cpu.cfs_quota_us") == want
        });
        assert!(
            ok,
            "{what}: container quota {}, pod quota {}, want {want}\n{}",
            pod.cgroup_file("cpu", "cpu.cfs_quota_us"),
            cgroup("cpu", &parent, "cpu.cfs_quota_us"),
            self.hooks.log()
        );
    }

    async fn be_quota_follows_the_node_slo(&self) {
        // At creation: suppression by cfsQuota is on, BE quotas are left unlimited.
        let pod = self.pod(&[(QOS, "BE")], &[(SPEC, BE_SPEC)], true).await;
        let shares = eventually(Duration::from_secs(5), || pod.cgroup_file("cpu", "cpu.shares") == "512");
        assert!(shares, "BatchResource applied: shares {}\n{}", pod.cgroup_file("cpu", "cpu.shares"), self.hooks.log());
        self.quota_becomes(&pod, "-1", "created under cfsQuota suppression");
        // Patched: the cpuset policy; the running pod gets its batch-cpu limit as quota.
        self.api.merge_patch(
            "nodeslos",
            None,
            NODE,
            json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuset"}}}),
        );
        self.quota_becomes(&pod, "100000", "after the patch to the cpuset policy");
        self.api.merge_patch(
            "nodeslos",
            None,
            NODE,
            json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cfsQuota"}}}),
        );
        self.quota_becomes(&pod, "-1", "after the patch back to cfsQuota");

        // A version that does not parse: reported (log, Event on the Node), the last good kept.
        self.api.merge_patch(
            "nodeslos",
            None,
            NODE,
            json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "bogus"}}}),
        );
        let ok =
            eventually(Duration::from_secs(5), || self.api.events().iter().any(|e| e["reason"] == "RuleParseFailed"));
        assert!(ok, "no RuleParseFailed Event\n{}", self.hooks.log());
        let event = self.api.events().into_iter().find(|e| e["reason"] == "RuleParseFailed").unwrap();
        assert_eq!(event["involvedObject"]["kind"], "Node");
        assert!(
            event["message"].as_str().unwrap().contains("spec.resourceUsedThresholdWithBE.cpuSuppressPolicy"),
            "{event}"
        );
        assert!(
            self.hooks.log().contains("unknown value \\\"bogus\\\"")
                || self.hooks.log().contains("unknown value \"bogus\""),
            "{}",
            self.hooks.log()
        );
        assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1", "the last good NodeSLO stays");

        // The API server goes away: the rules in force stay; it comes back: the watch resumes.
        self.api.stop().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(pod.cgroup_file("cpu", "cpu.cfs_quota_us"), "-1", "API server away: rules kept");
        self.api.restart().await;
        // Deleted (after the restart): back to koordlet's defaults, quotas from the limit.
        self.api.delete("nodeslos", None, NODE);
        self.quota_becomes(&pod, "100000", "after the NodeSLO's deletion, through a restarted API server");
        let log = self.hooks.log();
        assert!(log.contains("rules changed"), "{log}");
        self.remove(pod).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_mode_be_quota_follows_the_node_slo() {
    let c = start(true, &[node_slo("cfsQuota")]).await;
    c.be_quota_follows_the_node_slo().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_mode_be_quota_follows_the_node_slo() {
    let c = start(false, &[node_slo("cfsQuota")]).await;
    c.be_quota_follows_the_node_slo().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_mode_ls_cpuset_follows_the_share_pool() {
    let c = start(true, &[nrt("0")]).await;
    assert!(
        c.hooks.wait_log(&["watching the node's NodeResourceTopology"], 0, Duration::from_secs(10)),
        "{}",
        c.hooks.log()
    );
    let pod = c.pod(&[(QOS, "LS")], &[], false).await;
    assert_eq!(
        pod.cgroup_file("cpuset", "cpuset.cpus"),
        "0",
        "LS pod on the share pool at creation\n{}",
        c.hooks.log()
    );
    c.api.merge_patch(
        "noderesourcetopologies",
        None,
        NODE,
        json!({"metadata": {"annotations": {"node.koordinator.sh/cpu-shared-pools": r#"[{"socket":0,"node":0,"cpuset":"1"}]"#}}}),
    );
    let ok = eventually(Duration::from_secs(5), || pod.cgroup_file("cpuset", "cpuset.cpus") == "1");
    assert!(ok, "cpuset {} after the pool moved\n{}", pod.cgroup_file("cpuset", "cpuset.cpus"), c.hooks.log());
    c.remove(pod).await;
    let _ = &c.dir;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_server_at_start_serves_the_file_then_takes_the_cluster() {
    // The stand-in is stopped before runtime-hooks starts: hooks are served with the file's
    // NodeSLO (cfsQuota suppression), then the cluster's (no NodeSLO: koordlet's defaults).
    let env = Containerd::from_env();
    let api = KubeApi::start().await;
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let dir = tempfile::Builder::new().prefix("rh-cluster").tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    api.stop().await;
    let rules = rules_file(dir.path(), &serde_norway::to_string(&node_slo("cfsQuota")).unwrap());
    let label = ("test".to_string(), unique("cluster"));
    let selector = format!("{}={}", label.0, label.1);
    let args = [
        "--mode",
        "standalone",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--rules",
        rules.to_str().unwrap(),
        "--runtime-endpoint",
        env.socket.to_str().unwrap(),
        "--reconcile-interval",
        "1s",
        "--selector",
        &selector,
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["keeping the rules in force"], 0, Duration::from_secs(10)), "{}", hooks.log());
    let c = Cluster { api, env, dir, hooks, proxy: None, label };
    let pod = c.pod(&[(QOS, "BE")], &[(SPEC, BE_SPEC)], true).await;
    c.quota_becomes(&pod, "-1", "the file's NodeSLO while the API server is away");
    c.api.restart().await;
    c.quota_becomes(&pod, "100000", "the cluster (no NodeSLO) once it answers");
    c.remove(pod).await;
}

/// The first scrape after runtime-hooks starts following the cluster (no containerd needed: proxy
/// mode, no pod): the series of every object it watches and of the cluster as a rule source are
/// there at 0 before any error or change, so a dashboard shows 0 and `increase()` sees the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_scrape_has_each_watched_objects_series_at_zero() {
    let api = KubeApi::start().await;
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let dir = tempfile::Builder::new().prefix("rh-cluster").tempdir().unwrap();
    let kubeconfig = api.kubeconfig(dir.path());
    let (socket, conf) = (dir.path().join("runtime-hooks.sock"), dir.path().join("hookserver.d"));
    let args = [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--node-name",
        NODE,
        "--listen",
        socket.to_str().unwrap(),
        "--hook-config-dir",
        conf.to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
    ];
    let hooks = Hooks::start(&args, dir.path().join("hooks.log"));
    assert!(hooks.wait_log(&["admin endpoint"], 0, Duration::from_secs(10)), "no admin endpoint:\n{}", hooks.log());
    let log = hooks.log();
    let line = log.lines().find(|l| l.contains("admin endpoint")).unwrap_or_default();
    let addr = line.split("addr=").nth(1).and_then(|a| a.split_whitespace().next()).unwrap_or_default().to_owned();
    let (code, text) = test_support::http_get(&addr, "/metrics");
    assert_eq!(code, 200);
    for object in ["NodeSLO", "NodeResourceTopology", "Node"] {
        let series = format!("runtime_hooks_rule_errors_total{{object=\"{object}\"}} 0");
        assert!(text.contains(&series), "{series} missing:\n{text}");
    }
    for object in ["NodeSLO", "NodeResourceTopology", "Node", "Pod"] {
        for family in ["runtime_hooks_cluster_watch_errors_total", "runtime_hooks_cluster_synced"] {
            let series = format!("{family}{{object=\"{object}\"}} ");
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
    }
    assert!(text.contains("runtime_hooks_rule_changes_total{source=\"cluster\"} "), "{text}");
    assert!(!text.contains("runtime_hooks_rule_errors_total{object=\"Pod\"}"), "a pod is not a rule:\n{text}");
}
