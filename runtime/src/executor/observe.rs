//! What the executor tells telemetry: spans for the run and each step (replayed steps marked as
//! such), and the replay-safety metrics at the points where the facts are established.

use std::time::Instant;

use tracing::{debug_span, field::Empty, info_span, Span};

use super::Executor;
use super::Host;
use crate::approvals::NotApproved;
use crate::context::WorkflowCore;
use crate::journal::{CommandKind, Failure, FailureKind, Payload, Seq, SeqMap, SeqSet};
use crate::llm::{LlmResponse, LLM_ACTIVITY};
use crate::machines::CommandState;
use crate::operations::{OperationRecord, OperationStatus};
use crate::streams::visible_text;
use crate::telemetry::{
    failure_location, journal_stats, CallKind, FailedRun, LlmSpend, ReplayMode, ResumePoint,
    StepLocation, Wake,
};

/// The run's span; its `workflow` field is filled in once the journal names the workflow.
pub(super) fn run_span(workflow_id: &str, wake: Wake) -> Span {
    info_span!(
        "waymark.run",
        workflow_id = %workflow_id,
        workflow = Empty,
        wake = wake.name()
    )
}

/// What a live attempt reports to telemetry from its task.
pub(super) struct AttemptTelemetry {
    pub(super) span: Span,
    /// Why the attempt runs, as its span says.
    pub(super) mode: ReplayMode,
    telemetry: crate::telemetry::Telemetry,
    name: String,
    kind: CallKind,
    /// The key was sent downstream before: an earlier attempt of it had been prepared.
    repeat: bool,
    /// The call was in flight when the previous process stopped.
    pub(super) interrupted: bool,
}

impl AttemptTelemetry {
    /// The approval the call runs under refused it: counted when it did not list the call.
    pub(super) fn not_approved(&self, refused: NotApproved) -> Failure {
        if matches!(refused, NotApproved::NotAuthorised { .. }) {
            self.telemetry.approval_hash_mismatch();
        }
        super::attempts::not_approved_failure(&refused)
    }

    /// The call leaves the process now.
    pub(super) fn invoked(&self) {
        self.telemetry.invoked(self.kind);
        if self.repeat {
            self.telemetry.downstream_repeat(&self.name);
        }
    }

    /// A precondition refused the call: it never left the process.
    pub(super) fn refused(&self, kind: FailureKind) {
        self.span.record("outcome", kind.name());
    }

    /// The attempt ended with `result` (or never reported, when `None`: a crash).
    pub(super) fn ended(&self, result: Option<&Result<Payload, Failure>>) {
        let outcome = match result {
            Some(Ok(_)) => "ok",
            Some(Err(failure)) => failure.kind.name(),
            None => "crashed",
        };
        self.span.record("outcome", outcome);
    }
}

/// Per-run state of the executor's telemetry.
#[derive(Default)]
pub(super) struct Observed {
    pub(super) workflow: String,
    /// The mode the next attempt of a step runs in, when it is not the default.
    modes: SeqMap<ReplayMode>,
    /// Effects whose next call sends a key that an earlier attempt was prepared for.
    repeats: SeqSet,
    /// Calls that were in flight when the previous process stopped: their next attempt runs
    /// again under the number the journal holds.
    interrupted: SeqSet,
    /// The last stream event the divergence check read: each check reads only what is new.
    stream_read_up_to: u64,
    /// Generation events (chunks, markers) of steps still in flight, kept until their commit.
    in_flight_stream: SeqMap<Vec<crate::streams::StreamEvent>>,
}

impl Observed {
    /// Names the workflow on the run's span (the current one). The stream up to
    /// `stream_last` was written before this run: no step of it is checked against it (a step
    /// in flight then restarts under a new response version), so its first check starts after.
    pub(super) fn new(workflow: &str, stream_last: u64) -> Self {
        Span::current().record("workflow", workflow);
        Self {
            workflow: workflow.to_owned(),
            stream_read_up_to: stream_last,
            ..Self::default()
        }
    }
}

