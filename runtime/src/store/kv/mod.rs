//! The store over an ordered key-value [`Engine`]: one table per record type and a group-commit
//! writer thread.
//!
//! Writes are made one group at a time, under one lock. The writer thread takes the first
//! queued job, drains whatever else is waiting, validates each against the store plus the batch
//! built so far, writes them as one batch (synced if any of them needs it), and only then
//! acknowledges each waiter: concurrent workflows thereby share one fsync instead of paying
//! one each. A job submitted while nothing is queued and no group is being written is instead
//! written at once on the submitting thread, as a group of one, when the engine allows it
//! ([`Engine::writes_on_caller`]): a lone workflow's step then costs its write and no thread
//! hand-off, which on a virtual machine costs tens of microseconds for each sleeping thread
//! woken. That caller's thread blocks for its own write only, and at most one thread at a time
//! does; a synced job is written so only on a runtime of several workers and while the last
//! group held one job, so that concurrent writers still share an fsync. Every check and every
//! key is decided here, so each engine (RocksDB on disk, memory in simulations) behaves the
//! same.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::runtime::RuntimeFlavor;
use tokio::sync::oneshot;

use super::engine::{Engine, Ownership, Reads, Row, Write};
use super::watchers::StreamWatchers;
use super::{
    OperationListing, ParkedMark, Parking, PendingWrite, ReplayReads, Store, StoreError,
    SummaryListing, Table, Transition, WorkflowListing, WorkflowRecord, WriteStats,
};
use crate::artifacts::ArtifactRecord;
use crate::inbox::InboxMessage;
use crate::journal::{decode_record, encode_record, DecodeError, Digest, Entry, Record, Seq};
use crate::keys::{
    artifact_key, artifact_ref_key, ended_at_key, ended_by_time_prefix, ended_key, id_key,
    inbox_counter_key, inbox_message_key, inbox_messages_prefix, inbox_named_key,
    inbox_named_prefix, inbox_names_prefix, inbox_seen_key, journal_key, parse_ended_key,
    parse_id_key, parse_inbox_arrival, parse_journal_key, stream_ack_key, stream_key, TimerKey,
};
use crate::operations::OperationRecord;
use crate::streams::{ChunkWriter, StepVersions, StreamEvent, StreamItem, VersionSlot};
use crate::sync::lock;

mod blobs;
mod delete;
mod settle;

/// Most jobs folded into one batch.
pub(crate) const MAX_GROUP: usize = 256;

struct Job {
    work: Work,
    ack: Ack,
}

enum Work {
    /// Synced with its group. Dropped before the answer: the submitter may take it back.
    Transition(Arc<Transition>),
    /// Stream events alone (none: a barrier).
    Stream {
        workflow_id: String,
        items: Vec<StreamItem>,
    },
    /// One chunk of an attempt's generation; the first fixes the attempt's response version.
    Chunk {
        workflow_id: String,
        step: Seq,
        version: VersionSlot,
        text: String,
    },
    /// A signal for the inbox: synced; refused as a conflict if its id was seen.
    Signal {
        workflow_id: String,
        message: InboxMessage,
    },
    /// The workflow's parked mark ([`Store::mark_parked`]): not synced.
    Park {
        workflow_id: String,
        parking: Parking,
    },
    /// A reader's acknowledgement of the stream: synced; never back, never past the newest.
    Acknowledge {
        workflow_id: String,
        channel: String,
        event: u64,
    },
    /// An ended workflow deleted with every row of its own, and the artifacts it committed
    /// that no other workflow committed (`artifacts`: the hashes its journal committed).
    Delete {
        workflow_id: String,
        artifacts: Vec<Digest>,
    },
    /// A decision about an operation of an ended workflow ([`Store::settle_ended_operation`]).
    SettleEnded {
        workflow_id: String,
        key: String,
        decided: Box<OperationRecord>,
        settled: Box<OperationRecord>,
    },
}

/// A [`Store`] over the engine `E`.
pub struct KvStore<E: Engine> {
    engine: Arc<E>,
    lengths: Lengths,
    /// Whether the engine indexes its unsettled operations ([`Table::Unsettled`], layout 10):
    /// a store opened to read only keeps the layout an older build wrote.
    unsettled_indexed: bool,
    writer: Arc<Writer<E>>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    writer_thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct WriteCounters {
    batches: AtomicU64,
    transitions: AtomicU64,
}

impl<E: Engine> KvStore<E> {
    /// A store writing to `engine` through its own writer thread, which folds up to
    /// `max_group` queued jobs into one batch. The engine must hold the current layout (see
    /// `layout::prepare`).
    pub(crate) fn writable(engine: Arc<E>, max_group: usize) -> Result<Self, StoreError> {
        let writer = Arc::new(Writer::new(engine.clone(), max_group));
        let (jobs, receiver) = mpsc::channel();
        let writer_thread = std::thread::Builder::new()
            .name("waymark-store-writer".into())
            .spawn({
                let writer = writer.clone();
                move || writer.run(&receiver)
            })
            .map_err(|e| StoreError::Backend(format!("cannot start writer thread: {e}")))?;
        Ok(Self {
            lengths: Lengths::of(engine.as_ref()),
            unsettled_indexed: true,
            engine,
            writer,
            jobs: Mutex::new(Some(jobs)),
            writer_thread: Mutex::new(Some(writer_thread)),
        })
    }

    /// A store that only reads `engine`: commits fail with [`StoreError::Closed`].
    pub fn read_only(engine: Arc<E>) -> Self {
        Self {
            writer: Arc::new(Writer::new(engine.clone(), 1)),
            lengths: Lengths::of(engine.as_ref()),
            unsettled_indexed: super::layout::indexes_unsettled(engine.as_ref()),
            engine,
            jobs: Mutex::new(None),
            writer_thread: Mutex::new(None),
        }
    }

    /// The engine under the store.
    pub fn engine(&self) -> &Arc<E> {
        &self.engine
    }

    /// How commits were grouped into synced writes since the store opened.
    pub fn write_stats(&self) -> WriteStats {
        WriteStats {
            batches: self.writer.stats.batches.load(Ordering::Relaxed),
            transitions: self.writer.stats.transitions.load(Ordering::Relaxed),
        }
    }

    /// Overwrites one raw journal record, bypassing every check. Only for tests that prove a
    /// corrupt record is reported and contained.
    #[doc(hidden)]
    pub fn overwrite_journal_record(
        &self,
        workflow_id: &str,
        index: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.overwrite_raw(Table::Journal, &journal_key(workflow_id, index), bytes)
    }

    /// Overwrites one raw row of any table, bypassing every check. Only for tests that prove a
    /// corrupt row is reported and contained.
    #[doc(hidden)]
    pub fn overwrite_raw(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let write = Write::Put(table, key.to_vec(), value.to_vec());
        let mut writing = lock(&self.writer.writing);
        writing.forget_all();
        self.engine.write(vec![write], true)
    }

    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.engine.get(table, key)
    }

    fn scan(&self, table: Table, prefix: &[u8]) -> Result<Vec<Row>, StoreError> {
        self.scan_from(table, prefix, prefix)
    }

    /// The rows under `prefix` from key `from` on.
    fn scan_from(&self, table: Table, prefix: &[u8], from: &[u8]) -> Result<Vec<Row>, StoreError> {
        self.engine.scan(table, prefix, from, usize::MAX)
    }
}

impl<E: Engine> Drop for KvStore<E> {
    fn drop(&mut self) {
        // Closing the channel lets the writer finish what is queued and exit; joining it means
        // the engine is no longer written (for RocksDB: its lock is released once the last
        // handle goes) when the store is gone.
        lock(&self.jobs).take();
        let Some(writer_thread) = lock(&self.writer_thread).take() else {
            return; // Read-only: nothing was written.
        };
        let _ = writer_thread.join();
        if self.writer.poison_reason().is_some() {
            return;
        }
        if let Err(error) = self.engine.checkpoint_at_close() {
            // Nothing is lost: the next open recovers from the log, only slower.
            tracing::warn!(%error, "the store's checkpoint at close failed");
        }
    }
}

/// The rows a load for replay reads, through the engine's reads or a burst of them, and where
/// a workflow's journal length is read from.
struct Rows<'r>(&'r dyn Reads, Lengths);

/// Where a workflow's journal length is read from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lengths {
    /// Its journal's: on a store one process owns, a transition that only appends leaves the
    /// record's row as it was (see `stage_record`), so the length that row holds may trail.
    FromJournal,
    /// Its record's, which every transition writes: on a store many workers share, whose
    /// listing of workflows would otherwise ask the database once per workflow.
    InRecord,
}

impl Lengths {
    fn of(engine: &dyn Engine) -> Self {
        match engine.leases() {
            None => Lengths::FromJournal,
            Some(_) => Lengths::InRecord,
        }
    }
}

/// A workflow's record decoded from its row, with its journal length read as `lengths` says.
fn read_record(
    reads: &dyn Reads,
    lengths: Lengths,
    workflow_id: &str,
    row: &[u8],
) -> Result<WorkflowRecord, StoreError> {
    let mut record: WorkflowRecord = decode_at(Table::Workflows, workflow_id, row)?;
    if lengths == Lengths::InRecord {
        return Ok(record);
    }
    // The row's length is the journal's when it was written, and rows are deleted only by a
    // rewind, which writes the record too: fewer rows than it counts were lost. The two reads
    // are not one snapshot, so a rewind written between them is ruled out first by reading the
    // row again, after the journal.
    let journal_len = stored_journal_len(reads, workflow_id)?;
    if record.journal_len > journal_len {
        if let Some(again) = reads.get(Table::Workflows, &id_key(workflow_id))? {
            record = decode_at(Table::Workflows, workflow_id, &again)?;
        }
    }
    if record.journal_len > journal_len {
        let missing = format!(
            "the record counts {} journal entries, the journal has {journal_len}",
            record.journal_len
        );
        return Err(StoreError::Corrupt {
            table: Table::Workflows,
            key: workflow_id.to_owned(),
            source: DecodeError::Malformed(missing),
        });
    }
    record.journal_len = journal_len;
    Ok(record)
}

impl Rows<'_> {
    fn inbox(&self, workflow_id: &str, after: u64) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let prefix = inbox_messages_prefix(workflow_id);
        let from = inbox_message_key(workflow_id, after.saturating_add(1));
        let rows = self.0.scan(Table::Inbox, &prefix, &from, usize::MAX)?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let arrival = parse_inbox_arrival(&prefix, &key)
                .map_err(|e| StoreError::malformed_key(Table::Inbox, &key, &e))?;
            Ok((arrival, decode_inbox_message(workflow_id, arrival, &value)?))
        });
        decoded.collect()
    }

    /// The messages named `name`, through the index by name: each index row names the arrival
    /// of a message, and the messages are read together. An index row without its message is
    /// a corrupt record.
    fn inbox_named(
        &self,
        workflow_id: &str,
        name: &str,
    ) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let prefix = inbox_named_prefix(workflow_id, name);
        let rows = self.0.scan(Table::Inbox, &prefix, &prefix, usize::MAX)?;
        let arrival_of = |(key, _): &Row| {
            parse_inbox_arrival(&prefix, key)
                .map_err(|e| StoreError::malformed_key(Table::Inbox, key, &e))
        };
        let arrivals = rows.iter().map(arrival_of).collect::<Result<Vec<_>, _>>()?;
        if arrivals.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Vec<u8>> = arrivals
            .iter()
            .map(|arrival| inbox_message_key(workflow_id, *arrival))
            .collect();
        let values = self.0.get_many(Table::Inbox, &keys)?;
        debug_assert_eq!(values.len(), keys.len(), "one value or none per key");
        let message = |(arrival, value): (u64, Option<Vec<u8>>)| {
            let value = value.ok_or_else(|| StoreError::Corrupt {
                table: Table::Inbox,
                key: format!("{workflow_id}#{arrival}"),
                source: DecodeError::Malformed(format!(
                    "indexed by name `{name}`, and not in the inbox"
                )),
            })?;
            Ok((arrival, decode_inbox_message(workflow_id, arrival, &value)?))
        };
        arrivals.into_iter().zip(values).map(message).collect()
    }

    fn journal_page(
        &self,
        workflow_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let prefix = id_key(workflow_id);
        let start = journal_key(workflow_id, from);
        let mut decoded = Vec::new();
        // On RocksDB nothing is allocated per entry but the entry: its row is decoded where the
        // engine holds it.
        self.0
            .scan_with(Table::Journal, &prefix, &start, limit, &mut |key, value| {
                let index = from + decoded.len() as u64;
                decoded.push(decode_journal_row(workflow_id, &prefix, index, key, value)?);
                Ok(())
            })?;
        // Split payloads are joined once the scan is over, since a scan's visitor reads nothing
        // else: a corrupt record anywhere on the page is reported before a missing part.
        let mut parts = blobs::Parts::new();
        for (index, entry) in (from..).zip(decoded.iter_mut()) {
            blobs::join_entry(self.0, workflow_id, index, entry, &mut parts)?;
        }
        Ok(decoded)
    }
}

/// The journal entry at `index` of `workflow_id` from its row: the row's key is checked in
/// place (a gap means a lost or foreign record, as bad as an undecodable one) and named in
/// text only in an error.
fn decode_journal_row(
    workflow_id: &str,
    prefix: &[u8],
    index: u64,
    key: &[u8],
    value: &[u8],
) -> Result<Entry, StoreError> {
    let corrupt = |source| StoreError::Corrupt {
        table: Table::Journal,
        key: format!("{workflow_id}#{index}"),
        source,
    };
    if key.strip_prefix(prefix) != Some(index.to_be_bytes().as_slice()) {
        let missing = crate::journal::DecodeError::Malformed("missing entry".into());
        return Err(corrupt(missing));
    }
    decode_record(value).map_err(corrupt)
}

