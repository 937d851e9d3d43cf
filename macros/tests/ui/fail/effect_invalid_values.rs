use waymark::prelude::*;

#[activity(effect = true, version = 0, max_backoff_ms = 0, deadline_ms = 0)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
