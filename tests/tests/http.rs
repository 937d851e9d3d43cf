//! The worker's HTTP API over real HTTP: the start contract, authentication and roles, every
//! malformed request answered with a JSON 4xx that changes nothing, approvals and signals, the
//! SSE stream resumed with Last-Event-ID, operator resolution, cancellation.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use waymark::approvals::{ApprovalOutcome, ArtifactMeta};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::llm::{LlmError, ScriptedProvider};
use waymark::prelude::*;
use waymark::Worker;
use waymark_tests::conformance::check_answer;

mod web_ui;

#[workflow]
async fn reviewed_reply(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let plan = ctx.artifact_with(format!("rebook {order_id}"), ArtifactMeta::new("plan"))?;
    let ApprovalOutcome::Approved(_) = ctx.approval(&plan).risk(json!({"level": "high"})).await
    else {
        return Err(WorkflowError::new("not approved"));
    };
    let tone: String = ctx.signal("tone").await?;
    let request = Llm::new("writer")
        .user(format!("{tone}: {order_id}"))
        .streamed();
    Ok(ctx.llm(request).await?.text)
}

/// Streams `chunks` numbered chunks, then answers how many.
#[activity]
async fn chatter(cx: ActivityContext, chunks: u32) -> Result<u32, ActivityError> {
    for chunk in 0..chunks {
        cx.stream(&format!("{chunk} "));
    }
    Ok(chunks)
}

#[workflow]
async fn chatty(ctx: WorkflowContext, chunks: u32) -> Result<u32, WorkflowError> {
    Ok(ctx.activity(chatter, chunks).await?)
}

#[activity]
async fn step_number(n: u32) -> Result<u32, ActivityError> {
    Ok(n)
}

#[workflow]
async fn many_steps(ctx: WorkflowContext, steps: u32) -> Result<u32, WorkflowError> {
    let mut sum = 0;
    for n in 0..steps {
        sum += ctx.activity(step_number, n).await?;
    }
    Ok(sum)
}

#[workflow]
async fn echo(_ctx: WorkflowContext, text: String) -> Result<String, WorkflowError> {
    Ok(text)
}

#[workflow]
async fn wait_forever(ctx: WorkflowContext, _input: ()) -> Result<(), WorkflowError> {
    ctx.signal::<()>("never").await
}

/// Notifies without a reconciler: a lost acknowledgement parks it for an operator.
#[activity(effect)]
async fn notify(#[key] order_id: String) -> Result<String, ActivityError> {
    Err(ActivityError::uncertain(format!(
        "no answer about {order_id}"
    )))
}

#[workflow]
async fn notify_once(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(notify, order_id).await?)
}

struct Server {
    base: String,
    client: Client,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

const READER: &str = "reader:read:r-secret";
const ADMIN: &str = "admin:read+write:w-secret";
const DANA: &str = "dana:read+approve:a-secret";
const OPS: &str = "ops:read+operate:o-secret";
const CARRIER: &str = "carrier:settle:c-secret";

/// The worker the tests serve: every workflow here, a scripted model.
fn builder() -> waymark::WorkerBuilder {
    let scripted = ScriptedProvider::default()
        .broken_stream("We are", LlmError::Timeout)
        .reply("Sorry for the wait: your parcel ships today.");
    Worker::builder()
        .register(reviewed_reply)
        .register(echo)
        .register(wait_forever)
        .register(notify_once)
        .register(notify)
        .register(chatty)
        .register(chatter)
        .register(many_steps)
        .register(step_number)
        .llm(scripted)
        .llm_options(ActivityOptions::default().initial_backoff(Duration::ZERO))
}

async fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let worker = builder().data_dir(dir.path().join("data"));
    serve(worker.build().await.unwrap(), dir).await
}

async fn serve(worker: Worker, dir: tempfile::TempDir) -> Server {
    let tokens = [READER, ADMIN, DANA, OPS, CARRIER].map(|t| ApiToken::parse(t).unwrap());
    let config = HttpConfig {
        tokens: tokens.to_vec(),
        max_body_bytes: 4096,
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    tokio::spawn(http::serve(worker, listener, config, shutdown));
    Server {
        base,
        client: Client::new(),
        _dir: dir,
        stop: Some(stop),
    }
}

impl Server {
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.base);
        let method_name = method;
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let secret = token.rsplit(':').next().unwrap();
        let mut request = self.client.request(method, url).bearer_auth(secret);
        request = match body {
            Some(body) => request.json(&body),
            // Every POST is JSON, an empty one too.
            None => request.header("content-type", "application/json"),
        };
        let response = request.send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        let documented = check_answer(method_name, path, status.as_u16(), &body);
        documented.unwrap_or_else(|problem| panic!("outside the OpenAPI document: {problem}"));
        (status, body)
    }

    /// Waits until the workflow asks for an approval; the artifact hash it asks about.
    async fn pending_hash(&self, workflow_id: &str) -> String {
        let path = format!("/workflows/{workflow_id}");
        let asked = |b: &Value| !b["pending_approvals"].as_array().unwrap().is_empty();
        let shown = self.eventually(&path, asked).await;
        let hash = shown["pending_approvals"][0]["artifact_hash"].as_str();
        hash.unwrap().to_owned()
    }

    /// A request without a token.
    async fn anonymous(&self, path: &str) -> StatusCode {
        let url = format!("{}{path}", self.base);
        self.client.get(url).send().await.unwrap().status()
    }

    async fn eventually(&self, path: &str, check: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..400 {
            let (_, body) = self.call("GET", path, READER, None).await;
            if check(&body) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{path} never matched");
    }
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no JSON error>")
}

