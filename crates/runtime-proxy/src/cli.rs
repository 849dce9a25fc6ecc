//! Command-line flags, named and defaulted exactly as koord-runtime-proxy's (`cmd/koord-runtime-proxy/options`,
//! Koordinator v1.8.0), so that a unit file written for it starts this binary unchanged.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
pub use daemon_support::addr::{parse_metrics_addr, MetricsAddr};

/// The backend a proxy speaks to (`--backend-runtime-mode`). Values are case-sensitive, as in
/// koord-runtime-proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendRuntimeMode {
    /// Any CRI v1 runtime (containerd, CRI-O) behind a gRPC unix socket.
    #[value(name = "Containerd")]
    Containerd,
    /// The Docker Engine HTTP API (dockershim / cri-dockerd clusters): the proxy serves it on its
    /// socket (for cri-dockerd) and forwards it to dockerd, calling the hook servers as in CRI
    /// mode.
    #[value(name = "Docker")]
    Docker,
}

/// Where the proxy meets the runtime's calls (`--frontend`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Frontend {
    /// In kubelet's path: CRI on `--koord-runtimeproxy-endpoint` (or the Docker Engine API with
    /// `--backend-runtime-mode Docker`), forwarded to the runtime.
    #[value(name = "cri")]
    Cri,
    /// Inside containerd: one NRI plugin on `--nri-socket`, called at the runtime's pod and
    /// container events; no listening socket, no backend endpoint.
    #[value(name = "nri")]
    Nri,
}

/// `--version`: the crate version and the git revision it was built from (build.rs), e.g.
/// `0.1.0 (git 27cbb9f)`.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (git ", env!("GIT_REVISION"), ")");

/// What the binary does: serve (no subcommand: what kubelet's and systemd's command lines
/// start), or one of these.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Print the running proxy's state, read from its admin socket (--admin-socket; the TCP
    /// endpoint only when --metrics-addr is given): hook servers with their policy, timeout and
    /// health, the backend, the store, hook calls per stage. Exit 0: healthy; 1: something
    /// unhealthy (backend down, a Fail server failing); 2: no status could be read.
    Status(daemon_support::status::StatusArgs),
}

