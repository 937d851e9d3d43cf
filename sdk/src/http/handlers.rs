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
use waymark_runtime::journal::Payload;
use waymark_runtime::namespace;
use waymark_runtime::operations::{DecidedOn, OperatorDecision, Settlement};
use waymark_runtime::render::render_journal_from;
use waymark_runtime::store::{WorkflowRecord, WorkflowStatus};
use waymark_runtime::worker::StartOptions;

use super::auth::{Caller, Role};
use super::bodies::*;
use super::error::ApiError;
use super::paging::{keyed_after, take_page};
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

/// Start a workflow.
///
/// `{id}` names the registered workflow to start (the new workflow's own id is `workflow_id`,
/// or a fresh one). Role write. A `request_id` (or the `Idempotency-Key` header) deduplicates
/// starts: a repeated one answers 200 with the workflow the first start made.
#[utoipa::path(post, path = "/workflows/{id}", operation_id = "start_workflow",
    params(("id" = String, Path, description = "The registered workflow name."),
        ("Idempotency-Key" = Option<String>, Header, description = "The request id, when the body gives none.")),
    request_body(content = StartRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Started.", body = Started),
        (status = 200, description = "The workflow this request id already started.", body = Started),
        (status = 400, description = "Malformed, a bad or reserved id, or input over the size limit.", body = ErrorBody),
        (status = 404, description = "No workflow of that name is registered.", body = ErrorBody),
        (status = 409, description = "The workflow id or request id is taken by another start.", body = ErrorBody),
    ))]
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
    let body = Started {
        workflow_id: bare(&started.workflow_id).to_owned(),
        existed: started.existed,
    };
    Ok((status, Json(body)).into_response())
}

/// The identity, roles and namespaces the bearer token stands for.
#[utoipa::path(get, path = "/whoami", responses((status = 200, description = "Who the token is.", body = Whoami)))]
pub(crate) async fn whoami(
    State(api): ApiState,
    headers: HeaderMap,
) -> Result<Json<Whoami>, ApiError> {
    let caller = api.caller(&headers)?;
    let roles = caller.role_names().into_iter().map(str::to_owned).collect();
    Ok(Json(Whoami {
        name: caller.name.clone(),
        roles,
        namespaces: caller.namespace_names(),
    }))
}

/// Workflows on one page of `GET /workflows`, unless the query says fewer.
const LIST_PAGE: usize = 100;
/// The most workflows one page may hold.
const LIST_PAGE_MAX: usize = 1_000;

/// A page of workflows.
///
/// The caller's namespace's workflows in id order (shorter ids first), filtered by status and
/// name; `next` is the `after` of the next page, `null` on the last. Role read.
#[utoipa::path(get, path = "/workflows", operation_id = "list_workflows", params(ListQuery),
    responses(
        (status = 200, description = "A page.", body = WorkflowPage),
        (status = 400, description = "An unknown status or a limit out of range.", body = ErrorBody),
    ))]
pub(crate) async fn list(
    State(api): ApiState,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<WorkflowPage>, ApiError> {
    let caller = api.caller(&headers)?;
    let namespace = caller.require(Role::Read)?.namespace(&headers)?;
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let wanted = query.status.as_deref().map(status_named).transpose()?;
    let limit = page_limit(query.limit)?;
    let after = match &query.after {
        Some(after) => Some(stored_id(&caller, &headers, "`after`", after)?),
        None => None,
    };
    // Filtered and paged on summaries, which read no journal; only the page's records are read
    // whole, with their journal lengths.
    let listing = api
        .read(|worker| worker.runtime().workflow_summaries())
        .await??;
    let kept = |summary: &Result<waymark_runtime::store::WorkflowSummary, _>| match summary {
        Ok(summary) => {
            wanted.is_none_or(|wanted| summary.status == wanted)
                && (query.workflow.as_ref()).is_none_or(|name| &summary.workflow_name == name)
        }
        // An unreadable record is listed unless a filter needs what it would say.
        Err(_) => wanted.is_none() && query.workflow.is_none(),
    };
    // The store lists by key: an id length-prefixed, so `after` compares the same way.
    let after_key = after.as_deref().map(waymark_runtime::keys::id_key);
    let rows = listing.into_iter().filter(|(id, record)| {
        namespace::split(id).0 == namespace
            && after_key
                .as_ref()
                .is_none_or(|a| waymark_runtime::keys::id_key(id) > *a)
            && kept(record)
    });
    let (page, next) = take_page(rows, limit);
    let page = api
        .read(move |worker| worker.runtime().records_of(page))
        .await?;
    let rows = page
        .into_iter()
        .map(|(id, record)| list_row(bare(&id), record));
    Ok(Json(WorkflowPage {
        workflows: rows.collect(),
        next,
    }))
}

/// A page's `limit`, [`LIST_PAGE`] if not given.
fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(LIST_PAGE);
    if !(1..=LIST_PAGE_MAX).contains(&limit) {
        let message = format!("`limit` must be 1..={LIST_PAGE_MAX}, got {limit}");
        return Err(ApiError::bad_request(message));
    }
    Ok(limit)
}

