//! Where each table's rows are in RocksDB: every table but [`Table::Meta`] in the default
//! family, each key behind its table's tag byte.
//!
//! Builds before layout 5 kept one column family per table. Each family costs RocksDB work at
//! every open, whether it holds rows or not: its options written to the `OPTIONS` file, read
//! back and checked, its table factory and block cache built. With fifteen families that was
//! about 29 million instructions, half a restart's time to its first step. One shared family
//! opens in about a third of the time.
//!
//! [`Table::Meta`] keeps a family of its own, so that a build that predates the shared family
//! finds the layout row where it looks for it and refuses the store as newer, instead of
//! reading its own empty families as an empty store.

use rocksdb::{ColumnFamilyDescriptor, Options, WriteBatch, WriteOptions, DB};

use super::{backend, db_options};
use crate::store::{StoreError, Table};

/// The family every table but [`Table::Meta`] shares.
pub(super) const SHARED: &str = rocksdb::DEFAULT_COLUMN_FAMILY_NAME;

/// The layout from which every table but [`Table::Meta`] is in the shared family.
const SHARED_SINCE: u32 = 5;

/// Bytes of rows copied per write when tables move into the shared family.
const MOVE_BATCH_BYTES: usize = 4 << 20;

/// Where one table's rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Home {
    /// A family named after the table: [`Table::Meta`] always, and any table of a store written
    /// before layout 5, opened read-only.
    Own,
    /// The shared family, each key behind this tag.
    Shared(u8),
}

impl Home {
    /// Where `table` is in a store of layout 5 or later.
    pub(super) fn of(table: Table) -> Home {
        match table {
            Table::Meta => Home::Own,
            table => Home::Shared(tag(table)),
        }
    }

    /// The family's name.
    pub(super) fn family(self, table: Table) -> &'static str {
        match self {
            Home::Own => table.name(),
            Home::Shared(_) => SHARED,
        }
    }

    /// Runs `read` on the key stored for the table's `key`. A short key is tagged on the
    /// stack: a step's reads and writes allocate nothing for it.
    pub(super) fn with_stored<T>(self, key: &[u8], read: impl FnOnce(&[u8]) -> T) -> T {
        const ON_STACK: usize = 127;
        let Home::Shared(tag) = self else {
            return read(key);
        };
        if key.len() <= ON_STACK {
            let mut stored = [0u8; ON_STACK + 1];
            stored[0] = tag;
            stored[1..=key.len()].copy_from_slice(key);
            return read(&stored[..=key.len()]);
        }
        let mut stored = Vec::with_capacity(key.len() + 1);
        stored.push(tag);
        stored.extend_from_slice(key);
        read(&stored)
    }

    /// The table's key of a stored key; `None` for another table's row.
    pub(super) fn table_key(self, stored: &[u8]) -> Option<&[u8]> {
        match self {
            Home::Own => Some(stored),
            Home::Shared(tag) => match stored.split_first() {
                Some((first, rest)) if *first == tag => Some(rest),
                _ => None,
            },
        }
    }
}

/// A table's tag in the shared family: on disk, so never changed nor reused.
fn tag(table: Table) -> u8 {
    match table {
        Table::Workflows => 1,
        Table::Journal => 2,
        Table::Timers => 3,
        Table::Requests => 4,
        Table::Operations => 5,
        Table::Streams => 6,
        Table::Inbox => 7,
        Table::Artifacts => 8,
        Table::StreamSteps => 9,
        Table::Meta => 10,
        Table::StreamAcks => 11,
        Table::ArtifactRefs => 12,
        Table::Ended => 13,
        Table::Blobs => 14,
    }
}

