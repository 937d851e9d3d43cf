//! Approvals bound to what executes: an approval's scope names the artifact shown, the intents
//! it authorises and the evidence it rests on; an effect runs under it only when the intent the
//! runtime computes from the call is one the scope lists, unused and unexpired. A decision for
//! another scope is refused; a changed plan or new evidence is asked for again; an expired
//! approval resolves as expired.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use waymark::telemetry::names;

use serde::{Deserialize, Serialize};
use serde_json::json;
use waymark::approvals::{
    Approval, ApprovalOutcome, ApprovalScope, ApprovalVerdict, Artifact, ArtifactMeta, Intent,
};
use waymark::operations::OperationStatus;
use waymark::prelude::*;
use waymark::snapshots::{Retrieval, RetrievedDocument};
use waymark::testing::TestEnv;
use waymark::ApprovalError;
use waymark::WorkerBuilder;
use waymark_tests::{applied_effects, eventually, with_id};

/// The plan a person approves, built from the order's current state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Plan {
    order_id: String,
    carrier: String,
}

/// The fake order system: the carrier each order would be rebooked with. A test changes it to
/// make the plan change between approval and execution.
fn carriers() -> &'static Mutex<HashMap<String, String>> {
    static CARRIERS: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    CARRIERS.get_or_init(Default::default)
}

fn set_carrier(order_id: &str, carrier: &str) {
    let mut carriers = carriers().lock().unwrap();
    carriers.insert(order_id.to_owned(), carrier.to_owned());
}

#[activity]
async fn best_carrier(order_id: String) -> Result<String, ActivityError> {
    let carriers = carriers().lock().unwrap();
    let carrier = carriers.get(&order_id).cloned();
    carrier.ok_or_else(|| ActivityError::terminal(format!("no order {order_id}")))
}

#[activity(effect)]
async fn rebook(
    cx: ActivityContext,
    #[key] order_id: String,
    carrier: String,
) -> Result<String, ActivityError> {
    let what = format!("{order_id} with {carrier}");
    Ok(waymark_tests::apply_under_key(&cx, &what))
}

async fn plan_for(ctx: &WorkflowContext, order_id: &str) -> Result<Plan, WorkflowError> {
    let carrier = ctx.activity(best_carrier, order_id.to_owned()).await?;
    let order_id = order_id.to_owned();
    Ok(Plan { order_id, carrier })
}

/// Plans, asks for approval, re-reads the world right before acting, and runs the effect under
/// the approval of the plan it actually executes: a plan that changed meanwhile is refused and
/// approved again.
#[workflow]
async fn approved_rebooking(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let meta = || {
        ArtifactMeta::new("plan")
            .version("v1")
            .with("policy", "rebook-2026-10")
    };
    for _ in 0..3 {
        let plan = ctx.artifact_with(plan_for(&ctx, &order_id).await?, meta())?;
        let approved = plan.value().clone();
        let rebooking = ctx.intent(rebook, (approved.order_id, approved.carrier))?;
        let request = ctx
            .approval(&plan)
            .authorises(&rebooking)
            .risk(json!({"level": "high"}));
        let approval = match request.expires_in(Duration::from_secs(3600)).await {
            ApprovalOutcome::Approved(approval) => approval,
            ApprovalOutcome::Rejected { reason, .. } => return Err(WorkflowError::new(reason)),
            ApprovalOutcome::Expired => return Err(WorkflowError::new("approval expired")),
        };
        // What would execute now, read again right before acting.
        let Plan { order_id, carrier } = plan_for(&ctx, &order_id).await?;
        let call = ctx.effect(rebook, (order_id, carrier)).under(&approval);
        match call.await {
            Err(ActivityError::NotApproved { .. }) => continue,
            outcome => return Ok(outcome?),
        }
    }
    Err(WorkflowError::new("the plan kept changing"))
}

/// A risk whose keys are not strings cannot be JSON: the request must not go out without it.
#[workflow]
async fn risk_that_does_not_serialize(
    ctx: WorkflowContext,
    _input: (),
) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(json!({"carrier": "fastship"}))?;
    let risk = std::collections::BTreeMap::from([((1, 2), "level")]);
    let outcome = ctx.approval(&plan).risk(risk).await;
    Ok(format!(
        "{}",
        matches!(outcome, ApprovalOutcome::Approved(_))
    ))
}