/// All flags of the `runtime-proxy` binary.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "runtime-proxy",
    version = VERSION,
    about = "A CRI proxy: kubelet talks to it instead of the container runtime; it forwards every call \
             and calls runtime hook servers at the pod and container lifecycle points.",
    long_about = None,
    disable_help_subcommand = true
)]
pub struct Args {
    /// `status`: print a running proxy's state. Without a subcommand the proxy serves.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// Unix socket the proxy listens on; point kubelet's --container-runtime-endpoint at it.
    /// A stale socket is removed and the parent directory created. `unix://` prefix optional.
    #[arg(
        long = "koord-runtimeproxy-endpoint",
        value_name = "PATH",
        default_value = "/var/run/koord-runtimeproxy/runtimeproxy.sock",
        value_parser = parse_unix_path
    )]
    pub listen: PathBuf,

    /// Unix socket of the CRI runtime's RuntimeService (containerd's gRPC socket). Every call the
    /// proxy does not intercept is forwarded here unchanged. `unix://` prefix optional.
    #[arg(
        long = "remote-runtime-service-endpoint",
        value_name = "PATH",
        default_value = "/var/run/containerd/containerd.sock",
        value_parser = parse_unix_path
    )]
    pub runtime_endpoint: PathBuf,

    /// Unix socket of the CRI runtime's ImageService (`runtime.v1.ImageService` and
    /// `runtime.v1alpha2.ImageService` calls). Default: the runtime endpoint.
    #[arg(long = "remote-image-service-endpoint", value_name = "PATH", value_parser = parse_unix_path)]
    pub image_endpoint: Option<PathBuf>,

    /// Backend kind: `Containerd` (any CRI runtime, gRPC) or `Docker` (the Docker Engine API of
    /// dockerd at --remote-runtime-service-endpoint, e.g. /var/run/docker.sock).
    #[arg(long = "backend-runtime-mode", value_enum, default_value = "Containerd")]
    pub backend_runtime_mode: BackendRuntimeMode,

    /// Front end: `cri` (kubelet talks to the proxy; see --backend-runtime-mode) or `nri` (the
    /// proxy registers as an NRI plugin of containerd at --nri-socket and calls the hook servers
    /// at the runtime's events; kubelet talks to containerd directly).
    #[arg(long = "frontend", value_enum, default_value = "cri")]
    pub frontend: Frontend,

    /// The runtime's NRI socket (`--frontend nri`). `unix://` prefix optional.
    #[arg(long = "nri-socket", value_name = "PATH", default_value = nri_plugin::DEFAULT_SOCKET, value_parser = parse_unix_path)]
    pub nri_socket: PathBuf,

    /// The NRI plugin name the proxy registers with (`--frontend nri`).
    #[arg(long = "nri-plugin-name", value_name = "NAME", default_value = "runtime-proxy")]
    pub nri_plugin_name: String,

    /// The NRI plugin index, two digits (`--frontend nri`): the runtime calls plugins in
    /// ascending index order.
    #[arg(long = "nri-plugin-index", value_name = "NN", default_value = "40", value_parser = nri_plugin::parse_plugin_index)]
    pub nri_plugin_index: String,

    /// Pod label key that exempts a pod (and its containers) from every hook, together with
    /// --runtime-hook-server-val. Hook servers' own pods carry it to avoid blocking themselves.
    #[arg(
        long = "runtime-hook-server-key",
        value_name = "KEY",
        default_value = "runtimeproxy.koordinator.sh/skip-hookserver"
    )]
    pub hook_skip_key: String,

    /// Pod label value paired with --runtime-hook-server-key.
    #[arg(long = "runtime-hook-server-val", value_name = "VALUE", default_value = "true")]
    pub hook_skip_value: String,

    /// Namespaces whose pods may use the skip label (comma-separated; "" = none). Elsewhere the
    /// label is ignored, with a warning: the hooks are called (koord honours it everywhere).
    #[arg(
        long = "runtime-hook-server-namespaces",
        value_name = "NS,...",
        value_delimiter = ',',
        default_value = crate::hooks::skip_label::DEFAULT_NAMESPACES
    )]
    pub hook_skip_namespaces: Vec<String>,

    /// What a field conflict between two hook servers of one call does: `Warn` (the later value
    /// wins; logged and counted in runtime_proxy_hook_conflicts_total) or `Fail` (the call is
    /// refused with FAILED_PRECONDITION). A registration's `conflict-policy` overrides it for
    /// the conflicts its server causes.
    #[arg(long = "hook-conflict-policy", value_name = "POLICY", value_enum, default_value = "Warn")]
    pub hook_conflict_policy: crate::hooks::chain::ConflictPolicy,

    /// Hook servers (registration names, e.g. `koordlet.json`, comma-separated) every pod
    /// requires: a pre stage fails the call when one is not registered or its call fails,
    /// whatever its failure policy. Pods add their own with the
    /// `runtimeproxy.koordinator.sh/required-hook-servers` annotation.
    #[arg(long = "required-hook-servers", value_name = "NAME,...", value_delimiter = ',')]
    pub required_hook_servers: Vec<String>,

    /// Directory of hook server registrations (`*.json`, as koordlet writes them).
    #[arg(long = "hook-config-dir", value_name = "DIR", default_value = "/etc/runtime/hookserver.d")]
    pub hook_config_dir: PathBuf,

    /// Accept registration files (and a hook config directory) that are group- or
    /// world-writable or owned by a user other than root or the proxy's own: for development
    /// only. By default such files are refused, like sshd's StrictModes.
    #[arg(long = "insecure-hook-config")]
    pub insecure_hook_config: bool,

    /// Largest intercepted request body the proxy reads (bytes; kubelet's own limit is 16 MiB).
    #[arg(long = "max-request-bytes", value_name = "BYTES", default_value_t = 16 << 20, value_parser = parse_at_least_one::<usize>)]
    pub max_request_bytes: usize,

    /// How long an intercepted request's body may stall before the call is answered
    /// DEADLINE_EXCEEDED (a client that never finishes its request). Examples: `30s`, `500ms`.
    #[arg(long = "request-idle-timeout", value_name = "DURATION", default_value = "30s", value_parser = parse_nonzero_duration)]
    pub request_idle_timeout: Duration,

    /// Most concurrent calls on one client connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long = "max-concurrent-streams", value_name = "N", default_value_t = 1000, value_parser = parse_at_least_one::<u32>)]
    pub max_concurrent_streams: u32,

    /// Largest hook server answer (bytes); a larger one is a hook failure. As large as the
    /// largest request by default: koordlet echoes the whole request in its answer.
    #[arg(long = "max-hook-answer-bytes", value_name = "BYTES", default_value_t = 16 << 20, value_parser = parse_at_least_one::<usize>)]
    pub max_hook_answer_bytes: usize,

    /// Most entries a hook answer may add to one map (envs, labels, annotations); 0: none may
    /// be added (changing the request's own entries is still allowed).
    #[arg(long = "max-hook-added-entries", value_name = "N", default_value_t = 1024, value_parser = parse_count::<usize>)]
    pub max_hook_added_entries: usize,

    /// Largest key + value (bytes) of an entry a hook answer adds or changes.
    #[arg(long = "max-hook-entry-bytes", value_name = "BYTES", default_value_t = 256 << 10, value_parser = parse_at_least_one::<usize>)]
    pub max_hook_entry_bytes: usize,

    /// How long SIGTERM/SIGINT/SIGQUIT waits for in-flight calls (and open streams such as
    /// GetContainerEvents) before the proxy exits anyway; `0`: not at all. Examples: `10s`,
    /// `500ms`, `1m`.
    #[arg(long = "drain-timeout", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Address of the admin HTTP endpoint: `/metrics` (Prometheus), `/healthz` and `/status`.
    /// `IP:PORT`, `[IPv6]:PORT`, `localhost:PORT` (127.0.0.1), `:PORT` (every interface, as Go
    /// reads it); `off` (or "") serves none. Port 0 picks a free port (logged). If it cannot be
    /// bound the proxy does not start (exit 2). `status` asks this address only when it is given
    /// on status's command line (any local user can bind a free port; see --admin-socket).
    #[arg(
        long = "metrics-addr",
        value_name = "ADDR",
        default_value = "127.0.0.1:9318",
        value_parser = parse_metrics_addr,
        global = true
    )]
    pub metrics_addr: MetricsAddr,

    /// Address of the debug endpoint, `/debug/store` (every sandbox and container ID the proxy
    /// knows): a listener of its own, so that a metrics scraper never sees pod IDs. The forms of
    /// --metrics-addr; default `off`. If it cannot be bound the proxy does not start (exit 2).
    #[arg(long = "debug-addr", value_name = "ADDR", default_value = "off", value_parser = parse_metrics_addr)]
    pub debug_addr: MetricsAddr,

    /// Unix socket serving the admin routes (`/metrics`, `/healthz`, `/status`) to root only:
    /// mode 0600, in the proxy's socket directory. `status` asks it first. Default:
    /// beside --koord-runtimeproxy-endpoint, named after it
    /// (/var/run/koord-runtimeproxy/runtimeproxy-admin.sock); `off` serves none. If it cannot be
    /// bound the proxy does not start (exit 2).
    #[arg(long = "admin-socket", value_name = "PATH", value_parser = daemon_support::addr::parse_admin_socket, global = true)]
    pub admin_socket: Option<daemon_support::addr::AdminSocketFlag>,

    /// koord-runtime-proxy's klog flags (`--v`, `--logtostderr`, `--log-dir`, …): hidden,
    /// accepted with a deprecation notice; `--v` sets the log level, the others are ignored.
    #[command(flatten)]
    pub klog: daemon_support::klog::KlogFlags,
}

