//! The operation log: one record per side effect, keyed by its idempotency key.
//!
//! ```text
//! prepared ──call ok──▶ committed(result, external_ref)
//!     │  └─definite error──▶ failed_retriable ──(same key)──▶ prepared … / failed_terminal
//!     └─timeout / lost ack──▶ unknown_outcome ──reconcile──▶ committed | not_found→retry
//!                                                  | still unknown→(recheck)→awaiting_operator
//! ```
//!
//! `prepared` is synced before the downstream is called, so a process that dies mid-call leaves
//! a record saying "the outcome of this key is unknown", and the resumed run reconciles instead
//! of calling blindly. Every status change is written in the same batch as the journal entry
//! that explains it. Records are postcard behind the journal's format version; the types are
//! append-only like the journal's.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::approvals::Grant;
use crate::journal::{decode_exact, DecodeError, Failure, Payload, Seq};

/// The key of an effect: `{workflow_id}|{operation}|{key arguments}|v{version}`.
///
/// Derived from business intent only (never a random value or an attempt number), so every
/// retry, replay and process computes the same one. `|` and `%` in the workflow id are
/// percent-escaped so two different (workflow, operation) pairs can never produce the same key;
/// the key arguments are one canonical JSON array, which is unambiguous by itself.
pub fn idempotency_key(
    workflow_id: &str,
    operation: &str,
    key_arguments: &Payload,
    version: u32,
) -> String {
    let arguments = String::from_utf8_lossy(key_arguments.as_bytes());
    let (workflow_id, operation) = (escape(workflow_id), escape(operation));
    // Made at its size: every effect computes its key, and `format!` grew it piece by piece.
    let room = "|||v".len() + u32::MAX.ilog10() as usize + 1;
    let size = workflow_id.len() + operation.len() + arguments.len() + room;
    let mut key = String::with_capacity(size);
    for part in [&*workflow_id, "|", &*operation, "|", &*arguments, "|v"] {
        key.push_str(part);
    }
    let _ = write!(key, "{version}");
    key
}

/// Adds `operations` to the records one write carries, making room for each alone. A write
/// carries one or two, and a list's first push makes room for four: with a record and its key
/// taking 384 bytes, that is 1.5 KB on every effect, past glibc's per-thread cache, whose
/// allocator consolidates its free lists for such a block.
pub(crate) fn add_operations(
    list: &mut Vec<(String, OperationRecord)>,
    operations: impl IntoIterator<Item = (String, OperationRecord)>,
) {
    for operation in operations {
        list.reserve_exact(1);
        list.push(operation);
    }
}

/// The prefix every key of `workflow_id`'s operations starts with.
pub fn key_prefix(workflow_id: &str) -> String {
    format!("{}|", escape(workflow_id))
}

/// An operation status's name, one of [`OperationStatus::NAMES`]. (A name of its own, not
/// `&'static str` spelled out, so that a deserialized refusal does not borrow its input.)
pub type StatusName = &'static str;

/// How an operator settles an operation whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OperatorDecision {
    /// It happened downstream; this is its result (JSON of the effect's output type).
    Committed(Payload),
    /// It did not happen: run the next attempt now, with the same key (for an effect an
    /// earlier run left, or one of a workflow that has ended, the key is left free for the
    /// intent).
    NotFound,
    /// Give up: the effect fails terminally with this reason.
    Failed(String),
}

/// What a downstream's report of an outcome did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// It settled the operation.
    Applied,
    /// The operation was already committed with this very result: a repeated delivery.
    Duplicate,
}

fn escape(part: &str) -> Cow<'_, str> {
    if !part.contains(['%', '|']) {
        return Cow::Borrowed(part);
    }
    Cow::Owned(part.replace('%', "%25").replace('|', "%7C"))
}

