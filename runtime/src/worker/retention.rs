//! Deleting ended workflows: one on request ([`Worker::delete`]), and every one ended longer
//! ago than the retention period, swept page by page. On a store many workers share, each
//! sweeps; a workflow another worker deleted first is passed over. One that holds an operation
//! nobody has settled is kept, and said so at every sweep, until someone decides it.

use super::*;

use super::commands::unknown_workflow;
use crate::store::committed_artifacts;

/// Ended workflows read, and deleted, per page of a sweep.
const PAGE: usize = 256;

/// Sweeps every tenth of `retention` (between a second and a minute), deleting what ended
/// more than `retention` ago.
pub(super) async fn run_retention(shared: Weak<WorkerState>, retention: Duration) {
    let every = (retention / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    let every_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
    loop {
        let Some(clock) = shared.upgrade().map(|s| s.clock.clone()) else {
            return;
        };
        clock
            .sleep_until(clock.now_ms().saturating_add(every_ms))
            .await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let cutoff_ms = shared.clock.now_ms().saturating_sub(retention_ms);
        match shared.delete_ended_before(cutoff_ms).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "retention deleted ended workflows"),
            Err(error) => {
                tracing::warn!(%error, "the retention sweep stopped; it goes on at the next")
            }
        }
    }
}

impl WorkerState {
    pub(super) async fn delete(&self, workflow_id: &str) -> Result<(), DeleteError> {
        let record = self.workflow_record(workflow_id).await?;
        let record = record.ok_or_else(|| unknown_workflow(workflow_id))?;
        if !record.status.is_terminal() {
            return Err(DeleteError::NotEnded {
                workflow_id: workflow_id.to_owned(),
                status: record.status.name().to_owned(),
            });
        }
        // It has ended: its journal no longer changes, so what it committed is read once.
        let id = workflow_id.to_owned();
        let journal = self.read(move |store| store.journal(&id)).await;
        let artifacts = committed_artifacts(&journal.map_err(Unreachable::Store)?);
        let deleted = self.store.delete_workflow(workflow_id, artifacts).await;
        match deleted {
            Ok(()) => {
                self.telemetry.count(names::WORKFLOWS_DELETED);
                self.forget_stuck(workflow_id);
                Ok(())
            }
            // Deleted meanwhile (by retention, another caller, or another worker).
            Err(StoreError::NotFound { .. } | StoreError::Conflict { .. }) => {
                Err(unknown_workflow(workflow_id).into())
            }
            Err(StoreError::NotEnded { status, .. }) => Err(DeleteError::NotEnded {
                workflow_id: workflow_id.to_owned(),
                status: status.to_owned(),
            }),
            Err(StoreError::Unsettled { workflow_id, keys }) => {
                Err(DeleteError::Unsettled { workflow_id, keys })
            }
            Err(error) => Err(Unreachable::Store(error).into()),
        }
    }

    /// Deletes the workflows that ended at or before `cutoff_ms`; how many it deleted. One it
    /// cannot delete (its journal unreadable, say) is passed over, said so, and the sweep goes
    /// on past it: the next sweep tries it again.
    async fn delete_ended_before(&self, cutoff_ms: u64) -> Result<usize, StoreError> {
        let mut deleted = 0;
        let mut after: Option<(u64, String)> = None;
        loop {
            let from = after.clone();
            let page = self
                .read(move |s| s.ended_before(cutoff_ms, from.as_ref(), PAGE))
                .await?;
            let full = page.len() == PAGE;
            for (at, workflow_id) in page {
                if self.is_stopping() {
                    return Ok(deleted);
                }
                match self.delete(&workflow_id).await {
                    Ok(()) => deleted += 1,
                    // Another worker sharing the store deleted it first.
                    Err(DeleteError::Unreachable(Unreachable::UnknownWorkflow(_))) => {}
                    Err(error) => {
                        tracing::warn!(workflow_id, %error, "retention passed a workflow over")
                    }
                }
                after = Some((at, workflow_id));
            }
            if !full {
                return Ok(deleted);
            }
        }
    }
}
