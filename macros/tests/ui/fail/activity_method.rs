use waymark::prelude::*;

struct Orders;

impl Orders {
    #[activity]
    async fn load_order(&self, order_id: u64) -> Result<u64, ActivityError> {
        Ok(order_id)
    }
}

fn main() {}
