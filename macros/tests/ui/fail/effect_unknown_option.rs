use waymark::prelude::*;

#[activity(effect, idempotent)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
