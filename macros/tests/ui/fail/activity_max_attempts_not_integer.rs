use waymark::prelude::*;

#[activity(max_attempts = "three")]
async fn charge(amount_cents: u64) -> Result<u64, ActivityError> {
    Ok(amount_cents)
}

fn main() {}
