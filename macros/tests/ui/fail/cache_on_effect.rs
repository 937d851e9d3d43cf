use waymark::prelude::*;

#[activity(effect, cache)]
async fn book(#[key] order_id: String) -> Result<String, ActivityError> {
    Ok(order_id)
}

fn main() {}
