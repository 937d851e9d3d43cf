//! Namespaces over the API: a token acts in its namespaces only, a workflow belongs to one, ids
//! and request ids are independent across namespaces, and every access to another namespace's
//! workflow, operation or artifact answers 404 and changes nothing.

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::prelude::*;
use waymark::Worker;
use waymark_tests::unanswered::{notice, unanswered};

mod web_ui;

/// Commits an artifact, then waits for a `go` signal.
#[workflow]
async fn noted(ctx: WorkflowContext, note: String) -> Result<String, WorkflowError> {
    ctx.artifact(json!({ "note": note }))?;
    let go: String = ctx.signal("go").await?;
    Ok(format!("{note} {go}"))
}

const BILLING: &str = "billing-s3cret";
const SUPPORT: &str = "support-s3cret";
const OPS: &str = "ops-s3cret";
const LEGACY: &str = "legacy-s3cret";

/// A worker serving the API with the tokens above, and a client for it.
struct Served {
    _dir: tempfile::TempDir,
    base: String,
    client: Client,
}

impl Served {
    fn caller(&self, token: &'static str, namespace: Option<&'static str>) -> Caller<'_> {
        Caller {
            client: &self.client,
            base: &self.base,
            token,
            namespace,
        }
    }
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let tokens = format!(
        "billing:read+write+approve+operate@billing:{BILLING},\
         support:read+write@support|billing:{SUPPORT},\
         ops:read+operate@*:{OPS},\
         legacy:read+write+operate:{LEGACY}"
    );
    let config = HttpConfig {
        tokens: ApiToken::parse_list(&tokens).unwrap(),
        ..HttpConfig::default()
    };
    let worker = Worker::builder()
        .data_dir(dir.path().join("data"))
        .register(noted)
        .register(notice)
        .register(unanswered)
        .build()
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(http::serve(
        worker,
        listener,
        config,
        std::future::pending(),
    ));
    Served {
        _dir: dir,
        base,
        client: Client::new(),
    }
}

struct Caller<'a> {
    client: &'a Client,
    base: &'a str,
    token: &'static str,
    namespace: Option<&'static str>,
}

impl Caller<'_> {
    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(self.token);
        match self.namespace {
            Some(namespace) => request.header("waymark-namespace", namespace),
            None => request,
        }
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let answer = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let request = self.request(reqwest::Method::POST, path).json(&body);
        let answer = request.send().await.unwrap();
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    async fn text(&self, path: &str) -> String {
        let answer = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        answer.text().await.unwrap()
    }

    async fn ids(&self) -> Vec<String> {
        let (status, listed) = self.get("/workflows").await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let rows = listed["workflows"].as_array().unwrap().iter();
        rows.map(|w| w["workflow_id"].as_str().unwrap().to_owned())
            .collect()
    }

    async fn wait_for_status(&self, id: &str, wanted: &str) -> Value {
        for _ in 0..400 {
            let (_, shown) = self.get(&format!("/workflows/{id}")).await;
            if shown["status"] == wanted {
                return shown;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("`{id}` never reached {wanted}");
    }
}

#[tokio::test]
async fn each_namespace_sees_its_own_workflows_and_answers_404_for_the_others() {
    let served = serve().await;
    let caller = |token, namespace| served.caller(token, namespace);
    let billing = caller(BILLING, None);
    let support = caller(SUPPORT, Some("support"));
    let legacy = caller(LEGACY, None);

    // One request id in two namespaces starts two workflows, each under the same id.
    for (who, note) in [(&billing, "invoice"), (&support, "ticket")] {
        let body = json!({"input": note, "request_id": "r-1"});
        let (status, started) = who.post("/workflows/noted", body).await;
        assert_eq!(status, StatusCode::CREATED, "{started}");
        assert_eq!(started["workflow_id"], "r-1");
    }
    billing.wait_for_status("r-1", "awaiting_signal").await;
    support.wait_for_status("r-1", "awaiting_signal").await;
    assert_eq!(billing.ids().await, ["r-1"]);
    assert_eq!(support.ids().await, ["r-1"]);
    assert_eq!(legacy.ids().await, Vec::<String>::new());

    // A token of several namespaces names one; it acts only there.
    let support_in_billing = caller(SUPPORT, Some("billing"));
    let journal = support_in_billing.text("/workflows/r-1/journal").await;
    assert!(
        journal.contains("invoice") && !journal.contains("ticket"),
        "{journal}"
    );
    let journal = support.text("/workflows/r-1/journal").await;
    assert!(
        journal.contains("ticket") && !journal.contains("invoice"),
        "{journal}"
    );
    let (status, whoami) = support.get("/whoami").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(whoami["namespaces"], json!(["support", "billing"]));

    // Every way into another namespace's workflow is a 404 that changes nothing.
    let before = billing.get("/workflows/r-1").await;
    let go = json!({"signal_id": "s-1", "payload": "now"});
    let foreign = [
        legacy.get("/workflows/r-1").await,
        legacy.get("/workflows/r-1/result").await,
        legacy.post("/workflows/r-1/signals/go", go.clone()).await,
        legacy.post("/workflows/r-1/cancel", json!({})).await,
        legacy
            .post("/workflows/r-1/stream/ack", json!({"event": 0}))
            .await,
        legacy
            .post(
                "/operations/r-1%7Cnone%7Cv1/resolve",
                json!({"decision": "not_found"}),
            )
            .await,
        caller(LEGACY, Some("billing")).get("/workflows").await,
        caller(BILLING, Some("support")).get("/workflows/r-1").await,
    ];
    for (status, body) in foreign {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body["error"]["code"], "not_found", "{body}");
    }
    assert_eq!(billing.get("/workflows/r-1").await, before);

    // A workflow's artifact is read in its namespace only.
    let hash = artifact_hash(&billing).await;
    let (status, read) = billing.get(&format!("/artifacts/{hash}")).await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["workflow_id"], "r-1");
    let (status, _) = legacy.get(&format!("/artifacts/{hash}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // The same content committed in another namespace is that namespace's own artifact.
    let (status, _) = support.get(&format!("/artifacts/{hash}")).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "support has not committed it yet"
    );
    let body = json!({"input": "invoice", "workflow_id": "r-2"});
    let (status, started) = support.post("/workflows/noted", body).await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    support.wait_for_status("r-2", "awaiting_signal").await;
    let (status, read) = support.get(&format!("/artifacts/{hash}")).await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["workflow_id"], "r-2");

    // A token of every namespace names the one it acts in.
    let ops = caller(OPS, Some("billing"));
    assert_eq!(ops.ids().await, ["r-1"]);
    assert_eq!(caller(OPS, None).ids().await, Vec::<String>::new());

    // Signalled in its own namespace, each workflow goes on alone.
    let (status, _) = billing.post("/workflows/r-1/signals/go", go).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let done = billing.wait_for_status("r-1", "completed").await;
    assert_eq!(done["workflow_id"], "r-1");
    let (_, result) = billing.get("/workflows/r-1/result").await;
    assert_eq!(result["output"], "invoice now");
    let (_, still) = support.get("/workflows/r-1").await;
    assert_eq!(still["status"], "awaiting_signal");
}

