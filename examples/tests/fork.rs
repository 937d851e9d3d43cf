//! Forking the rebooking workflow: at every entry of its journal, and with another model for
//! the steps that run anew. A fork replays the prefix, runs the rest live, and never asks a
//! downstream again for an effect its source committed: it answers it from the operation
//! record it inherited.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use waymark::approvals::ApprovalVerdict;
use waymark::inspect::Entry;
use waymark::llm::{ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, LLM_ACTIVITY};
use waymark::prelude::*;
use waymark::{ForkError, ForkOptions, StartOptions, INHERITED_BY};
use waymark_examples::rebook::model::{scripted, scripted_models};
use waymark_examples::rebook::systems::{systems, Applications};
use waymark_examples::rebook::{
    load_order, notify_warehouse, rebook_carrier, rebook_shipment, search_policy,
    update_customer_eta, ShipmentOutcome, ShipmentRequest,
};

/// The scripted model, noting which model each call asked for.
#[derive(Clone)]
struct Noting {
    inner: Arc<dyn LlmProvider>,
    asked: Arc<Mutex<Vec<String>>>,
}

impl Noting {
    fn new() -> Self {
        Self {
            inner: scripted(false),
            asked: Arc::default(),
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.asked.lock().unwrap())
    }
}

impl LlmProvider for Noting {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        self.asked.lock().unwrap().push(request.model.clone());
        self.inner.complete(request)
    }

    fn stream(
        &self,
        request: LlmRequest,
        chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        self.asked.lock().unwrap().push(request.model.clone());
        self.inner.stream(request, chunks)
    }
}

async fn worker(dir: &std::path::Path, model: &Noting) -> Worker {
    Worker::builder()
        .data_dir(dir)
        .register(rebook_shipment)
        .register(load_order)
        .register(search_policy)
        .register(rebook_carrier)
        .register(notify_warehouse)
        .register(update_customer_eta)
        .llm(Arc::new(model.clone()))
        .build()
        .await
        .unwrap()
}

fn request(order_id: &str) -> ShipmentRequest {
    ShipmentRequest {
        message: waymark_examples::rebook::demo::request_text(order_id),
        models: scripted_models(),
    }
}

/// Approves whatever `id` asks, until it ends.
async fn finish(worker: &Worker, id: &str) -> ShipmentOutcome {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        for pending in worker.pending_approvals(id).unwrap() {
            let hash = &pending.artifact_hash;
            let approve = ApprovalVerdict::Approve;
            let decided = worker
                .decide_approval_request(id, pending.request, hash, "dana@ops", approve)
                .await;
            decided.unwrap();
        }
        let handle = worker.handle(rebook_shipment, id);
        if let Ok(outcome) = tokio::time::timeout(Duration::from_millis(20), handle.result()).await
        {
            return outcome.unwrap_or_else(|e| panic!("{id} failed: {e}"));
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} did not end");
    }
}

async fn completed_source(worker: &Worker, id: &str, order_id: &str) -> ShipmentOutcome {
    let options = StartOptions {
        workflow_id: Some(id.to_owned()),
        ..StartOptions::default()
    };
    worker
        .start_with(rebook_shipment, request(order_id), options)
        .await
        .unwrap();
    finish(worker, id).await
}

const ONCE_EACH: Applications = Applications {
    rebookings: 1,
    warehouse_notices: 1,
    eta_updates: 1,
};

