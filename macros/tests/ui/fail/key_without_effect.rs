use waymark::prelude::*;

#[activity(max_attempts = 3)]
async fn charge(#[key] payment_id: String, amount_cents: u64) -> Result<(), ActivityError> {
    let _ = (payment_id, amount_cents);
    Ok(())
}

fn main() {}
