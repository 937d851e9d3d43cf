//! The demo: runs the assistant on the embedded store, lets the model time out while writing the
//! customer message after every tool ran, kills the worker before the retry, starts a new one
//! on the same store, and reports what ran, what replayed, and what the systems applied.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use waymark::approvals::{ApprovalScope, ApprovalVerdict, Intent};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::inspect::OperationStatus;
use waymark::llm::{LlmProvider, LLM_ACTIVITY};
use waymark::prelude::*;
use waymark::streams::{summarize_stream, visible_text, StreamEvent};
use waymark::telemetry::{MetricSet, Telemetry};
use waymark::testing::{Boundary, Fault, FaultPlan, PlannedFault};
use waymark::StartOptions;

use super::agent::rebook_by_agent;
use super::systems::{systems, Applications};
use super::timeline::Timeline;
use super::{
    load_order, model, notify_warehouse, rebook_carrier, rebook_shipment, search_policy,
    update_customer_eta, Models, ShipmentOutcome, ShipmentRequest,
};

/// Who decides the approval.
#[derive(Debug, Clone)]
pub enum Approver {
    /// The demo approves as this person as soon as it is asked.
    Auto(String),
    /// The demo serves the worker's API here and waits for `waymark approve`.
    Interactive {
        /// Where the API listens.
        listen: SocketAddr,
        /// `name:roles:secret`, the token the person uses.
        token: String,
    },
}

/// How to run the demo.
pub struct DemoConfig {
    /// The store.
    pub data_dir: PathBuf,
    /// The workflow id.
    pub workflow_id: String,
    /// The order the operator asks about.
    pub order_id: String,
    /// Who approves.
    pub approver: Approver,
    /// The model provider.
    pub provider: Arc<dyn LlmProvider>,
    /// The models per role.
    pub models: Models,
    /// Whether to kill the worker after the model times out (the classic failure).
    pub crash: bool,
    /// Run the assistant as an agent ([`super::agent`]): the model chooses the tools.
    pub agent: bool,
    /// More faults to inject (tests: a crash right after an effect's call, say).
    pub faults: Vec<PlannedFault>,
    /// Where step spans are collected, if a [`Timeline`] layer is installed.
    pub timeline: Option<Timeline>,
}

/// What happened while it ran, for the progress display.
pub enum Progress<'a> {
    /// An event of the workflow's durable stream.
    Event(&'a StreamEvent),
    /// Something the demo did.
    Note(String),
}

/// What the demo found.
#[derive(Debug)]
pub struct DemoReport {
    /// The workflow id.
    pub workflow_id: String,
    /// Its outcome.
    pub outcome: ShipmentOutcome,
    /// Workers killed and restarted.
    pub crashes: u32,
    /// What the systems applied for the order.
    pub applications: Applications,
    /// The operation log, rendered.
    pub operations: String,
    /// Per effect committed under an approval: (name, approved intent, executed intent).
    pub approvals: Vec<(String, String, String)>,
    /// The journal, rendered (times and generated values redacted).
    pub journal: String,
    /// The stream summarized: versions, superseded or committed, and progress events.
    pub stream: String,
    /// The customer message readers were shown (the committed version's chunks).
    pub shown: String,
    /// The replay-safety metrics, across the crash.
    pub metrics: MetricSet,
    /// What ran and what was replayed.
    pub timeline: Vec<String>,
}

/// The operator's request.
pub fn request_text(order_id: &str) -> String {
    format!("Rebook the delayed shipment {order_id}, notify the warehouse, and update the customer ETA.")
}

