//! What listing the operations that await a decision costs beside a store's settled history:
//! the read each reconciliation sweep makes, and the operators' listing.

use std::path::Path;
use std::time::{Duration, Instant};

use waymark::prelude::*;
use waymark_runtime::journal::encode_record;
use waymark_runtime::operations::{idempotency_key, OperationRecord};
use waymark_runtime::store::{Engine as _, RocksStore, Table, Write};

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
/// holding only those, and on one holding as many besides them settled.
pub struct DecisionListingCosts {
    /// No settled operation beside them.
    pub none_s: f64,
    /// The settled operations beside them.
    pub settled_s: f64,
}

/// Leaves `awaiting` operations awaiting an operator in each of `bare` and `with_history`, adds
/// `settled` committed operations to `with_history`, then times `listings` listings of each
/// store, in turn, on a worker each.
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
    add_settled_operations(with_history, settled).await?;
    // Compacted, as a store that has served a while is: each worker's open would otherwise
    // compact what the last close flushed, a larger file for the store with history, on a
    // thread of its own while the listings are timed.
    for dir in [bare, with_history] {
        RocksStore::open(dir)?.engine().inner().compact()?;
    }
    let workers = [
        super::worker(bare).await?,
        super::worker(with_history).await?,
    ];
    let mut seconds = [Vec::new(), Vec::new()];
    for _ in 0..listings {
        for (worker, seconds) in workers.iter().zip(&mut seconds) {
            let started = Instant::now();
            let listed = worker.operations_awaiting_decision(None)?;
            seconds.push(started.elapsed().as_secs_f64());
            anyhow::ensure!(
                listed.len() as u64 == awaiting,
                "{} operations listed as awaiting a decision, not {awaiting}",
                listed.len()
            );
        }
    }
    for worker in workers {
        worker.shutdown().await;
    }
    let [none_s, settled_s] = seconds.map(super::median);
    Ok(DecisionListingCosts { none_s, settled_s })
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

/// Adds `count` committed operations to the store in `dir`, each the record a committed
/// [`super::noop_effect`] leaves under a key and workflow of its own, written in batches
/// straight through the store's engine, as a store that committed that many effects over
/// time holds them.
async fn add_settled_operations(dir: &Path, count: usize) -> anyhow::Result<()> {
    let template = committed_effect(dir).await?;
    let store = RocksStore::open(dir)?;
    let engine = store.engine().inner();
    let mut batch = Vec::new();
    for i in 0..count {
        let record = OperationRecord {
            workflow_id: format!("settled-{i}"),
            ..template.clone()
        };
        let key = idempotency_key(&record.workflow_id, &record.operation, &record.arguments, 1);
        batch.push(Write::Put(
            Table::Operations,
            key.into_bytes(),
            encode_record(&record),
        ));
        if batch.len() == 4_096 {
            engine.write(std::mem::take(&mut batch), false)?;
        }
    }
    engine.write(batch, true)?;
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
    /// decision on both, the settled ones beside them on one, unindexed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn both_stores_await_the_same_decisions_and_one_holds_settled_operations_too() {
        let root = tempfile::tempdir().unwrap();
        let (bare, with_history) = (root.path().join("bare"), root.path().join("history"));
        let costs = decision_listing_costs(&bare, &with_history, 3, 100, 1)
            .await
            .unwrap();
        assert!(costs.none_s > 0.0 && costs.settled_s > 0.0);
        let store = RocksStore::open(&with_history).unwrap();
        // The template's own effect is among the settled ones.
        assert_eq!(store.operations("").unwrap().len(), 3 + 100 + 1);
        assert_eq!(store.unsettled_operations("").unwrap().len(), 3);
    }
}
