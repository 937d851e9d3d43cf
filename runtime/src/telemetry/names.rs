//! The metric names, each with what it counts. Names are part of the public surface:
//! dashboards and alerts are written against them.

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};

/// Counter, labels `point` (the boundary a recovered workflow resumed from), `step` and `stage`
/// (the step in flight or due there, labelled as `LLM_WASTED_COST`'s `failed_at` and `stage`;
/// `none` between steps).
pub const RESUMES: &str = "waymark_workflow_resumes_total";
/// Histogram, label `cause` (`worker_start`, `event`): from the worker's start or the event's
/// arrival to the workflow running live again.
pub const RECOVERY_LATENCY: &str = "waymark_recovery_latency_seconds";
/// Counter, label `kind`: calls that left the process (activities, effects, model calls,
/// retrievals), retries and repeats after crashes included.
pub const INVOCATIONS: &str = "waymark_invocations_total";
/// Counter: the calls ended workflows would have made without any failure (one per step).
pub const IDEAL_INVOCATIONS: &str = "waymark_ideal_invocations_total";
/// Histogram: invocations ÷ ideal, per ended workflow whose every call this worker saw.
pub const RETRY_AMPLIFICATION: &str = "waymark_retry_amplification";
/// Counter, label `effect`: an idempotency key came up again (a retry or a reconciliation).
pub const DUPLICATE_INTENTS: &str = "waymark_duplicate_intents_total";
/// Counter, label `effect`: a key was sent downstream again after an earlier attempt for it
/// had been prepared.
pub const DOWNSTREAM_REPEATS: &str = "waymark_downstream_repeat_calls_total";
/// Gauge: operations whose outcome is unknown now (being reconciled or awaiting an operator).
pub const UNKNOWN_OUTCOME_OPERATIONS: &str = "waymark_operations_unknown_outcome";
/// Counter, label `effect`: operations whose outcome became unknown.
pub const UNKNOWN_OUTCOMES: &str = "waymark_unknown_outcomes_total";
/// Counter: effects refused because the approved artifact is not the executed one.
pub const APPROVAL_HASH_MISMATCHES: &str = "waymark_approval_hash_mismatches_total";
/// Counter, label `activity`: what activities reported their own calls cost
/// (`ActivityContext::record_cost`), in the same millionths as model cost.
pub const TOOL_COST: &str = "waymark_tool_cost_micros_total";
/// Counter, label `activity`: calls of a cached stage (`#[activity(cache)]`) answered with the
/// result of an earlier call with the same input in the same run, without calling it.
pub const STAGE_CACHE_HITS: &str = "waymark_stage_cache_hits_total";
/// Counter, label `operation`: effects refused because their idempotency key was used before
/// with other arguments.
pub const KEY_CONFLICTS: &str = "waymark_effect_key_conflicts_total";
/// Counter, labels `tool`, `reason` (`unknown_tool`, `invalid_arguments`): tool calls a model
/// chose that were refused before anything ran, their error sent back to the model.
pub const AGENT_TOOL_CALLS_REFUSED: &str = "waymark_agent_tool_calls_refused_total";
/// Counter, label `tool`: tool calls an agent ran (approved ones included).
pub const AGENT_TOOL_CALLS: &str = "waymark_agent_tool_calls_total";
/// Counter, label `budget` (`model_calls`, `tool_calls`, `tokens`, `cost_micros`, `wall_time`,
/// `refused_calls`): agent runs ended because a budget was exhausted.
pub const AGENT_BUDGET_EXHAUSTED: &str = "waymark_agent_budget_exhausted_total";
/// Counter: deliberate retrieval refreshes that found other documents than their snapshot.
pub const SNAPSHOT_DRIFT: &str = "waymark_snapshot_drift_total";
/// Counter: streamed response versions superseded by a retry after readers may have seen them.
pub const STREAM_SUPERSEDED: &str = "waymark_stream_superseded_total";
/// Counter: streamed responses whose committed text differs from the chunks readers were
/// shown for that version (checked at the commit).
pub const STREAM_DIVERGENCE: &str = "waymark_stream_divergence_total";
/// Histogram: the depth a repair ladder ended at (0: the first answer passed).
pub const VALIDATOR_DEPTH: &str = "waymark_validator_depth";
/// Counter, labels `model`, `kind` (`prompt`, `completion`), `attempt` (`completed`, `failed`,
/// `timed_out`, `interrupted`) and `priced` (`reported`, `estimated`): tokens of every model
/// attempt, a response journaled or not.
pub const LLM_TOKENS: &str = "waymark_llm_tokens_total";
/// Counter, labels `model`, `attempt`, `priced` (as `LLM_TOKENS`): the cost of every model
/// attempt, in micro-units of the price table. An attempt that journaled no response is priced
/// from what its provider reported, or estimated (`priced="estimated"`).
pub const LLM_COST: &str = "waymark_llm_cost_micros_total";
/// Counter, labels `failed_at` and `stage`: model spend lost to a failure, by where it
/// happened. A failed workflow's whole journaled spend goes to the step it failed at (an
/// activity or effect name with stage `read`/`effect`/`retrieval`, a model call's prompt with
/// `model_call`; `workflow` when its code gave up by itself, `cancelled`); an answer a validator
/// rejected to `validator`; an attempt that journaled no response to its call's prompt (or
/// model) with stage `attempt_failed`, `attempt_timed_out` or `attempt_interrupted`. A failed
/// workflow's figure includes its rejected answers, so the stages overlap and are read one at a
/// time.
pub const LLM_WASTED_COST: &str = "waymark_llm_wasted_cost_micros_total";