/// The approval of `plan` for `intent`: the workflow fails unless it is approved.
async fn approval_of<T>(
    ctx: &WorkflowContext,
    plan: &Artifact<T>,
    intent: &Intent,
) -> Result<Approval, WorkflowError> {
    match ctx.approval(plan).authorises(intent).await {
        ApprovalOutcome::Approved(approval) => Ok(approval),
        _ => Err(WorkflowError::new("not approved")),
    }
}

/// Tries to run two rebookings, of two orders, under one approval that authorises the first.
#[workflow]
async fn one_approval_two_effects(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(plan_for(&ctx, &order_id).await?)?;
    let Plan { order_id, carrier } = plan.value().clone();
    let rebooking = ctx.intent(rebook, (order_id.clone(), carrier.clone()))?;
    let approval = approval_of(&ctx, &plan, &rebooking).await?;
    let first = ctx.effect(rebook, (order_id.clone(), carrier.clone()));
    let first = first.under(&approval).await?;
    let second = ctx.effect(rebook, (format!("{order_id}-B"), carrier));
    match second.under(&approval).await {
        Err(ActivityError::NotApproved { message }) => Ok(format!("{first}; refused: {message}")),
        other => Ok(format!("{first}; then {other:?}")),
    }
}

/// Tries the one intent an approval authorises twice: the first command is refused by its own
/// precondition before the call, the second is another command of the same intent.
#[workflow]
async fn one_intent_two_commands(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(plan_for(&ctx, &order_id).await?)?;
    let Plan { order_id, carrier } = plan.value().clone();
    let input = (order_id, carrier);
    let rebooking = ctx.intent(rebook, input.clone())?;
    let approval = approval_of(&ctx, &plan, &rebooking).await?;
    let not_yet = || futures::future::ready(false);
    let first = ctx.effect(rebook, input.clone()).under(&approval);
    let first = first.precondition("the warehouse is open", not_yet).await;
    let second = ctx.effect(rebook, input).under(&approval).await;
    Ok(format!("{first:?}; then {second:?}"))
}

/// Issues one intent three times in one poll: first under an approval that authorises another
/// intent (refused before any call), then twice on its own.
#[workflow]
async fn refused_then_issued_twice(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(plan_for(&ctx, &order_id).await?)?;
    let Plan { order_id, carrier } = plan.value().clone();
    let other = ctx.intent(rebook, (format!("{order_id}-B"), carrier.clone()))?;
    let approval = approval_of(&ctx, &plan, &other).await?;
    let input = (order_id, carrier);
    let refused = ctx.effect(rebook, input.clone()).under(&approval);
    let second = ctx.effect(rebook, input.clone());
    let third = ctx.effect(rebook, input);
    let (refused, second, third) = futures::join!(refused, second, third);
    Ok(format!("{refused:?}; {second:?}; {third:?}"))
}

/// The policy version the retriever reads; a test changes it while a request waits.
static POLICY: Mutex<&str> = Mutex::new("policy-v1");

#[activity]
async fn search_policy(order_id: String) -> Result<Retrieval, ActivityError> {
    let version = *POLICY.lock().unwrap();
    let document = RetrievedDocument {
        id: "rebooking".into(),
        version: version.into(),
        score: 0.9,
        text: format!("{version}: delays over 48 h may be rebooked."),
    };
    Ok(Retrieval {
        query: order_id,
        rewritten_query: None,
        documents: vec![document],
        index_version: version.into(),
    })
}

/// The same plan, approved on the evidence it rests on: a request nobody decides within the
/// hour is asked again on the policy as it is then.
#[workflow]
async fn evidence_bound_rebooking(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let plan = Plan {
        order_id: order_id.clone(),
        carrier: "fastship".into(),
    };
    let rebooking = ctx.intent(rebook, (plan.order_id.clone(), plan.carrier.clone()))?;
    let plan = ctx.artifact_with(plan, ArtifactMeta::new("plan"))?;
    for _ in 0..3 {
        let policy = ctx.retrieve(search_policy, order_id.clone()).await?;
        let request = ctx
            .approval(&plan)
            .evidence(&policy)
            .authorises(&rebooking)
            .expires_in(Duration::from_secs(3600));
        if let ApprovalOutcome::Approved(approval) = request.await {
            let input = (order_id.clone(), "fastship".to_owned());
            return Ok(ctx.effect(rebook, input).under(&approval).await?);
        }
    }
    Err(WorkflowError::new("nobody decided"))
}

