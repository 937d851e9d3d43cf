//! The JSON bodies the API reads and answers, as types: the handlers build them, and the
//! OpenAPI document's schemas are derived from them, so the two cannot drift apart.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

/// Every refused request: `{"error": {"code", "message"}}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

/// What went wrong: a stable machine-readable code and a sentence for a person.
#[derive(Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    pub(crate) code: String,
    pub(crate) message: String,
}

/// A route's workflow.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // Read as a path segment by the handlers; here for the document.
pub(crate) struct WorkflowPath {
    /// The workflow's id.
    id: String,
}

/// A route's operation.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // Read as a path segment by the handlers; here for the document.
pub(crate) struct OperationPath {
    /// The operation's idempotency key, percent-encoded.
    key: String,
}

/// `POST /workflows/{id}` (a start): every field may be left out.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartRequest {
    /// The workflow's input (`null` when left out).
    #[serde(default)]
    pub(crate) input: Value,
    /// Deduplicates starts: a second start with it answers the workflow the first started.
    /// The `Idempotency-Key` header says the same.
    pub(crate) request_id: Option<String>,
    /// The new workflow's id (a fresh UUID when left out).
    pub(crate) workflow_id: Option<String>,
}

/// A start's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Started {
    pub(crate) workflow_id: String,
    /// `true` when the request id had already started this workflow.
    pub(crate) existed: bool,
}

/// Who the bearer token stands for.
#[derive(Serialize, ToSchema)]
pub(crate) struct Whoami {
    pub(crate) name: String,
    pub(crate) roles: Vec<String>,
    /// The namespaces it may act in, or `"*"` for all.
    pub(crate) namespaces: Value,
}

/// `GET /workflows`: filters and paging.
#[derive(Deserialize, Default, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only workflows in this status.
    #[param(
        pattern = "^(running|awaiting_approval|awaiting_signal|awaiting_operator|stuck|completed|failed)$"
    )]
    pub(crate) status: Option<String>,
    /// Only workflows of this registered name.
    pub(crate) workflow: Option<String>,
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Only workflows after this id, in the listing's order: the `next` of the page before.
    pub(crate) after: Option<String>,
}

/// A page of workflows.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowPage {
    pub(crate) workflows: Vec<WorkflowRow>,
    /// The `after` of the next page; `null` on the last.
    pub(crate) next: Option<String>,
}

/// One workflow of a page: its summary, or why its record cannot be read.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum WorkflowRow {
    Readable(WorkflowSummary),
    Unreadable(UnreadableWorkflow),
}

/// A workflow's name, status and length.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowSummary {
    pub(crate) workflow_id: String,
    /// The registered name it runs.
    pub(crate) workflow: String,
    pub(crate) status: String,
    pub(crate) journal_len: u64,
    /// Why a stuck run is stuck; `null` for any other.
    pub(crate) stuck: Option<StopBody>,
}

/// A workflow whose record does not decode.
#[derive(Serialize, ToSchema)]
pub(crate) struct UnreadableWorkflow {
    pub(crate) workflow_id: String,
    /// Always `unreadable`.
    pub(crate) status: String,
    pub(crate) error: String,
}

/// Why a run stopped: what kind of stop, at which command, the whole error and when.
#[derive(Serialize, ToSchema)]
pub(crate) struct StopBody {
    pub(crate) code: String,
    pub(crate) seq: Option<u32>,
    pub(crate) message: String,
    pub(crate) at_ms: u64,
}

/// `GET /workflows/{id}`.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowView {
    pub(crate) workflow_id: String,
    pub(crate) workflow: String,
    pub(crate) status: String,
    pub(crate) stuck: Option<StopBody>,
    pub(crate) journal_len: u64,
    /// The journal's last entry, rendered.
    pub(crate) current_step: Option<String>,
    pub(crate) pending_approvals: Vec<PendingApproval>,
    pub(crate) operations: Vec<OperationRow>,
    pub(crate) stream: StreamState,
}

/// An approval request waiting for a person.
#[derive(Serialize, ToSchema)]
pub(crate) struct PendingApproval {
    /// The request's number: name it in a decision to be sure it settles this request.
    pub(crate) request: u32,
    /// The scope to decide on, `sha256:…`.
    pub(crate) artifact_hash: String,
    /// The artifact shown, the intents it authorises with their arguments, and the evidence.
    pub(crate) scope: Value,
    /// What the workflow says about the risk.
    pub(crate) risk: Value,
    pub(crate) expires_at_ms: Option<u64>,
}

/// An operation of the workflow's log.
#[derive(Serialize, ToSchema)]
pub(crate) struct OperationRow {
    /// Its idempotency key.
    pub(crate) key: String,
    pub(crate) operation: String,
    pub(crate) attempt: u32,
    /// How many transitions the record went through (what a resolution's `revision` names).
    pub(crate) revision: u32,
    pub(crate) status: String,
}

