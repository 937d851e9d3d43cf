//! Attempt tasks: an attempt runs beside the workflow, with its preconditions, the fault plan's
//! hooks and its start-to-close timeout, and reports back through the mailbox (its first poll
//! on the workflow's task, the rest on the task set); and the timers that wake the run for a
//! retry or a recheck.

use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use super::observe::call_kind;
use super::*;
use crate::attempt_cell::AttemptCell;
use crate::registry::{ExternalRef, TimedOut};
use crate::streams::VersionSlot;

/// How an attempt's first poll, on the workflow's task, left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FirstPoll {
    /// It answered, or could not start: what it came to is in the mailbox or stops the run.
    Answered,
    /// It waits, polled again on a task of its own.
    Waiting,
}

impl<H: Host> Executor<H> {
    /// Runs one attempt: its first poll on the workflow's task, the rest, if it waits, on the
    /// task set. The start-to-close timeout is enforced inside the attempt: its future is
    /// dropped before the timeout is reported, so a timed-out attempt can do nothing more
    /// downstream once the executor reconciles or retries it.
    pub(super) fn spawn_attempt(&mut self, seq: Seq, attempt: u32) -> FirstPoll {
        let (spec, effect_key) = match self.core.activity_spec_and_key(seq) {
            Ok(found) => found,
            Err(error) => {
                self.core.stop(error);
                return FirstPoll::Answered;
            }
        };
        let registry = self.host.registry().clone();
        let Some(activity) = registry.activity(&spec.name) else {
            self.core.stop(RunError::UnknownActivity(spec.name.clone()));
            return FirstPoll::Answered;
        };
        let kind = call_kind(effect_key.is_some(), &spec.name, spec.snapshot);
        let observed = self.attempt_telemetry(seq, attempt, &spec.name, kind);
        let cell = Arc::new(AttemptCell::default());
        let key = effect_key.as_deref();
        let mut info = self.activity_info(seq, attempt, &spec.name, &cell, key);
        info.replay_mode = observed.mode;
        info.interrupted = observed.interrupted;
        let span = observed.span.clone();
        span.in_scope(|| debug!("starting attempt"));
        let attempt_future = (activity.run)(info, spec.input.clone());
        // Each handle an attempt takes is an atomic count to take and one to drop, on every
        // step: the checks are copied (nothing, for most calls), and the clock taken only with
        // an approval to check or a timeout to keep.
        let preconditions = spec.preconditions.clone();
        let clock = || self.host.clock().clone();
        let approval = spec.authorisation.clone().map(|a| (a, clock()));
        let deadline = spec.options.start_to_close_timeout.map(|t| (t, clock()));
        let faults = self.fault_hook(seq, attempt, &spec.name);
        let outputs = AttemptOutputs { cell: cell.clone() };
        let run = async move {
            let refusal = match approval.map(|(a, clock)| a.admit(clock.now_ms())) {
                Some(Err(refused)) => Some(observed.not_approved(refused)),
                _ => failed_precondition(&preconditions).await,
            };
            if let Some(failure) = refusal {
                observed.refused(failure.kind);
                let refused = Mail::Refused {
                    seq,
                    attempt,
                    failure,
                };
                return Attempted::Answered(refused);
            }
            match faults.before_call() {
                BeforeCall::Proceed => {
                    observed.invoked();
                    cell.called.store(true, Ordering::Release);
                }
                BeforeCall::Crash(reason) => {
                    observed.ended(None);
                    return Attempted::Answered(Mail::Crashed { reason });
                }
                BeforeCall::Fail(failure) => {
                    let result = Err(failure);
                    observed.ended(Some(&result));
                    let (streamed, external_ref) = (None, None);
                    return Attempted::Answered(Mail::ActivityDone {
                        seq,
                        attempt,
                        result,
                        external_ref,
                        streamed,
                    });
                }
            }
            let guarded = AssertUnwindSafe(attempt_future)
                .catch_unwind()
                .map(|outcome| {
                    outcome.unwrap_or_else(|panic| {
                        Err(Failure::new(FailureKind::Panicked, panic_message(&panic)))
                    })
                });
            let result = within_timeout(guarded, deadline, &cell).await;
            let result = match faults.after_call(result) {
                Ok(result) => result,
                Err(reason) => {
                    observed.ended(None);
                    return Attempted::Answered(Mail::Crashed { reason });
                }
            };
            observed.ended(Some(&result));
            Attempted::Returned(result)
        };
        let run = answered_even_if_it_panics(run, seq, attempt, outputs);
        // The event goes out once the attempt's span has closed, so that whoever sees the
        // result (a test reading spans, a timeline) also sees the whole attempt.
        let mut attempt = Box::pin(run.instrument(span));
        // An attempt that finishes at its first poll here (a no-op, a refusal, a planned fault)
        // spawns no task and wakes no other thread. One that waits is polled again on a task
        // of its own, and that poll registers the task's waker in place of this one, which
        // wakes nothing. The attempts a flush starts take their first polls in call order, so
        // those that answer at once are journaled in call order.
        let mut context = Context::from_waker(Waker::noop());
        if let Poll::Ready(event) = attempt.as_mut().poll(&mut context) {
            drop(attempt);
            let _ = self.events.send(event);
            return FirstPoll::Answered;
        }
        let events = self.events.clone();
        self.spawn_task(async move {
            let event = attempt.await;
            let _ = events.send(event);
        });
        FirstPoll::Waiting
    }