/// Parcel options as the carrier takes them: a map, so their order in a text means nothing.
#[activity(effect)]
async fn ship_with_options(
    cx: ActivityContext,
    #[key] order_id: String,
    options: std::collections::BTreeMap<String, f64>,
) -> Result<String, ActivityError> {
    let what = format!("{order_id} with {options:?}");
    Ok(waymark_tests::apply_under_key(&cx, &what))
}

/// Approves options built in code, then executes options parsed from `text` (as a model or a
/// form would send them).
#[workflow]
async fn options_from_text(ctx: WorkflowContext, text: String) -> Result<String, WorkflowError> {
    let approved = std::collections::BTreeMap::from([
        ("insurance_eur".to_owned(), 200.0),
        ("weight_kg".to_owned(), 2.0),
    ]);
    let order_id = "ORD-70".to_owned();
    let shipping = ctx.intent(ship_with_options, (order_id.clone(), approved.clone()))?;
    let plan = ctx.artifact(&approved)?;
    let approval = approval_of(&ctx, &plan, &shipping).await?;
    let executed = serde_json::from_str(&text).map_err(|e| WorkflowError::new(e.to_string()))?;
    let call = ctx.effect(ship_with_options, (order_id, executed));
    match call.under(&approval).await {
        Err(ActivityError::NotApproved { .. }) => Ok("refused".to_owned()),
        outcome => Ok(outcome?),
    }
}

/// Issues the effect, then waits for the approval, then puts the effect under it: too late,
/// the effect was journaled and started when the workflow first waited.
#[workflow]
async fn under_too_late(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(plan_for(&ctx, &order_id).await?)?;
    let Plan { order_id, carrier } = plan.value().clone();
    let rebooking = ctx.intent(rebook, (order_id.clone(), carrier.clone()))?;
    let call = ctx.effect(rebook, (order_id, carrier));
    let approval = approval_of(&ctx, &plan, &rebooking).await?;
    Ok(call.under(&approval).await?)
}

async fn env() -> TestEnv {
    let setup = |b: WorkerBuilder| {
        b.register(approved_rebooking)
            .register(risk_that_does_not_serialize)
            .register(approval_or_withdrawal)
            .register(asked_and_withdrawn_at_once)
            .register(one_approval_two_effects)
            .register(one_intent_two_commands)
            .register(refused_then_issued_twice)
            .register(under_too_late)
            .register(evidence_bound_rebooking)
            .register(options_from_text)
            .register(search_policy)
            .register(ship_with_options)
            .register(best_carrier)
            .register(rebook)
    };
    TestEnv::start(setup).await.unwrap()
}

/// Waits for the workflow to ask, and returns the hash it asks about.
async fn pending_hash(env: &TestEnv, wf: &str, requests: usize) -> String {
    let asked = || {
        let journal = env.worker().journal(wf).unwrap_or_default();
        let requested = journal
            .iter()
            .filter(|e| matches!(e, waymark::inspect::Entry::ApprovalRequestedAt { .. }));
        requested.count() == requests && !env.worker().pending_approvals(wf).unwrap().is_empty()
    };
    assert!(eventually(400, asked).await, "approval request {requests}");
    let pending = env.worker().pending_approvals(wf).unwrap();
    pending[0].artifact_hash.clone()
}

/// Approves `hash` in `wf` as dana@ops.
async fn approve(env: &TestEnv, wf: &str, hash: &str) -> Result<(), ApprovalError> {
    let verdict = ApprovalVerdict::Approve;
    env.worker()
        .decide_approval(wf, hash, "dana@ops", verdict)
        .await
}

/// Starts `workflow` as `wf`, approves its first request as dana@ops, and returns its result
/// and the approved hash.
async fn approved_run<W>(
    env: &TestEnv,
    workflow: W,
    input: W::Input,
    wf: &str,
) -> (W::Output, String)
where
    W: waymark::Workflow,
{
    env.worker()
        .start_with(workflow.clone(), input, with_id(wf))
        .await
        .unwrap();
    let hash = pending_hash(env, wf, 1).await;
    approve(env, wf, &hash).await.unwrap();
    let result = env.worker().handle(workflow, wf).result().await.unwrap();
    (result, hash)
}