/// The operations awaiting a decision are listed in their namespace only.
#[tokio::test]
async fn each_namespace_lists_only_its_own_operations_awaiting_a_decision() {
    let served = serve().await;
    let caller = |token, namespace| served.caller(token, namespace);
    let billing = caller(BILLING, None);
    let body = json!({"input": "ORD-5", "workflow_id": "r-1"});
    let (status, started) = billing.post("/workflows/notice", body).await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    billing.wait_for_status("r-1", "awaiting_operator").await;

    let listed = "/operations/awaiting-decision";
    let keys = |(status, body): (StatusCode, Value)| {
        assert_eq!(status, StatusCode::OK, "{body}");
        let rows = body["operations"].as_array().unwrap().iter();
        rows.map(|r| r["key"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let in_billing = keys(billing.get(listed).await);
    assert_eq!(in_billing, [r#"r-1|unanswered|["ORD-5"]|v1"#]);
    assert_eq!(
        keys(caller(OPS, Some("billing")).get(listed).await),
        in_billing
    );
    for elsewhere in [caller(SUPPORT, Some("support")), caller(OPS, None)] {
        assert_eq!(keys(elsewhere.get(listed).await), Vec::<String>::new());
    }

    // The web UI's page lists them in the session's namespace (a token's first) alone.
    let listed_call = "unanswered v1 of workflow";
    let billing_page = web_ui::session(&served.base, BILLING).await;
    let shown = web_ui::page(&served.base, &billing_page, "/ui/operations").await;
    assert!(shown.contains(listed_call), "{shown}");
    let support_page = web_ui::session(&served.base, SUPPORT).await;
    let shown = web_ui::page(&served.base, &support_page, "/ui/operations").await;
    assert!(!shown.contains(listed_call), "{shown}");
}

/// The hash of the artifact the billing workflow committed, from its journal.
async fn artifact_hash(billing: &Caller<'_>) -> String {
    let journal = billing.text("/workflows/r-1/journal").await;
    let at = journal.find("sha256:").expect("the artifact's hash");
    journal[at..at + 71].to_owned()
}

#[tokio::test]
async fn an_id_cannot_name_another_namespace() {
    let served = serve().await;
    let legacy = served.caller(LEGACY, None);
    for body in [
        json!({"input": "x", "workflow_id": "billing\u{1f}forged"}),
        json!({"input": "x", "request_id": "billing\u{1f}forged"}),
    ] {
        let (status, refused) = legacy.post("/workflows/noted", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    }
    let (status, _) = legacy.get("/workflows/billing%1Fforged").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(legacy.ids().await, Vec::<String>::new());
}
