//! An outsider's probe against a real worker process: no token, a wrong token, a wrong role, a
//! `text/plain` POST, a foreign `Host`, truncated, oversized and mistyped JSON, garbage ids and
//! keys, a token of another namespace. Each gets a 4xx JSON error, and the worker's workflows
//! and their operation logs read the same, byte for byte, before and after.

use std::io::BufReader;
use std::process::Child;

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::{json, Value};

mod common;

const WRITER: &str = "w-s3cret";
const READER: &str = "r-s3cret";
/// Every role, in the namespace `elsewhere` only.
const STRANGER: &str = "x-s3cret";

struct Worker {
    child: Child,
    base: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_worker(dir: &std::path::Path) -> Worker {
    let tokens = format!(
        "writer:read+write:{WRITER},reader:read:{READER},\
         stranger:read+write+approve+operate@elsewhere:{STRANGER}"
    );
    let mut child = common::worker_command(dir, &tokens)
        // Small, so that an oversized body still fits the socket's buffers and the refusal
        // can be read.
        .env("WAYMARK_MAX_BODY_BYTES", "4096")
        .env("RUST_LOG", "error")
        .spawn()
        .expect("the worker binary starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let base = common::listening_base(&mut stdout);
    Worker { child, base }
}

/// One probe: a method, a path, a token, headers, a body, and the status it must get.
struct Probe {
    what: &'static str,
    method: reqwest::Method,
    path: String,
    token: Option<&'static str>,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<String>,
    expected: u16,
}

fn probe(
    what: &'static str,
    method: &str,
    path: &str,
    token: Option<&'static str>,
    expected: u16,
) -> Probe {
    Probe {
        what,
        method: reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
        path: path.to_owned(),
        token,
        headers: vec![("content-type", "application/json")],
        body: None,
        expected,
    }
}

impl Probe {
    fn body(mut self, body: impl Into<String>) -> Self {
        self.body = Some(body.into());
        self
    }

    fn header(mut self, name: &'static str, value: &'static str) -> Self {
        self.headers.retain(|(existing, _)| *existing != name);
        self.headers.push((name, value));
        self
    }
}

/// What must not change: every workflow's record and journal length, and its operation log.
async fn state(client: &reqwest::Client, base: &str) -> String {
    let get = |path: String| {
        client
            .get(format!("{base}{path}"))
            .bearer_auth(READER)
            .send()
    };
    let listed: Value = get("/workflows".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut state = listed.to_string();
    for workflow in listed["workflows"].as_array().unwrap() {
        let id = workflow["workflow_id"].as_str().unwrap();
        let shown: Value = get(format!("/workflows/{id}"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let kept = json!({
            "status": shown["status"],
            "journal_len": shown["journal_len"],
            "operations": shown["operations"],
            "pending_approvals": shown["pending_approvals"],
        });
        state.push_str(&kept.to_string());
    }
    state
}

#[tokio::test]
async fn an_outsiders_probe_gets_json_4xx_errors_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let worker = spawn_worker(dir.path());
    let base = worker.base.clone();
    let client = reqwest::Client::new();
    let started = client
        .post(format!("{base}/workflows/await_confirmation"))
        .bearer_auth(WRITER)
        .json(&json!({"input": "TICKET-1", "workflow_id": "ticket-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 201);
    // Once it waits for its signal, it stands still: only a probe could move it.
    let mut before = state(&client, &base).await;
    for _ in 0..200 {
        if before.contains("awaiting_signal") && !before.contains("running") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        before = state(&client, &base).await;
    }
    assert!(before.contains("awaiting_signal"), "{before}");

    let start = "/workflows/await_confirmation";
    let signal = "/workflows/ticket-1/signals/confirm";
    let confirm = r#"{"signal_id": "s-1", "payload": {"by": "eve", "note": "ok"}}"#;
    let oversized = format!("{{\"input\": \"{}\"}}", "x".repeat(16 << 10));
    let probes = [
        probe("no token", "GET", "/workflows", None, 401),
        probe("no token, start", "POST", start, None, 401).body(r#"{"input": "X"}"#),
        probe("wrong token", "POST", signal, Some("guess"), 401).body(confirm),
        probe("read role starts", "POST", start, Some(READER), 403).body(r#"{"input": "X"}"#),
        probe("read role signals", "POST", signal, Some(READER), 403).body(confirm),
        probe(
            "read role cancels",
            "POST",
            "/workflows/ticket-1/cancel",
            Some(READER),
            403,
        ),
        probe("text/plain", "POST", signal, Some(WRITER), 415)
            .header("content-type", "text/plain")
            .body(confirm),
        probe("form", "POST", start, Some(WRITER), 415)
            .header("content-type", "application/x-www-form-urlencoded")
            .body("input=X"),
        probe("foreign Host", "POST", signal, Some(WRITER), 403)
            .header("host", "evil.example")
            .body(confirm),
        probe("truncated JSON", "POST", signal, Some(WRITER), 400).body(r#"{"signal_id": "s-"#),
        probe("oversized JSON", "POST", start, Some(WRITER), 413).body(oversized),
        probe("wrong types", "POST", start, Some(WRITER), 400)
            .body(r#"{"input": 5, "request_id": 7}"#),
        probe("unknown field", "POST", signal, Some(WRITER), 400)
            .body(r#"{"signal_id": "s-2", "payload": 1, "sender": "ceo"}"#),
        probe(
            "unknown workflow",
            "POST",
            "/workflows/nobody/signals/confirm",
            Some(WRITER),
            404,
        )
        .body(confirm),
        probe(
            "unknown workflow type",
            "POST",
            "/workflows/no_such_flow",
            Some(WRITER),
            404,
        )
        .body(r#"{"input": null}"#),
        probe(
            "garbage id",
            "GET",
            "/workflows/%00%FF%FE",
            Some(READER),
            400,
        ),
        probe(
            "garbage key",
            "POST",
            "/operations/%FF%00/resolve",
            Some(WRITER),
            403,
        )
        .body(r#"{"decision": "not_found"}"#),
        probe("garbage hash", "GET", "/artifacts/%FF", Some(READER), 400),
        probe(
            "bad Last-Event-ID",
            "GET",
            "/workflows/ticket-1/stream",
            Some(READER),
            400,
        )
        .header("last-event-id", "-1"),
        probe(
            "ack past the stream",
            "POST",
            "/workflows/ticket-1/stream/ack",
            Some(READER),
            409,
        )
        .body(r#"{"event": 999}"#),
        probe(
            "another namespace reads",
            "GET",
            "/workflows/ticket-1",
            Some(STRANGER),
            404,
        ),
        probe(
            "another namespace signals",
            "POST",
            signal,
            Some(STRANGER),
            404,
        )
        .body(confirm),
        probe(
            "another namespace cancels",
            "POST",
            "/workflows/ticket-1/cancel",
            Some(STRANGER),
            404,
        ),
        probe(
            "another namespace streams",
            "GET",
            "/workflows/ticket-1/stream",
            Some(STRANGER),
            404,
        ),
        probe(
            "another namespace exports",
            "GET",
            "/workflows/ticket-1/journal?format=binary",
            Some(STRANGER),
            404,
        ),
        probe(
            "a namespace not held",
            "GET",
            "/workflows",
            Some(STRANGER),
            404,
        )
        .header("waymark-namespace", "default"),
        probe(
            "a namespace not held, by header",
            "GET",
            "/workflows/ticket-1",
            Some(READER),
            404,
        )
        .header("waymark-namespace", "elsewhere"),
        probe(
            "a namespace forged into the id",
            "GET",
            "/workflows/elsewhere%1Fticket-1",
            Some(READER),
            400,
        ),
        probe(
            "a malformed namespace",
            "GET",
            "/workflows",
            Some(READER),
            400,
        )
        .header("waymark-namespace", "no/such"),
    ];
    for probe in probes {
        let mut request = client.request(probe.method.clone(), format!("{base}{}", probe.path));
        if let Some(token) = probe.token {
            request = request.bearer_auth(token);
        }
        for (name, value) in &probe.headers {
            let name = HeaderName::from_static(name);
            request = request.header(name, HeaderValue::from_static(value));
        }
        if let Some(body) = probe.body.clone() {
            request = request.body(body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap();
        assert_eq!(status, probe.expected, "{}: {text}", probe.what);
        let error: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{}: not JSON: {text}", probe.what));
        assert!(error["error"]["code"].is_string(), "{}: {text}", probe.what);
    }
    assert_eq!(state(&client, &base).await, before, "nothing changed");
    let elsewhere: Value = client
        .get(format!("{base}/workflows"))
        .bearer_auth(STRANGER)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        elsewhere["workflows"],
        json!([]),
        "another namespace lists nothing"
    );
}
