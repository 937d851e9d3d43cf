//! The machines driven by canned journals: entries in, what each settles and what the open
//! commands then need out, as readable transcripts (insta snapshots under `snapshots/`). And
//! the protocol decisions (retry or fail, call or reconcile, recheck or park, which request a
//! decision settles), each as a table of cases.

use std::fmt::Write as _;
use std::time::Duration;

use super::activity::{Activity, AfterFailure};
use super::approval::{self, Pending, Refused};
use super::effect::{self, AfterReconcile, Answer, FirstCall, NextCall, Reconciled};
use super::*;
use crate::artifacts::ApprovalVerdict;
use crate::inbox::InboxMessage;
use crate::journal::{
    ApprovalDecision, CommandIdentity, CommandKind, FailureKind, ReconciledBy, Reconciliation,
};
use crate::operations::{OperationRecord, OperationStatus};
use crate::options::{ActivityOptions, RetryPolicy};

fn identity(kind: CommandKind, name: &str) -> CommandIdentity {
    CommandIdentity::new(kind, name, &Payload::unit())
}

pub(super) fn scheduled(seq: Seq, name: &str) -> Entry {
    Entry::ActivityScheduledAt {
        seq,
        identity: identity(CommandKind::Activity, name),
        input: Payload::unit(),
        scheduled_at_ms: 1_000,
        idempotency_key: None,
    }
}

pub(super) fn effect_scheduled(seq: Seq, name: &str) -> Entry {
    Entry::ActivityScheduledAt {
        seq,
        identity: identity(CommandKind::Activity, name),
        input: Payload::unit(),
        scheduled_at_ms: 1_000,
        idempotency_key: Some(format!("wf|{name}|[]|v1")),
    }
}

fn failure(kind: FailureKind, message: &str) -> Failure {
    Failure::new(kind, message)
}

pub(super) fn attempt_failed(seq: Seq, attempt: u32, retry_at_ms: u64) -> Entry {
    Entry::ActivityAttemptFailed {
        seq,
        attempt,
        failure: failure(FailureKind::Retriable, "503"),
        retry_at_ms,
    }
}

pub(super) fn reconciled(
    seq: Seq,
    attempt: u32,
    by: ReconciledBy,
    verdict: Reconciliation,
) -> Entry {
    Entry::EffectReconciled {
        seq,
        attempt,
        by,
        verdict,
    }
}

fn still_unknown(recheck_at_ms: u64) -> Reconciliation {
    Reconciliation::StillUnknown {
        message: "cannot tell".into(),
        recheck_at_ms,
    }
}

fn timer(seq: Seq, fire_at_ms: u64) -> Entry {
    Entry::TimerStarted {
        seq,
        identity: identity(CommandKind::Timer, "sleep"),
        duration_ms: 500,
        fire_at_ms,
    }
}

fn approval_requested(seq: Seq, expires_at_ms: Option<u64>) -> Entry {
    Entry::ApprovalRequested {
        seq,
        identity: identity(CommandKind::Approval, "approval"),
        artifact_hash: Digest::of(b"plan"),
        risk: Payload::unit(),
        expires_at_ms,
    }
}

/// One line per entry: the entry, what it settled, and then every open command with what it
/// needs; `!` lines for an entry a machine refuses.
#[derive(Default)]
struct Transcript {
    commands: Commands,
    text: String,
}

impl Transcript {
    fn apply(mut self, entry: Entry) -> Self {
        let shown = show_entry(&entry);
        match self.commands.apply(&entry) {
            Ok(Some(settled)) => {
                let resolution = show_resolution(&settled.resolution);
                let _ = writeln!(
                    self.text,
                    "{shown}\n  settles {}: {resolution}",
                    settled.seq
                );
            }
            Ok(None) => {
                let _ = writeln!(self.text, "{shown}");
            }
            Err(conflict) => {
                let _ = writeln!(self.text, "{shown}\n  ! {conflict:?}");
            }
        }
        self.show_open();
        self
    }

