//! The store in Docker mode, rebuilt from dockerd: every container named the dockershim way
//! (`GET /containers/json?all=1`, then `GET /containers/{id}/json` for each), at start-up
//! (retrying while dockerd is not reachable) and every [`SWEEP_INTERVAL`] (which also drops
//! entries of containers removed behind the proxy's back); and one container at a time for a
//! call about an object the store does not know ([`fetch`]).
//!
//! An inspect answer yields the same entry as the create call did ([`model`]): a sandbox's pod
//! metadata (from its name), labels, annotations, cgroup parent and resources; a container's pod
//! fields (from its sandbox), name, attempt, ID, annotations and resources — the hooks' changes
//! included, since they were written into the container's configuration. Envs are not read: the
//! store keeps none ([`crate::hooks::store`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::UnixStream;

use super::model::{self, DockerObject, KubeName};
use crate::hooks::store::{sweep, RETRY_FIRST, RETRY_MAX, SWEEP_INTERVAL};
use crate::hooks::store::{ContainerEntry, Store};

/// Time allowed for one call to dockerd during recovery.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `GET path` on dockerd's socket, over a connection of its own; the JSON answer.
///
/// Errors: dockerd unreachable, a non-2xx status (its message), an answer that is not JSON;
/// each names the path.
pub async fn get_json(socket: &Path, path: &str) -> Result<Value, String> {
    let call = async {
        let stream =
            UnixStream::connect(socket).await.map_err(|e| format!("connecting to unix://{}: {e}", socket.display()))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::get(path)
            .header(http::header::HOST, "docker")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| format!("GET {path}: {e}"))?;
        let status = resp.status();
        let body = resp.into_body().collect().await.map_err(|e| format!("GET {path}: {e}"))?.to_bytes();
        if !status.is_success() {
            return Err(format!("GET {path}: {status}: {}", String::from_utf8_lossy(&body).trim()));
        }
        serde_json::from_slice(&body).map_err(|e| format!("GET {path}: answer is not JSON: {e}"))
    };
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("GET {path}: no answer within {CALL_TIMEOUT:?}"))?
}

/// An inspect answer's `Config` without what its image added: dockerd merges the image's `Env`
/// and `Labels` into the container's, while the create call (and so the entry made then) had
/// only the client's. Entries equal to the image's are dropped (a client that set exactly the
/// image's value cannot be told apart; the image's value is what the container has either way).
async fn own_config(socket: &Path, inspect: &Value) -> Option<Value> {
    let mut config = inspect.get("Config")?.clone();
    let image = inspect.get("Image").and_then(Value::as_str).unwrap_or("");
    let Ok(image) = get_json(socket, &format!("/images/{image}/json")).await else { return Some(config) };
    let image_config = image.get("Config");
    if let (Some(Value::Array(env)), Some(Value::Array(image_env))) =
        (config.get_mut("Env"), image_config.and_then(|c| c.get("Env")))
    {
        env.retain(|e| !image_env.contains(e));
    }
    if let (Some(Value::Object(labels)), Some(Value::Object(image_labels))) =
        (config.get_mut("Labels"), image_config.and_then(|c| c.get("Labels")))
    {
        labels.retain(|k, v| image_labels.get(k) != Some(v));
    }
    Some(config)
}

/// The store entry an inspect answer describes, recorded in `store`; `None` for a container
/// not named the dockershim way. A container whose sandbox the store does not know has its
/// sandbox inspected too (once).
pub async fn record(socket: &Path, store: &Store, inspect: &Value) -> Option<DockerObject> {
    let id = inspect.get("Id")?.as_str()?.to_owned();
    let kube = KubeName::parse(inspect.get("Name")?.as_str()?)?;
    let own = own_config(socket, inspect).await;
    let config = own.as_ref();
    let host_config = inspect.get("HostConfig");
    if model::is_sandbox(&model::labels_of(config), &kube) {
        let pod = model::pod_request(&kube, config, host_config);
        store.put_pod(&id, pod.clone());
        return Some(DockerObject::Sandbox(id, pod));
    }
    let sandbox_id = model::labels_of(config).get(model::SANDBOX_ID_LABEL).cloned().unwrap_or_default();
    let mut pod = store.pod(&sandbox_id);
    if pod.is_none() && !sandbox_id.is_empty() {
        if let Ok(sandbox) = get_json(socket, &format!("/containers/{sandbox_id}/json")).await {
            let kube = sandbox.get("Name").and_then(Value::as_str).and_then(KubeName::parse);
            if let Some(kube) = kube {
                let own = own_config(socket, &sandbox).await;
                let p = model::pod_request(&kube, own.as_ref(), sandbox.get("HostConfig"));
                store.put_pod(&sandbox_id, p.clone());
                pod = Some(p);
            }
        }
    }
    let mut hook = model::container_request(&kube, pod.as_ref(), config, host_config);
    hook.container_meta.get_or_insert_with(Default::default).id = id.clone();
    // Not kept (see `crate::hooks::store`): the entry returned is the one stored.
    hook.container_envs.clear();
    if let Some(r) = hook.container_resources.as_mut() {
        // dockerd reports a create's `MemorySwap: 0` (its default) as twice the memory limit;
        // the entry made at create holds the 0 (a client asking for exactly twice looks the same).
        if r.memory_limit_in_bytes > 0 && r.memory_swap_limit_in_bytes == r.memory_limit_in_bytes.saturating_mul(2) {
            r.memory_swap_limit_in_bytes = 0;
        }
    }
    let entry = ContainerEntry { sandbox_id, hook };
    store.put_container(&id, entry.clone());
    Some(DockerObject::Container(id, entry))
}

