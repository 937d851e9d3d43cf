use serde::{Deserialize, Serialize};
use waymark::prelude::*;

#[derive(Serialize, Deserialize)]
pub struct OrderId(pub String);

#[activity(effect)]
async fn rebook(cx: ActivityContext, order_id: OrderId) -> Result<(), ActivityError> {
    let _ = (cx, order_id);
    Ok(())
}

fn main() {}
