//! The embedded default engine: RocksDB on disk, most tables sharing one column family
//! ([`families`]).

mod families;
mod log;

use std::cell::RefCell;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rocksdb::{
    DBCompressionType, DBRawIterator, LogLevel, Options, ReadOptions, ReadTier, Snapshot,
    WriteBatch, WriteOptions, DB,
};

use families::Home;
use log::{Appended, Applied, Record, Recovered, StoreLog};

use super::coded::CodecEngine;
use super::engine::{Engine, Reads, Row, RowVisitor, Write};
use super::kv::KvStore;
use super::{layout, StoreError, Table};
use crate::codec::Codec;

/// The store on RocksDB: the embedded default, its values sealed when it is given a codec.
pub type RocksStore = KvStore<CodecEngine<RocksEngine>>;

/// RocksDB as the store's [`Engine`].
pub struct RocksEngine {
    /// Where a write is made durable (none when read-only). Declared before `db`, so that a
    /// sync of RocksDB's log it started ends before the database closes.
    log: Option<Mutex<StoreLog>>,
    db: Arc<DB>,
    /// Reads that answer from the memtables and the block cache only (RocksDB's
    /// `kBlockCacheTier`), or say they would need the disk.
    in_memory: ReadOptions,
    /// Write options made once: RocksDB's C API allocates each one it makes.
    synced: WriteOptions,
    unsynced: WriteOptions,
    /// Where each table's rows are, by [`Table::index`].
    homes: [Home; Table::ALL.len()],
}

impl RocksStore {
    /// Opens (creating if needed) the store in `dir` for reading and writing, its values as
    /// they are. One process at a time: RocksDB's lock file refuses a second opener.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with_codec(dir, None)
    }

    /// [`RocksStore::open`], sealing every value written with `codec` and opening those it
    /// sealed. Values written without a codec still read.
    pub fn open_with_codec(dir: &Path, codec: Option<Arc<dyn Codec>>) -> Result<Self, StoreError> {
        Self::open_writable(dir, codec, log::SEGMENT_BYTES)
    }

    fn open_writable(
        dir: &Path,
        codec: Option<Arc<dyn Codec>>,
        log_segment_bytes: u64,
    ) -> Result<Self, StoreError> {
        // RocksDB names its live manifest in `CURRENT`: without it there is no store yet.
        let created = !dir.join("CURRENT").exists();
        if !dir.exists() {
            create_private_dir(dir)?;
        }
        let found = families::listed(dir, created)?;
        let descriptors = families::descriptors(&found);
        let db = DB::open_cf_descriptors(&db_options(), dir, descriptors).map_err(backend)?;
        // Before any other write: each record knows the sequence number RocksDB gave it.
        let log = recover_log(&db, dir, log_segment_bytes)?;
        let homes = families::homes(&db)?;
        let mut engine = CodecEngine::new(RocksEngine::new(Arc::new(db), homes), codec);
        // Refused before an upgrade could write in clear; marked once the layout is known.
        engine.check_sealing(false)?;
        // Refuses a newer build's store before anything is written; an older one's tables
        // move into the shared family only once the layout row says so.
        layout::prepare(&engine, created)?;
        engine.check_sealing(true)?;
        engine.inner_mut().share_tables()?;
        // The upgrade's writes above are synced to RocksDB's log, as they always were.
        engine.inner_mut().begin_log(log)?;
        KvStore::writable(Arc::new(engine), super::kv::MAX_GROUP)
    }

    /// Opens a store read-only, for inspecting a stopped worker's data (or a running one's, as
    /// of its last flush). Commits fail with [`StoreError::Closed`].
    pub fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        Self::open_read_only_with_codec(dir, None)
    }

    /// [`RocksStore::open_read_only`], opening values `codec` sealed.
    pub fn open_read_only_with_codec(
        dir: &Path,
        codec: Option<Arc<dyn Codec>>,
    ) -> Result<Self, StoreError> {
        // A store written by an older build may lack families added since, or keep a family
        // per table; read what it has where it has it.
        let found = DB::list_cf(&Options::default(), dir).map_err(backend)?;
        let db = DB::open_cf_for_read_only(&db_options(), dir, &found, false).map_err(backend)?;
        let homes = families::homes(&db)?;
        let engine = RocksEngine::new(Arc::new(db), homes);
        // Without the family of the layout row, the store predates it (and encryption).
        let has_meta = engine.db.cf_handle(Table::Meta.name()).is_some();
        if has_meta {
            layout::check_readable(&engine)?;
        }
        let engine = CodecEngine::new(engine, codec);
        if has_meta {
            engine.check_sealing(false)?;
        }
        Ok(KvStore::read_only(Arc::new(engine)))
    }
}

impl RocksStore {
    /// Seals under the codec's current key every value that is plain or under an older key
    /// ([`CodecEngine::rekey`]), then flushes and compacts every family, so that the values
    /// it replaced leave RocksDB's files. For a store no worker holds.
    pub fn rekey(&self) -> Result<super::Rekeyed, StoreError> {
        let done = self.engine().rekey()?;
        let engine = self.engine().inner();
        engine.compact()?;
        match &engine.log {
            Some(log) => lock(log).remake()?,
            None => return Err(StoreError::Closed),
        }
        Ok(done)
    }
}

