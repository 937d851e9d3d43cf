//! The executor: the I/O shell around one resident workflow, one task per run.
//!
//! It replays the journal through the replay loop ([`crate::run`]), then runs live. Live, it
//! handles one event at a time: journal what the event settles (synced), apply exactly the
//! entries written to the commands' machines ([`crate::machines`]), deliver what they settled,
//! poll the workflow, journal the commands the poll issued, and only then start them.
//!
//! The executor performs; the machines decide. It may read and write the store, spawn attempts,
//! reconcilers and timers, and ask a machine what follows an answer; it may not change a
//! command's state except by applying an entry it wrote (or, for a retry whose time came,
//! telling the machine so). Effects' I/O (the operation log, reconcilers, operators) is in
//! [`effects`], approvals' in [`approvals`].

mod approvals;
mod attempts;
mod effects;
mod flush;
mod host;
mod observe;
mod reads;
mod runs;

use flush::FlushPlan;
pub(crate) use reads::{read_on_blocking_pool, reads, run_reads, Reads};

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::Either;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::approvals::NotApproved;
use crate::artifacts::{artifact_hash, ApprovalVerdict, ArtifactRecord};
use crate::canonical;
use crate::clock::Clock;
use crate::context::{NewCommand, Precondition, StreamVerdict, TelemetryNote, WorkflowCore};
use crate::error::{ApprovalError, CancelError, ResolveError, RunError, Unreachable};
use crate::faults::{Boundary, Fault};
use crate::journal::{
    Digest, Entry, Failure, FailureKind, Payload, ReconciledBy, Seq, SeqMap, WorkflowStarted,
};
use crate::keys::TimerKey;
use crate::lineage::Lineage;
use crate::machines::activity::{jitter, AfterFailure};
use crate::machines::timer::Due;
use crate::machines::{effect, signal};
use crate::machines::{CommandState, Conflict, Decision, Resolution, Settled, WaitingFor};
use crate::operations::{add_operations, OperationRecord, OperationStatus};
use crate::operations::{DecidedOn, OperatorDecision};
use crate::registry::{ActivityInfo, ArtifactReader, ReconcileOutcome};
use crate::replay::ReplayCursor;
use crate::run::{panic_message, Body, Replayed};
use crate::store::{
    Parking, ReplayReads, Store, StoreError, Transition, WorkflowRecord, WorkflowStatus,
};
use crate::streams::{StepStream, StreamItem, VersionSlot};
use crate::telemetry::{ReplayMode, Telemetry, Wake};
pub(crate) use host::Host;
pub(crate) use runs::kept_run_owner;
pub(crate) use runs::{continued_from, keep_run};

/// What the worker sends a resident workflow's executor: its mailbox holds these.
#[derive(Debug)]
pub(crate) enum Mail {
    ActivityDone {
        seq: Seq,
        attempt: u32,
        result: Result<Payload, Failure>,
        external_ref: Option<String>,
        /// Where the response version the attempt streamed under is fixed, if it streamed.
        streamed: Option<VersionSlot>,
    },
    /// A check right before the call refused it (a precondition, the approval): the
    /// downstream was not called.
    Refused {
        seq: Seq,
        attempt: u32,
        failure: Failure,
    },
    Reconciled {
        seq: Seq,
        attempt: u32,
        /// `None`: the effect has no reconciler.
        outcome: Option<Result<ReconcileOutcome, Failure>>,
    },
    /// Time to ask the reconciler again; stale unless the command is still reconciling the
    /// same attempt after the same number of checks.
    RecheckDue {
        seq: Seq,
        attempt: u32,
        checks: u32,
    },
    ResolveOperation {
        seq: Seq,
        /// The operation's idempotency key, as the caller named it.
        key: String,
        /// The attempt the operator looked at; a decision for another one is refused.
        attempt: u32,
        /// The record's revision the decision was made on, if the caller gave one: a decision
        /// about a record that moved on since is refused.
        revision: Option<u32>,
        decision: OperatorDecision,
        /// Who decided: an operator, or the downstream through its webhook.
        by: ReconciledBy,
        reply: oneshot::Sender<Result<(), ResolveError>>,
    },
    RetryDue {
        seq: Seq,
    },
    TimerDue {
        seq: Seq,
    },
    /// A signal reached the workflow's inbox.
    SignalArrived,
    /// A stuck run's pause ended: the rebuild that delivering this causes is the point.
    Resume,
    /// A fault plan crashed the worker inside an attempt.
    Crashed {
        reason: String,
    },
    /// Someone cancelled the workflow: it fails with `reason`, whatever it waits for.
    Cancel {
        failure: Failure,
        reply: oneshot::Sender<Result<(), CancelError>>,
    },
    /// Someone asks what the resident run holds.
    Footprint {
        reply: oneshot::Sender<RunFootprint>,
    },
    /// A person decided on a pending approval.
    DecideApproval {
        hash: Digest,
        /// The request the decision was made for, if the caller named it.
        request: Option<Seq>,
        approver: String,
        verdict: ApprovalVerdict,
        reply: oneshot::Sender<Result<(), ApprovalError>>,
    },
}

impl Mail {
    /// The event cannot be applied (its workflow is stuck): whoever waits for an answer hears
    /// `why`; the rest is durable and comes back with the next rebuild.
    pub(crate) fn refuse(self, workflow_id: &str, why: &str) {
        let unreachable = || Unreachable::not_running(workflow_id, why);
        match self {
            Mail::Cancel { reply, .. } => {
                let _ = reply.send(Err(unreachable().into()));
            }
            Mail::DecideApproval { reply, .. } => {
                let _ = reply.send(Err(unreachable().into()));
            }
            Mail::ResolveOperation { reply, .. } => {
                let _ = reply.send(Err(unreachable().into()));
            }
            _ => {}
        }
    }
}

/// What a cancellation left.
enum Cancelled {
    /// The run ended.
    Ended(Exit),
    /// The undos run in the code's place; `Some` if they already returned.
    Compensating(Option<Result<Payload, Failure>>),
}

/// How a run left the executor.
enum Exit {
    /// Journaled as completed or failed.
    Ended(Result<Payload, Failure>),
    /// Stopped without writing (divergence, corrupt store, …); resumes on the next start.
    Stopped(RunError),
    /// Evicted while waiting on a long timer; rebuilt by replay when it fires.
    Evicted,
    /// Woken after it had ended (a late event): its outcome is already in the store, and it must
    /// leave the router so it does not count as resident.
    AlreadyEnded,
    /// Its journal now holds a new run (continue-as-new), which runs next, and takes the
    /// cancellations and operators' decisions this run left in its mailbox.
    Continued(Vec<Mail>),
}

