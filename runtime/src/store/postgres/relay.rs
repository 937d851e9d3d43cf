//! Commands relayed between workers: a worker that is asked to decide an approval, cancel a
//! run or settle an operation of a workflow another worker holds writes the command to
//! `waymark_commands` and waits; the owner takes it (woken by `NOTIFY`, or at its next claim
//! round), applies it as if it had been asked itself, and writes the answer back.
//!
//! A command is in one of three states: waiting (nobody took it), taken (its taker applies
//! it), answered. Only a waiting command is withdrawn, in one conditional `DELETE`: either the
//! sender withdraws it or a taker has it, never both. So a sender that stops waiting says
//! "nothing applied" only of a command it withdrew; of one taken and not answered (its taker
//! lapsed, or did not answer in time, or the sender could not read it) it says the outcome is
//! unknown.
//!
//! The sender waits asynchronously, each read on a blocking thread of its own, and no more
//! than half the read connections read for senders at once: a thousand callers waiting on
//! answers hold no threads, and the heartbeat and the runs' reads always find a connection.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::{Plain, Shared, StoreError};
use crate::store::{RelayFuture, Relayed, RelayedCommand};
use crate::sync::lock;

/// The channel that tells owners a command waits for one of their workflows.
pub(super) const RELAY_CHANNEL: &str = "waymark_relay";

/// The channel that tells a sender its command was answered (the payload is its id).
pub(super) const ANSWER_CHANNEL: &str = "waymark_answer";

/// How often a sender looks at its command when no notification came (one may have been
/// missed while the listener reconnected).
const ANSWER_POLL: Duration = Duration::from_millis(500);

/// How old a command must be, at the least, to be taken for one its sender left behind.
const ORPHANED_AFTER: Duration = Duration::from_secs(3600);

/// How old a command must be to be taken for one its sender left behind, with leases of
/// `lease`: older than any sender waits (twice its patience of twice the lease), with room.
fn orphaned_after(lease: Duration) -> Duration {
    ORPHANED_AFTER.max(lease * 8)
}

/// The senders waiting for answers, by command id, and the reads they may run at once.
pub(super) struct Waiting {
    bells: std::sync::Mutex<std::collections::HashMap<i64, Arc<Notify>>>,
    reads: tokio::sync::Semaphore,
}

impl Waiting {
    /// Senders whose reads take at most `connections` of the pool at once.
    pub(super) fn new(connections: usize) -> Self {
        Self {
            bells: Default::default(),
            reads: tokio::sync::Semaphore::new(connections.max(1)),
        }
    }

    fn enter(&self, id: i64) -> Arc<Notify> {
        let bell = Arc::new(Notify::new());
        lock(&self.bells).insert(id, bell.clone());
        bell
    }

    fn leave(&self, id: i64) {
        lock(&self.bells).remove(&id);
    }

    /// The answer to `id` came in.
    pub(super) fn answered(&self, id: i64) {
        if let Some(bell) = lock(&self.bells).get(&id) {
            // A permit is kept for a sender not waiting yet; several coalesce into one look.
            bell.notify_one();
        }
    }

    /// Notifications may have been missed: every sender looks again.
    pub(super) fn look_again(&self) {
        for bell in lock(&self.bells).values() {
            bell.notify_one();
        }
    }
}

/// Where a relayed command stands, as its sender reads it.
enum CommandState {
    Waiting,
    Taken {
        taker: String,
        lapsed: bool,
    },
    Answered(Vec<u8>),
    /// Its row is gone: deleted by someone other than its sender.
    Missing,
}

impl Shared {
    pub(super) fn relay(
        self: &Arc<Self>,
        workflow_id: &str,
        command: Vec<u8>,
        patience: Duration,
    ) -> RelayFuture {
        let (shared, workflow_id) = (self.clone(), workflow_id.to_owned());
        Box::pin(async move { shared.send_and_wait(workflow_id, command, patience).await })
    }