fn status_named(name: &str) -> Result<WorkflowStatus, ApiError> {
    let found = WorkflowStatus::ALL.into_iter().find(|s| s.name() == name);
    found.ok_or_else(|| {
        let names: Vec<&str> = WorkflowStatus::ALL.iter().map(|s| s.name()).collect();
        ApiError::bad_request(format!("no status `{name}`; one of: {}", names.join(", ")))
    })
}

fn list_row(
    id: &str,
    record: Result<WorkflowRecord, waymark_runtime::store::StoreError>,
) -> WorkflowRow {
    match record {
        Ok(record) => WorkflowRow::Readable(WorkflowSummary {
            workflow_id: id.to_owned(),
            status: status_name(record.status).to_owned(),
            journal_len: record.journal_len,
            stuck: stop_body(&record),
            workflow: record.workflow_name.to_string(),
        }),
        Err(error) => WorkflowRow::Unreadable(UnreadableWorkflow {
            workflow_id: id.to_owned(),
            status: "unreadable".to_owned(),
            error: error.to_string(),
        }),
    }
}

pub(crate) fn status_name(status: WorkflowStatus) -> &'static str {
    status.name()
}

/// Why a stuck run is stuck, for the API: `None` for any other run.
pub(crate) fn stop_body(record: &WorkflowRecord) -> Option<StopBody> {
    let stop = record.stop.as_ref()?;
    Some(StopBody {
        code: stop.code.name().to_owned(),
        seq: stop.seq,
        message: stop.message.clone(),
        at_ms: stop.at_ms,
    })
}

/// A workflow: status, current step, pending approvals, operations, stream state.
///
/// `stream.delivered` maps each reader channel to the last event it acknowledged. Role read.
#[utoipa::path(get, path = "/workflows/{id}", operation_id = "describe_workflow", params(WorkflowPath),
    responses(
        (status = 200, description = "The workflow.", body = WorkflowView),
        (status = 404, description = "No such workflow.", body = ErrorBody),
    ))]
pub(crate) async fn show(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<WorkflowView>, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Read)?;
    let id = path(id)?;
    let workflow = stored_id(&caller, &headers, "workflow id", &id)?;
    let read = api
        .read(move |worker| show_parts(worker, &workflow))
        .await?;
    let view = read?.ok_or_else(|| ApiError::not_found(format!("no workflow `{id}`")))?;
    Ok(Json(view))
}

/// What `GET /workflows/{id}` shows, read in one go: `None` for an unknown workflow.
fn show_parts(worker: &crate::Worker, id: &str) -> Result<Option<WorkflowView>, ApiError> {
    let Some(record) = worker.runtime().workflow(id)? else {
        return Ok(None);
    };
    let last_entry = record.journal_len.saturating_sub(1);
    let tail = worker.runtime().journal_page(id, last_entry, 1)?;
    let current_step = render_journal_from(&tail, last_entry)
        .lines()
        .last()
        .map(str::trim)
        .map(str::to_owned);
    let pending_approvals = worker
        .pending_approvals(id)?
        .into_iter()
        .map(|p| PendingApproval {
            request: p.request,
            artifact_hash: p.artifact_hash,
            scope: json!(p.scope),
            risk: p.risk,
            expires_at_ms: p.expires_at_ms,
        })
        .collect();
    let operations = worker
        .operations(id)?
        .into_iter()
        .map(|(key, op)| OperationRow {
            key: bare(&key).to_owned(),
            status: op.status.name().to_owned(),
            revision: op.revision(),
            operation: op.operation,
            attempt: op.attempt,
        })
        .collect();
    let last_event = worker.runtime().stream_last(id)?;
    let delivered = worker.runtime().stream_acks(id)?.into_iter().collect();
    Ok(Some(WorkflowView {
        workflow_id: bare(id).to_owned(),
        status: status_name(record.status).to_owned(),
        stuck: stop_body(&record),
        journal_len: record.journal_len,
        workflow: record.workflow_name.to_string(),
        current_step,
        pending_approvals,
        operations,
        stream: StreamState {
            last_event,
            delivered,
        },
    }))
}