#[tokio::test]
async fn starts_are_deduplicated_by_request_id_and_bad_input_is_a_json_4xx() {
    let server = server().await;
    let start = json!({"input": "hello", "request_id": "req-1"});
    let (status, body) = server
        .call("POST", "/workflows/echo", ADMIN, Some(start.clone()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = body["workflow_id"].as_str().unwrap().to_owned();
    let (status, again) = server
        .call("POST", "/workflows/echo", ADMIN, Some(start))
        .await;
    assert_eq!(
        (status, again["workflow_id"].as_str()),
        (StatusCode::OK, Some(id.as_str()))
    );
    let other = json!({"input": "bye", "request_id": "req-1"});
    let (status, body) = server
        .call("POST", "/workflows/echo", ADMIN, Some(other))
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "conflict")
    );
    let result = server
        .eventually(&format!("/workflows/{id}/result"), |b| {
            b["status"] == "completed"
        })
        .await;
    assert_eq!(result["output"], "hello");

    let cases = [
        (
            "POST",
            "/workflows/nope",
            json!({"input": 1}),
            StatusCode::NOT_FOUND,
        ),
        (
            "POST",
            "/workflows/echo",
            json!({"input": 42}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/workflows/echo",
            json!({"inptu": "typo"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "POST",
            "/workflows/echo",
            json!({"input": "x".repeat(5000)}),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "GET",
            "/workflows/ghost",
            Value::Null,
            StatusCode::NOT_FOUND,
        ),
        (
            "GET",
            "/workflows/ghost/stream",
            Value::Null,
            StatusCode::NOT_FOUND,
        ),
        (
            "POST",
            "/workflows/ghost/cancel",
            Value::Null,
            StatusCode::NOT_FOUND,
        ),
        (
            "PUT",
            "/workflows/echo",
            Value::Null,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        ("GET", "/no/such/route", Value::Null, StatusCode::NOT_FOUND),
        (
            "GET",
            "/workflows?limit=0",
            Value::Null,
            StatusCode::BAD_REQUEST,
        ),
        (
            "GET",
            "/workflows?limit=1001",
            Value::Null,
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (method, path, body, expected) in cases {
        let body = (!body.is_null()).then_some(body);
        let (status, answer) = server.call(method, path, ADMIN, body).await;
        assert_eq!(status, expected, "{method} {path}: {answer}");
        assert!(
            answer["error"]["message"].is_string(),
            "{method} {path}: {answer}"
        );
    }
    let post = |content_type: &str, body: &str| {
        server
            .client
            .post(format!("{}/workflows/echo", server.base))
            .bearer_auth("w-secret")
            .header("content-type", content_type)
            .body(body.to_owned())
            .send()
    };
    let raw = post("application/json", "{not json").await.unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    // What a web page may send across origins without asking is refused before it is read.
    let start = r#"{"input": "from a web page"}"#;
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let cross_site = post(content_type, start).await.unwrap();
        assert_eq!(cross_site.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let body: Value = cross_site.json().await.unwrap();
        assert_eq!(error_code(&body), "unsupported_media_type");
    }
    let (_, list) = server.call("GET", "/workflows", READER, None).await;
    assert_eq!(
        list["workflows"].as_array().unwrap().len(),
        1,
        "nothing else was started"
    );
}

#[tokio::test]
async fn tokens_carry_roles_and_the_approver_is_the_token_not_the_body() {
    let server = server().await;
    assert_eq!(
        server.anonymous("/workflows").await,
        StatusCode::UNAUTHORIZED
    );
    let (status, _) = server.call("GET", "/workflows", "x:read:wrong", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let start = json!({"input": "ORD-1", "workflow_id": "wf-http"});
    let (status, body) = server
        .call(
            "POST",
            "/workflows/reviewed_reply",
            READER,
            Some(start.clone()),
        )
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    let (status, _) = server
        .call("POST", "/workflows/reviewed_reply", ADMIN, Some(start))
        .await;
    assert_eq!(status, StatusCode::CREATED);

    let hash = server.pending_hash("wf-http").await;
    // The approver reads what the scope names: the shown plan, by its own hash.
    let (status, scope) = server
        .call("GET", &format!("/artifacts/{hash}"), DANA, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{scope}");
    assert_eq!(scope["kind"], "approval_scope");
    let shown = scope["content"]["artifact"].as_str().unwrap().to_owned();
    let (_, plan) = server
        .call("GET", &format!("/artifacts/{shown}"), DANA, None)
        .await;
    assert_eq!(plan["content"], "rebook ORD-1");
    let refusals = [
        ("/artifacts/not-a-hash", DANA, StatusCode::BAD_REQUEST),
        (
            "/artifacts/sha256:0000000000000000000000000000000000000000000000000000000000000000",
            DANA,
            StatusCode::NOT_FOUND,
        ),
        (
            &format!("/artifacts/{hash}")[..],
            CARRIER,
            StatusCode::FORBIDDEN,
        ),
    ];
    for (path, token, expected) in refusals {
        let (status, body) = server.call("GET", path, token, None).await;
        assert_eq!(status, expected, "{path}: {body}");
    }
    let approve = json!({"decision": "approve"});
    let path = format!("/workflows/wf-http/approvals/{hash}");
    let (status, _) = server
        .call("POST", &path, ADMIN, Some(approve.clone()))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "write is not approve");
    let forged = json!({"decision": "approve", "approver": "ceo"});
    let (status, _) = server.call("POST", &path, DANA, Some(forged)).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "the body cannot name the approver"
    );
    let wrong = format!("/workflows/wf-http/approvals/sha256:{}", "0".repeat(64));
    let (status, body) = server
        .call("POST", &wrong, DANA, Some(approve.clone()))
        .await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::CONFLICT, "conflict")
    );
    let (status, body) = server.call("POST", &path, DANA, Some(approve)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["approver"], "dana");

    let signal = json!({"signal_id": "tone-1", "payload": "apologetic"});
    let (status, body) = server
        .call(
            "POST",
            "/workflows/wf-http/signals/tone",
            ADMIN,
            Some(signal.clone()),
        )
        .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("accepted"))
    );
    let (_, body) = server
        .call(
            "POST",
            "/workflows/wf-http/signals/tone",
            ADMIN,
            Some(signal),
        )
        .await;
    assert_eq!(body["outcome"], "duplicate");
    let result = server
        .eventually("/workflows/wf-http/result", |b| b["status"] == "completed")
        .await;
    assert_eq!(
        result["output"],
        "Sorry for the wait: your parcel ships today."
    );
    let (status, journal) = server
        .call("GET", "/workflows/wf-http/journal", READER, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let journal = journal.as_str().unwrap();
    assert!(journal.contains("approved by dana"), "{journal}");
    // Who started and who signalled come from the token, and are journaled.
    assert!(journal.contains("started_by          admin"), "{journal}");
    assert!(
        journal.contains("id=tone-1 from=admin payload=\"apologetic\""),
        "{journal}"
    );
}

/// Reads an SSE body into `(id, event, data)` triples.
fn parse_sse(text: &str) -> Vec<(u64, String, Value)> {
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut name, mut data) = (0, String::new(), Value::Null);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().unwrap_or(0);
            } else if let Some(v) = line.strip_prefix("event: ") {
                name = v.to_owned();
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = serde_json::from_str(v).unwrap_or(Value::Null);
            }
        }
        if !name.is_empty() {
            events.push((id, name, data));
        }
    }
    events
}

