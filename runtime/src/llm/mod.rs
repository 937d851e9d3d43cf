//! Model calls: the request and response as journaled, the provider trait, error classes and
//! the price table.
//!
//! A model call is journaled like an activity (the built-in activity [`LLM_ACTIVITY`]): its
//! input is the whole [`LlmRequest`], so the command identity carries the request digest, and
//! its output is the [`LlmResponse`] with the model the provider reported, token usage, cost and
//! latency. On replay the recorded response is returned and the provider is not called.

#[cfg(feature = "openai")]
mod openai;
mod scripted;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::error::ActivityError;
use crate::journal::{Digest, Payload};

#[cfg(feature = "openai")]
pub use openai::{OpenAiCompatible, API_KEY_VAR, BASE_URL_VAR};
pub use scripted::{ScriptedProvider, ScriptedReply};

/// The journal name of the built-in model-call activity.
pub const LLM_ACTIVITY: &str = "waymark.llm";

/// Who speaks in a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call, sent back to the model under the call's id.
    Tool,
}

/// One chat message.
///
/// The tool fields are left out of the journaled request when empty, so requests recorded
/// before tools existed keep their digests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who.
    pub role: Role,
    /// What.
    pub content: String,
    /// The tools an assistant message called (its answer, sent back in the next request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` with `content` and no tool fields.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message: the model's text and the tools it called.
    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls,
            ..Self::new(Role::Assistant, content)
        }
    }

    /// The result of the tool call `call_id`.
    pub fn tool_result(call_id: &str, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(call_id.to_owned()),
            ..Self::new(Role::Tool, content)
        }
    }
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the providers' default).
    Auto,
    /// No tool: answer in text.
    None,
    /// At least one tool.
    Required,
    /// This tool.
    Tool(String),
}

/// The prompt template a request was built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRef {
    /// Template id.
    pub id: String,
    /// Template version.
    pub version: String,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: serde_json::Value,
    /// Version of the tool's schema.
    pub version: String,
}

/// A model call, exactly as journaled (its digest is the command's identity).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmRequest {
    /// Model name as the provider knows it.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Template id and version, when built from one.
    pub prompt: Option<PromptRef>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Cap on generated tokens.
    pub max_tokens: Option<u32>,
    /// Tools offered to the model.
    pub tools: Vec<ToolSpec>,
    /// JSON schema the answer must follow (structured output).
    pub response_schema: Option<serde_json::Value>,
    /// Stream the answer's tokens to the workflow's stream as they are generated. Left out of
    /// the journaled request when false, so requests recorded before it existed still match.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// Whether and which tool the model must call; the provider's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one answer; the provider's default when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The conversation before `messages`, by reference: the hash (`sha256:…`) of the last
    /// [`TranscriptPart`] committed as an artifact. The journal then holds each message once,
    /// not once per turn; the call resolves the chain before it reaches the provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<String>,
    /// The tools offered, by reference: the hash of a list of [`ToolSpec`]s committed as an
    /// artifact of kind [`TOOLSET_KIND`], added to `tools` when the call resolves it. An agent
    /// offers the same tools at every turn; the journal holds them once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolset: Option<String>,
}

impl LlmRequest {
    /// A request to `model` with nothing else set: no messages, tools or options.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_owned(),
            messages: Vec::new(),
            prompt: None,
            temperature: None,
            max_tokens: None,
            tools: Vec::new(),
            response_schema: None,
            stream: false,
            tool_choice: None,
            parallel_tool_calls: None,
            history: None,
            toolset: None,
        }
    }
}

/// One stretch of a conversation, committed as an artifact of kind [`TRANSCRIPT_KIND`]: its
/// messages and the hash of the part before them. A chain of parts is the transcript; each is
/// stored once, content-addressed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptPart {
    /// The part before this one, if any.
    pub previous: Option<String>,
    /// The messages this part adds.
    pub messages: Vec<Message>,
}

/// The artifact kind of a [`TranscriptPart`].
pub const TRANSCRIPT_KIND: &str = "transcript";

/// The artifact kind of a list of [`ToolSpec`]s a request names by reference.
pub const TOOLSET_KIND: &str = "toolset";

/// The longest chain of parts a request may reference: a bound on the reads one call makes,
/// far above any real conversation's turns.
const MAX_TRANSCRIPT_PARTS: usize = 10_000;

