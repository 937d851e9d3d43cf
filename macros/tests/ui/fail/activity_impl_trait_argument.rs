use waymark::prelude::*;

#[activity]
async fn show(value: impl std::fmt::Display + Send) -> Result<String, ActivityError> {
    Ok(value.to_string())
}

fn main() {}
