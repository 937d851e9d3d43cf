use waymark::prelude::*;

#[workflow(name = "")]
async fn rebook(ctx: WorkflowContext) -> Result<(), WorkflowError> {
    let _context = ctx;
    Ok(())
}

fn main() {}
