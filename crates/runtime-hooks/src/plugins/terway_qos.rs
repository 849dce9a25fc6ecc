//! TerwayQoS: the QoS files Terway's `terway-qos` reads, from the NodeSLO and every pod
//! (koordlet's `hooks/terwayqos`, gate `TerwayQoS`).
//!
//! # Inputs and outputs
//!
//! | | |
//! |---|---|
//! | inputs | the NodeSLO's network QoS ([`crate::rules::net_qos`]); pod label `koordinator.sh/qosClass`, pod annotation `koordinator.sh/networkQOS` (as [`super::tc::pod_bandwidth`]), the pod cgroup |
//! | outputs | `<dir>/global_bps_config` and `<dir>/pod.json`, `<dir>` = `--terway-qos-dir` (koordlet's `/host-var-lib/terway/qos`) |
//! | stages | none: node-level work only (koordlet: NodeSLO and all-pods rule callbacks) |
//! | rules | `netQOSPolicy: terway-qos`; any other policy removes both files |
//!
//! Files are written only when their content changes.
//!
//! # `global_bps_config`
//!
//! One `name value` line each, bytes/s, in this order: `hw_tx_bps_max`, `hw_rx_bps_max` (both
//! `totalNetworkBandwidth` / 8), `offline_l1_tx_bps_min` (LS egress request),
//! `offline_l1_tx_bps_max` (LS egress limit), `offline_l1_rx_bps_min`, `offline_l1_rx_bps_max`
//! (LS ingress), then `offline_l2_…` the same for BE. A class whose `networkQOS` is off has 0s. A
//! quantity is bits/s (÷ 8), a percentage of the total.
//!
//! # `pod.json`
//!
//! A JSON object by pod UID (sorted, as Go marshals maps) of `{"podName", "podNamespace",
//! "podUID", "prio", "cgroupDir", "qosConfig": {"ingressBandwidth", "egressBandwidth"}}`:
//!
//! * prio 0 for SYSTEM, 1 for LSE/LSR/LS, 2 for BE, else by Kubernetes QoS (Guaranteed,
//!   Burstable 1; BestEffort 2);
//! * `cgroupDir` = `/sys/fs/cgroup/net_cls` + the pod's cgroup directory;
//! * bandwidths in bytes/s from the annotation.
//!
//! # Errors
//!
//! The rule is checked as koordlet checks it: a quantity above the total is an error and the
//! files are left as they were. A pod whose annotation does not parse is left out of `pod.json`
//! (logged once per distinct error); the others are written.
//!
//! # Where koordlet differs
//!
//! * a percentage is of the total in bytes/s (koordlet multiplies the total in bits/s, giving
//!   values 8 times too large next to `hw_*`);
//! * a quantity is compared with the total in bytes/s;
//! * a missing annotation field is `"0"` (koordlet's Terway hook fails the pod then, its TC hook
//!   reads `"0"`);
//! * files are not created empty first.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{anyhow, Context};
use serde::Serialize;

use super::tc::pod_bandwidth;
use crate::context::{KubeQos, QosClass};
use crate::host::Host;
use crate::plugin::{NodePods, Plugin, PodState, Stage};
use crate::rules::net_qos::{Bandwidth, ClassBandwidth, NetQosPolicy, NetQosRules};
use crate::rules::Rules;

/// koordlet's directory for the files.
pub const DEFAULT_DIR: &str = "/host-var-lib/terway/qos";
/// The node file.
pub const NODE_FILE: &str = "global_bps_config";
/// The pods file.
pub const POD_FILE: &str = "pod.json";

/// One pod's entry in `pod.json` (koordlet's `terwayqos.Pod`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodEntry {
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// 0 SYSTEM, 1 latency-sensitive, 2 best effort.
    pub prio: u8,
    /// `/sys/fs/cgroup/net_cls/<pod cgroup>`.
    pub cgroup_dir: String,
    /// Bandwidths, bytes/s.
    pub qos_config: QosConfig,
}

/// A pod's bandwidths (koordlet's `terwayqos.QoSConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QosConfig {
    /// Ingress limit, bytes/s (0: none).
    pub ingress_bandwidth: u64,
    /// Egress limit, bytes/s (0: none).
    pub egress_bandwidth: u64,
}

/// The TerwayQoS plugin; remembers the pod errors already logged.
#[derive(Debug, Default)]
pub struct TerwayQos {
    logged: Mutex<BTreeSet<String>>,
}

impl TerwayQos {
    /// The plugin's name (koordlet's gate).
    pub const NAME: &'static str = "TerwayQoS";

