//! Approvals (`ctx.approval`): a request waits for a person's decision on one artifact, named
//! by its hash. A decision for any other artifact, or for another request, is refused, so a
//! stale approval never settles a request for a changed artifact; a request past its expiry
//! settles as expired, whatever arrives after.

use super::{CommandState, Conflict};
use crate::artifacts::ApprovalVerdict;
use crate::journal::{ApprovalDecision, CommandIdentity, CommandKind, Digest, Payload, Seq};

/// An open approval request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    artifact_hash: Digest,
    expires_at_ms: Option<u64>,
}

/// A pending request, as a decision must name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The request.
    pub seq: Seq,
    /// The artifact it asks about.
    pub artifact_hash: Digest,
    /// When it expires, if it does.
    pub expires_at_ms: Option<u64>,
}

/// Why a decision settles no request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No request is pending.
    NotPending,
    /// No pending request is for the artifact the decision names; the oldest one's hash.
    HashMismatch {
        /// The artifact the oldest pending request asks about.
        pending: Digest,
    },
    /// The decision names another request than the one pending for its artifact.
    StaleRequest {
        /// The request the decision named.
        given: Seq,
        /// The request pending for the artifact.
        pending: Seq,
    },
}

/// The request expired before the decision: it settles as expired at `at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    /// The expiry.
    pub at_ms: u64,
}

impl Approval {
    pub(super) fn new(artifact_hash: Digest, expires_at_ms: Option<u64>) -> Self {
        Self {
            artifact_hash,
            expires_at_ms,
        }
    }

    pub(super) fn state(&self) -> CommandState {
        CommandState::AwaitingApproval {
            expires_at_ms: self.expires_at_ms,
        }
    }

    pub(super) fn expires_at_ms(&self) -> Option<u64> {
        self.expires_at_ms
    }

    pub(super) fn pending(&self, seq: Seq) -> Pending {
        Pending {
            seq,
            artifact_hash: self.artifact_hash,
            expires_at_ms: self.expires_at_ms,
        }
    }
}

/// The request (of `pending`, oldest first) that a decision on `hash`, naming `request` if
/// the caller did, settles.
pub fn settled_request(
    pending: &[Pending],
    hash: Digest,
    request: Option<Seq>,
) -> Result<Pending, Refused> {
    let oldest = pending.first().ok_or(Refused::NotPending)?;
    let Some(found) = pending.iter().find(|p| p.artifact_hash == hash) else {
        let pending = oldest.artifact_hash;
        return Err(Refused::HashMismatch { pending });
    };
    match request {
        Some(given) if given != found.seq => Err(Refused::StaleRequest {
            given,
            pending: found.seq,
        }),
        _ => Ok(*found),
    }
}

/// The decision `verdict` by `approver` at `now_ms` makes on `request`; an expired request
/// settles as expired whatever the verdict (its expiry timer may not have been handled yet,
/// overdue after a restart), and the caller is told.
pub fn decision(
    request: &Pending,
    verdict: ApprovalVerdict,
    approver: &str,
    now_ms: u64,
) -> Result<ApprovalDecision, Expired> {
    if let Some(at_ms) = request.expires_at_ms.filter(|at| *at <= now_ms) {
        return Err(Expired { at_ms });
    }
    let approver = approver.to_owned();
    Ok(match verdict {
        ApprovalVerdict::Approve => ApprovalDecision::Approved {
            approver,
            at_ms: now_ms,
            expires_at_ms: request.expires_at_ms,
        },
        ApprovalVerdict::Reject(reason) => ApprovalDecision::Rejected {
            approver,
            reason,
            at_ms: now_ms,
        },
    })
}

/// What the workflow receives for `decision`.
pub(super) fn delivered(seq: Seq, decision: &ApprovalDecision) -> Result<Payload, Conflict> {
    Payload::encode(decision).map_err(|error| {
        Conflict::inconsistent(
            seq,
            format!("the approval decision does not encode: {error}"),
        )
    })
}

/// Identity of an approval request for artifact `hash`.
pub fn approval_identity(hash: Digest) -> CommandIdentity {
    let digest = Digest::of(hash.hex().as_bytes());
    CommandIdentity {
        kind: CommandKind::Approval,
        name: "approval".to_owned(),
        input_digest: digest,
    }
}
