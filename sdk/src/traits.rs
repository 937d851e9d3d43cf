//! The typed surface that `#[workflow]` and `#[activity]` implement.

use futures::future::BoxFuture;
use serde::{de::DeserializeOwned, Serialize};

use crate::{ActivityContext, ActivityError, ActivityOptions, WorkflowContext, WorkflowError};

/// A unit of non-deterministic work (a read, a model call, a search) whose result is journaled.
///
/// Written with `#[activity]` on an `async fn`; implementing it by hand is possible but the
/// macro keeps the name and the input tuple consistent.
pub trait Activity: Clone + Send + Sync + 'static {
    /// The arguments, as one serde value: `()` for none, the type itself for one, a tuple for more.
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// The value returned on success.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// Stable name recorded in the journal; renaming an activity is a breaking change.
    const NAME: &'static str;

    /// Retry policy and timeouts applied when a workflow schedules this activity.
    fn options(&self) -> ActivityOptions {
        ActivityOptions::default()
    }

    /// Runs one attempt.
    fn run(
        &self,
        cx: ActivityContext,
        input: Self::Input,
    ) -> BoxFuture<'static, Result<Self::Output, ActivityError>>;
}

/// A durable, replayable `async fn`, written with `#[workflow]`.
pub trait Workflow: Clone + Send + Sync + 'static {
    /// The start argument.
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// The result.
    type Output: Serialize + DeserializeOwned + Send + 'static;
    /// Stable name recorded in the journal and used to start it over the API.
    const NAME: &'static str;

    /// Runs the workflow body from the top; the runtime replays it against its journal.
    fn run(
        &self,
        ctx: WorkflowContext,
        input: Self::Input,
    ) -> BoxFuture<'static, Result<Self::Output, WorkflowError>>;
}

/// Something a worker can host: a workflow or an activity. Implemented by the macros.
pub trait Register {
    /// Adds `self` to the registry under its stable name.
    fn register_into(self, registry: &mut crate::Registry);
}
