//! The replay cursor: a synchronous, sans-I/O state machine. Recorded entries in, decisions out.
//!
//! It imports neither tokio nor the store. The executor feeds it the journal and the commands the
//! workflow code issues, and asks it what to do: return a recorded value, deliver a recorded
//! completion, execute something new, or stop because the code no longer matches its journal.
//! Its failure state is sticky: after the first divergence every call reports the same one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;

use crate::journal::{CommandIdentity, CommandKind, Entry, Failure, Payload, Reconciliation, Seq};

/// The code parts from the journal at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Divergence {
    /// The position.
    pub seq: Seq,
    /// What the journal has there (`None`: nothing, the code issued a command the journal lacks).
    pub recorded: Option<CommandIdentity>,
    /// What the code issued there (`None`: nothing, the code skipped a recorded command).
    pub issued: Option<CommandIdentity>,
    /// How they part.
    pub mismatch: Mismatch,
}

/// How the code parts from the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The code issued another command (or none) than the journal recorded.
    Command,
    /// The journal records that the code dropped its wait there (a `select!` it lost); the
    /// code still waits on it, and would wait forever.
    WaitKept,
}

/// Stable code of the non-determinism error, to search for in logs and docs.
pub const DIVERGENCE_CODE: &str = "WM0001";

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &Option<CommandIdentity>| match c {
            Some(c) => c.to_string(),
            None => "nothing".to_owned(),
        };
        let seq = self.seq;
        match self.mismatch {
            Mismatch::Command => write!(
                f,
                "[{DIVERGENCE_CODE}] non-determinism at seq {seq}: the journal recorded {}, the \
                 workflow code issued {}.",
                show(&self.recorded),
                show(&self.issued)
            )?,
            Mismatch::WaitKept => write!(
                f,
                "[{DIVERGENCE_CODE}] non-determinism at seq {seq}: the journal recorded that the \
                 workflow code dropped its wait for {} here, the workflow code still waits.",
                show(&self.recorded)
            )?,
        }
        write!(
            f,
            " The workflow code changed in a way that is not replay-safe, or it reads the clock, \
             randomness or I/O directly. Guard the change with ctx.patched(\"change-id\") so old \
             journals keep their path, or let old runs finish on the old code."
        )
    }
}

impl std::error::Error for Divergence {}

/// Why the cursor cannot go on: the code no longer matches the journal, or the journal does
/// not add up (a number at the end of its range, found only in a corrupt or crafted journal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFault {
    /// The code issued another command than the journal recorded.
    Diverged(Box<Divergence>),
    /// The journal cannot be followed at `seq`.
    Inconsistent {
        /// The command.
        seq: Seq,
        /// What is wrong.
        message: String,
    },
}

impl From<Box<Divergence>> for ReplayFault {
    fn from(divergence: Box<Divergence>) -> Self {
        ReplayFault::Diverged(divergence)
    }
}

/// Answer to a command the code issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    /// The journal has this command: do not execute it again. For a recorded value (`now`,
    /// `random`, …) the value is returned here.
    Recorded {
        /// The command's position.
        seq: Seq,
        /// The recorded value of a value command.
        value: Option<Payload>,
    },
    /// Not in the journal: the executor must record and execute it.
    New {
        /// The command's position.
        seq: Seq,
    },
}

/// How a command ended, as delivered to the workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// An activity's result.
    Completed(Payload),
    /// An activity's final failure.
    Failed(Failure),
    /// A timer fired.
    Fired,
    /// A retrieval's result, kept as the snapshot artifact with this hash: the executor loads
    /// it and delivers it as `Completed`.
    Snapshot(crate::journal::Digest),
}

/// What walking the journal produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayEvent {
    /// Deliver this to the command's future, then poll the workflow.
    Resolve {
        /// The command.
        seq: Seq,
        /// Its outcome.
        resolution: Resolution,
    },
    /// The journal records that the workflow ended.
    Ended(Entry),
}

