use waymark::prelude::*;

#[activity(name = "charge", name = "charge_card")]
async fn charge(amount_cents: u64) -> Result<u64, ActivityError> {
    Ok(amount_cents)
}

fn main() {}
