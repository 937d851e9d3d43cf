//! Runs that leave their workflow's journal: a reset and a continue-as-new keep the run they
//! end, whole and ended, as the workflow `ID#run-N`, before the journal is rewound.
//!
//! The kept run is written first and the rewind second, two writes: after a crash between
//! them the run is still the workflow's, and doing it again finds its copy already kept
//! (same entries) rather than keeping it twice.

use super::*;

use crate::journal::Forked;
use crate::store::committed_artifacts;

/// How many kept runs one workflow can have.
const MAX_KEPT_RUNS: u32 = 10_000;

/// Keeps `journal` (the whole run of `workflow_id`), ended by `end`, as `ID#run-N`; its id.
pub(crate) async fn keep_run<H: Host>(
    host: &H,
    workflow_id: &str,
    journal: Vec<Entry>,
    end: Entry,
) -> Result<String, StoreError> {
    let (id, wanted) = (workflow_id.to_owned(), journal.clone());
    let (kept_id, already) = host.read(move |s| kept_run_id(s, &id, &wanted)).await?;
    if already {
        return Ok(kept_id);
    }
    let (namespace, _) = crate::namespace::split(workflow_id);
    let namespace = namespace.to_owned();
    let hashes = committed_artifacts(&journal);
    let artifacts = host
        .read(move |store| {
            let read = hashes.into_iter().map(|hash| {
                let record = store.artifact(&namespace, &hash)?;
                Ok(record.map(|record| (hash, record)))
            });
            read.filter_map(Result::transpose).collect()
        })
        .await?;
    let mut entries = journal;
    entries.push(end);
    let mut transition = Transition::import(&kept_id, entries, host.clock().now_ms())?;
    // The workflow keeps its request id: the kept run neither claims nor frees it.
    transition.claim_request = None;
    transition.record.request_id = None;
    transition.artifacts = artifacts;
    host.store().commit(transition).await?;
    Ok(kept_id)
}

/// The first `ID#run-N` no workflow holds, or the one that holds `journal` already (a crash
/// came between keeping it and the rewind); `true` for the latter.
fn kept_run_id(
    store: &dyn Store,
    workflow_id: &str,
    journal: &[Entry],
) -> Result<(String, bool), StoreError> {
    for run in 1..=MAX_KEPT_RUNS {
        let candidate = format!("{workflow_id}#run-{run}");
        let Some(record) = store.workflow(&candidate)? else {
            return Ok((candidate, false));
        };
        if record.journal_len == journal.len() as u64 + 1 {
            let kept = store.journal_page(&candidate, 0, journal.len())?;
            if kept == journal {
                return Ok((candidate, true));
            }
        }
    }
    Err(StoreError::Conflict {
        workflow_id: workflow_id.to_owned(),
        reason: format!("it has {MAX_KEPT_RUNS} kept runs; delete some first"),
    })
}

/// The entry that starts a run from a kept one, keeping `at` of its entries: where it came
/// from, with the keys and models of the workflow's `lineage` so far.
pub(crate) fn continued_from(
    workflow_id: &str,
    kept_id: &str,
    at: u64,
    lineage: &Lineage,
    by: Option<String>,
    at_ms: u64,
) -> Entry {
    let (key_root, key_roots) = lineage.fork_roots(workflow_id, workflow_id, &[]);
    Entry::Forked(Forked {
        source: kept_id.to_owned(),
        at,
        key_root,
        key_roots,
        models: lineage.models().to_vec(),
        by,
        forked_at_ms: at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::WorkflowStarted;
    use crate::store::{MemoryEngine, MemoryStore};

    fn started(input: u64) -> Vec<Entry> {
        vec![Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: "wf".into(),
            input: Payload::from_u64(input),
            request_id: None,
            started_at_ms: 0,
        })]
    }

    /// The window between keeping a run and rewinding the journal: a crash there leaves the
    /// kept copy, and doing it again finds that copy instead of keeping the run twice.
    #[test]
    fn a_run_kept_before_a_crash_is_found_again_and_another_takes_the_next_number() {
        let store = MemoryStore::on(MemoryEngine::new()).unwrap();
        let journal = started(1);
        let first = kept_run_id(&store, "wf", &journal).unwrap();
        assert_eq!(first, ("wf#run-1".to_owned(), false));
        let mut kept = journal.clone();
        kept.push(Entry::WorkflowCompleted {
            output: Payload::from_u64(0),
        });
        let keep = Transition::import("wf#run-1", kept, 0).unwrap();
        futures::executor::block_on(store.commit(keep)).unwrap();

        let again = kept_run_id(&store, "wf", &journal).unwrap();
        assert_eq!(again, ("wf#run-1".to_owned(), true));
        let other = kept_run_id(&store, "wf", &started(2)).unwrap();
        assert_eq!(other, ("wf#run-2".to_owned(), false));
    }
}