    /// Something other than an entry happened (the code dropped a wait, a backoff ended).
    fn then(mut self, what: &str, happen: impl FnOnce(&mut Commands) -> String) -> Self {
        let outcome = happen(&mut self.commands);
        let _ = writeln!(self.text, "{what}: {outcome}");
        self.show_open();
        self
    }

    fn show_open(&mut self) {
        for (seq, state) in self.commands.open_commands() {
            let decision = self.commands.decision(seq);
            let decision = decision.map_or("waits for someone".to_owned(), |d| format!("{d:?}"));
            let _ = writeln!(self.text, "  open {seq}: {state:?} -> {decision}");
        }
        let dropped = self.commands.timers();
        let open_rows: Vec<Seq> = self
            .commands
            .open_commands()
            .iter()
            .map(|(s, _)| *s)
            .collect();
        for (seq, fire_at_ms) in dropped.into_iter().filter(|(s, _)| !open_rows.contains(s)) {
            let _ = writeln!(
                self.text,
                "  dropped {seq}: its row at {fire_at_ms} is to delete"
            );
        }
    }
}

fn show_entry(entry: &Entry) -> String {
    match entry {
        Entry::ActivityScheduledAt {
            seq,
            identity,
            idempotency_key,
            ..
        } => match idempotency_key {
            Some(key) => format!("{seq} effect {} scheduled under {key}", identity.name),
            None => format!("{seq} activity {} scheduled", identity.name),
        },
        Entry::ActivityAttemptFailed {
            seq,
            attempt,
            retry_at_ms,
            ..
        } => format!("{seq} attempt {attempt} failed, retry at {retry_at_ms}"),
        Entry::EffectReconciled {
            seq,
            attempt,
            by,
            verdict,
        } => format!("{seq} attempt {attempt} reconciled by {by:?}: {verdict:?}"),
        other => format!("{other:?}"),
    }
}

fn show_resolution(resolution: &Resolution) -> String {
    match resolution {
        Resolution::Completed(payload) => {
            format!("completed {}", String::from_utf8_lossy(payload.as_bytes()))
        }
        Resolution::Failed(failure) => format!("failed ({:?}) {}", failure.kind, failure.message),
        Resolution::Fired => "fired".to_owned(),
        Resolution::Snapshot(hash) => format!("snapshot {}", &hash.hex()[..12]),
    }
}

#[test]
fn an_activity_retries_then_completes() {
    let script = Transcript::default()
        .apply(scheduled(0, "search"))
        .apply(attempt_failed(0, 1, 1_200))
        .then("retry due", |c| format!("{:?}", c.start_retry(0)))
        .then("retry due again", |c| format!("{:?}", c.start_retry(0)))
        .apply(Entry::ActivityCompleted {
            seq: 0,
            attempt: 2,
            output: Payload::from_u64(7),
        });
    insta::assert_snapshot!(script.text);
}

#[test]
fn an_activity_fails_for_good_and_a_retrieval_completes_as_a_snapshot() {
    let script = Transcript::default()
        .apply(scheduled(0, "charge_preview"))
        .apply(Entry::ActivityFailed {
            seq: 0,
            attempt: 1,
            failure: failure(FailureKind::Terminal, "400 bad request"),
        })
        .apply(Entry::ActivityScheduledAt {
            seq: 1,
            identity: identity(CommandKind::Retrieval, "policies"),
            input: Payload::unit(),
            scheduled_at_ms: 1_000,
            idempotency_key: None,
        })
        .apply(Entry::SnapshotCompleted {
            seq: 1,
            attempt: 1,
            artifact: Digest::of(b"documents"),
        });
    insta::assert_snapshot!(script.text);
}

