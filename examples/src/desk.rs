//! A support-desk workflow for the worker process: it waits for a person to confirm (a signal
//! sent over the API or with `waymark signal`), then records who confirmed what.

use serde::{Deserialize, Serialize};
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
