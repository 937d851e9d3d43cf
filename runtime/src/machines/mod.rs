//! One synchronous state machine per command kind, free of I/O: no tokio, no store, no clock
//! reads (time comes in as a value).
//!
//! A command's state is the fold of its journal entries through [`Commands::apply`]: on replay
//! the cursor applies each recorded entry, live the executor applies exactly the entries it has
//! just written. Two other inputs reach it the same way on replay: time, when a retry's backoff
//! ends ([`Commands::start_retry`], from the journaled `retry_at_ms`), and the code, when it
//! drops a wait ([`Commands::abandon`], at the same point of the code).
//! What a command needs next (run an attempt, wait for a retry, arm a timer, reconcile) comes
//! out as a [`Decision`]; how the protocol goes on after an answer (retry or fail, call or
//! reconcile, recheck or park) comes out of the kind's own file as a value. The executor
//! performs them and decides no step of a protocol itself.
//!
//! A new command kind is a new file here: its machine, its `apply` arms, its decisions, and a
//! variant of `Machine`.

pub mod activity;
pub mod approval;
mod calls;
pub mod effect;
pub mod signal;
pub mod timer;
pub mod value;

#[cfg(test)]
mod tests;

use crate::journal::{Digest, Entry, Failure, Payload, Seq, SeqMap, SeqSet};

pub use calls::CallCounts;
pub(crate) use calls::CallTally;

use activity::Activity;
use approval::Approval;
use signal::Signal;
use timer::Timer;

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
    Snapshot(Digest),
}

/// An entry settled a command: deliver `resolution` to the future at `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    /// The command.
    pub seq: Seq,
    /// Its outcome.
    pub resolution: Resolution,
}

/// Where an open command stands: the view of every kind's machine that the executor and its
/// telemetry read.
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
        /// When to ask (again); 0: at once.
        recheck_at_ms: u64,
    },
    /// Reconciliation gave up; an operator must settle the attempt.
    AwaitingOperator {
        /// The attempt whose outcome is unknown.
        attempt: u32,
    },
    /// Waits for a signal.
    Listening,
    /// Waits for a person's decision on an artifact.
    AwaitingApproval {
        /// When the request expires, if it does.
        expires_at_ms: Option<u64>,
    },
}

/// Who a run waits for, as its workflow record shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingFor {
    /// An operator must settle an effect whose outcome is unknown.
    Operator,
    /// A person must decide an approval request.
    Approval,
    /// A signal must arrive.
    Signal,
}

/// What an open command needs from the executor now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run `attempt` (an effect: once its operation log says a call is safe).
    Attempt {
        /// The command.
        seq: Seq,
        /// The attempt.
        attempt: u32,
    },
    /// Start the next attempt at `at_ms`.
    RetryAt {
        /// The command.
        seq: Seq,
        /// When.
        at_ms: u64,
    },
    /// Arm the timer row firing at `fire_at_ms` (a sleep, or an approval request's expiry).
    Arm {
        /// The command.
        seq: Seq,
        /// When.
        fire_at_ms: u64,
    },
    /// Ask the reconciler about `attempt` at `at_ms` (at once if that has passed).
    Reconcile {
        /// The command.
        seq: Seq,
        /// The attempt whose outcome is unknown.
        attempt: u32,
        /// Answers so far that could not tell: a recheck for another count is stale.
        checks: u32,
        /// When.
        at_ms: u64,
    },
}

/// An entry that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// The journal says the code dropped its wait at `seq`; the code still waits.
    WaitKept {
        /// The command.
        seq: Seq,
    },
    /// The entry does not follow from the ones before it (a corrupt or crafted journal).
    Inconsistent {
        /// The command.
        seq: Seq,
        /// What is wrong.
        message: String,
    },
}

impl Conflict {
    pub(crate) fn inconsistent(seq: Seq, message: impl Into<String>) -> Self {
        Conflict::Inconsistent {
            seq,
            message: message.into(),
        }
    }
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

/// The machine of one open command.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Machine {
    Activity(Activity),
    Timer(Timer),
    Signal(Signal),
    Approval(Approval),
}

impl Machine {
    fn state(&self) -> CommandState {
        match self {
            Machine::Activity(activity) => activity.state(),
            Machine::Timer(timer) => timer.state(),
            Machine::Signal(_) => CommandState::Listening,
            Machine::Approval(approval) => approval.state(),
        }
    }

