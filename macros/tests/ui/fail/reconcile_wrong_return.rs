use waymark::prelude::*;

// Returns the effect's output instead of `Reconciled<()>`.
pub async fn find_charge(cx: ActivityContext, payment_id: String) -> Result<(), ActivityError> {
    let _ = (cx, payment_id);
    Ok(())
}

#[activity(effect, reconcile = reconcilers::find_charge)]
async fn charge(#[key] payment_id: String) -> Result<(), ActivityError> {
    let _ = payment_id;
    Ok(())
}

mod reconcilers {
    pub use super::find_charge;
}

fn main() {}
