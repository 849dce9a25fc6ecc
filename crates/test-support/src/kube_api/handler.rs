//! The HTTP side: one axum handler that authenticates, parses the path as kube-apiserver's
//! RequestInfo does, authorizes, and answers list, watch, get, create, replace, merge-patch and
//! delete with the recorded status codes, headers and body shapes.
//!
//! Every answer carries `cache-control: no-cache, private`. JSON is compact with a trailing
//! newline, or pretty-printed (two spaces, no trailing newline) for `?pretty=true` or a `curl`/
//! `Wget` user agent, as kube-apiserver does; the recorded files were taken with curl, so a
//! request sent with `User-Agent: curl/…` gets their bytes for a Status.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, Request, State as Extract};
use axum::response::Response;
use axum::Router;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, USER_AGENT};
use http::{HeaderMap, Method, StatusCode, Uri};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::resources::{parse_path, Resource, Target};
use super::select::{FieldSelector, LabelSelector};
use super::status::Status;
use super::store::{merge_patch, Change, ChangeType, Key};
use super::{RecordedRequest, State};

/// What one run of the server (between a start or restart and a stop) shares with its handlers.
#[derive(Clone)]
pub(crate) struct App {
    pub state: Arc<State>,
    /// Cancelled by `stop()`: open watches then break off their responses mid-body.
    pub cancel: CancellationToken,
}

pub(crate) fn router(app: App) -> Router {
    Router::new().fallback(handle).with_state(app)
}

/// The largest request body read (an object or a patch).
const MAX_BODY: usize = 16 << 20;

async fn handle(Extract(app): Extract<App>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let token = bearer_token(&parts.headers);
    app.state.requests.lock().unwrap().push(RecordedRequest {
        method: parts.method.clone(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        token: token.clone(),
    });
    let params = Params::parse(&parts.uri, &parts.headers);
    let reply = Reply { pretty: params.pretty };
    let Some(user) = token.filter(|t| app.state.tokens.lock().unwrap().contains_key(t)) else {
        return reply.status(Status::unauthorized());
    };
    let Some(target) = parse_path(parts.uri.path()) else {
        return page_not_found();
    };
    let (resource, namespace, name) = match &target {
        Target::Version if parts.method == Method::GET => return reply.json(StatusCode::OK, &version()),
        Target::Version => return reply.status(Status::method_not_allowed()),
        Target::Collection { resource, namespace } => {
            let selected = FieldSelector::parse(&params.field_selector, resource).ok();
            (*resource, namespace.as_deref(), selected.and_then(|s| s.name().map(str::to_owned)).unwrap_or_default())
        }
        Target::Object { resource, namespace, name } => (*resource, namespace.as_deref(), name.clone()),
    };
    let collection = matches!(target, Target::Collection { .. });
    let verb = match (&parts.method, collection) {
        (&Method::GET, true) if params.watch => "watch",
        (&Method::GET, true) => "list",
        (&Method::POST, true) if resource.namespaced == namespace.is_some() => "create",
        (&Method::GET, false) => "get",
        (&Method::PUT, false) => "update",
        (&Method::PATCH, false) => "patch",
        (&Method::DELETE, false) => "delete",
        _ => return reply.status(Status::method_not_allowed()),
    };
    let forbidden = app.state.tokens.lock().unwrap().get(&user).is_some_and(|denied| denied.contains(resource.plural));
    if forbidden {
        return reply.status(Status::forbidden(&user, verb, resource, namespace, &name));
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(e) => return reply.status(Status::bad_request(format!("reading the request body: {e}"))),
    };
    let key = Key::new(resource, namespace, &name);
    let answer = match verb {
        "watch" => return watch(&app, resource, namespace, &params),
        "list" => list(&app, resource, namespace, &params).map(|list| reply.json(StatusCode::OK, &list)),
        "create" => parse_body(&body)
            .and_then(|object| app.state.write(|s| s.create(resource, namespace, object)))
            .map(|created| reply.json(StatusCode::CREATED, &created)),
        "get" => {
            let found = app.state.store.lock().unwrap().objects.get(&key).cloned();
            found.ok_or_else(|| Status::not_found(resource, &name)).map(|object| reply.json(StatusCode::OK, &object))
        }
        "update" => parse_body(&body)
            .and_then(|new| replace(&app, resource, &key, new))
            .map(|new| reply.json(StatusCode::OK, &new)),
        "patch" => patch(&app, resource, &key, &parts.headers, &body).map(|new| reply.json(StatusCode::OK, &new)),
        _ => app.state.write(|s| s.delete(resource, &key)).map(|gone| deleted(&reply, resource, &gone)),
    };
    answer.unwrap_or_else(|status| reply.status(status))
}

fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_owned())
}

