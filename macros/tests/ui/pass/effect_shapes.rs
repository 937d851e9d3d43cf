//! Effects: which arguments form the key, with and without a context, a version, a reconciler
//! and every option.
use std::time::Duration;

use serde::{Deserialize, Serialize};
use waymark::prelude::*;
use waymark::Register;

#[derive(Serialize, Deserialize)]
pub struct OrderId(pub String);

#[derive(Serialize, Deserialize)]
pub struct Flight {
    pub number: String,
}

#[derive(Serialize, Deserialize)]
pub struct Booking {
    pub reference: String,
}

/// One input, the key.
#[activity(effect)]
async fn cancel_order(#[key] order_id: OrderId) -> Result<(), ActivityError> {
    let _ = order_id;
    Ok(())
}

/// Several inputs, two of them keys: the note is not part of the intent.
#[activity(effect)]
pub async fn rebook(
    #[key] order_id: OrderId,
    note: String,
    #[key] flight: Flight,
) -> Result<Booking, ActivityError> {
    let _ = (order_id, note);
    Ok(Booking {
        reference: flight.number,
    })
}

/// The context first, then the key; the semantics changed twice.
#[activity(effect, version = 3)]
async fn send_notice(cx: ActivityContext, #[key] order_id: OrderId) -> Result<u32, ActivityError> {
    let _ = (cx.idempotency_key(), order_id);
    Ok(1)
}

/// The reconciler always takes the context first, then the same inputs as the effect.
async fn find_booking(
    cx: ActivityContext,
    order_id: OrderId,
    flight: Flight,
) -> Result<Reconciled<Booking>, ActivityError> {
    let _ = (cx, order_id, flight);
    Ok(Reconciled::NotFound)
}

/// A reconciler for an effect that takes no context itself.
#[activity(effect, reconcile = find_booking)]
async fn book(#[key] order_id: OrderId, #[key] flight: Flight) -> Result<Booking, ActivityError> {
    let _ = order_id;
    Ok(Booking {
        reference: flight.number,
    })
}

mod downstream {
    use super::{Booking, Flight, OrderId, Refused};
    use waymark::prelude::*;

    /// Any error that converts into `ActivityError`, and a path through a module.
    pub(super) async fn find(
        _cx: ActivityContext,
        _order_id: OrderId,
        flight: Flight,
    ) -> Result<Reconciled<Booking>, Refused> {
        Ok(Reconciled::Committed(Booking {
            reference: flight.number,
        }))
    }
}

/// Errors that convert into `ActivityError`, on the effect as on its reconciler.
pub struct Refused;

impl From<Refused> for ActivityError {
    fn from(_: Refused) -> Self {
        ActivityError::terminal("refused")
    }
}

/// Every argument at once, and a reconciler for an effect that takes the context.
#[activity(
    effect,
    name = "book_with_carrier.v2",
    version = 2,
    reconcile = downstream::find,
    max_attempts = 5,
    timeout_ms = 10_000,
    initial_backoff_ms = 100,
    max_backoff_ms = 60_000,
    deadline_ms = 600_000
)]
async fn book_with_carrier(
    cx: ActivityContext,
    #[key] order_id: OrderId,
    flight: Flight,
) -> Result<Booking, Refused> {
    let _ = (cx, order_id);
    Ok(Booking {
        reference: flight.number,
    })
}

fn assert_effect<E, I, O>(_effect: E, name: &str, version: u32)
where
    E: Effect<Input = I, Output = O> + Register,
{
    assert_eq!(E::NAME, name);
    assert_eq!(E::VERSION, version);
}

/// The key arguments of `input`, as the JSON array the idempotency key is built from.
fn key_json<E: Effect>(input: &E::Input) -> String {
    let payload = E::key_arguments(input).into_payload().expect("key encodes");
    String::from_utf8(payload.as_bytes().to_vec()).expect("JSON is UTF-8")
}

fn order(id: &str) -> OrderId {
    OrderId(id.to_owned())
}

fn flight(number: &str) -> Flight {
    Flight {
        number: number.to_owned(),
    }
}

fn main() {
    assert_effect::<_, OrderId, ()>(cancel_order, "cancel_order", 1);
    assert_effect::<_, (OrderId, String, Flight), Booking>(rebook, "rebook", 1);
    assert_effect::<_, OrderId, u32>(send_notice, "send_notice", 3);
    assert_effect::<_, (OrderId, Flight), Booking>(book, "book", 1);
    assert_effect::<_, (OrderId, Flight), Booking>(book_with_carrier, "book_with_carrier.v2", 2);

    assert_eq!(key_json::<cancel_order>(&order("ORD-7")), r#"["ORD-7"]"#);
    let input = (order("ORD-7"), "window seat".to_owned(), flight("LH 400"));
    assert_eq!(
        key_json::<rebook>(&input),
        r#"["ORD-7",{"number":"LH 400"}]"#
    );
    assert_eq!(key_json::<send_notice>(&order("ORD-8")), r#"["ORD-8"]"#);
    let input = (order("ORD-9"), flight("AF 1"));
    assert_eq!(
        <book_with_carrier as Effect>::key_arguments(&input)
            .into_payload()
            .map(|payload| payload.as_bytes().to_vec()),
        Ok(br#"["ORD-9"]"#.to_vec())
    );

    let expected = ActivityOptions::default()
        .max_attempts(5)
        .start_to_close_timeout(Duration::from_millis(10_000))
        .initial_backoff(Duration::from_millis(100))
        .max_backoff(Duration::from_millis(60_000))
        .deadline(Duration::from_millis(600_000));
    assert_eq!(book_with_carrier.options(), expected);
    assert_eq!(book.options(), ActivityOptions::default());

    // Registration goes through `add_effect`; building the worker is not needed for that.
    let _builder = Worker::builder()
        .register(cancel_order)
        .register(rebook)
        .register(send_notice)
        .register(book)
        .register(book_with_carrier);
}
