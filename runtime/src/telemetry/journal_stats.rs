//! What one journal says about replay safety, computed from its entries alone (sans I/O).
//! The worker takes a finished workflow's ideal call count from it; `waymark stats` on a data
//! dir sums it over every journal, so a stopped worker's history can be read the same way.

use std::collections::BTreeMap;

use serde::Serialize;

use super::CallKind;
use crate::compensations::UNDO_FAILED;
use crate::journal::{
    CommandKind, Entry, FailureKind, Payload, ReconciledBy, Reconciliation, Seq, SeqSet,
};
use crate::llm::{LlmRequest, LlmResponse, LLM_ACTIVITY};
use crate::machines::{CallCounts, CallTally};

/// Counts from one journal (or, summed, from many).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JournalStats {
    /// Steps settled or started by a call: what the workflow needs without any failure.
    pub ideal_calls: u64,
    /// Attempts the journal records (the highest attempt of each call step).
    pub journaled_attempts: u64,
    /// Failed attempts that were retried.
    pub retried_attempts: u64,
    /// Effect attempts whose outcome became unknown.
    pub unknown_outcomes: u64,
    /// Unknown outcomes settled by a reconciler.
    pub reconciled: u64,
    /// Unknown outcomes settled by an operator.
    pub operator_decisions: u64,
    /// Effects answered from the operation log (the same intent issued again).
    pub answered_from_log: u64,
    /// Cached stages answered with an earlier call's result (attempt 0), not called.
    pub stage_cache_hits: u64,
    /// Retrieval refreshes whose documents differed from their snapshot.
    pub snapshot_drift: u64,
    /// How many repair ladders ended at each depth.
    pub validator_depths: BTreeMap<u32, u64>,
    /// Journaled model calls.
    pub llm_calls: u64,
    /// Their prompt tokens.
    pub prompt_tokens: u64,
    /// Their completion tokens.
    pub completion_tokens: u64,
    /// Their cost (micro-units).
    pub cost_micros: u64,
}

impl JournalStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &JournalStats) {
        self.ideal_calls += other.ideal_calls;
        self.journaled_attempts += other.journaled_attempts;
        self.retried_attempts += other.retried_attempts;
        self.unknown_outcomes += other.unknown_outcomes;
        self.reconciled += other.reconciled;
        self.operator_decisions += other.operator_decisions;
        self.answered_from_log += other.answered_from_log;
        self.stage_cache_hits += other.stage_cache_hits;
        self.snapshot_drift += other.snapshot_drift;
        for (depth, count) in &other.validator_depths {
            *self.validator_depths.entry(*depth).or_default() += count;
        }
        self.llm_calls += other.llm_calls;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.cost_micros += other.cost_micros;
    }

    /// The calls these counts are of.
    pub fn calls(&self) -> CallCounts {
        CallCounts {
            ideal_calls: self.ideal_calls,
            journaled_attempts: self.journaled_attempts,
        }
    }
}

