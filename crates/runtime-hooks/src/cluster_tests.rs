//! The rule source against kube-rs's test seam: `kube::Client` over a `tower-test` mock service
//! answering with what a real kube-apiserver v1.31 answered (`crates/test-support/fixtures/k8s-wire/`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};

use super::*;
use crate::rules::Rules;

/// The recorded response body (and status) of a file in `crates/test-support/fixtures/k8s-wire/`.
fn recorded(name: &str) -> (u16, String) {
    let path = format!("{}/../test-support/fixtures/k8s-wire/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).replace("\r\n", "\n");
    let response = text.split("### response").nth(1).expect("a response section");
    let status_line = response.lines().find(|l| l.starts_with("HTTP/")).expect("a status line");
    let status: u16 = status_line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\n\n").map(|(_, b)| b).unwrap_or("").trim().to_owned();
    (status, body)
}

/// The object of a recorded create or get, as the `items` of a list with the object's version.
fn as_list(kind: &str, object_file: &str) -> (u16, String) {
    let (_, body) = recorded(object_file);
    let obj: Value = serde_json::from_str(&body).unwrap();
    let rv = obj["metadata"]["resourceVersion"].clone();
    (
        200,
        json!({"apiVersion": obj["apiVersion"], "kind": format!("{kind}List"), "metadata": {"resourceVersion": rv}, "items": [obj]})
            .to_string(),
    )
}

fn watch_events(events: &[Value]) -> (u16, String) {
    (200, events.iter().map(|e| format!("{e}\n")).collect())
}

/// What the mock API server answers next.
enum Reply {
    Answer(u16, String),
    /// The connection fails (connection refused, reset).
    Refused,
}

#[derive(Default)]
struct Script {
    lists: HashMap<&'static str, VecDeque<Reply>>,
    watches: HashMap<&'static str, VecDeque<Reply>>,
    /// `METHOD path?query` of every request, in order.
    seen: Vec<String>,
    /// Events POSTed.
    events: Vec<Value>,
}

type Shared = Arc<Mutex<Script>>;

fn resource(path: &str) -> &'static str {
    ["nodeslos", "noderesourcetopologies", "events", "pods", "nodes"]
        .into_iter()
        .find(|r| path.contains(&format!("/{r}")))
        .unwrap_or("other")
}

fn empty_list() -> String {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "100"}, "items": []}).to_string()
}

/// Serves the mock: scripted replies per resource; an empty list when no list is scripted, a
/// watch that never answers when no watch is.
fn serve(mut handle: tower_test::mock::Handle<Request<Body>, Response<Body>>, script: Shared) {
    tokio::spawn(async move {
        let mut parked = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().to_string();
            let method = req.method().to_string();
            let res = resource(req.uri().path());
            let watch = uri.contains("watch=true") || uri.contains("watch=1");
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let reply = {
                let mut s = script.lock().unwrap();
                s.seen.push(format!("{method} {uri}"));
                if method == "POST" && res == "events" {
                    let mut ev: Value = serde_json::from_slice(&body).unwrap();
                    ev["metadata"]["name"] = json!("node-a.1");
                    s.events.push(ev.clone());
                    Some(Reply::Answer(201, ev.to_string()))
                } else if watch {
                    s.watches.get_mut(res).and_then(|q| q.pop_front())
                } else {
                    Some(
                        s.lists
                            .get_mut(res)
                            .and_then(|q| q.pop_front())
                            .unwrap_or_else(|| Reply::Answer(200, empty_list())),
                    )
                }
            };
            match reply {
                Some(Reply::Answer(status, body)) => {
                    let resp = Response::builder()
                        .status(status)
                        .header("content-type", "application/json")
                        .body(Body::from(body.into_bytes()))
                        .unwrap();
                    send.send_response(resp);
                }
                Some(Reply::Refused) => {
                    send.send_error(std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused"))
                }
                None => parked.push(send),
            }
        }
    });
}

struct Harness {
    script: Shared,
    store: Arc<RulesStore>,
    source: ClusterSource,
}

fn start(store: Arc<RulesStore>, script: Script) -> Harness {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let script = Arc::new(Mutex::new(script));
    serve(handle, script.clone());
    let client = Client::new(service, "default");
    let source = spawn(client, "node-a".into(), store.clone());
    Harness { script, store, source }
}

