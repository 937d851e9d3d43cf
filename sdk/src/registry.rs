//! Turns typed workflows and activities into the runtime's payload-level registrations.

use std::sync::Arc;

use futures::FutureExt;
use waymark_runtime::context::compensate::with_undo_failures;
use waymark_runtime::context::WorkflowCore;
use waymark_runtime::error::RunError;
use waymark_runtime::journal::{Failure, FailureKind, Payload};
use waymark_runtime::registry::{
    self as rt, EffectRegistration, ReconcileOutcome, RegisteredActivity, RegisteredWorkflow,
};

use crate::{
    Activity, ActivityContext, Effect, Reconciled, Workflow, WorkflowContext, WorkflowError,
};

/// What a worker hosts. Filled by [`crate::WorkerBuilder::register`].
#[derive(Clone, Default)]
pub struct Registry {
    inner: rt::Registry,
}

impl Registry {
    /// Adds an activity under its stable name.
    pub fn add_activity<A: Activity>(&mut self, activity: A) {
        let registered = RegisteredActivity {
            options: activity.options(),
            cached: A::CACHED,
            run: run_fn(activity),
            effect: None,
        };
        self.inner.add_activity(A::NAME, registered);
    }

    /// Adds an effect (`#[activity(effect)]`) under its stable name.
    pub fn add_effect<E: Effect>(&mut self, effect: E) {
        let key_arguments: rt::KeyArgumentsFn = Arc::new(|input: &Payload| {
            let input: E::Input = input.decode().map_err(|e| e.to_string())?;
            E::key_arguments(&input).into_payload()
        });
        let registration = EffectRegistration {
            version: E::VERSION,
            at_most_once: E::AT_MOST_ONCE,
            key_arguments,
            reconcile: reconcile_fn(effect.clone()),
            check_output: decodes_as::<E::Output>(),
        };
        let registered = RegisteredActivity {
            options: effect.options(),
            run: run_fn(effect),
            effect: Some(registration),
            cached: false,
        };
        self.inner.add_activity(E::NAME, registered);
    }

    /// Adds a workflow under its stable name.
    pub fn add_workflow<W: Workflow>(&mut self, workflow: W) {
        let run: rt::WorkflowFn = Arc::new(move |core, input: Payload| {
            let input: W::Input = input
                .decode()
                .map_err(|source| RunError::PayloadMismatch { seq: None, source })?;
            let body = workflow.run(WorkflowContext::new(core.clone()), input);
            Ok(async move {
                let output = match body.await {
                    Ok(output) => output,
                    // Not a failure: nothing is undone, and the executor starts the next run.
                    Err(WorkflowError::ContinueAsNew) if core.confirm_continuation() => {
                        let continued = "continued as a new run";
                        return Err(Failure::new(FailureKind::Workflow, continued));
                    }
                    Err(WorkflowError::ContinueAsNew) => {
                        let error = WorkflowError::new(
                            "the workflow returned ContinueAsNew without calling \
                             ctx.continue_as_new, which gives the next run's input",
                        );
                        return Err(compensated(&core, error).await);
                    }
                    Err(error) => return Err(compensated(&core, error).await),
                };
                Payload::encode(&output).map_err(|e| {
                    Failure::new(
                        FailureKind::Workflow,
                        format!("output does not encode: {e}"),
                    )
                })
            }
            .boxed())
        });
        let check_input = decodes_as::<W::Input>();
        let workflow = RegisteredWorkflow {
            run,
            check_input,
            code_digest: W::CODE_DIGEST,
        };
        self.inner.add_workflow(W::NAME, workflow);
    }

    /// Adds a built-in activity the SDK implements (model calls, ...).
    pub(crate) fn add_builtin(&mut self, name: &str, activity: RegisteredActivity) {
        self.inner.add_activity(name, activity);
    }

    pub(crate) fn into_runtime(self) -> rt::Registry {
        self.inner
    }
}

fn run_fn<A: Activity>(activity: A) -> rt::ActivityFn {
    Arc::new(move |info, input: Payload| {
        let activity = activity.clone();
        async move {
            let input: A::Input = decode_input(&input)?;
            let output = activity
                .run(ActivityContext::new(info), input)
                .await
                .map_err(|e| e.to_failure())?;
            encode_output(&output)
        }
        .boxed()
    })
}

fn reconcile_fn<E: Effect>(effect: E) -> rt::ReconcileFn {
    Arc::new(move |info, input: Payload| {
        let input: E::Input = match decode_input(&input) {
            Ok(input) => input,
            Err(failure) => return Some(futures::future::ready(Err(failure)).boxed()),
        };
        let reconciling = effect.reconcile(ActivityContext::new(info), input)?;
        Some(
            async move {
                match reconciling.await.map_err(|e| e.to_failure())? {
                    Reconciled::Committed(output) => {
                        encode_output(&output).map(ReconcileOutcome::Committed)
                    }
                    Reconciled::NotFound => Ok(ReconcileOutcome::NotFound),
                    Reconciled::StillUnknown(why) => Ok(ReconcileOutcome::StillUnknown(why)),
                }
            }
            .boxed(),
        )
    })
}

/// The workflow failed with `error`: its registered undos run first (each once across crashes),
/// and the run's failure says which of them did not succeed.
async fn compensated(core: &WorkflowCore, error: WorkflowError) -> Failure {
    let failures = core.compensate().await;
    let failure = Failure::new(FailureKind::Workflow, error.to_string());
    with_undo_failures(failure, &failures)
}

fn decodes_as<T: serde::de::DeserializeOwned>() -> rt::InputCheck {
    Arc::new(|payload: &Payload| payload.decode::<T>().map(drop).map_err(|e| e.to_string()))
}

fn decode_input<T: serde::de::DeserializeOwned>(input: &Payload) -> Result<T, Failure> {
    input
        .decode()
        .map_err(|e| Failure::new(FailureKind::Terminal, format!("input does not decode: {e}")))
}

fn encode_output<T: serde::Serialize>(output: &T) -> Result<Payload, Failure> {
    Payload::encode(output).map_err(|e| {
        Failure::new(
            FailureKind::Terminal,
            format!("output does not encode: {e}"),
        )
    })
}