impl ReplayReads for Rows<'_> {
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        let key = id_key(workflow_id);
        self.0
            .get(Table::Workflows, &key)?
            .map(|row| read_record(self.0, self.1, workflow_id, &row))
            .transpose()
    }

    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.journal_page(workflow_id, 0, usize::MAX)
    }

    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        self.0
            .get(Table::Artifacts, &artifact_key(namespace, hash))?
            .map(|bytes| decode_at(Table::Artifacts, &hash.hex(), &bytes))
            .transpose()
    }

    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        stored_inbox_last(self.0, workflow_id)
    }

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        stored_stream_last(self.0, workflow_id)
    }
}

impl<E: Engine> KvStore<E> {
    fn rows(&self) -> Rows<'_> {
        Rows(self.engine.as_ref(), self.lengths)
    }
}

/// Ids, each with what was read for it or why it could not be.
type Listed<T> = Vec<(String, Result<T, StoreError>)>;

impl<E: Engine> KvStore<E> {
    /// Every workflow id with its record row as `read` takes it.
    fn list_records<T>(
        &self,
        read: impl Fn(&str, &[u8]) -> Result<T, StoreError>,
    ) -> Result<Listed<T>, StoreError> {
        let rows = self.scan(Table::Workflows, &[])?;
        let decoded = rows
            .into_iter()
            .map(|(key, value)| match parse_id_key(&key) {
                Ok(id) => {
                    let record = read(&id, &value);
                    (id, record)
                }
                // Listed under its bytes, so one bad key does not hide the other workflows.
                Err(error) => {
                    let shown = error.to_string();
                    let source =
                        DecodeError::Malformed(format!("the key does not decode: {error}"));
                    let table = Table::Workflows;
                    let corrupt = StoreError::Corrupt {
                        table,
                        key: shown.clone(),
                        source,
                    };
                    (shown, Err(corrupt))
                }
            });
        Ok(decoded.collect())
    }
}

impl<E: Engine> Store for KvStore<E> {
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.rows().workflow(workflow_id)
    }

    fn workflows(&self) -> Result<WorkflowListing, StoreError> {
        let engine = self.engine.as_ref();
        self.list_records(|id, row| read_record(engine, self.lengths, id, row))
    }

    fn workflow_summaries(&self) -> Result<SummaryListing, StoreError> {
        self.list_records(|id, row| {
            let record: WorkflowRecord = decode_at(Table::Workflows, id, row)?;
            Ok(record.into())
        })
    }

    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.journal_page(workflow_id, 0, usize::MAX)
    }

    fn journal_page(
        &self,
        workflow_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.rows().journal_page(workflow_id, from, limit)
    }

    fn request(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let Some(bytes) = self.get(Table::Requests, &id_key(request_id))? else {
            return Ok(None);
        };
        decode_at(Table::Requests, request_id, &bytes).map(Some)
    }

    fn timers(&self) -> Result<Vec<TimerKey>, StoreError> {
        let rows = self.scan(Table::Timers, &[])?;
        let keys = rows.iter().map(|(key, _)| {
            TimerKey::decode(key).map_err(|e| StoreError::malformed_key(Table::Timers, key, &e))
        });
        keys.collect()
    }

    fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        self.get(Table::Operations, key.as_bytes())?
            .map(|bytes| decode_at(Table::Operations, key, &bytes))
            .transpose()
    }

    fn operation_in_memory(
        &self,
        key: &str,
    ) -> Option<Result<Option<OperationRecord>, StoreError>> {
        let stored = self
            .engine
            .get_in_memory(Table::Operations, key.as_bytes())?;
        Some(stored.and_then(|stored| {
            let decode = |bytes: Vec<u8>| decode_at(Table::Operations, key, &bytes);
            stored.map(decode).transpose()
        }))
    }

    fn read_burst(&self, read: &mut dyn FnMut(&dyn ReplayReads)) -> bool {
        let Some(burst) = self.engine.burst_reads() else {
            return false;
        };
        read(&Rows(burst.as_ref(), self.lengths));
        true
    }

    fn operations(&self, prefix: &str) -> Result<OperationListing, StoreError> {
        let rows = self.scan(Table::Operations, prefix.as_bytes())?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let key = String::from_utf8_lossy(&key).into_owned();
            let record = decode_at(Table::Operations, &key, &value);
            (key, record)
        });
        Ok(decoded.collect())
    }

    fn unsettled_operations(&self, prefix: &str) -> Result<OperationListing, StoreError> {
        if !self.unsettled_indexed {
            let mut listed = self.operations(prefix)?;
            listed.retain(is_unsettled_or_unread);
            return Ok(listed);
        }
        let keys = self.writer.unsettled_keys(prefix.as_bytes())?;
        let values = self.engine.get_many(Table::Operations, &keys)?;
        debug_assert_eq!(values.len(), keys.len(), "one value or none per key");
        // The two reads are not one snapshot: an operation settled, and its workflow deleted,
        // in between has no record left, and is not listed.
        let listed = keys.into_iter().zip(values).filter_map(|(key, value)| {
            let key = String::from_utf8_lossy(&key).into_owned();
            let Some(value) = value else {
                tracing::debug!(%key, "an operation indexed as unsettled has no record");
                return None;
            };
            Some((key.clone(), decode_at(Table::Operations, &key, &value)))
        });
        Ok(listed.filter(is_unsettled_or_unread).collect())
    }

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.rows().stream_last(workflow_id)
    }

    fn stream(&self, workflow_id: &str, after: u64) -> Result<Vec<StreamEvent>, StoreError> {
        self.stream_page(workflow_id, after, usize::MAX)
    }

    fn stream_page(
        &self,
        workflow_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StreamEvent>, StoreError> {
        let prefix = id_key(workflow_id);
        let start = stream_key(workflow_id, after.saturating_add(1));
        let rows = self.engine.scan(Table::Streams, &prefix, &start, limit)?;
        let mut events = Vec::with_capacity(rows.len());
        for (key, value) in rows {
            let (_, seq) = parse_journal_key(&key)
                .map_err(|e| StoreError::malformed_key(Table::Streams, &key, &e))?;
            let item = decode_at(Table::Streams, &format!("{workflow_id}#{seq}"), &value)?;
            events.push(StreamEvent { seq, item });
        }
        Ok(events)
    }

    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        self.rows().artifact(namespace, hash)
    }

    fn inbox(&self, workflow_id: &str, after: u64) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        self.rows().inbox(workflow_id, after)
    }

    fn inbox_named(
        &self,
        workflow_id: &str,
        name: &str,
    ) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        self.rows().inbox_named(workflow_id, name)
    }

    /// One index row read per name, at most: the messages themselves are not read.
    fn inbox_holds_named(&self, workflow_id: &str, names: &[String]) -> Result<bool, StoreError> {
        for name in names {
            let prefix = inbox_named_prefix(workflow_id, name);
            if !self
                .engine
                .scan(Table::Inbox, &prefix, &prefix, 1)?
                .is_empty()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        stored_inbox_last(self.engine.as_ref(), workflow_id)
    }

    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError> {
        let key = inbox_seen_key(workflow_id, signal_id);
        Ok(self.get(Table::Inbox, &key)?.is_some())
    }

    fn send_signal(&self, workflow_id: &str, message: InboxMessage) -> PendingWrite {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Signal {
            workflow_id,
            message,
        })
    }

    fn mark_parked(&self, workflow_id: &str, parking: Parking) -> PendingWrite {
        self.submit(Work::Park {
            workflow_id: workflow_id.to_owned(),
            parking,
        })
    }

    fn parked(&self) -> Result<HashMap<String, u64>, StoreError> {
        let rows = self.scan(Table::Parked, &[])?;
        let mut parked = HashMap::with_capacity(rows.len());
        for (key, value) in rows {
            let mark = parse_id_key(&key)
                .map_err(|e| StoreError::malformed_key(Table::Parked, &key, &e))
                .and_then(|id| Ok((decode_at::<ParkedMark>(Table::Parked, &id, &value)?, id)));
            match mark {
                Ok((mark, id)) => {
                    parked.insert(id, mark.code_digest);
                }
                Err(error) => {
                    tracing::warn!(%error, "a parked mark that does not read is left out")
                }
            }
        }
        Ok(parked)
    }

    fn parked_mark(&self, workflow_id: &str) -> Result<Option<ParkedMark>, StoreError> {
        // A shared store keeps no marks: no round trip to learn so.
        if self.engine.leases().is_some() {
            return Ok(None);
        }
        let value = self.get(Table::Parked, &id_key(workflow_id))?;
        let decode = |value: Vec<u8>| decode_at(Table::Parked, workflow_id, &value);
        value.map(decode).transpose()
    }

    fn parked_mark_in_memory(
        &self,
        workflow_id: &str,
    ) -> Option<Result<Option<ParkedMark>, StoreError>> {
        if self.engine.leases().is_some() {
            return Some(Ok(None));
        }
        let stored = self
            .engine
            .get_in_memory(Table::Parked, &id_key(workflow_id))?;
        Some(stored.and_then(|stored| {
            let decode = |value: Vec<u8>| decode_at(Table::Parked, workflow_id, &value);
            stored.map(decode).transpose()
        }))
    }

    fn stream_acks(&self, workflow_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let prefix = id_key(workflow_id);
        let rows = self.scan_from(Table::StreamAcks, &prefix, &prefix)?;
        let decoded = rows.into_iter().map(|(key, value)| {
            let channel = String::from_utf8_lossy(&key[prefix.len()..]).into_owned();
            let at = format!("{workflow_id}#{channel}");
            Ok((channel, decode_at(Table::StreamAcks, &at, &value)?))
        });
        decoded.collect()
    }

    fn acknowledge_stream(&self, workflow_id: &str, channel: &str, event: u64) -> PendingWrite {
        self.submit(Work::Acknowledge {
            workflow_id: workflow_id.to_owned(),
            channel: channel.to_owned(),
            event,
        })
    }

    fn leases(&self) -> Option<Arc<dyn super::Leases>> {
        self.engine.leases()
    }

    fn write_stats(&self) -> Option<WriteStats> {
        Some(KvStore::write_stats(self))
    }

    fn watch_stream(&self, workflow_id: &str) -> Option<tokio::sync::watch::Receiver<()>> {
        // Other processes write a shared store too: only polling sees their events.
        if self.engine.leases().is_some() {
            return None;
        }
        Some(self.writer.watchers.subscribe(workflow_id))
    }

    fn commit(&self, transition: Transition) -> PendingWrite {
        self.submit(Work::Transition(Arc::new(transition)))
    }

    fn commit_shared(&self, transition: Arc<Transition>) -> PendingWrite {
        self.submit(Work::Transition(transition))
    }

    fn append_stream(&self, workflow_id: &str, items: Vec<StreamItem>) -> PendingWrite {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Stream { workflow_id, items })
    }

    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<&(u64, String)>,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        let prefix = ended_by_time_prefix();
        let from = match after {
            // The smallest key past the last one read.
            Some((at, workflow_id)) => [ended_key(*at, workflow_id), vec![0]].concat(),
            None => prefix.clone(),
        };
        let rows = self.engine.scan(Table::Ended, &prefix, &from, limit)?;
        let mut ended = Vec::with_capacity(rows.len());
        for (key, _) in rows {
            let (at, workflow_id) = parse_ended_key(&key)
                .map_err(|e| StoreError::malformed_key(Table::Ended, &key, &e))?;
            if at > before_ms {
                break;
            }
            ended.push((at, workflow_id));
        }
        Ok(ended)
    }

    fn delete_workflow(&self, workflow_id: &str, artifacts: Vec<Digest>) -> PendingWrite {
        let workflow_id = workflow_id.to_owned();
        self.submit(Work::Delete {
            workflow_id,
            artifacts,
        })
    }

    fn settle_ended_operation(
        &self,
        key: &str,
        decided: OperationRecord,
        settled: OperationRecord,
    ) -> PendingWrite {
        self.submit(Work::SettleEnded {
            workflow_id: decided.workflow_id.clone(),
            key: key.to_owned(),
            decided: Box::new(decided),
            settled: Box::new(settled),
        })
    }
}

impl<E: Engine> ChunkWriter for KvStore<E> {
    fn append_chunk(&self, workflow_id: &str, step: Seq, version: VersionSlot, text: String) {
        let workflow_id = workflow_id.to_owned();
        let work = Work::Chunk {
            workflow_id,
            step,
            version,
            text,
        };
        // Queued, never written here: the generation goes on while its chunks are grouped.
        // Its outcome reaches the step through its next write.
        drop(self.queue(work));
    }
}

impl<E: Engine> KvStore<E> {
    /// Writes `work` at once on this thread if the writer is idle and `work` may be (see
    /// [`Writer::may_write_on_caller`]), or queues it for the writer thread; the future ends
    /// when it is written (or refused).
    fn submit(&self, work: Work) -> PendingWrite {
        if !self.writer.may_write_on_caller(&work) {
            return self.queue(work);
        }
        if let Some(reason) = self.writer.poison_reason() {
            return PendingWrite::known(Err(StoreError::Poisoned(reason)));
        }
        if lock(&self.jobs).is_none() {
            return PendingWrite::known(Err(StoreError::Closed));
        }
        match self.writer.write_if_idle(work) {
            InPlace::Written(written) => PendingWrite::known(written),
            InPlace::Busy(work) => self.queue(work),
        }
    }

    /// Queues `work` for the writer thread; the future ends when it is written (or refused).
    fn queue(&self, work: Work) -> PendingWrite {
        if let Some(reason) = self.writer.poison_reason() {
            return PendingWrite::known(Err(StoreError::Poisoned(reason)));
        }
        let (ack, done) = oneshot::channel();
        self.send(Job { work, ack }, done)
    }