/// The families to open: the shared one, meta's, and every other one the store has (RocksDB
/// refuses an open that leaves one out).
pub(super) fn descriptors(found: &[String]) -> Vec<ColumnFamilyDescriptor> {
    let mut names = vec![SHARED, Table::Meta.name()];
    for name in found {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    let family = |name: &str| ColumnFamilyDescriptor::new(name, db_options());
    names.into_iter().map(family).collect()
}

/// The families of the store in `dir`, none if there is no store yet.
pub(super) fn listed(dir: &std::path::Path, created: bool) -> Result<Vec<String>, StoreError> {
    if created {
        return Ok(Vec::new());
    }
    DB::list_cf(&Options::default(), dir).map_err(backend)
}

/// Moves the rows of every table still in a family of its own into the shared family, then
/// drops that family: the upgrade to layout 5, before the store serves anything.
///
/// A family is dropped only once its rows are copied and synced, so a crash leaves each table
/// whole in one place: in its family (copied again by the next open, the same values over the
/// same keys), or in the shared family. The family of a table left by a build that refused
/// the store is empty, and dropped.
pub(super) fn share_tables(db: &mut DB) -> Result<(), StoreError> {
    for table in Table::ALL {
        if table == Table::Meta || db.cf_handle(table.name()).is_none() {
            continue;
        }
        move_rows(db, table)?;
        db.drop_cf(table.name()).map_err(backend)?;
        tracing::info!(table = table.name(), "table moved into the shared family");
    }
    Ok(())
}

fn move_rows(db: &DB, table: Table) -> Result<(), StoreError> {
    let (Some(own), Some(shared)) = (db.cf_handle(table.name()), db.cf_handle(SHARED)) else {
        return Err(StoreError::Backend(format!(
            "column family `{}` or `{SHARED}` missing",
            table.name()
        )));
    };
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    let home = Home::of(table);
    let (mut batch, mut bytes) = (WriteBatch::default(), 0);
    let mut rows = db.raw_iterator_cf(own);
    rows.seek_to_first();
    while let (Some(key), Some(value)) = (rows.key(), rows.value()) {
        home.with_stored(key, |key| batch.put_cf(shared, key, value));
        bytes += key.len() + value.len();
        if bytes >= MOVE_BATCH_BYTES {
            let full = std::mem::take(&mut batch);
            db.write_opt(full, &synced).map_err(backend)?;
            bytes = 0;
        }
        rows.next();
    }
    rows.status().map_err(backend)?;
    // Synced even when empty: the rows of the batches before it must be on disk before the
    // family that also holds them is dropped.
    db.write_opt(batch, &synced).map_err(backend)
}

/// Where each table is in a store of layout `layout` opened read-only, which cannot move them:
/// in the shared family from layout 5; before, in its own family while it has one (an
/// interrupted upgrade moves them table by table), else in the shared family.
pub(super) fn read_only_homes(db: &DB, layout: Option<u32>) -> [Home; Table::ALL.len()] {
    let shared = layout.is_some_and(|version| version >= SHARED_SINCE);
    Table::ALL.map(|table| {
        let own = table == Table::Meta || (!shared && db.cf_handle(table.name()).is_some());
        match own {
            true => Home::Own,
            false => Home::of(table),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_table_has_a_tag_of_its_own() {
        let mut tags: Vec<u8> = Table::ALL.iter().map(|table| tag(*table)).collect();
        tags.sort_unstable();
        tags.dedup();
        assert_eq!(tags.len(), Table::ALL.len());
        assert!(!tags.contains(&0));
    }

    #[test]
    fn a_stored_key_reads_back_as_its_tables_key_only() {
        let journal = Home::of(Table::Journal);
        let stored = journal.with_stored(b"wf#1", <[u8]>::to_vec);
        assert_eq!(stored, b"\x02wf#1");
        assert_eq!(journal.table_key(&stored), Some(&b"wf#1"[..]));
        assert_eq!(Home::of(Table::Workflows).table_key(&stored), None);
        let long = vec![b'k'; 300];
        let tagged = journal.with_stored(&long, <[u8]>::to_vec);
        assert_eq!((tagged[0], &tagged[1..]), (2, &long[..]));
    }
}
