//! The assistant as an agent: instead of a hand-wired plan, the model chooses which tools to
//! call (load the order, read the policy, rebook, notify the warehouse, update the ETA) and
//! when it is done. The tools are the same activities and effects as the workflow's; a person
//! approves the exact rebooking the model chose before it runs.

use waymark::llm::Role;
use waymark::prelude::*;

use super::{
    load_order, notify_warehouse, rebook_carrier, search_policy, update_customer_eta, Models,
    ShipmentOutcome, ShipmentRequest,
};

/// What the agent is told to do.
pub const AGENT_PROMPT: &str = "You are an operations assistant for delayed shipments. Load \
    the order, read the rebooking policy, rebook it with a carrier the policy approves, tell \
    the warehouse, update the customer's ETA, then write the customer a short, warm message.";

/// The agent: its model, its tools, its bounds.
pub fn operations_agent(models: &Models) -> Agent {
    Agent::new(&models.planner)
        .system(AGENT_PROMPT)
        .tool(load_order)
        .tool(search_policy)
        .tool(rebook_carrier)
        .needs_approval()
        .tool(notify_warehouse)
        .tool(update_customer_eta)
        .budget(Budget::default().model_calls(8).tool_calls(12))
}

/// The workflow: one durable agent run.
#[workflow]
pub async fn rebook_by_agent(
    ctx: WorkflowContext,
    request: ShipmentRequest,
) -> Result<ShipmentOutcome, WorkflowError> {
    let agent = operations_agent(&request.models);
    let answer = ctx
        .agent(&agent, vec![Message::user(request.message.clone())])
        .await?;
    let result = |tool: &str| last_tool_result(&answer.transcript, tool).unwrap_or_default();
    Ok(ShipmentOutcome::Rebooked {
        booking: result("rebook_carrier"),
        notice: result("notify_warehouse"),
        eta_update: result("update_customer_eta"),
        message: answer.text,
    })
}

/// What the last call of `tool` in `messages` returned: a string as itself, anything else
/// as its JSON.
pub fn last_tool_result(messages: &[Message], tool: &str) -> Option<String> {
    let mut calls = messages.iter().flat_map(|m| &m.tool_calls);
    let call = calls.rfind(|c| c.name == tool)?;
    let result = messages
        .iter()
        .find(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call.id.as_str()))?;
    let value: serde_json::Value = serde_json::from_str(&result.content).ok()?;
    Some(
        value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned),
    )
}
