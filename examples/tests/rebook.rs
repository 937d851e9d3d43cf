//! The main example's scenario, asserted: the model times out writing the customer message after
//! the tools ran and the worker dies; Waymark recovers with every effect applied once. The same
//! scenario under a naive "retry from the top" loop applies every effect twice.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use waymark::telemetry::names::*;
use waymark::testing::{Boundary, Fault, PlannedFault};
use waymark_examples::rebook::demo::{self, Approver, DemoConfig};
use waymark_examples::rebook::model;
use waymark_examples::rebook::naive::{agent_retry_from_the_top, retry_from_the_top};
use waymark_examples::rebook::systems::Applications;
use waymark_examples::rebook::timeline::Timeline;
use waymark_examples::rebook::ShipmentOutcome;

fn timeline() -> Timeline {
    static TIMELINE: OnceLock<Timeline> = OnceLock::new();
    TIMELINE
        .get_or_init(|| {
            let timeline = Timeline::default();
            let subscriber = tracing_subscriber::registry().with(timeline.layer());
            tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
            timeline
        })
        .clone()
}

const ONCE_EACH: Applications = Applications {
    rebookings: 1,
    warehouse_notices: 1,
    eta_updates: 1,
};

/// The demo as the binary runs it: scripted model, auto-approval, the stall and the crash.
fn config(dir: &std::path::Path) -> DemoConfig {
    DemoConfig {
        data_dir: dir.to_owned(),
        workflow_id: "rebook-demo".into(),
        order_id: "ORD-7001".into(),
        approver: Approver::Auto("dana@ops".into()),
        provider: model::scripted(true),
        models: model::scripted_models(),
        crash: true,
        agent: false,
        faults: Vec::new(),
        timeline: Some(timeline()),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_demo_survives_the_classic_failure_with_each_effect_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let report = demo::run(&config, &mut |_| {}).await.unwrap();

    let ShipmentOutcome::Rebooked {
        message, booking, ..
    } = &report.outcome
    else {
        panic!("not rebooked: {:?}", report.outcome);
    };
    assert_eq!(booking, "BK-1");
    assert_eq!(report.crashes, 1);
    assert_eq!(
        report.applications, ONCE_EACH,
        "each effect once downstream"
    );
    // The rebooking and the ETA update ran under the approval; the warehouse notice carries
    // the booking reference and follows the approved rebooking.
    let approved: Vec<&str> = report.approvals.iter().map(|a| a.0.as_str()).collect();
    assert_eq!(approved, ["rebook_carrier", "update_customer_eta"]);
    for (effect, approved, executed) in &report.approvals {
        assert_eq!(approved, executed, "{effect}");
    }
    assert_eq!(
        &report.shown, message,
        "the reader was shown what was committed"
    );

    let metrics = &report.metrics;
    assert_eq!(metrics.value(INVOCATIONS, &[("kind", "effect")]), 3.0);
    assert_eq!(
        metrics.value(INVOCATIONS, &[("kind", "llm")]),
        5.0,
        "writer twice"
    );
    assert_eq!(metrics.value(DOWNSTREAM_REPEATS, &[]), 0.0);
    assert_eq!(metrics.value(DUPLICATE_INTENTS, &[]), 0.0);
    assert_eq!(metrics.value(APPROVAL_HASH_MISMATCHES, &[]), 0.0);
    assert_eq!(metrics.value(STREAM_SUPERSEDED, &[]), 1.0);
    assert_eq!(metrics.value(STREAM_DIVERGENCE, &[]), 0.0);
    assert_eq!(metrics.value(RESUMES, &[("point", "retry_backoff")]), 1.0);

    let after_crash = report
        .timeline
        .iter()
        .skip_while(|line| !line.contains("worker process dies"));
    let rerun: Vec<&String> = after_crash.filter(|line| line.starts_with("ran")).collect();
    assert_eq!(
        rerun.len(),
        1,
        "only the writer runs after the crash: {rerun:?}"
    );
    assert!(
        rerun[0].contains("attempt 2 (resume_from_checkpoint) -> ok"),
        "{rerun:?}"
    );

    insta::assert_snapshot!("rebook_demo_journal", report.journal);
    insta::assert_snapshot!("rebook_demo_stream", report.stream);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_right_after_the_carrier_booked_is_reconciled_not_booked_again() {
    let dir = tempfile::tempdir().unwrap();
    let after_booking = PlannedFault::at("rebook_carrier", 1, Boundary::AfterCall, Fault::Crash);
    let config = DemoConfig {
        order_id: "ORD-7003".into(),
        workflow_id: "rebook-reconciled".into(),
        faults: vec![after_booking],
        ..config(dir.path())
    };
    let report = demo::run(&config, &mut |_| {}).await.unwrap();
    assert_eq!(
        report.crashes, 2,
        "after the booking, and before the message's retry"
    );
    assert_eq!(report.applications, ONCE_EACH);
    assert!(
        report.journal.contains("effect_reconciled"),
        "{}",
        report.journal
    );
    let effect = [("effect", "rebook_carrier")];
    assert_eq!(
        report.metrics.value(DUPLICATE_INTENTS, &effect),
        1.0,
        "asked once more"
    );
    assert_eq!(
        report.metrics.value(DOWNSTREAM_REPEATS, &effect),
        0.0,
        "never sent again"
    );
    let resumed = report
        .metrics
        .value(RESUMES, &[("point", "unsettled_effect")]);
    assert_eq!(resumed, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_naive_retry_from_the_top_applies_every_effect_twice() {
    let dir = tempfile::tempdir().unwrap();
    let protected = DemoConfig {
        order_id: "ORD-7002".into(),
        workflow_id: "rebook-compared".into(),
        ..config(dir.path())
    };
    let waymark = demo::run(&protected, &mut |_| {}).await.unwrap();
    let waymark_calls = waymark.metrics.value(INVOCATIONS, &[("kind", "llm")]);

    let order = "ORD-7004";
    let provider = model::scripted(true);
    let message = demo::request_text(order);
    let naive = retry_from_the_top(provider.as_ref(), &message, order, 3).await;
    assert_eq!(naive.runs, 2, "the stalled message forced a second run");
    assert!(naive.message.is_some());
    let twice = Applications {
        rebookings: 2,
        warehouse_notices: 2,
        eta_updates: 2,
    };
    assert_eq!(naive.applications, twice, "the duplicates Waymark prevents");
    assert_eq!(waymark.applications, ONCE_EACH);
    assert_eq!(
        (naive.model_calls, waymark_calls),
        (8, 5.0),
        "every model call repeated, against only the stalled one"
    );
}

/// The agent mode as the binary runs it with `--agent`.
fn agent_config(dir: &std::path::Path, order_id: &str) -> DemoConfig {
    DemoConfig {
        order_id: order_id.into(),
        workflow_id: format!("agent-{order_id}"),
        provider: model::scripted_agent(true),
        agent: true,
        ..config(dir)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_survives_the_classic_failure_with_each_chosen_effect_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let report = demo::run(&agent_config(dir.path(), "ORD-7101"), &mut |_| {})
        .await
        .unwrap();
    let ShipmentOutcome::Rebooked {
        booking, message, ..
    } = &report.outcome
    else {
        panic!("not rebooked: {:?}", report.outcome);
    };
    assert_eq!(booking, "BK-1");
    assert!(message.contains("booking BK-1"), "{message}");
    assert_eq!(
        report.crashes, 1,
        "the final answer timed out, then the worker died"
    );
    assert_eq!(report.applications, ONCE_EACH);
    // The rebooking the model chose ran under the approval of exactly that call.
    assert_eq!(report.approvals.len(), 1, "{:?}", report.approvals);
    let (effect, approved, executed) = &report.approvals[0];
    assert_eq!((effect.as_str(), approved), ("rebook_carrier", executed));
    // Only the lost final answer was asked again: four turns, one retried.
    assert_eq!(report.metrics.value(INVOCATIONS, &[("kind", "llm")]), 5.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_naive_agent_retried_from_the_top_applies_every_chosen_effect_twice() {
    let order = "ORD-7102";
    let provider = model::scripted_agent(true);
    let message = demo::request_text(order);
    let naive = agent_retry_from_the_top(provider.as_ref(), &message, order, 3).await;
    assert_eq!(naive.runs, 2, "the lost final answer forced a second run");
    assert!(naive.message.is_some());
    let twice = Applications {
        rebookings: 2,
        warehouse_notices: 2,
        eta_updates: 2,
    };
    assert_eq!(
        naive.applications, twice,
        "the model chose every tool again"
    );
    assert_eq!(naive.model_calls, 8, "every turn asked again");
}