#[test]
fn an_unknown_outcome_is_rechecked_then_parked_then_settled_by_an_operator() {
    let script = Transcript::default()
        .apply(effect_scheduled(0, "rebook"))
        .apply(Entry::EffectUncertain {
            seq: 0,
            attempt: 1,
            failure: failure(FailureKind::Timeout, "start-to-close timeout"),
        })
        .apply(reconciled(
            0,
            1,
            ReconciledBy::Reconciler,
            still_unknown(2_000),
        ))
        .apply(reconciled(
            0,
            1,
            ReconciledBy::Reconciler,
            still_unknown(4_000),
        ))
        .apply(reconciled(
            0,
            1,
            ReconciledBy::Reconciler,
            Reconciliation::AwaitingOperator {
                reason: "3 checks".into(),
            },
        ))
        .apply(reconciled(
            0,
            1,
            ReconciledBy::Operator("ops@example.com".into()),
            Reconciliation::Committed(Payload::from_u64(42)),
        ));
    insta::assert_snapshot!(script.text);
}

#[test]
fn an_effect_found_not_done_retries_and_one_the_log_answers_is_settled_at_once() {
    let script = Transcript::default()
        .apply(effect_scheduled(0, "notify"))
        .apply(Entry::EffectUncertain {
            seq: 0,
            attempt: 1,
            failure: failure(FailureKind::Uncertain, "ack lost"),
        })
        .apply(reconciled(
            0,
            1,
            ReconciledBy::Reconciler,
            Reconciliation::NotFound,
        ))
        .apply(attempt_failed(0, 1, 3_000))
        .apply(effect_scheduled(1, "rebook"))
        .apply(reconciled(
            1,
            0,
            ReconciledBy::OperationLog,
            Reconciliation::Committed(Payload::from_u64(9)),
        ));
    insta::assert_snapshot!(script.text);
}

#[test]
fn timers_fire_or_are_dropped_with_their_rows() {
    let script = Transcript::default()
        .apply(timer(0, 5_000))
        .apply(timer(1, 9_000))
        .apply(Entry::TimerFired { seq: 0 })
        .then("the code drops its wait at 1", |c| {
            c.abandon(1, true);
            format!("to journal {:?}", c.take_dropped_waits())
        })
        .apply(Entry::WaitDropped { seq: 1 })
        .then("a wait issued and dropped in one poll (2)", |c| {
            c.abandon(2, true);
            format!("abandoned: {}", c.is_abandoned(2))
        })
        .apply(timer(2, 7_000));
    insta::assert_snapshot!(script.text);
}

#[test]
fn signals_and_approvals_settle_their_waits() {
    let decision = ApprovalDecision::Approved {
        approver: "alice".into(),
        at_ms: 1_500,
        expires_at_ms: Some(60_000),
    };
    let script = Transcript::default()
        .apply(Entry::SignalAwaited {
            seq: 0,
            identity: identity(CommandKind::Signal, "go"),
        })
        .apply(approval_requested(1, Some(60_000)))
        .apply(approval_requested(2, None))
        .apply(Entry::SignalReceived {
            seq: 0,
            signal_id: "s-1".into(),
            payload: Payload::from_u64(1),
        })
        .apply(Entry::ApprovalDecided { seq: 1, decision })
        .then("the code drops request 2", |c| {
            c.abandon(2, true);
            format!("to journal {:?}", c.take_dropped_waits())
        })
        .apply(Entry::WaitDropped { seq: 2 });
    insta::assert_snapshot!(script.text);
}

#[test]
fn values_and_artifacts_leave_nothing_open() {
    let script = Transcript::default()
        .apply(Entry::ValueRecorded {
            seq: 0,
            identity: identity(CommandKind::Now, "now"),
            value: Payload::from_u64(1_000),
        })
        .apply(Entry::ArtifactCommitted {
            seq: 1,
            identity: identity(CommandKind::Artifact, "plan"),
        })
        .apply(Entry::WorkflowCompleted {
            output: Payload::unit(),
        });
    insta::assert_snapshot!(script.text);
}