    /// `global_bps_config`'s text for `rules`.
    ///
    /// Errors: an LS or BE quantity above the total (naming it).
    pub fn node_config(rules: &NetQosRules) -> anyhow::Result<String> {
        let total = rules.total_bandwidth / 8;
        let value = |b: Bandwidth, what: &str| -> anyhow::Result<u64> {
            match b {
                Bandwidth::Percent(p) => Ok((total as u128 * p as u128 / 100) as u64),
                Bandwidth::Quantity(q) if q / 8 > total => Err(anyhow!(
                    "{what}: {} bytes/s is more than the total {total} bytes/s (totalNetworkBandwidth)",
                    q / 8
                )),
                Bandwidth::Quantity(q) => Ok(q / 8),
            }
        };
        let class = |c: Option<ClassBandwidth>, name: &str| -> anyhow::Result<[u64; 4]> {
            let Some(c) = c else { return Ok([0; 4]) };
            Ok([
                value(c.egress_request, &format!("{name}.networkQOS.egressRequest"))?,
                value(c.egress_limit, &format!("{name}.networkQOS.egressLimit"))?,
                value(c.ingress_request, &format!("{name}.networkQOS.ingressRequest"))?,
                value(c.ingress_limit, &format!("{name}.networkQOS.ingressLimit"))?,
            ])
        };
        let (l1, l2) = (class(rules.ls, "lsClass")?, class(rules.be, "beClass")?);
        let mut text = format!("hw_tx_bps_max {total}\nhw_rx_bps_max {total}\n");
        for (level, v) in [("l1", l1), ("l2", l2)] {
            for (name, v) in ["tx_bps_min", "tx_bps_max", "rx_bps_min", "rx_bps_max"].iter().zip(v) {
                let _ = writeln!(text, "offline_{level}_{name} {v}");
            }
        }
        Ok(text)
    }

    /// A pod's entry (module documentation).
    ///
    /// Errors: its annotation does not parse.
    pub fn pod_entry(state: &PodState) -> anyhow::Result<PodEntry> {
        let pod = &state.pod;
        let (ingress, egress) = pod_bandwidth(pod)?;
        let prio = match pod.qos() {
            QosClass::System => 0,
            QosClass::Lse | QosClass::Lsr | QosClass::Ls => 1,
            QosClass::Be => 2,
            QosClass::None => match pod.kube_qos() {
                KubeQos::Guaranteed | KubeQos::Burstable => 1,
                KubeQos::BestEffort => 2,
            },
        };
        let dir = state.cgroup_dir.as_deref().unwrap_or_default().trim_start_matches('/');
        let cgroup_dir = Path::new("/sys/fs/cgroup/net_cls").join(dir).display().to_string();
        Ok(PodEntry {
            pod_name: pod.name.clone(),
            pod_namespace: pod.namespace.clone(),
            pod_uid: pod.uid.clone(),
            prio,
            cgroup_dir,
            qos_config: QosConfig { ingress_bandwidth: ingress, egress_bandwidth: egress },
        })
    }

    /// The directory of the files on `host`.
    pub fn dir(host: &Host) -> PathBuf {
        match &host.paths.terway_qos_dir {
            d if d.as_os_str().is_empty() => PathBuf::from(DEFAULT_DIR),
            d => d.clone(),
        }
    }
}

