//! Agents: model-chosen tool calls as journaled steps. The scripted provider plays the model
//! (its tool calls, its re-plans after a crash); the downstream ledger counts what each effect
//! applied; every crash is a real one (the worker dropped and restarted on the same store).

use std::time::Duration;

use serde_json::json;
use waymark::agent::AgentError;
use waymark::approvals::{ApprovalVerdict, Intent, PendingRequest};
use waymark::inspect::Entry;
use waymark::llm::{Role, ScriptedProvider, LLM_ACTIVITY};
use waymark::prelude::*;
use waymark::telemetry::names;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{
    applied_effects, close_gate, count, eventually, executions, open_gate, pass_gate,
    reconcile_by_key, with_id,
};

/// Looks up the rebooking policy that applies to an order.
#[activity]
async fn search_policy(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    count(cx.workflow_id(), "search_policy");
    Ok(format!("{order_id}: rebook late parcels with fastship"))
}

/// Rebooks a delayed order with another carrier.
#[activity(effect, reconcile = find_applied)]
async fn rebook(
    cx: ActivityContext,
    #[key] order_id: String,
    carrier: String,
) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "rebook").await;
    Ok(waymark_tests::apply_under_key(
        &cx,
        &format!("{order_id} with {carrier}"),
    ))
}

/// Tells the warehouse what changed for an order.
#[activity(effect, reconcile = find_notice)]
async fn notify_warehouse(
    cx: ActivityContext,
    #[key] order_id: String,
    message: String,
) -> Result<String, ActivityError> {
    Ok(waymark_tests::apply_under_key(
        &cx,
        &format!("{order_id}: {message}"),
    ))
}

async fn find_applied(
    cx: ActivityContext,
    _order_id: String,
    _carrier: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(reconcile_by_key(&cx))
}

async fn find_notice(
    cx: ActivityContext,
    _order_id: String,
    _message: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(reconcile_by_key(&cx))
}

fn planner() -> Agent {
    Agent::new("planner")
        .system("You rebook delayed orders.")
        .tool(search_policy)
        .tool(rebook)
        .tool(notify_warehouse)
}

#[workflow]
async fn rebook_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let question = Message::user(format!("{order_id} is late"));
    let answer = ctx.agent(&planner(), vec![question]).await?;
    Ok(answer.text)
}

#[workflow]
async fn approved_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = Agent::new("planner")
        .tool(search_policy)
        .tool(rebook)
        .needs_approval();
    let question = Message::user(format!("{order_id} is late"));
    let answer = ctx.agent(&agent, vec![question]).await?;
    Ok(answer.text)
}

#[workflow]
async fn frugal_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = planner().budget(Budget::default().model_calls(2).tool_calls(2));
    let question = Message::user(format!("{order_id} is late"));
    match ctx.agent(&agent, vec![question]).await {
        Ok(answer) => Ok(answer.text),
        Err(AgentError::BudgetExhausted {
            budget,
            limit,
            used,
        }) => Ok(format!("stopped: {budget} {used}/{limit}")),
        Err(other) => Err(other.into()),
    }
}

fn setup(scripted: &ScriptedProvider) -> impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync {
    let scripted = scripted.clone();
    move |b: WorkerBuilder| {
        b.register(rebook_agent)
            .register(approved_agent)
            .register(frugal_agent)
            .register(lenient_agent)
            .register(chatty_agent)
            .register(guarded_reads)
            .register(search_policy)
            .register(rebook)
            .register(notify_warehouse)
            .llm(scripted.clone())
            .llm_options(ActivityOptions::default().initial_backoff(Duration::from_millis(10)))
    }
}

