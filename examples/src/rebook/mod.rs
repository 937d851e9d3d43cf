//! The operations assistant: "rebook the delayed shipment, notify the warehouse, and update the
//! customer ETA". Classify the request → load the order (snapshot) → retrieve the rebooking
//! policy (retrieval snapshot) → draft an action plan with a model, validated against the
//! policy (repair ladder) → ask a person when the plan is high-risk → rebook, notify and update
//! under that approval (effects with business-intent keys and reconcilers) → write the customer
//! message with a streamed model call → done.
//!
//! [`demo`] drives it through the classic failure (the model times out while writing the final
//! message, after the tools ran, and the process dies) and reports what ran and what replayed.

pub mod agent;
pub mod demo;
pub mod model;
pub mod naive;
pub mod systems;
pub mod timeline;

use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::approvals::{Approval, ApprovalOutcome, Artifact, ArtifactMeta};
use waymark::llm::Validator;
use waymark::prelude::*;
use waymark::snapshots::{Retrieval, RetrievedDocument};
use waymark::EffectCall;

use systems::{systems, Order};

/// The models each role uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Models {
    /// Classifies the request.
    pub classifier: String,
    /// Drafts the plan.
    pub planner: String,
    /// Drafts the plan when repairs did not help.
    pub fallback: String,
    /// Writes to the customer.
    pub writer: String,
}

impl Models {
    /// One model for every role.
    pub fn all(model: &str) -> Self {
        Self {
            classifier: model.into(),
            planner: model.into(),
            fallback: model.into(),
            writer: model.into(),
        }
    }
}

/// What the operator asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShipmentRequest {
    /// The request, in words.
    pub message: String,
    /// Which models to ask (chosen outside the workflow, so replay sees the same ones).
    pub models: Models,
}

/// What the classifier answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Intent {
    /// `rebook_delayed_shipment`, or anything else.
    pub intent: String,
    /// The order the request is about.
    pub order_id: String,
}

/// The plan the model drafts and a person may approve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ActionPlan {
    /// The carrier to rebook onto.
    pub carrier: String,
    /// The new delivery estimate, in days.
    pub new_eta_days: u32,
    /// What the warehouse must do.
    pub warehouse_note: String,
    /// What the rebooking costs, in cents.
    pub cost_cents: u64,
}

/// How the workflow ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShipmentOutcome {
    /// Rebooked, notified, updated, told.
    Rebooked {
        /// The carrier's booking reference.
        booking: String,
        /// The warehouse's notice reference.
        notice: String,
        /// The ETA update's reference.
        eta_update: String,
        /// What the customer is told.
        message: String,
    },
    /// The person asked rejected the plan (or did not decide in time).
    NotApproved {
        /// The plan's hash.
        plan: String,
    },
    /// Not a request this assistant handles.
    NotHandled {
        /// What the classifier said it was.
        intent: String,
    },
}

/// Plans above this cost, or that change the carrier, need a person's approval.
const APPROVAL_ABOVE_CENTS: u64 = 1_000;
const INTENT: &str = "rebook_delayed_shipment";

/// Loads the order from the order system.
#[activity(max_attempts = 3, initial_backoff_ms = 200)]
pub async fn load_order(order_id: String) -> Result<Order, ActivityError> {
    if !order_id.starts_with("ORD-") {
        return Err(ActivityError::terminal(format!("no order `{order_id}`")));
    }
    Ok(systems().order(&order_id))
}

/// Searches the policy corpus.
#[activity(max_attempts = 3, initial_backoff_ms = 200)]
pub async fn search_policy(query: String) -> Result<Retrieval, ActivityError> {
    let document = RetrievedDocument {
        id: "rebooking-policy".into(),
        version: "2026-11".into(),
        score: 0.92,
        text: "Orders more than 2 days late may be rebooked. Approved carriers for rebooking: \
               rapidpost, parcelco. The warehouse must be told before the carrier collects."
            .into(),
    };
    Ok(Retrieval {
        query,
        rewritten_query: None,
        documents: vec![document],
        index_version: "policies@2026-11".into(),
    })
}

/// Rebooks the order with the carrier; the carrier deduplicates by key.
#[activity(effect, reconcile = find_booking, max_attempts = 4, initial_backoff_ms = 200)]
pub async fn rebook_carrier(
    cx: ActivityContext,
    #[key] order_id: String,
    #[key] carrier: String,
) -> Result<String, ActivityError> {
    let key = key_of(&cx)?;
    let booking = systems().rebook(Some(key), &order_id, &carrier);
    cx.set_external_ref(booking.clone());
    Ok(booking)
}

async fn find_booking(
    cx: ActivityContext,
    _order_id: String,
    _carrier: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(found(systems().find_booking(key_of(&cx)?)))
}