pub(crate) struct Executor<H> {
    id: Arc<str>,
    host: Arc<H>,
    record: WorkflowRecord,
    core: WorkflowCore,
    body: Body,
    mailbox: mpsc::UnboundedReceiver<Mail>,
    events: mpsc::UnboundedSender<Mail>,
    tasks: JoinSet<()>,
    wake: Wake,
    observed: observe::Observed,
    /// Outcomes journaled and not yet delivered, in journal order: the workflow is polled
    /// after each one, so it sees them one at a time, as replay shows them.
    deliveries: VecDeque<(Seq, Resolution)>,
    /// Signals in the workflow's inbox, by arrival number: every one that arrived after
    /// `inbox_read_up_to` was, and of those before it, the ones `inbox_names_read` says.
    inbox: signal::Unread,
    inbox_read_up_to: u64,
    /// The names whose signals up to `inbox_read_up_to` are in `inbox`: every name (`None`)
    /// for a run this worker started, which had none then; for a run rebuilt by replay, only
    /// the names a wait has listened for since, each read through the inbox's index by name
    /// when one first did. So a rebuild costs nothing for the signals of other names the
    /// inbox holds, however many.
    inbox_names_read: Option<HashSet<String>>,
    /// Retrieval snapshots the journal delivers: read with it for replay, and live the one
    /// just written, until its entry is applied.
    snapshots: HashMap<Digest, Payload>,
    /// The last operation record written or read for each effect not yet settled for good:
    /// a transition continues its history without reading it back.
    operations: SeqMap<OperationRecord>,
    /// Answers of judged steps journaled by this run, waiting for their validators' verdict:
    /// step → the version it streamed (`None`: it did not stream, so no version is settled).
    unvalidated: SeqMap<Option<u32>>,
    /// A flush a crash may lose at no cost (the schedule of reads and recorded values),
    /// applied and not yet written: it goes with the run's next write, or alone before the
    /// run waits. An attempt that answers at its first poll is so journaled with its schedule
    /// in one write.
    held_back: Option<HeldBack>,
    /// Whether the store may hold the workflow's parked mark ([`Store::mark_parked`]): a run
    /// rebuilt may find one, and one that stays after marking keeps it; a new run (a start, a
    /// continue-as-new, a fork, a reset) does not, since what made it took any mark away. The
    /// run's next write deletes it, so that a crash after that write rebuilds the run on start.
    parked_mark: bool,
}

/// A flush held back, and what it counts once written.
struct HeldBack {
    transition: Transition,
    counted: Vec<TelemetryNote>,
}

/// What a resident run holds (`Worker::footprint`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunFootprint {
    /// The workflow's core: open commands, facts and inputs kept.
    pub core: crate::context::Footprint,
    /// Outcomes journaled and not yet delivered.
    pub undelivered: usize,
    /// Signals read from the inbox and not taken.
    pub inbox: usize,
    /// Attempts, reconcilers and retry timers running beside it.
    pub tasks: usize,
    /// Commands with an attempt running now (not waiting for a retry, a timer or a person).
    pub running: usize,
}

/// What an executor reads before it can replay, off the async threads; or, for a workflow
/// this worker has just started, what its start wrote ([`Loaded::fresh`]).
pub(crate) struct Loaded {
    record: WorkflowRecord,
    started: WorkflowStarted,
    /// The entries after `started`.
    entries: std::vec::IntoIter<Entry>,
    /// The last arrival number given to a signal of the workflow; `None` for a run this
    /// worker has just started, whose inbox is empty.
    inbox_last: Option<u64>,
    snapshots: HashMap<Digest, Payload>,
    /// The newest stream event's number.
    stream_last: u64,
}

impl Loaded {
    /// What a workflow's start wrote, `record` and `entries` as committed, which is all a load
    /// would read back: a new workflow has no inbox, snapshot or stream yet (a signal sent once
    /// it exists comes to its mailbox too). `None` if `entries` does not begin with the start.
    pub(crate) fn fresh(record: WorkflowRecord, entries: Vec<Entry>) -> Option<Self> {
        let mut entries = entries.into_iter();
        let Some(Entry::WorkflowStarted(started)) = entries.next() else {
            return None;
        };
        Some(Self {
            record,
            started,
            entries,
            inbox_last: None,
            snapshots: HashMap::new(),
            stream_last: 0,
        })
    }
}

/// Runs workflow `id` until it ends, stops or is evicted. `fresh`: what its start wrote, when
/// this worker has just started it; otherwise the run reads its journal first.
pub(crate) async fn run_workflow<H: Host>(
    host: Arc<H>,
    id: String,
    wake: Wake,
    fresh: Option<Loaded>,
    mailbox: mpsc::UnboundedReceiver<Mail>,
    events: mpsc::UnboundedSender<Mail>,
) {
    let span = observe::run_span(&id, wake);
    host.telemetry().workflow_loaded(wake);
    let run = async {
        let loaded = match fresh {
            Some(fresh) => fresh,
            None => match host.reads().load(&id).await {
                Ok(Some(loaded)) => loaded,
                Ok(None) => return Exit::AlreadyEnded,
                Err(error) => return Exit::Stopped(error),
            },
        };
        match Executor::from_loaded(host.clone(), &id, wake, loaded, mailbox, events.clone()) {
            Ok(executor) => executor.run().await,
            Err(error) => Exit::Stopped(error),
        }
    };
    // A panic outside the workflow's poll (a bug here) must not leave the run without an
    // answer: it stops the run like any other error of the executor.
    let guarded = AssertUnwindSafe(run.instrument(span)).catch_unwind().await;
    let exit = guarded.unwrap_or_else(|panic| {
        let message = format!("the executor panicked: {}", panic_message(&panic));
        Exit::Stopped(RunError::Internal(message))
    });
    match exit {
        Exit::Ended(outcome) => host.ended(&id, &events, outcome),
        Exit::Stopped(error) => {
            warn!(workflow_id = %id, %error, "workflow run stopped");
            host.stopped(&id, &events, wake, error).await;
        }
        Exit::AlreadyEnded => host.found_ended(&id, &events),
        Exit::Continued(commands) => host.continued(&id, &events, commands),
        Exit::Evicted => debug!(workflow_id = %id, "workflow evicted until its timer fires"),
    }
}

impl<H: Host> Executor<H> {
    fn from_loaded(
        host: Arc<H>,
        id: &str,
        wake: Wake,
        loaded: Loaded,
        mailbox: mpsc::UnboundedReceiver<Mail>,
        events: mpsc::UnboundedSender<Mail>,
    ) -> Result<Self, RunError> {
        let Loaded {
            record,
            started,
            entries,
            inbox_last,
            snapshots,
            stream_last,
        } = loaded;
        let workflow = host
            .registry()
            .workflow(&started.workflow_name)
            .ok_or_else(|| RunError::UnknownWorkflow(started.workflow_name.clone()))?;
        let lineage = Lineage::of(entries.as_slice());
        let cursor = ReplayCursor::new(entries);
        let (clock, registry) = (host.clock().clone(), host.registry().clone());
        let (entropy, telemetry) = (host.entropy().clone(), host.telemetry().clone());
        let core = WorkflowCore::new(id, lineage, cursor, clock, entropy, registry, telemetry);
        let future = (workflow.run)(core.clone(), started.input)?;
        let body = Body::new(core.clone(), future);
        let observed = observe::Observed::new(&started.workflow_name, stream_last);
        let inbox_names_read = inbox_last.map(|_| HashSet::new());
        Ok(Self {
            id: id.into(),
            host,
            record,
            core,
            body,
            mailbox,
            events,
            tasks: JoinSet::new(),
            wake,
            observed,
            deliveries: VecDeque::new(),
            inbox: signal::Unread::default(),
            inbox_read_up_to: inbox_last.unwrap_or(0),
            inbox_names_read,
            snapshots,
            operations: SeqMap::default(),
            unvalidated: SeqMap::default(),
            held_back: None,
            parked_mark: !matches!(wake, Wake::Started),
        })
    }

    async fn run(mut self) -> Exit {
        self.run_to_exit().await.unwrap_or_else(Exit::Stopped)
    }

