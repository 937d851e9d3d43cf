use waymark::prelude::*;

fn find_charge(cx: ActivityContext, payment_id: String) -> Result<Reconciled<()>, ActivityError> {
    let _ = (cx, payment_id);
    Ok(Reconciled::NotFound)
}

#[activity(effect, reconcile = find_charge)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