    /// Runs `task` beside the workflow: dropped with the executor, and waited for by a
    /// worker's shutdown.
    pub(super) fn spawn_task(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(self.host.in_flight().track_future(task));
    }

    /// The fault plan's hook for one attempt; without a plan (in production) it holds nothing,
    /// so that an attempt copies no names for it.
    pub(super) fn fault_hook(&self, seq: Seq, attempt: u32, name: &str) -> FaultHook {
        FaultHook(self.host.faults().map(|plan| PlannedCall {
            plan: plan.clone(),
            workflow_id: String::from(&*self.id),
            seq,
            attempt,
            name: name.to_owned(),
        }))
    }

    /// `cell`: what the attempt shares with its executor and the store's writer. `effect_key`:
    /// the operation-log key its command carries, `None` for a plain activity.
    pub(super) fn activity_info(
        &self,
        seq: Seq,
        attempt: u32,
        name: &str,
        cell: &Arc<AttemptCell>,
        effect_key: Option<&str>,
    ) -> ActivityInfo {
        let stream = StepStream::new(
            self.host.store().clone(),
            self.id.clone(),
            seq,
            VersionSlot::of(cell),
        );
        ActivityInfo {
            workflow_id: self.id.clone(),
            activity_name: name.to_owned(),
            seq,
            attempt,
            replay_mode: match attempt {
                1 => ReplayMode::FirstExecution,
                _ => ReplayMode::InStageRetry,
            },
            idempotency_key: effect_key.map(|key| self.business_key(name, key)),
            external_ref: ExternalRef::of(cell),
            stream,
            artifacts: ArtifactReader::new(self.host.store().clone(), self.id.clone()),
            telemetry: self.host.telemetry().clone(),
            timed_out: TimedOut::of(cell),
            interrupted: false,
            lineage: self.core.lineage().clone(),
        }
    }

    pub(super) fn schedule_retry(&mut self, seq: Seq, retry_at_ms: u64) {
        self.send_at(retry_at_ms, Mail::RetryDue { seq });
    }

    pub(super) fn send_at(&mut self, deadline_ms: u64, event: Mail) {
        let sleep = self.host.clock().sleep_until(deadline_ms);
        let events = self.events.clone();
        self.spawn_task(async move {
            sleep.await;
            let _ = events.send(event);
        });
    }

    pub(super) fn reap_tasks(&mut self) {
        while self.tasks.try_join_next().is_some() {}
    }
}

/// What an attempt learnt besides its result (the reference it recorded, whether it
/// streamed), read from its cell once, when it reports or when it panics.
struct AttemptOutputs {
    cell: Arc<AttemptCell>,
}

