//! The commands against a running worker's HTTP API.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::{bail, Context as _};
use reqwest::{Client, Method, RequestBuilder};
use serde_json::{json, Value};

use crate::out::{pretty, printable, Out};
use crate::{json_arg, usage, ArtifactAction, Command, ListArgs};

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

pub(crate) async fn run(api: Api, command: Command, out: Out) -> anyhow::Result<i32> {
    match command {
        Command::Start {
            name,
            input,
            id,
            request_id,
        } => {
            let input = json_arg("--input", &input)?;
            let body = json!({"input": input, "workflow_id": id, "request_id": request_id});
            let answer = api
                .post(&format!("/workflows/{}", seg(&name)), body)
                .await?;
            out.value(&answer, |a| {
                let id = a["workflow_id"].as_str().unwrap_or("?");
                match a["existed"].as_bool() {
                    Some(true) => format!("{id} (started before, by the same request id)"),
                    _ => id.to_owned(),
                }
            });
        }
        Command::Result { id, no_wait } => return result(&api, &id, no_wait, out).await,
        Command::List(filter) => list(&api, &filter, out).await?,
        Command::Show { id } => show(&api, &id, out).await?,
        Command::Describe { id } => {
            let workflow = api.get(&format!("/workflows/{}", seg(&id))).await?;
            out.value(&workflow, |w| describe_text(&id, w));
        }
        Command::History { id, follow } => history(&api, &id, follow, out).await?,
        Command::Operations { id: Some(id), .. } => {
            let workflow = api.get(&format!("/workflows/{}", seg(&id))).await?;
            out.value(&workflow["operations"], operations_text);
        }
        Command::Operations { id: None, .. } => {
            let awaiting = awaiting_decision(&api).await?;
            out.value(&awaiting, awaiting_text);
        }
        Command::Approve {
            id,
            hash,
            approver,
            reject,
            request,
        } => {
            let decision = Decision { reject, request };
            approve(&api, &id, &hash, &approver, decision, out).await?
        }
        Command::Artifact {
            action: ArtifactAction::Show { hash },
        } => {
            let artifact = api.get(&format!("/artifacts/{}", seg(&hash))).await?;
            out.value(&artifact, pretty);
        }
        Command::Signal {
            id,
            name,
            signal_id,
            payload,
        } => {
            let body = json!({"signal_id": signal_id, "payload": json_arg("--payload", &payload)?});
            let path = format!("/workflows/{}/signals/{}", seg(&id), seg(&name));
            let answer = api.post(&path, body).await?;
            out.value(&answer, |a| {
                let outcome = a["outcome"].as_str().unwrap_or("?");
                format!("signal {name} to {id}: {outcome}")
            });
        }
        Command::Resolve {
            key,
            committed,
            not_found,
            failed,
            attempt,
            revision,
        } => {
            let mut body = decision_body(committed, not_found, failed)?;
            body["attempt"] = json!(attempt);
            // Only when given: a worker of an earlier build refuses a field it does not know.
            if let Some(revision) = revision {
                body["revision"] = json!(revision);
            }
            let path = format!("/operations/{}/resolve", seg(&key));
            let answer = api.post(&path, body).await?;
            out.value(&answer, |_| format!("resolved {key}"));
        }
        Command::Cancel { id, reason } => {
            let path = format!("/workflows/{}/cancel", seg(&id));
            let answer = api.post(&path, json!({"reason": reason})).await?;
            out.value(&answer, |a| {
                format!("{id}: {}", a["reason"].as_str().unwrap_or("cancelled"))
            });
        }
        Command::Fork {
            id,
            at,
            fork_id,
            input,
            models,
            refire,
        } => {
            let input = input.map(|i| json_arg("--input", &i)).transpose()?;
            let models: serde_json::Map<String, Value> = models
                .into_iter()
                .map(|(from, to)| (from, json!(to)))
                .collect();
            let body = json!({"at": at, "workflow_id": fork_id, "input": input, "models": models, "refire": refire});
            let answer = api
                .post(&format!("/workflows/{}/fork", seg(&id)), body)
                .await?;
            out.value(&answer, |a| {
                a["workflow_id"].as_str().unwrap_or("?").to_owned()
            });
        }
        Command::Reset { id, at } => {
            let path = format!("/workflows/{}/reset", seg(&id));
            let answer = api.post(&path, json!({"at": at})).await?;
            out.value(&answer, |a| {
                let kept = a["kept_run"].as_str().unwrap_or("?");
                format!("{id}: reset to entry {at}; the old run is kept as {kept}")
            });
        }
        Command::Delete { id } => {
            let answer = api.delete(&format!("/workflows/{}", seg(&id))).await?;
            out.value(&answer, |_| format!("{id}: deleted"));
        }
        Command::Export { id, plaintext } => {
            let path = format!(
                "/workflows/{}/journal?format=binary&plaintext={plaintext}",
                seg(&id)
            );
            let response = api.send(api.request(Method::GET, &path)).await?;
            std::io::stdout().write_all(&response.bytes().await?)?;
        }
        Command::Import { .. } => {
            return Err(usage(
                "import writes into a stopped worker's data dir: use --data-dir, not --url",
            ))
        }
        Command::Rekey => {
            return Err(usage(
                "rekey rewrites a stopped worker's data dir: use --data-dir, not --url",
            ))
        }
        Command::Stats => stats(&api, out).await?,
    }
    Ok(0)
}

