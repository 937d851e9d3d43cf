//! An engine in memory that behaves like a disk under faults: what was written but not synced
//! can be lost in a simulated power loss, and writes can be made to fail or to take time.
//!
//! It is what the seeded simulations run the store on, to reach what killing a process cannot:
//! a process crash keeps every write the operating system accepted, a power loss keeps only
//! what was synced (and, as RocksDB's write-ahead log, possibly some of the batches written
//! after the last sync, oldest first).

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::engine::{Engine, Reads, Row, Write};
use super::kv::{KvStore, MAX_GROUP};
use super::{layout, StoreError, Table};
use crate::sync::lock;

/// The store on memory: for simulations and tests.
pub type MemoryStore = KvStore<MemoryEngine>;

impl KvStore<MemoryEngine> {
    /// A store writing to `engine`, which may hold what an earlier store wrote (a restart on
    /// the same "disk"). A new engine gets the current layout.
    pub fn on(engine: Arc<MemoryEngine>) -> Result<Self, StoreError> {
        Self::grouping(engine, MAX_GROUP)
    }

    /// Like [`KvStore::on`], but every job is a batch of its own: the batches a power loss can
    /// drop are then the jobs, in the order they were queued, however the threads were timed.
    /// What a seeded simulation uses to replay a seed exactly.
    pub fn ungrouped(engine: Arc<MemoryEngine>) -> Result<Self, StoreError> {
        Self::grouping(engine, 1)
    }

    fn grouping(engine: Arc<MemoryEngine>, max_group: usize) -> Result<Self, StoreError> {
        let created = engine.is_empty();
        layout::prepare(engine.as_ref(), created)?;
        KvStore::writable(engine, max_group)
    }
}

type Tables = Vec<BTreeMap<Vec<u8>, Vec<u8>>>;

/// Tables in memory, with the synced state kept apart from what a power loss may drop.
#[derive(Default)]
pub struct MemoryEngine {
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    /// What reads see: every batch written.
    current: Tables,
    /// What survives a power loss: every batch up to the last synced one.
    synced: Tables,
    /// Batches written after the last synced one, oldest first.
    unsynced: Vec<Vec<Write>>,
    faults: WriteFaults,
    counts: WriteCounts,
    /// The thread that wrote the last batch.
    last_writer: Option<std::thread::Thread>,
}

#[derive(Default)]
struct WriteFaults {
    /// When the disk fails; `None`: no failure planned.
    failure: Option<PlannedFailure>,
    /// Whether the planned failure came: every write fails until healed.
    failed: bool,
    /// How long each write takes.
    latency: Duration,
}

/// A disk failure planned after a number of writes of some kind.
struct PlannedFailure {
    /// Writes of that kind that still succeed.
    left: u64,
    /// Only synced writes that touch this table count; `None`: every write counts.
    synced_to: Option<Table>,
}

impl PlannedFailure {
    fn counts(&self, batch: &[Write], sync: bool) -> bool {
        match self.synced_to {
            None => true,
            Some(table) => sync && batch.iter().any(|write| write.table() == table),
        }
    }
}

/// What the engine was asked to write since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Batches written.
    pub batches: u64,
    /// Of them, synced.
    pub synced: u64,
    /// Writes refused by an injected failure.
    pub failed: u64,
    /// Batches dropped by power losses.
    pub lost: u64,
}