/// A worker playing `scripted`, with `faults` planned, running `workflow` for ORD-1 as `wf`.
async fn started<W>(
    scripted: &ScriptedProvider,
    faults: Vec<PlannedFault>,
    workflow: W,
    wf: &str,
) -> TestEnv
where
    W: Workflow<Input = String>,
{
    let env = TestEnv::with_faults(faults, setup(scripted)).await.unwrap();
    env.worker()
        .start_with(workflow, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    env
}

const SEARCH: (&str, &str) = ("search_policy", r#"{"order_id":"ORD-1"}"#);
const REBOOK: (&str, &str) = ("rebook", r#"{"order_id":"ORD-1","carrier":"fastship"}"#);
const NOTIFY: (&str, &str) = (
    "notify_warehouse",
    r#"{"order_id":"ORD-1","message":"now with fastship"}"#,
);
const FINAL: &str = "ORD-1 is rebooked with fastship; the warehouse knows.";

/// The model's plan: look the policy up, then rebook and notify in one answer, then explain.
fn plan() -> ScriptedProvider {
    ScriptedProvider::default()
        .tool_calls(&[SEARCH])
        .tool_calls(&[REBOOK, NOTIFY])
        .reply(FINAL)
}

/// The commands of [`plan`]: each model call follows the transcript part it references.
/// Seqs: toolset 0, part 1, answer 2, search 3, part 4, answer 5, rebook 6, notify 7, part 8,
/// answer 9.
const PLAN_SECOND_ANSWER: u32 = 5;
const PLAN_THIRD_ANSWER: u32 = 9;

fn key(wf: &str, effect: &str) -> String {
    format!(r#"{wf}|{effect}|["ORD-1"]|v1"#)
}

async fn run_to_end(env: &mut TestEnv, wf: &str) -> Result<String, RunError> {
    let outcome = env.finish(rebook_agent, wf, 20).await;
    outcome.unwrap_or_else(|| panic!("{wf} did not finish"))
}

fn model_answers(env: &TestEnv, wf: &str) -> usize {
    let journal = env.worker().journal(wf).unwrap();
    let llm_seqs: Vec<u32> = journal
        .iter()
        .filter_map(|e| e.command())
        .filter(|(_, identity)| identity.name == LLM_ACTIVITY)
        .map(|(seq, _)| seq)
        .collect();
    let answered = journal
        .iter()
        .filter(|e| matches!(e, Entry::ActivityCompletedAt { seq, .. } if llm_seqs.contains(seq)));
    answered.count()
}

#[tokio::test]
async fn an_agent_runs_the_tools_its_model_chose_and_answers() {
    let scripted = plan();
    let wf = "agent-plain";
    let mut env = started(&scripted, vec![], rebook_agent, wf).await;
    assert_eq!(run_to_end(&mut env, wf).await.unwrap(), FINAL);
    assert_eq!(applied_effects(&key(wf, "rebook")), ["ORD-1 with fastship"]);
    assert_eq!(
        applied_effects(&key(wf, "notify_warehouse")),
        ["ORD-1: now with fastship"]
    );
    // The second model call saw its tool call and the result under the call's id.
    let second = &scripted.requests()[1];
    let roles: Vec<Role> = second.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::Tool]
    );
    assert_eq!(second.messages[2].tool_calls[0].id, "call-1-1");
    assert_eq!(second.messages[3].tool_call_id.as_deref(), Some("call-1-1"));
    assert_eq!(
        second.messages[3].content,
        r#""ORD-1: rebook late parcels with fastship""#
    );
    // Parallel calls go back in the model's call order.
    let third = &scripted.requests()[2];
    let results: Vec<_> = third.messages[5..]
        .iter()
        .map(|m| m.tool_call_id.clone().unwrap_or_default())
        .collect();
    assert_eq!(results, ["call-2-1", "call-2-2"]);
    // Tools are offered with their doc comments and a schema of their parameters.
    let offered = &scripted.requests()[0].tools;
    assert_eq!(offered[1].name, "rebook");
    assert_eq!(
        offered[1].description,
        "Rebooks a delayed order with another carrier."
    );
    assert_eq!(
        offered[1].parameters["required"],
        json!(["order_id", "carrier"])
    );
    assert_eq!(
        offered[1].parameters["properties"]["carrier"]["type"],
        "string"
    );
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

/// Where a crash strikes in the turns of [`plan`], and whether the model is asked again (a
/// crash after it answered, before the answer was journaled, loses the answer).
struct CrashPoint {
    name: &'static str,
    fault: PlannedFault,
    asks_again: bool,
}

fn crash_points() -> Vec<CrashPoint> {
    let at = |activity: &str, boundary| PlannedFault::at(activity, 1, boundary, Fault::Crash);
    vec![
        CrashPoint {
            name: "the model answered with tool calls, not journaled",
            fault: at(LLM_ACTIVITY, Boundary::AfterCall).on_seq(PLAN_SECOND_ANSWER),
            asks_again: true,
        },
        CrashPoint {
            name: "the read tool ran, not journaled",
            fault: at("search_policy", Boundary::AfterCall),
            asks_again: false,
        },
        CrashPoint {
            name: "tool 1 of 2 applied downstream, not journaled",
            fault: at("rebook", Boundary::AfterCall),
            asks_again: false,
        },
        CrashPoint {
            name: "tool 2 of 2 prepared, not called",
            fault: at("notify_warehouse", Boundary::BeforeCall),
            asks_again: false,
        },
        CrashPoint {
            name: "tool 2 of 2 applied downstream, not journaled",
            fault: at("notify_warehouse", Boundary::AfterCall),
            asks_again: false,
        },
        CrashPoint {
            name: "the tool results journaled, the next model call not started",
            fault: at(LLM_ACTIVITY, Boundary::BeforePrepared).on_seq(PLAN_THIRD_ANSWER),
            asks_again: false,
        },
    ]
}

#[tokio::test]
async fn a_crash_at_every_boundary_of_a_turn_applies_each_effect_once() {
    for (case, point) in crash_points().into_iter().enumerate() {
        let scripted = match point.asks_again {
            // The lost answer is asked again: the model answers the same way.
            true => ScriptedProvider::default()
                .tool_calls(&[SEARCH])
                .tool_calls(&[REBOOK, NOTIFY])
                .tool_calls(&[REBOOK, NOTIFY])
                .reply(FINAL),
            false => plan(),
        };
        let wf = format!("agent-crash-{case}");
        let mut env = started(&scripted, vec![point.fault], rebook_agent, &wf).await;
        let outcome = run_to_end(&mut env, &wf).await;
        let name = point.name;
        assert_eq!(outcome.unwrap(), FINAL, "{name}");
        assert_eq!(env.faults().fired().len(), 1, "{name}: the crash fired");
        assert_eq!(
            applied_effects(&key(&wf, "rebook")).len(),
            1,
            "{name}: rebook"
        );
        assert_eq!(
            applied_effects(&key(&wf, "notify_warehouse")).len(),
            1,
            "{name}: notify"
        );
        assert_eq!(model_answers(&env, &wf), 3, "{name}: answers recorded once");
        let asked = 3 + u32::from(point.asks_again);
        assert_eq!(scripted.calls(), asked, "{name}: model calls");
    }
}

#[tokio::test]
async fn a_model_that_replans_the_same_intent_after_a_crash_reaches_the_downstream_once() {
    // The first plan rebooks and the answer after it is lost in a crash; asked again, the
    // model re-plans: the same intent (same order, same carrier) with a new call id.
    let scripted = ScriptedProvider::default()
        .tool_calls(&[REBOOK])
        .tool_calls(&[NOTIFY])
        .tool_calls(&[REBOOK, NOTIFY])
        .reply(FINAL);
    // Seqs: toolset 0, transcript part 1, answer 2, rebook 3, part 4, answer 5.
    let crash = PlannedFault::at(LLM_ACTIVITY, 1, Boundary::AfterCall, Fault::Crash).on_seq(5);
    let wf = "agent-replan";
    let mut env = started(&scripted, vec![crash], rebook_agent, wf).await;
    assert_eq!(run_to_end(&mut env, wf).await.unwrap(), FINAL);
    assert_eq!(applied_effects(&key(wf, "rebook")), ["ORD-1 with fastship"]);
    assert_eq!(applied_effects(&key(wf, "notify_warehouse")).len(), 1);
    // The repeated intent was answered from the operation log: nothing went downstream again.
    let metrics = env.metrics();
    let repeats = metrics.value(names::DOWNSTREAM_REPEATS, &[("effect", "rebook")]);
    assert_eq!(repeats, 0.0);
    let last = scripted.requests().pop().unwrap();
    let rebook_results: Vec<&str> = last
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(rebook_results, [r#""ref-1""#, r#""ref-1""#, r#""ref-1""#]);
}

#[tokio::test]
async fn a_different_intent_after_a_replan_runs_under_its_own_key() {
    let other_order = ("rebook", r#"{"order_id":"ORD-2","carrier":"fastship"}"#);
    let scripted = ScriptedProvider::default()
        .tool_calls(&[REBOOK])
        .tool_calls(&[other_order])
        .reply(FINAL);
    let wf = "agent-other-intent";
    let mut env = started(&scripted, vec![], rebook_agent, wf).await;
    assert_eq!(run_to_end(&mut env, wf).await.unwrap(), FINAL);
    assert_eq!(applied_effects(&key(wf, "rebook")).len(), 1);
    let second_key = format!(r#"{wf}|rebook|["ORD-2"]|v1"#);
    assert_eq!(applied_effects(&second_key), ["ORD-2 with fastship"]);
    let duplicates = env
        .metrics()
        .value(names::DUPLICATE_INTENTS, &[("effect", "rebook")]);
    assert_eq!(duplicates, 0.0);
}

#[tokio::test]
async fn calls_to_unknown_tools_or_with_bad_arguments_never_run_and_the_model_is_told() {
    let scripted = ScriptedProvider::default()
        .tool_calls(&[
            ("cancel_order", r#"{"order_id":"ORD-1"}"#),
            ("rebook", r#"{"order_id":"ORD-1"}"#),
            ("rebook", r#"{"order_id":"ORD-1","carrier":7}"#),
            (
                "rebook",
                r#"{"order_id":"ORD-1","carrier":"fastship","force":true}"#,
            ),
            ("rebook", r#"["ORD-1","fastship"]"#),
            ("search_policy", "{not json"),
        ])
        .reply("I could not act.");
    let wf = "agent-refusals";
    let mut env = started(&scripted, vec![], lenient_agent, wf).await;
    let outcome = env.finish(lenient_agent, wf, 20).await.unwrap();
    assert_eq!(outcome.unwrap(), "I could not act.");
    assert!(applied_effects(&key(wf, "rebook")).is_empty());
    assert_eq!(executions(wf, "search_policy"), 0);
    let told: Vec<String> = scripted.requests()[1]
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.clone())
        .collect();
    insta::assert_yaml_snapshot!(told);
    let refused = |env: &TestEnv, tool, reason| {
        let labels = [("tool", tool), ("reason", reason)];
        env.metrics()
            .value(names::AGENT_TOOL_CALLS_REFUSED, &labels)
    };
    assert_eq!(refused(&env, "cancel_order", "unknown_tool"), 1.0);
    assert_eq!(refused(&env, "rebook", "invalid_arguments"), 4.0);
    // Replayed after a restart, the refusals are not counted again.
    env.crash_and_restart().await.unwrap();
    let handle = env.worker().handle(lenient_agent, wf);
    assert_eq!(handle.result().await.unwrap(), "I could not act.");
    assert_eq!(refused(&env, "rebook", "invalid_arguments"), 4.0);
}

/// An agent that tolerates the six refusals of one answer (the default tolerates three).
#[workflow]
async fn lenient_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = planner().budget(Budget::default().refused_calls(6));
    let answer = ctx
        .agent(&agent, vec![Message::user(format!("{order_id} is late"))])
        .await?;
    Ok(answer.text)
}

#[tokio::test]
async fn budgets_hold_across_a_restart() {
    // Three answers with a tool call each; the budget allows two model calls.
    let scripted = ScriptedProvider::default()
        .tool_calls(&[SEARCH])
        .tool_calls(&[SEARCH])
        .tool_calls(&[SEARCH])
        .reply(FINAL);
    // Seqs: toolset 0, transcript part 1, answer 2, search 3, part 4, answer 5, search 6.
    let crash = PlannedFault::at("search_policy", 1, Boundary::AfterCall, Fault::Crash).on_seq(6);
    let wf = "agent-budget";
    let mut env = started(&scripted, vec![crash], frugal_agent, wf).await;
    let outcome = env.finish(frugal_agent, wf, 20).await.unwrap();
    assert_eq!(env.faults().fired().len(), 1, "the crash fired");
    assert_eq!(outcome.unwrap(), "stopped: model_calls 2/2");
    assert_eq!(scripted.calls(), 2);
    let exhausted = env
        .metrics()
        .value(names::AGENT_BUDGET_EXHAUSTED, &[("budget", "model_calls")]);
    assert_eq!(exhausted, 1.0);
}

#[tokio::test]
async fn a_batch_of_tool_calls_over_the_budget_runs_none_of_them() {
    let scripted = ScriptedProvider::default()
        .tool_calls(&[SEARCH, REBOOK, NOTIFY])
        .reply(FINAL);
    let wf = "agent-tool-budget";
    let mut env = started(&scripted, vec![], frugal_agent, wf).await;
    let outcome = env.finish(frugal_agent, wf, 20).await.unwrap();
    assert_eq!(outcome.unwrap(), "stopped: tool_calls 3/2");
    assert_eq!(executions(wf, "search_policy"), 0);
    assert!(applied_effects(&key(wf, "rebook")).is_empty());
}

/// The approval requests of `wf` once `n` have been made and one is pending.
async fn pending_request(env: &TestEnv, wf: &str, n: usize) -> PendingRequest {
    let asked = || {
        let journal = env.worker().journal(wf).unwrap_or_default();
        let made = journal
            .iter()
            .filter(|e| matches!(e, Entry::ApprovalRequestedAt { .. }))
            .count();
        made == n && !env.worker().pending_approvals(wf).unwrap().is_empty()
    };
    assert!(eventually(400, asked).await, "approval request {n}");
    env.worker().pending_approvals(wf).unwrap().remove(0)
}

#[tokio::test]
async fn an_approval_covers_the_exact_arguments_and_a_replan_asks_again() {
    let slowship = ("rebook", r#"{"order_id":"ORD-1","carrier":"slowship"}"#);
    let scripted = ScriptedProvider::default()
        .tool_calls(&[REBOOK])
        .tool_calls(&[slowship])
        .tool_calls(&[REBOOK])
        .reply(FINAL);
    let wf = "agent-approval";
    let mut env = started(&scripted, vec![], approved_agent, wf).await;

    // The approver sees the exact call: tool, arguments, key.
    let first = pending_request(&env, wf, 1).await;
    assert_eq!(first.risk["tool"], "rebook");
    assert_eq!(
        first.risk["arguments"],
        json!({"order_id": "ORD-1", "carrier": "fastship"})
    );
    assert_eq!(first.risk["idempotency_key"], key(wf, "rebook"));
    let scope = first.scope.clone().expect("a scope");
    let shown = env.worker().artifact(&scope.artifact).unwrap().unwrap();
    assert_eq!(shown.kind, "tool_call");
    // The scope authorises the intent the runtime computes from the call's typed input.
    let rebooking = Intent {
        operation: "rebook".into(),
        version: 1,
        idempotency_key: key(wf, "rebook"),
        arguments: json!(["ORD-1", "fastship"]),
    };
    assert_eq!(scope.intents.len(), 1);
    assert_eq!(scope.intents[0].digest, rebooking.digest().hex());
    // Nothing ran before the decision, and waiting survives a restart.
    assert!(applied_effects(&key(wf, "rebook")).is_empty());
    env.crash_and_restart().await.unwrap();
    let decide = |hash: String, verdict| {
        let worker = env.worker();
        async move { worker.decide_approval(wf, &hash, "dana@ops", verdict).await }
    };
    decide(first.artifact_hash.clone(), ApprovalVerdict::Approve)
        .await
        .unwrap();

    // The model re-plans with other arguments: a new request, for another intent.
    let second = pending_request(&env, wf, 2).await;
    assert_ne!(second.artifact_hash, first.artifact_hash);
    assert_eq!(
        second.risk["arguments"],
        json!({"order_id": "ORD-1", "carrier": "slowship"})
    );
    let reject = ApprovalVerdict::Reject("slowship misses the delivery date".into());
    decide(second.artifact_hash.clone(), reject).await.unwrap();

    // The approved intent again: answered from the operation log, not put to a person again.
    let outcome = env.finish(approved_agent, wf, 20).await.unwrap();
    assert_eq!(outcome.unwrap(), FINAL);
    assert_eq!(applied_effects(&key(wf, "rebook")), ["ORD-1 with fastship"]);
    let requests = scripted.requests();
    let told = &requests[2].messages.last().unwrap().content;
    assert_eq!(
        told,
        "not run: dana@ops rejected this call: slowship misses the delivery date"
    );
    let repeated = &requests[3].messages.last().unwrap().content;
    assert_eq!(repeated, r#""ref-1""#);
    let record = env.worker().operation(&key(wf, "rebook")).unwrap().unwrap();
    let grant = record.approval.expect("the grant is on record");
    assert_eq!(grant.granted.scope.hex(), first.artifact_hash);
    assert_eq!(grant.intent, rebooking.digest());
    assert_eq!(grant.granted.approver, "dana@ops");
}

/// An agent allowed many turns.
#[workflow]
async fn chatty_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = planner().budget(Budget::default().model_calls(100));
    let answer = ctx
        .agent(&agent, vec![Message::user(format!("{order_id} is late"))])
        .await?;
    Ok(answer.text)
}

/// The journal's bytes after an agent of `turns` turns, each a policy search for another
/// order, and the journal rendered.
async fn journal_after(turns: usize) -> (usize, String) {
    let arguments: Vec<String> = (0..turns)
        .map(|turn| format!(r#"{{"order_id":"ORD-{turn:03}"}}"#))
        .collect();
    let scripted = arguments
        .iter()
        .fold(ScriptedProvider::default(), |script, arguments| {
            script.tool_calls(&[("search_policy", arguments)])
        })
        .reply(FINAL);
    let wf = format!("agent-turns-{turns}");
    let mut env = started(&scripted, vec![], chatty_agent, &wf).await;
    let outcome = env.finish(chatty_agent, &wf, 20).await;
    assert_eq!(outcome.unwrap().unwrap(), FINAL);
    let journal = env.worker().journal(&wf).unwrap();
    let bytes = waymark::inspect::write_framed(&journal).len();
    (bytes, env.worker().render_journal(&wf).unwrap())
}

#[tokio::test]
async fn a_long_conversation_is_journaled_once_not_once_per_turn() {
    let (short, _) = journal_after(10).await;
    let (long, rendered) = journal_after(40).await;
    // Four times the turns: about four times the journal. Re-journaling the conversation at
    // every turn would make it grow with the square of the turns (about 10 times here).
    let growth = long as f64 / short as f64;
    assert!(
        growth < 5.0,
        "10 turns: {short} bytes, 40 turns: {long} bytes"
    );
    // Each tool result is in the journal once: as its step's outcome, never inside a request.
    for turn in [0, 17, 39] {
        let result = format!("ORD-{turn:03}: rebook late parcels");
        assert_eq!(rendered.matches(&result).count(), 1, "{result}");
    }
}

#[tokio::test]
async fn parallel_calls_that_finish_out_of_order_replay_in_call_order_after_a_crash() {
    let scripted = plan();
    let wf = "agent-parallel-crash";
    // The rebooking waits while the notice finishes; then the worker dies after the carrier
    // booked, before the booking is journaled.
    close_gate(wf, "rebook");
    let crash = PlannedFault::at("rebook", 1, Boundary::AfterCall, Fault::Crash);
    let mut env = started(&scripted, vec![crash], rebook_agent, wf).await;
    let notified = || {
        let journal = env.worker().journal(wf).unwrap_or_default();
        journal
            .iter()
            .any(|e| matches!(e, Entry::ActivityCompletedAt { seq: 7, .. }))
    };
    assert!(
        eventually(400, notified).await,
        "the notice completed first"
    );
    open_gate(wf, "rebook");
    assert_eq!(run_to_end(&mut env, wf).await.unwrap(), FINAL);
    assert_eq!(env.faults().fired().len(), 1, "the crash fired");

    // The journal holds the completions as they came: the notice (seq 7) first.
    let journal = env.worker().journal(wf).unwrap();
    let settled: Vec<u32> = journal
        .iter()
        .filter_map(|e| match e {
            Entry::ActivityCompletedAt { seq, .. } | Entry::EffectReconciled { seq, .. }
                if [6, 7].contains(seq) =>
            {
                Some(*seq)
            }
            _ => None,
        })
        .collect();
    assert_eq!(settled, [7, 6]);
    // The model was sent the results in its own call order, before and after the crash.
    let last = scripted.requests().pop().unwrap();
    let order: Vec<_> = last.messages[5..]
        .iter()
        .map(|m| m.tool_call_id.clone().unwrap_or_default())
        .collect();
    assert_eq!(order, ["call-2-1", "call-2-2"]);
    assert_eq!(applied_effects(&key(wf, "rebook")).len(), 1);
    assert_eq!(applied_effects(&key(wf, "notify_warehouse")).len(), 1);
}

/// An agent whose read needs a person's approval at every call.
#[workflow]
async fn guarded_reads(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = Agent::new("planner").tool(search_policy).needs_approval();
    let answer = ctx
        .agent(&agent, vec![Message::user(format!("{order_id} is late"))])
        .await?;
    Ok(answer.text)
}

#[tokio::test]
async fn a_read_that_needs_approval_is_put_to_a_person_at_every_call() {
    let scripted = ScriptedProvider::default()
        .tool_calls(&[SEARCH])
        .tool_calls(&[SEARCH])
        .reply(FINAL);
    let wf = "agent-guarded-reads";
    let env = started(&scripted, vec![], guarded_reads, wf).await;
    for asked in 1..=2 {
        let request = pending_request(&env, wf, asked).await;
        let approve = ApprovalVerdict::Approve;
        let worker = env.worker();
        worker
            .decide_approval(wf, &request.artifact_hash, "dana@ops", approve)
            .await
            .unwrap();
    }
    let run = env.worker().handle(guarded_reads, wf);
    assert_eq!(run.result().await.unwrap(), FINAL);
    // The same read twice: it ran twice, so it was approved twice.
    assert_eq!(executions(wf, "search_policy"), 2);
}
