//! Replay-safety telemetry. Spans say what ran and what was replayed; metrics count the events
//! that reveal hidden replay bugs: a key attempted twice, an outcome left unknown, an approval
//! that does not match what ran, a stream that showed what was not committed.
//!
//! Every signal goes to two sinks through the `metrics` facade: the recorder the application
//! installed (none by default), and this worker's own Prometheus recorder, which `/metrics`
//! renders and tests read. The worker's own recorder is not global, so two workers in one
//! process (or two tests) never mix their figures; a [`Telemetry`] handed to a restarted worker
//! keeps counting across the restart.

mod journal_stats;
pub mod names;
mod prometheus;
pub mod text;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{counter, gauge, histogram, Counter};

pub use journal_stats::{failure_location, journal_stats, step_of, JournalStats, StepLocation};
use prometheus::PrometheusRecorder;
pub use text::{MetricSample, MetricSet};

use crate::machines::CallCounts;
use crate::store::LeaseStats;
use crate::sync::lock;
use names::*;

/// Why a step ran live: the replay mode its span carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Attempt 1 of a step this process issued.
    FirstExecution,
    /// A later attempt after a failure, in the same run of the executor.
    InStageRetry,
    /// Recorded history delivered again (replayed steps), or a step that was in flight when the
    /// previous run stopped and runs again after replay.
    ResumeFromCheckpoint,
    /// An attempt an operator's decision (`not_found`) allowed.
    OperatorRestart,
}

impl ReplayMode {
    /// The span field's value.
    pub fn name(self) -> &'static str {
        match self {
            ReplayMode::FirstExecution => "first_execution",
            ReplayMode::InStageRetry => "in_stage_retry",
            ReplayMode::ResumeFromCheckpoint => "resume_from_checkpoint",
            ReplayMode::OperatorRestart => "operator_restart",
        }
    }
}

/// The boundary a workflow resumed from when a worker recovered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResumePoint {
    /// Nothing past the start was journaled.
    Start,
    /// Every journaled step was settled: the next one had not been issued.
    BetweenSteps,
    /// A read activity or model call was in flight: it runs again.
    InFlightCall,
    /// An effect was in flight or being reconciled: its operation log decides what follows.
    UnsettledEffect,
    /// A retry was waiting for its backoff.
    RetryBackoff,
    /// An effect waited for an operator.
    AwaitingOperator,
    /// A timer, signal or approval was awaited.
    Waiting,
}

impl ResumePoint {
    /// The metric label.
    pub fn name(self) -> &'static str {
        match self {
            ResumePoint::Start => "start",
            ResumePoint::BetweenSteps => "between_steps",
            ResumePoint::InFlightCall => "in_flight_call",
            ResumePoint::UnsettledEffect => "unsettled_effect",
            ResumePoint::RetryBackoff => "retry_backoff",
            ResumePoint::AwaitingOperator => "awaiting_operator",
            ResumePoint::Waiting => "waiting",
        }
    }
}

/// Why an executor was started: recovery latency is measured from `since`.
#[derive(Debug, Clone, Copy)]
pub enum Wake {
    /// A new workflow.
    Started,
    /// The worker recovered it on start (after a crash, a restart or a deploy).
    Recovered {
        /// When the worker started.
        since: Instant,
    },
    /// An event (timer, signal, decision) arrived for an evicted workflow.
    Event {
        /// When the event arrived.
        since: Instant,
    },
}

impl Wake {
    /// The span field's value.
    pub fn name(self) -> &'static str {
        match self {
            Wake::Started => "started",
            Wake::Recovered { .. } => "recovered",
            Wake::Event { .. } => "event",
        }
    }
}

/// What kind of call a live invocation is, for the invocation counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A read activity.
    Activity,
    /// An effect.
    Effect,
    /// A model call.
    Llm,
    /// A retrieval.
    Retrieval,
}

impl CallKind {
    /// The `stage` a step of this kind is labelled with where it failed or resumed.
    pub fn stage(self) -> &'static str {
        match self {
            CallKind::Activity => "read",
            CallKind::Effect => "effect",
            CallKind::Llm => "model_call",
            CallKind::Retrieval => "retrieval",
        }
    }

    /// The metric label and span field.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::Activity => "activity",
            CallKind::Effect => "effect",
            CallKind::Llm => "llm",
            CallKind::Retrieval => "retrieval",
        }
    }
}

