//! The typed contexts: what workflow and activity code call.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::FusedFuture;
use serde::de::DeserializeOwned;
use std::sync::Arc;

use waymark_runtime::approvals::Intent;
use waymark_runtime::compensations::CompensationFailed;
use waymark_runtime::context::{
    Fresh, Precondition, PreconditionCheck, StreamVerdict, TelemetryNote, WorkflowCore,
};
use waymark_runtime::error::RunError;
use waymark_runtime::journal::{CommandKind, Payload, Seq};
use waymark_runtime::machines::Resolution;
use waymark_runtime::registry::ActivityInfo;
use waymark_runtime::telemetry::{ReplayMode, Telemetry};

use crate::{Activity, ActivityError, ActivityOptions, Effect, WorkflowError};

/// The workflow's handle on the outside world. Every method is journaled: on replay it returns
/// what was recorded. Clone it freely.
#[derive(Clone)]
pub struct WorkflowContext {
    core: WorkflowCore,
}

impl WorkflowContext {
    pub(crate) fn new(core: WorkflowCore) -> Self {
        Self { core }
    }

    pub(crate) fn core(&self) -> &WorkflowCore {
        &self.core
    }

    /// The workflow's id.
    pub fn workflow_id(&self) -> &str {
        self.core.workflow_id()
    }

    /// [`ReplayMode::ResumeFromCheckpoint`] while the code walks recorded history (every ctx
    /// call so far is answered from the journal), [`ReplayMode::FirstExecution`] once it is
    /// past the journal's end. For logging and metrics that must not repeat on replay: the
    /// commands the code issues must not depend on it, or a replay diverges.
    pub fn replay_mode(&self) -> ReplayMode {
        self.core.replay_mode()
    }

    /// Runs `activity` with `input`, under its retry policy. The command takes its place in the
    /// journal now, when called, not when first awaited.
    pub fn activity<A: Activity>(&self, activity: A, input: A::Input) -> ActivityCall<A::Output> {
        self.schedule(A::NAME, &input, Some(activity.options()))
    }

    /// Runs the effect `effect` (an `#[activity(effect)]`) under its idempotency key and the
    /// operation log: a retry reuses the key, an unknown outcome is reconciled before any
    /// retry, and a key the log already settled is answered without calling again. Add
    /// preconditions with [`EffectCall::precondition`].
    pub fn effect<E: Effect>(&self, effect: E, input: E::Input) -> EffectCall<E::Output> {
        EffectCall {
            call: self.activity(effect, input),
        }
    }

    /// The intent of calling `effect` with `input`, computed as the runtime computes it when
    /// the effect runs (effect name, semantics version, idempotency key, canonical
    /// arguments): what an approval [authorises](crate::approvals::ApprovalRequest::authorises).
    /// Nothing is journaled or called.
    pub fn intent<E: Effect>(&self, _effect: E, input: E::Input) -> Result<Intent, WorkflowError> {
        let input = Payload::encode(&input).map_err(|e| {
            WorkflowError::Failed(format!("`{}`'s input does not encode: {e}", E::NAME))
        })?;
        self.intent_named(E::NAME, &input)
    }

    /// The intent of the activity registered as `name` called with `input`.
    pub(crate) fn intent_named(
        &self,
        name: &str,
        input: &Payload,
    ) -> Result<Intent, WorkflowError> {
        self.core.intent(name, input).map_err(WorkflowError::Failed)
    }

    /// An activity as an [`EffectCall`], for code that holds any activity (an agent's tools):
    /// the runtime treats it as the effect it is registered as, or as a read.
    pub(crate) fn effect_of<A: Activity>(
        &self,
        activity: A,
        input: A::Input,
    ) -> EffectCall<A::Output> {
        EffectCall {
            call: self.activity(activity, input),
        }
    }

    /// The activity registered as `name`, with a JSON input, as an [`EffectCall`]: an agent's
    /// tools that have no Rust type (an MCP server's).
    #[cfg(feature = "mcp")]
    pub(crate) fn effect_named(
        &self,
        name: &str,
        input: &serde_json::Value,
    ) -> EffectCall<serde_json::Value> {
        EffectCall {
            call: self.schedule(name, input, None),
        }
    }

