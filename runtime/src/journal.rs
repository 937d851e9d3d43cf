//! The journal: what happened to one workflow, as an append-only list of entries.
//!
//! Entries are postcard-encoded. postcard writes an enum variant as its *position* and a struct
//! as its fields one after the other, with no names, no lengths and no end marker: it is not
//! self-describing. So:
//!
//! - an enum is append-only: a new variant goes at the end, none is reordered or removed;
//! - a struct's fields are fixed: a field can be neither removed nor *appended*, since a reader
//!   cannot tell where the old layout ends (and `decode_record` rejects the trailing bytes a
//!   longer record leaves to an old reader);
//! - none uses `skip_serializing_if`, `flatten` or internal tags.
//!
//! A record type that needs another field gets a new layout under a new format number: the
//! type's [`Record::FORMAT`] goes up, its old layout stays as a private struct, and
//! [`Record::decode_older`] reads records of the old format and upgrades them
//! (`WorkflowRecord`, format 2, is the example). Adding a variant to an enum at the end is the
//! other way, and needs no new format. Every record carries its format byte in front
//! ([`encode_record`]); decoders keep reading every format ever written, which the golden files
//! under `runtime/tests/golden/` prove, and a record of a newer format than a build knows is an
//! error that says so.

use std::fmt;
use std::sync::Arc;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The format byte written in front of records whose layout never changed (and the oldest
/// format of every record type).
pub const FORMAT_VERSION: u8 = 1;

/// A type stored behind a format byte.
pub trait Record: Serialize + DeserializeOwned {
    /// The format this build writes.
    const FORMAT: u8 = FORMAT_VERSION;

    /// Reads a record written in an older `format` (1 ≤ format < `FORMAT`) and upgrades it.
    fn decode_older(format: u8, _body: &[u8]) -> Result<Self, DecodeError> {
        Err(DecodeError::UnknownVersion(format))
    }
}

impl Record for Entry {}
impl Record for String {}
impl Record for u64 {}

/// A command's position in the workflow code's sequence of ctx calls.
pub type Seq = u32;

/// A map keyed by command position, hashed by [`SeqHasher`].
pub type SeqMap<V> = std::collections::HashMap<Seq, V, BuildSeqHasher>;

/// A set of command positions, hashed by [`SeqHasher`].
pub type SeqSet = std::collections::HashSet<Seq, BuildSeqHasher>;

/// Builds [`SeqHasher`]s.
pub type BuildSeqHasher = std::hash::BuildHasherDefault<SeqHasher>;

/// Hashes a command position with one multiplication and a fold. A replay looks positions
/// up a few times per entry, and SipHash, the default, cost as much as decoding the entry.
/// The runtime hands positions out one after the other; a journal brought in by an import
/// could hold positions crafted to collide, which slows the replay of that workflow alone.
#[derive(Default, Clone, Copy)]
pub struct SeqHasher(u64);

impl std::hash::Hasher for SeqHasher {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.mix(u64::from(*byte));
        }
    }

    fn write_u32(&mut self, seq: u32) {
        self.mix(u64::from(seq));
    }

    fn finish(&self) -> u64 {
        // The product's low bits depend only on the position's low bits (multiples of 2^k all
        // end in k zeros), and the table takes its bucket from the low bits: fold the high,
        // well-mixed half into them.
        self.0 ^ (self.0 >> 32)
    }
}

impl SeqHasher {
    fn mix(&mut self, word: u64) {
        // Fibonacci hashing: the golden ratio's odd multiplier spreads consecutive positions
        // over the high bits the table's control bytes use and the low bits its buckets use.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A serialized value: canonical JSON bytes (object keys sorted), so the same value always has
/// the same bytes and the same digest, across processes and versions of this crate.
///
/// The bytes are shared, never changed: a payload goes from the code to the journal entry, the
/// activity's spec and the machine that delivers it, and each of those holds the same bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Payload(Arc<[u8]>);

/// As one run of bytes: postcard writes a length and the bytes, exactly as it writes a
/// sequence of `u8` (what a derived impl writes), so records read the same either way, and a
/// read is one copy instead of a push per byte. In JSON, a run of bytes is an array of
/// numbers, as a sequence is, and only an array is read (a string is no payload).
impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            deserializer.deserialize_seq(PayloadBytes)
        } else {
            deserializer.deserialize_byte_buf(PayloadBytes)
        }
    }
}

struct PayloadBytes;

impl<'de> serde::de::Visitor<'de> for PayloadBytes {
    type Value = Payload;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the bytes of a payload")
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Payload, E> {
        Ok(Payload(Arc::from(bytes)))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Payload, E> {
        Ok(Payload(Arc::from(bytes)))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Payload, A::Error> {
        // A length that is only claimed reserves little: the bytes must be there.
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(byte) = seq.next_element()? {
            bytes.push(byte);
        }
        Ok(Payload(Arc::from(bytes)))
    }
}

impl Payload {
    /// Serializes `value` canonically.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, PayloadError> {
        // The bytes are written from a `Value` with object keys sorted at every depth, so a
        // HashMap's iteration order, a struct's field order and serde_json's features are all
        // irrelevant to the digest.
        let value = serde_json::to_value(value).map_err(PayloadError::encode)?;
        Ok(Self::from_value(&value))
    }

    /// Deserializes into `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, PayloadError> {
        serde_json::from_slice(&self.0).map_err(PayloadError::decode)
    }