/// A workflow's output or failure.
///
/// 200 once it ended, 202 with its status before. Role read.
#[utoipa::path(get, path = "/workflows/{id}/result", operation_id = "workflow_result", params(WorkflowPath),
    responses(
        (status = 200, description = "It ended: the output, or the failure.", body = Ended),
        (status = 202, description = "Not ended yet.", body = NotEnded),
        (status = 404, description = "No such workflow.", body = ErrorBody),
    ))]
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
        let body = NotEnded {
            workflow_id: id,
            status: status_name(record.status).to_owned(),
            stuck: stop_body(&record),
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    // Through the worker rather than the journal: an end still being counted is answered once
    // its telemetry is in, so a client that saw the result sees it on `/metrics` too.
    let body = match api.worker.runtime().result(&stored).await {
        Ok(output) => Ended::Completed(Completed {
            workflow_id: id,
            status: "completed".to_owned(),
            output: to_json(&output),
        }),
        Err(RunError::Failed(failure)) => Ended::Failed(Failed {
            workflow_id: id,
            status: "failed".to_owned(),
            error: FailureBody {
                kind: format!("{:?}", failure.kind),
                message: failure.message,
            },
        }),
        Err(error) => return Err(ApiError::internal(error.to_string())),
    };
    Ok(Json(body).into_response())
}

/// A workflow's journal.
///
/// Rendered, one entry a line, or a page of it (`from`, `limit`); `?format=binary` exports the
/// framed records (`waymark export`). Role read.
#[utoipa::path(get, path = "/workflows/{id}/journal", operation_id = "workflow_journal", params(WorkflowPath, JournalQuery),
    responses(
        (status = 200, description = "The journal.", content(
            (String = "text/plain"),
            (ExportBytes = "application/octet-stream"),
        )),
        (status = 400, description = "An unknown format, or paging a binary export.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
    ))]
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
    match query.format.as_deref() {
        None | Some("text") => journal_text(api, workflow, &id, &query).await,
        Some("binary") if query.from.is_some() || query.limit.is_some() => Err(
            ApiError::bad_request("`from` and `limit` page the text form only"),
        ),
        Some("binary") => journal_export(&api, workflow, &id, query.plaintext).await,
        Some(other) => Err(ApiError::bad_request(format!("unknown format `{other}`"))),
    }
}

/// Journal entries read from the store at once while the rendered journal is sent.
const JOURNAL_PAGE: usize = 256;