impl Harness {
    async fn until(&self, what: &str, f: impl Fn(&Harness) -> bool) {
        for _ in 0..200 {
            if f(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("timed out waiting for {what}; requests: {:#?}", self.script.lock().unwrap().seen);
    }

    fn requests(&self, needle: &str) -> usize {
        self.count(&[needle], &[])
    }

    /// Requests whose line holds every one of `all` and none of `none`.
    fn count(&self, all: &[&str], none: &[&str]) -> usize {
        let seen = &self.script.lock().unwrap().seen;
        seen.iter().filter(|s| all.iter().all(|n| s.contains(n)) && !none.iter().any(|n| s.contains(n))).count()
    }

    fn push_watch(&self, res: &'static str, reply: Reply) {
        self.script.lock().unwrap().watches.entry(res).or_default().push_back(reply);
    }
}

fn script(lists: Vec<(&'static str, Reply)>, watches: Vec<(&'static str, Reply)>) -> Script {
    let mut s = Script::default();
    for (r, reply) in lists {
        s.lists.entry(r).or_default().push_back(reply);
    }
    for (r, reply) in watches {
        s.watches.entry(r).or_default().push_back(reply);
    }
    s
}

fn answer((status, body): (u16, String)) -> Reply {
    Reply::Answer(status, body)
}

fn recorded_slo_rules() -> Rules {
    let (_, body) = recorded("03-create-nodeslo.txt");
    let obj: Value = serde_json::from_str(&body).unwrap();
    Rules::compose(&Rules::default(), Some(&node_slo::parse(&obj["spec"]).unwrap()), None, None)
}

#[tokio::test]
async fn the_first_list_then_watch_events_then_a_bookmark_resume() {
    let h = start(
        RulesStore::defaults(),
        script(
            vec![("nodeslos", answer(recorded("04-list-nodeslo-by-name.txt")))],
            vec![("nodeslos", answer(recorded("05-watch-nodeslo.txt")))],
        ),
    );
    let mut changes = h.store.subscribe();
    // The list: the recorded NodeSLO (cfsQuota suppression on) is in force.
    tokio::time::timeout(Duration::from_secs(10), changes.changed()).await.expect("rules from the list").unwrap();
    // The watch: MODIFIED (suppress policy cpuset: quotas set again), DELETED (defaults), BOOKMARK.
    h.until("the DELETED event", |h| *h.store.current() == Rules::default()).await;
    // The body ended after the bookmark; the next watch resumes from the bookmark's version.
    h.until("a watch from the bookmark", |h| h.requests("resourceVersion=211") >= 1).await;
    assert_eq!(h.count(&["nodeslos?", "watch=true"], &[]), 2);
    assert!(h.requests("fieldSelector=metadata.name%3Dnode-a") >= 2, "{:?}", h.script.lock().unwrap().seen);
    assert!(h.requests("/api/v1/pods?") >= 1 && h.requests("fieldSelector=spec.nodeName%3Dnode-a") >= 1);
}

#[tokio::test]
async fn an_expired_watch_relists_and_the_rules_stay_in_between() {
    let list = recorded("04-list-nodeslo-by-name.txt");
    let h = start(
        RulesStore::defaults(),
        script(vec![("nodeslos", answer(list.clone()))], vec![("nodeslos", answer(recorded("10-watch-too-old.txt")))]),
    );
    h.until("the list's rules", |h| *h.store.current() == recorded_slo_rules()).await;
    let mut changes = h.store.subscribe();
    changes.borrow_and_update();
    // The 410 ERROR event: a second list follows (an empty one by default: no NodeSLO any more).
    h.script.lock().unwrap().lists.entry("nodeslos").or_default().push_back(answer(list));
    h.until("a relist", |h| h.count(&["GET /apis/slo.koordinator.sh/v1alpha1/nodeslos?"], &["watch=true"]) >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!changes.has_changed().unwrap(), "the relist found the same NodeSLO: no change, no reset in between");
    assert_eq!(*h.store.current(), recorded_slo_rules());
}

#[tokio::test]
async fn forbidden_and_unauthorized_keep_the_file_rules_until_answered() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(
        &path,
        "kind: NodeSLO\napiVersion: slo.koordinator.sh/v1alpha1\nspec: {resourceQOSStrategy: {beClass: {cpuQOS: {enable: true}}}}\n",
    )
    .unwrap();
    let store = RulesStore::open(&path).unwrap();
    let file_rules = store.current();
    assert_eq!(file_rules.group_identity.be, -1);
    let h = start(
        store,
        script(
            vec![
                ("nodeslos", answer(recorded("11-list-nodeslo-forbidden.txt"))),
                ("nodeslos", answer(recorded("12-list-nodeslo-unauthorized.txt"))),
                ("nodeslos", answer(recorded("04-list-nodeslo-by-name.txt"))),
            ],
            vec![],
        ),
    );
    h.until("two refused lists", |h| h.requests("nodeslos?") >= 2).await;
    assert_eq!(h.store.current(), file_rules, "refused: the file's rules stay");
    // Permission granted: the third list answers.
    h.until("the cluster's rules", |h| *h.store.current() == recorded_slo_rules()).await;
}

#[test]
fn refusals_name_the_missing_permission() {
    for (file, needles) in [
        (
            "11-list-nodeslo-forbidden.txt",
            &["403", "cannot list resource \"nodeslos\" in API group \"slo.koordinator.sh\"", "ClusterRole"][..],
        ),
        ("12-list-nodeslo-unauthorized.txt", &["401", "--kubeconfig"][..]),
    ] {
        let (_, body) = recorded(file);
        let status: kube::core::Status = serde_json::from_str(&body).unwrap();
        let text = describe_watch(&watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status))), "NodeSLO");
        for n in needles {
            assert!(text.contains(n), "{file}: {text}");
        }
    }
}

