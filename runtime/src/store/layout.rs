//! The store's on-disk layout version and the one-time upgrade of a store written by an older
//! build.
//!
//! The version is a row of its own, written in the same synced batch as the upgrade it
//! records: a crash during an upgrade leaves the old version, so the next open redoes the
//! whole upgrade (every step of it rebuilds from the rows it indexes, so redoing is safe).
//! Keying the upgrade on something else (a column family that RocksDB creates on open, say)
//! would mark a store upgraded before the upgrade was written.

use std::collections::{HashMap, HashSet};

use super::engine::{Engine, Write};
use super::kv::{decode_at, decode_inbox_message};
use crate::journal::{decode_record, encode_record, Entry, Seq};
use crate::keys::{
    artifact_key, artifact_ref_key, ended_at_key, ended_key, inbox_counter_key, inbox_named_key,
    journal_key, parse_id_key, parse_inbox_key, parse_journal_key, InboxKey,
};
use crate::operations::OperationRecord;
use crate::store::{StoreError, Table, WorkflowRecord};
use crate::streams::{StepVersions, StreamItem};

/// The layout this build writes and reads.
///
/// 1. Before the version row existed: streams without their per-step version index, and inbox
///    counters only for workflows that received a signal from a build that kept them.
/// 2. The per-step version index of every stream, and a counter for every inbox.
/// 3. The workflows that committed each artifact (`artifact_refs`), and the ended workflows by
///    end time (`ended`), for deletion and retention.
/// 4. Large journaled payloads split, their long strings in `blobs` (an older build would
///    read a split payload as a value that does not decode).
/// 5. On RocksDB, every table but `journal` and `meta` in the default column family, each key
///    behind its table's tag byte (`rocks::families`), where each table had a family of its
///    own. Nothing changes on the other engines.
/// 6. Parked marks (`parked`): a worker starting on the store leaves a parked workflow out of
///    memory. An older build would resume such a workflow without deleting its mark, which
///    could then hide a run in flight from the next start; a store of layout 5 has no marks.
/// 7. A workflow's journal length is its journal's, not its record's: on a store one process
///    owns, a transition that only appends leaves the record's row as it was, so the length
///    that row holds may trail. An older build would take it for the journal's and append
///    over entries. The lengths of a store of layout 6 are exact: it has nothing to upgrade.
/// 8. On RocksDB, a write is durable in the store's own log (`rocks::log`), RocksDB's log
///    written unsynced. An older build would open the store without reading that log: after
///    the machine stopped, it would miss the writes RocksDB's log lost, and write over them.
///    A store of layout 7 has every write in RocksDB's log: it has nothing to upgrade.
/// 9. Each inbox message has a row in the inbox's index by name (`keys::inbox_named_key`): a
///    run rebuilt by replay reads the messages of the names it waits for, not the whole inbox.
///    An older build would deliver a message and leave its index row, and a rebuilt run
///    would then look for a message that is gone.
/// 10. Each unsettled operation has a row in [`Table::Unsettled`]: the reconciliation sweep
///     and the listing of decisions awaited read those, not every operation. An older build
///     would write a new unsettled operation without its row, out of the sweep and out of
///     the operators' sight, and leave a settled one's row behind.
pub(crate) const LAYOUT: u32 = 10;

/// The version row's key in [`Table::Meta`].
const LAYOUT_KEY: &[u8] = b"layout";

/// Brings the store in `engine` to [`LAYOUT`]: records it for a new store, upgrades an older
/// one, and refuses one written by a newer build (whose rows this build might misread).
pub(super) fn prepare(engine: &dyn Engine, created: bool) -> Result<(), StoreError> {
    let found = stored_layout(engine)?;
    match found {
        Some(LAYOUT) => Ok(()),
        Some(newer) if newer > LAYOUT => Err(StoreError::NewerLayout {
            found: newer,
            supported: LAYOUT,
        }),
        _ if created => write(engine, Vec::new()),
        older => upgrade(engine, older.unwrap_or(1)),
    }
}

