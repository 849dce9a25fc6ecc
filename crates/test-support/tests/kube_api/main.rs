//! The stand-in API server (`test_support::kube_api`) driven by kube-rs's own client and watcher,
//! as runtime-hooks' rule source will drive it; `wire.rs` replays the recorded exchanges of
//! `fixtures/k8s-wire/` against it. No test waits for anything without a deadline.

mod wire;

use std::future::Future;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, Pod};
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use serde_json::{json, Value};
use test_support::kube_api::KubeApi;

/// The most any one step may take.
const STEP: Duration = Duration::from_secs(10);

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A kube-rs client from the kubeconfig the stand-in writes (for `token`'s user, or the admin).
async fn client(api: &KubeApi, dir: &tempfile::TempDir, token: Option<&str>) -> Client {
    let path = match token {
        Some(token) => api.kubeconfig_with_token(dir.path(), token),
        None => api.kubeconfig(dir.path()),
    };
    let kubeconfig = Kubeconfig::read_from(&path).expect("the kubeconfig parses");
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("a kube config");
    assert_eq!(config.cluster_url.to_string(), format!("{}/", api.url()));
    Client::try_from(config).expect("a kube client")
}

fn nodeslo_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("slo.koordinator.sh", "v1alpha1", "NodeSLO"), "nodeslos")
}

fn nodeslo(name: &str, policy: &str) -> Value {
    json!({
        "apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": name},
        "spec": {"resourceUsedThresholdWithBE": {"enable": true, "cpuSuppressPolicy": policy}},
    })
}

fn pod(namespace: &str, name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"koordinator.sh/qosClass": "BE"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    })
}

/// Polls `stream` in a task of its own (a watcher only opens its watch while polled) and hands
/// its items over a channel.
fn drive<S>(stream: S) -> tokio::sync::mpsc::UnboundedReceiver<S::Item>
where
    S: futures::Stream + Send + 'static,
    S::Item: Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    rx
}

fn policy(slo: &DynamicObject) -> &str {
    slo.data["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressPolicy"].as_str().unwrap_or_default()
}

fn api_error(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("not an API error: {other:?}"),
    }
}

#[tokio::test]
async fn lists_select_by_field_and_page() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = client(&api, &dir, None).await;
    api.create(nodeslo("node-a", "cfsQuota"));
    api.create(nodeslo("node-b", "cfsQuota"));
    api.create(pod("kube-system", "p2", "node-a"));
    api.create(pod("default", "p1", "node-a"));
    api.create(pod("default", "p3", "node-b"));
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}));

    let slos = Api::<DynamicObject>::all_with(client.clone(), &nodeslo_resource());
    let listed =
        within("list", slos.list(&ListParams::default().fields("metadata.name=node-a").limit(500))).await.unwrap();
    assert_eq!(listed.items.iter().map(|o| o.name_any()).collect::<Vec<_>>(), ["node-a"]);
    assert_eq!(listed.metadata.resource_version, Some(api.resource_version().to_string()));
    assert_eq!(listed.items[0].metadata.generation, Some(1));

    let pods = Api::<Pod>::all(client.clone());
    let on_a = within("list pods", pods.list(&ListParams::default().fields("spec.nodeName=node-a"))).await.unwrap();
    let names: Vec<_> = on_a.items.iter().map(|p| format!("{}/{}", p.namespace().unwrap(), p.name_any())).collect();
    assert_eq!(names, ["default/p1", "kube-system/p2"], "all namespaces, in key order");
    let request = api.requests().into_iter().find(|r| r.is_list_of("/api/v1/pods")).expect("the list was recorded");
    assert_eq!(request.param("fieldSelector").as_deref(), Some("spec.nodeName=node-a"));

    let be = pods
        .list(&ListParams::default().labels("koordinator.sh/qosClass=BE").fields("spec.nodeName!=node-a"))
        .await
        .unwrap();
    assert_eq!(be.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["p3"]);
    let first = pods.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!((first.items.len(), first.metadata.remaining_item_count), (2, Some(1)));
    let rest = pods
        .list(&ListParams::default().limit(2).continue_token(first.metadata.continue_.as_deref().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        rest.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["p2"],
        "default/p1, default/p3, then kube-system/p2"
    );

    let version = within("version", client.apiserver_version()).await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str(), version.git_version.as_str()), ("1", "31", "v1.31.14"));
    let node = within("get node", Api::<Node>::all(client.clone()).get("node-a")).await.unwrap();
    assert!(node.metadata.uid.is_some() && node.metadata.creation_timestamp.is_some());
    let bad = within("bad selector", pods.list(&ListParams::default().fields("spec.foo=x"))).await.unwrap_err();
    assert_eq!(api_error(bad).code, 400);
}