#[tokio::test]
async fn an_unreachable_api_server_at_start_then_recovery() {
    let h = start(
        RulesStore::defaults(),
        script(
            vec![
                ("nodeslos", Reply::Refused),
                ("nodeslos", Reply::Refused),
                ("nodeslos", answer(recorded("04-list-nodeslo-by-name.txt"))),
            ],
            vec![],
        ),
    );
    h.until("two refused lists", |h| h.requests("nodeslos?") >= 2).await;
    assert_eq!(*h.store.current(), Rules::default(), "unreachable: koordlet's defaults");
    let slo = h.source.status.objects()["NodeSLO"].clone();
    assert!(!slo.synced && slo.watch_error.is_some() && !slo.not_served, "{slo:?}");
    h.until("the cluster's rules", |h| *h.store.current() == recorded_slo_rules()).await;
    h.until("synced, the error cleared", |h| {
        let slo = h.source.status.objects()["NodeSLO"].clone();
        slo.synced && slo.watch_error.is_none()
    })
    .await;
}

#[tokio::test]
async fn a_node_slo_that_does_not_parse_keeps_the_last_good_one_and_posts_an_event() {
    let (_, body) = recorded("03-create-nodeslo.txt");
    let mut bad: Value = serde_json::from_str(&body).unwrap();
    bad["spec"]["resourceUsedThresholdWithBE"]["cpuSuppressPolicy"] = json!("bogus");
    bad["metadata"]["resourceVersion"] = json!("300");
    let h = start(
        RulesStore::defaults(),
        script(
            vec![("nodeslos", answer(recorded("04-list-nodeslo-by-name.txt")))],
            vec![("nodeslos", answer(watch_events(&[json!({"type": "MODIFIED", "object": bad})])))],
        ),
    );
    h.until("an Event", |h| !h.script.lock().unwrap().events.is_empty()).await;
    assert_eq!(*h.store.current(), recorded_slo_rules(), "the last good NodeSLO stays");
    assert_eq!(h.source.status.rule_errors.load(Ordering::Relaxed), 1);
    let slo = h.source.status.objects()["NodeSLO"].clone();
    assert!(slo.synced, "{slo:?}");
    assert!(slo.parse_error.is_some_and(|(_, e)| e.contains("cpuSuppressPolicy")), "the parse error, for status");
    let ev = h.script.lock().unwrap().events[0].clone();
    // The shape of test-support/fixtures/k8s-wire/20-create-event.txt.
    assert_eq!(ev["involvedObject"]["kind"], "Node");
    assert_eq!(ev["involvedObject"]["name"], "node-a");
    assert_eq!((ev["reason"].as_str(), ev["type"].as_str()), (Some("RuleParseFailed"), Some("Warning")));
    let message = ev["message"].as_str().unwrap();
    assert_eq!(message, "NodeSLO node-a: spec.resourceUsedThresholdWithBE.cpuSuppressPolicy: unknown value \"bogus\" (cpuset or cfsQuota)");
    assert!(h.requests("POST /api/v1/namespaces/default/events") == 1);
    // The same bad object again (a relist) is not reported twice.
    h.push_watch("nodeslos", answer(watch_events(&[json!({"type": "MODIFIED", "object": bad})])));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(h.source.status.rule_errors.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn the_topology_and_the_node_feed_their_inputs() {
    let mut node_list = as_list("Node", "02-get-node.txt");
    // Core lists carry no apiVersion/kind per item in a real answer; kube reads either.
    node_list.1 = node_list.1.replace("\"apiVersion\":\"v1\",\"kind\":\"Node\",", "");
    let h = start(
        RulesStore::defaults(),
        script(
            vec![
                ("noderesourcetopologies", answer(recorded("15-list-nrt-by-name.txt"))),
                ("nodes", answer(node_list)),
                ("pods", answer(recorded("18-list-pods-on-node.txt"))),
            ],
            vec![],
        ),
    );
    h.until("the share pools", |h| h.store.current().cpuset.topology.all_share_pool_cpus() == "0-1").await;
    h.until("the normalization ratio", |h| h.store.current().batch_resource.cpu_normalization_ratio.is_some()).await;
    let (_, pods) = recorded("18-list-pods-on-node.txt");
    let items = serde_json::from_str::<Value>(&pods).unwrap()["items"].as_array().unwrap().clone();
    h.until("the pods", |h| h.source.pods.len() == items.len()).await;
    let uid = items[0]["metadata"]["uid"].as_str().unwrap();
    assert_eq!(h.source.pods.get(uid).unwrap().metadata.name, items[0]["metadata"]["name"].as_str().map(String::from));
}
