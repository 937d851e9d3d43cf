//! A store for tests that watch the worker's use of it: the embedded RocksDB store, which
//! records every read made on an async thread (the worker promises none), can be told to fail
//! its stream reads, and can hold back the write that records a run as stuck.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use waymark::store::{
    is_off_async_thread, ArtifactRecord, ChunkWriter, Digest, Entry, InboxMessage,
    OperationListing, OperationRecord, PendingWrite, RocksStore, Seq, Store, StoreError,
    StreamEvent, StreamItem, SummaryListing, TimerKey, Transition, VersionSlot, WorkflowListing,
    WorkflowRecord, WorkflowStatus, WriteStats,
};

/// RocksDB, watched.
pub struct WatchedStore {
    inner: Arc<RocksStore>,
    on_async_threads: Mutex<Vec<&'static str>>,
    fail_streams: AtomicBool,
    stuck_gate: Mutex<Option<StuckGate>>,
    stream_reads: Mutex<Vec<u64>>,
    /// How many events each stream read returned.
    stream_rows: Mutex<Vec<usize>>,
    /// How many entries each journal page read returned.
    journal_rows: Mutex<Vec<usize>>,
    /// How many signals each read of an inbox returned (`Store::inbox`, `Store::inbox_named`).
    inbox_rows: Mutex<Vec<usize>>,
    read_delay: Mutex<std::time::Duration>,
    /// Reads of the operation log on the blocking pool's side (`Store::operation`).
    operation_reads: std::sync::atomic::AtomicUsize,
    /// Reads of a whole journal (`Store::journal`), as a rebuild by replay makes.
    journal_reads: std::sync::atomic::AtomicUsize,
    /// Reads of a workflow's record (`Store::workflow`).
    record_reads: std::sync::atomic::AtomicUsize,
    /// Reads of a parked mark on the blocking pool's side (`Store::parked_mark`).
    mark_reads: std::sync::atomic::AtomicUsize,
    /// Reads under way now, and the most there were at once since the last look.
    reads_under_way: std::sync::atomic::AtomicUsize,
    most_reads_at_once: std::sync::atomic::AtomicUsize,
}

/// Holds the next write of a stuck record until released.
struct StuckGate {
    reached: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

/// The test's side of a held stuck write.
pub struct HeldStuckWrite {
    reached: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl HeldStuckWrite {
    /// Waits until the worker tries to record a run as stuck.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the write go on.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

impl WatchedStore {
    /// Opens the RocksDB store in `dir`.
    pub fn open(dir: &std::path::Path) -> Result<Arc<Self>, StoreError> {
        Ok(Arc::new(Self {
            inner: Arc::new(RocksStore::open(dir)?),
            on_async_threads: Mutex::default(),
            fail_streams: AtomicBool::new(false),
            stuck_gate: Mutex::default(),
            stream_reads: Mutex::default(),
            stream_rows: Mutex::default(),
            journal_rows: Mutex::default(),
            inbox_rows: Mutex::default(),
            read_delay: Mutex::default(),
            operation_reads: Default::default(),
            journal_reads: Default::default(),
            mark_reads: Default::default(),
            record_reads: Default::default(),
            reads_under_way: Default::default(),
            most_reads_at_once: Default::default(),
        }))
    }

    /// The reads made outside the worker's off-thread reads, by method, since the last call.
    pub fn take_reads_on_async_threads(&self) -> Vec<&'static str> {
        let mut reads = self
            .on_async_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut reads)
    }

    /// How many times the operation log was read with [`Store::operation`] (not from memory).
    pub fn operation_reads(&self) -> usize {
        self.operation_reads.load(Ordering::SeqCst)
    }

    /// How many times a whole journal was read with [`Store::journal`].
    pub fn journal_reads(&self) -> usize {
        self.journal_reads.load(Ordering::SeqCst)
    }

    /// How many times a parked mark was read with [`Store::parked_mark`].
    pub fn mark_reads(&self) -> usize {
        self.mark_reads.load(Ordering::SeqCst)
    }

    /// How many times a workflow's record was read with [`Store::workflow`].
    pub fn record_reads(&self) -> usize {
        self.record_reads.load(Ordering::SeqCst)
    }

    /// The most reads that were under way at once since the last call (a read lasts at least
    /// its [`WatchedStore::delay_reads`]).
    pub fn take_most_reads_at_once(&self) -> usize {
        self.most_reads_at_once.swap(0, Ordering::SeqCst)
    }