#[test]
fn entries_that_do_not_follow_are_refused() {
    let script = Transcript::default()
        .apply(Entry::ActivityCompleted {
            seq: 0,
            attempt: 1,
            output: Payload::unit(),
        })
        .apply(scheduled(1, "search"))
        .apply(Entry::EffectUncertain {
            seq: 1,
            attempt: 1,
            failure: failure(FailureKind::Uncertain, "ack lost"),
        })
        .apply(scheduled(1, "search"))
        .apply(attempt_failed(1, u32::MAX, 2_000))
        .apply(effect_scheduled(3, "rebook"))
        .apply(reconciled(
            3,
            1,
            ReconciledBy::Reconciler,
            still_unknown(2_000),
        ))
        .apply(Entry::ActivityCompleted {
            seq: 3,
            attempt: 2,
            output: Payload::unit(),
        })
        .apply(timer(2, 5_000))
        .apply(Entry::WaitDropped { seq: 2 });
    insta::assert_snapshot!(script.text);
}

fn options() -> ActivityOptions {
    ActivityOptions {
        retry: RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(100),
            backoff_coefficient: 2.0,
            max_backoff: Duration::from_secs(10),
        },
        start_to_close_timeout: None,
        deadline: Some(Duration::from_millis(1_000)),
    }
}

#[test]
fn after_a_failure_the_policy_the_hint_and_the_deadline_decide() {
    let activity = Activity::scheduled(Some(1_000), None);
    let retriable = failure(FailureKind::Retriable, "503");
    let hinted = Failure {
        retry_after_ms: Some(700),
        ..retriable.clone()
    };
    let cases = [
        ("retriable, attempt 1", 1, retriable.clone(), 1_000),
        ("retriable, hinted", 1, hinted, 1_000),
        ("retriable, last attempt", 3, retriable.clone(), 1_000),
        ("retriable, at the deadline", 1, retriable.clone(), 1_950),
        ("retriable, past the deadline", 1, retriable, 1_951),
        ("terminal", 1, failure(FailureKind::Terminal, "400"), 1_000),
    ];
    let mut text = String::new();
    for (case, attempt, failure, now_ms) in cases {
        let decided = activity.after_failure(&options(), attempt, failure, now_ms, 0);
        let shown = match decided {
            AfterFailure::Retry { retry_at_ms, .. } => format!("retry at {retry_at_ms}"),
            AfterFailure::Fail { failure } => format!("fail: {}", failure.message),
        };
        let _ = writeln!(text, "{case}: {shown}");
    }
    insta::assert_snapshot!(text);
}

fn record(status: OperationStatus) -> OperationRecord {
    OperationRecord {
        workflow_id: "wf".into(),
        seq: 0,
        operation: "rebook".into(),
        version: 1,
        arguments: Payload::unit(),
        preconditions: Vec::new(),
        attempt: 2,
        status,
        approval: None,
        external_ref: None,
        history: Vec::new(),
    }
}

fn statuses() -> Vec<(&'static str, Option<OperationRecord>)> {
    vec![
        ("nothing", None),
        ("prepared", Some(record(OperationStatus::Prepared))),
        (
            "unknown_outcome",
            Some(record(OperationStatus::UnknownOutcome {
                failure: failure(FailureKind::Timeout, "timeout"),
            })),
        ),
        (
            "awaiting_operator",
            Some(record(OperationStatus::AwaitingOperator {
                reason: "3 checks".into(),
            })),
        ),
        (
            "committed",
            Some(record(OperationStatus::Committed {
                result: Payload::from_u64(5),
                external_ref: None,
            })),
        ),
        (
            "failed_retriable",
            Some(record(OperationStatus::FailedRetriable {
                failure: failure(FailureKind::Retriable, "503"),
            })),
        ),
        (
            "failed_terminal",
            Some(record(OperationStatus::FailedTerminal {
                failure: failure(FailureKind::Terminal, "400"),
            })),
        ),
        (
            "not_attempted",
            Some(record(OperationStatus::NotAttempted {
                failure: failure(FailureKind::PreconditionFailed, "approval"),
            })),
        ),
    ]
}

