//! Validators and the repair ladder: each rung is a journaled model call, each verdict a recorded
//! value, the depth bounded. The scripted provider plays the model; its call count and the
//! requests it saw are the assertions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::llm::{HumanReview, LadderError, ScriptedProvider, Validator};
use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, eventually, open_gate, pass_gate, with_id};

/// The structured answer the planner must give.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct Plan {
    action: String,
    carrier: String,
}

/// Whether the carrier rule is enforced; a test turns it off to show that a resumed run
/// replays the recorded verdicts rather than re-judging with changed code.
static CARRIER_RULE_ON: AtomicBool = AtomicBool::new(true);

fn approved_carrier() -> Validator {
    Validator::rule("approved_carrier", |response| {
        let plan: Plan = serde_json::from_str(&response.text).map_err(|e| e.to_string())?;
        let enforced = CARRIER_RULE_ON.load(Ordering::SeqCst);
        match plan.carrier.as_str() {
            "fastship" | "slowboat" => Ok(()),
            other if enforced => Err(format!("carrier {other} is not approved")),
            _ => Ok(()),
        }
    })
}

#[workflow]
async fn validated_plan(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let request = Llm::new("planner")
        .prompt("plan", "v3")
        .json::<Plan>()
        .user(format!("Plan the rebooking of {order_id}"));
    let plan = ctx
        .llm(request)
        .validate(Validator::json::<Plan>())
        .validate(approved_carrier())
        .repair(2)
        .fallback("planner-large")
        .await?;
    ctx.activity(after_plan, order_id).await?;
    Ok(format!("{} (depth {})", plan.response.text, plan.depth))
}

/// A step after the ladder that a test can hold, to crash the worker there.
#[activity]
async fn after_plan(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "after_plan").await;
    Ok(order_id)
}

/// The author's choice on exhaustion: a readable failure naming the depth reached.
#[workflow]
async fn judged_answer(ctx: WorkflowContext, question: String) -> Result<String, WorkflowError> {
    let judge = Validator::model("tone_judge", |answer| {
        Llm::new("judge").user(format!("PASS if polite, else say why: {}", answer.text))
    });
    let outcome = ctx
        .llm(Llm::new("writer").user(question))
        .validate(judge)
        .repair(1)
        .fallback("writer-large")
        .await;
    match outcome {
        Ok(validated) => Ok(validated.response.text),
        Err(LadderError::Exhausted {
            attempts,
            last_reason,
        }) => Err(WorkflowError::Failed(format!(
            "gave up after {attempts} answers: {last_reason}"
        ))),
        Err(other) => Err(other.into()),
    }
}

/// The author's other choice: a person reviews what the validators kept rejecting.
#[workflow]
async fn reviewed_answer(ctx: WorkflowContext, question: String) -> Result<String, WorkflowError> {
    let no_apology = Validator::rule("apologises", |answer| match answer.text.contains("orry") {
        true => Ok(()),
        false => Err("the answer does not apologise".into()),
    });
    let validated = ctx
        .llm(Llm::new("writer").user(question))
        .validate(no_apology)
        .repair(1)
        .escalate_to_human("review")
        .await?;
    Ok(format!(
        "{} (by human: {})",
        validated.response.text, validated.by_human
    ))
}

/// A streamed answer a model judge checks: the reader sees it generated at once, and as the
/// answer only once the judge accepts it.
#[workflow]
async fn streamed_and_judged(
    ctx: WorkflowContext,
    question: String,
) -> Result<String, WorkflowError> {
    let judge = Validator::model("tone_judge", |answer| {
        Llm::new("judge").user(format!("PASS if polite, else say why: {}", answer.text))
    });
    let validated = ctx
        .llm(Llm::new("writer").user(question).streamed())
        .validate(judge)
        .repair(1)
        .await?;
    Ok(validated.response.text)
}

