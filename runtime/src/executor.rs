//! The deterministic executor: one task per resident workflow.
//!
//! It replays the journal through the cursor, then runs live. Live, it handles one event at a
//! time: journal it (synced), deliver it to the workflow, poll the workflow, journal the commands
//! the poll issued, and only then start them. The workflow future is polled here and nowhere
//! else, never spawned, so the order in which it observes completions is the journal's order.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::context::{NewCommand, WorkflowCore};
use crate::error::RunError;
use crate::journal::{Entry, Failure, FailureKind, Payload, Seq};
use crate::keys::TimerKey;
use crate::registry::ActivityInfo;
use crate::replay::{CommandState, ReplayCursor, ReplayEvent, Resolution};
use crate::store::{Transition, WorkflowRecord, WorkflowStatus};
use crate::worker::{Durability, Shared};

/// Something that happened to a resident workflow.
#[derive(Debug)]
pub(crate) enum Event {
    ActivityDone {
        seq: Seq,
        attempt: u32,
        result: Result<Payload, Failure>,
    },
    AttemptTimedOut {
        seq: Seq,
        attempt: u32,
    },
    RetryDue {
        seq: Seq,
    },
    TimerDue {
        seq: Seq,
    },
}

type Body = BoxFuture<'static, Result<Payload, Failure>>;

/// Where replay left the run.
enum Replayed {
    /// The journal records the end.
    Ended(Exit),
    /// Live from here; `Some` if the body already returned.
    Live(Option<Result<Payload, Failure>>),
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
}

pub(crate) struct Executor {
    id: String,
    shared: Arc<Shared>,
    record: WorkflowRecord,
    core: WorkflowCore,
    body: Option<Body>,
    mailbox: mpsc::UnboundedReceiver<Event>,
    events: mpsc::UnboundedSender<Event>,
    tasks: JoinSet<()>,
}

/// Runs workflow `id` until it ends, stops or is evicted.
pub(crate) async fn run_workflow(
    shared: Arc<Shared>,
    id: String,
    mailbox: mpsc::UnboundedReceiver<Event>,
    events: mpsc::UnboundedSender<Event>,
) {
    let exit = match Executor::load(shared.clone(), &id, mailbox, events) {
        Ok(Some(executor)) => executor.run().await,
        Ok(None) => Exit::AlreadyEnded,
        Err(error) => Exit::Stopped(error),
    };
    match exit {
        Exit::Ended(outcome) => {
            shared.router.remove(&id);
            shared.publish(
                &id,
                outcome.map_err(RunError::Failed),
                Durability::Journaled,
            );
        }
        Exit::Stopped(error) => {
            warn!(workflow_id = %id, %error, "workflow run stopped");
            shared.router.remove(&id);
            shared.publish(&id, Err(error), Durability::InMemory);
        }
        Exit::AlreadyEnded => shared.router.remove(&id),
        Exit::Evicted => debug!(workflow_id = %id, "workflow evicted until its timer fires"),
    }
}