#[tokio::test]
async fn watch_sees_patch_delete_and_bookmarks() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let slos = Api::<DynamicObject>::all_with(client(&api, &dir, None).await, &nodeslo_resource());
    api.create(nodeslo("node-a", "cfsQuota"));
    api.create(nodeslo("node-b", "cfsQuota"));
    let rv = api.resource_version().to_string();
    let params = WatchParams::default().fields("metadata.name=node-a").timeout(5);
    let mut events = within("watch", slos.watch(&params, &rv)).await.unwrap().boxed();
    let mut next = async || loop {
        match within("a watch event", events.try_next()).await.unwrap().expect("the watch goes on") {
            WatchEvent::Bookmark(_) => continue,
            event => return event,
        }
    };

    api.merge_patch("nodeslos", None, "node-b", json!({"spec": {"resourceUsedThresholdWithBE": {"enable": false}}}));
    let patched = api.merge_patch(
        "nodeslos",
        None,
        "node-a",
        json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuset"}}}),
    );
    let WatchEvent::Modified(modified) = next().await else { panic!("not MODIFIED") };
    assert_eq!(
        (modified.name_any(), policy(&modified), modified.metadata.generation),
        ("node-a".into(), "cpuset", Some(2))
    );
    assert_eq!(modified.resource_version().as_deref(), patched["metadata"]["resourceVersion"].as_str());

    let same = api.merge_patch(
        "nodeslos",
        None,
        "node-a",
        json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuset"}}}),
    );
    assert_eq!(same, patched, "a patch that changes nothing writes nothing");
    let gone = api.delete("nodeslos", None, "node-a").unwrap();
    let WatchEvent::Deleted(deleted) = next().await else { panic!("not DELETED") };
    assert_eq!(deleted.resource_version().as_deref(), gone["metadata"]["resourceVersion"].as_str());
    assert_eq!(policy(&deleted), "cpuset", "DELETED carries the last state");

    api.create(nodeslo("node-a", "cfsQuota"));
    let WatchEvent::Added(added) = next().await else { panic!("not ADDED") };
    assert_eq!(added.metadata.generation, Some(1));
    let current = api.resource_version().to_string();
    let bookmark = within("a bookmark", async {
        loop {
            if let Some(WatchEvent::Bookmark(bookmark)) = events.try_next().await.unwrap() {
                return bookmark;
            }
        }
    })
    .await;
    assert_eq!(bookmark.metadata.resource_version, current);
    // the watch ends when its timeoutSeconds (5) are up
    let end = within("the end of the watch", async {
        while let Some(event) = events.try_next().await.unwrap() {
            assert!(matches!(event, WatchEvent::Bookmark(_)), "only bookmarks after the last change");
        }
    });
    end.await;
    assert_eq!(api.open_watches(), 0);
}

#[tokio::test]
async fn watcher_lists_again_after_410_expired() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let slos = Api::<DynamicObject>::all_with(client(&api, &dir, None).await, &nodeslo_resource());
    api.create(nodeslo("node-a", "cfsQuota"));
    // no bookmarks, and a watch that ends after a second: the watcher then watches again from the
    // resourceVersion of the last event it saw
    let config = watcher::Config::default().fields("metadata.name=node-a").timeout(1).disable_bookmarks();
    let mut events = drive(watcher(slos.clone(), config));
    assert!(matches!(within("Init", events.recv()).await, Some(Ok(Event::Init))));
    assert!(
        matches!(within("InitApply", events.recv()).await, Some(Ok(Event::InitApply(o))) if o.name_any() == "node-a")
    );
    assert!(matches!(within("InitDone", events.recv()).await, Some(Ok(Event::InitDone))));
    let listed_at = api.resource_version().to_string();
    api.wait_for_watches(1, STEP).await;

    api.create(nodeslo("node-b", "cfsQuota"));
    api.compact();
    api.clear_requests();
    match within("the watch error", events.recv()).await.expect("the watcher goes on") {
        Err(watcher::Error::WatchError(status)) => assert_eq!((status.code, status.reason.as_str()), (410, "Expired")),
        other => panic!("not a 410 watch error: {other:?}"),
    }
    assert!(matches!(within("Init again", events.recv()).await, Some(Ok(Event::Init))));
    assert!(matches!(within("InitApply", events.recv()).await, Some(Ok(Event::InitApply(_)))));
    assert!(matches!(within("InitDone", events.recv()).await, Some(Ok(Event::InitDone))));

    let requests = api.requests();
    let expired =
        requests.iter().position(|r| r.is_watch() && r.param("resourceVersion").as_deref() == Some(&listed_at));
    let relist = requests.iter().position(|r| r.is_list_of("/apis/slo.koordinator.sh/v1alpha1/nodeslos"));
    assert!(expired.is_some() && relist > expired, "a watch from {listed_at}, then a list: {requests:#?}");
    // the raw ERROR event, as 10 shows it
    let mut raw = slos.watch(&WatchParams::default(), &listed_at).await.unwrap().boxed();
    match within("ERROR", raw.try_next()).await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert_eq!(status.message, format!("too old resource version: {listed_at} ({})", api.resource_version()));
        }
        other => panic!("not an ERROR event: {other:?}"),
    }
    assert!(within("the end", raw.try_next()).await.unwrap().is_none(), "the body ends after the ERROR");
}

