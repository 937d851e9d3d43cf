//! Runs the delayed-shipment workflow on the embedded store, no server, no network.
//!
//! `cargo run -p waymark-examples --bin shipment [ORDER_ID] [DATA_DIR]`
//!
//! Run it twice with the same order id: the second run finds the first by its request id and
//! prints the recorded decision without calling a carrier again.

use waymark::prelude::*;
use waymark::StartOptions;
use waymark_examples::shipment::{
    carrier_eta, load_order, rebook_delayed, request_quote, RebookRequest,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let order_id = args.next().unwrap_or_else(|| "A-1042".to_owned());
    let data_dir = args.next().unwrap_or_else(|| "./waymark-data".to_owned());

    let worker = Worker::builder()
        .data_dir(&data_dir)
        .register(rebook_delayed)
        .register(load_order)
        .register(carrier_eta)
        .register(request_quote)
        .build()
        .await?;
    let request = RebookRequest {
        order_id: order_id.clone(),
        promised_within_days: 4,
    };
    let options = StartOptions {
        request_id: Some(format!("rebook-{order_id}")),
        ..StartOptions::default()
    };
    let run = worker.start_with(rebook_delayed, request, options).await?;
    println!(
        "workflow {} ({})",
        run.id(),
        if run.existed() {
            "already known: replaying its record"
        } else {
            "started"
        }
    );
    let decision = run.result().await?;
    println!(
        "decision: {decision:?}\n\njournal:\n{}",
        worker.render_journal(run.id())?
    );
    worker.shutdown().await;
    Ok(())
}