fn rebook_key(wf: &str, order_id: &str) -> String {
    format!(r#"{wf}|rebook|["{order_id}"]|v1"#)
}

/// The intent of rebooking `order_id` with `carrier`, computed here from its definition: the
/// runtime must compute the same one from the call.
fn rebook_intent(wf: &str, order_id: &str, carrier: &str) -> Intent {
    Intent {
        operation: "rebook".into(),
        version: 1,
        idempotency_key: rebook_key(wf, order_id),
        arguments: json!([order_id, carrier]),
    }
}

/// The scope of the oldest pending request.
fn pending_scope(env: &TestEnv, wf: &str) -> ApprovalScope {
    let pending = env.worker().pending_approvals(wf).unwrap();
    pending[0]
        .scope
        .clone()
        .expect("the request asks about a scope")
}

#[tokio::test]
async fn an_approved_plan_executes_once_with_the_approved_hash_on_record() {
    let mut env = env().await;
    let wf = "approval-granted";
    set_carrier("ORD-40", "fastship");
    env.worker()
        .start_with(approved_rebooking, "ORD-40".into(), with_id(wf))
        .await
        .unwrap();
    let hash = pending_hash(&env, wf, 1).await;
    let scope = pending_scope(&env, wf);
    let rebooking = rebook_intent(wf, "ORD-40", "fastship");
    assert_eq!(scope.intents.len(), 1);
    assert_eq!(scope.intents[0].intent, rebooking);
    assert_eq!(scope.intents[0].digest, rebooking.digest().hex());
    let plan = env
        .worker()
        .artifact(&scope.artifact)
        .unwrap()
        .expect("the plan is stored");
    assert_eq!(plan.kind, "plan");
    assert_eq!(
        plan.metadata,
        [("policy".to_owned(), "rebook-2026-10".to_owned())]
    );
    let stored_scope = env.worker().artifact(&hash).unwrap().unwrap();
    assert_eq!(stored_scope.kind, "approval_scope");
    // Waiting for a person holds no memory, and survives a restart.
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    env.crash_and_restart().await.unwrap();
    let request = env.worker().pending_approvals(wf).unwrap()[0].request;
    let stale = env
        .worker()
        .decide_approval_request(wf, request + 7, &hash, "dana@ops", ApprovalVerdict::Approve)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, ApprovalError::StaleRequest { .. }),
        "{stale}"
    );
    env.worker()
        .decide_approval_request(wf, request, &hash, "dana@ops", ApprovalVerdict::Approve)
        .await
        .unwrap();
    let run = env.worker().handle(approved_rebooking, wf);
    assert_eq!(run.result().await.unwrap(), "ref-1");

    let key = rebook_key(wf, "ORD-40");
    assert_eq!(applied_effects(&key), ["ORD-40 with fastship"]);
    let record = env.worker().operation(&key).unwrap().unwrap();
    assert!(matches!(record.status, OperationStatus::Committed { .. }));
    let grant = record.approval.expect("the grant is on record");
    assert_eq!(
        (
            grant.granted.scope.hex(),
            grant.granted.artifact.hex(),
            grant.granted.approver.as_str()
        ),
        (hash.clone(), scope.artifact.clone(), "dana@ops")
    );
    assert_eq!(grant.intent, rebooking.digest());
    assert!(
        record.preconditions.is_empty(),
        "{:?}",
        record.preconditions
    );
    let statuses: Vec<&str> = record.history.iter().map(|e| e.status.as_str()).collect();
    assert_eq!(statuses, ["prepared", "committed"]);
    let stream = env.worker().render_stream(wf).unwrap();
    assert!(stream.contains("approval_required"), "{stream}");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn a_plan_changed_after_approval_is_refused_and_approved_again() {
    let mut env = env().await;
    let wf = "approval-stale";
    set_carrier("ORD-41", "fastship");
    env.worker()
        .start_with(approved_rebooking, "ORD-41".into(), with_id(wf))
        .await
        .unwrap();
    let first = pending_hash(&env, wf, 1).await;
    // The world changes while the person reads the plan: the executed plan will differ.
    set_carrier("ORD-41", "slowboat");
    approve(&env, wf, &first).await.unwrap();

    let second = pending_hash(&env, wf, 2).await;
    assert_ne!(first, second, "the changed plan is asked for again");
    let mismatches = env.metrics().value(names::APPROVAL_HASH_MISMATCHES, &[]);
    assert_eq!(mismatches, 1.0);
    let asked = pending_scope(&env, wf);
    assert_eq!(
        asked.intents[0].intent,
        rebook_intent(wf, "ORD-41", "slowboat")
    );
    // The refusal is journaled: a restart replays it, and asks nothing twice.
    env.crash_and_restart().await.unwrap();
    assert_eq!(pending_hash(&env, wf, 2).await, second);
    let refused = env.worker().render_journal(wf).unwrap();
    assert!(refused.contains("NotApproved"), "{refused}");
    let stale = approve(&env, wf, &first).await.unwrap_err();
    assert!(
        matches!(stale, ApprovalError::HashMismatch { .. }),
        "{stale}"
    );
    assert_eq!(
        stale.to_string(),
        format!(
            "the decision is for artifact {first}, but the approval pending in workflow \
             `{wf}` is for artifact {second}; read the pending artifact and decide on it"
        )
    );
    approve(&env, wf, &second).await.unwrap();
    let run = env.worker().handle(approved_rebooking, wf);
    assert_eq!(run.result().await.unwrap(), "ref-1");
    let key = rebook_key(wf, "ORD-41");
    assert_eq!(
        applied_effects(&key),
        ["ORD-41 with slowboat"],
        "never the stale plan"
    );
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn an_approval_nobody_decides_expires_on_its_durable_timer() {
    let env = env().await;
    let wf = "approval-expired";
    set_carrier("ORD-42", "fastship");
    let run = env
        .worker()
        .start_with(approved_rebooking, "ORD-42".into(), with_id(wf))
        .await
        .unwrap();
    pending_hash(&env, wf, 1).await;
    env.advance(Duration::from_secs(3601)).await;
    let error = run.result().await.unwrap_err().to_string();
    assert!(error.contains("approval expired"), "{error}");
    assert!(applied_effects(&rebook_key(wf, "ORD-42")).is_empty());
    let late = env
        .worker()
        .decide_approval(wf, "sha256:12", "dana@ops", ApprovalVerdict::Approve)
        .await
        .unwrap_err();
    assert!(matches!(late, ApprovalError::MalformedHash(_)), "{late}");
}

#[tokio::test]
async fn a_rejection_ends_the_workflow_with_the_reason() {
    let env = env().await;
    let wf = "approval-rejected";
    set_carrier("ORD-43", "fastship");
    let run = env
        .worker()
        .start_with(approved_rebooking, "ORD-43".into(), with_id(wf))
        .await
        .unwrap();
    let hash = pending_hash(&env, wf, 1).await;
    let reject = ApprovalVerdict::Reject("customer asked to wait".into());
    env.worker()
        .decide_approval(wf, &hash, "dana@ops", reject)
        .await
        .unwrap();
    let error = run.result().await.unwrap_err().to_string();
    assert!(error.contains("customer asked to wait"), "{error}");
    assert!(applied_effects(&rebook_key(wf, "ORD-43")).is_empty());
}

/// A decision that arrives after the expiry but before the expiry timer was handled settles
/// the request as expired, and the workflow goes on at once: it is polled after that delivery
/// like after any other.
#[tokio::test]
async fn a_decision_after_the_expiry_ends_the_wait_as_expired_at_once() {
    let env = env().await;
    let wf = "approval-decided-late";
    set_carrier("ORD-44", "fastship");
    let run = env
        .worker()
        .start_with(approved_rebooking, "ORD-44".into(), with_id(wf))
        .await
        .unwrap();
    let hash = pending_hash(&env, wf, 1).await;
    assert!(eventually(400, || env.worker().resident_workflows() == 0).await);
    // The decision is routed first: routing it rebuilds the evicted workflow, whose mailbox
    // then holds it ahead of anything else. Only then does the clock pass the expiry, without
    // a yield in between, so the timer service cannot fire before the decision is queued.
    let decide = env
        .worker()
        .decide_approval(wf, &hash, "dana@ops", ApprovalVerdict::Approve);
    tokio::pin!(decide);
    let mut routed = false;
    for _ in 0..1_000 {
        assert!(
            futures::poll!(&mut decide).is_pending(),
            "answered too early"
        );
        if env.worker().resident_workflows() == 1 {
            routed = true;
            break;
        }
        // Blocks this (the only runtime) thread: the store read runs on its own thread.
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(routed, "the decision reached the workflow");
    env.clock().advance(Duration::from_secs(3601));
    let late = decide.await.unwrap_err();
    assert!(matches!(late, ApprovalError::Expired { .. }), "{late}");
    let ended = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    let error = ended.expect("the run ends").unwrap_err().to_string();
    assert!(error.contains("approval expired"), "{error}");
    assert!(applied_effects(&rebook_key(wf, "ORD-44")).is_empty());
}

/// Asks for approval (with an expiry or without) unless the request is withdrawn first, then
/// naps: a withdrawn request is dropped by the code.
#[workflow]
async fn approval_or_withdrawal(
    ctx: WorkflowContext,
    expiring: bool,
) -> Result<String, WorkflowError> {
    let plan = Plan {
        order_id: "ORD-90".into(),
        carrier: "fastship".into(),
    };
    let plan = ctx.artifact_with(plan, ArtifactMeta::new("plan"))?;
    let outcome = {
        let mut request = ctx.approval(&plan);
        if expiring {
            request = request.expires_in(Duration::from_secs(3600));
        }
        let mut decided = std::future::IntoFuture::into_future(request);
        let mut withdrawn = ctx.signal::<String>("withdraw");
        waymark::select! {
            _ = decided => "decided".to_owned(),
            why = withdrawn => format!("withdrawn: {}", why?),
        }
    };
    ctx.sleep(Duration::from_secs(7200)).await;
    Ok(outcome)
}

/// A request the code dropped (it lost a `select!`) is journaled as dropped: it is no longer
/// listed for a person to decide, a decision for it is refused, and its expiry never fires.
#[tokio::test]
async fn a_dropped_request_is_no_longer_pending() {
    let env = env().await;
    for expiring in [false, true] {
        let wf = &format!("approval-dropped-{expiring}");
        env.worker()
            .start_with(approval_or_withdrawal, expiring, with_id(wf))
            .await
            .unwrap();
        let hash = pending_hash(&env, wf, 1).await;
        env.worker()
            .signal(wf, "withdraw", "w-1", &"the order was cancelled")
            .await
            .unwrap();
        let dropped = || {
            env.worker()
                .render_journal(wf)
                .unwrap()
                .contains("wait_dropped")
        };
        assert!(eventually(400, dropped).await, "the drop is journaled");
        assert_eq!(env.worker().pending_approvals(wf).unwrap(), []);
        let refused = approve(&env, wf, &hash).await;
        assert!(refused.is_err(), "{refused:?}");
        let timers = env.worker().pending_timers(wf).unwrap();
        assert_eq!(timers.len(), 1, "only the nap is left: {timers:?}");
    }
}

/// Asks for approval and, in the same poll, takes another branch.
#[workflow]
async fn asked_and_withdrawn_at_once(
    ctx: WorkflowContext,
    _input: (),
) -> Result<String, WorkflowError> {
    let plan = Plan {
        order_id: "ORD-91".into(),
        carrier: "fastship".into(),
    };
    let plan = ctx.artifact_with(plan, ArtifactMeta::new("plan"))?;
    let mut decided = std::future::IntoFuture::into_future(ctx.approval(&plan));
    let mut not_needed = futures::future::ready(());
    let outcome = waymark::select! {
        _ = decided => "decided",
        () = not_needed => "not needed",
    };
    Ok(outcome.to_owned())
}

/// A request the code dropped in the poll that made it is shown to no one: no
/// `approval_required` event reaches the stream, and it is not pending.
#[tokio::test]
async fn a_request_dropped_at_once_asks_no_one() {
    let env = env().await;
    let wf = "approval-dropped-at-once";
    let run = env
        .worker()
        .start_with(asked_and_withdrawn_at_once, (), with_id(wf))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), "not needed");
    let journal = env.worker().render_journal(wf).unwrap();
    assert!(journal.contains("wait_dropped"), "{journal}");
    let stream = env.worker().render_stream(wf).unwrap();
    assert!(!stream.contains("approval_required"), "{stream}");
    assert_eq!(env.worker().pending_approvals(wf).unwrap(), []);
}