    /// Wraps bytes that are already canonical JSON, such as a body received over HTTP after
    /// [`Payload::from_json_bytes`] normalised it.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self, PayloadError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(PayloadError::decode)?;
        Self::encode(&value)
    }

    /// `value` canonically: a JSON value always encodes.
    pub fn from_value(value: &serde_json::Value) -> Self {
        Payload(crate::canonical::to_shared(value))
    }

    /// Wraps bytes the runtime wrote canonically itself ([`crate::canonical`]).
    pub(crate) fn from_canonical(bytes: Vec<u8>) -> Self {
        Payload(Arc::from(bytes))
    }

    /// The bytes as stored, which need not be JSON (a store's reference to parts kept apart):
    /// only a store builds one, and reads it back before anything else sees it.
    pub(crate) fn from_stored(bytes: Vec<u8>) -> Self {
        Payload(Arc::from(bytes))
    }

    /// JSON `null`, the input of commands that take none. One shared copy: a timer, a signal
    /// and every command without input take it.
    pub fn unit() -> Self {
        static NULL: std::sync::OnceLock<Arc<[u8]>> = std::sync::OnceLock::new();
        Payload(NULL.get_or_init(|| Arc::from(&b"null"[..])).clone())
    }

    /// An integer, whose canonical JSON is its decimal digits. Written where they stand, so the
    /// payload's own allocation is the only one: `ctx.now()`, `ctx.random()` and every timer's
    /// identity take one.
    pub fn from_u64(value: u64) -> Self {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        let mut rest = value;
        loop {
            start -= 1;
            digits[start] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        Payload(Arc::from(&digits[start..]))
    }

    /// The canonical bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// SHA-256 of the canonical bytes.
    pub fn digest(&self) -> Digest {
        Digest::of(&self.0)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// A value could not be turned into a payload or back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("payload {direction} failed: {message}")]
pub struct PayloadError {
    direction: &'static str,
    message: String,
}

impl PayloadError {
    fn encode(e: serde_json::Error) -> Self {
        Self {
            direction: "encoding",
            message: e.to_string(),
        }
    }
    fn decode(e: serde_json::Error) -> Self {
        Self {
            direction: "decoding",
            message: e.to_string(),
        }
    }
}

/// SHA-256 digest, used for command identities and input conflict checks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// The whole digest, `sha256:` and 64 hex digits: how artifacts are named outside.
    pub fn hex(&self) -> String {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// Parses [`Digest::hex`].
    pub fn parse_hex(text: &str) -> Option<Self> {
        let hex = text.strip_prefix("sha256:")?;
        if hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Digest(bytes))
    }

    /// The first 8 bytes in hex: enough to tell identities apart in messages.
    pub fn short(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.short())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.short())
    }
}

/// What kind of ctx call issued a command. Append-only.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum CommandKind {
    /// `ctx.activity`.
    Activity,
    /// `ctx.sleep`.
    Timer,
    /// `ctx.now`.
    Now,
    /// `ctx.random`.
    Random,
    /// `ctx.uuid`.
    Uuid,
    /// `ctx.patched`.
    Patch,
    /// A validator's verdict on a model answer (the repair ladder).
    Verdict,
    /// `ctx.signal`: a durable wait for a named external event.
    Signal,
    /// `ctx.artifact`: an immutable artifact committed (its identity digest is its hash).
    Artifact,
    /// `ctx.approval`: a wait for a person's decision on an artifact.
    Approval,
    /// `ctx.retrieve`: an activity whose result is kept as a snapshot artifact.
    Retrieval,
}

impl fmt::Display for CommandKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl CommandKind {
    /// Its name in renderings, spans and metrics.
    pub fn name(self) -> &'static str {
        match self {
            CommandKind::Activity => "activity",
            CommandKind::Timer => "timer",
            CommandKind::Now => "now",
            CommandKind::Random => "random",
            CommandKind::Uuid => "uuid",
            CommandKind::Patch => "patch",
            CommandKind::Verdict => "verdict",
            CommandKind::Signal => "signal",
            CommandKind::Artifact => "artifact",
            CommandKind::Approval => "approval",
            CommandKind::Retrieval => "retrieval",
        }
    }
}

/// What a command *is*: replay compares the identity issued by the code with the recorded one.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct CommandIdentity {
    /// The ctx call.
    pub kind: CommandKind,
    /// Activity name, `sleep`, or the patch id.
    pub name: String,
    /// Digest of the canonical input.
    pub input_digest: Digest,
}

impl CommandIdentity {
    /// The identity of a command with `input`.
    pub fn new(kind: CommandKind, name: impl Into<String>, input: &Payload) -> Self {
        Self {
            kind,
            name: name.into(),
            input_digest: input.digest(),
        }
    }
}

impl fmt::Display for CommandIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} `{}` (input {})",
            self.kind, self.name, self.input_digest
        )
    }
}

/// Why an attempt or a command failed. Append-only.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum FailureKind {
    /// A retry may help.
    Retriable,
    /// A retry will not help.
    Terminal,
    /// The effect may or may not have happened.
    Uncertain,
    /// The attempt did not answer within its start-to-close timeout.
    Timeout,
    /// The activity panicked.
    Panicked,
    /// The workflow body returned an error.
    Workflow,
    /// A precondition of an effect did not hold right before the call; the effect was not
    /// called.
    PreconditionFailed,
    /// Someone cancelled the workflow.
    Cancelled,
    /// An effect was called under an idempotency key already used with other arguments: the
    /// same intent by its key, another call by what it asks. Neither result is the answer.
    KeyConflict,
    /// An effect run under an approval that does not authorise its intent (not listed, used
    /// already, expired); the effect was not called.
    NotApproved,
}