    async fn send_and_wait(
        self: Arc<Self>,
        workflow_id: String,
        command: Vec<u8>,
        patience: Duration,
    ) -> Result<Relayed, StoreError> {
        let sent = self.blocking(move |s| s.send_command(&workflow_id, &command));
        let id = match sent.await {
            Ok(Some(id)) => id,
            Ok(None) => return Ok(Relayed::NoLease),
            // The insert may have committed, its answer lost: the command may be taken.
            Err(error) => {
                return Ok(unknown(format!(
                    "the command may not have been sent: {error}"
                )))
            }
        };
        let bell = self.waiting.enter(id);
        let mut waiting = Waiter {
            shared: self.clone(),
            id,
            done: false,
        };
        let outcome = self.await_answer(id, &bell, patience).await;
        waiting.done = true;
        self.waiting.leave(id);
        if !matches!(outcome, Relayed::NotTaken) {
            // Answered or given up on: the sender is done with it either way (a taker's late
            // answer then updates nothing).
            let _ = self.blocking(move |s| s.delete_command(id)).await;
        }
        Ok(outcome)
    }

    /// Waits for command `id`'s answer: `patience` for a worker to take it, as long again for
    /// its taker to answer. A read that fails is tried again until then; what the sender
    /// cannot tell at the end is reported as such.
    async fn await_answer(self: &Arc<Self>, id: i64, bell: &Notify, patience: Duration) -> Relayed {
        let take_by = Instant::now() + patience;
        let answer_by = take_by + patience;
        loop {
            let pending = match self.blocking(move |s| s.command_state(id)).await {
                Ok(CommandState::Answered(answer)) => return Relayed::Answered(answer),
                Ok(CommandState::Missing) => {
                    return unknown("the command was deleted before it was answered".into())
                }
                Ok(CommandState::Taken {
                    taker,
                    lapsed: true,
                }) => {
                    return unknown(format!(
                        "worker `{taker}` took the command and lapsed before answering"
                    ))
                }
                Ok(CommandState::Taken { taker, .. }) => {
                    format!("worker `{taker}` took the command and did not answer")
                }
                Ok(CommandState::Waiting) if Instant::now() >= take_by => {
                    match self.blocking(move |s| s.withdraw(id)).await {
                        Ok(true) => return Relayed::NotTaken,
                        // Taken meanwhile: its taker's answer is what to wait for now.
                        Ok(false) => continue,
                        Err(error) => format!("the command could not be withdrawn: {error}"),
                    }
                }
                Ok(CommandState::Waiting) => String::new(),
                Err(error) => {
                    tracing::warn!(command = id, %error, "cannot read a relayed command; trying again");
                    format!("the command could not be read: {error}")
                }
            };
            if Instant::now() >= answer_by {
                return self.give_up(id, pending, patience * 2).await;
            }
            let wait = ANSWER_POLL.min(answer_by.saturating_duration_since(Instant::now()));
            let _ = tokio::time::timeout(wait, bell.notified()).await;
        }
    }

    /// The sender stops waiting: a command nobody took is withdrawn, unapplied; one taken may
    /// or may not have applied.
    async fn give_up(self: &Arc<Self>, id: i64, pending: String, waited: Duration) -> Relayed {
        match self.blocking(move |s| s.withdraw(id)).await {
            Ok(true) => Relayed::NotTaken,
            _ => unknown(format!("{pending} within {waited:?}")),
        }
    }

