//! The cursor driven by canned journals: each is a small function with what it records.

use super::*;
use crate::journal::{CommandKind, Failure, FailureKind, Reconciliation};
use crate::machines::signal::signal_identity;
use crate::machines::timer::timer_identity;
use crate::machines::value::value_identity;
use crate::machines::{CommandState, DroppedWait};

/// The cursor with the commands' machines it walks the journal into, as the core holds them.
struct Replay {
    cursor: ReplayCursor,
    commands: Commands,
}

impl Replay {
    fn new(entries: Vec<Entry>) -> Self {
        let cursor = ReplayCursor::new(entries);
        let commands = Commands::default();
        Self { cursor, commands }
    }

    fn issue(&mut self, identity: CommandIdentity) -> Result<Issued, Box<Divergence>> {
        self.cursor.issue(&identity)
    }

    fn patched(&mut self, identity: CommandIdentity) -> Result<Option<Issued>, Box<Divergence>> {
        self.cursor.patched(&identity)
    }

    fn next_replay_event(&mut self) -> Result<Option<ReplayEvent>, ReplayFault> {
        self.cursor.next_replay_event(&mut self.commands)
    }

    /// The code dropped its wait at `seq`, as `WorkflowCore::abandon_wait` tells both.
    fn abandon(&mut self, seq: Seq) {
        self.forget(seq);
        let issued = seq < self.cursor.issued();
        self.commands.abandon(seq, issued);
    }

    /// The outcome of `seq` was delivered.
    fn forget(&mut self, seq: Seq) {
        self.cursor.forget(seq);
        self.commands.forget(seq);
    }

    fn is_replaying(&self) -> bool {
        self.cursor.is_replaying()
    }

    fn divergence(&self) -> Option<&Divergence> {
        self.cursor.divergence()
    }

    fn unresolved(&self) -> Vec<(Seq, CommandState)> {
        self.commands.open_commands()
    }

    fn footprint(&self) -> (usize, usize) {
        let (open, kept) = self.commands.footprint();
        (open, kept + self.cursor.footprint())
    }
}

fn activity(name: &str, input: u64) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Activity, name, &Payload::from_u64(input))
}

fn scheduled(seq: Seq, name: &str, input: u64) -> Entry {
    Entry::ActivityScheduled {
        seq,
        identity: activity(name, input),
        input: Payload::from_u64(input),
    }
}

fn completed(seq: Seq, output: u64) -> Entry {
    Entry::ActivityCompleted {
        seq,
        attempt: 1,
        output: Payload::from_u64(output),
    }
}

/// `a(1)` then `b(2)`, both completed.
fn two_steps() -> Vec<Entry> {
    vec![
        scheduled(0, "a", 1),
        completed(0, 10),
        scheduled(1, "b", 2),
        completed(1, 20),
    ]
}

/// `join!(a(1), b(2))` where `b` finished first.
fn joined_b_first() -> Vec<Entry> {
    vec![
        scheduled(0, "a", 1),
        scheduled(1, "b", 2),
        completed(1, 20),
        completed(0, 10),
    ]
}

#[test]
fn recorded_commands_are_not_executed_again() {
    let mut cursor = Replay::new(two_steps());
    assert!(cursor.is_replaying());
    let first = cursor.issue(activity("a", 1));
    assert_eq!(
        first,
        Ok(Issued::Recorded {
            seq: 0,
            value: None
        })
    );
    let event = cursor.next_replay_event().unwrap();
    assert_eq!(
        event,
        Some(ReplayEvent::Resolve {
            seq: 0,
            resolution: Resolution::Completed(Payload::from_u64(10))
        })
    );
    assert_eq!(
        cursor.issue(activity("b", 2)),
        Ok(Issued::Recorded {
            seq: 1,
            value: None
        })
    );
    assert!(matches!(cursor.next_replay_event(), Ok(Some(_))));
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert!(!cursor.is_replaying());
    assert_eq!(cursor.issue(activity("c", 3)), Ok(Issued::New { seq: 2 }));
}