impl FailureKind {
    /// Its name in metrics and spans.
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Retriable => "retriable",
            FailureKind::Terminal => "terminal",
            FailureKind::Uncertain => "uncertain",
            FailureKind::Timeout => "timeout",
            FailureKind::Panicked => "panicked",
            FailureKind::Workflow => "workflow",
            FailureKind::PreconditionFailed => "precondition_failed",
            FailureKind::Cancelled => "cancelled",
            FailureKind::KeyConflict => "key_conflict",
            FailureKind::NotApproved => "not_approved",
        }
    }
}

/// A failure as journaled: its class, a message, and the retry hint the activity gave.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Failure {
    /// Class, which decides what a retry may do.
    pub kind: FailureKind,
    /// Human-readable cause.
    pub message: String,
    /// The activity asked to wait at least this long before the next attempt.
    pub retry_after_ms: Option<u64>,
}

impl FailureKind {
    /// Whether another attempt may help.
    pub fn is_retriable(self) -> bool {
        !matches!(
            self,
            FailureKind::Terminal
                | FailureKind::PreconditionFailed
                | FailureKind::KeyConflict
                | FailureKind::NotApproved
        )
    }
}

impl Failure {
    /// Whether an effect that failed this way may have taken effect anyway: the request went
    /// out and no definite answer came back.
    pub fn leaves_outcome_unknown(&self) -> bool {
        matches!(
            self.kind,
            FailureKind::Uncertain | FailureKind::Timeout | FailureKind::Panicked
        )
    }

    /// A failure without a retry hint.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after_ms: None,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

/// The start of a workflow's journal.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct WorkflowStarted {
    /// Registered workflow name.
    pub workflow_name: String,
    /// The start argument.
    pub input: Payload,
    /// The caller's deduplication key, when given.
    pub request_id: Option<String>,
    /// Clock reading at start.
    pub started_at_ms: u64,
}