/// Counter: passes of the reconciliation sweep over the operations awaiting a decision.
pub const RECONCILIATION_SWEEPS: &str = "waymark_reconciliation_sweeps_total";
/// Counter, label `answer` (`committed`, `not_found`, `cannot_tell`): operations the sweep asked
/// their reconciler about, by its answer. `cannot_tell` includes a reconciler that failed,
/// timed out or panicked, and an effect without one.
pub const SWEPT_OPERATIONS: &str = "waymark_swept_operations_total";

/// Gauge, label `status`: workflows in the store.
pub const WORKFLOWS: &str = "waymark_workflows";
/// Gauge: workflows held in memory.
pub const RESIDENT_WORKFLOWS: &str = "waymark_resident_workflows";
/// Counter, label `wake` (`started`, `recovered`, `event`): executors started, each of which
/// replays the journal (but for a new workflow). `event` counts rebuilds of evicted workflows.
pub const WORKFLOW_LOADS: &str = "waymark_workflow_loads_total";
/// Gauge: workflows this worker found stuck (their code does not match their journal, the
/// worker does not host them, their journal does not add up) and that have not resumed.
pub const WORKFLOWS_STUCK: &str = "waymark_workflows_stuck";
/// Counter: synced store write batches (group commits).
pub const STORE_SYNCED_BATCHES: &str = "waymark_store_synced_batches_total";
/// Counter: workflow transitions written.
pub const STORE_TRANSITIONS: &str = "waymark_store_transitions_total";
/// Counter: commands (decisions, cancellations, resolutions) this worker relayed and the
/// worker that owns their workflow answered.
pub const COMMANDS_RELAYED: &str = "waymark_commands_relayed_total";
/// Counter: runs that let go of their lease to wait for a timer (any worker takes them then).
pub const WORKFLOWS_PARKED: &str = "waymark_workflows_parked_total";
/// Counter: runs stopped because another worker holds their lease now.
pub const RUNS_FENCED: &str = "waymark_runs_fenced_total";
/// Counter: runs let go after a failed write on a shared store, for the next claim.
pub const RUNS_LET_GO: &str = "waymark_runs_let_go_total";
/// Counter: ended workflows deleted, every row of each.
pub const WORKFLOWS_DELETED: &str = "waymark_workflows_deleted_total";
/// Counter: writes of this worker refused by their lease's fence.
pub const FENCED_WRITES: &str = "waymark_fenced_writes_total";
/// Counter: heartbeats that lapsed this worker's registration (found it gone, or this worker
/// could no longer tell which leases it held).
pub const LEASE_LAPSES: &str = "waymark_lease_lapses_total";
/// Counter: leases this worker took of workflows nobody held: their owner lapsed or let them
/// go, or a worker (this one included) parked them.
pub const LEASES_CLAIMED: &str = "waymark_leases_claimed_total";
/// Counter: leases found naming this worker though it did not know it held them (a lease
/// statement of its own took them, and its answer was lost), and taken up.
pub const LEASES_ADOPTED: &str = "waymark_leases_adopted_total";