/// A replayed step's span names the recorded command when its outcome is delivered, after its
/// entry was walked: the identity goes from the entry to the cursor, and leaves on delivery.
#[test]
fn a_walked_command_is_named_until_its_outcome_is_delivered() {
    let mut cursor = Replay::new(joined_b_first());
    cursor.issue(activity("a", 1)).unwrap();
    cursor.issue(activity("b", 2)).unwrap();
    let first = cursor.next_replay_event().unwrap();
    assert!(matches!(first, Some(ReplayEvent::Resolve { seq: 1, .. })));
    // Both scheduled entries are walked; neither outcome is delivered yet.
    assert_eq!(cursor.cursor.recorded_identity(0), Some(&activity("a", 1)));
    assert_eq!(cursor.cursor.recorded_identity(1), Some(&activity("b", 2)));
    cursor.forget(1);
    assert_eq!(cursor.cursor.recorded_identity(1), None);
    assert_eq!(cursor.cursor.recorded_identity(0), Some(&activity("a", 1)));
}

/// A crafted journal recording one seq twice is compared with its last entry, as it always
/// was, and that entry's identity is what the walk keeps.
#[test]
fn a_seq_recorded_twice_is_named_by_its_last_entry() {
    let journal = vec![scheduled(0, "a", 1), scheduled(0, "b", 2), completed(0, 10)];
    let mut cursor = Replay::new(journal);
    assert!(matches!(
        cursor.issue(activity("b", 2)),
        Ok(Issued::Recorded { .. })
    ));
    let walked = cursor.next_replay_event();
    assert!(walked.is_err(), "scheduled twice: {walked:?}");
    assert_eq!(cursor.cursor.recorded_identity(0), Some(&activity("b", 2)));
}

#[test]
fn completions_are_delivered_in_journal_order_not_seq_order() {
    let mut cursor = Replay::new(joined_b_first());
    cursor.issue(activity("a", 1)).unwrap();
    cursor.issue(activity("b", 2)).unwrap();
    let order: Vec<Seq> = std::iter::from_fn(|| match cursor.next_replay_event().unwrap() {
        Some(ReplayEvent::Resolve { seq, .. }) => Some(seq),
        _ => None,
    })
    .collect();
    assert_eq!(order, vec![1, 0]);
}

#[test]
fn a_different_activity_at_a_recorded_seq_is_a_divergence() {
    let mut cursor = Replay::new(two_steps());
    cursor.issue(activity("a", 1)).unwrap();
    cursor.next_replay_event().unwrap();
    let divergence = cursor.issue(activity("charge", 2)).unwrap_err();
    assert_eq!(divergence.seq, 1);
    assert_eq!(divergence.recorded, Some(activity("b", 2)));
    assert_eq!(divergence.issued, Some(activity("charge", 2)));
    let message = divergence.to_string();
    assert!(
        message.contains("[WM0001] non-determinism at seq 1"),
        "{message}"
    );
    assert!(message.contains("ctx.patched"), "{message}");
}

#[test]
fn a_different_input_is_a_divergence() {
    let mut cursor = Replay::new(two_steps());
    let divergence = cursor.issue(activity("a", 999)).unwrap_err();
    assert_eq!(divergence.seq, 0);
}

#[test]
fn divergence_is_sticky() {
    let mut cursor = Replay::new(two_steps());
    let first = cursor.issue(activity("x", 1)).unwrap_err();
    assert_eq!(cursor.issue(activity("a", 1)), Err(first.clone()));
    let fault = ReplayFault::Diverged(first.clone());
    assert_eq!(cursor.next_replay_event(), Err(fault));
    assert_eq!(cursor.divergence(), Some(&*first));
}

