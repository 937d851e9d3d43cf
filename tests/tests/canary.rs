//! Canaries: a worker encrypting at rest, with canary bearer tokens, a canary model API key
//! and a redacted canary field, runs a workflow through every table (a request id, an
//! artifact and its approval, a signal, an effect and its operation log, a streamed model
//! answer). Afterwards no canary is in clear anywhere in its data dir, nor in an export; a
//! plaintext export (asked for) shows the payloads, but never a secret, and the redacted field
//! only where the code gets it back.

use std::path::Path;
use std::sync::Arc;

use reqwest::{Client, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use waymark::approvals::{ApprovalOutcome, ArtifactMeta};
use waymark::codec::{Codec, EncryptionKey, Keyring};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::inspect::{DataDir, Entry, Export};
use waymark::llm::OpenAiCompatible;
use waymark::prelude::*;
use waymark::testing::{ReplayError, Replayer};
use waymark::Worker;
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const API_KEY: &str = "sk-canary-api-key-5d1e77";
const WRITER_TOKEN: &str = "canary-bearer-writer-8a7f01";
const APPROVER_TOKEN: &str = "canary-bearer-approver-3b9c42";
const CARD: &str = "canary-card-4111-0000-1111";
const NOTE: &str = "canary-note-of-the-order";
const ANSWER: &str = "canary-streamed-answer";

const SECRETS: [&str; 3] = [API_KEY, WRITER_TOKEN, APPROVER_TOKEN];
const PAYLOADS: [&str; 3] = [CARD, NOTE, ANSWER];

#[derive(Clone, Serialize, Deserialize)]
struct Payment {
    card_number: String,
}

#[derive(Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    note: String,
    payment: Payment,
}

#[activity(effect)]
async fn charge(#[key] order_id: String, payment: Payment) -> Result<String, ActivityError> {
    let last_four = &payment.card_number[payment.card_number.len() - 4..];
    Ok(format!("receipt {order_id} ****{last_four}"))
}

#[workflow]
async fn checkout(ctx: WorkflowContext, order: Order) -> Result<String, WorkflowError> {
    let plan = format!("charge {} for {}", order.order_id, order.note);
    let plan = ctx.artifact_with(plan, ArtifactMeta::new("plan"))?;
    let ApprovalOutcome::Approved(_) = ctx.approval(&plan).await else {
        return Err(WorkflowError::new("not approved"));
    };
    let tone: String = ctx.signal("tone").await?;
    let receipt = ctx
        .effect(charge, (order.order_id.clone(), order.payment.clone()))
        .await?;
    let request = Llm::new("writer")
        .user(format!("{tone}: {receipt}"))
        .streamed();
    Ok(ctx.llm(request).await?.text)
}

