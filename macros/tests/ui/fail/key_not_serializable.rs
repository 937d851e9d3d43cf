use serde::{Deserialize, Serialize};
use waymark::prelude::*;

#[derive(Serialize, Deserialize)]
pub struct OrderId(pub String);

/// Not `Serialize`: cannot be part of an idempotency key.
pub struct Carrier {
    pub code: String,
}

#[activity(effect)]
async fn rebook(#[key] order_id: OrderId, #[key] carrier: Carrier) -> Result<(), ActivityError> {
    let _ = (order_id, carrier.code);
    Ok(())
}

fn main() {}