#[test]
fn a_recorded_command_the_code_no_longer_issues_is_a_divergence() {
    let mut cursor = Replay::new(two_steps());
    cursor.issue(activity("a", 1)).unwrap();
    cursor.next_replay_event().unwrap();
    // The code returns after `a` instead of calling `b`.
    let ReplayFault::Diverged(divergence) = cursor.next_replay_event().unwrap_err() else {
        panic!("a divergence");
    };
    assert_eq!(divergence.seq, 1);
    assert_eq!(divergence.recorded, Some(activity("b", 2)));
    assert_eq!(divergence.issued, None);
}

#[test]
fn a_different_timer_duration_is_a_divergence() {
    let journal = vec![Entry::TimerStarted {
        seq: 0,
        identity: timer_identity(1_000),
        duration_ms: 1_000,
        fire_at_ms: 5_000,
    }];
    let mut cursor = Replay::new(journal);
    let divergence = cursor.issue(timer_identity(2_000)).unwrap_err();
    assert_eq!(
        divergence.recorded.map(|r| r.kind),
        Some(CommandKind::Timer)
    );
}

#[test]
fn recorded_values_are_returned() {
    let identity = value_identity(CommandKind::Random, "random");
    let journal = vec![Entry::ValueRecorded {
        seq: 0,
        identity: identity.clone(),
        value: Payload::from_u64(42),
    }];
    let mut cursor = Replay::new(journal.clone());
    assert_eq!(
        cursor.issue(identity),
        Ok(Issued::Recorded {
            seq: 0,
            value: Some(Payload::from_u64(42))
        })
    );
    let now = value_identity(CommandKind::Now, "now");
    let mut changed = Replay::new(journal);
    assert!(
        changed.issue(now).is_err(),
        "a now() where random() was recorded"
    );
}

#[test]
fn patched_is_false_on_old_journals_and_takes_no_seq() {
    let patch = value_identity(CommandKind::Patch, "new-pricing");
    let mut cursor = Replay::new(two_steps());
    assert_eq!(cursor.patched(patch.clone()), Ok(None));
    assert_eq!(
        cursor.issue(activity("a", 1)),
        Ok(Issued::Recorded {
            seq: 0,
            value: None
        })
    );
}

#[test]
fn patched_is_true_on_new_runs_and_on_journals_with_the_marker() {
    let patch = value_identity(CommandKind::Patch, "new-pricing");
    let mut fresh = Replay::new(Vec::new());
    assert_eq!(
        fresh.patched(patch.clone()),
        Ok(Some(Issued::New { seq: 0 }))
    );
    let marked = vec![Entry::ValueRecorded {
        seq: 0,
        identity: patch.clone(),
        value: Payload::unit(),
    }];
    let mut replaying = Replay::new(marked);
    assert!(matches!(
        replaying.patched(patch),
        Ok(Some(Issued::Recorded { seq: 0, .. }))
    ));
}

#[test]
fn unresolved_commands_are_reported_after_replay() {
    let journal = vec![
        scheduled(0, "a", 1),
        Entry::ActivityAttemptFailed {
            seq: 0,
            attempt: 1,
            failure: Failure::new(FailureKind::Retriable, "503"),
            retry_at_ms: 700,
        },
        Entry::TimerStarted {
            seq: 1,
            identity: timer_identity(50),
            duration_ms: 50,
            fire_at_ms: 90,
        },
        scheduled(2, "c", 3),
    ];
    let mut cursor = Replay::new(journal);
    for identity in [activity("a", 1), timer_identity(50), activity("c", 3)] {
        cursor.issue(identity).unwrap();
    }
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert_eq!(
        cursor.unresolved(),
        vec![
            (
                0,
                CommandState::Backoff {
                    next_attempt: 2,
                    retry_at_ms: 700
                }
            ),
            (1, CommandState::Waiting { fire_at_ms: 90 }),
            (2, CommandState::Running { attempt: 1 }),
        ]
    );
}

