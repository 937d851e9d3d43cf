//! A workflow built to be killed: each iteration reads, then performs an effect whose
//! "downstream" is a log file. The effect appends `write <i>` and then lingers before
//! returning, which leaves a window in which a kill finds the write done but not committed: the
//! case reconciliation exists for. Its reconciler looks for the line.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use waymark::prelude::*;

use crate::lines::append_line;
pub use crate::lines::read_lines;

/// Where the steps write, and how long each takes.
#[derive(Debug, Clone)]
pub struct CrashloopConfig {
    /// The log file: `read <i>` per read, `write <i>` per effect applied.
    pub log: PathBuf,
    /// Simulated work per step.
    pub step_delay: Duration,
}

static CONFIG: OnceLock<CrashloopConfig> = OnceLock::new();

/// Sets the process-wide configuration (once).
pub fn configure(config: CrashloopConfig) {
    let _ = CONFIG.set(config);
}

fn config() -> Result<&'static CrashloopConfig, ActivityError> {
    CONFIG
        .get()
        .ok_or_else(|| ActivityError::terminal("crashloop::configure was not called"))
}

/// A read: may run again after a kill (its result was not journaled yet), which is harmless.
#[activity(max_attempts = 10, initial_backoff_ms = 10)]
pub async fn read_step(i: u64) -> Result<u64, ActivityError> {
    let config = config()?;
    tokio::time::sleep(config.step_delay).await;
    append_line(&config.log, &format!("read {i}"), "log")?;
    Ok(i)
}

/// The effect: appends `write <i>` once per key, whatever kills happen.
#[activity(effect, reconcile = find_write, max_attempts = 10, initial_backoff_ms = 10)]
pub async fn write_step(#[key] i: u64) -> Result<u64, ActivityError> {
    let config = config()?;
    tokio::time::sleep(config.step_delay / 2).await;
    append_line(&config.log, &format!("write {i}"), "log")?;
    // The window between the downstream's write and the journal's commit.
    tokio::time::sleep(config.step_delay * 2).await;
    Ok(i)
}

/// Reconciler of [`write_step`]: the effect happened iff its line is in the log.
pub async fn find_write(_cx: ActivityContext, i: u64) -> Result<Reconciled<u64>, ActivityError> {
    let config = config()?;
    let wanted = format!("write {i}");
    let found = read_lines(&config.log).contains(&wanted);
    Ok(if found {
        Reconciled::Committed(i)
    } else {
        Reconciled::NotFound
    })
}

/// Runs `steps` iterations of read-then-write and returns how many ran.
#[workflow]
pub async fn crashloop(ctx: WorkflowContext, steps: u64) -> Result<u64, WorkflowError> {
    for i in 0..steps {
        let read = ctx.activity(read_step, i).await?;
        ctx.effect(write_step, read).await?;
    }
    Ok(steps)
}
