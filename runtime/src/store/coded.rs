//! An [`Engine`] whose values pass through a [`Codec`]: encryption at rest for every table but
//! [`Table::Meta`] (the layout row, which must be readable before anything else is).
//!
//! A sealed value is [`SEALED`] followed by the codec's bytes, sealed under its table's name and
//! its key, so that a value moved to another row does not open. The `meta` row that records
//! that a store is sealed is not itself authenticated: these seals keep values secret and
//! detect a value altered or moved, not a store rewritten by someone who can write its files. A value without that mark is
//! read as it is, so that encryption can be turned on for a store written without it; every
//! value written from then on is sealed, and [`CodecEngine::rekey`] seals the rest, after which
//! a value in clear is refused.

use std::borrow::{Borrow, Cow};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::engine::{Engine, Locks, Ownership, Reads, Row, RowVisitor, Stage, Write};
use super::leases::Leases;
use super::{StoreError, Table};
use crate::codec::{Codec, SEALED};

/// Rows rewritten per batch while rekeying.
const REKEY_PAGE: usize = 512;

/// The `meta` row that says the store's values are sealed: a store with it opens only with a
/// codec, so a worker started without its keys cannot go on writing in clear. Its value is
/// [`SEALED_FROM_NOW`] or, once rekeyed, [`SEALED_ALL`].
const SEALED_KEY: &[u8] = b"sealed";
/// Values written since are sealed; older ones may be in clear.
const SEALED_FROM_NOW: u8 = 1;
/// Every value is sealed: one in clear was put there behind the store's back.
const SEALED_ALL: u8 = 2;

/// `E` with its values sealed by a codec, when it has one.
pub struct CodecEngine<E> {
    inner: E,
    codec: Option<Arc<dyn Codec>>,
    /// Every value is sealed ([`SEALED_ALL`]): a value in clear is refused.
    all_sealed: AtomicBool,
}

/// What [`CodecEngine::rekey`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rekeyed {
    /// Values sealed anew: plain ones and those under an older key.
    pub rewritten: u64,
    /// Values already sealed under the current key.
    pub kept: u64,
}

impl<E: Engine> CodecEngine<E> {
    /// `inner`, sealing with `codec` (or storing values as they are, without one).
    pub fn new(inner: E, codec: Option<Arc<dyn Codec>>) -> Self {
        Self {
            inner,
            codec,
            all_sealed: AtomicBool::new(false),
        }
    }

    /// The engine under the codec.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// The engine under the codec, to change (a backend's own upgrade, as it opens).
    #[cfg(feature = "rocksdb")]
    pub(crate) fn inner_mut(&mut self) -> &mut E {
        &mut self.inner
    }

    /// Refuses a store whose values are sealed when there is no codec to open them; records,
    /// for a store opened `writable` with a codec, that its values are sealed from now on. A
    /// backend calls it when it opens, before anything else is read.
    pub fn check_sealing(&self, writable: bool) -> Result<(), StoreError> {
        let mark = self.inner.get(Table::Meta, SEALED_KEY)?;
        let all = match mark.as_deref() {
            None | Some([SEALED_FROM_NOW]) => false,
            Some([SEALED_ALL]) => true,
            Some(other) => {
                return Err(StoreError::Corrupt {
                    table: Table::Meta,
                    key: "sealed".into(),
                    source: crate::journal::DecodeError::Malformed(format!("mark {other:?}")),
                })
            }
        };
        self.all_sealed.store(all, Ordering::Relaxed);
        match (&self.codec, mark) {
            (None, Some(_)) => Err(StoreError::KeysRequired),
            (Some(_), None) if writable => self.mark(SEALED_FROM_NOW),
            _ => Ok(()),
        }
    }

    fn mark(&self, how: u8) -> Result<(), StoreError> {
        let mark = Write::Put(Table::Meta, SEALED_KEY.to_vec(), vec![how]);
        self.inner.write(vec![mark], true)
    }