#[test]
fn completions_are_fenced_by_attempt() {
    let failed = Entry::ActivityAttemptFailed {
        seq: 0,
        attempt: 1,
        failure: Failure::new(FailureKind::Timeout, "start-to-close timeout"),
        retry_at_ms: 100,
    };
    let mut cursor = Replay::new(vec![scheduled(0, "a", 1)]);
    cursor.issue(activity("a", 1)).unwrap();
    assert_eq!(cursor.next_replay_event(), Ok(None));
    let commands = &mut cursor.commands;
    assert!(commands.is_current_attempt(0, 1));
    commands.apply(&failed).unwrap();
    assert!(!commands.is_current_attempt(0, 1), "attempt 1 timed out");
    assert_eq!(commands.start_retry(0), Some(2));
    assert_eq!(commands.start_retry(0), None, "a duplicate retry signal");
    assert!(
        !commands.is_current_attempt(0, 1),
        "late answer of attempt 1"
    );
    assert!(commands.is_current_attempt(0, 2));
    commands.apply(&completed_by(0, 2, 20)).unwrap();
    assert!(
        !commands.is_current_attempt(0, 2),
        "settled commands take nothing"
    );
}

fn completed_by(seq: Seq, attempt: u32, output: u64) -> Entry {
    Entry::ActivityCompleted {
        seq,
        attempt,
        output: Payload::from_u64(output),
    }
}

#[test]
fn the_recorded_end_is_reported() {
    let mut journal = two_steps();
    journal.push(Entry::WorkflowCompleted {
        output: Payload::from_u64(30),
    });
    let mut cursor = Replay::new(journal);
    cursor.issue(activity("a", 1)).unwrap();
    cursor.next_replay_event().unwrap();
    cursor.issue(activity("b", 2)).unwrap();
    cursor.next_replay_event().unwrap();
    assert!(matches!(
        cursor.next_replay_event(),
        Ok(Some(ReplayEvent::Ended(Ok(_))))
    ));
}

fn effect_scheduled(seq: Seq, key: &str) -> Entry {
    Entry::ActivityScheduledAt {
        seq,
        identity: activity("rebook", 7),
        input: Payload::from_u64(7),
        scheduled_at_ms: 1_000,
        idempotency_key: Some(key.to_owned()),
    }
}

fn reconciled(seq: Seq, verdict: Reconciliation) -> Entry {
    Entry::EffectReconciled {
        seq,
        attempt: 1,
        by: crate::journal::ReconciledBy::Reconciler,
        verdict,
    }
}

fn uncertain(seq: Seq) -> Entry {
    Entry::EffectUncertain {
        seq,
        attempt: 1,
        failure: Failure::new(FailureKind::Uncertain, "ack lost"),
    }
}

/// Walks `journal` after issuing `rebook(7)` at seq 0, collecting what it delivers.
fn walk_effect(journal: Vec<Entry>) -> (Replay, Vec<ReplayEvent>) {
    let mut cursor = Replay::new(journal);
    cursor.issue(activity("rebook", 7)).unwrap();
    let mut events = Vec::new();
    while let Some(event) = cursor.next_replay_event().unwrap() {
        events.push(event);
    }
    (cursor, events)
}

#[test]
fn an_effect_keeps_the_key_and_time_it_was_scheduled_with() {
    let (cursor, events) = walk_effect(vec![effect_scheduled(0, "wf|rebook|[7]|v1")]);
    assert!(events.is_empty());
    let effect = cursor.commands.activity(0).unwrap();
    assert_eq!(effect.idempotency_key(), Some("wf|rebook|[7]|v1"));
    assert_eq!(effect.scheduled_at_ms(), Some(1_000));
    assert_eq!(
        cursor.unresolved(),
        vec![(0, CommandState::Running { attempt: 1 })]
    );
}

#[test]
fn an_unknown_outcome_resumes_reconciling_with_its_checks_counted() {
    let still_unknown = Reconciliation::StillUnknown {
        message: "503".into(),
        recheck_at_ms: 5_000,
    };
    let journal = vec![
        effect_scheduled(0, "k"),
        uncertain(0),
        reconciled(0, still_unknown.clone()),
        reconciled(0, still_unknown),
    ];
    let (cursor, events) = walk_effect(journal);
    assert!(events.is_empty());
    let reconciling = CommandState::Reconciling {
        attempt: 1,
        checks: 2,
        recheck_at_ms: 5_000,
    };
    assert_eq!(cursor.unresolved(), vec![(0, reconciling)]);
}