/// Opens the store's own log in `dir`, writing into RocksDB again each record past what it
/// recovered of its own log (none are, after a process crash; some may be after the machine
/// stopped), then syncing RocksDB's log.
fn recover_log(db: &DB, dir: &Path, segment_bytes: u64) -> Result<Recovered, StoreError> {
    let unsynced = WriteOptions::default();
    let apply = |record: Record| {
        let held = db.latest_sequence_number();
        // The log reads back only records of at least one write.
        let count = log::batch_count(&record.batch).unwrap_or(0);
        let last = (record.first_sequence + count).saturating_sub(1);
        if count == 0 || last <= held {
            return Ok(Applied::Held);
        }
        if record.first_sequence != held + 1 {
            return Err(StoreError::Backend(format!(
                "the store's log resumes at write {} where RocksDB holds writes up to {held}: \
                 writes in between are lost",
                record.first_sequence
            )));
        }
        let batch = WriteBatch::from_data(&record.batch);
        db.write_opt(batch, &unsynced).map_err(backend)?;
        Ok(Applied::Written)
    };
    let recovered = StoreLog::open(dir, segment_bytes, apply)?;
    if recovered.applied == Applied::Written {
        tracing::warn!("writes RocksDB's log had lost were written again from the store's log");
        db.flush_wal(true).map_err(backend)?;
    }
    Ok(recovered)
}

/// The log, which takes no more writes if a write panicked holding it.
fn lock(log: &Mutex<StoreLog>) -> std::sync::MutexGuard<'_, StoreLog> {
    log.lock().unwrap_or_else(|poisoned| {
        let mut log = poisoned.into_inner();
        log.poisoned();
        log
    })
}

/// Creates the data dir readable by its owner only (`0700` on Unix): it holds every input,
/// output, prompt and answer as written.
fn create_private_dir(dir: &Path) -> Result<(), StoreError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    let created = builder.create(dir);
    created.map_err(|e| StoreError::Backend(format!("creating {}: {e}", dir.display())))
}

impl RocksEngine {
    fn new(db: Arc<DB>, homes: [Home; Table::ALL.len()]) -> Self {
        let mut in_memory = ReadOptions::default();
        in_memory.set_read_tier(ReadTier::BlockCache);
        let mut synced = WriteOptions::default();
        synced.set_sync(true);
        Self {
            log: None,
            db,
            in_memory,
            synced,
            unsynced: WriteOptions::default(),
            homes,
        }
    }

    /// Makes every write durable in the store's own log from now on.
    fn begin_log(&mut self, recovered: Recovered) -> Result<(), StoreError> {
        let syncing = Arc::clone(&self.db);
        let sync_rocks: log::SyncRocks = Arc::new(move || syncing.flush_wal(true).map_err(backend));
        self.log = Some(Mutex::new(recovered.begin(sync_rocks)?));
        Ok(())
    }

    /// `batch` as RocksDB's, made at its full size.
    fn rocks_batch(&self, batch: Vec<Write>) -> Result<WriteBatch, StoreError> {
        let mut rocks_batch = WriteBatch::with_capacity_bytes(batch_bytes(&batch));
        for write in batch {
            let family = self.family(write.table())?;
            let home = self.home(write.table());
            let rocks_batch = &mut rocks_batch;
            match write {
                Write::Put(_, key, value) => {
                    home.with_stored(&key, |key| rocks_batch.put_cf(family, key, value));
                }
                Write::Delete(_, key) => {
                    home.with_stored(&key, |key| rocks_batch.delete_cf(family, key));
                }
                Write::DeleteRange(_, from, to) => home.with_stored(&from, |from| {
                    home.with_stored(&to, |to| rocks_batch.delete_range_cf(family, from, to));
                }),
            }
        }
        Ok(rocks_batch)
    }

    /// An iterator over `table`, standing on its first key at or after `from`.
    fn iterator_from(&self, table: Table, from: &[u8]) -> Result<DBRawIterator<'_>, StoreError> {
        let home = self.home(table);
        let options = home.bounded(ReadOptions::default());
        let mut raw = self.db.raw_iterator_cf_opt(self.family(table)?, options);
        home.with_stored(from, |stored| raw.seek(stored));
        Ok(raw)
    }

    /// Flushes every family's memtable and compacts all of it: afterwards the files hold only
    /// the live value of each key (the write-ahead log of what was flushed is dropped too).
    pub fn compact(&self) -> Result<(), StoreError> {
        for family in self.families()? {
            self.db.flush_cf(family).map_err(backend)?;
            self.db
                .compact_range_cf(family, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    /// Bytes held by the memtables of every family (active and not yet flushed): RocksDB's
    /// write buffer, apart from what the workflows hold.
    pub fn memtable_bytes(&self) -> Result<u64, StoreError> {
        let mut bytes = 0;
        for family in self.families()? {
            let property = "rocksdb.cur-size-all-mem-tables";
            let size = self.db.property_int_value_cf(family, property);
            bytes += size.map_err(backend)?.unwrap_or(0);
        }
        Ok(bytes)
    }

    fn home(&self, table: Table) -> Home {
        self.homes[table.index()]
    }

    fn family(&self, table: Table) -> Result<&rocksdb::ColumnFamily, StoreError> {
        let name = self.home(table).family(table);
        let missing = || StoreError::Backend(format!("column family `{name}` missing"));
        self.db.cf_handle(name).ok_or_else(missing)
    }

    /// Every family a table is in, once each.
    fn families(&self) -> Result<Vec<&rocksdb::ColumnFamily>, StoreError> {
        let mut names: Vec<&str> = Vec::new();
        let mut families = Vec::new();
        for table in Table::ALL {
            let name = self.home(table).family(table);
            if !names.contains(&name) {
                names.push(name);
                families.push(self.family(table)?);
            }
        }
        Ok(families)
    }
}

impl Reads for RocksEngine {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let family = self.family(table)?;
        let read = |stored: &[u8]| self.db.get_cf(family, stored);
        self.home(table).with_stored(key, read).map_err(backend)
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        rows_lent(self, table, prefix, from, limit)
    }

    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        let mut raw = self.iterator_from(table, from)?;
        let home = self.home(table);
        visit_from(&mut raw, home, prefix, limit, |_, key, value| {
            visit(key, value)
        })
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let home = self.home(table);
        let options = home.bounded(ReadOptions::default());
        let mut raw = self.db.raw_iterator_cf_opt(self.family(table)?, options);
        // The prefix's first row tells whether it has one at or below `upto`, found by a
        // forward seek: a new workflow's journal, or a stream never written, has none, and a
        // seek back to where nothing is costs about half again as much.
        home.with_stored(prefix, |stored| raw.seek(stored));
        if !first_is_within(&raw, home, prefix, upto) {
            return raw.status().map(|()| None).map_err(backend);
        }
        home.with_stored(upto, |stored| raw.seek_for_prev(stored));
        row_at(&raw, home, prefix)
    }
}

