//! Artifacts and approvals, typed: `ctx.artifact`, `ctx.approval` of an artifact with the
//! intents it authorises and the evidence it rests on, and effects run `.under(&approval)`.

use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark_runtime::approvals::{ApprovalScope, Approved, Granted, Intent, SCOPE_KIND};
use waymark_runtime::context::WorkflowCore;
use waymark_runtime::error::RunError;
use waymark_runtime::journal::ApprovalDecision;
use waymark_runtime::journal::{Digest, Payload, PayloadError, Seq};
use waymark_runtime::machines::Resolution;

use crate::{EffectCall, WorkflowContext, WorkflowError};

/// A committed, immutable artifact and its value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact<T> {
    hash: Digest,
    kind: String,
    version: String,
    value: T,
}

impl<T> Artifact<T> {
    /// Its hash, `sha256:…`: what approvals name.
    pub fn hash(&self) -> String {
        self.hash.hex()
    }

    /// Its id: kind and the first bytes of the hash.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.hash.short())
    }

    /// What it is.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The author's version label.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// The value, owned.
    pub fn into_value(self) -> T {
        self.value
    }

    pub(crate) fn digest(&self) -> Digest {
        self.hash
    }
}

impl<T: Serialize> Artifact<T> {
    /// The handle of a retrieval snapshot the runtime stored (kind `retrieval`): the same
    /// canonical content, so the same hash.
    pub(crate) fn snapshot(value: T) -> Result<Self, String> {
        let content = Payload::encode(&value).map_err(|e| e.to_string())?;
        Ok(Artifact {
            hash: waymark_runtime::artifacts::artifact_hash(&content),
            kind: "retrieval".to_owned(),
            version: "1".to_owned(),
            value,
        })
    }
}

/// Kind, version label and causal metadata of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactMeta {
    kind: String,
    version: String,
    metadata: Vec<(String, String)>,
}

impl ArtifactMeta {
    /// An artifact of `kind` (`plan`, `retrieval`, …), version `1`.
    pub fn new(kind: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            version: "1".to_owned(),
            metadata: Vec::new(),
        }
    }

    /// The version label of its shape or policy.
    pub fn version(mut self, version: &str) -> Self {
        self.version = version.to_owned();
        self
    }

    /// Causal metadata: which prompt, model, tool, index or policy version produced it.
    pub fn with(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_owned(), value.to_owned()));
        self
    }
}

impl WorkflowContext {
    /// Commits `value` as an immutable, content-addressed artifact of kind `artifact`. The
    /// journal records only its hash; the content goes to the `artifacts` family.
    pub fn artifact<T: Serialize>(&self, value: T) -> Result<Artifact<T>, WorkflowError> {
        self.artifact_with(value, ArtifactMeta::new("artifact"))
    }

    /// [`WorkflowContext::artifact`] with a kind, a version label and causal metadata.
    pub fn artifact_with<T: Serialize>(
        &self,
        value: T,
        meta: ArtifactMeta,
    ) -> Result<Artifact<T>, WorkflowError> {
        let content = Payload::encode(&value)
            .map_err(|e| WorkflowError::Failed(format!("artifact does not serialize: {e}")))?;
        let ArtifactMeta {
            kind,
            version,
            metadata,
        } = meta;
        let hash = self
            .core()
            .commit_artifact(&kind, &version, metadata, content);
        Ok(Artifact {
            hash,
            kind,
            version,
            value,
        })
    }

    /// Asks a person to approve `artifact`, with the intents it authorises
    /// ([`ApprovalRequest::authorises`]) and the evidence it rests on
    /// ([`ApprovalRequest::evidence`]): the three are committed as one scope artifact (kind
    /// `approval_scope`), whose hash the request and the decision name. Publishes
    /// `approval_required` on the workflow's stream and waits (durably, holding no memory).
    /// Configure with `.risk(..)` and `.expires_in(..)`, then await the [`ApprovalOutcome`].
    pub fn approval<T>(&self, artifact: &Artifact<T>) -> ApprovalRequest {
        ApprovalRequest {
            ctx: self.clone(),
            artifact: artifact.digest(),
            evidence: Vec::new(),
            intents: Vec::new(),
            risk: Ok(Payload::unit()),
            expires_in: None,
        }
    }
}

/// An approval request under construction; await it.
#[must_use = "an approval request does nothing unless awaited"]
pub struct ApprovalRequest {
    ctx: WorkflowContext,
    artifact: Digest,
    evidence: Vec<Digest>,
    intents: Vec<Intent>,
    /// What the approver is told; an error if the author's value does not serialize, which
    /// stops the run when the request is made.
    risk: Result<Payload, PayloadError>,
    expires_in: Option<Duration>,
}

impl ApprovalRequest {
    /// An effect call the approval authorises (from [`WorkflowContext::intent`]): only the
    /// intents listed here may run `.under` the approval, each once.
    pub fn authorises(mut self, intent: &Intent) -> Self {
        self.intents.push(intent.clone());
        self
    }

    /// An artifact the approved decision rests on (a retrieval snapshot): part of what is
    /// approved, so the same plan on other evidence is another request.
    pub fn evidence<T>(mut self, artifact: &Artifact<T>) -> Self {
        self.evidence.push(artifact.digest());
        self
    }

    /// What the approver is told about the risk (any JSON-serializable value).
    pub fn risk(mut self, risk: impl Serialize) -> Self {
        self.risk = Payload::encode(&risk);
        self
    }