/// A run that ends with an effect open leaves its record where someone can settle it: a call
/// that may have taken effect waits for an operator, one that failed and is not retried frees
/// its key for the intent, and a settled or waiting record stays as it is.
#[test]
fn a_run_that_ends_leaves_each_open_effect_settleable() {
    let left: Vec<(&str, Option<&str>)> = statuses()
        .into_iter()
        .filter_map(|(status, found)| {
            let left = effect::left_by_ended_run(&found?);
            Some((status, left.as_ref().map(OperationStatus::name)))
        })
        .collect();
    let expected = [
        ("prepared", Some("awaiting_operator")),
        ("unknown_outcome", Some("awaiting_operator")),
        ("awaiting_operator", None),
        ("committed", None),
        ("failed_retriable", Some("not_attempted")),
        ("failed_terminal", None),
        ("not_attempted", None),
    ];
    assert_eq!(left, expected);
    let freed = effect::left_by_ended_run(&record(OperationStatus::FailedRetriable {
        failure: failure(FailureKind::Retriable, "503"),
    }));
    let freed = record(freed.unwrap());
    assert_eq!(
        freed.status.note(),
        "the run ended before retrying `rebook`; attempt 2 had failed definitely: 503"
    );
    let again = effect::first_call(3, "k", &Payload::unit(), Some(&freed), false);
    assert_eq!(show_first_call(again), "prepare and call");
    let in_flight = effect::left_by_ended_run(&record(OperationStatus::Prepared));
    assert_eq!(
        in_flight.unwrap().note(),
        "the run ended while attempt 2 of `rebook` was in flight, and nothing reconciles it \
         now: did it take effect?"
    );
}

/// Whatever the log holds, an effect calls only where no earlier call can have taken effect:
/// never for `prepared` or `unknown_outcome` (reconciled), `awaiting_operator` (parked), or an
/// outcome the log has (answered from it); and a new command under a key the log holds with
/// other arguments is a key conflict, never the earlier call's result. A record an earlier
/// run left is taken over by the command that issues its intent again, and goes on as its
/// next attempt would.
#[test]
fn the_operation_log_decides_whether_an_effect_may_call() {
    let mut text = String::new();
    for (status, found) in statuses() {
        let first_call = |arguments: &Payload, left_by_earlier_run| {
            let first = effect::first_call(3, "k", arguments, found.as_ref(), left_by_earlier_run);
            show_first_call(first)
        };
        let first = first_call(&Payload::unit(), false);
        let other_arguments = Payload::from_u64(1);
        let conflicting = first_call(&other_arguments, false);
        let left_earlier = first_call(&Payload::unit(), true);
        let next = match effect::next_call(3, "k", found.as_ref()) {
            NextCall::Prepare { .. } => "prepare and call".to_owned(),
            NextCall::Reconcile { attempt, .. } => format!("reconcile attempt {attempt}"),
            NextCall::AwaitOperator { attempt, .. } => format!("await operator, attempt {attempt}"),
            NextCall::Answered(entry) => format!("answered: {}", show_entry(&entry)),
        };
        let _ = writeln!(
            text,
            "{status}:\n  new command: {first}\n  new command, other arguments: {conflicting}\n  \
             new command, record left by an earlier run: {left_earlier}\n  next attempt: {next}"
        );
    }
    insta::assert_snapshot!(text);
}

fn show_first_call(first: FirstCall) -> String {
    match first {
        FirstCall::Prepare => "prepare and call".to_owned(),
        FirstCall::Answered(entry) => format!("answered: {}", show_entry(&entry)),
        FirstCall::KeyConflict(entry) => format!("key conflict: {}", show_entry(&entry)),
        FirstCall::TakeOver { taken, next } => {
            let next = match next {
                NextCall::Reconcile { attempt, failure } => {
                    format!("reconcile attempt {attempt} ({})", failure.message)
                }
                NextCall::AwaitOperator { attempt, .. } => {
                    format!("await operator, attempt {attempt}")
                }
                other => format!("{other:?}"),
            };
            format!(
                "take over as seq {}, {}: {next}",
                taken.seq,
                taken.status.name()
            )
        }
    }
}

