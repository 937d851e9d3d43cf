use waymark::prelude::*;

#[workflow]
async fn rebook(ctx: WorkflowContext, seats: u32, class: String) -> Result<u32, WorkflowError> {
    let _context = ctx;
    let _ = class;
    Ok(seats)
}

fn main() {}
