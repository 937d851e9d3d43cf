//! PostgreSQL as the store's [`Engine`], for many workers on one database.
//!
//! The store's tables are rows of one table, `waymark_rows (tbl, key, value)`, ordered by key
//! as RocksDB orders them (bytea compares bytewise), so that every key, check and read of
//! [`KvStore`] works unchanged. What only a shared database needs sits beside it:
//!
//! - **Transactions that hold still.** The writer's group of jobs is staged and written in one
//!   transaction ([`Engine::transact`]), which first takes an advisory lock on every workflow
//!   id, request id and idempotency key the group touches (sorted, so two writers cannot
//!   deadlock): what the checks read cannot change before the batch commits, whichever worker
//!   writes next. One commit per group: concurrent workflows share its WAL flush.
//! - **Leases and fencing.** `waymark_leases (workflow_id, owner, epoch)` names each running
//!   workflow's owner; `waymark_workers (worker_id, expires_at)` is each worker's
//!   registration, renewed by its heartbeat against the database's clock. A change to a
//!   workflow is checked against the lease in the same transaction, the row share-locked until
//!   commit ([`Reads::fence`]); a claim takes a lapsed worker's leases with `FOR UPDATE SKIP
//!   LOCKED` and a new epoch, so the old owner's next write is refused.
//! - **Wake-ups.** `NOTIFY waymark_wake` carries a workflow id to whichever worker holds it.
//! - **Relayed commands.** `waymark_commands` carries a decision, a cancellation or a
//!   resolution to a workflow's owner, and its answer back (see `relay`).
//! - **Migrations.** Versioned, each in the transaction that records it, behind an advisory
//!   lock, so that workers starting at once apply each exactly once.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{
    Arc, Condvar, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError,
};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use sha2::{Digest as _, Sha256};
use tokio_postgres::{Client, NoTls, Statement, Transaction};

mod relay;

use super::coded::CodecEngine;
use super::engine::{Engine, Locks, Ownership, Reads, Row, Stage, Write};
use super::leases::{LeaseStats, Leases, RelayFuture, RelayedCommand, SignalTake, Wakeup};
use super::{layout, KvStore, StoreError, Table};
use crate::codec::Codec;
use crate::sync::lock;

/// The store on PostgreSQL: values sealed by a codec when it has one.
pub type PgStore = KvStore<CodecEngine<PgEngine>>;

/// How to reach the database and how long a worker's leases last.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// A libpq-style connection string or `postgres://` URL.
    pub url: String,
    /// How long a worker's registration, and with it every lease it holds, lasts without a
    /// heartbeat. The worker heartbeats at a third of it; a dead worker's workflows wait this
    /// long before another worker claims them.
    pub lease: Duration,
    /// Connections kept for reads (the writer and the listener have one each).
    pub pool_size: usize,
    /// This worker's id, as owners are named (default: host, process id and a random suffix).
    pub worker_id: Option<String>,
    /// The schema Waymark's tables live in (created if missing; default: the connection's
    /// `search_path`). Letters, digits and `_` only.
    pub schema: Option<String>,
}

impl PgOptions {
    /// Defaults for `url`: a 30 s lease, 8 read connections.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            lease: Duration::from_secs(30),
            pool_size: 8,
            worker_id: None,
            schema: None,
        }
    }
}

/// Migrations, in order: a version is applied once, in the transaction that records it.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "rows, workers and leases",
        "CREATE TABLE waymark_rows (
         tbl smallint NOT NULL,
         key bytea NOT NULL,
         value bytea NOT NULL,
         PRIMARY KEY (tbl, key)
     );
     CREATE TABLE waymark_workers (
         worker_id text PRIMARY KEY,
         started_at timestamptz NOT NULL DEFAULT now(),
         expires_at timestamptz NOT NULL
     );
     CREATE TABLE waymark_leases (
         workflow_id text PRIMARY KEY,
         owner text,
         epoch bigint NOT NULL
     );
     CREATE INDEX waymark_leases_by_owner ON waymark_leases (owner);",
    ),
    (
        2,
        "commands relayed to a workflow's owner",
        "CREATE TABLE waymark_commands (
             id bigserial PRIMARY KEY,
             workflow_id text NOT NULL,
             command bytea NOT NULL,
             taken_by text,
             answer bytea,
             sent_at timestamptz NOT NULL DEFAULT now()
         );
         CREATE INDEX waymark_commands_waiting ON waymark_commands (workflow_id)
             WHERE taken_by IS NULL;",
    ),
    (
        3,
        "relayed commands by age, for the sweep of orphans",
        "CREATE INDEX waymark_commands_by_age ON waymark_commands (sent_at);",
    ),
    (
        4,
        "workflows parked until their timer is due",
        "ALTER TABLE waymark_leases ADD COLUMN parked_until_ms bigint NOT NULL DEFAULT 0;
         CREATE INDEX waymark_leases_parked ON waymark_leases (parked_until_ms)
             WHERE owner IS NULL;",
    ),
    // The epoch the names were written at: a worker of an older build parks without
    // writing them, after a take that moved the epoch on, so names left from an earlier
    // park are not taken for its.
    (
        5,
        "the signal names a parked workflow listens for",
        "ALTER TABLE waymark_leases ADD COLUMN listening text[],
             ADD COLUMN listening_epoch bigint;",
    ),
];

/// The advisory lock migrations run under (any constant no other lock of ours hashes to).
const MIGRATION_LOCK: i64 = 0x7761_796d_6172_6b00;

/// The channel wake-ups travel on.
const WAKE_CHANNEL: &str = "waymark_wake";

/// Most leases taken in one claim.
const CLAIM_PAGE: i64 = 512;

/// Prepared statements of one connection.
struct Statements {
    get: Statement,
    get_many: Statement,
    scan_bounded: Statement,
    scan_open: Statement,
    last: Statement,
    put: Statement,
    delete: Statement,
    delete_range: Statement,
    lock: Statement,
    lease_share: Statement,
    lease_begin: Statement,
    lease_end: Statement,
}

impl Statements {
    fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let prepare = |sql: &str| block_on(client.prepare(sql));
        Ok(Self {
            get: prepare("SELECT value FROM waymark_rows WHERE tbl = $1 AND key = $2")?,
            get_many: prepare(
                "SELECT key, value FROM waymark_rows WHERE tbl = $1 AND key = ANY($2::bytea[])",
            )?,
            scan_bounded: prepare(
                "SELECT key, value FROM waymark_rows WHERE tbl = $1 AND key >= $2 AND key < $3 \
                 ORDER BY key LIMIT $4",
            )?,
            scan_open: prepare(
                "SELECT key, value FROM waymark_rows WHERE tbl = $1 AND key >= $2 \
                 ORDER BY key LIMIT $3",
            )?,
            last: prepare(
                "SELECT key, value FROM waymark_rows WHERE tbl = $1 AND key >= $2 AND key <= $3 \
                 ORDER BY key DESC LIMIT 1",
            )?,
            put: prepare(
                "INSERT INTO waymark_rows (tbl, key, value) \
                 SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
                 ON CONFLICT (tbl, key) DO UPDATE SET value = EXCLUDED.value",
            )?,
            delete: prepare(
                "DELETE FROM waymark_rows AS r \
                 USING unnest($1::int2[], $2::bytea[]) AS d (tbl, key) \
                 WHERE r.tbl = d.tbl AND r.key = d.key",
            )?,
            delete_range: prepare(
                "DELETE FROM waymark_rows WHERE tbl = $1 AND key >= $2 AND key < $3",
            )?,
            lock: prepare(
                "SELECT pg_advisory_xact_lock(k) FROM unnest($1::int8[]) AS k ORDER BY k",
            )?,
            lease_share: prepare(
                "SELECT owner, epoch FROM waymark_leases WHERE workflow_id = $1 FOR SHARE",
            )?,
            lease_begin: prepare(
                "INSERT INTO waymark_leases (workflow_id, owner, epoch) VALUES ($1, $2, 1) \
                 ON CONFLICT (workflow_id) DO NOTHING",
            )?,
            lease_end: prepare(
                "DELETE FROM waymark_leases WHERE workflow_id = $1 AND owner = $2 AND epoch = $3",
            )?,
        })
    }
}

/// A connection with its statements.
struct Connection {
    client: Client,
    statements: Statements,
}

impl Connection {
    fn open(driver: &Driver, url: &str) -> Result<Self, StoreError> {
        let client = driver.connect(url, None)?;
        driver.prepare_session(&client)?;
        let statements = Statements::prepare(&client).map_err(backend)?;
        Ok(Self { client, statements })
    }
}