/// Runs the demo to the workflow's end.
pub async fn run(
    config: &DemoConfig,
    on_progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> anyhow::Result<DemoReport> {
    let telemetry = Telemetry::new();
    let faults = Arc::new(FaultPlan::default());
    if config.crash {
        // The retry of a model call that failed is where the process dies.
        faults.add(PlannedFault::at(
            LLM_ACTIVITY,
            2,
            Boundary::BeforeCall,
            Fault::Crash,
        ));
    }
    for fault in &config.faults {
        faults.add(fault.clone());
    }
    let mut host = Host::start(config, &faults, &telemetry).await?;
    let request = ShipmentRequest {
        message: request_text(&config.order_id),
        models: config.models.clone(),
    };
    let options = StartOptions {
        workflow_id: Some(config.workflow_id.clone()),
        ..StartOptions::default()
    };
    let id = config.workflow_id.as_str();
    let run = match config.agent {
        true => {
            host.worker
                .start_with(rebook_by_agent, request, options)
                .await?
        }
        false => {
            host.worker
                .start_with(rebook_shipment, request, options)
                .await?
        }
    };
    if run.existed() {
        bail!(
            "workflow {id} already exists in {}",
            config.data_dir.display()
        );
    }
    let mut shown_up_to = 0;
    let mut crashes = 0;
    let outcome = loop {
        shown_up_to = show_progress(&host.worker, id, shown_up_to, on_progress)?;
        host.approve_pending(config, id, on_progress).await?;
        let handle = match config.agent {
            true => host.worker.handle(rebook_by_agent, id),
            false => host.worker.handle(rebook_shipment, id),
        };
        let waited = tokio::time::timeout(Duration::from_millis(50), handle.result()).await;
        if !faults.take_crashes().is_empty() {
            // The process dies where the plan says once the run has stopped at its crash: what
            // its executor was writing then lands, as in every run of the demo.
            let _ = tokio::time::timeout(Duration::from_secs(5), handle.result()).await;
            crashes += 1;
            on_progress(Progress::Note(
                "the worker process died; starting a new one".into(),
            ));
            if let Some(timeline) = &config.timeline {
                timeline.mark(id, "---- the worker process dies ----");
            }
            host.kill().await?;
            host = Host::start(config, &faults, &telemetry).await?;
            continue;
        }
        match waited {
            Ok(Ok(outcome)) => break outcome,
            Ok(Err(error)) => {
                host.kill().await?;
                return Err(error).context("the workflow did not complete");
            }
            Err(_elapsed) => {}
        }
    };
    show_progress(&host.worker, id, shown_up_to, on_progress)?;
    let report = report(config, &host.worker, outcome, crashes, &telemetry)?;
    host.kill().await?;
    Ok(report)
}

/// Prints stream events after `after`; returns the last one shown.
fn show_progress(
    worker: &Worker,
    id: &str,
    after: u64,
    on_progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> anyhow::Result<u64> {
    let events = worker.stream(id, after)?;
    for event in &events {
        on_progress(Progress::Event(event));
    }
    Ok(events.last().map_or(after, |e| e.seq))
}

fn report(
    config: &DemoConfig,
    worker: &Worker,
    outcome: ShipmentOutcome,
    crashes: u32,
    telemetry: &Telemetry,
) -> anyhow::Result<DemoReport> {
    let id = &config.workflow_id;
    let journal = worker.journal(id)?;
    let writer = journal.iter().rev().find_map(|entry| match entry {
        waymark::inspect::Entry::ActivityScheduledAt { seq, identity, .. }
            if identity.name == LLM_ACTIVITY =>
        {
            Some(*seq)
        }
        _ => None,
    });
    let events = worker.stream(id, 0)?;
    Ok(DemoReport {
        workflow_id: id.clone(),
        outcome,
        crashes,
        applications: systems().applications(&config.order_id),
        operations: worker.render_operations(id)?,
        approvals: approvals(worker, id)?,
        journal: worker.render_journal(id)?,
        stream: summarize_stream(&events),
        shown: writer
            .map(|seq| visible_text(&events, seq))
            .unwrap_or_default(),
        metrics: telemetry.snapshot(),
        timeline: config
            .timeline
            .as_ref()
            .map(|t| t.lines(id))
            .unwrap_or_default(),
    })
}

/// For each effect committed under an approval: the intent the approved scope authorises for
/// it (read back from the stored scope), and the intent recomputed from the arguments the
/// operation log says executed.
fn approvals(worker: &Worker, id: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut found = Vec::new();
    for (key, record) in worker.operations(id)? {
        let (OperationStatus::Committed { .. }, Some(grant)) = (&record.status, &record.approval)
        else {
            continue;
        };
        let executed = Intent {
            operation: record.operation.clone(),
            version: record.version,
            idempotency_key: key,
            arguments: record.arguments.decode()?,
        };
        let scope = worker.artifact(&grant.granted.scope.hex())?;
        let scope: ApprovalScope = match scope {
            Some(scope) => scope.content.decode()?,
            None => anyhow::bail!(
                "the approved scope {} is not stored",
                grant.granted.scope.hex()
            ),
        };
        let listed = scope.intents.iter().any(|i| i.digest == grant.intent.hex());
        let approved = match listed {
            true => grant.intent.hex(),
            false => format!("{} (not in the approved scope)", grant.intent.hex()),
        };
        found.push((record.operation, approved, executed.digest().hex()));
    }
    Ok(found)
}

/// The worker, and the API while a person is asked to approve.
struct Host {
    worker: Arc<Worker>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Host {
    async fn start(
        config: &DemoConfig,
        faults: &Arc<FaultPlan>,
        telemetry: &Telemetry,
    ) -> anyhow::Result<Self> {
        let llm_options = ActivityOptions::default().initial_backoff(Duration::from_millis(300));
        let worker = Worker::builder()
            .data_dir(&config.data_dir)
            .register(rebook_shipment)
            .register(rebook_by_agent)
            .register(load_order)
            .register(search_policy)
            .register(rebook_carrier)
            .register(notify_warehouse)
            .register(update_customer_eta)
            .llm(config.provider.clone())
            .llm_prices(model::prices()?)
            .llm_options(llm_options)
            .faults(faults.clone())
            .telemetry(telemetry.clone())
            .build()
            .await?;
        Ok(Self {
            worker: Arc::new(worker),
            server: None,
        })
    }

    /// Decides what is pending: as the demo approver, or by waiting for a person.
    async fn approve_pending(
        &mut self,
        config: &DemoConfig,
        id: &str,
        on_progress: &mut (dyn FnMut(Progress<'_>) + Send),
    ) -> anyhow::Result<()> {
        let pending = self.worker.pending_approvals(id)?;
        match &config.approver {
            Approver::Auto(approver) => {
                for request in pending {
                    let hash = &request.artifact_hash;
                    let verdict = ApprovalVerdict::Approve;
                    self.worker
                        .decide_approval_request(id, request.request, hash, approver, verdict)
                        .await?;
                    on_progress(Progress::Note(format!("{approver} approved {hash}")));
                }
            }
            Approver::Interactive { listen, token } => match pending.first() {
                Some(request) if self.server.is_none() => {
                    self.serve(*listen, token).await?;
                    let (name, secret) = token_parts(token);
                    let hash = &request.artifact_hash;
                    let plan = self.worker.artifact(hash)?.map(|a| a.content);
                    let plan = plan.and_then(|p| p.decode::<serde_json::Value>().ok());
                    on_progress(Progress::Note(format!(
                        "approval needed for plan {}\n    risk: {}\n  \
                         approve it from another terminal:\n  \
                         cargo run -p waymark-cli -- --url http://{listen} --token {secret} \
                         approve {id} {hash} --as {name}\n  \
                         (or reject it: add --reject \"<reason>\")",
                        plan.unwrap_or_default(),
                        request.risk
                    )));
                }
                Some(_) => {}
                None => self.stop_serving().await,
            },
        }
        Ok(())
    }

    async fn serve(&mut self, listen: SocketAddr, token: &str) -> anyhow::Result<()> {
        let token = ApiToken::parse(token).map_err(anyhow::Error::msg)?;
        let config = HttpConfig {
            tokens: vec![token],
            ..HttpConfig::default()
        };
        let router = http::router(self.worker.clone(), &config)?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        self.server = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        }));
        Ok(())
    }

    async fn stop_serving(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
    }

    /// Drops the worker as a killed process would leave it (its tasks aborted, nothing more
    /// written); the store is closed once the API lets go of it.
    async fn kill(mut self) -> anyhow::Result<()> {
        self.stop_serving().await;
        let mut worker = self.worker;
        for _ in 0..100 {
            match Arc::try_unwrap(worker) {
                Ok(worker) => {
                    worker.shutdown().await;
                    return Ok(());
                }
                Err(shared) => worker = shared,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("API connections still hold the worker; cannot restart it")
    }
}

fn token_parts(token: &str) -> (&str, &str) {
    let name = token.split(':').next().unwrap_or_default();
    let secret = token.rsplit(':').next().unwrap_or_default();
    (name, secret)
}
