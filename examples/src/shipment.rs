//! The delayed-shipment workflow: find out whether an order will be late and, if so, plan a
//! rebooking with the carrier that meets the promised date at the lowest cost.
//!
//! The carriers are simulated in-process (deterministic answers, no network) so the example
//! runs anywhere. Every call to them is an activity: after a crash the workflow resumes from the
//! journal and does not ask a carrier again for an answer it already has.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::prelude::*;

/// What the caller asks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RebookRequest {
    /// The order.
    pub order_id: String,
    /// Days the order may still take to arrive.
    pub promised_within_days: u32,
}

/// An order as the order system returns it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Order {
    /// Id.
    pub order_id: String,
    /// Current carrier.
    pub carrier: String,
    /// Destination postcode.
    pub destination: String,
}

/// A carrier's offer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Quote {
    /// Carrier.
    pub carrier: String,
    /// Days to deliver.
    pub eta_days: u32,
    /// Price in cents.
    pub price_cents: u64,
}

/// The workflow's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum Decision {
    /// The current carrier still makes it.
    OnTime {
        /// Its estimate.
        eta_days: u32,
    },
    /// Rebook with this quote.
    Rebook(Quote),
    /// Nobody can make it; a human must call the customer.
    Escalate {
        /// Why.
        reason: String,
    },
}

/// Looks the order up in the order system.
#[activity(max_attempts = 3)]
pub async fn load_order(order_id: String) -> Result<Order, ActivityError> {
    if order_id.is_empty() {
        return Err(ActivityError::terminal("empty order id"));
    }
    Ok(Order {
        carrier: "slowship".into(),
        destination: format!("{:05}", order_id.len() * 7919 % 100_000),
        order_id,
    })
}

/// Asks a carrier for its current estimate for the order.
#[activity(max_attempts = 5, initial_backoff_ms = 100)]
pub async fn carrier_eta(order: Order) -> Result<u32, ActivityError> {
    Ok(simulated_eta(&order.carrier, &order.destination))
}

/// Asks a carrier for a rebooking quote.
#[activity(max_attempts = 5, initial_backoff_ms = 100)]
pub async fn request_quote(carrier: String, destination: String) -> Result<Quote, ActivityError> {
    let eta_days = simulated_eta(&carrier, &destination);
    let price_cents = 900 + 600 * u64::from(6u32.saturating_sub(eta_days));
    Ok(Quote {
        carrier,
        eta_days,
        price_cents,
    })
}

fn simulated_eta(carrier: &str, destination: &str) -> u32 {
    let spread: u32 = destination.bytes().map(u32::from).sum::<u32>() % 2;
    match carrier {
        "slowship" => 7 + spread,
        "rapidpost" => 2 + spread,
        _ => 4 + spread,
    }
}

/// Checks the order's delay, re-checks once after a pause (estimates settle), and plans.
#[workflow]
pub async fn rebook_delayed(
    ctx: WorkflowContext,
    request: RebookRequest,
) -> Result<Decision, WorkflowError> {
    let order = ctx.activity(load_order, request.order_id.clone()).await?;
    let first_eta = ctx.activity(carrier_eta, order.clone()).await?;
    if first_eta <= request.promised_within_days {
        return Ok(Decision::OnTime {
            eta_days: first_eta,
        });
    }
    // Durable: a restart during the pause resumes the wait, it does not start it again.
    ctx.sleep(Duration::from_secs(2)).await;
    let eta = ctx.activity(carrier_eta, order.clone()).await?;
    if eta <= request.promised_within_days {
        return Ok(Decision::OnTime { eta_days: eta });
    }
    let mut quotes = Vec::with_capacity(CARRIERS.len());
    for carrier in CARRIERS {
        let destination = order.destination.clone();
        quotes.push(
            ctx.activity(request_quote, (carrier.to_owned(), destination))
                .await?,
        );
    }
    Ok(choose(quotes, request.promised_within_days))
}

/// Carriers asked for a rebooking quote, in order.
const CARRIERS: [&str; 2] = ["rapidpost", "parcelco"];

fn choose(quotes: Vec<Quote>, within_days: u32) -> Decision {
    let cheapest_in_time = quotes
        .into_iter()
        .filter(|q| q.eta_days <= within_days)
        .min_by_key(|q| q.price_cents);
    match cheapest_in_time {
        Some(quote) => Decision::Rebook(quote),
        None => Decision::Escalate {
            reason: format!("no carrier delivers within {within_days} days"),
        },
    }
}
