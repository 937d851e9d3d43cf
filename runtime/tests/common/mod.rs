//! What the store tests share: a workflow's record and first entry, and the transition that
//! starts it.

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
