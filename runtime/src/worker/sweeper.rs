//! The reconciliation sweeper: an operation parked for an operator because its reconciler could
//! not tell is asked again, with a growing pause, whether or not its workflow is in memory; an
//! answer settles it as the reconciler's (a committed result, or not found: the next attempt
//! runs), and the workflow goes on. A downstream that was down when the effect ran is found
//! out without an operator. An operation an earlier run of the workflow left (it continued as
//! new, or was reset) has its record settled alone, unless a command of the current run took
//! it over, which then gets the answer.
//!
//! Every operation a person could decide about is swept ([`decisions_awaited`]), whatever its
//! workflow's status: one an earlier run left while its workflow waits for something else, one
//! a workflow left when it ended or was cancelled, one a reset discarded. Not an
//! `unknown_outcome` a command of its run holds: that run rechecks it itself. Only effects with
//! a reconciler get an answer; the others wait for a person. An operation is asked about once
//! it has stood still for a sweep interval (its record, and the run that left it behind), since
//! a call cut off moments ago may still be on its way to the downstream. Finding them reads,
//! once a sweep, as the operators' listing does, the row of each unsettled operation (through
//! their index, never a settled one's), the journal of each workflow with a `prepared` or
//! `unknown_outcome` one, and that of each operation asked about.
//!
//! On a store many workers share, each sweeps its share of the operations: each key goes to
//! the live worker that ranks highest for it ([`Share`]). A reconciler is asked once a pass,
//! not once per worker; a worker that stops leaves its share to the others once its
//! registration is gone, and only its share moves. Every worker is assumed to run the same
//! code (the same reconcilers) with the same sweep interval.
//!
//! The pause is kept in memory: a restarted worker sweeps each parked operation once soon, then
//! backs off again.

use super::*;

use super::commands::{decisions_awaited, DecisionAwaited};
use crate::journal::Seq;
use crate::lineage::Lineage;
use crate::registry::{ActivityInfo, ArtifactReader, ReconcileOutcome};
use crate::streams::{StepStream, VersionSlot};
use crate::telemetry::ReplayMode;

/// How long one reconciler call of a sweep may take.
const SWEEP_CALL_TIMEOUT_MS: u64 = 30_000;

/// The pause after `checks` sweeps that could not tell: `interval` doubled each time, at most
/// 64 times it.
fn pause_ms(interval_ms: u64, checks: u32) -> u64 {
    interval_ms.saturating_mul(1 << checks.min(6))
}

/// When each parked operation is due again, and how many sweeps could not tell it.
#[derive(Default)]
struct Schedule {
    due: HashMap<String, (u32, u64)>,
}

impl Schedule {
    fn is_due(&self, key: &str, now_ms: u64) -> bool {
        self.due.get(key).is_none_or(|(_, at)| *at <= now_ms)
    }

    fn could_not_tell(&mut self, key: &str, now_ms: u64, interval_ms: u64) {
        let checks = self.due.get(key).map_or(0, |(checks, _)| *checks);
        let next = now_ms.saturating_add(pause_ms(interval_ms, checks + 1));
        self.due.insert(key.to_owned(), (checks + 1, next));
    }

    /// Forgets what is no longer parked.
    fn keep_only(&mut self, parked: &BTreeSet<String>) {
        self.due.retain(|key, _| parked.contains(key));
    }
}

/// Sweeps every `interval_ms` on the worker's clock, from `start_ms` (when the worker started),
/// until the worker is gone.
pub(super) async fn run_sweeper(shared: Weak<WorkerState>, start_ms: u64, interval_ms: u64) {
    let mut schedule = Schedule::default();
    let mut next = start_ms.saturating_add(interval_ms);
    loop {
        let Some(clock) = shared.upgrade().map(|s| s.clock.clone()) else {
            return;
        };
        clock.sleep_until(next).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // Boxed: a pass awaits a decision's future (over 3 KiB), and passes are an interval apart.
        if let Err(error) = Box::pin(shared.sweep(&mut schedule, interval_ms)).await {
            tracing::warn!(%error, "the reconciliation sweep could not read the store");
        }
        next = clock.now_ms().saturating_add(interval_ms);
    }
}

/// A parked operation the sweep asks about.
struct Parked {
    key: String,
    /// The key the reconciler asks the downstream about (a fork's is its source's).
    business_key: String,
    record: OperationRecord,
}