/// Refuses, for a read-only open, a store written by a newer build. An older store is read as it
/// is: what it lacks (a family, an index) reads as empty, but for the index of unsettled
/// operations, which the store then does without ([`indexes_unsettled`]).
#[cfg(feature = "rocksdb")]
pub(super) fn check_readable(engine: &dyn Engine) -> Result<(), StoreError> {
    match stored_layout(engine)? {
        Some(newer) if newer > LAYOUT => Err(StoreError::NewerLayout {
            found: newer,
            supported: LAYOUT,
        }),
        _ => Ok(()),
    }
}

/// Whether the store in `engine` indexes its unsettled operations (layout 10 on). A layout row
/// that does not read says no: the listing then reads every operation, as before the index.
pub(super) fn indexes_unsettled(engine: &dyn Engine) -> bool {
    matches!(stored_layout(engine), Ok(Some(layout)) if layout >= 10)
}

fn stored_layout(engine: &dyn Engine) -> Result<Option<u32>, StoreError> {
    let bytes = engine.get(Table::Meta, LAYOUT_KEY)?;
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let parsed = <[u8; 4]>::try_from(bytes.as_slice()).map(u32::from_be_bytes);
    parsed.map(Some).map_err(|_| StoreError::Corrupt {
        table: Table::Meta,
        key: "layout".into(),
        source: crate::journal::DecodeError::Malformed(format!("{} bytes, not 4", bytes.len())),
    })
}

/// Upgrades a store of layout `from` (a store without a version row is layout 1).
fn upgrade(engine: &dyn Engine, from: u32) -> Result<(), StoreError> {
    tracing::info!(
        from,
        to = LAYOUT,
        "upgrading a store written by an older build"
    );
    let mut batch = Vec::new();
    if from < 2 {
        index_stream_versions(engine, &mut batch)?;
        count_inbox_arrivals(engine, &mut batch)?;
    }
    if from < 3 {
        reference_artifacts(engine, &mut batch)?;
        list_ended(engine, &mut batch)?;
    }
    if from < 9 {
        index_inbox_by_name(engine, &mut batch)?;
    }
    if from < 10 {
        index_unsettled_operations(engine, &mut batch)?;
    }
    write(engine, batch)
}

/// Records, for every artifact a journal committed, that its workflow committed it: without
/// that, deleting one workflow would take an artifact another one still names. A journal row
/// that does not decode is logged and left out, as in the other steps, rather than keep the
/// store from opening: its workflow cannot replay past it anyway.
fn reference_artifacts(engine: &dyn Engine, batch: &mut Vec<Write>) -> Result<(), StoreError> {
    for_each_row(engine, Table::Journal, |key, value| {
        match numbered_row::<Entry>(Table::Journal, key, value) {
            Ok((workflow_id, entry)) => {
                let committed = super::committed_artifacts(std::slice::from_ref(&entry));
                let (namespace, _) = crate::namespace::split(&workflow_id);
                for hash in committed {
                    let artifact = artifact_key(namespace, &hash);
                    let reference = artifact_ref_key(&artifact, &workflow_id);
                    batch.push(Write::Put(Table::ArtifactRefs, reference, Vec::new()));
                }
            }
            Err(error) => tracing::warn!(%error, "journal row left out of the artifact references"),
        }
    })
}

