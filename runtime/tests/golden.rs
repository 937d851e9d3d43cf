//! Golden journal files: bytes written by each format version, checked in, decoded forever.
//!
//! `journal-v1.bin` holds one entry of every kind as format version 1 wrote them. If a change
//! to the journal types breaks this test, the change broke every stored journal: add a variant
//! at the end or a new format version instead. The file is never regenerated; a new format
//! version gets a new file (`cargo test -p waymark-runtime --test golden -- --ignored` writes
//! the current version's file if it does not exist yet).

use waymark_runtime::journal::{
    read_framed, write_framed, CommandIdentity, CommandKind, Entry, Failure, FailureKind, Payload,
    WorkflowStarted, FORMAT_VERSION,
};
use waymark_runtime::render::render_journal;

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

fn golden_path(version: u8) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("journal-v{version}.bin"))
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
    let path = golden_path(FORMAT_VERSION);
    if !path.exists() {
        std::fs::write(&path, write_framed(&every_entry_v1())).expect("write golden file");
    }
}