#[test]
fn a_parked_effect_stays_parked_and_a_committed_verdict_is_delivered() {
    let parked = Reconciliation::AwaitingOperator {
        reason: "no reconciler".into(),
    };
    let journal = vec![
        effect_scheduled(0, "k"),
        uncertain(0),
        reconciled(0, parked),
    ];
    let (cursor, _) = walk_effect(journal.clone());
    let waiting = CommandState::AwaitingOperator { attempt: 1 };
    assert_eq!(cursor.unresolved(), vec![(0, waiting)]);

    let mut settled = journal;
    settled.push(reconciled(
        0,
        Reconciliation::Committed(Payload::from_u64(70)),
    ));
    let (cursor, events) = walk_effect(settled);
    let resolution = Resolution::Completed(Payload::from_u64(70));
    assert_eq!(events, vec![ReplayEvent::Resolve { seq: 0, resolution }]);
    assert!(cursor.unresolved().is_empty());
}

#[test]
fn not_found_leaves_the_retry_to_the_next_entry() {
    let journal = vec![
        effect_scheduled(0, "k"),
        uncertain(0),
        reconciled(0, Reconciliation::NotFound),
        Entry::ActivityAttemptFailed {
            seq: 0,
            attempt: 1,
            failure: Failure::new(FailureKind::Retriable, "did not take effect"),
            retry_at_ms: 9_000,
        },
    ];
    let (cursor, events) = walk_effect(journal);
    assert!(events.is_empty());
    let backoff = CommandState::Backoff {
        next_attempt: 2,
        retry_at_ms: 9_000,
    };
    assert_eq!(cursor.unresolved(), vec![(0, backoff)]);
}

fn timer(seq: Seq, fire_at_ms: u64) -> Entry {
    Entry::TimerStarted {
        seq,
        identity: timer_identity(1_000),
        duration_ms: 1_000,
        fire_at_ms,
    }
}

fn signal_awaited(seq: Seq, name: &str) -> Entry {
    Entry::SignalAwaited {
        seq,
        identity: signal_identity(name),
    }
}

/// On replay the code drops a wait before the walk reaches its entry (the drop happened in
/// the poll that issued it): the wait never opens, and a dropped timer is to be cancelled.
#[test]
fn a_wait_dropped_before_its_entry_is_walked_never_opens() {
    let mut cursor = Replay::new(vec![signal_awaited(0, "go"), timer(1, 5_000)]);
    cursor.issue(signal_identity("go")).unwrap();
    cursor.issue(timer_identity(1_000)).unwrap();
    cursor.abandon(0);
    cursor.abandon(1);
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert_eq!(cursor.unresolved(), []);
    assert!(
        cursor.commands.listeners().is_empty(),
        "the dropped wait takes no signal"
    );
    let dropped = DroppedWait {
        seq: 1,
        fire_at_ms: Some(5_000),
    };
    assert_eq!(cursor.commands.take_dropped_waits(), [dropped]);
}

/// A journaled drop settles the timer: the code drops it again on replay (in the poll after
/// the signal that won), and the drop is not journaled a second time.
#[test]
fn a_journaled_drop_is_not_repeated() {
    let received = Entry::SignalReceived {
        seq: 1,
        signal_id: "s-1".into(),
        payload: Payload::unit(),
    };
    let journal = vec![
        timer(0, 5_000),
        signal_awaited(1, "go"),
        received,
        Entry::WaitDropped { seq: 0 },
    ];
    let mut cursor = Replay::new(journal);
    cursor.issue(timer_identity(1_000)).unwrap();
    cursor.issue(signal_identity("go")).unwrap();
    let won = cursor.next_replay_event().unwrap();
    assert!(
        matches!(won, Some(ReplayEvent::Resolve { seq: 1, .. })),
        "{won:?}"
    );
    cursor.abandon(0);
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert!(!cursor.commands.has_dropped_waits());
    assert_eq!(cursor.unresolved(), []);
}