    /// The timer row this command keeps, if any.
    fn timer(&self) -> Option<u64> {
        match self {
            Machine::Timer(timer) => Some(timer.fire_at_ms()),
            Machine::Approval(approval) => approval.expires_at_ms(),
            Machine::Activity(_) | Machine::Signal(_) => None,
        }
    }
}

/// The open commands of one run, each in its kind's machine.
///
/// A settled command leaves: what this holds grows with the commands in flight, not with the
/// length of the history.
#[derive(Debug, Default)]
pub struct Commands {
    open: SeqMap<Machine>,
    calls: CallTally,
    /// The attempt that settled each activity not delivered yet, for its span.
    settled_attempts: SeqMap<u32>,
    /// Waits the code dropped before their entry was applied.
    abandoned: SeqSet,
    /// Sleeps and approval requests the code dropped that are not journaled as dropped yet.
    dropped: Vec<DroppedWait>,
}

impl Commands {
    /// The open commands after `entries`, with no code running: what a journal alone says
    /// (the timers a stored run still waits for, say). Entries that do not follow from the ones
    /// before them are passed over and handed back, so that a run whose journal does not add
    /// up (one that is stuck for it) can still be cancelled and its timer rows deleted.
    pub fn fold<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> (Self, Vec<Conflict>) {
        let mut commands = Self::default();
        let mut passed_over = Vec::new();
        for entry in entries {
            match entry {
                // On replay the code drops the wait before its drop is applied; with no code
                // running, the entry drops it.
                Entry::WaitDropped { seq } => {
                    commands.open.remove(seq);
                }
                entry => {
                    if let Err(conflict) = commands.apply(entry) {
                        passed_over.push(conflict);
                    }
                }
            }
        }
        (commands, passed_over)
    }

