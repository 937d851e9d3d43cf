//! The smallest complete worker of a crate of one's own, serving the HTTP API: the README shows
//! this file as it is (`examples/tests/readme_own_worker.rs` keeps the two the same).

use waymark::http::{self, HttpConfig};
use waymark::prelude::*;

/// Reads a carrier's ETA: retried on failure, its result journaled.
#[activity]
async fn fetch_eta(order_id: String) -> Result<u32, ActivityError> {
    Ok(order_id.len() as u32) // call the carrier's API here
}

/// Waits an hour, durably, then says whether the order is late.
#[workflow]
async fn check_delay(ctx: WorkflowContext, order_id: String) -> Result<bool, WorkflowError> {
    let eta_days = ctx.activity(fetch_eta, order_id).await?;
    ctx.sleep(std::time::Duration::from_secs(3600)).await;
    Ok(eta_days > 3)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Tokens from WAYMARK_TOKENS (`name:read+write:secret`, comma-separated) or the file
    // WAYMARK_TOKENS_FILE names; TLS from WAYMARK_TLS_CERT and WAYMARK_TLS_KEY.
    let config = HttpConfig::from_env()?;
    // One worker process per data dir: the store is locked while it is open.
    let worker = Worker::builder()
        .data_dir("./waymark-data")
        .register(check_delay)
        .register(fetch_eta)
        .build()
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    // Until SIGTERM or Ctrl-C; requests in flight finish, and running workflows resume on the
    // next start.
    http::serve(worker, listener, config, http::shutdown_signal()).await?;
    Ok(())
}
