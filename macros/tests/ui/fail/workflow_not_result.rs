use waymark::prelude::*;

#[workflow]
async fn rebook(ctx: WorkflowContext) -> Option<u32> {
    let _context = ctx;
    Some(1)
}

fn main() {}