/// A risk the author's value cannot express stops the run with why, before anything is asked:
/// no approver is shown an empty risk.
#[tokio::test]
async fn a_risk_that_does_not_serialize_stops_the_run_before_asking() {
    let env = env().await;
    let wf = "risk-does-not-serialize";
    let run = env
        .worker()
        .start_with(risk_that_does_not_serialize, (), with_id(wf));
    let handle = run.await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), handle.result()).await;
    let error = result
        .expect("the run stops rather than waits")
        .unwrap_err();
    let RunError::Stuck(stuck) = &error else {
        panic!("expected the run to stop, got {error}");
    };
    assert_eq!(
        stuck.stop.code,
        waymark::inspect::StopCode::PayloadMismatch,
        "{error}"
    );
    let journal = env.worker().journal(wf).unwrap();
    let asked = journal.iter().any(|e| {
        use waymark::inspect::Entry;
        matches!(
            e,
            Entry::ApprovalRequested { .. } | Entry::ApprovalRequestedAt { .. }
        )
    });
    assert!(!asked, "nothing was asked");
    assert!(env.worker().pending_approvals(wf).unwrap().is_empty());
}

#[tokio::test]
async fn an_approval_authorises_its_intents_and_another_under_it_is_refused() {
    let mut env = env().await;
    let wf = "approval-used-once";
    set_carrier("ORD-50", "fastship");
    let input = "ORD-50".to_owned();
    let (result, hash) = approved_run(&env, one_approval_two_effects, input, wf).await;
    let other = rebook_intent(wf, "ORD-50-B", "fastship").digest().hex();
    let listed = rebook_intent(wf, "ORD-50", "fastship").digest().hex();
    let expected = format!(
        "ref-1; refused: intent {other} of `rebook` is not authorised by approval request 3 \
         (scope {hash}, which authorises {listed}); ask for an approval of this \
         intent; the effect was not called"
    );
    assert_eq!(result, expected);
    assert_eq!(applied_effects(&rebook_key(wf, "ORD-50")).len(), 1);
    assert!(applied_effects(&rebook_key(wf, "ORD-50-B")).is_empty());
    let refused = env.worker().operation(&rebook_key(wf, "ORD-50-B")).unwrap();
    let refused = refused.expect("the refused call is on record");
    assert_eq!(refused.status.name(), "not_attempted");
    // Refused when issued: no `prepared` was written that a crash could leave behind.
    let trail: Vec<&str> = refused.history.iter().map(|e| e.status.as_str()).collect();
    assert_eq!(trail, ["not_attempted"]);
    assert_eq!(
        env.metrics().value(names::APPROVAL_HASH_MISMATCHES, &[]),
        1.0
    );
    // Replayed from the top, the checks are made again in the same order.
    env.crash_and_restart().await.unwrap();
    let run = env.worker().handle(one_approval_two_effects, wf);
    assert_eq!(run.result().await.unwrap(), expected);
}

