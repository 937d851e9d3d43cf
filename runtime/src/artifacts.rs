//! Immutable, content-addressed artifacts: what a workflow produced and may ask a person to
//! approve (a plan), or what a step read and must not re-read on replay (a retrieval snapshot).
//!
//! An artifact's hash is the SHA-256 of its canonical JSON content. The record is written once,
//! in the transition that journals `ArtifactCommitted` (which carries only the hash, in the
//! command identity), and never changes: a second commit of the same content is the same
//! artifact.

use serde::{Deserialize, Serialize};

use crate::journal::{Digest, Payload};

/// A stored artifact. Append-only: postcard encodes fields by position.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ArtifactRecord {
    /// What it is (`plan`, `retrieval`, …).
    pub kind: String,
    /// The author's version label for its shape or policy (`v2`).
    pub version: String,
    /// The content.
    pub content: Payload,
    /// Causal metadata: the prompt, model, tool, index and policy versions that produced it.
    pub metadata: Vec<(String, String)>,
    /// The workflow that committed it first.
    pub workflow_id: String,
    /// When (worker clock).
    pub created_at_ms: u64,
}

impl crate::journal::Record for ArtifactRecord {}

/// The hash that names `content`.
pub fn artifact_hash(content: &Payload) -> Digest {
    content.digest()
}

/// How an approval request ended. Append-only.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ApprovalDecision {
    /// `approver` approved the artifact at `at_ms`.
    Approved {
        /// Who (from the caller's identity, not from the request body).
        approver: String,
        /// When.
        at_ms: u64,
        /// Until when the approval may be acted on (the request's expiry).
        expires_at_ms: Option<u64>,
    },
    /// `approver` rejected it.
    Rejected {
        /// Who.
        approver: String,
        /// Why.
        reason: String,
        /// When.
        at_ms: u64,
    },
    /// Nobody decided before the expiry.
    Expired {
        /// When it expired.
        at_ms: u64,
    },
}

/// What a decision for a pending approval says.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Approve the artifact.
    Approve,
    /// Reject it, with a reason.
    Reject(String),
}

/// Why a decision was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApprovalError {
    /// No workflow has this id.
    #[error("no workflow with id `{0}`")]
    UnknownWorkflow(String),
    /// The workflow waits for no approval.
    #[error("workflow `{0}` is not waiting for an approval")]
    NotPending(String),
    /// The decision names another artifact than the one waiting for approval.
    #[error(
        "the decision is for artifact {given}, but the approval pending in workflow \
         `{workflow_id}` is for artifact {pending}; read the pending artifact and decide on it"
    )]
    HashMismatch {
        /// The workflow.
        workflow_id: String,
        /// The hash the decision named.
        given: String,
        /// The hash waiting for approval.
        pending: String,
    },
    /// The decision names another request than the one pending for that artifact.
    #[error("approval request {given} of workflow `{workflow_id}` is not pending (the pending one for this artifact is {pending})")]
    StaleRequest {
        /// The workflow.
        workflow_id: String,
        /// The request the decision named.
        given: u32,
        /// The pending request for the hash.
        pending: u32,
    },
    /// The request expired before the decision arrived; it resolved as expired.
    #[error("the approval request expired at {expired_at_ms} ms, before this decision")]
    Expired {
        /// When it expired.
        expired_at_ms: u64,
    },
    /// The hash is not a hash.
    #[error("`{0}` is not an artifact hash (expected `sha256:` and 64 hex digits)")]
    MalformedHash(String),
    /// The workflow stopped before applying the decision.
    #[error("the workflow is not running: {0}")]
    NotRunning(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}