/// Whether `raw`, sought to `prefix`, stands on a row of the prefix at or below `upto`: if not,
/// the prefix has no such row, and [`Reads::last`] need not seek back.
fn first_is_within(raw: &DBRawIterator<'_>, home: Home, prefix: &[u8], upto: &[u8]) -> bool {
    let first = raw.key().and_then(|stored| home.table_key(stored));
    first.is_some_and(|key| key.starts_with(prefix) && key <= upto)
}

/// The rows `reads` lends to a visitor in a [`Reads::scan_with`], copied out: a scan that
/// returns them is the same walk.
fn rows_lent(
    reads: &impl Reads,
    table: Table,
    prefix: &[u8],
    from: &[u8],
    limit: usize,
) -> Result<Vec<Row>, StoreError> {
    let mut rows: Vec<Row> = Vec::new();
    reads.scan_with(table, prefix, from, limit, &mut |key, value| {
        rows.push((key.into(), value.into()));
        Ok(())
    })?;
    Ok(rows)
}

/// Hands `visit` the rows from where `raw` stands on, while they are the table's and start
/// with `prefix`, up to `limit` of them, where the iterator holds them (the key as stored, the
/// key in its table, the value): `raw` is left on the key after the last one.
fn visit_from(
    raw: &mut DBRawIterator<'_>,
    home: Home,
    prefix: &[u8],
    limit: usize,
    mut visit: impl FnMut(&[u8], &[u8], &[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut visited = 0;
    while let (Some(stored), Some(value)) = (raw.key(), raw.value()) {
        let key = home.table_key(stored).filter(|key| key.starts_with(prefix));
        let Some(key) = key.filter(|_| visited < limit) else {
            break;
        };
        visit(stored, key, value)?;
        visited += 1;
        raw.next();
    }
    raw.status().map_err(backend)
}

/// The row `raw` stands on, if it is the table's and its key starts with `prefix`.
fn row_at(raw: &DBRawIterator<'_>, home: Home, prefix: &[u8]) -> Result<Option<Row>, StoreError> {
    let found = match (raw.key(), raw.value()) {
        (Some(stored), Some(value)) => home
            .table_key(stored)
            .filter(|key| key.starts_with(prefix))
            .map(|key| (key.into(), value.into())),
        _ => None,
    };
    raw.status().map(|()| found).map_err(backend)
}

impl Engine for RocksEngine {
    /// The batch's record goes to the store's log (synced there when `sync`) before RocksDB
    /// writes it, unsynced: a reader sees a synced write only once it is durable. One write at
    /// a time, so that the log's order is RocksDB's and each record knows its sequence number.
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        let rocks_batch = self.rocks_batch(batch)?;
        let Some(log) = &self.log else {
            return self
                .db
                .write_opt(rocks_batch, &self.synced)
                .map_err(backend);
        };
        let mut log = lock(log);
        // RocksDB numbers no write of an empty batch: a record of one would share its
        // sequence number with the next one's.
        if rocks_batch.is_empty() {
            return if sync { log.sync() } else { Ok(()) };
        }
        let first_sequence = self.db.latest_sequence_number() + 1;
        match log.append(first_sequence, rocks_batch.data(), sync)? {
            Appended::At(at) => {
                let written = self.db.write_opt(rocks_batch, &self.unsynced);
                written.map_err(backend).inspect_err(|_| log.retract(at))
            }
            // Larger than a segment: RocksDB's own log makes it durable, with every write
            // before it.
            Appended::TooLarge => self
                .db
                .write_opt(rocks_batch, &self.synced)
                .map_err(backend),
        }
    }

    fn write_sequence(&self) -> Option<u64> {
        Some(self.db.latest_sequence_number())
    }

    fn writes_on_caller(&self) -> bool {
        true
    }

    fn burst_reads(&self) -> Option<Box<dyn Reads + '_>> {
        Some(Box::new(Cursors::new(self)))
    }

    fn get_in_memory(
        &self,
        table: Table,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        let family = match self.family(table) {
            Ok(family) => family,
            Err(missing) => return Some(Err(missing)),
        };
        let read = |stored: &[u8]| self.db.get_cf_opt(family, stored, &self.in_memory);
        match self.home(table).with_stored(key, read) {
            Err(e) if e.kind() == rocksdb::ErrorKind::Incomplete => None,
            read => Some(read.map_err(backend)),
        }
    }

    /// Writes the memtables to table files, then empties the store's log: otherwise the next
    /// open replays RocksDB's log into memtables and writes those table files itself, and
    /// reads every record of the store's log back, before the first step.
    fn checkpoint_at_close(&self) -> Result<(), StoreError> {
        let families = self.families()?;
        let options = rocksdb::FlushOptions::default();
        // Under the log's lock: no write lands between the flush and the emptying.
        let mut log = self.log.as_ref().map(lock);
        self.db
            .flush_cfs_opt(&families, &options)
            .map_err(backend)?;
        log.as_mut().map_or(Ok(()), |log| log.empty_both())
    }
}