    /// Like [`WorkflowContext::activity`] with options that replace the activity's own.
    pub fn activity_with<A: Activity>(
        &self,
        options: ActivityOptions,
        _activity: A,
        input: A::Input,
    ) -> ActivityCall<A::Output> {
        self.schedule(A::NAME, &input, Some(options))
    }

    /// Schedules a built-in activity (`waymark.llm`, ...) with the worker's options for it.
    pub(crate) fn schedule_builtin<I: serde::Serialize, O>(
        &self,
        name: &str,
        input: &I,
    ) -> ActivityCall<O> {
        self.schedule(name, input, None)
    }

    /// Schedules a retrieval: an activity whose result becomes a snapshot artifact.
    pub(crate) fn schedule_retrieval<I: serde::Serialize, O>(
        &self,
        name: &str,
        input: &I,
    ) -> ActivityCall<O> {
        self.schedule_as(input, |core, input| core.schedule_retrieval(name, input))
    }

    fn schedule<I: serde::Serialize, O>(
        &self,
        name: &str,
        input: &I,
        options: Option<ActivityOptions>,
    ) -> ActivityCall<O> {
        self.schedule_as(input, |core, input| {
            core.schedule_activity(name, input, options)
        })
    }

    fn schedule_as<I: serde::Serialize, O>(
        &self,
        input: &I,
        issue: impl FnOnce(&WorkflowCore, Payload) -> Option<Seq>,
    ) -> ActivityCall<O> {
        let seq = match Payload::encode(input) {
            Ok(input) => issue(&self.core, input),
            Err(error) => {
                self.core.stop(RunError::PayloadMismatch {
                    seq: None,
                    source: error,
                });
                None
            }
        };
        ActivityCall {
            core: self.core.clone(),
            seq,
            done: false,
            _output: PhantomData,
        }
    }