    /// How many events each stream read since the last call returned.
    pub fn take_stream_rows(&self) -> Vec<usize> {
        let mut rows = self.stream_rows.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut rows)
    }

    /// How many entries each journal page read since the last call returned.
    pub fn take_journal_rows(&self) -> Vec<usize> {
        let mut rows = self.journal_rows.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut rows)
    }

    /// How many signals each inbox read since the last call returned.
    pub fn take_inbox_rows(&self) -> Vec<usize> {
        let mut rows = self.inbox_rows.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut rows)
    }

    /// Notes how many signals an inbox read returned, and passes it on.
    fn count_inbox_rows(
        &self,
        read: Result<Vec<(u64, InboxMessage)>, StoreError>,
    ) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        let messages = read?;
        let mut rows = self.inbox_rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.push(messages.len());
        Ok(messages)
    }

    /// Where each stream read since the last call started (its `after`), in order.
    pub fn take_stream_reads(&self) -> Vec<u64> {
        let mut reads = self.stream_reads.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut reads)
    }

    /// From now on, stream reads fail (or succeed again).
    pub fn fail_stream_reads(&self, fail: bool) {
        self.fail_streams.store(fail, Ordering::SeqCst);
    }

    /// Holds the next write that records a run as stuck until the returned handle releases it.
    pub fn hold_next_stuck_write(&self) -> HeldStuckWrite {
        let reached = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let gate = StuckGate {
            reached: reached.clone(),
            release: release.clone(),
        };
        *self.stuck_gate.lock().unwrap_or_else(|e| e.into_inner()) = Some(gate);
        HeldStuckWrite { reached, release }
    }

    /// From now on, every read takes `delay` more (a slow disk).
    pub fn delay_reads(&self, delay: std::time::Duration) {
        *self.read_delay.lock().unwrap_or_else(|e| e.into_inner()) = delay;
    }

    fn read(&self, method: &'static str) {
        let delay = *self.read_delay.lock().unwrap_or_else(|e| e.into_inner());
        let under_way = self.reads_under_way.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_reads_at_once
            .fetch_max(under_way, Ordering::SeqCst);
        std::thread::sleep(delay);
        self.reads_under_way.fetch_sub(1, Ordering::SeqCst);
        if !is_off_async_thread() && tokio::runtime::Handle::try_current().is_ok() {
            let mut reads = self
                .on_async_threads
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            reads.push(method);
        }
    }
}

impl Store for WatchedStore {
    fn workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRecord>, StoreError> {
        self.read("workflow");
        self.record_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.workflow(workflow_id)
    }

    fn workflows(&self) -> Result<WorkflowListing, StoreError> {
        self.read("workflows");
        self.inner.workflows()
    }

    fn workflow_summaries(&self) -> Result<SummaryListing, StoreError> {
        self.read("workflow_summaries");
        self.inner.workflow_summaries()
    }

    fn journal_page(
        &self,
        workflow_id: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        self.read("journal_page");
        let entries = self.inner.journal_page(workflow_id, from, limit)?;
        let mut rows = self.journal_rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.push(entries.len());
        Ok(entries)
    }

    fn journal(&self, workflow_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.read("journal");
        self.journal_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.journal(workflow_id)
    }

    fn request(&self, request_id: &str) -> Result<Option<String>, StoreError> {
        self.read("request");
        self.inner.request(request_id)
    }

    fn timers(&self) -> Result<Vec<TimerKey>, StoreError> {
        self.read("timers");
        self.inner.timers()
    }

    fn operation(&self, key: &str) -> Result<Option<OperationRecord>, StoreError> {
        self.read("operation");
        self.operation_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.operation(key)
    }

    /// Not watched: a read the engine answers from memory may be made on an async thread.
    fn operation_in_memory(
        &self,
        key: &str,
    ) -> Option<Result<Option<OperationRecord>, StoreError>> {
        self.inner.operation_in_memory(key)
    }

    fn operations(&self, prefix: &str) -> Result<OperationListing, StoreError> {
        self.read("operations");
        self.inner.operations(prefix)
    }

    fn unsettled_operations(&self, prefix: &str) -> Result<OperationListing, StoreError> {
        self.read("unsettled_operations");
        self.inner.unsettled_operations(prefix)
    }

    fn artifact(
        &self,
        namespace: &str,
        hash: &Digest,
    ) -> Result<Option<ArtifactRecord>, StoreError> {
        self.read("artifact");
        self.inner.artifact(namespace, hash)
    }