    async fn run_to_exit(&mut self) -> Result<Exit, RunError> {
        let output = match self.replay()? {
            Replayed::Ended { recorded, .. } => return Ok(Exit::Ended(recorded)),
            Replayed::Live(output) => output,
        };
        self.observe_resumed();
        self.clear_stuck().await?;
        // Restart what was in flight before starting what the last replayed polls issued, so
        // nothing is started twice.
        self.resume_open_commands().await?;
        if let Some(output) = self.advance(output).await? {
            return self.finish(output).await;
        }
        self.publish_waiting().await?;
        loop {
            // Mail already there (an attempt that answered at its first poll) writes what is
            // held back with its own write, and is handled before the run could leave memory.
            if self.mailbox.is_empty() {
                self.write_held_back().await?;
                if self.should_evict() && self.leave_memory().await {
                    return Ok(Exit::Evicted);
                }
            }
            let Some(event) = self.mailbox.recv().await else {
                return Err(RunError::ShutDown);
            };
            self.reap_tasks();
            let output = match event {
                Mail::Cancel { failure, reply } => match self.cancel(failure, reply).await? {
                    Cancelled::Ended(exit) => return Ok(exit),
                    Cancelled::Compensating(output) => output,
                },
                event => {
                    self.handle(event).await?;
                    None
                }
            };
            if let Some(output) = self.advance(output).await? {
                return self.finish(output).await;
            }
            self.publish_waiting().await?;
        }
    }

    /// Records who the run waits for (an approval, a signal), once it has done all it can, so
    /// that lists and filters show it. Not synced: a crash that loses it loses a view, which
    /// the next run of the workflow writes again. Parked and stuck runs keep their status.
    async fn publish_waiting(&mut self) -> Result<(), RunError> {
        let waiting = self.core.lock().commands.waiting_for();
        let status = match waiting {
            _ if matches!(
                self.record.status,
                WorkflowStatus::AwaitingOperator | WorkflowStatus::Stuck
            ) =>
            {
                return Ok(())
            }
            Some(WaitingFor::Approval) => WorkflowStatus::AwaitingApproval,
            Some(WaitingFor::Signal) => WorkflowStatus::AwaitingSignal,
            Some(WaitingFor::Operator) => WorkflowStatus::AwaitingOperator,
            None => WorkflowStatus::Running,
        };
        if status == self.record.status {
            return Ok(());
        }
        let mut transition = Transition::append(self.id.clone(), &self.record, Vec::new());
        transition.record.status = status;
        transition.durable = false;
        self.commit(transition).await
    }

    /// A run recorded as stuck replayed cleanly (matching code was deployed): its record says
    /// so before anything else happens.
    async fn clear_stuck(&mut self) -> Result<(), RunError> {
        // Held in memory even if the record could not say so.
        self.host.replayed_cleanly(&self.id);
        if self.record.status != WorkflowStatus::Stuck {
            return Ok(());
        }
        let mut transition = Transition::append(self.id.clone(), &self.record, Vec::new());
        transition.record.status = self.status_without(Seq::MAX);
        transition.record.stop = None;
        self.commit(transition).await?;
        info!(workflow_id = %self.id, "stuck workflow resumed: its code matches its journal again");
        Ok(())
    }

    /// [`Mail::Resume`]: writes what was held back, then clears the stuck mark in the store.
    async fn resume(&mut self) -> Result<(), RunError> {
        self.write_held_back().await?;
        self.clear_stuck_in_store().await
    }

    /// A run that stopped may have recorded the workflow as stuck while this one was loading,
    /// too late for this one to see it: the record says so until it is cleared here.
    async fn clear_stuck_in_store(&mut self) -> Result<(), RunError> {
        let id = self.id.clone();
        let stored = self.host.read(move |store| store.workflow(&id)).await?;
        let Some(stored) = stored else {
            return Ok(());
        };
        if stored.status == WorkflowStatus::Stuck && stored.journal_len == self.record.journal_len {
            self.record = stored;
            self.clear_stuck().await?;
        }
        Ok(())
    }

    /// Ends the run as cancelled; the caller hears whether that was written.
    /// Ends the run as cancelled at once, or, when effects it registered undos for may need
    /// undoing, journals the cancellation and runs the undos in the code's place (the run ends
    /// when they have). A second cancellation while they run is answered as done.
    async fn cancel(
        &mut self,
        failure: Failure,
        reply: oneshot::Sender<Result<(), CancelError>>,
    ) -> Result<Cancelled, RunError> {
        if self.body.is_cancelled() {
            let _ = reply.send(Ok(()));
            return Ok(Cancelled::Compensating(None));
        }
        if !self.core.has_pending_compensations() {
            let exit = self.finish(Err(failure)).await;
            let answer = match &exit {
                Ok(_) => Ok(()),
                Err(error) => Err(Unreachable::not_running(&self.id, error).into()),
            };
            let _ = reply.send(answer);
            return exit.map(Cancelled::Ended);
        }
        let entry = Entry::CancelRequested {
            failure: failure.clone(),
        };
        let written = Transition::append(self.id.clone(), &self.record, vec![entry]);
        if let Err(error) = self.commit(written).await {
            let _ = reply.send(Err(Unreachable::not_running(&self.id, &error).into()));
            return Err(error);
        }
        let _ = reply.send(Ok(()));
        info!(workflow_id = %self.id, "cancelled: compensating its effects");
        self.body.cancel(failure);
        Ok(Cancelled::Compensating(self.body.poll()?))
    }

    /// Replays recorded history through the replay loop, shared with the `Replayer`.
    fn replay(&mut self) -> Result<Replayed, RunError> {
        // Live runs never deliver from the prefetched snapshots: do not hold them.
        let snapshots = std::mem::take(&mut self.snapshots);
        let (id, workflow) = (&self.id, &self.observed.workflow);
        let replayed = self.body.replay(|seq, resolution| {
            observe::replayed_step(&self.core, id, workflow, seq);
            deliverable(&snapshots, seq, resolution)
        })?;
        debug!(workflow_id = %self.id, "replay finished; running live");
        Ok(replayed)
    }

    /// Journals and starts what the last poll issued, then delivers what is journaled and not
    /// yet delivered, one outcome per poll, in journal order; a signal waiting in the inbox
    /// is taken only when nothing else is left, one at a time, so that a wait dropped by the
    /// poll after one delivery never swallows the next signal. `output`: the body returned in
    /// the last poll. Returns the body's output once it returns, `None` when there is nothing
    /// more to deliver.
    async fn advance(
        &mut self,
        mut output: Option<Result<Payload, Failure>>,
    ) -> Result<Option<Result<Payload, Failure>>, RunError> {
        loop {
            self.flush_new_commands().await?;
            if output.is_some() {
                return Ok(output);
            }
            // Asked after every delivery: with no signal read, its future is not even built.
            if self.deliveries.is_empty() && self.may_take_a_signal() {
                Box::pin(self.take_signal()).await?;
            }
            let Some((seq, resolution)) = self.deliveries.pop_front() else {
                return Ok(None);
            };
            self.core.deliver(seq, resolution)?;
            output = self.body.poll()?;
        }
    }