/// Reads an artifact's kind and content by hash.
pub type ArtifactRead<'a> = &'a dyn Fn(&Digest) -> Result<Option<(String, Payload)>, String>;

/// `request` with what it names by reference read back in: its history before its messages,
/// oldest first, and its toolset after its tools. What the provider is sent. An artifact that
/// is missing, of another kind or that does not decode is an error naming it.
pub fn resolve_references(
    mut request: LlmRequest,
    read: ArtifactRead<'_>,
) -> Result<LlmRequest, String> {
    let mut parts = Vec::new();
    let mut next = request.history.take();
    while let Some(hash) = next {
        if parts.len() == MAX_TRANSCRIPT_PARTS {
            return Err(format!(
                "the transcript is longer than {MAX_TRANSCRIPT_PARTS} parts"
            ));
        }
        let part: TranscriptPart = read_artifact(read, &hash, TRANSCRIPT_KIND)?;
        next = part.previous;
        parts.push(part.messages);
    }
    let earlier = parts.into_iter().rev().flatten();
    request.messages = earlier.chain(request.messages).collect();
    if let Some(hash) = request.toolset.take() {
        let tools: Vec<ToolSpec> = read_artifact(read, &hash, TOOLSET_KIND)?;
        request.tools.extend(tools);
    }
    Ok(request)
}

fn read_artifact<T: serde::de::DeserializeOwned>(
    read: ArtifactRead<'_>,
    hash: &str,
    kind: &str,
) -> Result<T, String> {
    let digest = Digest::parse_hex(hash)
        .ok_or_else(|| format!("{kind} reference `{hash}` is not a hash"))?;
    let (found, content) = read(&digest)?.ok_or_else(|| format!("{kind} {hash} is not stored"))?;
    if found != kind {
        return Err(format!("artifact {hash} is a `{found}`, not a `{kind}`"));
    }
    content
        .decode()
        .map_err(|e| format!("{kind} {hash} does not decode: {e}"))
}

/// Tokens a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; its result goes back under it. Empty in responses
    /// recorded before ids were kept.
    #[serde(default)]
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, as the JSON text the model wrote.
    pub arguments: String,
}

/// What a provider returned for one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The answer's text.
    pub text: String,
    /// The model (and version) the provider says answered.
    pub provider_model: String,
    /// Tokens used.
    pub usage: Usage,
    /// Why generation stopped (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
    /// Tools the model called.
    pub tool_calls: Vec<ToolCall>,
}

/// A model call's result, as journaled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LlmResponse {
    /// The answer's text.
    pub text: String,
    /// The model requested.
    pub model: String,
    /// The model (and version) the provider reported.
    pub provider_model: String,
    /// The prompt template's version, copied from the request.
    pub prompt_version: Option<String>,
    /// Tokens used.
    pub usage: Usage,
    /// Cost in millionths of a currency unit, from the worker's price table (0 if unpriced).
    pub cost_micros: u64,
    /// Wall-clock time of the call.
    pub latency_ms: u64,
    /// Why generation stopped.
    pub finish_reason: Option<String>,
    /// Tools the model called.
    pub tool_calls: Vec<ToolCall>,
}

/// Why a provider call failed, in classes that decide what a retry may do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LlmError {
    /// No answer in time.
    #[error("model call timed out")]
    Timeout,
    /// Too many requests; wait at least `retry_after` when the provider said so.
    #[error("rate limited by the provider")]
    RateLimited {
        /// The provider's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// The request does not fit the model's context: the same request will never succeed.
    #[error("context length exceeded: {0}")]
    ContextOverflow(String),
    /// The connection failed or broke.
    #[error("transport error: {0}")]
    Transport(String),
    /// The provider answered something that is not a valid response.
    #[error("malformed provider response: {0}")]
    Malformed(String),
    /// The provider failed (5xx).
    #[error("provider error {status}: {message}")]
    Server {
        /// HTTP status.
        status: u16,
        /// Body or reason.
        message: String,
    },
    /// The provider refused the request (4xx other than rate limiting and context length).
    #[error("provider refused the request ({status}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// Body or reason.
        message: String,
    },
}

impl LlmError {
    /// The activity error that carries this class to the retry policy.
    pub fn into_activity_error(self) -> ActivityError {
        let message = self.to_string();
        match self {
            LlmError::RateLimited { retry_after } => ActivityError::Retriable {
                message,
                retry_after,
            },
            LlmError::ContextOverflow(_) | LlmError::Refused { .. } => {
                ActivityError::terminal(message)
            }
            LlmError::Timeout
            | LlmError::Transport(_)
            | LlmError::Malformed(_)
            | LlmError::Server { .. } => ActivityError::retriable(message),
        }
    }
}

