use waymark::prelude::*;

#[workflow]
async fn rebook() -> Result<u32, WorkflowError> {
    Ok(1)
}

fn main() {}