/// One journal entry. **Append-only**: new variants go at the end, none is ever removed or
/// reordered (a retired one stays, documented as such), because postcard encodes the position.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Entry {
    /// Always entry 0.
    WorkflowStarted(WorkflowStarted),
    /// The code issued `ctx.activity` at `seq`.
    ActivityScheduled {
        /// Command position.
        seq: Seq,
        /// What was issued.
        identity: CommandIdentity,
        /// The exact input, so an operator can see what ran.
        input: Payload,
    },
    /// An attempt succeeded; the result is delivered to the workflow. Journaled as
    /// [`Entry::ActivityCompletedAt`] (with its time, [`Entry::with_time`]) since steps show
    /// their duration; older journals hold this one.
    ActivityCompleted {
        /// Command position.
        seq: Seq,
        /// 1-based attempt that produced the result.
        attempt: u32,
        /// The result.
        output: Payload,
    },
    /// An attempt failed and another will run at `retry_at_ms`; not delivered to the workflow.
    ActivityAttemptFailed {
        /// Command position.
        seq: Seq,
        /// The attempt that failed.
        attempt: u32,
        /// Why.
        failure: Failure,
        /// When the next attempt may start.
        retry_at_ms: u64,
    },
    /// The activity failed for good (terminal error or attempts exhausted); delivered.
    /// Journaled as [`Entry::ActivityFailedAt`] since steps show their duration.
    ActivityFailed {
        /// Command position.
        seq: Seq,
        /// The last attempt.
        attempt: u32,
        /// Why.
        failure: Failure,
    },
    /// `ctx.sleep` at `seq` set a durable timer.
    TimerStarted {
        /// Command position.
        seq: Seq,
        /// Identity (kind timer, name `sleep`, digest of the duration).
        identity: CommandIdentity,
        /// The requested duration.
        duration_ms: u64,
        /// Clock time at which it fires.
        fire_at_ms: u64,
    },
    /// The timer at `seq` fired; delivered. Journaled as [`Entry::TimerFiredAt`] since steps
    /// show their duration.
    TimerFired {
        /// Command position.
        seq: Seq,
    },
    /// A value produced inside the workflow (`now`, `random`, `uuid`, a patch marker) recorded so
    /// that replay returns the same one.
    ValueRecorded {
        /// Command position.
        seq: Seq,
        /// What was issued.
        identity: CommandIdentity,
        /// The value.
        value: Payload,
    },
    /// The workflow returned `Ok`.
    WorkflowCompleted {
        /// Its output.
        output: Payload,
    },
    /// The workflow returned `Err`.
    WorkflowFailed {
        /// Its error.
        failure: Failure,
    },
    /// The code issued `ctx.activity` or `ctx.effect` at `seq`. Written since effects exist, in
    /// place of [`Entry::ActivityScheduled`] (which journals from before still contain).
    ActivityScheduledAt {
        /// Command position.
        seq: Seq,
        /// What was issued.
        identity: CommandIdentity,
        /// The exact input.
        input: Payload,
        /// Clock time when it was issued: the overall deadline counts from here.
        scheduled_at_ms: u64,
        /// The effect's idempotency key; `None` for a plain activity. Recorded so that a run
        /// resumed on code with another effect version keeps the key its operation used.
        idempotency_key: Option<String>,
    },
    /// An effect attempt ended without a definite outcome (timeout, lost acknowledgement, an
    /// `Uncertain` error, the worker stopping mid-call): it is reconciled before any retry.
    EffectUncertain {
        /// Command position.
        seq: Seq,
        /// The attempt.
        attempt: u32,
        /// Why the outcome is unknown.
        failure: Failure,
    },
    /// What reconciling an unknown outcome found, or how an operator resolved it.
    EffectReconciled {
        /// Command position.
        seq: Seq,
        /// The attempt concerned (0: the operation log answered before any attempt).
        attempt: u32,
        /// Who decided.
        by: ReconciledBy,
        /// The finding.
        verdict: Reconciliation,
    },
    /// `ctx.signal(name)` at `seq` waits for the next signal of that name.
    SignalAwaited {
        /// Command position.
        seq: Seq,
        /// Identity (kind signal, the signal's name).
        identity: CommandIdentity,
    },
    /// The signal delivered to the wait at `seq` (taken from the inbox in the same write).
    SignalReceived {
        /// Command position.
        seq: Seq,
        /// The sender's id for it (duplicates of an id are dropped on arrival).
        signal_id: String,
        /// What it carries.
        payload: Payload,
    },
    /// `ctx.artifact` at `seq` committed an artifact; its hash is `identity.input_digest`, its
    /// content lives in the `artifacts` family, not here.
    ArtifactCommitted {
        /// Command position.
        seq: Seq,
        /// Identity (kind artifact, the artifact's kind, its hash).
        identity: CommandIdentity,
    },
    /// `ctx.approval` at `seq` asks a person to decide on artifact `artifact_hash`.
    ApprovalRequested {
        /// Command position.
        seq: Seq,
        /// Identity (kind approval, digest of the artifact hash).
        identity: CommandIdentity,
        /// The artifact to approve.
        artifact_hash: Digest,
        /// What the author says about the risk, shown to the approver.
        risk: Payload,
        /// When the request expires, if it does.
        expires_at_ms: Option<u64>,
    },
    /// The decision on the approval at `seq`; delivered.
    ApprovalDecided {
        /// Command position.
        seq: Seq,
        /// Approved, rejected or expired.
        decision: ApprovalDecision,
    },
    /// The retrieval at `seq` completed; its result is the snapshot artifact `artifact` (kept
    /// in the `artifacts` family, not copied here). On replay the snapshot is delivered.
    SnapshotCompleted {
        /// Command position.
        seq: Seq,
        /// The attempt that completed.
        attempt: u32,
        /// The snapshot's hash.
        artifact: Digest,
    },
    /// The code dropped the wait at `seq` before it was settled (a sleep or an approval request
    /// that lost a `select!`): the wait's timer row (a sleep's, a request's expiry) is deleted
    /// in the same write, so it never fires, and a request is no longer listed as pending. On
    /// replay the code drops it again at the same point. A dropped signal wait is not
    /// journaled: nothing outside the run shows it, and the inbox keeps the signal.
    WaitDropped {
        /// Command position.
        seq: Seq,
    },
    /// The run was cancelled while effects it registered undos for may need undoing: from
    /// here the code no longer runs, the undos do (newest first), and the run then ends as
    /// `WorkflowFailed` with this failure. On replay the code is replaced at the same point.
    CancelRequested {
        /// The cancellation, as the run's end will record it.
        failure: Failure,
    },
    /// Who started the workflow (a caller's identity, never a request's body): entry 1 when the
    /// start came from a known caller.
    StartedBy {
        /// The caller.
        caller: String,
    },
    /// [`Entry::SignalReceived`] with who sent the signal (from the caller's identity, never
    /// from the request's body): written when the sender is known.
    SignalReceivedFrom {
        /// Command position.
        seq: Seq,
        /// The sender's id for it.
        signal_id: String,
        /// What it carries.
        payload: Payload,
        /// Who sent it.
        sender: String,
    },
    /// The entries before this one are a prefix of another workflow's journal: this workflow
    /// was forked from it. Written once, right after the prefix; replay passes over it.
    Forked(Forked),
    /// [`Entry::ActivityCompleted`] with when it was journaled: what the runtime writes since
    /// steps show how long they took (see [`Entry::with_time`]).
    ActivityCompletedAt {
        /// Command position.
        seq: Seq,
        /// 1-based attempt that produced the result (0: answered without a call).
        attempt: u32,
        /// The result.
        output: Payload,
        /// Clock time of the write that journaled it.
        completed_at_ms: u64,
    },
    /// [`Entry::ActivityFailed`] with when it was journaled.
    ActivityFailedAt {
        /// Command position.
        seq: Seq,
        /// The last attempt.
        attempt: u32,
        /// Why.
        failure: Failure,
        /// Clock time of the write that journaled it.
        failed_at_ms: u64,
    },
    /// [`Entry::SnapshotCompleted`] with when it was journaled.
    SnapshotCompletedAt {
        /// Command position.
        seq: Seq,
        /// The attempt that completed.
        attempt: u32,
        /// The snapshot's hash.
        artifact: Digest,
        /// Clock time of the write that journaled it.
        completed_at_ms: u64,
    },
    /// [`Entry::SignalAwaited`] with when the wait was journaled.
    SignalAwaitedAt {
        /// Command position.
        seq: Seq,
        /// Identity (kind signal, the signal's name).
        identity: CommandIdentity,
        /// Clock time of the write that journaled it.
        awaited_at_ms: u64,
    },
    /// [`Entry::SignalReceived`] and [`Entry::SignalReceivedFrom`] with when the signal was
    /// taken from the inbox.
    SignalReceivedAt {
        /// Command position.
        seq: Seq,
        /// The sender's id for it.
        signal_id: String,
        /// What it carries.
        payload: Payload,
        /// Who sent it, when known (from the caller's identity, never from a request's body).
        sender: Option<String>,
        /// Clock time of the write that journaled it.
        received_at_ms: u64,
    },
    /// [`Entry::ApprovalRequested`] with when the request was journaled.
    ApprovalRequestedAt {
        /// Command position.
        seq: Seq,
        /// Identity (kind approval, digest of the artifact hash).
        identity: CommandIdentity,
        /// The artifact to approve.
        artifact_hash: Digest,
        /// What the author says about the risk, shown to the approver.
        risk: Payload,
        /// When the request expires, if it does.
        expires_at_ms: Option<u64>,
        /// Clock time of the write that journaled it.
        requested_at_ms: u64,
    },
    /// [`Entry::TimerFired`] with when it was journaled (a timer fires late when the worker
    /// was down at its time).
    TimerFiredAt {
        /// Command position.
        seq: Seq,
        /// Clock time of the write that journaled it.
        fired_at_ms: u64,
    },
}