impl AttemptOutputs {
    fn done(self, seq: Seq, attempt: u32, result: Result<Payload, Failure>) -> Mail {
        let cell = &self.cell;
        let streamed = cell.sent.load(Ordering::Acquire);
        Mail::ActivityDone {
            seq,
            attempt,
            result,
            external_ref: crate::sync::lock(&cell.external_ref).take(),
            streamed: streamed.then(|| VersionSlot::of(cell)),
        }
    }
}

/// How an attempt's run ended: with the answer to send as it is (a refusal, a planned fault),
/// or with what the call returned, which the attempt's cell completes.
enum Attempted {
    Answered(Mail),
    Returned(Result<Payload, Failure>),
}

/// `run`, answering even if it panics. The application's code in it is caught where it runs;
/// what is left is the runtime's own (its fault hooks, its telemetry, dropping a timed-out
/// call's future, whose values' destructors are the application's again). Uncaught, such a
/// panic would end the attempt's task without an answer and leave its command waiting for
/// ever. Before the call, the attempt failed without calling, which its retry policy may retry
/// (an effect under the same key); after it, the attempt failed with its outcome unknown, like
/// any panic after a call (an effect is reconciled).
fn answered_even_if_it_panics(
    run: impl Future<Output = Attempted>,
    seq: Seq,
    attempt: u32,
    outputs: AttemptOutputs,
) -> impl Future<Output = Mail> {
    AssertUnwindSafe(run)
        .catch_unwind()
        .map(move |outcome| match outcome {
            Ok(Attempted::Answered(mail)) => mail,
            Ok(Attempted::Returned(result)) => outputs.done(seq, attempt, result),
            Err(panic) => {
                let message = panic_message(&panic);
                if outputs.cell.called.load(Ordering::Acquire) {
                    let message = format!("the attempt panicked after its call: {message}");
                    let failure = Failure::new(FailureKind::Panicked, message);
                    return outputs.done(seq, attempt, Err(failure));
                }
                let message =
                    format!("the attempt panicked before its call: {message}; it was not called");
                outputs.done(
                    seq,
                    attempt,
                    Err(Failure::new(FailureKind::Retriable, message)),
                )
            }
        })
}

/// What the fault plan says right before a call.
pub(super) enum BeforeCall {
    Proceed,
    Crash(String),
    Fail(Failure),
}

/// The fault plan as an attempt task sees it: `None` when no plan is installed.
pub(super) struct FaultHook(Option<PlannedCall>);

/// One attempt of one call, as a fault plan names it.
struct PlannedCall {
    plan: Arc<crate::faults::FaultPlan>,
    workflow_id: String,
    seq: Seq,
    attempt: u32,
    name: String,
}

impl FaultHook {
    /// The fault the plan injects at `boundary`, and the call it strikes.
    fn strike(&self, boundary: Boundary) -> Option<(Fault, &PlannedCall)> {
        let call = self.0.as_ref()?;
        let fault = call.plan.strike(
            &call.workflow_id,
            call.seq,
            &call.name,
            call.attempt,
            boundary,
        )?;
        Some((fault, call))
    }

    /// Whether the call goes ahead, the worker crashes, or the attempt fails without it.
    fn before_call(&self) -> BeforeCall {
        match self.strike(Boundary::BeforeCall) {
            None => BeforeCall::Proceed,
            Some((Fault::Crash, call)) => {
                BeforeCall::Crash(format!("BeforeCall {} attempt {}", call.name, call.attempt))
            }
            Some((fault, _)) => match crate::faults::replaced_answer(&fault) {
                Some(failure) => BeforeCall::Fail(failure),
                None => BeforeCall::Proceed,
            },
        }
    }

    /// The answer after the call, possibly replaced by an injected fault; `Err` on a crash.
    fn after_call(
        &self,
        result: Result<Payload, Failure>,
    ) -> Result<Result<Payload, Failure>, String> {
        let Some((fault, call)) = self.strike(Boundary::AfterCall) else {
            return Ok(result);
        };
        match crate::faults::replaced_answer(&fault) {
            Some(failure) => Ok(Err(failure)),
            None => Err(format!("AfterCall {} attempt {}", call.name, call.attempt)),
        }
    }
}

