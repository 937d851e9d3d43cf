//! Turns typed workflows and activities into the runtime's payload-level registrations.

use std::sync::Arc;

use futures::FutureExt;
use waymark_runtime::error::RunError;
use waymark_runtime::journal::{Failure, FailureKind, Payload};
use waymark_runtime::registry::{self as rt, RegisteredActivity, RegisteredWorkflow};

use crate::{Activity, ActivityContext, Workflow, WorkflowContext};

/// What a worker hosts. Filled by [`crate::WorkerBuilder::register`].
#[derive(Clone, Default)]
pub struct Registry {
    inner: rt::Registry,
}

impl Registry {
    /// Adds an activity under its stable name.
    pub fn add_activity<A: Activity>(&mut self, activity: A) {
        let options = activity.options();
        let run: rt::ActivityFn = Arc::new(move |info, input: Payload| {
            let activity = activity.clone();
            async move {
                let input: A::Input = input.decode().map_err(|e| {
                    Failure::new(FailureKind::Terminal, format!("input does not decode: {e}"))
                })?;
                let output = activity
                    .run(ActivityContext::new(info), input)
                    .await
                    .map_err(|e| e.to_failure())?;
                Payload::encode(&output).map_err(|e| {
                    Failure::new(
                        FailureKind::Terminal,
                        format!("output does not encode: {e}"),
                    )
                })
            }
            .boxed()
        });
        self.inner
            .add_activity(A::NAME, RegisteredActivity { run, options });
    }

    /// Adds a workflow under its stable name.
    pub fn add_workflow<W: Workflow>(&mut self, workflow: W) {
        let run: rt::WorkflowFn = Arc::new(move |core, input: Payload| {
            let input: W::Input = input
                .decode()
                .map_err(|source| RunError::PayloadMismatch { seq: None, source })?;
            let body = workflow.run(WorkflowContext::new(core), input);
            Ok(async move {
                let output = body
                    .await
                    .map_err(|e| Failure::new(FailureKind::Workflow, e.to_string()))?;
                Payload::encode(&output).map_err(|e| {
                    Failure::new(
                        FailureKind::Workflow,
                        format!("output does not encode: {e}"),
                    )
                })
            }
            .boxed())
        });
        let check_input: rt::InputCheck = Arc::new(|input: &Payload| {
            input
                .decode::<W::Input>()
                .map(drop)
                .map_err(|e| e.to_string())
        });
        self.inner
            .add_workflow(W::NAME, RegisteredWorkflow { run, check_input });
    }

    pub(crate) fn into_runtime(self) -> rt::Registry {
        self.inner
    }
}
