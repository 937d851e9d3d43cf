//! What a run's calls needed and took, counted as its journal's entries are applied: the
//! figures of a run's end (its retry amplification), without reading the journal back.

use crate::journal::{Entry, ReconciledBy, Reconciliation, Seq, SeqMap};

/// What a run's calls needed and took: the figures of a run's end (its retry amplification).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Call steps settled or started: what the workflow needs without any failure.
    pub ideal_calls: u64,
    /// Attempts journaled (the highest attempt of each call step, at least 1).
    pub journaled_attempts: u64,
}

/// The calls of a journal, counted entry by entry. A run's [`Commands`](super::Commands) keep
/// one, so that a run that ends need not read its journal back for its telemetry, and
/// `telemetry::journal_stats` folds one over a whole journal: the two count alike. Only the
/// calls still open are held, so a long run's tally does not grow with its history.
///
/// It counts valid journals as the whole journal says. Of one that does not add up (a stuck
/// run's, read by `waymark stats`), a call scheduled again after it settled counts twice, and an
/// attempt journaled after its call settled counts for nothing.
#[derive(Debug, Default)]
pub(crate) struct CallTally {
    open: SeqMap<OpenCall>,
    settled: CallCounts,
}

/// A call scheduled and not settled yet.
#[derive(Debug, Clone, Copy)]
struct OpenCall {
    /// The highest attempt journaled so far (0: none yet).
    highest: u32,
}

impl CallTally {
    /// Counts `entry`. Entries of calls this tally never saw scheduled count for nothing.
    pub(crate) fn apply(&mut self, entry: &Entry) {
        match entry {
            Entry::ActivityScheduled { seq, .. } | Entry::ActivityScheduledAt { seq, .. } => {
                self.open.insert(*seq, OpenCall { highest: 0 });
            }
            // Answered without a call, from the stage cache: no call was needed.
            Entry::ActivityCompleted {
                seq, attempt: 0, ..
            }
            | Entry::ActivityCompletedAt {
                seq, attempt: 0, ..
            } => {
                self.open.remove(seq);
            }
            Entry::ActivityCompleted { seq, attempt, .. }
            | Entry::ActivityCompletedAt { seq, attempt, .. }
            | Entry::SnapshotCompleted { seq, attempt, .. }
            | Entry::SnapshotCompletedAt { seq, attempt, .. }
            | Entry::ActivityFailed { seq, attempt, .. }
            | Entry::ActivityFailedAt { seq, attempt, .. } => {
                self.attempted(*seq, *attempt);
                self.settle(*seq);
            }
            Entry::ActivityAttemptFailed { seq, attempt, .. }
            | Entry::EffectUncertain { seq, attempt, .. } => self.attempted(*seq, *attempt),
            Entry::EffectReconciled {
                seq,
                by,
                verdict: Reconciliation::Committed(_),
                ..
            } => match by {
                // The operation log answered the command: no call was needed.
                ReconciledBy::OperationLog => {
                    self.open.remove(seq);
                }
                _ => self.settle(*seq),
            },
            _ => {}
        }
    }

    /// The calls counted so far, those still open included.
    pub(crate) fn counts(&self) -> CallCounts {
        let mut counts = self.settled;
        for call in self.open.values() {
            add_call(&mut counts, call);
        }
        counts
    }

    fn attempted(&mut self, seq: Seq, attempt: u32) {
        if let Some(call) = self.open.get_mut(&seq) {
            call.highest = call.highest.max(attempt);
        }
    }

    fn settle(&mut self, seq: Seq) {
        if let Some(call) = self.open.remove(&seq) {
            add_call(&mut self.settled, &call);
        }
    }
}

fn add_call(counts: &mut CallCounts, call: &OpenCall) {
    counts.ideal_calls += 1;
    counts.journaled_attempts += u64::from(call.highest.max(1));
}

#[cfg(test)]
mod tests {
    use super::super::tests::{attempt_failed, effect_scheduled, reconciled, scheduled};
    use super::*;
    use crate::journal::{Failure, FailureKind, Payload};

