//! A real Kubernetes API server for tests of runtime-hooks' cluster rule source, started the way
//! controller-runtime's envtest starts one: etcd and kube-apiserver as child processes on
//! loopback, no kubelet, no controller manager, no scheduler.
//!
//! # Binaries
//!
//! The binaries follow envtest's convention: `KUBEBUILDER_ASSETS` names a directory holding
//! `kube-apiserver` and `etcd` (`setup-envtest use 1.31 -p path` prints one). When that directory
//! has no `etcd`, Debian's `/usr/bin/etcd` (package `etcd-server`) is used if installed. Without
//! `KUBEBUILDER_ASSETS`, [`Envtest::start`] prints [`SKIP_LINE`] and returns `None`: the
//! project's machines have no kube-apiserver (tests there answer the Kubernetes client with
//! recorded answers of a real one instead).
//!
//! # What it sets up
//!
//! What [`Envtest::start`] sets up, all in the caller's directory:
//!
//! * etcd on `127.0.0.1`, free ports, a fresh data directory;
//! * kube-apiserver on `127.0.0.1` (a free secure port, its self-signed serving certificate in
//!   `certs/`, so kubeconfigs skip TLS verification), `--authorization-mode=RBAC`,
//!   `--token-auth-file` with an admin token (group `system:masters`) and a token of the user
//!   [`LIMITED_USER`], a service-account key pair made with `openssl` (`--service-account-*`), and
//!   the ServiceAccount admission plugin off (as envtest: with no controller manager, no namespace
//!   gets its `default` ServiceAccount, and pods could not be created without one);
//! * the CRDs of `deploy/crds/` (NodeSLO, NodeResourceTopology), established and served;
//! * `deploy/namespace.yaml` and `deploy/runtime-hooks-rbac.yaml` as shipped: the ServiceAccount
//!   `runtime-hooks/runtime-hooks` bound to the ClusterRole `runtime-hooks`, and a token for it
//!   from the TokenRequest API;
//! * the ClusterRole [`LIMITED_ROLE`] (the same rules without `nodeslos`) bound to
//!   [`LIMITED_USER`];
//! * one kubeconfig per identity: [`Envtest::admin_kubeconfig`], [`Envtest::hooks_kubeconfig`],
//!   [`Envtest::limited_kubeconfig`].
//!
//! # Use
//!
//! Requests go through `curl -k` (Debian's curl; no Kubernetes client here). Starting takes about
//! 10 s and blocks the calling thread (from an async test: before other work, or in
//! `spawn_blocking`). Both processes are killed when the [`Envtest`] is dropped; their logs stay in
//! the directory (`etcd.log`, `kube-apiserver.log`).
//!
//! # Source and verification
//!
//! Written from kube-apiserver's flag documentation and controller-runtime's envtest flags; run
//! here against Debian's etcd 3.4 and a stand-in for kube-apiserver only, never a real one (none
//! is to be had on these machines): the first run with `KUBEBUILDER_ASSETS` is its first real test.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};

/// The one line [`Envtest::start`] prints (to stderr) when `KUBEBUILDER_ASSETS` is not set.
pub const SKIP_LINE: &str =
    "envtest skipped: KUBEBUILDER_ASSETS is not set (run: setup-envtest use 1.31 -p path, then KUBEBUILDER_ASSETS=<dir> make test)";

/// The NodeSLO CRD (`deploy/crds/nodeslo.yaml`), applied by [`Envtest::start`].
pub const NODESLO_CRD: &str = include_str!("../../../deploy/crds/nodeslo.yaml");

/// The NodeResourceTopology CRD (`deploy/crds/noderesourcetopology.yaml`), applied by
/// [`Envtest::start`].
pub const NODE_RESOURCE_TOPOLOGY_CRD: &str = include_str!("../../../deploy/crds/noderesourcetopology.yaml");

/// runtime-hooks' namespace (`deploy/namespace.yaml`), applied by [`Envtest::start`].
pub const NAMESPACE: &str = include_str!("../../../deploy/namespace.yaml");

/// runtime-hooks' ServiceAccount, ClusterRole and ClusterRoleBinding
/// (`deploy/runtime-hooks-rbac.yaml`), applied by [`Envtest::start`].
pub const RBAC: &str = include_str!("../../../deploy/runtime-hooks-rbac.yaml");

/// The user of the token file's second token, bound to [`LIMITED_ROLE`].
pub const LIMITED_USER: &str = "limited";

/// runtime-hooks' ClusterRole without the rule on `nodeslos`, bound to [`LIMITED_USER`].
pub const LIMITED_ROLE: &str = "runtime-hooks-without-nodeslos";

/// Debian's etcd (package `etcd-server`), used when `KUBEBUILDER_ASSETS` has no `etcd`.
pub const DEBIAN_ETCD: &str = "/usr/bin/etcd";

/// How long etcd and kube-apiserver may take to answer their health checks.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a CRD, or an RBAC change, may take to take effect.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Binaries
// ---------------------------------------------------------------------------------------------

/// The binaries of the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assets {
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
}