/// The journal from `from` (at most `limit` entries), rendered one entry a line and sent as it
/// is read, a page at a time: a long journal is never held whole.
async fn journal_text(
    api: std::sync::Arc<Api>,
    workflow: String,
    id: &str,
    query: &JournalQuery,
) -> Result<Response, ApiError> {
    let (from, limit) = (query.from.unwrap_or(0), query.limit.unwrap_or(usize::MAX));
    // The first page is read before answering: an unknown workflow is a 404 and a store that
    // fails a 500, not a cut 200; a later page can only cut the body short.
    let (wanted, take) = (workflow.clone(), limit.min(JOURNAL_PAGE));
    let first = api
        .read(move |worker| match worker.runtime().workflow(&wanted)? {
            Some(_) => worker.runtime().journal_page(&wanted, from, take).map(Some),
            None => Ok(None),
        })
        .await??;
    let first = first.ok_or_else(|| ApiError::not_found(format!("no workflow `{id}`")))?;
    let head = Bytes::from(render_journal_from(&first, from));
    let rest = (first.len() == take && take > 0).then(|| {
        let read = first.len();
        (api, workflow, from + read as u64, limit - read)
    });
    let pages = futures::stream::unfold(rest, |place| async move {
        let (api, workflow, next, left) = place?;
        let take = left.min(JOURNAL_PAGE);
        let wanted = workflow.clone();
        let read = api
            .read(move |worker| worker.runtime().journal_page(&wanted, next, take))
            .await;
        let entries = match read {
            Ok(Ok(entries)) if entries.is_empty() || take == 0 => return None,
            Ok(Ok(entries)) => entries,
            // The status line is sent: a failure can only cut the body short.
            Ok(Err(error)) => return Some((Err(std::io::Error::other(error)), None)),
            Err(error) => return Some((Err(std::io::Error::other(error.message)), None)),
        };
        let text = render_journal_from(&entries, next);
        let read = entries.len();
        let place = (api, workflow, next + read as u64, left - read);
        Some((Ok::<_, std::io::Error>(Bytes::from(text)), Some(place)))
    });
    let head = futures::stream::once(async move { Ok::<_, std::io::Error>(head) });
    let body = axum::body::Body::from_stream(futures::StreamExt::chain(head, pages));
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

/// The workflow as `waymark export` writes it, sealed when the worker encrypts at rest unless
/// `plaintext`.
async fn journal_export(
    api: &Api,
    workflow: String,
    id: &str,
    plaintext: bool,
) -> Result<Response, ApiError> {
    let export = api
        .read(move |worker| match worker.runtime().workflow(&workflow)? {
            Some(_) => worker.export(&workflow).map(Some),
            None => Ok(None),
        })
        .await??;
    let export = export.ok_or_else(|| ApiError::not_found(format!("no workflow `{id}`")))?;
    let codec = api.worker.codec().filter(|_| !plaintext);
    let bytes = export.write(codec.map(|codec| codec.as_ref()));
    let bytes = bytes.map_err(|e| ApiError::internal(format!("sealing the export: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// Send a signal.
///
/// Role write, or approve for a payload a repair ladder takes as a person's review. A
/// `signal_id` (or the `Idempotency-Key` header) is needed: a repeated one is a duplicate.
#[utoipa::path(post, path = "/workflows/{id}/signals/{signal}", operation_id = "signal_workflow",
    params(WorkflowPath, ("signal" = String, Path, description = "The signal's name."),
        ("Idempotency-Key" = Option<String>, Header, description = "The signal id, when the body gives none.")),
    request_body(content = SignalRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Accepted, or a duplicate of one accepted.", body = SignalSent),
        (status = 400, description = "No signal id, or malformed.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "The workflow ended.", body = ErrorBody),
    ))]
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
    let outcome = match sent? {
        SignalOutcome::Accepted => "accepted",
        SignalOutcome::Duplicate => "duplicate",
    };
    let body = SignalSent {
        workflow_id: id,
        signal: name,
        outcome: outcome.to_owned(),
    };
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// Decide a pending approval.
///
/// The approval of scope `hash`: the artifact shown, the intents it authorises and the
/// evidence. Role approve; the approver is the token's identity. Naming the `request` makes
/// sure the decision settles the request the approver saw.
#[utoipa::path(post, path = "/workflows/{id}/approvals/{hash}", operation_id = "decide_approval",
    params(WorkflowPath, ("hash" = String, Path, description = "`sha256:…` of the approval scope.")),
    request_body(content = DecisionRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Decided.", body = Decided),
        (status = 400, description = "Malformed, or a rejection without a reason.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "No pending approval of that scope, another request pending, or expired.", body = ErrorBody),
    ))]
pub(crate) async fn approve(
    State(api): ApiState,
    headers: HeaderMap,
    params: Result<Path<(String, String)>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Decided>, ApiError> {
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
    Ok(Json(Decided {
        workflow_id: id,
        artifact_hash: hash,
        decision: request.decision,
        approver,
    }))
}

/// Settle an operation awaiting an operator.
///
/// Role operate; the operator is the token's identity.
#[utoipa::path(post, path = "/operations/{key}/resolve", operation_id = "resolve_operation",
    params(OperationPath),
    request_body(content = ResolveRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Resolved.", body = Resolved),
        (status = 400, description = "Malformed, a decision without what it needs, or a result other than the one recorded.", body = ErrorBody),
        (status = 404, description = "No such operation.", body = ErrorBody),
        (status = 409, description = "The operation awaits no operator, or moved on from the attempt or revision decided on.", body = ErrorBody),
    ))]
pub(crate) async fn resolve(
    State(api): ApiState,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Resolved>, ApiError> {
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
    let on = DecidedOn {
        attempt: request.attempt,
        revision: request.revision,
    };
    let resolved = runtime.resolve_operation(&stored, on, decision, &operator);
    resolved.await?;
    Ok(Json(Resolved {
        key,
        decision: request.decision,
        operator,
    }))
}

/// The operations awaiting a decision.
///
/// Every operation of the namespace an operator's decision is taken about now, whatever its
/// workflow's status: those waiting for an operator or of unknown outcome, and the calls no run
/// will make or settle any more (their workflow ended, or a reset discarded the command). A
/// call in flight is not listed, nor an operation of a stuck workflow (decided once the run is
/// fixed, reset or cancelled). Paged by idempotency key. Role read or operate.
#[utoipa::path(get, path = "/operations/awaiting-decision",
    operation_id = "operations_awaiting_decision",
    params(AwaitingQuery),
    responses(
        (status = 200, description = "A page of the operations, by idempotency key.", body = AwaitingDecision),
        (status = 400, description = "A `limit` out of range, an unknown parameter, or a bad `after` or namespace.", body = ErrorBody),
    ))]
pub(crate) async fn awaiting_decision(
    State(api): ApiState,
    headers: HeaderMap,
    query: Result<Query<AwaitingQuery>, QueryRejection>,
) -> Result<Json<AwaitingDecision>, ApiError> {
    let caller = api.caller(&headers)?;
    let namespace = caller
        .require_any(&[Role::Read, Role::Operate])?
        .namespace(&headers)?;
    let Query(query) = query.map_err(|r| ApiError::bad_request(r.body_text()))?;
    let limit = page_limit(query.limit)?;
    let after = match &query.after {
        Some(after) => Some(stored_id(&caller, &headers, "`after`", after)?),
        None => None,
    };
    let listed = api
        .read(move |worker| worker.operations_awaiting_decision(Some(&namespace)))
        .await??;
    let (page, next) = take_page(keyed_after(listed, after), limit);
    let operations = page
        .into_iter()
        .map(|(key, record)| OperationAwaiting {
            key: bare(&key).to_owned(),
            workflow_id: bare(&record.workflow_id).to_owned(),
            reason: record.status.note(),
            status: record.status.name().to_owned(),
            arguments: to_json(&record.arguments),
            revision: record.revision(),
            operation: record.operation,
            version: record.version,
            attempt: record.attempt,
        })
        .collect();
    Ok(Json(AwaitingDecision { operations, next }))
}

/// An artifact: kind, version, content and metadata.
///
/// What an approval scope names (its shown artifact, its evidence), so an approver sees
/// exactly that before deciding. Role read or approve.
#[utoipa::path(get, path = "/artifacts/{hash}", operation_id = "show_artifact",
    params(("hash" = String, Path, description = "`sha256:…` of the artifact.")),
    responses(
        (status = 200, description = "The artifact.", body = ArtifactBody),
        (status = 400, description = "Not an artifact hash.", body = ErrorBody),
        (status = 404, description = "No such artifact in the namespace.", body = ErrorBody),
    ))]