/// A burst's reads, all at one snapshot taken when the burst begins, so that a load reads one
/// state of the store (a record and its journal from the same moment): one raw cursor per
/// table, made at the table's first read and moved from one read to the next. A point read is
/// a seek too: on an open cursor it costs about two thirds of a `get`, which sets up a lookup
/// of its own. (A seek for an absent key passes over the deleted rows after it, where a `get`
/// would stop; the loads read keys that exist, or are about to.) A read whose seek would land
/// where the cursor already stands, or one step on, skips the seek: the loads of a recovery
/// come in key order, and each workflow's rows begin where the one before it ends.
struct Cursors<'a> {
    engine: &'a RocksEngine,
    // Declared before the snapshot, so that they are dropped before it.
    open: RefCell<Vec<(Table, Cursor<'a>)>>,
    snapshot: Snapshot<'a>,
}

/// A table's cursor, and what is known of where it stands.
struct Cursor<'a> {
    raw: DBRawIterator<'a>,
    stands: Stands,
}

/// Where a cursor stands, as far as a forward seek can tell.
#[derive(Default)]
enum Stands {
    #[default]
    Unknown,
    /// On the first key at or after this one (or at the end).
    AtOrAfter(Vec<u8>),
    /// On the first key after this one (or at the end).
    After(Vec<u8>),
}

impl Stands {
    /// On the first key after `bound` (at or after, `inclusive`), in the buffer of the bound
    /// it replaces.
    fn set_past(&mut self, bound: &[u8], inclusive: bool) {
        let mut key = match std::mem::take(self) {
            Stands::AtOrAfter(key) | Stands::After(key) => key,
            Stands::Unknown => Vec::new(),
        };
        key.clear();
        key.extend_from_slice(bound);
        *self = match inclusive {
            true => Stands::AtOrAfter(key),
            false => Stands::After(key),
        };
    }
}

impl Cursor<'_> {
    /// Moves to the first key at or after `target`, without a seek when that is where the
    /// cursor stands (it stands on the first key past a bound at or before `target`, and that
    /// key is not before `target`) or where one step takes it.
    fn seek(&mut self, target: &[u8]) {
        if !(self.stands_at(target) || self.steps_to(target)) {
            self.raw.seek(target);
        }
        self.stands_past(target, true);
    }

    /// Whether one step from the key it stands on, before `target`, takes the cursor at or
    /// past `target`: then it is on the first key at or after `target`, since no key lies
    /// between a key and the next. A point read leaves the cursor on the key it read, and the
    /// next workflow's row is the next key.
    fn steps_to(&mut self, target: &[u8]) -> bool {
        let before = self.raw.status().is_ok() && self.raw.key().is_some_and(|key| key < target);
        if !before {
            return false;
        }
        self.raw.next();
        self.raw.status().is_ok() && self.raw.key().is_none_or(|key| key >= target)
    }

    /// Notes that the cursor stands on the first key after `bound` (at or after, `inclusive`),
    /// in the buffer of the bound it replaces.
    fn stands_past(&mut self, bound: &[u8], inclusive: bool) {
        self.stands.set_past(bound, inclusive);
    }

    fn stands_at(&self, target: &[u8]) -> bool {
        let bound_before = match &self.stands {
            Stands::Unknown => false,
            Stands::AtOrAfter(bound) => bound.as_slice() <= target,
            Stands::After(bound) => bound.as_slice() < target,
        };
        // An invalid cursor with no error is at the end: nothing is at or after the target.
        bound_before && self.raw.status().is_ok() && self.raw.key().is_none_or(|key| key >= target)
    }
}

impl<'a> Cursors<'a> {
    fn new(engine: &'a RocksEngine) -> Self {
        let snapshot = engine.db.snapshot();
        Self {
            engine,
            open: RefCell::default(),
            snapshot,
        }
    }

    fn at(snapshot: &Snapshot<'a>) -> ReadOptions {
        let mut options = ReadOptions::default();
        options.set_snapshot(snapshot);
        options
    }