    /// Seals every value that is plain or sealed under a key other than the current one, a
    /// page of rows per synced batch, then records that every value is sealed (from then on
    /// one in clear is refused). For a store no worker holds: a row a worker rewrites between
    /// the read and the write here would be lost.
    pub fn rekey(&self) -> Result<Rekeyed, StoreError> {
        let Some(codec) = &self.codec else {
            return Err(StoreError::Backend(
                "rekeying needs encryption keys: none were given".into(),
            ));
        };
        let mut done = Rekeyed::default();
        for table in Table::ALL.into_iter().filter(|t| is_sealed_table(*t)) {
            let mut from = Vec::new();
            loop {
                let rows = self.inner.scan(table, &[], &from, REKEY_PAGE)?;
                let mut batch = Vec::new();
                for (key, value) in &rows {
                    let stale = match value.split_first() {
                        Some((&SEALED, sealed)) => !codec.is_current(sealed),
                        Some(_) => true,
                        None => false,
                    };
                    if stale {
                        let plain = self.open(table, key, value.to_vec())?;
                        batch.push(Write::Put(table, key.to_vec(), plain));
                    } else {
                        done.kept += 1;
                    }
                }
                done.rewritten += batch.len() as u64;
                self.write(batch, true)?;
                let Some((last, _)) = rows.last().filter(|_| rows.len() == REKEY_PAGE) else {
                    break;
                };
                from = last.to_vec();
                from.push(0);
            }
        }
        self.mark(SEALED_ALL)?;
        self.all_sealed.store(true, Ordering::Relaxed);
        Ok(done)
    }

    fn seal(&self, table: Table, key: &[u8], plain: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let Some(codec) = self.codec.as_ref().filter(|_| is_sealed_table(table)) else {
            return Ok(plain);
        };
        if plain.is_empty() {
            return Ok(plain);
        }
        let sealed = codec.encode(&context(table, key), &plain);
        let sealed = sealed.map_err(|source| StoreError::Codec {
            table,
            key: None,
            source,
        })?;
        let mut out = Vec::with_capacity(1 + sealed.len());
        out.push(SEALED);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn open(&self, table: Table, key: &[u8], stored: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let unsealed = match self.opened(table, key, &stored)? {
            Cow::Owned(unsealed) => Some(unsealed),
            Cow::Borrowed(_) => None,
        };
        Ok(unsealed.unwrap_or(stored))
    }

    /// `stored` as the code reads it: itself when it is in clear (where that is allowed), else
    /// unsealed.
    fn opened<'v>(
        &self,
        table: Table,
        key: &[u8],
        stored: &'v [u8],
    ) -> Result<Cow<'v, [u8]>, StoreError> {
        let failed = |source| StoreError::Codec {
            table,
            key: Some(key.escape_ascii().to_string()),
            source,
        };
        if !is_sealed_table(table) || stored.is_empty() {
            return Ok(Cow::Borrowed(stored));
        }
        if stored[0] != SEALED {
            return match self.all_sealed.load(Ordering::Relaxed) {
                true => Err(failed(crate::codec::CodecError::Malformed(
                    "in clear, where every value is sealed",
                ))),
                false => Ok(Cow::Borrowed(stored)),
            };
        }
        let Some(codec) = &self.codec else {
            return Err(failed(crate::codec::CodecError::NoKeys));
        };
        let unsealed = codec.decode(&context(table, key), &stored[1..]);
        unsealed.map(Cow::Owned).map_err(failed)
    }

    fn open_row(&self, table: Table, (key, value): Row) -> Result<Row, StoreError> {
        let value = self.open(table, &key, value.into_vec())?;
        Ok((key, value.into_boxed_slice()))
    }
}

/// What a value is sealed under: its table's name and its key.
fn context(table: Table, key: &[u8]) -> Vec<u8> {
    let name = table.name().as_bytes();
    let mut context = Vec::with_capacity(name.len() + 1 + key.len());
    context.extend_from_slice(name);
    // No table's name holds a NUL, so the name ends here.
    context.push(0);
    context.extend_from_slice(key);
    context
}

/// Whether `table`'s values are sealed.
fn is_sealed_table(table: Table) -> bool {
    table != Table::Meta
}

impl<E: Engine> CodecEngine<E> {
    fn get_from(
        &self,
        reads: &dyn Reads,
        table: Table,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let stored = reads.get(table, key)?;
        stored.map(|value| self.open(table, key, value)).transpose()
    }

    fn get_many_from(
        &self,
        reads: &dyn Reads,
        table: Table,
        keys: &[Vec<u8>],
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let stored = reads.get_many(table, keys)?;
        debug_assert_eq!(stored.len(), keys.len(), "one value or none per key");
        let open = |(key, value): (&Vec<u8>, Option<Vec<u8>>)| {
            value.map(|value| self.open(table, key, value)).transpose()
        };
        keys.iter().zip(stored).map(open).collect()
    }

    fn scan_from(
        &self,
        reads: &dyn Reads,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let rows = reads.scan(table, prefix, from, limit)?;
        let open = rows.into_iter().map(|row| self.open_row(table, row));
        open.collect()
    }

