//! Workflows with and without an input.
use serde::{Deserialize, Serialize};
use waymark::prelude::*;
use waymark::Register;

#[derive(Serialize, Deserialize)]
pub struct RebookRequest {
    pub seats: u32,
}

#[derive(Serialize, Deserialize)]
pub struct Summary {
    pub seats: u32,
}

/// Context and one input.
#[workflow]
pub async fn rebook(ctx: WorkflowContext, req: RebookRequest) -> Result<Summary, WorkflowError> {
    let _context = ctx;
    Ok(Summary { seats: req.seats })
}

/// Context only, with an explicit journal name.
#[workflow(name = "nightly_cleanup")]
async fn cleanup(_ctx: WorkflowContext) -> Result<(), WorkflowError> {
    Ok(())
}

/// Any error type that converts into `WorkflowError` can be returned.
pub struct NoSeats;

impl From<NoSeats> for WorkflowError {
    fn from(_: NoSeats) -> Self {
        WorkflowError::new("no seats left")
    }
}

#[workflow]
async fn reserve(_ctx: WorkflowContext, seats: u32) -> Result<u32, NoSeats> {
    if seats == 0 {
        return Err(NoSeats);
    }
    Ok(seats)
}

fn assert_workflow<W, I, O>(_workflow: W, name: &str)
where
    W: Workflow<Input = I, Output = O> + Register,
{
    assert_eq!(W::NAME, name);
}

fn main() {
    assert_workflow::<_, RebookRequest, Summary>(rebook, "rebook");
    assert_workflow::<_, (), ()>(cleanup, "nightly_cleanup");
    assert_workflow::<_, u32, u32>(reserve, "reserve");
}