impl Executor {
    fn load(
        shared: Arc<Shared>,
        id: &str,
        mailbox: mpsc::UnboundedReceiver<Event>,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Option<Self>, RunError> {
        let record = shared
            .store
            .workflow(id)?
            .ok_or_else(|| RunError::UnknownWorkflow(id.to_owned()))?;
        if record.status.is_terminal() {
            return Ok(None);
        }
        let mut entries = shared.store.journal(id)?.into_iter();
        let Some(Entry::WorkflowStarted(started)) = entries.next() else {
            return Err(RunError::Store(crate::store::StoreError::Corrupt {
                table: crate::store::Table::Journal,
                key: format!("{id}#0"),
                source: crate::journal::DecodeError::Malformed(
                    "journal does not begin with WorkflowStarted".into(),
                ),
            }));
        };
        let workflow = shared
            .registry
            .workflow(&started.workflow_name)
            .ok_or_else(|| RunError::UnknownWorkflow(started.workflow_name.clone()))?;
        let cursor = ReplayCursor::new(entries);
        let core = WorkflowCore::new(id, cursor, shared.clock.clone(), shared.registry.clone());
        let body = (workflow.run)(core.clone(), started.input)?;
        Ok(Some(Self {
            id: id.to_owned(),
            shared,
            record,
            core,
            body: Some(body),
            mailbox,
            events,
            tasks: JoinSet::new(),
        }))
    }

    async fn run(mut self) -> Exit {
        self.run_to_exit().await.unwrap_or_else(Exit::Stopped)
    }

    async fn run_to_exit(&mut self) -> Result<Exit, RunError> {
        let output = match self.replay()? {
            Replayed::Ended(exit) => return Ok(exit),
            Replayed::Live(output) => output,
        };
        // Restart what was in flight before starting what the last replayed polls issued, so
        // nothing is started twice.
        self.restart_unresolved();
        self.flush_new_commands().await?;
        if let Some(output) = output {
            return self.finish(output).await;
        }
        loop {
            if self.should_evict() && self.shared.router.try_evict(&self.id, &self.mailbox) {
                return Ok(Exit::Evicted);
            }
            let Some(event) = self.mailbox.recv().await else {
                return Err(RunError::ShutDown);
            };
            self.reap_tasks();
            if !self.handle(event).await? {
                continue;
            }
            if let Some(output) = self.advance().await? {
                return self.finish(output).await;
            }
        }
    }

    /// Replays recorded history through the cursor.
    fn replay(&mut self) -> Result<Replayed, RunError> {
        let mut output = self.poll_body()?;
        loop {
            let event = self.core.lock().cursor.next_replay_event();
            match event.map_err(RunError::NonDeterminism)? {
                Some(ReplayEvent::Resolve { seq, resolution }) => {
                    self.core.deliver(seq, resolution);
                    output = output.or(self.poll_body()?);
                }
                Some(ReplayEvent::Ended(entry)) => return Ok(Replayed::Ended(ended_from(entry))),
                None => break,
            }
        }
        debug!(workflow_id = %self.id, "replay finished; running live");
        Ok(Replayed::Live(output))
    }

    /// After a delivery: polls the body, journals what it issued, starts it.
    async fn advance(&mut self) -> Result<Option<Result<Payload, Failure>>, RunError> {
        let output = self.poll_body()?;
        self.flush_new_commands().await?;
        Ok(output)
    }

    /// Handles one event; `true` if something was delivered and the body must be polled.
    async fn handle(&mut self, event: Event) -> Result<bool, RunError> {
        match event {
            Event::ActivityDone {
                seq,
                attempt,
                result,
            } => self.on_attempt_result(seq, attempt, result).await,
            Event::AttemptTimedOut { seq, attempt } => {
                let failure = Failure::new(FailureKind::Timeout, "start-to-close timeout");
                self.on_attempt_result(seq, attempt, Err(failure)).await
            }
            Event::RetryDue { seq } => {
                let next = self.core.lock().cursor.start_retry(seq);
                if let Some(attempt) = next {
                    self.spawn_attempt(seq, attempt);
                }
                Ok(false)
            }
            Event::TimerDue { seq } => self.on_timer_due(seq).await,
        }
    }

    async fn on_attempt_result(
        &mut self,
        seq: Seq,
        attempt: u32,
        result: Result<Payload, Failure>,
    ) -> Result<bool, RunError> {
        if !self.core.lock().cursor.is_current_attempt(seq, attempt) {
            debug!(workflow_id = %self.id, seq, attempt, "ignoring a stale attempt's answer");
            return Ok(false);
        }
        match result {
            Ok(output) => {
                let entry = Entry::ActivityCompleted {
                    seq,
                    attempt,
                    output: output.clone(),
                };
                self.commit(Transition::append(&self.id, &self.record, vec![entry]))
                    .await?;
                self.resolve(seq, Resolution::Completed(output));
                Ok(true)
            }
            Err(failure) => self.on_attempt_failure(seq, attempt, failure).await,
        }
    }

    async fn on_attempt_failure(
        &mut self,
        seq: Seq,
        attempt: u32,
        failure: Failure,
    ) -> Result<bool, RunError> {
        let spec = self.core.activity_spec(seq);
        let policy = spec.map(|s| s.options.retry).unwrap_or_default();
        let retriable = failure.kind != FailureKind::Terminal;
        if !(retriable && policy.allows_retry_after(attempt)) {
            let entry = Entry::ActivityFailed {
                seq,
                attempt,
                failure: failure.clone(),
            };
            self.commit(Transition::append(&self.id, &self.record, vec![entry]))
                .await?;
            self.resolve(seq, Resolution::Failed(failure));
            return Ok(true);
        }
        let delay = policy.backoff(attempt, jitter(&self.id, seq, attempt));
        let hinted = failure.retry_after_ms.unwrap_or(0);
        let delay_ms = u64::try_from(delay.as_millis())
            .unwrap_or(u64::MAX)
            .max(hinted);
        let retry_at_ms = self.shared.clock.now_ms().saturating_add(delay_ms);
        let entry = Entry::ActivityAttemptFailed {
            seq,
            attempt,
            failure,
            retry_at_ms,
        };
        self.commit(Transition::append(&self.id, &self.record, vec![entry]))
            .await?;
        self.core
            .lock()
            .cursor
            .record_attempt_failure(seq, attempt, retry_at_ms);
        self.schedule_retry(seq, retry_at_ms);
        Ok(false)
    }

    async fn on_timer_due(&mut self, seq: Seq) -> Result<bool, RunError> {
        let Some(CommandState::Waiting { fire_at_ms }) = self.core.lock().cursor.state(seq) else {
            return Ok(false);
        };
        let mut transition =
            Transition::append(&self.id, &self.record, vec![Entry::TimerFired { seq }]);
        transition.remove_timers.push(TimerKey {
            fire_at_ms,
            workflow_id: self.id.clone(),
            seq,
        });
        self.commit(transition).await?;
        self.resolve(seq, Resolution::Fired);
        Ok(true)
    }

    fn resolve(&mut self, seq: Seq, resolution: Resolution) {
        self.core.lock().cursor.set(seq, CommandState::Done);
        self.core.deliver(seq, resolution);
    }

    /// Journals the commands the last polls issued, then starts them.
    async fn flush_new_commands(&mut self) -> Result<(), RunError> {
        let commands = self.core.take_new_commands();
        if commands.is_empty() {
            return Ok(());
        }
        let entries = commands.iter().map(command_entry).collect();
        let mut transition = Transition::append(&self.id, &self.record, entries);
        transition.add_timers = commands.iter().filter_map(|c| self.timer_key(c)).collect();
        self.commit(transition).await?;
        for command in commands {
            self.start(command);
        }
        Ok(())
    }

    fn start(&mut self, command: NewCommand) {
        match command {
            NewCommand::Activity { seq, .. } => {
                let running = CommandState::Running { attempt: 1 };
                self.core.lock().cursor.set(seq, running);
                self.spawn_attempt(seq, 1);
            }
            NewCommand::Timer {
                seq, fire_at_ms, ..
            } => {
                let waiting = CommandState::Waiting { fire_at_ms };
                self.core.lock().cursor.set(seq, waiting);
                self.shared.timers.schedule(self.timer(seq, fire_at_ms));
            }
            NewCommand::Value { seq, .. } => self.core.lock().cursor.set(seq, CommandState::Done),
        }
    }

    /// After replay: whatever was in flight when the previous process stopped runs again.
    fn restart_unresolved(&mut self) {
        let unresolved = self.core.lock().cursor.unresolved();
        for (seq, state) in unresolved {
            match state {
                CommandState::Running { attempt } => self.spawn_attempt(seq, attempt),
                CommandState::Backoff { retry_at_ms, .. } => self.schedule_retry(seq, retry_at_ms),
                CommandState::Waiting { fire_at_ms } => {
                    self.shared.timers.schedule(self.timer(seq, fire_at_ms));
                }
                CommandState::Done => {}
            }
        }
    }

    fn spawn_attempt(&mut self, seq: Seq, attempt: u32) {
        let Some(spec) = self.core.activity_spec(seq) else {
            return;
        };
        let Some(activity) = self.shared.registry.activity(&spec.name) else {
            self.core.stop(RunError::UnknownActivity(spec.name));
            return;
        };
        let info = ActivityInfo {
            workflow_id: self.id.clone(),
            activity_name: spec.name.clone(),
            seq,
            attempt,
            idempotency_key: None,
            external_ref: Default::default(),
        };
        debug!(workflow_id = %self.id, seq, attempt, activity = %spec.name, "starting attempt");
        let attempt_future = (activity.run)(info, spec.input);
        let events = self.events.clone();
        self.tasks.spawn(async move {
            let result = AssertUnwindSafe(attempt_future)
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    Err(Failure::new(FailureKind::Panicked, panic_message(&panic)))
                });
            let _ = events.send(Event::ActivityDone {
                seq,
                attempt,
                result,
            });
        });
        if let Some(timeout) = spec.options.start_to_close_timeout {
            let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
            let deadline = self.shared.clock.now_ms().saturating_add(timeout_ms);
            self.send_at(deadline, Event::AttemptTimedOut { seq, attempt });
        }
    }

    fn schedule_retry(&mut self, seq: Seq, retry_at_ms: u64) {
        self.send_at(retry_at_ms, Event::RetryDue { seq });
    }

    fn send_at(&mut self, deadline_ms: u64, event: Event) {
        let sleep = self.shared.clock.sleep_until(deadline_ms);
        let events = self.events.clone();
        self.tasks.spawn(async move {
            sleep.await;
            let _ = events.send(event);
        });
    }

    fn reap_tasks(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }

    /// Evict when nothing runs and every open command is a timer further away than the
    /// threshold: such a workflow holds no memory until its timer fires.
    fn should_evict(&self) -> bool {
        let now = self.shared.clock.now_ms();
        let threshold = self.shared.eviction_threshold_ms;
        let unresolved = self.core.lock().cursor.unresolved();
        !unresolved.is_empty()
            && unresolved.iter().all(|(_, state)| {
                matches!(state, CommandState::Waiting { fire_at_ms } if fire_at_ms.saturating_sub(now) > threshold)
            })
    }

    async fn finish(&mut self, output: Result<Payload, Failure>) -> Result<Exit, RunError> {
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
        let mut transition = Transition::append(&self.id, &self.record, vec![entry]);
        transition.record.status = status;
        // Timers the workflow no longer waits for (a select! it left) must not wake it later.
        transition.remove_timers = self.pending_timers();
        self.commit(transition).await?;
        info!(workflow_id = %self.id, ?status, "workflow ended");
        Ok(Exit::Ended(output))
    }

    async fn commit(&mut self, transition: Transition) -> Result<(), RunError> {
        let record = transition.record.clone();
        self.shared.store.commit(transition).await?;
        self.record = record;
        Ok(())
    }

    /// Polls the body once. `Some` when it returned.
    fn poll_body(&mut self) -> Result<Option<Result<Payload, Failure>>, RunError> {
        let Some(body) = self.body.as_mut() else {
            return Ok(None);
        };
        // Wake-ups are not how this executor decides to poll (it polls after every delivery),
        // so the top-level waker does nothing; ctx futures still wake their own parents.
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(&mut cx)));
        let polled = polled.map_err(|panic| RunError::Panicked(panic_message(&panic)))?;
        if let Some(stop) = self.core.take_stop() {
            return Err(stop);
        }
        match polled {
            Poll::Ready(output) => {
                self.body = None;
                Ok(Some(output))
            }
            Poll::Pending => Ok(None),
        }
    }

    fn pending_timers(&self) -> Vec<TimerKey> {
        let unresolved = self.core.lock().cursor.unresolved();
        let waiting = unresolved
            .into_iter()
            .filter_map(|(seq, state)| match state {
                CommandState::Waiting { fire_at_ms } => Some(self.timer(seq, fire_at_ms)),
                _ => None,
            });
        waiting.collect()
    }

    fn timer(&self, seq: Seq, fire_at_ms: u64) -> TimerKey {
        TimerKey {
            fire_at_ms,
            workflow_id: self.id.clone(),
            seq,
        }
    }

    fn timer_key(&self, command: &NewCommand) -> Option<TimerKey> {
        match command {
            NewCommand::Timer {
                seq, fire_at_ms, ..
            } => Some(self.timer(*seq, *fire_at_ms)),
            _ => None,
        }
    }
}