    /// Runs `read` on the cursor of `table`, made if this burst has none yet.
    fn with_cursor<T>(
        &self,
        table: Table,
        read: impl FnOnce(&mut Cursor<'a>) -> T,
    ) -> Result<T, StoreError> {
        // A read from inside a scan's visitor would need a second borrow: refused, not a panic.
        let Ok(mut open) = self.open.try_borrow_mut() else {
            return Err(StoreError::Backend(
                "a burst's read from inside one of its scans".into(),
            ));
        };
        let index = match open.iter().position(|(t, _)| *t == table) {
            Some(index) => index,
            None => {
                let family = self.engine.family(table)?;
                let options = self.engine.home(table).bounded(Self::at(&self.snapshot));
                let raw = self.engine.db.raw_iterator_cf_opt(family, options);
                let stands = Stands::Unknown;
                open.push((table, Cursor { raw, stands }));
                open.len() - 1
            }
        };
        Ok(read(&mut open[index].1))
    }
}

impl Reads for Cursors<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let home = self.engine.home(table);
        self.with_cursor(table, |cursor| {
            home.with_stored(key, |stored| {
                cursor.seek(stored);
                let raw = &cursor.raw;
                let found = match (raw.key(), raw.value()) {
                    (Some(at), Some(value)) if at == stored => Some(value.to_vec()),
                    _ => None,
                };
                raw.status().map(|()| found).map_err(backend)
            })
        })?
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        rows_lent(self, table, prefix, from, limit)
    }

    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        let home = self.engine.home(table);
        self.with_cursor(table, |cursor| {
            home.with_stored(from, |stored| cursor.seek(stored));
            let Cursor { raw, stands } = cursor;
            let visited = visit_from(raw, home, prefix, limit, |stored, key, value| {
                visit(key, value)?;
                // Noted before the step past the row, which visit_from takes next.
                stands.set_past(stored, false);
                Ok(())
            });
            if visited.is_err() {
                // Stopped on a row, or by the engine: where the cursor stands is not known.
                *stands = Stands::Unknown;
            }
            visited
        })?
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let home = self.engine.home(table);
        self.with_cursor(table, |cursor| {
            // The prefix's first row tells whether it has one at or below `upto`: found by a
            // forward seek, which the loads of a recovery mostly skip (most workflows have no
            // stream, and in a shared family a seek back for an absent one costs a full one).
            home.with_stored(prefix, |stored| cursor.seek(stored));
            if !first_is_within(&cursor.raw, home, prefix, upto) {
                return cursor.raw.status().map(|()| None).map_err(backend);
            }
            cursor.stands = Stands::Unknown;
            home.with_stored(upto, |stored| cursor.raw.seek_for_prev(stored));
            row_at(&cursor.raw, home, prefix)
        })?
    }
}

fn db_options() -> Options {
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    // A flush writes the memtable to level 0 as it is; compaction then compresses it once, into
    // the levels below. Level 0's files are few and short-lived (compacted away at four), and
    // compressing them cost every row an LZ4 pass at flush and a decompression at compaction:
    // about 2,400 instructions of a sequential step's 63,000.
    options.set_compression_per_level(&[DBCompressionType::None, DBCompressionType::Lz4]);
    // On open, RocksDB starts `max_file_opening_threads - 1` threads (16 - 1 by default) to load
    // each column family's table handles, whether it has files or not: with the fifteen
    // families of layout 4, 225 threads started and joined before the first step after a
    // restart. One loads them on the opening thread; a store of many table files opens slower
    // for it.
    options.set_max_file_opening_threads(1);
    // At its default level RocksDB's own log takes in every option of every family at each
    // open (about 1 ms of a restart's 15 with layout 4's fifteen families); warnings (write
    // stalls, background errors) and errors still reach it.
    options.set_log_level(LogLevel::Warn);
    // RocksDB dumps its statistics at the info level, which the log no longer keeps: the first
    // dump runs as the store opens, about 6 million instructions beside the first step.
    options.set_stats_dump_period_sec(0);
    // Each open renames RocksDB's log aside (`LOG.old.<time>`) and starts a new one: at the
    // default of 1,000 kept, a worker restarted often fills its data dir with them.
    options.set_keep_log_file_num(KEPT_LOGS);
    options
}

/// How many of RocksDB's own logs a data dir keeps, the current one included.
const KEPT_LOGS: usize = 4;

/// The bytes RocksDB's batch takes for `batch`, within a few: a batch grown from empty copies
/// itself at every doubling, three or four times for a step's rows.
fn batch_bytes(batch: &[Write]) -> usize {
    // The batch's header (sequence number and count); per record, its type, family and tag
    // bytes and the varint lengths of key and value.
    const HEADER: usize = 12;
    const PER_RECORD: usize = 16;
    let record = |write: &Write| {
        PER_RECORD
            + match write {
                Write::Put(_, key, value) | Write::DeleteRange(_, key, value) => {
                    key.len() + value.len()
                }
                Write::Delete(_, key) => key.len(),
            }
    };
    HEADER + batch.iter().map(record).sum::<usize>()
}

