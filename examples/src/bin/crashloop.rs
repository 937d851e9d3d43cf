//! Runs or resumes one `crashloop` workflow to completion; the crash test kills it with SIGKILL
//! at random moments and runs it again until it prints `completed <N>`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use waymark::{StartOptions, Worker};
use waymark_examples::crashloop::{configure, crashloop, read_step, write_step, CrashloopConfig};

/// Run (or resume) one workflow of N read-then-effect iterations.
#[derive(Parser)]
struct Args {
    /// The worker's store.
    #[arg(long)]
    data_dir: PathBuf,
    /// The workflow to run or resume.
    #[arg(long)]
    workflow_id: String,
    /// Iterations.
    #[arg(long)]
    steps: u64,
    /// The log the steps append to (the effect's downstream).
    #[arg(long)]
    log: PathBuf,
    /// Simulated work per step, in milliseconds.
    #[arg(long, default_value_t = 10)]
    step_delay_ms: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    configure(CrashloopConfig {
        log: args.log,
        step_delay: Duration::from_millis(args.step_delay_ms),
    });
    let worker = Worker::builder()
        .data_dir(&args.data_dir)
        .register(crashloop)
        .register(read_step)
        .register(write_step)
        .build()
        .await?;
    // The id doubles as the request id, so a second run finds the first one's workflow.
    let options = StartOptions {
        workflow_id: Some(args.workflow_id.clone()),
        request_id: Some(args.workflow_id),
        ..StartOptions::default()
    };
    let run = worker.start_with(crashloop, args.steps, options).await?;
    let completed = run.result().await?;
    println!("completed {completed}");
    worker.shutdown().await;
    Ok(())
}