#[tokio::test]
async fn an_approval_is_used_once_by_one_command_of_its_intent() {
    let env = env().await;
    let wf = "approval-one-command";
    set_carrier("ORD-51", "fastship");
    let input = "ORD-51".to_owned();
    let (result, _) = approved_run(&env, one_intent_two_commands, input, wf).await;
    assert!(
        result.contains("precondition `the warehouse is open` does not hold"),
        "{result}"
    );
    let intent = rebook_intent(wf, "ORD-51", "fastship").digest().hex();
    let used = format!("approval request 3 was already used for intent {intent} by command 4");
    assert!(result.contains(&used), "{result}");
    assert!(applied_effects(&rebook_key(wf, "ORD-51")).is_empty());
}

/// A command refused before its call leaves a `not_attempted` record in the write that
/// journals it; two later commands of the same intent in that write must not both take it
/// for the key's last record: the second is the first's, in use.
#[tokio::test]
async fn one_intent_issued_twice_after_a_refusal_in_one_write_is_called_once() {
    let mut env = env().await;
    let wf = "approval-refused-then-twice";
    set_carrier("ORD-52", "fastship");
    let input = "ORD-52".to_owned();
    let (result, _) = approved_run(&env, refused_then_issued_twice, input, wf).await;
    assert_eq!(
        applied_effects(&rebook_key(wf, "ORD-52")).len(),
        1,
        "{result}"
    );
    assert!(
        result.contains("is not authorised by approval request"),
        "{result}"
    );
    assert!(result.contains("Ok(\"ref-1\")"), "{result}");
    assert!(result.contains("is in use by seq"), "{result}");
    // Replayed from the top, the three answers come from the journal.
    env.crash_and_restart().await.unwrap();
    let run = env.worker().handle(refused_then_issued_twice, wf);
    assert_eq!(run.result().await.unwrap(), result);
    assert_eq!(applied_effects(&rebook_key(wf, "ORD-52")).len(), 1);
}

