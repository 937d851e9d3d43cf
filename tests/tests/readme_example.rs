//! The example test of the README's "Testing your workflows" section, kept compiling and passing.

use std::sync::Mutex;

use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::StartOptions;

/// The fake carrier: bookings by idempotency key.
static BOOKINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

#[activity(effect, reconcile = find_booking)]
async fn book(cx: ActivityContext, #[key] order_id: String) -> Result<String, ActivityError> {
    let key = cx.idempotency_key().unwrap_or_default().to_owned();
    BOOKINGS.lock().unwrap().push(key);
    Ok(format!("booked {order_id}"))
}

async fn find_booking(
    cx: ActivityContext,
    order_id: String,
) -> Result<Reconciled<String>, ActivityError> {
    let key = cx.idempotency_key().unwrap_or_default().to_owned();
    let booked = BOOKINGS.lock().unwrap().contains(&key);
    Ok(if booked {
        Reconciled::Committed(format!("booked {order_id}"))
    } else {
        Reconciled::NotFound
    })
}

#[workflow]
async fn rebook_order(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(book, order_id).await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_after_the_booking_books_once() {
    // The carrier books, then the worker dies before the journal records it.
    let crash = PlannedFault::at("book", 1, Boundary::AfterCall, Fault::Crash);
    let mut env = TestEnv::with_faults([crash], |b| b.register(rebook_order).register(book))
        .await
        .unwrap();
    let options = StartOptions {
        workflow_id: Some("wf-1".into()),
        ..StartOptions::default()
    };
    env.worker()
        .start_with(rebook_order, "ORD-1".into(), options)
        .await
        .unwrap();
    // Restarts the worker after the crash, moves the clock, waits for the end.
    let outcome = env
        .finish(rebook_order, "wf-1", 200)
        .await
        .expect("it ends");
    assert_eq!(outcome.unwrap(), "booked ORD-1");
    assert_eq!(
        BOOKINGS.lock().unwrap().len(),
        1,
        "reconciled, not booked twice"
    );
    insta::assert_snapshot!(env.journal("wf-1").unwrap());
}