fn parse_body(body: &[u8]) -> Result<Value, Status> {
    serde_json::from_slice(body)
        .map_err(|e| Status::bad_request(format!("the body of the request could not be decoded: {e}")))
}

/// PUT: the body replaces the object; its `metadata.resourceVersion`, when set, must be the
/// stored one.
fn replace(app: &App, resource: &'static Resource, key: &Key, new: Value) -> Result<Value, Status> {
    let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(&key.name);
    if name != key.name {
        return Err(Status::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            key.name
        )));
    }
    let expect = new.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
    app.state.write(|s| s.update(resource, key, expect.as_deref(), |_| Ok(new)))
}

/// PATCH with `application/merge-patch+json` (06-patch-nodeslo.txt); other patch types are 415.
fn patch(app: &App, resource: &'static Resource, key: &Key, headers: &HeaderMap, body: &[u8]) -> Result<Value, Status> {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    if content_type.split(';').next().unwrap_or_default().trim() != "application/merge-patch+json" {
        return Err(Status::unsupported_patch(content_type));
    }
    let patch = parse_body(body)?;
    let expect = patch.pointer("/metadata/resourceVersion").and_then(Value::as_str).map(str::to_owned);
    app.state.write(|s| {
        s.update(resource, key, expect.as_deref(), |old| {
            let mut new = old.clone();
            merge_patch(&mut new, &patch);
            Ok(new)
        })
    })
}

/// A DELETE's answer: a Pod comes back as deleted (its registry returns the object), anything
/// else as a Success Status (07-delete-nodeslo.txt).
fn deleted(reply: &Reply, resource: &Resource, gone: &Value) -> Response {
    if resource.plural == "pods" {
        return reply.json(StatusCode::OK, gone);
    }
    let name = gone.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    let uid = gone.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default();
    reply.json(StatusCode::OK, &Status::deleted(resource, name, uid))
}

/// Which objects a list or watch selects.
struct Filter {
    resource: &'static Resource,
    namespace: Option<String>,
    fields: FieldSelector,
    labels: LabelSelector,
}

impl Filter {
    fn new(resource: &'static Resource, namespace: Option<&str>, params: &Params) -> Result<Filter, Status> {
        Ok(Filter {
            resource,
            namespace: namespace.map(str::to_owned),
            fields: FieldSelector::parse(&params.field_selector, resource).map_err(Status::bad_request)?,
            labels: LabelSelector::parse(&params.label_selector).map_err(Status::bad_request)?,
        })
    }

    fn selects(&self, key: &Key, object: &Value) -> bool {
        key.plural == self.resource.plural
            && self.namespace.as_ref().is_none_or(|ns| *ns == key.namespace)
            && self.fields.matches(object)
            && self.labels.matches(object)
    }

    /// The watch event line a change makes for this filter, if any: a change that takes an
    /// object out of the selection is `DELETED`, one that brings it in is `ADDED`, as
    /// kube-apiserver's watch cache filters.
    fn event(&self, change: &Change) -> Option<Bytes> {
        let now = self.selects(&change.key, &change.new);
        let before = change.old.as_ref().map(|old| self.selects(&change.key, old));
        let kind = match (change.kind, before, now) {
            (ChangeType::Added, _, true) => "ADDED",
            (ChangeType::Deleted, _, true) => "DELETED",
            (ChangeType::Modified, Some(true), true) => "MODIFIED",
            (ChangeType::Modified, Some(true), false) => "DELETED",
            (ChangeType::Modified, _, true) => "ADDED",
            _ => return None,
        };
        Some(event_line(kind, &change.new))
    }
}

/// `{"type":…,"object":…}` and a newline, as 05 and 10 frame a watch.
fn event_line(kind: &str, object: &impl Serialize) -> Bytes {
    format!("{{\"type\":\"{kind}\",\"object\":{}}}\n", serde_json::to_string(object).unwrap()).into()
}