    fn send(&self, job: Job, done: oneshot::Receiver<Result<(), StoreError>>) -> PendingWrite {
        let sent = match lock(&self.jobs).as_ref() {
            Some(jobs) => self.writer.send(jobs, job),
            None => false,
        };
        if !sent {
            return PendingWrite::known(Err(StoreError::Closed));
        }
        PendingWrite::from_writer(done)
    }
}

pub(super) fn decode_at<T: Record>(table: Table, key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    decode_record(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_owned(),
        source,
    })
}

/// What writes: shared by the writer thread and the threads that write their own job.
struct Writer<E> {
    engine: Arc<E>,
    max_group: usize,
    poison: Mutex<Option<String>>,
    /// Whether `poison` holds a reason: asked on every write, without its lock.
    poisoned: AtomicBool,
    stats: WriteCounters,
    watchers: StreamWatchers,
    /// Held while a group is staged and written: groups are written one at a time, in order.
    /// What it guards is what only writing uses.
    writing: Mutex<Written>,
    /// Jobs sent to the writer thread and not yet written. A job may be written on its caller's
    /// thread only when there are none: it would otherwise overtake jobs submitted before it
    /// (a stream's chunks, sent without waiting, before the step's end).
    queued: AtomicUsize,
    /// Whether the last group written held one job: no other writer was waiting. Once groups
    /// form, synced jobs go to the writer thread again, where they share one fsync.
    lone: AtomicBool,
}

impl<E: Engine> Writer<E> {
    fn new(engine: Arc<E>, max_group: usize) -> Self {
        Self {
            writing: Mutex::new(Written::new(engine.leases().is_none())),
            engine,
            max_group: max_group.max(1),
            poison: Mutex::new(None),
            poisoned: AtomicBool::new(false),
            stats: WriteCounters::default(),
            watchers: StreamWatchers::default(),
            queued: AtomicUsize::new(0),
            lone: AtomicBool::new(true),
        }
    }

    fn run(&self, jobs: &mpsc::Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut writing = lock(&self.writing);
            let (mut group, mut acks) = (vec![first.work], vec![first.ack]);
            while group.len() < self.max_group {
                match jobs.try_recv() {
                    Ok(job) => {
                        group.push(job.work);
                        acks.push(job.ack);
                    }
                    Err(_) => break,
                }
            }
            let verdicts = self.write_group(&group, &mut writing);
            // Before anyone hears: a submitter may take its transition back.
            drop(group);
            // Before anyone hears: a waiter that writes next must find nothing queued.
            self.queued.fetch_sub(acks.len(), Ordering::AcqRel);
            drop(writing);
            for (ack, verdict) in acks.into_iter().zip(verdicts.in_order()) {
                let _ = ack.send(verdict);
            }
        }
    }

    /// The keys of the unsettled operations under `prefix`, in order: on a store this process
    /// owns, from the keys the writer keeps (read from the index at the first listing, then
    /// kept by each write, read again after a write made around the store); else from the
    /// index.
    fn unsettled_keys(&self, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        // An engine that numbers no writes (a database many workers write) is read each
        // time, without waiting for a group being written.
        if self.engine.write_sequence().is_none() {
            return index_keys(&*self.engine, prefix);
        }
        let mut known = lock(&self.writing);
        let now = self.engine.write_sequence();
        if !known.owned || now.is_none() {
            drop(known);
            return index_keys(&*self.engine, prefix);
        }
        if known.sequence != now {
            known.forget_all();
        }
        if known.unsettled.is_none() {
            // No write of this store lands while `writing` is held; one made around it moves
            // the sequence on, and what was read is not kept.
            let keys = index_keys(&*self.engine, &[])?;
            if self.engine.write_sequence() != now {
                drop(known);
                return index_keys(&*self.engine, prefix);
            }
            known.sequence = now;
            if keys.len() > MAX_KEPT_UNSETTLED {
                drop(known);
                return Ok(keys.into_iter().filter(|k| k.starts_with(prefix)).collect());
            }
            known.unsettled = Some(keys.into_iter().collect());
        }
        let kept = known
            .unsettled
            .iter()
            .flat_map(|keys| keys.range(prefix.to_vec()..));
        Ok(kept
            .take_while(|key| key.starts_with(prefix))
            .cloned()
            .collect())
    }

    /// Whether `work` may be written on the thread that submits it, if the writer is idle then:
    /// the engine allows it, and, for a synced job, no group formed last time and the thread
    /// is not a runtime's only worker, whose other tasks would all wait for the fsync and never
    /// queue a job to share it.
    fn may_write_on_caller(&self, work: &Work) -> bool {
        if !self.engine.writes_on_caller() {
            return false;
        }
        if !work.needs_sync() {
            return true;
        }
        // Asked first: the runtime's handle is a count to take and drop, on every write.
        if !self.lone.load(Ordering::Relaxed) {
            return false;
        }
        let single_threaded = tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
            runtime.runtime_flavor() == RuntimeFlavor::CurrentThread
                || runtime.metrics().num_workers() < 2
        });
        !single_threaded
    }

    /// Writes `work` now, on this thread, if nothing is queued and no group is being written,
    /// and says how that went; otherwise gives it back, to be queued. Written in place, a job
    /// needs no channel for its answer, nor a group of its own.
    fn write_if_idle(&self, work: Work) -> InPlace {
        if self.queued.load(Ordering::Acquire) != 0 {
            return InPlace::Busy(work);
        }
        let Ok(mut writing) = self.writing.try_lock() else {
            return InPlace::Busy(work);
        };
        // Checked again under the lock: a job queued since would otherwise be overtaken.
        if self.queued.load(Ordering::Acquire) != 0 {
            return InPlace::Busy(work);
        }
        let verdicts = self.write_group(std::slice::from_ref(&work), &mut writing);
        // Before the answer: the submitter may take its transition back.
        drop(work);
        drop(writing);
        InPlace::Written(verdicts.of(0))
    }

    /// Sends `job` to the writer thread; `false` if it has stopped.
    fn send(&self, jobs: &mpsc::Sender<Job>, job: Job) -> bool {
        self.queued.fetch_add(1, Ordering::AcqRel);
        let sent = jobs.send(job).is_ok();
        if !sent {
            self.queued.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// Writes `group` as one batch; what each job hears is told by the caller, once the group
    /// is no longer counted as queued.
    fn write_group(&self, group: &[Work], known: &mut Written) -> Verdicts {
        self.lone.store(group.len() == 1, Ordering::Relaxed);
        if let Some(reason) = self.poison_reason() {
            return Verdicts::all(Err(StoreError::Poisoned(reason)));
        }
        let sync = group.iter().any(Work::needs_sync);
        let mut staged = None;
        known.check_still_current(self.engine.write_sequence());
        let mut spare = known.spare.take();
        let locks = |visit: &mut dyn FnMut(&str)| visit_group_locks(group, visit);
        let keeps_unsettled = known.unsettled.is_some();
        let written = self.engine.transact(&locks, sync, &mut |reads| {
            let space = spare.take().unwrap_or_default();
            let mut fresh = Staged::from_group(reads, group, known, space);
            let batch = std::mem::take(&mut fresh.batch);
            if keeps_unsettled {
                fresh.unsettled = IndexChanges::of(&batch);
            }
            staged = Some(fresh);
            Ok(batch)
        });
        let mut staged = staged.unwrap_or_default();
        match &written {
            Ok(()) => known.learn(&mut staged, self.engine.write_sequence()),
            // What the batch changed is unknown (a transaction may have been retried): read
            // every length again.
            Err(_) => known.forget_all(),
        }
        let outcome = match written {
            Ok(()) => {
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                let count = staged.accepted.len() as u64;
                self.stats.transitions.fetch_add(count, Ordering::Relaxed);
                let changed = staged.stream_changed.iter().map(String::as_str);
                self.watchers.notify(changed);
                Ok(())
            }
            // A stream's version is fixed while staging and its chunks are sent without an
            // answer: a failed group with stream work cannot be retried from the step's side.
            Err(e) if self.engine.failed_write_poisons() || !staged.stream_changed.is_empty() => {
                Err(self.poison(e.to_string()))
            }
            Err(e) => {
                tracing::warn!(error = %e, "store write failed; its runs stop and resume by replay");
                Err(e)
            }
        };
        // Rejections are answered only after the batch is written: a transition that lost to
        // one in the same batch must be able to read the winner's state when it hears why. If
        // the batch failed, there is no winner: they hear the failure instead.
        let rejected = std::mem::take(&mut staged.rejected);
        known.spare = Some(staged.into_space());
        Verdicts { outcome, rejected }
    }

    fn poison(&self, reason: String) -> StoreError {
        tracing::error!(%reason, "store write failed; poisoning the store");
        *lock(&self.poison) = Some(reason.clone());
        self.poisoned.store(true, Ordering::Release);
        self.engine.poisoned();
        StoreError::Poisoned(reason)
    }

    /// Why the store refuses every write, once a failed write poisoned it.
    fn poison_reason(&self) -> Option<String> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.poison).clone()
    }
}

impl Work {
    /// The workflow the job changes.
    fn workflow_id(&self) -> &str {
        match self {
            Work::Transition(t) => &t.workflow_id,
            Work::Stream { workflow_id, .. }
            | Work::Chunk { workflow_id, .. }
            | Work::Signal { workflow_id, .. }
            | Work::Park { workflow_id, .. }
            | Work::Acknowledge { workflow_id, .. }
            | Work::Delete { workflow_id, .. }
            | Work::SettleEnded { workflow_id, .. } => workflow_id,
        }
    }

    /// Whether the job is acknowledged only once synced. Stream events are: readers are shown
    /// what is written, and a power loss that took an event a reader saw would give its number
    /// to another event, spliced after what the reader holds when it resumes. An empty stream
    /// job is only a barrier and needs no sync.
    fn needs_sync(&self) -> bool {
        match self {
            Work::Transition(transition) => transition.durable,
            Work::Signal { .. }
            | Work::Chunk { .. }
            | Work::Acknowledge { .. }
            | Work::Delete { .. }
            | Work::SettleEnded { .. } => true,
            Work::Stream { items, .. } => !items.is_empty(),
            Work::Park { .. } => false,
        }
    }

    /// The workflow whose stream readers this job concerns: new events, or an end (readers
    /// finish).
    fn stream_change(&self) -> Option<String> {
        match self {
            Work::Transition(t) if !t.stream.is_empty() || t.record.status.is_terminal() => {
                Some(t.workflow_id.to_string())
            }
            Work::Stream { workflow_id, items } if !items.is_empty() => Some(workflow_id.clone()),
            Work::Chunk { workflow_id, .. } => Some(workflow_id.clone()),
            Work::Stream { .. } => None,
            Work::Transition(_)
            | Work::Signal { .. }
            | Work::Park { .. }
            | Work::Acknowledge { .. }
            | Work::Delete { .. }
            | Work::SettleEnded { .. } => None,
        }
    }
}

type Ack = oneshot::Sender<Result<(), StoreError>>;

/// How a job offered to be written in place fared.
enum InPlace {
    /// Written, or refused: what it hears.
    Written(Result<(), StoreError>),
    /// The writer was busy: the job, to be queued.
    Busy(Work),
}

/// What the jobs of a group written hear: the batch's outcome, but for those refused.
struct Verdicts {
    outcome: Result<(), StoreError>,
    /// Refused jobs, by their place in the group, in order.
    rejected: Vec<(usize, StoreError)>,
}

impl Verdicts {
    /// Every job hears `outcome`.
    fn all(outcome: Result<(), StoreError>) -> Self {
        Self {
            outcome,
            rejected: Vec::new(),
        }
    }

    /// What the job at `index` hears: its refusal if the batch was written (a failed batch
    /// has no winner, so a refused job hears the failure too), else the batch's outcome.
    fn of(&self, index: usize) -> Result<(), StoreError> {
        let refused = self.rejected.iter().find(|(at, _)| *at == index);
        self.heard(refused.map(|(_, rejection)| rejection))
    }

    /// What each job of the group hears, in the group's order, without end: the caller zips
    /// it with the group.
    fn in_order(&self) -> impl Iterator<Item = Result<(), StoreError>> + '_ {
        let mut refused = self.rejected.iter().peekable();
        (0..).map(move |index| {
            let rejection = refused.next_if(|(at, _)| *at == index);
            self.heard(rejection.map(|(_, rejection)| rejection))
        })
    }

    fn heard(&self, rejection: Option<&StoreError>) -> Result<(), StoreError> {
        match rejection {
            Some(rejection) => self.outcome.clone().and(Err(rejection.clone())),
            None => self.outcome.clone(),
        }
    }
}

/// What a group's batch is checked against, for an engine shared by many processes to hold
/// still while it is staged and written: the workflows it changes, the request ids it claims,
/// the idempotency keys it writes, the artifacts it commits or deletes.
fn visit_group_locks(group: &[Work], visit: &mut dyn FnMut(&str)) {
    for work in group {
        match work {
            Work::Transition(t) => {
                visit(&t.workflow_id);
                if let Some(request_id) = &t.claim_request {
                    visit(request_id);
                }
                for (key, _) in &t.operations {
                    visit(key);
                }
                for (hash, _) in &t.artifacts {
                    visit(&artifact_lock(&t.workflow_id, hash));
                }
            }
            Work::Delete {
                workflow_id,
                artifacts,
            } => {
                visit(workflow_id);
                for hash in artifacts {
                    visit(&artifact_lock(workflow_id, hash));
                }
            }
            Work::SettleEnded {
                workflow_id, key, ..
            } => {
                visit(workflow_id);
                visit(key);
            }
            Work::Stream { workflow_id, .. }
            | Work::Chunk { workflow_id, .. }
            | Work::Signal { workflow_id, .. }
            | Work::Park { workflow_id, .. }
            | Work::Acknowledge { workflow_id, .. } => visit(workflow_id),
        }
    }
}

