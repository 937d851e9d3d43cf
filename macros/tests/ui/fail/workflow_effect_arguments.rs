use waymark::prelude::*;

#[workflow(effect, version = 2)]
async fn rebook(ctx: WorkflowContext, #[key] order_id: String) -> Result<(), WorkflowError> {
    let _ = (ctx, order_id);
    Ok(())
}

fn main() {}
