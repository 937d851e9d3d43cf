//! `ctx.llm(...)`: model calls journaled like activities.
//!
//! The request is the command's input (its digest is part of the identity, so a changed prompt
//! on replay is a divergence, not a silent re-call); the response, with the model the provider
//! reported, token usage, cost and latency, is the recorded output. Retries follow the worker's
//! LLM retry policy, each attempt journaled with its error class.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::future::FusedFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use waymark_runtime::journal::{Failure, FailureKind, Payload};
use waymark_runtime::registry::{self as rt, ActivityInfo, RegisteredActivity};

use waymark_runtime::llm::resolve_references;
#[cfg(feature = "openai")]
pub use waymark_runtime::llm::OpenAiCompatible;
pub use waymark_runtime::llm::{
    ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, LlmResponse, Message, ModelPrice,
    PriceParseError, PriceTable, PromptRef, Role, ScriptedProvider, ScriptedReply, ToolCall,
    ToolChoice, ToolSpec, TranscriptPart, Usage, LLM_ACTIVITY, TOOLSET_KIND, TRANSCRIPT_KIND,
};

use crate::{ActivityCall, ActivityError, ActivityOptions, WorkflowContext};

mod attempt_cost;
mod ladder;

use attempt_cost::AttemptCost;

pub use ladder::{HumanReview, Ladder, LadderError, Validated, Validator};

/// A model call under construction: `Llm::new("planner").system(..).user(..)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Llm {
    request: LlmRequest,
}

impl Llm {
    /// A call to `model`.
    pub fn new(model: &str) -> Self {
        Self {
            request: LlmRequest::new(model),
        }
    }

    /// Adds a system message.
    pub fn system(self, content: impl Into<String>) -> Self {
        self.message(Role::System, content)
    }

    /// Adds a user message.
    pub fn user(self, content: impl Into<String>) -> Self {
        self.message(Role::User, content)
    }

    /// Adds an assistant message (a previous answer, for a repair prompt).
    pub fn assistant(self, content: impl Into<String>) -> Self {
        self.message(Role::Assistant, content)
    }

    fn message(mut self, role: Role, content: impl Into<String>) -> Self {
        let content = content.into();
        self.request.messages.push(Message::new(role, content));
        self
    }

    /// Names the prompt template and its version (journaled, shown in telemetry).
    pub fn prompt(mut self, id: &str, version: &str) -> Self {
        let (id, version) = (id.to_owned(), version.to_owned());
        self.request.prompt = Some(PromptRef { id, version });
        self
    }

    /// Sampling temperature.
    pub fn temperature(mut self, temperature: f64) -> Self {
        self.request.temperature = Some(temperature);
        self
    }

    /// Cap on generated tokens.
    pub fn max_tokens(mut self, max_tokens: u32) -> Self {
        self.request.max_tokens = Some(max_tokens);
        self
    }

    /// Offers a tool to the model.
    pub fn tool(mut self, tool: ToolSpec) -> Self {
        self.request.tools.push(tool);
        self
    }

    /// Appends `messages` to the conversation (a transcript with tool calls and results).
    pub fn messages(mut self, messages: impl IntoIterator<Item = Message>) -> Self {
        self.request.messages.extend(messages);
        self
    }

    /// Whether and which tool the model must call.
    pub fn tool_choice(mut self, choice: ToolChoice) -> Self {
        self.request.tool_choice = Some(choice);
        self
    }

    /// Whether the model may call several tools in one answer.
    pub fn parallel_tool_calls(mut self, parallel: bool) -> Self {
        self.request.parallel_tool_calls = Some(parallel);
        self
    }

    /// Asks for an answer that follows `schema` (a JSON schema); read it with
    /// [`LlmResponse`]'s text and [`parse_json`].
    pub fn response_schema(mut self, schema: serde_json::Value) -> Self {
        self.request.response_schema = Some(schema);
        self
    }

    /// Asks for an answer shaped like `T`, with the JSON schema derived from the type. Pair it
    /// with [`Validator::json`] so a malformed answer goes down the repair ladder.
    pub fn json<T: schemars::JsonSchema>(self) -> Self {
        let schema = schemars::schema_for!(T);
        let schema = serde_json::to_value(&schema).unwrap_or_default();
        self.response_schema(schema)
    }

    /// Streams the answer's tokens to the workflow's durable stream as they are generated
    /// (read them with `Worker::stream`). The journaled response stays the whole answer; a
    /// retried generation streams under a new response version.
    pub fn streamed(mut self) -> Self {
        self.request.stream = true;
        self
    }

    /// The conversation before this request's messages, by reference to the last transcript
    /// part committed (see [`waymark_runtime::llm::TranscriptPart`]).
    pub(crate) fn after_history(mut self, history: Option<String>) -> Self {
        self.request.history = history;
        self
    }

    /// The tools offered, by reference to a toolset artifact.
    pub(crate) fn toolset(mut self, toolset: String) -> Self {
        self.request.toolset = Some(toolset);
        self
    }

    /// The same request on another model (the ladder's fallback).
    pub(crate) fn on_model(mut self, model: &str) -> Self {
        self.request.model = model.to_owned();
        self
    }

    /// The request as it will be journaled.
    pub fn request(&self) -> &LlmRequest {
        &self.request
    }
}

