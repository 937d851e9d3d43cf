//! The `otel` feature: step spans reach an OpenTelemetry exporter with their replay attributes,
//! a replayed step marked as not executed, under its run's span.

use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;
use waymark::prelude::*;
use waymark::telemetry::otel;
use waymark::telemetry::otel::opentelemetry::{KeyValue, Value};
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark_tests::{executions, with_id};

#[activity]
async fn fetch(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    waymark_tests::count(cx.workflow_id(), "fetch");
    Ok(format!("order {order_id}"))
}

#[activity]
async fn store(order: String) -> Result<String, ActivityError> {
    Ok(format!("stored {order}"))
}

#[workflow]
async fn fetch_and_store(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let order = ctx.activity(fetch, order_id).await?;
    Ok(ctx.activity(store, order).await?)
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    let found = span
        .attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key);
    found.map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> String {
    attribute(span, key)
        .map(|v| v.as_str().into_owned())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn replayed_and_executed_steps_are_exported_with_their_replay_mode() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider));
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let wf = "otel-crash";
    let crash = PlannedFault::at("store", 1, Boundary::BeforeCall, Fault::Crash);
    let mut env = TestEnv::with_faults([crash], |b| {
        b.register(fetch_and_store).register(fetch).register(store)
    })
    .await
    .unwrap();
    env.worker()
        .start_with(fetch_and_store, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    let outcome = env.finish(fetch_and_store, wf, 40).await.expect("it ends");
    assert_eq!(outcome.unwrap(), "stored order ORD-1");
    env.stop().await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let steps: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "waymark.step" && text(s, "workflow_id") == wf)
        .collect();
    let fetches: Vec<(String, Option<&Value>)> = steps
        .iter()
        .filter(|s| text(s, "name") == "fetch")
        .map(|s| (text(s, "replay_mode"), attribute(s, "executed")))
        .collect();
    assert_eq!(
        fetches,
        [
            ("first_execution".to_owned(), Some(&Value::Bool(true))),
            (
                "resume_from_checkpoint".to_owned(),
                Some(&Value::Bool(false))
            ),
        ]
    );
    assert_eq!(executions(wf, "fetch"), 1);

    let runs: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.name == "waymark.run" && text(s, "workflow_id") == wf)
        .collect();
    assert_eq!(runs.len(), 2, "one run before the crash, one after");
    assert!(runs
        .iter()
        .all(|r| text(r, "workflow") == "fetch_and_store"));
    let run_ids: Vec<_> = runs.iter().map(|r| r.span_context.span_id()).collect();
    assert!(
        steps.iter().all(|s| run_ids.contains(&s.parent_span_id)),
        "steps sit under their run"
    );
}