#[test]
fn a_reconciler_that_cannot_tell_is_asked_a_bounded_number_of_times() {
    let policy = options().retry;
    let mut text = String::new();
    let answers = [
        ("no reconciler", 0, Answer::NoReconciler),
        ("committed", 0, Answer::Committed(Payload::from_u64(5))),
        ("not found", 0, Answer::NotFound),
        ("cannot tell, first", 0, Answer::CannotTell("503".into())),
        ("cannot tell, second", 1, Answer::CannotTell("503".into())),
        ("cannot tell, third", 2, Answer::CannotTell("503".into())),
    ];
    for (case, checks, answer) in answers {
        let reconciled = Reconciled {
            name: "rebook",
            attempt: 1,
            checks,
            policy: &policy,
            now_ms: 10_000,
        };
        let shown = match reconciled.after(answer, |_| 0) {
            AfterReconcile::Commit(output) => format!("commit {output:?}"),
            AfterReconcile::Retry(failure) => format!("retry after: {}", failure.message),
            AfterReconcile::Recheck {
                checks,
                recheck_at_ms,
                ..
            } => format!("recheck at {recheck_at_ms} ({checks} checks)"),
            AfterReconcile::AwaitOperator { by, reason } => {
                format!("await operator ({by:?}): {reason}")
            }
        };
        let _ = writeln!(text, "{case}: {shown}");
    }
    insta::assert_snapshot!(text);
}

#[test]
fn an_operator_decides_only_the_attempt_whose_outcome_is_unknown() {
    let parked = Some(CommandState::AwaitingOperator { attempt: 2 });
    assert_eq!(effect::operator_attempt(parked, Some(2)), Ok(2));
    let stale = effect::operator_attempt(parked, Some(1));
    assert_eq!(
        stale,
        Err(effect::OperatorRefusal::StaleAttempt { current: 2 })
    );
    let running = Some(CommandState::Running { attempt: 2 });
    let refused = effect::operator_attempt(running, Some(2));
    assert_eq!(refused, Err(effect::OperatorRefusal::NotAwaiting));
}

#[test]
fn a_decision_settles_only_the_request_for_its_artifact() {
    let plan = Digest::of(b"plan");
    let changed = Digest::of(b"changed plan");
    let pending = [
        Pending {
            seq: 4,
            artifact_hash: plan,
            expires_at_ms: Some(10_000),
        },
        Pending {
            seq: 6,
            artifact_hash: changed,
            expires_at_ms: None,
        },
    ];
    let settled = |hash, request| approval::settled_request(&pending, hash, request);
    assert_eq!(settled(changed, None).map(|p| p.seq), Ok(6));
    assert_eq!(settled(plan, Some(4)).map(|p| p.seq), Ok(4));
    let stale = settled(plan, Some(6));
    assert_eq!(
        stale,
        Err(Refused::StaleRequest {
            given: 6,
            pending: 4
        })
    );
    let other = settled(Digest::of(b"something else"), None);
    assert_eq!(other, Err(Refused::HashMismatch { pending: plan }));
    let none = approval::settled_request(&[], plan, None);
    assert_eq!(none, Err(Refused::NotPending));

    let approve = |now_ms| approval::decision(&pending[0], ApprovalVerdict::Approve, "al", now_ms);
    assert!(matches!(
        approve(9_999),
        Ok(ApprovalDecision::Approved { .. })
    ));
    assert_eq!(approve(10_000), Err(approval::Expired { at_ms: 10_000 }));
}

fn message(name: &str) -> InboxMessage {
    InboxMessage {
        name: name.to_owned(),
        signal_id: format!("{name}-id"),
        payload: Payload::unit(),
        sent_at_ms: 0,
        sender: None,
    }
}

fn unread(arrivals: &[(u64, &str)]) -> signal::Unread {
    let messages = arrivals
        .iter()
        .map(|(arrival, name)| (*arrival, message(name)));
    messages.collect()
}