/// Where a forked workflow comes from, and what it does differently. Append-only (postcard).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Forked {
    /// The workflow it was forked from (stored id).
    pub source: String,
    /// How many of the source's entries it kept.
    pub at: u64,
    /// The workflow whose id its effects' idempotency keys derive from: the source's own root,
    /// so that the prefix replays to the same approval scopes, and an effect the source
    /// committed is one intent, not a new one.
    pub key_root: String,
    /// Effects whose keys derive from another workflow than `key_root`: the ones an operator
    /// named to fire again (this workflow's own), and those an earlier fork named.
    pub key_roots: Vec<(String, String)>,
    /// Models replaced in the model calls that run anew: (as the code names it, the one run).
    pub models: Vec<(String, String)>,
    /// Who forked it, when known.
    pub by: Option<String>,
    /// When, in worker-clock milliseconds.
    pub forked_at_ms: u64,
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

/// Who settled an effect's outcome. Append-only.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ReconciledBy {
    /// The effect's reconciler, asking the downstream by idempotency key.
    Reconciler,
    /// An operator, named.
    Operator(String),
    /// The operation log already held the outcome for this idempotency key (the same intent
    /// was issued before): the effect is not called again.
    OperationLog,
    /// Nobody could ask: the effect has no reconciler, so the runtime handed it to an operator.
    NoReconciler,
    /// The downstream itself reported the outcome (a webhook), as the named caller.
    Downstream(String),
}

/// The outcome of reconciliation. Append-only.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Reconciliation {
    /// The effect happened: this is its result, delivered to the workflow.
    Committed(Payload),
    /// It did not happen. The next entry says what follows: a retry (`ActivityAttemptFailed`)
    /// or the end (`ActivityFailed`).
    NotFound,
    /// The downstream cannot tell yet; asked again at `recheck_at_ms`.
    StillUnknown {
        /// What the reconciler said.
        message: String,
        /// When to ask again.
        recheck_at_ms: u64,
    },
    /// Nobody can tell automatically: the workflow waits for an operator.
    AwaitingOperator {
        /// Why, for the operator.
        reason: String,
    },
    /// An operator declared it failed; `ActivityFailed` follows.
    Failed {
        /// The operator's reason.
        message: String,
    },
}

impl Entry {
    /// The command this entry issues, if it is a command entry.
    pub fn command(&self) -> Option<(Seq, &CommandIdentity)> {
        match self {
            Entry::ActivityScheduled { seq, identity, .. }
            | Entry::ActivityScheduledAt { seq, identity, .. }
            | Entry::TimerStarted { seq, identity, .. }
            | Entry::SignalAwaited { seq, identity }
            | Entry::SignalAwaitedAt { seq, identity, .. }
            | Entry::ArtifactCommitted { seq, identity }
            | Entry::ApprovalRequested { seq, identity, .. }
            | Entry::ApprovalRequestedAt { seq, identity, .. }
            | Entry::ValueRecorded { seq, identity, .. } => Some((*seq, identity)),
            _ => None,
        }
    }

    /// The identity of the command this entry records, taken out of it (see [`Entry::command`]).
    pub(crate) fn into_identity(self) -> Option<CommandIdentity> {
        match self {
            Entry::ActivityScheduled { identity, .. }
            | Entry::ActivityScheduledAt { identity, .. }
            | Entry::TimerStarted { identity, .. }
            | Entry::SignalAwaited { identity, .. }
            | Entry::SignalAwaitedAt { identity, .. }
            | Entry::ArtifactCommitted { identity, .. }
            | Entry::ApprovalRequested { identity, .. }
            | Entry::ApprovalRequestedAt { identity, .. }
            | Entry::ValueRecorded { identity, .. } => Some(identity),
            _ => None,
        }
    }

    /// This entry as the runtime journals it in a write at `at_ms`: an entry that has a timed
    /// form (a step's end, a wait's start, a signal taken) carries the time, so that a step
    /// shows when it was issued and how long it took. The code builds the untimed forms; the
    /// executor's one write path adds the time. Any other entry, and one that has its time
    /// already, is unchanged.
    pub fn with_time(self, at_ms: u64) -> Entry {
        match self {
            Entry::ActivityCompleted {
                seq,
                attempt,
                output,
            } => Entry::ActivityCompletedAt {
                seq,
                attempt,
                output,
                completed_at_ms: at_ms,
            },
            Entry::ActivityFailed {
                seq,
                attempt,
                failure,
            } => Entry::ActivityFailedAt {
                seq,
                attempt,
                failure,
                failed_at_ms: at_ms,
            },
            Entry::SnapshotCompleted {
                seq,
                attempt,
                artifact,
            } => Entry::SnapshotCompletedAt {
                seq,
                attempt,
                artifact,
                completed_at_ms: at_ms,
            },
            Entry::SignalAwaited { seq, identity } => Entry::SignalAwaitedAt {
                seq,
                identity,
                awaited_at_ms: at_ms,
            },
            Entry::SignalReceived {
                seq,
                signal_id,
                payload,
            } => Entry::SignalReceivedAt {
                seq,
                signal_id,
                payload,
                sender: None,
                received_at_ms: at_ms,
            },
            Entry::SignalReceivedFrom {
                seq,
                signal_id,
                payload,
                sender,
            } => Entry::SignalReceivedAt {
                seq,
                signal_id,
                payload,
                sender: Some(sender),
                received_at_ms: at_ms,
            },
            Entry::ApprovalRequested {
                seq,
                identity,
                artifact_hash,
                risk,
                expires_at_ms,
            } => Entry::ApprovalRequestedAt {
                seq,
                identity,
                artifact_hash,
                risk,
                expires_at_ms,
                requested_at_ms: at_ms,
            },
            Entry::TimerFired { seq } => Entry::TimerFiredAt {
                seq,
                fired_at_ms: at_ms,
            },
            other => other,
        }
    }

