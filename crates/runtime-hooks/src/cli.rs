//! Command-line flags of the `runtime-hooks` binary.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::cgroup::CgroupVersion;
use crate::cgroup_path::CgroupDriver;
use crate::cpu_weight::WeightFormula;
use crate::plugin::FailurePolicy;

/// How the policies reach the pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Serve `runtime.v1alpha1` hooks to runtime-proxy, which applies the answers before the
    /// runtime creates anything.
    Proxy,
    /// No proxy: list pods from the CRI runtime and write their cgroup files directly.
    Standalone,
    /// No proxy: an NRI plugin of the runtime (containerd >= 1.7 with NRI enabled), called at
    /// pod and container events; container changes are NRI adjustments and updates.
    Nri,
}

/// `--cgroup-version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CgroupVersionArg {
    /// Detect from the file system type of `--cgroup-root`.
    Auto,
    /// cgroup v1 (legacy or hybrid).
    V1,
    /// cgroup v2 (unified).
    V2,
}

impl CgroupVersionArg {
    /// The explicit version, `None` for auto.
    pub fn version(&self) -> Option<CgroupVersion> {
        match self {
            CgroupVersionArg::Auto => None,
            CgroupVersionArg::V1 => Some(CgroupVersion::V1),
            CgroupVersionArg::V2 => Some(CgroupVersion::V2),
        }
    }
}

/// `--cgroup-driver`: how the node names cgroups (kubelet's and the runtime's cgroup driver).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CgroupDriverArg {
    /// Ask the runtime (CRI `RuntimeConfig`, when there is a runtime endpoint and it answers);
    /// otherwise each cgroup name's form decides (`….slice`: systemd, other paths: cgroupfs).
    Auto,
    /// systemd: slices and scopes (`kubepods-besteffort-pod<uid>.slice`).
    Systemd,
    /// cgroupfs: absolute paths (`/kubepods/besteffort/pod<uid>`).
    Cgroupfs,
}

impl CgroupDriverArg {
    /// The explicit driver, `None` for auto.
    pub fn driver(&self) -> Option<CgroupDriver> {
        match self {
            CgroupDriverArg::Auto => None,
            CgroupDriverArg::Systemd => Some(CgroupDriver::Systemd),
            CgroupDriverArg::Cgroupfs => Some(CgroupDriver::Cgroupfs),
        }
    }
}

/// `--cpu-weight-formula`: how CPU shares become cgroup v2 `cpu.weight` ([`crate::cpu_weight`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightFormulaArg {
    /// The node runtime's: learned from the first running container whose shares and weight
    /// tell the formulas apart; runc's until then.
    Auto,
    /// koordlet's and runc < 1.3.2's: `1 + (shares − 2) × 9999 / 262142` (1024 → 39).
    Linear,
    /// runc ≥ 1.3.2's and crun ≥ 1.23's quadratic-in-log formula (1024 → 100).
    Runc,
}

impl WeightFormulaArg {
    /// The forced formula, `None` for auto.
    pub fn formula(&self) -> Option<WeightFormula> {
        match self {
            WeightFormulaArg::Auto => None,
            WeightFormulaArg::Linear => Some(WeightFormula::Linear),
            WeightFormulaArg::Runc => Some(WeightFormula::Runc),
        }
    }
}

/// `--version`: the crate version and the git revision it was built from (build.rs), e.g.
/// `0.1.0 (git 27cbb9f)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("GIT_REVISION"), ")");

/// What the binary does: serve (no subcommand: what the unit and the DaemonSet start), or one
/// of these.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Print the running server's state, read from its admin socket (--admin-socket; the TCP
    /// endpoint only when --metrics-addr is given): mode,
    /// plugins, stages, registration, the rule source and the rules in force, the reconciler's
    /// last pass. Exit 0: healthy; 1: something unhealthy (rules that do not parse, a failing
    /// watch or pass, a registration gone); 2: no status could be read.
    Status(daemon_support::status::StatusArgs),
}