/// Where an issued command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandState {
    /// An activity attempt may be running; only a completion of this attempt is accepted.
    Running {
        /// Current attempt (1-based).
        attempt: u32,
    },
    /// A failed attempt waits for its retry.
    Backoff {
        /// The attempt that will run next.
        next_attempt: u32,
        /// When it may start.
        retry_at_ms: u64,
    },
    /// A timer waits to fire.
    Waiting {
        /// When.
        fire_at_ms: u64,
    },
    /// An effect attempt's outcome is unknown: the reconciler runs at `recheck_at_ms`.
    Reconciling {
        /// The attempt whose outcome is unknown.
        attempt: u32,
        /// Reconciler answers so far that could not tell.
        checks: u32,
        /// When to ask (again).
        recheck_at_ms: u64,
    },
    /// Reconciliation gave up; an operator must settle the attempt.
    AwaitingOperator {
        /// The attempt whose outcome is unknown.
        attempt: u32,
    },
    /// Waits for a signal (its name is in the command's identity).
    Listening,
    /// Waits for a person's decision on an artifact (its hash is in the command's meta).
    AwaitingApproval {
        /// When the request expires, if it does.
        expires_at_ms: Option<u64>,
    },
    /// Resolved, or a value command.
    Done,
}

/// What the journal says about an activity command besides its identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandMeta {
    /// When it was issued (unknown for journals written before this was recorded).
    pub scheduled_at_ms: Option<u64>,
    /// The effect's idempotency key.
    pub idempotency_key: Option<String>,
    /// The name a signal wait listens for.
    pub signal: Option<String>,
    /// The artifact an approval request is for.
    pub approval_hash: Option<crate::journal::Digest>,
}

/// Whether the cursor is still walking recorded history.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Replaying,
    Live,
    Diverged(Box<Divergence>),
}

/// A sleep or an approval request the code dropped before it was settled: `WaitDropped` is
/// journaled and its timer row deleted, so that it neither fires nor wakes an evicted workflow
/// later, nor is listed as pending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DroppedWait {
    /// The command.
    pub seq: Seq,
    /// When its timer would have fired (`None`: an approval request without an expiry).
    pub fire_at_ms: Option<u64>,
}

/// The cursor over one workflow run.
///
/// It keeps what open commands need, and forgets a command once it is settled and delivered:
/// what it holds grows with the commands in flight, not with the length of the history.
#[derive(Debug)]
pub struct ReplayCursor {
    /// Recorded identities (and values) of commands not yet issued again, or issued and not
    /// yet delivered (a replayed step's span names them).
    recorded: HashMap<Seq, (CommandIdentity, Option<Payload>)>,
    /// Whether the journal recorded any command at all.
    had_commands: bool,
    unwalked: VecDeque<Entry>,
    next_seq: Seq,
    phase: Phase,
    /// Open commands only: a settled command leaves.
    states: HashMap<Seq, CommandState>,
    meta: HashMap<Seq, CommandMeta>,
    /// The attempt that settled each replayed activity, for its span.
    settled_attempts: HashMap<Seq, u32>,
    /// Waits the code dropped before the journal (or a live start) opened them.
    abandoned: HashSet<Seq>,
    /// Sleeps and approval requests the code dropped that are not journaled as dropped yet.
    dropped: Vec<DroppedWait>,
}

impl ReplayCursor {
    /// A cursor over a journal's entries after `WorkflowStarted`.
    pub fn new(entries: impl IntoIterator<Item = Entry>) -> Self {
        let unwalked: VecDeque<Entry> = entries.into_iter().collect();
        let recorded: HashMap<Seq, (CommandIdentity, Option<Payload>)> = unwalked
            .iter()
            .filter_map(|entry| {
                let (seq, identity) = entry.command()?;
                let value = match entry {
                    Entry::ValueRecorded { value, .. } => Some(value.clone()),
                    _ => None,
                };
                Some((seq, (identity.clone(), value)))
            })
            .collect();
        let phase = if unwalked.is_empty() {
            Phase::Live
        } else {
            Phase::Replaying
        };
        Self {
            had_commands: !recorded.is_empty(),
            recorded,
            unwalked,
            next_seq: 0,
            phase,
            states: HashMap::new(),
            meta: HashMap::new(),
            settled_attempts: HashMap::new(),
            abandoned: HashSet::new(),
            dropped: Vec::new(),
        }
    }