/// Runs `attempt` for at most the timeout given, on the clock given with it; on timeout the
/// attempt's cell says so, and the attempt is dropped (cancelled at its current await point)
/// before this returns.
pub(super) async fn within_timeout(
    attempt: impl Future<Output = Result<Payload, Failure>>,
    timeout: Option<(Duration, Arc<dyn Clock>)>,
    cell: &AttemptCell,
) -> Result<Payload, Failure> {
    let Some((timeout, clock)) = timeout else {
        return attempt.await;
    };
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let expiry = clock.sleep_until(clock.now_ms().saturating_add(timeout_ms));
    futures::pin_mut!(attempt);
    match futures::future::select(attempt, expiry).await {
        Either::Left((result, _)) => result,
        Either::Right(((), _)) => {
            cell.timed_out.store(true, Ordering::SeqCst);
            Err(Failure::new(FailureKind::Timeout, "start-to-close timeout"))
        }
    }
}

/// The failure of the first precondition that does not hold, checked in order. A check is
/// the application's code: one that panics refuses the call as well, instead of taking the
/// attempt down with it (its command would wait for an answer that never comes).
pub(super) async fn failed_precondition(preconditions: &[Precondition]) -> Option<Failure> {
    for precondition in preconditions {
        // Called inside the caught future: a check may panic before it returns its future.
        let check = async { (precondition.check)().await };
        let checked = AssertUnwindSafe(check).catch_unwind().await;
        let name = &precondition.name;
        match checked {
            Ok(true) => {}
            Ok(false) => {
                let message =
                    format!("precondition `{name}` does not hold; the effect was not called");
                return Some(Failure::new(FailureKind::PreconditionFailed, message));
            }
            Err(panic) => {
                let message = format!(
                    "precondition `{name}` panicked: {}; the effect was not called",
                    panic_message(&panic)
                );
                return Some(Failure::new(FailureKind::Panicked, message));
            }
        }
    }
    None
}

/// The journaled failure of an effect refused by its approval.
pub(super) fn not_approved_failure(refused: &NotApproved) -> Failure {
    let message = format!("{refused}; the effect was not called");
    Failure::new(FailureKind::NotApproved, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs(call_made: bool) -> AttemptOutputs {
        let cell = Arc::new(AttemptCell::default());
        cell.called.store(call_made, Ordering::Release);
        AttemptOutputs { cell }
    }

    /// Runs an attempt that panics, after marking its call made or not.
    fn answer_of_a_panic(call_made: bool) -> Mail {
        let outputs = outputs(call_made);
        ExternalRef::of(&outputs.cell).set("booking-9".into());
        let panics = async { panic!("a hook broke") };
        let run = answered_even_if_it_panics(panics, 3, 2, outputs);
        futures::executor::block_on(run)
    }

    #[test]
    fn a_panic_before_the_call_is_a_failure_a_retry_may_follow() {
        let Mail::ActivityDone {
            seq,
            attempt,
            result,
            ..
        } = answer_of_a_panic(false)
        else {
            panic!("not an answer");
        };
        assert_eq!((seq, attempt), (3, 2));
        let failure = result.unwrap_err();
        assert_eq!(failure.kind, FailureKind::Retriable, "{failure:?}");
        assert!(!failure.leaves_outcome_unknown(), "nothing was called");
        let expected = "the attempt panicked before its call: a hook broke; it was not called";
        assert_eq!(failure.message, expected);
    }

    #[test]
    fn a_panic_after_the_call_leaves_its_outcome_unknown() {
        let Mail::ActivityDone {
            seq,
            attempt,
            result,
            external_ref,
            ..
        } = answer_of_a_panic(true)
        else {
            panic!("not an answer");
        };
        assert_eq!((seq, attempt), (3, 2));
        let failure = result.unwrap_err();
        assert!(failure.leaves_outcome_unknown(), "{failure:?}");
        assert_eq!(
            failure.message,
            "the attempt panicked after its call: a hook broke"
        );
        assert_eq!(
            external_ref.as_deref(),
            Some("booking-9"),
            "what it learnt is kept"
        );
    }
}
