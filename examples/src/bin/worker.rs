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

use std::path::PathBuf;

use clap::Parser;
use waymark::codec::Keyring;
use waymark::http::{self, HttpConfig};
use waymark::Worker;
use waymark_examples::desk::await_confirmation;
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
        .register(await_confirmation);
    if let Some(keys) = Keyring::from_env()? {
        tracing::info!(key = keys.current_key_id(), "encrypting the store at rest");
        builder = builder.encryption(keys);
    }
    let worker = builder.build().await?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    // The test harness reads this line to learn the port.
    println!("listening on {}", listener.local_addr()?);
    http::serve(worker, listener, config, http::shutdown_signal()).await?;
    println!("stopped");
    Ok(())
}