    /// Runs `read` on a blocking thread (the pool's calls block), once a sender's share of
    /// the pool has room.
    async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        read: impl FnOnce(&Shared) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let Ok(_permit) = self.waiting.reads.acquire().await else {
            return Err(StoreError::Backend("the store is closing".into()));
        };
        let shared = self.clone();
        match tokio::task::spawn_blocking(move || read(&shared)).await {
            Ok(result) => result,
            Err(error) => Err(StoreError::Backend(format!("relay task failed: {error}"))),
        }
    }

    /// Writes the command and tells the owners; `None` for a workflow with no lease row, which
    /// no worker can ever take (it ended, or never started).
    fn send_command(&self, workflow_id: &str, command: &[u8]) -> Result<Option<i64>, StoreError> {
        let sent = self.pool.with(|c| {
            c.client.query_sql(
                "WITH sent AS (
                     INSERT INTO waymark_commands (workflow_id, command)
                     SELECT $1, $2 WHERE EXISTS (
                         SELECT 1 FROM waymark_leases WHERE workflow_id = $1)
                     RETURNING id)
                 SELECT id, pg_notify($3, $1) FROM sent",
                &[&workflow_id, &command, &RELAY_CHANNEL],
            )
        })?;
        Ok(sent.first().map(|row| row.get::<_, i64>(0)))
    }

    fn command_state(&self, id: i64) -> Result<CommandState, StoreError> {
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                "SELECT c.answer, c.taken_by, NOT EXISTS (
                     SELECT 1 FROM waymark_workers w
                     WHERE w.worker_id = c.taken_by AND w.expires_at > now())
                 FROM waymark_commands c WHERE c.id = $1",
                &[&id],
            )
        })?;
        let Some(row) = rows.first() else {
            return Ok(CommandState::Missing);
        };
        if let Some(answer) = row.get::<_, Option<Vec<u8>>>(0) {
            return Ok(CommandState::Answered(answer));
        }
        Ok(match row.get::<_, Option<String>>(1) {
            None => CommandState::Waiting,
            Some(taker) => CommandState::Taken {
                taker,
                lapsed: row.get(2),
            },
        })
    }

    fn delete_command(&self, id: i64) -> Result<(), StoreError> {
        self.pool.with(|c| {
            c.client
                .run_sql("DELETE FROM waymark_commands WHERE id = $1", &[&id])
        })?;
        Ok(())
    }

    /// Withdraws command `id` unless a worker took it meanwhile.
    fn withdraw(&self, id: i64) -> Result<bool, StoreError> {
        let deleted = self.pool.with(|c| {
            c.client.run_sql(
                "DELETE FROM waymark_commands WHERE id = $1 AND taken_by IS NULL",
                &[&id],
            )
        })?;
        Ok(deleted == 1)
    }

    pub(super) fn take_relayed(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<RelayedCommand>, StoreError> {
        if workflow_id.is_none() {
            self.sweep_relayed()?;
        }
        let me = &self.worker_id;
        // Only for leases this worker knows it holds: a row naming it after it let the lease go
        // (a release that failed) is not its to answer.
        let held: Vec<String> = match workflow_id {
            Some(id) => lock(&self.held)
                .get_key_value(id)
                .map(|(id, _)| id.clone())
                .into_iter()
                .collect(),
            None => lock(&self.held).keys().cloned().collect(),
        };
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                "UPDATE waymark_commands c SET taken_by = $1
                 FROM waymark_leases l
                 WHERE c.taken_by IS NULL AND l.workflow_id = c.workflow_id AND l.owner = $1
                   AND c.workflow_id = ANY($2)
                 RETURNING c.id, c.workflow_id, c.command",
                &[me, &held],
            )
        })?;
        let mut taken: Vec<RelayedCommand> = rows
            .iter()
            .map(|row| RelayedCommand {
                id: row.get(0),
                workflow_id: row.get(1),
                command: row.get(2),
            })
            .collect();
        taken.sort_by_key(|command| command.id);
        Ok(taken)
    }

    /// Deletes the commands of senders that went without deleting their own (a crash while
    /// waiting): no sender waits that long.
    fn sweep_relayed(&self) -> Result<(), StoreError> {
        self.pool.with(|c| {
            c.client.run_sql(
                "DELETE FROM waymark_commands WHERE sent_at < now() - make_interval(secs => $1)",
                &[&orphaned_after(self.lease).as_secs_f64()],
            )
        })?;
        Ok(())
    }

    pub(super) fn answer_relayed(&self, id: i64, answer: &[u8]) -> Result<(), StoreError> {
        let me = &self.worker_id;
        self.pool.with(|c| {
            c.client.query_sql(
                "WITH answered AS (
                     UPDATE waymark_commands SET answer = $3
                     WHERE id = $1 AND taken_by = $2 RETURNING id)
                 SELECT pg_notify($4, id::text) FROM answered",
                &[&id, me, &answer, &ANSWER_CHANNEL],
            )
        })?;
        Ok(())
    }
}

/// A sender while it waits. One that stops waiting before the answer (its caller went away)
/// withdraws its command if nobody took it yet, and no longer listens for the answer.
struct Waiter {
    shared: Arc<Shared>,
    id: i64,
    done: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (shared, id) = (self.shared.clone(), self.id);
        shared.waiting.leave(id);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn_blocking(move || shared.withdraw(id)));
        }
    }
}

fn unknown(reason: String) -> Relayed {
    Relayed::OutcomeUnknown(reason)
}
