use waymark::prelude::*;

#[activity]
async fn charge(amount_cents: u64, cx: ActivityContext) -> Result<u64, ActivityError> {
    let _context = cx;
    Ok(amount_cents)
}

fn main() {}
