//! The delayed-shipment assistant, end to end, on the embedded store: no server, no network
//! (unless `WAYMARK_LLM_BASE_URL` names a model server).
//!
//! `cargo run -p waymark-examples --bin rebook [-- --agent] [--interactive] [--data-dir D]
//! [--order ID]`
//!
//! The model times out while writing the customer message, after every tool ran, and the
//! worker process dies; a new worker recovers the workflow from its journal. The summary shows
//! what ran, what was replayed, each effect applied exactly once, the approved hash equal to the
//! executed one, the streamed answer, and the replay-safety metrics.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};
use waymark::streams::{StreamEvent, StreamItem};
use waymark::telemetry::names::*;
use waymark::telemetry::MetricSet;
use waymark_examples::rebook::demo::{self, Approver, DemoConfig, DemoReport, Progress};
use waymark_examples::rebook::model;
use waymark_examples::rebook::timeline::Timeline;

#[derive(Parser)]
#[command(about = "Rebook a delayed shipment through a crash, on the embedded store")]
struct Args {
    /// Where the store lives: a new directory (the demo's faults apply to every workflow in
    /// the worker). Default: a fresh `./waymark-data/rebook-<time>`.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The order to rebook.
    #[arg(long, default_value = "ORD-1042")]
    order: String,
    /// Wait for `waymark approve` instead of approving as the demo approver.
    #[arg(long)]
    interactive: bool,
    /// Where the API listens with --interactive.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Run without the injected timeout and crash.
    #[arg(long)]
    no_crash: bool,
    /// Run the assistant as an agent: the model chooses the tools, a person approves the
    /// exact rebooking it chose.
    #[arg(long)]
    agent: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let timeline = Timeline::default();
    let logs = EnvFilter::try_from_default_env().unwrap_or_else(|_| "off".into());
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_filter(logs))
        .with(timeline.layer())
        .init();

    let data_dir = match args.data_dir {
        Some(dir) if dir.exists() && dir.read_dir()?.next().is_some() => {
            anyhow::bail!(
                "{} is not empty: the demo injects its faults into every workflow of the worker, \
                 so give it a new directory",
                dir.display()
            )
        }
        Some(dir) => dir,
        None => fresh_data_dir()?,
    };
    let (provider, models, source) = match args.agent {
        true => model::agent_provider_from_env(!args.no_crash),
        false => model::provider_from_env(!args.no_crash),
    };
    let approver = match args.interactive {
        false => Approver::Auto("dana@ops (demo approver)".into()),
        true => Approver::Interactive {
            listen: args.listen,
            token: format!("you:read+write+approve:{:016x}", rand::random::<u64>()),
        },
    };
    let config = DemoConfig {
        data_dir: data_dir.clone(),
        workflow_id: format!("rebook-{}", args.order),
        order_id: args.order.clone(),
        approver,
        provider,
        models,
        crash: !args.no_crash,
        agent: args.agent,
        faults: Vec::new(),
        timeline: Some(timeline),
    };
    println!("Waymark: the delayed-shipment assistant");
    println!("  model:   {source}");
    println!("  store:   {} (embedded RocksDB)", data_dir.display());
    println!("  request: {}\n", demo::request_text(&args.order));
    println!("progress");
    let mut display = ProgressDisplay::default();
    let report = demo::run(&config, &mut |progress| display.show(progress)).await?;
    display.end_line();
    print_report(&report);
    println!(
        "\nthe store is kept: cargo run -p waymark-cli -- --data-dir {} stats",
        data_dir.display()
    );
    Ok(())
}

/// `./waymark-data/rebook-<unix time>`: every run starts on an empty store.
fn fresh_data_dir() -> anyhow::Result<PathBuf> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(PathBuf::from(format!(
        "./waymark-data/rebook-{}",
        now.as_secs()
    )))
}

/// Prints stream events as they arrive: progress events on their own lines, tokens inline.
#[derive(Default)]
struct ProgressDisplay {
    in_text: Option<(u32, u32)>,
}

impl ProgressDisplay {
    fn show(&mut self, progress: Progress<'_>) {
        match progress {
            Progress::Note(note) => {
                self.end_line();
                println!("  ! {note}");
            }
            Progress::Event(event) => self.event(event),
        }
        let _ = std::io::stdout().flush();
    }