    /// Applies one journal entry. `Some` when it settles a command whose outcome the code
    /// still waits for.
    pub fn apply(&mut self, entry: &Entry) -> Result<Option<Settled>, Conflict> {
        self.calls.apply(entry);
        let settled = match entry {
            Entry::ActivityScheduled { seq, .. } => {
                self.insert(*seq, Machine::Activity(Activity::scheduled(None, None)))?;
                None
            }
            Entry::ActivityScheduledAt {
                seq,
                scheduled_at_ms,
                idempotency_key,
                ..
            } => {
                let activity = Activity::scheduled(Some(*scheduled_at_ms), idempotency_key.clone());
                self.insert(*seq, Machine::Activity(activity))?;
                None
            }
            Entry::ActivityAttemptFailed {
                seq,
                attempt,
                retry_at_ms,
                ..
            } => {
                self.activity_mut(*seq)?
                    .attempt_failed(*seq, *attempt, *retry_at_ms)?;
                None
            }
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
            } => {
                self.activity_mut(*seq)?.completes(*seq, *attempt)?;
                let resolution = Resolution::Completed(output.clone());
                Some(self.settle_activity(*seq, Some(*attempt), resolution)?)
            }
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
            } => {
                let resolution = Resolution::Failed(failure.clone());
                Some(self.settle_activity(*seq, Some(*attempt), resolution)?)
            }
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
            } => {
                self.activity_mut(*seq)?.completes(*seq, *attempt)?;
                let resolution = Resolution::Snapshot(*artifact);
                Some(self.settle_activity(*seq, Some(*attempt), resolution)?)
            }
            Entry::EffectUncertain { seq, attempt, .. } => {
                self.activity_mut(*seq)?.uncertain(*seq, *attempt)?;
                None
            }
            Entry::EffectReconciled {
                seq,
                attempt,
                verdict,
                ..
            } => match self
                .activity_mut(*seq)?
                .reconciled(*seq, *attempt, verdict)?
            {
                Some(output) => {
                    let resolution = Resolution::Completed(output);
                    // Settled by a verdict, not by an attempt's answer.
                    Some(self.settle_activity(*seq, None, resolution)?)
                }
                None => None,
            },
            Entry::TimerStarted {
                seq, fire_at_ms, ..
            } => {
                self.open_wait(*seq, Machine::Timer(Timer::new(*fire_at_ms)))?;
                None
            }
            Entry::TimerFired { seq } | Entry::TimerFiredAt { seq, .. } => {
                self.settle_wait(*seq, Resolution::Fired)
            }
            Entry::SignalAwaited { seq, identity }
            | Entry::SignalAwaitedAt { seq, identity, .. } => {
                self.open_wait(*seq, Machine::Signal(Signal::new(&identity.name)))?;
                None
            }
            Entry::SignalReceived { seq, payload, .. }
            | Entry::SignalReceivedFrom { seq, payload, .. }
            | Entry::SignalReceivedAt { seq, payload, .. } => {
                self.settle_wait(*seq, Resolution::Completed(payload.clone()))
            }
            Entry::ApprovalRequested {
                seq,
                artifact_hash,
                expires_at_ms,
                ..
            }
            | Entry::ApprovalRequestedAt {
                seq,
                artifact_hash,
                expires_at_ms,
                ..
            } => {
                let approval = Approval::new(*artifact_hash, *expires_at_ms);
                self.open_wait(*seq, Machine::Approval(approval))?;
                None
            }
            Entry::ApprovalDecided { seq, decision } => {
                let delivered = approval::delivered(*seq, decision)?;
                self.settle_wait(*seq, Resolution::Completed(delivered))
            }
            Entry::WaitDropped { seq } => {
                self.wait_dropped(*seq)?;
                None
            }
            // Values and artifacts are answered when issued: nothing stays open.
            Entry::ValueRecorded { .. } | Entry::ArtifactCommitted { .. } => None,
            // The run's ends are the replay loop's, not a command's.
            Entry::WorkflowStarted(_)
            | Entry::WorkflowCompleted { .. }
            | Entry::WorkflowFailed { .. }
            | Entry::CancelRequested { .. } => None,
            // Who started it, and where a fork came from, are for the record, not for a
            // command.
            Entry::StartedBy { .. } | Entry::Forked(_) => None,
        };
        Ok(settled)
    }

    /// The calls of the entries applied so far: what a run that ends needed and took, without
    /// reading its journal back.
    pub fn calls(&self) -> CallCounts {
        self.calls.counts()
    }

    fn insert(&mut self, seq: Seq, machine: Machine) -> Result<(), Conflict> {
        if self.open.contains_key(&seq) {
            return Err(Conflict::inconsistent(
                seq,
                "a second command at an open seq",
            ));
        }
        self.open.insert(seq, machine);
        Ok(())
    }

    /// Opens a wait, unless the code dropped it before: a dropped timer (a sleep, an expiry)
    /// is then cancelled.
    fn open_wait(&mut self, seq: Seq, machine: Machine) -> Result<(), Conflict> {
        if self.abandoned.remove(&seq) {
            if let Machine::Timer(_) | Machine::Approval(_) = machine {
                let fire_at_ms = machine.timer();
                self.dropped.push(DroppedWait { seq, fire_at_ms });
            }
            return Ok(());
        }
        self.insert(seq, machine)
    }

    fn activity_mut(&mut self, seq: Seq) -> Result<&mut Activity, Conflict> {
        match self.open.get_mut(&seq) {
            Some(Machine::Activity(activity)) => Ok(activity),
            _ => Err(Conflict::inconsistent(
                seq,
                "no activity is open at this seq",
            )),
        }
    }

    fn settle_activity(
        &mut self,
        seq: Seq,
        attempt: Option<u32>,
        resolution: Resolution,
    ) -> Result<Settled, Conflict> {
        self.activity_mut(seq)?;
        self.open.remove(&seq);
        if let Some(attempt) = attempt {
            self.settled_attempts.insert(seq, attempt);
        }
        Ok(Settled { seq, resolution })
    }

    /// A wait's outcome. Live, an outcome can be journaled before the code drops its wait
    /// (several journaled at once are delivered one per poll, and an earlier one made the code
    /// drop this wait): it was delivered to nothing, and the drop was not journaled, the
    /// outcome having closed the wait. On replay the code drops the wait before the outcome is
    /// applied; so here too the outcome goes nowhere, and the drop is not journaled again.
    fn settle_wait(&mut self, seq: Seq, resolution: Resolution) -> Option<Settled> {
        if self.open.remove(&seq).is_some() {
            return Some(Settled { seq, resolution });
        }
        self.dropped.retain(|wait| wait.seq != seq);
        None
    }

    /// The journal says the code dropped the wait at `seq`: by now, on replay, it has dropped
    /// it again, unless the code changed.
    fn wait_dropped(&mut self, seq: Seq) -> Result<(), Conflict> {
        if let Some(Machine::Timer(_) | Machine::Approval(_)) = self.open.get(&seq) {
            return Err(Conflict::WaitKept { seq });
        }
        self.dropped.retain(|wait| wait.seq != seq);
        Ok(())
    }

    /// The code dropped its wait at `seq` (a signal, an approval or a timer that lost a
    /// `select!`): nothing is delivered to it any more, and its timer, if it has one, is
    /// cancelled. A wait issued but not open yet (issued in this very poll, or not applied yet
    /// on replay) is remembered and never opens. Activities are not waits: they run on.
    pub fn abandon(&mut self, seq: Seq, issued: bool) {
        match self.open.get(&seq) {
            Some(Machine::Activity(_)) => {}
            Some(machine) => {
                let fire_at_ms = machine.timer();
                let keeps_row = !matches!(machine, Machine::Signal(_));
                self.open.remove(&seq);
                if keeps_row {
                    self.dropped.push(DroppedWait { seq, fire_at_ms });
                }
            }
            None if issued => {
                self.abandoned.insert(seq);
            }
            None => {}
        }
    }

    /// Whether the code dropped the wait at `seq` before its entry was applied.
    pub fn is_abandoned(&self, seq: Seq) -> bool {
        self.abandoned.contains(&seq)
    }

    /// An outcome for `seq` is being delivered: `true` if the code dropped its wait, so the
    /// outcome goes nowhere. Either way nothing more comes for `seq`.
    pub fn take_abandoned(&mut self, seq: Seq) -> bool {
        self.abandoned.remove(&seq)
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

    /// A settled outcome of `seq` was delivered: nothing about it is needed any more.
    pub fn forget(&mut self, seq: Seq) {
        self.settled_attempts.remove(&seq);
    }

    /// The attempt that settled the activity at `seq`, until its outcome is delivered.
    pub fn settled_attempt(&self, seq: Seq) -> Option<u32> {
        self.settled_attempts.get(&seq).copied()
    }

    /// Where `seq` stands; `None` once it is settled (or if it never opened).
    pub fn state(&self, seq: Seq) -> Option<CommandState> {
        self.open.get(&seq).map(Machine::state)
    }

    /// The open commands in seq order, so that what follows from them happens in a
    /// deterministic order.
    pub fn open_commands(&self) -> Vec<(Seq, CommandState)> {
        let mut open: Vec<_> = self
            .open
            .iter()
            .map(|(seq, machine)| (*seq, machine.state()))
            .collect();
        open.sort_by_key(|(seq, _)| *seq);
        open
    }

    /// The states of the open commands, in no order: for a question about all of them, which
    /// a step asks at its end (whether the run may leave memory) and need not sort for.
    pub fn open_states(&self) -> impl Iterator<Item = CommandState> + '_ {
        self.open.values().map(Machine::state)
    }

    /// What the open command at `seq` needs now; `None` if it waits for someone else (a
    /// signal, a person, an operator).
    pub fn decision(&self, seq: Seq) -> Option<Decision> {
        match self.open.get(&seq)? {
            Machine::Activity(activity) => activity.decision(seq),
            Machine::Timer(timer) => Some(Decision::Arm {
                seq,
                fire_at_ms: timer.fire_at_ms(),
            }),
            Machine::Approval(approval) => approval
                .expires_at_ms()
                .map(|fire_at_ms| Decision::Arm { seq, fire_at_ms }),
            Machine::Signal(_) => None,
        }
    }

    /// What every open command needs, in seq order: what a run resumed after replay starts.
    pub fn decisions(&self) -> Vec<Decision> {
        let open = self.open_commands().into_iter();
        open.filter_map(|(seq, _)| self.decision(seq)).collect()
    }

    /// The timer rows the open commands keep, in seq order, with the dropped waits whose rows
    /// are not deleted yet.
    pub fn timers(&self) -> Vec<(Seq, u64)> {
        let mut timers: Vec<(Seq, u64)> = self
            .open
            .iter()
            .filter_map(|(seq, machine)| Some((*seq, machine.timer()?)))
            .collect();
        let dropped = self.dropped.iter();
        timers.extend(dropped.filter_map(|wait| Some((wait.seq, wait.fire_at_ms?))));
        timers.sort_unstable();
        timers
    }

    /// The activity or effect open at `seq`.
    pub fn activity(&self, seq: Seq) -> Option<&Activity> {
        match self.open.get(&seq)? {
            Machine::Activity(activity) => Some(activity),
            _ => None,
        }
    }

    /// The backoff of `seq` ended: the attempt to run now, which is then the current one.
    /// `None` if `seq` is not backing off (a duplicate or stale retry signal).
    pub fn start_retry(&mut self, seq: Seq) -> Option<u32> {
        match self.open.get_mut(&seq)? {
            Machine::Activity(activity) => activity.start_retry(),
            _ => None,
        }
    }

    /// Fencing: whether an answer of `attempt` for `seq` is the current one. A late answer
    /// from an attempt that timed out, or any answer for a settled command, is not.
    pub fn is_current_attempt(&self, seq: Seq, attempt: u32) -> bool {
        self.activity(seq)
            .is_some_and(|activity| activity.is_current_attempt(attempt))
    }

    /// The idempotency key of the effect open at `seq`, as its schedule entry recorded it.
    pub fn effect_key(&self, seq: Seq) -> Option<&str> {
        self.activity(seq)?.idempotency_key()
    }

    /// The timer of `seq` is due: what it settles, if it still waits.
    pub fn timer_due(&self, seq: Seq) -> Option<timer::Due> {
        match self.open.get(&seq)? {
            Machine::Timer(timer) => Some(timer::Due::Fire {
                fire_at_ms: timer.fire_at_ms(),
            }),
            Machine::Approval(approval) => {
                let at_ms = approval.expires_at_ms()?;
                Some(timer::Due::Expire { at_ms })
            }
            _ => None,
        }
    }

    /// Signal waits in seq order, with the name each listens for: the oldest wait gets the
    /// oldest signal.
    pub fn listeners(&self) -> Vec<(Seq, &str)> {
        let mut listening: Vec<(Seq, &str)> = self
            .open
            .iter()
            .filter_map(|(seq, machine)| match machine {
                Machine::Signal(signal) => Some((*seq, signal.name())),
                _ => None,
            })
            .collect();
        listening.sort_unstable();
        listening
    }

    /// Pending approval requests in seq order.
    pub fn pending_approvals(&self) -> Vec<approval::Pending> {
        let mut pending: Vec<approval::Pending> = self
            .open
            .iter()
            .filter_map(|(seq, machine)| match machine {
                Machine::Approval(approval) => Some(approval.pending(*seq)),
                _ => None,
            })
            .collect();
        pending.sort_unstable_by_key(|pending| pending.seq);
        pending
    }

    /// Whether an effect other than `seq` waits for an operator.
    /// What the open commands wait for from outside, the most pressing first: an operator, a
    /// person's approval, a signal. `None` while nothing waits on someone else.
    pub fn waiting_for(&self) -> Option<WaitingFor> {
        // One pass, nothing collected: asked at the end of every step.
        let waits = self.open_states().filter_map(|state| match state {
            CommandState::AwaitingOperator { .. } => Some(WaitingFor::Operator),
            CommandState::AwaitingApproval { .. } => Some(WaitingFor::Approval),
            CommandState::Listening => Some(WaitingFor::Signal),
            _ => None,
        });
        waits.max_by_key(|waiting| match waiting {
            WaitingFor::Operator => 2,
            WaitingFor::Approval => 1,
            WaitingFor::Signal => 0,
        })
    }

    pub fn others_await_operator(&self, seq: Seq) -> bool {
        let open = self.open.iter();
        open.filter(|(other, _)| **other != seq)
            .any(|(_, machine)| matches!(machine.state(), CommandState::AwaitingOperator { .. }))
    }

    /// How many commands are open, and how many facts about settled ones are still kept:
    /// neither grows with the length of the history.
    pub fn footprint(&self) -> (usize, usize) {
        let open = self.open.len() + self.abandoned.len() + self.dropped.len();
        (open, self.settled_attempts.len())
    }
}