/// All flags.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "runtime-hooks",
    version = VERSION,
    about = "Runtime hook server with koordlet's ten runtime-hook plugins behind its feature gates (GroupIdentity, \
             BatchResource and CPUSetAllocator on by default; CPUNormalization, CoreSched, GPUEnvInject, \
             RDMADeviceInject, Resctrl, TCNetworkQoS, TerwayQoS with --feature-gates): serves runtime.v1alpha1 hooks \
             to runtime-proxy, reconciles pod cgroups on its own, or runs as an NRI plugin.",
    long_about = None,
    disable_help_subcommand = true
)]
pub struct Args {
    /// `status`: print a running server's state. Without a subcommand runtime-hooks serves.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// `proxy`: serve hooks to runtime-proxy on --listen (and, with --runtime-endpoint, also
    /// re-apply rule changes to running pods); `standalone`: no proxy, reconcile the cgroups of
    /// the pods of --runtime-endpoint; `nri`: no proxy, an NRI plugin on --nri-socket.
    #[arg(long, value_enum, default_value = "proxy")]
    pub mode: Mode,

    /// NRI mode: the runtime's NRI socket (containerd: `socket_path` of
    /// `[plugins."io.containerd.nri.v1.nri"]`). Waited for when absent; re-dialled when closed.
    #[arg(long, value_name = "SOCKET", default_value = crate::nri::DEFAULT_SOCKET, value_parser = parse_unix_path)]
    pub nri_socket: PathBuf,

    /// NRI mode: the plugin's name, as the runtime logs it.
    #[arg(long, value_name = "NAME", default_value = "runtime-hooks")]
    pub nri_plugin_name: String,

    /// NRI mode: the plugin's index, two digits; plugins are called in ascending index order.
    #[arg(long, value_name = "NN", default_value = "50", value_parser = crate::nri::parse_plugin_index)]
    pub nri_plugin_index: String,

    /// Unix socket to serve hooks on (proxy mode). A stale socket is replaced, a live one never;
    /// the parent directory is created. `unix://` prefix optional.
    #[arg(long, value_name = "SOCKET", default_value = "/var/run/runtime-hooks/runtime-hooks.sock", value_parser = parse_unix_path)]
    pub listen: PathBuf,

    /// Where to register (proxy mode): `<DIR>/<--hook-name>.json` is written atomically at
    /// start, written again within a second when removed or taken over, and removed at shutdown
    /// if it still names this server.
    #[arg(long, value_name = "DIR", default_value = "/etc/runtime/hookserver.d")]
    pub hook_config_dir: PathBuf,

    /// Registration file name, without `.json`: a plain file name (not empty, no `/` or NUL,
    /// not `.` or `..`, not starting with `.`, at most 200 bytes).
    #[arg(long, value_name = "NAME", default_value = "runtime-hooks", value_parser = crate::proxy::server::parse_hook_name)]
    pub hook_name: String,

    /// `failure-policy` written into the registration: what runtime-proxy does when this server
    /// fails (`Fail`: refuse the CRI call; `Ignore`: go on without it).
    // The values' own texts describe a plugin's failure: hidden here, the line above says it.
    #[arg(long, value_enum, default_value = "Ignore", hide_possible_values = true)]
    pub failure_policy: FailurePolicy,

    /// What this server does when a plugin fails (`Fail`: answer the hook call with an error;
    /// `Ignore`: log, drop that plugin's change, run the others). koordlet's default is Ignore.
    #[arg(long, value_enum, default_value = "Ignore", hide_possible_values = true)]
    pub plugin_failure_policy: FailurePolicy,

    /// Which plugins run, as koordlet's feature gates: `Name=true,Other=false` over koordlet's
    /// defaults (GroupIdentity, BatchResource, CPUSetAllocator on); an unknown name is refused.
    #[arg(long, value_name = "GATES", default_value = "", value_parser = crate::feature_gates::FeatureGates::parse)]
    pub feature_gates: crate::feature_gates::FeatureGates,

    /// Deprecated (use --feature-gates): plugins to enable by name, comma-separated,
    /// case-insensitive (GroupIdentity, BatchResource, CPUSet); replaces the gates' choice.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub plugins: Option<Vec<String>>,

