//! Replays the exchanges recorded from kube-apiserver v1.31.14 (`fixtures/k8s-wire/01..20`) against
//! the stand-in, in order, and compares what comes back: status code, the header names
//! (`content-type` and `cache-control` values too), and the body. The requests go out as the
//! recording's did (same method, path with query, body, and a curl user agent, so JSON comes back
//! pretty-printed as recorded).
//!
//! Body comparison: a Status, the text 404 and the watch `ERROR` byte for byte (a uid and the
//! compaction point substituted); a custom resource, its list and its watch events equal once the
//! values the server makes up (uid, timestamps, resourceVersions, `managedFields`) are blanked; a
//! built-in type's object a subset of the recorded one (the stand-in applies no defaults; for a Pod
//! the `spec` is left out, as kube-apiserver also rewrites quantities: `1000` → `1k` in 17).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use test_support::kube_api::KubeApi;

use super::{within, STEP};

const WIRE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/k8s-wire");

/// One recorded exchange.
struct Exchange {
    file: String,
    method: String,
    path: String,
    content_type: Option<String>,
    request_body: String,
    status: u16,
    /// Header names (lower case) and values, as recorded.
    headers: Vec<(String, String)>,
    body: String,
}

fn exchanges() -> Vec<Exchange> {
    let mut files: Vec<_> = std::fs::read_dir(WIRE)
        .unwrap_or_else(|e| panic!("{WIRE}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| parse(p.file_name().unwrap().to_str().unwrap(), &std::fs::read_to_string(p).unwrap()))
        .collect()
}

fn parse(file: &str, text: &str) -> Exchange {
    let text = text.replace("\r\n", "\n");
    let (request, response) = text.split_once("### response").unwrap_or_else(|| panic!("{file}: no response"));
    let request = request.strip_prefix("### request\n").unwrap_or_else(|| panic!("{file}: no request"));
    let (head, request_body) = request.split_once("\n\n").unwrap_or((request, ""));
    let mut lines = head.lines();
    let (method, path) = lines.next().unwrap().split_once(' ').unwrap();
    let content_type = lines.find_map(|l| l.strip_prefix("Content-Type: ")).map(str::to_owned);
    let response = response.split_once('\n').unwrap().1;
    let (head, body) = response.split_once("\n\n").unwrap_or((response, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| l.split_once(": ").unwrap_or_else(|| panic!("{file}: header {l:?}")))
        .map(|(n, v)| (n.to_lowercase(), v.to_owned()))
        .collect();
    let body = match headers.iter().find(|(n, _)| n == "content-length") {
        Some((_, length)) => body[..length.parse::<usize>().unwrap()].to_owned(),
        None => body.trim_end().to_owned() + "\n",
    };
    Exchange {
        file: file.to_owned(),
        method: method.to_owned(),
        path: path.to_owned(),
        content_type,
        request_body: request_body.trim_end().to_owned(),
        status,
        headers,
        body,
    }
}

/// Sends one request over a connection of its own, as curl did; the connection lives as long as
/// the returned task.
async fn send(api: &KubeApi, x: &Exchange, token: &str) -> (http::Response<Incoming>, tokio::task::JoinHandle<()>) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", api.port())).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    let connection = tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = http::Request::builder()
        .method(x.method.as_str())
        .uri(&x.path)
        .header("host", format!("127.0.0.1:{}", api.port()))
        .header("user-agent", "curl/8.5.0")
        .header("accept", "*/*")
        .header("authorization", format!("Bearer {token}"));
    if let Some(content_type) = &x.content_type {
        request = request.header("content-type", content_type);
    }
    let request = request.body(Full::new(Bytes::from(x.request_body.clone()))).unwrap();
    (within(&x.file, sender.send_request(request)).await.unwrap(), connection)
}

/// Reads a streamed body line by line.
struct Lines {
    body: Incoming,
    buffer: Vec<u8>,
}

impl Lines {
    /// The next line with its newline, or `None` at the end of the body.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return Some(String::from_utf8(line).unwrap());
            }
            match within("a body line", self.body.frame()).await {
                Some(frame) => {
                    self.buffer.extend_from_slice(frame.unwrap().data_ref().map(|d| &d[..]).unwrap_or_default())
                }
                None => {
                    return (!self.buffer.is_empty())
                        .then(|| String::from_utf8(std::mem::take(&mut self.buffer)).unwrap())
                }
            }
        }
    }
}