/// Writes `text` to `path` unless it already holds it.
fn write_if_changed(path: &Path, text: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(());
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

impl Plugin for TerwayQos {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn stages(&self) -> &'static [Stage] {
        &[]
    }

    fn node(&self, pods: &NodePods<'_>, rules: &Rules, host: &Host) -> anyhow::Result<()> {
        let dir = Self::dir(host);
        let (node_file, pod_file) = (dir.join(NODE_FILE), dir.join(POD_FILE));
        if rules.net_qos.policy != NetQosPolicy::TerwayQos {
            for f in [&node_file, &pod_file] {
                match std::fs::remove_file(f) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(anyhow!("removing {}: {e}", f.display()))
                    }
                    _ => {}
                }
            }
            return Ok(());
        }
        let node = Self::node_config(&rules.net_qos)?;
        let mut entries = BTreeMap::new();
        for state in pods {
            match Self::pod_entry(state) {
                Ok(e) => {
                    entries.insert(e.pod_uid.clone(), e);
                }
                Err(e) => {
                    let msg = format!("pod {}: {e:#}; left out of {POD_FILE}", state.pod.key());
                    if self.logged.lock().unwrap_or_else(|e| e.into_inner()).insert(msg.clone()) {
                        tracing::warn!(plugin = Self::NAME, "{msg}");
                    }
                }
            }
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        write_if_changed(&node_file, &node)?;
        write_if_changed(&pod_file, &serde_json::to_string(&entries)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{PodContext, QOS_CLASS_KEY};
    use crate::host::HostPaths;
    use crate::plugins::tc::NETWORK_QOS;

    fn pod(uid: &str, class: Option<&str>, qos: Option<&str>, parent: &str) -> PodState {
        let mut p = PodContext {
            uid: uid.into(),
            name: format!("n-{uid}"),
            namespace: "ns".into(),
            cgroup_parent: parent.into(),
            ..Default::default()
        };
        if let Some(c) = class {
            p.labels.insert(QOS_CLASS_KEY.into(), c.into());
        }
        if let Some(q) = qos {
            p.annotations.insert(NETWORK_QOS.into(), q.into());
        }
        PodState { pod: p, cgroup_dir: Some(parent.into()), containers: Vec::new() }
    }

    fn rules(policy: &str) -> Rules {
        let spec = serde_json::json!({
            "systemStrategy": {"totalNetworkBandwidth": "800M"},
            "resourceQOSStrategy": {
                "policies": {"netQOSPolicy": policy},
                "lsClass": {"networkQOS": {"enable": true, "ingressRequest": "80M", "ingressLimit": 100, "egressRequest": 50, "egressLimit": "400M"}},
            }
        });
        Rules::compose(&Rules::default(), Some(&crate::rules::node_slo::parse(&spec).unwrap()), None, None)
    }

    fn host(dir: &Path) -> Host {
        Host { paths: HostPaths { terway_qos_dir: dir.to_owned(), ..Default::default() }, ..Default::default() }
    }

    #[test]
    fn files_follow_the_rule_and_the_pods() {
        let t = tempfile::tempdir().unwrap();
        let h = host(t.path());
        let p = TerwayQos::default();
        let ls =
            pod("u1", Some("LS"), Some(r#"{"ingressLimit": "8M", "egressLimit": "16M"}"#), "/kubepods/burstable/podu1");
        let be = pod("u2", None, None, "/kubepods/besteffort/podu2");
        p.node(&NodePods::given(&[ls.clone(), be.clone()]), &rules("terway-qos"), &h).unwrap();
        let node = std::fs::read_to_string(t.path().join(NODE_FILE)).unwrap();
        assert_eq!(
            node,
            "hw_tx_bps_max 100000000\nhw_rx_bps_max 100000000\n\
             offline_l1_tx_bps_min 50000000\noffline_l1_tx_bps_max 50000000\n\
             offline_l1_rx_bps_min 10000000\noffline_l1_rx_bps_max 100000000\n\
             offline_l2_tx_bps_min 0\noffline_l2_tx_bps_max 0\noffline_l2_rx_bps_min 0\noffline_l2_rx_bps_max 0\n"
        );
        let pods: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(t.path().join(POD_FILE)).unwrap()).unwrap();
        assert_eq!(
            pods,
            serde_json::json!({
                "u1": {"podName": "n-u1", "podNamespace": "ns", "podUID": "u1", "prio": 1,
                       "cgroupDir": "/sys/fs/cgroup/net_cls/kubepods/burstable/podu1",
                       "qosConfig": {"ingressBandwidth": 1_000_000, "egressBandwidth": 2_000_000}},
                "u2": {"podName": "n-u2", "podNamespace": "ns", "podUID": "u2", "prio": 2,
                       "cgroupDir": "/sys/fs/cgroup/net_cls/kubepods/besteffort/podu2",
                       "qosConfig": {"ingressBandwidth": 0, "egressBandwidth": 0}},
            })
        );

        // A pod goes; a bad annotation skips only that pod.
        let bad = pod("u3", Some("BE"), Some(r#"{"egressLimit": "lots"}"#), "/kubepods/besteffort/podu3");
        p.node(&NodePods::given(&[be.clone(), bad]), &rules("terway-qos"), &h).unwrap();
        let pods: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(t.path().join(POD_FILE)).unwrap()).unwrap();
        assert_eq!(pods.as_object().unwrap().keys().collect::<Vec<_>>(), ["u2"]);
        assert_eq!(p.logged.lock().unwrap().len(), 1);

        // Another policy removes the files.
        p.node(&NodePods::given(&[be]), &rules("tc"), &h).unwrap();
        assert!(!t.path().join(NODE_FILE).exists() && !t.path().join(POD_FILE).exists());
    }

    #[test]
    fn a_quantity_above_the_total_leaves_the_files() {
        let t = tempfile::tempdir().unwrap();
        let mut r = rules("terway-qos");
        r.net_qos.ls.as_mut().unwrap().egress_limit = Bandwidth::Quantity(1_000_000_000);
        let e = TerwayQos::default().node(&NodePods::given(&[]), &r, &host(t.path())).unwrap_err();
        assert!(e.to_string().contains("lsClass.networkQOS.egressLimit"), "{e}");
        assert!(!t.path().join(NODE_FILE).exists());
    }

    #[test]
    fn prio_by_class_then_kube_qos_and_the_default_dir() {
        for (class, parent, want) in [
            (Some("SYSTEM"), "/kubepods/podx", 0),
            (Some("LSE"), "/kubepods/besteffort/podx", 1),
            (None, "/kubepods/podx", 1),
            (None, "/kubepods/burstable/podx", 1),
        ] {
            assert_eq!(TerwayQos::pod_entry(&pod("x", class, None, parent)).unwrap().prio, want, "{class:?} {parent}");
        }
        assert_eq!(TerwayQos::dir(&Host::default()), PathBuf::from(DEFAULT_DIR));
    }
}
