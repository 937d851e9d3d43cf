use waymark::prelude::*;

/// Does not convert into `ActivityError`.
pub struct LookupFailed;

async fn find_charge(
    cx: ActivityContext,
    payment_id: String,
) -> Result<Reconciled<()>, LookupFailed> {
    let _ = (cx, payment_id);
    Ok(Reconciled::NotFound)
}

#[activity(effect, reconcile = crate::find_charge)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

fn main() {}
