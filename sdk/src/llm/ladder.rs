//! Validators and the bounded repair ladder: answer → verdict → repair prompt on the same model
//! (up to `repair(n)` times) → one call on the fallback model → either a person's review
//! (`escalate_to_human(signal)`: the workflow waits durably for a [`HumanReview`] signal) or
//! [`LadderError::Exhausted`]. The author chooses.
//!
//! Every rung is journaled: each model call is its own `waymark.llm` command, a model-based
//! validator's judgement is a model call too, and each verdict is a recorded value (`verdict
//! validation {...}`), so a resumed run replays the decisions the original took even if a
//! validator's code changed since.

use std::future::IntoFuture;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::json;
use waymark_runtime::context::StreamVerdict;
use waymark_runtime::journal::Seq;
use waymark_runtime::telemetry::{ReplayMode, Telemetry};

use super::{Llm, LlmCall, LlmResponse};
use crate::{ActivityCall, ActivityError, WorkflowContext, WorkflowError};

type Rule = Arc<dyn Fn(&LlmResponse) -> Result<(), String> + Send + Sync>;
type Judge = Arc<dyn Fn(&LlmResponse) -> Llm + Send + Sync>;

/// Checks a model answer.
#[derive(Clone)]
pub struct Validator {
    name: String,
    kind: ValidatorKind,
}

#[derive(Clone)]
enum ValidatorKind {
    /// Deterministic: a schema, a policy rule.
    Rule(Rule),
    /// Another model call judges the answer; it must answer `PASS` or give the reason.
    Model(Judge),
}

impl Validator {
    /// A deterministic check: `Err(reason)` rejects the answer.
    pub fn rule(
        name: &str,
        check: impl Fn(&LlmResponse) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        let kind = ValidatorKind::Rule(Arc::new(check));
        let name = name.to_owned();
        Self { name, kind }
    }

    /// The answer must parse as `T` (structured output).
    pub fn json<T: DeserializeOwned + 'static>() -> Self {
        Self::rule("structured_output", |response| {
            serde_json::from_str::<T>(&response.text)
                .map(drop)
                .map_err(|e| format!("malformed structured output: {e}"))
        })
    }

    /// A model-based check: `judge` builds the judging call from the answer; the judge's
    /// answer must start with `PASS`, anything else is the reason for rejecting.
    pub fn model(name: &str, judge: impl Fn(&LlmResponse) -> Llm + Send + Sync + 'static) -> Self {
        let kind = ValidatorKind::Model(Arc::new(judge));
        let name = name.to_owned();
        Self { name, kind }
    }
}

/// A validated answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    /// The answer that passed (or that a person accepted or wrote).
    pub response: LlmResponse,
    /// Rungs climbed before it passed: 0 when the first answer passed.
    pub depth: u32,
    /// Whether a person decided, after the validators kept rejecting.
    pub by_human: bool,
}

/// A person's decision on an answer the validators kept rejecting: the payload of the signal
/// named in [`Ladder::escalate_to_human`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "decision")]
pub enum HumanReview {
    /// Take the last answer as it is.
    Accept,
    /// Use this text instead.
    Replace {
        /// The answer the person wrote.
        text: String,
    },
    /// No answer: the ladder fails.
    Reject {
        /// Why.
        reason: String,
    },
}

/// Why the ladder gave no validated answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LadderError {
    /// A model call failed for good (its retries are the activity's).
    #[error(transparent)]
    Call(#[from] ActivityError),
    /// Every rung was rejected.
    #[error("no valid answer after {attempts} attempts; last rejection: {last_reason}")]
    Exhausted {
        /// Answers produced.
        attempts: u32,
        /// Why the last one was rejected.
        last_reason: String,
    },
    /// A person rejected the answer, or the review could not be read.
    #[error("the reviewer rejected the answer: {reason}")]
    Rejected {
        /// The reviewer's reason.
        reason: String,
    },
}

impl From<LadderError> for WorkflowError {
    fn from(error: LadderError) -> Self {
        match error {
            LadderError::Call(error) => WorkflowError::Activity(error),
            exhausted => WorkflowError::Failed(exhausted.to_string()),
        }
    }
}

