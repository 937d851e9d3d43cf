//! The flush after a poll: the commands the poll issued are journaled (with the waits it
//! dropped, their timer rows deleted), and only then started; or, when a crash may lose the
//! flush at no cost, started first and journaled with what they answer.

use super::attempts::FirstPoll;
use super::*;
use crate::context::NewWork;
use crate::machines::effect::NextCall;
use crate::machines::DroppedWait;

impl<H: Host> Executor<H> {
    /// Journals the commands the last polls issued, and the waits they dropped, then starts
    /// the commands. An effect leaves the process only after its `prepared` is synced.
    ///
    /// A flush a crash may lose at no cost (the schedule of reads, recorded values: the code
    /// issues them again on replay) is held back instead, with what it counts: the attempts
    /// take their first polls, and it is written at once if one of them waits, else with the
    /// run's next write, which is the first answer's unless other mail comes first. A read
    /// that answers at its first poll then costs one write, not two; one that waits is
    /// journaled as scheduled before the run goes on. A crash in the first poll loses the
    /// schedule: the next process runs the read as a first execution, as it would after a
    /// crash before the write. A flush that answers a cached stage is written at once: the
    /// answer is delivered next.
    ///
    /// The new commands' entries are applied before the write, the one place where entries
    /// are: a wait the poll that issued it also dropped is then cancelled in the same write
    /// (its timer row is never armed). A failed write stops the run, and what was applied goes
    /// with it.
    pub(super) async fn flush_new_commands(&mut self) -> Result<(), RunError> {
        let Some(NewWork {
            commands,
            notes,
            verdicts,
        }) = self.core.take_flush()
        else {
            return Ok(());
        };
        let mut plan = FlushPlan::default();
        for command in commands {
            self.plan_command(command, &mut plan).await?;
        }
        for verdict in verdicts {
            plan.stream.extend(self.judged_stream(verdict).await?);
        }
        self.apply(&plan.entries)?;
        // Under one lock: each takes it on every flush.
        let (dropped, decisions): (_, Vec<Decision>) = {
            let mut state = self.core.lock();
            let dropped = state.commands.take_dropped_waits();
            let issued = plan.issued.iter();
            let decisions = issued
                .filter_map(|seq| state.commands.decision(*seq))
                .collect();
            (dropped, decisions)
        };
        self.plan_dropped_waits(dropped, &mut plan);
        self.strike_before_prepared(&decisions)?;
        let durable = plan.needs_sync();
        // A cached stage's answer is delivered next: it is journaled first.
        let delivers = !plan.stage_cache_hits.is_empty();
        let counted = plan.take_counted(notes);
        let mut transition = Transition::append(self.id.clone(), &self.record, plan.entries);
        transition.durable = durable;
        transition.add_timers = plan.timers;
        transition.remove_timers = plan.removed_timers.clone();
        transition.operations = plan.operations;
        transition.artifacts = plan.artifacts;
        transition.stream = plan.stream;
        if durable || delivers || !transition.appends_only() {
            self.write(transition).await?;
            self.count_written(counted);
        } else {
            self.hold_back(transition, counted);
        }
        for timer in plan.removed_timers {
            self.host.cancel_timer(timer);
        }
        let mut answered = true;
        let mut taken_over = std::mem::take(&mut plan.taken_over);
        for decision in decisions {
            let taken_over = taken_over_next(&mut taken_over, &decision);
            answered &= match (decision, taken_over) {
                // No call: what the log decided about the call an earlier run left.
                (Decision::Attempt { seq, attempt }, Some(next)) => {
                    Box::pin(self.perform_next_call(seq, attempt, next)).await?;
                    false
                }
                (decision, _) => self.start_new(decision) == FirstPoll::Answered,
            };
        }
        // A read that waits is journaled as scheduled before the run goes on; one that
        // answered at its first poll is journaled with its answer, in one write.
        if !answered {
            self.write_held_back().await?;
        }
        Ok(())
    }

    /// Answers a cached stage called before with the same input: its earlier result, journaled
    /// as attempt 0 with the command, so nothing is called.
    fn plan_stage_cache(&mut self, seq: Seq, name: String, plan: &mut FlushPlan) {
        let Some(output) = self.core.stage_cache_answer(seq) else {
            return;
        };
        plan.entries.push(Entry::ActivityCompleted {
            seq,
            attempt: 0,
            output,
        });
        plan.stage_cache_hits.push(name);
    }

    /// Adds `WaitDropped` (and the timer row's deletion) for each wait the code dropped.
    fn plan_dropped_waits(&mut self, dropped: Vec<DroppedWait>, plan: &mut FlushPlan) {
        for wait in dropped {
            plan.entries.push(Entry::WaitDropped { seq: wait.seq });
            if let Some(fire_at_ms) = wait.fire_at_ms {
                plan.removed_timers.push(self.timer(wait.seq, fire_at_ms));
            }
        }
    }

