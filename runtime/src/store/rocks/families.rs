//! Where each table's rows are in RocksDB: [`Table::Journal`] and [`Table::Meta`] in families
//! of their own, every other table in the default family, each key behind its table's tag
//! byte.
//!
//! Builds before layout 5 kept one column family per table. Each family costs RocksDB work at
//! every open, whether it holds rows or not: its options written to the `OPTIONS` file, read
//! back and checked, its table factory and block cache built. With fifteen families that was
//! about 29 million instructions, a third of a restart's to its first step.
//!
//! Two tables keep a family of their own. [`Table::Meta`], so that a build that predates the
//! shared family finds the layout row where it looks for it and refuses the store as newer,
//! instead of reading its own empty families as an empty store. [`Table::Journal`], because
//! its rows are appended at its end: in a memtable of its own each append lands next to the
//! one before, where RocksDB's insert starts looking. Shared with the workflow records written
//! beside them, every insert searched the whole memtable again, about 5,000 instructions more
//! per step.
//!
//! A table that shares the default family lives in a family of its own instead while that
//! family holds rows. The rule needs no version, and it holds at every point of the upgrade
//! that moves the tables: a family is dropped only once its rows are copied, so until then it
//! holds the whole table (a copy cut short in the shared family is ignored, then written again
//! over itself), and an empty family (a table without rows, or one an older build created
//! opening a store it then refused) leaves the table to the shared family.

use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, ReadOptions, WriteBatch, WriteOptions, DB};

use super::{backend, db_options, RocksEngine};
use crate::store::{StoreError, Table};

/// The family every table but [`Table::Journal`] and [`Table::Meta`] shares.
pub(super) const SHARED: &str = rocksdb::DEFAULT_COLUMN_FAMILY_NAME;

/// Bytes of rows copied per write when tables move into the shared family.
const MOVE_BATCH_BYTES: usize = 4 << 20;

/// Where one table's rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Home {
    /// A family named after the table: [`Table::Journal`] and [`Table::Meta`] always, and
    /// another table of a store written before layout 5 until a worker moves it.
    Own,
    /// The shared family, each key behind this tag.
    Shared(u8),
}

impl Home {
    /// Where `table` is once every table that shares the default family is in it.
    pub(super) fn of(table: Table) -> Home {
        match table {
            Table::Journal | Table::Meta => Home::Own,
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

    /// Runs `then` on the key stored for the table's `key`. A short key is tagged on the
    /// stack: a step's reads and writes allocate nothing for it.
    pub(super) fn with_stored<T>(self, key: &[u8], then: impl FnOnce(&[u8]) -> T) -> T {
        const ON_STACK: usize = 127;
        let Home::Shared(tag) = self else {
            return then(key);
        };
        if key.len() <= ON_STACK {
            let mut stored = [0u8; ON_STACK + 1];
            stored[0] = tag;
            stored[1..=key.len()].copy_from_slice(key);
            return then(&stored[..=key.len()]);
        }
        let mut stored = Vec::with_capacity(key.len() + 1);
        stored.push(tag);
        stored.extend_from_slice(key);
        then(&stored)
    }

    /// Read options that keep an iterator on the table's keys: in the shared family, a scan
    /// that reaches the table's end would otherwise go on over the next table's deleted rows.
    pub(super) fn bounded(self, mut options: ReadOptions) -> ReadOptions {
        if let Home::Shared(tag) = self {
            options.set_iterate_lower_bound([tag]);
            options.set_iterate_upper_bound([tag + 1]);
        }
        options
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

/// Whether `table` shares the default family once moved there.
fn shares(table: Table) -> bool {
    Home::of(table) != Home::Own
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
        Table::Parked => 15,
        Table::Unsettled => 16,
    }
}

/// The families to open: the shared one, those of the tables that keep their own, and every
/// other one the store has (RocksDB refuses an open that leaves one out).
pub(super) fn descriptors(found: &[String]) -> Vec<ColumnFamilyDescriptor> {
    let mut names = vec![SHARED, Table::Journal.name(), Table::Meta.name()];
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

/// Where each table of the store `db` is: a table that shares the default family is in its own
/// family instead while that family holds rows.
pub(super) fn homes(db: &DB) -> Result<[Home; Table::ALL.len()], StoreError> {
    let mut homes = Table::ALL.map(Home::of);
    for table in Table::ALL {
        let Some(own) = db.cf_handle(table.name()).filter(|_| shares(table)) else {
            continue;
        };
        let mut rows = db.raw_iterator_cf(own);
        rows.seek_to_first();
        rows.status().map_err(backend)?;
        if rows.valid() {
            homes[table.index()] = Home::Own;
        }
    }
    Ok(homes)
}

impl RocksEngine {
    /// Moves every table that shares the default family and is still in a family of its own
    /// into the shared family, and drops that family: the RocksDB part of the upgrade to
    /// layout 5, run once the layout row says 5 (so that an older build refuses the store from
    /// the first drop on) and before the store serves anything.
    pub(super) fn share_tables(&mut self) -> Result<(), StoreError> {
        for table in Table::ALL {
            if !shares(table) || self.db.cf_handle(table.name()).is_none() {
                continue;
            }
            tracing::info!(
                table = table.name(),
                "moving a table into the shared family"
            );
            // The store's log, the one other holder of the database, is begun after this.
            let db = Arc::get_mut(&mut self.db).ok_or_else(|| {
                StoreError::Backend("tables moved while the database was shared".into())
            })?;
            if self.homes[table.index()] == Home::Own {
                move_rows(db, table)?;
            }
            db.drop_cf(table.name()).map_err(backend)?;
            self.homes[table.index()] = Home::of(table);
        }
        Ok(())
    }
}

/// Copies the rows of `table`'s own family into the shared family, every batch synced: the
/// family is dropped next, and what it held must be on disk elsewhere first.
fn move_rows(db: &DB, table: Table) -> Result<(), StoreError> {
    let (Some(own), Some(shared)) = (db.cf_handle(table.name()), db.cf_handle(SHARED)) else {
        return Err(StoreError::Backend(format!(
            "column family `{}` or `{SHARED}` missing",
            table.name()
        )));
    };
    let mut synced = WriteOptions::default();
    synced.set_sync(true);
    let mut once = ReadOptions::default();
    once.fill_cache(false);
    let home = Home::of(table);
    let (mut batch, mut bytes) = (WriteBatch::default(), 0);
    let mut rows = db.raw_iterator_cf_opt(own, once);
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
    db.write_opt(batch, &synced).map_err(backend)
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
        let timers = Home::of(Table::Timers);
        let stored = timers.with_stored(b"wf#1", <[u8]>::to_vec);
        assert_eq!(stored, b"\x03wf#1");
        assert_eq!(timers.table_key(&stored), Some(&b"wf#1"[..]));
        assert_eq!(Home::of(Table::Workflows).table_key(&stored), None);
        let long = vec![b'k'; 300];
        let tagged = timers.with_stored(&long, <[u8]>::to_vec);
        assert_eq!((tagged[0], &tagged[1..]), (3, &long[..]));
    }
}