/// One model call's spend, as journaled with its response.
#[derive(Debug, Clone, Copy)]
pub struct LlmSpend<'a> {
    /// The model asked for.
    pub model: &'a str,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Cost in millionths of the price table's currency.
    pub cost_micros: u64,
}

/// How a model attempt ended, as its cost is labelled (`attempt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptEnd {
    /// Its response was journaled.
    Completed,
    /// The provider answered with an error.
    Failed,
    /// It was dropped at its timeout.
    TimedOut,
    /// The process stopped while it was in flight (found by the process that ran it again).
    Interrupted,
}

impl AttemptEnd {
    /// The `attempt` label.
    pub fn name(self) -> &'static str {
        match self {
            AttemptEnd::Completed => "completed",
            AttemptEnd::Failed => "failed",
            AttemptEnd::TimedOut => "timed_out",
            AttemptEnd::Interrupted => "interrupted",
        }
    }

    /// The `stage` of its wasted cost.
    fn stage(self) -> &'static str {
        match self {
            AttemptEnd::Completed => "model_call",
            AttemptEnd::Failed => "attempt_failed",
            AttemptEnd::TimedOut => "attempt_timed_out",
            AttemptEnd::Interrupted => "attempt_interrupted",
        }
    }
}

/// Where a cost figure comes from (`priced`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priced {
    /// The provider's reported usage, priced by the price table.
    Reported,
    /// Estimated from the request's (and any streamed output's) size: about four characters a
    /// token. A provider that reports nothing for a failed call leaves nothing better.
    Estimated,
}

impl Priced {
    /// The `priced` label.
    pub fn name(self) -> &'static str {
        match self {
            Priced::Reported => "reported",
            Priced::Estimated => "estimated",
        }
    }
}

/// Every status `waymark_workflows` reports, so one that drops to none reads 0.
pub const WORKFLOW_STATUSES: [&str; 6] = [
    "running",
    "completed",
    "failed",
    "awaiting_operator",
    "stuck",
    "unreadable",
];

/// What the store holds and has counted, set on the gauges and counters when metrics are
/// scraped.
#[derive(Debug, Clone, Default)]
pub struct StoreState {
    /// Workflows by status name.
    pub workflows_by_status: BTreeMap<&'static str, u64>,
    /// Workflows held in memory.
    pub resident: u64,
    /// The store's write statistics, when it keeps them.
    pub writes: Option<crate::store::WriteStats>,
}

/// A worker's telemetry. Cheap to clone; clones share their figures.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

struct Inner {
    prometheus: Prometheus,
    /// Idempotency keys whose outcome is unknown now, with their workflow: the gauge is this
    /// map's size, so finding the same key again does not count it twice, and a workflow that
    /// ends takes its keys with it.
    unknown: Mutex<HashMap<String, String>>,
    /// Per workflow, the calls this process ran again after a restart found them in flight
    /// under the attempt number the journal already holds: the journal cannot show them.
    reruns: Mutex<HashMap<String, u64>>,
    /// Per worker id, the store's lease counts as last counted here: the store keeps totals
    /// since it opened, and a worker restarted with this telemetry registers under a new id.
    leases_seen: Mutex<HashMap<String, LeaseStats>>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// A fresh set of figures, all zero.
    pub fn new() -> Self {
        names::describe_all();
        Self {
            inner: Arc::new(Inner {
                prometheus: Prometheus::new(),
                unknown: Mutex::default(),
                reruns: Mutex::default(),
                leases_seen: Mutex::default(),
            }),
        }
    }

    /// The figures as Prometheus text.
    pub fn render(&self) -> String {
        self.inner.prometheus.recorder.render()
    }

    /// The figures, parsed.
    pub fn snapshot(&self) -> MetricSet {
        MetricSet::parse(&self.render())
    }

    /// Records to the application's recorder and to this worker's.
    fn emit(&self, record: impl Fn()) {
        record();
        metrics::with_local_recorder(&self.inner.prometheus.recorder, record);
    }