/// Reads one workflow's journal.
pub fn journal_stats(journal: &[Entry]) -> JournalStats {
    let mut stats = JournalStats::default();
    let mut calls = CallTally::default();
    // Model calls scheduled and not answered yet: their answer is priced.
    let mut model_calls = SeqSet::default();
    let mut ladder = LadderDepths::default();
    for entry in journal {
        match entry {
            Entry::ActivityScheduled { seq, identity, .. }
            | Entry::ActivityScheduledAt { seq, identity, .. }
                if identity.name == LLM_ACTIVITY =>
            {
                model_calls.insert(*seq);
            }
            // Answered without a call, from the stage cache.
            Entry::ActivityCompleted { attempt: 0, .. }
            | Entry::ActivityCompletedAt { attempt: 0, .. } => stats.stage_cache_hits += 1,
            Entry::ActivityCompleted { seq, output, .. }
            | Entry::ActivityCompletedAt { seq, output, .. }
                if model_calls.remove(seq) =>
            {
                count_llm(&mut stats, output.decode::<LlmResponse>().ok());
            }
            Entry::ActivityAttemptFailed { .. } => stats.retried_attempts += 1,
            Entry::EffectUncertain { .. } => stats.unknown_outcomes += 1,
            Entry::EffectReconciled { by, verdict, .. } => match by {
                // A downstream's own report settles it as surely as the reconciler's lookup.
                ReconciledBy::Reconciler | ReconciledBy::Downstream(_) => stats.reconciled += 1,
                ReconciledBy::Operator(_) => stats.operator_decisions += 1,
                // The log answered the command, unless it only said the key waits for an
                // operator: then the effect may still be called.
                ReconciledBy::OperationLog => {
                    if let Reconciliation::Committed(_) = verdict {
                        stats.answered_from_log += 1;
                    }
                }
                ReconciledBy::NoReconciler => {}
            },
            Entry::ValueRecorded {
                identity, value, ..
            } if identity.kind == CommandKind::Verdict => match identity.name.as_str() {
                "snapshot_drift" => stats.snapshot_drift += 1,
                "validation" => ladder.verdict(value.decode::<serde_json::Value>().ok()),
                _ => {}
            },
            _ => {}
        }
        calls.apply(entry);
    }
    let CallCounts {
        ideal_calls,
        journaled_attempts,
    } = calls.counts();
    stats.ideal_calls = ideal_calls;
    stats.journaled_attempts = journaled_attempts;
    stats.validator_depths = ladder.finish();
    stats
}

/// A step as metrics label it (its name, and what kind of step it is): where a workflow failed,
/// where it resumed. Read from the journal alone, so every process labels a step the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLocation {
    /// The step: an activity or effect's name, a model call's prompt (or model), or `workflow`
    /// when the code failed by itself, `cancelled` when it was cancelled.
    pub step: String,
    /// `model_call`, `effect`, `read`, `retrieval`, `workflow` or `cancelled`.
    pub stage: &'static str,
}

/// Where the workflow of `journal` failed; `None` if it did not (or has not yet).
pub fn failure_location(journal: &[Entry]) -> Option<StepLocation> {
    let failure = match journal.last()? {
        Entry::WorkflowFailed { failure } => failure,
        _ => return None,
    };
    if failure.kind == FailureKind::Cancelled {
        return Some(StepLocation::of_run("cancelled"));
    }
    // The code failed at a step when it failed with that step's error (`?` carries the
    // message up), the last such step if several failed; otherwise it gave up by itself. The
    // undos of a compensated failure, journaled after it, do not move the location.
    let message = without_undo_failures(&failure.message);
    let failed_with = journal.iter().rev().find_map(|entry| match entry {
        Entry::ActivityFailed {
            seq,
            failure: step_failure,
            ..
        }
        | Entry::ActivityFailedAt {
            seq,
            failure: step_failure,
            ..
        } if !step_failure.message.is_empty() && message.contains(&step_failure.message) => {
            Some(*seq)
        }
        _ => None,
    });
    let failed_step = failed_with.and_then(|seq| step_of(journal, seq));
    Some(failed_step.unwrap_or_else(|| StepLocation::of_run("workflow")))
}

/// A run's failure message before the undos that failed after it (`with_undo_failures`): an
/// undo's failure is not where the run failed.
fn without_undo_failures(message: &str) -> &str {
    message
        .split_once(UNDO_FAILED)
        .map_or(message, |(failure, _)| failure)
}

impl StepLocation {
    /// Not a step: the run as a whole (`workflow`: its code gave up; `cancelled`).
    pub fn of_run(why: &'static str) -> Self {
        Self {
            step: why.to_owned(),
            stage: why,
        }
    }
}

