use waymark::prelude::*;

#[activity]
async fn greet(name: &str) -> Result<String, ActivityError> {
    Ok(format!("hello {name}"))
}

fn main() {}