    fn completed(seq: Seq, attempt: u32) -> Entry {
        Entry::ActivityCompleted {
            seq,
            attempt,
            output: Payload::unit(),
        }
    }

    fn uncertain(seq: Seq, attempt: u32) -> Entry {
        Entry::EffectUncertain {
            seq,
            attempt,
            failure: Failure::new(FailureKind::Timeout, "no answer"),
        }
    }

    fn tally(journal: &[Entry]) -> CallTally {
        let mut tally = CallTally::default();
        for entry in journal {
            tally.apply(entry);
        }
        tally
    }

    /// A long run's tally holds its open calls only, and counts the settled ones as the whole
    /// journal would.
    #[test]
    fn a_tally_holds_only_the_calls_still_open() {
        let mut journal = Vec::new();
        for seq in 0..1_000 {
            journal.push(scheduled(seq, "noop"));
            journal.push(completed(seq, 1));
        }
        journal.push(scheduled(1_000, "noop"));
        journal.push(attempt_failed(1_000, 2, 0));
        let tally = tally(&journal);
        assert_eq!(tally.open.len(), 1, "only the call still retrying");
        let counts = CallCounts {
            ideal_calls: 1_001,
            journaled_attempts: 1_002,
        };
        assert_eq!(tally.counts(), counts);
    }

    /// Each way an effect ends, counted as a call needed (or not) and its highest attempt.
    #[test]
    fn effects_count_by_how_they_settled() {
        let committed = || Reconciliation::Committed(Payload::unit());
        let cases = [
            // A reconciler found it happened after an unknown second attempt: 1 call, 2 attempts.
            (
                vec![
                    uncertain(0, 2),
                    reconciled(0, 2, ReconciledBy::Reconciler, committed()),
                ],
                (1, 2),
            ),
            // The downstream's own report, or an operator, settles it as surely.
            (
                vec![
                    uncertain(0, 1),
                    reconciled(
                        0,
                        1,
                        ReconciledBy::Downstream("carrier".into()),
                        committed(),
                    ),
                ],
                (1, 1),
            ),
            (
                vec![
                    uncertain(0, 3),
                    reconciled(0, 3, ReconciledBy::Operator("ops".into()), committed()),
                ],
                (1, 3),
            ),
            // The operation log answered, even after an unknown attempt: no call was needed.
            (
                vec![
                    uncertain(0, 1),
                    reconciled(0, 0, ReconciledBy::OperationLog, committed()),
                ],
                (0, 0),
            ),
            // The log says the key waits for an operator: the call is still open, and needed.
            (
                vec![reconciled(
                    0,
                    1,
                    ReconciledBy::OperationLog,
                    Reconciliation::AwaitingOperator {
                        reason: "3 checks".into(),
                    },
                )],
                (1, 1),
            ),
            // Not found, then retried and committed at the third attempt.
            (
                vec![
                    uncertain(0, 2),
                    reconciled(0, 2, ReconciledBy::Reconciler, Reconciliation::NotFound),
                    attempt_failed(0, 2, 0),
                    completed(0, 3),
                ],
                (1, 3),
            ),
            // A stage-cache answer needed no call.
            (vec![completed(0, 0)], (0, 0)),
            // A terminal failure the log recorded (attempt 0) is one call, one attempt.
            (
                vec![Entry::ActivityFailed {
                    seq: 0,
                    attempt: 0,
                    failure: Failure::new(FailureKind::Terminal, "refused"),
                }],
                (1, 1),
            ),
        ];
        for (after_schedule, (ideal_calls, journaled_attempts)) in cases {
            let mut journal = vec![effect_scheduled(0, "rebook")];
            journal.extend(after_schedule);
            let counts = CallCounts {
                ideal_calls,
                journaled_attempts,
            };
            assert_eq!(tally(&journal).counts(), counts, "{journal:?}");
        }
    }
}