    /// What the journal recorded at `seq` (its identity, and the attempt that settled it if it
    /// is an activity): what a replayed step's span shows. Known until the step is delivered.
    pub fn recorded_step(&self, seq: Seq) -> Option<(&CommandIdentity, Option<u32>)> {
        let (identity, _) = self.recorded.get(&seq)?;
        Some((identity, self.settled_attempts.get(&seq).copied()))
    }

    /// Whether the journal this cursor replays recorded any command (a run that got past its
    /// start).
    pub fn had_commands(&self) -> bool {
        self.had_commands
    }

    /// A replayed outcome of `seq` was delivered: nothing about it is needed any more.
    pub fn forget(&mut self, seq: Seq) {
        self.recorded.remove(&seq);
        self.settled_attempts.remove(&seq);
    }

    /// The code issued `identity`: takes the next seq and compares it with the journal.
    pub fn issue(&mut self, identity: CommandIdentity) -> Result<Issued, Box<Divergence>> {
        self.check_not_diverged()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some((recorded, value)) = self.recorded.get_mut(&seq) else {
            return Ok(Issued::New { seq });
        };
        if *recorded != identity {
            let recorded = Some(recorded.clone());
            return Err(self.diverge(seq, recorded, Some(identity)));
        }
        let value = value.take();
        if !is_delivered(identity.kind) {
            // Nothing is delivered for it: its identity is not needed after this.
            self.recorded.remove(&seq);
        }
        Ok(Issued::Recorded { seq, value })
    }

    /// `ctx.patched(id)`: `None` while replaying a journal written before the patch existed (the
    /// old path: no seq is taken, so old journals keep lining up); otherwise the marker command,
    /// recorded or new, and the code takes the new path.
    pub fn patched(
        &mut self,
        identity: CommandIdentity,
    ) -> Result<Option<Issued>, Box<Divergence>> {
        self.check_not_diverged()?;
        match self.recorded.get(&self.next_seq) {
            Some((recorded, _)) if *recorded == identity => self.issue(identity).map(Some),
            Some(_) => Ok(None),
            None if self.phase == Phase::Replaying => Ok(None),
            None => self.issue(identity).map(Some),
        }
    }

    /// Walks the journal to the next thing to deliver. `Ok(None)`: history is exhausted and the
    /// run is live from here.
    pub fn next_replay_event(&mut self) -> Result<Option<ReplayEvent>, ReplayFault> {
        self.check_not_diverged()?;
        while let Some(entry) = self.unwalked.pop_front() {
            if self.unwalked.is_empty() {
                self.phase = Phase::Live;
            }
            if let Some(event) = self.walk(entry)? {
                return Ok(Some(event));
            }
        }
        self.phase = Phase::Live;
        Ok(None)
    }