/// GET on a collection (04, 15, 18): the selected objects in key order, `limit` per page with a
/// `continue` token for the rest (it lists from the current state, not a snapshot).
fn list(app: &App, resource: &'static Resource, namespace: Option<&str>, params: &Params) -> Result<Value, Status> {
    if params.send_initial_events.is_some() {
        return Err(Status::send_initial_events_forbidden(false));
    }
    let filter = Filter::new(resource, namespace, params)?;
    let store = app.state.store.lock().unwrap();
    let (rv, after) = match params.continue_token.as_str() {
        "" => (store.rv, None),
        token => {
            let bad = || Status::bad_request(format!("continue key is not valid: {token}"));
            let (rv, key) = token.split_once('/').ok_or_else(bad)?;
            let (namespace, name) = key.split_once('/').ok_or_else(bad)?;
            let rv: u64 = rv.parse().map_err(|_| bad())?;
            if rv < store.compacted {
                return Err(Status::expired(rv, store.compacted));
            }
            (rv, Some(Key { plural: resource.plural, namespace: namespace.into(), name: name.into() }))
        }
    };
    let mut selected = store
        .objects
        .iter()
        .filter(|(key, object)| after.as_ref().is_none_or(|a| *key > a) && filter.selects(key, object));
    let mut items = Vec::new();
    let mut last = None;
    for (key, object) in selected.by_ref().take(params.limit.unwrap_or(usize::MAX)) {
        let mut item = object.clone();
        if !resource.custom {
            // a built-in type's list items carry no apiVersion/kind (18)
            let item = item.as_object_mut().unwrap();
            item.remove("apiVersion");
            item.remove("kind");
        }
        items.push(item);
        last = Some(key);
    }
    let remaining = selected.count();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if remaining > 0 {
        let last = last.unwrap();
        metadata["continue"] = format!("{rv}/{}/{}", last.namespace, last.name).into();
        metadata["remainingItemCount"] = remaining.into();
    } else if resource.custom {
        metadata["continue"] = "".into();
    }
    let kind = format!("{}List", resource.kind);
    Ok(json!({"apiVersion": resource.api_version(), "kind": kind, "metadata": metadata, "items": items}))
}

/// GET on a collection with `watch` (05, 10): 200 at once, then one JSON event per line.
fn watch(app: &App, resource: &'static Resource, namespace: Option<&str>, params: &Params) -> Response {
    let reply = Reply { pretty: params.pretty };
    if params.send_initial_events.is_some() {
        return reply.status(Status::send_initial_events_forbidden(true));
    }
    let filter = match Filter::new(resource, namespace, params) {
        Ok(filter) => filter,
        Err(status) => return reply.status(status),
    };
    let store = app.state.store.lock().unwrap();
    // "" and "0": the current objects first, as ADDED events ("start at most recent"/"any")
    let (from, initial) = match params.resource_version.as_str() {
        "" | "0" => {
            let initial = store
                .objects
                .iter()
                .filter(|(k, o)| filter.selects(k, o))
                .map(|(_, o)| event_line("ADDED", o))
                .collect();
            (store.rv, initial)
        }
        rv => match rv.parse::<u64>() {
            Ok(rv) if rv < store.compacted => {
                let expired = event_line("ERROR", &Status::expired(rv, store.compacted));
                let once = futures_lite::stream::once(Ok::<_, io::Error>(expired));
                return watch_response(Body::from_stream(once));
            }
            Ok(rv) => (rv, Vec::new()),
            Err(_) => return reply.status(Status::bad_request(format!("resourceVersion: Invalid value: {rv:?}"))),
        },
    };
    drop(store);
    let (tx, rx) = mpsc::channel(64);
    let bookmarks = params.bookmarks.then(|| *app.state.bookmark_every.lock().unwrap());
    tokio::spawn(stream_changes(app.clone(), filter, from, initial, tx, params.timeout, bookmarks));
    watch_response(Body::from_stream(ReceiverStream::new(rx)))
}

fn watch_response(body: Body) -> Response {
    Response::builder()
        .header(CACHE_CONTROL, "no-cache, private")
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap()
}