/// Blanks what a server makes up (uid, timestamps, resourceVersions, managedFields, a generated
/// name's suffix) so two servers' answers compare.
fn blank(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("managedFields");
            for key in ["uid", "creationTimestamp", "resourceVersion"] {
                if let Some(v @ Value::String(_)) = map.get_mut(key) {
                    *v = "…".into();
                }
            }
            if let Some(prefix) = map.get("generateName").and_then(Value::as_str).map(str::to_owned) {
                map.insert("name".into(), format!("{prefix}…").into());
            }
            map.values_mut().for_each(blank);
        }
        Value::Array(items) => items.iter_mut().for_each(blank),
        _ => {}
    }
}

/// Every member of `ours` is in `recorded` with the same value (objects recursively).
fn assert_subset(ours: &Value, recorded: &Value, at: &str) {
    match (ours, recorded) {
        (Value::Object(ours), Value::Object(recorded)) => {
            for (key, value) in ours {
                let theirs =
                    recorded.get(key).unwrap_or_else(|| panic!("{at}.{key}: the real server sends no such member"));
                assert_subset(value, theirs, &format!("{at}.{key}"));
            }
        }
        (Value::Array(ours), Value::Array(recorded)) if ours.len() == recorded.len() => {
            ours.iter().zip(recorded).enumerate().for_each(|(i, (o, r))| assert_subset(o, r, &format!("{at}[{i}]")));
        }
        _ => assert_eq!(ours, recorded, "{at}"),
    }
}

/// Compares one JSON document (an answer or a watch event's line).
fn compare_json(file: &str, ours: &str, recorded: &str) {
    let (mut ours, mut recorded): (Value, Value) =
        (serde_json::from_str(ours).unwrap(), serde_json::from_str(recorded).unwrap());
    blank(&mut ours);
    blank(&mut recorded);
    let object = recorded.get("object").unwrap_or(&recorded);
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    if api_version.contains('.') {
        // a custom resource: exactly as recorded
        assert_eq!(ours, recorded, "{file}");
        return;
    }
    if matches!(object["kind"].as_str(), Some("Pod" | "PodList")) {
        // no defaults, no quantity canonicalisation: compare all but the spec
        strip_pod_specs(&mut ours);
        strip_pod_specs(&mut recorded);
    }
    assert_subset(&ours, &recorded, file);
}

fn strip_pod_specs(value: &mut Value) {
    if let Some(map) = value.as_object_mut() {
        map.remove("spec");
        if let Some(Value::Array(items)) = map.get_mut("items") {
            items.iter_mut().for_each(strip_pod_specs);
        }
    }
}

/// Status code, header names, `content-type` and `cache-control` as recorded.
fn compare_head(x: &Exchange, response: &http::Response<Incoming>) {
    assert_eq!(response.status().as_u16(), x.status, "{}: status", x.file);
    let mut ours: Vec<String> = response
        .headers()
        .keys()
        .map(|n| n.as_str().to_owned())
        .filter(|n| !matches!(n.as_str(), "date" | "content-length" | "transfer-encoding"))
        .collect();
    let mut recorded: Vec<String> =
        x.headers.iter().map(|(n, _)| n.clone()).filter(|n| n != "content-length").collect();
    ours.sort();
    recorded.sort();
    assert_eq!(ours, recorded, "{}: header names", x.file);
    for (name, value) in x.headers.iter().filter(|(n, _)| n == "content-type" || n == "cache-control") {
        assert_eq!(response.headers()[name.as_str()], value.as_str(), "{}: {name}", x.file);
    }
    let sized = x.headers.iter().any(|(n, _)| n == "content-length");
    assert_eq!(response.headers().contains_key("content-length"), sized, "{}: a sized body or a stream", x.file);
}