    /// Handles one event: journals what it settles and queues the outcome for delivery.
    ///
    /// A future holds the largest future it awaits on any path, and each resident workflow's
    /// task holds this one. Only an attempt's answer comes at every step: every other event,
    /// and an answer's rarer outcomes, are awaited boxed, so that their futures do not size
    /// the step's.
    async fn handle(&mut self, event: Mail) -> Result<(), RunError> {
        match event {
            Mail::ActivityDone {
                seq,
                attempt,
                result,
                external_ref,
                streamed,
            } => {
                let streamed = self.streamed_version(streamed).await?;
                let done = AttemptDone {
                    seq,
                    attempt,
                    external_ref,
                    streamed,
                };
                self.on_attempt_result(done, result).await
            }
            Mail::RetryDue { seq } => {
                let next = self.core.lock().commands.start_retry(seq);
                match next {
                    Some(attempt) => Box::pin(self.begin_attempt(seq, attempt)).await,
                    None => Ok(()),
                }
            }
            Mail::TimerDue { seq } => Box::pin(self.on_timer_due(seq)).await,
            Mail::SignalArrived => Box::pin(self.read_new_signals()).await,
            Mail::Resume => Box::pin(self.resume()).await,
            Mail::Crashed { reason } => Err(RunError::Crashed(reason)),
            Mail::Footprint { reply } => {
                let _ = reply.send(self.footprint());
                Ok(())
            }
            // Handled by the run loop before it gets here.
            Mail::Cancel { .. } => Ok(()),
            Mail::DecideApproval {
                hash,
                request,
                approver,
                verdict,
                reply,
            } => {
                let decided =
                    Box::pin(self.on_approval_decision(hash, request, &approver, verdict)).await;
                self.answer(reply, decided)
            }
            Mail::Refused {
                seq,
                attempt,
                failure,
            } => Box::pin(self.on_refused(seq, attempt, failure)).await,
            Mail::Reconciled {
                seq,
                attempt,
                outcome,
            } => Box::pin(self.on_reconciled(seq, attempt, outcome)).await,
            Mail::RecheckDue {
                seq,
                attempt,
                checks,
            } => {
                self.on_recheck_due(seq, attempt, checks);
                Ok(())
            }
            Mail::ResolveOperation {
                seq,
                key,
                attempt,
                revision,
                decision,
                by,
                reply,
            } => {
                let on = DecidedOn {
                    attempt: Some(attempt),
                    revision,
                };
                let decided = Box::pin(self.on_operator_decision(seq, key, on, decision, by)).await;
                self.answer(reply, decided)
            }
        }
    }

    /// Tells the caller of a decision what became of it. A refusal leaves the run going; a
    /// failure to apply it stops the run, and the caller hears that it is not running.
    fn answer<E: From<Unreachable>>(
        &self,
        reply: oneshot::Sender<Result<(), E>>,
        decided: Result<(), Unapplied<E>>,
    ) -> Result<(), RunError> {
        match decided {
            Ok(()) => {
                let _ = reply.send(Ok(()));
                Ok(())
            }
            Err(Unapplied::Refused(error)) => {
                let _ = reply.send(Err(error));
                Ok(())
            }
            Err(Unapplied::Run(error)) => {
                let why = Unreachable::not_running(&self.id, &error);
                let _ = reply.send(Err(why.into()));
                Err(error)
            }
        }
    }

    /// The response version an attempt streamed under. The store fixes it when it writes the
    /// first chunk; every chunk was queued before the attempt reported, so once a later write
    /// of this workflow is through, the version is known.
    async fn streamed_version(
        &mut self,
        slot: Option<VersionSlot>,
    ) -> Result<Option<u32>, RunError> {
        let Some(slot) = slot else {
            return Ok(None);
        };
        if slot.get().is_none() {
            let barrier = self.host.store().append_stream(&self.id, Vec::new());
            barrier.await?;
        }
        Ok(slot.get())
    }

    async fn on_attempt_result(
        &mut self,
        done: AttemptDone,
        result: Result<Payload, Failure>,
    ) -> Result<(), RunError> {
        let AttemptDone { seq, attempt, .. } = done;
        if !self.core.lock().commands.is_current_attempt(seq, attempt) {
            debug!(workflow_id = %self.id, seq, attempt, "ignoring a stale attempt's answer");
            return Ok(());
        }
        let result = match result {
            Ok(output) => match self.oversized_result(seq, attempt, &output) {
                None => Ok(output),
                Some(failure) if self.is_effect(seq) => {
                    return Box::pin(self.complete_oversized_effect(done, output, failure)).await;
                }
                Some(failure) => Err(failure),
            },
            failed => failed,
        };
        match result {
            Ok(output) => self.complete_attempt(done, output).await,
            Err(failure) => {
                if let Some(version) = done.streamed {
                    self.supersede_stream(seq, version, &failure);
                }
                self.learn_external_ref(seq, done.external_ref).await?;
                if self.is_effect(seq) && effect::outcome_unknown(&failure, self.at_most_once(seq))
                {
                    return Box::pin(self.mark_uncertain(seq, attempt, failure)).await;
                }
                let outcome = self.after_failure(seq, attempt, failure, Vec::new())?;
                Box::pin(self.apply_failure(outcome)).await
            }
        }
    }

    /// A terminal failure naming the step when `output` is larger than the worker journals.
    fn oversized_result(&self, seq: Seq, attempt: u32, output: &Payload) -> Option<Failure> {
        let what = || {
            let name = self.core.activity_name(seq).unwrap_or_default();
            format!("the result of `{name}` (seq {seq}, attempt {attempt})")
        };
        let message = crate::journal::oversized(output, self.host.max_payload_bytes(), what)?;
        Some(Failure::new(FailureKind::Terminal, message))
    }

    /// An effect's result too large to journal: it happened, so its operation is recorded as
    /// committed (with the result's size and digest in its place) and never called again; the
    /// step fails, saying why.
    async fn complete_oversized_effect(
        &mut self,
        done: AttemptDone,
        output: Payload,
        failure: Failure,
    ) -> Result<(), RunError> {
        let AttemptDone { seq, attempt, .. } = done;
        if let Some(version) = done.streamed {
            self.supersede_stream(seq, version, &failure);
        }
        let entry = Entry::ActivityFailed {
            seq,
            attempt,
            failure,
        };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        let committed = OperationStatus::Committed {
            result: crate::journal::oversized_placeholder(&output),
            external_ref: done.external_ref,
        };
        let operation = self.operation(seq, attempt, committed).await?;
        add_operations(&mut transition.operations, operation);
        self.commit(transition).await
    }

    /// Journals the result; the operation log and the stream's commit marker go in the same
    /// write, so the stream's committed version is always the journaled response.
    async fn complete_attempt(
        &mut self,
        done: AttemptDone,
        output: Payload,
    ) -> Result<(), RunError> {
        let AttemptDone { seq, attempt, .. } = done;
        let call = self.core.completed_call(seq)?;
        let entry = match &call.retriever {
            Some(_) => Entry::SnapshotCompleted {
                seq,
                attempt,
                artifact: artifact_hash(&output),
            },
            None => Entry::ActivityCompleted {
                seq,
                attempt,
                output: output.clone(),
            },
        };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        if let Some(retriever) = call.retriever {
            let content = json_of(&output, "the retrieval's result")?;
            let (hash, record) = self.snapshot_artifact(&retriever, &output, &content);
            transition
                .stream
                .push(retrieval_complete(seq, hash, &content));
            transition.artifacts.push((hash, record));
            // What the snapshot entry delivers once applied, as replay reads it from the store.
            self.snapshots.insert(hash, output.clone());
        }
        if call.effect {
            let committed = OperationStatus::Committed {
                result: output.clone(),
                external_ref: done.external_ref,
            };
            let operation = self.operation(seq, attempt, committed).await?;
            let executed = operation
                .as_ref()
                .map(|op| action_executed(seq, op, &output));
            transition.stream.extend(executed);
            add_operations(&mut transition.operations, operation);
        }
        match (call.awaits_validation, done.streamed) {
            // Committed by the verdict that accepts it, or superseded by one that does not.
            (true, streamed) => {
                self.unvalidated.insert(seq, streamed);
            }
            (false, Some(response_version)) => transition.stream.push(StreamItem::Committed {
                step: seq,
                response_version,
            }),
            (false, None) => {}
        }
        let written = self.write(transition).await?;
        if call.model_call {
            // Before the entry is applied: the check reads the stream of a step still open.
            self.observe_model_call(seq, &output, done.streamed.is_some())
                .await;
        }
        self.apply(&written)
    }