/// `GET /operations/awaiting-decision`: paging.
#[derive(Deserialize, Default, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AwaitingQuery {
    /// At most this many (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Only operations after this idempotency key, in key order: the `next` of the page before.
    pub(crate) after: Option<String>,
}

/// `GET /operations/awaiting-decision`: a page of what the namespace's operators are asked to
/// decide, by idempotency key.
#[derive(Serialize, ToSchema)]
pub(crate) struct AwaitingDecision {
    pub(crate) operations: Vec<OperationAwaiting>,
    /// The `after` of the next page; `null` on the last.
    pub(crate) next: Option<String>,
}

/// An operation a decision is taken about now (`POST /operations/{key}/resolve`).
#[derive(Serialize, ToSchema)]
pub(crate) struct OperationAwaiting {
    /// Its idempotency key.
    pub(crate) key: String,
    /// The workflow that issued it.
    pub(crate) workflow_id: String,
    /// The effect (the activity's name).
    pub(crate) operation: String,
    /// The effect's semantics version.
    pub(crate) version: u32,
    /// The attempt a decision is about.
    pub(crate) attempt: u32,
    /// How many transitions the record went through: a decision that gives it is refused
    /// once the record moves on.
    pub(crate) revision: u32,
    /// `awaiting_operator` or `unknown_outcome` (its reconciler may still be checking); or
    /// `prepared` when no run will make or settle the call any more (its workflow ended, or a
    /// reset discarded the command).
    pub(crate) status: String,
    /// Why it waits for an operator, or the failure that left its outcome unknown; empty for a
    /// `prepared` one.
    pub(crate) reason: String,
    /// The exact arguments of the call.
    pub(crate) arguments: Value,
}

/// How far the stream got, and how far each reader channel acknowledged it.
#[derive(Serialize, ToSchema)]
pub(crate) struct StreamState {
    pub(crate) last_event: u64,
    pub(crate) delivered: BTreeMap<String, u64>,
}

/// `GET /workflows/{id}/result` before the workflow ended.
#[derive(Serialize, ToSchema)]
pub(crate) struct NotEnded {
    pub(crate) workflow_id: String,
    pub(crate) status: String,
    pub(crate) stuck: Option<StopBody>,
}

/// `GET /workflows/{id}/result` once the workflow ended.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Ended {
    Completed(Completed),
    Failed(Failed),
}

/// A completed workflow's output.
#[derive(Serialize, ToSchema)]
pub(crate) struct Completed {
    pub(crate) workflow_id: String,
    /// Always `completed`.
    pub(crate) status: String,
    pub(crate) output: Value,
}

/// A failed workflow's failure.
#[derive(Serialize, ToSchema)]
pub(crate) struct Failed {
    pub(crate) workflow_id: String,
    /// Always `failed`.
    pub(crate) status: String,
    pub(crate) error: FailureBody,
}

/// Why a workflow failed.
#[derive(Serialize, ToSchema)]
pub(crate) struct FailureBody {
    pub(crate) kind: String,
    pub(crate) message: String,
}

/// `GET /workflows/{id}/journal`: the form and, for text, the page.
#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct JournalQuery {
    /// `text` (the default) or `binary` (framed records, as `waymark export` writes them).
    #[param(pattern = "^(text|binary)$")]
    pub(crate) format: Option<String>,
    /// Text only: the first entry's index (default 0).
    pub(crate) from: Option<u64>,
    /// Text only: at most this many entries (default: all from `from` on).
    pub(crate) limit: Option<usize>,
    /// With `binary` from a worker that encrypts at rest: records in clear, not sealed.
    #[serde(default)]
    pub(crate) plaintext: bool,
}

/// An export's bytes, as `waymark export` writes them (`waymark import` reads them).
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // The body is bytes; this names their schema.
pub(crate) struct ExportBytes(Vec<u8>);

/// `POST /workflows/{id}/signals/{signal}`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignalRequest {
    /// Deduplicates the signal (or the `Idempotency-Key` header): one is needed.
    pub(crate) signal_id: Option<String>,
    #[serde(default)]
    pub(crate) payload: Value,
}

/// A signal's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct SignalSent {
    pub(crate) workflow_id: String,
    pub(crate) signal: String,
    /// `accepted`, or `duplicate` for a signal id already sent.
    pub(crate) outcome: String,
}

/// `POST /workflows/{id}/approvals/{hash}`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionRequest {
    /// `approve` or `reject`.
    #[schema(pattern = "^(approve|reject)$")]
    pub(crate) decision: String,
    /// Why, for a rejection (which needs one).
    pub(crate) reason: Option<String>,
    /// The request's number: the decision is refused if another request is pending.
    pub(crate) request: Option<u32>,
}

