use waymark::prelude::*;

#[workflow]
fn rebook(ctx: WorkflowContext) -> Result<(), WorkflowError> {
    let _context = ctx;
    Ok(())
}

fn main() {}
