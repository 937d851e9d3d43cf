//! Workflows for many workers on one database: each iteration calls a "downstream" (a file
//! per workflow) through an effect keyed by (workflow, iteration). The downstream logs every
//! call it gets, `call <i> <pid>`, and applies a key once, `write <i>`, as an API honouring
//! idempotency keys does: a worker that lost its lease mid-call (a zombie) may still reach it,
//! and the log tells such late calls from the effect itself.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::prelude::*;

use crate::lines::append_line;
pub use crate::lines::read_lines;

/// Where the downstream keeps its files, and how long a call takes.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// One file per workflow: `<dir>/<workflow index>`.
    pub dir: PathBuf,
    /// Simulated work per call.
    pub step_delay: Duration,
}

static CONFIG: OnceLock<FleetConfig> = OnceLock::new();

/// Sets the process-wide configuration (once).
pub fn configure(config: FleetConfig) {
    let _ = CONFIG.set(config);
}

fn config() -> Result<&'static FleetConfig, ActivityError> {
    CONFIG
        .get()
        .ok_or_else(|| ActivityError::terminal("fleet::configure was not called"))
}

/// One call's business intent: iteration `step` of workflow number `workflow`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct FleetStep {
    /// The workflow's number.
    pub workflow: u32,
    /// The iteration.
    pub step: u64,
}

/// The effect: the downstream applies each key once, whoever calls and however often.
#[activity(effect, reconcile = find_step, max_attempts = 20, initial_backoff_ms = 10)]
pub async fn fleet_step(#[key] call: FleetStep) -> Result<u64, ActivityError> {
    let config = config()?;
    tokio::time::sleep(config.step_delay / 2).await;
    let file = config.dir.join(call.workflow.to_string());
    let pid = std::process::id();
    append_line(&file, &format!("call {} {pid}", call.step), "downstream")?;
    if !read_lines(&file).contains(&format!("write {}", call.step)) {
        append_line(&file, &format!("write {}", call.step), "downstream")?;
    }
    // The window between the downstream's write and the journal's commit.
    tokio::time::sleep(config.step_delay / 2).await;
    Ok(call.step)
}

/// Reconciler of [`fleet_step`]: the effect happened iff its line is in the file.
pub async fn find_step(
    _cx: ActivityContext,
    call: FleetStep,
) -> Result<Reconciled<u64>, ActivityError> {
    let config = config()?;
    let file = config.dir.join(call.workflow.to_string());
    let found = read_lines(&file).contains(&format!("write {}", call.step));
    Ok(if found {
        Reconciled::Committed(call.step)
    } else {
        Reconciled::NotFound
    })
}

/// Runs `steps` effects for workflow number `workflow` and returns how many ran.
#[workflow]
pub async fn fleet(ctx: WorkflowContext, run: (u32, u64)) -> Result<u64, WorkflowError> {
    let (workflow, steps) = run;
    for step in 0..steps {
        ctx.effect(fleet_step, FleetStep { workflow, step }).await?;
    }
    Ok(steps)
}