impl Args {
    /// The admin socket's path (`--admin-socket`, by default `NAME-admin.sock` beside
    /// `--koord-runtimeproxy-endpoint`, NAME its socket's); `None`: off.
    pub fn admin_socket(&self) -> Option<std::path::PathBuf> {
        daemon_support::addr::AdminSocketFlag::resolve(self.admin_socket.as_ref(), &self.listen)
    }

    /// The skip label and the namespaces that may use it (empty names dropped, so `""` is none).
    pub fn skip_label(&self) -> crate::hooks::skip_label::SkipLabel {
        crate::hooks::skip_label::SkipLabel {
            key: self.hook_skip_key.clone(),
            value: self.hook_skip_value.clone(),
            namespaces: self
                .hook_skip_namespaces
                .iter()
                .map(|n| n.trim().to_owned())
                .filter(|n| !n.is_empty())
                .collect(),
        }
    }

    /// `--required-hook-servers`, trimmed, empty names dropped, each once.
    ///
    /// Errors: the flag names more than [`crate::hooks::chain::MAX_REQUIRED_SERVERS`] servers.
    pub fn required_hook_servers(&self) -> anyhow::Result<Vec<String>> {
        crate::hooks::chain::parse_names(&self.required_hook_servers.join(",")).map_err(|e| {
            anyhow::anyhow!(
                "--required-hook-servers names at least {} hook servers, more than {}",
                e.at_least,
                crate::hooks::chain::MAX_REQUIRED_SERVERS
            )
        })
    }