/// Tells the warehouse about the booking.
#[activity(effect, reconcile = find_notice, max_attempts = 4, initial_backoff_ms = 200)]
pub async fn notify_warehouse(
    cx: ActivityContext,
    #[key] order_id: String,
    #[key] booking: String,
    note: String,
) -> Result<String, ActivityError> {
    let note = format!("{note} (booking {booking})");
    let notice = systems().notify_warehouse(Some(key_of(&cx)?), &order_id, &note);
    cx.set_external_ref(notice.clone());
    Ok(notice)
}

async fn find_notice(
    cx: ActivityContext,
    _order_id: String,
    _booking: String,
    _note: String,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(found(systems().find_notice(key_of(&cx)?)))
}

/// Updates the ETA the customer sees.
#[activity(effect, reconcile = find_eta_update, max_attempts = 4, initial_backoff_ms = 200)]
pub async fn update_customer_eta(
    cx: ActivityContext,
    #[key] order_id: String,
    #[key] eta_days: u32,
) -> Result<String, ActivityError> {
    let update = systems().update_eta(Some(key_of(&cx)?), &order_id, eta_days);
    cx.set_external_ref(update.clone());
    Ok(update)
}

async fn find_eta_update(
    cx: ActivityContext,
    _order_id: String,
    _eta_days: u32,
) -> Result<Reconciled<String>, ActivityError> {
    Ok(found(systems().find_eta_update(key_of(&cx)?)))
}

/// The effect's idempotency key, which the systems deduplicate by. An effect always has one;
/// without it, calling (or asking) the downstream could not be made safe, so it is refused.
fn key_of(cx: &ActivityContext) -> Result<&str, ActivityError> {
    cx.idempotency_key()
        .ok_or_else(|| ActivityError::terminal("an effect ran without its idempotency key"))
}

fn found(reference: Option<String>) -> Reconciled<String> {
    reference.map_or(Reconciled::NotFound, Reconciled::Committed)
}

/// The workflow.
#[workflow]
pub async fn rebook_shipment(
    ctx: WorkflowContext,
    request: ShipmentRequest,
) -> Result<ShipmentOutcome, WorkflowError> {
    let models = &request.models;
    let intent = classify(&ctx, models, &request.message).await?;
    if intent.intent != INTENT {
        return Ok(ShipmentOutcome::NotHandled {
            intent: intent.intent,
        });
    }
    let order = ctx.activity(load_order, intent.order_id).await?;
    let order = ctx.artifact_with(order, ArtifactMeta::new("order_snapshot"))?;
    let query = format!(
        "rebooking policy for late orders with {}",
        order.value().carrier
    );
    let policy = ctx.retrieve(search_policy, query).await?;
    let plan = draft_plan(&ctx, models, order.value(), policy.value()).await?;
    let meta = ArtifactMeta::new("action_plan")
        .with("order", &order.hash())
        .with("policy", &policy.hash());
    let plan = ctx.artifact_with(plan, meta)?;
    let approval = match needs_approval(order.value(), plan.value()) {
        false => None,
        true => match ask_approval(&ctx, order.value(), &plan, &policy).await? {
            Some(approval) => Some(approval),
            None => return Ok(ShipmentOutcome::NotApproved { plan: plan.hash() }),
        },
    };
    execute(&ctx, models, order.value(), &plan, approval.as_ref()).await
}

async fn classify(
    ctx: &WorkflowContext,
    models: &Models,
    message: &str,
) -> Result<Intent, WorkflowError> {
    let request = Llm::new(&models.classifier)
        .prompt("classify", "v1")
        .json::<Intent>()
        .system(model::CLASSIFY_PROMPT)
        .user(message);
    let answer = ctx
        .llm(request)
        .validate(Validator::json::<Intent>())
        .repair(1)
        .await?;
    parse(&answer.response.text)
}

async fn draft_plan(
    ctx: &WorkflowContext,
    models: &Models,
    order: &Order,
    policy: &Retrieval,
) -> Result<ActionPlan, WorkflowError> {
    let policy_text: Vec<&str> = policy.documents.iter().map(|d| d.text.as_str()).collect();
    let approved = approved_carriers(&policy_text.join(" "));
    let promised = order.promised_days;
    let request = Llm::new(&models.planner)
        .prompt("plan", "v3")
        .json::<ActionPlan>()
        .system(model::PLAN_PROMPT)
        .user(model::plan_request(order, &policy_text));
    let follows_policy = move |answer: &waymark::llm::LlmResponse| {
        let plan: ActionPlan = serde_json::from_str(&answer.text).map_err(|e| e.to_string())?;
        check_plan(&plan, &approved, promised)
    };
    let answer = ctx
        .llm(request)
        .validate(Validator::json::<ActionPlan>())
        .validate(Validator::rule("policy", follows_policy))
        .repair(2)
        .fallback(&models.fallback)
        .await?;
    parse(&answer.response.text)
}