    /// A durable timer: survives restarts; a workflow waiting on a long one is evicted from
    /// memory and rebuilt when it fires.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        let duration_ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Sleep {
            core: self.core.clone(),
            seq: self.core.schedule_timer(duration_ms),
            done: false,
        }
    }

    /// Waits durably for the next signal named `name` (sent with `Worker::signal`). Signals
    /// sent before the wait are kept in the workflow's inbox; each delivery is journaled, and
    /// a repeated signal id is dropped on arrival. While it waits the workflow holds no memory.
    /// A payload that does not decode as `T` is an `Err` the workflow sees (and replays).
    pub fn signal<T: DeserializeOwned>(&self, name: &str) -> Signal<T> {
        Signal {
            core: self.core.clone(),
            seq: self.core.schedule_signal(name),
            name: name.to_owned(),
            done: false,
            _payload: PhantomData,
        }
    }

    /// The current time, recorded on first execution and replayed after.
    pub fn now(&self) -> SystemTime {
        let millis = self.recorded_u64(CommandKind::Now, |fresh| fresh.now_ms());
        UNIX_EPOCH + Duration::from_millis(millis)
    }

    /// A random number, recorded on first execution and replayed after.
    pub fn random(&self) -> u64 {
        self.recorded_u64(CommandKind::Random, |fresh| fresh.random(0))
    }

    /// A random (version 4) UUID, recorded on first execution and replayed after.
    pub fn uuid(&self) -> uuid::Uuid {
        let fresh = |fresh: &Fresh<'_>| {
            let high = u128::from(fresh.random(0)) << 64;
            let bytes = (high | u128::from(fresh.random(1))).to_be_bytes();
            let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
            Payload::from_value(&serde_json::Value::String(id.to_string()))
        };
        let recorded = self.core.record_value(CommandKind::Uuid, fresh);
        // A recorded value that is not a uuid stops the run (`decode`); the nil uuid is the
        // placeholder a stopping run gets, never journaled nor acted on.
        recorded.and_then(|p| self.decode(&p)).unwrap_or_default()
    }

    /// Runs the compensations registered so far ([`EffectCall::compensate_with`]), newest
    /// effect first, each once across crashes, and waits for them; each effect is undone at
    /// most once, so a later failure or cancellation does not undo it again. An undo that fails
    /// does not stop the ones before it; the error lists every one that failed.
    pub async fn compensate(&self) -> Result<(), CompensationFailed> {
        let failures = self.core.compensate().await;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(CompensationFailed(failures))
        }
    }

    /// Ends this run and starts the workflow afresh, under the same id, with `input` (which
    /// must be the workflow's input type): return the error this gives. The run's journal is
    /// kept as the ended workflow `ID#run-N`, and the new run starts with an empty history, so
    /// a workflow that loops for ever (a poller, an agent's long session) does not grow one
    /// without end. Its effects keep their keys: a call the earlier run made with the same
    /// intent is answered from the operation log. Registered undos do not run.
    ///
    /// ```ignore
    /// if state.rounds_done % 1_000 == 0 {
    ///     return Err(ctx.continue_as_new(&state));
    /// }
    /// ```
    pub fn continue_as_new<I: serde::Serialize>(&self, input: &I) -> WorkflowError {
        match Payload::encode(input) {
            Ok(input) => {
                self.core.continue_as_new(input);
                WorkflowError::ContinueAsNew
            }
            Err(e) => WorkflowError::Failed(format!("the next run's input does not encode: {e}")),
        }
    }

    /// Versioning: `true` for runs that reach this point on code that has the change, `false`
    /// when replaying a journal written before it. Keep both branches until no run that started
    /// before the change is still in flight.
    ///
    /// ```ignore
    /// let price = if ctx.patched("price-v2") {
    ///     ctx.activity(price_v2, item).await?
    /// } else {
    ///     ctx.activity(price_v1, item).await?
    /// };
    /// ```
    pub fn patched(&self, change_id: &str) -> bool {
        self.core.patched(change_id)
    }

    /// Records a validator's verdict (first execution) or returns the recorded one (replay), so
    /// a resumed run takes the decisions the original took.
    pub(crate) fn record_verdict(
        &self,
        name: &str,
        verdict: serde_json::Value,
        note: impl FnOnce(&Telemetry) + Send + 'static,
    ) -> Option<serde_json::Value> {
        self.record_stream_verdict(name, verdict, note, None)
    }

    /// [`WorkflowContext::record_verdict`] on a streamed answer: a new verdict also commits or
    /// supersedes the judged step's stream version, in the same write.
    pub(crate) fn record_stream_verdict(
        &self,
        name: &str,
        verdict: serde_json::Value,
        note: impl FnOnce(&Telemetry) + Send + 'static,
        stream: Option<StreamVerdict>,
    ) -> Option<serde_json::Value> {
        let fresh = |_: &Fresh<'_>| Payload::from_value(&verdict);
        // The note is counted once the new verdict is written; never for a replayed one.
        let note: TelemetryNote = Box::new(note);
        let recorded =
            self.core
                .record_verdict_value(CommandKind::Verdict, name, fresh, Some(note), stream);
        recorded.and_then(|p| self.decode(&p))
    }

    fn recorded_u64(&self, kind: CommandKind, fresh: impl FnOnce(&Fresh<'_>) -> u64) -> u64 {
        let recorded = self
            .core
            .record_value(kind, |source| Payload::from_u64(fresh(source)));
        // A stopping run gets a placeholder; it is never journaled nor acted on.
        recorded.and_then(|p| self.decode(&p)).unwrap_or_default()
    }

    fn decode<T: DeserializeOwned>(&self, payload: &Payload) -> Option<T> {
        match payload.decode() {
            Ok(value) => Some(value),
            Err(source) => {
                self.core
                    .stop(RunError::PayloadMismatch { seq: None, source });
                None
            }
        }
    }
}

/// The pending result of `ctx.activity`. Resolves with the activity's output, or with its error
/// once its retry policy gave up.
#[must_use = "an activity call does nothing for the workflow unless awaited"]
pub struct ActivityCall<T> {
    core: WorkflowCore,
    seq: Option<Seq>,
    done: bool,
    _output: PhantomData<fn() -> T>,
}

impl<T> ActivityCall<T> {
    /// The command; `None` when the run is stopping.
    pub(crate) fn seq(&self) -> Option<Seq> {
        self.seq
    }
}

