//! A loopback stand-in for kube-apiserver v1.31, for tests of a component that watches and
//! writes through kube-rs (runtime-hooks' cluster rule source) when no API server can be had.
//!
//! # Source
//!
//! It answers as the real server answered in the exchanges recorded in `fixtures/k8s-wire/`
//! (files 01–20 there; each item below names the file it follows): the same status codes,
//! `content-type`, and body shapes, over plain HTTP (HTTP/1.1 and h2c) on `127.0.0.1`.
//!
//! # Modules
//!
//! * `resources` — what is served: core v1 `nodes`, `pods`, `events`, `namespaces`,
//!   `serviceaccounts`, `configmaps`; `slo.koordinator.sh/v1alpha1` `nodeslos` and
//!   `topology.node.k8s.io/v1alpha1` `noderesourcetopologies` (cluster-scoped custom resources).
//! * `store` — the objects, the global resourceVersion, the history watches replay.
//! * `handler` — list, watch, get, create, replace, merge-patch, delete; 401/403/404/410/422.
//! * `select` — field and label selectors. `status` — the Status bodies.
//!
//! # Use
//!
//! A test drives it two ways: through HTTP like any client (kube-rs from the kubeconfig that
//! [`KubeApi::kubeconfig`] writes), and through the control methods here, which change the store
//! as another client of the API server would (every change is seen by open watches).
//!
//! # Where it differs from kube-apiserver
//!
//! * no `managedFields`, and no defaulting of built-in types (a Pod gets no `restartPolicy`,
//!   `status.phase`, …, a Node no `status`, quantities are not canonicalised); only empty
//!   `metadata` members are dropped, as ObjectMeta's `omitempty` does;
//! * JSON keys come out sorted (kube-apiserver sorts them for custom resources only);
//! * resourceVersions start at 1 ([`KubeApi::set_resource_version`] moves them on); a list's
//!   `continue` pages the current state, not a snapshot; a watch from any resourceVersion not
//!   compacted away is served (the real watch cache also refuses one far in the future);
//! * bookmarks every second (the real server sends them about once a minute, and before a
//!   watch's timeout as here); bookmarks of built-in types as of custom ones (apiVersion, kind,
//!   metadata.resourceVersion only);
//! * only merge patches (others are 415); PUT and PATCH never create; a Pod's DELETE removes it
//!   at once (no graceful deletion); no subresources (`/status`, `/binding`: 404 page not found),
//!   no watch on an object's own path;
//! * no admission, quota, RBAC objects, discovery documents or protobuf; `GET /version` answers a
//!   made-up v1.31.14;
//! * a missing token is 401 as an unknown one (the real server, with anonymous auth on, maps it
//!   to `system:anonymous` and answers 403).

mod handler;
mod resources;
mod select;
mod status;
mod store;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use resources::Resource;
use store::{Key, Store};

/// One request the stand-in received, in arrival order (also those answered 401/403/404).
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The HTTP method (`GET`: get, list, watch; `POST`: create; `PUT`, `PATCH`: update, patch).
    pub method: http::Method,
    /// The path without the query (`/api/v1/pods`).
    pub path: String,
    /// The raw query string, `""` when none (`fieldSelector=spec.nodeName%3Dnode-a&limit=500`).
    pub query: String,
    /// The bearer token sent, if any.
    pub token: Option<String>,
}

impl RecordedRequest {
    /// A query parameter, URL-decoded (`param("fieldSelector")` → `spec.nodeName=node-a`).
    pub fn param(&self, name: &str) -> Option<String> {
        let uri: http::Uri = format!("/?{}", self.query).parse().ok()?;
        let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri).ok()?.0;
        pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// A watch: GET with `watch` set to anything but `0`/`false`.
    pub fn is_watch(&self) -> bool {
        self.method == http::Method::GET
            && self.param("watch").is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
    }

    /// A list: GET on `path` (a collection path such as `/api/v1/pods`) without `watch`.
    pub fn is_list_of(&self, path: &str) -> bool {
        self.method == http::Method::GET && self.path == path && !self.is_watch()
    }
}

/// What the handlers and the control methods share; outlives a stop/restart.
pub(crate) struct State {
    store: Mutex<Store>,
    /// The latest resourceVersion, for open watches to wake on.
    latest: tokio::sync::watch::Sender<u64>,
    /// Known bearer tokens (the user name is the token) → the resources each may not touch.
    tokens: Mutex<HashMap<String, HashSet<String>>>,
    requests: Mutex<Vec<RecordedRequest>>,
    bookmark_every: Mutex<Duration>,
    open_watches: AtomicUsize,
}

