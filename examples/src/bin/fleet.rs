//! One of many workers on one PostgreSQL database: starts its share of `fleet` workflows (by
//! request id, so a replacement process finds them) and works until every workflow of the
//! fleet has completed, whichever worker ran it. Exits with status 3 if its leases lapse.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use waymark::store::{PgOptions, PgStore, Store, WorkflowStatus};
use waymark::{StartOptions, Worker};
use waymark_examples::fleet::{configure, fleet, fleet_step, FleetConfig};

/// A worker of the fleet.
#[derive(Parser)]
struct Args {
    /// The database every worker shares.
    #[arg(long, env = "WAYMARK_DATABASE_URL")]
    database_url: String,
    /// The schema Waymark's tables live in.
    #[arg(long)]
    schema: Option<String>,
    /// How long this worker's leases last without a heartbeat, in milliseconds.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Workflows in the fleet.
    #[arg(long)]
    workflows: u32,
    /// The first workflow this worker starts, and how many.
    #[arg(long, default_value_t = 0)]
    start_from: u32,
    #[arg(long, default_value_t = 0)]
    start_count: u32,
    /// Effects per workflow.
    #[arg(long)]
    steps: u64,
    /// Where the downstream keeps its files.
    #[arg(long)]
    log_dir: PathBuf,
    /// Simulated work per effect, in milliseconds.
    #[arg(long, default_value_t = 10)]
    step_delay_ms: u64,
}

fn workflow_id(index: u32) -> String {
    format!("fleet-{index}")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    configure(FleetConfig {
        dir: args.log_dir.clone(),
        step_delay: Duration::from_millis(args.step_delay_ms),
    });
    let mut options = PgOptions::new(&args.database_url);
    options.schema = args.schema.clone();
    options.lease = Duration::from_millis(args.lease_ms);
    let store = tokio::task::spawn_blocking(move || PgStore::connect(&options, None)).await??;
    let store: Arc<dyn Store> = Arc::new(store);
    let worker = Worker::builder()
        .store(store.clone())
        .register(fleet)
        .register(fleet_step)
        .build()
        .await?;
    eprintln!("worker {} up", worker.worker_id().unwrap_or_default());
    for index in args.start_from..args.start_from + args.start_count {
        let options = StartOptions {
            workflow_id: Some(workflow_id(index)),
            request_id: Some(workflow_id(index)),
            ..StartOptions::default()
        };
        worker
            .start_with(fleet, (index, args.steps), options)
            .await?;
    }
    tokio::select! {
        () = worker.lapsed() => {
            eprintln!("lapsed: this worker's leases lapsed; exiting");
            std::process::exit(3);
        }
        done = all_completed(store, args.workflows) => done?,
    }
    println!("completed {}", args.workflows);
    worker.shutdown().await;
    Ok(())
}

/// Waits until every workflow of the fleet has completed.
async fn all_completed(store: Arc<dyn Store>, workflows: u32) -> anyhow::Result<()> {
    loop {
        let reading = store.clone();
        let done = tokio::task::spawn_blocking(move || -> anyhow::Result<bool> {
            for index in 0..workflows {
                let record = reading.workflow(&workflow_id(index))?;
                if record.is_none_or(|r| r.status != WorkflowStatus::Completed) {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await??;
        if done {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