#[tokio::test]
async fn watcher_comes_back_after_a_restart() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let pods = Api::<Pod>::all(client(&api, &dir, None).await);
    api.create(pod("default", "p1", "node-a"));
    let config = watcher::Config::default().fields("spec.nodeName=node-a");
    let mut events = drive(watcher(pods, config).default_backoff().applied_objects());
    assert_eq!(within("p1", events.recv()).await.unwrap().unwrap().name_any(), "p1");
    api.wait_for_watches(1, STEP).await;

    api.stop().await;
    assert!(!api.is_running());
    within("the watch dropped", async {
        while api.open_watches() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(tokio::net::TcpStream::connect(("127.0.0.1", api.port())).await.is_err(), "the port is closed");
    api.create(pod("default", "p2", "node-a"));
    api.create(pod("default", "p3", "node-b"));
    tokio::time::sleep(Duration::from_millis(300)).await;

    api.restart().await;
    // the watcher's errors while the server was away are skipped; it watches again from where it was
    let mut next_pod = async || loop {
        match within("a pod", events.recv()).await.expect("the watcher goes on") {
            Ok(pod) => return pod.name_any(),
            Err(_) => continue,
        }
    };
    assert_eq!(next_pod().await, "p2", "the change made while stopped");
    api.merge_patch("pods", Some("default"), "p1", json!({"metadata": {"labels": {"x": "y"}}}));
    assert_eq!(next_pod().await, "p1", "a change after the restart");
}

#[tokio::test]
async fn unknown_token_401_forbidden_403() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    api.create(nodeslo("node-a", "cfsQuota"));
    let stranger = Api::<DynamicObject>::all_with(client(&api, &dir, Some("wrong-token")).await, &nodeslo_resource());
    let status = api_error(within("401", stranger.list(&ListParams::default())).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str(), status.message.as_str()), (401, "Unauthorized", "Unauthorized"));

    api.set_forbidden("limited", "nodeslos");
    let limited = client(&api, &dir, Some("limited")).await;
    let slos = Api::<DynamicObject>::all_with(limited.clone(), &nodeslo_resource());
    let status =
        api_error(within("403", slos.list(&ListParams::default().fields("metadata.name=node-a"))).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        r#"nodeslos.slo.koordinator.sh "node-a" is forbidden: User "limited" cannot list resource "nodeslos" in API group "slo.koordinator.sh" at the cluster scope"#
    );
    // a watcher surfaces it as its initial list's error
    let mut events = watcher(slos, watcher::Config::default()).boxed();
    assert!(matches!(within("watcher Init", events.next()).await, Some(Ok(Event::Init))));
    match within("watcher 403", events.next()).await.unwrap() {
        Err(watcher::Error::InitialListFailed(error)) => assert_eq!(api_error(error).code, 403),
        other => panic!("not a failed list: {other:?}"),
    }
    // other resources stay allowed; set_allowed lifts the ban; remove_token revokes
    assert!(Api::<Pod>::all(limited.clone()).list(&ListParams::default()).await.is_ok());
    api.set_allowed("limited", "nodeslos");
    let slos = Api::<DynamicObject>::all_with(limited.clone(), &nodeslo_resource());
    assert_eq!(slos.list(&ListParams::default()).await.unwrap().items.len(), 1);
    api.remove_token("limited");
    assert_eq!(api_error(slos.list(&ListParams::default()).await.unwrap_err()).code, 401);
    let tokens: Vec<_> = api.requests().iter().map(|r| r.token.clone()).collect();
    assert!(tokens.contains(&Some("wrong-token".into())));
}

#[tokio::test]
async fn streaming_lists_are_refused_422() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let slos = Api::<DynamicObject>::all_with(client(&api, &dir, None).await, &nodeslo_resource());
    let status = match within("watch", slos.watch(&WatchParams::streaming_lists(), "")).await {
        Err(error) => api_error(error),
        Ok(stream) => match within("its first item", stream.boxed().try_next()).await {
            Err(error) => api_error(error),
            Ok(event) => panic!("not refused: {event:?}"),
        },
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(status
        .message
        .contains("sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"));
    // kube's watcher with the streaming-list strategy fails the same way, so a client must list, then watch
    let mut events = watcher(slos, watcher::Config::default().streaming_lists()).boxed();
    assert!(within("watcher", events.next()).await.unwrap().is_err());
}