impl State {
    /// Runs a change on the store, then wakes the watches.
    fn write<T>(&self, change: impl FnOnce(&mut Store) -> T) -> T {
        let (out, rv) = {
            let mut store = self.store.lock().unwrap();
            let out = change(&mut store);
            (out, store.rv)
        };
        self.latest.send_replace(rv);
        out
    }
}

/// A running server (between a start/restart and a stop).
struct Running {
    task: JoinHandle<()>,
    cancel: CancellationToken,
}

struct Inner {
    state: Arc<State>,
    port: u16,
    running: Mutex<Option<Running>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(running) = self.running.get_mut().unwrap().take() {
            running.cancel.cancel();
            running.task.abort();
        }
    }
}

/// The stand-in API server. Clones share one server; it stops when the last is dropped.
#[derive(Clone)]
pub struct KubeApi {
    inner: Arc<Inner>,
}

impl KubeApi {
    /// The bearer token of the user [`KubeApi::kubeconfig`] writes, allowed everything (user
    /// name `admin`).
    pub const TOKEN: &'static str = "admin";

    /// Starts serving on `127.0.0.1` on a free port, with an empty store at resourceVersion 1 and
    /// one known token, [`KubeApi::TOKEN`].
    pub async fn start() -> KubeApi {
        let (latest, _) = tokio::sync::watch::channel(1);
        let state = Arc::new(State {
            store: Mutex::new(Store::new()),
            latest,
            tokens: Mutex::new(HashMap::from([(KubeApi::TOKEN.to_owned(), HashSet::new())])),
            requests: Mutex::new(Vec::new()),
            bookmark_every: Mutex::new(Duration::from_secs(1)),
            open_watches: AtomicUsize::new(0),
        });
        let listener = bind(0).expect("kube_api: binding 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let running = serve(listener, state.clone());
        KubeApi { inner: Arc::new(Inner { state, port, running: Mutex::new(Some(running)) }) }
    }

    /// The port it listens on (the same after [`KubeApi::restart`]).
    pub fn port(&self) -> u16 {
        self.inner.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.inner.port)
    }

    /// Writes `dir/kubeconfig` for the [`KubeApi::TOKEN`] user and returns its path: one
    /// cluster (`server: http://127.0.0.1:PORT`), one user with a bearer token, one context
    /// (namespace `default`) that is the current one. `kube::Config::from_custom_kubeconfig`,
    /// `KUBECONFIG` and a `--kubeconfig FILE` flag read it.
    pub fn kubeconfig(&self, dir: impl AsRef<Path>) -> PathBuf {
        self.write_kubeconfig(dir.as_ref().join("kubeconfig"), KubeApi::TOKEN)
    }

    /// Writes `dir/kubeconfig-TOKEN` as [`KubeApi::kubeconfig`] but for the user with bearer
    /// `token` (which need not be known: an unknown one is answered 401, as 12).
    pub fn kubeconfig_with_token(&self, dir: impl AsRef<Path>, token: &str) -> PathBuf {
        let file: String =
            token.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        self.write_kubeconfig(dir.as_ref().join(format!("kubeconfig-{file}")), token)
    }