    /// Adds one new command's entries, timers and operation records to the flush.
    pub(super) async fn plan_command(
        &mut self,
        command: NewCommand,
        plan: &mut FlushPlan,
    ) -> Result<(), RunError> {
        let (seq, synced) = match command {
            NewCommand::Activity {
                seq,
                identity,
                input,
                scheduled_at_ms,
                idempotency_key,
            } => {
                let what = || format!("the input of `{}` (seq {seq})", identity.name);
                let max = self.host.max_payload_bytes();
                // What the journal would hold: the input with its redacted fields as digests.
                let journaled = self.host.redaction().apply(input);
                if let Some(message) = crate::journal::oversized(&journaled, max, what) {
                    let name = identity.name.clone();
                    plan.entries.push(Entry::ActivityScheduledAt {
                        seq,
                        identity,
                        input: crate::journal::oversized_placeholder(&journaled),
                        scheduled_at_ms,
                        idempotency_key,
                    });
                    // Failed in the write that journals it: no attempt starts, nothing is called.
                    let message = format!("{message}; `{name}` was not called");
                    let failure = Failure::new(FailureKind::Terminal, message);
                    plan.entries.push(Entry::ActivityFailed {
                        seq,
                        attempt: 0,
                        failure,
                    });
                    plan.issued.push(seq);
                    plan.synced = true;
                    return Ok(());
                }
                let cached = idempotency_key.is_none() && self.core.is_cached_stage(&identity.name);
                let name = cached.then(|| identity.name.clone());
                plan.entries.push(Entry::ActivityScheduledAt {
                    seq,
                    identity,
                    input: journaled,
                    scheduled_at_ms,
                    idempotency_key: idempotency_key.clone(),
                });
                match (idempotency_key, name) {
                    (Some(key), _) => (seq, self.plan_effect(seq, key, plan).await?),
                    // A read's schedule may be lost to a crash: the code issues it again, and
                    // a cached stage is answered again from the same earlier result.
                    (None, Some(name)) => {
                        self.plan_stage_cache(seq, name, plan);
                        (seq, false)
                    }
                    (None, None) => (seq, false),
                }
            }
            NewCommand::Timer {
                seq,
                identity,
                duration_ms,
                fire_at_ms,
            } => {
                plan.entries.push(Entry::TimerStarted {
                    seq,
                    identity,
                    duration_ms,
                    fire_at_ms,
                });
                plan.timers.push(self.timer(seq, fire_at_ms));
                (seq, true)
            }
            NewCommand::Artifact {
                seq,
                identity,
                record,
            } => {
                plan.artifacts.push((identity.input_digest, record));
                plan.entries
                    .push(Entry::ArtifactCommitted { seq, identity });
                (seq, false)
            }
            NewCommand::Approval {
                seq,
                identity,
                artifact_hash,
                risk,
                expires_at_ms,
            } => {
                // A request the code dropped in the poll that made it asks no one.
                if !self.core.lock().commands.is_abandoned(seq) {
                    let asked = approval_required(seq, artifact_hash, &risk, expires_at_ms)?;
                    plan.stream.push(asked);
                }
                plan.entries.push(Entry::ApprovalRequested {
                    seq,
                    identity,
                    artifact_hash,
                    risk,
                    expires_at_ms,
                });
                plan.timers
                    .extend(expires_at_ms.map(|at| self.timer(seq, at)));
                (seq, true)
            }
            NewCommand::Signal { seq, identity } => {
                plan.entries.push(Entry::SignalAwaited { seq, identity });
                (seq, true)
            }
            NewCommand::Value {
                seq,
                identity,
                value,
            } => {
                plan.entries.push(Entry::ValueRecorded {
                    seq,
                    identity,
                    value,
                });
                (seq, false)
            }
        };
        plan.issued.push(seq);
        plan.synced |= synced;
        Ok(())
    }

    /// What a validator's verdict makes of the judged step's stream version: committed when
    /// accepted, superseded when rejected; nothing when the step did not stream. The version is
    /// the one its result was journaled with, or, after a restart, the one still unsettled.
    async fn judged_stream(
        &mut self,
        verdict: StreamVerdict,
    ) -> Result<Option<StreamItem>, RunError> {
        let step = verdict.step;
        let version = match self.unvalidated.remove(&step) {
            Some(version) => version,
            // Journaled by an earlier process: the newest version left open, the journaled
            // attempt's unless that attempt did not stream.
            None => {
                let id = self.id.clone();
                let events = self.host.read(move |store| store.stream(&id, 0)).await?;
                crate::streams::unsettled_version(&events, step)
            }
        };
        let Some(response_version) = version else {
            return Ok(None);
        };
        Ok(Some(match verdict.rejected {
            None => StreamItem::Committed {
                step,
                response_version,
            },
            Some(why) => StreamItem::Superseded {
                step,
                response_version,
                reason: format!("rejected: {why}"),
            },
        }))
    }

