use waymark::prelude::*;

/// Not `Serialize`: a list of these cannot be part of an idempotency key either.
pub struct Stop {
    pub code: String,
}

#[activity(effect)]
async fn reroute(
    #[key] order_id: String,
    #[key] stops: std::vec::Vec<Stop>,
) -> Result<(), ActivityError> {
    let _ = (order_id, stops.len());
    Ok(())
}

fn main() {}