    /// Rules file (JSON if it ends in .json, else YAML): the node's NodeSLO (and optionally its
    /// NodeResourceTopology and Node) as `kubectl apply` takes them; watched and hot-reloaded.
    /// With a cluster, used until the API server answers. Without it: koordlet's defaults.
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,

    /// Take the rules from the cluster: the kubeconfig file to reach the API server with.
    /// Without it, in a pod (`KUBERNETES_SERVICE_HOST` set), the pod's service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// koordlet's flag: LSE/LSR pods bound to CPUs keep their CFS quota (pod and containers)
    /// instead of having it unset (−1). Applies over the rules from the file or the cluster.
    /// Go's bool syntax: `--disable-unset-cpu-quota` or `--disable-unset-cpu-quota=true|false`.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub disable_unset_cpu_quota: bool,

    /// Admin endpoint (`/metrics`, `/healthz`, `/status`): `IP:PORT`, `[IPv6]:PORT`,
    /// `localhost:PORT`, `:PORT` (every interface) or `off`. If it cannot be bound runtime-hooks
    /// does not start (exit 2). `status` asks this address only when it is given on status's
    /// command line (any local user can bind a free port; see --admin-socket).
    #[arg(
        long = "metrics-addr",
        value_name = "ADDR",
        default_value = "off",
        value_parser = daemon_support::addr::parse_metrics_addr,
        global = true
    )]
    pub metrics_addr: daemon_support::addr::MetricsAddr,

    /// Unix socket serving the admin routes (`/metrics`, `/healthz`, `/status`) to root only:
    /// mode 0600, in the directory of --listen, in every mode. `status` asks it first. Default:
    /// beside --listen, named after it (/var/run/runtime-hooks/runtime-hooks-admin.sock); `off`
    /// serves none. If it cannot be bound runtime-hooks does not start (exit 2).
    #[arg(long = "admin-socket", value_name = "PATH", value_parser = daemon_support::addr::parse_admin_socket, global = true)]
    pub admin_socket: Option<daemon_support::addr::AdminSocketFlag>,

    /// The node whose NodeSLO, NodeResourceTopology, Node and pods are watched.
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// The CRI runtime's socket, to list pods. Standalone: default
    /// /var/run/containerd/containerd.sock. Proxy mode: reconciles only when given.
    #[arg(long, value_name = "SOCKET", value_parser = parse_unix_path)]
    pub runtime_endpoint: Option<PathBuf>,

    /// How often the reconciler re-checks every pod (`10s`, `500ms`, `2m`, `1h`), counted from
    /// the end of a pass; `0s`: only at start and when the rules change.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub reconcile_interval: Duration,

    /// Reconcile only pods whose labels hold KEY=VALUE (repeatable: all must match).
    #[arg(long = "selector", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub selector: Vec<(String, String)>,

    /// kubelet's QoS cgroup root (cgroupfs: `/kubepods`; systemd: `kubepods.slice` or
    /// `/kubepods.slice`); when given, the reconciler also sets the QoS directories (`/kubepods`,
    /// `/kubepods/burstable`, `/kubepods/besteffort`; systemd: `/kubepods.slice`,
    /// `/kubepods.slice/kubepods-burstable.slice`, `/kubepods.slice/kubepods-besteffort.slice`).
    /// Checked at start: absolute, or a slice name under the systemd (or auto) driver.
    #[arg(long, value_name = "DIR")]
    pub kubepods_cgroup: Option<String>,

    /// Root of the cgroup file systems. Checked at start: a mounted, writable cgroup file
    /// system of --cgroup-version (cgroup2; or v1 controllers such as DIR/cpu), else exit 2.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,

    /// Where TerwayQoS writes Terway's QoS files (`global_bps_config`, `pod.json`): koordlet's
    /// path, a DaemonSet's mount of the host's /var/lib/terway/qos.
    #[arg(long, value_name = "DIR", default_value = "/host-var-lib/terway/qos")]
    pub terway_qos_dir: PathBuf,

    /// cgroup version of --cgroup-root.
    #[arg(long, value_enum, default_value = "auto")]
    pub cgroup_version: CgroupVersionArg,

    /// The resctrl mount, for the Resctrl plugin; when it has no `info/L3/cbm_mask` (not
    /// mounted, no L3 cache allocation) Resctrl logs that once and does nothing.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/resctrl")]
    pub resctrl_root: PathBuf,

    /// Skip the start-up check that --cgroup-root is a mounted cgroup file system: take it as
    /// a directory tree laid out like one (tests, a chroot). Needs --cgroup-version v1 or v2.
    #[arg(long)]
    pub unchecked_cgroup_root: bool,

    /// The node's cgroup driver. `auto`: asks the runtime at --runtime-endpoint (CRI
    /// `RuntimeConfig`, containerd 2.0 / CRI-O 1.28 and later); when there is none or it does
    /// not answer, each cgroup name's form decides (`….slice` and `<slice>:<prefix>:<id>` are
    /// systemd, other absolute paths cgroupfs).
    #[arg(long, value_enum, default_value = "auto")]
    pub cgroup_driver: CgroupDriverArg,

    /// How CPU shares become cgroup v2 `cpu.weight` where runtime-hooks writes it (pod level;
    /// containers in standalone mode) and compares it: `auto` learns the runtime's own from a
    /// running container (runc's formula until then), `linear` is koordlet's (runc < 1.3.2),
    /// `runc` runc ≥ 1.3.2's. One formula per node, so runtime-hooks never fights the runtime.
    #[arg(long, value_enum, default_value = "auto")]
    pub cpu_weight_formula: WeightFormulaArg,

    /// RDMADeviceInject: where the host's root file system is seen; the plugin reads
    /// `DIR/sys/bus/pci/devices/<pci>/infiniband_verbs/` and stats `DIR/dev/infiniband/…`
    /// (koordlet: fixed `/`). The device paths given to containers stay `/dev/infiniband/…`.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub device_host_root: PathBuf,

    /// GPUEnvInject: the HAMi-core library (koordlet's flag and default), set as `LD_PRELOAD`
    /// and bind-mounted into HAMi-core containers that share a GPU.
    #[arg(long, value_name = "PATH", default_value = crate::plugins::devices::DEFAULT_HAMI_CORE_LIBRARY)]
    pub hami_core_library_directory_path: String,

    /// Liveness check, e.g. for a Kubernetes exec probe: instead of serving, make one hook call
    /// (PostStopPodSandboxHook, answered with the plain echo) to the server on --listen; exit 0
    /// when it answers within 2 s, 1 otherwise.
    #[arg(long)]
    pub probe: bool,

    /// The klog flags of koord's components (`--v`, `--logtostderr`, `--log-dir`, …): hidden,
    /// accepted with a deprecation notice; `--v` sets the log level, the others are ignored.
    #[command(flatten)]
    pub klog: daemon_support::klog::KlogFlags,
}