impl Assets {
    /// The binaries named by `KUBEBUILDER_ASSETS`: `Ok(None)` when it is unset or empty, an error
    /// (what is missing, and where to get it) when the directory lacks `kube-apiserver`, or lacks
    /// `etcd` and [`DEBIAN_ETCD`] is not installed either.
    pub fn from_env() -> Result<Option<Assets>, String> {
        Assets::from_var(std::env::var_os("KUBEBUILDER_ASSETS"), Path::new(DEBIAN_ETCD))
    }

    /// [`Assets::from_env`] for the value `var` of `KUBEBUILDER_ASSETS`, with `fallback_etcd` in
    /// place of [`DEBIAN_ETCD`].
    pub fn from_var(var: Option<OsString>, fallback_etcd: &Path) -> Result<Option<Assets>, String> {
        match var {
            Some(dir) if !dir.is_empty() => Assets::in_dir(Path::new(&dir), fallback_etcd).map(Some),
            _ => Ok(None),
        }
    }

    /// `dir/kube-apiserver`, and `dir/etcd` or else `fallback_etcd`; each must be an executable
    /// file.
    pub fn in_dir(dir: &Path, fallback_etcd: &Path) -> Result<Assets, String> {
        let kube_apiserver = dir.join("kube-apiserver");
        if !is_executable(&kube_apiserver) {
            return Err(format!(
                "KUBEBUILDER_ASSETS={}: no executable kube-apiserver there (setup-envtest use 1.31 -p path prints a directory that has one)",
                dir.display()
            ));
        }
        let etcd =
            [dir.join("etcd"), fallback_etcd.to_owned()].into_iter().find(|p| is_executable(p)).ok_or_else(|| {
                format!(
                    "KUBEBUILDER_ASSETS={}: no executable etcd there, nor {} (Debian: apt-get install etcd-server)",
                    dir.display(),
                    fallback_etcd.display()
                )
            })?;
        Ok(Assets { kube_apiserver, etcd })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Files the API server is started with
// ---------------------------------------------------------------------------------------------

/// The `--token-auth-file` contents (CSV: token, user name, uid, groups): `admin_token` for the
/// user `admin` in the group `system:masters` (every right, RBAC or not), `limited_token` for
/// [`LIMITED_USER`] in no group of its own (only what [`LIMITED_ROLE`] grants, plus what every
/// authenticated user may do).
pub fn token_file(admin_token: &str, limited_token: &str) -> String {
    format!(
        "{admin_token},admin,envtest-admin,\"system:masters\"\n{limited_token},{LIMITED_USER},envtest-{LIMITED_USER}\n"
    )
}

/// A kubeconfig for `server` (TLS not verified: the API server's certificate is self-signed) with
/// one user and context, both named `name`, authenticating with the bearer `token`.
pub fn kubeconfig(server: &str, name: &str, token: &str) -> String {
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "envtest", "cluster": {"server": server, "insecure-skip-tls-verify": true}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": "envtest", "user": name}}],
        "current-context": name,
    });
    serde_norway::to_string(&config).expect("a kubeconfig serializes")
}

/// The documents of a (multi-document) YAML text as JSON values; empty documents are left out.
pub fn yaml_documents(yaml: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc).map_err(|e| format!("YAML: {e}"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// [`LIMITED_ROLE`]: the ClusterRole of [`RBAC`] renamed, without its rules on the
/// `slo.koordinator.sh` API group (`nodeslos`), with its binding to [`LIMITED_USER`].
pub fn limited_role() -> (Value, Value) {
    let mut role = yaml_documents(RBAC)
        .expect("deploy/runtime-hooks-rbac.yaml parses")
        .into_iter()
        .find(|d| d["kind"] == "ClusterRole")
        .expect("deploy/runtime-hooks-rbac.yaml has a ClusterRole");
    role["metadata"] = json!({"name": LIMITED_ROLE});
    let rules =
        role["rules"].as_array().expect("rules").iter().filter(|r| !mentions(&r["apiGroups"], "slo.koordinator.sh"));
    role["rules"] = Value::Array(rules.cloned().collect());
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": LIMITED_ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": LIMITED_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": LIMITED_USER}],
    });
    (role, binding)
}

fn mentions(list: &Value, item: &str) -> bool {
    list.as_array().is_some_and(|l| l.iter().any(|v| v == item))
}

