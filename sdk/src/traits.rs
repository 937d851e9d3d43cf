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

    /// What the activity does, for a model choosing tools: `#[activity]` takes the doc comment.
    const DESCRIPTION: &'static str = "";

    /// The names of the arguments, in order: the properties of the JSON object a model writes
    /// when it calls the activity as a tool. `#[activity]` takes the parameter names.
    const PARAMETERS: &'static [&'static str] = &[];

    /// A cached stage (`#[activity(cache)]`): an expensive, pure read whose second call with
    /// the same canonical input in one run is answered with the first call's result, without
    /// calling it (journaled as attempt 0, counted in `waymark_stage_cache_hits_total`).
    const CACHED: bool = false;

    /// Retry policy and timeouts applied when a workflow schedules this activity.
    fn options(&self) -> ActivityOptions {
        ActivityOptions::default()
    }

    /// For an effect, its semantics version and the `#[key]` arguments of `input`: what an
    /// agent binds an approval to. `None` for a read; `#[activity(effect)]` implements it from
    /// [`Effect`], and a hand-written effect should too.
    fn effect_key(input: &Self::Input) -> Option<EffectKey> {
        let _ = input;
        None
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

    /// A digest of the workflow's code: `#[workflow]` takes it from the function as written,
    /// the version of the package it is built in, and Waymark's version. A run that left
    /// memory waiting for a signal, a decision or a timer stays out of memory when a worker
    /// restarts with the same digest; with another one it is rebuilt at start, so that a
    /// change its journal no longer matches shows as soon as it is deployed. A change outside
    /// the function (a helper it calls, a type) under the same package version shows when the
    /// run is next rebuilt, by what it waits for. `None` (a hand-written workflow): rebuilt at
    /// every start.
    const CODE_DIGEST: Option<u64> = None;

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

/// A side-effecting activity, written `#[activity(effect)]`: it changes the world (books a
/// carrier, sends a message), so it runs under an idempotency key derived from business intent
/// and is tracked in the operation log.
///
/// The key is `{workflow_id}|{operation}|{key arguments}|v{VERSION}`: the same intent always
/// gets the same key, across retries, replays and processes. Pass it to the downstream API
/// (`cx.idempotency_key()`) so that a retry after a lost acknowledgement is recognised there.
pub trait Effect: Activity {
    /// Version of the effect's semantics. Bump it when the same arguments should now mean a
    /// different effect; it changes the key.
    const VERSION: u32;

    /// At most once (`#[activity(effect, at_most_once)]`): once a call started, every failure
    /// but a definite refusal (`Terminal`) leaves the outcome unknown, and the effect is
    /// reconciled (or waits for an operator) instead of being retried. For downstreams that
    /// may act and still answer with an error.
    const AT_MOST_ONCE: bool = false;

    /// The `#[key]` arguments of `input`: the ones that name the business target.
    fn key_arguments(input: &Self::Input) -> KeyArguments;

    /// Asks the downstream whether an attempt whose outcome is unknown took effect (looked up
    /// by `cx.idempotency_key()`). `None`: this effect has no reconciler, and an unknown
    /// outcome waits for an operator.
    fn reconcile(
        &self,
        cx: ActivityContext,
        input: Self::Input,
    ) -> Option<BoxFuture<'static, Result<Reconciled<Self::Output>, ActivityError>>> {
        let _ = (cx, input);
        None
    }
}

/// An effect's version and key arguments, from [`Activity::effect_key`].
#[derive(Debug, Clone)]
pub struct EffectKey {
    /// [`Effect::VERSION`].
    pub version: u32,
    /// [`Effect::key_arguments`] of the input.
    pub arguments: KeyArguments,
}

/// What a reconciler found downstream for an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconciled<T> {
    /// The effect happened; this is its result. It is committed without calling again.
    Committed(T),
    /// The effect did not happen; it may be retried with the same key.
    NotFound,
    /// The downstream cannot tell yet; asked again later, with backoff.
    StillUnknown(String),
}

/// The canonical values of an effect's `#[key]` arguments, in declaration order.
#[derive(Debug, Clone, Default)]
pub struct KeyArguments {
    values: Vec<serde_json::Value>,
    error: Option<String>,
}

impl KeyArguments {
    /// Appends one argument.
    pub fn with<T: KeyArgument + ?Sized>(mut self, value: &T) -> Self {
        match serde_json::to_value(value) {
            Ok(value) => self.values.push(value),
            Err(error) => {
                self.error.get_or_insert_with(|| error.to_string());
            }
        }
        self
    }

    /// The arguments as one canonical JSON array, or why one did not serialize.
    pub fn into_payload(self) -> Result<waymark_runtime::journal::Payload, String> {
        if let Some(error) = self.error {
            return Err(error);
        }
        waymark_runtime::journal::Payload::encode(&self.values).map_err(|e| e.to_string())
    }
}

/// A type that can be part of an idempotency key: anything `Serialize`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "this `#[key]` argument is not serializable",
    note = "a `#[key]` argument is serialized canonically into the effect's idempotency key; \
            derive or implement `serde::Serialize` for `{Self}`"
)]
pub trait KeyArgument: Serialize {}

impl<T: Serialize + ?Sized> KeyArgument for T {}
