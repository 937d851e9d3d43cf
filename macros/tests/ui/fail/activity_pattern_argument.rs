use waymark::prelude::*;

#[activity]
async fn add((a, b): (u32, u32)) -> Result<u32, ActivityError> {
    Ok(a + b)
}

fn main() {}
