//! The ordered key-value engine under [`super::KvStore`]: what a backend must provide so that the
//! store's writer, its checks and its reads work unchanged on it.
//!
//! The store decides every key, value and check; an engine only keeps bytes in tables, in key
//! order, and writes a batch atomically. RocksDB is the engine on disk; [`super::MemoryEngine`]
//! keeps tables in memory and can lose what was not synced, for simulated power losses;
//! PostgreSQL (feature `postgres`) is the engine many workers share, where the writer's checks
//! run inside the transaction that writes ([`Engine::transact`]) and every change to a workflow
//! is fenced by its lease ([`Reads::fence`]).

use std::sync::Arc;

use super::leases::Leases;
use super::{StoreError, Table};

/// A raw key and value.
pub type Row = (Box<[u8]>, Box<[u8]>);

/// What [`Reads::scan_with`] hands each row to: its key (without the table) and its value.
pub type RowVisitor<'v> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'v;

/// One write of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Sets `key` to `value`.
    Put(Table, Vec<u8>, Vec<u8>),
    /// Removes `key`.
    Delete(Table, Vec<u8>),
    /// Removes every key in `[from, to)`.
    DeleteRange(Table, Vec<u8>, Vec<u8>),
}

impl Write {
    /// The table it changes.
    pub fn table(&self) -> Table {
        match self {
            Write::Put(table, ..) | Write::Delete(table, _) | Write::DeleteRange(table, ..) => {
                *table
            }
        }
    }
}

/// How a change relates to the ownership of its workflow (see [`Reads::fence`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The change creates the workflow: its writer becomes its owner.
    Begin,
    /// The change goes on with a workflow its writer owns.
    Continue,
    /// The change ends the workflow: nobody owns it after.
    End,
    /// The change creates a workflow that has ended (an imported journal): nobody owns it.
    Whole,
}

/// What the store's writer reads while it checks a batch: the tables, and whether this process
/// may change a workflow.
pub trait Reads {
    /// The value at `key`.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// The values at `keys`, in their order. An engine across a network reads them in one
    /// round trip (PostgreSQL: one query), so that rows found through an index cost one read,
    /// not one each; this default reads them one by one.
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        keys.iter().map(|key| self.get(table, key)).collect()
    }
    /// Up to `limit` rows whose key starts with `prefix`, from key `from` on, in key order.
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError>;
    /// Hands `visit` each row [`Reads::scan`] would return, in key order, as it reads it: an
    /// engine that reads rows in place (RocksDB's iterator) lends them without a copy. `visit`
    /// must not read through `self` (a RocksDB burst holds its cursor while it runs, and
    /// refuses such a read). The first error, the engine's or `visit`'s, ends the scan.
    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        for (key, value) in self.scan(table, prefix, from, limit)? {
            visit(&key, &value)?;
        }
        Ok(())
    }
    /// The row with the greatest key at or below `upto` among those starting with `prefix`.
    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError>;
    /// The key of the row [`Reads::last`] would return. A codec that seals values leaves the
    /// row sealed: a key is all a journal's length needs.
    fn last_key(
        &self,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Box<[u8]>>, StoreError> {
        Ok(self.last(table, prefix, upto)?.map(|(key, _)| key))
    }
    /// Refuses, with [`StoreError::Fenced`], a change to `workflow_id` by a process that does
    /// not hold its lease; inside [`Engine::transact`] the check holds until the batch is
    /// written. One process owning the whole store (RocksDB, memory) owns every workflow.
    fn fence(&self, _workflow_id: &str, _change: Ownership) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Builds a batch from what it reads: the store's writer, handed to [`Engine::transact`].
pub type Stage<'s> = dyn FnMut(&dyn Reads) -> Result<Vec<Write>, StoreError> + 's;

/// Names what a batch is checked against, one name at a time, to the visitor it is given:
/// listed only for an engine that asks ([`Engine::transact`]).
pub type Locks<'l> = dyn Fn(&mut dyn FnMut(&str)) + 'l;

/// Tables of bytes in key order, written a batch at a time.
pub trait Engine: Reads + Send + Sync + 'static {
    /// Applies every write of `batch`, all or none. With `sync`, returns only once the batch
    /// survives a power loss; without, a power loss may drop it, and the batches after it, but
    /// never one before it.
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError>;

    /// Runs `stage` and writes the batch it returns, so that nothing another process writes
    /// comes between what `stage` read and the batch: `locks` names what the batch is checked
    /// against (workflow ids, request ids, idempotency keys, artifacts), which no other writer
    /// changes meanwhile. `stage` may run more than once (a transaction retried); only the batch of
    /// its last run is written. One process owning the store needs nothing more than reading,
    /// then writing, one writer at a time: it does not ask for the locks, which then cost
    /// nothing (listing them took about 700 instructions a no-op step, 3,600 an effect step).
    fn transact(
        &self,
        locks: &Locks<'_>,
        sync: bool,
        stage: &mut Stage<'_>,
    ) -> Result<(), StoreError> {
        let _ = locks;
        let batch = stage(&ReadsOf(self))?;
        self.write(batch, sync)
    }

    /// The leases of a store that many workers share (`None`: this process owns every
    /// workflow).
    fn leases(&self) -> Option<Arc<dyn Leases>> {
        None
    }

    /// Whether the write that just failed (asked on the writer's thread, right after) leaves
    /// this process unsure of what the engine holds, so that no later write may be staged over
    /// it: a failed fsync does (the page cache may hold what the disk does not). An engine
    /// whose write is all or nothing, and whose checks read only what it holds, answers
    /// `false` for a failure that passes: that group fails, and the writes after it go on.
    fn failed_write_poisons(&self) -> bool {
        true
    }

    /// A number that changes with every batch written to the engine, by whoever writes it;
    /// `None` if the engine does not keep one. The store's writer trusts what it remembers of
    /// its own writes only while this number is the one its last write left.
    fn write_sequence(&self) -> Option<u64> {
        None
    }

    /// Whether a write may run on the thread that submits it, when the store's writer is idle:
    /// an engine whose write waits only on the local disk or on memory. An engine that waits
    /// on another process (a database server over the network) answers `false`, so that its
    /// writes always go through the writer thread.
    fn writes_on_caller(&self) -> bool {
        false
    }

    /// The value at `key` if the engine can tell without waiting on a disk or a network:
    /// what it holds in memory (a cached block, a write buffer). `None`: finding out would
    /// wait, and the caller reads with [`Reads::get`] off the async threads instead.
    fn get_in_memory(
        &self,
        table: Table,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        let _ = (table, key);
        None
    }

    /// Reads for a burst made one after the other on one thread (the loads of the workflows
    /// that start together), sharing what they can: RocksDB reads the whole burst at one
    /// snapshot, taken when the burst begins, and keeps one cursor per table from one read to
    /// the next, instead of creating, seeking and dropping one per scan. Every read sees the
    /// store as it was when the burst began, so a burst is for reads that need nothing newer.
    /// `None`: the engine's own reads are as cheap.
    fn burst_reads(&self) -> Option<Box<dyn Reads + '_>> {
        None
    }

    /// The store was poisoned: nothing more will be written through this engine.
    fn poisoned(&self) {}

    /// The store closes cleanly (its writer has stopped): persist what only a log holds, so
    /// that the next open has nothing to recover, as PostgreSQL's shutdown checkpoint does.
    fn checkpoint_at_close(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// An engine's own reads, as a [`Reads`] of known size.
struct ReadsOf<'a, E: ?Sized>(&'a E);