/// The step that command `seq` of `journal` is.
pub fn step_of(journal: &[Entry], seq: Seq) -> Option<StepLocation> {
    journal.iter().find_map(|entry| match entry {
        Entry::ActivityScheduled {
            seq: at,
            identity,
            input,
        }
        | Entry::ActivityScheduledAt {
            seq: at,
            identity,
            input,
            ..
        } if *at == seq => {
            let effect = matches!(
                entry,
                Entry::ActivityScheduledAt {
                    idempotency_key: Some(_),
                    ..
                }
            );
            let kind = match identity.kind {
                _ if effect => CallKind::Effect,
                _ if identity.name == LLM_ACTIVITY => CallKind::Llm,
                CommandKind::Retrieval => CallKind::Retrieval,
                _ => CallKind::Activity,
            };
            Some(StepLocation::of_call(&identity.name, input, kind))
        }
        _ => None,
    })
}

impl StepLocation {
    /// The call of activity `name` with `input`, of `kind`: a model call is named by its
    /// prompt (or its model), anything else by its activity's name.
    pub fn of_call(name: &str, input: &Payload, kind: CallKind) -> Self {
        let prompted = || {
            let request = input.decode::<LlmRequest>().ok()?;
            Some(request.prompt.map_or(request.model, |prompt| prompt.id))
        };
        let step = match kind {
            CallKind::Llm => prompted(),
            _ => None,
        };
        StepLocation {
            step: step.unwrap_or_else(|| name.to_owned()),
            stage: kind.stage(),
        }
    }
}

fn count_llm(stats: &mut JournalStats, response: Option<LlmResponse>) {
    stats.llm_calls += 1;
    if let Some(response) = response {
        stats.prompt_tokens += response.usage.prompt_tokens;
        stats.completion_tokens += response.usage.completion_tokens;
        stats.cost_micros += response.cost_micros;
    }
}

/// Ladders journal one `validation` verdict per rung with rising depths (a person's review is
/// the rung after the last model rung); a depth that does not rise starts the next ladder,
/// which always starts at 0. A ladder ended at its last verdict's depth.
#[derive(Default)]
struct LadderDepths {
    current: Option<u32>,
    ended: BTreeMap<u32, u64>,
}

impl LadderDepths {
    fn verdict(&mut self, verdict: Option<serde_json::Value>) {
        let Some(depth) = verdict.and_then(|v| v["depth"].as_u64()) else {
            return;
        };
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        match self.current {
            Some(current) if depth > current => {}
            Some(current) => *self.ended.entry(current).or_default() += 1,
            None => {}
        }
        self.current = Some(depth);
    }