    fn event(&mut self, event: &StreamEvent) {
        match &event.item {
            StreamItem::Chunk {
                step,
                response_version,
                text,
            } => {
                if self.in_text != Some((*step, *response_version)) {
                    self.end_line();
                    print!("  > writer v{response_version}: ");
                    self.in_text = Some((*step, *response_version));
                }
                print!("{text}");
            }
            StreamItem::Superseded {
                response_version,
                reason,
                ..
            } => {
                self.end_line();
                println!("  x v{response_version} superseded: {reason}");
            }
            StreamItem::Committed {
                response_version, ..
            } => {
                self.end_line();
                println!("  = v{response_version} committed");
            }
            StreamItem::Progress { name, detail, .. } => {
                self.end_line();
                let detail = detail.decode::<serde_json::Value>().unwrap_or_default();
                println!("  - {name} {detail}");
            }
        }
    }

    fn end_line(&mut self) {
        if self.in_text.take().is_some() {
            println!();
        }
    }
}

fn print_report(report: &DemoReport) {
    println!("\ntimeline (from the waymark.step spans)");
    for line in &report.timeline {
        println!("  {line}");
    }
    println!("\noperation log");
    for line in report.operations.lines() {
        println!("  {line}");
    }
    println!("\nintents checked against the approval right before each effect");
    for (effect, approved, executed) in &report.approvals {
        let same = if approved == executed { "=" } else { "!=" };
        println!("  {effect:<20} approved {approved} {same} executed {executed}");
    }
    println!("\nstream");
    for line in report.stream.lines() {
        println!("  {line}");
    }
    let applied = &report.applications;
    let once = [
        applied.rebookings,
        applied.warehouse_notices,
        applied.eta_updates,
    ] == [1, 1, 1];
    let verdict = if once {
        " (each effect exactly once)"
    } else {
        ""
    };
    println!("\nwhat the systems applied{verdict}");
    println!("  carrier rebookings   {}", applied.rebookings);
    println!("  warehouse notices    {}", applied.warehouse_notices);
    println!("  customer ETA updates {}", applied.eta_updates);
    println!("\nreplay-safety metrics");
    print_metrics(&report.metrics);
    println!(
        "\noutcome after {} crash(es): {:?}",
        report.crashes, report.outcome
    );
}

/// A label, a metric name and the labels to match.
type MetricRow<'a> = (&'a str, String, &'a [(&'a str, &'a str)]);

fn print_metrics(metrics: &MetricSet) {
    let calls: [(&str, &str); 5] = [
        ("model calls made", "llm"),
        ("effect calls made", "effect"),
        ("read calls made", "activity"),
        ("retrieval calls made", "retrieval"),
        ("all calls made", ""),
    ];
    for (label, kind) in calls {
        let labels: &[(&str, &str)] = if kind.is_empty() {
            &[]
        } else {
            &[("kind", kind)]
        };
        row(label, metrics.value(INVOCATIONS, labels));
    }
    let rows: [MetricRow<'_>; 10] = [
        ("calls needed (ideal)", IDEAL_INVOCATIONS.into(), &[]),
        (
            "retry amplification",
            format!("{RETRY_AMPLIFICATION}_sum"),
            &[],
        ),
        (
            "resumed in flight",
            RESUMES.into(),
            &[("point", "in_flight_call")],
        ),
        (
            "resumed in backoff",
            RESUMES.into(),
            &[("point", "retry_backoff")],
        ),
        ("duplicate intents", DUPLICATE_INTENTS.into(), &[]),
        ("downstream repeat calls", DOWNSTREAM_REPEATS.into(), &[]),
        (
            "approval hash mismatches",
            APPROVAL_HASH_MISMATCHES.into(),
            &[],
        ),
        ("stream versions superseded", STREAM_SUPERSEDED.into(), &[]),
        ("stream/commit divergence", STREAM_DIVERGENCE.into(), &[]),
        ("model cost (micro-units)", LLM_COST.into(), &[]),
    ];
    for (label, name, labels) in rows {
        row(label, metrics.value(&name, labels));
    }
    let depth = metrics.value(&format!("{VALIDATOR_DEPTH}_sum"), &[]);
    let ladders = metrics.value(&format!("{VALIDATOR_DEPTH}_count"), &[]);
    println!(
        "  {:<28} {:>8}",
        "repair rungs / ladders",
        format!("{depth}/{ladders}")
    );
    let wasted = metrics.value(LLM_WASTED_COST, &[("failed_at", "validator")]);
    row("cost of rejected answers", wasted);
}

fn row(label: &str, value: f64) {
    println!("  {label:<28} {:>8}", format_value(value));
}

fn format_value(value: f64) -> String {
    match value.fract() == 0.0 {
        true => format!("{value:.0}"),
        false => format!("{value:.2}"),
    }
}
