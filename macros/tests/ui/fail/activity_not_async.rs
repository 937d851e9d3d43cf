use waymark::prelude::*;

#[activity]
fn load_order(order_id: u64) -> Result<u64, ActivityError> {
    Ok(order_id)
}

fn main() {}
