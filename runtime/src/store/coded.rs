//! An [`Engine`] whose values pass through a [`Codec`]: encryption at rest for every table but
//! [`Table::Meta`] (the layout row, which must be readable before anything else is).
//!
//! A sealed value is [`SEALED`] followed by the codec's bytes. A value without that mark is
//! read as it is, so that encryption can be turned on for a store written without it; every
//! value written from then on is sealed, and [`CodecEngine::rekey`] seals the rest.

use std::sync::Arc;

use super::engine::{Engine, Row, Write};
use super::{StoreError, Table};
use crate::codec::{Codec, SEALED};

/// Rows rewritten per batch while rekeying.
const REKEY_PAGE: usize = 512;

/// `E` with its values sealed by a codec, when it has one.
pub struct CodecEngine<E> {
    inner: E,
    codec: Option<Arc<dyn Codec>>,
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
        Self { inner, codec }
    }

    /// The engine under the codec.
    pub fn inner(&self) -> &E {
        &self.inner
    }

    /// Whether values are sealed.
    pub fn is_sealing(&self) -> bool {
        self.codec.is_some()
    }

    /// Seals every value that is plain or sealed under a key other than the current one, a
    /// page of rows per synced batch. For a store no worker holds: a row a worker rewrites
    /// between the read and the write here would be lost.
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
        Ok(done)
    }

    fn seal(&self, table: Table, plain: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let Some(codec) = self.codec.as_ref().filter(|_| is_sealed_table(table)) else {
            return Ok(plain);
        };
        if plain.is_empty() {
            return Ok(plain);
        }
        let sealed = codec.encode(table.name().as_bytes(), &plain);
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
        if stored.first() != Some(&SEALED) || !is_sealed_table(table) {
            return Ok(stored);
        }
        let failed = |source| StoreError::Codec {
            table,
            key: Some(key.escape_ascii().to_string()),
            source,
        };
        let Some(codec) = &self.codec else {
            return Err(failed(crate::codec::CodecError::UnknownKey(
                "(no keys were given)".into(),
            )));
        };
        codec
            .decode(table.name().as_bytes(), &stored[1..])
            .map_err(failed)
    }

    fn open_row(&self, table: Table, (key, value): Row) -> Result<Row, StoreError> {
        let value = self.open(table, &key, value.into_vec())?;
        Ok((key, value.into_boxed_slice()))
    }
}

/// Whether `table`'s values are sealed.
fn is_sealed_table(table: Table) -> bool {
    table != Table::Meta
}

impl<E: Engine> Engine for CodecEngine<E> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let stored = self.inner.get(table, key)?;
        stored.map(|value| self.open(table, key, value)).transpose()
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let rows = self.inner.scan(table, prefix, from, limit)?;
        let open = rows.into_iter().map(|row| self.open_row(table, row));
        open.collect()
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let row = self.inner.last(table, prefix, upto)?;
        row.map(|row| self.open_row(table, row)).transpose()
    }

    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        if self.codec.is_none() {
            return self.inner.write(batch, sync);
        }
        let sealed = batch.into_iter().map(|write| match write {
            Write::Put(table, key, value) => Ok(Write::Put(table, key, self.seal(table, value)?)),
            other => Ok(other),
        });
        self.inner
            .write(sealed.collect::<Result<_, StoreError>>()?, sync)
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