    fn walk(&mut self, entry: Entry) -> Result<Option<ReplayEvent>, ReplayFault> {
        if let Some((seq, identity)) = entry.command() {
            if seq >= self.next_seq {
                // By the time live execution journaled this command, the code had issued it.
                return Err(self.diverge(seq, Some(identity.clone()), None).into());
            }
        }
        let resolve = |seq, resolution| Some(ReplayEvent::Resolve { seq, resolution });
        let event = match entry {
            Entry::ActivityScheduled { seq, .. } => {
                self.set(seq, CommandState::Running { attempt: 1 });
                None
            }
            Entry::ActivityScheduledAt {
                seq,
                scheduled_at_ms,
                idempotency_key,
                ..
            } => {
                self.set(seq, CommandState::Running { attempt: 1 });
                let meta = CommandMeta {
                    scheduled_at_ms: Some(scheduled_at_ms),
                    idempotency_key,
                    ..CommandMeta::default()
                };
                self.set_meta(seq, meta);
                None
            }
            Entry::EffectUncertain { seq, attempt, .. } => {
                self.begin_reconciling(seq, attempt, 0);
                None
            }
            Entry::EffectReconciled {
                seq,
                attempt,
                verdict,
                ..
            } => self.walk_verdict(seq, attempt, verdict),
            Entry::TimerStarted {
                seq, fire_at_ms, ..
            } => {
                self.wait_timer(seq, fire_at_ms);
                None
            }
            Entry::WaitDropped { seq } => {
                self.check_dropped(seq)?;
                self.dropped.retain(|wait| wait.seq != seq);
                self.set(seq, CommandState::Done);
                None
            }
            Entry::ValueRecorded { seq, .. } => {
                self.set(seq, CommandState::Done);
                None
            }
            Entry::SignalAwaited { seq, identity } => {
                self.listen(seq, identity.name);
                None
            }
            Entry::SignalReceived { seq, payload, .. } => {
                self.settle_wait(seq, Resolution::Completed(payload))
            }
            Entry::SnapshotCompleted {
                seq,
                artifact,
                attempt,
            } => {
                self.settled_attempts.insert(seq, attempt);
                self.set(seq, CommandState::Done);
                resolve(seq, Resolution::Snapshot(artifact))
            }
            Entry::ArtifactCommitted { seq, .. } => {
                self.set(seq, CommandState::Done);
                None
            }
            Entry::ApprovalRequested {
                seq,
                artifact_hash,
                expires_at_ms,
                ..
            } => {
                self.await_approval(seq, artifact_hash, expires_at_ms);
                None
            }
            Entry::ApprovalDecided { seq, decision } => {
                let decision = Payload::encode(&decision).unwrap_or_else(|_| Payload::unit());
                self.settle_wait(seq, Resolution::Completed(decision))
            }
            Entry::ActivityAttemptFailed {
                seq,
                attempt,
                retry_at_ms,
                ..
            } => {
                self.record_attempt_failure(seq, attempt, retry_at_ms)?;
                None
            }
            Entry::ActivityCompleted {
                seq,
                output,
                attempt,
            } => {
                self.settled_attempts.insert(seq, attempt);
                self.set(seq, CommandState::Done);
                resolve(seq, Resolution::Completed(output))
            }
            Entry::ActivityFailed {
                seq,
                failure,
                attempt,
            } => {
                self.settled_attempts.insert(seq, attempt);
                self.set(seq, CommandState::Done);
                resolve(seq, Resolution::Failed(failure))
            }
            Entry::TimerFired { seq } => self.settle_wait(seq, Resolution::Fired),
            ended @ (Entry::WorkflowCompleted { .. } | Entry::WorkflowFailed { .. }) => {
                Some(ReplayEvent::Ended(ended))
            }
            Entry::WorkflowStarted(_) => None,
        };
        Ok(event)
    }

    fn walk_verdict(
        &mut self,
        seq: Seq,
        attempt: u32,
        verdict: Reconciliation,
    ) -> Option<ReplayEvent> {
        match verdict {
            Reconciliation::Committed(output) => {
                self.set(seq, CommandState::Done);
                return Some(ReplayEvent::Resolve {
                    seq,
                    resolution: Resolution::Completed(output),
                });
            }
            Reconciliation::StillUnknown { recheck_at_ms, .. } => {
                let checks = match self.state(seq) {
                    Some(CommandState::Reconciling { checks, .. }) => checks.saturating_add(1),
                    _ => 1,
                };
                let state = CommandState::Reconciling {
                    attempt,
                    checks,
                    recheck_at_ms,
                };
                self.set(seq, state);
            }
            Reconciliation::AwaitingOperator { .. } => {
                self.set(seq, CommandState::AwaitingOperator { attempt });
            }
            // What follows is told by the next entry (a retry or the final failure).
            Reconciliation::NotFound | Reconciliation::Failed { .. } => {}
        }
        None
    }

    /// An effect attempt's outcome became unknown: reconcile it now.
    pub fn begin_reconciling(&mut self, seq: Seq, attempt: u32, now_ms: u64) {
        let state = CommandState::Reconciling {
            attempt,
            checks: 0,
            recheck_at_ms: now_ms,
        };
        self.set(seq, state);
    }