/// The runtime that drives every connection's I/O, so that the engine's blocking calls work
/// from any thread (a caller's future is polled where it blocks; only the connection needs
/// tokio's reactor).
struct Driver {
    runtime: Option<tokio::runtime::Runtime>,
    schema: Option<String>,
    /// How long a session may sit in an open transaction, or wait for a lock: a worker frozen
    /// mid-transaction (paused, swapped out, partitioned) would otherwise hold its locks, and
    /// with them its successor, for as long as it stays frozen.
    stall_limit: Duration,
    /// The worker id, as every connection's `application_name`: `pg_stat_activity` shows whose
    /// session is whose.
    worker_id: String,
}

impl Driver {
    fn new(
        schema: Option<String>,
        stall_limit: Duration,
        worker_id: String,
    ) -> Result<Self, StoreError> {
        if let Some(bad) = schema.as_ref().filter(|name| !is_plain_name(name)) {
            return Err(StoreError::Backend(format!(
                "schema `{bad}`: use letters, digits and `_`, starting with a letter"
            )));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("waymark-pg")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Backend(format!("cannot start the database runtime: {e}")))?;
        Ok(Self {
            runtime: Some(runtime),
            schema,
            stall_limit,
            worker_id,
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        // Taken only when dropped.
        let runtime = self.runtime.as_ref();
        runtime
            .map(tokio::runtime::Runtime::handle)
            .expect("driver runtime")
    }

    /// Points `client` at the configured schema, bounds how long it may stall, and reads at
    /// read committed whatever the database's default: a transaction's checks read after its
    /// advisory locks are granted, and must see what the writer that held them committed. At
    /// repeatable read the snapshot would be taken by the lock statement, before the wait.
    fn prepare_session(&self, client: &Client) -> Result<(), StoreError> {
        // At least a second, so that a slow round trip under load is not taken for a stall.
        let limit_ms = self.stall_limit.as_millis().max(1_000);
        let mut sql = format!(
            "SET idle_in_transaction_session_timeout = {limit_ms}; SET lock_timeout = {limit_ms}; \
             SET default_transaction_isolation = 'read committed'"
        );
        if let Some(schema) = &self.schema {
            sql.push_str(&format!("; SET search_path TO {schema}"));
        }
        block_on(client.batch_execute(&sql)).map_err(backend)
    }

    /// Creates the configured schema if missing, behind the migrations' lock: two workers
    /// creating it at once would otherwise collide in the catalog.
    fn create_schema(&self, client: &Client) -> Result<(), StoreError> {
        let Some(schema) = &self.schema else {
            return Ok(());
        };
        let sql = format!(
            "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK}); \
             CREATE SCHEMA IF NOT EXISTS {schema}; COMMIT"
        );
        block_on(client.batch_execute(&sql)).map_err(backend)
    }

    /// Advisory locks are per database: names are qualified with the schema.
    fn lock_key(&self, name: &str) -> i64 {
        lock_key(self.schema.as_deref().unwrap_or(""), name)
    }

    /// Connects; with `notices`, the connection's notifications go there.
    fn connect(
        &self,
        url: &str,
        notices: Option<tokio::sync::mpsc::UnboundedSender<Notice>>,
    ) -> Result<Client, StoreError> {
        let (url, application_name) = (url.to_owned(), self.worker_id.clone());
        let limit = self.stall_limit.max(Duration::from_secs(1));
        let connecting = self.handle().spawn(async move {
            let mut config: tokio_postgres::Config = url.parse().map_err(backend)?;
            config.application_name(&application_name);
            bound_network_waits(&mut config, limit);
            // The whole handshake, not only the TCP connect: a host that accepts and never
            // answers (its database stopped, a half-open proxy) must not hold the worker.
            let connected = tokio::time::timeout(limit, config.connect(NoTls)).await;
            let (client, mut connection) = connected
                .map_err(|_| {
                    StoreError::Backend(format!(
                        "postgresql: the database did not answer the connect within {limit:?}"
                    ))
                })?
                .map_err(backend)?;
            tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(|cx| connection.poll_message(cx));
                while let Some(message) = futures::StreamExt::next(&mut messages).await {
                    match message {
                        Ok(tokio_postgres::AsyncMessage::Notification(notification)) => {
                            if let Some(notices) = &notices {
                                let notice = Notice {
                                    channel: notification.channel().to_owned(),
                                    payload: notification.payload().to_owned(),
                                };
                                let _ = notices.send(notice);
                            }
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(%error, "database connection failed");
                            break;
                        }
                    }
                }
            });
            Ok::<_, StoreError>(client)
        });
        block_on(connecting)
            .map_err(|e| StoreError::Backend(format!("database connect task failed: {e}")))?
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Dropped wherever the last store handle goes, an async thread included.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Read connections, opened as needed up to a bound.
struct Pool {
    driver: Arc<Driver>,
    url: String,
    size: usize,
    idle: Mutex<(Vec<Connection>, usize)>,
    returned: Condvar,
}

impl Pool {
    fn with<T>(
        &self,
        use_it: impl FnOnce(&mut Connection) -> Result<T, tokio_postgres::Error>,
    ) -> Result<T, StoreError> {
        let mut connection = self.take()?;
        let result = use_it(&mut connection);
        // A connection that failed may be broken: it is dropped, and the next one is new.
        match &result {
            Err(_) => lock(&self.idle).1 -= 1,
            Ok(_) => lock(&self.idle).0.push(connection),
        }
        self.returned.notify_one();
        result.map_err(backend)
    }

    fn take(&self) -> Result<Connection, StoreError> {
        let mut idle = lock(&self.idle);
        loop {
            if let Some(connection) = idle.0.pop() {
                if connection.client.is_closed() {
                    // Ended by the server (a restart, an idle limit) while it waited here.
                    idle.1 -= 1;
                    continue;
                }
                return Ok(connection);
            }
            if idle.1 < self.size {
                idle.1 += 1;
                drop(idle);
                let opened = Connection::open(&self.driver, &self.url);
                if opened.is_err() {
                    lock(&self.idle).1 -= 1;
                }
                return opened;
            }
            idle = self
                .returned
                .wait(idle)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

/// PostgreSQL as the store's engine, and this worker's leases in it.
pub struct PgEngine {
    shared: Arc<Shared>,
}

struct Shared {
    pool: Pool,
    writer: Mutex<Connection>,
    worker_id: String,
    lease: Duration,
    /// Leases this worker holds, by workflow, with their epochs.
    held: Mutex<HashMap<String, i64>>,
    wakeups: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Wakeup>>>,
    /// Senders of relayed commands waiting for their answers.
    waiting: relay::Waiting,
    stopping: AtomicBool,
    /// Set when this worker can no longer tell which leases it holds.
    unsure: AtomicBool,
    /// Until when claims look for leases that name this worker though it does not hold them
    /// ([`Shared::adopt_unsettled`]): set on any failure of a statement that moves a lease
    /// and may commit late, unless reading the lease back settled it. The statement may
    /// commit as late as its lock wait allows, so they look for that long.
    unsettled: Mutex<Option<Instant>>,
    /// Held shared by every statement that moves a lease of this worker, from before it runs
    /// until `held` says what it did; exclusively by the adoption of unknown leases, which so
    /// never finds a lease that such a statement moved and has not noted yet.
    lease_moves: RwLock<()>,
    /// Whether the writer's last failure is one that passes (a lost connection, a server
    /// restart, a lock or serialization timeout), as opposed to one that comes back on every
    /// retry (a value the database refuses).
    failure_passes: AtomicBool,
    counts: LeaseCounts,
}

/// [`LeaseStats`] as the store counts them.
#[derive(Default)]
struct LeaseCounts {
    fenced_writes: AtomicU64,
    lapses: AtomicU64,
    claimed: AtomicU64,
    adopted: AtomicU64,
}

impl LeaseCounts {
    fn add(count: &AtomicU64, n: u64) {
        count.fetch_add(n, Ordering::Relaxed);
    }

    fn stats(&self) -> LeaseStats {
        LeaseStats {
            fenced_writes: self.fenced_writes.load(Ordering::Relaxed),
            lapses: self.lapses.load(Ordering::Relaxed),
            claimed: self.claimed.load(Ordering::Relaxed),
            adopted: self.adopted.load(Ordering::Relaxed),
        }
    }
}

impl PgEngine {
    /// Connects, applies pending migrations, registers this worker, and starts listening for
    /// wake-ups.
    pub fn connect(options: &PgOptions) -> Result<Self, StoreError> {
        let worker_id = options.worker_id.clone().unwrap_or_else(default_worker_id);
        let driver = Driver::new(options.schema.clone(), options.lease, worker_id.clone())?;
        let driver = Arc::new(driver);
        let mut bare = driver.connect(&options.url, None)?;
        driver.create_schema(&bare)?;
        driver.prepare_session(&bare)?;
        // The statements name the tables: they prepare only once the migrations ran.
        migrate(&mut bare)?;
        register(&bare, &worker_id, options.lease)?;
        let statements = Statements::prepare(&bare).map_err(backend)?;
        let writer = Connection {
            client: bare,
            statements,
        };
        let (wake, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            pool: Pool {
                driver: driver.clone(),
                url: options.url.clone(),
                size: options.pool_size.max(1),
                idle: Mutex::new((Vec::new(), 0)),
                returned: Condvar::new(),
            },
            writer: Mutex::new(writer),
            worker_id,
            lease: options.lease,
            held: Mutex::new(HashMap::new()),
            wakeups: Mutex::new(Some(wakeups)),
            // Half the read connections at most: the heartbeat and the runs' reads need theirs.
            waiting: relay::Waiting::new(options.pool_size / 2),
            stopping: AtomicBool::new(false),
            unsure: AtomicBool::new(false),
            unsettled: Mutex::new(None),
            lease_moves: RwLock::new(()),
            failure_passes: AtomicBool::new(false),
            counts: LeaseCounts::default(),
        });
        spawn_listener(&driver, options.url.clone(), Arc::downgrade(&shared), wake)?;
        Ok(Self { shared })
    }
}

/// Holds the layout lock for as long as it lives: a session of its own, whose end releases it.
struct LayoutLock(#[allow(dead_code)] Client);

impl PgEngine {
    /// Waits for, then holds, the lock the layout of this database is prepared under.
    fn lock_layout(&self) -> Result<LayoutLock, StoreError> {
        let driver = &self.shared.pool.driver;
        let client = driver.connect(&self.shared.pool.url, None)?;
        // A control character first: no workflow id, request id or key holds one.
        let key = driver.lock_key("\u{1e}layout");
        block_on(client.execute("SELECT pg_advisory_lock($1)", &[&key])).map_err(backend)?;
        Ok(LayoutLock(client))
    }

    /// One transaction: the advisory locks, then `stage` reading through it, then its batch,
    /// then the commit. `changes` receives what it did to this worker's leases.
    fn write_in_transaction(
        &self,
        writer: &mut Connection,
        locks: &Locks<'_>,
        sync: bool,
        stage: &mut Stage<'_>,
        changes: &mut Vec<LeaseChange>,
    ) -> Result<(), StoreError> {
        let Connection { client, statements } = writer;
        let txn = block_on(client.transaction()).map_err(|e| self.shared.failed(e))?;
        if !sync {
            // Acknowledged without waiting for the WAL flush: the batch may be lost in a crash,
            // with every later one (PostgreSQL keeps commit order), as the trait allows.
            block_on(txn.batch_execute("SET LOCAL synchronous_commit = off"))
                .map_err(|e| self.shared.failed(e))?;
        }
        let mut txn = txn;
        let driver = &self.shared.pool.driver;
        let mut keys: Vec<i64> = Vec::new();
        locks(&mut |name| keys.push(driver.lock_key(name)));
        keys.sort_unstable();
        keys.dedup();
        if !keys.is_empty() {
            txn.run(&statements.lock, &[&keys])
                .map_err(|e| self.shared.failed(e))?;
        }
        let view = InTransaction {
            txn: RefCell::new(txn),
            statements,
            shared: &self.shared,
            changes: RefCell::new(Vec::new()),
        };
        let staged = stage(&view);
        let InTransaction {
            txn, changes: made, ..
        } = view;
        // Before the batch: a commit that fails after it was sent may still have happened.
        *changes = made.into_inner();
        let batch = staged?;
        let mut txn = txn.into_inner();
        apply(&mut txn, statements, batch).map_err(|e| self.shared.failed(e))?;
        block_on(txn.commit()).map_err(|e| self.shared.failed(e))
    }
}

impl Drop for PgEngine {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        // A store closed in order lets its workflows go at once; a crash leaves them to lapse.
        let leases = PgLeases {
            shared: self.shared.clone(),
        };
        if let Err(error) = leases.release_all() {
            tracing::warn!(%error, "cannot release leases on close; others claim them once they lapse");
        }
    }
}

impl PgStore {
    /// Connects to the database in `options`, brings its schema and layout up to date, and
    /// opens the store for reading and writing, sealing values with `codec` when given.
    pub fn connect(options: &PgOptions, codec: Option<Arc<dyn Codec>>) -> Result<Self, StoreError> {
        let engine = PgEngine::connect(options)?;
        // Workers starting together upgrade the layout one at a time: each reads it again
        // under the lock, so the first upgrades and the others find it done.
        let upgrading = engine.lock_layout()?;
        let engine = CodecEngine::new(engine, codec);
        engine.check_sealing(false)?;
        // Every PostgreSQL store has had its layout row since its first worker started, so one
        // without it is new.
        let created = engine.get(Table::Meta, b"layout")?.is_none();
        layout::prepare(&engine, created)?;
        drop(upgrading);
        engine.check_sealing(true)?;
        KvStore::writable(Arc::new(engine), super::kv::MAX_GROUP)
    }
}

fn migrate(client: &mut Client) -> Result<(), StoreError> {
    block_on(migrate_async(client))
}

async fn migrate_async(client: &mut Client) -> Result<(), StoreError> {
    let txn = client.transaction().await.map_err(backend)?;
    // A migration waits for another worker's, however long it takes (the session's limit is
    // for a worker's own writes).
    txn.batch_execute("SET LOCAL lock_timeout = 0")
        .await
        .map_err(backend)?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(backend)?;
    txn.batch_execute(
        "CREATE TABLE IF NOT EXISTS waymark_migrations (
             version int PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(backend)?;
    let row = txn
        .query_one(
            "SELECT coalesce(max(version), 0) FROM waymark_migrations",
            &[],
        )
        .await
        .map_err(backend)?;
    let applied: i32 = row.get(0);
    let newest = MIGRATIONS.last().map_or(0, |(version, ..)| *version);
    if applied > newest {
        return Err(StoreError::NewerLayout {
            found: applied as u32,
            supported: newest as u32,
        });
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|(v, ..)| *v > applied) {
        tracing::info!(version, name, "applying a database migration");
        txn.batch_execute(sql).await.map_err(backend)?;
        txn.execute(
            "INSERT INTO waymark_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(backend)?;
    }
    txn.commit().await.map_err(backend)
}

fn register(client: &Client, worker_id: &str, lease: Duration) -> Result<(), StoreError> {
    let inserted = block_on(client.execute(
        "INSERT INTO waymark_workers (worker_id, expires_at) \
             VALUES ($1, now() + make_interval(secs => $2)) ON CONFLICT DO NOTHING",
        &[&worker_id, &lease.as_secs_f64()],
    ))
    .map_err(backend)?;
    if inserted == 0 {
        // An id that registered before is a worker that may have lapsed and been taken over:
        // coming back under it would pass its successor's fences.
        return Err(StoreError::Backend(format!(
            "a worker named `{worker_id}` registered before: each start needs a new worker id"
        )));
    }
    Ok(())
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "worker".into());
    let suffix: u32 = rand::random();
    format!("{host}-{}-{suffix:08x}", std::process::id())
}

/// A time in the workflows' clock as the database keeps it (`bigint`).
fn millis(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// Bounds, by `limit` (the lease), how long a connection waits on a peer that went without a
/// word (a cut link, a frozen host), where the URL does not say: the kernel's own defaults
/// are two hours of silence before a keepalive and minutes of retransmission.
fn bound_network_waits(config: &mut tokio_postgres::Config, limit: Duration) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(limit);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(limit);
    }
    // The URL set no idle time if it is still the driver's default.
    if config.get_keepalives_idle() == tokio_postgres::Config::new().get_keepalives_idle() {
        config.keepalives_idle((limit / 2).max(Duration::from_secs(1)));
    }
}

/// Whether `error` passes: the connection went (class 08, the server ending the session or
/// restarting), or the transaction lost a race it may win next time (serialization, deadlock,
/// a lock or idle timeout).
fn failure_passes(error: &tokio_postgres::Error) -> bool {
    const PASSING: &[&str] = &[
        "57P01", "57P02", "57P03", "40001", "40P01", "55P03", "25P03",
    ];
    match error.code() {
        Some(code) => code.code().starts_with("08") || PASSING.contains(&code.code()),
        None => {
            error.is_closed()
                || std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
        }
    }
}

fn backend(error: tokio_postgres::Error) -> StoreError {
    // The server's message says what went wrong; the client's display alone says "db error".
    let detail = error
        .as_db_error()
        .map(|db| format!("{}: {}", db.code().code(), db.message()));
    StoreError::Backend(format!(
        "postgresql: {}",
        detail.unwrap_or_else(|| error.to_string())
    ))
}

/// Whether `name` is safe to splice into SQL as an identifier.
fn is_plain_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

/// The advisory lock of a name in a schema: the first 8 bytes of a SHA-256 (two names sharing
/// one only serialize their writers).
fn lock_key(schema: &str, name: &str) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(schema.as_bytes());
    hasher.update([0]);
    hasher.update(name.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn table_code(table: Table) -> i16 {
    table.index() as i16
}

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn row_of(row: &tokio_postgres::Row) -> Row {
    let key: Vec<u8> = row.get(0);
    let value: Vec<u8> = row.get(1);
    (key.into_boxed_slice(), value.into_boxed_slice())
}

/// Something that runs statements: a connection or a transaction.
trait Queries {
    fn rows(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>;
    fn run(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error>;
}

impl Queries for Client {
    fn rows(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        block_on(self.query(statement, params))
    }
    fn run(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        block_on(self.execute(statement, params))
    }
}

impl Queries for Transaction<'_> {
    fn rows(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        block_on(self.query(statement, params))
    }
    fn run(
        &mut self,
        statement: &Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        block_on(self.execute(statement, params))
    }
}

fn get_row(
    q: &mut dyn Queries,
    s: &Statements,
    table: Table,
    key: &[u8],
) -> Result<Option<Vec<u8>>, tokio_postgres::Error> {
    let rows = q.rows(&s.get, &[&table_code(table), &key])?;
    Ok(rows.first().map(|row| row.get(0)))
}

/// The values at `keys`, in their order, in one query.
fn get_rows(
    q: &mut dyn Queries,
    s: &Statements,
    table: Table,
    keys: &[Vec<u8>],
) -> Result<Vec<Option<Vec<u8>>>, tokio_postgres::Error> {
    let rows = q.rows(&s.get_many, &[&table_code(table), &keys])?;
    let found: HashMap<Vec<u8>, Vec<u8>> =
        rows.iter().map(|row| (row.get(0), row.get(1))).collect();
    Ok(keys.iter().map(|key| found.get(key).cloned()).collect())
}

fn scan_rows(
    q: &mut dyn Queries,
    s: &Statements,
    table: Table,
    prefix: &[u8],
    from: &[u8],
    limit: usize,
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let start = from.max(prefix);
    let (code, limit) = (table_code(table), limit_of(limit));
    let rows = match crate::keys::prefix_end(prefix) {
        Some(end) => q.rows(&s.scan_bounded, &[&code, &start, &end, &limit])?,
        None => q.rows(&s.scan_open, &[&code, &start, &limit])?,
    };
    Ok(rows.iter().map(row_of).collect())
}

fn last_row(
    q: &mut dyn Queries,
    s: &Statements,
    table: Table,
    prefix: &[u8],
    upto: &[u8],
) -> Result<Option<Row>, tokio_postgres::Error> {
    let rows = q.rows(&s.last, &[&table_code(table), &prefix, &upto])?;
    Ok(rows
        .first()
        .map(row_of)
        .filter(|(key, _)| key.starts_with(prefix)))
}

/// Applies `batch` as its writes one by one would leave the rows, in as few statements as
/// [`runs`] gathers them into.
fn apply(
    q: &mut dyn Queries,
    s: &Statements,
    batch: Vec<Write>,
) -> Result<(), tokio_postgres::Error> {
    for run in runs(batch) {
        match run {
            Run::Puts(rows) => q.run(&s.put, &[&rows.tables, &rows.keys, &rows.values])?,
            Run::Deletes(rows) => q.run(&s.delete, &[&rows.tables, &rows.keys])?,
            Run::DeleteRange { table, from, to } => {
                q.run(&s.delete_range, &[&table, &from, &to])?
            }
        };
    }
    Ok(())
}

/// One statement of a batch's writes.
#[derive(Debug, PartialEq)]
enum Run {
    /// Puts, as one `INSERT … ON CONFLICT`, which may not touch a row twice.
    Puts(Rows),
    /// Deletes, as one `DELETE`.
    Deletes(Rows),
    DeleteRange {
        table: i16,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// The rows of a run gathered so far (`values` only for puts).
#[derive(Debug, Default, PartialEq)]
struct Rows {
    tables: Vec<i16>,
    keys: Vec<Vec<u8>>,
    values: Vec<Vec<u8>>,
}

/// A run being gathered, and the rows it holds.
#[derive(Default)]
struct Gathering {
    rows: Rows,
    held: HashSet<(i16, Vec<u8>)>,
}

impl Gathering {
    fn holds(&self, row: &(i16, Vec<u8>)) -> bool {
        self.held.contains(row)
    }

    fn add(&mut self, (table, key): (i16, Vec<u8>), value: Option<Vec<u8>>) {
        self.held.insert((table, key.clone()));
        self.rows.tables.push(table);
        self.rows.keys.push(key);
        self.rows.values.extend(value);
    }

    /// Ends the run, if it holds a row, as `run` of its rows.
    fn end(&mut self, runs: &mut Vec<Run>, run: fn(Rows) -> Run) {
        let gathered = std::mem::take(self);
        if !gathered.rows.tables.is_empty() {
            runs.push(run(gathered.rows));
        }
    }
}

/// `batch` as statements: its puts gathered into one run and its deletes into another, a run
/// ended before a later write of a row it holds. Writes of different rows commute, so a
/// group's puts and deletes take a statement each however they interleave (a settled
/// operation's record is put beside the delete of its index row).
fn runs(batch: Vec<Write>) -> Vec<Run> {
    let mut runs = Vec::new();
    let (mut puts, mut deletes) = (Gathering::default(), Gathering::default());
    for write in batch {
        match write {
            Write::Put(table, key, value) => {
                let row = (table_code(table), key);
                if deletes.holds(&row) {
                    deletes.end(&mut runs, Run::Deletes);
                }
                if puts.holds(&row) {
                    puts.end(&mut runs, Run::Puts);
                }
                puts.add(row, Some(value));
            }
            Write::Delete(table, key) => {
                let row = (table_code(table), key);
                if puts.holds(&row) {
                    puts.end(&mut runs, Run::Puts);
                }
                deletes.add(row, None);
            }
            Write::DeleteRange(table, from, to) => {
                deletes.end(&mut runs, Run::Deletes);
                puts.end(&mut runs, Run::Puts);
                let table = table_code(table);
                runs.push(Run::DeleteRange { table, from, to });
            }
        }
    }
    deletes.end(&mut runs, Run::Deletes);
    puts.end(&mut runs, Run::Puts);
    runs
}

impl Reads for PgEngine {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let pool = &self.shared.pool;
        pool.with(|c| get_row(&mut c.client, &c.statements, table, key))
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let pool = &self.shared.pool;
        pool.with(|c| get_rows(&mut c.client, &c.statements, table, keys))
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let pool = &self.shared.pool;
        pool.with(|c| scan_rows(&mut c.client, &c.statements, table, prefix, from, limit))
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let pool = &self.shared.pool;
        pool.with(|c| last_row(&mut c.client, &c.statements, table, prefix, upto))
    }

    /// Outside a transaction nothing holds a lease still: only [`Engine::transact`] fences.
    fn fence(&self, workflow_id: &str, _change: Ownership) -> Result<(), StoreError> {
        Err(fenced(
            &self.shared.worker_id,
            workflow_id,
            "a change to a shared store is only checked inside its transaction",
        ))
    }
}

impl Engine for PgEngine {
    fn write(&self, batch: Vec<Write>, sync: bool) -> Result<(), StoreError> {
        let mut batch = Some(batch);
        let mut stage = |_: &dyn Reads| Ok(batch.take().unwrap_or_default());
        self.transact(&|_| {}, sync, &mut stage)
    }

    fn transact(
        &self,
        locks: &Locks<'_>,
        sync: bool,
        stage: &mut Stage<'_>,
    ) -> Result<(), StoreError> {
        let mut writer = lock(&self.shared.writer);
        // A failure is taken as lasting unless it is known to pass (see `failed_write_poisons`).
        self.shared.failure_passes.store(false, Ordering::Relaxed);
        if writer.client.is_closed() {
            // Closed by the server (a stall past the limit, a restart) or the network: the
            // transaction it had open is gone, and the next one needs a new connection.
            let opened = Connection::open(&self.shared.pool.driver, &self.shared.pool.url);
            self.shared
                .failure_passes
                .store(opened.is_err(), Ordering::Relaxed);
            *writer = opened?;
        }
        let mut changes = Vec::new();
        let _moving = self.shared.moving_leases();
        let written = self.write_in_transaction(&mut writer, locks, sync, stage, &mut changes);
        match written {
            Ok(()) => self.shared.apply_lease_changes(changes),
            // Committed or not, nobody can tell from here: the leases it took or let go are
            // read back, so that this worker runs what it holds, no more and no less.
            Err(_) => self.shared.settle_lease_changes(changes),
        }
        written
    }

    fn leases(&self) -> Option<Arc<dyn Leases>> {
        Some(Arc::new(PgLeases {
            shared: self.shared.clone(),
        }))
    }

    /// A transaction commits whole or not at all, and every check reads the database: after
    /// a failure that passes, nothing in this process is left to distrust (the leases the
    /// transaction may have changed are read back, see `settle_lease_changes`). Any other
    /// failure would come back on every retry.
    fn failed_write_poisons(&self) -> bool {
        !self.shared.failure_passes.load(Ordering::Relaxed)
    }

    /// A poisoned store writes nothing more: this worker lets its registration lapse, so that
    /// others take its workflows, rather than hold them unrun.
    fn poisoned(&self) {
        self.shared.unsure.store(true, Ordering::Relaxed);
    }
}

/// What a committed transaction did to this worker's leases.
enum LeaseChange {
    Took(String, i64),
    Released(String),
}

impl Shared {
    fn apply_lease_changes(&self, changes: Vec<LeaseChange>) {
        let mut held = lock(&self.held);
        for change in changes {
            match change {
                LeaseChange::Took(id, epoch) => {
                    held.insert(id, epoch);
                }
                LeaseChange::Released(id) => {
                    held.remove(&id);
                }
            }
        }
    }

    /// Notes whether the writer's failure `error` passes, and says what it was.
    fn failed(&self, error: tokio_postgres::Error) -> StoreError {
        self.failure_passes
            .store(failure_passes(&error), Ordering::Relaxed);
        backend(error)
    }

    /// After a transaction whose outcome is unknown: what it would have done to this worker's
    /// leases is read back. If that fails too, this worker cannot know what it holds, and
    /// lets its registration lapse (its next heartbeat says so) rather than run a workflow
    /// twice or leave one unrun.
    fn settle_lease_changes(&self, changes: Vec<LeaseChange>) {
        let ids: Vec<String> = changes
            .into_iter()
            .map(|change| match change {
                LeaseChange::Took(id, _) | LeaseChange::Released(id) => id,
            })
            .collect();
        if ids.is_empty() {
            return;
        }
        // The transaction may commit after this read (a commit waiting on a slow flush).
        self.mark_unsettled();
        let read = self.pool.with(|c| {
            c.client.query_sql(
                "SELECT workflow_id, owner, epoch FROM waymark_leases WHERE workflow_id = ANY($1)",
                &[&ids],
            )
        });
        let rows = match read {
            Ok(rows) => rows,
            Err(error) => {
                tracing::error!(%error, "cannot read back the leases of a failed write; letting this worker's registration lapse");
                self.unsure.store(true, Ordering::Relaxed);
                return;
            }
        };
        let mine: HashMap<String, i64> = rows
            .iter()
            .filter(|row| row.get::<_, Option<&str>>(1) == Some(self.worker_id.as_str()))
            .map(|row| (row.get(0), row.get(2)))
            .collect();
        let mut held = lock(&self.held);
        for id in ids {
            match mine.get(&id) {
                Some(epoch) => held.insert(id, *epoch),
                None => held.remove(&id),
            };
        }
    }

    /// Records `workflow_id` as held at `epoch`, taken by a statement of this worker that
    /// answered: counted as claimed.
    fn took(&self, workflow_id: &str, epoch: i64) {
        lock(&self.held).insert(workflow_id.to_owned(), epoch);
        LeaseCounts::add(&self.counts.claimed, 1);
    }

    /// Records `workflow_id` as held at `epoch`, found naming this worker: taken by a
    /// statement whose answer was lost. Counted as adopted unless it was held at that epoch
    /// already (a statement of this worker that answered took it meanwhile).
    fn adopt(&self, workflow_id: &str, epoch: i64) {
        let before = lock(&self.held).insert(workflow_id.to_owned(), epoch);
        if before != Some(epoch) {
            LeaseCounts::add(&self.counts.adopted, 1);
        }
    }

    /// Notes what a take found: the epoch it took the lease at (`taken`), or the one at which
    /// the lease named this worker already (`mine`, adopted). Whether this worker holds it now.
    fn took_or_adopted(&self, workflow_id: &str, taken: Option<i64>, mine: Option<i64>) -> bool {
        match (taken, mine) {
            (Some(epoch), _) => self.took(workflow_id, epoch),
            (None, Some(epoch)) => self.adopt(workflow_id, epoch),
            (None, None) => return false,
        }
        true
    }

    /// Forgets `workflow_id`'s lease if this worker holds it at `epoch`: one taken again since,
    /// under a later epoch, is kept.
    fn forget_held_at(&self, workflow_id: &str, epoch: i64) {
        let mut held = lock(&self.held);
        if held.get(workflow_id) == Some(&epoch) {
            held.remove(workflow_id);
        }
    }

    /// Shared hold on [`Shared::lease_moves`], for a statement that moves a lease.
    fn moving_leases(&self) -> RwLockReadGuard<'_, ()> {
        self.lease_moves
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Has claims look for unknown leases for as long as a statement whose answer was lost
    /// may still commit: its lock wait is bounded by the lease (`Driver::prepare_session`).
    fn mark_unsettled(&self) {
        let window = self.lease.max(Duration::from_secs(1)) * 2;
        let until = Instant::now() + window;
        let mut unsettled = lock(&self.unsettled);
        *unsettled = Some(unsettled.map_or(until, |known| known.max(until)));
    }

    /// The owner and epoch of `workflow_id`'s lease (`None`: it has none), read back after a
    /// lease statement whose answer was lost: what the statement did is in the row.
    fn lease_row(&self, workflow_id: &str) -> Result<Option<(Option<String>, i64)>, StoreError> {
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                // Named, so that it is told apart from the fence's read of the same row.
                "SELECT owner, epoch FROM waymark_leases WHERE workflow_id = $1 /* read-back */",
                &[&workflow_id],
            )
        })?;
        Ok(rows.first().map(|row| (row.get(0), row.get(1))))
    }

    /// After a take of `workflow_id` that failed with `error`, perhaps once it had committed:
    /// the epoch it took the lease at, if the lease names this worker now; else `error`, and
    /// the next claim looks again ([`Shared::adopt_unsettled`]), since the statement may
    /// still commit (a connection given up on while its statement waited for a lock) or the
    /// row could not be read: held here with no run, the workflow would wait for nothing.
    fn settle_take(&self, workflow_id: &str, error: StoreError) -> Result<i64, StoreError> {
        match self.lease_row(workflow_id) {
            Ok(Some((Some(owner), epoch))) if owner == self.worker_id => Ok(epoch),
            Ok(_) => {
                self.mark_unsettled();
                Err(error)
            }
            Err(unread) => {
                tracing::warn!(workflow_id, %unread, "cannot read back a failed take; the next claim looks for it");
                self.mark_unsettled();
                Err(error)
            }
        }
    }

    /// After a park of `workflow_id` at `epoch` that failed with `error`, perhaps once it had
    /// committed: the leases it let go, read back (one; none if the lease moved); `error` when
    /// the lease is still held here at `epoch`. A row that cannot be read is taken as let go,
    /// and the next claim adopts the lease if the park did not commit
    /// ([`Shared::adopt_unsettled`]): held here while parked, the workflow's signals would
    /// reach runs whose writes are refused, and it would wait for its timer.
    fn settle_park(
        &self,
        workflow_id: &str,
        epoch: i64,
        error: StoreError,
    ) -> Result<u64, StoreError> {
        match self.lease_row(workflow_id) {
            Ok(Some((None, now))) if now == epoch => Ok(1),
            Ok(Some((Some(owner), now))) if owner == self.worker_id && now == epoch => Err(error),
            // Parked, then taken back here (a signal, a claim) before this was read.
            Ok(Some((Some(owner), now))) if owner == self.worker_id && now > epoch => Ok(1),
            Ok(_) => Ok(0),
            Err(unread) => {
                tracing::warn!(workflow_id, %error, %unread, "cannot read back a failed park; taken as let go, and the next claim looks for it");
                self.mark_unsettled();
                Ok(1)
            }
        }
    }

    /// The leases that name this worker though it did not know of them, adopted: taken by a
    /// statement whose answer was lost, and not read back then (see [`Shared::unsettled`]).
    /// None unless such an answer was lost: it reads every lease this worker holds.
    ///
    /// No statement of this worker moves a lease while the leases read are compared with the
    /// ones held and adopted ([`Shared::lease_moves`]), so an unknown lease is one no
    /// statement here is about to note. Each is taken again under a new epoch, by a statement
    /// that finds it still naming this worker: a lease parked, let go or ended since the read
    /// is left alone, and a park or a release of this worker whose answer was lost, and which
    /// commits late, moves nothing.
    fn adopt_unsettled(&self) -> Vec<String> {
        let Some(until) = *lock(&self.unsettled) else {
            return Vec::new();
        };
        let scanned_at = Instant::now();
        let adopted = self
            .leases_naming_this_worker()
            .and_then(|named| self.adopt_unknown(named));
        let ids = match adopted {
            Ok(Some(ids)) => ids,
            // Not this time: the window stays open.
            Ok(None) => return Vec::new(),
            Err(error) => {
                tracing::warn!(%error, "cannot read back this worker's leases; the next claim tries again");
                return Vec::new();
            }
        };
        // A statement that commits after the read began is looked for again, unless the
        // window it may commit in had closed by then.
        let mut unsettled = lock(&self.unsettled);
        if *unsettled == Some(until) && scanned_at >= until {
            *unsettled = None;
        }
        ids
    }

    /// Of the leases `named` (read as naming this worker), adopts those it does not hold.
    /// Only this comparison and the adoption hold this worker's lease moves off: a lease moved
    /// after the read no longer names this worker, or is held here by then. `None` when they
    /// did not pause soon enough (see [`Shared::alone_with_lease_moves`]).
    fn adopt_unknown(&self, named: Vec<String>) -> Result<Option<Vec<String>>, StoreError> {
        let Some(_alone) = self.alone_with_lease_moves() else {
            return Ok(None);
        };
        let unknown: Vec<String> = {
            let held = lock(&self.held);
            let unknown = named.into_iter().filter(|id| !held.contains_key(id));
            unknown.collect()
        };
        if unknown.is_empty() {
            return Ok(Some(Vec::new()));
        }
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                "UPDATE waymark_leases SET epoch = epoch + 1
                 WHERE owner = $1 AND workflow_id = ANY($2)
                 RETURNING workflow_id, epoch",
                &[&self.worker_id, &unknown],
            )
        })?;
        let adopted = rows.iter().map(|row| (row.get(0), row.get(1)));
        let adopted: Vec<(String, i64)> = adopted.collect();
        for (id, epoch) in &adopted {
            self.adopt(id, *epoch);
        }
        Ok(Some(adopted.into_iter().map(|(id, _)| id).collect()))
    }

    /// [`Shared::lease_moves`] alone, if this worker's lease moves pause within a sixth of
    /// the lease. It is not waited for: a waiting writer would hold every new move back
    /// behind the slowest one under way (a transaction may wait a lease for its locks), and
    /// the heartbeat comes after the claims.
    fn alone_with_lease_moves(&self) -> Option<RwLockWriteGuard<'_, ()>> {
        let patience = Instant::now() + self.lease / 6;
        loop {
            match self.lease_moves.try_write() {
                Ok(alone) => return Some(alone),
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < patience => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// The ids of the leases that name this worker.
    fn leases_naming_this_worker(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.pool.with(|c| {
            c.client.query_sql(
                "SELECT workflow_id FROM waymark_leases WHERE owner = $1",
                &[&self.worker_id],
            )
        })?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}

/// Reads inside the writer's transaction, and its fences.
struct InTransaction<'a, 't> {
    txn: RefCell<Transaction<'t>>,
    statements: &'a Statements,
    shared: &'a Shared,
    changes: RefCell<Vec<LeaseChange>>,
}

impl Reads for InTransaction<'_, '_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        let mut txn = self.txn.borrow_mut();
        get_row(&mut *txn, self.statements, table, key).map_err(|e| self.shared.failed(e))
    }

    fn get_many(&self, table: Table, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut txn = self.txn.borrow_mut();
        get_rows(&mut *txn, self.statements, table, keys).map_err(|e| self.shared.failed(e))
    }

    fn scan(
        &self,
        table: Table,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<Row>, StoreError> {
        let mut txn = self.txn.borrow_mut();
        scan_rows(&mut *txn, self.statements, table, prefix, from, limit)
            .map_err(|e| self.shared.failed(e))
    }

    fn last(&self, table: Table, prefix: &[u8], upto: &[u8]) -> Result<Option<Row>, StoreError> {
        let mut txn = self.txn.borrow_mut();
        last_row(&mut *txn, self.statements, table, prefix, upto).map_err(|e| self.shared.failed(e))
    }

    fn fence(&self, workflow_id: &str, change: Ownership) -> Result<(), StoreError> {
        let me = self.shared.worker_id.as_str();
        let held = lock(&self.shared.held).get(workflow_id).copied();
        let mut txn = self.txn.borrow_mut();
        let s = self.statements;
        let refused = |reason: String| {
            let counts = &self.shared.counts;
            LeaseCounts::add(&counts.fenced_writes, 1);
            tracing::warn!(workflow_id, worker_id = me, %reason, "write refused: lease lost");
            Err(fenced(me, workflow_id, &reason))
        };
        match change {
            Ownership::Whole => Ok(()),
            Ownership::Begin => {
                let inserted = txn.run(&s.lease_begin, &[&workflow_id, &me]);
                if inserted.map_err(|e| self.shared.failed(e))? == 0 {
                    return refused("the workflow has an owner already".into());
                }
                let took = LeaseChange::Took(workflow_id.to_owned(), 1);
                self.changes.borrow_mut().push(took);
                Ok(())
            }
            Ownership::Continue | Ownership::End => {
                let Some(epoch) = held else {
                    return refused("this worker does not hold its lease".into());
                };
                let rows = txn
                    .rows(&s.lease_share, &[&workflow_id])
                    .map_err(|e| self.shared.failed(e))?;
                let found = rows.first().map(|row| {
                    let owner: Option<String> = row.get(0);
                    let epoch: i64 = row.get(1);
                    (owner, epoch)
                });
                let lost = match found {
                    Some((Some(owner), found)) if owner == me && found == epoch => None,
                    Some((owner, found)) => {
                        let owner = owner.unwrap_or_else(|| "nobody".into());
                        Some(format!(
                            "the lease is {owner}'s at epoch {found}, this worker held epoch \
                             {epoch}"
                        ))
                    }
                    None => Some("the workflow has no lease (it ended)".into()),
                };
                if let Some(reason) = lost {
                    // Forgotten here, at the epoch refused: left to the run this refusal
                    // stops, it could drop a lease this worker took again since.
                    self.shared.forget_held_at(workflow_id, epoch);
                    return refused(reason);
                }
                if change == Ownership::End {
                    txn.run(&s.lease_end, &[&workflow_id, &me, &epoch])
                        .map_err(|e| self.shared.failed(e))?;
                    let released = LeaseChange::Released(workflow_id.to_owned());
                    self.changes.borrow_mut().push(released);
                }
                Ok(())
            }
        }
    }
}

fn fenced(worker_id: &str, workflow_id: &str, reason: &str) -> StoreError {
    StoreError::Fenced {
        workflow_id: workflow_id.to_owned(),
        worker_id: worker_id.to_owned(),
        reason: reason.to_owned(),
    }
}

/// This worker's side of the leases.
struct PgLeases {
    shared: Arc<Shared>,
}

impl Leases for PgLeases {
    fn worker_id(&self) -> &str {
        &self.shared.worker_id
    }

    fn lease(&self) -> Duration {
        self.shared.lease
    }

    fn heartbeat(&self) -> Result<(), StoreError> {
        let (me, secs) = (&self.shared.worker_id, self.shared.lease.as_secs_f64());
        if self.shared.unsure.load(Ordering::Relaxed) {
            lock(&self.shared.held).clear();
            LeaseCounts::add(&self.shared.counts.lapses, 1);
            return Err(fenced(
                me,
                "",
                "it could not read back the leases of a failed write",
            ));
        }
        let renewed = self.shared.pool.with(|c| {
            c.client.run_sql(
                "UPDATE waymark_workers SET expires_at = now() + make_interval(secs => $2) \
                 WHERE worker_id = $1 AND expires_at > now()",
                &[me, &secs],
            )
        })?;
        if renewed == 0 {
            // Every lease went with the registration: no write of this worker passes a fence
            // from now on, whether or not another worker has claimed the workflow yet.
            lock(&self.shared.held).clear();
            LeaseCounts::add(&self.shared.counts.lapses, 1);
            return Err(fenced(
                me,
                "",
                "its registration lapsed before this heartbeat",
            ));
        }
        Ok(())
    }

    fn claim(&self, limit: usize, now_ms: u64) -> Result<Vec<String>, StoreError> {
        let me = &self.shared.worker_id;
        let limit = limit_of(limit).min(CLAIM_PAGE);
        let moving = self.shared.moving_leases();
        let taken = self.shared.pool.with(|c| {
            c.client.query_sql(
                // Three ways to be free, each found through its own index: let go (or parked
                // and due), owned by a worker that lapsed, parked with a command waiting. The
                // update checks again that the row is free. A row another worker claimed, and
                // committed after this statement's snapshot, is locked on its newest version,
                // and `lapsed`'s recheck of that version let it through (its `NOT EXISTS` is
                // planned as an anti-join): two workers then claimed one workflow. The `OR`
                // keeps this check a subplan, evaluated on the row as it is now.
                "WITH let_go AS (
                     SELECT l.workflow_id FROM waymark_leases l
                     WHERE l.owner IS NULL AND l.parked_until_ms <= $3
                     ORDER BY l.parked_until_ms LIMIT $2
                     FOR UPDATE OF l SKIP LOCKED),
                 lapsed AS (
                     SELECT l.workflow_id FROM waymark_leases l
                     WHERE l.owner IS NOT NULL AND NOT EXISTS (
                         SELECT 1 FROM waymark_workers w
                         WHERE w.worker_id = l.owner AND w.expires_at > now())
                     LIMIT $2
                     FOR UPDATE OF l SKIP LOCKED),
                 commanded AS (
                     SELECT l.workflow_id FROM waymark_leases l
                     WHERE l.owner IS NULL AND l.workflow_id IN (
                         SELECT c.workflow_id FROM waymark_commands c WHERE c.taken_by IS NULL)
                     LIMIT $2
                     FOR UPDATE OF l SKIP LOCKED),
                 free AS (
                     SELECT workflow_id FROM let_go
                     UNION SELECT workflow_id FROM lapsed
                     UNION SELECT workflow_id FROM commanded
                     LIMIT $2)
                 UPDATE waymark_leases l SET owner = $1, epoch = l.epoch + 1, parked_until_ms = 0
                 FROM free WHERE l.workflow_id = free.workflow_id
                     AND (l.owner IS NULL OR NOT EXISTS (
                         SELECT 1 FROM waymark_workers w
                         WHERE w.worker_id = l.owner AND w.expires_at > now()))
                 RETURNING l.workflow_id, l.epoch",
                &[me, &limit, &millis(now_ms)],
            )
        });
        let taken = match taken {
            Ok(taken) => taken,
            // Which workflows it took, if it committed, only the leases tell.
            Err(error) => {
                self.shared.mark_unsettled();
                return Err(error);
            }
        };
        let mut claimed = Vec::with_capacity(taken.len());
        for row in &taken {
            let (id, epoch): (String, i64) = (row.get(0), row.get(1));
            self.shared.took(&id, epoch);
            claimed.push(id);
        }
        drop(moving);
        claimed.extend(self.shared.adopt_unsettled());
        Ok(claimed)
    }

    fn take(&self, workflow_id: &str) -> Result<bool, StoreError> {
        let me = &self.shared.worker_id;
        let _moving = self.shared.moving_leases();
        // One row, re-checked under its lock: of two workers taking at once, one does. A lease
        // that names this worker already, unknown to it, was taken by a statement whose answer
        // was lost: it is adopted (the second select reads the row as it was before the update).
        let taken = self.shared.pool.with(|c| {
            c.client.query_sql(
                "WITH taken AS (
                     UPDATE waymark_leases l SET owner = $1, epoch = l.epoch + 1, parked_until_ms = 0
                     WHERE l.workflow_id = $2 AND (l.owner IS NULL OR NOT EXISTS (
                         SELECT 1 FROM waymark_workers w
                         WHERE w.worker_id = l.owner AND w.expires_at > now()))
                     RETURNING l.epoch)
                 SELECT (SELECT epoch FROM taken) AS taken_at,
                     (SELECT epoch FROM waymark_leases WHERE workflow_id = $2 AND owner = $1)
                         AS held_at",
                &[me, &workflow_id],
            )
        });
        let (taken, mine) = match taken {
            Ok(rows) => {
                let epoch = |column| {
                    rows.first()
                        .and_then(|row| row.get::<_, Option<i64>>(column))
                };
                (epoch(0), epoch(1))
            }
            Err(error) => (None, Some(self.shared.settle_take(workflow_id, error)?)),
        };
        Ok(self.shared.took_or_adopted(workflow_id, taken, mine))
    }

    fn park(
        &self,
        workflow_id: &str,
        due_at_ms: u64,
        listening: &[String],
    ) -> Result<(), StoreError> {
        let me = &self.shared.worker_id;
        let _moving = self.shared.moving_leases();
        let Some(epoch) = lock(&self.shared.held).get(workflow_id).copied() else {
            return Err(fenced(
                me,
                workflow_id,
                "this worker does not hold its lease",
            ));
        };
        let parked = self.shared.pool.with(|c| {
            c.client.run_sql(
                "UPDATE waymark_leases
                 SET owner = NULL, parked_until_ms = $4, listening = $5, listening_epoch = epoch
                 WHERE workflow_id = $1 AND owner = $2 AND epoch = $3",
                &[&workflow_id, me, &epoch, &millis(due_at_ms), &listening],
            )
        });
        let parked = match parked {
            Ok(parked) => parked,
            Err(error) => self.shared.settle_park(workflow_id, epoch, error)?,
        };
        // Only the lease parked: one taken again meanwhile (a command that found the park
        // written) is held under a later epoch.
        self.shared.forget_held_at(workflow_id, epoch);
        if parked == 0 {
            return Err(fenced(
                me,
                workflow_id,
                "the lease moved before it was parked",
            ));
        }
        Ok(())
    }

    fn take_for_signal(&self, workflow_id: &str) -> Result<SignalTake, StoreError> {
        let me = &self.shared.worker_id;
        let _moving = self.shared.moving_leases();
        // The take is `take`'s, but for a row parked with names, and locks nothing when a live
        // worker holds the row (its writes share-lock it until they commit). The names are read
        // at the statement's snapshot: a park written after it, which the take then finds,
        // reads the inbox itself once written, and so sees the signal (see
        // `WorkerState::park`); one taken after it is rebuilt from an inbox holding the signal.
        let rows = self.shared.pool.with(|c| {
            c.client.query_sql(
                "WITH taken AS (
                     UPDATE waymark_leases l
                     SET owner = $1, epoch = l.epoch + 1, parked_until_ms = 0
                     WHERE l.workflow_id = $2 AND (l.owner IS NULL OR NOT EXISTS (
                         SELECT 1 FROM waymark_workers w
                         WHERE w.worker_id = l.owner AND w.expires_at > now()))
                         AND NOT (l.owner IS NULL AND l.parked_until_ms > 0
                             AND l.listening IS NOT NULL
                             AND l.listening_epoch IS NOT DISTINCT FROM l.epoch)
                     RETURNING l.epoch
                 )
                 SELECT (SELECT epoch FROM taken),
                     (SELECT listening FROM waymark_leases
                      WHERE workflow_id = $2 AND owner IS NULL AND parked_until_ms > 0
                          AND listening_epoch = epoch),
                     (SELECT epoch FROM waymark_leases WHERE workflow_id = $2 AND owner = $1)",
                &[me, &workflow_id],
            )
        });
        // A failure is the caller's to answer with a plain take, which adopts the lease if
        // this statement took it; one that commits after that take read the row is left to
        // the claims.
        let rows = rows.inspect_err(|_| self.shared.mark_unsettled())?;
        let row = rows.first();
        let taken = row.and_then(|row| row.get::<_, Option<i64>>(0));
        let names = row.and_then(|row| row.get::<_, Option<Vec<String>>>(1));
        // A lease naming this worker, unknown to it, is adopted (see `take`): left to its
        // owner, the signal would wake this worker, which would pass it on again.
        let mine = row.and_then(|row| row.get::<_, Option<i64>>(2));
        if self.shared.took_or_adopted(workflow_id, taken, mine) {
            return Ok(SignalTake::Taken);
        }
        Ok(names.map_or(SignalTake::Held, SignalTake::Parked))
    }

