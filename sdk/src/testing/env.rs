//! [`TestEnv`]: a worker on a temporary store that tests crash and restart: RocksDB in a
//! temporary directory, or a fresh schema of a PostgreSQL database (see [`TestEnv::start`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use waymark_runtime::journal::Entry;
use waymark_runtime::store::{RocksStore, Store, StoreError};
use waymark_runtime::telemetry::{MetricSet, Telemetry};

use super::{FaultPlan, PlannedFault};
use crate::{ManualClock, Worker, WorkerBuilder};

type Setup = Arc<dyn Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync>;

/// A worker on a temporary store with a manual clock, which tests can crash and restart.
pub struct TestEnv {
    dir: tempfile::TempDir,
    backend: Backend,
    clock: ManualClock,
    setup: Setup,
    worker: Option<Worker>,
    faults: Arc<FaultPlan>,
    telemetry: Telemetry,
}

impl TestEnv {
    /// Starts a worker configured by `setup` (register workflows and activities there; it runs
    /// again on every restart).
    ///
    /// The store is RocksDB in a temporary directory. With `WAYMARK_TEST_BACKEND=postgres`
    /// (and the `postgres` feature) it is a fresh schema of the database at
    /// `WAYMARK_TEST_DATABASE_URL` instead, so that the same scenario runs on both backends; a
    /// restart there is a new worker (a new registration) claiming what the stopped one held.
    pub async fn start(
        setup: impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync + 'static,
    ) -> Result<Self, StoreError> {
        let dir = tempfile::tempdir()
            .map_err(|e| StoreError::Backend(format!("cannot create a temp dir: {e}")))?;
        let mut env = Self {
            dir,
            backend: Backend::from_env()?,
            clock: ManualClock::default(),
            setup: Arc::new(setup),
            worker: None,
            faults: Arc::default(),
            telemetry: Telemetry::new(),
        };
        env.boot().await?;
        Ok(env)
    }

    /// [`TestEnv::start`] with faults to inject at named boundaries of activity attempts; an
    /// injected crash is a real one: [`TestEnv::finish`] drops the worker and starts a new one
    /// on the same store.
    pub async fn with_faults(
        faults: impl IntoIterator<Item = PlannedFault>,
        setup: impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync + 'static,
    ) -> Result<Self, StoreError> {
        let mut env = Self::start(setup).await?;
        for fault in faults {
            env.faults.add(fault);
        }
        env.crash_and_restart().await?;
        Ok(env)
    }

    /// The replay-safety metrics of every worker this environment started: they are counted
    /// across crashes and restarts.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// The figures of [`TestEnv::telemetry`], parsed: `env.metrics().value(name, &[labels])`.
    pub fn metrics(&self) -> MetricSet {
        self.telemetry.snapshot()
    }

