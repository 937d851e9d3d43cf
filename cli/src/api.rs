//! The commands against a running worker's HTTP API.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{bail, Context as _};
use reqwest::{Client, Method, RequestBuilder};
use serde_json::{json, Value};

use crate::{json_arg, ArtifactAction, Command};

pub(crate) struct Api {
    client: Client,
    base: String,
    token: Option<String>,
    namespace: Option<String>,
}

impl Api {
    pub(crate) fn new(base: &str, token: Option<String>, namespace: Option<String>) -> Self {
        let base = base.trim_end_matches('/').to_owned();
        let client = Client::new();
        Self {
            client,
            base,
            token,
            namespace,
        }
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        match &self.namespace {
            Some(namespace) => request.header("waymark-namespace", namespace),
            None => request,
        }
    }

    async fn send(&self, request: RequestBuilder) -> anyhow::Result<reqwest::Response> {
        let response = request.send().await.context("the worker did not answer")?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"].as_str().unwrap_or("no details");
        bail!("{status}: {message}")
    }

    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.send(self.request(Method::GET, path)).await?;
        Ok(response.json().await?)
    }

    async fn delete(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.send(self.request(Method::DELETE, path)).await?;
        Ok(response.json().await?)
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let request = self.request(Method::POST, path).json(&body);
        Ok(self.send(request).await?.json().await?)
    }
}

/// A path segment, percent-encoded: ids may hold `/`, `?`, `#` or `%`.
fn seg(text: &str) -> String {
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-._~:".contains(&b);
    let encode = |b: u8| match keep(b) {
        true => (b as char).to_string(),
        false => format!("%{b:02X}"),
    };
    text.bytes().map(encode).collect()
}

pub(crate) async fn run(api: Api, command: Command) -> anyhow::Result<()> {
    match command {
        Command::List { status } => list(&api, status.as_deref()).await,
        Command::Show { id } => show(&api, &id).await,
        Command::Approve {
            id,
            hash,
            approver,
            reject,
            request,
        } => {
            let decision = Decision { reject, request };
            approve(&api, &id, &hash, &approver, decision).await
        }
        Command::Artifact {
            action: ArtifactAction::Show { hash },
        } => {
            let artifact = api.get(&format!("/artifacts/{}", seg(&hash))).await?;
            println!("{}", serde_json::to_string_pretty(&artifact)?);
            Ok(())
        }
        Command::Signal {
            id,
            name,
            signal_id,
            payload,
        } => {
            let body = json!({"signal_id": signal_id, "payload": json_arg("--payload", &payload)?});
            let answer = api
                .post(
                    &format!("/workflows/{}/signals/{}", seg(&id), seg(&name)),
                    body,
                )
                .await?;
            println!(
                "signal {name} to {id}: {}",
                answer["outcome"].as_str().unwrap_or("?")
            );
            Ok(())
        }
        Command::Resolve {
            key,
            committed,
            not_found,
            failed,
            attempt,
        } => resolve(&api, &key, committed, not_found, failed, attempt).await,
        Command::Cancel { id, reason } => {
            let answer = api
                .post(
                    &format!("/workflows/{}/cancel", seg(&id)),
                    json!({"reason": reason}),
                )
                .await?;
            println!("{id}: {}", answer["reason"].as_str().unwrap_or("cancelled"));
            Ok(())
        }
        Command::Delete { id } => {
            api.delete(&format!("/workflows/{}", seg(&id))).await?;
            println!("{id}: deleted");
            Ok(())
        }
        Command::Export { id, plaintext } => {
            let path = format!(
                "/workflows/{}/journal?format=binary&plaintext={plaintext}",
                seg(&id)
            );
            let bytes = api
                .send(api.request(Method::GET, &path))
                .await?
                .bytes()
                .await?;
            std::io::stdout().write_all(&bytes)?;
            Ok(())
        }
        Command::Import { .. } => {
            bail!("import writes into a stopped worker's data dir: use --data-dir, not --url")
        }
        Command::Rekey => {
            bail!("rekey rewrites a stopped worker's data dir: use --data-dir, not --url")
        }
        Command::Stats { json } => stats(&api, json).await,
    }
}

async fn list(api: &Api, wanted: Option<&str>) -> anyhow::Result<()> {
    let path = match wanted {
        Some(wanted) => format!("/workflows?status={}", seg(wanted)),
        None => "/workflows".to_owned(),
    };
    let listing = api.get(&path).await?;
    for row in listing["workflows"].as_array().into_iter().flatten() {
        let field = |name: &str| row[name].as_str().unwrap_or("-").to_owned();
        println!(
            "{:<32} {:<24} {}",
            field("workflow_id"),
            field("workflow"),
            status(row)
        );
    }
    Ok(())
}

