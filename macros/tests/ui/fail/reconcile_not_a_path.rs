use waymark::prelude::*;

#[activity(effect, reconcile = "find_charge")]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
