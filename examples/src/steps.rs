//! A workflow of numbered steps that records every execution in a ledger file, so a test can
//! count how often each step really ran across crashes.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use waymark::prelude::*;

use crate::lines::append_line;

/// Where steps record their executions, and how long each takes.
#[derive(Debug, Clone)]
pub struct StepConfig {
    /// Ledger file: one line per execution, `step <i>`.
    pub ledger: PathBuf,
    /// Simulated work per step.
    pub step_duration: Duration,
}

static CONFIG: OnceLock<StepConfig> = OnceLock::new();

/// Sets the process-wide step configuration (once).
pub fn configure(config: StepConfig) {
    let _ = CONFIG.set(config);
}

/// One step: works for a while, appends to the ledger (synced), returns `i * i`.
#[activity(max_attempts = 10, initial_backoff_ms = 10)]
pub async fn step(i: u64) -> Result<u64, ActivityError> {
    let config = CONFIG
        .get()
        .ok_or_else(|| ActivityError::terminal("steps::configure was not called"))?;
    tokio::time::sleep(config.step_duration).await;
    append_line(&config.ledger, &format!("step {i}"), "ledger")?;
    Ok(i * i)
}

/// Runs `count` steps in order and returns the sum of their results.
#[workflow]
pub async fn numbered_steps(ctx: WorkflowContext, count: u64) -> Result<u64, WorkflowError> {
    let mut sum = 0;
    for i in 0..count {
        sum += ctx.activity(step, i).await?;
    }
    Ok(sum)
}

/// Counts ledger lines per step.
pub fn ledger_counts(ledger: &std::path::Path, count: u64) -> Vec<u32> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    let mut counts = vec![0; count as usize];
    for line in text.lines() {
        let index = line
            .strip_prefix("step ")
            .and_then(|i| i.parse::<usize>().ok());
        if let Some(slot) = index.and_then(|i| counts.get_mut(i)) {
            *slot += 1;
        }
    }
    counts
}