/// Lists every ended workflow as ended now (older builds kept no end time), so that
/// retention counts from the upgrade. A record that does not decode is logged and left out:
/// that workflow is deleted by hand only.
fn list_ended(engine: &dyn Engine, batch: &mut Vec<Write>) -> Result<(), StoreError> {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let now_ms = since_epoch.map_or(0, |d| d.as_millis() as u64);
    for_each_row(engine, Table::Workflows, |key, value| {
        let ended = parse_id_key(key)
            .map_err(|e| StoreError::malformed_key(Table::Workflows, key, &e))
            .and_then(|id| {
                let record: WorkflowRecord = decode_at(Table::Workflows, &id, value)?;
                Ok(record.status.is_terminal().then_some(id))
            });
        match ended {
            Ok(Some(workflow_id)) => {
                batch.push(Write::Put(
                    Table::Ended,
                    ended_key(now_ms, &workflow_id),
                    Vec::new(),
                ));
                let when = now_ms.to_be_bytes().to_vec();
                batch.push(Write::Put(Table::Ended, ended_at_key(&workflow_id), when));
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, "workflow left out of the ended list"),
        }
    })
}

/// Writes the index row by name of every inbox message. A message that does not decode is
/// logged and left out: no run could be handed it anyway.
fn index_inbox_by_name(engine: &dyn Engine, batch: &mut Vec<Write>) -> Result<(), StoreError> {
    for_each_row(engine, Table::Inbox, |key, value| {
        let Some(InboxKey::Message {
            workflow_id,
            arrival,
        }) = parse_inbox_key(key)
        else {
            return;
        };
        match decode_inbox_message(&workflow_id, arrival, value) {
            Ok(message) => {
                let named = inbox_named_key(&workflow_id, &message.name, arrival);
                batch.push(Write::Put(Table::Inbox, named, Vec::new()));
            }
            Err(error) => tracing::warn!(%error, "inbox message left out of the index by name"),
        }
    })
}

/// Writes the index row of every unsettled operation. A row that does not decode is indexed
/// too, and logged: the listing of decisions awaited logs it by key each time, as it did when
/// it read every row, and it may be the only trace of a call that took effect.
fn index_unsettled_operations(
    engine: &dyn Engine,
    batch: &mut Vec<Write>,
) -> Result<(), StoreError> {
    for_each_row(engine, Table::Operations, |key, value| {
        let name = String::from_utf8_lossy(key);
        let unsettled = match decode_at::<OperationRecord>(Table::Operations, &name, value) {
            Ok(record) => record.status.is_unsettled(),
            Err(error) => {
                tracing::warn!(%error, "an operation that does not decode is indexed as unsettled");
                true
            }
        };
        if unsettled {
            batch.push(Write::Put(Table::Unsettled, key.to_vec(), Vec::new()));
        }
    })
}

/// Writes `batch` and the current layout version as one synced write.
fn write(engine: &dyn Engine, mut batch: Vec<Write>) -> Result<(), StoreError> {
    let version = LAYOUT.to_be_bytes().to_vec();
    batch.push(Write::Put(Table::Meta, LAYOUT_KEY.to_vec(), version));
    engine.write(batch, true)
}

/// Builds the per-step version index from the streams. A row that cannot be read is logged and
/// left out rather than refusing to open the store: the index only has to keep new versions
/// above the ones readers have seen, and the rows readers could see are the readable ones. An
/// index row a build with the index already kept is merged in, never lowered.
fn index_stream_versions(engine: &dyn Engine, batch: &mut Vec<Write>) -> Result<(), StoreError> {
    let mut index: HashMap<(String, Seq), StepVersions> = HashMap::new();
    for_each_row(engine, Table::Streams, |key, value| {
        match numbered_row::<StreamItem>(Table::Streams, key, value) {
            Ok((workflow_id, item)) if item.is_generation() => {
                let versions = index.entry((workflow_id, item.step())).or_default();
                versions.track(&item);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "stream row left out of the version index"),
        }
    })?;
    for ((workflow_id, step), rebuilt) in index {
        let key = journal_key(&workflow_id, u64::from(step));
        let kept = engine.get(Table::StreamSteps, &key)?;
        // The index is rebuilt from the stream here, so a row that does not decode is replaced,
        // said so, rather than stop the upgrade.
        let kept = kept.and_then(|bytes| match decode_record::<StepVersions>(&bytes) {
            Ok(versions) => Some(versions),
            Err(error) => {
                tracing::warn!(%workflow_id, step, %error, "version index row replaced");
                None
            }
        });
        let versions = encode_record(&merged(rebuilt, kept));
        batch.push(Write::Put(Table::StreamSteps, key, versions));
    }
    Ok(())
}