async fn read_stream(
    server: &Server,
    id: &str,
    last_event_id: Option<u64>,
) -> Vec<(u64, String, Value)> {
    let mut request = server
        .client
        .get(format!("{}/workflows/{id}/stream", server.base))
        .bearer_auth("r-secret");
    if let Some(last) = last_event_id {
        request = request.header("Last-Event-ID", last.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .unwrap()
        .unwrap();
    parse_sse(&text)
}

#[tokio::test]
async fn the_stream_resumes_after_last_event_id_and_marks_superseded_chunks() {
    let server = server().await;
    let start = json!({"input": "ORD-2", "workflow_id": "wf-sse"});
    server
        .call("POST", "/workflows/reviewed_reply", ADMIN, Some(start))
        .await;
    let hash = server.pending_hash("wf-sse").await;
    let path = format!("/workflows/wf-sse/approvals/{hash}");
    server
        .call("POST", &path, DANA, Some(json!({"decision": "approve"})))
        .await;
    let signal = json!({"signal_id": "t", "payload": "kind"});
    server
        .call(
            "POST",
            "/workflows/wf-sse/signals/tone",
            ADMIN,
            Some(signal),
        )
        .await;
    server
        .eventually("/workflows/wf-sse/result", |b| b["status"] == "completed")
        .await;

    let events = read_stream(&server, "wf-sse", None).await;
    let (last, rest) = events.split_last().unwrap();
    assert_eq!(last.1, "end");
    let ids: Vec<u64> = rest.iter().map(|e| e.0).collect();
    assert_eq!(
        ids,
        (1..=rest.len() as u64).collect::<Vec<_>>(),
        "numbered without gaps"
    );
    assert_eq!(rest[0].1, "approval_required");
    assert_eq!(rest[0].2["detail"]["artifact_hash"], hash.as_str());
    let shown: String = rest
        .iter()
        .filter(|e| e.1 == "chunk" && e.2["response_version"] == 2)
        .map(|e| e.2["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        shown, "Sorry for the wait: your parcel ships today.",
        "stream == committed"
    );
    let cut: Vec<&Value> = rest
        .iter()
        .filter(|e| e.1 == "chunk" && e.2["response_version"] == 1)
        .map(|e| &e.2)
        .collect();
    assert!(
        !cut.is_empty() && cut.iter().all(|c| c["superseded"] == true),
        "{cut:?}"
    );
    assert!(rest.iter().any(|e| e.1 == "committed"));
    let ready = rest
        .iter()
        .find(|e| e.1 == "final_response_ready")
        .expect("announced");
    assert_eq!(ready.2["detail"]["output"], shown.as_str());

    let resumed = read_stream(&server, "wf-sse", Some(3)).await;
    assert_eq!(resumed[0].0, 4, "exactly the events after Last-Event-ID");
    assert_eq!(resumed.len(), events.len() - 3);
    let (_, shown) = server.call("GET", "/workflows/wf-sse", READER, None).await;
    assert_eq!(
        shown["stream"]["delivered"]["default"], 3,
        "delivery is tracked apart from generation"
    );
    let (status, _) = server
        .call("GET", "/workflows/wf-sse/stream", READER, None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn operators_resolve_and_writers_cancel_over_http() {
    let server = server().await;
    let start = json!({"input": "ORD-3", "workflow_id": "wf-ops"});
    server
        .call("POST", "/workflows/notify_once", ADMIN, Some(start))
        .await;
    let shown = server
        .eventually("/workflows/wf-ops", |b| b["status"] == "awaiting_operator")
        .await;
    let key = shown["operations"][0]["key"].as_str().unwrap().to_owned();
    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let path = format!("/operations/{encoded}/resolve");
    let committed = json!({"decision": "committed", "result": "sent-7"});
    let (status, _) = server
        .call("POST", &path, ADMIN, Some(committed.clone()))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let wrong_type = json!({"decision": "committed", "result": 7});
    let (status, body) = server.call("POST", &path, OPS, Some(wrong_type)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = server.call("POST", &path, OPS, Some(committed)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result = server
        .eventually("/workflows/wf-ops/result", |b| b["status"] == "completed")
        .await;
    assert_eq!(result["output"], "sent-7");

    // A person's review of a model's answer is a decision: approve role, not write.
    let start = json!({"input": null, "workflow_id": "wf-review"});
    server
        .call("POST", "/workflows/wait_forever", ADMIN, Some(start))
        .await;
    let path = "/workflows/wf-review/signals/review";
    let review = json!({"signal_id": "r-1", "payload": {"decision": "replace", "text": "ok"}});
    let (status, body) = server.call("POST", path, ADMIN, Some(review.clone())).await;
    assert_eq!(
        (status, error_code(&body)),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    let (status, _) = server.call("POST", path, DANA, Some(review)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "an approver may review");
    let plain = json!({"signal_id": "p-1", "payload": {"note": "hello"}});
    let (status, _) = server.call("POST", path, DANA, Some(plain)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "other signals need write");

    let start = json!({"input": null, "workflow_id": "wf-cancel"});
    server
        .call("POST", "/workflows/wait_forever", ADMIN, Some(start))
        .await;
    let cancel = json!({"reason": "customer withdrew"});
    let (status, _) = server
        .call(
            "POST",
            "/workflows/wf-cancel/cancel",
            ADMIN,
            Some(cancel.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let result = server
        .eventually("/workflows/wf-cancel/result", |b| b["status"] == "failed")
        .await;
    assert_eq!(result["error"]["kind"], "Cancelled");
    assert!(result["error"]["message"]
        .as_str()
        .unwrap()
        .contains("cancelled by admin: customer withdrew"));
    let (status, _) = server
        .call("POST", "/workflows/wf-cancel/cancel", ADMIN, Some(cancel))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

/// The web UI's operations page, and the API's list of operations awaiting a decision, show
/// what a person must settle whatever the workflow's status: a cancelled workflow leaves its
/// call waiting for an operator, and no run will settle it.
#[tokio::test]
async fn a_call_a_cancelled_workflow_left_to_an_operator_is_listed_for_a_decision() {
    let server = server().await;
    let start = json!({"input": "ORD-12", "workflow_id": "wf-left"});
    server
        .call("POST", "/workflows/notify_once", ADMIN, Some(start))
        .await;
    server
        .eventually("/workflows/wf-left", |b| b["status"] == "awaiting_operator")
        .await;
    let cancel = json!({"reason": "customer withdrew"});
    let path = "/workflows/wf-left/cancel";
    let (status, _) = server.call("POST", path, ADMIN, Some(cancel)).await;
    assert_eq!(status, StatusCode::OK);
    let shown = server
        .eventually("/workflows/wf-left", |b| b["status"] == "failed")
        .await;
    assert_eq!(shown["operations"][0]["status"], "awaiting_operator");

    let session = web_ui::session(&server.base, "o-secret").await;
    let page = web_ui::page(&server.base, &session, "/ui/operations").await;
    assert!(page.contains(r#"href="/ui/workflows/wf-left""#), "{page}");
    assert!(page.contains("State: awaiting_operator"), "{page}");
    let listed = "/operations/awaiting-decision";
    let (status, awaiting) = server.call("GET", listed, READER, None).await;
    assert_eq!(status, StatusCode::OK, "{awaiting}");
    let key = shown["operations"][0]["key"].as_str().unwrap();
    let row = &awaiting["operations"][0];
    assert_eq!(awaiting["operations"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        (row["key"].as_str(), row["workflow_id"].as_str()),
        (Some(key), Some("wf-left"))
    );
    assert_eq!(
        (row["status"].as_str(), row["attempt"].as_u64()),
        (Some("awaiting_operator"), Some(1))
    );
    assert_eq!(row["arguments"], "ORD-12");
    let revision = row["revision"].as_u64().unwrap();
    assert_eq!(shown["operations"][0]["revision"].as_u64(), Some(revision));

    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let path = format!("/operations/{encoded}/resolve");
    // Decided on the record as it was one transition before: refused, though the attempt
    // is the same.
    let stale = json!({"decision": "not_found", "attempt": 1, "revision": revision - 1});
    let (status, body) = server.call("POST", &path, OPS, Some(stale)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("changed since it was read"), "{message}");
    // So is the UI's form, which posts the revision its page showed.
    let shown_revision = format!(r#"name="revision" value="{revision}""#);
    assert!(page.contains(&shown_revision), "{page}");
    let csrf = page.split(r#"name="csrf" value=""#).nth(1).unwrap();
    let csrf = &csrf[..csrf.find('"').unwrap()];
    let stale_revision = (revision - 1).to_string();
    let form = [
        ("csrf", csrf),
        ("key", key),
        ("attempt", "1"),
        ("revision", stale_revision.as_str()),
        ("decision", "not_found"),
    ];
    let posted = Client::new()
        .post(format!("{}/ui/operations/resolve", server.base))
        .header("cookie", &session)
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), StatusCode::CONFLICT);
    let refused = posted.text().await.unwrap();
    assert!(refused.contains("changed since it was read"), "{refused}");
    let not_found = json!({"decision": "not_found", "revision": revision});
    let (status, body) = server.call("POST", &path, OPS, Some(not_found)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let page = web_ui::page(&server.base, &session, "/ui/operations").await;
    assert!(
        !page.contains("wf-left"),
        "settled, no longer listed: {page}"
    );
    let (_, awaiting) = server.call("GET", listed, OPS, None).await;
    assert_eq!(awaiting, json!({"operations": [], "next": null}));
    let (status, _) = server.call("GET", listed, CARRIER, None).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a downstream's token reads no operation"
    );
}

/// The operations awaiting a decision come a page at a time, in key order, each page naming
/// the key the next one starts after: in the API, and in the UI (50 a page).
#[tokio::test]
async fn the_operations_awaiting_a_decision_come_a_page_at_a_time() {
    let server = server().await;
    let ids: Vec<String> = (0..51).map(|n| format!("wf-page-{n:02}")).collect();
    for (n, id) in ids.iter().enumerate() {
        let start = json!({"input": format!("ORD-{n}"), "workflow_id": id});
        server
            .call("POST", "/workflows/notify_once", ADMIN, Some(start))
            .await;
    }
    let mut keys = Vec::new();
    for id in &ids {
        let path = format!("/workflows/{id}");
        let shown = server
            .eventually(&path, |b| b["status"] == "awaiting_operator")
            .await;
        keys.push(shown["operations"][0]["key"].as_str().unwrap().to_owned());
    }
    let listed_keys = |page: &serde_json::Value| -> Vec<String> {
        let rows = page["operations"].as_array().unwrap();
        rows.iter()
            .map(|row| row["key"].as_str().unwrap().to_owned())
            .collect()
    };
    let encoded = |key: &str| -> String { key.bytes().map(|b| format!("%{b:02X}")).collect() };

    let listed = "/operations/awaiting-decision";
    let (status, first) = server
        .call("GET", &format!("{listed}?limit=50"), READER, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(listed_keys(&first), keys[..50]);
    assert_eq!(first["next"].as_str(), Some(keys[49].as_str()));
    let path = format!("{listed}?limit=50&after={}", encoded(&keys[49]));
    let (status, last) = server.call("GET", &path, READER, None).await;
    assert_eq!(status, StatusCode::OK, "{last}");
    assert_eq!(listed_keys(&last), keys[50..]);
    assert_eq!(last["next"], serde_json::Value::Null, "the last page");
    let (_, whole) = server.call("GET", listed, READER, None).await;
    assert_eq!(listed_keys(&whole), keys, "one page of up to 100");
    for bad in ["limit=0", "limit=1001", "limit=two", "page=2"] {
        let path = format!("{listed}?{bad}");
        let (status, body) = server.call("GET", &path, READER, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }

    let session = web_ui::session(&server.base, "o-secret").await;
    let shown = |page: &str, id: &str| page.contains(&format!(r#"href="/ui/workflows/{id}""#));
    let page = web_ui::page(&server.base, &session, "/ui/operations").await;
    assert!(shown(&page, &ids[49]) && !shown(&page, &ids[50]), "{page}");
    let next = r#"" rel="next""#;
    let link = page
        .split(next)
        .next()
        .and_then(|before| before.rsplit("href=\"").next());
    let link = link.filter(|link| link.starts_with("/ui/operations?after="));
    let page = web_ui::page(&server.base, &session, link.expect(&page)).await;
    assert!(shown(&page, &ids[50]) && !shown(&page, &ids[49]), "{page}");
    assert!(!page.contains(r#"rel="next""#), "the last page");
}

/// The downstream's webhook settles an unknown outcome with its own role; the same delivery
/// arriving twice at once, and again later, converges to one commit.
#[tokio::test]
async fn a_webhook_settles_an_unknown_outcome_once_however_often_it_is_delivered() {
    let server = server().await;
    let start = json!({"input": "ORD-9", "workflow_id": "wf-hook"});
    server
        .call("POST", "/workflows/notify_once", ADMIN, Some(start))
        .await;
    let shown = server
        .eventually("/workflows/wf-hook", |b| b["status"] == "awaiting_operator")
        .await;
    let key = shown["operations"][0]["key"].as_str().unwrap().to_owned();
    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let path = format!("/operations/{encoded}/settle");
    let sent = json!({"outcome": "committed", "result": "sent-9"});
    for token in [OPS, READER] {
        let (status, _) = server.call("POST", &path, token, Some(sent.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{token}");
    }
    let (first, second) = tokio::join!(
        server.call("POST", &path, CARRIER, Some(sent.clone())),
        server.call("POST", &path, CARRIER, Some(sent.clone())),
    );
    assert_eq!(
        (first.0, second.0),
        (StatusCode::OK, StatusCode::OK),
        "{first:?} {second:?}"
    );
    let duplicates = [&first.1, &second.1].map(|b| b["duplicate"].as_bool().unwrap());
    assert_eq!(
        duplicates.iter().filter(|d| **d).count(),
        1,
        "{duplicates:?}"
    );
    assert_eq!(first.1["settled_by"], "carrier");
    let (status, again) = server.call("POST", &path, CARRIER, Some(sent)).await;
    assert_eq!(
        (status, &again["duplicate"]),
        (StatusCode::OK, &json!(true))
    );
    let other = json!({"outcome": "committed", "result": "sent-10"});
    let (status, _) = server.call("POST", &path, CARRIER, Some(other)).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "another result is not a duplicate"
    );
    let result = server
        .eventually("/workflows/wf-hook/result", |b| b["status"] == "completed")
        .await;
    assert_eq!(result["output"], "sent-9");
    let (_, journal) = server
        .call("GET", "/workflows/wf-hook/journal", READER, None)
        .await;
    let journal = journal.as_str().unwrap();
    assert_eq!(
        journal.matches("by=downstream:carrier").count(),
        1,
        "{journal}"
    );
}

/// A downstream that reports it did not do the work fails the effect, naming itself.
#[tokio::test]
async fn a_webhook_can_report_a_failure() {
    let server = server().await;
    let start = json!({"input": "ORD-10", "workflow_id": "wf-hook-failed"});
    server
        .call("POST", "/workflows/notify_once", ADMIN, Some(start))
        .await;
    let shown = server
        .eventually("/workflows/wf-hook-failed", |b| {
            b["status"] == "awaiting_operator"
        })
        .await;
    let key = shown["operations"][0]["key"].as_str().unwrap().to_owned();
    let encoded: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
    let path = format!("/operations/{encoded}/settle");
    let failed = json!({"outcome": "failed", "reason": "address unknown"});
    let (status, body) = server.call("POST", &path, CARRIER, Some(failed)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let result = server
        .eventually("/workflows/wf-hook-failed/result", |b| {
            b["status"] == "failed"
        })
        .await;
    let message = result["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the downstream (`carrier`) failed the effect: address unknown"),
        "{message}"
    );
}

/// Who a run waits for is its status, and lists filter by it.
#[tokio::test]
async fn waiting_states_are_statuses_lists_filter_by() {
    let server = server().await;
    let start = json!({"input": "ORD-5", "workflow_id": "wf-wait"});
    server
        .call("POST", "/workflows/reviewed_reply", ADMIN, Some(start))
        .await;
    let ids = |body: &Value| -> Vec<String> {
        let rows = body["workflows"].as_array().unwrap().iter();
        rows.map(|r| r["workflow_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let waiting = |status: &'static str| move |b: &Value| b["status"] == status;
    server
        .eventually("/workflows/wf-wait", waiting("awaiting_approval"))
        .await;
    let (_, listed) = server
        .call("GET", "/workflows?status=awaiting_approval", READER, None)
        .await;
    assert_eq!(ids(&listed), ["wf-wait"]);
    let (_, listed) = server
        .call("GET", "/workflows?status=awaiting_signal", READER, None)
        .await;
    assert!(ids(&listed).is_empty());
    let (status, body) = server
        .call("GET", "/workflows?status=asleep", READER, None)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let hash = server.pending_hash("wf-wait").await;
    let path = format!("/workflows/wf-wait/approvals/{hash}");
    let approve = json!({"decision": "approve"});
    server.call("POST", &path, DANA, Some(approve)).await;
    server
        .eventually("/workflows/wf-wait", waiting("awaiting_signal"))
        .await;
    let (_, listed) = server
        .call("GET", "/workflows?status=awaiting_signal", READER, None)
        .await;
    assert_eq!(ids(&listed), ["wf-wait"]);
    // A page's rows are read whole: the length the list shows is the workflow's.
    let (_, detail) = server.call("GET", "/workflows/wf-wait", READER, None).await;
    let listed_len = &listed["workflows"][0]["journal_len"];
    assert_eq!(listed_len, &detail["journal_len"], "{listed}");
    assert!(listed_len.as_u64().unwrap() > 1, "{listed}");
    let signal = json!({"signal_id": "tone-1", "payload": "calm"});
    let path = "/workflows/wf-wait/signals/tone";
    server.call("POST", path, ADMIN, Some(signal)).await;
    server
        .eventually("/workflows/wf-wait", waiting("completed"))
        .await;
}

#[tokio::test]
async fn health_metrics_and_the_openapi_document_cover_every_route() {
    let server = server().await;
    assert_eq!(server.anonymous("/healthz").await, StatusCode::OK);
    let (status, metrics) = server.call("GET", "/metrics", READER, None).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().unwrap().to_owned();
    for name in [
        "waymark_approval_hash_mismatches_total",
        "waymark_snapshot_drift_total",
        "waymark_resident_workflows",
    ] {
        assert!(metrics.contains(name), "{name} in {metrics}");
    }
    // The served document is the generated one, which `tests/tests/openapi.rs` checks for
    // completeness; every answer of these tests is checked against it (`check_answer`).
    let document = reqwest::get(format!("{}/openapi.json", server.base))
        .await
        .unwrap();
    let document: Value = document.json().await.unwrap();
    assert_eq!(document, http::openapi_document());
    let paths = document["paths"].as_object().unwrap();
    assert!(paths.contains_key("/workflows/{id}/signals/{signal}"));
}

/// A `Last-Event-ID` that is no event number (not even ASCII) is refused, not read as 0; the
/// `end` event carries the last event's number, and a reconnection that saw everything of an
/// ended workflow is told there is nothing more (204), so a browser `EventSource` stops.
#[tokio::test]
async fn a_finished_stream_ends_once_and_bad_last_event_ids_are_refused() {
    let server = server().await;
    let start = json!({"input": "hello", "workflow_id": "wf-echo-sse"});
    server
        .call("POST", "/workflows/echo", ADMIN, Some(start))
        .await;
    server
        .eventually("/workflows/wf-echo-sse/result", |b| {
            b["status"] == "completed"
        })
        .await;
    let url = format!("{}/workflows/wf-echo-sse/stream", server.base);
    let value = reqwest::header::HeaderValue::from_bytes("é".as_bytes()).unwrap();
    let refused = server
        .client
        .get(&url)
        .bearer_auth("r-secret")
        .header("Last-Event-ID", value)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(error_code(&body), "bad_request");

    let events = read_stream(&server, "wf-echo-sse", None).await;
    let (end, rest) = events.split_last().unwrap();
    assert_eq!(end.1, "end");
    let last = rest.last().map_or(0, |e| e.0);
    assert!(last > 0, "final_response_ready was streamed");
    assert_eq!(end.0, last, "the end carries the last event's number");
    let again = server
        .client
        .get(&url)
        .bearer_auth("r-secret")
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
}

/// Readers acknowledge per channel, by reconnecting or explicitly; an acknowledgement never
/// moves back, one past the stream's newest event is refused, and each refusal changes nothing.
#[tokio::test]
async fn readers_acknowledge_per_channel_never_back_never_past_the_stream() {
    let server = server().await;
    let start = json!({"input": "hello", "workflow_id": "wf-ack"});
    server
        .call("POST", "/workflows/echo", ADMIN, Some(start))
        .await;
    server
        .eventually("/workflows/wf-ack/result", |b| b["status"] == "completed")
        .await;
    let events = read_stream(&server, "wf-ack", None).await;
    let last = events.split_last().unwrap().0 .0;
    let ack = |event: Value, channel: &str| json!({"event": event, "channel": channel});
    let path = "/workflows/wf-ack/stream/ack";
    let (status, body) = server
        .call("POST", path, READER, Some(ack(json!(last), "mobile")))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["delivered"], last);
    let (status, body) = server
        .call("POST", path, READER, Some(ack(json!(0), "mobile")))
        .await;
    assert_eq!(
        (status, &body["delivered"]),
        (StatusCode::OK, &json!(last)),
        "never back"
    );
    let refusals = [
        (ack(json!(last + 1), "mobile"), StatusCode::CONFLICT),
        (ack(json!(1), "no spaces"), StatusCode::BAD_REQUEST),
        (ack(json!(-1), "mobile"), StatusCode::BAD_REQUEST),
        (json!({"event": 1, "reader": "x"}), StatusCode::BAD_REQUEST),
    ];
    for (request, expected) in refusals {
        let (status, body) = server
            .call("POST", path, READER, Some(request.clone()))
            .await;
        assert_eq!(status, expected, "{request} → {body}");
    }
    let unknown = "/workflows/nobody/stream/ack";
    let (status, _) = server
        .call("POST", unknown, READER, Some(ack(json!(0), "mobile")))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, shown) = server.call("GET", "/workflows/wf-ack", READER, None).await;
    assert_eq!(shown["stream"]["delivered"], json!({"mobile": last}));
    let past = server
        .client
        .get(format!(
            "{}/workflows/wf-ack/stream?channel=web",
            server.base
        ))
        .bearer_auth("r-secret")
        .header("Last-Event-ID", (last + 1).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(
        past.status(),
        StatusCode::CONFLICT,
        "a reconnection past the stream"
    );
}

/// A long stream is read from the store a page at a time, by the reader and by its
/// superseded-versions scan alike, and reaches the client whole and in order; the workflow
/// page shows the last event without reading the others.
#[tokio::test]
async fn a_long_stream_is_read_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = waymark_tests::store::WatchedStore::open(dir.path()).unwrap();
    let worker = builder().store(store.clone()).build().await.unwrap();
    let server = serve(worker, dir).await;
    let start = json!({"input": 1000, "workflow_id": "wf-long-stream"});
    server
        .call("POST", "/workflows/chatty", ADMIN, Some(start))
        .await;
    let ended = |b: &Value| b["status"] == "completed";
    server
        .eventually("/workflows/wf-long-stream/result", ended)
        .await;
    store.take_stream_rows();
    let events = read_stream(&server, "wf-long-stream", None).await;
    let chunks: Vec<String> = events
        .iter()
        .filter(|e| e.1 == "chunk")
        .map(|e| e.2["text"].as_str().unwrap().to_owned())
        .collect();
    let expected: Vec<String> = (0..1000).map(|n| format!("{n} ")).collect();
    assert_eq!(chunks, expected, "every chunk, in order");
    assert_eq!(events.last().unwrap().1, "end");
    let rows = store.take_stream_rows();
    let largest = rows.iter().max().copied().unwrap_or_default();
    assert!(largest <= 256, "a read of {largest} events: {rows:?}");
    assert!(rows.iter().sum::<usize>() >= 2 * 1000, "{rows:?}");
    let (_, view) = server
        .call("GET", "/workflows/wf-long-stream", READER, None)
        .await;
    assert_eq!(view["stream"]["last_event"], events.last().unwrap().0);
    let rows = store.take_stream_rows();
    assert!(rows.iter().all(|n| *n <= 1), "the page read {rows:?}");
}

/// A long journal is rendered as it is read, a page at a time, whole and in order; `from` and
/// `limit` still page it.
#[tokio::test]
async fn a_long_journal_is_sent_as_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let store = waymark_tests::store::WatchedStore::open(dir.path()).unwrap();
    let worker = builder().store(store.clone()).build().await.unwrap();
    let server = serve(worker, dir).await;
    let start = json!({"input": 300, "workflow_id": "wf-journal-pages"});
    server
        .call("POST", "/workflows/many_steps", ADMIN, Some(start))
        .await;
    let ended = |b: &Value| b["status"] == "completed";
    server
        .eventually("/workflows/wf-journal-pages/result", ended)
        .await;
    let len = server
        .call("GET", "/workflows/wf-journal-pages", READER, None)
        .await
        .1["journal_len"]
        .as_u64()
        .unwrap();
    store.take_journal_rows();
    let (status, text) = server
        .call("GET", "/workflows/wf-journal-pages/journal", READER, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap().to_owned();
    assert_eq!(text.lines().count() as u64, len, "{text}");
    assert!(len > 600, "{len} entries");
    let rows = store.take_journal_rows();
    assert_eq!(rows.iter().sum::<usize>() as u64, len, "{rows:?}");
    assert!(rows.iter().all(|n| *n <= 256), "{rows:?}");
    let (_, page) = server
        .call(
            "GET",
            "/workflows/wf-journal-pages/journal?from=1&limit=2",
            READER,
            None,
        )
        .await;
    let page: Vec<&str> = page.as_str().unwrap().lines().collect();
    assert_eq!(page, text.lines().skip(1).take(2).collect::<Vec<_>>());
}

/// A store that fails while a reader waits: the stream says so with an `error` event before it
/// ends, instead of ending as if the workflow had nothing more to say.
#[tokio::test]
async fn a_store_failure_mid_stream_is_an_error_event() {
    let dir = tempfile::tempdir().unwrap();
    let store = waymark_tests::store::WatchedStore::open(dir.path()).unwrap();
    let worker = builder().store(store.clone()).build().await.unwrap();
    let server = serve(worker, dir).await;
    let start = json!({"input": null, "workflow_id": "wf-sse-broken"});
    server
        .call("POST", "/workflows/wait_forever", ADMIN, Some(start))
        .await;
    let response = server
        .client
        .get(format!("{}/workflows/wf-sse-broken/stream", server.base))
        .bearer_auth("r-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    store.fail_stream_reads(true);
    // The end wakes the reader, whose next read fails.
    let cancel = json!({"reason": "done waiting"});
    server
        .call(
            "POST",
            "/workflows/wf-sse-broken/cancel",
            ADMIN,
            Some(cancel),
        )
        .await;
    let text = tokio::time::timeout(Duration::from_secs(10), response.text())
        .await
        .expect("the stream ends")
        .unwrap();
    let events = parse_sse(&text);
    let last = events.last().expect("an event");
    assert_eq!(last.1, "error", "{text}");
    let message = last.2["message"].as_str().unwrap_or_default();
    assert!(message.contains("the disk is gone"), "{message}");
}

/// Forking and resetting are an operator's: a writer or a reader is refused (403) and nothing
/// is made; the fork's journal names the operator; a malformed or unknown field is a 400.
#[tokio::test]
async fn forks_and_resets_are_an_operators_and_say_who_made_them() {
    let server = server().await;
    let start = json!({"input": null, "workflow_id": "wf-source"});
    server
        .call("POST", "/workflows/wait_forever", ADMIN, Some(start))
        .await;
    server
        .eventually("/workflows/wf-source", |b| b["status"] == "awaiting_signal")
        .await;
    let fork = json!({"at": 1, "workflow_id": "wf-copy"});
    for token in [READER, ADMIN, DANA] {
        let (status, body) = server
            .call(
                "POST",
                "/workflows/wf-source/fork",
                token,
                Some(fork.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{token}: {body}");
        let (status, _) = server
            .call(
                "POST",
                "/workflows/wf-source/reset",
                token,
                Some(json!({"at": 1})),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{token}");
    }
    let (status, _) = server.call("GET", "/workflows/wf-copy", READER, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a refused fork made nothing");
    let unknown = json!({"at": 1, "workflow_id": "wf-copy", "rewind": true});
    let (status, _) = server
        .call("POST", "/workflows/wf-source/fork", OPS, Some(unknown))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, body) = server
        .call("POST", "/workflows/wf-source/fork", OPS, Some(fork))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["workflow_id"], "wf-copy");
    let (_, journal) = server
        .call("GET", "/workflows/wf-copy/journal", READER, None)
        .await;
    assert!(
        journal
            .as_str()
            .unwrap()
            .contains("forked              from=wf-source at=1"),
        "{journal}"
    );
    assert!(journal.as_str().unwrap().contains("by=ops"), "{journal}");
    // Only a stuck run is reset.
    let (status, body) = server
        .call(
            "POST",
            "/workflows/wf-source/reset",
            OPS,
            Some(json!({"at": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}