/// Live, a timer can fire (journaled, row deleted) before the code drops its wait, when an
/// outcome journaled before it made the code drop it: the firing went nowhere, and no drop was
/// journaled. On replay the code drops the wait first; the firing then goes nowhere too, and
/// no drop is journaled.
#[test]
fn an_outcome_of_a_wait_dropped_before_it_was_walked_goes_nowhere() {
    let received = Entry::SignalReceived {
        seq: 1,
        signal_id: "s-1".into(),
        payload: Payload::unit(),
    };
    let journal = vec![
        timer(0, 5_000),
        signal_awaited(1, "go"),
        received,
        Entry::TimerFired { seq: 0 },
    ];
    let mut cursor = Replay::new(journal);
    cursor.issue(timer_identity(1_000)).unwrap();
    cursor.issue(signal_identity("go")).unwrap();
    let won = cursor.next_replay_event().unwrap();
    assert!(
        matches!(won, Some(ReplayEvent::Resolve { seq: 1, .. })),
        "{won:?}"
    );
    cursor.abandon(0);
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert!(
        !cursor.commands.has_dropped_waits(),
        "the firing closed the wait"
    );
    assert_eq!(cursor.unresolved(), []);
}

/// A journal that records a dropped wait the code no longer drops (the code changed) is a
/// divergence, not a wait that hangs forever on a timer whose row is gone.
#[test]
fn a_recorded_drop_the_code_does_not_repeat_diverges() {
    let journal = vec![timer(0, 5_000), Entry::WaitDropped { seq: 0 }];
    let mut cursor = Replay::new(journal);
    cursor.issue(timer_identity(1_000)).unwrap();
    let ReplayFault::Diverged(divergence) = cursor.next_replay_event().unwrap_err() else {
        panic!("a divergence");
    };
    assert_eq!(
        (divergence.seq, divergence.mismatch),
        (0, Mismatch::WaitKept)
    );
    let shown = divergence.to_string();
    assert!(
        shown.contains("the journal recorded that the workflow code dropped its wait for timer"),
        "{shown}"
    );
}

/// An attempt number at the top of its range (a crafted journal) is an error that names the
/// seq, never an overflow.
#[test]
fn an_attempt_at_the_limit_is_an_inconsistent_journal() {
    let failed = Entry::ActivityAttemptFailed {
        seq: 0,
        attempt: u32::MAX,
        failure: Failure::new(FailureKind::Retriable, "503"),
        retry_at_ms: 1,
    };
    let mut cursor = Replay::new(vec![scheduled(0, "a", 1), failed]);
    cursor.issue(activity("a", 1)).unwrap();
    let fault = cursor.next_replay_event().unwrap_err();
    let ReplayFault::Inconsistent { seq, message } = fault else {
        panic!("an inconsistent journal, got {fault:?}");
    };
    assert_eq!(seq, 0);
    assert!(message.contains("4294967295"), "{message}");
}

/// What the cursor keeps grows with the commands in flight, not with the history it walked.
#[test]
fn a_long_history_leaves_nothing_behind() {
    let mut journal = Vec::new();
    for seq in 0..1_000 {
        journal.push(scheduled(seq, "a", u64::from(seq)));
        journal.push(completed(seq, u64::from(seq)));
    }
    let mut cursor = Replay::new(journal);
    for seq in 0..1_000 {
        cursor.issue(activity("a", u64::from(seq))).unwrap();
        let event = cursor.next_replay_event().unwrap();
        assert!(matches!(event, Some(ReplayEvent::Resolve { .. })));
        cursor.forget(seq);
    }
    assert_eq!(cursor.next_replay_event(), Ok(None));
    assert_eq!(cursor.footprint(), (0, 0));
}
