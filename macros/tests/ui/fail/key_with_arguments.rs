use waymark::prelude::*;

#[activity(effect)]
async fn charge(
    #[key(payment_id)] payment_id: String,
    #[key = "amount"] amount_cents: u64,
    #[key]
    #[key]
    currency: String,
) -> Result<(), ActivityError> {
    let _ = (payment_id, amount_cents, currency);
    Ok(())
}

fn main() {}