/// The lock of an artifact of `workflow_id`'s namespace: a control character first, which no
/// workflow id, request id or idempotency key holds, so it is no other lock.
fn artifact_lock(workflow_id: &str, hash: &Digest) -> String {
    let (namespace, _) = crate::namespace::split(workflow_id);
    format!("\u{1e}artifact {namespace} {}", hash.hex())
}

/// Most workflows remembered of each kind; past it they are forgotten and read again. Enough
/// for the workflows that step at once; parked ones come back rarely, and are not worth the
/// memory.
const MAX_WRITTEN: usize = 4_096;

/// What this writer last wrote of each workflow, used instead of reading it: the journal length
/// and the last stream event number (a read per transition; a cursor set up and sought per
/// progress event), and the record (so that a transition that only lengthens the journal leaves
/// the record's row as it is). Only for a store one process owns, on an engine that numbers its
/// writes ([`Engine::write_sequence`]): it is trusted only while the engine's number is the one
/// this writer's last write left, so a write made around the store (another store on the same
/// engine, a test writing rows directly) makes it be read again. A workflow that ended or was
/// deleted is forgotten; everything is forgotten after a failed write and after a raw overwrite.
struct Written {
    /// The store is this process's own: what it wrote stays known, and it keeps parked marks
    /// (a shared store hands parked runs over through leases instead).
    owned: bool,
    /// Keyed by the transitions' own shared ids: remembering a workflow copies no id.
    journal_lens: Map<Arc<str>, u64>,
    stream_lasts: Map<String, u64>,
    /// The record as its row holds it, but for the journal length, which may trail.
    records: Map<Arc<str>, WorkflowRecord>,
    /// The engine's write sequence after this writer's last write.
    sequence: Option<u64>,
    /// The last group's staging space, emptied, for the next.
    spare: Option<Box<Spare>>,
    /// The keys of the index of unsettled operations, once a listing read them: kept by each
    /// write, so that a listing reads none of the deletions a read of RocksDB's index steps
    /// over (each settled operation leaves one until a compaction into the last level).
    unsettled: Option<BTreeSet<Vec<u8>>>,
}

impl Written {
    fn new(owned: bool) -> Self {
        Self {
            owned,
            journal_lens: Map::default(),
            stream_lasts: Map::default(),
            records: Map::default(),
            sequence: None,
            spare: None,
            unsettled: None,
        }
    }

    fn journal_len(&self, workflow_id: &str) -> Option<&u64> {
        self.journal_lens.get(workflow_id)
    }

    fn stream_last(&self, workflow_id: &str) -> Option<&u64> {
        self.stream_lasts.get(workflow_id)
    }

    fn record(&self, workflow_id: &str) -> Option<&WorkflowRecord> {
        self.records.get(workflow_id)
    }

    /// Forgets everything unless the engine was written by this writer alone since.
    fn check_still_current(&mut self, sequence: Option<u64>) {
        if sequence.is_none() || sequence != self.sequence {
            self.forget_all();
        }
    }

    /// Takes in what a written batch changed; `sequence` is the engine's after it.
    fn learn(&mut self, staged: &mut Staged, sequence: Option<u64>) {
        if !self.owned || sequence.is_none() {
            return;
        }
        self.sequence = sequence;
        let changes = &mut staged.space.changes;
        remember(&mut self.journal_lens, &mut changes.journal_len);
        remember(&mut self.stream_lasts, &mut changes.stream_last);
        remember(&mut self.records, &mut changes.records);
        for gone in changes.ended.iter().chain(&changes.deleted) {
            self.journal_lens.remove(gone.as_str());
            self.stream_lasts.remove(gone);
            self.records.remove(gone.as_str());
        }
        staged.unsettled.apply_to(&mut self.unsettled);
    }

    fn forget_all(&mut self) {
        self.journal_lens.clear();
        self.stream_lasts.clear();
        self.records.clear();
        self.sequence = None;
        self.unsettled = None;
    }
}

/// Moves `written` into `known`, which starts over rather than outgrow its bound.
fn remember<K: Eq + std::hash::Hash, V>(known: &mut Map<K, V>, written: &mut Map<K, V>) {
    if known.len() + written.len() > MAX_WRITTEN {
        known.clear();
    }
    known.extend(written.drain());
}

/// A group validated into one batch; jobs by their place in the group.
#[derive(Default)]
struct Staged {
    batch: Vec<Write>,
    accepted: Vec<usize>,
    rejected: Vec<(usize, StoreError)>,
    /// Workflows whose stream readers should look again once the batch is written.
    stream_changed: Vec<String>,
    /// What the batch does to the index of unsettled operations.
    unsettled: IndexChanges,
    /// What the accepted jobs changed, together, and where each job was staged.
    space: Box<Spare>,
}

/// What a batch does to the index of unsettled operations ([`Table::Unsettled`]), in the
/// batch's order, for the keys a writer keeps of it ([`Written::unsettled`]).
#[derive(Default)]
struct IndexChanges(Vec<Write>);

impl IndexChanges {
    fn of(batch: &[Write]) -> Self {
        let of_index = batch
            .iter()
            .filter(|write| write.table() == Table::Unsettled);
        IndexChanges(of_index.cloned().collect())
    }

    /// Applies the changes to `kept`, which is let go (read again at the next listing) once
    /// it would hold more than [`MAX_KEPT_UNSETTLED`] keys.
    fn apply_to(&mut self, kept: &mut Option<BTreeSet<Vec<u8>>>) {
        let Some(keys) = kept else { return };
        for change in self.0.drain(..) {
            match change {
                Write::Put(_, key, _) => {
                    keys.insert(key);
                }
                Write::Delete(_, key) => {
                    keys.remove(&key);
                }
                Write::DeleteRange(_, from, to) => keys.retain(|key| *key < from || *key >= to),
            }
        }
        if keys.len() > MAX_KEPT_UNSETTLED {
            *kept = None;
        }
    }
}

/// Most keys of unsettled operations a writer keeps: beyond, each listing reads the index.
const MAX_KEPT_UNSETTLED: usize = 65_536;

/// A group's staging space, kept by the writer from one group to the next (boxed: it is
/// moved with the group, and its tables take a few hundred bytes): the group's tables and a
/// job's, emptied but keeping their room. Made new for each group, they cost a sequential
/// step about 800 instructions of seeding and the first insert's allocation.
#[derive(Default)]
struct Spare {
    /// What the accepted jobs changed, together.
    changes: Overlay,
    scratch: Scratch,
}

impl Staged {
    /// Stages `group` in `space`, which must be empty.
    fn from_group(engine: &dyn Reads, group: &[Work], known: &Written, space: Box<Spare>) -> Self {
        let mut staged = Staged {
            batch: Vec::new(),
            accepted: Vec::with_capacity(group.len()),
            rejected: Vec::new(),
            stream_changed: Vec::new(),
            unsettled: IndexChanges::default(),
            space,
        };
        for (index, work) in group.iter().enumerate() {
            let Spare { changes, scratch } = &mut *staged.space;
            let seen = &*changes;
            // Each job is staged on its own: a job refused halfway (a key that does not parse,
            // a number that would overflow) must leave nothing of itself in the batch.
            let mut view = View::new(engine, seen, known, scratch);
            let staged_work = match work {
                _ if seen.deleted.contains(work.workflow_id()) => Err(StoreError::Conflict {
                    workflow_id: work.workflow_id().to_owned(),
                    reason: "it was deleted in the same write".into(),
                }),
                Work::Transition(t) => stage(&mut view, t),
                Work::Stream { workflow_id, items } => stage_stream(&mut view, workflow_id, items),
                Work::Chunk {
                    workflow_id,
                    step,
                    version,
                    text,
                } => stage_chunk(&mut view, workflow_id, *step, version, text),
                Work::Signal {
                    workflow_id,
                    message,
                } => stage_signal(&mut view, workflow_id, message),
                Work::Park {
                    workflow_id,
                    parking,
                } => stage_parked(&mut view, workflow_id, parking),
                Work::Acknowledge {
                    workflow_id,
                    channel,
                    event,
                } => stage_acknowledgement(&mut view, workflow_id, channel, *event),
                Work::Delete {
                    workflow_id,
                    artifacts,
                } => delete::stage_delete(&mut view, workflow_id, artifacts),
                Work::SettleEnded {
                    workflow_id,
                    key,
                    decided,
                    settled,
                } => settle::stage_settle_ended(&mut view, workflow_id, key, decided, settled),
            };
            let claims = view.claims;
            match staged_work {
                Ok(()) => {
                    // The first job accepted is the group's so far: its writes and tables are
                    // moved, not copied (the scratch takes the group's, still empty).
                    if staged.accepted.is_empty() {
                        std::mem::swap(&mut staged.batch, &mut scratch.writes.0);
                        std::mem::swap(changes, &mut scratch.changes);
                        staged.make_room(group.len() - index - 1);
                    } else {
                        staged.batch.append(&mut scratch.writes.0);
                        changes.merge(&mut scratch.changes);
                    }
                    for (slot, version) in claims {
                        slot.claim(version);
                    }
                    staged.stream_changed.extend(work.stream_change());
                    staged.accepted.push(index);
                }
                Err(e) => {
                    scratch.clear();
                    staged.rejected.push((index, e));
                }
            }
        }
        staged
    }

    /// The staging space this group used, emptied for the next group.
    fn into_space(self) -> Box<Spare> {
        let mut space = self.space;
        space.changes.clear();
        space.scratch.clear();
        space
    }
}

/// Most writes room is made for ahead of a group's later jobs.
const MAX_ROOM: usize = 4_096;

impl Staged {
    /// Makes room for `rest` more jobs the size of the first, so that the batch and the
    /// journal lengths grow once rather than at every doubling, each copying what it held:
    /// the writer thread, which does it, is what limits concurrent workflows.
    fn make_room(&mut self, rest: usize) {
        let writes = self.batch.len().saturating_mul(rest).min(MAX_ROOM);
        self.batch.reserve(writes);
        self.space.changes.journal_len.reserve(rest);
    }
}

/// One job's staging space, used again by every job of a group and kept for the next group
/// ([`Spare`]): emptied after each, it keeps its tables' and its writes' room. A job's own
/// tables and writes, made new for each, cost the writer thread thirteen seeded tables and two
/// or three allocations a transition.
#[derive(Default)]
struct Scratch {
    changes: Overlay,
    writes: Writes,
}

impl Scratch {
    /// Drops what a refused job staged.
    fn clear(&mut self) {
        self.changes.clear();
        self.writes.0.clear();
    }
}

/// A job's writes, joining the group's batch only once the whole job validated.
#[derive(Default)]
struct Writes(Vec<Write>);

impl Writes {
    fn put(&mut self, table: Table, key: Vec<u8>, value: Vec<u8>) {
        self.0.push(Write::Put(table, key, value));
    }

    fn delete(&mut self, table: Table, key: Vec<u8>) {
        self.0.push(Write::Delete(table, key));
    }

    /// The operation's row, and its row in the index of unsettled operations put or deleted
    /// to match: every write of an operation's record is made here.
    fn put_operation(&mut self, key: &str, record: &OperationRecord) {
        let key = key.as_bytes().to_vec();
        match record.status.is_unsettled() {
            true => self.put(Table::Unsettled, key.clone(), Vec::new()),
            false => self.delete(Table::Unsettled, key.clone()),
        }
        self.put(Table::Operations, key, encode_record(record));
    }
}

/// The keys of the index of unsettled operations under `prefix`, as the engine holds them.
fn index_keys(engine: &dyn Reads, prefix: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
    let rows = engine.scan(Table::Unsettled, prefix, prefix, usize::MAX)?;
    Ok(rows.into_iter().map(|(key, _)| key.into()).collect())
}

/// Whether a listed operation is unsettled, or its row does not read (and may be).
fn is_unsettled_or_unread((_, record): &(String, Result<OperationRecord, StoreError>)) -> bool {
    record.as_ref().map_or(true, |r| r.status.is_unsettled())
}

/// A map of the writer's: a group's staging, or what it remembers of its writes. Its keys are
/// workflow ids, request ids and artifact keys a caller chooses, so each map is seeded on its
/// own, a staging map holds one group's keys at a time (emptied after each, and kept with its
/// seed for the next: [`Spare`]), and none holds more than [`MAX_WRITTEN`] keys. SipHash cost
/// the writer thread about 1,400 instructions a transition under 1,024 concurrent workflows.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A set of one group's staging (see [`Map`]).
type Set<K> = HashSet<K, foldhash::fast::RandomState>;

/// What the group has claimed so far, so two jobs in one batch are checked against each other
/// as well as against the store.
#[derive(Default)]
struct Overlay {
    journal_len: Map<Arc<str>, u64>,
    /// The records written, but for the journal length (see [`Written::records`]).
    records: Map<Arc<str>, WorkflowRecord>,
    requests: Map<String, String>,
    /// The last stream event number written or staged, per workflow.
    stream_last: Map<String, u64>,
    /// The last inbox arrival number written or staged, per workflow.
    inbox_last: Map<String, u64>,
    /// Signal ids staged in this group, per workflow.
    signals_seen: Set<(String, String)>,
    /// Workflows whose end is staged in this group.
    ended: Set<String>,
    /// Response versions of streamed steps, as staged.
    step_versions: Map<(String, Seq), StepVersions>,
    /// Readers' acknowledgements, as staged, per (workflow, channel).
    stream_acks: Map<(String, String), u64>,
    /// Workflows deleted in this group: no later job of the group may write them.
    deleted: Set<String>,
    /// Artifacts (by key) committed in this group: a deletion keeps them.
    artifacts_committed: Set<Vec<u8>>,
    /// Artifacts (by key) deleted in this group: a commit writes them again.
    artifacts_deleted: Set<Vec<u8>>,
    /// Artifact references (by key) deleted in this group: they count no more.
    refs_deleted: Set<Vec<u8>>,
    /// Operations (by key) of ended workflows settled in this group: a second decision about
    /// one is refused, as it would be after the write.
    settled_ended: Set<String>,
    /// Workflows marked parked in this group: a later signal for one deletes the mark, whatever
    /// names it holds (see [`View::signal_keeps_mark`]).
    parked: Set<String>,
}

