//! What an approval covers, and the check an effect passes right before it runs under one.
//!
//! An effect's [`Intent`] is computed by the runtime from the command itself (effect name,
//! semantics version, idempotency key, canonical arguments), never passed in by workflow code.
//! A request puts an [`ApprovalScope`] to a person: the artifact shown, the intents it
//! authorises and the evidence it rests on. The scope is committed as an artifact and the
//! request names its hash, so a decision is for that whole scope: a new plan, other arguments
//! or new evidence make another scope, another hash, another request. Right before the call,
//! [`Grant::admit`] checks the effect's own digest against the granted scope.

use serde::{Deserialize, Serialize};

use crate::journal::{Digest, Payload, Seq};

/// The artifact kind of an approval's scope.
pub const SCOPE_KIND: &str = "approval_scope";

/// One call of one effect, as it will execute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    /// The effect (activity) name.
    pub operation: String,
    /// Its semantics version.
    pub version: u32,
    /// Its idempotency key.
    pub idempotency_key: String,
    /// Its whole input, canonical JSON: the typed arguments encoded again from their type, so
    /// two spellings that decode to the same value are one intent.
    pub arguments: serde_json::Value,
}

impl Intent {
    /// The intent's digest: sha256 of its canonical JSON.
    pub fn digest(&self) -> Digest {
        let value = serde_json::json!({
            "operation": self.operation,
            "version": self.version,
            "idempotency_key": self.idempotency_key,
            "arguments": self.arguments,
        });
        Payload::from_value(&value).digest()
    }
}

/// An intent with its digest, as a scope lists it (so a reader can check one against the other).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorisedIntent {
    /// [`Intent::digest`], `sha256:…`.
    pub digest: String,
    /// The call.
    pub intent: Intent,
}

/// What a person approves: committed as an artifact of kind [`SCOPE_KIND`], whose hash the
/// request and the decision name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalScope {
    /// The artifact shown (a plan, a tool call), `sha256:…`.
    pub artifact: String,
    /// The artifacts it rests on (retrieval snapshots), `sha256:…`.
    pub evidence: Vec<String>,
    /// The effect calls it authorises.
    pub intents: Vec<AuthorisedIntent>,
}

impl ApprovalScope {
    /// A scope for `artifact`, `evidence` and `intents`, each listed once, in the order given.
    pub fn new(artifact: Digest, evidence: &[Digest], intents: Vec<Intent>) -> Self {
        let mut evidence: Vec<String> = evidence.iter().map(Digest::hex).collect();
        dedup_in_order(&mut evidence, |e| e.clone());
        let mut intents: Vec<AuthorisedIntent> = intents
            .into_iter()
            .map(|intent| AuthorisedIntent {
                digest: intent.digest().hex(),
                intent,
            })
            .collect();
        dedup_in_order(&mut intents, |i| i.digest.clone());
        Self {
            artifact: artifact.hex(),
            evidence,
            intents,
        }
    }

    /// The digests of the intents it authorises.
    pub fn intent_digests(&self) -> Vec<Digest> {
        let parsed = self.intents.iter().map(|i| Digest::parse_hex(&i.digest));
        parsed.flatten().collect()
    }
}

fn dedup_in_order<T, K: Eq + std::hash::Hash>(items: &mut Vec<T>, key: impl Fn(&T) -> K) {
    let mut seen = std::collections::HashSet::new();
    items.retain(|item| seen.insert(key(item)));
}

/// A person's approval of one request's scope. Append-only (postcard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Granted {
    /// The request it answers.
    pub request: Seq,
    /// The approved scope's hash: what the decision named.
    pub scope: Digest,
    /// The artifact shown to the approver.
    pub artifact: Digest,
    /// Who approved.
    pub approver: String,
    /// When, in worker-clock milliseconds.
    pub decided_at_ms: u64,
    /// Until when it may be acted on.
    pub expires_at_ms: Option<u64>,
}

/// A granted approval as the workflow holds it: the decision, and the digests of the intents
/// its scope authorises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approved {
    /// The decision.
    pub granted: Granted,
    /// The digests of the intents the scope authorises.
    pub intents: Vec<Digest>,
}

/// A granted approval as the operation log records it with each call made under it: the
/// decision, and the intent that ran. Append-only (postcard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The decision.
    pub granted: Granted,
    /// The digest of the intent the call was (or, on a `not_attempted` record, would have
    /// been) made for, as the runtime computed it.
    pub intent: Digest,
}

