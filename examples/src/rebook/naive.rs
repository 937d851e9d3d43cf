//! The same assistant without Waymark: a plain async function that, when anything fails, runs
//! again from the top. Nothing is journaled, so every retry repeats the model calls and the
//! actions already taken, and the systems are called without idempotency keys, the way code
//! that has no operation log calls them.

use waymark::llm::{Llm, LlmError, LlmProvider, Message};

use super::agent::{operations_agent, AGENT_PROMPT};

use super::model::{self, scripted_models};
use super::systems::{systems, Applications};
use super::{approved_carriers, check_plan, ActionPlan, Intent};

/// What the naive loop did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaiveReport {
    /// Runs from the top.
    pub runs: u32,
    /// Model calls made.
    pub model_calls: u32,
    /// What the systems applied for the order.
    pub applications: Applications,
    /// The message the customer got, if a run finished.
    pub message: Option<String>,
}

struct Run<'a> {
    provider: &'a dyn LlmProvider,
    model_calls: u32,
}

impl Run<'_> {
    async fn ask(&mut self, request: Llm) -> Result<String, LlmError> {
        self.model_calls += 1;
        let request = request.request().clone();
        let completion = match request.stream {
            true => {
                self.provider
                    .stream(request, Box::new(|_: &str| {}))
                    .await?
            }
            false => self.provider.complete(request).await?,
        };
        Ok(completion.text)
    }

    async fn once(&mut self, message: &str) -> Result<String, String> {
        let models = scripted_models();
        let classify = Llm::new(&models.classifier)
            .prompt("classify", "v1")
            .user(message);
        let intent: Intent = parse(&self.ask(classify).await.map_err(|e| e.to_string())?)?;
        let order = systems().order(&intent.order_id);
        let policy = "Approved carriers for rebooking: rapidpost, parcelco.";
        let request = Llm::new(&models.planner)
            .prompt("plan", "v3")
            .system(model::PLAN_PROMPT)
            .user(model::plan_request(&order, &[policy]));
        let answer = self.ask(request.clone()).await.map_err(|e| e.to_string())?;
        let mut plan: ActionPlan = parse(&answer)?;
        if let Err(reason) = check_plan(&plan, &approved_carriers(policy), order.promised_days) {
            let repair = request
                .assistant(answer)
                .user(format!("Fix this: {reason}"));
            plan = parse(&self.ask(repair).await.map_err(|e| e.to_string())?)?;
        }
        let id = &order.order_id;
        let booking = systems().rebook(None, id, &plan.carrier);
        systems().notify_warehouse(None, id, &plan.warehouse_note);
        systems().update_eta(None, id, plan.new_eta_days);
        let write = Llm::new(&models.writer)
            .prompt("customer_message", "v2")
            .user(model::message_request(&order, &plan, &booking))
            .streamed();
        self.ask(write).await.map_err(|e| e.to_string())
    }
}

fn parse<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// Handles `message` about `order_id`, retrying from the top up to `max_runs` times.
pub async fn retry_from_the_top(
    provider: &dyn LlmProvider,
    message: &str,
    order_id: &str,
    max_runs: u32,
) -> NaiveReport {
    let mut run = Run {
        provider,
        model_calls: 0,
    };
    let mut runs = 0;
    let mut answer = None;
    while runs < max_runs && answer.is_none() {
        runs += 1;
        answer = run.once(message).await.ok();
    }
    NaiveReport {
        runs,
        model_calls: run.model_calls,
        applications: systems().applications(order_id),
        message: answer,
    }
}

/// The agent without Waymark: the loop of model calls and tool calls kept in memory, the
/// tools called without idempotency keys. When anything fails it runs again from the top, and
/// the model, asked again, decides again to call every tool.
pub async fn agent_retry_from_the_top(
    provider: &dyn LlmProvider,
    message: &str,
    order_id: &str,
    max_runs: u32,
) -> NaiveReport {
    let mut model_calls = 0;
    let mut runs = 0;
    let mut answer = None;
    while runs < max_runs && answer.is_none() {
        runs += 1;
        answer = agent_once(provider, message, &mut model_calls).await.ok();
    }
    NaiveReport {
        runs,
        model_calls,
        applications: systems().applications(order_id),
        message: answer,
    }
}

async fn agent_once(
    provider: &dyn LlmProvider,
    message: &str,
    model_calls: &mut u32,
) -> Result<String, String> {
    let agent = operations_agent(&scripted_models());
    let mut messages = vec![Message::system(AGENT_PROMPT), Message::user(message)];
    for _turn in 0..8 {
        *model_calls += 1;
        let request = agent
            .tool_specs()
            .into_iter()
            .fold(Llm::new(&scripted_models().planner), Llm::tool)
            .messages(messages.clone());
        let completion = provider.complete(request.request().clone()).await;
        let completion = completion.map_err(|e| e.to_string())?;
        messages.push(Message::assistant(
            completion.text.clone(),
            completion.tool_calls.clone(),
        ));
        if completion.tool_calls.is_empty() {
            return Ok(completion.text);
        }
        for call in &completion.tool_calls {
            let result = call_without_key(&call.name, &call.arguments)?;
            messages.push(Message::tool_result(&call.id, result));
        }
    }
    Err("the agent did not finish".into())
}

/// Calls a tool the way code without an operation log does: straight at the system, no key.
fn call_without_key(tool: &str, arguments: &str) -> Result<String, String> {
    let arguments: serde_json::Value =
        serde_json::from_str(arguments).map_err(|e| e.to_string())?;
    let text = |name: &str| arguments[name].as_str().unwrap_or_default().to_owned();
    let order = text("order_id");
    let result = match tool {
        "load_order" => serde_json::to_value(systems().order(&order)).map_err(|e| e.to_string())?,
        "search_policy" => "Approved carriers for rebooking: rapidpost, parcelco.".into(),
        "rebook_carrier" => systems().rebook(None, &order, &text("carrier")).into(),
        "notify_warehouse" => systems()
            .notify_warehouse(None, &order, &text("note"))
            .into(),
        "update_customer_eta" => {
            let days = arguments["eta_days"].as_u64().unwrap_or_default();
            let days = u32::try_from(days).map_err(|e| e.to_string())?;
            systems().update_eta(None, &order, days).into()
        }
        other => return Err(format!("no tool `{other}`")),
    };
    Ok(serde_json::Value::to_string(&result))
}