impl Args {
    /// The admin socket's path (`--admin-socket`, by default `NAME-admin.sock` beside
    /// `--listen`, NAME its socket's); `None`: off.
    pub fn admin_socket(&self) -> Option<PathBuf> {
        daemon_support::addr::AdminSocketFlag::resolve(self.admin_socket.as_ref(), &self.listen)
    }

    /// The runtime endpoint the reconciler uses, if it runs: always in standalone mode (default
    /// containerd's socket), in proxy mode only when given.
    pub fn reconcile_endpoint(&self) -> Option<PathBuf> {
        match (self.mode, &self.runtime_endpoint) {
            (_, Some(p)) => Some(p.clone()),
            (Mode::Standalone, None) => Some(PathBuf::from("/var/run/containerd/containerd.sock")),
            (Mode::Proxy | Mode::Nri, None) => None,
        }
    }

    /// The interval, `None` for `0s`.
    pub fn interval(&self) -> Option<Duration> {
        Some(self.reconcile_interval).filter(|d| !d.is_zero())
    }
}

pub use hook_api::parse_unix_path;

pub use daemon_support::duration::parse_duration;

/// `KEY=VALUE`.
pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("invalid selector {s:?}: expected KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let a = Args::parse_from(["runtime-hooks"]);
        assert_eq!(a.mode, Mode::Proxy);
        assert_eq!(a.hook_config_dir, PathBuf::from("/etc/runtime/hookserver.d"));
        assert_eq!(a.plugins, None);
        assert_eq!(a.feature_gates, crate::feature_gates::FeatureGates::default());
        assert_eq!(a.reconcile_interval, Duration::from_secs(10));
        assert_eq!(a.reconcile_endpoint(), None, "proxy mode reconciles only when asked");
        assert_eq!((a.failure_policy, a.plugin_failure_policy), (FailurePolicy::Ignore, FailurePolicy::Ignore));
        assert!(!a.disable_unset_cpu_quota, "koordlet's default: the quota of CPU-bound pods is unset");
        for (arg, want) in [
            ("--disable-unset-cpu-quota", true),
            ("--disable-unset-cpu-quota=true", true),
            ("--disable-unset-cpu-quota=false", false),
        ] {
            assert_eq!(Args::parse_from(["runtime-hooks", arg]).disable_unset_cpu_quota, want, "{arg}");
        }
        assert!(
            Args::parse_from(["runtime-hooks", "--disable-unset-cpu-quota", "status"]).command.is_some(),
            "`status` is no value"
        );
        let s = Args::parse_from(["runtime-hooks", "--mode", "standalone"]);
        assert_eq!(s.reconcile_endpoint(), Some(PathBuf::from("/var/run/containerd/containerd.sock")));
    }

    /// Without a subcommand the binary serves; `status` takes --metrics-addr before or after it.
    #[test]
    fn status_subcommand() {
        assert_eq!(Args::parse_from(["runtime-hooks", "--probe"]).command, None, "--probe stays a flag");
        let a = Args::parse_from(["runtime-hooks", "status", "--metrics-addr", "localhost:9319", "-o", "json"]);
        assert!(
            matches!(&a.command, Some(Command::Status(s)) if s.output == daemon_support::status::Output::Json),
            "{a:?}"
        );
        assert_eq!(a.metrics_addr.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9319"));
        let a = Args::parse_from(["runtime-hooks", "--metrics-addr", ":9319", "status"]);
        assert_eq!(a.metrics_addr.map(|a| a.to_string()).as_deref(), Some("0.0.0.0:9319"));
        assert_eq!(Args::parse_from(["runtime-hooks", "status"]).metrics_addr, None, "off unless given");
    }

    #[test]
    fn flags_parse() {
        let a = Args::parse_from([
            "runtime-hooks",
            "--mode",
            "standalone",
            "--runtime-endpoint",
            "unix:///run/c.sock",
            "--reconcile-interval",
            "0s",
            "--selector",
            "a=b",
            "--selector",
            "c=",
            "--plugins",
            "cpuset,BatchResource",
            "--plugin-failure-policy",
            "Fail",
            "--cgroup-version",
            "v2",
        ]);
        assert_eq!(a.reconcile_endpoint(), Some(PathBuf::from("/run/c.sock")));
        assert_eq!(a.interval(), None);
        assert_eq!(a.selector, [("a".to_string(), "b".to_string()), ("c".to_string(), String::new())]);
        assert_eq!(a.plugins.as_deref(), Some(&["cpuset".to_string(), "BatchResource".to_string()][..]));
        assert_eq!(a.plugin_failure_policy, FailurePolicy::Fail);
        assert_eq!(a.cgroup_version.version(), Some(CgroupVersion::V2));
        assert!(Args::try_parse_from(["runtime-hooks", "--mode", "koordlet"]).is_err());
        assert!(Args::try_parse_from(["runtime-hooks", "--selector", "novalue"]).is_err());
        assert!(Args::try_parse_from(["runtime-hooks", "--plugin-failure-policy", "fail"]).is_err());
        let g = Args::parse_from(["runtime-hooks", "--feature-gates", "GroupIdentity=false"]).feature_gates;
        assert!(!g.enabled("GroupIdentity") && g.enabled("BatchResource"));
        let e =
            Args::try_parse_from(["runtime-hooks", "--feature-gates", "BatchResorce=true"]).unwrap_err().to_string();
        assert!(e.contains("unknown feature gate \"BatchResorce\""), "{e}");
    }

    /// `--failure-policy` is the proxy's policy for this server: its help must not describe a
    /// plugin's failure (the value texts of the shared enum did), and no help names a module.
    #[test]
    fn help_texts_fit_their_flags() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        let section = |flag: &str| {
            let start = help.find(&format!("--{flag} <")).unwrap_or_else(|| panic!("{flag} in:\n{help}"));
            let rest = &help[start..];
            rest[..rest[2..].find("\n      --").map_or(rest.len(), |i| i + 2)].to_owned()
        };
        let policy = section("failure-policy");
        assert!(policy.contains("what runtime-proxy does when this server fails"), "{policy}");
        assert!(!policy.contains("plugin"), "--failure-policy describes plugins:\n{policy}");
        assert!(!help.contains("module") && !help.contains("`cgroup_path`"), "{help}");
        assert!(!help.contains("--logtostderr") && !help.contains("--v <"), "klog flags are hidden:\n{help}");
    }

    #[test]
    fn nri_flags() {
        let a = Args::parse_from(["runtime-hooks", "--mode", "nri"]);
        assert_eq!(a.mode, Mode::Nri);
        assert_eq!(
            (a.nri_socket.to_str(), a.nri_plugin_name.as_str(), a.nri_plugin_index.as_str()),
            (Some("/var/run/nri/nri.sock"), "runtime-hooks", "50")
        );
        assert_eq!(a.reconcile_endpoint(), None, "NRI mode reconciles only when asked");
        let a = Args::parse_from([
            "runtime-hooks",
            "--mode",
            "nri",
            "--nri-socket",
            "unix:///run/n.sock",
            "--nri-plugin-name",
            "rh",
            "--nri-plugin-index",
            "07",
        ]);
        assert_eq!(
            (a.nri_socket.to_str(), a.nri_plugin_name.as_str(), a.nri_plugin_index.as_str()),
            (Some("/run/n.sock"), "rh", "07")
        );
        assert_eq!(Args::try_parse_from(["runtime-hooks", "--nri-plugin-index", "7"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn hook_name_is_a_plain_file_name() {
        assert_eq!(Args::parse_from(["runtime-hooks", "--hook-name", "koordlet"]).hook_name, "koordlet");
        assert_eq!(Args::parse_from(["runtime-hooks"]).hook_name, "runtime-hooks");
        for bad in ["../../etc/evil", "a/b", "", ".", "..", ".hidden"] {
            let e = Args::try_parse_from(["runtime-hooks", "--hook-name", bad]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}");
            assert!(e.to_string().contains("--hook-name"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn cgroup_driver_flag() {
        assert_eq!(Args::parse_from(["runtime-hooks"]).cgroup_driver, CgroupDriverArg::Auto);
        assert_eq!(Args::parse_from(["runtime-hooks"]).cgroup_driver.driver(), None);
        let a =
            Args::parse_from(["runtime-hooks", "--cgroup-driver", "systemd", "--kubepods-cgroup", "kubepods.slice"]);
        assert_eq!(a.cgroup_driver.driver(), Some(CgroupDriver::Systemd));
        assert_eq!(a.kubepods_cgroup.as_deref(), Some("kubepods.slice"));
        assert_eq!(
            Args::parse_from(["runtime-hooks", "--cgroup-driver", "cgroupfs"]).cgroup_driver.driver(),
            Some(CgroupDriver::Cgroupfs)
        );
        assert!(Args::try_parse_from(["runtime-hooks", "--cgroup-driver", "docker"]).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("10").is_err() && parse_duration("1d").is_err());
        let a = Args::parse_from(["runtime-hooks", "--reconcile-interval", &format!("{}s", u64::MAX)]);
        assert_eq!(a.interval(), Some(Duration::from_secs(u64::MAX)), "accepted: in effect never again after start");
        assert!(Args::try_parse_from(["runtime-hooks", "--reconcile-interval=-1s"]).is_err());
    }
}