/// The evidence is part of what is approved: the same plan on a changed policy is another
/// scope, and a decision on the first is refused.
#[tokio::test]
async fn evidence_changed_after_the_request_is_approved_again() {
    let mut env = env().await;
    let wf = "approval-evidence";
    *POLICY.lock().unwrap() = "policy-v1";
    env.worker()
        .start_with(evidence_bound_rebooking, "ORD-60".into(), with_id(wf))
        .await
        .unwrap();
    let first = pending_hash(&env, wf, 1).await;
    let read = pending_scope(&env, wf);
    *POLICY.lock().unwrap() = "policy-v2";
    env.advance(Duration::from_secs(3601)).await;
    let second = pending_hash(&env, wf, 2).await;
    let asked = pending_scope(&env, wf);
    assert_eq!(asked.artifact, read.artifact, "the same plan");
    assert_eq!(asked.intents, read.intents, "the same intent");
    assert_ne!(asked.evidence, read.evidence, "other evidence");
    assert_ne!(first, second);
    env.crash_and_restart().await.unwrap();
    let stale = approve(&env, wf, &first).await.unwrap_err();
    assert!(
        matches!(stale, ApprovalError::HashMismatch { .. }),
        "{stale}"
    );
    approve(&env, wf, &second).await.unwrap();
    let run = env.worker().handle(evidence_bound_rebooking, wf);
    assert_eq!(run.result().await.unwrap(), "ref-1");
    let record = env.worker().operation(&rebook_key(wf, "ORD-60")).unwrap();
    assert_eq!(
        record.unwrap().approval.unwrap().granted.scope.hex(),
        second
    );
}