    /// The resource limits the flags set.
    pub fn limits(&self) -> crate::hooks::limits::Limits {
        crate::hooks::limits::Limits {
            max_request_bytes: self.max_request_bytes,
            request_idle_timeout: self.request_idle_timeout,
            max_concurrent_streams: self.max_concurrent_streams.max(1),
            hooks: crate::hooks::limits::HookLimits {
                max_answer_bytes: self.max_hook_answer_bytes,
                max_added_entries: self.max_hook_added_entries,
                max_entry_bytes: self.max_hook_entry_bytes,
            },
        }
    }

    /// The ImageService backend socket: `--remote-image-service-endpoint`, or the runtime one.
    pub fn image_endpoint(&self) -> &PathBuf {
        self.image_endpoint.as_ref().unwrap_or(&self.runtime_endpoint)
    }
}

pub use hook_api::parse_unix_path;

/// Parses a limit that must be at least 1 (`--max-request-bytes`, `--max-concurrent-streams`,
/// `--max-hook-answer-bytes`, `--max-hook-entry-bytes`): 0 would let the proxy start and then
/// refuse every call (or every hook answer setting an entry) the limit applies to, so it is
/// refused at start (exit 2) instead.
///
/// Errors: not a whole number of the type's range (negative, a fraction, too large: the
/// message names the largest), or 0.
pub fn parse_at_least_one<T: std::str::FromStr + PartialEq + From<u8> + std::fmt::Display + Bounded>(
    s: &str,
) -> Result<T, String> {
    let n: T = parse_count(s)?;
    if n == T::from(0) {
        return Err("0 would refuse every call this limit applies to; the smallest value is 1".to_owned());
    }
    Ok(n)
}

/// Parses a count or size flag: a whole number from 0 to the type's largest.
///
/// Errors: anything else, naming the range (a negative number, a fraction, a number too large).
pub fn parse_count<T: std::str::FromStr + std::fmt::Display + Bounded>(s: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("{s:?} is not a whole number from 0 to {}", T::MAX_VALUE))
}

/// The largest value of a flag's integer type, for error messages.
pub trait Bounded {
    /// `T::MAX`.
    const MAX_VALUE: Self;
}

impl Bounded for usize {
    const MAX_VALUE: usize = usize::MAX;
}

impl Bounded for u32 {
    const MAX_VALUE: u32 = u32::MAX;
}

/// [`parse_duration`] for `--request-idle-timeout`, which must be more than zero: with 0 every
/// intercepted request whose body is not already there would be answered DEADLINE_EXCEEDED.
///
/// Errors: as [`parse_duration`], and a zero duration.
pub fn parse_nonzero_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("0 would time out every intercepted request; use e.g. 30s".to_owned());
    }
    Ok(d)
}

