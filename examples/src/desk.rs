//! Support-desk workflows for the worker process: one waits for a person to confirm (a signal
//! sent over the API or with `waymark signal`), then records who confirmed what; another asks
//! a person to approve a refund (over the API, the web UI or `waymark approve`).

use serde::{Deserialize, Serialize};
use waymark::approvals::ApprovalOutcome;
use waymark::prelude::*;

/// What the confirming person sends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Confirmation {
    /// Who confirmed.
    pub by: String,
    /// What they decided.
    pub note: String,
}

/// Waits durably for the `confirm` signal; the workflow holds no memory while it waits and
/// survives worker restarts.
#[workflow]
pub async fn await_confirmation(
    ctx: WorkflowContext,
    ticket: String,
) -> Result<String, WorkflowError> {
    let confirmation: Confirmation = ctx.signal("confirm").await?;
    Ok(format!(
        "{ticket}: {} ({})",
        confirmation.note, confirmation.by
    ))
}

/// A refund a person is asked to approve.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refund {
    /// The ticket it settles.
    pub ticket: String,
    /// How much, in cents.
    pub amount_cents: u64,
}

/// Shows the refund to an approver and waits durably for the decision: says who approved it,
/// or why it was rejected.
#[workflow]
pub async fn approve_refund(ctx: WorkflowContext, refund: Refund) -> Result<String, WorkflowError> {
    let shown = ctx.artifact(&refund)?;
    Ok(match ctx.approval(&shown).await {
        ApprovalOutcome::Approved(approval) => {
            format!(
                "{}: refund approved ({})",
                refund.ticket,
                approval.approver()
            )
        }
        ApprovalOutcome::Rejected { approver, reason } => {
            format!("{}: refund rejected by {approver}: {reason}", refund.ticket)
        }
        ApprovalOutcome::Expired => format!("{}: nobody decided on the refund", refund.ticket),
    })
}