    fn finish(mut self) -> BTreeMap<u32, u64> {
        if let Some(current) = self.current {
            *self.ended.entry(current).or_default() += 1;
        }
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{CommandIdentity, Failure, FailureKind, Payload};
    use crate::llm::Usage;

    fn scheduled(seq: Seq, name: &str) -> Entry {
        let input = Payload::unit();
        Entry::ActivityScheduled {
            seq,
            identity: CommandIdentity::new(CommandKind::Activity, name, &input),
            input,
        }
    }

    fn verdict(seq: Seq, depth: u32) -> Entry {
        let value = Payload::encode(&serde_json::json!({"depth": depth})).unwrap();
        Entry::ValueRecorded {
            seq,
            identity: CommandIdentity::new(CommandKind::Verdict, "validation", &Payload::unit()),
            value,
        }
    }

    fn answer(cost_micros: u64) -> Payload {
        Payload::encode(&LlmResponse {
            text: "ok".into(),
            model: "planner".into(),
            provider_model: "planner@1".into(),
            prompt_version: None,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 4,
            },
            cost_micros,
            latency_ms: 1,
            finish_reason: None,
            tool_calls: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn calls_attempts_reconciliations_ladders_and_spend_are_read_from_entries() {
        let unknown = Failure::new(FailureKind::Timeout, "no answer");
        let journal = vec![
            scheduled(0, LLM_ACTIVITY),
            Entry::ActivityCompleted {
                seq: 0,
                attempt: 1,
                output: answer(7),
            },
            verdict(1, 0),
            scheduled(2, LLM_ACTIVITY),
            Entry::ActivityCompleted {
                seq: 2,
                attempt: 2,
                output: answer(5),
            },
            verdict(3, 0),
            verdict(4, 1),
            scheduled(5, "rebook"),
            Entry::EffectUncertain {
                seq: 5,
                attempt: 1,
                failure: unknown,
            },
            Entry::EffectReconciled {
                seq: 5,
                attempt: 1,
                by: ReconciledBy::Reconciler,
                verdict: Reconciliation::Committed(Payload::unit()),
            },
            scheduled(6, "rebook"),
            Entry::EffectReconciled {
                seq: 6,
                attempt: 0,
                by: ReconciledBy::OperationLog,
                verdict: Reconciliation::Committed(Payload::unit()),
            },
            // The log says the key waits for an operator: not an answer, the call may come.
            scheduled(7, "notify"),
            Entry::EffectReconciled {
                seq: 7,
                attempt: 1,
                by: ReconciledBy::OperationLog,
                verdict: Reconciliation::AwaitingOperator {
                    reason: "3 checks".into(),
                },
            },
        ];
        let stats = journal_stats(&journal);
        assert_eq!(stats.ideal_calls, 4, "the log's answer needed no call");
        assert_eq!(stats.journaled_attempts, 5);
        assert_eq!((stats.unknown_outcomes, stats.reconciled), (1, 1));
        assert_eq!(stats.answered_from_log, 1);
        assert_eq!(stats.validator_depths, BTreeMap::from([(0, 1), (1, 1)]));
        assert_eq!(stats.llm_calls, 2);
        assert_eq!((stats.prompt_tokens, stats.completion_tokens), (20, 8));
        assert_eq!(stats.cost_micros, 12);

        let mut total = stats.clone();
        total.add(&stats);
        assert_eq!(total.ideal_calls, 8);
        assert_eq!(total.validator_depths, BTreeMap::from([(0, 2), (1, 2)]));
    }

    #[test]
    fn a_failure_is_located_at_the_step_whose_error_ended_the_run() {
        let refused = Failure::new(FailureKind::Terminal, "no car left");
        let ended = |kind, message: &str| Entry::WorkflowFailed {
            failure: Failure::new(kind, message),
        };
        let mut journal = vec![
            scheduled(0, "book_car"),
            Entry::ActivityFailed {
                seq: 0,
                attempt: 1,
                failure: refused,
            },
            // An undo run after the failure does not move it.
            scheduled(1, "cancel_hotel"),
            Entry::ActivityCompleted {
                seq: 1,
                attempt: 1,
                output: Payload::unit(),
            },
            ended(
                FailureKind::Workflow,
                "activity failed: terminal: no car left",
            ),
        ];
        let at = failure_location(&journal).unwrap();
        assert_eq!((at.step.as_str(), at.stage), ("book_car", "read"));
        // An undo that failed after it is not where the run failed.
        journal.pop();
        journal.push(Entry::ActivityFailed {
            seq: 1,
            attempt: 1,
            failure: Failure::new(FailureKind::Terminal, "carrier down"),
        });
        let compensated = "activity failed: terminal: no car left; compensation `cancel_hotel` \
                           of `book_hotel` failed: carrier down";
        journal.push(ended(FailureKind::Workflow, compensated));
        let at = failure_location(&journal).unwrap();
        assert_eq!((at.step.as_str(), at.stage), ("book_car", "read"));
        journal.pop();
        journal.push(ended(FailureKind::Workflow, "gave up"));
        let at = failure_location(&journal).unwrap();
        assert_eq!((at.step.as_str(), at.stage), ("workflow", "workflow"));
        journal.pop();
        journal.push(ended(FailureKind::Cancelled, "called off"));
        let at = failure_location(&journal).unwrap();
        assert_eq!((at.step.as_str(), at.stage), ("cancelled", "cancelled"));
        journal.pop();
        assert_eq!(failure_location(&journal), None, "not ended");
    }
}