    /// `seq` waits for the next signal named `name` (unless the code dropped the wait).
    pub fn listen(&mut self, seq: Seq, name: String) {
        if self.abandoned.remove(&seq) {
            return;
        }
        self.set(seq, CommandState::Listening);
        let meta = CommandMeta {
            signal: Some(name),
            ..CommandMeta::default()
        };
        self.set_meta(seq, meta);
    }

    /// `seq` waits for a decision on artifact `hash` (unless the code dropped the request,
    /// whose expiry timer is then cancelled).
    pub fn await_approval(
        &mut self,
        seq: Seq,
        hash: crate::journal::Digest,
        expires_at_ms: Option<u64>,
    ) {
        if self.abandoned.remove(&seq) {
            self.journal_dropped(seq, expires_at_ms);
            return;
        }
        self.set(seq, CommandState::AwaitingApproval { expires_at_ms });
        let meta = CommandMeta {
            approval_hash: Some(hash),
            ..CommandMeta::default()
        };
        self.set_meta(seq, meta);
    }

    /// `seq`'s timer waits to fire at `fire_at_ms` (unless the code dropped it: then it is
    /// cancelled).
    pub fn wait_timer(&mut self, seq: Seq, fire_at_ms: u64) {
        if self.abandoned.remove(&seq) {
            self.journal_dropped(seq, Some(fire_at_ms));
            return;
        }
        self.set(seq, CommandState::Waiting { fire_at_ms });
    }

    /// The code dropped its wait at `seq` (a signal, an approval or a timer that lost a
    /// `select!`): nothing is delivered to it any more, and its timer, if it has one, is
    /// cancelled. A wait not open yet (issued in this very poll, or not walked yet on replay)
    /// is remembered and never opens. Dropping happens at the same point of every replay, so
    /// this is as deterministic as the code. Activities are not waits: they run on.
    pub fn abandon(&mut self, seq: Seq) {
        // Nothing is delivered to it, so what a delivery would name is not needed either.
        self.forget(seq);
        match self.state(seq) {
            Some(CommandState::Listening) => self.set(seq, CommandState::Done),
            Some(CommandState::AwaitingApproval { expires_at_ms }) => {
                self.set(seq, CommandState::Done);
                self.journal_dropped(seq, expires_at_ms);
            }
            Some(CommandState::Waiting { fire_at_ms }) => {
                self.set(seq, CommandState::Done);
                self.journal_dropped(seq, Some(fire_at_ms));
            }
            Some(_) => {}
            None if seq < self.next_seq => {
                self.abandoned.insert(seq);
            }
            None => {}
        }
    }

    /// Whether the code dropped the wait at `seq` before it opened.
    pub fn is_abandoned(&self, seq: Seq) -> bool {
        self.abandoned.contains(&seq)
    }

    /// An outcome for `seq` arrived: `true` if the code dropped its wait, so the outcome goes
    /// nowhere. Either way nothing more comes for `seq`, so it is not remembered as dropped.
    pub fn take_abandoned(&mut self, seq: Seq) -> bool {
        self.abandoned.remove(&seq)
    }

    fn journal_dropped(&mut self, seq: Seq, fire_at_ms: Option<u64>) {
        self.dropped.push(DroppedWait { seq, fire_at_ms });
    }

    /// Sleeps and approval requests the code dropped that the journal does not say are dropped
    /// yet: the executor journals `WaitDropped` for each, with its timer row's deletion.
    pub fn take_dropped_waits(&mut self) -> Vec<DroppedWait> {
        std::mem::take(&mut self.dropped)
    }

    /// Whether a dropped wait is still to be journaled.
    pub fn has_dropped_waits(&self) -> bool {
        !self.dropped.is_empty()
    }

    /// Pending approval requests in seq order, with the artifact hash each waits on.
    pub fn pending_approvals(&self) -> Vec<(Seq, crate::journal::Digest)> {
        let unresolved = self.unresolved().into_iter();
        let pending =
            unresolved.filter(|(_, state)| matches!(state, CommandState::AwaitingApproval { .. }));
        let hashed = pending.filter_map(|(seq, _)| Some((seq, self.meta(seq)?.approval_hash?)));
        hashed.collect()
    }