    /// The snapshot artifact of a retrieval's result, with the index version it names (if it
    /// has an `index_version` field) and the retriever as causal metadata.
    fn snapshot_artifact(
        &self,
        retriever: &str,
        output: &Payload,
        content: &serde_json::Value,
    ) -> (Digest, ArtifactRecord) {
        let mut metadata = vec![("retriever".to_owned(), retriever.to_owned())];
        if let Some(index) = content.get("index_version").and_then(|v| v.as_str()) {
            metadata.push(("index_version".to_owned(), index.to_owned()));
        }
        let record = ArtifactRecord {
            kind: "retrieval".to_owned(),
            version: "1".to_owned(),
            content: output.clone(),
            metadata,
            workflow_id: String::from(&*self.id),
            created_at_ms: self.host.clock().now_ms(),
        };
        (artifact_hash(output), record)
    }

    /// Marks a failed attempt's streamed output as dropped. Queued ahead of the failure's own
    /// write, so a reader sees it before any chunk of the next attempt.
    fn supersede_stream(&self, step: Seq, response_version: u32, failure: &Failure) {
        let reason = failure.message.clone();
        let marker = StreamItem::Superseded {
            step,
            response_version,
            reason,
        };
        drop(self.host.store().append_stream(&self.id, vec![marker]));
        self.host.telemetry().stream_superseded();
    }

    /// What follows a definite failure of `attempt`, as the activity's machine decides it:
    /// another attempt, or the end. `prefix` entries (a reconciliation verdict) go first in
    /// the same batch.
    fn after_failure(
        &self,
        seq: Seq,
        attempt: u32,
        failure: Failure,
        prefix: Vec<Entry>,
    ) -> Result<FailureOutcome, RunError> {
        let spec = self.core.activity_spec(seq)?;
        let options = &spec.options;
        let now_ms = self.host.clock().now_ms();
        let jitter = jitter(&self.id, seq, attempt);
        let state = self.core.lock();
        let activity = state.commands.activity(seq).ok_or_else(|| not_open(seq))?;
        let decided = activity.after_failure(options, attempt, failure, now_ms, jitter);
        Ok(match decided {
            AfterFailure::Retry {
                retry_at_ms,
                failure,
            } => FailureOutcome::Retry {
                seq,
                attempt,
                failure,
                retry_at_ms,
                prefix,
            },
            AfterFailure::Fail { failure } => FailureOutcome::Final {
                seq,
                attempt,
                failure,
                prefix,
            },
        })
    }

    /// Journals a failure outcome (with the operation log's matching status) and acts on it.
    async fn apply_failure(&mut self, outcome: FailureOutcome) -> Result<(), RunError> {
        match outcome {
            FailureOutcome::Retry {
                seq,
                attempt,
                failure,
                retry_at_ms,
                mut prefix,
            } => {
                let status = OperationStatus::FailedRetriable {
                    failure: failure.clone(),
                };
                prefix.push(Entry::ActivityAttemptFailed {
                    seq,
                    attempt,
                    failure,
                    retry_at_ms,
                });
                let by = settled_by(&prefix);
                let mut transition = Transition::append(self.id.clone(), &self.record, prefix);
                let record = self.operation_settled(seq, attempt, status, by);
                add_operations(&mut transition.operations, record.await?);
                self.commit(transition).await?;
                self.schedule_retry(seq, retry_at_ms);
                Ok(())
            }
            FailureOutcome::Final {
                seq,
                attempt,
                failure,
                prefix,
            } => {
                let status = OperationStatus::FailedTerminal {
                    failure: failure.clone(),
                };
                self.fail_finally(seq, attempt, failure, prefix, status)
                    .await
            }
        }
    }

    /// Journals the final failure of `seq` (after `prefix`) with the operation log's `status`
    /// for an effect, and delivers it.
    pub(super) async fn fail_finally(
        &mut self,
        seq: Seq,
        attempt: u32,
        failure: Failure,
        mut prefix: Vec<Entry>,
        status: OperationStatus,
    ) -> Result<(), RunError> {
        prefix.push(Entry::ActivityFailed {
            seq,
            attempt,
            failure: failure.clone(),
        });
        let by = settled_by(&prefix);
        let mut transition = Transition::append(self.id.clone(), &self.record, prefix);
        let record = self.operation_settled(seq, attempt, status, by);
        add_operations(&mut transition.operations, record.await?);
        self.commit(transition).await
    }

    async fn on_timer_due(&mut self, seq: Seq) -> Result<(), RunError> {
        let due = self.core.lock().commands.timer_due(seq);
        match due {
            Some(Due::Fire { fire_at_ms }) => {
                let fired = vec![Entry::TimerFired { seq }];
                let mut transition = Transition::append(self.id.clone(), &self.record, fired);
                transition.remove_timers.push(self.timer(seq, fire_at_ms));
                self.commit(transition).await
            }
            Some(Due::Expire { at_ms }) => self.expire_approval(seq, at_ms).await,
            // Settled, or dropped, since the row was armed.
            None => Ok(()),
        }
    }

    /// What this run holds in memory, by kind: none of it grows with the length of history.
    fn footprint(&self) -> RunFootprint {
        RunFootprint {
            core: self.core.footprint(),
            undelivered: self.deliveries.len(),
            inbox: self.inbox.len(),
            tasks: self.tasks.len(),
            running: self.running_attempts(),
        }
    }

    fn running_attempts(&self) -> usize {
        let now = self.host.clock().now_ms();
        let core = self.core.lock();
        let running = core.commands.open_states().filter(|state| match state {
            CommandState::Running { .. } => true,
            // Checking now, or waiting for the clock to say when to check again.
            CommandState::Reconciling { recheck_at_ms, .. } => *recheck_at_ms <= now,
            _ => false,
        });
        running.count()
    }

    /// Reads the signals that reached the inbox since the last read: the arrival numbers
    /// only grow, so this reads what is new, not the whole inbox.
    async fn read_new_signals(&mut self) -> Result<(), RunError> {
        let (id, after) = (self.id.clone(), self.inbox_read_up_to);
        let arrived = self.host.read(move |store| store.inbox(&id, after)).await?;
        for (arrival, message) in arrived {
            self.inbox_read_up_to = self.inbox_read_up_to.max(arrival);
            self.inbox.insert(arrival, message);
        }
        Ok(())
    }

    /// Whether a wait may find a signal: one is held, or a wait listens for a name whose
    /// signals a rebuilt run has not read yet.
    fn may_take_a_signal(&self) -> bool {
        !self.inbox.is_empty() || !self.listened_names_unread().is_empty()
    }