/// A model server that streams [`ANSWER`], only to a caller presenting [`API_KEY`].
async fn model_server() -> MockServer {
    let server = MockServer::start().await;
    let events = [
        json!({"model": "writer-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "here: "}}]}),
        json!({"model": "writer-1", "choices": [{"index": 0, "delta": {"content": ANSWER}, "finish_reason": "stop"}]}),
        json!({"model": "writer-1", "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
    ];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .and(header(
            "authorization",
            format!("Bearer {API_KEY}").as_str(),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    server
}

/// Every file under `dir` holding one of `needles`, with the needle.
fn files_holding(dir: &Path, needles: &[&str]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files_holding(&path, needles));
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for needle in needles {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push((path.display().to_string(), needle.to_string()));
            }
        }
    }
    found
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

struct Api {
    client: Client,
    base: String,
}

impl Api {
    async fn call(&self, verb: &str, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        let verb = reqwest::Method::from_bytes(verb.as_bytes()).unwrap();
        let request = self.client.request(verb, format!("{}{path}", self.base));
        let answer = request.bearer_auth(token).json(&body).send().await.unwrap();
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    async fn bytes(&self, path: &str) -> Vec<u8> {
        let request = self.client.get(format!("{}{path}", self.base));
        let answer = request.bearer_auth(WRITER_TOKEN).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        answer.bytes().await.unwrap().to_vec()
    }

    /// Polls the workflow until `done` holds of what `GET /workflows/wf-canary` shows.
    async fn until(&self, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..500 {
            let (_, shown) = self
                .call("GET", "/workflows/wf-canary", WRITER_TOKEN, Value::Null)
                .await;
            if done(&shown) {
                return shown;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the workflow never got there");
    }
}

/// Runs the workflow to its end over the API; the sealed and the plaintext export.
async fn run_scenario(api: &Api) -> (Vec<u8>, Vec<u8>) {
    let order = json!({"order_id": "o-1", "note": NOTE, "payment": {"card_number": CARD}});
    let body = json!({"input": order, "request_id": "wf-canary"});
    let (status, started) = api
        .call("POST", "/workflows/checkout", WRITER_TOKEN, body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    let asked = |shown: &Value| {
        shown["pending_approvals"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    };
    let shown = api.until(asked).await;
    let hash = shown["pending_approvals"][0]["artifact_hash"]
        .as_str()
        .unwrap();
    let path = format!("/workflows/wf-canary/approvals/{hash}");
    let approve = json!({"decision": "approve"});
    let (status, decided) = api.call("POST", &path, APPROVER_TOKEN, approve).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let tone = json!({"signal_id": "t-1", "payload": "kind"});
    let path = "/workflows/wf-canary/signals/tone";
    let (status, sent) = api.call("POST", path, WRITER_TOKEN, tone).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    api.until(|shown| shown["status"] == "completed").await;
    let (_, result) = api
        .call(
            "GET",
            "/workflows/wf-canary/result",
            WRITER_TOKEN,
            Value::Null,
        )
        .await;
    assert_eq!(result["output"], format!("here: {ANSWER}"), "{result}");
    let sealed = api
        .bytes("/workflows/wf-canary/journal?format=binary")
        .await;
    let plain = api
        .bytes("/workflows/wf-canary/journal?format=binary&plaintext=true")
        .await;
    (sealed, plain)
}

#[tokio::test]
async fn no_canary_is_in_clear_in_the_data_dir_or_an_export() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let model = model_server().await;
    let keys: Arc<dyn Codec> =
        Arc::new(Keyring::new(vec![EncryptionKey::generate("k1").unwrap()]).unwrap());
    let worker = Worker::builder()
        .data_dir(&data)
        .codec(keys.clone())
        .redact_fields(["card_number"])
        .register(checkout)
        .register(charge)
        .llm(OpenAiCompatible::new(&format!("{}/v1", model.uri())).api_key(API_KEY))
        .build()
        .await
        .unwrap();
    let tokens = format!("writer:read+write:{WRITER_TOKEN},approver:read+approve:{APPROVER_TOKEN}");
    let config = HttpConfig {
        tokens: ApiToken::parse_list(&tokens).unwrap(),
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = Api {
        client: Client::new(),
        base: format!("http://{}", listener.local_addr().unwrap()),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(http::serve(worker, listener, config, async move {
        let _ = stopped.await;
    }));
    let (sealed, plain) = run_scenario(&api).await;
    let everything: Vec<&str> = SECRETS.iter().chain(&PAYLOADS).copied().collect();
    // Running, the store's log holds every write as written; stopped, its table files hold
    // them compressed, where a leak is harder to find: both are searched.
    assert_eq!(
        files_holding(&data, &everything),
        Vec::new(),
        "in the data dir"
    );
    let _ = stop.send(());
    serving.await.unwrap().unwrap();
    assert!(
        !model.received_requests().await.unwrap().is_empty(),
        "the key was used"
    );

    assert_eq!(
        files_holding(&data, &everything),
        Vec::new(),
        "in the data dir, stopped"
    );
    for canary in &everything {
        assert!(!holds(&sealed, canary), "{canary} in the export");
    }
    // Asked for in clear, the export shows what the code gets back, and no secret.
    assert!(holds(&plain, NOTE) && holds(&plain, ANSWER));
    for secret in SECRETS {
        assert!(!holds(&plain, secret), "{secret} in the plaintext export");
    }
    let sealed_entries = Export::read(&sealed, Some(keys.as_ref())).unwrap().entries;
    let plain_entries = Export::read(&plain, None).unwrap().entries;
    assert_eq!(sealed_entries, plain_entries, "one journal, sealed or not");
    let replayer = || Replayer::new().register(checkout).register(charge);
    let refused = replayer().replay_bytes(&sealed).unwrap_err().to_string();
    assert!(refused.contains("sealed"), "{refused}");
    // With the keys it decodes, and replays up to the model call (a replayer hosts no model).
    let opened = replayer().codec(keys.clone()).replay_bytes(&sealed);
    assert!(
        matches!(&opened, Err(ReplayError::NotRegistered(name)) if name == "waymark.llm"),
        "{opened:?}"
    );
    assert_redacted_outside_what_the_code_gets_back(&plain_entries, &data, keys);
}

/// The card is journaled whole only in the workflow's input (the code gets it back on
/// replay); the effect's journaled input holds its digest. The operation log keeps it whole,
/// sealed: it is what the reconciler is given and the record of what ran.
fn assert_redacted_outside_what_the_code_gets_back(
    journal: &[Entry],
    data: &Path,
    keys: Arc<dyn Codec>,
) {
    for entry in journal {
        let shown = format!("{entry:?}");
        match entry {
            Entry::WorkflowStarted(_) => assert!(shown.contains(CARD)),
            _ => assert!(!shown.contains(CARD), "{shown}"),
        }
        if let Entry::ActivityScheduledAt { input, .. } = entry {
            let input = String::from_utf8_lossy(input.as_bytes()).into_owned();
            if input.contains("card_number") {
                assert!(input.contains("redacted:sha256:"), "{input}");
            }
        }
    }
    let store = DataDir::open_with_codec(data, Some(keys)).unwrap();
    let operations = store.all_operations().unwrap();
    assert_eq!(operations.len(), 1);
    for (_, record) in operations {
        let arguments = format!("{:?}", record.unwrap().arguments);
        assert!(arguments.contains(CARD), "{arguments}");
    }
}