/// The carriers the policy names as approved for rebooking.
fn approved_carriers(policy: &str) -> Vec<String> {
    let Some((_, list)) = policy.split_once("Approved carriers for rebooking:") else {
        return Vec::new();
    };
    let list = list.split('.').next().unwrap_or_default();
    list.split(',').map(|c| c.trim().to_owned()).collect()
}

fn check_plan(plan: &ActionPlan, approved: &[String], promised: u32) -> Result<(), String> {
    if !approved.contains(&plan.carrier) {
        return Err(format!(
            "carrier `{}` is not approved for rebooking (approved: {})",
            plan.carrier,
            approved.join(", ")
        ));
    }
    if plan.new_eta_days > promised {
        return Err(format!(
            "the new ETA of {} days misses the promised {promised}",
            plan.new_eta_days
        ));
    }
    Ok(())
}

fn needs_approval(order: &Order, plan: &ActionPlan) -> bool {
    plan.carrier != order.carrier || plan.cost_cents > APPROVAL_ABOVE_CENTS
}

/// Asks a person to approve the plan, resting on the policy it was drafted from, and the two
/// effects it decides: the rebooking and the customer's new ETA. The warehouse notice carries
/// the booking reference, known only once the rebooking ran, so it follows the approved
/// rebooking rather than being approved in advance.
async fn ask_approval(
    ctx: &WorkflowContext,
    order: &Order,
    plan: &Artifact<ActionPlan>,
    policy: &Artifact<Retrieval>,
) -> Result<Option<Approval>, WorkflowError> {
    let steps = plan.value();
    let id = order.order_id.clone();
    let rebooking = ctx.intent(rebook_carrier, (id.clone(), steps.carrier.clone()))?;
    let eta_update = ctx.intent(update_customer_eta, (id, steps.new_eta_days))?;
    let risk = serde_json::json!({
        "why": "the plan changes the carrier and spends money",
        "carrier": steps.carrier,
        "cost_cents": steps.cost_cents,
    });
    let request = ctx
        .approval(plan)
        .evidence(policy)
        .authorises(&rebooking)
        .authorises(&eta_update)
        .risk(risk)
        .expires_in(Duration::from_secs(24 * 3600));
    Ok(match request.await {
        ApprovalOutcome::Approved(approval) => Some(approval),
        _ => None,
    })
}

async fn execute(
    ctx: &WorkflowContext,
    models: &Models,
    order: &Order,
    plan: &Artifact<ActionPlan>,
    approval: Option<&Approval>,
) -> Result<ShipmentOutcome, WorkflowError> {
    let guard = |call: EffectCall<String>| match approval {
        Some(approval) => call.under(approval),
        None => call,
    };
    let id = order.order_id.clone();
    let steps = plan.value();
    let booking = guard(ctx.effect(rebook_carrier, (id.clone(), steps.carrier.clone()))).await?;
    let note = steps.warehouse_note.clone();
    let notice = ctx.effect(notify_warehouse, (id.clone(), booking.clone(), note));
    let notice = notice.await?;
    let eta_update = guard(ctx.effect(update_customer_eta, (id, steps.new_eta_days))).await?;
    let request = Llm::new(&models.writer)
        .prompt("customer_message", "v2")
        .system(model::MESSAGE_PROMPT)
        .user(model::message_request(order, steps, &booking))
        .streamed();
    let message = ctx.llm(request).await?.text;
    Ok(ShipmentOutcome::Rebooked {
        booking,
        notice,
        eta_update,
        message,
    })
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, WorkflowError> {
    serde_json::from_str(text).map_err(|e| WorkflowError::new(format!("unreadable answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_its_carriers_and_plans_are_checked_against_them() {
        let approved = approved_carriers("Approved carriers for rebooking: rapidpost, parcelco. X");
        assert_eq!(approved, ["rapidpost", "parcelco"]);
        let plan = ActionPlan {
            carrier: "cheapship".into(),
            new_eta_days: 3,
            warehouse_note: String::new(),
            cost_cents: 0,
        };
        assert!(check_plan(&plan, &approved, 4)
            .unwrap_err()
            .contains("not approved"));
        let plan = ActionPlan {
            carrier: "rapidpost".into(),
            ..plan
        };
        assert_eq!(check_plan(&plan, &approved, 4), Ok(()));
        assert!(check_plan(&plan, &approved, 2)
            .unwrap_err()
            .contains("misses"));
    }
}
