//! Runs that leave their workflow's journal: a reset and a continue-as-new keep the run they
//! end, whole and ended, as the workflow `ID#run-N`, before the journal is rewound.
//!
//! The kept run is written first and the rewind second, two writes: after a crash between
//! them the run is still the workflow's, and doing it again finds its copy already kept
//! (same entries) rather than keeping it twice.

use super::*;

use crate::journal::Forked;
use crate::store::committed_artifacts;

/// What marks a kept run's id: `ID#run-N`. Reserved: no workflow is started under such an id.
pub(crate) const KEPT_RUN_MARK: &str = "#run-";

/// How many numbers past the expected one a keep tries (numbers retention freed are not
/// reused: the search starts after the last run the journal names).
const KEPT_RUN_SEARCH: u64 = 1_000;

/// The workflow `id` is a kept run of, when it is one (`ID#run-N`).
pub(crate) fn kept_run_owner(id: &str) -> Option<&str> {
    let (owner, number) = id.rsplit_once(KEPT_RUN_MARK)?;
    let digits = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    (digits && !owner.is_empty()).then_some(owner)
}

/// The number of the run `workflow_id`'s journal says it continues from, 0 for its first.
fn last_kept_number(workflow_id: &str, journal: &[Entry]) -> u64 {
    let sources = journal.iter().rev().filter_map(|entry| match entry {
        Entry::Forked(forked) => Some(forked.source.as_str()),
        _ => None,
    });
    let kept = sources.filter_map(|source| {
        let (owner, number) = source.rsplit_once(KEPT_RUN_MARK)?;
        (owner == workflow_id).then(|| number.parse::<u64>().ok())?
    });
    kept.max().unwrap_or(0)
}

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

/// The `ID#run-N` to keep `journal` under: the first free number after the run the journal
/// continues from, or the one that holds `journal` already (a crash came between keeping it
/// and the rewind); `true` for the latter.
fn kept_run_id(
    store: &dyn Store,
    workflow_id: &str,
    journal: &[Entry],
) -> Result<(String, bool), StoreError> {
    let first = last_kept_number(workflow_id, journal) + 1;
    for run in first..first + KEPT_RUN_SEARCH {
        let candidate = format!("{workflow_id}{KEPT_RUN_MARK}{run}");
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
        reason: format!(
            "runs {first} to {} are all kept already",
            first + KEPT_RUN_SEARCH - 1
        ),
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

    #[test]
    fn only_an_id_ending_in_run_and_a_number_is_a_kept_run() {
        assert_eq!(kept_run_owner("order-7#run-12"), Some("order-7"));
        assert_eq!(kept_run_owner("a#run-1#run-2"), Some("a#run-1"));
        for id in ["order-7", "order-7#run-", "#run-3", "x#run-3a", "x#run3"] {
            assert_eq!(kept_run_owner(id), None, "{id}");
        }
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