    /// Signal waits in seq order, with the name each listens for: the oldest wait gets the
    /// oldest signal.
    pub fn listeners(&self) -> Vec<(Seq, String)> {
        let unresolved = self.unresolved().into_iter();
        let listening = unresolved.filter(|(_, state)| *state == CommandState::Listening);
        let named = listening.filter_map(|(seq, _)| Some((seq, self.meta(seq)?.signal.clone()?)));
        named.collect()
    }

    /// Records what the journal (or a new command) says about `seq` besides its identity.
    pub fn set_meta(&mut self, seq: Seq, meta: CommandMeta) {
        self.meta.insert(seq, meta);
    }

    /// What is known about `seq` besides its identity.
    pub fn meta(&self, seq: Seq) -> Option<&CommandMeta> {
        self.meta.get(&seq)
    }

    /// How many commands the code has issued: the seq the next one will take.
    pub fn issued(&self) -> Seq {
        self.next_seq
    }

    /// Whether recorded history is still being walked.
    pub fn is_replaying(&self) -> bool {
        self.phase == Phase::Replaying
    }

    /// The first divergence, if any.
    pub fn divergence(&self) -> Option<&Divergence> {
        match &self.phase {
            Phase::Diverged(d) => Some(d),
            _ => None,
        }
    }

    /// A new command was journaled: track it from its first attempt or as a waiting timer.
    /// `Done` forgets it: a settled command holds nothing here.
    pub fn set(&mut self, seq: Seq, state: CommandState) {
        if state == CommandState::Done {
            self.states.remove(&seq);
            self.meta.remove(&seq);
        } else {
            self.states.insert(seq, state);
        }
    }

    /// Where `seq` stands.
    pub fn state(&self, seq: Seq) -> Option<CommandState> {
        self.states.get(&seq).copied()
    }

    /// Commands that are neither resolved nor values: what the executor must (re)start after
    /// replay. Sorted by seq so restarts happen in a deterministic order.
    pub fn unresolved(&self) -> Vec<(Seq, CommandState)> {
        let mut open: Vec<_> = self
            .states
            .iter()
            .map(|(seq, state)| (*seq, *state))
            .collect();
        open.sort_by_key(|(seq, _)| *seq);
        open
    }

    /// How many commands are open, and how many facts about settled ones are still kept:
    /// neither grows with the length of the history.
    pub fn footprint(&self) -> (usize, usize) {
        let open = self.states.len() + self.abandoned.len() + self.dropped.len();
        let kept = self.recorded.len() + self.meta.len() + self.settled_attempts.len();
        (open, kept)
    }

    /// Fencing: whether a completion of `attempt` for `seq` is the current one. A late answer
    /// from an attempt that timed out, or any answer for a resolved command, is not.
    pub fn is_current_attempt(&self, seq: Seq, attempt: u32) -> bool {
        self.state(seq) == Some(CommandState::Running { attempt })
    }

    /// A failed attempt was journaled; the next one waits for `retry_at_ms`. An attempt number
    /// at the end of its range (a crafted or corrupt journal) cannot be followed.
    pub fn record_attempt_failure(
        &mut self,
        seq: Seq,
        attempt: u32,
        retry_at_ms: u64,
    ) -> Result<(), ReplayFault> {
        let Some(next_attempt) = attempt.checked_add(1) else {
            return Err(ReplayFault::Inconsistent {
                seq,
                message: format!("attempt {attempt} failed, and no attempt number follows it"),
            });
        };
        self.set(
            seq,
            CommandState::Backoff {
                next_attempt,
                retry_at_ms,
            },
        );
        Ok(())
    }

    /// The backoff of `seq` ended: its next attempt is now the current one. `None` if `seq` is
    /// not backing off (a duplicate or stale retry signal).
    pub fn start_retry(&mut self, seq: Seq) -> Option<u32> {
        let CommandState::Backoff { next_attempt, .. } = self.state(seq)? else {
            return None;
        };
        self.set(
            seq,
            CommandState::Running {
                attempt: next_attempt,
            },
        );
        Some(next_attempt)
    }

