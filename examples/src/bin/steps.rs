//! A worker process running one `numbered_steps` workflow to completion; the crash test kills it
//! with SIGKILL at random moments and starts it again.
//!
//! `steps DATA_DIR LEDGER COUNT STEP_MS`

use std::path::PathBuf;
use std::time::Duration;

use waymark::StartOptions;
use waymark::Worker;
use waymark_examples::steps::{configure, numbered_steps, step, StepConfig};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data_dir, ledger, count, step_ms] = args.as_slice() else {
        anyhow::bail!("usage: steps DATA_DIR LEDGER COUNT STEP_MS");
    };
    configure(StepConfig {
        ledger: PathBuf::from(ledger),
        step_duration: Duration::from_millis(step_ms.parse()?),
    });
    let worker = Worker::builder()
        .data_dir(data_dir)
        .register(numbered_steps)
        .register(step)
        .build()
        .await?;
    let options = StartOptions {
        request_id: Some("steps-run".to_owned()),
        ..StartOptions::default()
    };
    let run = worker
        .start_with(numbered_steps, count.parse()?, options)
        .await?;
    let sum = run.result().await?;
    println!("result {sum}");
    worker.shutdown().await;
    Ok(())
}
