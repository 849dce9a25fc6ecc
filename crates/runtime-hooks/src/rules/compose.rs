//! [`Rules::compose`]: the policy in force from a base and the parsed inputs. Beside the inputs'
//! parsers rather than in the rules' facade, which the parsers read their types from.

use super::{node, node_slo, topology, Rules};

impl Rules {
    /// The rules from a base (koordlet's defaults, or a deprecated old-format file) and the
    /// parsed inputs: the NodeSLO's settings replace the base's group identity and BatchResource
    /// CFS quota switch, the topology the CPU pools, the Node its normalization ratio.
    pub fn compose(
        base: &Rules,
        slo: Option<&node_slo::SloRules>,
        topology: Option<&topology::Topology>,
        node: Option<&node::NodeRules>,
    ) -> Rules {
        let mut rules = base.clone();
        if let Some(slo) = slo {
            rules.group_identity = slo.group_identity.clone();
            rules.batch_resource.cfs_quota = slo.batch_cfs_quota;
            rules.host_applications.clone_from(&slo.host_applications);
            rules.net_qos = slo.net_qos.clone();
            rules.core_sched = slo.core_sched.clone();
        }
        if let Some(t) = topology {
            rules.cpuset.topology = t.clone();
        }
        if let Some(n) = node {
            rules.batch_resource.cpu_normalization_ratio = n.cpu_normalization_ratio;
            rules.cpu_normalization.ratio = n.cpu_normalization_ratio;
        }
        rules
    }
}
