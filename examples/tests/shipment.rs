//! The delayed-shipment example, run on a test environment and snapshotted.

use std::time::Duration;

use waymark::testing::TestEnv;
use waymark::StartOptions;
use waymark_examples::shipment::{
    carrier_eta, load_order, rebook_delayed, request_quote, Decision, RebookRequest,
};

async fn env() -> TestEnv {
    TestEnv::start(|b| {
        b.register(rebook_delayed)
            .register(load_order)
            .register(carrier_eta)
            .register(request_quote)
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_late_order_is_rebooked_with_the_cheapest_carrier_in_time() {
    let env = env().await;
    let request = RebookRequest {
        order_id: "A-1042".into(),
        promised_within_days: 4,
    };
    let options = StartOptions {
        request_id: Some("rebook-A-1042".into()),
        ..StartOptions::default()
    };
    let run = env
        .worker()
        .start_with(rebook_delayed, request, options)
        .await
        .unwrap();
    // The workflow pauses 2 s (durable timer) before re-checking the estimate.
    assert!(env.wait_for_timer(run.id(), Duration::from_secs(10)).await);
    env.advance(Duration::from_secs(2)).await;
    let decision = tokio::time::timeout(Duration::from_secs(10), run.result())
        .await
        .expect("completes")
        .unwrap();
    let Decision::Rebook(quote) = &decision else {
        panic!("expected a rebooking, got {decision:?}");
    };
    assert_eq!(quote.carrier, "rapidpost");
    insta::assert_snapshot!(env.worker().render_journal(run.id()).unwrap());
}

#[tokio::test]
async fn an_order_on_time_is_left_alone() {
    let env = env().await;
    let request = RebookRequest {
        order_id: "B-7".into(),
        promised_within_days: 10,
    };
    let run = env.worker().start(rebook_delayed, request).await.unwrap();
    let decision = run.result().await.unwrap();
    assert!(matches!(decision, Decision::OnTime { .. }), "{decision:?}");
}