pub(crate) async fn artifact(
    State(api): ApiState,
    headers: HeaderMap,
    hash: Result<Path<String>, PathRejection>,
) -> Result<Json<ArtifactBody>, ApiError> {
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
    Ok(Json(ArtifactBody {
        hash,
        content: to_json(&record.content),
        workflow_id: bare(&record.workflow_id).to_owned(),
        kind: record.kind,
        version: record.version,
        metadata: record.metadata.into_iter().collect(),
        created_at_ms: record.created_at_ms,
    }))
}

/// Report an operation's outcome, as its downstream (a webhook).
///
/// Role settle; the source is the token's identity. Applied while the outcome is unknown; a
/// repeated delivery of the same committed result answers `"duplicate": true` and changes
/// nothing.
#[utoipa::path(post, path = "/operations/{key}/settle", operation_id = "settle_operation",
    params(OperationPath),
    request_body(content = SettleRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Settled, or a duplicate.", body = Settled),
        (status = 400, description = "Malformed, or an outcome without what it needs.", body = ErrorBody),
        (status = 404, description = "No such operation.", body = ErrorBody),
        (status = 409, description = "The operation's outcome is known and differs.", body = ErrorBody),
    ))]
pub(crate) async fn settle(
    State(api): ApiState,
    headers: HeaderMap,
    key: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Settled>, ApiError> {
    let caller = api.caller(&headers)?;
    let source = caller.require(Role::Settle)?.name.clone();
    let (key, raw) = (path(key)?, body(raw)?);
    let stored = stored_id(&caller, &headers, "idempotency key", &key)?;
    let request: SettleRequest = json_body(&raw)?;
    let decision = decision(&request.outcome, request.result, request.reason, "outcome")?;
    let runtime = api.worker.runtime();
    let settled = runtime.settle_operation(&stored, request.attempt, decision, &source);
    let settled = settled.await?;
    Ok(Json(Settled {
        key,
        outcome: request.outcome,
        settled_by: source,
        duplicate: settled == Settlement::Duplicate,
    }))
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

/// Delete an ended workflow with every row of its own.
///
/// Its journal, stream, inbox, operations, request id, and the artifacts no other workflow
/// committed. Role operate.
#[utoipa::path(delete, path = "/workflows/{id}", operation_id = "delete_workflow", params(WorkflowPath),
    responses(
        (status = 200, description = "Deleted.", body = Deleted),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "The workflow has not ended, or holds an operation nobody has settled.", body = ErrorBody),
    ))]
