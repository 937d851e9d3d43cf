use waymark::prelude::*;

#[activity(timeout = 30)]
async fn charge(amount_cents: u64) -> Result<u64, ActivityError> {
    Ok(amount_cents)
}

fn main() {}
