use waymark::prelude::*;

#[workflow(foo = 1)]
async fn rebook(ctx: WorkflowContext) -> Result<(), WorkflowError> {
    let _context = ctx;
    Ok(())
}

fn main() {}
