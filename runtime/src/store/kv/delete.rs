//! Deleting an ended workflow: every row of its own in one batch (record, parked mark, journal,
//! stream and its index and acknowledgements, inbox and the signal ids seen, operations and
//! their index of unsettled ones, its request id, its place in the ended list), and the
//! artifacts it committed that no other workflow did.

use super::*;
use crate::keys::{artifact_refs_prefix, prefix_end};
use crate::operations::key_prefix;

/// Stages the deletion of `workflow_id`, which must have ended; `artifacts` are the hashes its
/// journal committed (an ended journal no longer changes, so the caller read them exactly).
pub(super) fn stage_delete(
    view: &mut View<'_>,
    workflow_id: &str,
    artifacts: &[Digest],
) -> Result<(), StoreError> {
    let record = stored_record(view.engine, workflow_id)?.ok_or_else(|| StoreError::NotFound {
        workflow_id: workflow_id.to_owned(),
    })?;
    // The stored status: an end staged in this same group is not written yet.
    if !record.status.is_terminal() {
        return Err(StoreError::NotEnded {
            workflow_id: workflow_id.to_owned(),
            status: record.status.name(),
        });
    }
    refuse_unsettled(view, workflow_id)?;
    view.writes.delete(Table::Workflows, id_key(workflow_id));
    view.unpark(workflow_id);
    let own = id_key(workflow_id);
    for table in [
        Table::Journal,
        Table::Streams,
        Table::StreamSteps,
        Table::StreamAcks,
        Table::Inbox,
        Table::Blobs,
    ] {
        delete_prefix(view, table, &own);
    }
    let operations = key_prefix(workflow_id);
    delete_prefix(view, Table::Operations, operations.as_bytes());
    delete_prefix(view, Table::Unsettled, operations.as_bytes());
    if let Some(request_id) = &record.request_id {
        if view.request_owner(request_id)?.as_deref() == Some(workflow_id) {
            view.writes.delete(Table::Requests, id_key(request_id));
        }
    }
    unlist_ended(view, workflow_id)?;
    for hash in artifacts {
        release_artifact(view, workflow_id, hash)?;
    }
    view.job.deleted.insert(workflow_id.to_owned());
    Ok(())
}

/// Refuses the deletion while an operation of the workflow may have taken effect unsettled:
/// its record is the only trace of it. A row that does not decode refuses it too, by its error.
fn refuse_unsettled(view: &View<'_>, workflow_id: &str) -> Result<(), StoreError> {
    let prefix = key_prefix(workflow_id);
    let rows = view.engine.scan(
        Table::Operations,
        prefix.as_bytes(),
        prefix.as_bytes(),
        usize::MAX,
    )?;
    let mut keys = Vec::new();
    for (key, value) in rows {
        let key = String::from_utf8_lossy(&key).into_owned();
        let record: OperationRecord = decode_at(Table::Operations, &key, &value)?;
        if record.status.is_unsettled() {
            keys.push(key);
        }
    }
    if keys.is_empty() {
        return Ok(());
    }
    let workflow_id = workflow_id.to_owned();
    Err(StoreError::Unsettled { workflow_id, keys })
}

fn delete_prefix(view: &mut View<'_>, table: Table, prefix: &[u8]) {
    // Ids are length-prefixed, so a prefix of one is never all 0xff.
    if let Some(end) = prefix_end(prefix) {
        let range = Write::DeleteRange(table, prefix.to_vec(), end);
        view.writes.0.push(range);
    }
}

/// Removes the workflow from the ended list, by the time its row by id gives.
fn unlist_ended(view: &mut View<'_>, workflow_id: &str) -> Result<(), StoreError> {
    let by_id = ended_at_key(workflow_id);
    let Some(when) = view.engine.get(Table::Ended, &by_id)? else {
        return Ok(());
    };
    let when = <[u8; 8]>::try_from(when.as_slice()).map_err(|_| StoreError::Corrupt {
        table: Table::Ended,
        key: workflow_id.to_owned(),
        source: DecodeError::Malformed(format!("{} bytes, not 8", when.len())),
    })?;
    let by_time = ended_key(u64::from_be_bytes(when), workflow_id);
    view.writes.delete(Table::Ended, by_time);
    view.writes.delete(Table::Ended, by_id);
    Ok(())
}

/// Drops the workflow's reference to the artifact `hash`, and the artifact with it when no
/// other workflow committed it (counting what this group committed and released so far).
fn release_artifact(
    view: &mut View<'_>,
    workflow_id: &str,
    hash: &Digest,
) -> Result<(), StoreError> {
    let (namespace, _) = crate::namespace::split(workflow_id);
    let key = artifact_key(namespace, hash);
    let reference = artifact_ref_key(&key, workflow_id);
    view.writes.delete(Table::ArtifactRefs, reference.clone());
    view.job.refs_deleted.insert(reference);
    if view.group.artifacts_committed.contains(&key) || referenced_elsewhere(view, &key)? {
        return Ok(());
    }
    view.writes.delete(Table::Artifacts, key.clone());
    view.job.artifacts_deleted.insert(key);
    Ok(())
}

/// Whether a reference to the artifact at `key` is left that neither this job nor an earlier
/// one of the group deleted.
fn referenced_elsewhere(view: &View<'_>, key: &[u8]) -> Result<bool, StoreError> {
    let prefix = artifact_refs_prefix(key);
    let mut from = prefix.clone();
    loop {
        let rows = view.engine.scan(Table::ArtifactRefs, &prefix, &from, 64)?;
        let released =
            |k: &[u8]| view.job.refs_deleted.contains(k) || view.group.refs_deleted.contains(k);
        if rows.iter().any(|(k, _)| !released(k)) {
            return Ok(true);
        }
        let Some((last, _)) = rows.last() else {
            return Ok(false);
        };
        if rows.len() < 64 {
            return Ok(false);
        }
        from = last.to_vec();
        from.push(0);
    }
}
