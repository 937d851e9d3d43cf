use waymark::prelude::*;

#[activity]
async fn notify(order_id: u64) {
    let _ = order_id;
}

fn main() {}