#[test]
fn the_oldest_wait_for_a_name_takes_the_oldest_signal_of_that_name() {
    let listeners = [(2, "approve"), (5, "go"), (7, "go")];
    let held = unread(&[(12, "approve"), (10, "other"), (13, "go"), (11, "go")]);
    assert_eq!(held.next_delivery(&listeners), Some((11, 5)));
    assert_eq!(unread(&[(10, "other")]).next_delivery(&listeners), None);
    assert_eq!(
        held.next_delivery(&[(7, "go"), (9, "approve")]),
        Some((11, 7))
    );
    assert_eq!(held.next_delivery(&[]), None);
}

/// Taking a signal, or reading one number again, leaves the choice to the signals held.
#[test]
fn a_signal_taken_or_read_again_leaves_the_others_to_choose_from() {
    let listeners = [(2, "approve"), (5, "go")];
    let mut held = unread(&[(10, "other"), (11, "go"), (12, "approve"), (13, "go")]);
    assert_eq!(held.remove(11).map(|m| m.name), Some("go".to_owned()));
    assert_eq!(held.remove(11), None);
    assert_eq!(held.next_delivery(&listeners), Some((12, 2)));
    held.insert(12, message("other"));
    assert_eq!(held.next_delivery(&listeners), Some((13, 5)));
    assert_eq!(held.remove(13).map(|m| m.name), Some("go".to_owned()));
    assert_eq!(held.next_delivery(&listeners), None);
    assert_eq!(held.len(), 2);
}

/// What the executor needs to resume a run comes from the journal alone, in seq order.
#[test]
fn a_folded_journal_says_what_to_resume() {
    let journal = [
        scheduled(0, "search"),
        attempt_failed(0, 1, 1_200),
        effect_scheduled(1, "rebook"),
        Entry::EffectUncertain {
            seq: 1,
            attempt: 1,
            failure: failure(FailureKind::Uncertain, "ack lost"),
        },
        timer(2, 5_000),
        approval_requested(3, Some(8_000)),
        scheduled(4, "draft"),
        // A sleep the code dropped: no code runs to drop it here, the entry does.
        timer(5, 9_000),
        Entry::WaitDropped { seq: 5 },
    ];
    let (commands, passed_over) = Commands::fold(&journal);
    assert_eq!(passed_over, []);
    let decisions = commands.decisions();
    let expected = vec![
        Decision::RetryAt {
            seq: 0,
            at_ms: 1_200,
        },
        Decision::Reconcile {
            seq: 1,
            attempt: 1,
            checks: 0,
            at_ms: 0,
        },
        Decision::Arm {
            seq: 2,
            fire_at_ms: 5_000,
        },
        Decision::Arm {
            seq: 3,
            fire_at_ms: 8_000,
        },
        Decision::Attempt { seq: 4, attempt: 1 },
    ];
    assert_eq!(decisions, expected);
    assert_eq!(commands.timers(), vec![(2, 5_000), (3, 8_000)]);
}

#[test]
fn an_at_most_once_effect_leaves_every_failure_but_a_refusal_unknown() {
    let kinds = [
        FailureKind::Retriable,
        FailureKind::Terminal,
        FailureKind::Uncertain,
        FailureKind::Timeout,
        FailureKind::Panicked,
        FailureKind::PreconditionFailed,
        FailureKind::KeyConflict,
        FailureKind::NotApproved,
    ];
    let unknown = |at_most_once| -> Vec<bool> {
        let failures = kinds.iter().map(|kind| failure(*kind, "cause"));
        failures
            .map(|f| effect::outcome_unknown(&f, at_most_once))
            .collect()
    };
    let definite = [false, false, false];
    assert_eq!(unknown(false)[..5], [false, false, true, true, true]);
    assert_eq!(unknown(true)[..5], [true, false, true, true, true]);
    assert_eq!(
        unknown(true)[5..],
        definite,
        "refusals the activity reported are definite"
    );
}