    fn holds(&self, workflow_id: &str) -> bool {
        lock(&self.shared.held).contains_key(workflow_id)
    }

    fn held(&self) -> Vec<String> {
        lock(&self.shared.held).keys().cloned().collect()
    }

    fn held_epoch(&self, workflow_id: &str) -> Option<i64> {
        lock(&self.shared.held).get(workflow_id).copied()
    }

    fn forget_at(&self, workflow_id: &str, epoch: i64) {
        self.shared.forget_held_at(workflow_id, epoch);
    }

    fn owner(&self, workflow_id: &str) -> Result<Option<String>, StoreError> {
        let rows = self.shared.pool.with(|c| {
            c.client.query_sql(
                "SELECT owner FROM waymark_leases WHERE workflow_id = $1",
                &[&workflow_id],
            )
        })?;
        Ok(rows.first().and_then(|row| row.get(0)))
    }

    fn live_workers(&self) -> Result<Vec<String>, StoreError> {
        let rows = self.shared.pool.with(|c| {
            c.client.query_sql(
                "SELECT worker_id FROM waymark_workers WHERE expires_at > now() \
                 ORDER BY worker_id",
                &[],
            )
        })?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    fn wake(&self, workflow_id: &str) -> Result<(), StoreError> {
        self.shared.pool.with(|c| {
            c.client
                .run_sql("SELECT pg_notify($1, $2)", &[&WAKE_CHANNEL, &workflow_id])
        })?;
        Ok(())
    }

    fn wakeups(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Wakeup>> {
        lock(&self.shared.wakeups).take()
    }

    fn relay(&self, workflow_id: &str, command: Vec<u8>, patience: Duration) -> RelayFuture {
        self.shared.relay(workflow_id, command, patience)
    }

    fn take_relayed(&self, workflow_id: Option<&str>) -> Result<Vec<RelayedCommand>, StoreError> {
        self.shared.take_relayed(workflow_id)
    }

    fn answer_relayed(&self, id: i64, answer: &[u8]) -> Result<(), StoreError> {
        self.shared.answer_relayed(id, answer)
    }

    fn stats(&self) -> LeaseStats {
        self.shared.counts.stats()
    }

    fn release(&self, workflow_id: &str) -> Result<(), StoreError> {
        let me = &self.shared.worker_id;
        let _moving = self.shared.moving_leases();
        let Some(epoch) = self.held_epoch(workflow_id) else {
            return Ok(());
        };
        let released = self.shared.pool.with(|c| {
            c.client.run_sql(
                "UPDATE waymark_leases SET owner = NULL \
                 WHERE workflow_id = $1 AND owner = $2 AND epoch = $3",
                &[&workflow_id, me, &epoch],
            )
        });
        // Forgotten once written, as a park is: a lease naming this worker that it does not
        // hold is one a lost answer took, which a take or a claim adopts.
        self.forget_at(workflow_id, epoch);
        if released.is_err() {
            self.shared.unsure.store(true, Ordering::Relaxed);
        }
        released.map(drop)
    }

    fn release_all(&self) -> Result<(), StoreError> {
        let me = &self.shared.worker_id;
        let _moving = self.shared.moving_leases();
        self.shared.pool.with(|c| {
            block_on(async {
                let txn = c.client.transaction().await?;
                txn.execute(
                    "UPDATE waymark_leases SET owner = NULL WHERE owner = $1",
                    &[me],
                )
                .await?;
                txn.execute("DELETE FROM waymark_workers WHERE worker_id = $1", &[me])
                    .await?;
                txn.commit().await
            })
        })?;
        lock(&self.shared.held).clear();
        Ok(())
    }
}

/// A notification as the listener hears it.
struct Notice {
    channel: String,
    payload: String,
}

/// Listens for wake-ups and answers on a connection of its own, reconnecting after a failure
/// (and then saying that some may have been missed). Only wake-ups of workflows this worker
/// holds are passed on.
fn spawn_listener(
    driver: &Arc<Driver>,
    url: String,
    shared: std::sync::Weak<Shared>,
    wake: tokio::sync::mpsc::UnboundedSender<Wakeup>,
) -> Result<(), StoreError> {
    let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let client = listen(driver, &url, notices.clone())?;
    let reconnecting = driver.clone();
    driver.handle().spawn(async move {
        let mut client = client;
        loop {
            let next = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
            let Some(alive) = shared.upgrade() else {
                return;
            };
            if alive.stopping.load(Ordering::Relaxed) {
                return;
            }
            match next {
                Ok(Some(notice)) => alive.heard(notice, &wake),
                Ok(None) => return,
                // Quiet: a closed connection shows only here.
                Err(_) if !client.is_closed() => {}
                Err(_) => {
                    tracing::warn!("wake-up listener lost its connection; reconnecting");
                    let (url, driver) = (url.clone(), reconnecting.clone());
                    let notices = notices.clone();
                    let fresh = tokio::task::spawn_blocking(move || listen(&driver, &url, notices));
                    if let Ok(Ok(fresh)) = fresh.await {
                        client = fresh;
                        let _ = wake.send(Wakeup::Missed);
                        alive.waiting.look_again();
                    }
                }
            }
        }
    });
    Ok(())
}

impl Shared {
    /// Passes a notification on: a wake-up to the worker, an answer to its sender.
    fn heard(&self, notice: Notice, wake: &tokio::sync::mpsc::UnboundedSender<Wakeup>) {
        let Notice { channel, payload } = notice;
        if channel == relay::ANSWER_CHANNEL {
            if let Ok(id) = payload.parse() {
                self.waiting.answered(id);
            }
            return;
        }
        if !lock(&self.held).contains_key(&payload) {
            return;
        }
        let wakeup = if channel == relay::RELAY_CHANNEL {
            Wakeup::Relayed(payload)
        } else {
            Wakeup::Signal(payload)
        };
        let _ = wake.send(wakeup);
    }
}

fn listen(
    driver: &Driver,
    url: &str,
    notices: tokio::sync::mpsc::UnboundedSender<Notice>,
) -> Result<Client, StoreError> {
    let client = driver.connect(url, Some(notices))?;
    driver.prepare_session(&client)?;
    let channels = [WAKE_CHANNEL, relay::RELAY_CHANNEL, relay::ANSWER_CHANNEL];
    let sql: Vec<String> = channels.iter().map(|c| format!("LISTEN {c}")).collect();
    block_on(client.batch_execute(&sql.join("; "))).map_err(backend)?;
    Ok(client)
}

/// Plain statements on a connection, blocking.
trait Plain {
    fn run_sql(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error>;
    fn query_sql(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>;
}

impl Plain for Client {
    fn run_sql(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        block_on(self.execute(sql, params))
    }
    fn query_sql(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        block_on(self.query(sql, params))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(table: Table, key: &str) -> Write {
        Write::Put(table, key.into(), format!("{key}!").into_bytes())
    }

    fn delete(table: Table, key: &str) -> Write {
        Write::Delete(table, key.into())
    }

    /// The statements `batch` takes, each as its kind and the keys it writes.
    fn statements(batch: Vec<Write>) -> Vec<(&'static str, Vec<String>)> {
        let keys = |rows: &Rows| {
            let keys = rows
                .keys
                .iter()
                .map(|k| String::from_utf8_lossy(k).into_owned());
            keys.collect()
        };
        let run = |run: Run| match run {
            Run::Puts(rows) => ("put", keys(&rows)),
            Run::Deletes(rows) => ("delete", keys(&rows)),
            Run::DeleteRange { from, .. } => {
                ("delete range", vec![from.escape_ascii().to_string()])
            }
        };
        runs(batch).into_iter().map(run).collect()
    }

    /// A group of settled operations puts each record beside the delete of its index row:
    /// two statements, however many operations.
    #[test]
    fn interleaved_puts_and_deletes_of_different_rows_take_one_statement_each() {
        let mut batch = Vec::new();
        for key in ["a", "b", "c"] {
            batch.push(delete(Table::Unsettled, key));
            batch.push(put(Table::Operations, key));
        }
        assert_eq!(
            statements(batch),
            [
                ("delete", vec!["a".into(), "b".into(), "c".into()]),
                ("put", vec!["a".into(), "b".into(), "c".into()]),
            ]
        );
    }

    /// Writes of one row keep their order: a run is written before a later write of a row it
    /// holds, and a range deletion after everything before it.
    #[test]
    fn writes_of_one_row_keep_their_order() {
        let batch = vec![
            put(Table::Inbox, "x"),
            delete(Table::Inbox, "x"),
            put(Table::Inbox, "x"),
            put(Table::Inbox, "x"),
            delete(Table::Inbox, "y"),
            Write::DeleteRange(Table::Inbox, b"x".to_vec(), b"z".to_vec()),
            put(Table::Timers, "x"),
        ];
        assert_eq!(
            statements(batch),
            [
                ("put", vec!["x".into()]),
                ("delete", vec!["x".into()]),
                ("put", vec!["x".into()]),
                ("delete", vec!["y".into()]),
                ("put", vec!["x".into()]),
                ("delete range", vec!["x".into()]),
                ("put", vec!["x".into()]),
            ]
        );
        // The last put of a row is the value it keeps.
        let runs = runs(vec![
            put(Table::Inbox, "x"),
            Write::Put(Table::Inbox, b"x".to_vec(), b"2".to_vec()),
        ]);
        assert_eq!(
            runs.last(),
            Some(&Run::Puts(Rows {
                tables: vec![table_code(Table::Inbox)],
                keys: vec![b"x".to_vec()],
                values: vec![b"2".to_vec()],
            }))
        );
    }

    #[test]
    fn network_waits_are_bounded_by_the_lease_where_the_url_does_not_say() {
        let lease = Duration::from_secs(10);
        let mut unset: tokio_postgres::Config = "postgres://u@h/d".parse().unwrap();
        bound_network_waits(&mut unset, lease);
        assert_eq!(unset.get_connect_timeout(), Some(&lease));
        assert_eq!(unset.get_tcp_user_timeout(), Some(&lease));
        assert_eq!(unset.get_keepalives_idle(), Duration::from_secs(5));

        let url = "postgres://u@h/d?connect_timeout=60&tcp_user_timeout=90&keepalives_idle=600";
        let mut set: tokio_postgres::Config = url.parse().unwrap();
        bound_network_waits(&mut set, lease);
        assert_eq!(set.get_connect_timeout(), Some(&Duration::from_secs(60)));
        assert_eq!(set.get_tcp_user_timeout(), Some(&Duration::from_secs(90)));
        assert_eq!(set.get_keepalives_idle(), Duration::from_secs(600));
    }
}