/// Where an operation stands. Append-only.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum OperationStatus {
    /// About to call the downstream (synced before the call).
    Prepared,
    /// The downstream did it.
    Committed {
        /// The result the workflow received.
        result: Payload,
        /// The downstream's reference, when the activity recorded one.
        external_ref: Option<String>,
    },
    /// A definite failure; the next attempt uses the same key.
    FailedRetriable {
        /// Why.
        failure: Failure,
    },
    /// A definite failure with no retry left (or a failed precondition).
    FailedTerminal {
        /// Why.
        failure: Failure,
    },
    /// The call may or may not have taken effect: reconciled before anything else.
    UnknownOutcome {
        /// Why it is unknown.
        failure: Failure,
    },
    /// Reconciliation could not settle it; an operator must.
    AwaitingOperator {
        /// What the operator is told.
        reason: String,
    },
    /// A precondition (an approval, a state check) refused the call, or a decision about a
    /// call an earlier run left unsettled found that it did not take effect: the downstream did
    /// not act on the key, so the same intent may be issued again (after a fresh approval, say).
    NotAttempted {
        /// Which precondition, and why.
        failure: Failure,
    },
}

impl OperationStatus {
    /// Every status's name, as [`OperationStatus::name`] gives it.
    pub const NAMES: [&'static str; 7] = [
        "prepared",
        "committed",
        "failed_retriable",
        "failed_terminal",
        "unknown_outcome",
        "awaiting_operator",
        "not_attempted",
    ];

    /// The status's name, as the API and the rendering show it.
    pub fn name(&self) -> &'static str {
        match self {
            OperationStatus::Prepared => "prepared",
            OperationStatus::Committed { .. } => "committed",
            OperationStatus::FailedRetriable { .. } => "failed_retriable",
            OperationStatus::FailedTerminal { .. } => "failed_terminal",
            OperationStatus::UnknownOutcome { .. } => "unknown_outcome",
            OperationStatus::AwaitingOperator { .. } => "awaiting_operator",
            OperationStatus::NotAttempted { .. } => "not_attempted",
        }
    }

    /// Whether an operator's (or a reconciler's) decision may settle it: its outcome is
    /// unknown, or it waits for someone to decide.
    pub fn awaits_decision(&self) -> bool {
        matches!(
            self,
            OperationStatus::AwaitingOperator { .. } | OperationStatus::UnknownOutcome { .. }
        )
    }

    /// Whether the call may have taken effect with nobody having said whether it did: a call
    /// made and not answered (`prepared`), an unknown outcome, or one waiting for an operator.
    /// Such a record is the only trace of what the downstream may have done, so it is kept.
    pub fn is_unsettled(&self) -> bool {
        matches!(self, OperationStatus::Prepared) || self.awaits_decision()
    }

    /// Whether an operator's decision is taken about an operation in this status. While a run
    /// may still make or settle the call (`no_call_in_flight` false), only one that waits for
    /// a decision; once none will (its workflow ended, or a reset discarded the command), any
    /// unsettled one.
    pub fn takes_decision(&self, no_call_in_flight: bool) -> bool {
        match no_call_in_flight {
            true => self.is_unsettled(),
            false => self.awaits_decision(),
        }
    }

    /// Whether the outcome is settled for good.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OperationStatus::Committed { .. } | OperationStatus::FailedTerminal { .. }
        )
    }
}

/// One side effect. Append-only (postcard); format 2 added the approval, the kept external
/// reference and the history, format 3 the command of each history event.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct OperationRecord {
    /// The workflow that issued it.
    pub workflow_id: String,
    /// The command that issued it.
    pub seq: Seq,
    /// The activity name.
    pub operation: String,
    /// The effect's semantics version (the tool version).
    pub version: u32,
    /// The exact arguments.
    pub arguments: Payload,
    /// Names of the preconditions checked right before the call.
    pub preconditions: Vec<String>,
    /// The attempt this status belongs to.
    pub attempt: u32,
    /// Where it stands.
    pub status: OperationStatus,
    /// The approval the call ran under, if it ran under one.
    pub approval: Option<Grant>,
    /// The downstream's reference, once any attempt or reconciler learnt it: kept through
    /// later transitions, whoever commits.
    pub external_ref: Option<String>,
    /// Every status it went through, oldest first, each with its time.
    pub history: Vec<OperationEvent>,
}