/// Parses a structured answer into `T`; a malformed one is a retriable error (a new call may
/// answer well).
pub fn parse_json<T: DeserializeOwned>(response: &LlmResponse) -> Result<T, ActivityError> {
    serde_json::from_str(&response.text).map_err(|e| {
        ActivityError::retriable(format!(
            "malformed structured output from {}: {e}",
            response.model
        ))
    })
}

impl WorkflowContext {
    /// Calls a model through the worker's provider. Journaled: on replay the recorded response
    /// is returned and the provider is not called. Add `.validate(..)` for the repair ladder.
    pub fn llm(&self, call: Llm) -> LlmCall {
        LlmCall {
            call: self.schedule_builtin(LLM_ACTIVITY, &call.request),
            ctx: self.clone(),
            llm: call,
        }
    }
}

/// The pending response of `ctx.llm`.
#[must_use = "a model call does nothing for the workflow unless awaited"]
pub struct LlmCall {
    call: ActivityCall<LlmResponse>,
    ctx: WorkflowContext,
    llm: Llm,
}

impl Future for LlmCall {
    type Output = Result<LlmResponse, ActivityError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.call).poll(cx)
    }
}

impl LlmCall {
    /// The model call's command; `None` when the run is stopping.
    pub(crate) fn seq(&self) -> Option<waymark_runtime::journal::Seq> {
        self.call.seq()
    }

    /// Checks the answer with `validator`, starting the repair ladder: configure it with
    /// [`Ladder::repair`] and [`Ladder::fallback`], then await it. A streamed answer's stream
    /// version is committed only once the validators accept it, and superseded when they
    /// reject it.
    pub fn validate(self, validator: Validator) -> Ladder {
        Ladder::new(self.ctx, self.llm, self.call, validator)
    }
}

impl FusedFuture for LlmCall {
    fn is_terminated(&self) -> bool {
        self.call.is_terminated()
    }
}

impl LlmConfig {
    /// The request with the transcript and toolset it names read back in, when it names any.
    async fn resolved(
        &self,
        info: &ActivityInfo,
        request: LlmRequest,
    ) -> Result<LlmRequest, Failure> {
        if request.history.is_none() && request.toolset.is_none() {
            return Ok(request);
        }
        let resolving = info
            .artifacts
            .blocking(move |read| resolve_references(request, read));
        // A part that cannot be read now may be readable on a later attempt (a store error); a
        // chain that is wrong stays wrong, but the bounded retries say so in the journal.
        let retriable =
            |e: String| Failure::new(FailureKind::Retriable, format!("model request: {e}"));
        resolving.await.map_err(retriable)?.map_err(retriable)
    }
}

/// The worker's model configuration.
#[derive(Clone)]
pub(crate) struct LlmConfig {
    pub(crate) provider: Arc<dyn LlmProvider>,
    pub(crate) prices: PriceTable,
    pub(crate) options: ActivityOptions,
}

impl LlmConfig {
    pub(crate) fn new(provider: Arc<dyn LlmProvider>) -> Self {
        let options = ActivityOptions::default()
            .max_attempts(4)
            .initial_backoff(Duration::from_secs(1))
            .max_backoff(Duration::from_secs(60));
        Self {
            provider,
            prices: PriceTable::default(),
            options,
        }
    }

    /// The built-in activity that runs one model call.
    pub(crate) fn into_registration(self) -> RegisteredActivity {
        let options = self.options.clone();
        let run: rt::ActivityFn = Arc::new(move |info: ActivityInfo, input: Payload| {
            let config = self.clone();
            async move { config.call(info, input).await }.boxed()
        });
        RegisteredActivity {
            run,
            options,
            effect: None,
            cached: false,
        }
    }

    async fn call(&self, info: ActivityInfo, input: Payload) -> Result<Payload, Failure> {
        let request: LlmRequest = input.decode().map_err(|e| {
            Failure::new(
                FailureKind::Terminal,
                format!("model request does not decode: {e}"),
            )
        })?;
        let mut request = self.resolved(&info, request).await?;
        // A fork may run its new model calls on another model than the code names.
        request.model = info.lineage.model(&request.model).to_owned();
        let cost = AttemptCost::new(&self.prices, &info, &request);
        cost.price_interrupted_before(&info);
        let model = request.model.clone();
        let prompt_version = request.prompt.as_ref().map(|p| p.version.clone());
        let started = Instant::now();
        let completion = match request.stream {
            true => {
                let sink = cost.counting_sink(info.stream);
                self.provider.stream(request, sink)
            }
            false => self.provider.complete(request),
        };
        let completion = match completion.await {
            Ok(completion) => {
                cost.answered();
                completion
            }
            Err(error) => {
                cost.failed();
                return Err(error.into_activity_error().to_failure());
            }
        };
        let response = LlmResponse {
            cost_micros: self.prices.cost_micros(&model, completion.usage),
            latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            text: completion.text,
            model,
            provider_model: completion.provider_model,
            prompt_version,
            usage: completion.usage,
            finish_reason: completion.finish_reason,
            tool_calls: completion.tool_calls,
        };
        Payload::encode(&response).map_err(|e| Failure::new(FailureKind::Terminal, e.to_string()))
    }
}
