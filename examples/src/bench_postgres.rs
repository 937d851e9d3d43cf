//! The `bench` binary's PostgreSQL figures: a step against one synced single-row
//! `INSERT … COMMIT` on the same server, throughput with one, two and four workers on one
//! database, and the time other workers take to resume the workflows of a killed one.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::try_join_all;
use tokio_postgres::NoTls;
use waymark::store::{PgOptions, PgStore, Store};
use waymark::{StartOptions, Worker};

use crate::bench::{awaits_wake, median, setup, steps};

/// A schema of the benchmark's own, dropped when done.
pub struct Schema {
    url: String,
    name: String,
}

impl Schema {
    /// A new schema on the database at `url`.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            name: format!("waymark_bench_{}", std::process::id()),
        }
    }

    /// The name the workers are pointed at.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Options for one worker in this schema, its leases lasting `lease`.
    pub fn options(&self, lease: Duration) -> PgOptions {
        let mut options = PgOptions::new(&self.url);
        options.schema = Some(self.name.clone());
        options.lease = lease;
        options
    }

    async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// Drops the schema and all it holds.
    pub async fn drop_all(&self) -> anyhow::Result<()> {
        let client = self.client().await?;
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        client.batch_execute(&sql).await?;
        Ok(())
    }
}

/// Seconds per single-row `INSERT` of `size` bytes committed on its own with
/// `synchronous_commit = on` (median of `count`): the floor of one durable write there.
pub async fn synced_insert_seconds(
    schema: &Schema,
    size: usize,
    count: usize,
) -> anyhow::Result<f64> {
    let client = schema.client().await?;
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {name}; \
             CREATE TABLE IF NOT EXISTS {name}.raw_insert (id bigint PRIMARY KEY, value bytea); \
             SET synchronous_commit = on",
            name = schema.name
        ))
        .await?;
    let insert = client
        .prepare(&format!(
            "INSERT INTO {}.raw_insert (id, value) VALUES ($1, $2)",
            schema.name
        ))
        .await?;
    let value = vec![7u8; size];
    let mut times = Vec::with_capacity(count);
    for id in 0..count as i64 {
        let started = Instant::now();
        client.execute(&insert, &[&id, &value]).await?;
        times.push(started.elapsed().as_secs_f64());
    }
    Ok(median(times))
}

/// A worker of the benchmark's workflows on the shared database.
pub async fn worker(options: PgOptions) -> anyhow::Result<(Worker, Arc<dyn Store>)> {
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&options, None)).await??;
    let store: Arc<dyn Store> = Arc::new(store);
    let worker = setup(Worker::builder().store(store.clone()))
        .build()
        .await?;
    Ok((worker, store))
}

fn with_id(id: String) -> StartOptions {
    StartOptions {
        workflow_id: Some(id),
        ..StartOptions::default()
    }
}

/// Steps per second of `concurrency` workflows of `n` steps each, started all at once and
/// spread evenly over `workers` (each runs what it started).
pub async fn steps_per_second(
    workers: &[Worker],
    concurrency: usize,
    n: u64,
    round: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let starts = (0..concurrency).map(|i| {
        let worker = &workers[i % workers.len()];
        let id = format!("concurrent-{}-{round}-{i}", workers.len());
        async move { worker.start_with(steps, n, with_id(id)).await }
    });
    let runs = try_join_all(starts).await?;
    try_join_all(runs.iter().map(|run| run.result())).await?;
    Ok((concurrency as u64 * n) as f64 / started.elapsed().as_secs_f64())
}

/// Starts `count` workflows that wait for a signal, starting up to 256 at a time, and waits until none is
/// resident.
pub async fn start_waiting(worker: &Worker, count: usize) -> anyhow::Result<()> {
    let ids: Vec<String> = (0..count).map(|i| format!("waiting-{i}")).collect();
    for chunk in ids.chunks(256) {
        let starts = chunk
            .iter()
            .map(|id| worker.start_with(awaits_wake, 0, with_id(id.clone())));
        try_join_all(starts).await?;
    }
    crate::bench::wait_until_idle(worker, Duration::from_secs(600)).await
}

/// What taking over a killed worker's workflows took.
pub struct Takeover {
    /// From the kill until every workflow was claimed, replayed and out of memory again here.
    pub total_ms: f64,
    /// From the first claim until every workflow was out of memory again here: claiming and replay,
    /// without waiting for the lease to lapse.
    pub after_first_claim_ms: f64,
}

/// Starts the benchmark binary as a worker that holds `count` waiting workflows in `schema` of the
/// database at `url`, and waits;
/// returns once they are out of memory.
pub fn spawn_holding_worker(
    url: &str,
    schema: &str,
    count: usize,
    lease: Duration,
) -> anyhow::Result<Child> {
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["wait-on-postgres", "--database-url", url])
        .args(["--schema", schema])
        .args(["--count", &count.to_string()])
        .args(["--lease-ms", &lease.as_millis().to_string()])
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    anyhow::ensure!(line.trim() == "waiting", "the holding worker said {line:?}");
    Ok(child)
}

/// How long the survivor must stay idle holding every lease for the takeover to be done.
const SETTLED: Duration = Duration::from_millis(20);

/// Kills `victim` and times `survivor` taking over its `count` workflows.
pub async fn take_over(
    mut victim: Child,
    survivor: &Worker,
    store: &Arc<dyn Store>,
    count: usize,
) -> anyhow::Result<Takeover> {
    let leases = store
        .leases()
        .ok_or_else(|| anyhow::anyhow!("the survivor's store has no leases"))?;
    let killed = Instant::now();
    victim.kill()?;
    victim.wait()?;
    let deadline = killed + Duration::from_secs(600);
    let (mut first_claim, mut idle_since) = (None, None);
    // A claimed page is held a moment before its runs are resident: done is all held and
    // none resident, for a while.
    let done = loop {
        let held = leases.held().len();
        let now = Instant::now();
        if held > 0 && first_claim.is_none() {
            first_claim = Some(now);
        }
        match held >= count && survivor.resident_workflows() == 0 {
            true => {
                let since = *idle_since.get_or_insert(now);
                if now - since >= SETTLED {
                    break since;
                }
            }
            false => idle_since = None,
        }
        anyhow::ensure!(now < deadline, "{held} of {count} taken over");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let first_claim = first_claim.unwrap_or(done);
    Ok(Takeover {
        total_ms: (done - killed).as_secs_f64() * 1e3,
        after_first_claim_ms: (done - first_claim).as_secs_f64() * 1e3,
    })
}