impl<H: Host> Executor<H> {
    /// Replay is over and the run is live again: how long that took after the worker started
    /// (or the event arrived), and, for a recovered run, the boundary it resumed from. Steps in
    /// flight when the previous run stopped run again in mode `resume_from_checkpoint`.
    pub(super) fn observe_resumed(&mut self) {
        let since = match self.wake {
            Wake::Started => return,
            Wake::Recovered { since } | Wake::Event { since } => since,
        };
        let unresolved = self.core.lock().commands.open_commands();
        let telemetry = self.host.telemetry();
        telemetry.recovered(self.wake, Instant::now().saturating_duration_since(since));
        if matches!(self.wake, Wake::Recovered { .. }) {
            let started = self.core.lock().cursor.had_commands();
            let (point, at) = self.resume_point(started, &unresolved);
            let step = at.and_then(|seq| self.step_location(seq));
            telemetry.resumed(point, step.as_ref());
        }
        for (seq, state) in unresolved {
            let unsettled = matches!(
                state,
                CommandState::Reconciling { .. } | CommandState::AwaitingOperator { .. }
            );
            if let Some(key) = self.effect_key(seq).filter(|_| unsettled) {
                telemetry.outcome_still_unknown(&self.id, &key);
            }
            // Run again under the attempt number the journal holds, so the journal cannot show it.
            if matches!(state, CommandState::Running { .. }) && !self.is_effect(seq) {
                telemetry.rerun_after_restart(&self.id);
                self.observed.interrupted.insert(seq);
            }
            // A reconciliation is not an attempt: the attempt after it is an ordinary retry.
            if matches!(
                state,
                CommandState::Running { .. } | CommandState::Backoff { .. }
            ) {
                self.observed
                    .modes
                    .insert(seq, ReplayMode::ResumeFromCheckpoint);
            }
        }
    }

    /// Where the run resumed, and the step that decided it (`None` between steps).
    fn resume_point(
        &self,
        started: bool,
        unresolved: &[(Seq, CommandState)],
    ) -> (ResumePoint, Option<Seq>) {
        let rank = |(seq, state): &(Seq, CommandState)| match state {
            CommandState::Running { .. } if self.is_effect(*seq) => ResumePoint::UnsettledEffect,
            CommandState::Reconciling { .. } => ResumePoint::UnsettledEffect,
            CommandState::Running { .. } => ResumePoint::InFlightCall,
            CommandState::AwaitingOperator { .. } => ResumePoint::AwaitingOperator,
            CommandState::Backoff { .. } => ResumePoint::RetryBackoff,
            _ => ResumePoint::Waiting,
        };
        let order = [
            ResumePoint::UnsettledEffect,
            ResumePoint::InFlightCall,
            ResumePoint::AwaitingOperator,
            ResumePoint::RetryBackoff,
            ResumePoint::Waiting,
        ];
        let points: Vec<(ResumePoint, Seq)> = unresolved
            .iter()
            .map(|command| (rank(command), command.0))
            .collect();
        let first = order
            .into_iter()
            .find_map(|point| points.iter().find(|(p, _)| *p == point).copied());
        match first {
            Some((point, seq)) => (point, Some(seq)),
            None if !started => (ResumePoint::Start, None),
            None => (ResumePoint::BetweenSteps, None),
        }
    }

    /// Step `seq` as metrics label it; `None` for a wait (a timer, a signal, an approval).
    fn step_location(&self, seq: Seq) -> Option<StepLocation> {
        let spec = self.core.activity_spec(seq).ok()?;
        let kind = call_kind(self.is_effect(seq), &spec.name, spec.snapshot);
        Some(StepLocation::of_call(&spec.name, &spec.input, kind))
    }

    /// `seq` left the attempt a resumed or operator mode was noted for (it is reconciled, or it
    /// settled): a later attempt is an ordinary retry.
    pub(super) fn forget_mode(&mut self, seq: Seq) {
        self.observed.modes.remove(&seq);
    }

    /// `seq` settled: nothing kept for it is needed any more.
    pub(super) fn observe_settled(&mut self, seq: Seq) {
        self.forget_mode(seq);
        self.observed.repeats.remove(&seq);
        self.observed.in_flight_stream.remove(&seq);
    }

    /// The next attempt of `seq` runs because an operator found the last one did not happen.
    pub(super) fn observe_operator_restart(&mut self, seq: Seq) {
        self.observed.modes.insert(seq, ReplayMode::OperatorRestart);
    }

