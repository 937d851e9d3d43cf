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

/// What a decision for a pending approval says.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum ApprovalVerdict {
    /// Approve the artifact.
    Approve,
    /// Reject it, with a reason.
    Reject(String),
}
