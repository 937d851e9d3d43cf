//! The JSON endpoints. Each one authenticates, checks the role, parses strictly, and maps every
//! domain error to a status: the caller's mistakes are 4xx and change nothing.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use waymark_runtime::artifacts::ApprovalVerdict;
use waymark_runtime::error::RunError;
use waymark_runtime::inbox::SignalOutcome;
use waymark_runtime::journal::{write_framed, write_framed_sealed, Payload};
use waymark_runtime::namespace;
use waymark_runtime::operations::{OperatorDecision, Settlement};
use waymark_runtime::render::{render_journal, render_journal_from};
use waymark_runtime::store::{WorkflowRecord, WorkflowStatus};
use waymark_runtime::worker::StartOptions;

use super::auth::{Caller, Role};
use super::error::ApiError;
use super::Api;
use crate::llm::HumanReview;

type ApiState = State<std::sync::Arc<Api>>;

/// The request body, within the size limit, as bytes.
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
            _ => "bad_request",
        };
        ApiError::new(status, code, rejection.body_text())
    })
}

/// A path segment, percent-decoded.
pub(crate) fn path<T>(path: Result<Path<T>, PathRejection>) -> Result<T, ApiError> {
    path.map(|Path(value)| value)
        .map_err(|rejection| ApiError::bad_request(rejection.body_text()))
}

/// A JSON body; an empty body is the type's default.
fn json_body<T: DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
}

