//! A workflow whose waits listen for one signal name, then another: what a signal of a name
//! no wait listens for yet does to it.

use waymark::prelude::*;

/// Waits for `go`, then for `count` signals named `note`.
#[workflow]
pub async fn go_then_notes(ctx: WorkflowContext, count: u32) -> Result<Vec<String>, WorkflowError> {
    let mut got = vec![ctx.signal::<String>("go").await?];
    for _ in 0..count {
        got.push(ctx.signal("note").await?);
    }
    Ok(got)
}