    /// Sets the store's gauges (called when metrics are scraped).
    pub fn observe_store(&self, state: &StoreState) {
        self.emit(|| {
            for status in WORKFLOW_STATUSES {
                let count = state.workflows_by_status.get(status).copied().unwrap_or(0);
                gauge!(WORKFLOWS, "status" => status).set(count as f64);
            }
            gauge!(RESIDENT_WORKFLOWS).set(state.resident as f64);
            if let Some(writes) = state.writes {
                counter!(STORE_SYNCED_BATCHES).absolute(writes.batches);
                counter!(STORE_TRANSITIONS).absolute(writes.transitions);
            }
        });
    }

    /// Counts what the leases of worker `worker_id` came to since they were last counted here
    /// (`stats`: the store's totals). Called after every heartbeat, and before metrics are
    /// rendered, so the counters move within a third of a lease. The counters of a worker on a
    /// shared store are all there from its first heartbeat, at zero if nothing happened.
    pub fn observe_leases(&self, worker_id: &str, stats: LeaseStats) {
        let seen = lock(&self.inner.leases_seen).insert(worker_id.to_owned(), stats);
        let seen = seen.unwrap_or_default();
        let grown = |now: u64, before: u64| now.saturating_sub(before);
        self.emit(|| {
            counter!(FENCED_WRITES).increment(grown(stats.fenced_writes, seen.fenced_writes));
            counter!(LEASE_LAPSES).increment(grown(stats.lapses, seen.lapses));
            counter!(LEASES_CLAIMED).increment(grown(stats.claimed, seen.claimed));
            counter!(LEASES_ADOPTED).increment(grown(stats.adopted, seen.adopted));
            for name in [COMMANDS_RELAYED, WORKFLOWS_PARKED, RUNS_FENCED, RUNS_LET_GO] {
                counter!(name).increment(0);
            }
        });
    }

    /// One more of what the counter `name` (of [`names`]) counts.
    pub(crate) fn count(&self, name: &'static str) {
        self.emit(|| counter!(name).increment(1));
    }

    /// An executor started for a workflow (it replays the journal unless the workflow is new).
    pub fn workflow_loaded(&self, wake: Wake) {
        self.emit(|| counter!(WORKFLOW_LOADS, "wake" => wake.name()).increment(1));
    }

    /// The reconciliation sweep went over every operation awaiting a decision once.
    pub fn swept(&self) {
        self.emit(|| counter!(RECONCILIATION_SWEEPS).increment(1));
    }

    /// The sweep asked an operation's reconciler, which answered `answer` (`committed`,
    /// `not_found`, `cannot_tell`).
    pub fn operation_swept(&self, answer: &'static str) {
        self.emit(|| counter!(SWEPT_OPERATIONS, "answer" => answer).increment(1));
    }

    /// How many workflows this worker holds as stuck now.
    pub fn workflows_stuck(&self, count: usize) {
        self.emit(|| gauge!(WORKFLOWS_STUCK).set(count as f64));
    }

    /// A workflow the worker recovered on start resumed from `point`, at `step` (the step in
    /// flight or due, labelled as a failure location is; `None`: between steps).
    pub fn resumed(&self, point: ResumePoint, step: Option<&StepLocation>) {
        // Every workflow of a recovery passes here: the labels known at compile time are
        // borrowed, not copied into new strings.
        let (name, stage) = match step {
            Some(step) => (metrics::SharedString::from(step.step.clone()), step.stage),
            None => (metrics::SharedString::const_str("none"), "none"),
        };
        let point = point.name();
        self.emit(|| {
            let step = name.clone();
            counter!(RESUMES, "point" => point, "step" => step, "stage" => stage).increment(1)
        });
    }

    /// A call found in flight after a restart runs again under the attempt number the journal
    /// holds: amplification adds it to what the journal shows.
    pub fn rerun_after_restart(&self, workflow_id: &str) {
        *lock(&self.inner.reruns)
            .entry(workflow_id.to_owned())
            .or_default() += 1;
    }

    /// A workflow runs again `latency` after the worker started or its event arrived.
    pub fn recovered(&self, wake: Wake, latency: Duration) {
        let cause = match wake {
            Wake::Recovered { .. } => "worker_start",
            Wake::Event { .. } => "event",
            Wake::Started => return,
        };
        let seconds = latency.as_secs_f64();
        self.emit(|| histogram!(RECOVERY_LATENCY, "cause" => cause).record(seconds));
    }

    /// A call left the process (an attempt passed its last boundary before the call).
    pub fn invoked(&self, kind: CallKind) {
        invocations(kind).increment(1);
        self.inner.prometheus.invocations.of(kind).increment(1);
    }

