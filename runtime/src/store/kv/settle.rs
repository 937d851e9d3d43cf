//! A decision about an operation of an ended workflow: no run of the workflow can apply it, so
//! the store writes the settled record itself, checked against the record it replaces.

use super::*;

/// Stages `settled` under `key`, an operation of the ended workflow `workflow_id`, if the
/// stored record is still `decided` and unsettled (`prepared` included: no run of an ended
/// workflow will settle it), and no decision about it is staged earlier in the group.
pub(super) fn stage_settle_ended(
    view: &mut View<'_>,
    workflow_id: &str,
    key: &str,
    decided: &OperationRecord,
    settled: &OperationRecord,
) -> Result<(), StoreError> {
    let conflict = |reason: String| StoreError::Conflict {
        workflow_id: workflow_id.to_owned(),
        reason,
    };
    let Some(record) = stored_record(view.engine, workflow_id)? else {
        let workflow_id = workflow_id.to_owned();
        return Err(StoreError::NotFound { workflow_id });
    };
    if !record.status.is_terminal() {
        let status = record.status.name();
        return Err(conflict(format!(
            "it is {status}, not ended: its run applies decisions about its operations"
        )));
    }
    let staged = view.group.settled_ended.contains(key) || view.job.settled_ended.contains(key);
    if staged {
        return Err(conflict(format!(
            "operation `{key}` was settled earlier in the same write"
        )));
    }
    let bytes = view.engine.get(Table::Operations, key.as_bytes())?;
    let stored: Option<OperationRecord> = bytes
        .map(|bytes| decode_at(Table::Operations, key, &bytes))
        .transpose()?;
    let Some(stored) = stored.filter(|stored| stored.workflow_id == workflow_id) else {
        return Err(conflict(format!("it has no operation `{key}` to settle")));
    };
    if stored != *decided {
        return Err(conflict(format!(
            "operation `{key}` is {} at attempt {}, not the record the decision was made on",
            stored.status.name(),
            stored.attempt
        )));
    }
    if !stored.status.is_unsettled() {
        let status = stored.status.name();
        return Err(conflict(format!(
            "operation `{key}` is {status}: settled already"
        )));
    }
    view.writes.put_operation(key, settled);
    view.job.settled_ended.insert(key.to_owned());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Payload;
    use crate::operations::{DecidedOn, OperationStatus};
    use crate::store::{MemoryEngine, MemoryStore, Store, WorkflowStatus};

    const KEY: &str = "wf|notify|[\"ORD-1\"]|v1";

    fn waiting(workflow_id: &str) -> OperationRecord {
        OperationRecord {
            workflow_id: workflow_id.to_owned(),
            seq: 1,
            operation: "notify".into(),
            version: 1,
            arguments: Payload::unit(),
            preconditions: Vec::new(),
            attempt: 1,
            status: OperationStatus::AwaitingOperator {
                reason: "did it take effect?".into(),
            },
            approval: None,
            external_ref: None,
            history: Vec::new(),
        }
    }

    fn committed(workflow_id: &str, result: u64) -> OperationRecord {
        let status = OperationStatus::Committed {
            result: Payload::from_u64(result),
            external_ref: None,
        };
        waiting(workflow_id).after(1, status, 5, Some("operator:ops".into()))
    }

    /// Workflow `wf` with its operation waiting for an operator; ended if `ends`.
    async fn workflow(store: &MemoryStore, ends: bool) {
        workflow_holding(store, ends, waiting("wf")).await
    }

    /// Workflow `wf` with `operation` under [`KEY`]; ended if `ends`.
    async fn workflow_holding(store: &MemoryStore, ends: bool, operation: OperationRecord) {
        let mut start = crate::store::first_transition("wf");
        start.operations.push((KEY.to_owned(), operation));
        let after_start = start.record.clone();
        store.commit(start).await.unwrap();
        if ends {
            let output = Entry::WorkflowCompleted {
                output: Payload::unit(),
            };
            let mut end = Transition::append("wf", &after_start, vec![output]);
            end.record.status = WorkflowStatus::Completed;
            end.ended_at_ms = 4;
            store.commit(end).await.unwrap();
        }
    }

    fn status(store: &MemoryStore) -> &'static str {
        store.operation(KEY).unwrap().unwrap().status.name()
    }

    /// Only an ended workflow's operation is settled here (a running one's run applies the
    /// decision), only while it waits, and only once: the second decision finds it settled.
    #[tokio::test]
    async fn an_ended_workflows_operation_is_settled_once_while_it_waits() {
        let running = MemoryStore::on(MemoryEngine::new()).unwrap();
        workflow(&running, false).await;
        let refused = running.settle_ended_operation(KEY, waiting("wf"), committed("wf", 1));
        let refused = refused.await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "conflicting write to workflow `wf`: it is running, not ended: its run applies \
             decisions about its operations"
        );
        assert_eq!(status(&running), "awaiting_operator");

        let ended = MemoryStore::on(MemoryEngine::new()).unwrap();
        workflow(&ended, true).await;
        // Decided on another record than the stored one: refused.
        let mut other = waiting("wf");
        other.attempt = 2;
        let stale = ended.settle_ended_operation(KEY, other, committed("wf", 1));
        let stale = stale.await.unwrap_err();
        assert_eq!(
            stale.to_string(),
            format!(
                "conflicting write to workflow `wf`: operation `{KEY}` is awaiting_operator at \
                 attempt 1, not the record the decision was made on"
            )
        );
        assert_eq!(status(&ended), "awaiting_operator");
        let settled = ended.settle_ended_operation(KEY, waiting("wf"), committed("wf", 1));
        settled.await.unwrap();
        assert_eq!(ended.operation(KEY).unwrap(), Some(committed("wf", 1)));
        let second = ended.settle_ended_operation(KEY, waiting("wf"), committed("wf", 2));
        let second = second.await.unwrap_err();
        assert_eq!(
            second.to_string(),
            format!(
                "conflicting write to workflow `wf`: operation `{KEY}` is committed at attempt \
                 1, not the record the decision was made on"
            )
        );
        assert_eq!(ended.operation(KEY).unwrap(), Some(committed("wf", 1)));
        let unknown = ended.settle_ended_operation(KEY, waiting("other"), committed("other", 1));
        let unknown = unknown.await.unwrap_err();
        assert!(matches!(unknown, StoreError::NotFound { .. }), "{unknown}");
    }

    /// An ended workflow's call left `prepared` (by a build that did not move it at the run's
    /// end) is settled like one waiting for an operator: nothing else will settle it. A settled
    /// record is not, even when it is the one decided on.
    #[tokio::test]
    async fn an_ended_workflows_prepared_operation_is_settled_and_a_settled_one_is_not() {
        let prepared = OperationRecord {
            status: OperationStatus::Prepared,
            ..waiting("wf")
        };
        let store = MemoryStore::on(MemoryEngine::new()).unwrap();
        workflow_holding(&store, true, prepared.clone()).await;
        let settled = store.settle_ended_operation(KEY, prepared, committed("wf", 1));
        settled.await.unwrap();
        assert_eq!(store.operation(KEY).unwrap(), Some(committed("wf", 1)));

        let store = MemoryStore::on(MemoryEngine::new()).unwrap();
        workflow_holding(&store, true, committed("wf", 1)).await;
        let again = store.settle_ended_operation(KEY, committed("wf", 1), committed("wf", 2));
        let again = again.await.unwrap_err();
        assert_eq!(
            again.to_string(),
            format!(
                "conflicting write to workflow `wf`: operation `{KEY}` is committed: settled \
                 already"
            )
        );
        assert_eq!(store.operation(KEY).unwrap(), Some(committed("wf", 1)));
    }

    /// A call in flight is not decided while its workflow runs; once the workflow has ended,
    /// nothing else will settle it, so a decision may (the worker's check, before the store's).
    #[test]
    fn a_prepared_call_is_decided_only_once_its_workflow_has_ended() {
        use crate::error::{awaiting_decision, ResolveError};
        let prepared = OperationRecord {
            status: OperationStatus::Prepared,
            ..waiting("wf")
        };
        let any = DecidedOn::ANY;
        let running = awaiting_decision(KEY, Some(prepared.clone()), any, false).unwrap_err();
        assert_eq!(
            running.to_string(),
            format!("operation `{KEY}` is prepared, not awaiting an operator")
        );
        let on_attempt = |attempt| DecidedOn::attempt(Some(attempt));
        let ended = awaiting_decision(KEY, Some(prepared.clone()), on_attempt(1), true);
        assert_eq!(ended.unwrap(), prepared);
        let stale = awaiting_decision(KEY, Some(prepared), on_attempt(2), true).unwrap_err();
        assert!(
            matches!(stale, ResolveError::StaleAttempt { .. }),
            "{stale}"
        );
    }

    /// A decision made on a record as it read is refused after any transition since, though
    /// the attempt number is the same: the key may have been freed and called again.
    #[test]
    fn a_decision_made_on_an_earlier_revision_is_refused() {
        use crate::error::{awaiting_decision, ResolveError};
        let read = waiting("wf");
        let on = read.as_read();
        let same = awaiting_decision(KEY, Some(read.clone()), on, true);
        assert_eq!(same.unwrap(), read);
        let prepared_again = read.after(1, OperationStatus::Prepared, 2, None);
        let called_again = prepared_again.after(1, waiting("wf").status, 3, None);
        assert_eq!(called_again.attempt, on.attempt.unwrap());
        let stale = awaiting_decision(KEY, Some(called_again), on, true).unwrap_err();
        let ResolveError::StaleRevision {
            decided, current, ..
        } = stale
        else {
            panic!("{stale}");
        };
        assert_eq!((decided, current), (on.revision.unwrap(), decided + 2));
    }

    /// Two decisions about one operation in one write: the first is written, the second
    /// refused, as it would be after the write.
    #[tokio::test]
    async fn two_decisions_in_one_write_settle_the_operation_once() {
        let engine = MemoryEngine::new();
        let store = MemoryStore::on(engine.clone()).unwrap();
        workflow(&store, true).await;
        let decision = |result| Work::SettleEnded {
            workflow_id: "wf".into(),
            key: KEY.into(),
            decided: Box::new(waiting("wf")),
            settled: Box::new(committed("wf", result)),
        };
        let group = [decision(1), decision(2)];
        let known = Written::new(true);
        let staged = Staged::from_group(&*engine, &group, &known, Box::default());
        assert_eq!(staged.accepted, [0]);
        let refused: Vec<String> = staged.rejected.iter().map(|(_, e)| e.to_string()).collect();
        assert_eq!(
            refused,
            [format!(
                "conflicting write to workflow `wf`: operation `{KEY}` was settled earlier in \
                 the same write"
            )]
        );
    }
}