/// Why an effect may not run under an approval. The effect is not called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotApproved {
    /// The effect's own intent is not one the approval lists.
    #[error(
        "intent {intent} of `{operation}` is not authorised by approval request {request} \
         (scope {scope}, which authorises {authorised}); ask for an approval of this intent"
    )]
    NotAuthorised {
        /// The effect.
        operation: String,
        /// Its intent's digest, as the runtime computed it, `sha256:…`.
        intent: String,
        /// The approval request.
        request: Seq,
        /// The approved scope, `sha256:…`.
        scope: String,
        /// The digests the scope authorises, comma-separated (`none` if it lists none).
        authorised: String,
    },
    /// Another command already ran this intent under the same approval.
    #[error(
        "approval request {request} was already used for intent {intent} by command {by}; \
         an approval authorises each intent once"
    )]
    AlreadyUsed {
        /// The approval request.
        request: Seq,
        /// The intent, `sha256:…`.
        intent: String,
        /// The command that used it.
        by: Seq,
    },
    /// The approval expired before the call.
    #[error(
        "approval request {request} expired at {expires_at_ms} ms, before the call at {now_ms} ms"
    )]
    Expired {
        /// The approval request.
        request: Seq,
        /// Its expiry.
        expires_at_ms: u64,
        /// The time of the call.
        now_ms: u64,
    },
    /// The command is not an effect, so it has no intent to approve.
    #[error("`{operation}` is not an effect: only an effect's intent can run under an approval")]
    NotAnEffect {
        /// The activity.
        operation: String,
    },
}

/// A granted approval as an effect command holds it: the grant, and whether it authorises
/// the effect (decided when the effect is issued, from the effect's own input).
#[derive(Debug, Clone)]
pub struct Authorisation {
    /// The grant, recorded in the operation log.
    pub grant: Grant,
    /// `Err` when the approval does not cover this command.
    pub admitted: Result<(), NotApproved>,
}

impl Authorisation {
    /// Right before a call at `now_ms`: the admission decided at issue, then the expiry.
    pub fn admit(&self, now_ms: u64) -> Result<(), NotApproved> {
        self.admitted.clone()?;
        match self.grant.granted.expires_at_ms {
            Some(expires_at_ms) if expires_at_ms <= now_ms => Err(NotApproved::Expired {
                request: self.grant.granted.request,
                expires_at_ms,
                now_ms,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(carrier: &str) -> Intent {
        Intent {
            operation: "rebook".into(),
            version: 1,
            idempotency_key: r#"wf|rebook|["ORD-1"]|v1"#.into(),
            arguments: serde_json::json!(["ORD-1", carrier]),
        }
    }

    #[test]
    fn an_intent_digest_changes_with_every_part() {
        let base = intent("fastship");
        let digests = [
            base.digest(),
            intent("slowship").digest(),
            Intent {
                version: 2,
                ..base.clone()
            }
            .digest(),
            Intent {
                operation: "cancel".into(),
                ..base.clone()
            }
            .digest(),
            Intent {
                idempotency_key: "other".into(),
                ..base.clone()
            }
            .digest(),
        ];
        let distinct: std::collections::HashSet<_> = digests.iter().collect();
        assert_eq!(distinct.len(), digests.len());
        assert_eq!(base.digest(), intent("fastship").digest());
    }

    #[test]
    fn a_scope_lists_each_intent_and_evidence_once_and_its_hash_covers_the_evidence() {
        let plan = Digest::of(b"plan");
        let (e1, e2) = (Digest::of(b"docs-1"), Digest::of(b"docs-2"));
        let twice = vec![intent("fastship"), intent("fastship")];
        let scope = ApprovalScope::new(plan, &[e1, e1], twice.clone());
        assert_eq!(scope.intents.len(), 1);
        assert_eq!(scope.evidence, [e1.hex()]);
        assert_eq!(scope.intent_digests(), [intent("fastship").digest()]);
        let hash = |s: &ApprovalScope| Payload::encode(s).unwrap().digest();
        let other_evidence = ApprovalScope::new(plan, &[e2], twice);
        assert_ne!(hash(&scope), hash(&other_evidence));
    }

    #[test]
    fn an_admitted_grant_is_refused_once_expired() {
        let granted = Granted {
            request: 3,
            scope: Digest::of(b"scope"),
            artifact: Digest::of(b"plan"),
            approver: "dana".into(),
            decided_at_ms: 10,
            expires_at_ms: Some(100),
        };
        let grant = Grant {
            granted,
            intent: intent("fastship").digest(),
        };
        let authorisation = Authorisation {
            grant,
            admitted: Ok(()),
        };
        assert_eq!(authorisation.admit(99), Ok(()));
        assert!(matches!(
            authorisation.admit(100),
            Err(NotApproved::Expired { now_ms: 100, .. })
        ));
    }
}