/// A row's status, and for a stuck run its code and seq, as `waymark list` prints it for a
/// data dir too.
fn status(row: &serde_json::Value) -> String {
    let name = row["status"].as_str().unwrap_or("?");
    let stuck = &row["stuck"];
    match (stuck["code"].as_str(), stuck["seq"].as_u64()) {
        (Some(code), Some(seq)) => format!("{name} ({code} at seq {seq})"),
        (Some(code), None) => format!("{name} ({code})"),
        (None, _) => name.to_owned(),
    }
}

async fn show(api: &Api, id: &str) -> anyhow::Result<()> {
    let workflow = api.get(&format!("/workflows/{}", seg(id))).await?;
    println!(
        "{id}: {} ({})",
        status(&workflow),
        workflow["workflow"].as_str().unwrap_or("?")
    );
    if let Some(message) = workflow["stuck"]["message"].as_str() {
        println!("stuck: {message}");
    }
    for pending in workflow["pending_approvals"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!(
            "pending approval: {}",
            pending["artifact_hash"].as_str().unwrap_or("?")
        );
        print_scope(&pending["scope"]);
    }
    let path = format!("/workflows/{}/journal", seg(id));
    let journal = api
        .send(api.request(Method::GET, &path))
        .await?
        .text()
        .await?;
    print!("{journal}");
    Ok(())
}

/// What an approver decides, on which request.
struct Decision {
    reject: Option<String>,
    request: Option<u32>,
}

async fn approve(
    api: &Api,
    id: &str,
    hash: &str,
    approver: &str,
    decision: Decision,
) -> anyhow::Result<()> {
    let me = api.get("/whoami").await?;
    let name = me["name"].as_str().unwrap_or("");
    if name != approver {
        bail!("your token identifies you as `{name}`, not `{approver}`; nothing was decided");
    }
    let mut body = match decision.reject {
        Some(reason) => json!({"decision": "reject", "reason": reason}),
        None => json!({"decision": "approve"}),
    };
    if let Some(request) = decision.request {
        body["request"] = json!(request);
    }
    let answer = api
        .post(
            &format!("/workflows/{}/approvals/{}", seg(id), seg(hash)),
            body,
        )
        .await?;
    println!(
        "{id}: {} {hash} as {approver}",
        answer["decision"].as_str().unwrap_or("?")
    );
    Ok(())
}

async fn resolve(
    api: &Api,
    key: &str,
    committed: Option<String>,
    not_found: bool,
    failed: Option<String>,
    attempt: Option<u32>,
) -> anyhow::Result<()> {
    let body = match (committed, not_found, failed) {
        (Some(result), false, None) => {
            json!({"decision": "committed", "result": json_arg("--committed", &result)?})
        }
        (None, true, None) => json!({"decision": "not_found"}),
        (None, false, Some(reason)) => json!({"decision": "failed", "reason": reason}),
        _ => bail!("say one of --committed JSON, --not-found, --failed REASON"),
    };
    let mut body = body;
    body["attempt"] = json!(attempt);
    api.post(&format!("/operations/{}/resolve", seg(key)), body)
        .await?;
    println!("resolved {key}");
    Ok(())
}

async fn stats(api: &Api, as_json: bool) -> anyhow::Result<()> {
    let listing = api.get("/workflows").await?;
    let mut workflows = BTreeMap::<String, u64>::new();
    for row in listing["workflows"].as_array().into_iter().flatten() {
        let status = row["status"].as_str().unwrap_or("?").to_owned();
        *workflows.entry(status).or_default() += 1;
    }
    let metrics = api
        .send(api.request(Method::GET, "/metrics"))
        .await?
        .text()
        .await?;
    let stats = crate::stats::Stats {
        source: "worker",
        workflows,
        operations: None,
        journals: None,
        metrics: Some(waymark::telemetry::MetricSet::parse(&metrics)),
    };
    stats.print(as_json);
    Ok(())
}

/// What a pending approval's scope holds: the artifact shown, the evidence, each intent.
fn print_scope(scope: &Value) {
    if scope.is_null() {
        return;
    }
    println!("  shows {}", scope["artifact"].as_str().unwrap_or("?"));
    for evidence in scope["evidence"].as_array().into_iter().flatten() {
        println!("  rests on {}", evidence.as_str().unwrap_or("?"));
    }
    for intent in scope["intents"].as_array().into_iter().flatten() {
        let call = &intent["intent"];
        println!(
            "  authorises {} v{} {} key={} ({})",
            call["operation"].as_str().unwrap_or("?"),
            call["version"],
            call["arguments"],
            call["idempotency_key"].as_str().unwrap_or("?"),
            intent["digest"].as_str().unwrap_or("?")
        );
    }
}