    fn inbox(&self, workflow_id: &str, after: u64) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        self.read("inbox");
        self.count_inbox_rows(self.inner.inbox(workflow_id, after))
    }

    fn inbox_named(
        &self,
        workflow_id: &str,
        name: &str,
    ) -> Result<Vec<(u64, InboxMessage)>, StoreError> {
        self.read("inbox_named");
        self.count_inbox_rows(self.inner.inbox_named(workflow_id, name))
    }

    fn inbox_holds_named(&self, workflow_id: &str, names: &[String]) -> Result<bool, StoreError> {
        self.read("inbox_holds_named");
        self.inner.inbox_holds_named(workflow_id, names)
    }

    fn inbox_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.read("inbox_last");
        self.inner.inbox_last(workflow_id)
    }

    fn signal_seen(&self, workflow_id: &str, signal_id: &str) -> Result<bool, StoreError> {
        self.read("signal_seen");
        self.inner.signal_seen(workflow_id, signal_id)
    }

    fn send_signal(&self, workflow_id: &str, message: InboxMessage) -> PendingWrite {
        self.inner.send_signal(workflow_id, message)
    }

    fn mark_parked(&self, workflow_id: &str, parking: waymark::store::Parking) -> PendingWrite {
        self.inner.mark_parked(workflow_id, parking)
    }

    fn parked(&self) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        self.read("parked");
        self.inner.parked()
    }

    fn parked_mark(
        &self,
        workflow_id: &str,
    ) -> Result<Option<waymark::store::ParkedMark>, StoreError> {
        self.read("parked_mark");
        self.mark_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.parked_mark(workflow_id)
    }

    fn parked_mark_in_memory(
        &self,
        workflow_id: &str,
    ) -> Option<Result<Option<waymark::store::ParkedMark>, StoreError>> {
        self.inner.parked_mark_in_memory(workflow_id)
    }

    fn stream_last(&self, workflow_id: &str) -> Result<u64, StoreError> {
        self.read("stream_last");
        self.inner.stream_last(workflow_id)
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
        self.read("stream");
        let mut reads = self.stream_reads.lock().unwrap_or_else(|e| e.into_inner());
        reads.push(after);
        drop(reads);
        if self.fail_streams.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected: the disk is gone".into()));
        }
        let events = self.inner.stream_page(workflow_id, after, limit)?;
        let mut rows = self.stream_rows.lock().unwrap_or_else(|e| e.into_inner());
        rows.push(events.len());
        Ok(events)
    }

    fn stream_acks(&self, workflow_id: &str) -> Result<Vec<(String, u64)>, StoreError> {
        self.read("stream_acks");
        self.inner.stream_acks(workflow_id)
    }

    fn acknowledge_stream(&self, workflow_id: &str, channel: &str, event: u64) -> PendingWrite {
        self.inner.acknowledge_stream(workflow_id, channel, event)
    }

    fn watch_stream(&self, workflow_id: &str) -> Option<tokio::sync::watch::Receiver<()>> {
        self.inner.watch_stream(workflow_id)
    }

    fn write_stats(&self) -> Option<WriteStats> {
        Some(self.inner.write_stats())
    }

    fn commit(&self, transition: Transition) -> PendingWrite {
        let gate = if transition.record.status == WorkflowStatus::Stuck {
            self.stuck_gate
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
        } else {
            None
        };
        let Some(gate) = gate else {
            return self.inner.commit(transition);
        };
        let inner = self.inner.clone();
        PendingWrite::later(async move {
            gate.reached.notify_one();
            let _ = gate.release.acquire().await;
            inner.commit(transition).await
        })
    }

    fn append_stream(&self, workflow_id: &str, items: Vec<StreamItem>) -> PendingWrite {
        self.inner.append_stream(workflow_id, items)
    }

    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<&(u64, String)>,
        limit: usize,
    ) -> Result<Vec<(u64, String)>, StoreError> {
        self.read("ended_before");
        self.inner.ended_before(before_ms, after, limit)
    }

    fn delete_workflow(&self, workflow_id: &str, artifacts: Vec<Digest>) -> PendingWrite {
        self.inner.delete_workflow(workflow_id, artifacts)
    }

    fn settle_ended_operation(
        &self,
        key: &str,
        decided: waymark::operations::OperationRecord,
        settled: waymark::operations::OperationRecord,
    ) -> PendingWrite {
        self.inner.settle_ended_operation(key, decided, settled)
    }
}

impl ChunkWriter for WatchedStore {
    fn append_chunk(&self, workflow_id: &str, step: Seq, version: VersionSlot, text: String) {
        self.inner.append_chunk(workflow_id, step, version, text)
    }
}