#[tokio::test]
async fn recorded_exchanges_are_answered_alike() {
    let api = KubeApi::start().await;
    api.set_forbidden("limited", "nodeslos");
    // periodic bookmarks would come between the events 05 recorded
    api.set_bookmark_interval(Duration::from_secs(60));
    // resourceVersions as recorded: 01 made 208, so 03 makes the 209 that 05 watches from
    api.set_resource_version(207);
    let exchanges = exchanges();
    assert_eq!(exchanges.len(), 20, "the recorded files 01..20");
    let mut watch_05 = None;
    for x in &exchanges {
        let number = &x.file[..2];
        if number == "10" {
            api.compact();
        }
        let token = match number {
            "11" => "limited",
            "12" => "wrong-token",
            _ => KubeApi::TOKEN,
        };
        let (response, connection) = send(&api, x, token).await;
        compare_head(x, &response);
        let mut lines = Lines { body: response.into_body(), buffer: Vec::new() };
        if number == "05" {
            // the watch runs on while 06 patches and 07 deletes the NodeSLO
            watch_05 = Some((x, lines, connection));
            continue;
        }
        let mut body = String::new();
        while let Some(line) = lines.next().await {
            body.push_str(&line);
        }
        connection.abort();
        let kind = serde_json::from_str::<Value>(&x.body)
            .ok()
            .and_then(|v| v.get("kind").and_then(Value::as_str).map(str::to_owned));
        match (number, kind.as_deref()) {
            ("07", _) => {
                let recorded_uid = "483f9cfa-f6f0-4629-9c30-1e9e7fb98a5d";
                let ours: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(body.replace(ours["details"]["uid"].as_str().unwrap(), recorded_uid), x.body, "{}", x.file);
            }
            ("10", _) => {
                assert_eq!(body.replace(&format!("({})", api.resource_version()), "(208)"), x.body, "{}", x.file)
            }
            ("19", _) | (_, Some("Status")) => assert_eq!(body, x.body, "{}", x.file),
            _ => compare_json(&x.file, &body, &x.body),
        }
        if number == "07" {
            let (x05, mut lines, connection) = watch_05.take().expect("05 came before");
            let recorded: Vec<&str> = x05.body.lines().collect();
            for (i, recorded) in recorded.iter().take(2).enumerate() {
                let line = lines.next().await.unwrap_or_else(|| panic!("05: event {i} missing"));
                compare_json(&format!("{} event {i}", x05.file), &line, recorded);
            }
            connection.abort();
        }
    }
}

#[tokio::test]
async fn watch_ends_with_a_bookmark_at_its_timeout() {
    let api = KubeApi::start().await;
    api.set_bookmark_interval(Duration::from_secs(60));
    api.create(serde_json::json!({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "node-a"}}));
    let rv = api.resource_version();
    let x = Exchange {
        file: "watch".into(),
        method: "GET".into(),
        path: format!(
            "/apis/slo.koordinator.sh/v1alpha1/nodeslos?fieldSelector=metadata.name%3Dnode-a&resourceVersion={rv}&allowWatchBookmarks=true&watch=true&timeoutSeconds=1"
        ),
        content_type: None,
        request_body: String::new(),
        status: 200,
        headers: Vec::new(),
        body: String::new(),
    };
    let (response, _connection) = send(&api, &x, KubeApi::TOKEN).await;
    let mut lines = Lines { body: response.into_body(), buffer: Vec::new() };
    let deleted = api.delete("nodeslos", None, "node-a").unwrap();
    let started = tokio::time::Instant::now();
    let mut types = Vec::new();
    let mut last = Value::Null;
    while let Some(line) = lines.next().await {
        last = serde_json::from_str(&line).unwrap();
        types.push(last["type"].as_str().unwrap().to_owned());
    }
    assert!(started.elapsed() < STEP);
    assert_eq!(types, ["DELETED", "BOOKMARK"]);
    // 05's last line, with this server's resourceVersion
    let bookmark = format!(
        r#"{{"type":"BOOKMARK","object":{{"apiVersion":"slo.koordinator.sh/v1alpha1","kind":"NodeSLO","metadata":{{"resourceVersion":{}}}}}}}"#,
        deleted["metadata"]["resourceVersion"]
    );
    assert_eq!(last, serde_json::from_str::<Value>(&bookmark).unwrap());
}