/// The rebuilt versions of a step, with what a kept index row knows beyond them.
fn merged(rebuilt: StepVersions, kept: Option<StepVersions>) -> StepVersions {
    let Some(kept) = kept else {
        return rebuilt;
    };
    let mut open = rebuilt.open;
    open.extend(kept.open.iter().filter(|v| **v > rebuilt.newest));
    StepVersions {
        newest: rebuilt.newest.max(kept.newest),
        open,
    }
}

/// A row of a table keyed by workflow and number (the journal, the streams), decoded.
fn numbered_row<T: crate::journal::Record>(
    table: Table,
    key: &[u8],
    value: &[u8],
) -> Result<(String, T), StoreError> {
    let (workflow_id, number) =
        parse_journal_key(key).map_err(|e| StoreError::malformed_key(table, key, &e))?;
    let decoded = decode_at(table, &format!("{workflow_id}#{number}"), value)?;
    Ok((workflow_id, decoded))
}

/// Gives every inbox that holds messages but no counter one at its newest arrival, so that an
/// arrival number is never given twice once those messages are delivered and deleted (a reader
/// asks for the messages after the last number it saw).
fn count_inbox_arrivals(engine: &dyn Engine, batch: &mut Vec<Write>) -> Result<(), StoreError> {
    let mut newest: HashMap<String, u64> = HashMap::new();
    let mut counted: HashSet<String> = HashSet::new();
    for_each_row(engine, Table::Inbox, |key, _| match parse_inbox_key(key) {
        Some(InboxKey::Message {
            workflow_id,
            arrival,
        }) => {
            let last = newest.entry(workflow_id).or_default();
            *last = (*last).max(arrival);
        }
        Some(InboxKey::Counter { workflow_id }) => {
            counted.insert(workflow_id);
        }
        Some(InboxKey::Seen { .. } | InboxKey::Named { .. }) => {}
        None => tracing::warn!(key = ?key, "unreadable inbox key left as it is"),
    })?;
    for (workflow_id, arrival) in newest {
        if !counted.contains(&workflow_id) {
            let counter = inbox_counter_key(&workflow_id);
            batch.push(Write::Put(Table::Inbox, counter, encode_record(&arrival)));
        }
    }
    Ok(())
}

/// Rows read per scan while upgrading: a whole table is never held in memory at once.
const PAGE: usize = 1024;

/// Calls `visit` with every row of `table`, in key order, a page at a time.
fn for_each_row(
    engine: &dyn Engine,
    table: Table,
    mut visit: impl FnMut(&[u8], &[u8]),
) -> Result<(), StoreError> {
    let mut from = Vec::new();
    loop {
        let rows = engine.scan(table, &[], &from, PAGE)?;
        for (key, value) in &rows {
            visit(key, value);
        }
        let Some((last, _)) = rows.last().filter(|_| rows.len() == PAGE) else {
            return Ok(());
        };
        // The smallest key after `last`.
        from = last.to_vec();
        from.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryEngine;

    #[test]
    fn every_row_is_visited_once_across_pages() {
        let engine = MemoryEngine::new();
        let rows = (0..PAGE * 2 + 3).map(|i| {
            let key = format!("{i:06}").into_bytes();
            Write::Put(Table::Inbox, key, Vec::new())
        });
        engine.write(rows.collect(), true).unwrap();
        let mut seen = Vec::new();
        for_each_row(engine.as_ref(), Table::Inbox, |key, _| {
            seen.push(key.to_vec())
        })
        .unwrap();
        let expected: Vec<Vec<u8>> = (0..PAGE * 2 + 3)
            .map(|i| format!("{i:06}").into_bytes())
            .collect();
        assert_eq!(seen, expected);
    }
}
