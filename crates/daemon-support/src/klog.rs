//! The klog flags of koord-runtime-proxy's command line (klog v2's flag set, as Kubernetes
//! components register it, and component-base's `--log-flush-frequency`).
//!
//! They are accepted so that a unit or DaemonSet written for koord-runtime-proxy (or for koordlet, whose hook server
//! runtime-hooks replaces) starts these binaries unchanged, and each one given is named in a single deprecation notice
//! at start ([`KlogFlags::notice`]). Only `--v` has an effect: it sets the log level when `RUST_LOG` is not set
//! ([`filter_for_verbosity`]). The rest are ignored: logs always go to stderr (the journal under systemd, the container
//! log in a pod), never to files. Names are accepted with dashes or with klog's underscores (`--log-dir`, `--log_dir`);
//! bool flags as `--flag`, `--flag=true|false` or, once the binary's arguments go through [`koord_args`],
//! `--flag false`; values as `--flag=VALUE` or `--flag VALUE`; `--v` also as `-v=4`, `-v 4` (pflag's short form of a
//! one-letter Go flag, as koord-runtime-proxy reads it). Hidden from `--help`.

use std::fmt::Write as _;

use clap::builder::BoolishValueParser;

/// klog's flags (see the module docs). Flatten it into a binary's arguments with
/// `#[command(flatten)]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct KlogFlags {
    /// klog's verbosity: sets the log level (see [`filter_for_verbosity`]).
    #[arg(long = "v", short = 'v', value_name = "LEVEL", hide = true)]
    pub v: Option<u32>,
    /// Per-file verbosity (`pattern=N,...`): ignored.
    #[arg(long, value_name = "PATTERN=N,...", hide = true)]
    pub vmodule: Option<String>,
    /// Log to stderr instead of files: ignored (always so).
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub logtostderr: Option<bool>,
    /// Log to stderr as well as files: ignored (stderr only).
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub alsologtostderr: Option<bool>,
    /// Directory of klog's log files: ignored (no log files).
    #[arg(long = "log-dir", alias = "log_dir", value_name = "DIR", hide = true)]
    pub log_dir: Option<String>,
    /// klog's log file: ignored (no log files).
    #[arg(long = "log-file", alias = "log_file", value_name = "FILE", hide = true)]
    pub log_file: Option<String>,
    /// Largest klog log file, MB: ignored.
    #[arg(long = "log-file-max-size", alias = "log_file_max_size", value_name = "MB", hide = true)]
    pub log_file_max_size: Option<String>,
    /// Lowest severity also copied to stderr: ignored (everything goes to stderr).
    #[arg(long, value_name = "SEVERITY", hide = true)]
    pub stderrthreshold: Option<String>,
    /// Lines without klog's header: ignored.
    #[arg(long = "skip-headers", alias = "skip_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub skip_headers: Option<bool>,
    /// Files without klog's header: ignored.
    #[arg(long = "skip-log-headers", alias = "skip_log_headers", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub skip_log_headers: Option<bool>,
    /// The source file's directory in the header: ignored.
    #[arg(long = "add-dir-header", alias = "add_dir_header", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub add_dir_header: Option<bool>,
    /// Each line in its own severity's file only: ignored.
    #[arg(long = "one-output", alias = "one_output", hide = true, num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub one_output: Option<bool>,
    /// A stack trace at `file:line`: ignored.
    #[arg(long = "log-backtrace-at", alias = "log_backtrace_at", value_name = "FILE:LINE", hide = true)]
    pub log_backtrace_at: Option<String>,
    /// How often klog flushes its buffers: ignored (lines are written as they come).
    #[arg(long = "log-flush-frequency", alias = "log_flush_frequency", value_name = "DURATION", hide = true)]
    pub log_flush_frequency: Option<String>,
}

/// klog's bool flags, in both spellings: the ones [`koord_args`] joins with a separate value.
const BOOL_FLAGS: [&str; 10] = [
    "--logtostderr",
    "--alsologtostderr",
    "--skip-headers",
    "--skip_headers",
    "--skip-log-headers",
    "--skip_log_headers",
    "--add-dir-header",
    "--add_dir_header",
    "--one-output",
    "--one_output",
];

/// The command line `args` (program name first) with koord's spelling of a klog bool flag and
/// its value as two arguments (`--logtostderr false`) joined into one (`--logtostderr=false`),
/// so that clap reads it as koord-runtime-proxy's flag parser accepts it (pflag reads the word
/// apart and ignores it; the flag has no effect here either way). Only a word Go's
/// `strconv.ParseBool` reads (`true`, `false`, `1`, `0`, `t`, `f`, in its cases) is joined: any
/// other next argument (a subcommand such as `status`, another flag) stays as it is, and so does
/// everything after `--`. `-v=4` and `-v 4` need nothing here: `--v` has the short form `-v`.
pub fn koord_args<I: IntoIterator<Item = std::ffi::OsString>>(args: I) -> Vec<std::ffi::OsString> {
    const GO_BOOLS: [&str; 12] = ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"];
    let mut out: Vec<std::ffi::OsString> = Vec::new();
    let mut rest_positional = false;
    for arg in args {
        if !rest_positional {
            let joins = out.last().and_then(|prev| prev.to_str()).is_some_and(|prev| BOOL_FLAGS.contains(&prev))
                && arg.to_str().is_some_and(|a| GO_BOOLS.contains(&a));
            if joins {
                if let (Some(prev), Some(value)) = (out.last_mut(), arg.to_str()) {
                    prev.push(format!("={value}"));
                    continue;
                }
            }
            rest_positional = arg == "--";
        }
        out.push(arg);
    }
    out
}

