//! Golden journal files: bytes written by each format version, checked in, decoded forever.
//!
//! `journal-v1.bin` holds one entry of every kind as format version 1 wrote them;
//! `journal-v1-effects.bin` the variants appended to version 1 with effects, and
//! `operations-v1.bin` one operation log record of every status; `journal-v1-signals.bin` the
//! variants appended with signals, validator verdicts and streaming, and
//! `streams-inbox-v1.bin` one stream item of every kind and an inbox message;
//! `journal-v1-approvals.bin` the artifact, approval and snapshot entries, and
//! `records-v1-approvals.bin` an artifact record, a `not_attempted` operation and a progress
//! stream item; `workflow-records-v1.bin` workflow records of every status as format 1 wrote
//! them (written by the last build that had format 1), and `workflow-records-v2.bin` the same
//! in format 2, which added why a run is stuck; `journal-v1-cancel.bin` the cancelled timer;
//! `operations-v2.bin` operation records of format 2, which added the approval, the kept
//! external reference and the history, and `operations-v3.bin` of format 3, whose history
//! events name their command; `journal-v1-step-times.bin` the step ends that carry their time,
//! and `journal-v1-wait-times.bin` the waits that do; `parked-marks-v1.bin` parked marks as
//! format 1 wrote them (the code digest alone), and `parked-marks-v2.bin` those of format 2,
//! which added the signal names the run's waits listen for.
//! If a change
//! to the journal types breaks this test, the change broke every stored journal: add a variant
//! at the end or a new format version instead. The file is never regenerated; a new format
//! version gets a new file (`cargo test -p waymark-runtime --test golden -- --ignored` writes
//! the current version's file if it does not exist yet).

use waymark_runtime::approvals::{Grant, Granted};
use waymark_runtime::artifacts::ArtifactRecord;
use waymark_runtime::inbox::InboxMessage;
use waymark_runtime::journal::ApprovalDecision;
use waymark_runtime::journal::{
    decode_exact, decode_record, encode_record, read_framed, write_framed, CommandIdentity,
    CommandKind, Digest, Entry, Failure, FailureKind, Payload, ReconciledBy, Reconciliation,
    WorkflowStarted, FORMAT_VERSION,
};
use waymark_runtime::operations::{render_operations, OperationRecord, OperationStatus};
use waymark_runtime::render::render_journal;
use waymark_runtime::store::{ParkedMark, RunStop, StopCode, WorkflowRecord, WorkflowStatus};
use waymark_runtime::streams::StreamItem;

fn payload(json: &str) -> Payload {
    Payload::from_json_bytes(json.as_bytes()).expect("valid JSON")
}

fn identity(kind: CommandKind, name: &str, input: &Payload) -> CommandIdentity {
    CommandIdentity::new(kind, name, input)
}