impl Overlay {
    /// Moves a job's changes into the group's, leaving the job's tables empty.
    fn merge(&mut self, job: &mut Overlay) {
        absorb(&mut self.journal_len, &mut job.journal_len);
        absorb(&mut self.records, &mut job.records);
        absorb(&mut self.requests, &mut job.requests);
        absorb(&mut self.stream_last, &mut job.stream_last);
        absorb(&mut self.inbox_last, &mut job.inbox_last);
        absorb_set(&mut self.signals_seen, &mut job.signals_seen);
        absorb_set(&mut self.ended, &mut job.ended);
        absorb(&mut self.step_versions, &mut job.step_versions);
        absorb(&mut self.stream_acks, &mut job.stream_acks);
        absorb_set(&mut self.deleted, &mut job.deleted);
        absorb_set(&mut self.artifacts_committed, &mut job.artifacts_committed);
        absorb_set(&mut self.artifacts_deleted, &mut job.artifacts_deleted);
        absorb_set(&mut self.refs_deleted, &mut job.refs_deleted);
        absorb_set(&mut self.settled_ended, &mut job.settled_ended);
        absorb_set(&mut self.parked, &mut job.parked);
    }

    /// Empties every table, keeping its room. Every field is named, so that a table added
    /// later cannot be left out: the writer stages each group in the tables the last one used.
    fn clear(&mut self) {
        let Overlay {
            journal_len,
            records,
            requests,
            stream_last,
            inbox_last,
            signals_seen,
            ended,
            step_versions,
            stream_acks,
            deleted,
            artifacts_committed,
            artifacts_deleted,
            refs_deleted,
            settled_ended,
            parked,
        } = self;
        journal_len.clear();
        records.clear();
        requests.clear();
        stream_last.clear();
        inbox_last.clear();
        signals_seen.clear();
        ended.clear();
        step_versions.clear();
        stream_acks.clear();
        deleted.clear();
        artifacts_committed.clear();
        artifacts_deleted.clear();
        refs_deleted.clear();
        settled_ended.clear();
        parked.clear();
    }
}

/// Moves a job's changes of one kind into the group's. A job leaves most kinds empty, and the
/// writer merges every job of a group on its own thread: an empty one costs a look, not a
/// hash table's `extend`.
fn absorb<K: Eq + std::hash::Hash, V>(group: &mut Map<K, V>, job: &mut Map<K, V>) {
    if !job.is_empty() {
        group.extend(job.drain());
    }
}

/// [`absorb`], for a set.
fn absorb_set<K: Eq + std::hash::Hash>(group: &mut Set<K>, job: &mut Set<K>) {
    if !job.is_empty() {
        group.extend(job.drain());
    }
}

/// One job's view while it is staged: the store, what the group staged before it, and its own
/// writes and changes, which join the group only if the job is accepted.
struct View<'a> {
    engine: &'a dyn Reads,
    group: &'a Overlay,
    known: &'a Written,
    job: &'a mut Overlay,
    writes: &'a mut Writes,
    /// Response versions this job fixes, set once it is accepted.
    claims: Vec<(VersionSlot, u32)>,
}

impl<'a> View<'a> {
    /// A job's view, staging into `scratch`, which must be empty.
    fn new(
        engine: &'a dyn Reads,
        group: &'a Overlay,
        known: &'a Written,
        scratch: &'a mut Scratch,
    ) -> Self {
        Self {
            engine,
            group,
            known,
            job: &mut scratch.changes,
            writes: &mut scratch.writes,
            claims: Vec::new(),
        }
    }

    fn journal_len(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.journal_len.get(workflow_id);
        let staged = staged.or_else(|| self.group.journal_len.get(workflow_id));
        match staged.or_else(|| self.known.journal_len(workflow_id)) {
            Some(len) => Ok(*len),
            None if self.known.owned => stored_journal_len(self.engine, workflow_id),
            None => Ok(stored_record(self.engine, workflow_id)?.map_or(0, |r| r.journal_len)),
        }
    }

    /// Whether the workflow's record row already says what `record` says, but for the journal
    /// length: as this job, the group or this writer last wrote it, or else as the row holds it
    /// (a row that does not decode refuses the job, as any corrupt row it reads). Only on a
    /// store one process owns: elsewhere every transition writes its record.
    fn record_stands(
        &mut self,
        workflow_id: &str,
        record: &WorkflowRecord,
    ) -> Result<bool, StoreError> {
        if !self.known.owned {
            return Ok(false);
        }
        let staged = self.job.records.get(workflow_id);
        let staged = staged.or_else(|| self.group.records.get(workflow_id));
        if let Some(known) = staged.or_else(|| self.known.record(workflow_id)) {
            return Ok(known.same_but_journal_len(record));
        }
        let Some(stored) = stored_record(self.engine, workflow_id)? else {
            return Ok(false);
        };
        let stands = stored.same_but_journal_len(record);
        if stands {
            self.job.records.insert(workflow_id.into(), stored);
        }
        Ok(stands)
    }

    fn has_ended(&self, workflow_id: &str) -> Result<bool, StoreError> {
        if self.job.ended.contains(workflow_id) || self.group.ended.contains(workflow_id) {
            return Ok(true);
        }
        let record = stored_record(self.engine, workflow_id)?;
        Ok(record.is_some_and(|r| r.status.is_terminal()))
    }