fn effects(journal: &[Entry]) -> usize {
    let effects = journal.iter().filter(|entry| {
        matches!(
            entry,
            Entry::ActivityScheduledAt {
                idempotency_key: Some(_),
                ..
            }
        )
    });
    effects.count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_at_every_entry_completes_without_asking_a_downstream_again() {
    let dir = tempfile::tempdir().unwrap();
    let model = Noting::new();
    let worker = worker(dir.path(), &model).await;
    let order = "ORD-FORK-1";
    let source = completed_source(&worker, "source", order).await;
    let asked = systems().requests(order);
    assert_eq!(asked, ONCE_EACH);
    let journal = worker.journal("source").unwrap();
    assert!(journal.last().unwrap().is_terminal());
    let committed = worker.operations("source").unwrap().len();
    assert_eq!(
        committed,
        3,
        "{}",
        worker.render_operations("source").unwrap()
    );

    // Every point a run can go on from: after the start, before the end.
    for at in 1..journal.len() as u64 {
        let fork = format!("fork-{at}");
        let options = ForkOptions {
            at,
            workflow_id: Some(fork.clone()),
            ..ForkOptions::default()
        };
        let id = worker.fork("source", options).await.unwrap();
        assert_eq!(id, fork);
        let outcome = finish(&worker, &fork).await;
        assert_eq!(outcome, source, "fork at {at}");
        assert_eq!(
            systems().requests(order),
            ONCE_EACH,
            "fork at {at} asked a downstream again"
        );
        let forked = worker.journal(&fork).unwrap();
        assert_eq!(forked[..at as usize].len(), at as usize);
        assert!(
            matches!(&forked[at as usize], Entry::Forked(f) if f.source == "source" && f.at == at),
            "fork at {at}: entry {at} is {:?}",
            forked[at as usize]
        );
        // Each effect the source committed is the fork's by inheritance, marked as such.
        let operations = worker.operations(&fork).unwrap();
        assert_eq!(operations.len(), committed, "fork at {at}");
        for (key, record) in &operations {
            let marked = record.history.iter().any(|event| {
                let by = event.by.as_deref().unwrap_or_default();
                by == format!("{INHERITED_BY}source")
            });
            assert!(marked, "fork at {at}: {key} is not marked inherited");
            assert!(key.starts_with("fork-"), "{key} is not the fork's own row");
        }
        assert_eq!(effects(&forked), effects(&journal), "fork at {at}");
    }
    worker.shutdown().await;
}

/// How many of `journal`'s model calls have no outcome among its first `at` entries: the calls a
/// fork at `at` runs anew.
fn model_calls_after(journal: &[Entry], at: usize) -> usize {
    let calls = journal.iter().filter_map(|entry| match entry {
        Entry::ActivityScheduledAt { seq, identity, .. } if identity.name == LLM_ACTIVITY => {
            Some(*seq)
        }
        _ => None,
    });
    let answered_in_prefix = |seq: u32| {
        journal[..at]
            .iter()
            .any(|entry| matches!(entry, Entry::ActivityCompletedAt { seq: s, .. } if *s == seq))
    };
    calls.filter(|seq| !answered_in_prefix(*seq)).count()
}

/// At every entry, a fork with every model replaced runs exactly the model calls the source
/// answered after that entry, on the replacements, and nothing before it.
#[tokio::test(flavor = "multi_thread")]
async fn a_fork_on_other_models_runs_only_the_calls_after_the_fork_at_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let model = Noting::new();
    let worker = worker(dir.path(), &model).await;
    let order = "ORD-FORK-2";
    let source = completed_source(&worker, "source", order).await;
    let asked_by_source = model.take();
    assert!(asked_by_source.len() >= 3, "{asked_by_source:?}");
    let journal = worker.journal("source").unwrap();
    assert_eq!(model_calls_after(&journal, 1), asked_by_source.len());
    let models = scripted_models();
    let replaced = [
        models.classifier,
        models.planner,
        models.fallback,
        models.writer,
    ];
    let replaced: Vec<(String, String)> = replaced
        .into_iter()
        .map(|name| (name.clone(), format!("{name}-v2")))
        .collect();

    for at in 1..journal.len() {
        let fork = format!("on-v2-{at}");
        let options = ForkOptions {
            at: at as u64,
            workflow_id: Some(fork.clone()),
            models: replaced.clone(),
            ..ForkOptions::default()
        };
        worker.fork("source", options).await.unwrap();
        let outcome = finish(&worker, &fork).await;
        let anew = model_calls_after(&journal, at);
        let expected: Vec<String> = asked_by_source[asked_by_source.len() - anew..]
            .iter()
            .map(|name| format!("{name}-v2"))
            .collect();
        assert_eq!(model.take(), expected, "fork at {at}");
        assert_eq!(systems().requests(order), ONCE_EACH, "fork at {at}");
        let (
            ShipmentOutcome::Rebooked { booking, .. },
            ShipmentOutcome::Rebooked {
                booking: forked, ..
            },
        ) = (&source, &outcome)
        else {
            panic!("fork at {at}: not rebooked: {source:?} / {outcome:?}");
        };
        assert_eq!(booking, forked, "fork at {at}: the booking is the source's");
    }
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_effect_named_to_fire_again_fires_under_a_key_of_the_fork() {
    let dir = tempfile::tempdir().unwrap();
    let model = Noting::new();
    let worker = worker(dir.path(), &model).await;
    let order = "ORD-FORK-3";
    completed_source(&worker, "source", order).await;
    // Right before the notice is issued: the fork issues it anew.
    let journal = worker.journal("source").unwrap();
    let notice = journal.iter().position(|entry| {
        matches!(entry, Entry::ActivityScheduledAt { identity, .. } if identity.name == "notify_warehouse")
    });
    let options = ForkOptions {
        at: notice.unwrap() as u64,
        workflow_id: Some("notify-again".into()),
        refire: vec!["notify_warehouse".into()],
        ..ForkOptions::default()
    };
    worker.fork("source", options).await.unwrap();
    finish(&worker, "notify-again").await;
    let asked = systems().requests(order);
    assert_eq!(
        asked,
        Applications {
            warehouse_notices: 2,
            ..ONCE_EACH
        }
    );
    assert_eq!(systems().applications(order).warehouse_notices, 2);
    let own = worker.operations("notify-again").unwrap();
    let notice = own.iter().find(|(_, r)| r.operation == "notify_warehouse");
    let (key, record) = notice.unwrap();
    assert!(key.starts_with("notify-again|"), "{key}");
    let inherited = record
        .history
        .iter()
        .any(|e| e.by.as_deref().is_some_and(|b| b.starts_with(INHERITED_BY)));
    assert!(!inherited, "a refired effect is the fork's own");
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_that_cannot_go_on_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = Noting::new();
    let worker = worker(dir.path(), &model).await;
    completed_source(&worker, "source", "ORD-FORK-4").await;
    let len = worker.journal("source").unwrap().len() as u64;
    let refused = |at, refire: Vec<String>| ForkOptions {
        at,
        workflow_id: Some("refused".into()),
        refire,
        ..ForkOptions::default()
    };
    for at in [0, len, len + 1] {
        let error = worker
            .fork("source", refused(at, vec![]))
            .await
            .unwrap_err();
        assert!(matches!(error, ForkError::BadPoint { .. }), "{at}: {error}");
    }
    let error = worker
        .fork("source", refused(1, vec!["load_order".into()]))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "`load_order` is not an effect registered on this worker: only effects fire again"
    );
    let error = worker
        .fork("nowhere", refused(1, vec![]))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("nowhere"), "{error}");
    assert_eq!(worker.workflow_status("refused").unwrap(), None);
    worker.shutdown().await;
}