fn backend(error: rocksdb::Error) -> StoreError {
    StoreError::Backend(error.into_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{Entry, Payload};
    use crate::store::{Store, Transition, WorkflowStatus};

    /// The range deletions in the store's table files, once its memtables are flushed.
    fn range_deletions_on_disk(store: &RocksStore) -> u64 {
        let engine = store.engine().inner();
        engine.checkpoint_at_close().unwrap();
        let property = "rocksdb.aggregated-table-properties";
        let families = engine.families().unwrap();
        let counts = families.iter().map(|family| {
            let all = engine.db.property_value_cf(family, property).unwrap();
            let all = all.unwrap_or_default();
            let count = all
                .split(';')
                .find_map(|p| p.trim().strip_prefix("# range deletions="));
            count.map_or(0, |count| count.trim().parse::<u64>().unwrap())
        });
        counts.sum()
    }

    /// The length of each of RocksDB's logs in `dir`.
    fn rocks_logs(dir: &Path) -> std::collections::HashMap<std::ffi::OsString, u64> {
        let files = std::fs::read_dir(dir).unwrap().map(Result::unwrap);
        let logs = files.filter(|file| file.file_name().to_string_lossy().ends_with(".log"));
        logs.map(|log| (log.file_name(), log.metadata().unwrap().len()))
            .collect()
    }

    /// A copy of the store in `dir` as its disk would hold it had the machine stopped now:
    /// each of RocksDB's logs cut to `kept` of its bytes, but never below what was `synced`
    /// of it. (RocksDB's table files and manifest are synced as they are written.)
    fn copy_as_if_stopped(
        dir: &Path,
        synced: &std::collections::HashMap<std::ffi::OsString, u64>,
        kept: impl Fn(u64) -> u64,
    ) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let target = copy.path().join(entry.file_name());
            std::fs::copy(entry.path(), &target).unwrap();
            if !entry.file_name().to_string_lossy().ends_with(".log") {
                continue;
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .unwrap();
            let length = file.metadata().unwrap().len();
            let floor = synced.get(&entry.file_name()).copied().unwrap_or(0);
            file.set_len(kept(length).max(floor).min(length)).unwrap();
        }
        copy
    }

    async fn start_workflows(store: &RocksStore, ids: std::ops::Range<usize>) {
        for number in ids {
            let start = crate::store::first_transition(&format!("wf-{number}"));
            store.commit(start).await.unwrap();
        }
    }

    fn started(store: &RocksStore, ids: std::ops::Range<usize>) -> Vec<usize> {
        let found = |number: &usize| store.workflow(&format!("wf-{number}")).unwrap().is_some();
        ids.filter(found).collect()
    }

    /// Each synced write is durable in the store's own log: whatever RocksDB's unsynced log
    /// lost when the machine stopped is written again from it at the next open.
    #[tokio::test]
    async fn writes_rocksdbs_log_lost_are_written_again_from_the_stores_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        // What the open wrote to RocksDB's log is synced.
        let synced = rocks_logs(dir.path());
        start_workflows(&store, 0..40).await;
        for (cut, kept) in [("all", 0.0), ("half", 0.5), ("none", 1.0)] {
            let kept = |length: u64| (length as f64 * kept) as u64;
            let copy = copy_as_if_stopped(dir.path(), &synced, kept);
            let reopened = RocksStore::open(copy.path()).unwrap();
            assert_eq!(
                started(&reopened, 0..40),
                (0..40).collect::<Vec<_>>(),
                "{cut}"
            );
            start_workflows(&reopened, 40..41).await;
            drop(reopened);
            let again = RocksStore::open(copy.path()).unwrap();
            assert_eq!(started(&again, 0..41).len(), 41, "{cut}, opened again");
        }
    }

    /// Writes go on in the other segment when one fills, and a segment is written over only
    /// once RocksDB's log is synced past its records: after many switches, what RocksDB's
    /// log lost since its last sync is still in the store's log.
    #[tokio::test]
    async fn a_full_segment_is_written_over_only_once_rocksdb_holds_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open_writable(dir.path(), None, 8 << 10).unwrap();
        let log = || lock(store.engine().inner().log.as_ref().unwrap());
        // What RocksDB's log holds durably: what the open wrote, then what each sync the log
        // asks for finds.
        let synced = Arc::new(Mutex::new(rocks_logs(dir.path())));
        let (db, at_sync, data) = (
            Arc::clone(&store.engine().inner().db),
            Arc::clone(&synced),
            dir.path().to_owned(),
        );
        log().set_sync_rocks(Arc::new(move || {
            db.flush_wal(true).map_err(backend)?;
            at_sync.lock().unwrap().extend(rocks_logs(&data));
            Ok(())
        }));
        let generation = log().generation();
        start_workflows(&store, 0..200).await;
        assert!(
            log().generation() >= generation + 5,
            "the writes switched segments"
        );
        // The last switch's sync of RocksDB's log.
        log().synced_rocks().unwrap();
        let generation_at_sync = log().generation();
        let synced = synced.lock().unwrap().clone();
        // As many more as the active segment takes without a switch.
        let before = log().offset();
        start_workflows(&store, 200..201).await;
        let per_write = log().offset() - before;
        let room = log().room() / per_write;
        let more = 201 + room as usize;
        start_workflows(&store, 201..more).await;
        assert_eq!(
            log().generation(),
            generation_at_sync,
            "no switch since the sync"
        );
        let copy = copy_as_if_stopped(dir.path(), &synced, |_| 0);
        let reopened = RocksStore::open_writable(copy.path(), None, 8 << 10).unwrap();
        assert_eq!(started(&reopened, 0..more).len(), more);
    }

    /// A synced write with nothing to write makes the writes before it durable, and takes no
    /// record: RocksDB numbers none of its writes, and a record of it would share its
    /// sequence number with the next one's, which would end the log read back there.
    #[tokio::test]
    async fn an_empty_synced_write_leaves_the_records_after_it_readable() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let synced = rocks_logs(dir.path());
        start_workflows(&store, 0..2).await;
        store.engine().inner().write(Vec::new(), true).unwrap();
        start_workflows(&store, 2..4).await;
        let copy = copy_as_if_stopped(dir.path(), &synced, |_| 0);
        let reopened = RocksStore::open(copy.path()).unwrap();
        assert_eq!(started(&reopened, 0..4), [0, 1, 2, 3]);
    }

    /// A store closed cleanly leaves no record to read back at its next open: what they
    /// wrote is in RocksDB's table files.
    #[tokio::test]
    async fn a_store_closed_cleanly_leaves_its_log_empty() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        start_workflows(&store, 0..10).await;
        drop(store);
        let mut records = 0;
        let recovered = StoreLog::open(dir.path(), log::SEGMENT_BYTES, |_| {
            records += 1;
            Ok(Applied::Held)
        });
        drop(recovered.unwrap());
        assert_eq!(records, 0);
        let reopened = RocksStore::open(dir.path()).unwrap();
        assert_eq!(started(&reopened, 0..10).len(), 10);
    }

    /// Records that do not reach back to what RocksDB recovered are refused, not applied over
    /// a hole: here the segment of the earlier records is gone with RocksDB's log.
    #[tokio::test]
    async fn a_log_that_does_not_reach_back_to_rocksdb_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open_writable(dir.path(), None, 8 << 10).unwrap();
        let synced = rocks_logs(dir.path());
        let log = || lock(store.engine().inner().log.as_ref().unwrap());
        let (generation, mut written) = (log().generation(), 0);
        // Into the second segment, by a few writes.
        while log().generation() == generation || log().offset() < 1024 {
            start_workflows(&store, written..written + 1).await;
            written += 1;
        }
        let active = log().active();
        let whole = copy_as_if_stopped(dir.path(), &synced, |_| 0);
        let reopened = RocksStore::open_writable(whole.path(), None, 8 << 10).unwrap();
        assert_eq!(
            started(&reopened, 0..written).len(),
            written,
            "both segments kept"
        );
        let copy = copy_as_if_stopped(dir.path(), &synced, |_| 0);
        std::fs::remove_file(copy.path().join(format!("WAYMARK-LOG-{}", 1 - active))).unwrap();
        let refused = RocksStore::open_writable(copy.path(), None, 8 << 10)
            .err()
            .unwrap();
        assert!(
            refused.to_string().contains("writes in between are lost"),
            "{refused}"
        );
    }

    /// A batch is made at its full size: the estimate covers what RocksDB's batch holds for
    /// every kind of write, in the shared family and in a family of its own, short and long,
    /// without reserving much more.
    #[test]
    fn a_batch_is_made_at_its_full_size() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine().inner();
        let long = vec![b'x'; 70_000];
        let writes = || {
            let mut writes = Vec::new();
            for table in [Table::Journal, Table::Workflows] {
                writes.push(Write::Put(table, b"k".to_vec(), b"v".to_vec()));
                writes.push(Write::Put(table, long.clone(), long.clone()));
                writes.push(Write::Delete(table, long.clone()));
                writes.push(Write::DeleteRange(table, b"a".to_vec(), long.clone()));
            }
            writes
        };
        let estimate = batch_bytes(&writes());
        let made = engine.rocks_batch(writes()).unwrap().size_in_bytes();
        assert!(estimate >= made, "{estimate} < {made}");
        assert!(estimate < made + 200, "{estimate} reserved for {made}");
    }

    /// A flushed memtable lands on level 0 uncompressed; compaction compresses it into the
    /// level below.
    #[test]
    fn only_compaction_compresses() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine().inner();
        let raw: usize = 256 * 1024;
        let value = b"a journal entry's payload, much like the one before it; ".repeat(raw / 56);
        let rows = (0u8..4).map(|key| Write::Put(Table::Journal, vec![key], value.clone()));
        engine.write(rows.collect(), false).unwrap();
        let files = |level: i32| {
            let live = engine.db.live_files().unwrap();
            let on_level = live.into_iter().filter(|file| file.level == level);
            on_level.map(|file| file.size).sum::<usize>()
        };
        let family = engine.family(Table::Journal).unwrap();
        engine.db.flush_cf(family).unwrap();
        assert!(files(0) > 4 * raw, "level 0 holds {} bytes", files(0));
        engine
            .db
            .compact_range_cf(family, None::<&[u8]>, None::<&[u8]>);
        assert_eq!(files(0), 0);
        let compacted: usize = (1..7).map(files).sum();
        assert!(compacted < raw, "compacted to {compacted} bytes");
    }

    /// An end with an empty inbox writes nothing there: a range tombstone per ended run would
    /// slow every later inbox read.
    #[tokio::test]
    async fn an_end_with_an_empty_inbox_leaves_no_tombstone() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let start = crate::store::first_transition("wf");
        let current = start.record.clone();
        store.commit(start).await.unwrap();
        let completed = Entry::WorkflowCompleted {
            output: Payload::unit(),
        };
        let mut end = Transition::append("wf", &current, vec![completed]);
        end.record.status = WorkflowStatus::Completed;
        store.commit(end).await.unwrap();
        assert_eq!(range_deletions_on_disk(&store), 0);
    }

    /// A scan lends, row by row, the rows from its start (within its prefix, as every caller's
    /// is) that have its prefix, up to its limit, on the engine and in a burst, in the shared
    /// family and in the journal's own; a scan that returns them returns the same. A burst's
    /// cursor stands where the scan left it (the next read after each scan agrees), and a read
    /// from inside the visitor is refused in a burst, not a panic.
    #[test]
    fn a_scan_with_a_visitor_sees_the_rows_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine().inner();
        let put = |table, key: &[u8]| Write::Put(table, key.to_vec(), [key, b"!"].concat());
        let keys: [&[u8]; 6] = [b"a1", b"a2", b"a3", b"ab", b"b1", b"\xff"];
        let rows = keys
            .iter()
            .flat_map(|key| [put(Table::Journal, key), put(Table::Timers, key)]);
        engine.write(rows.collect(), false).unwrap();
        let visited = |reads: &dyn Reads, table, prefix: &[u8], from: &[u8], limit| {
            let mut rows: Vec<Row> = Vec::new();
            let mut visit = |key: &[u8], value: &[u8]| {
                rows.push((key.into(), value.into()));
                Ok(())
            };
            reads
                .scan_with(table, prefix, from, limit, &mut visit)
                .unwrap();
            rows
        };
        let scans: [(&[u8], &[u8], usize); 6] = [
            (b"", b"", usize::MAX),
            (b"a", b"a2", usize::MAX),
            (b"a", b"a", 2),
            (b"a", b"a3", 1),
            (b"b", b"b", usize::MAX),
            (b"c", b"c", usize::MAX),
        ];
        let burst = engine.burst_reads().unwrap();
        for reads in [engine as &dyn Reads, burst.as_ref()] {
            for table in [Table::Journal, Table::Timers] {
                for (prefix, from, limit) in scans {
                    let expected: Vec<Row> = keys
                        .iter()
                        .filter(|key| key.starts_with(prefix) && **key >= from)
                        .take(limit)
                        .map(|key| (Box::from(*key), [key, &b"!"[..]].concat().into()))
                        .collect();
                    let lent = visited(reads, table, prefix, from, limit);
                    assert_eq!(lent, expected, "{table:?} {prefix:?} {from:?} {limit}");
                    let returned = reads.scan(table, prefix, from, limit).unwrap();
                    assert_eq!(returned, expected, "{table:?} {prefix:?} {from:?} {limit}");
                    let next = reads.scan(table, b"", b"ab", 1).unwrap();
                    assert_eq!(
                        next[0].0.as_ref(),
                        b"ab",
                        "after {prefix:?} {from:?} {limit}"
                    );
                }
            }
        }
        let mut nested = |_: &[u8], _: &[u8]| burst.get(Table::Timers, b"a1").map(|_| ());
        let refused = burst.scan_with(Table::Journal, b"", b"", 1, &mut nested);
        assert!(
            matches!(refused, Err(StoreError::Backend(_))),
            "{refused:?}"
        );
        let next = burst.scan(Table::Journal, b"", b"a1", 1).unwrap();
        assert_eq!(
            next[0].0.as_ref(),
            b"a1",
            "after a scan its visitor stopped"
        );
    }

    /// In the shared family, each read keeps to its table's rows, on the engine and in a
    /// burst: a scan to the table's end stops before the next table, and a read back from a
    /// key before the table's first stops before the previous one.
    #[test]
    fn reads_keep_to_their_table_in_the_shared_family() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine().inner();
        let put = |table, key: &[u8]| Write::Put(table, key.to_vec(), key.to_vec());
        let rows = vec![
            put(Table::Workflows, b"a"),
            put(Table::Workflows, b"\xff\xff"),
            put(Table::Timers, b"\x00"),
            put(Table::Timers, b"b"),
            put(Table::Requests, b"c"),
        ];
        engine.write(rows, false).unwrap();
        let burst = engine.burst_reads().unwrap();
        for reads in [engine as &dyn Reads, burst.as_ref()] {
            let keys = |rows: Vec<Row>| rows.into_iter().map(|(key, _)| key.to_vec());
            let timers = keys(reads.scan(Table::Timers, b"", b"", usize::MAX).unwrap());
            assert_eq!(
                timers.collect::<Vec<_>>(),
                [b"\x00".to_vec(), b"b".to_vec()]
            );
            let workflows = keys(reads.scan(Table::Workflows, b"", b"b", usize::MAX).unwrap());
            assert_eq!(workflows.collect::<Vec<_>>(), [b"\xff\xff".to_vec()]);
            assert_eq!(reads.last(Table::Requests, b"", b"a").unwrap(), None);
            assert_eq!(reads.last(Table::Timers, b"", b"").unwrap(), None);
            let first = reads.last(Table::Timers, b"", b"\x00").unwrap();
            assert_eq!(first.map(|(key, _)| key.to_vec()), Some(b"\x00".to_vec()));
            assert_eq!(reads.last(Table::Timers, b"b", b"a").unwrap(), None);
            // A prefix without rows, between two that have some.
            assert_eq!(reads.last(Table::Timers, b"a", b"a\xff").unwrap(), None);
            let newest = reads.last(Table::Timers, b"", b"\xff").unwrap();
            assert_eq!(newest.map(|(key, _)| key.to_vec()), Some(b"b".to_vec()));
            assert_eq!(reads.get(Table::Requests, b"b").unwrap(), None);
            assert_eq!(reads.get(Table::Timers, b"b").unwrap(), Some(b"b".to_vec()));
        }
    }

    /// A burst reads one state of the store, the one it began at: what is written after, its
    /// scans and its point reads both miss, so a record and its journal read in it agree.
    #[test]
    fn a_burst_reads_the_store_as_it_was_when_it_began() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine().inner();
        let put = |table, key: &[u8]| Write::Put(table, key.to_vec(), b"v".to_vec());
        let first = vec![put(Table::Journal, b"a#0"), put(Table::Workflows, b"a")];
        engine.write(first, false).unwrap();
        let burst = engine.burst_reads().unwrap();
        let later = vec![put(Table::Journal, b"b#0"), put(Table::Workflows, b"b")];
        engine.write(later, false).unwrap();
        let journal = burst.scan(Table::Journal, b"", b"", usize::MAX).unwrap();
        assert_eq!(
            journal.len(),
            1,
            "the journal row written after the burst began"
        );
        assert_eq!(burst.get(Table::Workflows, b"b").unwrap(), None);
        assert_eq!(
            burst.get(Table::Workflows, b"a").unwrap(),
            Some(b"v".to_vec())
        );
    }

    /// A read from memory answers "it would need the disk" for a value in a table file whose
    /// block no read has cached yet, instead of failing; once read, the block answers it.
    #[test]
    fn a_read_from_memory_defers_an_uncached_block_to_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let (key, value) = (b"book|v1".to_vec(), b"prepared".to_vec());
        let store = RocksStore::open(dir.path()).unwrap();
        let put = Write::Put(Table::Operations, key.clone(), value.clone());
        store.engine().write(vec![put], true).unwrap();
        store.engine().inner().compact().unwrap();
        drop(store);

        let store = RocksStore::open(dir.path()).unwrap();
        let engine = store.engine();
        assert!(engine.get_in_memory(Table::Operations, &key).is_none());
        assert_eq!(
            engine.get(Table::Operations, &key).unwrap(),
            Some(value.clone())
        );
        let cached = engine.get_in_memory(Table::Operations, &key);
        assert_eq!(cached.map(Result::unwrap), Some(Some(value)));
    }
}