impl ListArgs {
    fn query(&self) -> String {
        let limit = self.limit.map(|l| l.to_string());
        let pairs = [
            ("status", self.status.as_deref()),
            ("workflow", self.workflow.as_deref()),
            ("limit", limit.as_deref()),
            ("after", self.after.as_deref()),
        ];
        let given: Vec<String> = pairs
            .iter()
            .filter_map(|(name, value)| value.map(|v| format!("{name}={}", seg(v))))
            .collect();
        match given.is_empty() {
            true => String::new(),
            false => format!("?{}", given.join("&")),
        }
    }
}

async fn list(api: &Api, filter: &ListArgs, out: Out) -> anyhow::Result<()> {
    let listing = api.get(&format!("/workflows{}", filter.query())).await?;
    out.value(&listing, |listing| {
        let rows = listing["workflows"].as_array().into_iter().flatten();
        let mut lines: Vec<String> = rows.map(list_line).collect();
        if let Some(next) = listing["next"].as_str() {
            lines.push(format!("(more: --after {next})"));
        }
        lines.join("\n")
    });
    Ok(())
}

fn list_line(row: &Value) -> String {
    let field = |name: &str| row[name].as_str().unwrap_or("-").to_owned();
    let (id, name) = (field("workflow_id"), field("workflow"));
    format!("{id:<32} {name:<24} {}", status(row))
}

/// Polls the result until the workflow ends (unless `no_wait`); exit code 3 if it failed.
async fn result(api: &Api, id: &str, no_wait: bool, out: Out) -> anyhow::Result<i32> {
    let path = format!("/workflows/{}/result", seg(id));
    loop {
        let response = api.send(api.request(Method::GET, &path)).await?;
        let ongoing = response.status() == reqwest::StatusCode::ACCEPTED;
        let answer: Value = response.json().await?;
        // A stuck run waits for a deployment or an operator, not for time: said, not awaited.
        let stuck = answer["status"].as_str() == Some("stuck");
        if ongoing && !no_wait && !stuck {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            continue;
        }
        let failed = answer["status"].as_str() == Some("failed");
        out.value(&answer, |a| match a["status"].as_str() {
            Some("completed") => pretty(&a["output"]),
            Some("failed") => format!("failed: {}", a["error"]),
            Some("stuck") => format!("stuck: {}", a["stuck"]["message"].as_str().unwrap_or("?")),
            other => other.unwrap_or("?").to_owned(),
        });
        return Ok(match (failed, stuck) {
            (true, _) => 3,
            (_, true) => 1,
            _ => 0,
        });
    }
}

fn describe_text(id: &str, workflow: &Value) -> String {
    let mut lines = vec![format!(
        "{id}: {} ({})",
        status(workflow),
        workflow["workflow"].as_str().unwrap_or("?")
    )];
    if let Some(message) = workflow["stuck"]["message"].as_str() {
        lines.push(format!("stuck: {message}"));
    }
    for pending in workflow["pending_approvals"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let hash = pending["artifact_hash"].as_str().unwrap_or("?");
        lines.push(format!("pending approval: {hash}"));
        lines.extend(scope_lines(&pending["scope"]));
    }
    let operations = workflow["operations"].as_array().map_or(0, Vec::len);
    lines.push(format!("operations: {operations}"));
    let stream = &workflow["stream"];
    lines.push(format!("stream: last event {}", stream["last_event"]));
    lines.join("\n")
}

/// One line per operation awaiting a decision: its workflow, key, status, attempt and
/// revision.
pub(crate) fn awaiting_text(operations: &Value) -> String {
    let rows = operations.as_array().into_iter().flatten();
    let line = |op: &Value| {
        let workflow = op["workflow_id"].as_str().unwrap_or("?");
        let key = op["key"].as_str().unwrap_or("?");
        let status = op["status"].as_str().unwrap_or("?");
        format!(
            "{workflow:<24} {key:<60} {status:<20} attempt {} revision {}",
            op["attempt"], op["revision"]
        )
    };
    rows.map(line).collect::<Vec<_>>().join("\n")
}

fn operations_text(operations: &Value) -> String {
    let rows = operations.as_array().into_iter().flatten();
    let lines: Vec<String> = rows
        .map(|op| {
            let key = op["key"].as_str().or(op["idempotency_key"].as_str());
            let status = op["status"].as_str().unwrap_or("?");
            format!(
                "{:<60} {status:<20} attempt {} revision {}",
                key.unwrap_or("?"),
                op["attempt"],
                op["revision"]
            )
        })
        .collect();
    lines.join("\n")
}

