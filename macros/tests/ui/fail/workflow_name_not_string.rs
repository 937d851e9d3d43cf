use waymark::prelude::*;

#[workflow(name = 3)]
async fn rebook(ctx: WorkflowContext) -> Result<(), WorkflowError> {
    let _context = ctx;
    Ok(())
}

fn main() {}