async fn scripted_env(scripted: &ScriptedProvider) -> TestEnv {
    let scripted = scripted.clone();
    let setup = move |b: WorkerBuilder| {
        b.register(validated_plan)
            .register(streamed_and_judged)
            .register(after_plan)
            .register(judged_answer)
            .register(reviewed_answer)
            .llm(scripted.clone())
            .llm_options(ActivityOptions::default().initial_backoff(Duration::from_millis(10)))
    };
    TestEnv::start(setup).await.unwrap()
}

const BAD_JSON: &str = "rebook it with fastship";
const BAD_CARRIER: &str = r#"{"action":"rebook","carrier":"pigeon"}"#;
const GOOD_PLAN: &str = r#"{"action":"rebook","carrier":"fastship"}"#;

#[tokio::test]
async fn two_rejections_then_a_pass_take_three_calls_and_every_verdict_is_journaled() {
    let scripted = ScriptedProvider::default()
        .reply(BAD_JSON)
        .reply(BAD_CARRIER)
        .reply(GOOD_PLAN);
    let mut env = scripted_env(&scripted).await;
    let wf = "ladder-repairs";
    close_gate(wf, "after_plan");
    env.worker()
        .start_with(validated_plan, "ORD-7".into(), with_id(wf))
        .await
        .unwrap();
    let laddered = |env: &TestEnv| env.worker().journal(wf).unwrap_or_default().len() >= 10;
    assert!(eventually(400, || laddered(&env)).await);
    assert_eq!(scripted.calls(), 3);

    // Resume with validator code that would now pass the carrier: the recorded verdicts stand.
    CARRIER_RULE_ON.store(false, Ordering::SeqCst);
    env.crash_and_restart().await.unwrap();
    open_gate(wf, "after_plan");
    let run = env.worker().handle(validated_plan, wf);
    assert_eq!(
        run.result().await.unwrap(),
        format!("{GOOD_PLAN} (depth 2)")
    );
    assert_eq!(scripted.calls(), 3, "replayed rungs do not call the model");

    let requests = scripted.requests();
    let repair = &requests[1].messages;
    assert_eq!(repair[repair.len() - 2].content, BAD_JSON);
    assert!(repair[repair.len() - 1]
        .content
        .contains("structured_output: malformed structured output"));
    assert!(requests[0].response_schema.is_some(), "the schema is sent");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn past_the_bound_the_ladder_gives_up_after_the_fallback() {
    let scripted = ScriptedProvider::default()
        .reply("do it now, you fool")
        .reply("rude")
        .reply("still rude, do it")
        .reply("rude")
        .reply("Please allow us one more day.")
        .reply("condescending");
    let env = scripted_env(&scripted).await;
    let wf = "ladder-exhausted";
    let run = env
        .worker()
        .start_with(judged_answer, "Where is my parcel?".into(), with_id(wf))
        .await
        .unwrap();
    let error = run.result().await.unwrap_err().to_string();
    assert!(
        error.contains("gave up after 3 answers: tone_judge: condescending"),
        "{error}"
    );
    let models: Vec<String> = scripted.requests().into_iter().map(|r| r.model).collect();
    let expected = [
        "writer",
        "judge",
        "writer",
        "judge",
        "writer-large",
        "judge",
    ];
    assert_eq!(
        models, expected,
        "answer, repair, fallback; each judged once"
    );
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn a_first_answer_that_passes_climbs_no_rung() {
    let scripted = ScriptedProvider::default()
        .reply("We are sorry: it ships tomorrow.")
        .reply("PASS");
    let env = scripted_env(&scripted).await;
    let run = env
        .worker()
        .start_with(judged_answer, "Late?".into(), with_id("ladder-pass"))
        .await
        .unwrap();
    assert_eq!(
        run.result().await.unwrap(),
        "We are sorry: it ships tomorrow."
    );
    assert_eq!(scripted.calls(), 2);
}

#[tokio::test]
async fn past_the_bound_a_person_reviews_and_the_workflow_waits_for_them() {
    let scripted = ScriptedProvider::default()
        .reply("It is late.")
        .reply("It is late, as said.");
    let mut env = scripted_env(&scripted).await;
    let wf = "ladder-human";
    env.worker()
        .start_with(reviewed_answer, "Where is my parcel?".into(), with_id(wf))
        .await
        .unwrap();
    let waiting = |env: &TestEnv| env.worker().resident_workflows() == 0;
    assert!(
        eventually(400, || waiting(&env)).await,
        "waits holding no memory"
    );
    env.crash_and_restart().await.unwrap();
    let review = HumanReview::Replace {
        text: "Sorry: it ships tomorrow.".into(),
    };
    env.worker()
        .signal(wf, "review", "review-1", &review)
        .await
        .unwrap();
    let run = env.worker().handle(reviewed_answer, wf);
    assert_eq!(
        run.result().await.unwrap(),
        "Sorry: it ships tomorrow. (by human: true)"
    );
    assert_eq!(scripted.calls(), 2, "the model was not called again");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn a_reviewer_can_reject_and_the_ladder_fails_with_their_reason() {
    let scripted = ScriptedProvider::default()
        .reply("It is late.")
        .reply("Still late.");
    let env = scripted_env(&scripted).await;
    let wf = "ladder-human-rejects";
    let run = env
        .worker()
        .start_with(reviewed_answer, "Late?".into(), with_id(wf))
        .await
        .unwrap();
    // A payload that is not a review decides nothing (over HTTP, only the approve role may
    // send one that is): the ladder waits for the next.
    let not_a_review = serde_json::json!({"note": "rejected, says someone"});
    env.worker()
        .signal(wf, "review", "noise-1", &not_a_review)
        .await
        .unwrap();
    let review = HumanReview::Reject {
        reason: "we owe this customer a call".into(),
    };
    env.worker()
        .signal(wf, "review", "review-1", &review)
        .await
        .unwrap();
    let error = run.result().await.unwrap_err().to_string();
    assert!(
        error.contains("the reviewer rejected the answer: we owe this customer a call"),
        "{error}"
    );
}

/// A validator's rejection supersedes the streamed answer it rejected, and only the accepted
/// one is committed, also when the worker dies between an answer and its verdict (the judge's
/// call, which the verdict waits for, is where it dies).
#[tokio::test]
async fn a_rejected_streamed_answer_is_superseded_and_only_the_accepted_one_committed() {
    let scripted = ScriptedProvider::default()
        .reply("Your parcel is late. Deal with it.")
        .reply("rude: it blames the customer")
        .reply("Sorry, your parcel is late; it ships today.")
        .reply("PASS");
    let mut env = scripted_env(&scripted).await;
    let wf = "ladder-streamed";
    let crash = PlannedFault::at("waymark.llm", 1, Boundary::BeforeCall, Fault::Crash).on_seq(1);
    env.faults().add(crash);
    env.worker()
        .start_with(
            streamed_and_judged,
            "Where is my parcel?".into(),
            with_id(wf),
        )
        .await
        .unwrap();
    let outcome = env.finish(streamed_and_judged, wf, 40).await.expect("ends");
    assert_eq!(
        outcome.unwrap(),
        "Sorry, your parcel is late; it ships today."
    );
    assert_eq!(
        env.faults().fired().len(),
        1,
        "the worker died before the first verdict"
    );
    let stream = env.worker().render_stream(wf).unwrap();
    insta::assert_snapshot!(stream);
    let events = env.worker().stream(wf, 0).unwrap();
    let rude = waymark::streams::visible_text(&events, 0);
    assert_eq!(rude, "", "the rejected answer is no longer shown");
    let shown = waymark::streams::visible_text(&events, 3);
    assert_eq!(shown, "Sorry, your parcel is late; it ships today.");
}
