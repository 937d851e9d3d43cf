use waymark::prelude::*;

#[workflow]
async fn rebook(seats: u32, ctx: WorkflowContext) -> Result<u32, WorkflowError> {
    let _context = ctx;
    Ok(seats)
}

fn main() {}
