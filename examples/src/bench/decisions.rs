//! What listing the operations that await a decision costs beside a store's settled history:
//! the read each reconciliation sweep makes, and the operators' listing.

use std::path::Path;
use std::time::{Duration, Instant};

use waymark::prelude::*;
use waymark_runtime::journal::encode_record;
use waymark_runtime::operations::{idempotency_key, OperationRecord, OperationStatus};
use waymark_runtime::store::{Engine as _, RocksStore, Table, Write};
use waymark_runtime::worker::operations_awaiting_decision;

/// An effect whose downstream never says whether it took effect. It has no reconciler, so its
/// operation waits for an operator.
#[activity(effect)]
pub async fn unanswered_effect(#[key] i: u64) -> Result<u64, ActivityError> {
    Err(ActivityError::uncertain(format!("no answer about {i}")))
}

/// One [`unanswered_effect`]: the run then waits for an operator's decision.
#[workflow]
pub async fn awaits_operator(ctx: WorkflowContext, i: u64) -> Result<u64, WorkflowError> {
    Ok(ctx.effect(unanswered_effect, i).await?)
}

/// The median seconds one listing of the operations awaiting a decision took, on a store
/// holding only those and on one holding settled operations besides them, timed in turn: just
/// after the settled ones were written, and once both stores were compacted.
pub struct DecisionListingCosts {
    /// Just written: the deletions of the settled operations' index rows are in RocksDB's
    /// memtable, where a read of the index steps over each. The bare store, then that one.
    pub fresh_s: [f64; 2],
    /// Both stores compacted: the deletions are gone.
    pub compacted_s: [f64; 2],
}

/// Leaves `awaiting` operations awaiting an operator in each of `bare` and `with_history`,
/// writes `settled` committed operations into `with_history`, then times `listings` listings
/// of each store, in turn, as the reconciliation sweep reads them
/// ([`waymark_runtime::worker::operations_awaiting_decision`]); then compacts both stores and
/// times them again.
pub async fn decision_listing_costs(
    bare: &Path,
    with_history: &Path,
    awaiting: u64,
    settled: usize,
    listings: usize,
) -> anyhow::Result<DecisionListingCosts> {
    for dir in [bare, with_history] {
        leave_awaiting(dir, awaiting).await?;
    }
    let template = committed_effect(with_history).await?;
    let stores = [RocksStore::open(bare)?, RocksStore::open(with_history)?];
    // What each worker's close flushed is compacted first, not on a thread of RocksDB's own
    // while the listings are timed (a larger file for the store with the template's effect).
    for store in &stores {
        store.engine().inner().compact()?;
    }
    add_settled_operations(&stores[1], &template, settled)?;
    let fresh_s = listing_seconds(&stores, awaiting, listings)?;
    for store in &stores {
        store.engine().inner().compact()?;
    }
    let compacted_s = listing_seconds(&stores, awaiting, listings)?;
    Ok(DecisionListingCosts {
        fresh_s,
        compacted_s,
    })
}

/// The median seconds of `listings` listings of each of `stores`, in turn.
fn listing_seconds(
    stores: &[RocksStore; 2],
    awaiting: u64,
    listings: usize,
) -> anyhow::Result<[f64; 2]> {
    let mut seconds = [Vec::new(), Vec::new()];
    for _ in 0..listings {
        for (store, seconds) in stores.iter().zip(&mut seconds) {
            let started = Instant::now();
            let listed = operations_awaiting_decision(store, None)?;
            seconds.push(started.elapsed().as_secs_f64());
            anyhow::ensure!(
                listed.len() as u64 == awaiting,
                "{} operations listed as awaiting a decision, not {awaiting}",
                listed.len()
            );
        }
    }
    Ok(seconds.map(super::median))
}

/// Starts `count` [`awaits_operator`] runs on `dir` and waits until each waits for an operator.
async fn leave_awaiting(dir: &Path, count: u64) -> anyhow::Result<()> {
    let worker = super::worker(dir).await?;
    for i in 0..count {
        let start = super::with_id(format!("awaits-operator-{i}"));
        worker.start_with(awaits_operator, i, start).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while (worker.operations_awaiting_decision(None)?.len() as u64) < count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the effects never awaited an operator"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    worker.shutdown().await;
    Ok(())
}

/// Writes `count` committed operations into `store`, each the record `template` is under a
/// key and workflow of its own, as the store writes an effect's: the record `prepared` with
/// its index row, then committed with the index row's deletion, 256 effects a batch (a group
/// commit's worth), straight through the store's engine.
fn add_settled_operations(
    store: &RocksStore,
    template: &OperationRecord,
    count: usize,
) -> anyhow::Result<()> {
    let engine = store.engine().inner();
    let ids: Vec<usize> = (0..count).collect();
    for group in ids.chunks(256) {
        let (mut prepared, mut committed) = (Vec::new(), Vec::new());
        for i in group {
            let record = OperationRecord {
                workflow_id: format!("settled-{i}"),
                ..template.clone()
            };
            let key = idempotency_key(&record.workflow_id, &record.operation, &record.arguments, 1);
            let key = key.into_bytes();
            let before = OperationRecord {
                status: OperationStatus::Prepared,
                ..record.clone()
            };
            prepared.push(Write::Put(
                Table::Operations,
                key.clone(),
                encode_record(&before),
            ));
            prepared.push(Write::Put(Table::Unsettled, key.clone(), Vec::new()));
            committed.push(Write::Put(
                Table::Operations,
                key.clone(),
                encode_record(&record),
            ));
            committed.push(Write::Delete(Table::Unsettled, key));
        }
        engine.write(prepared, false)?;
        engine.write(committed, false)?;
    }
    engine.write(Vec::new(), true)?;
    Ok(())
}

/// The operation record of one [`super::noop_effect`] committed on a worker on `dir`.
async fn committed_effect(dir: &Path) -> anyhow::Result<OperationRecord> {
    let worker = super::worker(dir).await?;
    let start = super::with_id("committed-effect".into());
    worker
        .start_with(super::effects, 1, start)
        .await?
        .result()
        .await?;
    let mut operations = worker.operations("committed-effect")?;
    worker.shutdown().await;
    let (_, record) = operations
        .pop()
        .ok_or_else(|| anyhow::anyhow!("the effect left no operation"))?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_runtime::store::Store as _;

    /// The listing is timed on the stores the figure names: the operations awaiting a
    /// decision on both, the settled ones beside them on one, their index rows deleted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_stores_await_the_same_decisions_and_one_holds_settled_operations_too() {
        let root = tempfile::tempdir().unwrap();
        let (bare, with_history) = (root.path().join("bare"), root.path().join("history"));
        let costs = decision_listing_costs(&bare, &with_history, 3, 100, 1)
            .await
            .unwrap();
        let timed = costs.fresh_s.iter().chain(&costs.compacted_s);
        assert!(timed.into_iter().all(|s| *s > 0.0));
        let store = RocksStore::open(&with_history).unwrap();
        // The template's own effect is among the settled ones.
        assert_eq!(store.operations("").unwrap().len(), 3 + 100 + 1);
        assert_eq!(store.unsettled_operations("").unwrap().len(), 3);
    }
}