    /// The time of the write that journaled this entry, for the timed forms
    /// ([`Entry::with_time`]).
    pub fn journaled_at(&self) -> Option<u64> {
        match self {
            Entry::ActivityCompletedAt {
                completed_at_ms: at,
                ..
            }
            | Entry::SnapshotCompletedAt {
                completed_at_ms: at,
                ..
            }
            | Entry::ActivityFailedAt {
                failed_at_ms: at, ..
            }
            | Entry::SignalAwaitedAt {
                awaited_at_ms: at, ..
            }
            | Entry::SignalReceivedAt {
                received_at_ms: at, ..
            }
            | Entry::ApprovalRequestedAt {
                requested_at_ms: at,
                ..
            }
            | Entry::TimerFiredAt {
                fired_at_ms: at, ..
            } => Some(*at),
            _ => None,
        }
    }

    /// Whether the workflow ended with this entry.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Entry::WorkflowCompleted { .. } | Entry::WorkflowFailed { .. }
        )
    }
}

/// A record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Zero bytes where a record was expected.
    #[error("empty record")]
    Empty,
    /// A format byte no Waymark writes.
    #[error("unknown format version {0}")]
    UnknownVersion(u8),
    /// A format newer than this build reads: the record is fine, the build is old.
    #[error("written by a newer Waymark (format {found}, this build reads up to {supported})")]
    NewerFormat {
        /// The record's format.
        found: u8,
        /// The newest format this build reads for the record's type.
        supported: u8,
    },
    /// postcard rejected the bytes.
    #[error("malformed record: {0}")]
    Malformed(String),
    /// The record decoded but bytes were left over, so it is not what was written.
    #[error("{0} trailing bytes after the record")]
    TrailingBytes(usize),
    /// A sealed record that could not be opened: no codec was given, or it refused.
    #[error("sealed record: {0}")]
    Sealed(crate::codec::CodecError),
}

/// Encodes `value` behind its type's current format byte.
pub fn encode_record<T: Record>(value: &T) -> Vec<u8> {
    // Room for a typical entry (a scheduled activity with its input is over 64 bytes): the
    // writer thread encodes a step's entries, and each growth was a copy and a second
    // allocation there. The buffer lives only until the batch is written.
    append_record(value, Vec::with_capacity(256))
}

/// [`encode_record`] written at the end of `out`: one buffer for many records.
fn append_record<T: Record>(value: &T, mut out: Vec<u8>) -> Vec<u8> {
    out.push(T::FORMAT);
    // postcard only fails on unsupported serde features (none are used by journal types) or on
    // a full fixed buffer (the Vec grows), so a failure here is a bug in a journal type.
    postcard::to_extend(value, out).expect("journal types are postcard-encodable")
}

/// Decodes a record written by [`encode_record`] in any format its type ever had.
pub fn decode_record<T: Record>(bytes: &[u8]) -> Result<T, DecodeError> {
    let (&format, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    match format {
        0 => Err(DecodeError::UnknownVersion(0)),
        current if current == T::FORMAT => decode_exact(body),
        older if older < T::FORMAT => T::decode_older(older, body),
        newer => Err(DecodeError::NewerFormat {
            found: newer,
            supported: T::FORMAT,
        }),
    }
}

/// Decodes one postcard body that must be all of `body`.
pub fn decode_exact<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if rest.is_empty() {
        Ok(value)
    } else {
        Err(DecodeError::TrailingBytes(rest.len()))
    }
}

/// Why `payload` (`what` names it, built only then) cannot be journaled under a maximum of
/// `max` bytes; `None` when it can.
pub(crate) fn oversized(
    payload: &Payload,
    max: usize,
    what: impl FnOnce() -> String,
) -> Option<String> {
    let bytes = payload.as_bytes().len();
    (bytes > max).then(|| {
        let what = what();
        format!(
            "{what} is {bytes} bytes, over the worker's maximum payload of {max} bytes \
             (WorkerBuilder::max_payload_bytes)"
        )
    })
}

/// Whether `payload` is what [`oversized_placeholder`] leaves in a payload's place.
pub fn is_oversized_placeholder(payload: &Payload) -> bool {
    if !payload.as_bytes().starts_with(br#"{"payload_too_large":"#) {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload.as_bytes()) else {
        return false;
    };
    let Some(object) = value.as_object() else {
        return false;
    };
    let inner = object.get("payload_too_large").and_then(|v| v.as_object());
    object.len() == 1 && inner.is_some_and(|i| i.contains_key("bytes") && i.contains_key("digest"))
}

/// What the journal holds in place of a payload too large to journal: its size and digest.
pub fn oversized_placeholder(payload: &Payload) -> Payload {
    let bytes = payload.as_bytes().len();
    let digest = payload.digest().hex();
    Payload::from_value(
        &serde_json::json!({"payload_too_large": {"bytes": bytes, "digest": digest}}),
    )
}