    /// An effect's idempotency key came up again after its first attempt: a retry, or a
    /// reconciliation of an unknown outcome.
    pub fn intent_repeated(&self, effect: &str) {
        let effect = effect.to_owned();
        self.emit(|| counter!(DUPLICATE_INTENTS, "effect" => effect.clone()).increment(1));
    }

    /// An effect was called again for a key an earlier attempt had been prepared for: the key
    /// reached the downstream more than once.
    pub fn downstream_repeat(&self, effect: &str) {
        let effect = effect.to_owned();
        self.emit(|| counter!(DOWNSTREAM_REPEATS, "effect" => effect.clone()).increment(1));
    }

    /// An effect's outcome became unknown.
    pub fn outcome_unknown(&self, workflow_id: &str, effect: &str, key: &str) {
        if self.track_unknown(workflow_id, key) {
            let effect = effect.to_owned();
            self.emit(|| counter!(UNKNOWN_OUTCOMES, "effect" => effect.clone()).increment(1));
        }
    }

    /// A recovered workflow still has an unknown outcome under `key` (counted when it became
    /// unknown, by the worker that saw it happen): on the gauge again, not on the counter.
    pub fn outcome_still_unknown(&self, workflow_id: &str, key: &str) {
        self.track_unknown(workflow_id, key);
    }

    /// An unknown outcome was settled (reconciled, or decided by an operator).
    pub fn outcome_settled(&self, key: &str) {
        let mut unknown = lock(&self.inner.unknown);
        if unknown.remove(key).is_some() {
            self.set_unknown_gauge(unknown.len());
        }
    }

    /// Whether `key` was not tracked yet.
    fn track_unknown(&self, workflow_id: &str, key: &str) -> bool {
        let mut unknown = lock(&self.inner.unknown);
        let owner = workflow_id.to_owned();
        let newly = unknown.insert(key.to_owned(), owner).is_none();
        self.set_unknown_gauge(unknown.len());
        newly
    }

    /// Called with the map locked, so concurrent changes set the gauge in their order.
    fn set_unknown_gauge(&self, open: usize) {
        let open = open as f64;
        self.emit(|| gauge!(UNKNOWN_OUTCOME_OPERATIONS).set(open));
    }

    /// A workflow that ended (or was cancelled) with operations unsettled: they can no longer
    /// be resolved, so they leave the gauge (their records stay for inspection).
    fn forget_unknown(&self, workflow_id: &str) {
        let mut unknown = lock(&self.inner.unknown);
        let before = unknown.len();
        unknown.retain(|_, owner| owner != workflow_id);
        if unknown.len() != before {
            self.set_unknown_gauge(unknown.len());
        }
    }

    /// An effect was refused because the approved artifact is not the executed one.
    pub fn approval_hash_mismatch(&self) {
        self.emit(|| counter!(APPROVAL_HASH_MISMATCHES).increment(1));
    }

    /// A cached stage was answered with an earlier call's result.
    pub fn stage_cache_hit(&self, activity: &str) {
        let activity = activity.to_owned();
        self.emit(|| counter!(STAGE_CACHE_HITS, "activity" => activity.clone()).increment(1));
    }

    /// An effect was refused: its key was used before with other arguments.
    pub fn key_conflict(&self, operation: &str) {
        let operation = operation.to_owned();
        self.emit(|| counter!(KEY_CONFLICTS, "operation" => operation.clone()).increment(1));
    }

    /// An agent refused a tool call its model chose, before anything ran.
    pub fn agent_tool_call_refused(&self, tool: &str, reason: &'static str) {
        let tool = tool.to_owned();
        self.emit(|| {
            counter!(AGENT_TOOL_CALLS_REFUSED, "tool" => tool.clone(), "reason" => reason)
                .increment(1)
        });
    }

    /// An agent ran a tool call its model chose.
    pub fn agent_tool_called(&self, tool: &str) {
        let tool = tool.to_owned();
        self.emit(|| counter!(AGENT_TOOL_CALLS, "tool" => tool.clone()).increment(1));
    }

    /// An agent run ended on an exhausted budget.
    pub fn agent_budget_exhausted(&self, budget: &'static str) {
        self.emit(|| counter!(AGENT_BUDGET_EXHAUSTED, "budget" => budget).increment(1));
    }

