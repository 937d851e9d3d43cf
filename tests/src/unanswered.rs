//! The plainest operation awaiting a decision: an effect whose call never answers and that has
//! no reconciler, so its workflow waits for an operator.

use waymark::prelude::*;

/// Never answers: without a reconciler, its call waits for an operator.
#[activity(effect)]
pub async fn unanswered(#[key] order_id: String) -> Result<String, ActivityError> {
    Err(ActivityError::uncertain(format!(
        "no answer about {order_id}"
    )))
}

/// One call of [`unanswered`].
#[workflow]
pub async fn notice(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(unanswered, order_id).await?)
}