/// Counts an open watch while alive.
struct OpenWatch(Arc<State>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Feeds one watch: the initial lines, then every selected change after `from`, a BOOKMARK
/// (apiVersion, kind and metadata.resourceVersion only, as in 05) every `bookmarks` and when
/// `timeout` expires, then the end of the body. On `stop()` the body breaks off with an error,
/// as a killed server's connection does.
async fn stream_changes(
    app: App,
    filter: Filter,
    mut from: u64,
    initial: Vec<Bytes>,
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    timeout: Option<Duration>,
    bookmarks: Option<Duration>,
) {
    app.state.open_watches.fetch_add(1, Ordering::SeqCst);
    let _open = OpenWatch(app.state.clone());
    let deadline = timeout.map(|t| Instant::now() + t);
    let every = bookmarks.unwrap_or(Duration::from_secs(3600));
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut latest = app.state.latest.subscribe();
    let bookmark = |rv: u64| {
        let object = json!({"apiVersion": filter.resource.api_version(), "kind": filter.resource.kind, "metadata": {"resourceVersion": rv.to_string()}});
        Ok(event_line("BOOKMARK", &object))
    };
    for line in initial {
        if tx.send(Ok(line)).await.is_err() {
            return;
        }
    }
    loop {
        latest.borrow_and_update();
        let (lines, rv): (Vec<Bytes>, u64) = {
            let store = app.state.store.lock().unwrap();
            (store.changes_after(from).iter().filter_map(|c| filter.event(c)).collect(), store.rv.max(from))
        };
        for line in lines {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        from = rv;
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return },
            _ = tick.tick(), if bookmarks.is_some() => if tx.send(bookmark(from)).await.is_err() { return },
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => {
                if bookmarks.is_some() {
                    let _ = tx.send(bookmark(from)).await;
                }
                return;
            }
            _ = app.cancel.cancelled() => {
                let _ = tx.send(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the stand-in API server stopped"))).await;
                return;
            }
            _ = tx.closed() => return,
        }
    }
}

/// The query parameters kube-apiserver's ListOptions take (booleans as apimachinery converts
/// them: anything but `0`/`false` is true).
struct Params {
    watch: bool,
    resource_version: String,
    field_selector: String,
    label_selector: String,
    limit: Option<usize>,
    continue_token: String,
    timeout: Option<Duration>,
    bookmarks: bool,
    send_initial_events: Option<bool>,
    pretty: bool,
}

impl Params {
    fn parse(uri: &Uri, headers: &HeaderMap) -> Params {
        let pairs = Query::<Vec<(String, String)>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default();
        let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
        let flag = |name: &str| get(name).map(|v| v != "0" && !v.eq_ignore_ascii_case("false"));
        let agent = headers.get(USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let pretty = match get("pretty") {
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
            _ => agent.starts_with("curl") || agent.starts_with("Wget"),
        };
        Params {
            watch: flag("watch").unwrap_or(false),
            resource_version: get("resourceVersion").unwrap_or_default().to_owned(),
            field_selector: get("fieldSelector").unwrap_or_default().to_owned(),
            label_selector: get("labelSelector").unwrap_or_default().to_owned(),
            limit: get("limit").and_then(|v| v.parse::<usize>().ok()).filter(|&n| n > 0),
            continue_token: get("continue").unwrap_or_default().to_owned(),
            timeout: get("timeoutSeconds").and_then(|v| v.parse().ok()).map(Duration::from_secs),
            bookmarks: flag("allowWatchBookmarks").unwrap_or(false),
            send_initial_events: flag("sendInitialEvents"),
            pretty,
        }
    }
}

/// How to encode an answer.
struct Reply {
    pretty: bool,
}

impl Reply {
    fn json(&self, code: StatusCode, body: &impl Serialize) -> Response {
        let bytes = match self.pretty {
            true => serde_json::to_vec_pretty(body).unwrap(),
            false => {
                let mut bytes = serde_json::to_vec(body).unwrap();
                bytes.push(b'\n');
                bytes
            }
        };
        let mut response = Response::builder()
            .status(code)
            .header(CACHE_CONTROL, "no-cache, private")
            .header(CONTENT_TYPE, "application/json")
            .body(Body::from(bytes))
            .unwrap();
        if code == StatusCode::FORBIDDEN {
            // as 11 shows (the 401 of 12 and the 404 of 13 have none)
            response.headers_mut().insert("x-content-type-options", "nosniff".parse().unwrap());
        }
        response
    }

    fn status(&self, status: Status) -> Response {
        self.json(StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &status)
    }
}

/// A path nothing serves (19-list-nodeslo-nocrd-group.txt): Go's `http.NotFound`.
fn page_not_found() -> Response {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(CACHE_CONTROL, "no-cache, private")
        .header(CONTENT_TYPE, "text/plain; charset=utf-8")
        .header("x-content-type-options", "nosniff")
        .body(Body::from("404 page not found\n"))
        .unwrap()
}

/// `GET /version` (not recorded; the fields of `version.Info`, for a client's reachability check).
fn version() -> Value {
    json!({
        "major": "1", "minor": "31", "gitVersion": "v1.31.14", "gitCommit": "", "gitTreeState": "clean",
        "buildDate": "", "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64",
    })
}