/// A decision's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Decided {
    pub(crate) workflow_id: String,
    pub(crate) artifact_hash: String,
    pub(crate) decision: String,
    /// The token's identity.
    pub(crate) approver: String,
}

/// `POST /operations/{key}/resolve`: an operator's decision on an operation.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResolveRequest {
    /// `committed` (with a `result`), `not_found`, or `failed` (with a `reason`).
    #[schema(pattern = "^(committed|not_found|failed)$")]
    pub(crate) decision: String,
    pub(crate) result: Option<Value>,
    pub(crate) reason: Option<String>,
    /// The attempt decided on: refused if the operation moved on to another since.
    pub(crate) attempt: Option<u32>,
    /// The operation's `revision` as the decision was made on it: refused after any
    /// transition since, a later call of the key at the same attempt number included.
    pub(crate) revision: Option<u32>,
}

/// A resolution's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Resolved {
    pub(crate) key: String,
    pub(crate) decision: String,
    /// The token's identity.
    pub(crate) operator: String,
}

/// `POST /operations/{key}/settle`: a downstream's report of an operation's outcome.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettleRequest {
    /// `committed` (with a `result`), `not_found`, or `failed` (with a `reason`).
    #[schema(pattern = "^(committed|not_found|failed)$")]
    pub(crate) outcome: String,
    pub(crate) result: Option<Value>,
    pub(crate) reason: Option<String>,
    pub(crate) attempt: Option<u32>,
}

/// A settlement's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Settled {
    pub(crate) key: String,
    pub(crate) outcome: String,
    /// The token's identity.
    pub(crate) settled_by: String,
    /// `true` for a repeated delivery, which changed nothing.
    pub(crate) duplicate: bool,
}

/// An artifact: what an approval scope names.
#[derive(Serialize, ToSchema)]
pub(crate) struct ArtifactBody {
    pub(crate) hash: String,
    pub(crate) kind: String,
    pub(crate) version: String,
    pub(crate) content: Value,
    /// The prompt, model, tool, index and policy versions that produced it.
    pub(crate) metadata: BTreeMap<String, String>,
    /// The workflow that committed it first.
    pub(crate) workflow_id: String,
    pub(crate) created_at_ms: u64,
}

/// `POST /workflows/{id}/cancel`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelRequest {
    pub(crate) reason: Option<String>,
}

/// A cancellation's answer: the workflow failed with the reason.
#[derive(Serialize, ToSchema)]
pub(crate) struct Cancelled {
    pub(crate) workflow_id: String,
    pub(crate) status: String,
    pub(crate) reason: String,
}

/// A deletion's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Deleted {
    pub(crate) workflow_id: String,
    pub(crate) deleted: bool,
}

/// `POST /workflows/{id}/fork`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkRequest {
    /// How many of the source's entries the fork keeps.
    #[schema(minimum = 1)]
    pub(crate) at: u64,
    /// The fork's id (a fresh one when left out).
    pub(crate) workflow_id: Option<String>,
    /// Replaces the input.
    pub(crate) input: Option<Value>,
    /// Model as the code names it → model to run, in the model calls the fork runs anew.
    #[serde(default)]
    pub(crate) models: BTreeMap<String, String>,
    /// Effects (by activity name) to fire again rather than inherit.
    #[serde(default)]
    pub(crate) refire: Vec<String>,
}

/// A fork's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct Forked {
    pub(crate) workflow_id: String,
    pub(crate) forked_from: String,
    pub(crate) at: u64,
}

/// `POST /workflows/{id}/reset`.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResetRequest {
    /// How many of the run's entries the new run keeps.
    #[schema(minimum = 1)]
    pub(crate) at: u64,
}

/// A reset's answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct ResetDone {
    pub(crate) workflow_id: String,
    pub(crate) at: u64,
    /// The old run, kept ended: `ID#run-N`.
    pub(crate) kept_run: String,
}

/// `GET /workflows/{id}/stream`: the reader's channel.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ChannelQuery {
    /// The reader channel whose deliveries the reconnection acknowledges (`default`).
    pub(crate) channel: Option<String>,
}

/// `POST /workflows/{id}/stream/ack`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckRequest {
    /// The last event the reader holds.
    pub(crate) event: u64,
    /// The reader's channel (`default`).
    pub(crate) channel: Option<String>,
}

/// What a channel is now known to have received (never less than before).
#[derive(Serialize, ToSchema)]
pub(crate) struct Acknowledged {
    pub(crate) workflow_id: String,
    pub(crate) channel: String,
    pub(crate) delivered: u64,
}

/// `GET /healthz`.
#[derive(Serialize, ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    pub(crate) status: String,
}