pub use daemon_support::duration::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_paths_with_and_without_scheme() {
        assert_eq!(parse_unix_path("/run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert_eq!(parse_unix_path("unix:///run/c.sock").unwrap(), PathBuf::from("/run/c.sock"));
        assert!(parse_unix_path("tcp://1.2.3.4:5").unwrap_err().contains("tcp"));
        assert!(parse_unix_path("unix://").is_err());
    }

    /// kubelet's three spellings mean the same absolute path; relative paths (also hidden in
    /// `unix:rel` and `unix://host/path`) and paths too long for a socket address are refused.
    #[test]
    fn endpoint_forms_and_limits() {
        for form in ["/tmp/x.sock", "unix:/tmp/x.sock", "unix:///tmp/x.sock"] {
            assert_eq!(parse_unix_path(form).unwrap(), PathBuf::from("/tmp/x.sock"), "{form}");
        }
        for relative in ["x.sock", "tmp/x.sock", "unix:tmp/x.sock", "unix://tmp/x.sock", "./x.sock"] {
            let err = parse_unix_path(relative).unwrap_err();
            assert!(err.contains("absolute") && err.contains(relative), "{relative}: {err}");
        }
        let longest = format!("/{}", "x".repeat(hook_api::MAX_SOCKET_PATH - 1));
        assert!(parse_unix_path(&longest).is_ok());
        let err = parse_unix_path(&format!("{longest}y")).unwrap_err();
        assert!(err.contains("108 bytes") && err.contains("at most 107"), "{err}");
        let err = Args::try_parse_from(["rp", "--remote-runtime-service-endpoint", "unix://run/c.sock"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be absolute"), "{err}");
    }

    #[test]
    fn defaults_match_koord_runtime_proxy() {
        let a = Args::parse_from(["runtime-proxy"]);
        assert_eq!(a.listen, PathBuf::from("/var/run/koord-runtimeproxy/runtimeproxy.sock"));
        assert_eq!(a.runtime_endpoint, PathBuf::from("/var/run/containerd/containerd.sock"));
        assert_eq!(a.image_endpoint(), &a.runtime_endpoint);
        assert_eq!(a.backend_runtime_mode, BackendRuntimeMode::Containerd);
        assert_eq!(a.hook_skip_key, "runtimeproxy.koordinator.sh/skip-hookserver");
        assert_eq!(a.hook_skip_value, "true");
        assert_eq!(a.hook_config_dir, PathBuf::from("/etc/runtime/hookserver.d"));
        assert_eq!(a.limits(), crate::hooks::limits::Limits::default(), "flag defaults are the documented limits");
    }

    /// A limit of 0 would start fine and then refuse every pod: refused at start, naming the flag.
    #[test]
    fn nri_front_end_flags() {
        let a = Args::parse_from(["runtime-proxy"]);
        assert_eq!(
            (a.frontend, a.nri_socket.to_str(), a.nri_plugin_index.as_str()),
            (Frontend::Cri, Some("/var/run/nri/nri.sock"), "40")
        );
        let a = Args::parse_from([
            "runtime-proxy",
            "--frontend",
            "nri",
            "--nri-socket",
            "unix:///run/n.sock",
            "--nri-plugin-index",
            "05",
        ]);
        assert_eq!(
            (a.frontend, a.nri_socket.to_str(), a.nri_plugin_index.as_str()),
            (Frontend::Nri, Some("/run/n.sock"), "05")
        );
        for bad in [&["--nri-plugin-index", "5"][..], &["--frontend", "NRI"], &["--nri-socket", "rel.sock"]] {
            assert!(Args::try_parse_from(["runtime-proxy"].iter().chain(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn zero_limits_are_refused() {
        for flag in [
            "--max-request-bytes",
            "--max-concurrent-streams",
            "--max-hook-answer-bytes",
            "--max-hook-entry-bytes",
            "--request-idle-timeout",
        ] {
            let zero = if flag == "--request-idle-timeout" { "0s" } else { "0" };
            let err = Args::try_parse_from(["rp", flag, zero]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flag}");
            let text = err.to_string();
            assert!(text.contains(flag) && text.contains("would"), "{flag}: {text}");
            let one = if flag == "--request-idle-timeout" { "1ms" } else { "1" };
            assert!(Args::try_parse_from(["rp", flag, one]).is_ok(), "{flag} {one}");
        }
        assert!(Args::try_parse_from(["rp", "--max-request-bytes", "-1"]).is_err());
        let e = Args::try_parse_from(["rp", "--max-request-bytes=-1"]).unwrap_err().to_string();
        assert!(e.contains("not a whole number from 0 to 18446744073709551615"), "{e}");
        let e = Args::try_parse_from(["rp", "--max-concurrent-streams", "4294967296"]).unwrap_err().to_string();
        assert!(e.contains("from 0 to 4294967295"), "beyond u32: {e}");
        assert_eq!(
            Args::try_parse_from(["rp", "--max-concurrent-streams", "4294967295"]).unwrap().max_concurrent_streams,
            u32::MAX
        );
        assert_eq!(
            Args::try_parse_from(["rp", "--max-hook-added-entries", "0"]).unwrap().max_hook_added_entries,
            0,
            "none may be added"
        );
        assert!(Args::try_parse_from(["rp", "--drain-timeout", "0"]).unwrap().drain_timeout.is_zero(), "no drain");
    }

    /// `--help` speaks to operators: no internal module names, koord's klog flags hidden (they
    /// are accepted, with a notice).
    #[test]
    fn help_names_no_module_and_hides_klog_flags() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(!help.contains("module"), "{help}");
        assert!(!help.contains("--logtostderr") && !help.contains("--log-dir") && !help.contains("--v <"), "{help}");
        let a = Args::try_parse_from(["rp", "--v=4", "--logtostderr", "--log-dir", "/x"]).expect("klog flags accepted");
        assert_eq!(a.klog.v, Some(4));
    }

    /// Without a subcommand the binary serves (kubelet's and systemd's command lines); `status`
    /// takes --metrics-addr before or after it, and the serving flags keep working.
    #[test]
    fn status_subcommand_and_serving_flags() {
        use daemon_support::status::Output;
        let a = Args::parse_from(["rp", "--metrics-addr", ":9400", "--debug-addr", "localhost:9401"]);
        assert_eq!(a.command, None);
        assert_eq!(a.metrics_addr.map(|a| a.to_string()).as_deref(), Some("0.0.0.0:9400"));
        assert_eq!(a.debug_addr.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9401"));
        assert_eq!(Args::parse_from(["rp"]).debug_addr, None, "debug endpoint off by default");
        let a = Args::parse_from(["rp", "status", "--metrics-addr", "127.0.0.1:9318", "--output", "json"]);
        let Some(Command::Status(s)) = &a.command else { panic!("{a:?}") };
        assert_eq!(s.output, Output::Json);
        assert_eq!(a.metrics_addr.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9318"));
        let a = Args::parse_from(["rp", "--metrics-addr", "127.0.0.1:9000", "status"]);
        assert_eq!(a.metrics_addr.map(|a| a.to_string()).as_deref(), Some("127.0.0.1:9000"));
        assert!(matches!(a.command, Some(Command::Status(ref s)) if s.output == Output::Table));
        assert!(Args::try_parse_from(["rp", "stauts"]).is_err(), "a misspelt subcommand is an error, not a serve");
    }

    #[test]
    fn mode_is_case_sensitive() {
        assert!(Args::try_parse_from(["rp", "--backend-runtime-mode", "Docker"]).is_ok());
        assert!(Args::try_parse_from(["rp", "--backend-runtime-mode", "docker"]).is_err());
    }

    /// The shared syntax (daemon_support::duration has the edge cases).
    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("10").is_err());
        assert!(parse_nonzero_duration("0").unwrap_err().contains("0 would"));
    }
}
