use waymark::prelude::*;

#[activity(effect)]
async fn charge(#[key] cx: ActivityContext, payment_id: String) -> Result<(), ActivityError> {
    let _ = (cx, payment_id);
    Ok(())
}

fn main() {}