impl<T: DeserializeOwned> Future for ActivityCall<T> {
    type Output = Result<T, ActivityError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (Some(seq), false) = (self.seq, self.done) else {
            return Poll::Pending;
        };
        let resolution = std::task::ready!(self.core.poll_resolution(seq, cx));
        let output = match resolution {
            Resolution::Completed(payload) => match payload.decode() {
                Ok(value) => Ok(value),
                Err(source) => {
                    self.core.stop(RunError::PayloadMismatch {
                        seq: Some(seq),
                        source,
                    });
                    return Poll::Pending;
                }
            },
            Resolution::Failed(failure) => Err(ActivityError::from_failure(&failure)),
            Resolution::Fired | Resolution::Snapshot(_) => {
                self.core.stop(RunError::InconsistentJournal {
                    seq,
                    message: "an activity resolved by something other than its outcome".into(),
                });
                return Poll::Pending;
            }
        };
        self.done = true;
        Poll::Ready(output)
    }
}

impl<T: DeserializeOwned> FusedFuture for ActivityCall<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

/// The pending result of `ctx.effect`.
#[must_use = "an effect call does nothing for the workflow unless awaited"]
pub struct EffectCall<T> {
    call: ActivityCall<T>,
}

impl<T> EffectCall<T> {
    pub(crate) fn core(&self) -> &WorkflowCore {
        &self.call.core
    }

    /// The effect's command; `None` when the run is stopping.
    pub(crate) fn seq(&self) -> Option<Seq> {
        self.call.seq
    }

    /// Adds a precondition, checked right before every call of the effect (after the
    /// `prepared` record, before the downstream). When it returns `false` the effect is not
    /// called and fails terminally with the precondition's name, journaled; it is not retried.
    ///
    /// ```ignore
    /// let orders = orders.clone();
    /// ctx.effect(rebook, (order_id.clone(), carrier))
    ///     .precondition("order still delayed", move || {
    ///         let orders = orders.clone();
    ///         async move { orders.is_delayed(&order_id).await }
    ///     })
    ///     .await?;
    /// ```
    pub fn precondition<F, Fut>(self, name: &str, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = bool> + Send + 'static,
    {
        if let Some(seq) = self.call.seq {
            let check: PreconditionCheck = Arc::new(move || Box::pin(check()));
            let precondition = Precondition {
                name: name.to_owned(),
                check,
            };
            self.call.core.add_precondition(seq, precondition);
        }
        self
    }
}

impl<T: DeserializeOwned + 'static> EffectCall<T> {
    /// Registers `undo`, called with `input`, as this effect's compensation: if the effect
    /// commits and the workflow then fails, is cancelled, or calls
    /// [`WorkflowContext::compensate`], `undo` runs (newest effect first), as an effect with
    /// its own idempotency key, once across crashes. An effect that fails for good (the
    /// operation log says it did not happen) is not undone. The undo's key comes from its own
    /// `#[key]` arguments: two undos of one run with the same key arguments are one intent (the
    /// second is answered by the first), so key an undo by what it undoes.
    ///
    /// ```ignore
    /// ctx.effect(book, (order.clone(), carrier))
    ///     .compensate_with(cancel_booking, order.clone())
    ///     .await?;
    /// ```
    pub fn compensate_with<U: Effect>(self, undo: U, input: U::Input) -> Self {
        let input = Payload::encode(&input).map_err(|e| e.to_string());
        self.register_undo(undo, move |_| input)
    }

    /// Like [`EffectCall::compensate_with`], with the undo's input made from the effect's
    /// output (the booking reference a cancellation names).
    pub fn compensate_with_output<U: Effect>(
        self,
        undo: U,
        input: impl FnOnce(&T) -> U::Input + Send + 'static,
    ) -> Self {
        self.register_undo(undo, move |output| {
            let output: T = output.decode().map_err(|e| e.to_string())?;
            Payload::encode(&input(&output)).map_err(|e| e.to_string())
        })
    }

    fn register_undo<U: Effect>(
        self,
        undo: U,
        input: impl FnOnce(&Payload) -> Result<Payload, String> + Send + 'static,
    ) -> Self {
        if let Some(effect) = self.call.seq {
            let core = &self.call.core;
            core.register_compensation(effect, U::NAME, undo.options(), Box::new(input));
        }
        self
    }
}

impl<T: DeserializeOwned> Future for EffectCall<T> {
    type Output = Result<T, ActivityError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.call).poll(cx)
    }
}

impl<T: DeserializeOwned> FusedFuture for EffectCall<T> {
    fn is_terminated(&self) -> bool {
        self.call.done
    }
}