/// For a call about `id` (full ID, short ID or name) the store does not know: inspects it and
/// records it. `None` when dockerd does not know it or it is not a pod's container (logged at
/// debug; the call then passes through and dockerd answers it).
pub async fn fetch(socket: &Path, store: &Store, id: &str) -> Option<DockerObject> {
    match get_json(socket, &format!("/containers/{id}/json")).await {
        Ok(inspect) => {
            // A short ID or a name of something the store knows by its full ID: the stored entry
            // (made at create, hooks' changes included) is the exact one.
            let full = inspect.get("Id").and_then(Value::as_str).unwrap_or("");
            if let Some(e) = store.container(full) {
                return Some(DockerObject::Container(full.to_owned(), e));
            }
            if let Some(p) = store.pod(full) {
                return Some(DockerObject::Sandbox(full.to_owned(), p));
            }
            let known = record(socket, store, &inspect).await;
            if known.is_some() {
                tracing::info!(id, "store miss: container recovered from dockerd");
            }
            known
        }
        Err(e) => {
            tracing::debug!(id, error = %e, "store miss: dockerd has no such container");
            None
        }
    }
}

/// Rebuilds the store from dockerd: returns (pod sandboxes, containers) recorded. Entries of
/// containers dockerd no longer has are removed.
///
/// Errors: dockerd cannot list its containers.
pub async fn rebuild(socket: &Path, store: &Store) -> Result<(usize, usize), String> {
    let listed = get_json(socket, "/containers/json?all=1").await?;
    let mut ids: Vec<(bool, String)> = Vec::new();
    for c in listed.as_array().into_iter().flatten() {
        let name =
            c.get("Names").and_then(Value::as_array).and_then(|n| n.first()).and_then(Value::as_str).unwrap_or("");
        let (Some(kube), Some(id)) = (KubeName::parse(name), c.get("Id").and_then(Value::as_str)) else { continue };
        let labels = model::labels_of(Some(c));
        ids.push((model::is_sandbox(&labels, &kube), id.to_owned()));
    }
    // Sandboxes first, so their containers find them in the store.
    ids.sort_by_key(|(sandbox, _)| !sandbox);
    let (mut pods, mut containers) = (HashSet::new(), HashSet::new());
    for (_, id) in &ids {
        match get_json(socket, &format!("/containers/{id}/json")).await {
            Ok(inspect) => match record(socket, store, &inspect).await {
                Some(DockerObject::Sandbox(id, _)) => {
                    pods.insert(id);
                }
                Some(DockerObject::Container(id, _)) => {
                    containers.insert(id);
                }
                None => {}
            },
            Err(e) => tracing::debug!(id, error = %e, "recovery: container gone while listing"),
        }
    }
    sweep(store, &pods, &containers);
    Ok((pods.len(), containers.len()))
}

/// The store's keeper in Docker mode, for the proxy's lifetime: [`rebuild`] at start-up
/// (retrying with backoff while dockerd is not reachable) and every [`SWEEP_INTERVAL`].
pub async fn keep_store(socket: PathBuf, store: Arc<Store>) {
    let mut why = "start-up";
    loop {
        let mut delay = RETRY_FIRST;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let start = Instant::now();
            match rebuild(&socket, &store).await {
                Ok((pods, containers)) => {
                    tracing::info!(
                        why,
                        attempts,
                        "store recovered: {pods} pod sandboxes, {containers} containers in {} ms",
                        start.elapsed().as_millis()
                    );
                    break;
                }
                Err(e) => {
                    if attempts == 1 {
                        tracing::info!(backend = %socket.display(), error = %e, why, "dockerd not ready; store recovery retries until it is");
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
        tokio::time::sleep(SWEEP_INTERVAL).await;
        why = "periodic sweep";
    }
}