impl MemoryEngine {
    /// An empty engine.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn is_empty(&self) -> bool {
        lock(&self.state).current.iter().all(BTreeMap::is_empty)
    }

    /// A power loss: every batch written since the last synced one is dropped except the
    /// `keep` oldest. Returns how many were dropped. The stores on this engine must be gone
    /// (as the processes are after a power loss); a new one is opened with [`KvStore::on`].
    pub fn lose_power(&self, keep: usize) -> usize {
        let mut state = lock(&self.state);
        let unsynced = std::mem::take(&mut state.unsynced);
        let dropped = unsynced.len().saturating_sub(keep);
        let mut current = state.synced.clone();
        for batch in unsynced.into_iter().take(keep) {
            apply(&mut current, batch);
        }
        state.synced = current.clone();
        state.current = current;
        state.counts.lost += dropped as u64;
        dropped
    }

    /// Batches written since the last synced one: what a power loss now could drop.
    pub fn unsynced_batches(&self) -> usize {
        lock(&self.state).unsynced.len()
    }

    /// After `writes` more successful writes, every write fails (as a full or broken disk).
    pub fn fail_writes_after(&self, writes: u64) {
        self.plan_failure(writes, None);
    }

    /// After `writes` more successful synced writes that touch `table`, the next such write and
    /// every write after it fail. Counting only synced writes to one table puts the failure at
    /// the same step of a run however the store grouped the writes around it.
    pub fn fail_after_synced_writes_to(&self, table: Table, writes: u64) {
        self.plan_failure(writes, Some(table));
    }

    fn plan_failure(&self, left: u64, synced_to: Option<Table>) {
        let mut state = lock(&self.state);
        state.faults.failure = Some(PlannedFailure { left, synced_to });
    }

    /// Whether the planned failure came: writes fail until [`MemoryEngine::heal`].
    pub fn has_failed(&self) -> bool {
        lock(&self.state).faults.failed
    }

    /// Writes succeed again, and no failure is planned.
    pub fn heal(&self) {
        let mut state = lock(&self.state);
        state.faults.failure = None;
        state.faults.failed = false;
    }

    /// Every write takes `latency`, on the thread that writes, as a slow disk would.
    pub fn set_write_latency(&self, latency: Duration) {
        lock(&self.state).faults.latency = latency;
    }

    /// What the engine was asked to write so far.
    pub fn write_counts(&self) -> WriteCounts {
        lock(&self.state).counts
    }

    /// The name of the thread that wrote the last batch (`unnamed` for a thread without one).
    pub fn last_writer(&self) -> Option<String> {
        let writer = lock(&self.state).last_writer.clone()?;
        Some(writer.name().unwrap_or("unnamed").to_owned())
    }

    fn table(tables: &Tables, table: Table) -> Option<&BTreeMap<Vec<u8>, Vec<u8>>> {
        tables.get(table.index())
    }
}

impl Reads for MemoryEngine {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let state = lock(&self.state);
        let rows = Self::table(&state.current, table);
        Ok(rows.and_then(|rows| rows.get(key).cloned()))
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let state = lock(&self.state);
        let Some(rows) = Self::table(&state.current, table) else {
            return Ok(Vec::new());
        };
        let range = rows.range::<[u8], _>((Bound::Included(from), Bound::Unbounded));
        let under = range.take_while(|(key, _)| key.starts_with(prefix));
        let found = under.take(limit).map(|(key, value)| row(key, value));
        Ok(found.collect())
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let state = lock(&self.state);
        let Some(rows) = Self::table(&state.current, table) else {
            return Ok(None);
        };
        let mut range = rows.range::<[u8], _>((Bound::Unbounded, Bound::Included(upto)));
        let newest = range.next_back().filter(|(key, _)| key.starts_with(prefix));
        Ok(newest.map(|(key, value)| row(key, value)))
    }
}

impl Engine for MemoryEngine {
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        let latency = lock(&self.state).faults.latency;
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let mut state = lock(&self.state);
        if state.faults.fails(&batch, sync) {
            state.counts.failed += 1;
            return Err(StoreError::Backend("injected write failure".into()));
        }
        state.counts.batches += 1;
        state.last_writer = Some(std::thread::current());
        apply(&mut state.current, batch.clone());
        state.unsynced.push(batch);
        if sync {
            state.counts.synced += 1;
            let unsynced = std::mem::take(&mut state.unsynced);
            for batch in unsynced {
                apply(&mut state.synced, batch);
            }
        }
        Ok(())
    }

    /// Batches written and batches a power loss dropped: either changes what reads see.
    fn write_sequence(&self) -> Option<u64> {
        let counts = lock(&self.state).counts;
        Some(counts.batches + counts.lost)
    }

    /// As RocksDB's: the simulations then run the path a lone workflow takes on disk.
    fn writes_on_caller(&self) -> bool {
        true
    }

    /// Everything it holds is in memory.
    fn get_in_memory(
        &self,
        table: Table,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        Some(self.get(table, key))
    }
}

impl WriteFaults {
    /// Whether this write fails, counting it against the planned failure.
    fn fails(&mut self, batch: &[Write], sync: bool) -> bool {
        if self.failed {
            return true;
        }
        let Some(failure) = self.failure.as_mut() else {
            return false;
        };
        if !failure.counts(batch, sync) {
            return false;
        }
        if failure.left == 0 {
            self.failed = true;
            return true;
        }
        failure.left -= 1;
        false
    }
}