    fn write_kubeconfig(&self, path: PathBuf, token: &str) -> PathBuf {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: {}\n\
             users:\n- name: {user}\n  user:\n    token: {token}\n\
             contexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: {user}\n    namespace: default\n\
             current-context: stand-in\n",
            self.url(),
            user = serde_json::to_string(token).unwrap(),
            token = serde_json::to_string(token).unwrap(),
        );
        std::fs::write(&path, yaml).unwrap_or_else(|e| panic!("kube_api: writing {}: {e}", path.display()));
        path
    }

    /// Makes `token` known (user name = the token), allowed everything not forbidden to it.
    pub fn add_token(&self, token: &str) {
        self.inner.state.tokens.lock().unwrap().entry(token.to_owned()).or_default();
    }

    /// Forgets `token`: its requests answer 401 (12), as after a revoked service-account token.
    pub fn remove_token(&self, token: &str) {
        self.inner.state.tokens.lock().unwrap().remove(token);
    }

    /// Makes every request of `token` (made known if it is not) on the resource `plural`
    /// (`nodeslos`, `pods`, …) answer 403 Forbidden naming user, verb, resource and group (11).
    pub fn set_forbidden(&self, token: &str, plural: &str) {
        Resource::by_plural(plural);
        self.inner.state.tokens.lock().unwrap().entry(token.to_owned()).or_default().insert(plural.to_owned());
    }

    /// Undoes [`KubeApi::set_forbidden`].
    pub fn set_allowed(&self, token: &str, plural: &str) {
        if let Some(denied) = self.inner.state.tokens.lock().unwrap().get_mut(token) {
            denied.remove(plural);
        }
    }

    /// Creates `object` (its `apiVersion` and `kind` pick the resource; a namespaced one without
    /// `metadata.namespace` goes to `default`) as a POST would (01, 03, 14, 17, 20) and returns
    /// it as stored. Panics when it exists, names no served resource, or has no name.
    pub fn create(&self, object: Value) -> Value {
        let resource = resource_of(&object);
        self.inner
            .state
            .write(|s| s.create(resource, None, object))
            .unwrap_or_else(|status| panic!("kube_api create: {}", status.message))
    }

    /// Creates `object`, or replaces the stored one of that name (keeping its uid and
    /// creationTimestamp; a new resourceVersion only when something changed; a
    /// `metadata.resourceVersion` in `object` is ignored). Returns it as stored.
    pub fn apply(&self, mut object: Value) -> Value {
        let resource = resource_of(&object);
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let namespace = match resource.namespaced {
            true => Some(object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default").to_owned()),
            false => None,
        };
        let key = Key::new(resource, namespace.as_deref(), &name);
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("resourceVersion");
        }
        self.inner
            .state
            .write(|s| match s.objects.contains_key(&key) {
                true => s.update(resource, &key, None, |_| Ok(object)),
                false => s.create(resource, None, object),
            })
            .unwrap_or_else(|status| panic!("kube_api apply: {}", status.message))
    }

    /// Applies the RFC 7386 merge patch `patch` to an object, as a PATCH with
    /// `application/merge-patch+json` does (06), and returns the result. `plural` names the
    /// resource (`nodeslos`); `namespace` is `Some` exactly for a namespaced one. Panics when
    /// the object does not exist.
    pub fn merge_patch(&self, plural: &str, namespace: Option<&str>, name: &str, patch: Value) -> Value {
        let (resource, key) = key(plural, namespace, name);
        self.inner
            .state
            .write(|s| {
                s.update(resource, &key, None, |old| {
                    let mut new = old.clone();
                    store::merge_patch(&mut new, &patch);
                    Ok(new)
                })
            })
            .unwrap_or_else(|status| panic!("kube_api merge_patch: {}", status.message))
    }

    /// Deletes an object as a DELETE does (07): watches get `DELETED` with its last state and a
    /// new resourceVersion, which is what this returns; `None` when there was no such object.
    pub fn delete(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let (resource, key) = key(plural, namespace, name);
        self.inner.state.write(|s| s.delete(resource, &key)).ok()
    }

    /// The stored object, as a GET answers it (02).
    pub fn get(&self, plural: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let (_, key) = key(plural, namespace, name);
        self.inner.state.store.lock().unwrap().objects.get(&key).cloned()
    }

    /// Every stored object of the resource `plural`, in list order (namespace, then name).
    pub fn list(&self, plural: &str) -> Vec<Value> {
        let plural = Resource::by_plural(plural).plural;
        let store = self.inner.state.store.lock().unwrap();
        store.objects.iter().filter(|(k, _)| k.plural == plural).map(|(_, o)| o.clone()).collect()
    }

    /// The current (last given out) resourceVersion, what a list answers in
    /// `metadata.resourceVersion` (04).
    pub fn resource_version(&self) -> u64 {
        self.inner.state.store.lock().unwrap().rv
    }

    /// Every core v1 Event created so far (by clients' `POST …/events`, as 20, or by
    /// [`KubeApi::create`]), in order, as stored; later deletions do not remove them here.
    pub fn events(&self) -> Vec<Value> {
        self.inner.state.store.lock().unwrap().events.clone()
    }

    /// Moves the resourceVersion counter on to `rv` (the next write gets `rv + 1`), as if other
    /// writes had happened meanwhile: to start where a recording did (01 gets 208 after
    /// `set_resource_version(207)`) or to look like a busy cluster. Panics if `rv` is below the
    /// current one (resourceVersions never go back).
    pub fn set_resource_version(&self, rv: u64) {
        self.inner.state.write(|s| {
            assert!(rv >= s.rv, "kube_api: resourceVersion {rv} is below the current {}", s.rv);
            s.rv = rv;
        });
    }

    /// Compacts history: a watch from any resourceVersion older than the current one gets the
    /// `ERROR` event with a 410 `Expired` Status (10), so kube-rs's watcher lists again.
    pub fn compact(&self) {
        let mut store = self.inner.state.store.lock().unwrap();
        store.compacted = store.rv;
    }

    /// How often an open watch with `allowWatchBookmarks=true` gets a `BOOKMARK` (default 1 s;
    /// applies to watches opened afterwards).
    pub fn set_bookmark_interval(&self, every: Duration) {
        *self.inner.state.bookmark_every.lock().unwrap() = every;
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.state.requests.lock().unwrap().clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        self.inner.state.requests.lock().unwrap().clear();
    }

    /// Waits until a received request (also one before the call; see
    /// [`KubeApi::clear_requests`]) satisfies `matches`, and returns it. Panics after `timeout`.
    pub async fn wait_for_request(
        &self,
        timeout: Duration,
        matches: impl Fn(&RecordedRequest) -> bool,
    ) -> RecordedRequest {
        let found = tokio::time::timeout(timeout, async {
            loop {
                if let Some(r) = self.inner.state.requests.lock().unwrap().iter().find(|r| matches(r)) {
                    return r.clone();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        found.await.unwrap_or_else(|_| {
            panic!("kube_api: no such request within {timeout:?}; received: {:#?}", self.requests())
        })
    }

    /// Watches being served now.
    pub fn open_watches(&self) -> usize {
        self.inner.state.open_watches.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` watches are open (a client is caught up and listening).
    /// Panics after `timeout`.
    pub async fn wait_for_watches(&self, count: usize, timeout: Duration) {
        let waited = tokio::time::timeout(timeout, async {
            while self.open_watches() < count {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        waited.await.unwrap_or_else(|_| {
            panic!("kube_api: {} watches open after {timeout:?}, not {count}", self.open_watches())
        });
    }

    /// Stops like a killed kube-apiserver: the port is closed (connections are refused) and
    /// every open connection is dropped, open watches mid-body. The store stays, for
    /// [`KubeApi::restart`]. Does nothing when stopped already.
    pub async fn stop(&self) {
        let running = self.inner.running.lock().unwrap().take();
        if let Some(running) = running {
            running.cancel.cancel();
            running.task.abort();
            let _ = running.task.await;
        }
    }

    /// Serves again on the same port with the same store, as a restarted kube-apiserver with its
    /// etcd: resourceVersions go on where they were. Does nothing when running.
    pub async fn restart(&self) {
        let mut running = self.inner.running.lock().unwrap();
        if running.is_none() {
            let listener = bind(self.inner.port)
                .unwrap_or_else(|e| panic!("kube_api: binding 127.0.0.1:{} again: {e}", self.inner.port));
            *running = Some(serve(listener, self.inner.state.clone()));
        }
    }

    /// Whether it serves now (not between [`KubeApi::stop`] and [`KubeApi::restart`]).
    pub fn is_running(&self) -> bool {
        self.inner.running.lock().unwrap().is_some()
    }
}

fn resource_of(object: &Value) -> &'static Resource {
    let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    Resource::by_kind(api_version, kind).unwrap_or_else(|| panic!("kube_api: {api_version} {kind} is not served"))
}

fn key(plural: &str, namespace: Option<&str>, name: &str) -> (&'static Resource, Key) {
    let resource = Resource::by_plural(plural);
    assert_eq!(
        resource.namespaced,
        namespace.is_some(),
        "kube_api: {plural} are {}namespaced",
        if resource.namespaced { "" } else { "not " }
    );
    (resource, Key::new(resource, namespace, name))
}

/// A listener on `127.0.0.1:port` with SO_REUSEADDR, so a restart can take the port back while
/// the old connections linger in TIME_WAIT.
fn bind(port: u16) -> std::io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
    socket.listen(1024)
}

/// Accepts connections and serves each (HTTP/1.1 or h2c) in a task of its own; aborting the
/// returned task drops the listener and every connection with it.
fn serve(listener: TcpListener, state: Arc<State>) -> Running {
    let cancel = CancellationToken::new();
    let router = handler::router(handler::App { state, cancel: cancel.clone() });
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let service = TowerToHyperService::new(router.clone());
                        connections.spawn(async move {
                            let builder = auto::Builder::new(TokioExecutor::new());
                            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    });
    Running { task, cancel }
}