/// The repair ladder of one model call; await it.
#[must_use = "the ladder does nothing unless awaited"]
pub struct Ladder {
    ctx: WorkflowContext,
    llm: Llm,
    first: ActivityCall<LlmResponse>,
    validators: Vec<Validator>,
    repairs: u32,
    fallback: Option<String>,
    escalation: Option<String>,
}

impl Ladder {
    pub(super) fn new(
        ctx: WorkflowContext,
        llm: Llm,
        first: ActivityCall<LlmResponse>,
        validator: Validator,
    ) -> Self {
        await_verdict(&ctx, first.seq());
        Self {
            ctx,
            llm,
            first,
            validators: vec![validator],
            repairs: 0,
            fallback: None,
            escalation: None,
        }
    }

    /// Another validator, checked after the previous ones.
    pub fn validate(mut self, validator: Validator) -> Self {
        self.validators.push(validator);
        self
    }

    /// Up to `times` repair prompts on the same model, each quoting the rejection.
    pub fn repair(mut self, times: u32) -> Self {
        self.repairs = times;
        self
    }

    /// After the repairs, one call of the original request on `model`.
    pub fn fallback(mut self, model: &str) -> Self {
        self.fallback = Some(model.to_owned());
        self
    }

    /// When every rung is rejected, wait (durably, holding no memory) for a [`HumanReview`]
    /// sent as signal `signal` instead of failing with [`LadderError::Exhausted`].
    pub fn escalate_to_human(mut self, signal: &str) -> Self {
        self.escalation = Some(signal.to_owned());
        self
    }

    async fn climb(self) -> Result<Validated, LadderError> {
        let Ladder {
            ctx,
            llm,
            first,
            validators,
            repairs,
            fallback,
            escalation,
        } = self;
        let mut step = first.seq();
        let mut answer = first.await?;
        let mut request = llm.clone();
        let mut depth = 0;
        loop {
            let next_rung = depth < repairs || (fallback.is_some() && depth == repairs);
            let last_rung = !next_rung && escalation.is_none();
            let judged = Judged {
                answer: &answer,
                step,
                depth,
                last_rung,
                person_next: !next_rung && escalation.is_some(),
            };
            let rejection = judge(&ctx, &validators, judged).await?;
            let Some(reason) = rejection else {
                return Ok(Validated {
                    response: answer,
                    depth,
                    by_human: false,
                });
            };
            depth += 1;
            request = if depth <= repairs {
                repair_request(request, &answer, &reason)
            } else if let (Some(model), true) = (&fallback, depth == repairs + 1) {
                llm.clone().on_model(model)
            } else if let Some(signal) = &escalation {
                return ask_human(&ctx, signal, answer, step, depth).await;
            } else {
                return Err(LadderError::Exhausted {
                    attempts: depth,
                    last_reason: reason,
                });
            };
            let call = ctx.llm(request.clone());
            step = call.seq();
            await_verdict(&ctx, step);
            answer = call.await?;
        }
    }
}

impl IntoFuture for Ladder {
    type Output = Result<Validated, LadderError>;
    type IntoFuture = BoxFuture<'static, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.climb())
    }
}

/// Marks the model call at `step` as judged: its streamed answer is committed by the verdict.
fn await_verdict(ctx: &WorkflowContext, step: Option<Seq>) {
    if let Some(step) = step {
        ctx.core().await_validation(step);
    }
}

/// An answer put to the validators: which call made it, at which rung.
struct Judged<'a> {
    answer: &'a LlmResponse,
    step: Option<Seq>,
    depth: u32,
    last_rung: bool,
    /// A rejection goes to a person, who settles the answer's stream version instead.
    person_next: bool,
}