    /// A deliberate retrieval refresh found other documents than its snapshot.
    pub fn snapshot_drift(&self) {
        self.emit(|| counter!(SNAPSHOT_DRIFT).increment(1));
    }

    /// A response version readers may have seen was superseded by a retry.
    pub fn stream_superseded(&self) {
        self.emit(|| counter!(STREAM_SUPERSEDED).increment(1));
    }

    /// What readers were shown differs from what was committed.
    pub fn stream_divergence(&self) {
        self.emit(|| counter!(STREAM_DIVERGENCE).increment(1));
    }

    /// A repair ladder ended at `depth` (0: the first answer passed).
    pub fn validator_depth(&self, depth: u32) {
        self.emit(|| histogram!(VALIDATOR_DEPTH).record(f64::from(depth)));
    }

    /// A model call completed and was journaled, with the usage its provider reported.
    pub fn llm_spent(&self, spend: LlmSpend<'_>) {
        self.llm_attempt_priced(spend, AttemptEnd::Completed, Priced::Reported);
    }

    /// A model attempt that journaled no response still cost something: `spend` is what the
    /// provider reported for it, or what it was estimated at (`priced`).
    /// It is wasted where it was spent: at `step` (the call's prompt, or its model).
    pub fn llm_attempt_lost(
        &self,
        spend: LlmSpend<'_>,
        step: &str,
        end: AttemptEnd,
        priced: Priced,
    ) {
        self.llm_attempt_priced(spend, end, priced);
        let (step, stage, cost) = (step.to_owned(), end.stage(), spend.cost_micros);
        self.emit(|| {
            counter!(LLM_WASTED_COST, "failed_at" => step.clone(), "stage" => stage).increment(cost)
        });
    }

    fn llm_attempt_priced(&self, spend: LlmSpend<'_>, end: AttemptEnd, priced: Priced) {
        let model = spend.model.to_owned();
        let (end, priced) = (end.name(), priced.name());
        self.emit(|| {
            let labels = |kind: &'static str| {
                [
                    ("model", model.clone()),
                    ("kind", kind.to_owned()),
                    ("attempt", end.to_owned()),
                    ("priced", priced.to_owned()),
                ]
            };
            counter!(LLM_TOKENS, &labels("prompt")).increment(spend.prompt_tokens);
            counter!(LLM_TOKENS, &labels("completion")).increment(spend.completion_tokens);
            let [model, _, attempt, priced] = labels("");
            counter!(LLM_COST, &[model, attempt, priced]).increment(spend.cost_micros);
        });
    }

    /// What an activity reported its own call cost (a paid API behind a tool).
    pub fn tool_cost(&self, activity: &str, cost_micros: u64) {
        let activity = activity.to_owned();
        self.emit(|| counter!(TOOL_COST, "activity" => activity.clone()).increment(cost_micros));
    }

    /// A model answer was rejected by a validator: what it cost was spent for nothing.
    pub fn llm_rejected(&self, cost_micros: u64) {
        self.emit(|| {
            counter!(LLM_WASTED_COST, "failed_at" => "validator", "stage" => "validator")
                .increment(cost_micros)
        });
    }

    /// A workflow ended (completed, failed or cancelled). `calls` says how many calls it
    /// needed and how many attempts it journaled, as its journal's entries do; `failed` where
    /// it failed and what its model calls had cost, if it failed. Amplification comes from the
    /// journal (plus the in-flight calls this process ran again after a restart), so a
    /// workflow that a new process recovered counts whole, whichever process saw it start.
    pub fn workflow_ended(&self, workflow_id: &str, calls: CallCounts, failed: Option<&FailedRun>) {
        self.forget_unknown(workflow_id);
        let reruns = lock(&self.inner.reruns).remove(workflow_id).unwrap_or(0);
        if calls.ideal_calls > 0 {
            let ideal = calls.ideal_calls;
            self.emit(|| counter!(IDEAL_INVOCATIONS).increment(ideal));
            let factor = (calls.journaled_attempts + reruns) as f64 / ideal as f64;
            self.emit(|| histogram!(RETRY_AMPLIFICATION).record(factor));
        }
        if let Some(failed) = failed {
            let (step, stage) = (failed.at.step.clone(), failed.at.stage);
            let cost = failed.model_cost_micros;
            self.emit(|| {
                let wasted =
                    counter!(LLM_WASTED_COST, "failed_at" => step.clone(), "stage" => stage);
                wasted.increment(cost);
            });
        }
    }
}

