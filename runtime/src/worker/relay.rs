//! Commands for workflows another worker runs. A decision, a cancellation or an operator's
//! resolution needs the run's answer, and only the workflow's owner has the run: a worker that
//! does not hold the lease relays the command through the store ([`Leases::relay`]) and returns
//! the owner's answer as its own. The owner applies a relayed command exactly as if it had been
//! asked itself, so every check and refusal is the same wherever the caller came in.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::*;
use crate::artifacts::ApprovalVerdict;
use crate::operations::DecidedOn;
use crate::store::{Leases, Relayed, RelayedCommand};

/// A command as it travels to a workflow's owner.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Command {
    Cancel {
        reason: String,
    },
    DecideApproval {
        request: Option<u32>,
        hash: String,
        approver: String,
        verdict: ApprovalVerdict,
    },
    ResolveOperation {
        key: String,
        attempt: Option<u32>,
        /// Left out by a worker that fenced decisions by attempt only.
        #[serde(default)]
        revision: Option<u32>,
        decision: OperatorDecision,
        by: ReconciledBy,
    },
}

tokio::task_local! {
    /// Set while a relayed command is applied: it must not travel on from the worker it was
    /// relayed to, were the workflow to move meanwhile (its sender would hear of an outcome
    /// unknown while a second relay still applies it).
    static APPLYING_RELAYED: ();
}

impl WorkerState {
    /// Hands `command` to `workflow_id`'s owner and returns the owner's answer. A command no
    /// worker takes within twice the lease (the time a dead owner's successor takes to claim
    /// the workflow) is withdrawn, unapplied; one taken and not answered within as long again
    /// has an unknown outcome.
    pub(super) async fn relay<E>(&self, workflow_id: &str, command: Command) -> Result<(), E>
    where
        E: DeserializeOwned + From<Unreachable>,
    {
        let refused = |why: String| Err(E::from(Unreachable::not_running(workflow_id, why)));
        let unknown = |why: String| Err(E::from(Unreachable::outcome_unknown(workflow_id, why)));
        let Some(leases) = self.leases.clone() else {
            return refused("this worker runs no workflow of another".into());
        };
        if APPLYING_RELAYED.try_with(|_| ()).is_ok() {
            return refused("it moved to another worker meanwhile".into());
        }
        let body = match serde_json::to_vec(&command) {
            Ok(body) => body,
            Err(error) => return refused(format!("the command does not encode: {error}")),
        };
        let patience = leases.lease() * 2;
        let relayed = match leases.relay(workflow_id, body, patience).await {
            Ok(relayed) => relayed,
            Err(error) => return Err(E::from(Unreachable::Store(error))),
        };
        match relayed {
            Relayed::Answered(answer) => {
                self.telemetry.count(names::COMMANDS_RELAYED);
                serde_json::from_slice(&answer).unwrap_or_else(|error| {
                    unknown(format!("its owner's answer does not decode: {error}"))
                })
            }
            Relayed::NoLease => refused("it has ended".into()),
            Relayed::NotTaken => refused(format!(
                "no worker took the command within {patience:?} (nobody runs the workflow \
                 now); nothing was applied"
            )),
            Relayed::OutcomeUnknown(why) => unknown(why),
        }
    }

    /// Takes the commands relayed to `workflow_id` (`None`: to any workflow this worker holds)
    /// and applies each on a task of its own, as its sender waits for it.
    pub(super) async fn apply_relayed(
        &self,
        leases: &Arc<dyn Leases>,
        workflow_id: Option<String>,
    ) {
        // A stopping worker could not answer what it takes: its successor will.
        if self.is_stopping() {
            return;
        }
        let taking = leases.clone();
        let taken =
            tokio::task::spawn_blocking(move || taking.take_relayed(workflow_id.as_deref())).await;
        let commands = match taken {
            Ok(Ok(commands)) => commands,
            Ok(Err(error)) => {
                return warn!(%error, "cannot take relayed commands; trying at the next claim")
            }
            Err(error) => return warn!(%error, "relayed command task failed"),
        };
        let Some(shared) = self.myself.upgrade() else {
            return;
        };
        for command in commands {
            let (shared, leases) = (shared.clone(), leases.clone());
            self.spawn(async move { shared.answer_relayed(&leases, command).await });
        }
    }

    async fn answer_relayed(&self, leases: &Arc<dyn Leases>, relayed: RelayedCommand) {
        let RelayedCommand {
            id,
            workflow_id,
            command,
        } = relayed;
        let refusal =
            |why: String| answer_of(Err::<(), _>(Unreachable::not_running(&workflow_id, why)));
        let answer = match serde_json::from_slice::<Command>(&command) {
            // Applied here or refused: a command must not travel on from the worker it was
            // relayed to (to itself, were the lease row stale). A workflow parked since the
            // command was taken is free: it is taken back.
            Ok(_)
                if !self.owns_on_shared_store(&workflow_id)
                    && !self.take_to_run_here(&workflow_id).await =>
            {
                refusal("it moved to another worker meanwhile".into())
            }
            Ok(command) => {
                let applying = self.apply_command(&workflow_id, command);
                APPLYING_RELAYED.scope((), applying).await
            }
            // A command this build cannot read (sent by a newer one): refused, not dropped, so
            // that its sender hears why.
            Err(error) => refusal(format!("its owner cannot read the command: {error}")),
        };
        self.send_answer(leases, id, &workflow_id, answer).await;
    }

    /// Writes `answer` back, trying again for as long as the sender waits for it.
    async fn send_answer(
        &self,
        leases: &Arc<dyn Leases>,
        id: i64,
        workflow_id: &str,
        answer: Vec<u8>,
    ) {
        let answer = Arc::new(answer);
        let give_up_at = tokio::time::Instant::now() + leases.lease() * 2;
        let mut pause = Duration::from_millis(50);
        loop {
            let (leases, answer) = (leases.clone(), answer.clone());
            let answering = tokio::task::spawn_blocking(move || leases.answer_relayed(id, &answer));
            let error = match answering.await {
                Ok(Ok(())) => return,
                Ok(Err(error)) => error.to_string(),
                Err(error) => error.to_string(),
            };
            if tokio::time::Instant::now() + pause >= give_up_at {
                return warn!(%error, workflow_id, "cannot answer a relayed command; its sender hears that the outcome is unknown");
            }
            warn!(%error, workflow_id, "cannot answer a relayed command; trying again");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Applies `command` as if this worker had been asked: the answer is what its caller would
    /// have heard.
    async fn apply_command(&self, workflow_id: &str, command: Command) -> Vec<u8> {
        match command {
            Command::Cancel { reason } => answer_of(self.cancel(workflow_id, &reason).await),
            Command::DecideApproval {
                request,
                hash,
                approver,
                verdict,
            } => {
                let decided = self
                    .decide_approval(workflow_id, request, &hash, &approver, verdict)
                    .await;
                answer_of(decided)
            }
            Command::ResolveOperation {
                key,
                attempt,
                revision,
                decision,
                by,
            } => {
                let on = DecidedOn { attempt, revision };
                answer_of(self.resolve_operation(&key, on, decision, by).await)
            }
        }
    }
}

fn answer_of<E: Serialize>(answer: Result<(), E>) -> Vec<u8> {
    // Every refusal is plain data (strings and numbers): it always encodes.
    serde_json::to_vec(&answer).unwrap_or_default()
}