    fn scan_with_from(
        &self,
        reads: &dyn Reads,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        reads.scan_with(table, prefix, from, limit, &mut |key, stored| {
            visit(key, &self.opened(table, key, stored)?)
        })
    }

    fn last_from(
        &self,
        reads: &dyn Reads,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Row>, StoreError> {
        let row = reads.last(table, prefix, upto)?;
        row.map(|row| self.open_row(table, row)).transpose()
    }

    fn seal_batch(&self, batch: Vec<Write>) -> Result<Vec<Write>, StoreError> {
        if self.codec.is_none() {
            return Ok(batch);
        }
        let sealed = batch.into_iter().map(|write| match write {
            Write::Put(table, key, value) => {
                let sealed = self.seal(table, &key, value)?;
                Ok(Write::Put(table, key, sealed))
            }
            other => Ok(other),
        });
        sealed.collect()
    }
}

/// What the engine under the codec reads (in a transaction, or in a burst), opened through
/// the codec.
struct Opened<'a, E, R> {
    coded: &'a CodecEngine<E>,
    reads: R,
}

impl<'a, E: Engine, R: Borrow<dyn Reads + 'a>> Reads for Opened<'a, E, R> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.coded.get_from(self.reads.borrow(), table, key)
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.coded.get_many_from(self.reads.borrow(), table, keys)
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.coded
            .scan_from(self.reads.borrow(), table, prefix, from, limit)
    }

    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        self.coded
            .scan_with_from(self.reads.borrow(), table, prefix, from, limit, visit)
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        self.coded
            .last_from(self.reads.borrow(), table, prefix, upto)
    }

    fn last_key(
        &self,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Box<[u8]>>, StoreError> {
        self.reads.borrow().last_key(table, prefix, upto)
    }

    fn fence(&self, workflow_id: &str, change: Ownership) -> Result<(), StoreError> {
        self.reads.borrow().fence(workflow_id, change)
    }
}

impl<E: Engine> Reads for CodecEngine<E> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.get_from(&self.inner, table, key)
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.get_many_from(&self.inner, table, keys)
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        self.scan_from(&self.inner, table, prefix, from, limit)
    }

    fn scan_with(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
        visit: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        self.scan_with_from(&self.inner, table, prefix, from, limit, visit)
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        self.last_from(&self.inner, table, prefix, upto)
    }

    fn last_key(
        &self,
        table: Table,
        prefix: &[u8],
        upto: &[u8],
    ) -> Result<Option<Box<[u8]>>, StoreError> {
        self.inner.last_key(table, prefix, upto)
    }

    fn fence(&self, workflow_id: &str, change: Ownership) -> Result<(), StoreError> {
        self.inner.fence(workflow_id, change)
    }
}