#[tokio::test]
async fn missing_object_404_and_unserved_version_404_text() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = client(&api, &dir, None).await;
    let slos = Api::<DynamicObject>::all_with(client.clone(), &nodeslo_resource());
    let status = api_error(within("get", slos.get("node-b")).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert_eq!(status.message, r#"nodeslos.slo.koordinator.sh "node-b" not found"#);
    assert!(within("get_opt", slos.get_opt("node-b")).await.unwrap().is_none());

    let v1alpha2 = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("slo.koordinator.sh", "v1alpha2", "NodeSLO"),
        "nodeslos",
    );
    let status = api_error(
        within("list", Api::<DynamicObject>::all_with(client, &v1alpha2).list(&ListParams::default()))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 404);
    assert_eq!(status.message, "404 page not found\n", "a text body, not a Status");
}

#[tokio::test]
async fn create_patch_delete_over_http() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let client = client(&api, &dir, None).await;
    let slos = Api::<DynamicObject>::all_with(client.clone(), &nodeslo_resource());
    let object: DynamicObject = serde_json::from_value(nodeslo("node-a", "cfsQuota")).unwrap();
    let created = within("create", slos.create(&PostParams::default(), &object)).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let again = api_error(slos.create(&PostParams::default(), &object).await.unwrap_err());
    assert_eq!((again.code, again.reason.as_str()), (409, "AlreadyExists"));

    let patch = json!({"spec": {"resourceUsedThresholdWithBE": {"cpuSuppressPolicy": "cpuset"}}});
    let patched = within("patch", slos.patch("node-a", &PatchParams::default(), &Patch::Merge(&patch))).await.unwrap();
    assert_eq!((policy(&patched), patched.metadata.generation), ("cpuset", Some(2)));
    assert_eq!(
        api.get("nodeslos", None, "node-a").unwrap()["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressPolicy"],
        "cpuset"
    );
    let stale = json!({"metadata": {"resourceVersion": created.resource_version()}, "spec": {"x": 1}});
    let conflict = api_error(slos.patch("node-a", &PatchParams::default(), &Patch::Merge(&stale)).await.unwrap_err());
    assert_eq!((conflict.code, conflict.reason.as_str()), (409, "Conflict"));
    let unsupported = slos.patch("node-a", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap_err();
    assert_eq!(api_error(unsupported).code, 415);

    let mut replaced = patched.clone();
    replaced.data["spec"] = json!({"other": true});
    let replaced = within("replace", slos.replace("node-a", &PostParams::default(), &replaced)).await.unwrap();
    assert_eq!((replaced.data["spec"].clone(), replaced.metadata.generation), (json!({"other": true}), Some(3)));

    let deleted = within("delete", slos.delete("node-a", &DeleteParams::default())).await.unwrap();
    let status = deleted.right().expect("a custom resource's DELETE answers a Status (07)");
    assert_eq!(status.status, Some(kube::core::response::StatusSummary::Success));
    assert!(api.get("nodeslos", None, "node-a").is_none());

    api.create(pod("default", "p1", "node-a"));
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let gone = within("delete pod", pods.delete("p1", &DeleteParams::default())).await.unwrap();
    assert_eq!(gone.left().expect("a Pod's DELETE answers the Pod").name_any(), "p1");
}

#[tokio::test]
async fn events_posted_are_kept() {
    let api = KubeApi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let events = Api::<CoreEvent>::namespaced(client(&api, &dir, None).await, "default");
    // the Event of 20-create-event.txt
    let event: CoreEvent = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "node-a."},
        "involvedObject": {"kind": "Node", "name": "node-a", "uid": "node-a"},
        "reason": "RuleParseFailed", "message": "NodeSLO node-a: bad", "type": "Warning",
        "source": {"component": "runtime-hooks", "host": "node-a"},
        "reportingComponent": "runtime-hooks", "reportingInstance": "node-a",
    }))
    .unwrap();
    let created = within("post", events.create(&PostParams::default(), &event)).await.unwrap();
    let name = created.name_any();
    assert!(name.starts_with("node-a.") && name.len() == "node-a.".len() + 5, "{name}");
    assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
    let kept = api.events();
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0]["metadata"]["name"].as_str(), kept[0]["reason"].as_str()),
        (Some(name.as_str()), Some("RuleParseFailed"))
    );
    let posted = api.wait_for_request(STEP, |r| r.method == "POST").await;
    assert_eq!(posted.path, "/api/v1/namespaces/default/events");
}