/// The collection a new `object` is POSTed to: `/api/v1/...` for the core group,
/// `/apis/GROUP/VERSION/...` otherwise, `namespaces/NS/` for a namespaced object. Knows the kinds
/// these tests create (core, RBAC, CRDs, events and the two custom resources); `None` for others.
pub fn collection_path(object: &Value) -> Option<String> {
    let api_version = object["apiVersion"].as_str()?;
    let (plural, namespaced) = match object["kind"].as_str()? {
        "Namespace" => ("namespaces", false),
        "Node" => ("nodes", false),
        "Pod" => ("pods", true),
        "ServiceAccount" => ("serviceaccounts", true),
        "ConfigMap" => ("configmaps", true),
        "Event" => ("events", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "CustomResourceDefinition" => ("customresourcedefinitions", false),
        "NodeSLO" => ("nodeslos", false),
        "NodeResourceTopology" => ("noderesourcetopologies", false),
        _ => return None,
    };
    let prefix = if api_version == "v1" { "/api/v1".to_owned() } else { format!("/apis/{api_version}") };
    if namespaced {
        let ns = object["metadata"]["namespace"].as_str().unwrap_or("default");
        Some(format!("{prefix}/namespaces/{ns}/{plural}"))
    } else {
        Some(format!("{prefix}/{plural}"))
    }
}

/// etcd's flags: a single member named `envtest` listening for clients on `client_port` and peers
/// on `peer_port` (both on 127.0.0.1), data in `data_dir`; `no_fsync` adds
/// `--unsafe-no-fsync=true` (etcd 3.5 and later have it: faster, and the data is thrown away).
pub fn etcd_args(data_dir: &Path, client_port: u16, peer_port: u16, no_fsync: bool) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut args = vec![
        "--name=envtest".to_owned(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=envtest={peer}"),
    ];
    if no_fsync {
        args.push("--unsafe-no-fsync=true".to_owned());
    }
    args
}

/// The paths kube-apiserver is started with (all below the [`Envtest`] directory).
#[derive(Clone, Debug)]
pub struct ApiServerFiles {
    /// `--cert-dir`: kube-apiserver writes its self-signed serving certificate there.
    pub cert_dir: PathBuf,
    /// `--token-auth-file` ([`token_file`]).
    pub token_file: PathBuf,
    /// `--service-account-signing-key-file`: the RSA private key service-account tokens are
    /// signed with.
    pub sa_private_key: PathBuf,
    /// `--service-account-key-file`: its public key, which verifies them.
    pub sa_public_key: PathBuf,
}

/// kube-apiserver's flags (those controller-runtime's envtest passes, with token authentication):
/// secure port `port` on 127.0.0.1 only, etcd at `etcd_url`, RBAC, the token file, the
/// service-account keys and issuer (`https://127.0.0.1:PORT`), and no ServiceAccount admission.
pub fn apiserver_args(files: &ApiServerFiles, etcd_url: &str, port: u16) -> Vec<String> {
    vec![
        format!("--etcd-servers={etcd_url}"),
        "--bind-address=127.0.0.1".to_owned(),
        "--advertise-address=127.0.0.1".to_owned(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", files.cert_dir.display()),
        format!("--token-auth-file={}", files.token_file.display()),
        "--authorization-mode=RBAC".to_owned(),
        format!("--service-account-issuer=https://127.0.0.1:{port}"),
        format!("--service-account-key-file={}", files.sa_public_key.display()),
        format!("--service-account-signing-key-file={}", files.sa_private_key.display()),
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        "--allow-privileged=true".to_owned(),
        // No controller manager creates the namespaces' `default` ServiceAccounts (envtest does
        // the same).
        "--disable-admission-plugins=ServiceAccount".to_owned(),
    ]
}

/// Writes a new RSA key pair, `private` and `public` (PEM), with `openssl genrsa` and
/// `openssl rsa -pubout` (Debian's openssl). An error when openssl is missing or fails.
pub fn write_service_account_keys(private: &Path, public: &Path) -> Result<(), String> {
    run(Command::new("openssl").arg("genrsa").arg("-out").arg(private).arg("2048"))?;
    run(Command::new("openssl").arg("rsa").arg("-in").arg(private).arg("-pubout").arg("-out").arg(public))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    let out =
        cmd.stdin(Stdio::null()).output().map_err(|e| format!("{what}: {e} (Debian: apt-get install openssl curl)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{what}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A token no one can guess: 32 hex digits from `/dev/urandom`.
pub fn random_token() -> String {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut File::open("/dev/urandom").expect("/dev/urandom"), &mut bytes)
        .expect("/dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Free TCP ports on 127.0.0.1, distinct, below the ephemeral range
/// ([`crate::free_loopback_port`]).
fn free_ports<const N: usize>() -> [u16; N] {
    std::array::from_fn(|_| crate::free_loopback_port())
}

// ---------------------------------------------------------------------------------------------
// HTTP (curl)
// ---------------------------------------------------------------------------------------------

/// An HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The status code (0: no answer; `body` then holds curl's error).
    pub status: u16,
    /// The body as sent.
    pub body: String,
}

impl Answer {
    /// The body as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// True for 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// One HTTP request with `curl` (`-k`: the API server's certificate is self-signed): `method` on
/// `url`, with the bearer `token` if any, and `body` if any (content type
/// `application/merge-patch+json` for PATCH, `application/json` otherwise). Times out after 30 s.
pub fn http(method: &str, url: &str, token: Option<&str>, body: Option<&Value>) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--max-time", "30", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(token) = token {
        cmd.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    if body.is_some() {
        let content_type = if method == "PATCH" { "application/merge-patch+json" } else { "application/json" };
        cmd.args(["-H", &format!("Content-Type: {content_type}"), "--data-binary", "@-"]);
    }
    cmd.arg(url).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return Answer { status: 0, body: format!("curl: {e} (Debian: apt-get install curl)") },
    };
    let mut stdin = child.stdin.take().expect("stdin piped");
    if let Some(body) = body {
        let _ = stdin.write_all(body.to_string().as_bytes());
    }
    drop(stdin);
    let out = match child.wait_with_output() {
        Ok(out) => out,
        Err(e) => return Answer { status: 0, body: format!("curl: {e}") },
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.rsplit_once('\n').map(|(body, code)| (body, code.trim().parse::<u16>())) {
        Some((body, Ok(status))) if status != 0 => Answer { status, body: body.to_owned() },
        _ => Answer { status: 0, body: format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)) },
    }
}

// ---------------------------------------------------------------------------------------------
// The control plane
// ---------------------------------------------------------------------------------------------

/// A running etcd + kube-apiserver; both killed when dropped.
pub struct Envtest {
    /// The API server's URL, `https://127.0.0.1:PORT`.
    pub server: String,
    /// etcd's client URL, `http://127.0.0.1:PORT`.
    pub etcd_url: String,
    /// The directory everything is in (the caller's).
    pub dir: PathBuf,
    /// kubeconfig of the user `admin` (group `system:masters`: every right).
    pub admin_kubeconfig: PathBuf,
    /// kubeconfig of the ServiceAccount `runtime-hooks/runtime-hooks`, which
    /// `deploy/runtime-hooks-rbac.yaml` binds to the ClusterRole `runtime-hooks`: the identity
    /// runtime-hooks has in its DaemonSet.
    pub hooks_kubeconfig: PathBuf,
    /// kubeconfig of [`LIMITED_USER`], bound to [`LIMITED_ROLE`]: as runtime-hooks, but without
    /// any right on `nodeslos` (403 Forbidden).
    pub limited_kubeconfig: PathBuf,
    /// The bearer token of `admin`.
    pub admin_token: String,
    /// The bearer token of the ServiceAccount `runtime-hooks/runtime-hooks` (TokenRequest, valid
    /// for a day).
    pub hooks_token: String,
    /// The bearer token of [`LIMITED_USER`].
    pub limited_token: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
}

impl Envtest {
    /// Starts etcd and kube-apiserver with everything in `dir` (a fresh temp dir of the test's),
    /// and sets them up as the module documentation says; returns when the API server is ready,
    /// the CRDs are served and the bindings are in effect.
    ///
    /// Without `KUBEBUILDER_ASSETS` (unset or empty): prints [`SKIP_LINE`] to stderr and returns
    /// `None`; the test then returns without checking anything. Panics (test code) when
    /// `KUBEBUILDER_ASSETS` is set but a binary, `openssl` or `curl` is missing, or when a process
    /// does not come up (with the tail of its log).
    pub fn start(dir: &Path) -> Option<Envtest> {
        Envtest::start_from(std::env::var_os("KUBEBUILDER_ASSETS"), dir, &mut std::io::stderr())
    }

    /// [`Envtest::start`] with `assets_var` as the value of `KUBEBUILDER_ASSETS`, and the skip line
    /// written to `out`.
    pub fn start_from(assets_var: Option<OsString>, dir: &Path, out: &mut dyn Write) -> Option<Envtest> {
        let assets = match Assets::from_var(assets_var, Path::new(DEBIAN_ETCD)) {
            Ok(Some(assets)) => assets,
            Ok(None) => {
                let _ = writeln!(out, "{SKIP_LINE}");
                return None;
            }
            Err(e) => panic!("envtest: {e}"),
        };
        Some(Envtest::start_with(&assets, dir))
    }

    /// Starts the control plane from `assets` (no skipping); see [`Envtest::start`].
    pub fn start_with(assets: &Assets, dir: &Path) -> Envtest {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("envtest: creating {}: {e}", dir.display()));
        let dir = dir.canonicalize().expect("envtest dir");
        let [etcd_port, peer_port, api_port] = free_ports::<3>();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let server = format!("https://127.0.0.1:{api_port}");
        let (admin_token, limited_token) = (random_token(), random_token());
        let mut env = Envtest {
            server,
            etcd_url,
            admin_kubeconfig: dir.join("admin.kubeconfig"),
            hooks_kubeconfig: dir.join("runtime-hooks.kubeconfig"),
            limited_kubeconfig: dir.join(format!("{LIMITED_USER}.kubeconfig")),
            dir,
            admin_token,
            hooks_token: String::new(),
            limited_token,
            etcd: None,
            apiserver: None,
        };

        // etcd
        let no_fsync = help_mentions(&assets.etcd, "--unsafe-no-fsync");
        let args = etcd_args(&env.dir.join("etcd-data"), etcd_port, peer_port, no_fsync);
        env.etcd = Some(spawn(&assets.etcd, &args, &env.dir.join("etcd.log")));
        let health = format!("{}/health", env.etcd_url);
        env.wait_up(Process::Etcd, || {
            let a = http("GET", &health, None, None);
            a.status == 200 && a.json()["health"] == "true"
        });

        // kube-apiserver
        let files = ApiServerFiles {
            cert_dir: env.dir.join("certs"),
            token_file: env.dir.join("tokens.csv"),
            sa_private_key: env.dir.join("sa.key"),
            sa_public_key: env.dir.join("sa.pub"),
        };
        std::fs::create_dir_all(&files.cert_dir).expect("cert dir");
        std::fs::write(&files.token_file, token_file(&env.admin_token, &env.limited_token)).expect("token file");
        write_service_account_keys(&files.sa_private_key, &files.sa_public_key)
            .unwrap_or_else(|e| panic!("envtest: {e}"));
        let args = apiserver_args(&files, &env.etcd_url, api_port);
        env.apiserver = Some(spawn(&assets.kube_apiserver, &args, &env.dir.join("kube-apiserver.log")));
        let (readyz, token) = (format!("{}/readyz", env.server), env.admin_token.clone());
        env.wait_up(Process::ApiServer, || http("GET", &readyz, Some(&token), None).status == 200);

        // CRDs, then runtime-hooks' namespace and RBAC, then the limited user's.
        env.apply(NODESLO_CRD);
        env.apply(NODE_RESOURCE_TOPOLOGY_CRD);
        for (crd, collection) in [
            ("nodeslos.slo.koordinator.sh", "/apis/slo.koordinator.sh/v1alpha1/nodeslos"),
            (
                "noderesourcetopologies.topology.node.k8s.io",
                "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies",
            ),
        ] {
            let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}");
            env.settle(&format!("CRD {crd} established and {collection} served"), || {
                let established = env.request("GET", &path, None).json()["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Established" && c["status"] == "True"));
                established && env.request("GET", collection, None).status == 200
            });
        }
        env.apply(NAMESPACE);
        env.apply(RBAC);
        let (role, binding) = limited_role();
        env.create(&role);
        env.create(&binding);
        env.hooks_token = env.service_account_token("runtime-hooks", "runtime-hooks");

        std::fs::write(&env.admin_kubeconfig, kubeconfig(&env.server, "admin", &env.admin_token)).expect("kubeconfig");
        std::fs::write(&env.hooks_kubeconfig, kubeconfig(&env.server, "runtime-hooks", &env.hooks_token))
            .expect("kubeconfig");
        std::fs::write(&env.limited_kubeconfig, kubeconfig(&env.server, LIMITED_USER, &env.limited_token))
            .expect("kubeconfig");

        // The authorizer learns of new bindings through a watch: wait until both are in effect.
        let nodeslos = "/apis/slo.koordinator.sh/v1alpha1/nodeslos";
        env.settle("the ClusterRoleBindings in effect", || {
            env.request_as(&env.hooks_token, "GET", nodeslos, None).status == 200
                && env.request_as(&env.limited_token, "GET", "/api/v1/nodes", None).status == 200
        });
        env
    }

    /// `method` on the API server's `path` (e.g. `/api/v1/nodes`) as `admin`; see [`http()`] for
    /// the body's content type.
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        self.request_as(&self.admin_token, method, path, body)
    }

    /// `method` on the API server's `path` with the bearer `token` (e.g.
    /// [`Envtest::limited_token`], or a wrong one for a 401).
    pub fn request_as(&self, token: &str, method: &str, path: &str, body: Option<&Value>) -> Answer {
        http(method, &format!("{}{path}", self.server), Some(token), body)
    }

    /// Creates `object` as `admin` (its collection from [`collection_path`]); an object that
    /// exists already is left as it is. Panics on any other failure.
    pub fn create(&self, object: &Value) -> Answer {
        let path = collection_path(object).unwrap_or_else(|| panic!("envtest: no collection known for {object}"));
        let answer = self.request("POST", &path, Some(object));
        assert!(answer.ok() || answer.status == 409, "envtest: POST {path}: {} {}", answer.status, answer.body);
        answer
    }

    /// Creates every document of `yaml` in order, as [`Envtest::create`].
    pub fn apply(&self, yaml: &str) {
        for doc in yaml_documents(yaml).unwrap_or_else(|e| panic!("envtest: {e}")) {
            self.create(&doc);
        }
    }

    /// A token of the ServiceAccount `namespace/name` (which must exist) from the TokenRequest
    /// API, valid for a day.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token");
        let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}});
        let answer = self.request("POST", &path, Some(&request));
        match answer.json()["status"]["token"].as_str() {
            Some(token) if answer.ok() => token.to_owned(),
            _ => panic!("envtest: POST {path}: {} {}", answer.status, answer.body),
        }
    }

    /// Writes a kubeconfig named `name` for the bearer `token` into the directory; returns its
    /// path.
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig(&self.server, name, token)).expect("kubeconfig");
        path
    }

    /// Waits until `ready` holds; panics with the tail of the process's log when it exits or
    /// [`START_TIMEOUT`] passes.
    fn wait_up(&mut self, which: Process, ready: impl Fn() -> bool) {
        let (name, log) = match which {
            Process::Etcd => ("etcd", self.dir.join("etcd.log")),
            Process::ApiServer => ("kube-apiserver", self.dir.join("kube-apiserver.log")),
        };
        let start = Instant::now();
        loop {
            if ready() {
                return;
            }
            let child = match which {
                Process::Etcd => self.etcd.as_mut(),
                Process::ApiServer => self.apiserver.as_mut(),
            };
            if let Some(status) = child.and_then(|c| c.try_wait().ok().flatten()) {
                panic!("envtest: {name} exited with {status}:\n{}", tail(&log));
            }
            if start.elapsed() > START_TIMEOUT {
                panic!("envtest: {name} not ready within {START_TIMEOUT:?}:\n{}", tail(&log));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `done` holds; panics naming `what` (with the API server's log tail) after
    /// [`SETTLE_TIMEOUT`].
    fn settle(&self, what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > SETTLE_TIMEOUT {
                panic!(
                    "envtest: {what}: not within {SETTLE_TIMEOUT:?}:\n{}",
                    tail(&self.dir.join("kube-apiserver.log"))
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One of the two processes of an [`Envtest`].
#[derive(Clone, Copy)]
enum Process {
    Etcd,
    ApiServer,
}

impl Drop for Envtest {
    fn drop(&mut self) {
        // The API server first: it would log etcd's absence at length otherwise.
        for mut child in [self.apiserver.take(), self.etcd.take()].into_iter().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `binary` with `args`, stdout and stderr appended to `log`.
fn spawn(binary: &Path, args: &[String], log: &Path) -> Child {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("log file"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("envtest: spawning {}: {e}", binary.display()))
}

/// Whether `binary --help` mentions `flag` (etcd prints its help to stderr).
fn help_mentions(binary: &Path, flag: &str) -> bool {
    Command::new(binary)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag) || String::from_utf8_lossy(&o.stderr).contains(flag))
        .unwrap_or(false)
}

/// The last 30 lines of `path`.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read};

    #[test]
    fn without_kubebuilder_assets_start_prints_one_line_and_skips() {
        let dir = tempfile::tempdir().unwrap();
        for var in [None, Some(OsString::new())] {
            let mut out = Vec::new();
            assert!(Envtest::start_from(var, dir.path(), &mut out).is_none());
            assert_eq!(String::from_utf8(out).unwrap(), format!("{SKIP_LINE}\n"));
        }
        assert_eq!(
            SKIP_LINE,
            "envtest skipped: KUBEBUILDER_ASSETS is not set (run: setup-envtest use 1.31 -p path, then KUBEBUILDER_ASSETS=<dir> make test)"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing written when skipped");
    }

    fn executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn assets_come_from_the_directory_else_debians_etcd() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let fallback = d.join("fallback-etcd");
        let err = Assets::in_dir(d, &fallback).unwrap_err();
        assert!(err.contains("no executable kube-apiserver"), "{err}");

        executable(&d.join("kube-apiserver"));
        let err = Assets::in_dir(d, &fallback).unwrap_err();
        assert!(err.contains("no executable etcd") && err.contains("etcd-server"), "{err}");

        executable(&fallback);
        assert_eq!(
            Assets::in_dir(d, &fallback).unwrap(),
            Assets { kube_apiserver: d.join("kube-apiserver"), etcd: fallback.clone() }
        );
        executable(&d.join("etcd"));
        assert_eq!(Assets::in_dir(d, &fallback).unwrap().etcd, d.join("etcd"), "the directory's etcd first");

        assert_eq!(Assets::from_var(None, &fallback), Ok(None));
        assert_eq!(Assets::from_var(Some(OsString::new()), &fallback), Ok(None));
        assert_eq!(Assets::from_var(Some(d.as_os_str().to_owned()), &fallback).unwrap().unwrap().etcd, d.join("etcd"));

        // A file that is not executable does not count.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.join("etcd"), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        assert_eq!(Assets::in_dir(d, &fallback).unwrap().etcd, fallback);
    }

    #[test]
    fn token_file_has_an_admin_in_system_masters_and_a_limited_user() {
        let (admin, limited) = (random_token(), random_token());
        assert_eq!(admin.len(), 32);
        assert!(admin.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(admin, limited);
        let text = token_file(&admin, &limited);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [format!("{admin},admin,envtest-admin,\"system:masters\""), format!("{limited},limited,envtest-limited")]
        );
    }

    #[test]
    fn crds_parse_and_define_what_runtime_hooks_reads() {
        for (yaml, name, group, plural, kind) in [
            (NODESLO_CRD, "nodeslos.slo.koordinator.sh", "slo.koordinator.sh", "nodeslos", "NodeSLO"),
            (
                NODE_RESOURCE_TOPOLOGY_CRD,
                "noderesourcetopologies.topology.node.k8s.io",
                "topology.node.k8s.io",
                "noderesourcetopologies",
                "NodeResourceTopology",
            ),
        ] {
            let docs = yaml_documents(yaml).unwrap();
            assert_eq!(docs.len(), 1);
            let crd = &docs[0];
            assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
            assert_eq!(crd["kind"], "CustomResourceDefinition");
            assert_eq!(crd["metadata"]["name"], name);
            assert_eq!(crd["spec"]["group"], group);
            assert_eq!(crd["spec"]["names"]["plural"], plural);
            assert_eq!(crd["spec"]["names"]["kind"], kind);
            assert_eq!(crd["spec"]["scope"], "Cluster");
            let versions = crd["spec"]["versions"].as_array().unwrap();
            assert_eq!(versions.len(), 1);
            assert_eq!(
                (&versions[0]["name"], &versions[0]["served"], &versions[0]["storage"]),
                (&json!("v1alpha1"), &json!(true), &json!(true))
            );
            assert_eq!(collection_path(crd).unwrap(), "/apis/apiextensions.k8s.io/v1/customresourcedefinitions");
        }
        let slo = &yaml_documents(NODESLO_CRD).unwrap()[0];
        let props = &slo["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert_eq!(props["spec"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(props["status"]["x-kubernetes-preserve-unknown-fields"], true);

        let nrt = &yaml_documents(NODE_RESOURCE_TOPOLOGY_CRD).unwrap()[0];
        assert!(
            nrt["metadata"]["annotations"]["api-approved.kubernetes.io"].as_str().unwrap().starts_with("https://"),
            "a *.k8s.io group needs it"
        );
        let props = &nrt["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        assert_eq!(props["topologyPolicies"]["items"]["type"], "string");
        assert_eq!(props["zones"]["items"]["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(props["attributes"]["items"]["x-kubernetes-preserve-unknown-fields"], true);
    }

    #[test]
    fn rbac_and_namespace_parse_and_the_limited_role_lacks_only_nodeslos() {
        let docs = yaml_documents(RBAC).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]);
        let paths: Vec<String> = docs.iter().map(|d| collection_path(d).unwrap()).collect();
        assert_eq!(
            paths,
            [
                "/api/v1/namespaces/runtime-hooks/serviceaccounts",
                "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
            ]
        );
        assert_eq!(
            docs[2]["subjects"][0],
            json!({"kind": "ServiceAccount", "name": "runtime-hooks", "namespace": "runtime-hooks"})
        );
        let ns = yaml_documents(NAMESPACE).unwrap();
        assert_eq!(collection_path(&ns[0]).unwrap(), "/api/v1/namespaces");
        assert_eq!(ns[0]["metadata"]["name"], "runtime-hooks");

        let (role, binding) = limited_role();
        assert_eq!(role["metadata"]["name"], LIMITED_ROLE);
        let full = docs[1]["rules"].as_array().unwrap();
        let rules = role["rules"].as_array().unwrap();
        assert_eq!(rules.len(), full.len() - 1);
        assert!(rules.iter().all(|r| !mentions(&r["resources"], "nodeslos")));
        for resource in ["nodes", "pods", "noderesourcetopologies", "events"] {
            assert!(rules.iter().any(|r| mentions(&r["resources"], resource)), "{resource} kept");
        }
        assert_eq!(binding["roleRef"]["name"], LIMITED_ROLE);
        assert_eq!(binding["subjects"][0]["name"], LIMITED_USER);
        assert_eq!(binding["subjects"][0]["kind"], "User");
    }

    #[test]
    fn collection_paths() {
        let obj = |api: &str, kind: &str, ns: Option<&str>| json!({"apiVersion": api, "kind": kind, "metadata": {"name": "x", "namespace": ns}});
        assert_eq!(collection_path(&obj("v1", "Node", None)).unwrap(), "/api/v1/nodes");
        assert_eq!(collection_path(&obj("v1", "Pod", Some("ns1"))).unwrap(), "/api/v1/namespaces/ns1/pods");
        assert_eq!(collection_path(&obj("v1", "Event", None)).unwrap(), "/api/v1/namespaces/default/events");
        assert_eq!(
            collection_path(&obj("slo.koordinator.sh/v1alpha1", "NodeSLO", None)).unwrap(),
            "/apis/slo.koordinator.sh/v1alpha1/nodeslos"
        );
        assert_eq!(
            collection_path(&obj("topology.node.k8s.io/v1alpha1", "NodeResourceTopology", None)).unwrap(),
            "/apis/topology.node.k8s.io/v1alpha1/noderesourcetopologies"
        );
        assert_eq!(collection_path(&obj("apps/v1", "DaemonSet", Some("x"))), None);
    }

    #[test]
    fn kubeconfig_parses_with_the_server_token_and_no_tls_verification() {
        let text = kubeconfig("https://127.0.0.1:6443", "limited", "t0k3n");
        let k = &yaml_documents(&text).unwrap()[0];
        assert_eq!(k["kind"], "Config");
        assert_eq!(k["current-context"], "limited");
        assert_eq!(k["contexts"][0]["context"], json!({"cluster": "envtest", "user": "limited"}));
        assert_eq!(
            k["clusters"][0]["cluster"],
            json!({"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": true})
        );
        assert_eq!(k["users"][0], json!({"name": "limited", "user": {"token": "t0k3n"}}));
    }

    #[test]
    fn flags() {
        let files = ApiServerFiles {
            cert_dir: "/d/certs".into(),
            token_file: "/d/tokens.csv".into(),
            sa_private_key: "/d/sa.key".into(),
            sa_public_key: "/d/sa.pub".into(),
        };
        let args = apiserver_args(&files, "http://127.0.0.1:2379", 6443);
        for want in [
            "--etcd-servers=http://127.0.0.1:2379",
            "--bind-address=127.0.0.1",
            "--secure-port=6443",
            "--cert-dir=/d/certs",
            "--token-auth-file=/d/tokens.csv",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://127.0.0.1:6443",
            "--service-account-key-file=/d/sa.pub",
            "--service-account-signing-key-file=/d/sa.key",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
        let args = etcd_args(Path::new("/d/etcd"), 2379, 2380, false);
        assert!(args.contains(&"--listen-client-urls=http://127.0.0.1:2379".to_owned()));
        assert!(args.contains(&"--initial-cluster=envtest=http://127.0.0.1:2380".to_owned()));
        assert!(!args.iter().any(|a| a.starts_with("--unsafe-no-fsync")));
        assert!(etcd_args(Path::new("/d/etcd"), 1, 2, true).contains(&"--unsafe-no-fsync=true".to_owned()));
        let ports = free_ports::<3>();
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2], "{ports:?}");
    }

    #[test]
    fn service_account_keys_from_openssl() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public) = (dir.path().join("sa.key"), dir.path().join("sa.pub"));
        write_service_account_keys(&private, &public).expect("openssl (Debian: apt-get install openssl)");
        // PKCS#8 from OpenSSL 3, PKCS#1 ("RSA PRIVATE KEY") from 1.1: kube-apiserver reads both.
        let key = std::fs::read_to_string(&private).unwrap();
        assert!(key.starts_with("-----BEGIN ") && key.contains("PRIVATE KEY-----"), "{key}");
        assert!(std::fs::read_to_string(&public).unwrap().starts_with("-----BEGIN PUBLIC KEY-----"));
    }

    /// The curl helper against a one-shot HTTP/1.1 server: method, path, bearer token, JSON body
    /// and content type go out as they should; status and body come back.
    #[test]
    fn http_sends_method_token_and_body_and_reads_the_answer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/api/v1/namespaces/default/events", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_owned());
            }
            let length: usize = head.iter().find_map(|h| h.strip_prefix("Content-Length: ")).unwrap().parse().unwrap();
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let answer = r#"{"kind":"Event"}"#;
            write!(
                &conn,
                "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
                answer.len()
            )
            .unwrap();
            (head, String::from_utf8(body).unwrap())
        });
        let answer = http("POST", &url, Some("s3cr3t"), Some(&json!({"kind": "Event"})));
        let (head, body) = server.join().unwrap();
        assert_eq!(head[0], "POST /api/v1/namespaces/default/events HTTP/1.1");
        assert!(head.contains(&"Authorization: Bearer s3cr3t".to_owned()), "{head:?}");
        assert!(head.contains(&"Content-Type: application/json".to_owned()), "{head:?}");
        assert_eq!(body, r#"{"kind":"Event"}"#);
        assert_eq!(answer, Answer { status: 201, body: r#"{"kind":"Event"}"#.into() });
        assert!(answer.ok());
        assert_eq!(answer.json()["kind"], "Event");

        // Nothing listening: status 0 and curl's error.
        let port = free_ports::<1>()[0];
        let answer = http("GET", &format!("http://127.0.0.1:{port}/readyz"), None, None);
        assert_eq!(answer.status, 0, "{answer:?}");
        assert!(!answer.ok());
    }

    /// etcd alone, as [`Envtest::start_with`] starts it, when one is at hand (KUBEBUILDER_ASSETS'
    /// or Debian's): up, healthy, killed on drop. Returns at once otherwise.
    #[test]
    fn etcd_starts_healthy_when_installed() {
        let etcd = std::env::var_os("KUBEBUILDER_ASSETS")
            .map(|d| Path::new(&d).join("etcd"))
            .filter(|p| is_executable(p))
            .or_else(|| Some(PathBuf::from(DEBIAN_ETCD)).filter(|p| is_executable(p)));
        let Some(etcd) = etcd else {
            eprintln!("no etcd here (KUBEBUILDER_ASSETS, {DEBIAN_ETCD}): not started");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let [client, peer] = free_ports::<2>();
        let args = etcd_args(&dir.path().join("data"), client, peer, help_mentions(&etcd, "--unsafe-no-fsync"));
        let mut child = spawn(&etcd, &args, &dir.path().join("etcd.log"));
        let start = Instant::now();
        let health = loop {
            let a = http("GET", &format!("http://127.0.0.1:{client}/health"), None, None);
            if a.status == 200 || start.elapsed() > Duration::from_secs(20) || child.try_wait().unwrap().is_some() {
                break a;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(health.status, 200, "{health:?}\n{}", tail(&dir.path().join("etcd.log")));
        assert_eq!(health.json()["health"], "true");
    }
}