impl<E: Engine + ?Sized> Reads for ReadsOf<'_, E> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get(table, key)
    }
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.0.get_many(table, keys)
    }
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.0.scan(table, prefix, from, limit)
    }
    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        self.0.scan_with(table, prefix, from, limit, visit)
    }
    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        self.0.last(table, prefix, upto)
    }
    fn last_key(
        &self,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Box<[u8]>>, StoreError> {
        self.0.last_key(table, prefix, upto)
    }
    fn fence(&self, workflow_id: &str, change: Ownership) -> Result<(), StoreError> {
        self.0.fence(workflow_id, change)
    }
}

/// An engine shared behind an `Arc` is the engine.
impl<E: Engine + ?Sized> Reads for Arc<E> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(table, key)
    }
    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        (**self).get_many(table, keys)
    }
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        (**self).scan(table, prefix, from, limit)
    }
    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        (**self).scan_with(table, prefix, from, limit, visit)
    }
    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        (**self).last(table, prefix, upto)
    }
    fn last_key(
        &self,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Box<[u8]>>, StoreError> {
        (**self).last_key(table, prefix, upto)
    }
    fn fence(&self, workflow_id: &str, change: Ownership) -> Result<(), StoreError> {
        (**self).fence(workflow_id, change)
    }
}

impl<E: Engine + ?Sized> Engine for Arc<E> {
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        (**self).write(batch, sync)
    }
    fn transact(
        &self,
        locks: &Locks<'_>,
        sync: bool,
        stage: &mut Stage<'_>,
    ) -> Result<(), StoreError> {
        (**self).transact(locks, sync, stage)
    }
    fn leases(&self) -> Option<Arc<dyn Leases>> {
        (**self).leases()
    }
    fn failed_write_poisons(&self) -> bool {
        (**self).failed_write_poisons()
    }
    fn write_sequence(&self) -> Option<u64> {
        (**self).write_sequence()
    }
    fn writes_on_caller(&self) -> bool {
        (**self).writes_on_caller()
    }
    fn get_in_memory(
        &self,
        table: Table,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        (**self).get_in_memory(table, key)
    }
    fn burst_reads(&self) -> Option<Box<dyn Reads + '_>> {
        (**self).burst_reads()
    }
    fn poisoned(&self) {
        (**self).poisoned()
    }
    fn checkpoint_at_close(&self) -> Result<(), StoreError> {
        (**self).checkpoint_at_close()
    }
}