    fn request_owner(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        let staged = self.job.requests.get(request_id);
        if let Some(owner) = staged.or_else(|| self.group.requests.get(request_id)) {
            return Ok(Some(owner.clone()));
        }
        let bytes = self.engine.get(Table::Requests, &id_key(request_id))?;
        bytes
            .map(|b| decode_at::<String>(Table::Requests, request_id, &b))
            .transpose()
    }

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.stream_last.get(workflow_id);
        let staged = staged.or_else(|| self.group.stream_last.get(workflow_id));
        match staged.or_else(|| self.known.stream_last(workflow_id)) {
            Some(last) => Ok(*last),
            None => stored_stream_last(self.engine, workflow_id),
        }
    }

    fn stream_ack(&self, workflow_id: &str, channel: &str) -> Result<u64, StoreError> {
        let id = (workflow_id.to_owned(), channel.to_owned());
        if let Some(event) = self.job.stream_acks.get(&id) {
            return Ok(*event);
        }
        if let Some(event) = self.group.stream_acks.get(&id) {
            return Ok(*event);
        }
        let key = stream_ack_key(workflow_id, channel);
        let bytes = self.engine.get(Table::StreamAcks, &key)?;
        let at = || format!("{workflow_id}#{channel}");
        let acked = bytes.map(|b| decode_at(Table::StreamAcks, &at(), &b));
        Ok(acked.transpose()?.unwrap_or(0))
    }

    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        let staged = self.job.inbox_last.get(workflow_id);
        match staged.or_else(|| self.group.inbox_last.get(workflow_id)) {
            Some(last) => Ok(*last),
            None => stored_inbox_last(self.engine, workflow_id),
        }
    }

    /// Whether a signal arrived for the workflow after arrival `after` (0: any, arrivals are
    /// numbered from 1): staged in this group, or stored and not yet delivered.
    fn signals_past(&self, workflow_id: &str, after: u64) -> Result<bool, StoreError> {
        if self.job.inbox_last.contains_key(workflow_id)
            || self.group.inbox_last.contains_key(workflow_id)
        {
            return Ok(true);
        }
        let prefix = inbox_messages_prefix(workflow_id);
        let from = inbox_message_key(workflow_id, after.saturating_add(1));
        Ok(!self
            .engine
            .scan(Table::Inbox, &prefix, &from, 1)?
            .is_empty())
    }

    fn has_timer_rows(&self, timers: &[TimerKey]) -> Result<bool, StoreError> {
        for timer in timers {
            if self.engine.get(Table::Timers, &timer.encode())?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn keeps_parked_marks(&self) -> bool {
        self.known.owned
    }

    /// Whether a signal named `name` leaves the workflow's parked mark: only a stored mark
    /// that no wait of the run takes the name by, with no mark staged in this group (whose
    /// names are not read back here). A mark that cannot be read or decoded is deleted: the
    /// run is then rebuilt, as it would be without the mark.
    fn signal_keeps_mark(&self, workflow_id: &str, name: &str) -> bool {
        if !self.keeps_parked_marks()
            || self.job.parked.contains(workflow_id)
            || self.group.parked.contains(workflow_id)
        {
            return false;
        }
        let stored = self.engine.get(Table::Parked, &id_key(workflow_id));
        let mark = stored.ok().flatten();
        let mark = mark.and_then(|value| decode_record::<ParkedMark>(&value).ok());
        mark.is_some_and(|mark| !mark.wakes_for(name))
    }

    /// Deletes the workflow's parked mark, on a store that keeps them.
    fn unpark(&mut self, workflow_id: &str) {
        if self.keeps_parked_marks() {
            self.writes.delete(Table::Parked, id_key(workflow_id));
        }
    }

    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError> {
        let id = (workflow_id.to_owned(), signal_id.to_owned());
        if self.job.signals_seen.contains(&id) || self.group.signals_seen.contains(&id) {
            return Ok(true);
        }
        let key = inbox_seen_key(workflow_id, signal_id);
        Ok(self.engine.get(Table::Inbox, &key)?.is_some())
    }

    fn step_versions(&self, workflow_id: &str, step: Seq) -> Result<StepVersions, StoreError> {
        let id = (workflow_id.to_owned(), step);
        let staged = self.job.step_versions.get(&id);
        if let Some(versions) = staged.or_else(|| self.group.step_versions.get(&id)) {
            return Ok(versions.clone());
        }
        stored_step_versions(self.engine, workflow_id, step)
    }
}

fn stage(view: &mut View<'_>, t: &Transition) -> Result<(), StoreError> {
    check_journal_len(view, t)?;
    if let Some(request_id) = &t.claim_request {
        check_request_free(view, t, request_id)?;
    }
    let start = rewound_start(view, t)?;
    check_record_counts_entries(t, start)?;
    for (offset, entry) in t.append.iter().enumerate() {
        let index = start + offset as u64;
        let key = journal_key(&t.workflow_id, index);
        let record = stage_entry(view, &t.workflow_id, entry)?;
        view.writes.put(Table::Journal, key, record);
    }
    if let Some(to) = t.rewind_to {
        blobs::release_rewound(view, &t.workflow_id, to, &t.append)?;
    }
    if !t.redeliver.is_empty() {
        stage_redelivery(view, &t.workflow_id, &t.redeliver)?;
    }
    stage_record(view, t)?;
    if t.unpark {
        view.unpark(&t.workflow_id);
    }
    if let Some(request_id) = &t.claim_request {
        let owner = encode_record(&t.workflow_id.to_string());
        view.writes.put(Table::Requests, id_key(request_id), owner);
        let claim = (request_id.clone(), t.workflow_id.to_string());
        view.job.requests.insert(claim.0, claim.1);
    }
    for timer in &t.add_timers {
        view.writes.put(Table::Timers, timer.encode(), Vec::new());
    }
    for timer in &t.remove_timers {
        view.writes.delete(Table::Timers, timer.encode());
    }
    for (key, record) in &t.operations {
        view.writes.put_operation(key, record);
    }
    stage_stream(view, &t.workflow_id, &t.stream)?;
    stage_artifacts(view, &t.workflow_id, &t.artifacts)?;
    for (arrival, name) in &t.consume_inbox {
        let key = inbox_message_key(&t.workflow_id, *arrival);
        view.writes.delete(Table::Inbox, key);
        let named = inbox_named_key(&t.workflow_id, name, *arrival);
        view.writes.delete(Table::Inbox, named);
    }
    if t.record.status.is_terminal() {
        stage_end(view, &t.workflow_id, t.ended_at_ms)?;
    }
    // Last: on a shared store the fence writes the lease (taken at the start, let go at the
    // end), which a check refusing the job after it could not take back.
    view.engine.fence(&t.workflow_id, ownership(t))?;
    view.job
        .journal_len
        .insert(t.workflow_id.clone(), t.record.journal_len);
    Ok(())
}

/// Writes `t`'s record, unless its row already says the same but for the journal length: a
/// workflow's length is its journal's (see [`stored_journal_len`]), so a step that only appends
/// writes no record row. The record is the one row a step would otherwise rewrite, and with
/// the entries' rows it was a third of a step's memtable inserts on the writer thread.
///
/// A rewind always writes it: the length a row holds then never exceeds the journal's, so a
/// row counting more entries than the journal has tells of rows lost (see [`read_record`]).
fn stage_record(view: &mut View<'_>, t: &Transition) -> Result<(), StoreError> {
    if t.rewind_to.is_none() && view.record_stands(&t.workflow_id, &t.record)? {
        return Ok(());
    }
    let record = encode_record(&t.record);
    view.writes
        .put(Table::Workflows, id_key(&t.workflow_id), record);
    if view.known.owned {
        let written = (t.workflow_id.clone(), t.record.clone());
        view.job.records.insert(written.0, written.1);
    }
    Ok(())
}

/// Artifacts are immutable: one that exists is not written again (unless a deletion earlier
/// in the group takes it). Each commit is counted for its workflow (`artifact_refs`), so the
/// artifact goes only with the last workflow that committed it.
fn stage_artifacts(
    view: &mut View<'_>,
    workflow_id: &str,
    artifacts: &[(Digest, ArtifactRecord)],
) -> Result<(), StoreError> {
    let (namespace, _) = crate::namespace::split(workflow_id);
    for (hash, record) in artifacts {
        let key = artifact_key(namespace, hash);
        let deleted = view.group.artifacts_deleted.contains(&key);
        if deleted || view.engine.get(Table::Artifacts, &key)?.is_none() {
            view.writes
                .put(Table::Artifacts, key.clone(), encode_record(record));
        }
        let reference = artifact_ref_key(&key, workflow_id);
        view.writes.put(Table::ArtifactRefs, reference, Vec::new());
        view.job.artifacts_committed.insert(key);
    }
    Ok(())
}

/// The workflow ends: signals it never took can never be delivered, so they go with the end
/// (the ids seen stay, so a repeated send is still told it was a duplicate), and later ones
/// are refused. It is listed by its end time, for retention.
fn stage_end(view: &mut View<'_>, workflow_id: &str, ended_at_ms: u64) -> Result<(), StoreError> {
    let listed = ended_key(ended_at_ms, workflow_id);
    view.writes.put(Table::Ended, listed, Vec::new());
    let when = ended_at_ms.to_be_bytes().to_vec();
    view.writes
        .put(Table::Ended, ended_at_key(workflow_id), when);
    // Most runs end with an empty inbox: a range tombstone each would slow every later read.
    if view.signals_past(workflow_id, 0)? {
        for prefix in [
            inbox_messages_prefix(workflow_id),
            inbox_names_prefix(workflow_id),
        ] {
            let mut after = prefix.clone();
            if let Some(last) = after.last_mut() {
                *last += 1;
            }
            view.writes
                .0
                .push(Write::DeleteRange(Table::Inbox, prefix, after));
        }
    }
    view.job.ended.insert(workflow_id.to_owned());
    Ok(())
}

/// Numbers stream events after the workflow's last one. Numbering happens here, on the single
/// writer thread, so numbers follow write order and readers never see a gap fill in later.
fn stage_stream(
    view: &mut View<'_>,
    workflow_id: &str,
    items: &[StreamItem],
) -> Result<(), StoreError> {
    if items.is_empty() {
        return Ok(());
    }
    stage_stream_rows(view, workflow_id, items)?;
    for item in items {
        track_versions(view, workflow_id, item)?;
    }
    Ok(())
}

/// Numbers `items` after the workflow's last stream event and writes them, leaving the steps'
/// version index as it is.
fn stage_stream_rows(
    view: &mut View<'_>,
    workflow_id: &str,
    items: &[StreamItem],
) -> Result<(), StoreError> {
    let mut last = view.stream_last(workflow_id)?;
    for item in items {
        last = last
            .checked_add(1)
            .ok_or_else(|| exhausted(Table::Streams, workflow_id))?;
        let key = stream_key(workflow_id, last);
        view.writes.put(Table::Streams, key, encode_record(item));
    }
    view.job.stream_last.insert(workflow_id.to_owned(), last);
    Ok(())
}

/// Keeps the per-step index of response versions in step with a generation event, so that a
/// new attempt's version is one lookup away however long the stream is.
fn track_versions(
    view: &mut View<'_>,
    workflow_id: &str,
    item: &StreamItem,
) -> Result<(), StoreError> {
    if !item.is_generation() {
        return Ok(());
    }
    let step = item.step();
    let mut versions = view.step_versions(workflow_id, step)?;
    if !versions.track(item) {
        return Ok(());
    }
    let key = journal_key(workflow_id, u64::from(step));
    view.writes
        .put(Table::StreamSteps, key, encode_record(&versions));
    view.job
        .step_versions
        .insert((workflow_id.to_owned(), step), versions);
    Ok(())
}

/// A chunk of one attempt's generation. Its first chunk fixes the attempt's response version,
/// one above any the step had, and supersedes the step's versions still open (a crash cut
/// them off): decided here, in write order, so no reader or attempt ever reads the stream.
fn stage_chunk(
    view: &mut View<'_>,
    workflow_id: &str,
    step: Seq,
    slot: &VersionSlot,
    text: &str,
) -> Result<(), StoreError> {
    let chunk = |response_version| StreamItem::Chunk {
        step,
        response_version,
        text: text.to_owned(),
    };
    // A later chunk of the attempt: its first one indexed the version, and only a higher one
    // would change the index. Not reading it keeps a chunk's cost to its own row.
    if let Some(version) = slot.get() {
        return stage_stream_rows(view, workflow_id, &[chunk(version)]);
    }
    let versions = view.step_versions(workflow_id, step)?;
    let mut items: Vec<StreamItem> = versions
        .open
        .iter()
        .map(|&response_version| StreamItem::Superseded {
            step,
            response_version,
            reason: "the attempt stopped before its result was journaled".into(),
        })
        .collect();
    let version = versions
        .newest
        .checked_add(1)
        .ok_or_else(|| exhausted(Table::StreamSteps, workflow_id))?;
    view.claims.push((slot.clone(), version));
    items.push(chunk(version));
    stage_stream(view, workflow_id, &items)
}

/// Numbers a signal after the workflow's last arrival and marks its id seen; a seen id (in the
/// store or earlier in this group) writes nothing, and neither does a workflow that ended.
fn stage_signal(
    view: &mut View<'_>,
    workflow_id: &str,
    message: &InboxMessage,
) -> Result<(), StoreError> {
    if view.has_ended(workflow_id)? {
        return Err(StoreError::Ended {
            workflow_id: workflow_id.to_owned(),
        });
    }
    if view.signal_seen(workflow_id, &message.signal_id)? {
        return Err(StoreError::Conflict {
            workflow_id: workflow_id.to_owned(),
            reason: format!("signal id `{}` was seen before", message.signal_id),
        });
    }
    let last = view.inbox_last(workflow_id)?;
    let arrival = put_inbox_message(view, workflow_id, last, message)?;
    count_inbox_arrivals(view, workflow_id, arrival);
    let id = (workflow_id.to_owned(), message.signal_id.clone());
    view.job.signals_seen.insert(id);
    if !view.signal_keeps_mark(workflow_id, &message.name) {
        view.unpark(workflow_id);
    }
    Ok(())
}

/// Marks the workflow parked, unless it ended, a signal arrived that its run has not read
/// (stored, or staged in this group), or a timer it waits for has no row: then the run is to
/// be rebuilt on start, as it would be without the mark.
fn stage_parked(
    view: &mut View<'_>,
    workflow_id: &str,
    parking: &Parking,
) -> Result<(), StoreError> {
    if !view.keeps_parked_marks()
        || view.has_ended(workflow_id)?
        || view.signals_past(workflow_id, parking.inbox_read_up_to)?
        || !view.has_timer_rows(&parking.timers)?
    {
        return Ok(());
    }
    let mark = ParkedMark {
        code_digest: parking.code_digest,
        listening: Some(parking.listening.clone()),
    };
    view.writes
        .put(Table::Parked, id_key(workflow_id), encode_record(&mark));
    view.job.parked.insert(workflow_id.to_owned());
    Ok(())
}

/// Puts `redelivered` back in the inbox ahead of the messages waiting there: all of them are
/// numbered again after the last arrival, in that order (for one signal name, the order they
/// arrived in). Refused as a conflict when this group already staged a signal for the workflow.
fn stage_redelivery(
    view: &mut View<'_>,
    workflow_id: &str,
    redelivered: &[InboxMessage],
) -> Result<(), StoreError> {
    // A signal an earlier job of this group staged is not in the stored rows read below: it
    // would keep its place ahead of the ones put back. The reset is asked to try again.
    let staged = view.job.inbox_last.get(workflow_id);
    if staged
        .or_else(|| view.group.inbox_last.get(workflow_id))
        .is_some()
    {
        return Err(StoreError::Conflict {
            workflow_id: workflow_id.to_owned(),
            reason: "a signal arrived in the same write".to_owned(),
        });
    }
    let prefix = inbox_messages_prefix(workflow_id);
    let mut waiting = Vec::new();
    for (key, value) in view
        .engine
        .scan(Table::Inbox, &prefix, &prefix, usize::MAX)?
    {
        let arrival = parse_inbox_arrival(&prefix, &key)
            .map_err(|e| StoreError::malformed_key(Table::Inbox, &key, &e))?;
        let message = decode_inbox_message(workflow_id, arrival, &value)?;
        view.writes.delete(Table::Inbox, key.to_vec());
        let named = inbox_named_key(workflow_id, &message.name, arrival);
        view.writes.delete(Table::Inbox, named);
        waiting.push(message);
    }
    let mut arrival = view.inbox_last(workflow_id)?;
    for message in redelivered.iter().chain(&waiting) {
        arrival = put_inbox_message(view, workflow_id, arrival, message)?;
        let id = (workflow_id.to_owned(), message.signal_id.clone());
        view.job.signals_seen.insert(id);
    }
    count_inbox_arrivals(view, workflow_id, arrival);
    Ok(())
}

/// Writes `message` as the arrival after `last`, its id as seen; the arrival's number.
fn put_inbox_message(
    view: &mut View<'_>,
    workflow_id: &str,
    last: u64,
    message: &InboxMessage,
) -> Result<u64, StoreError> {
    let arrival = last
        .checked_add(1)
        .ok_or_else(|| exhausted(Table::Inbox, workflow_id))?;
    let key = inbox_message_key(workflow_id, arrival);
    view.writes.put(Table::Inbox, key, encode_record(message));
    let named = inbox_named_key(workflow_id, &message.name, arrival);
    view.writes.put(Table::Inbox, named, Vec::new());
    let seen = inbox_seen_key(workflow_id, &message.signal_id);
    view.writes.put(Table::Inbox, seen, Vec::new());
    Ok(arrival)
}

/// Records `arrival` as the workflow's last inbox arrival.
fn count_inbox_arrivals(view: &mut View<'_>, workflow_id: &str, arrival: u64) {
    let counter = inbox_counter_key(workflow_id);
    view.writes
        .put(Table::Inbox, counter, encode_record(&arrival));
    view.job.inbox_last.insert(workflow_id.to_owned(), arrival);
}

fn stage_acknowledgement(
    view: &mut View<'_>,
    workflow_id: &str,
    channel: &str,
    event: u64,
) -> Result<(), StoreError> {
    let newest = view.stream_last(workflow_id)?;
    if event > newest {
        return Err(StoreError::Conflict {
            workflow_id: workflow_id.to_owned(),
            reason: format!(
                "event {event} was never generated: the stream's newest event is {newest}"
            ),
        });
    }
    if event <= view.stream_ack(workflow_id, channel)? {
        return Ok(());
    }
    let key = stream_ack_key(workflow_id, channel);
    view.writes
        .put(Table::StreamAcks, key, encode_record(&event));
    let id = (workflow_id.to_owned(), channel.to_owned());
    view.job.stream_acks.insert(id, event);
    Ok(())
}

/// A per-workflow number at the end of its range: only a corrupt store (or an imported one
/// crafted so) gets here, and the job is refused instead of the writer panicking.
fn exhausted(table: Table, workflow_id: &str) -> StoreError {
    StoreError::Corrupt {
        table,
        key: workflow_id.to_owned(),
        source: DecodeError::Malformed("the per-workflow counter is at its maximum".into()),
    }
}

/// The number of a workflow's journal rows. They are numbered from 0 with no gap (an append
/// writes the next, a rewind deletes those past it, a deletion all): the last one's number
/// and one.
fn stored_journal_len(engine: &dyn Reads, workflow_id: &str) -> Result<u64, StoreError> {
    let prefix = id_key(workflow_id);
    let end = journal_key(workflow_id, u64::MAX);
    let Some(key) = engine.last_key(Table::Journal, &prefix, &end)? else {
        return Ok(0);
    };
    let parsed = parse_journal_key(&key).map(|(_, index)| index.saturating_add(1));
    parsed.map_err(|e| StoreError::malformed_key(Table::Journal, &key, &e))
}

/// A workflow's record as its row holds it: its journal length may trail (see [`Lengths`]).
fn stored_record(
    engine: &dyn Reads,
    workflow_id: &str,
) -> Result<Option<WorkflowRecord>, StoreError> {
    let bytes = engine.get(Table::Workflows, &id_key(workflow_id))?;
    bytes
        .map(|b| decode_at(Table::Workflows, workflow_id, &b))
        .transpose()
}

/// The newest arrival number of a workflow's inbox (0 before its first signal). Every inbox
/// with messages has its counter (see `layout`), so arrival numbers never repeat and a reader
/// can ask for the messages after the last one it saw.
pub(super) fn decode_inbox_message(
    workflow_id: &str,
    arrival: u64,
    value: &[u8],
) -> Result<InboxMessage, StoreError> {
    decode_at(Table::Inbox, &format!("{workflow_id}#{arrival}"), value)
}

fn stored_inbox_last(engine: &dyn Reads, workflow_id: &str) -> Result<u64, StoreError> {
    let bytes = engine.get(Table::Inbox, &inbox_counter_key(workflow_id))?;
    let at = || format!("{workflow_id}#counter");
    bytes.map_or(Ok(0), |b| decode_at(Table::Inbox, &at(), &b))
}

fn stored_stream_last(engine: &dyn Reads, workflow_id: &str) -> Result<u64, StoreError> {
    let prefix = id_key(workflow_id);
    let end = stream_key(workflow_id, u64::MAX);
    let Some((key, _)) = engine.last(Table::Streams, &prefix, &end)? else {
        return Ok(0);
    };
    let parsed = parse_journal_key(&key).map(|(_, seq)| seq);
    parsed.map_err(|e| StoreError::malformed_key(Table::Streams, &key, &e))
}

fn stored_step_versions(
    engine: &dyn Reads,
    workflow_id: &str,
    step: Seq,
) -> Result<StepVersions, StoreError> {
    let key = journal_key(workflow_id, u64::from(step));
    let bytes = engine.get(Table::StreamSteps, &key)?;
    let at = || format!("{workflow_id}#{step}");
    bytes.map_or(Ok(StepVersions::default()), |b| {
        decode_at(Table::StreamSteps, &at(), &b)
    })
}

/// What `t` does to its workflow's ownership: a first append creates it, a terminal record ends
/// it (an imported journal that ended does both).
fn ownership(t: &Transition) -> Ownership {
    let ends = t.record.status.is_terminal();
    if ends && t.expected_journal_len == 0 {
        Ownership::Whole
    } else if ends {
        Ownership::End
    } else if t.expected_journal_len == 0 {
        Ownership::Begin
    } else {
        Ownership::Continue
    }
}

fn check_journal_len(view: &View<'_>, t: &Transition) -> Result<(), StoreError> {
    let current = view.journal_len(&t.workflow_id)?;
    if current == t.expected_journal_len {
        return Ok(());
    }
    Err(StoreError::Conflict {
        workflow_id: t.workflow_id.to_string(),
        reason: format!(
            "journal has {current} entries, the writer expected {}",
            t.expected_journal_len
        ),
    })
}

/// `entry` as its journal row holds it: a large one with its long strings kept apart, each
/// written once for the workflow (see `blobs`).
fn stage_entry(
    view: &mut View<'_>,
    workflow_id: &str,
    entry: &Entry,
) -> Result<Vec<u8>, StoreError> {
    let record = encode_record(entry);
    if record.len() < blobs::PAYLOAD_THRESHOLD {
        return Ok(record);
    }
    let (Some(split), parts) = blobs::split_entry(entry) else {
        return Ok(record);
    };
    for (hash, bytes) in parts {
        let key = blobs::blob_key(workflow_id, &hash);
        if view.engine.get(Table::Blobs, &key)?.is_none() {
            view.writes.put(Table::Blobs, key, bytes);
        }
    }
    Ok(encode_record(&split))
}

/// Where `t`'s entries go: after the journal, or, for a rewind, from the index it rewinds
/// to, the entries from there on deleted.
fn rewound_start(view: &mut View<'_>, t: &Transition) -> Result<u64, StoreError> {
    let Some(to) = t.rewind_to else {
        return Ok(t.expected_journal_len);
    };
    // A rewind to 0 starts the journal again: only with a new start in its place.
    if (to == 0 && t.append.is_empty()) || to > t.expected_journal_len {
        return Err(StoreError::Conflict {
            workflow_id: t.workflow_id.to_string(),
            reason: format!(
                "cannot rewind a journal of {} entries to {to}",
                t.expected_journal_len
            ),
        });
    }
    // The rows the new entries take are written over; the ones past them go.
    let written_up_to = to + t.append.len() as u64;
    for index in written_up_to..t.expected_journal_len {
        let key = journal_key(&t.workflow_id, index);
        view.writes.delete(Table::Journal, key);
    }
    Ok(to)
}

/// Refuses a record whose journal length is not what `t` leaves: the length is the journal's
/// (see [`stored_journal_len`]), and the writer remembers the record's as the workflow's.
fn check_record_counts_entries(t: &Transition, start: u64) -> Result<(), StoreError> {
    let leaves = start.saturating_add(t.append.len() as u64);
    if t.record.journal_len == leaves {
        return Ok(());
    }
    Err(StoreError::Conflict {
        workflow_id: t.workflow_id.to_string(),
        reason: format!(
            "its record counts {} journal entries, and the change leaves {leaves}",
            t.record.journal_len
        ),
    })
}

fn check_request_free(view: &View<'_>, t: &Transition, request_id: &str) -> Result<(), StoreError> {
    match view.request_owner(request_id)? {
        Some(owner) if *owner != *t.workflow_id => Err(StoreError::Conflict {
            workflow_id: t.workflow_id.to_string(),
            reason: format!("request id `{request_id}` belongs to workflow `{owner}`"),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::journal::Payload;
    use crate::store::{MemoryEngine, MemoryStore, WorkflowStatus};

    const WRITER_THREAD: &str = "waymark-store-writer";

    fn store() -> (MemoryStore, Arc<MemoryEngine>) {
        let engine = MemoryEngine::new();
        (MemoryStore::on(engine.clone()).unwrap(), engine)
    }

    /// The thread that wrote the last batch.
    fn last_writer(engine: &MemoryEngine) -> String {
        engine.last_writer().unwrap_or_default()
    }

    fn this_thread() -> String {
        std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned()
    }

    fn record() -> WorkflowRecord {
        WorkflowRecord::new("wf", None, Digest::of(b"null"))
    }

    fn start(workflow_id: &str) -> Transition {
        crate::store::first_transition(workflow_id)
    }

    /// One more entry after the first `len`.
    fn append(len: u64) -> Transition {
        let mut before = record();
        before.journal_len = len;
        Transition::append("wf", &before, vec![Entry::WaitDropped { seq: len as Seq }])
    }

    /// `transition` as a writer's job.
    fn job(transition: Transition) -> Work {
        Work::Transition(Arc::new(transition))
    }

    /// Stages `group` as the writer does, every job of it accepted, and writes its batch.
    fn stage_accepted(engine: &MemoryEngine, known: &Written, group: &[Work]) {
        let staged = Staged::from_group(engine, group, known, Box::default());
        assert!(staged.rejected.is_empty());
        engine.write(staged.batch, true).unwrap();
    }

    /// A job sees what every job before it in its group staged, not only the first (which the
    /// group takes as it is): the second job starts a workflow, and the third takes its next
    /// entry from the length the second left.
    #[test]
    fn a_job_sees_what_every_job_before_it_in_the_group_staged() {
        let engine = MemoryEngine::new();
        let group = [job(start("other")), job(start("wf")), job(append(1))];
        let space = Box::default();
        let staged = Staged::from_group(&*engine, &group, &Written::new(true), space);
        let refused: Vec<String> = staged.rejected.iter().map(|(_, e)| e.to_string()).collect();
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(staged.accepted, [0, 1, 2]);
    }

    /// A signal of a name that a mark staged before it in its group listens for deletes that
    /// mark, even where the mark stored before the group, which it replaces, listens for
    /// other names only: the group leaves no mark beside an unread signal its run waits for.
    #[test]
    fn a_signal_deletes_a_mark_staged_before_it_in_its_group() {
        let engine = MemoryEngine::new();
        let known = Written::new(true);
        let stage = |group: &[Work]| stage_accepted(&engine, &known, group);
        stage(&[job(start("wf"))]);
        let older = ParkedMark {
            code_digest: 7,
            listening: Some(vec!["note".into()]),
        };
        let stored = Write::Put(Table::Parked, id_key("wf"), encode_record(&older));
        engine.write(vec![stored], true).unwrap();
        let park = Work::Park {
            workflow_id: "wf".into(),
            parking: parking(0),
        };
        let go = Work::Signal {
            workflow_id: "wf".into(),
            message: signal("g-1"),
        };
        stage(&[park, go]);
        assert_eq!(engine.get(Table::Parked, &id_key("wf")).unwrap(), None);
    }

    /// A mark that does not decode is deleted by any signal: the run is rebuilt, as it would be
    /// without a mark, rather than left parked beside a signal a wait may take.
    #[test]
    fn a_signal_deletes_a_mark_that_does_not_decode() {
        let engine = MemoryEngine::new();
        let known = Written::new(true);
        let stage = |group: &[Work]| stage_accepted(&engine, &known, group);
        stage(&[job(start("wf"))]);
        let garbage = Write::Put(Table::Parked, id_key("wf"), vec![2, 0xFF]);
        engine.write(vec![garbage], true).unwrap();
        let note = Work::Signal {
            workflow_id: "wf".into(),
            message: named("note", "n-1"),
        };
        stage(&[note]);
        assert_eq!(engine.get(Table::Parked, &id_key("wf")).unwrap(), None);
    }

    /// The writer stages each group in the space the last one left, emptied: nothing the last
    /// group staged (here a signal's id, which the next group would take for seen before)
    /// reaches the next, whose batch is checked against the store alone.
    #[test]
    fn a_group_leaves_nothing_it_staged_to_the_next() {
        let engine = MemoryEngine::new();
        let known = Written::new(true);
        let group = [Work::Signal {
            workflow_id: "wf".into(),
            message: signal("s-1"),
        }];
        let first = Staged::from_group(&*engine, &group, &known, Box::default());
        assert_eq!(first.accepted, [0]);
        // The first group's batch is never written: the store has not seen the signal.
        let second = Staged::from_group(&*engine, &group, &known, first.into_space());
        let refused: Vec<String> = second.rejected.iter().map(|(_, e)| e.to_string()).collect();
        assert!(refused.is_empty(), "{refused:?}");
        assert_eq!(second.accepted, [0]);
    }

    /// A job refused halfway leaves nothing of itself to the jobs after it in its group: not
    /// the rows it staged before it was refused, nor what it changed.
    #[test]
    fn a_job_refused_halfway_leaves_nothing_to_the_next() {
        let engine = MemoryEngine::new();
        // A key in the stream's range that is no stream event: numbering after it fails,
        // once the job's journal row and record are staged.
        let mut garbage = id_key("refused");
        garbage.extend_from_slice(&[0, 0, 0]);
        let corrupt = Write::Put(Table::Streams, garbage, b"x".to_vec());
        engine.write(vec![corrupt], true).unwrap();
        let mut refused = start("refused");
        refused.stream.push(StreamItem::Chunk {
            step: 0,
            response_version: 1,
            text: "lost".into(),
        });
        let group = [job(refused), job(start("wf"))];
        let space = Box::default();
        let staged = Staged::from_group(&*engine, &group, &Written::new(true), space);
        assert_eq!(staged.accepted, [1]);
        assert!(matches!(
            staged.rejected[..],
            [(0, StoreError::Corrupt { .. })]
        ));
        let prefix = id_key("refused");
        let leaked = staged.batch.iter().filter(|write| match write {
            Write::Put(_, key, _) | Write::Delete(_, key) => key.starts_with(&prefix),
            Write::DeleteRange(..) => true,
        });
        assert_eq!(leaked.count(), 0);
        assert!(!staged.space.changes.records.contains_key("refused"));
    }

    /// The record as its row holds it, the journal length it was last written with included.
    fn record_row(engine: &MemoryEngine, workflow_id: &str) -> WorkflowRecord {
        let row = engine.get(Table::Workflows, &id_key(workflow_id)).unwrap();
        decode_at(Table::Workflows, workflow_id, &row.unwrap()).unwrap()
    }

    /// A transition that only appends leaves the record's row as it was; the store reads the
    /// workflow's length from its journal, for one workflow and in the listing.
    #[tokio::test]
    async fn an_append_leaves_the_record_row_as_it_was() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        store.commit(append(1)).await.unwrap();
        store.commit(append(2)).await.unwrap();
        assert_eq!(record_row(&engine, "wf").journal_len, 1);
        assert_eq!(store.workflow("wf").unwrap().unwrap().journal_len, 3);
        let listed = store.workflows().unwrap();
        assert_eq!(listed[0].1.as_ref().unwrap().journal_len, 3);
        let mut fourth = append(3);
        fourth.expected_journal_len = 2;
        assert!(matches!(
            store.commit(fourth).await,
            Err(StoreError::Conflict { .. })
        ));
    }

    /// A change to anything but the length is written, after appends that left the row alone;
    /// a store that starts over on the same engine reads the row, and leaves it as it stands.
    #[tokio::test]
    async fn a_changed_record_is_written_after_appends_that_were_not() {
        let engine = MemoryEngine::new();
        let store = MemoryStore::on(engine.clone()).unwrap();
        store.commit(start("wf")).await.unwrap();
        store.commit(append(1)).await.unwrap();
        let mut stuck = append(2);
        stuck.record.status = WorkflowStatus::Stuck;
        store.commit(stuck).await.unwrap();
        let row = record_row(&engine, "wf");
        assert_eq!((row.status, row.journal_len), (WorkflowStatus::Stuck, 3));
        drop(store);
        let again = MemoryStore::on(engine.clone()).unwrap();
        assert_eq!(again.workflow("wf").unwrap().unwrap().journal_len, 3);
        let mut next = append(3);
        next.record.status = WorkflowStatus::Stuck;
        again.commit(next).await.unwrap();
        assert_eq!(record_row(&engine, "wf").journal_len, 3);
        assert_eq!(again.workflow("wf").unwrap().unwrap().journal_len, 4);
    }

    /// Commits `wf` with three entries, stuck: a run a rewind may take back.
    async fn stuck_after_three_entries(store: &MemoryStore) {
        store.commit(start("wf")).await.unwrap();
        store.commit(append(1)).await.unwrap();
        let mut at_three = append(2);
        at_three.record.status = WorkflowStatus::Stuck;
        store.commit(at_three).await.unwrap();
    }

    /// Rewinds the stuck `wf` of [`stuck_after_three_entries`] to its first entry and appends
    /// one in place of the others: a journal of two.
    async fn rewind_to_one(store: &MemoryStore) {
        let mut stuck = record();
        stuck.status = WorkflowStatus::Stuck;
        stuck.journal_len = 3;
        let rewind = Transition::rewind("wf", &stuck, 1, vec![Entry::WaitDropped { seq: 1 }]);
        store.commit(rewind).await.unwrap();
    }

    /// Journal rows lost past the length a record row counts are told, not read as a shorter
    /// journal; a rewind writes the record, so its shorter journal is no such loss.
    #[tokio::test]
    async fn a_record_counting_more_entries_than_the_journal_holds_is_corrupt() {
        let (store, engine) = store();
        stuck_after_three_entries(&store).await;
        rewind_to_one(&store).await;
        assert_eq!(store.workflow("wf").unwrap().unwrap().journal_len, 2);
        let lost = Write::Delete(Table::Journal, journal_key("wf", 1));
        engine.write(vec![lost], true).unwrap();
        let refused = store.workflow("wf").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("counts 2 journal entries, the journal has 1"),
            "{refused}"
        );
    }

    /// A row read before a rewind, with the journal read after it, is not a corrupt record: the
    /// row is read again.
    #[tokio::test]
    async fn a_row_read_before_a_rewind_is_read_again() {
        let (store, engine) = store();
        stuck_after_three_entries(&store).await;
        let before = engine
            .get(Table::Workflows, &id_key("wf"))
            .unwrap()
            .unwrap();
        rewind_to_one(&store).await;
        let read = read_record(&*engine, Lengths::FromJournal, "wf", &before).unwrap();
        assert_eq!(read.journal_len, 2);
    }

    /// A power loss that drops unsynced appends, which wrote no record row, leaves the length
    /// the journal kept; the next store appends after it and not over it.
    #[tokio::test]
    async fn a_power_loss_after_appends_without_the_record_keeps_the_journals_length() {
        let engine = MemoryEngine::new();
        let store = MemoryStore::on(engine.clone()).unwrap();
        store.commit(start("wf")).await.unwrap();
        for len in 1..4 {
            let mut unsynced = append(len);
            unsynced.durable = false;
            store.commit(unsynced).await.unwrap();
        }
        drop(store);
        assert_eq!(engine.lose_power(1), 2);
        let again = MemoryStore::on(engine.clone()).unwrap();
        assert_eq!(again.workflow("wf").unwrap().unwrap().journal_len, 2);
        assert_eq!(record_row(&engine, "wf").journal_len, 1);
        let lost_place = again.commit(append(3)).await.unwrap_err();
        assert!(
            matches!(lost_place, StoreError::Conflict { .. }),
            "{lost_place}"
        );
        again.commit(append(2)).await.unwrap();
        assert_eq!(again.journal("wf").unwrap().len(), 3);
    }

    /// A summary reads no journal: a journal row whose key does not parse fails the workflow's
    /// entry in the full listing (its length unknown), not its summary.
    #[tokio::test]
    async fn a_summary_reads_no_journal() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        let mut unparsed = id_key("wf");
        unparsed.extend_from_slice(b"xyz");
        let put = Write::Put(Table::Journal, unparsed, Vec::new());
        engine.write(vec![put], true).unwrap();
        let listed = store.workflows().unwrap();
        let refused = listed[0].1.as_ref().unwrap_err();
        assert!(refused.to_string().contains("journal"), "{refused}");
        let summaries = store.workflow_summaries().unwrap();
        let summary = summaries[0].1.as_ref().unwrap();
        assert_eq!(summary.status, WorkflowStatus::Running);
    }

    /// A record whose length is not what the change leaves is refused, and nothing is written.
    #[tokio::test]
    async fn a_record_that_miscounts_the_entries_is_refused() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        let mut miscounted = append(1);
        miscounted.record.journal_len = 3;
        let refused = store.commit(miscounted).await.unwrap_err();
        assert!(refused.to_string().contains("counts 3"), "{refused}");
        assert_eq!(store.workflow("wf").unwrap().unwrap().journal_len, 1);
        assert_eq!(record_row(&engine, "wf").journal_len, 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_lone_synced_commit_is_written_on_the_callers_thread() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        assert_eq!(last_writer(&engine), this_thread());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_single_threaded_runtime_leaves_synced_commits_to_the_writer_thread() {
        let (store, engine) = store();
        let mut unsynced = start("wf");
        unsynced.durable = false;
        store.commit(unsynced).await.unwrap();
        assert_eq!(last_writer(&engine), this_thread());
        // Its other tasks could not queue a job to share the fsync while it blocked.
        store.commit(append(1)).await.unwrap();
        assert_eq!(last_writer(&engine), WRITER_THREAD);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_runtime_of_one_worker_leaves_synced_commits_to_the_writer_thread() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        assert_eq!(last_writer(&engine), WRITER_THREAD);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_commit_never_overtakes_a_job_queued_before_it() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        let writing = lock(&store.writer.writing);
        let first = store.commit(append(1));
        drop(writing);
        // Before the writer thread takes the lock back: this one must queue behind `first`.
        let second = store.commit(append(2));
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(store.journal("wf").unwrap().len(), 3);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn once_commits_group_a_synced_one_goes_to_the_writer_thread() {
        let (store, engine) = store();
        let writing = lock(&store.writer.writing);
        let queued: Vec<_> = ["a", "b", "c"]
            .map(|id| store.commit(start(id)))
            .into_iter()
            .collect();
        drop(writing);
        for commit in queued {
            commit.await.unwrap();
        }
        assert_eq!(store.write_stats().batches, 1, "the three shared one write");
        store.commit(start("d")).await.unwrap();
        assert_eq!(last_writer(&engine), WRITER_THREAD);
        // A group of one again: the next is written where it is asked for.
        store.commit(start("e")).await.unwrap();
        assert_eq!(last_writer(&engine), this_thread());
    }

    #[tokio::test]
    async fn the_writer_remembers_the_lengths_of_running_workflows_only() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        store.commit(start("other")).await.unwrap();
        let remembered = |store: &MemoryStore| {
            let writing = lock(&store.writer.writing);
            let mut ids: Vec<String> = writing
                .journal_lens
                .keys()
                .map(|id| id.to_string())
                .collect();
            ids.sort();
            ids
        };
        assert_eq!(remembered(&store), ["other", "wf"]);
        let mut end = append(1);
        end.record.status = WorkflowStatus::Completed;
        store.commit(end).await.unwrap();
        assert_eq!(remembered(&store), ["other"]);
    }

    /// The executor takes its transition back after the write instead of copying it first.
    #[tokio::test(flavor = "current_thread")]
    async fn a_transition_is_let_go_before_its_answer() {
        let (store, engine) = store();
        let mut unsynced = start("wf");
        unsynced.durable = false;
        for (transition, writer) in [(unsynced, this_thread()), (append(1), WRITER_THREAD.into())] {
            let shared = Arc::new(transition);
            store.commit_shared(shared.clone()).await.unwrap();
            assert_eq!(last_writer(&engine), writer);
            assert_eq!(Arc::strong_count(&shared), 1, "written by {writer}");
        }
    }

    /// A progress event with nothing in it but its name.
    fn milestone(name: &str) -> StreamItem {
        StreamItem::Progress {
            step: 1,
            name: name.into(),
            detail: Payload::unit(),
        }
    }

    fn stream_numbers(store: &MemoryStore) -> Vec<(u64, StreamItem)> {
        let events = store.stream("wf", 0).unwrap();
        events.into_iter().map(|e| (e.seq, e.item)).collect()
    }

    #[tokio::test]
    async fn a_stream_number_remembered_is_read_again_after_a_write_around_the_store() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        store
            .append_stream("wf", vec![milestone("first")])
            .await
            .unwrap();
        let remembered = lock(&store.writer.writing).stream_last("wf").copied();
        assert_eq!(remembered, Some(1), "the writer remembers what it numbered");
        let around = MemoryStore::on(engine).unwrap();
        around
            .append_stream("wf", vec![milestone("around")])
            .await
            .unwrap();
        store
            .append_stream("wf", vec![milestone("third")])
            .await
            .unwrap();
        let expected = ["first", "around", "third"].map(milestone);
        let expected: Vec<_> = (1..).zip(expected).collect();
        assert_eq!(stream_numbers(&store), expected, "no event written over");
    }

    #[tokio::test]
    async fn the_lengths_remembered_stay_bounded() {
        let (store, _) = store();
        for i in 0..=MAX_WRITTEN {
            store.commit(start(&format!("wf-{i}"))).await.unwrap();
        }
        let remembered = lock(&store.writer.writing).journal_lens.len();
        assert!(remembered <= MAX_WRITTEN, "{remembered}");
        assert!(remembered > 0, "the newest is remembered");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_chunk_is_never_written_on_the_generating_thread() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        let slot = VersionSlot::default();
        store.append_chunk("wf", 1, slot.clone(), "Hel".into());
        let deadline = Instant::now() + Duration::from_secs(10);
        while slot.get().is_none() {
            assert!(Instant::now() < deadline, "not written within 10 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(last_writer(&engine), WRITER_THREAD);
    }

    /// A later chunk of an attempt does not read the step's version index: a row there that
    /// does not decode refuses the first chunk of an attempt (which needs it) and none after.
    #[tokio::test]
    async fn a_later_chunk_of_an_attempt_leaves_the_version_index_unread() {
        let (store, engine) = store();
        store.commit(start("wf")).await.unwrap();
        let slot = VersionSlot::default();
        store.append_chunk("wf", 1, slot.clone(), "Hel".into());
        store.append_stream("wf", Vec::new()).await.unwrap();
        assert_eq!(slot.get(), Some(1));
        let index = Write::Put(Table::StreamSteps, journal_key("wf", 1), b"x".to_vec());
        engine.write(vec![index], true).unwrap();
        store.append_chunk("wf", 1, slot.clone(), "lo".into());
        store.append_chunk("wf", 1, VersionSlot::default(), "other".into());
        store.append_stream("wf", Vec::new()).await.unwrap();
        let texts: Vec<String> = store
            .stream("wf", 0)
            .unwrap()
            .into_iter()
            .filter_map(|event| match event.item {
                StreamItem::Chunk { text, .. } => Some(text),
                _ => None,
            })
            .collect();
        assert_eq!(texts, ["Hel", "lo"]);
    }

    fn signal(id: &str) -> InboxMessage {
        InboxMessage {
            name: "go".into(),
            signal_id: id.into(),
            payload: Payload::unit(),
            sent_at_ms: 0,
            sender: None,
        }
    }

    /// A run that read its inbox as far as `inbox_read_up_to`, under code of digest 7, waiting
    /// for no timer, listening for `go`.
    fn parking(inbox_read_up_to: u64) -> Parking {
        Parking {
            inbox_read_up_to,
            code_digest: 7,
            timers: Vec::new(),
            listening: vec!["go".into()],
        }
    }

    fn named(name: &str, id: &str) -> InboxMessage {
        InboxMessage {
            name: name.into(),
            ..signal(id)
        }
    }

    #[tokio::test]
    async fn a_signal_no_wait_listens_for_leaves_the_mark() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        store.mark_parked("wf", parking(0)).await.unwrap();
        let mark = store.parked_mark("wf").unwrap().unwrap();
        assert_eq!(mark.listening, Some(vec!["go".to_owned()]));
        assert!(mark.wakes_for("go") && !mark.wakes_for("note"));
        store.send_signal("wf", named("note", "n-1")).await.unwrap();
        assert!(is_parked(&store, "wf"), "no wait listens for `note`");
        store.send_signal("wf", named("go", "g-1")).await.unwrap();
        assert!(!is_parked(&store, "wf"), "a wait listens for `go`");
        assert_eq!(store.parked_mark("wf").unwrap(), None);
    }

    #[test]
    fn a_mark_of_format_1_is_woken_by_any_signal() {
        let mut v1 = vec![1];
        v1.extend(postcard::to_allocvec(&7u64).unwrap());
        let mark: ParkedMark = decode_record(&v1).unwrap();
        assert_eq!(mark.code_digest, 7);
        assert_eq!(mark.listening, None);
        assert!(mark.wakes_for("anything"));
    }

    fn is_parked(store: &MemoryStore, workflow_id: &str) -> bool {
        store.parked().unwrap().contains_key(workflow_id)
    }

    #[tokio::test]
    async fn a_signal_the_run_has_not_read_keeps_it_from_being_marked_parked() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        store.send_signal("wf", signal("s-1")).await.unwrap();
        store.mark_parked("wf", parking(0)).await.unwrap();
        assert!(!is_parked(&store, "wf"), "arrival 1 was not read");
        store.mark_parked("wf", parking(1)).await.unwrap();
        assert_eq!(
            store.parked().unwrap().get("wf"),
            Some(&7),
            "every arrival read"
        );
        store.send_signal("wf", signal("s-2")).await.unwrap();
        assert!(!is_parked(&store, "wf"), "a signal kept deletes the mark");
    }

    #[tokio::test]
    async fn a_write_for_a_parked_workflow_deletes_its_mark_unless_told_none_is_left() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        store.mark_parked("wf", parking(0)).await.unwrap();
        let mut knows_none_left = append(1);
        knows_none_left.unpark = false;
        store.commit(knows_none_left).await.unwrap();
        assert!(is_parked(&store, "wf"));
        store.commit(append(2)).await.unwrap();
        assert!(
            !is_parked(&store, "wf"),
            "a write deletes the mark by default"
        );
    }

    #[tokio::test]
    async fn a_run_waiting_for_a_timer_without_a_row_is_not_marked_parked() {
        let (store, _) = store();
        let timer = TimerKey {
            fire_at_ms: 60_000,
            workflow_id: "wf".into(),
            seq: 1,
        };
        let waits = Parking {
            timers: vec![timer.clone()],
            ..parking(0)
        };
        store.commit(start("wf")).await.unwrap();
        store.mark_parked("wf", waits.clone()).await.unwrap();
        assert!(
            !is_parked(&store, "wf"),
            "armed in memory only: only a rebuild wakes it"
        );
        let mut arms = append(1);
        arms.add_timers.push(timer);
        store.commit(arms).await.unwrap();
        store.mark_parked("wf", waits).await.unwrap();
        assert!(is_parked(&store, "wf"), "its row wakes it");
    }

    #[tokio::test]
    async fn an_ended_workflow_is_not_marked_parked() {
        let (store, _) = store();
        store.commit(start("wf")).await.unwrap();
        let mut end = append(1);
        end.record.status = WorkflowStatus::Completed;
        store.commit(end).await.unwrap();
        store.mark_parked("wf", parking(0)).await.unwrap();
        assert!(!is_parked(&store, "wf"));
    }
}