impl<E: Engine> Engine for CodecEngine<E> {
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        self.inner.write(self.seal_batch(batch)?, sync)
    }

    fn transact(
        &self,
        locks: &Locks<'_>,
        sync: bool,
        stage: &mut Stage<'_>,
    ) -> Result<(), StoreError> {
        let mut sealed_stage = |reads: &dyn Reads| {
            let opened = Opened { coded: self, reads };
            self.seal_batch(stage(&opened)?)
        };
        self.inner.transact(locks, sync, &mut sealed_stage)
    }

    fn leases(&self) -> Option<Arc<dyn Leases>> {
        self.inner.leases()
    }

    fn failed_write_poisons(&self) -> bool {
        self.inner.failed_write_poisons()
    }

    fn write_sequence(&self) -> Option<u64> {
        self.inner.write_sequence()
    }

    fn writes_on_caller(&self) -> bool {
        self.inner.writes_on_caller()
    }

    fn get_in_memory(
        &self,
        table: Table,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, StoreError>> {
        let stored = self.inner.get_in_memory(table, key)?;
        Some(stored.and_then(|stored| {
            let open = |value| self.open(table, key, value);
            stored.map(open).transpose()
        }))
    }

    fn burst_reads(&self) -> Option<Box<dyn Reads + '_>> {
        let reads = self.inner.burst_reads()?;
        Some(Box::new(Opened { coded: self, reads }))
    }

    fn poisoned(&self) {
        self.inner.poisoned()
    }

    fn checkpoint_at_close(&self) -> Result<(), StoreError> {
        self.inner.checkpoint_at_close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Keyring;
    use crate::store::MemoryEngine;

    const A: &str = "a:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B: &str = "b:ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn ring(spec: &str) -> Option<Arc<dyn Codec>> {
        Some(Arc::new(Keyring::parse(spec).unwrap()))
    }

    fn put(table: Table, key: &str, value: &str) -> Write {
        Write::Put(table, key.into(), value.into())
    }

    #[test]
    fn values_are_sealed_on_disk_and_plain_through_the_engine() {
        let memory = MemoryEngine::new();
        let engine = CodecEngine::new(memory.clone(), ring(A));
        let batch = vec![
            put(Table::Journal, "k", "hello"),
            put(Table::Meta, "m", "v"),
        ];
        engine.write(batch, true).unwrap();
        let raw = memory.get(Table::Journal, b"k").unwrap().unwrap();
        assert_eq!(raw[0], SEALED);
        assert!(!raw.windows(5).any(|w| w == b"hello"));
        assert_eq!(memory.get(Table::Meta, b"m").unwrap().unwrap(), b"v");
        let read = engine.get(Table::Journal, b"k").unwrap().unwrap();
        assert_eq!(read, b"hello");
        let scanned = engine.scan(Table::Journal, b"", b"", 10).unwrap();
        assert_eq!(&*scanned[0].1, b"hello");
    }

    #[test]
    fn the_engine_under_the_codec_decides_where_a_write_runs() {
        let engine = CodecEngine::new(MemoryEngine::new(), None);
        assert!(engine.writes_on_caller());
        assert_eq!(engine.write_sequence(), Some(0));
    }

    #[test]
    fn a_sealed_value_without_its_key_is_an_error_naming_the_row() {
        let memory = MemoryEngine::new();
        let batch = vec![put(Table::Inbox, "wf-1", "x")];
        CodecEngine::new(memory.clone(), ring(A))
            .write(batch, true)
            .unwrap();
        for codec in [None, ring(B)] {
            let error = CodecEngine::new(memory.clone(), codec)
                .get(Table::Inbox, b"wf-1")
                .unwrap_err();
            let text = error.to_string();
            assert!(text.contains("`inbox`") && text.contains("wf-1"), "{text}");
        }
    }

    #[test]
    fn a_value_moved_to_another_row_does_not_open() {
        let memory = MemoryEngine::new();
        let engine = CodecEngine::new(memory.clone(), ring(A));
        engine
            .write(vec![put(Table::Journal, "wf-1", "one")], true)
            .unwrap();
        let stored = memory.get(Table::Journal, b"wf-1").unwrap().unwrap();
        let moved = Write::Put(Table::Journal, b"wf-2".to_vec(), stored);
        memory.write(vec![moved], true).unwrap();
        let error = engine.get(Table::Journal, b"wf-2").unwrap_err().to_string();
        assert!(error.contains("does not verify"), "{error}");
    }

    #[test]
    fn once_rekeyed_a_value_in_clear_is_refused() {
        let memory = MemoryEngine::new();
        let engine = CodecEngine::new(memory.clone(), ring(A));
        engine.check_sealing(true).unwrap();
        let planted = vec![put(Table::Journal, "wf-1", "planted")];
        memory.write(planted.clone(), true).unwrap();
        assert_eq!(
            engine.get(Table::Journal, b"wf-1").unwrap().unwrap(),
            b"planted"
        );
        engine.rekey().unwrap();
        memory.write(planted, true).unwrap();
        let error = engine.get(Table::Journal, b"wf-1").unwrap_err().to_string();
        assert!(error.contains("in clear"), "{error}");
        // The mark is durable: the store opened again refuses it too.
        let reopened = CodecEngine::new(memory, ring(A));
        reopened.check_sealing(true).unwrap();
        assert!(reopened.get(Table::Journal, b"wf-1").is_err());
    }

    #[test]
    fn rekey_seals_plain_and_old_values_under_the_current_key() {
        let memory = MemoryEngine::new();
        let plain = vec![put(Table::Journal, "p", "plain")];
        CodecEngine::new(memory.clone(), None)
            .write(plain, true)
            .unwrap();
        let old = vec![put(Table::Journal, "o", "old")];
        CodecEngine::new(memory.clone(), ring(A))
            .write(old, true)
            .unwrap();
        let rotated = CodecEngine::new(memory.clone(), ring(&format!("{B},{A}")));
        let first = rotated.rekey().unwrap();
        assert_eq!((first.rewritten, first.kept), (2, 0));
        let again = rotated.rekey().unwrap();
        assert_eq!((again.rewritten, again.kept), (0, 2));
        let only_new = CodecEngine::new(memory, ring(B));
        assert_eq!(only_new.get(Table::Journal, b"o").unwrap().unwrap(), b"old");
        assert_eq!(
            only_new.get(Table::Journal, b"p").unwrap().unwrap(),
            b"plain"
        );
    }
}