/// Receives the text of a streamed answer, chunk by chunk, as it is generated.
pub type ChunkSink = Box<dyn FnMut(&str) + Send>;

/// A model provider. Implementations must not retry on their own: retries are the runtime's,
/// bounded and journaled.
pub trait LlmProvider: Send + Sync + 'static {
    /// One call.
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>>;

    /// One call whose text is handed to `chunks` as it is generated; returns the whole
    /// completion. Providers without streaming hand over the whole text at once.
    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.complete(request);
        Box::pin(async move {
            let completion = call.await?;
            chunks(&completion.text);
            Ok(completion)
        })
    }
}

/// A shared provider is a provider: one instance can serve a worker across restarts.
impl<P: LlmProvider + ?Sized> LlmProvider for Arc<P> {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        (**self).complete(request)
    }

    fn stream(
        &self,
        request: LlmRequest,
        chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        (**self).stream(request, chunks)
    }
}

/// Prices per million tokens, by model name, in millionths of a currency unit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PriceTable {
    prices: HashMap<String, ModelPrice>,
}

/// What one model costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelPrice {
    /// Per million prompt tokens, in micro-units.
    pub prompt_micros_per_mtok: u64,
    /// Per million generated tokens, in micro-units.
    pub completion_micros_per_mtok: u64,
}

impl PriceTable {
    /// Sets the price of `model`.
    pub fn with(mut self, model: &str, price: ModelPrice) -> Self {
        self.prices.insert(model.to_owned(), price);
        self
    }

    /// The cost of `usage` on `model`, rounded up; 0 for a model not in the table.
    pub fn cost_micros(&self, model: &str, usage: Usage) -> u64 {
        let Some(price) = self.prices.get(model) else {
            return 0;
        };
        let tokens = |count: u64, per_mtok: u64| {
            (u128::from(count) * u128::from(per_mtok)).div_ceil(1_000_000)
        };
        let total = tokens(usage.prompt_tokens, price.prompt_micros_per_mtok)
            + tokens(usage.completion_tokens, price.completion_micros_per_mtok);
        u64::try_from(total).unwrap_or(u64::MAX)
    }

    /// The table in `WAYMARK_LLM_PRICES` (see the `FromStr` impl); empty when it is unset.
    pub fn from_env() -> Result<Self, PriceParseError> {
        match std::env::var("WAYMARK_LLM_PRICES") {
            Ok(text) => text.parse(),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(text)) => Err(PriceParseError {
                entry: text.to_string_lossy().into_owned(),
                reason: "not valid Unicode",
            }),
        }
    }
}

/// A price list that does not parse; says which entry and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad price `{entry}`: {reason} (expected `model=prompt/completion`, in micro-units per million tokens)")]
pub struct PriceParseError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// `model=prompt/completion` entries separated by commas, prices in micro-units per million
/// tokens: `gpt-4o-mini=150000/600000,gpt-4o=2500000/10000000`. A model named twice keeps its
/// last price.
impl std::str::FromStr for PriceTable {
    type Err = PriceParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut entries = text.split(',').map(str::trim).filter(|e| !e.is_empty());
        entries.try_fold(Self::default(), |table, entry| {
            let (model, price) = parse_price(entry)?;
            Ok(table.with(model, price))
        })
    }
}

