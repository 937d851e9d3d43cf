//! The ordered key-value engine under [`super::KvStore`]: what a backend must provide so that the
//! store's writer, its checks and its reads work unchanged on it.
//!
//! The store decides every key, value and check; an engine only keeps bytes in tables, in key
//! order, and writes a batch atomically. RocksDB is the engine on disk; [`super::MemoryEngine`]
//! keeps tables in memory and can lose what was not synced, for simulated power losses.

use super::{StoreError, Table};

/// A raw key and value.
pub type Row = (Box<[u8]>, Box<[u8]>);

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

/// Tables of bytes in key order, written a batch at a time.
pub trait Engine: Send + Sync + 'static {
    /// The value at `key`.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;
    /// Up to `limit` rows whose key starts with `prefix`, from key `from` on, in key order.
    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError>;
    /// The row with the greatest key at or below `upto` among those starting with `prefix`.
    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError>;
    /// Applies every write of `batch`, all or none. With `sync`, returns only once the batch
    /// survives a power loss; without, a power loss may drop it, and the batches after it, but
    /// never one before it.
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError>;
}

/// An engine shared behind an `Arc` is the engine.
impl<E: Engine + ?Sized> Engine for std::sync::Arc<E> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        (**self).get(table, key)
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
    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        (**self).last(table, prefix, upto)
    }
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        (**self).write(batch, sync)
    }
}