    /// Performs what a command just flushed needs: its first attempt (an effect's `prepared`
    /// went in the same write), or its timer row's wake-up. A decision with no first poll
    /// counts as waiting: its flush is written at once.
    pub(super) fn start_new(&mut self, decision: Decision) -> FirstPoll {
        match decision {
            Decision::Attempt { seq, attempt } => self.spawn_attempt(seq, attempt),
            other => {
                self.schedule(other);
                FirstPoll::Waiting
            }
        }
    }

    /// A planned crash before a new attempt's first write stops the run here.
    pub(super) fn strike_before_prepared(&self, decisions: &[Decision]) -> Result<(), RunError> {
        for decision in decisions {
            if let Decision::Attempt { seq, attempt } = decision {
                self.strike(*seq, *attempt, Boundary::BeforePrepared)?;
            }
        }
        Ok(())
    }
}

/// What follows for the command `decision` starts, if it took over a record an earlier run
/// left.
fn taken_over_next(taken_over: &mut Vec<(Seq, NextCall)>, decision: &Decision) -> Option<NextCall> {
    let Decision::Attempt { seq, .. } = decision else {
        return None;
    };
    let index = taken_over.iter().position(|(taken, _)| taken == seq)?;
    Some(taken_over.swap_remove(index).1)
}

/// What one flush writes and then starts.
#[derive(Default)]
pub(super) struct FlushPlan {
    pub(super) entries: Vec<Entry>,
    pub(super) timers: Vec<TimerKey>,
    /// Rows of timers the code dropped.
    pub(super) removed_timers: Vec<TimerKey>,
    pub(super) operations: Vec<(String, OperationRecord)>,
    /// Effects that took over a record an earlier run left, with what follows once written.
    pub(super) taken_over: Vec<(Seq, NextCall)>,
    pub(super) artifacts: Vec<(Digest, ArtifactRecord)>,
    pub(super) stream: Vec<StreamItem>,
    /// The commands, in the order issued.
    pub(super) issued: Vec<Seq>,
    /// A command whose schedule must not be lost (an effect answered by the log, a wait).
    pub(super) synced: bool,
    /// Effects refused for a key used with other arguments, by operation: counted once
    /// written.
    pub(super) key_conflicts: Vec<String>,
    /// Effects refused because their approval does not list their intent: counted once
    /// written.
    pub(super) approval_mismatches: u32,
    /// Cached stages answered from an earlier call, by activity: counted once written.
    pub(super) stage_cache_hits: Vec<String>,
}

impl FlushPlan {
    /// What the flush counts once it is written, after the poll's `notes`: so a flush a crash
    /// loses is counted by the process that writes it again, alone.
    fn take_counted(&mut self, notes: Vec<TelemetryNote>) -> Vec<TelemetryNote> {
        let mut counted = notes;
        for operation in std::mem::take(&mut self.key_conflicts) {
            counted.push(Box::new(move |t: &Telemetry| t.key_conflict(&operation)));
        }
        for _ in 0..self.approval_mismatches {
            counted.push(Box::new(|t: &Telemetry| t.approval_hash_mismatch()));
        }
        for stage in std::mem::take(&mut self.stage_cache_hits) {
            counted.push(Box::new(move |t: &Telemetry| t.stage_cache_hit(&stage)));
        }
        counted
    }

    /// Whether this flush must be synced before anything starts: everything but the schedule
    /// of plain activities and recorded values, which a crash may lose at no cost (the code
    /// issues them again on replay, and a read may run twice). Effects (`prepared`), timers,
    /// artifacts, approvals and signal waits are synced.
    fn needs_sync(&self) -> bool {
        self.synced
            || !(self.timers.is_empty()
                && self.removed_timers.is_empty()
                && self.operations.is_empty()
                && self.artifacts.is_empty()
                && self.stream.is_empty())
    }
}

/// The `approval_required` progress event readers are shown.
pub(super) fn approval_required(
    seq: Seq,
    artifact_hash: Digest,
    risk: &Payload,
    expires_at_ms: Option<u64>,
) -> Result<StreamItem, RunError> {
    let risk: serde_json::Value = risk
        .decode()
        .map_err(|error| RunError::Internal(format!("the approval's risk: {error}")))?;
    let detail = serde_json::json!({
        "request": seq,
        "artifact_hash": artifact_hash.hex(),
        "risk": risk,
        "expires_at_ms": expires_at_ms,
    });
    Ok(progress(seq, "approval_required", detail))
}
