//! Resetting a stuck run in place: the workflow keeps its id and goes on as a new run from
//! one of its journal's entries, on the code deployed now; the run it leaves is kept, ended,
//! as a workflow of its own (`ID#run-N`), for the record.
//!
//! The new run's journal is the old one's first `at` entries and a `Forked` entry naming the
//! kept run. Its keys are the workflow's own, as before, and so is its operation log: an
//! effect the old run committed after `at` is answered from the log when the new run calls
//! it with the same intent, as any replayed effect would be. The old run is written first:
//! a crash between the two writes leaves the history kept and the run still stuck, and a
//! second reset keeps it again, under the next number.

use super::*;

use crate::error::ForkError;
use crate::executor::{continued_from, keep_run};
use crate::journal::Seq;
use crate::lineage::Lineage;
use crate::namespace;

use super::fork::{kept_prefix, Source};

impl WorkerState {
    /// Resets the stuck run `workflow_id` to its first `at` entries; the id the run it left
    /// is kept under.
    pub(super) async fn reset(
        &self,
        workflow_id: &str,
        at: u64,
        by: Option<String>,
    ) -> Result<String, ForkError> {
        if self.is_stopping() {
            return Err(StartError::ShutDown.into());
        }
        let record = self.workflow_record(workflow_id).await?;
        let record = record.ok_or_else(|| super::commands::unknown_workflow(workflow_id))?;
        self.refuse_unless_stuck(workflow_id, &record)?;
        // Nothing rebuilds the run until the reset is done (an event, the stuck run's retry,
        // taking its lease), so that no replay of the old run writes beside the rewind.
        let _hold = ResetHold::take(self, workflow_id)?;
        // On a shared store, the rewrite is its owner's: this worker takes the run first.
        if !self.owns(workflow_id) && !self.take_to_run_here(workflow_id).await {
            let why = "another worker holds it; reset it there";
            return Err(Unreachable::not_running(workflow_id, why).into());
        }
        self.wait_out_of_memory(workflow_id).await;
        let source = self.read_source(workflow_id).await?;
        self.refuse_unless_stuck(workflow_id, &source.record)?;
        let prefix = kept_prefix(workflow_id, &source, at)?;
        let kept_id = self
            .keep_reset_run(workflow_id, &source, at, by.as_deref())
            .await?;
        let run = NewRun {
            lineage: Lineage::of(&source.journal),
            redeliver: redelivered(&source.journal, prefix.len(), self.clock.now_ms()),
            prefix,
            by,
        };
        let removed_timers = self
            .rewind(workflow_id, &kept_id, source.record, run)
            .await?;
        for timer in removed_timers {
            self.timers.cancel(timer);
        }
        self.forget_stuck(workflow_id);
        drop(_hold);
        self.router.ensure_running(self, workflow_id, Wake::Started);
        Ok(kept_id)
    }

