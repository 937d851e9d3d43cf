//! A stable, human-readable rendering of a journal for snapshot tests and the CLI.
//!
//! One line per entry. Wall-clock times and generated values (`now`, `random`, `uuid`) are
//! redacted, since they differ on every run; durations, seqs, attempts, names, inputs and outputs
//! are kept, since a change in them is a change in behaviour.

use std::fmt::Write as _;

use crate::journal::ApprovalDecision;
use crate::journal::{CommandKind, Entry, Failure, Payload, ReconciledBy, Reconciliation};

/// Renders `entries`, one numbered line each.
pub fn render_journal(entries: &[Entry]) -> String {
    render_journal_from(entries, 0)
}

/// [`render_journal`] of a page whose first entry is at index `first`.
pub fn render_journal_from(entries: &[Entry], first: u64) -> String {
    let mut out = String::new();
    for (index, entry) in (first..).zip(entries) {
        let _ = writeln!(out, "{index:>3} {}", render_entry(entry));
    }
    out
}

fn decision_text(decision: &ApprovalDecision) -> String {
    match decision {
        ApprovalDecision::Approved { approver, .. } => format!("approved by {approver}"),
        ApprovalDecision::Rejected {
            approver, reason, ..
        } => format!("rejected by {approver} {reason:?}"),
        ApprovalDecision::Expired { .. } => "expired".to_owned(),
    }
}

fn render_entry(entry: &Entry) -> String {
    match entry {
        Entry::WorkflowStarted(started) => format!(
            "workflow_started    {} request_id={} input={}",
            started.workflow_name,
            started.request_id.as_deref().unwrap_or("-"),
            text(&started.input)
        ),
        Entry::ActivityScheduled {
            seq,
            identity,
            input,
        } => format!(
            "activity_scheduled  seq={seq} {} input={}",
            identity.name,
            text(input)
        ),
        Entry::ActivityCompleted {
            seq,
            attempt: 0,
            output,
        }
        | Entry::ActivityCompletedAt {
            seq,
            attempt: 0,
            output,
            ..
        } => format!(
            "activity_completed  seq={seq} from=stage_cache output={}",
            text(output)
        ),
        Entry::ActivityCompleted {
            seq,
            attempt,
            output,
        }
        | Entry::ActivityCompletedAt {
            seq,
            attempt,
            output,
            ..
        } => format!(
            "activity_completed  seq={seq} attempt={attempt} output={}",
            text(output)
        ),
        Entry::ActivityAttemptFailed {
            seq,
            attempt,
            failure,
            ..
        } => format!(
            "attempt_failed      seq={seq} attempt={attempt} {} retry_at=[time]",
            failure_text(failure)
        ),
        Entry::ActivityFailed {
            seq,
            attempt,
            failure,
        }
        | Entry::ActivityFailedAt {
            seq,
            attempt,
            failure,
            ..
        } => format!(
            "activity_failed     seq={seq} attempt={attempt} {}",
            failure_text(failure)
        ),
        Entry::TimerStarted {
            seq, duration_ms, ..
        } => {
            format!("timer_started       seq={seq} duration={duration_ms}ms fire_at=[time]")
        }
        Entry::TimerFired { seq } | Entry::TimerFiredAt { seq, .. } => {
            format!("timer_fired         seq={seq}")
        }
        Entry::WaitDropped { seq } => format!("wait_dropped        seq={seq}"),
        Entry::SnapshotCompleted {
            seq,
            attempt,
            artifact,
        }
        | Entry::SnapshotCompletedAt {
            seq,
            attempt,
            artifact,
            ..
        } => format!(
            "snapshot_completed  seq={seq} attempt={attempt} artifact={}",
            artifact.hex()
        ),
        Entry::ArtifactCommitted { seq, identity } => format!(
            "artifact_committed  seq={seq} {} {}",
            identity.name,
            identity.input_digest.hex()
        ),
        Entry::ApprovalRequested {
            seq,
            artifact_hash,
            risk,
            expires_at_ms,
            ..
        }
        | Entry::ApprovalRequestedAt {
            seq,
            artifact_hash,
            risk,
            expires_at_ms,
            ..
        } => format!(
            "approval_requested  seq={seq} artifact={} risk={} expires={}",
            artifact_hash.hex(),
            text(risk),
            if expires_at_ms.is_some() {
                "[time]"
            } else {
                "never"
            }
        ),
        Entry::ApprovalDecided { seq, decision } => {
            format!("approval_decided    seq={seq} {}", decision_text(decision))
        }
        Entry::SignalAwaited { seq, identity } | Entry::SignalAwaitedAt { seq, identity, .. } => {
            format!("signal_awaited      seq={seq} {}", identity.name)
        }
        Entry::SignalReceived {
            seq,
            signal_id,
            payload,
        }
        | Entry::SignalReceivedAt {
            seq,
            signal_id,
            payload,
            sender: None,
            ..
        } => format!(
            "signal_received     seq={seq} id={signal_id} payload={}",
            text(payload)
        ),
        Entry::SignalReceivedFrom {
            seq,
            signal_id,
            payload,
            sender,
        }
        | Entry::SignalReceivedAt {
            seq,
            signal_id,
            payload,
            sender: Some(sender),
            ..
        } => format!(
            "signal_received     seq={seq} id={signal_id} from={sender} payload={}",
            text(payload)
        ),
        Entry::ValueRecorded {
            seq,
            identity,
            value,
        } => {
            let shown = match identity.kind {
                CommandKind::Now => "now=[time]".to_owned(),
                CommandKind::Random => "random=[random]".to_owned(),
                CommandKind::Uuid => "uuid=[uuid]".to_owned(),
                CommandKind::Patch => format!("patched {}", identity.name),
                CommandKind::Verdict => format!("verdict {} {}", identity.name, text(value)),
                _ => format!("{}={}", identity.name, text(value)),
            };
            format!("value_recorded      seq={seq} {shown}")
        }
        Entry::WorkflowCompleted { output } => {
            format!("workflow_completed  output={}", text(output))
        }
        Entry::WorkflowFailed { failure } => {
            format!("workflow_failed     {}", failure_text(failure))
        }
        Entry::StartedBy { caller } => format!("started_by          {caller}"),
        Entry::Forked(forked) => forked_text(forked),
        Entry::CancelRequested { failure } => {
            format!("cancel_requested    {}", failure_text(failure))
        }
        Entry::ActivityScheduledAt {
            seq,
            identity,
            input,
            idempotency_key,
            ..
        } => match idempotency_key {
            None if identity.kind == CommandKind::Retrieval => format!(
                "retrieval_scheduled seq={seq} {} input={}",
                identity.name,
                text(input)
            ),
            None => format!(
                "activity_scheduled  seq={seq} {} input={}",
                identity.name,
                text(input)
            ),
            Some(key) => format!(
                "effect_scheduled    seq={seq} {} key={key} input={}",
                identity.name,
                text(input)
            ),
        },
        Entry::EffectUncertain {
            seq,
            attempt,
            failure,
        } => format!(
            "effect_uncertain    seq={seq} attempt={attempt} {}",
            failure_text(failure)
        ),
        Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict,
        } => format!(
            "effect_reconciled   seq={seq} attempt={attempt} by={} {}",
            reconciled_by_text(by),
            verdict_text(verdict)
        ),
    }
}