/// One transition of an operation. Append-only (postcard).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct OperationEvent {
    /// When, in worker-clock milliseconds.
    pub at_ms: u64,
    /// The command it belongs to: an intent issued again (after a refusal) continues the
    /// history of its key under another command.
    pub seq: Seq,
    /// The attempt.
    pub attempt: u32,
    /// The status's name ([`OperationStatus::name`]).
    pub status: String,
    /// Who settled it, when it was not the call itself (`reconciler`, `operator:dana`,
    /// `downstream:carrier`, `no_reconciler`, `operation_log`).
    pub by: Option<String>,
    /// The failure, the reason (why it waits for an operator); empty when there is none.
    pub note: String,
}

/// Format 1 of [`OperationRecord`], before approvals, kept references and history.
#[derive(Deserialize)]
struct OperationRecordV1 {
    workflow_id: String,
    seq: Seq,
    operation: String,
    version: u32,
    arguments: Payload,
    preconditions: Vec<String>,
    attempt: u32,
    status: OperationStatus,
}

/// Format 2 of [`OperationRecord`]: its history's events name no command.
#[derive(Deserialize)]
struct OperationRecordV2 {
    workflow_id: String,
    seq: Seq,
    operation: String,
    version: u32,
    arguments: Payload,
    preconditions: Vec<String>,
    attempt: u32,
    status: OperationStatus,
    approval: Option<Grant>,
    external_ref: Option<String>,
    history: Vec<OperationEventV2>,
}

/// Format 2 of [`OperationEvent`].
#[derive(Deserialize)]
struct OperationEventV2 {
    at_ms: u64,
    attempt: u32,
    status: String,
    by: Option<String>,
    note: String,
}

impl crate::journal::Record for OperationRecord {
    const FORMAT: u8 = 3;

    fn decode_older(format: u8, body: &[u8]) -> Result<Self, DecodeError> {
        match format {
            2 => {
                let v2: OperationRecordV2 = decode_exact(body)?;
                // Format 2 kept one command's history per record: its events are that command's.
                let seq = v2.seq;
                let history = v2.history.into_iter().map(|e| OperationEvent {
                    at_ms: e.at_ms,
                    seq,
                    attempt: e.attempt,
                    status: e.status,
                    by: e.by,
                    note: e.note,
                });
                Ok(OperationRecord {
                    workflow_id: v2.workflow_id,
                    seq,
                    operation: v2.operation,
                    version: v2.version,
                    arguments: v2.arguments,
                    preconditions: v2.preconditions,
                    attempt: v2.attempt,
                    status: v2.status,
                    approval: v2.approval,
                    external_ref: v2.external_ref,
                    history: history.collect(),
                })
            }
            1 => {
                let v1: OperationRecordV1 = decode_exact(body)?;
                let external_ref = match &v1.status {
                    OperationStatus::Committed { external_ref, .. } => external_ref.clone(),
                    _ => None,
                };
                Ok(OperationRecord {
                    workflow_id: v1.workflow_id,
                    seq: v1.seq,
                    operation: v1.operation,
                    version: v1.version,
                    arguments: v1.arguments,
                    preconditions: v1.preconditions,
                    attempt: v1.attempt,
                    status: v1.status,
                    approval: None,
                    external_ref,
                    history: Vec::new(),
                })
            }
            other => Err(DecodeError::UnknownVersion(other)),
        }
    }
}

impl OperationStatus {
    /// What the history notes about this status: its failure, reason or nothing.
    pub fn note(&self) -> String {
        match self {
            OperationStatus::Prepared | OperationStatus::Committed { .. } => String::new(),
            OperationStatus::FailedRetriable { failure }
            | OperationStatus::FailedTerminal { failure }
            | OperationStatus::UnknownOutcome { failure }
            | OperationStatus::NotAttempted { failure } => failure.message.clone(),
            OperationStatus::AwaitingOperator { reason } => reason.clone(),
        }
    }
}

/// What a decision about an operation was made on, as far as its decider says: it is refused
/// once the record has moved on from that. A reconciler's answer, or a person's, is about the
/// call they asked after; applied to a later call of the key it could free a key whose call
/// took effect. A decision that names no revision is fenced by attempt only, from the moment
/// the worker reads the record to the one its run applies the decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecidedOn {
    /// The attempt decided on.
    pub attempt: Option<u32>,
    /// The record's [revision](OperationRecord::revision) when it was read: refused after any
    /// transition since, the same attempt of a later call included.
    pub revision: Option<u32>,
}