    /// The names the open waits listen for, each once.
    fn listened_names(&self) -> Vec<String> {
        let core = self.core.lock();
        let mut names: Vec<String> = Vec::new();
        for (_, name) in core.commands.listeners() {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        names
    }

    /// The names waits listen for whose signals up to `inbox_read_up_to` are not read yet.
    fn listened_names_unread(&self) -> Vec<String> {
        let Some(read) = &self.inbox_names_read else {
            return Vec::new();
        };
        let mut names = self.listened_names();
        names.retain(|name| !read.contains(name));
        names
    }

    /// Reads the signals of each name a wait listens for and a rebuilt run has not read yet.
    /// One that arrived after `inbox_read_up_to` may come again with the next read of new
    /// signals, which holds it once more under its arrival number.
    async fn read_listened_names(&mut self) -> Result<(), RunError> {
        for name in self.listened_names_unread() {
            let (id, reading) = (self.id.clone(), name.clone());
            let read = move |store: &dyn Store| store.inbox_named(&id, &reading);
            for (arrival, message) in self.host.read(read).await? {
                self.inbox.insert(arrival, message);
            }
            if let Some(read) = &mut self.inbox_names_read {
                read.insert(name);
            }
        }
        Ok(())
    }

    /// Hands the oldest signal that a wait listens for to the oldest wait for its name,
    /// journaling the delivery with the inbox row's deletion. One at a time: the poll after
    /// it may drop the other waits.
    async fn take_signal(&mut self) -> Result<(), RunError> {
        self.read_listened_names().await?;
        let taken = {
            let state = self.core.lock();
            self.inbox.next_delivery(&state.commands.listeners())
        };
        let Some((arrival, seq)) = taken else {
            return Ok(());
        };
        let Some(message) = self.inbox.remove(arrival) else {
            let lost = format!("signal {arrival} was chosen from the inbox and is not in it");
            return Err(RunError::Internal(lost));
        };
        let name = message.name;
        let entry = match message.sender {
            Some(sender) => Entry::SignalReceivedFrom {
                seq,
                signal_id: message.signal_id,
                payload: message.payload,
                sender,
            },
            None => Entry::SignalReceived {
                seq,
                signal_id: message.signal_id,
                payload: message.payload,
            },
        };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        transition.consume_inbox.push((arrival, name));
        self.commit(transition).await
    }

    /// Applies entries just written to the commands' machines: what they settle waits to be
    /// delivered, after what was settled before, in journal order.
    fn apply(&mut self, written: &[Entry]) -> Result<(), RunError> {
        for entry in written {
            let applied = self.core.lock().commands.apply(entry);
            match applied {
                Ok(Some(Settled { seq, resolution })) => {
                    let resolution = deliverable(&self.snapshots, seq, resolution)?;
                    // Delivered: the snapshot is the store's to keep, not this run's.
                    self.snapshots.clear();
                    self.observe_settled(seq);
                    self.deliveries.push_back((seq, resolution));
                }
                Ok(None) => {}
                Err(conflict) => return Err(refused_own_entry(conflict)),
            }
        }
        Ok(())
    }

    /// Consults the fault plan at `boundary` of `seq`'s `attempt`: a crash stops the run.
    pub(super) fn strike(
        &self,
        seq: Seq,
        attempt: u32,
        boundary: Boundary,
    ) -> Result<(), RunError> {
        let Some(plan) = self.host.faults() else {
            return Ok(());
        };
        // A boundary after the outcome was delivered finds no open command: nothing to strike.
        let Some(name) = self.core.activity_name(seq) else {
            return Ok(());
        };
        match plan.strike(&self.id, seq, &name, attempt, boundary) {
            Some(Fault::Crash) => Err(RunError::Crashed(format!(
                "{boundary:?} {name} attempt {attempt}"
            ))),
            _ => Ok(()),
        }
    }

    /// After replay: whatever was in flight when the previous process stopped runs again (an
    /// effect only after its operation log says that is safe).
    async fn resume_open_commands(&mut self) -> Result<(), RunError> {
        let decisions = self.core.lock().commands.decisions();
        for decision in decisions {
            match decision {
                Decision::Attempt { seq, attempt } => self.begin_attempt(seq, attempt).await?,
                other => self.schedule(other),
            }
        }
        Ok(())
    }

    /// Performs a decision that waits for the clock: a retry, a timer, a reconciliation.
    fn schedule(&mut self, decision: Decision) {
        match decision {
            Decision::Attempt { seq, attempt } => {
                self.spawn_attempt(seq, attempt);
            }
            Decision::RetryAt { seq, at_ms } => self.schedule_retry(seq, at_ms),
            Decision::Arm { seq, fire_at_ms } => {
                self.host.schedule_timer(self.timer(seq, fire_at_ms));
            }
            Decision::Reconcile {
                seq,
                attempt,
                checks,
                at_ms,
            } => self.schedule_reconcile(seq, attempt, checks, at_ms),
        }
    }

    /// Evict when nothing runs and every open command waits for a signal, a person (an
    /// approval, an operator) or a timer further away than the threshold: such a workflow
    /// holds no memory until what it waits for arrives.
    fn should_evict(&self) -> bool {
        let now = self.host.clock().now_ms();
        let threshold = self.host.eviction_threshold_ms();
        let core = self.core.lock();
        let mut open = core.commands.open_states().peekable();
        open.peek().is_some()
            && open.all(|state| match state {
                CommandState::Waiting { fire_at_ms } => fire_at_ms.saturating_sub(now) > threshold,
                CommandState::Listening
                | CommandState::AwaitingApproval { .. }
                | CommandState::AwaitingOperator { .. } => true,
                CommandState::Running { .. }
                | CommandState::Backoff { .. }
                | CommandState::Reconciling { .. } => false,
            })
    }

    async fn finish(&mut self, output: Result<Payload, Failure>) -> Result<Exit, RunError> {
        let continuation = self.core.take_continuation();
        if let (Err(_), Some(input)) = (&output, continuation) {
            return self.continue_as_new(input).await;
        }
        let max = self.host.max_payload_bytes();
        let output = match output {
            Ok(output) => {
                match crate::journal::oversized(&output, max, || "the workflow's output".into()) {
                    Some(message) => Err(Failure::new(FailureKind::Workflow, message)),
                    None => Ok(output),
                }
            }
            failed => failed,
        };
        let (entry, status) = match &output {
            Ok(output) => (
                Entry::WorkflowCompleted {
                    output: output.clone(),
                },
                WorkflowStatus::Completed,
            ),
            Err(failure) => (
                Entry::WorkflowFailed {
                    failure: failure.clone(),
                },
                WorkflowStatus::Failed,
            ),
        };
        let left_open = self.left_open_by_ending_run().await?;
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        transition.record.status = status;
        transition.record.stop = None;
        transition.ended_at_ms = self.host.clock().now_ms();
        transition.operations = left_open;
        // Timers the workflow no longer waits for must not wake it later.
        let timers = self.pending_timers();
        transition.remove_timers = timers.clone();
        if let Ok(output) = &output {
            let output = json_of(output, "the workflow's output")?;
            let detail = serde_json::json!({ "output": output });
            let after_last_step = self.core.lock().cursor.issued();
            let ready = progress(after_last_step, "final_response_ready", detail);
            transition.stream.push(ready);
        }
        let host = self.host.clone();
        let ending = host.ending(&self.id);
        self.commit(transition).await?;
        for timer in timers {
            self.host.cancel_timer(timer);
        }
        self.observe_end(&output).await;
        drop(ending);
        info!(workflow_id = %self.id, ?status, "workflow ended");
        Ok(Exit::Ended(output))
    }

    /// The code asked for a new run with `input`: this run is kept as `ID#run-N`, and the
    /// journal starts again with the new input, which the next load runs.
    async fn continue_as_new(&mut self, input: Payload) -> Result<Exit, RunError> {
        let name = self.record.workflow_name.clone();
        let max = self.host.max_payload_bytes();
        if let Some(message) =
            crate::journal::oversized(&input, max, || "the next run's input".into())
        {
            let failure = Failure::new(FailureKind::Workflow, message);
            return Box::pin(self.finish(Err(failure))).await;
        }
        if let Some(Err(message)) = self
            .host
            .registry()
            .workflow(&name)
            .map(|w| (w.check_input)(&input))
        {
            let message =
                format!("continue-as-new with an input `{name}` does not take: {message}");
            return Box::pin(self.finish(Err(Failure::new(FailureKind::Workflow, message)))).await;
        }
        self.write_held_back().await?;
        let id = self.id.clone();
        let journal = self.host.read(move |store| store.journal(&id)).await?;
        let output =
            serde_json::json!({ "continued_as_new": json_of(&input, "the next run's input")? });
        let end = Entry::WorkflowCompleted {
            output: Payload::from_value(&output),
        };
        let kept = keep_run(&*self.host, &self.id, journal, end).await?;
        let now = self.host.clock().now_ms();
        let started = Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: name.to_string(),
            input,
            request_id: self.record.request_id.clone(),
            started_at_ms: now,
        });
        let from = continued_from(&self.id, &kept, 0, self.core.lineage(), None, now);
        let mut transition = Transition::rewind(&self.id, &self.record, 0, vec![started, from]);
        transition.operations = self.left_open_by_ending_run().await?;
        let timers = self.pending_timers();
        transition.remove_timers = timers.clone();
        transition.record.status = WorkflowStatus::Running;
        self.host.store().commit(transition).await?;
        for timer in timers {
            self.host.cancel_timer(timer);
        }
        info!(workflow_id = %self.id, kept_run = %kept, "workflow continued as a new run");
        Ok(Exit::Continued(self.commands_for_next_run()))
    }

    /// The callers' commands still in the mailbox as this run gives way to the next: a
    /// cancellation and an operator's decision are the workflow's, not this run's, and the next
    /// run checks each again (a decision about what this run left settles that record alone).
    /// An approval decision is about a request of this run: the next run numbers its requests
    /// anew, and one of them may ask for the same scope, which the decision must not settle.
    /// It is refused. The rest is this run's own (its attempts' answers, its timers): dropped.
    fn commands_for_next_run(&mut self) -> Vec<Mail> {
        // Closed first: a command sent from now on starts the next run itself.
        self.mailbox.close();
        let mut commands = Vec::new();
        while let Ok(mail) = self.mailbox.try_recv() {
            match mail {
                Mail::DecideApproval { reply, .. } => {
                    let continued = ApprovalError::RunContinued(self.id.to_string());
                    let _ = reply.send(Err(continued));
                }
                Mail::Cancel { .. } | Mail::ResolveOperation { .. } => commands.push(mail),
                _ => {}
            }
        }
        commands
    }

    /// Writes `transition`, then applies its entries: the commands' state follows what is
    /// durable.
    async fn commit(&mut self, transition: Transition) -> Result<(), RunError> {
        let written = self.write(transition).await?;
        self.apply(&written)
    }

    /// Writes `transition`, after what was held back: in the same write when it appends after
    /// it, else apart and first. Hands back `transition`'s own entries, to apply (the held
    /// ones were applied when held back).
    async fn write(&mut self, transition: Transition) -> Result<Vec<Entry>, RunError> {
        let mut transition = self.stamped(transition);
        let mut held_entries = 0;
        let mut counted = Vec::new();
        if let Some(held) = self.held_back.take() {
            let after_held = held.transition.record.journal_len;
            if transition.rewind_to.is_none() && transition.expected_journal_len == after_held {
                held_entries = held.transition.append.len();
                counted = held.counted;
                transition = held.transition.followed_by(transition);
            } else {
                // Not an append after the held flush: written apart, the store judging each.
                Box::pin(self.write_alone(held)).await?;
            }
        }
        let mut written = self.write_now(transition).await?;
        self.count_written(counted);
        written.drain(..held_entries);
        Ok(written)
    }

    /// Holds back a flush a crash may lose at no cost (`durable` false, entries only, already
    /// applied), after any other held back, with what it counts once written: the record is
    /// as if it were written.
    fn hold_back(&mut self, transition: Transition, mut counted: Vec<TelemetryNote>) {
        debug_assert!(!transition.durable && transition.appends_only());
        let transition = self.stamped(transition);
        self.record = transition.record.clone();
        let held = match self.held_back.take() {
            Some(mut held) => {
                held.counted.append(&mut counted);
                held.transition = held.transition.followed_by(transition);
                held
            }
            None => HeldBack {
                transition,
                counted,
            },
        };
        self.held_back = Some(held);
    }

    /// Writes what was held back, before the run waits or reads its own record or journal.
    async fn write_held_back(&mut self) -> Result<(), RunError> {
        match self.held_back.take() {
            Some(held) => self.write_alone(held).await,
            None => Ok(()),
        }
    }

    /// Writes a held-back flush by itself, then counts what it noted.
    async fn write_alone(&mut self, held: HeldBack) -> Result<(), RunError> {
        self.write_now(held.transition).await?;
        self.count_written(held.counted);
        Ok(())
    }

    /// Runs the notes of a flush once it is written, so that a flush a crash lost is counted
    /// only by the process that writes it again.
    fn count_written(&self, counted: Vec<TelemetryNote>) {
        for note in counted {
            note(self.host.telemetry());
        }
    }

    /// `transition` with its entries stamped with the time they are journaled at.
    fn stamped(&self, mut transition: Transition) -> Transition {
        let now_ms = self.host.clock().now_ms();
        let append = std::mem::take(&mut transition.append);
        transition.append = append
            .into_iter()
            .map(|entry| entry.with_time(now_ms))
            .collect();
        transition
    }

    /// Commits `transition` as it is, and takes back its entries, record and operations.
    async fn write_now(&mut self, mut transition: Transition) -> Result<Vec<Entry>, RunError> {
        transition.unpark = std::mem::take(&mut self.parked_mark);
        let transition = Arc::new(transition);
        self.host.store().commit_shared(transition.clone()).await?;
        // The store let go of its handle before it answered: nothing is copied.
        let Transition {
            append,
            record,
            operations,
            ..
        } = Arc::unwrap_or_clone(transition);
        self.observe_operations(&operations);
        self.remember_operations(operations);
        self.record = record;
        Ok(append)
    }

    /// Leaves memory unless an event waits in the mailbox, marked parked on a store this
    /// process owns ([`Executor::mark_parked`]). On a store many workers share, a run waiting
    /// for a timer parks (its lease let go until the timer is due), so that whichever worker
    /// is free then runs it.
    async fn leave_memory(&mut self) -> bool {
        if self.held_back.is_some() {
            return false;
        }
        let timers = self.pending_timers();
        let first_timer = timers.iter().map(|t| t.fire_at_ms).min();
        let listening = self.listened_names();
        if !self.mark_parked(timers, &listening).await {
            return false;
        }
        let Some(due_ms) = first_timer else {
            return self.host.try_evict(&self.id, &self.mailbox, listening);
        };
        if !self.host.begin_parking(&self.id, &self.mailbox) {
            return self.host.try_evict(&self.id, &self.mailbox, listening);
        }
        self.host.park(&self.id, due_ms, listening).await;
        true
    }

    /// On a store this process owns, marks the workflow parked before it leaves memory, so
    /// that a worker starting on the store with the same code does not rebuild it until what
    /// it waits for comes. Marked first: an event that comes between finds the run still
    /// resident, and the run's next write deletes the mark. Waited for, so that a run counts
    /// as resident until its mark is written: a shutdown once none is resident loses none. A
    /// run with an effect waiting for an operator is not marked: rebuilt at start, it is
    /// counted on the unknown-outcome gauge of the new process. `timers`: those that wake it.
    /// `listening`: the signal names its waits listen for. `false`: the mark could not be
    /// written; stay.
    async fn mark_parked(&mut self, timers: Vec<TimerKey>, listening: &[String]) -> bool {
        let store = self.host.store();
        let registered = self.host.registry().workflow(&self.record.workflow_name);
        let code_digest = registered.and_then(|workflow| workflow.code_digest);
        let for_operator = self.core.lock().commands.waiting_for() == Some(WaitingFor::Operator);
        let marks = store.leases().is_none() && !for_operator;
        let Some(code_digest) = code_digest.filter(|_| marks) else {
            return true;
        };
        let parking = Parking {
            inbox_read_up_to: self.inbox_read_up_to,
            code_digest,
            timers,
            listening: listening.to_vec(),
        };
        match store.mark_parked(&self.id, parking).await {
            Ok(()) => {
                self.parked_mark = true;
                true
            }
            Err(error) => {
                warn!(workflow_id = %self.id, %error, "cannot mark the workflow parked");
                false
            }
        }
    }

    /// Timer rows the workflow still has: open timers and expiries, and those it dropped that
    /// are not journaled as cancelled yet.
    fn pending_timers(&self) -> Vec<TimerKey> {
        let timers = self.core.lock().commands.timers();
        let rows = timers.into_iter();
        rows.map(|(seq, fire_at_ms)| self.timer(seq, fire_at_ms))
            .collect()
    }

    fn timer(&self, seq: Seq, fire_at_ms: u64) -> TimerKey {
        TimerKey {
            fire_at_ms,
            workflow_id: String::from(&*self.id),
            seq,
        }
    }
}