impl WorkerState {
    async fn sweep(&self, schedule: &mut Schedule, interval_ms: u64) -> Result<(), StoreError> {
        let leases = self.leases.clone();
        let swept = self
            .read(move |store| {
                let share = Share::of(leases.as_deref())?;
                swept_operations(store, &share)
            })
            .await?;
        let keys: BTreeSet<String> = swept.iter().map(|awaited| awaited.key.clone()).collect();
        schedule.keep_only(&keys);
        let mut lineages = HashMap::new();
        for awaited in swept {
            let now_ms = self.clock.now_ms();
            // A call cut off moments ago may still be on its way to the downstream, which
            // could answer "not found" before it arrives.
            let stood_still = now_ms.saturating_sub(awaited.still_since_ms) >= interval_ms;
            if !stood_still || !schedule.is_due(&awaited.key, now_ms) {
                continue;
            }
            let DecisionAwaited { key, record, .. } = awaited;
            let Some(business_key) = self.business_key(&mut lineages, &key, &record).await else {
                continue;
            };
            let parked = Parked {
                key,
                business_key,
                record,
            };
            if !self.ask_and_settle(&parked).await {
                schedule.could_not_tell(&parked.key, now_ms, interval_ms);
            }
        }
        self.telemetry.swept();
        Ok(())
    }

    /// The key the reconciler asks the downstream about, from the workflow's lineage (read
    /// once a sweep); `None` (logged) when its journal does not read: one such workflow must
    /// not stop the sweep of every other.
    async fn business_key(
        &self,
        lineages: &mut HashMap<String, Lineage>,
        key: &str,
        record: &OperationRecord,
    ) -> Option<String> {
        let workflow_id = &record.workflow_id;
        if !lineages.contains_key(workflow_id) {
            let id = workflow_id.clone();
            match self.read(move |store| store.journal(&id)).await {
                Ok(journal) => {
                    lineages.insert(workflow_id.clone(), Lineage::of(&journal));
                }
                Err(error) => {
                    warn!(%key, %error, "an operation whose journal does not read is not swept");
                    return None;
                }
            }
        }
        let lineage = lineages.get(workflow_id)?;
        Some(lineage.business_key(workflow_id, &record.operation, key))
    }

    /// Asks the reconciler about `parked` and applies its answer; whether it had one.
    async fn ask_and_settle(&self, parked: &Parked) -> bool {
        let answer = self.ask_downstream(parked).await;
        self.telemetry.operation_swept(answer_name(answer.as_ref()));
        let decision = match answer {
            Some(ReconcileOutcome::Committed(result)) => OperatorDecision::Committed(result),
            Some(ReconcileOutcome::NotFound) => OperatorDecision::NotFound,
            Some(ReconcileOutcome::StillUnknown(_)) | None => return false,
        };
        self.settle_swept(parked, decision).await;
        true
    }

    /// The reconciler's answer; `None` when there is none (no reconciler, or one that failed,
    /// panicked or took too long).
    async fn ask_downstream(&self, parked: &Parked) -> Option<ReconcileOutcome> {
        let record = &parked.record;
        let registry = &self.registry;
        let effect = registry.activity(&record.operation)?.effect.as_ref()?;
        let info = self.sweep_info(&parked.business_key, record);
        // A reconciler that panics cannot tell; it must not end the sweep of every workflow.
        let reconcile =
            std::panic::AssertUnwindSafe(|| (effect.reconcile)(info, record.arguments.clone()));
        let asking = std::panic::catch_unwind(reconcile).ok()??;
        let asking = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(asking));
        let deadline = self.clock.now_ms().saturating_add(SWEEP_CALL_TIMEOUT_MS);
        let timeout = self.clock.sleep_until(deadline);
        match futures::future::select(asking, timeout).await {
            futures::future::Either::Left((Ok(answer), _)) => answer.ok(),
            futures::future::Either::Left((Err(_), _)) | futures::future::Either::Right(_) => None,
        }
    }

    /// What the reconciler is told: the parked attempt, under its key.
    fn sweep_info(&self, key: &str, record: &OperationRecord) -> ActivityInfo {
        let store = self.store.clone();
        let workflow_id: Arc<str> = record.workflow_id.as_str().into();
        let version = VersionSlot::default();
        ActivityInfo {
            workflow_id: workflow_id.clone(),
            activity_name: record.operation.clone(),
            seq: record.seq,
            attempt: record.attempt,
            replay_mode: ReplayMode::ResumeFromCheckpoint,
            idempotency_key: Some(key.to_owned()),
            external_ref: Default::default(),
            stream: StepStream::new(store.clone(), workflow_id.clone(), record.seq, version),
            artifacts: ArtifactReader::new(store, workflow_id),
            telemetry: self.telemetry.clone(),
            timed_out: Default::default(),
            interrupted: false,
            lineage: Default::default(),
        }
    }

    /// Applies the reconciler's answer to the call it was about: if the record moved on
    /// meanwhile (an operator or the downstream settled it, and maybe a later call of the key
    /// began at the same attempt number), the answer is refused and dropped.
    async fn settle_swept(&self, parked: &Parked, decision: OperatorDecision) {
        let Parked { key, record, .. } = parked;
        let on = record.as_read();
        let settled = self
            .resolve_operation(key, on, decision, ReconciledBy::Reconciler)
            .await;
        let seq: Seq = record.seq;
        match settled {
            Ok(()) => info!(workflow_id = %record.workflow_id, seq, %key,
                "the reconciliation sweep settled a parked operation"),
            Err(error) => info!(workflow_id = %record.workflow_id, seq, %key, %error,
                "the reconciliation sweep's answer was not applied"),
        }
    }
}