/// One entry of every variant, with every failure kind and command kind.
fn every_entry_v1() -> Vec<Entry> {
    let order = payload(r#"{"order_id":"A-1","qty":2}"#);
    let mut entries = vec![
        Entry::WorkflowStarted(WorkflowStarted {
            workflow_name: "rebook_delayed".into(),
            input: order.clone(),
            request_id: Some("req-1".into()),
            started_at_ms: 1_767_225_600_000,
        }),
        Entry::ActivityScheduled {
            seq: 0,
            identity: identity(CommandKind::Activity, "load_order", &order),
            input: order.clone(),
        },
        Entry::ActivityCompleted {
            seq: 0,
            attempt: 1,
            output: payload(r#"{"carrier":"slowship"}"#),
        },
    ];
    let kinds = [
        FailureKind::Retriable,
        FailureKind::Terminal,
        FailureKind::Uncertain,
        FailureKind::Timeout,
        FailureKind::Panicked,
    ];
    for (attempt, kind) in (1..).zip(kinds) {
        entries.push(Entry::ActivityAttemptFailed {
            seq: 1,
            attempt,
            failure: Failure {
                kind,
                message: format!("{kind:?} failure"),
                retry_after_ms: Some(250),
            },
            retry_at_ms: 1_767_225_601_000,
        });
    }
    let duration = Payload::from_u64(2_000);
    entries.extend([
        Entry::ActivityFailed {
            seq: 1,
            attempt: 6,
            failure: Failure::new(FailureKind::Terminal, "not found"),
        },
        Entry::TimerStarted {
            seq: 2,
            identity: identity(CommandKind::Timer, "sleep", &duration),
            duration_ms: 2_000,
            fire_at_ms: 1_767_225_602_000,
        },
        Entry::TimerFired { seq: 2 },
    ]);
    let values = [
        (CommandKind::Now, Payload::from_u64(1_767_225_602_000)),
        (CommandKind::Random, Payload::from_u64(42)),
        (
            CommandKind::Uuid,
            payload(r#""0b7e8c1a-3f2d-4e5b-9a6c-7d8e9f0a1b2c""#),
        ),
        (CommandKind::Patch, Payload::unit()),
    ];
    for (seq, (kind, value)) in (3..).zip(values) {
        let name = match kind {
            CommandKind::Patch => "price-v2".to_owned(),
            other => other.to_string(),
        };
        entries.push(Entry::ValueRecorded {
            seq,
            identity: identity(kind, &name, &Payload::unit()),
            value,
        });
    }
    entries.extend([
        Entry::WorkflowCompleted {
            output: payload(r#"{"ok":true}"#),
        },
        Entry::WorkflowFailed {
            failure: Failure::new(FailureKind::Workflow, "gave up"),
        },
    ]);
    entries
}

/// The variants appended to version 1 with effects, with every verdict and decider.
fn every_effect_entry_v1() -> Vec<Entry> {
    let order = payload(r#"["ORD-7","fastship"]"#);
    let key = r#"wf-1|rebook|["ORD-7"]|v2"#.to_owned();
    let uncertain = Failure::new(FailureKind::Uncertain, "read timed out");
    let mut entries = vec![
        Entry::ActivityScheduledAt {
            seq: 0,
            identity: identity(CommandKind::Activity, "load_order", &order),
            input: order.clone(),
            scheduled_at_ms: 1_767_225_600_000,
            idempotency_key: None,
        },
        Entry::ActivityScheduledAt {
            seq: 1,
            identity: identity(CommandKind::Activity, "rebook", &order),
            input: order.clone(),
            scheduled_at_ms: 1_767_225_600_500,
            idempotency_key: Some(key),
        },
        Entry::EffectUncertain {
            seq: 1,
            attempt: 1,
            failure: uncertain,
        },
        Entry::ActivityFailed {
            seq: 1,
            attempt: 2,
            failure: Failure::new(FailureKind::PreconditionFailed, "order no longer delayed"),
        },
    ];
    let verdicts = [
        (
            ReconciledBy::Reconciler,
            Reconciliation::Committed(payload(r#""ref-1""#)),
        ),
        (ReconciledBy::Reconciler, Reconciliation::NotFound),
        (
            ReconciledBy::Reconciler,
            Reconciliation::StillUnknown {
                message: "503".into(),
                recheck_at_ms: 1_767_225_601_000,
            },
        ),
        (
            ReconciledBy::Reconciler,
            Reconciliation::AwaitingOperator {
                reason: "no reconciler".into(),
            },
        ),
        (
            ReconciledBy::Operator("ops@example".into()),
            Reconciliation::Failed {
                message: "carrier has no record".into(),
            },
        ),
        (
            ReconciledBy::OperationLog,
            Reconciliation::Committed(payload(r#""ref-1""#)),
        ),
    ];
    for (by, verdict) in verdicts {
        entries.push(Entry::EffectReconciled {
            seq: 1,
            attempt: 1,
            by,
            verdict,
        });
    }
    entries
}

/// The variants appended to version 1 with signals, validator verdicts and parking for lack of
/// a reconciler.
fn every_signal_entry_v1() -> Vec<Entry> {
    let unit = Payload::unit();
    let verdict = payload(r#"{"depth":0,"model":"planner","passed":true,"reason":null}"#);
    vec![
        Entry::SignalAwaited {
            seq: 0,
            identity: identity(CommandKind::Signal, "approval", &unit),
        },
        Entry::SignalReceived {
            seq: 0,
            signal_id: "sig-1".into(),
            payload: payload(r#"{"approve":true}"#),
        },
        Entry::ValueRecorded {
            seq: 1,
            identity: identity(CommandKind::Verdict, "validation", &unit),
            value: verdict,
        },
        Entry::EffectReconciled {
            seq: 2,
            attempt: 1,
            by: ReconciledBy::NoReconciler,
            verdict: Reconciliation::AwaitingOperator {
                reason: "no reconciler".into(),
            },
        },
    ]
}

/// One stream item of every kind, then an inbox message; each framed like the journal.
fn streams_and_inbox_v1() -> (Vec<StreamItem>, InboxMessage) {
    let items = vec![
        StreamItem::Chunk {
            step: 3,
            response_version: 1,
            text: "We are".into(),
        },
        StreamItem::Superseded {
            step: 3,
            response_version: 1,
            reason: "model call timed out".into(),
        },
        StreamItem::Committed {
            step: 3,
            response_version: 2,
        },
    ];
    let message = InboxMessage {
        name: "approval".into(),
        signal_id: "sig-1".into(),
        payload: payload(r#"{"approve":true}"#),
        sent_at_ms: 1_767_225_600_000,
        sender: None,
    };
    (items, message)
}

/// Records framed like journal exports: length, then the record.
fn frame(records: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for bytes in records {
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
    }
    out
}

fn unframe(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while let Some((len, tail)) = bytes.split_first_chunk::<4>() {
        let len = u32::from_be_bytes(*len) as usize;
        frames.push(&tail[..len]);
        bytes = &tail[len..];
    }
    frames
}

fn write_streams_and_inbox() -> Vec<u8> {
    let (items, message) = streams_and_inbox_v1();
    let mut records: Vec<Vec<u8>> = items.iter().map(encode_record).collect();
    records.push(encode_record(&message));
    frame(records)
}

#[test]
fn version_1_signal_entries_stream_items_and_inbox_messages_still_decode() {
    let bytes = std::fs::read(golden_file("journal-v1-signals.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 signal-era record decodes");
    assert_eq!(decoded, every_signal_entry_v1());
    assert_eq!(write_framed(&every_signal_entry_v1()), bytes);
    let bytes = std::fs::read(golden_file("streams-inbox-v1.bin")).expect("checked in");
    let records = unframe(&bytes);
    let (items, message) = streams_and_inbox_v1();
    let (item_bytes, message_bytes) = records.split_at(items.len());
    // The stream items are still written as then; the inbox message is at format 2 now.
    let written = write_streams_and_inbox();
    let rewritten = unframe(&written);
    assert_eq!(rewritten[..items.len()], records[..items.len()]);
    assert_eq!(message_bytes[0][0], 1, "written in format 1");
    let decoded: Vec<StreamItem> = item_bytes
        .iter()
        .map(|b| decode_record(b).expect("a v1 stream item decodes"))
        .collect();
    assert_eq!(decoded, items);
    let decoded: InboxMessage = decode_record(message_bytes[0]).expect("a v1 inbox message");
    assert_eq!(decoded, message);
    insta::assert_snapshot!(render_journal(&every_signal_entry_v1()));
}

/// The variants appended to version 1 with compensation and with callers' identities, and an
/// inbox message at format 2 (with its sender).
fn every_sender_era_record() -> (Vec<Entry>, InboxMessage) {
    let entries = vec![
        Entry::StartedBy {
            caller: "ops".into(),
        },
        Entry::CancelRequested {
            failure: Failure::new(FailureKind::Cancelled, "cancelled by ops: called off"),
        },
        Entry::SignalReceivedFrom {
            seq: 3,
            signal_id: "sig-2".into(),
            payload: payload(r#"{"approve":false}"#),
            sender: "dana".into(),
        },
    ];
    let message = InboxMessage {
        name: "approval".into(),
        signal_id: "sig-2".into(),
        payload: payload(r#"{"approve":false}"#),
        sent_at_ms: 1_767_225_600_000,
        sender: Some("dana".into()),
    };
    (entries, message)
}

fn write_sender_era_records() -> Vec<u8> {
    let (entries, message) = every_sender_era_record();
    let mut records: Vec<Vec<u8>> = entries.iter().map(encode_record).collect();
    records.push(encode_record(&message));
    frame(records)
}

#[test]
fn cancellation_and_signal_sender_records_still_decode() {
    let bytes = std::fs::read(golden_file("records-v1-senders.bin")).expect("checked in");
    assert_eq!(write_sender_era_records(), bytes);
    let records = unframe(&bytes);
    let (entries, message) = every_sender_era_record();
    let (entry_bytes, message_bytes) = records.split_at(entries.len());
    let decoded: Vec<Entry> = entry_bytes
        .iter()
        .map(|b| decode_record(b).expect("an entry decodes"))
        .collect();
    assert_eq!(decoded, entries);
    assert_eq!(message_bytes[0][0], 2, "written in format 2");
    let decoded: InboxMessage = decode_record(message_bytes[0]).expect("a v2 inbox message");
    assert_eq!(decoded, message);
    insta::assert_snapshot!(render_journal(&entries));
}

/// The variant appended to version 1 when dropped waits became journaled.
fn every_cancel_entry_v1() -> Vec<Entry> {
    vec![Entry::WaitDropped { seq: 4 }]
}

#[test]
fn version_1_dropped_waits_still_decode() {
    let bytes = std::fs::read(golden_file("journal-v1-cancel.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 record decodes");
    assert_eq!(decoded, every_cancel_entry_v1());
    assert_eq!(write_framed(&every_cancel_entry_v1()), bytes);
    assert_eq!(render_journal(&decoded), "  0 wait_dropped        seq=4\n");
}

/// The variants appended to version 1 when a step's end began to carry its time.
fn every_timed_end_entry_v1() -> Vec<Entry> {
    vec![
        Entry::ActivityCompletedAt {
            seq: 0,
            attempt: 2,
            output: payload(r#"{"carrier":"DHL"}"#),
            completed_at_ms: 1_767_225_600_750,
        },
        Entry::ActivityFailedAt {
            seq: 1,
            attempt: 3,
            failure: Failure::new(FailureKind::Terminal, "no car left"),
            failed_at_ms: 1_767_225_609_000,
        },
        Entry::SnapshotCompletedAt {
            seq: 2,
            attempt: 1,
            artifact: Digest([7; 32]),
            completed_at_ms: 1_767_225_610_020,
        },
    ]
}

#[test]
fn version_1_timed_step_ends_still_decode_and_render_as_untimed_ones() {
    let bytes = std::fs::read(golden_file("journal-v1-step-times.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 record decodes");
    assert_eq!(decoded, every_timed_end_entry_v1());
    assert_eq!(write_framed(&every_timed_end_entry_v1()), bytes);
    let times: Vec<Option<u64>> = decoded.iter().map(Entry::journaled_at).collect();
    assert_eq!(
        times,
        [
            Some(1_767_225_600_750),
            Some(1_767_225_609_000),
            Some(1_767_225_610_020)
        ]
    );
    // A time is not behaviour: snapshots of journals render the same with or without it.
    let untimed = vec![
        Entry::ActivityCompleted {
            seq: 0,
            attempt: 2,
            output: payload(r#"{"carrier":"DHL"}"#),
        },
        Entry::ActivityFailed {
            seq: 1,
            attempt: 3,
            failure: Failure::new(FailureKind::Terminal, "no car left"),
        },
        Entry::SnapshotCompleted {
            seq: 2,
            attempt: 1,
            artifact: Digest([7; 32]),
        },
    ];
    assert_eq!(render_journal(&decoded), render_journal(&untimed));
    let stamped: Vec<Entry> = untimed.into_iter().map(|e| e.with_time(5)).collect();
    assert!(stamped.iter().all(|e| e.journaled_at() == Some(5)));
}

/// The variants appended to version 1 when waits and timers began to carry their times.
fn every_timed_wait_entry_v1() -> Vec<Entry> {
    let plan = Digest([9; 32]);
    vec![
        Entry::SignalAwaitedAt {
            seq: 3,
            identity: identity(CommandKind::Signal, "approval", &Payload::unit()),
            awaited_at_ms: 1_767_225_611_000,
        },
        Entry::SignalReceivedAt {
            seq: 3,
            signal_id: "sig-1".into(),
            payload: payload(r#"{"approve":true}"#),
            sender: None,
            received_at_ms: 1_767_225_611_300,
        },
        Entry::SignalReceivedAt {
            seq: 4,
            signal_id: "sig-2".into(),
            payload: payload(r#"{"approve":false}"#),
            sender: Some("dana".into()),
            received_at_ms: 1_767_225_612_000,
        },
        Entry::ApprovalRequestedAt {
            seq: 5,
            identity: identity(
                CommandKind::Approval,
                "plan",
                &Payload::from_value(&plan.hex().into()),
            ),
            artifact_hash: plan,
            risk: payload(r#"{"level":"high"}"#),
            expires_at_ms: Some(1_767_240_000_000),
            requested_at_ms: 1_767_225_613_000,
        },
        Entry::TimerFiredAt {
            seq: 6,
            fired_at_ms: 1_767_225_614_000,
        },
    ]
}

#[test]
fn version_1_timed_waits_still_decode_and_render_as_untimed_ones() {
    let bytes = std::fs::read(golden_file("journal-v1-wait-times.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 record decodes");
    assert_eq!(decoded, every_timed_wait_entry_v1());
    assert_eq!(write_framed(&every_timed_wait_entry_v1()), bytes);
    let untimed: Vec<Entry> = decoded.iter().map(untimed_wait).collect();
    assert_eq!(render_journal(&decoded), render_journal(&untimed));
    let stamped: Vec<Entry> = untimed.into_iter().map(|e| e.with_time(7)).collect();
    let times: Vec<Option<u64>> = stamped.iter().map(Entry::journaled_at).collect();
    assert_eq!(times, [Some(7); 5]);
}

/// `entry` as it was journaled before waits carried their times.
fn untimed_wait(entry: &Entry) -> Entry {
    match entry.clone() {
        Entry::SignalAwaitedAt { seq, identity, .. } => Entry::SignalAwaited { seq, identity },
        Entry::SignalReceivedAt {
            seq,
            signal_id,
            payload,
            sender: None,
            ..
        } => Entry::SignalReceived {
            seq,
            signal_id,
            payload,
        },
        Entry::SignalReceivedAt {
            seq,
            signal_id,
            payload,
            sender: Some(sender),
            ..
        } => Entry::SignalReceivedFrom {
            seq,
            signal_id,
            payload,
            sender,
        },
        Entry::ApprovalRequestedAt {
            seq,
            identity,
            artifact_hash,
            risk,
            expires_at_ms,
            ..
        } => Entry::ApprovalRequested {
            seq,
            identity,
            artifact_hash,
            risk,
            expires_at_ms,
        },
        Entry::TimerFiredAt { seq, .. } => Entry::TimerFired { seq },
        other => other,
    }
}

/// The variants appended to version 1 with artifacts, approvals and retrieval snapshots.
fn every_approval_entry_v1() -> Vec<Entry> {
    let plan = payload(r#"{"carrier":"fastship","order_id":"ORD-7"}"#);
    let hash = plan.digest();
    let mut entries = vec![
        Entry::ArtifactCommitted {
            seq: 0,
            identity: CommandIdentity {
                kind: CommandKind::Artifact,
                name: "plan".into(),
                input_digest: hash,
            },
        },
        Entry::ApprovalRequested {
            seq: 1,
            identity: identity(CommandKind::Approval, "approval", &plan),
            artifact_hash: hash,
            risk: payload(r#"{"level":"high"}"#),
            expires_at_ms: Some(1_767_229_200_000),
        },
    ];
    let decisions = [
        ApprovalDecision::Approved {
            approver: "dana@ops".into(),
            at_ms: 1_767_225_700_000,
            expires_at_ms: Some(1_767_229_200_000),
        },
        ApprovalDecision::Rejected {
            approver: "dana@ops".into(),
            reason: "customer asked to wait".into(),
            at_ms: 1_767_225_700_000,
        },
        ApprovalDecision::Expired {
            at_ms: 1_767_229_200_000,
        },
    ];
    let decided = decisions
        .into_iter()
        .map(|decision| Entry::ApprovalDecided { seq: 1, decision });
    entries.extend(decided);
    let search = payload(r#""rebook after 3 days?""#);
    entries.extend([
        Entry::ActivityScheduledAt {
            seq: 2,
            identity: identity(CommandKind::Retrieval, "search_policies", &search),
            input: search,
            scheduled_at_ms: 1_767_225_800_000,
            idempotency_key: None,
        },
        Entry::SnapshotCompleted {
            seq: 2,
            attempt: 1,
            artifact: hash,
        },
    ]);
    entries
}

/// An artifact record, a `not_attempted` operation and a progress event, framed.
fn write_approval_records() -> Vec<u8> {
    let plan = payload(r#"{"carrier":"fastship","order_id":"ORD-7"}"#);
    let artifact = ArtifactRecord {
        kind: "plan".into(),
        version: "v1".into(),
        content: plan.clone(),
        metadata: vec![("policy".into(), "rebook-2026-10".into())],
        workflow_id: "wf-1".into(),
        created_at_ms: 1_767_225_600_000,
    };
    let refused = Failure::new(FailureKind::PreconditionFailed, "approval mismatch");
    let operation = every_operation_v1()[0]
        .1
        .with_status(OperationStatus::NotAttempted { failure: refused });
    let mut operation_v1 = vec![1];
    operation_v1.extend(postcard::to_stdvec(&operation).expect("encodable"));
    let progress = StreamItem::Progress {
        step: 1,
        name: "approval_required".into(),
        detail: payload(r#"{"artifact_hash":"sha256:00"}"#),
    };
    let records = [
        encode_record(&artifact),
        operation_v1,
        encode_record(&progress),
    ];
    frame(records)
}

#[test]
fn version_1_approval_entries_and_records_still_decode() {
    let bytes = std::fs::read(golden_file("journal-v1-approvals.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 approval-era entry decodes");
    assert_eq!(decoded, every_approval_entry_v1());
    assert_eq!(write_framed(&every_approval_entry_v1()), bytes);
    let records = std::fs::read(golden_file("records-v1-approvals.bin")).expect("checked in");
    assert_eq!(write_approval_records(), records);
    let frames = unframe(&records);
    let artifact: ArtifactRecord = decode_record(frames[0]).expect("an artifact record");
    assert_eq!(artifact.kind, "plan");
    let operation: OperationRecord = decode_record(frames[1]).expect("an operation record");
    assert_eq!(operation.status.name(), "not_attempted");
    let progress: StreamItem = decode_record(frames[2]).expect("a progress event");
    assert!(!progress.is_generation());
    insta::assert_snapshot!(render_journal(&decoded));
}

/// [`OperationRecord`] as format 1 laid it out, to write and read the format-1 files exactly.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct OperationRecordV1 {
    workflow_id: String,
    seq: u32,
    operation: String,
    version: u32,
    arguments: Payload,
    preconditions: Vec<String>,
    attempt: u32,
    status: OperationStatus,
}

impl OperationRecordV1 {
    fn with_status(&self, status: OperationStatus) -> Self {
        Self {
            status,
            ..self.clone()
        }
    }

    /// What this build reads a format-1 record as: no approval, no history, the committed
    /// reference kept.
    fn upgraded(&self) -> OperationRecord {
        let external_ref = match &self.status {
            OperationStatus::Committed { external_ref, .. } => external_ref.clone(),
            _ => None,
        };
        OperationRecord {
            workflow_id: self.workflow_id.clone(),
            seq: self.seq,
            operation: self.operation.clone(),
            version: self.version,
            arguments: self.arguments.clone(),
            preconditions: self.preconditions.clone(),
            attempt: self.attempt,
            status: self.status.clone(),
            approval: None,
            external_ref,
            history: Vec::new(),
        }
    }
}

/// One operation record of every status, as format 1 wrote them.
fn every_operation_v1() -> Vec<(String, OperationRecordV1)> {
    let base = OperationRecordV1 {
        workflow_id: "wf-1".into(),
        seq: 1,
        operation: "rebook".into(),
        version: 2,
        arguments: payload(r#"["ORD-7","fastship"]"#),
        preconditions: vec!["order still delayed".into()],
        attempt: 1,
        status: OperationStatus::Prepared,
    };
    let records = every_status().into_iter().enumerate().map(|(n, status)| {
        let key = format!(r#"wf-1|rebook|["ORD-{n}"]|v2"#);
        (key, base.with_status(status))
    });
    records.collect()
}

fn every_status() -> Vec<OperationStatus> {
    let failure = |kind| Failure::new(kind, "cause");
    vec![
        OperationStatus::Prepared,
        OperationStatus::Committed {
            result: payload(r#""ref-1""#),
            external_ref: Some("BK-991".into()),
        },
        OperationStatus::FailedRetriable {
            failure: failure(FailureKind::Retriable),
        },
        OperationStatus::FailedTerminal {
            failure: failure(FailureKind::Terminal),
        },
        OperationStatus::UnknownOutcome {
            failure: failure(FailureKind::Timeout),
        },
        OperationStatus::AwaitingOperator {
            reason: "no reconciler".into(),
        },
    ]
}

/// Format 2: every status, run under an approval, with the history that led to it and a
/// reference an earlier attempt learnt.
fn every_operation_current() -> Vec<OperationRecord> {
    let granted = Granted {
        request: 2,
        scope: Digest::of(b"scope"),
        artifact: Digest::of(b"plan"),
        approver: "dana@ops".into(),
        decided_at_ms: 1_767_225_600_000,
        expires_at_ms: Some(1_767_229_200_000),
    };
    let grant = Grant {
        granted,
        intent: Digest::of(b"intent"),
    };
    let mut statuses = every_status();
    statuses.push(OperationStatus::NotAttempted {
        failure: Failure::new(FailureKind::NotApproved, "not authorised"),
    });
    let records = statuses.into_iter().map(|status| {
        let mut record = every_operation_v1()[0].1.upgraded();
        record.approval = Some(grant.clone());
        record.external_ref = Some("BK-990".into());
        let prepared = record.after(1, OperationStatus::Prepared, 1_767_225_600_100, None);
        let by = Some("reconciler".to_owned());
        prepared.after(2, status, 1_767_225_600_200, by)
    });
    records.collect()
}

#[test]
fn operation_records_of_formats_1_and_2_upgrade_and_of_format_3_still_decode() {
    for (_, v1) in every_operation_v1() {
        let mut bytes = vec![1];
        bytes.extend(postcard::to_stdvec(&v1).expect("encodable"));
        let read: OperationRecord = decode_record(&bytes).expect("a format-1 record upgrades");
        assert_eq!(read, v1.upgraded());
    }
    let v2 = std::fs::read(golden_file("operations-v2.bin")).expect("checked in");
    let frames = unframe(&v2);
    let decoded: Vec<OperationRecord> = frames
        .iter()
        .map(|f| decode_record(f).expect("every format-2 operation record decodes"))
        .collect();
    assert!(frames.iter().all(|f| f[0] == 2), "written in format 2");
    // Each record's events were its own command's: they upgrade naming it.
    assert_eq!(decoded, every_operation_current());
    let v3 = std::fs::read(golden_file("operations-v3.bin")).expect("checked in");
    let decoded: Vec<OperationRecord> = unframe(&v3)
        .iter()
        .map(|f| decode_record(f).expect("every format-3 operation record decodes"))
        .collect();
    assert_eq!(decoded, every_operation_current());
    assert_eq!(
        frame(every_operation_current().iter().map(encode_record)),
        v3
    );
}

/// Operation records framed like journal exports: length, then the record.
/// Each frame is format byte 1 and the postcard `(key, record)` pair, as version 1 wrote it.
fn write_framed_operations(records: &[(String, OperationRecordV1)]) -> Vec<u8> {
    let encode = |record| {
        let mut bytes = vec![FORMAT_VERSION];
        bytes.extend(postcard::to_stdvec(record).expect("encodable"));
        bytes
    };
    frame(records.iter().map(encode))
}

fn read_framed_operations(bytes: &[u8]) -> Vec<(String, OperationRecordV1)> {
    let frames = unframe(bytes).into_iter();
    let decode = |frame: &[u8]| {
        assert_eq!(frame[0], FORMAT_VERSION);
        decode_exact(&frame[1..]).expect("every v1 operation record decodes")
    };
    frames.map(decode).collect()
}

/// The records `workflow-records-v1.bin` holds, as this build reads them.
fn workflow_records_v1() -> Vec<WorkflowRecord> {
    let statuses = [
        WorkflowStatus::Running,
        WorkflowStatus::Completed,
        WorkflowStatus::Failed,
        WorkflowStatus::AwaitingOperator,
    ];
    let records = statuses.into_iter().enumerate().map(|(i, status)| {
        let digest = waymark_runtime::journal::Digest::of(br#"{"order_id":"A-1"}"#);
        let request_id = (i % 2 == 0).then(|| format!("req-{i}"));
        let mut record = WorkflowRecord::new("rebook_delayed", request_id, digest);
        record.status = status;
        record.journal_len = 7 + i as u64;
        record
    });
    records.collect()
}

/// Format 2: every status, and a stuck run with the reason it is stuck.
fn workflow_records_v2() -> Vec<WorkflowRecord> {
    let mut records = workflow_records_v1();
    let mut stuck = records[0].clone();
    stuck.status = WorkflowStatus::Stuck;
    stuck.stop = Some(RunStop {
        code: StopCode::NonDeterminism,
        seq: Some(3),
        message: "[WM0001] non-determinism at seq 3".into(),
        at_ms: 1_767_225_600_000,
    });
    records.push(stuck);
    let codes = [
        StopCode::UnknownWorkflow,
        StopCode::UnknownActivity,
        StopCode::CorruptRecord,
        StopCode::InconsistentJournal,
        StopCode::PayloadMismatch,
        StopCode::IdempotencyKey,
        StopCode::Panicked,
        StopCode::Internal,
    ];
    for code in codes {
        let mut record = records[0].clone();
        record.status = WorkflowStatus::Stuck;
        record.stop = Some(RunStop {
            code,
            seq: None,
            message: code.name().into(),
            at_ms: 1,
        });
        records.push(record);
    }
    records
}

fn read_framed_records(bytes: &[u8]) -> Vec<WorkflowRecord> {
    let frames = unframe(bytes).into_iter();
    let decoded = frames.map(|f| decode_record(f).expect("every workflow record decodes"));
    decoded.collect()
}

#[test]
fn workflow_records_of_format_1_and_2_still_decode() {
    let v1 = std::fs::read(golden_file("workflow-records-v1.bin")).expect("checked in");
    assert_eq!(unframe(&v1)[0][0], 1, "written in format 1");
    assert_eq!(read_framed_records(&v1), workflow_records_v1());
    let v2 = std::fs::read(golden_file("workflow-records-v2.bin")).expect("checked in");
    assert_eq!(read_framed_records(&v2), workflow_records_v2());
    assert_eq!(frame(workflow_records_v2().iter().map(encode_record)), v2);
}

/// Parked marks as format 1 wrote them: the code digest alone.
fn parked_marks_v1() -> Vec<u64> {
    vec![0, 7, u64::MAX]
}

fn parked_marks_v2() -> Vec<ParkedMark> {
    let mark = |code_digest, names: &[&str]| ParkedMark {
        code_digest,
        listening: Some(names.iter().map(|name| (*name).to_owned()).collect()),
    };
    vec![
        mark(0, &[]),
        mark(7, &["go"]),
        mark(u64::MAX, &["go", "stop"]),
    ]
}

#[test]
fn parked_marks_of_format_1_and_2_still_decode() {
    let marks = |bytes: &[u8]| -> Vec<ParkedMark> {
        let frames = unframe(bytes).into_iter();
        frames.map(|f| decode_record(f).expect("decodes")).collect()
    };
    let v1 = std::fs::read(golden_file("parked-marks-v1.bin")).expect("checked in");
    assert_eq!(unframe(&v1)[0][0], 1, "written in format 1");
    let woken_by_any = parked_marks_v1().into_iter().map(|code_digest| ParkedMark {
        code_digest,
        listening: None,
    });
    assert_eq!(marks(&v1), woken_by_any.collect::<Vec<_>>());
    let v2 = std::fs::read(golden_file("parked-marks-v2.bin")).expect("checked in");
    assert_eq!(marks(&v2), parked_marks_v2());
    assert_eq!(frame(parked_marks_v2().iter().map(encode_record)), v2);
}

/// A record of a format this build does not know says so, instead of calling itself corrupt.
#[test]
fn a_record_of_a_newer_format_names_both_formats() {
    let mut bytes = encode_record(&workflow_records_v2()[0]);
    bytes[0] = 3;
    let error = decode_record::<WorkflowRecord>(&bytes).unwrap_err();
    assert_eq!(
        error.to_string(),
        "written by a newer Waymark (format 3, this build reads up to 2)"
    );
}

fn golden_path(version: u8) -> std::path::PathBuf {
    golden_file(&format!("journal-v{version}.bin"))
}

fn golden_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

#[test]
fn version_1_effect_entries_and_operations_still_decode() {
    let bytes = std::fs::read(golden_file("journal-v1-effects.bin")).expect("checked in");
    let decoded = read_framed(&bytes).expect("every v1 effect record decodes");
    assert_eq!(decoded, every_effect_entry_v1());
    assert_eq!(write_framed(&every_effect_entry_v1()), bytes);
    let bytes = std::fs::read(golden_file("operations-v1.bin")).expect("checked in");
    let operations = read_framed_operations(&bytes);
    assert_eq!(operations, every_operation_v1());
    assert_eq!(write_framed_operations(&every_operation_v1()), bytes);
    let operations: Vec<(String, OperationRecord)> = operations
        .into_iter()
        .map(|(key, v1)| (key, v1.upgraded()))
        .collect();
    let rendered = format!(
        "{}--- operations\n{}",
        render_journal(&decoded),
        render_operations(&operations)
    );
    insta::assert_snapshot!(rendered);
}

#[test]
fn version_1_journals_still_decode() {
    let bytes = std::fs::read(golden_path(1)).expect("golden file journal-v1.bin is checked in");
    let decoded = read_framed(&bytes).expect("every v1 record decodes");
    assert_eq!(decoded, every_entry_v1());
    insta::assert_snapshot!(render_journal(&decoded));
}

#[test]
fn the_current_writer_reproduces_the_golden_bytes() {
    // While FORMAT_VERSION is 1 the writer must produce exactly the stored bytes.
    assert_eq!(FORMAT_VERSION, 1, "a new version needs its own golden file");
    let bytes = std::fs::read(golden_path(1)).expect("golden file");
    assert_eq!(write_framed(&every_entry_v1()), bytes);
}

#[test]
#[ignore = "writes the golden file of the current format version once; never overwrites"]
fn write_current_golden_file() {
    let files = [
        (golden_path(FORMAT_VERSION), write_framed(&every_entry_v1())),
        (
            golden_file("journal-v1-effects.bin"),
            write_framed(&every_effect_entry_v1()),
        ),
        (
            golden_file("operations-v1.bin"),
            write_framed_operations(&every_operation_v1()),
        ),
        (
            golden_file("journal-v1-signals.bin"),
            write_framed(&every_signal_entry_v1()),
        ),
        (
            golden_file("streams-inbox-v1.bin"),
            write_streams_and_inbox(),
        ),
        (
            golden_file("journal-v1-approvals.bin"),
            write_framed(&every_approval_entry_v1()),
        ),
        (
            golden_file("records-v1-approvals.bin"),
            write_approval_records(),
        ),
        (
            golden_file("journal-v1-cancel.bin"),
            write_framed(&every_cancel_entry_v1()),
        ),
        (
            golden_file("workflow-records-v2.bin"),
            frame(workflow_records_v2().iter().map(encode_record)),
        ),
        (
            golden_file("operations-v3.bin"),
            frame(every_operation_current().iter().map(encode_record)),
        ),
        (
            golden_file("records-v1-senders.bin"),
            write_sender_era_records(),
        ),
        (
            golden_file("journal-v1-step-times.bin"),
            write_framed(&every_timed_end_entry_v1()),
        ),
        (
            golden_file("journal-v1-wait-times.bin"),
            write_framed(&every_timed_wait_entry_v1()),
        ),
        (
            golden_file("parked-marks-v1.bin"),
            frame(parked_marks_v1().iter().map(encode_record)),
        ),
        (
            golden_file("parked-marks-v2.bin"),
            frame(parked_marks_v2().iter().map(encode_record)),
        ),
    ];
    for (path, bytes) in files {
        if !path.exists() {
            std::fs::write(&path, bytes).expect("write golden file");
        }
    }
}