pub(crate) fn reconciled_by_text(by: &ReconciledBy) -> String {
    match by {
        ReconciledBy::Reconciler => "reconciler".to_owned(),
        ReconciledBy::Operator(name) => format!("operator:{name}"),
        ReconciledBy::OperationLog => "operation_log".to_owned(),
        ReconciledBy::NoReconciler => "no_reconciler".to_owned(),
        ReconciledBy::Downstream(name) => format!("downstream:{name}"),
    }
}

fn verdict_text(verdict: &Reconciliation) -> String {
    match verdict {
        Reconciliation::Committed(output) => format!("committed output={}", text(output)),
        Reconciliation::NotFound => "not_found".to_owned(),
        Reconciliation::StillUnknown { message, .. } => {
            format!("still_unknown {message:?} recheck_at=[time]")
        }
        Reconciliation::AwaitingOperator { reason } => format!("awaiting_operator {reason:?}"),
        Reconciliation::Failed { message } => format!("failed {message:?}"),
    }
}

/// The payload's JSON, with measured durations (`latency_ms` fields, as model calls record)
/// redacted: they differ on every run.
fn text(payload: &Payload) -> String {
    let raw = String::from_utf8_lossy(payload.as_bytes());
    if !raw.contains("\"latency_ms\"") {
        return raw.into_owned();
    }
    match serde_json::from_slice::<serde_json::Value>(payload.as_bytes()) {
        Ok(mut value) => {
            redact_latency(&mut value);
            value.to_string()
        }
        Err(_) => raw.into_owned(),
    }
}

fn redact_latency(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                if key == "latency_ms" {
                    *field = serde_json::Value::String("[duration]".into());
                } else {
                    redact_latency(field);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact_latency),
        _ => {}
    }
}

fn failure_text(failure: &Failure) -> String {
    match failure.retry_after_ms {
        Some(ms) => format!(
            "{:?} {:?} retry_after={ms}ms",
            failure.kind, failure.message
        ),
        None => format!("{:?} {:?}", failure.kind, failure.message),
    }
}

fn forked_text(forked: &crate::journal::Forked) -> String {
    let pairs = |pairs: &[(String, String)]| {
        let shown = pairs.iter().map(|(a, b)| format!("{a}={b}"));
        shown.collect::<Vec<_>>().join(",")
    };
    format!(
        "forked              from={} at={} key_root={} key_roots=[{}] models=[{}] by={}",
        forked.source,
        forked.at,
        forked.key_root,
        pairs(&forked.key_roots),
        pairs(&forked.models),
        forked.by.as_deref().unwrap_or("-")
    )
}
