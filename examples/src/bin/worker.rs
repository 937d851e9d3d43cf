//! A worker process: hosts the example workflows and serves the HTTP API until SIGTERM (or
//! Ctrl-C), then stops taking requests, lets those in flight finish and exits 0. Every step is
//! durable, so workflows still running resume on the next start.
//!
//! `cargo run -p waymark-examples --bin worker -- --data-dir ./waymark-data --listen 127.0.0.1:8080`
//!
//! Tokens come from `WAYMARK_TOKENS` (`name:role+role:secret`, comma-separated) or the file
//! `WAYMARK_TOKENS_FILE` names; without any, the worker refuses to serve unless started with
//! `--insecure-local` on a loopback address (every caller then has every role). With
//! `WAYMARK_ENCRYPTION_KEYS` (`id:64 hex digits`, current key first) or the file
//! `WAYMARK_ENCRYPTION_KEYS_FILE` names, every value the store writes is encrypted.
//!
//! With `--database-url` (or `WAYMARK_DATABASE_URL`) the store is PostgreSQL instead of the
//! data dir: start as many workers on one database as you like; each runs the workflows it
//! leases, and takes over those of a worker that stopped heartbeating.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use waymark::codec::Keyring;
use waymark::http::{self, HttpConfig};
use waymark::Worker;
use waymark_examples::desk::{approve_refund, await_confirmation};
use waymark_examples::shipment::{carrier_eta, load_order, rebook_delayed, request_quote};

/// Serve the example workflows over HTTP.
#[derive(Parser)]
struct Args {
    /// The worker's store.
    #[arg(long, default_value = "./waymark-data")]
    data_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Serve without tokens, every caller with every role: only on a loopback address.
    #[arg(long)]
    insecure_local: bool,
    /// A JSON field of activity inputs journaled as its digest only (repeatable; the
    /// variable takes them comma-separated).
    #[arg(
        long = "redact-field",
        env = "WAYMARK_REDACT_FIELDS",
        value_delimiter = ','
    )]
    redact_fields: Vec<String>,
    /// A PostgreSQL database many workers share, instead of the data dir.
    #[arg(long, env = "WAYMARK_DATABASE_URL")]
    database_url: Option<String>,
    /// How long this worker's leases last without a heartbeat (with `--database-url`).
    #[arg(long, default_value_t = 30)]
    lease_secs: u64,
    /// The schema the workers' tables live in (with `--database-url`), created if missing;
    /// without it, the connection's `search_path`.
    #[arg(long, env = "WAYMARK_DATABASE_SCHEMA")]
    schema: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut config = HttpConfig::from_env().map_err(anyhow::Error::msg)?;
    config.insecure_local = args.insecure_local;
    let mut builder = Worker::builder()
        .data_dir(&args.data_dir)
        .redact_fields(args.redact_fields)
        .register(rebook_delayed)
        .register(load_order)
        .register(carrier_eta)
        .register(request_quote)
        .register(await_confirmation)
        .register(approve_refund);
    let keys = Keyring::from_env()?.map(Arc::new);
    if let Some(keys) = &keys {
        tracing::info!(key = keys.current_key_id(), "encrypting the store at rest");
        builder = builder.codec(keys.clone());
    }
    if let Some(url) = args.database_url {
        let mut options = waymark::store::PgOptions::new(url);
        options.lease = Duration::from_secs(args.lease_secs);
        options.schema = args.schema;
        let codec = keys.map(|keys| keys as Arc<dyn waymark::codec::Codec>);
        let connect = move || waymark::store::PgStore::connect(&options, codec);
        let store = tokio::task::spawn_blocking(connect).await??;
        builder = builder.store(Arc::new(store));
    }
    let worker = builder.build().await?;
    if let Some(id) = worker.worker_id() {
        tracing::info!(worker_id = %id, "sharing the PostgreSQL store with other workers");
    }
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    // The test harness reads this line to learn the port.
    println!("listening on {}", listener.local_addr()?);
    let lapsed = worker.on_lapse();
    let stop = async move {
        tokio::select! {
            () = http::shutdown_signal() => {}
            () = lapsed => tracing::error!("this worker's leases lapsed; stopping"),
        }
    };
    http::serve(worker, listener, config, stop).await?;
    println!("stopped");
    Ok(())
}
