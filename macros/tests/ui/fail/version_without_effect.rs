use waymark::prelude::*;

async fn find_charge(
    cx: ActivityContext,
    payment_id: String,
) -> Result<Reconciled<()>, ActivityError> {
    let _ = (cx, payment_id);
    Ok(Reconciled::NotFound)
}

#[activity(version = 2, reconcile = find_charge, at_most_once)]
async fn charge(payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