/// Reads what replay needs: the record, the journal, the inbox and the retrieval snapshots
/// the journal delivers. `None` if the workflow ended.
fn read_for_replay(store: &dyn ReplayReads, id: &str) -> Result<Option<Loaded>, RunError> {
    let record = store
        .workflow(id)?
        .ok_or_else(|| RunError::UnknownWorkflow(id.to_owned()))?;
    if record.status.is_terminal() {
        return Ok(None);
    }
    // The first entry is taken off the front as the rest stand, where removing it from the
    // vector would shift every other.
    let mut entries = store.journal(id)?.into_iter();
    let started = match entries.next() {
        Some(Entry::WorkflowStarted(started)) => started,
        _ => {
            return Err(RunError::Store(StoreError::Corrupt {
                table: crate::store::Table::Journal,
                key: format!("{id}#0"),
                source: crate::journal::DecodeError::Malformed(
                    "journal does not begin with WorkflowStarted".into(),
                ),
            }))
        }
    };
    let Some(record) = record_of_journal(store, id, record, entries.len() + 1)? else {
        return Ok(None);
    };
    let mut snapshots = HashMap::new();
    for entry in entries.as_slice() {
        if let Entry::SnapshotCompleted { artifact, .. }
        | Entry::SnapshotCompletedAt { artifact, .. } = entry
        {
            let (namespace, _) = crate::namespace::split(id);
            if let Some(record) = store.artifact(namespace, artifact)? {
                snapshots.insert(*artifact, record.content);
            }
        }
    }
    let inbox_last = store.inbox_last(id)?;
    // Only the stream check needs it; a stream that cannot be read is checked from its start.
    let stream_last = store.stream_last(id).unwrap_or_else(|error| {
        tracing::warn!(workflow_id = id, %error, "stream not readable at load");
        0
    });
    Ok(Some(Loaded {
        record,
        started,
        entries,
        inbox_last: Some(inbox_last),
        snapshots,
        stream_last,
    }))
}