/// The operations of this worker's `share` a decision is taken about, but an
/// `unknown_outcome` a command of its run rechecks: that run asks the reconciler itself.
fn swept_operations(store: &dyn Store, share: &Share) -> Result<Vec<DecisionAwaited>, StoreError> {
    let mut awaited = decisions_awaited(store, None, &|key| share.takes(key))?;
    awaited.retain(|awaited| !awaited.run_acts_on_it);
    Ok(awaited)
}

/// Which operations a worker's sweep asks about.
#[derive(Debug, PartialEq, Eq)]
enum Share {
    /// Every one: the worker is alone on its store.
    All,
    /// Those of `me` among the `live` workers of a shared store: each key goes to the live
    /// worker that ranks highest for it (rendezvous hashing), so a worker that starts or stops
    /// moves only its own share, and the keys it takes or leaves are asked about at once by
    /// their new sweeper. Workers that read the list at different moments may overlap or leave
    /// a key out for a pass: an answer is applied only to the record it was about, and the
    /// next pass asks about what was left out.
    Part { me: String, live: Vec<String> },
    /// None: the worker's registration lapsed, and the others share the work.
    Nothing,
}

impl Share {
    fn of(leases: Option<&dyn crate::store::Leases>) -> Result<Self, StoreError> {
        let Some(leases) = leases else {
            return Ok(Share::All);
        };
        let live = leases.live_workers()?;
        let me = leases.worker_id().to_owned();
        Ok(match live.contains(&me) {
            true => Share::Part { me, live },
            false => Share::Nothing,
        })
    }

    fn takes(&self, key: &str) -> bool {
        match self {
            Share::All => true,
            Share::Part { me, live } => {
                let highest = live
                    .iter()
                    .max_by_key(|worker| (rank(worker, key), *worker));
                highest == Some(me)
            }
            Share::Nothing => false,
        }
    }
}

/// How high `worker` ranks for `key`: the same in every worker, whatever its build.
fn rank(worker: &str, key: &str) -> u64 {
    let bytes = worker.bytes().chain([0]).chain(key.bytes());
    bytes.fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// How [`SWEPT_OPERATIONS`](crate::telemetry::names::SWEPT_OPERATIONS) labels an answer.
fn answer_name(answer: Option<&ReconcileOutcome>) -> &'static str {
    match answer {
        Some(ReconcileOutcome::Committed(_)) => "committed",
        Some(ReconcileOutcome::NotFound) => "not_found",
        Some(ReconcileOutcome::StillUnknown(_)) | None => "cannot_tell",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_workers_share_the_keys_out_without_overlap() {
        let keys: Vec<String> = (0..300)
            .map(|n| format!("wf-{n}|notify|[{n}]|v1"))
            .collect();
        let shares = |live: &[&str]| -> Vec<Share> {
            let live: Vec<String> = live.iter().map(|id| (*id).to_owned()).collect();
            let part = |me: &String| Share::Part {
                me: me.clone(),
                live: live.clone(),
            };
            live.iter().map(part).collect()
        };
        let three = shares(&["w-a", "w-b", "w-c"]);
        for key in &keys {
            let takers = three.iter().filter(|share| share.takes(key)).count();
            assert_eq!(takers, 1, "{key}");
        }
        let first = keys.iter().filter(|key| three[0].takes(key)).count();
        assert!((60..=140).contains(&first), "{first} of 300");
        // `w-c` stops: only its keys move, and they move to the two left.
        let two = shares(&["w-a", "w-b"]);
        for key in &keys {
            for (before, after) in three.iter().zip(&two) {
                assert!(!before.takes(key) || after.takes(key), "{key} moved");
            }
        }
        assert!(keys.iter().all(|key| Share::All.takes(key)));
        assert!(!keys.iter().any(|key| Share::Nothing.takes(key)));
        // Workers of every build must rank alike: FNV-1a 64 of "w-a", a zero byte, then "k".
        assert_eq!(rank("w-a", "k"), 0x7599_6b87_73fc_ceb1);
    }

    #[test]
    fn a_parked_operation_is_swept_at_once_then_less_and_less_often() {
        let mut schedule = Schedule::default();
        assert!(schedule.is_due("k", 0));
        schedule.could_not_tell("k", 0, 1_000);
        assert!(!schedule.is_due("k", 1_999));
        assert!(schedule.is_due("k", 2_000));
        schedule.could_not_tell("k", 2_000, 1_000);
        assert!(!schedule.is_due("k", 5_999));
        assert!(schedule.is_due("k", 6_000));
        assert_eq!(pause_ms(1_000, 40), 64_000, "bounded");
        schedule.keep_only(&BTreeSet::new());
        assert!(schedule.is_due("k", 0), "settled keys are forgotten");
    }
}
