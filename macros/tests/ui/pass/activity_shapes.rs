//! Activities with zero, one and several inputs, with and without a context, with arguments.
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::prelude::*;
use waymark::Register;

#[derive(Serialize, Deserialize)]
pub struct OrderId(pub u64);

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub id: u64,
}

/// No input at all.
#[activity]
async fn ping() -> Result<(), ActivityError> {
    Ok(())
}

/// One input: the input type is the argument's type.
#[activity]
pub async fn load_order(order_id: OrderId) -> Result<Order, ActivityError> {
    Ok(Order { id: order_id.0 })
}

/// The context and three inputs, with every attribute argument.
#[activity(
    name = "charge_card.v1",
    max_attempts = 3,
    timeout_ms = 30_000,
    initial_backoff_ms = 200
)]
#[allow(clippy::needless_pass_by_value)]
pub(crate) async fn charge_card(
    cx: ActivityContext,
    order: Order,
    amount_cents: u64,
    mut note: String,
) -> Result<String, ActivityError> {
    let _context = cx;
    note.push('!');
    Ok(format!("{} {amount_cents} {note}", order.id))
}

/// Only the context, named through a path.
#[activity(max_attempts = 1)]
async fn heartbeat(_cx: waymark::prelude::ActivityContext) -> Result<u32, ActivityError> {
    Ok(1)
}

/// A raw identifier: the journal name drops the `r#`.
#[activity]
async fn r#match(left: u32, right: u32) -> Result<bool, ActivityError> {
    Ok(left == right)
}

/// Compiled out after expansion: every generated item must go with it.
#[activity]
#[cfg(any())]
async fn never_compiled(missing: NoSuchType) -> Result<(), ActivityError> {
    let _ = missing;
    Ok(())
}

/// Any error type that converts into `ActivityError` can be returned.
pub struct CardDeclined;

impl From<CardDeclined> for ActivityError {
    fn from(_: CardDeclined) -> Self {
        ActivityError::terminal("card declined")
    }
}

#[activity]
async fn authorize(amount_cents: u64) -> Result<u64, CardDeclined> {
    if amount_cents > 100_000 {
        return Err(CardDeclined);
    }
    Ok(amount_cents)
}

fn assert_activity<A, I, O>(_activity: A, name: &str)
where
    A: Activity<Input = I, Output = O> + Register,
{
    assert_eq!(A::NAME, name);
}

fn main() {
    assert_activity::<_, (), ()>(ping, "ping");
    assert_activity::<_, OrderId, Order>(load_order, "load_order");
    assert_activity::<_, (Order, u64, String), String>(charge_card, "charge_card.v1");
    assert_activity::<_, (), u32>(heartbeat, "heartbeat");
    assert_activity::<_, (u32, u32), bool>(r#match, "match");
    assert_activity::<_, u64, u64>(authorize, "authorize");

    // Options are overridden only by the arguments that were given.
    assert_eq!(ping.options(), ActivityOptions::default());
    assert_eq!(
        heartbeat.options(),
        ActivityOptions::default().max_attempts(1)
    );
    let expected = ActivityOptions::default()
        .max_attempts(3)
        .start_to_close_timeout(Duration::from_millis(30_000))
        .initial_backoff(Duration::from_millis(200));
    assert_eq!(charge_card.options(), expected);
}