fn command_entry(command: &NewCommand) -> Entry {
    match command.clone() {
        NewCommand::Activity {
            seq,
            identity,
            input,
        } => Entry::ActivityScheduled {
            seq,
            identity,
            input,
        },
        NewCommand::Timer {
            seq,
            identity,
            duration_ms,
            fire_at_ms,
        } => Entry::TimerStarted {
            seq,
            identity,
            duration_ms,
            fire_at_ms,
        },
        NewCommand::Value {
            seq,
            identity,
            value,
        } => Entry::ValueRecorded {
            seq,
            identity,
            value,
        },
    }
}

fn ended_from(entry: Entry) -> Exit {
    match entry {
        Entry::WorkflowCompleted { output } => Exit::Ended(Ok(output)),
        Entry::WorkflowFailed { failure } => Exit::Ended(Err(failure)),
        other => Exit::Stopped(RunError::Panicked(format!(
            "unexpected end entry {other:?}"
        ))),
    }
}

/// Deterministic jitter for a retry: the same workflow, command and attempt always wait the
/// same, so a journaled `retry_at_ms` is reproducible and tests are stable.
fn jitter(workflow_id: &str, seq: Seq, attempt: u32) -> u64 {
    let digest = crate::journal::Digest::of(format!("{workflow_id}|{seq}|{attempt}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest.0[..8]);
    u64::from_be_bytes(bytes)
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = panic.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