/// The pending end of a durable timer.
#[must_use = "a timer does nothing for the workflow unless awaited"]
pub struct Sleep {
    core: WorkflowCore,
    seq: Option<Seq>,
    done: bool,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let (Some(seq), false) = (self.seq, self.done) else {
            return Poll::Pending;
        };
        std::task::ready!(self.core.poll_resolution(seq, cx));
        self.done = true;
        Poll::Ready(())
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        // A timer that lost a select! is cancelled: it must neither fire later (a synced write)
        // nor wake the workflow from eviction to do nothing.
        if let (Some(seq), false) = (self.seq, self.done) {
            self.core.abandon_wait(seq);
        }
    }
}

impl FusedFuture for Sleep {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

/// The pending delivery of a signal.
#[must_use = "a signal wait does nothing for the workflow unless awaited"]
pub struct Signal<T> {
    core: WorkflowCore,
    seq: Option<Seq>,
    name: String,
    done: bool,
    _payload: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> Future for Signal<T> {
    type Output = Result<T, WorkflowError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let (Some(seq), false) = (self.seq, self.done) else {
            return Poll::Pending;
        };
        let resolution = std::task::ready!(self.core.poll_resolution(seq, cx));
        let Resolution::Completed(payload) = resolution else {
            self.core.stop(RunError::InconsistentJournal {
                seq,
                message: "a signal wait resolved by something other than a signal".into(),
            });
            return Poll::Pending;
        };
        self.done = true;
        let decoded = payload.decode().map_err(|e| {
            WorkflowError::Failed(format!(
                "signal `{}` carries a payload of the wrong shape: {e}",
                self.name
            ))
        });
        Poll::Ready(decoded)
    }
}

impl<T: DeserializeOwned> FusedFuture for Signal<T> {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<T> Drop for Signal<T> {
    fn drop(&mut self) {
        // A wait that lost a select! must not swallow the next signal of its name.
        if let (Some(seq), false) = (self.seq, self.done) {
            self.core.abandon_wait(seq);
        }
    }
}

/// What an activity attempt knows about itself.
#[derive(Debug, Clone)]
pub struct ActivityContext {
    info: ActivityInfo,
}

impl ActivityContext {
    pub(crate) fn new(info: ActivityInfo) -> Self {
        Self { info }
    }

    /// The workflow that scheduled this activity.
    pub fn workflow_id(&self) -> &str {
        &self.info.workflow_id
    }

    /// The activity's stable name.
    pub fn activity_name(&self) -> &str {
        &self.info.activity_name
    }

    /// The command's position in the workflow.
    pub fn seq(&self) -> u32 {
        self.info.seq
    }

    /// 1-based attempt number.
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// Why this attempt runs: [`ReplayMode::FirstExecution`], `InStageRetry` (a later attempt
    /// in the same run), `ResumeFromCheckpoint` (it was in flight when the previous process
    /// stopped) or `OperatorRestart` (an operator found the last attempt did not happen). An
    /// activity may choose by it: load the snapshot it saved rather than query live on a
    /// resume, say.
    pub fn replay_mode(&self) -> ReplayMode {
        self.info.replay_mode
    }

    /// The effect's idempotency key, `{workflow_id}|{operation}|{key arguments}|v{version}`
    /// (in a fork, the id of the workflow it was forked from, so that the same intent is the
    /// same key downstream): pass it to the downstream API so it can recognise a retry. `None`
    /// in a plain (non-effect) activity.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.info.idempotency_key.as_deref()
    }

    /// Records the downstream's reference for what this attempt did (a booking number); the
    /// operation log keeps it next to the result.
    pub fn set_external_ref(&self, reference: impl Into<String>) {
        self.info.external_ref.set(reference.into());
    }

    /// Reports what this attempt's call cost (a paid API behind a tool), in the millionths the
    /// model price table uses, so tool cost is read beside model cost
    /// (`waymark_tool_cost_micros_total`, by activity). Counted for every attempt that reports
    /// it, failed ones included: each was paid for.
    pub fn record_cost(&self, cost_micros: u64) {
        let info = &self.info;
        info.telemetry.tool_cost(&info.activity_name, cost_micros);
    }

    /// Appends partial output to the workflow's durable stream, under this attempt's response
    /// version: readers see it once it is synced; if the attempt fails, the version is marked
    /// superseded. A write the store refuses fails the attempt's own result write.
    pub fn stream(&self, text: &str) {
        self.info.stream.chunk(text);
    }
}