/// Writes entries as an export file: each record as a big-endian `u32` length then its bytes.
/// This is the format of `waymark export` and of the golden journal files.
pub fn write_framed(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        // Each record is encoded in place, behind room for its length.
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        out = append_record(entry, out);
        let len = out.len() - at - 4;
        let len = u32::try_from(len).expect("a journal entry is smaller than 4 GiB");
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    out
}

/// The context an export's record `index` is sealed under: it opens in no table of a store,
/// and at no other place of an export (a record moved, or taken from another place, does not
/// open).
fn export_context(index: usize) -> Vec<u8> {
    let mut context = b"export#".to_vec();
    context.extend_from_slice(&(index as u64).to_be_bytes());
    context
}

/// [`write_framed`] with every record sealed by `codec` (behind the store's seal mark), so an
/// export of an encrypted store stays encrypted.
pub fn write_framed_sealed(
    entries: &[Entry],
    codec: &dyn crate::codec::Codec,
) -> Result<Vec<u8>, crate::codec::CodecError> {
    let mut out = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let mut record = vec![crate::codec::SEALED];
        record.extend(codec.encode(&export_context(index), &encode_record(entry))?);
        let len = u32::try_from(record.len()).expect("a journal entry is smaller than 4 GiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&record);
    }
    Ok(out)
}

/// Reads an export file written by [`write_framed`]; the error names the entry index.
pub fn read_framed(bytes: &[u8]) -> Result<Vec<Entry>, (usize, DecodeError)> {
    read_framed_with(bytes, None)
}

/// Reads framed journal records written by [`write_framed`] or [`write_framed_sealed`] (the
/// golden files, and the older form of an export, which `Export::read` reads too),
/// opening sealed records with `codec`; the error names the entry index.
pub fn read_framed_with(
    mut bytes: &[u8],
    codec: Option<&dyn crate::codec::Codec>,
) -> Result<Vec<Entry>, (usize, DecodeError)> {
    let mut entries = Vec::new();
    let mut sealed = None;
    while !bytes.is_empty() {
        let index = entries.len();
        let truncated = || (index, DecodeError::Malformed("truncated frame".into()));
        let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(truncated)?;
        let len = u32::from_be_bytes(*len) as usize;
        let record = rest.get(..len).ok_or_else(truncated)?;
        let is_sealed = record.first() == Some(&crate::codec::SEALED);
        // An export is sealed or plain throughout: a plain record among sealed ones was not
        // written by the export.
        let sealed_export = *sealed.get_or_insert(is_sealed);
        let entry = match (is_sealed, sealed_export) {
            (true, true) => open_export_record(index, &record[1..], codec),
            (false, false) => decode_record(record),
            _ => Err(DecodeError::Malformed(
                "sealed and plain records mixed in one export".into(),
            )),
        };
        entries.push(entry.map_err(|e| (index, e))?);
        bytes = &rest[len..];
    }
    Ok(entries)
}