    /// Effect `seq` is about to run `attempt`; `previous` is what its operation log held. A
    /// later attempt, or one after a prepared record, presents the same key again.
    pub(super) fn observe_effect_attempt(
        &mut self,
        seq: Seq,
        attempt: u32,
        previous: Option<&OperationStatus>,
    ) {
        if matches!(previous, Some(OperationStatus::FailedRetriable { .. })) {
            self.observed.repeats.insert(seq);
        }
        if attempt > 1 {
            let name = self.core.activity_name(seq).unwrap_or_default();
            self.host.telemetry().intent_repeated(&name);
        }
    }

    /// An effect's outcome became unknown: it is reconciled, which presents the key again.
    pub(super) fn observe_reconciling(&self, seq: Seq) {
        let name = self.core.activity_name(seq).unwrap_or_default();
        self.host.telemetry().intent_repeated(&name);
    }

    /// The span and counters of a live attempt of `seq`.
    pub(super) fn attempt_telemetry(
        &mut self,
        seq: Seq,
        attempt: u32,
        name: &str,
        kind: CallKind,
    ) -> AttemptTelemetry {
        let default_mode = if attempt > 1 {
            ReplayMode::InStageRetry
        } else {
            ReplayMode::FirstExecution
        };
        let mode = self.observed.modes.remove(&seq).unwrap_or(default_mode);
        let span = info_span!(
            "waymark.step",
            workflow_id = %self.id,
            workflow = %self.observed.workflow,
            seq,
            kind = kind.name(),
            name = %name,
            attempt,
            replay_mode = mode.name(),
            executed = true,
            outcome = Empty,
        );
        AttemptTelemetry {
            span,
            mode,
            telemetry: self.host.telemetry().clone(),
            name: name.to_owned(),
            kind,
            repeat: self.observed.repeats.remove(&seq),
            interrupted: self.observed.interrupted.remove(&seq),
        }
    }

    /// Follows the operation log as written: an unknown outcome opens, any other status
    /// settles it.
    pub(super) fn observe_operations(&self, operations: &[(String, OperationRecord)]) {
        let telemetry = self.host.telemetry();
        for (key, record) in operations {
            match record.status {
                OperationStatus::UnknownOutcome { .. }
                | OperationStatus::AwaitingOperator { .. } => {
                    telemetry.outcome_unknown(&self.id, &record.operation, key);
                }
                OperationStatus::Prepared => {}
                _ => telemetry.outcome_settled(key),
            }
        }
    }

    /// A model call's response was journaled: count its tokens and cost, and, if it streamed,
    /// check that readers were shown what was committed. The commit went through the same
    /// ordered writer as the chunks, so every chunk is in the store by now.
    pub(super) async fn observe_model_call(&mut self, seq: Seq, output: &Payload, streamed: bool) {
        let response = match output.decode::<LlmResponse>() {
            Ok(response) => response,
            Err(error) => {
                // The model-call activity journaled something else than its response.
                tracing::error!(workflow_id = %self.id, seq, %error,
                    "a model call's result is not a response: its spend is not counted");
                return;
            }
        };
        let spend = LlmSpend {
            model: &response.model,
            prompt_tokens: response.usage.prompt_tokens,
            completion_tokens: response.usage.completion_tokens,
            cost_micros: response.cost_micros,
        };
        self.host.telemetry().llm_spent(spend);
        if streamed {
            self.check_stream(seq, &response.text).await;
        }
    }

    async fn check_stream(&mut self, seq: Seq, committed: &str) {
        if let Err(error) = self.read_stream().await {
            tracing::warn!(workflow_id = %self.id, seq, %error, "stream not readable");
            return;
        }
        let of_step = self.observed.in_flight_stream.remove(&seq);
        let shown = visible_text(&of_step.unwrap_or_default(), seq);
        if shown != committed {
            tracing::warn!(workflow_id = %self.id, seq, shown = shown.len(),
                committed = committed.len(), "streamed text differs from the committed response");
            self.host.telemetry().stream_divergence();
        }
    }

