//! The store's on-disk layout version and the one-time upgrade of a store written by an older
//! build.
//!
//! The version is a row of its own, written in the same synced batch as the upgrade it
//! records: a crash during an upgrade leaves the old version, so the next open redoes the
//! whole upgrade (every step of it rebuilds from the rows it indexes, so redoing is safe).
//! Keying the upgrade on something else (a column family that RocksDB creates on open, say)
//! would mark a store upgraded before the upgrade was written.

use std::collections::{HashMap, HashSet};

use rocksdb::{IteratorMode, WriteBatch, WriteOptions, DB};

use super::{backend, cf, decode_at};
use crate::journal::{decode_record, encode_record, Seq};
use crate::keys::{inbox_counter_key, journal_key, parse_inbox_key, parse_journal_key, InboxKey};
use crate::store::{StoreError, Table};
use crate::streams::{StepVersions, StreamItem};

/// The layout this build writes and reads.
///
/// 1. Before the version row existed: streams without their per-step version index, and inbox
///    counters only for workflows that received a signal from a build that kept them.
/// 2. The per-step version index of every stream, and a counter for every inbox.
pub(super) const LAYOUT: u32 = 2;

/// The version row's key in [`Table::Meta`].
const LAYOUT_KEY: &[u8] = b"layout";

/// Brings the store at `db` to [`LAYOUT`]: records it for a new store, upgrades an older one,
/// and refuses one written by a newer build (whose rows this build might misread).
pub(super) fn prepare(db: &DB, created: bool) -> Result<(), StoreError> {
    let found = stored_layout(db)?;
    match found {
        Some(LAYOUT) => Ok(()),
        Some(newer) if newer > LAYOUT => Err(StoreError::NewerLayout {
            found: newer,
            supported: LAYOUT,
        }),
        _ if created => write(db, WriteBatch::default()),
        _ => upgrade(db),
    }
}

/// Refuses, for a read-only open, a store written by a newer build. An older store is read as it
/// is: what it lacks (a family, an index) reads as empty.
pub(super) fn check_readable(db: &DB) -> Result<(), StoreError> {
    if db.cf_handle(Table::Meta.name()).is_none() {
        return Ok(());
    }
    match stored_layout(db)? {
        Some(newer) if newer > LAYOUT => Err(StoreError::NewerLayout {
            found: newer,
            supported: LAYOUT,
        }),
        _ => Ok(()),
    }
}

fn stored_layout(db: &DB) -> Result<Option<u32>, StoreError> {
    let bytes = db
        .get_cf(cf(db, Table::Meta)?, LAYOUT_KEY)
        .map_err(backend)?;
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

/// Upgrades a layout-1 store: the only older layout there is.
fn upgrade(db: &DB) -> Result<(), StoreError> {
    tracing::info!(to = LAYOUT, "upgrading a store written by an older build");
    let mut batch = WriteBatch::default();
    index_stream_versions(db, &mut batch)?;
    count_inbox_arrivals(db, &mut batch)?;
    write(db, batch)
}

/// Writes `batch` and the current layout version as one synced write.
fn write(db: &DB, mut batch: WriteBatch) -> Result<(), StoreError> {
    batch.put_cf(cf(db, Table::Meta)?, LAYOUT_KEY, LAYOUT.to_be_bytes());
    let mut options = WriteOptions::default();
    options.set_sync(true);
    db.write_opt(batch, &options).map_err(backend)
}

/// Builds the per-step version index from the streams. A row that cannot be read is logged and
/// left out rather than refusing to open the store: the index only has to keep new versions
/// above the ones readers have seen, and the rows readers could see are the readable ones. An
/// index row a build with the index already kept is merged in, never lowered.
fn index_stream_versions(db: &DB, batch: &mut WriteBatch) -> Result<(), StoreError> {
    let mut index: HashMap<(String, Seq), StepVersions> = HashMap::new();
    for row in db.iterator_cf(cf(db, Table::Streams)?, IteratorMode::Start) {
        let (key, value) = row.map_err(backend)?;
        match stream_row(&key, &value) {
            Ok((workflow_id, item)) if item.is_generation() => {
                let versions = index.entry((workflow_id, item.step())).or_default();
                versions.track(&item);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "stream row left out of the version index"),
        }
    }
    let family = cf(db, Table::StreamSteps)?;
    for ((workflow_id, step), rebuilt) in index {
        let key = journal_key(&workflow_id, u64::from(step));
        let kept = db.get_cf(family, &key).map_err(backend)?;
        let kept = kept.and_then(|bytes| decode_record::<StepVersions>(&bytes).ok());
        batch.put_cf(family, key, encode_record(&merged(rebuilt, kept)));
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

fn stream_row(key: &[u8], value: &[u8]) -> Result<(String, StreamItem), StoreError> {
    let (workflow_id, number) = parse_journal_key(key).map_err(|e| StoreError::Corrupt {
        table: Table::Streams,
        key: format!("{key:02x?}"),
        source: crate::journal::DecodeError::Malformed(e.to_string()),
    })?;
    let item = decode_at(Table::Streams, &format!("{workflow_id}#{number}"), value)?;
    Ok((workflow_id, item))
}

/// Gives every inbox that holds messages but no counter one at its newest arrival, so that an
/// arrival number is never given twice once those messages are delivered and deleted (a reader
/// asks for the messages after the last number it saw).
fn count_inbox_arrivals(db: &DB, batch: &mut WriteBatch) -> Result<(), StoreError> {
    let mut newest: HashMap<String, u64> = HashMap::new();
    let mut counted: HashSet<String> = HashSet::new();
    for row in db.iterator_cf(cf(db, Table::Inbox)?, IteratorMode::Start) {
        let (key, _) = row.map_err(backend)?;
        match parse_inbox_key(&key) {
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
            Some(InboxKey::Seen { .. }) => {}
            None => tracing::warn!(key = ?key, "unreadable inbox key left as it is"),
        }
    }
    let family = cf(db, Table::Inbox)?;
    for (workflow_id, arrival) in newest {
        if !counted.contains(&workflow_id) {
            batch.put_cf(
                family,
                inbox_counter_key(&workflow_id),
                encode_record(&arrival),
            );
        }
    }
    Ok(())
}