/// Describes every metric to the current recorder (the `# HELP` lines).
pub(super) fn describe_all() {
    describe_gauge!(WORKFLOWS, "Workflows in the store, by status.");
    describe_gauge!(RESIDENT_WORKFLOWS, "Workflows held in memory.");
    describe_counter!(
        WORKFLOW_LOADS,
        "Executors started (a replay of the journal each), by why."
    );
    describe_gauge!(
        WORKFLOWS_STUCK,
        "Workflows found stuck that have not resumed."
    );
    describe_counter!(
        STORE_SYNCED_BATCHES,
        "Synced store write batches (group commits)."
    );
    describe_counter!(STORE_TRANSITIONS, "Workflow transitions written.");
    describe_counter!(
        COMMANDS_RELAYED,
        "Commands relayed to, and answered by, the worker that owns their workflow."
    );
    describe_counter!(
        WORKFLOWS_PARKED,
        "Runs that let go of their lease to wait for a timer."
    );
    describe_counter!(
        RUNS_FENCED,
        "Runs stopped because another worker holds their lease now."
    );
    describe_counter!(
        RUNS_LET_GO,
        "Runs let go after a failed write, for the next claim."
    );
    describe_counter!(WORKFLOWS_DELETED, "Ended workflows deleted.");
    describe_counter!(
        FENCED_WRITES,
        "Writes of this worker refused by their lease's fence."
    );
    describe_counter!(
        LEASE_LAPSES,
        "Heartbeats that lapsed this worker's registration."
    );
    describe_counter!(
        LEASES_CLAIMED,
        "Leases this worker took of workflows nobody held (lapsed, let go or parked)."
    );
    describe_counter!(
        LEASES_ADOPTED,
        "Leases found naming this worker though it did not know it held them (an answer lost)."
    );
    describe_counter!(
        RESUMES,
        "Recovered workflows by the boundary they resumed from."
    );
    describe_histogram!(
        RECOVERY_LATENCY,
        Unit::Seconds,
        "From worker start or event arrival to the workflow running again."
    );
    describe_counter!(INVOCATIONS, "Calls that left the process, by kind.");
    describe_counter!(
        IDEAL_INVOCATIONS,
        "Calls ended workflows would have made without failures."
    );
    describe_histogram!(
        RETRY_AMPLIFICATION,
        "Invocations per ended workflow divided by its ideal count."
    );
    describe_counter!(
        DUPLICATE_INTENTS,
        "Idempotency keys that came up again (retry or reconciliation)."
    );
    describe_counter!(
        DOWNSTREAM_REPEATS,
        "Effect calls for a key an earlier attempt had been prepared for."
    );
    describe_gauge!(
        UNKNOWN_OUTCOME_OPERATIONS,
        "Operations whose outcome is unknown now."
    );
    describe_counter!(UNKNOWN_OUTCOMES, "Operations whose outcome became unknown.");
    describe_counter!(
        APPROVAL_HASH_MISMATCHES,
        "Effects refused: the approved artifact is not the executed one."
    );
    describe_counter!(
        TOOL_COST,
        "What activities reported their own calls cost (millionths of the price unit)."
    );
    describe_counter!(
        STAGE_CACHE_HITS,
        "Calls of a cached stage answered with an earlier call's result, not called."
    );
    describe_counter!(
        KEY_CONFLICTS,
        "Effects refused: their idempotency key was used before with other arguments."
    );
    describe_counter!(
        AGENT_TOOL_CALLS_REFUSED,
        "Tool calls a model chose that were refused before anything ran."
    );
    describe_counter!(AGENT_TOOL_CALLS, "Tool calls agents ran.");
    describe_counter!(
        AGENT_BUDGET_EXHAUSTED,
        "Agent runs ended because a budget was exhausted."
    );
    describe_counter!(
        SNAPSHOT_DRIFT,
        "Retrieval refreshes that found other documents than their snapshot."
    );
    describe_counter!(
        STREAM_SUPERSEDED,
        "Streamed response versions superseded after readers may have seen them."
    );
    describe_counter!(
        STREAM_DIVERGENCE,
        "Streamed responses whose committed text differs from what readers were shown."
    );
    describe_counter!(
        RECONCILIATION_SWEEPS,
        "Passes of the reconciliation sweep over the operations awaiting a decision."
    );
    describe_counter!(
        SWEPT_OPERATIONS,
        "Operations the sweep asked their reconciler about, by its answer."
    );
    describe_histogram!(VALIDATOR_DEPTH, "Depth a repair ladder ended at.");
    describe_counter!(LLM_TOKENS, "Tokens of model attempts, journaled or not.");
    describe_counter!(
        LLM_COST,
        "Cost of model attempts (micro-units), journaled or not."
    );
    describe_counter!(
        LLM_WASTED_COST,
        "Model spend lost to a failure, by where it happened (micro-units)."
    );
}

/// Registers the unlabeled series at zero.
pub(super) fn register_unlabeled() {
    for name in [
        IDEAL_INVOCATIONS,
        APPROVAL_HASH_MISMATCHES,
        SNAPSHOT_DRIFT,
        STREAM_SUPERSEDED,
        STREAM_DIVERGENCE,
        RECONCILIATION_SWEEPS,
        WORKFLOWS_DELETED,
    ] {
        counter!(name).increment(0);
    }
    gauge!(UNKNOWN_OUTCOME_OPERATIONS).set(0.0);
    gauge!(WORKFLOWS_STUCK).set(0.0);
}