    /// Reads the stream events written since the last read, keeping those of steps in flight
    /// (steps run concurrently, so one's chunks may precede another's commit).
    async fn read_stream(&mut self) -> Result<(), crate::store::StoreError> {
        let (id, after) = (self.id.clone(), self.observed.stream_read_up_to);
        let events = self
            .host
            .read(move |store| store.stream(&id, after))
            .await?;
        self.observed.stream_read_up_to = events.last().map_or(after, |event| event.seq);
        let commands = &self.core.lock().commands;
        for event in events.into_iter().filter(|e| e.item.is_generation()) {
            let step = event.item.step();
            let in_flight = matches!(
                commands.state(step),
                Some(CommandState::Running { .. } | CommandState::Backoff { .. })
            );
            if in_flight {
                self.observed
                    .in_flight_stream
                    .entry(step)
                    .or_default()
                    .push(event);
            }
        }
        Ok(())
    }

    /// The run ended. What its calls needed and took is the tally of the entries its commands
    /// applied, replayed and live, so the figures hold across restarts without reading the
    /// journal back; only a failed run's journal is read, for where it failed and what its
    /// model calls had cost.
    pub(super) async fn observe_end(&mut self, output: &Result<Payload, Failure>) {
        let calls = self.core.lock().commands.calls();
        let failed = match output {
            Ok(_) => None,
            Err(_) => Some(self.failed_run().await),
        };
        self.host
            .telemetry()
            .workflow_ended(&self.id, calls, failed.as_ref());
    }

    async fn failed_run(&mut self) -> FailedRun {
        let id = self.id.clone();
        let journal = self.host.read(move |store| store.journal(&id)).await;
        let journal = journal.unwrap_or_else(|error| {
            tracing::warn!(workflow_id = %self.id, %error, "no journal for end-of-run telemetry");
            Vec::new()
        });
        // Without its journal a failure is still counted, at an unknown step.
        let at = failure_location(&journal).unwrap_or_else(|| StepLocation::of_run("unknown"));
        FailedRun::of(&journal_stats(&journal), at)
    }
}

/// A recorded step delivered again from the journal, not executed: its span, named like a live
/// attempt's, so a step reads the same in both.
pub(super) fn replayed_step(core: &WorkflowCore, workflow_id: &str, workflow: &str, seq: Seq) {
    // Debug level: every rebuild replays the whole history, and a trace at info level would
    // repeat it each time. What the span names takes the core's lock, on every replayed step:
    // not looked up when no subscriber takes debug spans at all.
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return;
    }
    let recorded = {
        let state = core.lock();
        let identity = state.cursor.recorded_identity(seq);
        let attempt = state.commands.settled_attempt(seq);
        identity.map(|identity| (identity.kind, identity.name.clone(), attempt))
    };
    let Some((kind, name, attempt)) = recorded else {
        return;
    };
    let kind = match kind {
        CommandKind::Activity | CommandKind::Retrieval => call_kind_at(core, seq, &name).name(),
        other => other.name(),
    };
    let span = debug_span!(
        "waymark.step",
        workflow_id = %workflow_id,
        workflow = %workflow,
        seq,
        kind,
        name = %name,
        attempt,
        replay_mode = ReplayMode::ResumeFromCheckpoint.name(),
        executed = false,
        outcome = "replayed",
    );
    span.in_scope(|| tracing::trace!("delivered from the journal"));
}

/// What kind of call an activity is, as spans and counters name it: by whether its command
/// carries an idempotency key, by its name, and by whether it is a retrieval.
pub(super) fn call_kind(is_effect: bool, name: &str, retrieval: bool) -> CallKind {
    if is_effect {
        CallKind::Effect
    } else if name == LLM_ACTIVITY {
        CallKind::Llm
    } else if retrieval {
        CallKind::Retrieval
    } else {
        CallKind::Activity
    }
}

/// [`call_kind`] of the activity at `seq`, asked of the workflow's core.
fn call_kind_at(core: &WorkflowCore, seq: Seq, name: &str) -> CallKind {
    let is_effect = core.lock().commands.effect_key(seq).is_some();
    let retrieval = core
        .retriever(seq)
        .is_ok_and(|retriever| retriever.is_some());
    call_kind(is_effect, name, retrieval)
}
