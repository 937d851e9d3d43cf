//! Commands relayed between workers: a worker that is asked to decide an approval, cancel a
//! run or settle an operation of a workflow another worker holds writes the command to
//! `waymark_commands` and waits; the owner takes it (woken by `NOTIFY`, or at its next claim
//! round), applies it as if it had been asked itself, and writes the answer back.
//!
//! A command is in one of three states: waiting (nobody took it), taken (its taker applies
//! it), answered. Only a waiting command is withdrawn when the sender's patience runs out, in
//! one conditional `DELETE`: either the sender withdraws it or a taker has it, never both.

use std::sync::mpsc::{Receiver, SyncSender, TryRecvError};
use std::time::{Duration, Instant};

use super::{Plain, Shared, StoreError};
use crate::store::{Relayed, RelayedCommand};
use crate::sync::lock;

/// The channel that tells owners a command waits for one of their workflows.
pub(super) const RELAY_CHANNEL: &str = "waymark_relay";

/// The channel that tells a sender its command was answered (the payload is its id).
pub(super) const ANSWER_CHANNEL: &str = "waymark_answer";

/// How often a sender looks at its command when no notification came (one may have been
/// missed while the listener reconnected).
const ANSWER_POLL: Duration = Duration::from_millis(500);

/// How old a command must be to be taken for one its sender left behind.
const ORPHANED_AFTER: Duration = Duration::from_secs(3600);

/// The senders waiting for answers, by command id.
#[derive(Default)]
pub(super) struct Waiting(std::sync::Mutex<std::collections::HashMap<i64, SyncSender<()>>>);

impl Waiting {
    fn enter(&self, id: i64) -> Receiver<()> {
        let (tell, told) = std::sync::mpsc::sync_channel(1);
        lock(&self.0).insert(id, tell);
        told
    }

    fn leave(&self, id: i64) {
        lock(&self.0).remove(&id);
    }

    /// The answer to `id` came in.
    pub(super) fn answered(&self, id: i64) {
        if let Some(tell) = lock(&self.0).get(&id) {
            let _ = tell.try_send(());
        }
    }

    /// Notifications may have been missed: every sender looks again.
    pub(super) fn look_again(&self) {
        for tell in lock(&self.0).values() {
            let _ = tell.try_send(());
        }
    }
}

impl Shared {
    pub(super) fn relay(
        &self,
        workflow_id: &str,
        command: &[u8],
        patience: Duration,
    ) -> Result<Relayed, StoreError> {
        // Only a workflow with a lease row can ever be taken: one that ended has none.
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
        let Some(id) = sent.first().map(|row| row.get::<_, i64>(0)) else {
            return Ok(Relayed::NoLease);
        };
        let told = self.waiting.enter(id);
        let outcome = self.await_answer(id, &told, Instant::now() + patience);
        self.waiting.leave(id);
        if !matches!(outcome, Ok(Relayed::NotTaken)) {
            // Answered, given up on, or unreadable: the sender is done with it either way.
            let _ = self.pool.with(|c| {
                c.client
                    .run_sql("DELETE FROM waymark_commands WHERE id = $1", &[&id])
            });
        }
        outcome
    }

    fn await_answer(
        &self,
        id: i64,
        told: &Receiver<()>,
        deadline: Instant,
    ) -> Result<Relayed, StoreError> {
        loop {
            let rows = self.pool.with(|c| {
                c.client.query_sql(
                    "SELECT c.answer, c.taken_by, c.taken_by IS NOT NULL AND NOT EXISTS (
                         SELECT 1 FROM waymark_workers w
                         WHERE w.worker_id = c.taken_by AND w.expires_at > now())
                     FROM waymark_commands c WHERE c.id = $1",
                    &[&id],
                )
            })?;
            let Some(row) = rows.first() else {
                return Err(StoreError::Backend(format!(
                    "relayed command {id} disappeared before it was answered"
                )));
            };
            if let Some(answer) = row.get::<_, Option<Vec<u8>>>(0) {
                return Ok(Relayed::Answered(answer));
            }
            let taker: Option<String> = row.get(1);
            if row.get::<_, bool>(2) {
                return Ok(Relayed::TakerLapsed(taker.unwrap_or_default()));
            }
            let now = Instant::now();
            if taker.is_none() && now >= deadline && self.withdraw(id)? {
                return Ok(Relayed::NotTaken);
            }
            let wait = if taker.is_none() {
                deadline.saturating_duration_since(now).min(ANSWER_POLL)
            } else {
                ANSWER_POLL
            };
            match told.recv_timeout(wait.max(Duration::from_millis(1))) {
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(StoreError::Closed)
                }
            }
            // Several notifications may have queued: one look covers them all.
            while !matches!(
                told.try_recv(),
                Err(TryRecvError::Empty | TryRecvError::Disconnected)
            ) {}
        }
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
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                "UPDATE waymark_commands c SET taken_by = $1
                 FROM waymark_leases l
                 WHERE c.taken_by IS NULL AND l.workflow_id = c.workflow_id AND l.owner = $1
                   AND ($2::text IS NULL OR c.workflow_id = $2)
                 RETURNING c.id, c.workflow_id, c.command",
                &[me, &workflow_id],
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
                &[&ORPHANED_AFTER.as_secs_f64()],
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
