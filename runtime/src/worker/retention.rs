//! Deleting ended workflows: one on request ([`Worker::delete`]), and every one ended longer
//! ago than the retention period, swept page by page. On a store many workers share, each
//! sweeps; a workflow another worker deleted first is passed over.

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
        let id = workflow_id.to_owned();
        // An ended journal no longer changes: what it committed is read once, before the write.
        let journal = self.read(move |store| store.journal(&id)).await;
        let artifacts = committed_artifacts(&journal.map_err(Unreachable::Store)?);
        let deleted = self.store.delete_workflow(workflow_id, artifacts).await;
        match deleted {
            Ok(()) => {
                metrics::counter!("waymark_workflows_deleted_total").increment(1);
                self.forget_stuck(workflow_id);
                Ok(())
            }
            Err(StoreError::NotFound { .. }) => Err(unknown_workflow(workflow_id).into()),
            Err(StoreError::NotEnded { status, .. }) => Err(DeleteError::NotEnded {
                workflow_id: workflow_id.to_owned(),
                status: status.to_owned(),
            }),
            Err(error) => Err(Unreachable::Store(error).into()),
        }
    }

    /// Deletes the workflows that ended at or before `cutoff_ms`; how many it deleted.
    async fn delete_ended_before(&self, cutoff_ms: u64) -> Result<usize, StoreError> {
        let mut deleted = 0;
        loop {
            let page = self.read(move |s| s.ended_before(cutoff_ms, PAGE)).await?;
            let full = page.len() == PAGE;
            let before_page = deleted;
            for (_, workflow_id) in page {
                if self.is_stopping() {
                    return Ok(deleted);
                }
                match self.delete(&workflow_id).await {
                    Ok(()) => deleted += 1,
                    // Another worker sharing the store deleted it first.
                    Err(DeleteError::Unreachable(Unreachable::UnknownWorkflow(_))) => {}
                    Err(DeleteError::Unreachable(Unreachable::Store(error))) => return Err(error),
                    Err(error) => {
                        tracing::warn!(workflow_id, %error, "retention passed a workflow over")
                    }
                }
            }
            // A page passed over whole would be read again: the next sweep tries it.
            if !full || deleted == before_page {
                return Ok(deleted);
            }
        }
    }
}