fn parse_price(entry: &str) -> Result<(&str, ModelPrice), PriceParseError> {
    let refuse = |reason| PriceParseError {
        entry: entry.to_owned(),
        reason,
    };
    let (model, prices) = entry.split_once('=').ok_or_else(|| refuse("no `=`"))?;
    let model = model.trim();
    if model.is_empty() {
        return Err(refuse("no model name"));
    }
    let (prompt, completion) = prices.split_once('/').ok_or_else(|| refuse("no `/`"))?;
    let micros = |text: &str| text.trim().parse::<u64>();
    let price = ModelPrice {
        prompt_micros_per_mtok: micros(prompt)
            .map_err(|_| refuse("prompt price is not a whole number"))?,
        completion_micros_per_mtok: micros(completion)
            .map_err(|_| refuse("completion price is not a whole number"))?,
    };
    Ok((model, price))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_priced_per_million_tokens_and_rounded_up() {
        let price = ModelPrice {
            prompt_micros_per_mtok: 2_500_000,
            completion_micros_per_mtok: 10_000_000,
        };
        let table = PriceTable::default().with("planner", price);
        let usage = Usage {
            prompt_tokens: 1_000,
            completion_tokens: 333,
        };
        assert_eq!(table.cost_micros("planner", usage), 2_500 + 3_330);
        assert_eq!(table.cost_micros("unknown", usage), 0);
    }

    #[test]
    fn a_price_list_parses_and_a_bad_entry_is_named() {
        let table: PriceTable = "gpt-4o-mini=150000/600000, planner = 2500000/10000000,"
            .parse()
            .unwrap();
        let usage = Usage {
            prompt_tokens: 1_000_000,
            completion_tokens: 1_000_000,
        };
        assert_eq!(table.cost_micros("gpt-4o-mini", usage), 750_000);
        assert_eq!(table.cost_micros("planner", usage), 12_500_000);
        let refusals = [
            ("gpt-4o-mini", "no `=`"),
            ("=1/2", "no model name"),
            ("m=12", "no `/`"),
            ("m=1.5/2", "prompt price is not a whole number"),
            ("m=1/-2", "completion price is not a whole number"),
        ];
        for (entry, reason) in refusals {
            let error = entry.parse::<PriceTable>().unwrap_err();
            assert_eq!((error.entry.as_str(), error.reason), (entry, reason));
        }
        assert_eq!("".parse::<PriceTable>(), Ok(PriceTable::default()));
    }

    #[test]
    fn error_classes_decide_retries() {
        let rate_limited = LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(3)),
        };
        assert!(matches!(
            rate_limited.into_activity_error(),
            ActivityError::Retriable { retry_after: Some(d), .. } if d == Duration::from_secs(3)
        ));
        let overflow = LlmError::ContextOverflow("8192 tokens".into());
        assert!(matches!(
            overflow.into_activity_error(),
            ActivityError::Terminal { .. }
        ));
        assert!(matches!(
            LlmError::Timeout.into_activity_error(),
            ActivityError::Retriable { .. }
        ));
    }

    fn part(previous: Option<&Payload>, text: &str) -> Payload {
        let part = TranscriptPart {
            previous: previous.map(|p| p.digest().hex()),
            messages: vec![Message::user(text)],
        };
        Payload::encode(&part).unwrap()
    }

    #[test]
    fn a_history_is_read_back_oldest_first_and_a_broken_chain_is_named() {
        let first = part(None, "one");
        let second = part(Some(&first), "two");
        let tools = Payload::encode(&Vec::<ToolSpec>::new()).unwrap();
        let stored = [
            (first.digest(), (TRANSCRIPT_KIND, first.clone())),
            (second.digest(), (TRANSCRIPT_KIND, second.clone())),
            (tools.digest(), (TOOLSET_KIND, tools.clone())),
        ];
        let read = |hash: &Digest| {
            let found = stored.iter().find(|(h, _)| h == hash);
            Ok(found.map(|(_, (kind, content))| ((*kind).to_owned(), content.clone())))
        };
        let request = |history: Option<&Payload>| LlmRequest {
            messages: vec![Message::user("three")],
            history: history.map(|p| p.digest().hex()),
            ..LlmRequest::new("m")
        };
        let resolved = resolve_references(request(Some(&second)), &read).unwrap();
        let texts: Vec<&str> = resolved
            .messages
            .iter()
            .map(|m| m.content.as_str())
            .collect();
        assert_eq!(texts, ["one", "two", "three"]);
        assert_eq!(resolved.history, None);

        let missing = part(Some(&part(None, "never stored")), "orphan");
        let error = resolve_references(request(Some(&missing)), &read).unwrap_err();
        assert!(error.ends_with("is not stored"), "{error}");
        let mut wrong_kind = request(None);
        wrong_kind.history = Some(tools.digest().hex());
        let error = resolve_references(wrong_kind, &read).unwrap_err();
        assert!(
            error.contains("is a `toolset`, not a `transcript`"),
            "{error}"
        );
        let mut not_a_hash = request(None);
        not_a_hash.toolset = Some("latest".into());
        let error = resolve_references(not_a_hash, &read).unwrap_err();
        assert_eq!(error, "toolset reference `latest` is not a hash");
    }
}