/// Runs the validators in order until one rejects; records the verdict, which commits or
/// supersedes the answer's stream version. `Some(reason)` when rejected.
async fn judge(
    ctx: &WorkflowContext,
    validators: &[Validator],
    judged: Judged<'_>,
) -> Result<Option<String>, LadderError> {
    let Judged {
        answer,
        step,
        depth,
        last_rung,
        person_next,
    } = judged;
    let mut rejection = None;
    for validator in validators {
        let verdict = match &validator.kind {
            ValidatorKind::Rule(check) => check(answer).err(),
            ValidatorKind::Model(build) => model_verdict(ctx.llm(build(answer))).await?,
        };
        if let Some(reason) = verdict {
            rejection = Some(format!("{}: {reason}", validator.name));
            break;
        }
    }
    let verdict = json!({
        "depth": depth,
        "model": answer.model,
        "passed": rejection.is_none(),
        "reason": rejection,
    });
    let (passed, cost_micros) = (rejection.is_none(), answer.cost_micros);
    let count = move |telemetry: &Telemetry| {
        if !passed {
            telemetry.llm_rejected(cost_micros);
        }
        if passed || last_rung {
            telemetry.validator_depth(depth);
        }
    };
    // On replay the recorded verdict wins over a recomputed one.
    let settles = rejection.is_none() || !person_next;
    let stream = step.filter(|_| settles).map(|step| StreamVerdict {
        step,
        rejected: rejection.clone(),
    });
    let recorded = ctx.record_stream_verdict("validation", verdict, count, stream);
    let reason = recorded.and_then(|v| v["reason"].as_str().map(str::to_owned));
    // The loop depth, for telemetry: how far down the ladder this answer took the workflow.
    tracing::info!(
        target: "waymark::ladder",
        depth,
        model = %answer.model,
        passed = reason.is_none(),
        "validation verdict"
    );
    Ok(reason)
}

/// Waits for a person's review of the last rejected answer; their decision is journaled as a
/// signal and recorded as the final verdict.
async fn ask_human(
    ctx: &WorkflowContext,
    signal: &str,
    answer: LlmResponse,
    step: Option<Seq>,
    depth: u32,
) -> Result<Validated, LadderError> {
    tracing::info!(target: "waymark::ladder", depth, signal, "escalated to a person");
    // Only a payload that is a review decides: any other (a mistake, or a caller without the
    // approve role, which the API refuses reviews from) is skipped, and the next one awaited.
    let review = loop {
        match ctx.signal::<HumanReview>(signal).await {
            Ok(review) => break review,
            Err(error) if ctx.replay_mode() == ReplayMode::FirstExecution => {
                tracing::warn!(target: "waymark::ladder", signal, %error,
                    "a signal that is not a review was skipped");
            }
            Err(_) => {}
        }
    };
    let (passed, reason) = match &review {
        HumanReview::Reject { reason } => (false, Some(reason.clone())),
        _ => (true, None),
    };
    let verdict = json!({"depth": depth, "model": "human", "passed": passed, "reason": reason});
    let count = move |telemetry: &Telemetry| telemetry.validator_depth(depth);
    // Only an answer the person accepts as it is stays what the reader was shown.
    let rejected = match &review {
        HumanReview::Accept => None,
        HumanReview::Replace { .. } => Some("replaced by the reviewer".to_owned()),
        HumanReview::Reject { reason } => Some(reason.clone()),
    };
    let stream = step.map(|step| StreamVerdict { step, rejected });
    let _ = ctx.record_stream_verdict("validation", verdict, count, stream);
    let response = match review {
        HumanReview::Accept => answer,
        HumanReview::Replace { text } => LlmResponse { text, ..answer },
        HumanReview::Reject { reason } => return Err(LadderError::Rejected { reason }),
    };
    Ok(Validated {
        response,
        depth,
        by_human: true,
    })
}

async fn model_verdict(call: LlmCall) -> Result<Option<String>, LadderError> {
    let judgement = call.await?;
    let text = judgement.text.trim();
    Ok(match text.strip_prefix("PASS") {
        Some(_) => None,
        None => Some(text.to_owned()),
    })
}

fn repair_request(request: Llm, answer: &LlmResponse, reason: &str) -> Llm {
    request.assistant(answer.text.clone()).user(format!(
        "Your previous answer was rejected ({reason}). Answer again, fixing that."
    ))
}