fn open_export_record(
    index: usize,
    sealed: &[u8],
    codec: Option<&dyn crate::codec::Codec>,
) -> Result<Entry, DecodeError> {
    let codec = codec.ok_or(DecodeError::Sealed(crate::codec::CodecError::NoKeys))?;
    let record = codec.decode(&export_context(index), sealed);
    decode_record(&record.map_err(DecodeError::Sealed)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Entry {
        Entry::ActivityCompleted {
            seq: 3,
            attempt: 2,
            output: Payload::encode(&serde_json::json!({"b": 1, "a": [true]})).unwrap(),
        }
    }

    /// [`Entry::into_identity`] lists the command entries again, by value, for the replay
    /// cursor: the entries of every golden journal give up the identity they name.
    #[test]
    fn an_entry_gives_up_the_identity_it_names() {
        let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
        let mut kinds = std::collections::HashSet::new();
        for file in std::fs::read_dir(golden).expect("checked in") {
            let path = file.expect("listed").path();
            let name = path.file_name().and_then(|name| name.to_str());
            if !name.is_some_and(|name| name.starts_with("journal-")) {
                continue;
            }
            let bytes = std::fs::read(&path).expect("readable");
            for entry in read_framed(&bytes).expect("golden journals decode") {
                let named = entry.command().map(|(_, identity)| identity.clone());
                if named.is_some() {
                    kinds.insert(std::mem::discriminant(&entry));
                }
                assert_eq!(entry.clone().into_identity(), named, "{entry:?}");
            }
        }
        assert_eq!(
            kinds.len(),
            9,
            "every kind of command entry is in a golden journal"
        );
    }

    #[test]
    fn an_integer_payload_is_its_decimal_digits() {
        for value in [0, 7, 10, 99, 1_000, 1_733_400_000_123, u64::MAX] {
            let payload = Payload::from_u64(value);
            assert_eq!(payload.as_bytes(), value.to_string().as_bytes());
            assert_eq!(payload.decode::<u64>(), Ok(value));
        }
    }

    #[test]
    fn record_round_trips() {
        let bytes = encode_record(&sample());
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode_record::<Entry>(&bytes), Ok(sample()));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let mut bytes = encode_record(&sample());
        bytes.push(0);
        assert_eq!(
            decode_record::<Entry>(&bytes),
            Err(DecodeError::TrailingBytes(1))
        );
    }

    #[test]
    fn unknown_version_and_garbage_are_errors_not_panics() {
        assert_eq!(decode_record::<Entry>(&[]), Err(DecodeError::Empty));
        let newer = decode_record::<Entry>(&[9, 0]).unwrap_err();
        assert_eq!(
            newer,
            DecodeError::NewerFormat {
                found: 9,
                supported: 1
            }
        );
        assert_eq!(
            newer.to_string(),
            "written by a newer Waymark (format 9, this build reads up to 1)"
        );
        assert_eq!(
            decode_record::<Entry>(&[0, 0]),
            Err(DecodeError::UnknownVersion(0))
        );
        assert!(matches!(
            decode_record::<Entry>(&[1, 200, 200, 200]),
            Err(DecodeError::Malformed(_))
        ));
    }

    /// A payload is written as one run of bytes: the same bytes a sequence of `u8` gives in
    /// postcard (so every stored record reads the same) and in JSON (an array of numbers).
    #[test]
    fn a_payload_is_written_as_its_byte_sequence_was() {
        let payload = Payload::encode(&serde_json::json!({"a": [1, 2]})).unwrap();
        let as_sequence = payload.as_bytes().to_vec();
        assert_eq!(
            postcard::to_stdvec(&payload).unwrap(),
            postcard::to_stdvec(&as_sequence).unwrap()
        );
        let json = serde_json::to_string(&payload).unwrap();
        assert_eq!(json, serde_json::to_string(&as_sequence).unwrap());
        assert_eq!(serde_json::from_str::<Payload>(&json).unwrap(), payload);
        assert!(
            serde_json::from_str::<Payload>(r#""{}""#).is_err(),
            "a string is no payload"
        );
        let read: Payload =
            postcard::from_bytes(&postcard::to_stdvec(&as_sequence).unwrap()).unwrap();
        assert_eq!(read, payload);
    }

    /// Positions that are multiples of a power of two, as a crafted import could hold, still
    /// spread over a table's buckets (its low bits).
    #[test]
    fn positions_spread_over_buckets() {
        use std::hash::BuildHasher;
        let build = BuildSeqHasher::default();
        for shift in [0, 4, 10, 16] {
            let buckets: std::collections::HashSet<u64> = (0..256u32)
                .map(|n| build.hash_one(n << shift) & 255)
                .collect();
            assert!(buckets.len() > 128, "2^{shift}: {} buckets", buckets.len());
        }
    }

    #[test]
    fn payloads_are_canonical() {
        let a: std::collections::HashMap<&str, u32> = [("x", 1), ("y", 2), ("z", 3)].into();
        let b: std::collections::BTreeMap<&str, u32> = [("z", 3), ("y", 2), ("x", 1)].into();
        let (a, b) = (Payload::encode(&a).unwrap(), Payload::encode(&b).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.digest(), b.digest());
        assert_eq!(a.as_bytes(), br#"{"x":1,"y":2,"z":3}"#);
    }

    /// The test build turns on `serde_json/preserve_order` (a dev-dependency), as any crate in
    /// an application's graph may: a struct's fields and a map's insertion order must still
    /// not reach the bytes, or every digest would change with an unrelated dependency.
    #[test]
    fn payloads_do_not_depend_on_serde_json_map_order() {
        let mut map = serde_json::Map::new();
        map.insert("z".into(), 1.into());
        map.insert("a".into(), 2.into());
        let first_key = map.keys().next().map(String::as_str);
        assert_eq!(first_key, Some("z"), "preserve_order is on in this build");

        #[derive(Serialize)]
        struct Booking {
            order_id: &'static str,
            carrier: &'static str,
            attempts: Vec<u8>,
        }
        let booking = Booking {
            order_id: "A-1",
            carrier: "fastship",
            attempts: vec![1, 2],
        };
        let payload = Payload::encode(&booking).unwrap();
        assert_eq!(
            payload.as_bytes(),
            br#"{"attempts":[1,2],"carrier":"fastship","order_id":"A-1"}"#
        );
        assert_eq!(
            payload.digest().hex(),
            "sha256:79226dd6b51d26e98cd5c73292eb4db8393a9b9db0938a8785ce8f07f18d3426"
        );
        let from_map = Payload::encode(&serde_json::Value::Object(map)).unwrap();
        assert_eq!(from_map.as_bytes(), br#"{"a":2,"z":1}"#);
    }

    #[test]
    fn framed_files_report_the_bad_entry() {
        let bytes = write_framed(&[sample(), sample()]);
        assert_eq!(read_framed(&bytes).unwrap(), vec![sample(), sample()]);
        let err = read_framed(&bytes[..bytes.len() - 3]).unwrap_err();
        assert_eq!(err.0, 1);
    }

    /// The frames of an export: each length and record.
    fn frames(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let mut rest = bytes;
        while let Some((len, tail)) = rest.split_first_chunk::<4>() {
            let len = 4 + u32::from_be_bytes(*len) as usize;
            frames.push(rest[..len].to_vec());
            rest = &tail[len - 4..];
        }
        frames
    }

    #[test]
    fn a_sealed_export_refuses_moved_and_plain_records() {
        let key = crate::codec::EncryptionKey::generate("k").unwrap();
        let ring = crate::codec::Keyring::new(vec![key]).unwrap();
        let other = Entry::TimerFired { seq: 9 };
        let sealed = write_framed_sealed(&[sample(), other.clone()], &ring).unwrap();
        let opened = read_framed_with(&sealed, Some(&ring)).unwrap();
        assert_eq!(opened, vec![sample(), other.clone()]);
        let sealed_frames = frames(&sealed);
        let swapped = [sealed_frames[1].clone(), sealed_frames[0].clone()].concat();
        assert_eq!(read_framed_with(&swapped, Some(&ring)).unwrap_err().0, 0);
        let plain_frames = frames(&write_framed(&[sample(), other]));
        let spliced = [sealed_frames[0].clone(), plain_frames[1].clone()].concat();
        let (index, error) = read_framed_with(&spliced, Some(&ring)).unwrap_err();
        assert_eq!(index, 1);
        assert!(error.to_string().contains("mixed"), "{error}");
    }
}