    /// Waits a little for a run that is leaving memory (a replay started before the hold, one
    /// that will stop again where it stopped) to be gone.
    async fn wait_out_of_memory(&self, workflow_id: &str) {
        for _ in 0..500 {
            if !self.router.holds(workflow_id) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Whether `workflow_id` is being reset.
    pub(super) fn is_resetting(&self, workflow_id: &str) -> bool {
        lock(&self.resetting).contains(workflow_id)
    }

    /// Only a stuck run that is not in memory is reset: any other could be writing its journal.
    fn refuse_unless_stuck(
        &self,
        workflow_id: &str,
        record: &WorkflowRecord,
    ) -> Result<(), ForkError> {
        let in_memory = self.router.holds(workflow_id);
        if record.status == WorkflowStatus::Stuck && !in_memory {
            return Ok(());
        }
        Err(ForkError::NotStuck {
            workflow_id: namespace::display(workflow_id),
            status: record.status.name().to_owned(),
        })
    }

    /// Keeps the whole run, ended as failed, saying why; its id.
    async fn keep_reset_run(
        &self,
        workflow_id: &str,
        source: &Source,
        at: u64,
        by: Option<&str>,
    ) -> Result<String, ForkError> {
        let who = by.unwrap_or("an operator");
        let message = format!(
            "reset by {who} to entry {at}: `{}` goes on as a new run",
            namespace::display(workflow_id)
        );
        let end = Entry::WorkflowFailed {
            failure: Failure::new(FailureKind::Cancelled, message),
        };
        let kept = keep_run(self, workflow_id, source.journal.clone(), end).await;
        kept.map_err(|error| StartError::Store(error).into())
    }

    /// Replaces the run's entries from `prefix.len()` on with the `Forked` entry naming the
    /// kept run, and its timers with none; the timers it removed.
    async fn rewind(
        &self,
        workflow_id: &str,
        kept_id: &str,
        record: WorkflowRecord,
        run: NewRun,
    ) -> Result<Vec<TimerKey>, ForkError> {
        let at = run.prefix.len() as u64;
        let now = self.clock.now_ms();
        let forked = continued_from(workflow_id, kept_id, at, &run.lineage, run.by, now);
        let id = workflow_id.to_owned();
        let timers = self.read(move |store| store.timers()).await?;
        let timers = timers.into_iter().filter(|t| t.workflow_id == id);
        let mut transition = Transition::rewind(workflow_id, &record, at, vec![forked]);
        transition.record.status = WorkflowStatus::Running;
        transition.record.stop = None;
        let timers: Vec<TimerKey> = timers.collect();
        transition.remove_timers = timers.clone();
        transition.redeliver = run.redeliver;
        match self.store.commit(transition).await {
            Ok(()) => Ok(timers),
            Err(StoreError::Conflict { reason, .. }) => {
                let why = format!("its journal changed during the reset ({reason}); try again");
                Err(Unreachable::not_running(workflow_id, why).into())
            }
            Err(error) => Err(StartError::Store(error).into()),
        }
    }
}

/// What the new run starts from: the entries it keeps, the keys and models of the workflow's
/// lineage, the signals to deliver again, and who reset it.
struct NewRun {
    prefix: Vec<Entry>,
    lineage: Lineage,
    redeliver: Vec<InboxMessage>,
    by: Option<String>,
}

/// The signals `journal`'s entries from `at` on delivered, as inbox messages again: the new
/// run waits for them anew, and their senders were told they were taken.
fn redelivered(journal: &[Entry], at: usize, now_ms: u64) -> Vec<InboxMessage> {
    let awaited = |seq: Seq| {
        journal.iter().find_map(|entry| match entry {
            Entry::SignalAwaited { seq: s, identity }
            | Entry::SignalAwaitedAt {
                seq: s, identity, ..
            } if *s == seq => Some(identity.name.clone()),
            _ => None,
        })
    };
    let message = |seq, signal_id: &String, payload: &Payload, sender: Option<&String>| {
        Some(InboxMessage {
            name: awaited(seq)?,
            signal_id: signal_id.clone(),
            payload: payload.clone(),
            sent_at_ms: now_ms,
            sender: sender.cloned(),
        })
    };
    let replaced = journal.iter().skip(at);
    let delivered = replaced.filter_map(|entry| match entry {
        Entry::SignalReceived {
            seq,
            signal_id,
            payload,
        } => message(*seq, signal_id, payload, None),
        Entry::SignalReceivedFrom {
            seq,
            signal_id,
            payload,
            sender,
        } => message(*seq, signal_id, payload, Some(sender)),
        Entry::SignalReceivedAt {
            seq,
            signal_id,
            payload,
            sender,
            ..
        } => message(*seq, signal_id, payload, sender.as_ref()),
        _ => None,
    });
    delivered.collect()
}

/// `workflow_id` marked as being reset for as long as this lives.
struct ResetHold<'a> {
    worker: &'a WorkerState,
    workflow_id: String,
}

impl<'a> ResetHold<'a> {
    fn take(worker: &'a WorkerState, workflow_id: &str) -> Result<Self, ForkError> {
        if !lock(&worker.resetting).insert(workflow_id.to_owned()) {
            let why = "another reset of it is under way";
            return Err(Unreachable::not_running(workflow_id, why).into());
        }
        Ok(Self {
            worker,
            workflow_id: workflow_id.to_owned(),
        })
    }
}

impl Drop for ResetHold<'_> {
    fn drop(&mut self) {
        lock(&self.worker.resetting).remove(&self.workflow_id);
    }
}
