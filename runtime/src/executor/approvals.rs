//! Approvals: the I/O of `ctx.approval`, whose decisions are [`crate::machines::approval`]'s.
//!
//! A request is journaled with the artifact's hash and an expiry timer. The machine says which
//! request a person's decision settles (one for any other artifact is refused) and what it
//! settles as; here the decision (or the expiry) is journaled with its timer row's deletion.

use tracing::info;

use super::Host;
use super::{Executor, Unapplied};
use crate::artifacts::ApprovalVerdict;
use crate::error::{ApprovalError, RunError};
use crate::journal::{ApprovalDecision, Digest, Entry, Seq};
use crate::machines::approval::{self, Expired, Pending, Refused};
use crate::store::Transition;

impl<H: Host> Executor<H> {
    /// Applies a person's decision to the pending request for artifact `hash`.
    pub(super) async fn on_approval_decision(
        &mut self,
        hash: Digest,
        request: Option<Seq>,
        approver: &str,
        verdict: ApprovalVerdict,
    ) -> Result<(), Unapplied<ApprovalError>> {
        let pending = self.core.lock().commands.pending_approvals();
        let settled = approval::settled_request(&pending, hash, request);
        let request = settled.map_err(|refused| self.refusal(refused, hash))?;
        let now = self.host.clock().now_ms();
        match approval::decision(&request, verdict, approver, now) {
            Ok(decision) => Ok(self.decide(&request, decision).await?),
            Err(Expired { at_ms }) => {
                self.decide(&request, ApprovalDecision::Expired { at_ms })
                    .await?;
                let expired_at_ms = at_ms;
                Err(Unapplied::Refused(ApprovalError::Expired { expired_at_ms }))
            }
        }
    }

    fn refusal(&self, refused: Refused, hash: Digest) -> Unapplied<ApprovalError> {
        let workflow_id = String::from(&*self.id);
        let error = match refused {
            Refused::NotPending => ApprovalError::NotPending(workflow_id),
            Refused::HashMismatch { pending } => {
                info!(workflow_id = %self.id, given = %hash.hex(),
                    "refused an approval decision for another artifact");
                ApprovalError::HashMismatch {
                    workflow_id,
                    given: hash.hex(),
                    pending: pending.hex(),
                }
            }
            Refused::StaleRequest { given, pending } => ApprovalError::StaleRequest {
                workflow_id,
                given,
                pending,
            },
        };
        Unapplied::Refused(error)
    }

    /// Nobody decided in time: the request at `seq` settles as expired.
    pub(super) async fn expire_approval(&mut self, seq: Seq, at_ms: u64) -> Result<(), RunError> {
        let pending = self.core.lock().commands.pending_approvals();
        let Some(request) = pending.into_iter().find(|pending| pending.seq == seq) else {
            return Ok(());
        };
        self.decide(&request, ApprovalDecision::Expired { at_ms })
            .await
    }

    /// Journals `decision` on `request`, with the deletion of its expiry timer's row; applying
    /// it delivers the decision.
    async fn decide(
        &mut self,
        request: &Pending,
        decision: ApprovalDecision,
    ) -> Result<(), RunError> {
        let seq = request.seq;
        let entry = Entry::ApprovalDecided { seq, decision };
        let mut transition = Transition::append(self.id.clone(), &self.record, vec![entry]);
        let expiry = request.expires_at_ms.map(|at| self.timer(seq, at));
        transition.remove_timers.extend(expiry);
        self.commit(transition).await
    }
}