/// The forms the executor journals now (with the write's time) drive the machines exactly as
/// the untimed forms older journals hold.
#[test]
fn the_timed_forms_drive_the_machines_as_the_untimed_ones() {
    let journal = vec![
        scheduled(0, "search"),
        Entry::ActivityCompleted {
            seq: 0,
            attempt: 1,
            output: Payload::from_u64(7),
        },
        scheduled(1, "book"),
        Entry::ActivityFailed {
            seq: 1,
            attempt: 1,
            failure: failure(FailureKind::Terminal, "refused"),
        },
        scheduled(2, "policies"),
        Entry::SnapshotCompleted {
            seq: 2,
            attempt: 1,
            artifact: Digest::of(b"snapshot"),
        },
        timer(3, 5_000),
        Entry::TimerFired { seq: 3 },
        Entry::SignalAwaited {
            seq: 4,
            identity: identity(CommandKind::Signal, "go"),
        },
        Entry::SignalReceived {
            seq: 4,
            signal_id: "s-1".into(),
            payload: Payload::from_u64(1),
        },
        Entry::SignalAwaited {
            seq: 5,
            identity: identity(CommandKind::Signal, "go"),
        },
        Entry::SignalReceivedFrom {
            seq: 5,
            signal_id: "s-2".into(),
            payload: Payload::from_u64(2),
            sender: "dana".into(),
        },
        approval_requested(6, Some(9_000)),
    ];
    let timed: Vec<Entry> = journal.iter().cloned().map(|e| e.with_time(42)).collect();
    let stamped = timed.iter().filter(|e| e.journaled_at() == Some(42));
    assert_eq!(stamped.count(), 9, "every untimed form has a timed one");
    let run = |entries: &[Entry]| {
        let mut commands = Commands::default();
        let outcomes: Vec<String> = entries
            .iter()
            .map(|entry| match commands.apply(entry) {
                Ok(settled) => format!(
                    "{:?}",
                    settled.map(|s| (s.seq, show_resolution(&s.resolution)))
                ),
                Err(conflict) => format!("! {conflict:?}"),
            })
            .collect();
        (outcomes, commands.decisions(), commands.timers())
    };
    let untimed_run = run(&journal);
    assert!(
        untimed_run.0.iter().all(|o| !o.starts_with('!')),
        "{untimed_run:?}"
    );
    assert_eq!(run(&timed), untimed_run);
}

/// What a run says it waits for, when it waits for several: an operator before a person, a
/// person before a signal, whatever order the waits were opened in.
#[test]
fn a_run_waits_first_for_an_operator_then_a_person_then_a_signal() {
    let waits = [
        Entry::SignalAwaited {
            seq: 0,
            identity: identity(CommandKind::Signal, "go"),
        },
        approval_requested(1, None),
        effect_scheduled(2, "rebook"),
        Entry::EffectUncertain {
            seq: 2,
            attempt: 1,
            failure: failure(FailureKind::Timeout, "start-to-close timeout"),
        },
        reconciled(
            2,
            1,
            ReconciledBy::Reconciler,
            Reconciliation::AwaitingOperator {
                reason: "3 checks".into(),
            },
        ),
    ];
    let waiting_after = |entries: &[Entry]| {
        let mut commands = Commands::default();
        for entry in entries {
            commands.apply(entry).unwrap();
        }
        commands.waiting_for()
    };
    assert_eq!(waiting_after(&[]), None);
    assert_eq!(waiting_after(&waits[..1]), Some(WaitingFor::Signal));
    assert_eq!(waiting_after(&waits[..2]), Some(WaitingFor::Approval));
    assert_eq!(waiting_after(&waits[1..2]), Some(WaitingFor::Approval));
    assert_eq!(waiting_after(&waits), Some(WaitingFor::Operator));
    let operator_first = [&waits[2..], &waits[..2]].concat();
    assert_eq!(waiting_after(&operator_first), Some(WaitingFor::Operator));
}