/// Arguments are compared as the effect's typed input encodes them, canonically: another
/// spelling of the same value (key order, spaces, `2` for `2.0`) is the approved intent, and
/// any other value is not.
#[tokio::test]
async fn arguments_that_mean_the_same_typed_value_are_the_approved_intent() {
    let env = env().await;
    let spellings = [
        (
            "same",
            r#"{ "weight_kg": 2, "insurance_eur": 200.0 }"#,
            "ref-1",
        ),
        (
            "other",
            r#"{"insurance_eur": 200.5, "weight_kg": 2.0}"#,
            "refused",
        ),
    ];
    for (name, text, expected) in spellings {
        let wf = &format!("approval-spelling-{name}");
        let (result, _) = approved_run(&env, options_from_text, text.to_owned(), wf).await;
        assert_eq!(result, expected, "{text}");
    }
}

/// `.under` after the effect may have started cannot guard it: the run stops, stuck, naming
/// the misuse, rather than pretend the call was checked.
#[tokio::test]
async fn an_effect_put_under_an_approval_after_it_started_stops_the_run() {
    let env = env().await;
    let wf = "approval-too-late";
    set_carrier("ORD-52", "fastship");
    env.worker()
        .start_with(under_too_late, "ORD-52".into(), with_id(wf))
        .await
        .unwrap();
    let hash = pending_hash(&env, wf, 1).await;
    approve(&env, wf, &hash).await.unwrap();
    let run = env.worker().handle(under_too_late, wf);
    let error = run.result().await.unwrap_err();
    let RunError::Stuck(stuck) = &error else {
        panic!("expected the run to stop, got {error}");
    };
    assert_eq!(
        stuck.stop.code,
        waymark::inspect::StopCode::Misuse,
        "{error}"
    );
    assert!(
        stuck.stop.message.contains("must follow the effect call"),
        "{error}"
    );
    let record = env
        .worker()
        .operation(&rebook_key(wf, "ORD-52"))
        .unwrap()
        .unwrap();
    assert_eq!(
        record.approval, None,
        "it ran under no approval, and says so"
    );
}