fn row(key: &[u8], value: &[u8]) -> Row {
    (key.into(), value.into())
}

fn apply(tables: &mut Tables, batch: Vec<Write>) {
    if tables.len() < Table::ALL.len() {
        tables.resize_with(Table::ALL.len(), BTreeMap::new);
    }
    for write in batch {
        let rows = &mut tables[write.table().index()];
        match write {
            Write::Put(_, key, mut value) => {
                // Kept for the engine's life: without the room its encoding was given.
                value.shrink_to_fit();
                rows.insert(key, value);
            }
            Write::Delete(_, key) => {
                rows.remove(&key);
            }
            Write::DeleteRange(_, from, to) => {
                let doomed: Vec<Vec<u8>> = rows
                    .range::<[u8], _>((Bound::Included(&from[..]), Bound::Excluded(&to[..])))
                    .map(|(key, _)| key.clone())
                    .collect();
                for key in doomed {
                    rows.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str) -> Vec<Write> {
        vec![Write::Put(Table::Journal, key.into(), b"v".to_vec())]
    }

    fn keys(engine: &MemoryEngine) -> Vec<String> {
        let rows = engine.scan(Table::Journal, &[], &[], usize::MAX).unwrap();
        let text = rows.iter().map(|(k, _)| String::from_utf8_lossy(k).into());
        text.collect()
    }

    /// The engine keeps one map per table at its index.
    #[test]
    fn table_indexes_follow_the_list_of_tables() {
        for (position, table) in Table::ALL.iter().enumerate() {
            assert_eq!(table.index(), position, "{}", table.name());
        }
    }

    #[test]
    fn a_power_loss_keeps_what_was_synced_and_the_oldest_unsynced_batches_kept() {
        let engine = MemoryEngine::new();
        engine.write(put("a"), false).unwrap();
        engine.write(put("b"), true).unwrap();
        engine.write(put("c"), false).unwrap();
        engine.write(put("d"), false).unwrap();
        engine.write(put("e"), false).unwrap();
        assert_eq!(engine.unsynced_batches(), 3);
        assert_eq!(engine.lose_power(1), 2);
        assert_eq!(keys(&engine), ["a", "b", "c"]);
        assert_eq!(engine.unsynced_batches(), 0);
        assert_eq!(engine.lose_power(0), 0);
        assert_eq!(keys(&engine), ["a", "b", "c"]);
    }

    #[test]
    fn an_injected_failure_writes_nothing_until_healed() {
        let engine = MemoryEngine::new();
        engine.fail_writes_after(1);
        engine.write(put("a"), true).unwrap();
        assert!(engine.write(put("b"), true).is_err());
        assert_eq!(keys(&engine), ["a"]);
        assert!(
            engine.write(put("c"), true).is_err(),
            "a failed disk stays failed"
        );
        engine.heal();
        engine.write(put("d"), true).unwrap();
        assert_eq!(keys(&engine), ["a", "d"]);
        assert_eq!(engine.write_counts().failed, 2);
    }

    #[test]
    fn a_failure_after_synced_writes_to_a_table_ignores_other_writes() {
        let engine = MemoryEngine::new();
        engine.fail_after_synced_writes_to(Table::Journal, 1);
        let other = vec![Write::Put(Table::Streams, b"s".to_vec(), Vec::new())];
        engine.write(other.clone(), true).unwrap();
        engine.write(put("a"), false).unwrap();
        engine.write(put("b"), true).unwrap();
        engine.write(other.clone(), true).unwrap();
        assert!(engine.write(put("c"), true).is_err());
        assert!(
            engine.write(other, false).is_err(),
            "every write after it fails"
        );
        assert_eq!(keys(&engine), ["a", "b"]);
    }

    #[test]
    fn last_finds_the_greatest_key_under_the_prefix() {
        let engine = MemoryEngine::new();
        for key in ["a1", "a2", "b1"] {
            engine.write(put(key), true).unwrap();
        }
        let found = |prefix: &[u8], upto: &[u8]| {
            let row = engine.last(Table::Journal, prefix, upto).unwrap();
            row.map(|(k, _)| String::from_utf8_lossy(&k).into_owned())
        };
        assert_eq!(found(b"a", b"a\xff").as_deref(), Some("a2"));
        assert_eq!(found(b"b", b"b0"), None);
        assert_eq!(found(b"c", b"c\xff"), None);
    }
}