pub(crate) async fn delete(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Deleted>, ApiError> {
    let caller = api.caller(&headers)?;
    caller.require(Role::Operate)?;
    let id = path(id)?;
    let stored = stored_id(&caller, &headers, "workflow id", &id)?;
    api.worker.delete(&stored).await?;
    Ok(Json(Deleted {
        workflow_id: id,
        deleted: true,
    }))
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

/// Fork a workflow at entry `at`.
///
/// A new workflow whose journal is the first `at` entries of this one's, replayed, then run
/// live. An effect this one committed is not fired again (the fork inherits its operation
/// record) unless `refire` names it; `models` replaces models in the model calls the fork runs
/// anew; `input` replaces the input. Role operate; the fork's journal names the token.
#[utoipa::path(post, path = "/workflows/{id}/fork", operation_id = "fork_workflow", params(WorkflowPath),
    request_body(content = ForkRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The fork.", body = Forked),
        (status = 400, description = "Malformed, `at` out of the journal, or a refire an approval in the prefix authorises.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "The fork's id is taken, or an operation of the source's has an unknown outcome.", body = ErrorBody),
    ))]
pub(crate) async fn fork(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Forked>, ApiError> {
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
    Ok(Json(Forked {
        workflow_id: bare(&fork).to_owned(),
        forked_from: command.id,
        at,
    }))
}

/// Reset a stuck run in place.
///
/// The workflow goes on as a new run of the code deployed now, from the first `at` entries of
/// its journal; the old run is kept, ended, as the workflow `kept_run` (`ID#run-N`). Effects
/// keep their keys and records: one the old run committed is answered, not called again. Role
/// operate.
#[utoipa::path(post, path = "/workflows/{id}/reset", operation_id = "reset_workflow", params(WorkflowPath),
    request_body(content = ResetRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Reset.", body = ResetDone),
        (status = 400, description = "Malformed, or `at` out of the journal.", body = ErrorBody),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "The run is not stuck.", body = ErrorBody),
    ))]
pub(crate) async fn reset(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<ResetDone>, ApiError> {
    let command = WorkflowCommand::<ResetRequest>::read(&api, &headers, Role::Operate, id, raw)?;
    let (at, sender) = (command.request.at, Some(command.sender));
    let kept = api.worker.reset(&command.stored, at, sender).await?;
    Ok(Json(ResetDone {
        workflow_id: command.id,
        at,
        kept_run: bare(&kept).to_owned(),
    }))
}

/// Cancel a running workflow: it fails with the reason.
///
/// Role write.
#[utoipa::path(post, path = "/workflows/{id}/cancel", operation_id = "cancel_workflow", params(WorkflowPath),
    request_body(content = CancelRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Cancelled.", body = Cancelled),
        (status = 404, description = "No such workflow.", body = ErrorBody),
        (status = 409, description = "The workflow has ended.", body = ErrorBody),
    ))]
pub(crate) async fn cancel(
    State(api): ApiState,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Json<Cancelled>, ApiError> {
    let command = WorkflowCommand::<CancelRequest>::read(&api, &headers, Role::Write, id, raw)?;
    let reason = command.request.reason;
    let reason = reason.unwrap_or_else(|| "no reason given".to_owned());
    let reason = format!("cancelled by {}: {reason}", command.sender);
    api.worker.cancel(&command.stored, &reason).await?;
    Ok(Json(Cancelled {
        workflow_id: command.id,
        status: "failed".to_owned(),
        reason,
    }))
}