    /// A wait's outcome from the journal. Live, an outcome can be journaled before the code
    /// drops its wait (several journaled at once are delivered one per poll, and an earlier one
    /// made the code drop this wait): it was delivered to nothing, and the drop was not
    /// journaled, the outcome having closed the wait. On replay the code drops the wait before
    /// the outcome is walked; so here too the outcome goes nowhere, and the drop is not
    /// journaled again.
    fn settle_wait(&mut self, seq: Seq, resolution: Resolution) -> Option<ReplayEvent> {
        let open = self.states.contains_key(&seq);
        self.set(seq, CommandState::Done);
        if open {
            return Some(ReplayEvent::Resolve { seq, resolution });
        }
        self.dropped.retain(|wait| wait.seq != seq);
        None
    }

    /// The journal says the code dropped the wait at `seq`: by now, on replay, it has dropped
    /// it again, unless the code changed.
    fn check_dropped(&mut self, seq: Seq) -> Result<(), Box<Divergence>> {
        let open = matches!(
            self.state(seq),
            Some(CommandState::Waiting { .. } | CommandState::AwaitingApproval { .. })
        );
        if !open {
            return Ok(());
        }
        let recorded = self
            .recorded
            .get(&seq)
            .map(|(identity, _)| identity.clone());
        Err(self.diverge_as(Mismatch::WaitKept, seq, recorded, None))
    }

    fn check_not_diverged(&self) -> Result<(), Box<Divergence>> {
        match &self.phase {
            Phase::Diverged(d) => Err(d.clone()),
            _ => Ok(()),
        }
    }

    fn diverge(
        &mut self,
        seq: Seq,
        recorded: Option<CommandIdentity>,
        issued: Option<CommandIdentity>,
    ) -> Box<Divergence> {
        self.diverge_as(Mismatch::Command, seq, recorded, issued)
    }

    fn diverge_as(
        &mut self,
        mismatch: Mismatch,
        seq: Seq,
        recorded: Option<CommandIdentity>,
        issued: Option<CommandIdentity>,
    ) -> Box<Divergence> {
        let divergence = Box::new(Divergence {
            seq,
            recorded,
            issued,
            mismatch,
        });
        self.phase = Phase::Diverged(divergence.clone());
        divergence
    }
}

/// Whether an outcome is delivered for commands of `kind` (values and artifacts are answered
/// when issued).
fn is_delivered(kind: CommandKind) -> bool {
    !matches!(
        kind,
        CommandKind::Now
            | CommandKind::Random
            | CommandKind::Uuid
            | CommandKind::Patch
            | CommandKind::Verdict
            | CommandKind::Artifact
    )
}

/// Identity of an artifact commit: its hash is the digest.
pub fn artifact_identity(kind: &str, hash: crate::journal::Digest) -> CommandIdentity {
    CommandIdentity {
        kind: CommandKind::Artifact,
        name: kind.to_owned(),
        input_digest: hash,
    }
}

/// Identity of an approval request for artifact `hash`.
pub fn approval_identity(hash: crate::journal::Digest) -> CommandIdentity {
    let digest = crate::journal::Digest::of(hash.hex().as_bytes());
    CommandIdentity {
        kind: CommandKind::Approval,
        name: "approval".to_owned(),
        input_digest: digest,
    }
}

/// Identity of a signal wait.
pub fn signal_identity(name: &str) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Signal, name, &Payload::unit())
}

/// Identity of a timer command.
pub fn timer_identity(duration_ms: u64) -> CommandIdentity {
    CommandIdentity::new(CommandKind::Timer, "sleep", &Payload::from_u64(duration_ms))
}

/// Identity of a recorded value (`now`, `random`, `uuid`) or a patch marker.
pub fn value_identity(kind: CommandKind, name: &str) -> CommandIdentity {
    CommandIdentity::new(kind, name, &Payload::unit())
}

#[cfg(test)]
mod tests;