/// The record that goes with a journal of `len` entries; `None` if the workflow ended. Read one
/// after the other, the two can be a write apart (a cancellation landed between): the record
/// read again says which. Still apart, one of them is damaged, and replaying either would run
/// the workflow from the wrong point.
fn record_of_journal(
    store: &dyn ReplayReads,
    id: &str,
    record: WorkflowRecord,
    len: usize,
) -> Result<Option<WorkflowRecord>, RunError> {
    let len = len as u64;
    if record.journal_len == len {
        return Ok(Some(record));
    }
    let again = store.workflow(id)?;
    match again {
        Some(again) if again.status.is_terminal() => Ok(None),
        Some(again) if again.journal_len == len => Ok(Some(again)),
        _ => Err(RunError::Store(StoreError::Corrupt {
            table: crate::store::Table::Workflows,
            key: id.to_owned(),
            source: crate::journal::DecodeError::Malformed(format!(
                "the record counts {} journal entries, the journal has {len}",
                record.journal_len
            )),
        })),
    }
}

/// What an attempt reported besides its result.
struct AttemptDone {
    seq: Seq,
    attempt: u32,
    external_ref: Option<String>,
    streamed: Option<u32>,
}

/// What follows a definite failure.
/// Who settled the effect, when a reconciliation verdict leads the entries of a failure.
fn settled_by(entries: &[Entry]) -> Option<ReconciledBy> {
    entries.iter().find_map(|entry| match entry {
        Entry::EffectReconciled { by, .. } => Some(by.clone()),
        _ => None,
    })
}

enum FailureOutcome {
    Retry {
        seq: Seq,
        attempt: u32,
        failure: Failure,
        retry_at_ms: u64,
        prefix: Vec<Entry>,
    },
    Final {
        seq: Seq,
        attempt: u32,
        failure: Failure,
        prefix: Vec<Entry>,
    },
}

/// Why a caller's decision (an approval, an operator's resolution) did not apply.
enum Unapplied<E> {
    /// Refused with `E`; the run goes on.
    Refused(E),
    /// Applying it failed; the run stops.
    Run(RunError),
}

impl<E> From<RunError> for Unapplied<E> {
    fn from(error: RunError) -> Self {
        Unapplied::Run(error)
    }
}

/// A progress event for readers.
fn progress(step: Seq, name: &str, detail: serde_json::Value) -> StreamItem {
    progress_of(step, name, Payload::from_value(&detail))
}

/// The `action_executed` progress event of the effect at `seq` that committed `output`, from
/// the operation record written for it (`key`, record): its name, its key and the result.
pub(super) fn action_executed(
    seq: Seq,
    (key, record): &(String, OperationRecord),
    output: &Payload,
) -> StreamItem {
    // Written around the result's canonical bytes, which are not decoded for it.
    let operation = canonical::string(&record.operation);
    let key = canonical::string(key);
    let mut fields = [
        ("operation", &operation[..]),
        ("idempotency_key", &key[..]),
        ("result", output.as_bytes()),
    ];
    let detail = Payload::from_canonical(canonical::object_of_canonical(&mut fields));
    progress_of(seq, "action_executed", detail)
}

/// A progress event whose detail is a payload already.
fn progress_of(step: Seq, name: &str, detail: Payload) -> StreamItem {
    StreamItem::Progress {
        step,
        name: name.to_owned(),
        detail,
    }
}

/// The `retrieval_complete` progress event readers are shown.
fn retrieval_complete(seq: Seq, hash: Digest, content: &serde_json::Value) -> StreamItem {
    let documents = content
        .get("documents")
        .and_then(|d| d.as_array())
        .map(Vec::len);
    let detail = serde_json::json!({"snapshot": hash.hex(), "documents": documents});
    progress(seq, "retrieval_complete", detail)
}

/// A recorded resolution as the workflow receives it: a snapshot is read from the store (with
/// the journal, before replay), never fetched again.
fn deliverable(
    snapshots: &HashMap<Digest, Payload>,
    seq: Seq,
    resolution: Resolution,
) -> Result<Resolution, RunError> {
    let Resolution::Snapshot(hash) = resolution else {
        return Ok(resolution);
    };
    match snapshots.get(&hash) {
        Some(content) => Ok(Resolution::Completed(content.clone())),
        None => Err(RunError::InconsistentJournal {
            seq,
            message: format!("snapshot artifact {} is missing from the store", hash.hex()),
        }),
    }
}

/// `payload` as JSON, for an event readers are shown.
fn json_of(payload: &Payload, what: &str) -> Result<serde_json::Value, RunError> {
    let decoded = payload.decode();
    decoded.map_err(|error| RunError::Internal(format!("{what} is not JSON: {error}")))
}

/// A machine refused an entry the executor itself just wrote: the executor broke the protocol.
fn refused_own_entry(conflict: Conflict) -> RunError {
    let (seq, message) = match conflict {
        Conflict::WaitKept { seq } => (seq, "the wait was journaled as dropped".to_owned()),
        Conflict::Inconsistent { seq, message } => (seq, message),
    };
    RunError::Internal(format!(
        "the executor wrote an entry for seq {seq} that its command does not accept: {message}"
    ))
}

/// An activity the executor handles an answer for is not open: its own bug, said so.
fn not_open(seq: Seq) -> RunError {
    RunError::Internal(format!("no activity is open at seq {seq}"))
}
