//! What the store tests share: a workflow's record and first entry, the transition that
//! starts it, and an operation of it.

use waymark_runtime::journal::{Digest, Entry, Payload, WorkflowStarted};
use waymark_runtime::store::{Transition, WorkflowRecord};

pub(crate) fn record() -> WorkflowRecord {
    WorkflowRecord::new("wf", None, Digest::of(b"null"))
}

pub(crate) fn started() -> Entry {
    Entry::WorkflowStarted(WorkflowStarted {
        workflow_name: "wf".into(),
        input: Payload::unit(),
        request_id: None,
        started_at_ms: 0,
    })
}

pub(crate) fn start(id: &str) -> Transition {
    Transition::append(id, &record(), vec![started()])
}

/// `workflow_id`'s call of operation `book` with nothing, `prepared`.
#[allow(dead_code)]
pub(crate) fn operation(workflow_id: &str) -> waymark_runtime::operations::OperationRecord {
    waymark_runtime::operations::OperationRecord {
        workflow_id: workflow_id.into(),
        seq: 0,
        operation: "book".into(),
        version: 1,
        arguments: Payload::unit(),
        preconditions: Vec::new(),
        attempt: 1,
        status: waymark_runtime::operations::OperationStatus::Prepared,
        approval: None,
        external_ref: None,
        history: Vec::new(),
    }
}

/// The PostgreSQL database the tests may use: `WAYMARK_TEST_DATABASE_URL`. Without it the
/// PostgreSQL cases say they were skipped, unless `WAYMARK_REQUIRE_DATABASE` is set (as CI
/// does): then a missing database fails them.
#[cfg(feature = "postgres")]
#[allow(dead_code)]
pub(crate) fn database_url() -> Option<String> {
    let url = std::env::var("WAYMARK_TEST_DATABASE_URL").ok();
    let url = url.filter(|url| !url.is_empty());
    if url.is_none() {
        if std::env::var_os("WAYMARK_REQUIRE_DATABASE").is_some() {
            panic!("WAYMARK_REQUIRE_DATABASE is set but WAYMARK_TEST_DATABASE_URL is not");
        }
        eprintln!(
            "skipped: no PostgreSQL database; run with \
             WAYMARK_TEST_DATABASE_URL=postgres://user@localhost/db to include it"
        );
    }
    url
}

/// A schema name no other test uses.
#[cfg(feature = "postgres")]
#[allow(dead_code)]
pub(crate) fn fresh_schema() -> String {
    format!("t{:016x}", rand::random::<u64>())
}
