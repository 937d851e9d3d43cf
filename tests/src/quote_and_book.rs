//! The code `journals/quote-and-book-v1.journal` was recorded with: the replayer's fixture.

use waymark::prelude::*;

/// The exported journal.
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/journals/quote-and-book-v1.journal"
);

/// A carrier's quote.
#[activity]
pub async fn quote(carrier: String) -> Result<u32, ActivityError> {
    Ok(if carrier == "fastship" { 1200 } else { 900 })
}

/// Books the carrier.
#[activity]
pub async fn book(carrier: String) -> Result<String, ActivityError> {
    Ok(format!("booked {carrier}"))
}

/// Version 1, the code the fixture was recorded with.
#[workflow(name = "quote_and_book")]
pub async fn quote_and_book(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let fast = ctx.activity(quote, "fastship".to_owned()).await?;
    let slow = ctx.activity(quote, "slowboat".to_owned()).await?;
    let carrier = if fast < 1000 { "fastship" } else { "slowboat" };
    let booking = ctx.activity(book, carrier.to_owned()).await?;
    Ok(format!("{order_id}: {booking} ({fast}/{slow})"))
}
