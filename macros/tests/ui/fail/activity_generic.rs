use waymark::prelude::*;

#[activity]
async fn echo<T: Send>(value: T) -> Result<T, ActivityError> {
    Ok(value)
}

fn main() {}