/// The stored form of `id` (a workflow id, or an idempotency key, which starts with one) in the
/// namespace the request acts in: another namespace's workflows are never found through it.
pub(crate) fn stored_id(
    caller: &Caller,
    headers: &HeaderMap,
    what: &'static str,
    id: &str,
) -> Result<String, ApiError> {
    let namespace = caller.namespace(headers)?;
    namespace::qualify(&namespace, what, id).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A stored id as the caller named it: without its namespace.
fn bare(stored: &str) -> &str {
    namespace::split(stored).1
}

fn to_payload(value: &Value) -> Result<Payload, ApiError> {
    Payload::encode(value).map_err(|e| ApiError::bad_request(e.to_string()))
}

fn to_json(payload: &Payload) -> Value {
    payload.decode().unwrap_or(Value::Null)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct StartRequest {
    #[serde(default)]
    input: Value,
    request_id: Option<String>,
    workflow_id: Option<String>,
}

/// `POST /workflows/{name}`: 201 for a new workflow, 200 for the one the request id started.
pub(crate) async fn start(
    State(api): ApiState,
    headers: HeaderMap,
    name: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = api.caller(&headers)?;
    let started_by = caller.require(Role::Write)?.name.clone();
    let namespace = caller.namespace(&headers)?;
    let (name, raw) = (path(name)?, body(raw)?);
    let request: StartRequest = json_body(&raw)?;
    let header_id = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let options = StartOptions {
        workflow_id: request.workflow_id,
        request_id: request.request_id.or(header_id.map(str::to_owned)),
        started_by: Some(started_by),
        namespace: Some(namespace),
    };
    let input = to_payload(&request.input)?;
    let started = api.worker.runtime().start_workflow(&name, input, options);
    let started = started.await?;
    let status = match started.existed {
        true => StatusCode::OK,
        false => StatusCode::CREATED,
    };
    let id = bare(&started.workflow_id);
    let body = json!({"workflow_id": id, "existed": started.existed});
    Ok((status, Json(body)).into_response())
}

/// `GET /whoami`: the identity and roles the token stands for.
pub(crate) async fn whoami(
    State(api): ApiState,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    Ok(Json(
        json!({"name": caller.name, "roles": caller.role_names(), "namespaces": caller.namespace_names()}),
    ))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only workflows in this status.
    status: Option<String>,
    /// Only workflows of this registered name.
    workflow: Option<String>,
    /// At most this many (default [`LIST_PAGE`], at most [`LIST_PAGE_MAX`]).
    limit: Option<usize>,
    /// Only workflows after this id, in the listing's order: the `next` of the page before.
    after: Option<String>,
}

/// Workflows on one page of `GET /workflows`, unless the query says fewer.
const LIST_PAGE: usize = 100;
/// The most workflows one page may hold.
const LIST_PAGE_MAX: usize = 1_000;

/// The statuses a list may be filtered by.
const STATUSES: [WorkflowStatus; 7] = [
    WorkflowStatus::Running,
    WorkflowStatus::AwaitingApproval,
    WorkflowStatus::AwaitingSignal,
    WorkflowStatus::AwaitingOperator,
    WorkflowStatus::Stuck,
    WorkflowStatus::Completed,
    WorkflowStatus::Failed,
];

/// `GET /workflows`: a page of the caller's namespace's workflows, in id order (shorter ids
/// first), filtered by status and name; `next` is the `after` of the next page, `null` on the
/// last.
pub(crate) async fn list(
    State(api): ApiState,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    let namespace = caller.require(Role::Read)?.namespace(&headers)?;
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let wanted = query.status.as_deref().map(status_named).transpose()?;
    let limit = query.limit.unwrap_or(LIST_PAGE);
    if !(1..=LIST_PAGE_MAX).contains(&limit) {
        let message = format!("`limit` must be 1..={LIST_PAGE_MAX}, got {limit}");
        return Err(ApiError::bad_request(message));
    }
    let after = match &query.after {
        Some(after) => Some(stored_id(&caller, &headers, "`after`", after)?),
        None => None,
    };
    let listing = api.read(|worker| worker.runtime().workflows()).await??;
    let kept = |record: &Result<WorkflowRecord, _>| match record {
        Ok(record) => {
            wanted.is_none_or(|wanted| record.status == wanted)
                && (query.workflow.as_ref()).is_none_or(|name| &record.workflow_name == name)
        }
        // An unreadable record is listed unless a filter needs what it would say.
        Err(_) => wanted.is_none() && query.workflow.is_none(),
    };
    // The store lists by key: an id length-prefixed, so `after` compares the same way.
    let after_key = after.as_deref().map(waymark_runtime::keys::id_key);
    let mut rows = listing.into_iter().filter(|(id, record)| {
        namespace::split(id).0 == namespace
            && after_key
                .as_ref()
                .is_none_or(|a| waymark_runtime::keys::id_key(id) > *a)
            && kept(record)
    });
    let page: Vec<_> = rows.by_ref().take(limit).collect();
    let next = match rows.next() {
        Some(_) => page.last().map(|(id, _)| bare(id).to_owned()),
        None => None,
    };
    let rows = page
        .into_iter()
        .map(|(id, record)| list_row(bare(&id), record));
    Ok(Json(
        json!({"workflows": rows.collect::<Vec<_>>(), "next": next}),
    ))
}

fn status_named(name: &str) -> Result<WorkflowStatus, ApiError> {
    let found = STATUSES.into_iter().find(|s| s.name() == name);
    found.ok_or_else(|| {
        let names: Vec<&str> = STATUSES.iter().map(|s| s.name()).collect();
        ApiError::bad_request(format!("no status `{name}`; one of: {}", names.join(", ")))
    })
}

fn list_row(id: &str, record: Result<WorkflowRecord, waymark_runtime::store::StoreError>) -> Value {
    match record {
        Ok(record) => json!({
            "workflow_id": id,
            "workflow": record.workflow_name,
            "status": status_name(record.status),
            "journal_len": record.journal_len,
            "stuck": stop_json(&record),
        }),
        Err(error) => {
            json!({"workflow_id": id, "status": "unreadable", "error": error.to_string()})
        }
    }
}

pub(crate) fn status_name(status: WorkflowStatus) -> &'static str {
    status.name()
}

/// Why a stuck run is stuck, for the API: `null` for any other run.
fn stop_json(record: &WorkflowRecord) -> Value {
    match &record.stop {
        Some(stop) => json!({
            "code": stop.code.name(),
            "seq": stop.seq,
            "message": stop.message,
            "at_ms": stop.at_ms,
        }),
        None => Value::Null,
    }
}

/// `GET /workflows/{id}`: status, the last step, pending approvals, operations, stream state.
pub(crate) async fn show(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let id = path(id)?;
    let workflow = stored_id(&caller, &headers, "workflow id", &id)?;
    let read = api
        .read(move |worker| show_parts(worker, &workflow))
        .await?;
    let Some((record, current_step, pending, operations, stream)) = read? else {
        return Err(ApiError::not_found(format!("no workflow `{id}`")));
    };
    Ok(Json(json!({
        "workflow_id": id,
        "workflow": record.workflow_name,
        "status": status_name(record.status),
        "stuck": stop_json(&record),
        "journal_len": record.journal_len,
        "current_step": current_step,
        "pending_approvals": pending,
        "operations": operations,
        "stream": stream,
    })))
}

/// What `GET /workflows/{id}` shows, read in one go: `None` for an unknown workflow.
type ShowParts = (
    WorkflowRecord,
    Option<String>,
    Vec<Value>,
    Vec<Value>,
    Value,
);

fn show_parts(worker: &crate::Worker, id: &str) -> Result<Option<ShowParts>, ApiError> {
    let Some(record) = worker.runtime().workflow(id)? else {
        return Ok(None);
    };
    let journal = worker.journal(id)?;
    let current_step = render_journal(&journal)
        .lines()
        .last()
        .map(str::trim)
        .map(str::to_owned);
    let pending: Vec<Value> = worker
        .pending_approvals(id)?
        .into_iter()
        .map(|p| json!({"request": p.request, "artifact_hash": p.artifact_hash, "scope": p.scope, "risk": p.risk, "expires_at_ms": p.expires_at_ms}))
        .collect();
    let operations: Vec<Value> = worker
        .operations(id)?
        .into_iter()
        .map(|(key, op)| json!({"key": bare(&key), "operation": op.operation, "attempt": op.attempt, "status": op.status.name()}))
        .collect();
    let last_event = worker.stream(id, 0)?.last().map_or(0, |e| e.seq);
    let delivered: serde_json::Map<String, Value> = worker
        .runtime()
        .stream_acks(id)?
        .into_iter()
        .map(|(channel, event)| (channel, json!(event)))
        .collect();
    let stream = json!({"last_event": last_event, "delivered": delivered});
    Ok(Some((record, current_step, pending, operations, stream)))
}

/// `GET /workflows/{id}/result`: 200 with the output or the failure once it ended, 202 before.
pub(crate) async fn result(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let id = path(id)?;
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    let workflow = stored.clone();
    let record = api
        .read(move |worker| worker.runtime().workflow(&workflow))
        .await??;
    let record = record.ok_or_else(|| ApiError::not_found(format!("no workflow `{id}`")))?;
    if !record.status.is_terminal() {
        let body = json!({"workflow_id": id, "status": status_name(record.status), "stuck": stop_json(&record)});
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    // Through the worker rather than the journal: an end still being counted is answered once
    // its telemetry is in, so a client that saw the result sees it on `/metrics` too.
    let body = match api.worker.runtime().result(&stored).await {
        Ok(output) => {
            json!({"workflow_id": id, "status": "completed", "output": to_json(&output)})
        }
        Err(RunError::Failed(failure)) => json!({
            "workflow_id": id,
            "status": "failed",
            "error": {"kind": format!("{:?}", failure.kind), "message": failure.message},
        }),
        Err(error) => return Err(ApiError::internal(error.to_string())),
    };
    Ok(Json(body).into_response())
}

#[derive(Deserialize, Default)]
pub(crate) struct JournalQuery {
    format: Option<String>,
    /// Text only: the first entry's index (default 0).
    from: Option<u64>,
    /// Text only: at most this many entries (default: all from `from` on).
    limit: Option<usize>,
    /// With `format=binary` from a worker that encrypts at rest: records in clear.
    #[serde(default)]
    plaintext: bool,
}

/// `GET /workflows/{id}/journal`: the rendered journal; `?format=binary` exports the framed
/// records (`waymark export`).
pub(crate) async fn journal(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<JournalQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let id = path(id)?;
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let workflow = stored_id(&caller, &headers, "workflow id", &id)?;
    let text = matches!(query.format.as_deref(), None | Some("text"));
    let paged = query.from.is_some() || query.limit.is_some();
    if paged && !text {
        return Err(ApiError::bad_request(
            "`from` and `limit` page the text form only",
        ));
    }
    let (from, limit) = (query.from.unwrap_or(0), query.limit.unwrap_or(usize::MAX));
    let journal = api
        .read(move |worker| match worker.runtime().workflow(&workflow)? {
            Some(_) => worker
                .runtime()
                .journal_page(&workflow, from, limit)
                .map(Some),
            None => Ok(None),
        })
        .await??;
    let Some(journal) = journal else {
        return Err(ApiError::not_found(format!("no workflow `{id}`")));
    };
    let response = match query.format.as_deref() {
        None | Some("text") => {
            let text = render_journal_from(&journal, from);
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
        }
        Some("binary") => {
            let bytes = match api.worker.codec() {
                Some(codec) if !query.plaintext => write_framed_sealed(&journal, codec.as_ref())
                    .map_err(|e| ApiError::internal(format!("sealing the export: {e}")))?,
                _ => write_framed(&journal),
            };
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        Some(other) => return Err(ApiError::bad_request(format!("unknown format `{other}`"))),
    };
    Ok(response)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SignalRequest {
    signal_id: Option<String>,
    #[serde(default)]
    payload: Value,
}

/// `POST /workflows/{id}/signals/{name}`: 202, with `accepted` or `duplicate`.
pub(crate) async fn signal(
    State(api): ApiState,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let caller = api.caller(&headers)?;
    let ((id, name), raw) = (path(params)?, body(raw)?);
    let request: SignalRequest = json_body(&raw)?;
    // A payload a repair ladder would take as a person's review (accept or replace a model's
    // answer) is a decision, like an approval: it needs the approve role, not write.
    let review = HumanReview::deserialize(&request.payload).is_ok();
    let role = if review { Role::Approve } else { Role::Write };
    let sender = caller.require(role)?.name.clone();
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    let header_id = headers.get("idempotency-key").and_then(|v| v.to_str().ok());
    let signal_id = request.signal_id.or(header_id.map(str::to_owned));
    let signal_id = signal_id.ok_or_else(|| {
        ApiError::bad_request("a signal needs `signal_id` (or an Idempotency-Key header)")
    })?;
    let payload = to_payload(&request.payload)?;
    api.signals.take(&stored, "signals to this workflow")?;
    let sent = api
        .worker
        .runtime()
        .signal_from(&stored, &name, &signal_id, payload, &sender)
        .await;
    let outcome = sent?;
    let outcome = match outcome {
        SignalOutcome::Accepted => "accepted",
        SignalOutcome::Duplicate => "duplicate",
    };
    let body = json!({"workflow_id": id, "signal": name, "outcome": outcome});
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DecisionRequest {
    decision: String,
    reason: Option<String>,
    request: Option<u32>,
}

/// `POST /workflows/{id}/approvals/{hash}`: the approver is the token's identity.
pub(crate) async fn approve(
    State(api): ApiState,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    let approver = caller.require(Role::Approve)?.name.clone();
    let ((id, hash), raw) = (path(params)?, body(raw)?);
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    let request: DecisionRequest = json_body(&raw)?;
    let verdict = match (request.decision.as_str(), request.reason.clone()) {
        ("approve", _) => ApprovalVerdict::Approve,
        ("reject", Some(reason)) => ApprovalVerdict::Reject(reason),
        ("reject", None) => return Err(ApiError::bad_request("a rejection needs a `reason`")),
        (other, _) => {
            let message = format!("`decision` must be `approve` or `reject`, not `{other}`");
            return Err(ApiError::bad_request(message));
        }
    };
    let runtime = api.worker.runtime();
    let decided = runtime.decide_approval(&stored, request.request, &hash, &approver, verdict);
    let decided = decided.await;
    decided?;
    let decision = request.decision;
    Ok(Json(
        json!({"workflow_id": id, "artifact_hash": hash, "decision": decision, "approver": approver}),
    ))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResolveRequest {
    decision: String,
    result: Option<Value>,
    reason: Option<String>,
    attempt: Option<u32>,
}

/// `POST /operations/{key}/resolve`: the operator is the token's identity.
pub(crate) async fn resolve(
    State(api): ApiState,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    let operator = caller.require(Role::Operate)?.name.clone();
    let (key, raw) = (path(key)?, body(raw)?);
    let stored = stored_id(&caller, &headers, "idempotency key", &key)?;
    let request: ResolveRequest = json_body(&raw)?;
    let decision = decision(
        &request.decision,
        request.result,
        request.reason,
        "decision",
    )?;
    let runtime = api.worker.runtime();
    let resolved = runtime.resolve_operation(&stored, request.attempt, decision, &operator);
    resolved.await?;
    Ok(Json(
        json!({"key": key, "decision": request.decision, "operator": operator}),
    ))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    outcome: String,
    result: Option<Value>,
    reason: Option<String>,
    attempt: Option<u32>,
}

/// `GET /artifacts/{hash}`: what an artifact holds, so an approver sees exactly what a scope
/// names (its shown artifact, its evidence) before deciding. Role read or approve.
pub(crate) async fn artifact(
    State(api): ApiState,
    headers: HeaderMap,
    hash: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    let namespace = caller
        .require_any(&[Role::Read, Role::Approve])?
        .namespace(&headers)?;
    let hash = path(hash)?;
    if waymark_runtime::journal::Digest::parse_hex(&hash).is_none() {
        let message = format!("`{hash}` is not an artifact hash (`sha256:` and 64 hex digits)");
        return Err(ApiError::bad_request(message));
    }
    let wanted = hash.clone();
    let record = api
        .read(move |worker| worker.artifact_in(&namespace, &wanted))
        .await??;
    let record = record.ok_or_else(|| ApiError::not_found(format!("no artifact `{hash}`")))?;
    let metadata: serde_json::Map<String, Value> = record
        .metadata
        .iter()
        .map(|(key, value)| (key.clone(), json!(value)))
        .collect();
    Ok(Json(json!({
        "hash": hash,
        "kind": record.kind,
        "version": record.version,
        "content": to_json(&record.content),
        "metadata": metadata,
        "workflow_id": bare(&record.workflow_id),
        "created_at_ms": record.created_at_ms,
    })))
}

/// `POST /operations/{key}/settle`: the downstream reports what it did with `key` (a webhook),
/// as the token's identity. A repeated delivery of the same committed result answers 200 with
/// `"duplicate": true` and changes nothing.
pub(crate) async fn settle(
    State(api): ApiState,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    let source = caller.require(Role::Settle)?.name.clone();
    let (key, raw) = (path(key)?, body(raw)?);
    let stored = stored_id(&caller, &headers, "idempotency key", &key)?;
    let request: SettleRequest = json_body(&raw)?;
    let decision = decision(&request.outcome, request.result, request.reason, "outcome")?;
    let runtime = api.worker.runtime();
    let settled = runtime.settle_operation(&stored, request.attempt, decision, &source);
    let settled = settled.await?;
    let duplicate = settled == Settlement::Duplicate;
    Ok(Json(
        json!({"key": key, "outcome": request.outcome, "settled_by": source, "duplicate": duplicate}),
    ))
}

/// An operator's or a downstream's decision, from the request's `field` (`committed` with a
/// `result`, `not_found`, `failed` with a `reason`).
fn decision(
    given: &str,
    result: Option<Value>,
    reason: Option<String>,
    field: &str,
) -> Result<OperatorDecision, ApiError> {
    Ok(match (given, result, reason) {
        ("committed", Some(result), _) => OperatorDecision::Committed(to_payload(&result)?),
        ("committed", None, _) => {
            return Err(ApiError::bad_request("`committed` needs a `result`"))
        }
        ("not_found", _, _) => OperatorDecision::NotFound,
        ("failed", _, Some(reason)) => OperatorDecision::Failed(reason),
        ("failed", _, None) => return Err(ApiError::bad_request("`failed` needs a `reason`")),
        (other, _, _) => {
            let message =
                format!("`{field}` must be `committed`, `not_found` or `failed`, not `{other}`");
            return Err(ApiError::bad_request(message));
        }
    })
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CancelRequest {
    reason: Option<String>,
}

/// `DELETE /workflows/{id}`: an ended workflow, with every row of its own.
pub(crate) async fn delete(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Operate)?;
    let id = path(id)?;
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    api.worker.delete(&stored).await?;
    Ok(Json(json!({"workflow_id": id, "deleted": true})))
}

/// A command on one workflow, as a handler starts from it: who sends it (holding the role
/// asked), the workflow's id as given and as stored, and the JSON body.
struct WorkflowCommand<T> {
    sender: String,
    id: String,
    stored: String,
    request: T,
}

impl<T: DeserializeOwned + Default> WorkflowCommand<T> {
    fn read(
        api: &Api,
        headers: &HeaderMap,
        role: Role,
        id: Result<Path<String>, PathRejection>,
        raw: Result<Bytes, BytesRejection>,
    ) -> Result<Self, ApiError> {
        let caller = api.caller(headers)?;
        let sender = caller.require(role)?.name.clone();
        let (id, raw) = (path(id)?, body(raw)?);
        let stored = stored_id(&caller, headers, "workflow id", &id)?;
        let request = json_body(&raw)?;
        Ok(Self {
            sender,
            id,
            stored,
            request,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForkRequest {
    /// How many of the source's entries the fork keeps.
    at: u64,
    workflow_id: Option<String>,
    input: Option<Value>,
    /// Model as the code names it → model to run.
    #[serde(default)]
    models: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    refire: Vec<String>,
}

/// `POST /workflows/{id}/fork`: a new workflow from the first `at` entries of this one's
/// journal, as the token's identity (role operate).
pub(crate) async fn fork(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let command = WorkflowCommand::<ForkRequest>::read(&api, &headers, Role::Operate, id, raw)?;
    let (request, stored) = (command.request, command.stored);
    let input = request.input.as_ref().map(to_payload).transpose()?;
    let at = request.at;
    let options = crate::ForkOptions {
        at,
        workflow_id: request.workflow_id,
        input,
        models: request.models.into_iter().collect(),
        refire: request.refire,
        forked_by: Some(command.sender),
    };
    let fork = api.worker.fork(&stored, options).await?;
    Ok(Json(
        json!({"workflow_id": bare(&fork), "forked_from": command.id, "at": at}),
    ))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    /// How many of the run's entries the new run keeps.
    at: u64,
}

/// `POST /workflows/{id}/reset`: a stuck run goes on as a new run from its first `at`
/// entries; the old run is kept as `ID#run-N` (role operate).
pub(crate) async fn reset(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let command = WorkflowCommand::<ResetRequest>::read(&api, &headers, Role::Operate, id, raw)?;
    let (at, sender) = (command.request.at, Some(command.sender));
    let kept = api.worker.reset(&command.stored, at, sender).await?;
    Ok(Json(
        json!({"workflow_id": command.id, "at": at, "kept_run": bare(&kept)}),
    ))
}

/// `POST /workflows/{id}/cancel`.
pub(crate) async fn cancel(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let command = WorkflowCommand::<CancelRequest>::read(&api, &headers, Role::Write, id, raw)?;
    let reason = command.request.reason;
    let reason = reason.unwrap_or_else(|| "no reason given".to_owned());
    let reason = format!("cancelled by {}: {reason}", command.sender);
    api.worker.cancel(&command.stored, &reason).await?;
    Ok(Json(
        json!({"workflow_id": command.id, "status": "failed", "reason": reason}),
    ))
}