    /// The fault plan: what fired, what is still pending.
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// Drives `workflow_id` to its end: restarts the worker after every injected crash and,
    /// whenever the workflow stands still, moves the clock by half a second so that retries,
    /// rechecks and timers fire. `None` once the clock moved `idle_rounds` times without the
    /// workflow ending (it waits for a person, say), or after a minute of real time.
    ///
    /// The clock moves only while the workflow stands still: its journal did not grow and no
    /// attempt of it is running (or one has run for a while of real time without an answer,
    /// which a test may mean: an attempt that hangs until its timeout). On a slow or busy
    /// machine a workflow that is still working is left to work, instead of seeing time pass
    /// that its steps never saw.
    ///
    /// # Panics
    /// If the worker does not come back after an injected crash, with the reason.
    pub async fn finish<W: crate::Workflow + Clone>(
        &mut self,
        workflow: W,
        workflow_id: &str,
        idle_rounds: usize,
    ) -> Option<Result<W::Output, crate::RunError>> {
        /// How long a running attempt may go without an answer before the clock moves.
        const STILL: Duration = Duration::from_millis(250);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut idle = 0;
        let mut journal_len = self.journal_len(workflow_id);
        let mut still_since = tokio::time::Instant::now();
        while idle < idle_rounds && tokio::time::Instant::now() < deadline {
            let handle = self.worker().handle(workflow.clone(), workflow_id);
            let waited = tokio::time::timeout(Duration::from_millis(5), handle.result()).await;
            let crashed = self.faults.take_crashes();
            if !crashed.is_empty() {
                self.until_stopped(crashed, deadline).await;
                // A test cannot go on without its worker: say why it did not come back, rather
                // than leave the next call to find it missing.
                if let Err(error) = self.crash_and_restart().await {
                    panic!("the worker did not restart on its store after a crash: {error}");
                }
                still_since = tokio::time::Instant::now();
                continue;
            }
            match waited {
                Ok(Err(crate::RunError::Crashed(_))) => {
                    // A crash already handled: its stale answer comes back until the restarted
                    // run answers. Bounded by the deadline, not counted as standing still.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Ok(outcome) => return Some(outcome),
                Err(_) => {
                    let now = self.journal_len(workflow_id);
                    if now != journal_len {
                        journal_len = now;
                        still_since = tokio::time::Instant::now();
                    } else if !self.is_running(workflow_id).await || still_since.elapsed() >= STILL
                    {
                        idle += 1;
                        self.advance(Duration::from_millis(500)).await;
                        still_since = tokio::time::Instant::now();
                    }
                }
            }
        }
        None
    }

    /// Waits until the runs of `workflow_ids` have stopped at the crash planned in them, so the
    /// process dies where the plan says: an attempt's crash stops its run when the executor
    /// handles it, after the write the executor had under way (an attempt runs beside the
    /// write that journals it as scheduled). Bounded by five seconds and by `deadline`; a run
    /// that never reports is named on stderr, and the worker restarts all the same.
    async fn until_stopped(&self, mut workflow_ids: Vec<String>, deadline: tokio::time::Instant) {
        let Some(worker) = self.worker.as_ref() else {
            return;
        };
        workflow_ids.sort();
        workflow_ids.dedup();
        let stopped = workflow_ids.iter().map(|id| worker.runtime().result(id));
        let limit = deadline.min(tokio::time::Instant::now() + Duration::from_secs(5));
        let waited = tokio::time::timeout_at(limit, futures::future::join_all(stopped)).await;
        if waited.is_err() {
            eprintln!(
                "a run did not stop at its planned crash: {workflow_ids:?}; restarting anyway"
            );
        }
    }

    /// Whether an attempt of the workflow is running: asked of its executor, which answers
    /// after the events it has queued, so a delivered answer counts as handled.
    async fn is_running(&self, workflow_id: &str) -> bool {
        let Some(worker) = self.worker.as_ref() else {
            return false;
        };
        // A run too busy to answer within a second is running.
        let asked = tokio::time::timeout(Duration::from_secs(1), worker.footprint(workflow_id));
        match asked.await {
            Ok(footprint) => footprint.is_some_and(|footprint| footprint.running > 0),
            Err(_) => true,
        }
    }

    fn journal_len(&self, workflow_id: &str) -> Option<usize> {
        let worker = self.worker.as_ref()?;
        worker
            .journal(workflow_id)
            .ok()
            .map(|journal| journal.len())
    }

    /// The workflow's record for a snapshot test: journal, operation log, pending approvals and
    /// a summary of its stream, with times, durations and generated values redacted.
    pub fn journal(&self, workflow_id: &str) -> Result<String, StoreError> {
        let worker = self.worker();
        let journal = worker.render_journal(workflow_id)?;
        let operations = worker.render_operations(workflow_id)?;
        let approvals = worker.pending_approvals(workflow_id)?;
        let approvals: Vec<String> = approvals
            .iter()
            .map(|a| format!("pending {} risk={}\n", a.artifact_hash, a.risk))
            .collect();
        let stream = worker.stream(workflow_id, 0)?;
        let summary = waymark_runtime::streams::summarize_stream(&stream);
        Ok(format!(
            "{journal}--- operations\n{operations}--- approvals\n{}--- stream\n{summary}",
            approvals.concat()
        ))
    }

    /// The running worker.
    ///
    /// # Panics
    /// If called between [`TestEnv::stop`] and [`TestEnv::boot`]: a test bug.
    pub fn worker(&self) -> &Worker {
        self.worker
            .as_ref()
            .expect("the worker is stopped; call boot() first")
    }

    /// The manual clock every worker of this environment uses.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    /// Moves the clock forward, then lets due timers fire.
    pub async fn advance(&self, by: Duration) {
        self.clock.advance(by);
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    /// Waits (up to `within` of real time) until `workflow_id` waits on a durable timer that has
    /// not fired, so that advancing the clock next is sure to fire it. `false` if it never did.
    pub async fn wait_for_timer(&self, workflow_id: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.has_pending_timer(workflow_id) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn has_pending_timer(&self, workflow_id: &str) -> bool {
        let Some(worker) = self.worker.as_ref() else {
            return false;
        };
        let journal = worker.journal(workflow_id).unwrap_or_default();
        let started = journal.iter().filter_map(|e| match e {
            Entry::TimerStarted { seq, .. } => Some(*seq),
            _ => None,
        });
        let fired: Vec<u32> = journal
            .iter()
            .filter_map(|e| match e {
                Entry::TimerFired { seq } | Entry::TimerFiredAt { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        started.into_iter().any(|seq| !fired.contains(&seq))
    }

    /// The data directory (of the RocksDB backend; empty on PostgreSQL).
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Aborts every task of the worker wherever it is and closes the store: every run is left
    /// where a killed process leaves it. The store itself closes cleanly (on RocksDB its
    /// memtables are flushed); a killed process's store recovers from its log instead, which
    /// the tests that kill a worker with SIGKILL exercise.
    pub async fn stop(&mut self) {
        if let Some(worker) = self.worker.take() {
            worker.shutdown().await;
        }
    }

    /// Starts a new worker on the same store; it recovers every in-flight workflow.
    pub async fn boot(&mut self) -> Result<(), StoreError> {
        let builder = match self.backend.shared_store().await? {
            Some(store) => Worker::builder().store(store),
            None => Worker::builder().data_dir(self.dir.path()),
        };
        let builder = builder
            .clock(self.clock.clone())
            .evict_after(Duration::from_secs(60))
            .faults(self.faults.clone())
            .telemetry(self.telemetry.clone());
        let worker = (self.setup)(builder).build().await?;
        self.worker = Some(worker);
        Ok(())
    }

    /// Stops the worker and starts one configured by `setup` instead: a deploy of changed
    /// workflow code over the same store.
    pub async fn boot_with(
        &mut self,
        setup: impl Fn(WorkerBuilder) -> WorkerBuilder + Send + Sync + 'static,
    ) -> Result<(), StoreError> {
        self.stop().await;
        self.setup = Arc::new(setup);
        self.boot().await
    }

    /// [`TestEnv::stop`] then [`TestEnv::boot`].
    pub async fn crash_and_restart(&mut self) -> Result<(), StoreError> {
        self.stop().await;
        self.boot().await
    }

    /// Overwrites one journal record with `bytes`, bypassing every check, to prove that a
    /// corrupt record is reported and contained. The worker must be stopped.
    pub fn overwrite_journal_record(
        &self,
        workflow_id: &str,
        index: u64,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        if !matches!(self.backend, Backend::Rocks) {
            return Err(StoreError::Backend(
                "overwriting a record bypasses the store: RocksDB only".into(),
            ));
        }
        let store = RocksStore::open(self.dir.path())?;
        store.overwrite_journal_record(workflow_id, index, bytes)
    }

    /// Whether the store is RocksDB (the default), for a test that reaches beneath the store.
    pub fn on_rocksdb(&self) -> bool {
        matches!(self.backend, Backend::Rocks)
    }
}

/// Where a [`TestEnv`] keeps its store.
enum Backend {
    Rocks,
    #[cfg(feature = "postgres")]
    Postgres(waymark_runtime::store::PgOptions),
}

impl Backend {
    /// As `WAYMARK_TEST_BACKEND` says: `rocksdb` (or unset) or `postgres`.
    fn from_env() -> Result<Self, StoreError> {
        match std::env::var("WAYMARK_TEST_BACKEND").as_deref() {
            Err(_) | Ok("" | "rocksdb") => Ok(Self::Rocks),
            #[cfg(feature = "postgres")]
            Ok("postgres") => Self::fresh_schema(),
            Ok(other) => Err(StoreError::Backend(format!(
                "WAYMARK_TEST_BACKEND=`{other}`: use `rocksdb`, or `postgres` with the `postgres` feature"
            ))),
        }
    }

    /// A schema no other environment uses, on the database at `WAYMARK_TEST_DATABASE_URL`.
    #[cfg(feature = "postgres")]
    fn fresh_schema() -> Result<Self, StoreError> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let url = std::env::var("WAYMARK_TEST_DATABASE_URL").map_err(|_| {
            StoreError::Backend(
                "WAYMARK_TEST_BACKEND=postgres needs WAYMARK_TEST_DATABASE_URL".into(),
            )
        })?;
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let mut options = waymark_runtime::store::PgOptions::new(url);
        options.schema = Some(format!(
            "waymark_env_{}_{}_{}",
            std::process::id(),
            since_epoch.as_micros() % 1_000_000_000,
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // Short, for a test that leaves a worker to lapse; a stopped worker lets go at once.
        options.lease = Duration::from_secs(5);
        options.pool_size = 2;
        Ok(Self::Postgres(options))
    }

    /// A new connection to the shared store, or `None` for RocksDB (the worker opens it).
    async fn shared_store(&self) -> Result<Option<Arc<dyn Store>>, StoreError> {
        match self {
            Self::Rocks => Ok(None),
            #[cfg(feature = "postgres")]
            Self::Postgres(options) => {
                let options = options.clone();
                let connect = move || waymark_runtime::store::PgStore::connect(&options, None);
                let store = tokio::task::spawn_blocking(connect)
                    .await
                    .map_err(|e| StoreError::Backend(format!("connect task failed: {e}")))??;
                Ok(Some(Arc::new(store)))
            }
        }
    }
}