impl DecidedOn {
    /// A decision about whatever attempt the record is at when it is applied.
    pub const ANY: DecidedOn = DecidedOn {
        attempt: None,
        revision: None,
    };

    /// A decision about `attempt`, whichever call of the key it belongs to.
    pub fn attempt(attempt: Option<u32>) -> Self {
        DecidedOn {
            attempt,
            revision: None,
        }
    }
}

impl OperationRecord {
    /// Whether `key` is one of this record's workflow's keys (they begin with its id): a row
    /// filed under another workflow's keys is nobody's to list or settle.
    pub fn is_filed_under(&self, key: &str) -> bool {
        key.starts_with(&key_prefix(&self.workflow_id))
    }

    /// How many transitions the record went through: every one adds an event to its history,
    /// and an intent issued again after its key was freed continues that history. Attempt
    /// numbers start over for such a call; the revision tells the two calls apart. A command
    /// of a later run that takes the record over (the same call) renames its seq without an
    /// event: a decision made before goes to that command.
    pub fn revision(&self) -> u32 {
        u32::try_from(self.history.len()).unwrap_or(u32::MAX)
    }

    /// What a decision made on this record, as it reads now, is about.
    pub fn as_read(&self) -> DecidedOn {
        DecidedOn {
            attempt: Some(self.attempt),
            revision: Some(self.revision()),
        }
    }

    /// The record after a transition to `status` for `attempt` at `at_ms`, settled `by`
    /// someone other than the call when given: the history grows by one event, and an
    /// external reference once learnt is kept.
    pub fn after(
        mut self,
        attempt: u32,
        mut status: OperationStatus,
        at_ms: u64,
        by: Option<String>,
    ) -> Self {
        if let OperationStatus::Committed { external_ref, .. } = &mut status {
            match external_ref {
                Some(reference) => self.external_ref = Some(reference.clone()),
                None => external_ref.clone_from(&self.external_ref),
            }
        }
        self.history.push(OperationEvent {
            at_ms,
            seq: self.seq,
            attempt,
            status: status.name().to_owned(),
            by,
            note: status.note(),
        });
        self.attempt = attempt;
        self.status = status;
        self
    }
}

/// Renders operations (key, record) one per line, stable for snapshot tests.
pub fn render_operations(operations: &[(String, OperationRecord)]) -> String {
    let mut out = String::new();
    for (key, op) in operations {
        let detail = match &op.status {
            OperationStatus::Prepared => String::new(),
            OperationStatus::Committed {
                result,
                external_ref,
            } => format!(
                " result={} external_ref={}",
                String::from_utf8_lossy(result.as_bytes()),
                external_ref.as_deref().unwrap_or("-")
            ),
            OperationStatus::FailedRetriable { failure }
            | OperationStatus::FailedTerminal { failure }
            | OperationStatus::UnknownOutcome { failure }
            | OperationStatus::NotAttempted { failure } => {
                format!(" {:?} {:?}", failure.kind, failure.message)
            }
            OperationStatus::AwaitingOperator { reason } => format!(" {reason:?}"),
        };
        let _ = writeln!(
            out,
            "{key} seq={} attempt={} {}{detail}",
            op.seq,
            op.attempt,
            op.status.name()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(json: &str) -> Payload {
        Payload::from_json_bytes(json.as_bytes()).unwrap()
    }

    #[test]
    fn key_is_derived_from_intent_and_version() {
        let key = idempotency_key("wf-1", "rebook", &args(r#"["ORD-7"]"#), 2);
        assert_eq!(key, r#"wf-1|rebook|["ORD-7"]|v2"#);
        assert_ne!(
            key,
            idempotency_key("wf-1", "rebook", &args(r#"["ORD-8"]"#), 2)
        );
        assert_ne!(
            key,
            idempotency_key("wf-1", "rebook", &args(r#"["ORD-7"]"#), 3)
        );
    }

    #[test]
    fn separators_in_ids_cannot_forge_another_key() {
        let a = idempotency_key("a|b", "c", &args("[1]"), 1);
        let b = idempotency_key("a", "b|c", &args("[1]"), 1);
        assert_ne!(a, b);
        assert_eq!(a, "a%7Cb|c|[1]|v1");
    }
}
