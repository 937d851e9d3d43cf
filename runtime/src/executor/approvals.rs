//! Approvals: the executor's side of `ctx.approval`.
//!
//! A request is journaled with the artifact's hash and an expiry timer. A decision must name
//! that hash: one for any other artifact is refused, so a stale approval can never settle a
//! request for a changed artifact. The decision (or the expiry) is journaled and delivered.

use tracing::info;

use super::Host;
use super::{Executor, Unapplied};
use crate::artifacts::ApprovalVerdict;
use crate::error::{ApprovalError, RunError};
use crate::journal::ApprovalDecision;
use crate::journal::{Digest, Entry, Payload, Seq};
use crate::replay::{CommandState, Resolution};
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
        let seq = self.pending_request(hash, request)?;
        let now = self.host.clock().now_ms();
        let expires_at_ms = match self.core.lock().cursor.state(seq) {
            Some(CommandState::AwaitingApproval { expires_at_ms }) => expires_at_ms,
            _ => None,
        };
        // The expiry timer may not have been handled yet (overdue timers after a restart).
        if let Some(at_ms) = expires_at_ms.filter(|at| *at <= now) {
            self.decide(seq, ApprovalDecision::Expired { at_ms })
                .await?;
            let expired = ApprovalError::Expired {
                expired_at_ms: at_ms,
            };
            return Err(Unapplied::Refused(expired));
        }
        let approver = approver.to_owned();
        let decision = match verdict {
            ApprovalVerdict::Approve => ApprovalDecision::Approved {
                approver,
                at_ms: now,
                expires_at_ms,
            },
            ApprovalVerdict::Reject(reason) => ApprovalDecision::Rejected {
                approver,
                reason,
                at_ms: now,
            },
        };
        self.decide(seq, decision).await?;
        Ok(())
    }

    /// The pending request a decision for `hash` (and, if named, request `request`) settles.
    fn pending_request(
        &self,
        hash: Digest,
        request: Option<Seq>,
    ) -> Result<Seq, Unapplied<ApprovalError>> {
        let pending = self.core.lock().cursor.pending_approvals();
        let Some(&(first_seq, first_hash)) = pending.first() else {
            return Err(Unapplied::Refused(ApprovalError::NotPending(
                self.id.clone(),
            )));
        };
        let Some(&(seq, _)) = pending.iter().find(|(_, pending)| *pending == hash) else {
            info!(workflow_id = %self.id, seq = first_seq, given = %hash.hex(),
                "refused an approval decision for another artifact");
            return Err(Unapplied::Refused(ApprovalError::HashMismatch {
                workflow_id: self.id.clone(),
                given: hash.hex(),
                pending: first_hash.hex(),
            }));
        };
        match request {
            Some(given) if given != seq => Err(Unapplied::Refused(ApprovalError::StaleRequest {
                workflow_id: self.id.clone(),
                given,
                pending: seq,
            })),
            _ => Ok(seq),
        }
    }

    /// Nobody decided in time: the request resolves as expired.
    pub(super) async fn expire_approval(&mut self, seq: Seq, at_ms: u64) -> Result<(), RunError> {
        self.decide(seq, ApprovalDecision::Expired { at_ms }).await
    }

    /// Journals and delivers `decision`; `false` if `seq` no longer waits for one.
    async fn decide(&mut self, seq: Seq, decision: ApprovalDecision) -> Result<(), RunError> {
        let state = self.core.lock().cursor.state(seq);
        let expiry = match state {
            Some(CommandState::AwaitingApproval { expires_at_ms }) => expires_at_ms,
            _ => return Ok(()),
        };
        let delivered = Payload::encode(&decision).unwrap_or_else(|_| Payload::unit());
        let entry = Entry::ApprovalDecided { seq, decision };
        let mut transition = Transition::append(&self.id, &self.record, vec![entry]);
        transition
            .remove_timers
            .extend(expiry.map(|at| self.timer(seq, at)));
        self.commit(transition).await?;
        self.resolve(seq, Resolution::Completed(delivered));
        Ok(())
    }
}
