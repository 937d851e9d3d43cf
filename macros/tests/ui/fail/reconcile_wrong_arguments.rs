use waymark::prelude::*;

// Missing the context, which a reconciler always takes first.
async fn find_charge(payment_id: String) -> Result<Reconciled<()>, ActivityError> {
    let _ = payment_id;
    Ok(Reconciled::NotFound)
}

#[activity(effect, reconcile = find_charge)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
