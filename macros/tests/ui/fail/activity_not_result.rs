use waymark::prelude::*;

#[activity]
async fn load_order(order_id: u64) -> u64 {
    order_id
}

fn main() {}