/// The rendered journal, once or, with `follow`, as it grows until the workflow ends.
async fn history(api: &Api, id: &str, follow: bool, out: Out) -> anyhow::Result<()> {
    let path = format!("/workflows/{}/journal", seg(id));
    if !follow {
        let journal = api
            .send(api.request(Method::GET, &path))
            .await?
            .text()
            .await?;
        let all = json!({"workflow_id": id, "entries": journal.lines().collect::<Vec<_>>()});
        out.either(|| journal.trim_end().to_owned(), || all);
        return Ok(());
    }
    let mut printed = 0;
    loop {
        // The status first: an end read before the journal means the journal read after it
        // holds the last entry.
        let workflow = api.get(&format!("/workflows/{}", seg(id))).await?;
        let ended = matches!(workflow["status"].as_str(), Some("completed" | "failed"));
        // Only what was written since: one entry a line.
        let page = format!("{path}?from={printed}");
        let journal = api
            .send(api.request(Method::GET, &page))
            .await?
            .text()
            .await?;
        let new: Vec<&str> = journal.lines().collect();
        for line in &new {
            let entry = json!({"workflow_id": id, "entry": line});
            match out.json {
                true => println!("{entry}"),
                false => println!("{}", printable(line)),
            }
        }
        printed += new.len();
        if ended {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
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

async fn show(api: &Api, id: &str, out: Out) -> anyhow::Result<()> {
    let workflow = api.get(&format!("/workflows/{}", seg(id))).await?;
    let path = format!("/workflows/{}/journal", seg(id));
    let journal = api
        .send(api.request(Method::GET, &path))
        .await?
        .text()
        .await?;
    out.either(
        || format!("{}\n{}", describe_text(id, &workflow), journal.trim_end()),
        || json!({"workflow": workflow, "journal": journal.lines().collect::<Vec<_>>()}),
    );
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
    out: Out,
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
    out.value(&answer, |a| {
        let decision = a["decision"].as_str().unwrap_or("?");
        format!("{id}: {decision} {hash} as {approver}")
    });
    Ok(())
}

/// The body of a resolution: the one decision its flags say.
fn decision_body(
    committed: Option<String>,
    not_found: bool,
    failed: Option<String>,
) -> anyhow::Result<Value> {
    Ok(match (committed, not_found, failed) {
        (Some(result), false, None) => {
            json!({"decision": "committed", "result": json_arg("--committed", &result)?})
        }
        (None, true, None) => json!({"decision": "not_found"}),
        (None, false, Some(reason)) => json!({"decision": "failed", "reason": reason}),
        _ => {
            return Err(usage(
                "say one of --committed JSON, --not-found, --failed REASON",
            ))
        }
    })
}

/// Every row of `field` in the pages of `path` (a listing that pages by `limit`, `after` and
/// `next`), page after page.
async fn every_row(api: &Api, path: &str, field: &str) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page_path = match &after {
            Some(after) => format!("{path}?limit=1000&after={}", seg(after)),
            None => format!("{path}?limit=1000"),
        };
        let mut page = api.get(&page_path).await?;
        if let Value::Array(page_rows) = page[field].take() {
            rows.extend(page_rows);
        }
        let next = page["next"].as_str().map(str::to_owned);
        // Ids only grow from page to page: a `next` that does not would page forever.
        if next.is_some() && next <= after {
            anyhow::bail!("the worker's pages do not advance (`next` {next:?} after {after:?})");
        }
        match next {
            Some(next) => after = Some(next),
            None => return Ok(rows),
        }
    }
}

/// Every operation awaiting a decision in the namespace.
async fn awaiting_decision(api: &Api) -> anyhow::Result<Value> {
    let rows = every_row(api, "/operations/awaiting-decision", "operations").await?;
    Ok(Value::Array(rows))
}

async fn stats(api: &Api, out: Out) -> anyhow::Result<()> {
    let mut workflows = BTreeMap::<String, u64>::new();
    // Every page: the figures count every workflow.
    for row in every_row(api, "/workflows", "workflows").await? {
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
    stats.print(out.json);
    Ok(())
}

/// What a pending approval's scope holds: the artifact shown, the evidence, each intent.
fn scope_lines(scope: &Value) -> Vec<String> {
    if scope.is_null() {
        return Vec::new();
    }
    let mut lines = vec![format!(
        "  shows {}",
        scope["artifact"].as_str().unwrap_or("?")
    )];
    for evidence in scope["evidence"].as_array().into_iter().flatten() {
        lines.push(format!("  rests on {}", evidence.as_str().unwrap_or("?")));
    }
    for intent in scope["intents"].as_array().into_iter().flatten() {
        let call = &intent["intent"];
        lines.push(format!(
            "  authorises {} v{} {} key={} ({})",
            call["operation"].as_str().unwrap_or("?"),
            call["version"],
            call["arguments"],
            call["idempotency_key"].as_str().unwrap_or("?"),
            intent["digest"].as_str().unwrap_or("?")
        ));
    }
    lines
}