/// Where a run failed, and what its model calls had cost: spent for nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRun {
    /// The step it failed at.
    pub at: StepLocation,
    /// What its journaled model calls cost (micro-units).
    pub model_cost_micros: u64,
}

impl FailedRun {
    /// The failure, at `at`, of the run whose journal says `stats`.
    pub fn of(stats: &JournalStats, at: StepLocation) -> Self {
        Self {
            at,
            model_cost_micros: stats.cost_micros,
        }
    }
}

/// The worker's own recorder.
struct Prometheus {
    recorder: PrometheusRecorder,
    /// Registered once: every step counts one, and registering looks the key up in the
    /// recorder's table.
    invocations: Invocations,
}

/// The worker's invocation counter of each [`CallKind`].
struct Invocations {
    activity: Counter,
    effect: Counter,
    llm: Counter,
    retrieval: Counter,
}

impl Invocations {
    /// The counters of the current recorder.
    fn register() -> Self {
        Self {
            activity: invocations(CallKind::Activity),
            effect: invocations(CallKind::Effect),
            llm: invocations(CallKind::Llm),
            retrieval: invocations(CallKind::Retrieval),
        }
    }

    fn of(&self, kind: CallKind) -> &Counter {
        match kind {
            CallKind::Activity => &self.activity,
            CallKind::Effect => &self.effect,
            CallKind::Llm => &self.llm,
            CallKind::Retrieval => &self.retrieval,
        }
    }
}

impl Prometheus {
    fn new() -> Self {
        let recorder = PrometheusRecorder::new();
        metrics::with_local_recorder(&recorder, names::describe_all);
        // Unlabeled series exist from the start, so an alert on them sees 0, not no data.
        metrics::with_local_recorder(&recorder, names::register_unlabeled);
        let invocations = metrics::with_local_recorder(&recorder, Invocations::register);
        Self {
            recorder,
            invocations,
        }
    }
}

/// The invocation counter of `kind` in the current recorder. Literal labels make a static
/// key: registering it allocates no key.
fn invocations(kind: CallKind) -> Counter {
    match kind {
        CallKind::Activity => counter!(INVOCATIONS, "kind" => "activity"),
        CallKind::Effect => counter!(INVOCATIONS, "kind" => "effect"),
        CallKind::Llm => counter!(INVOCATIONS, "kind" => "llm"),
        CallKind::Retrieval => counter!(INVOCATIONS, "kind" => "retrieval"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invocation_is_counted_under_its_kinds_name() {
        let kinds = [
            CallKind::Activity,
            CallKind::Effect,
            CallKind::Llm,
            CallKind::Retrieval,
        ];
        let telemetry = Telemetry::new();
        for (times, kind) in kinds.into_iter().enumerate() {
            for _ in 0..=times {
                telemetry.invoked(kind);
            }
        }
        let figures = telemetry.snapshot();
        for (times, kind) in kinds.into_iter().enumerate() {
            let counted = figures.value(INVOCATIONS, &[("kind", kind.name())]);
            assert_eq!(counted, (times + 1) as f64, "{}", kind.name());
        }
    }

    #[test]
    fn lease_counts_add_what_each_workers_totals_grew_by() {
        let telemetry = Telemetry::new();
        let claimed = |claimed| LeaseStats {
            claimed,
            ..LeaseStats::default()
        };
        let counted = || telemetry.snapshot().value(LEASES_CLAIMED, &[]);
        telemetry.observe_leases("first", claimed(2));
        telemetry.observe_leases("first", claimed(2));
        assert_eq!(counted(), 2.0, "a total seen twice counts once");
        telemetry.observe_leases("first", claimed(3));
        assert_eq!(counted(), 3.0);
        // A worker restarted with this telemetry: a new id, its store counting from zero.
        telemetry.observe_leases("second", claimed(1));
        assert_eq!(counted(), 4.0);
        let figures = telemetry.snapshot();
        let relayed: Vec<_> = figures.matching(COMMANDS_RELAYED, &[]).collect();
        assert_eq!(
            relayed.len(),
            1,
            "a shared store's counters are there, at zero"
        );
        assert_eq!(relayed[0].value, 0.0);
    }
}