/// The log filter for klog verbosity `v`, with `crates` (e.g. `["runtime_proxy"]`) the
/// binary's own crates, following the Kubernetes logging conventions:
///
/// | `--v` | filter | Kubernetes' meaning of the level |
/// |---|---|---|
/// | 0–2 | `info` | steady-state information (2 is the usual production level: it must not flood) |
/// | 3–4 | `info,CRATE=debug` | extended information, debug level (one line per CRI or hook call) |
/// | 5+ | `info,CRATE=trace` | trace level |
///
/// Libraries (h2, tonic, hyper) stay at `info`: their debug output is per frame; `RUST_LOG`
/// reaches them.
pub fn filter_for_verbosity(v: u32, crates: &[&str]) -> String {
    let level = match v {
        0..=2 => return "info".to_owned(),
        3..=4 => "debug",
        _ => "trace",
    };
    let mut filter = "info".to_owned();
    for c in crates {
        let _ = write!(filter, ",{c}={level}");
    }
    filter
}

impl KlogFlags {
    /// The default log filter these flags ask for: [`filter_for_verbosity`] of `--v`, else `info`.
    pub fn default_filter(&self, crates: &[&str]) -> String {
        filter_for_verbosity(self.v.unwrap_or(0), crates)
    }

    /// One line naming every klog flag given and what it does here, e.g. `deprecated klog flags
    /// (Koordinator's logging flags): --v=4 sets the log level info,runtime_proxy=debug; --logtostderr
    /// is ignored (logs always go to stderr); … Remove them: RUST_LOG sets the log level.`;
    /// `None` when none was given. `rust_log_set`: `RUST_LOG` decided the filter, so `--v` is
    /// ignored too.
    pub fn notice(&self, crates: &[&str], rust_log_set: bool) -> Option<String> {
        const STDERR: &str = "is ignored (logs always go to stderr)";
        const NO_FILES: &str = "is ignored (no log files: logs go to stderr, e.g. the journal)";
        const IGNORED: &str = "is ignored";
        let mut parts: Vec<String> = Vec::new();
        let mut add = |flag: &str, value: Option<String>, effect: &str| {
            if let Some(value) = value {
                parts.push(format!("--{flag}{value} {effect}"));
            }
        };
        let val = |v: &Option<String>| v.as_ref().map(|v| format!("={v}"));
        let flag = |b: &Option<bool>| b.map(|b| if b { String::new() } else { "=false".to_owned() });
        if let Some(v) = self.v {
            let effect = if rust_log_set {
                "is ignored (RUST_LOG is set)".to_owned()
            } else {
                format!("sets the log level {}", filter_for_verbosity(v, crates))
            };
            add("v", Some(format!("={v}")), &effect);
        }
        add("vmodule", val(&self.vmodule), IGNORED);
        add("logtostderr", flag(&self.logtostderr), STDERR);
        add("alsologtostderr", flag(&self.alsologtostderr), STDERR);
        add("stderrthreshold", val(&self.stderrthreshold), STDERR);
        add("log-dir", val(&self.log_dir), NO_FILES);
        add("log-file", val(&self.log_file), NO_FILES);
        add("log-file-max-size", val(&self.log_file_max_size), NO_FILES);
        add("skip-headers", flag(&self.skip_headers), IGNORED);
        add("skip-log-headers", flag(&self.skip_log_headers), IGNORED);
        add("add-dir-header", flag(&self.add_dir_header), IGNORED);
        add("one-output", flag(&self.one_output), IGNORED);
        add("log-backtrace-at", val(&self.log_backtrace_at), IGNORED);
        add("log-flush-frequency", val(&self.log_flush_frequency), IGNORED);
        if parts.is_empty() {
            return None;
        }
        Some(format!(
            "deprecated klog flags (Koordinator's logging flags): {}. Remove them: RUST_LOG sets the log level",
            parts.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        klog: KlogFlags,
        #[arg(long)]
        other: Option<String>,
    }

    fn parse(args: &[&str]) -> Result<KlogFlags, clap::Error> {
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.klog)
    }

    #[test]
    fn koords_spellings_are_accepted() {
        let k = parse(&[
            "--v=4",
            "--logtostderr",
            "--alsologtostderr=false",
            "--log-dir",
            "/var/log/koord",
            "--log_file=/x.log",
            "--log_file_max_size=1800",
            "--stderrthreshold=2",
            "--skip_headers",
            "--add-dir-header=true",
            "--one_output",
            "--log_backtrace_at=a.go:1",
            "--vmodule=a=1",
            "--log-flush-frequency=5s",
            "--skip-log-headers",
        ])
        .unwrap();
        assert_eq!(k.v, Some(4));
        assert_eq!((k.logtostderr, k.alsologtostderr), (Some(true), Some(false)));
        assert_eq!(k.log_dir.as_deref(), Some("/var/log/koord"));
        assert_eq!(k.log_file.as_deref(), Some("/x.log"));
        assert_eq!(
            (k.skip_headers, k.add_dir_header, k.one_output, k.skip_log_headers),
            (Some(true), Some(true), Some(true), Some(true))
        );
        assert_eq!(parse(&["--v", "2"]).unwrap().v, Some(2), "a value as the next argument");
        assert_eq!(parse(&["--log_dir=/d"]).unwrap().log_dir.as_deref(), Some("/d"));
        assert_eq!(parse(&[]).unwrap(), KlogFlags::default());
    }

    #[test]
    fn bad_values_are_refused_like_klog() {
        assert!(parse(&["--v=loud"]).is_err());
        assert!(parse(&["--logtostderr=maybe"]).is_err());
        assert!(parse(&["--v", "loud"]).is_err() && parse(&["-v=-1"]).is_err());
    }

    /// koord's spellings pflag reads: `-v=4`, `-v 4`, `-v4`, and a bool flag with its value as
    /// the next argument.
    #[test]
    fn koords_short_v_and_separate_bool_values() {
        assert_eq!(parse(&["-v=4"]).unwrap().v, Some(4));
        assert_eq!(parse(&["-v", "4"]).unwrap().v, Some(4));
        assert_eq!(parse(&["-v4"]).unwrap().v, Some(4));
        let args = |a: &[&str]| koord_args(std::iter::once("x").chain(a.iter().copied()).map(std::ffi::OsString::from));
        let joined = args(&[
            "--logtostderr",
            "false",
            "--one_output",
            "T",
            "--skip-headers",
            "--other",
            "status",
            "--",
            "--logtostderr",
            "true",
        ]);
        let want = [
            "x",
            "--logtostderr=false",
            "--one_output=T",
            "--skip-headers",
            "--other",
            "status",
            "--",
            "--logtostderr",
            "true",
        ];
        assert_eq!(joined, want.map(std::ffi::OsString::from));
        let k = Cli::try_parse_from(args(&["--logtostderr", "false", "--alsologtostderr", "1"])).unwrap().klog;
        assert_eq!((k.logtostderr, k.alsologtostderr), (Some(false), Some(true)));
        // Not a bool word: left alone (a subcommand, another flag's value).
        assert_eq!(args(&["--logtostderr", "status"]), ["x", "--logtostderr", "status"].map(std::ffi::OsString::from));
        assert_eq!(args(&["--other", "false"]), ["x", "--other", "false"].map(std::ffi::OsString::from));
    }

    #[test]
    fn verbosity_follows_the_kubernetes_conventions() {
        let c = ["runtime_proxy", "hook_api"];
        for v in 0..=2 {
            assert_eq!(filter_for_verbosity(v, &c), "info", "--v={v}");
        }
        assert_eq!(filter_for_verbosity(3, &c), "info,runtime_proxy=debug,hook_api=debug");
        assert_eq!(filter_for_verbosity(4, &c), "info,runtime_proxy=debug,hook_api=debug");
        assert_eq!(filter_for_verbosity(5, &c), "info,runtime_proxy=trace,hook_api=trace");
        assert_eq!(filter_for_verbosity(u32::MAX, &c), "info,runtime_proxy=trace,hook_api=trace");
        assert_eq!(KlogFlags::default().default_filter(&c), "info");
    }

    #[test]
    fn one_notice_names_every_flag_given() {
        assert_eq!(KlogFlags::default().notice(&["rp"], false), None);
        let k = parse(&["--v=4", "--logtostderr", "--alsologtostderr=false", "--log-dir=/var/log"]).unwrap();
        let n = k.notice(&["rp"], false).unwrap();
        assert!(!n.contains('\n'), "{n}");
        assert_eq!(
            n,
            "deprecated klog flags (Koordinator's logging flags): --v=4 sets the log level info,rp=debug; \
             --logtostderr is ignored (logs always go to stderr); --alsologtostderr=false is ignored (logs always go to stderr); \
             --log-dir=/var/log is ignored (no log files: logs go to stderr, e.g. the journal). Remove them: RUST_LOG \
             sets the log level"
        );
        let n = parse(&["--v=4"]).unwrap().notice(&["rp"], true).unwrap();
        assert!(n.contains("--v=4 is ignored (RUST_LOG is set)"), "{n}");
    }
}