    /// Resolve as [`ApprovalOutcome::Expired`] if nobody decides within `duration` (a durable
    /// timer); an approval given in time may be acted on until then, not after.
    pub fn expires_in(mut self, duration: Duration) -> Self {
        self.expires_in = Some(duration);
        self
    }
}

impl IntoFuture for ApprovalRequest {
    type Output = ApprovalOutcome;
    type IntoFuture = PendingApproval;

    fn into_future(self) -> PendingApproval {
        let core = self.ctx.core().clone();
        let risk = self.risk.unwrap_or_else(|source| {
            let stop = RunError::PayloadMismatch { seq: None, source };
            core.stop(stop);
            // Never journaled: the run stops before anything is written.
            Payload::unit()
        });
        let scope = ApprovalScope::new(self.artifact, &self.evidence, self.intents);
        let intents = scope.intent_digests();
        let scope = match self.ctx.artifact_with(scope, ArtifactMeta::new(SCOPE_KIND)) {
            Ok(scope) => scope.digest(),
            Err(error) => {
                core.stop(RunError::Internal(format!("an approval scope: {error}")));
                Digest::of(b"")
            }
        };
        let expires_in_ms = self
            .expires_in
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let seq = core.request_approval(scope, risk, expires_in_ms);
        PendingApproval {
            core,
            seq,
            scope,
            artifact: self.artifact,
            intents,
            done: false,
            _not_unpin: PhantomData,
        }
    }
}

/// How an approval request ended. The author chooses what follows a rejection or an expiry
/// (ask again, fail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalOutcome {
    /// Approved: run the authorised effects `.under(&approval)`.
    Approved(Approval),
    /// Rejected.
    Rejected {
        /// Who.
        approver: String,
        /// Why.
        reason: String,
    },
    /// Nobody decided in time.
    Expired,
}

/// A granted approval of one scope: an artifact, the intents it authorises and the evidence
/// it rests on. Only `ctx.approval` makes one (it cannot be built or deserialized), and it
/// authorises each listed intent once: see [`EffectCall::under`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    approved: Approved,
}

impl Approval {
    /// The hash of the approved scope, `sha256:…`: what the decision named.
    pub fn scope_hash(&self) -> String {
        self.approved.granted.scope.hex()
    }

    /// The hash of the artifact shown to the approver, `sha256:…`.
    pub fn artifact_hash(&self) -> String {
        self.approved.granted.artifact.hex()
    }

    /// Who approved.
    pub fn approver(&self) -> &str {
        &self.approved.granted.approver
    }

    /// Until when it may be acted on, in worker-clock milliseconds.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.approved.granted.expires_at_ms
    }
}

/// The pending decision of `ctx.approval`.
#[must_use = "an approval request does nothing for the workflow unless awaited"]
pub struct PendingApproval {
    core: WorkflowCore,
    seq: Option<Seq>,
    scope: Digest,
    artifact: Digest,
    intents: Vec<Digest>,
    done: bool,
    _not_unpin: PhantomData<()>,
}

impl Future for PendingApproval {
    type Output = ApprovalOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ApprovalOutcome> {
        let (Some(seq), false) = (self.seq, self.done) else {
            return Poll::Pending;
        };
        let resolution = std::task::ready!(self.core.poll_resolution(seq, cx));
        let decision = match resolution {
            Resolution::Completed(payload) => payload.decode::<ApprovalDecision>().ok(),
            _ => None,
        };
        let Some(decision) = decision else {
            let message = "an approval resolved without a decision".to_owned();
            self.core
                .stop(RunError::InconsistentJournal { seq, message });
            return Poll::Pending;
        };
        self.done = true;
        Poll::Ready(self.outcome(seq, decision))
    }
}

impl futures::future::FusedFuture for PendingApproval {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl Drop for PendingApproval {
    fn drop(&mut self) {
        // A request that lost a select! is no longer pending: no decision can settle it.
        if let (Some(seq), false) = (self.seq, self.done) {
            self.core.abandon_wait(seq);
        }
    }
}

impl PendingApproval {
    fn outcome(&self, seq: Seq, decision: ApprovalDecision) -> ApprovalOutcome {
        match decision {
            ApprovalDecision::Approved {
                approver,
                at_ms,
                expires_at_ms,
            } => ApprovalOutcome::Approved(Approval {
                approved: Approved {
                    granted: Granted {
                        request: seq,
                        scope: self.scope,
                        artifact: self.artifact,
                        approver,
                        decided_at_ms: at_ms,
                        expires_at_ms,
                    },
                    intents: self.intents.clone(),
                },
            }),
            ApprovalDecision::Rejected {
                approver, reason, ..
            } => ApprovalOutcome::Rejected { approver, reason },
            ApprovalDecision::Expired { .. } => ApprovalOutcome::Expired,
        }
    }
}

impl<T> EffectCall<T> {
    /// Runs the effect under `approval`. The runtime computes the effect's intent from the
    /// call itself (effect name, semantics version, idempotency key, canonical arguments) and,
    /// right before every call, checks that the approval authorises that intent, that no
    /// other command ran it under the same approval, and that the approval has not expired.
    /// Any of them failing refuses the call with a terminal, journaled
    /// [`ActivityError::NotApproved`](crate::ActivityError::NotApproved) (counted when the
    /// intent is not authorised), after which the author asks for a new approval of what is
    /// now to run. The grant (request, scope, approver, time, expiry, intent) is recorded in
    /// the operation log with the call.
    pub fn under(self, approval: &Approval) -> Self {
        if let Some(seq) = self.seq() {
            self.core().run_under(seq, &approval.approved);
        }
        self
    }
}
