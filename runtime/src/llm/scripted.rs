//! A provider that answers from a script, for tests and demos: replies and faults in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, ToolCall, Usage};
use crate::sync::lock;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptedReply {
    /// The model answers this text.
    Text(String),
    /// The model calls these tools, by name and JSON arguments, in this order; the calls get
    /// the ids `call-{n}-{i}`, `n` counting the provider's calls.
    ToolCalls(Vec<(String, String)>),
    /// The call fails with this error.
    Fault(LlmError),
    /// Streamed, the first words come out, then the call fails with the error (a generation
    /// cut off mid-stream); not streamed, it just fails.
    BrokenStream {
        /// What is generated before the failure.
        partial: String,
        /// The failure.
        error: LlmError,
    },
}

/// Answers calls with its script, in order, whatever the request; counts calls. Clones share
/// the script and the count, so a test can keep one to inspect.
#[derive(Debug, Clone, Default)]
pub struct ScriptedProvider {
    script: Arc<Mutex<VecDeque<ScriptedReply>>>,
    calls: Arc<AtomicU32>,
    requests: Arc<Mutex<Vec<LlmRequest>>>,
}

impl ScriptedProvider {
    /// A provider with `replies`, in order.
    pub fn new(replies: impl IntoIterator<Item = ScriptedReply>) -> Self {
        let provider = Self::default();
        lock(&provider.script).extend(replies);
        provider
    }

    /// Appends a text reply.
    pub fn reply(self, text: &str) -> Self {
        lock(&self.script).push_back(ScriptedReply::Text(text.to_owned()));
        self
    }

    /// Appends an answer that calls `calls` (tool name, JSON arguments), in order.
    pub fn tool_calls(self, calls: &[(&str, &str)]) -> Self {
        let calls = calls
            .iter()
            .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()));
        lock(&self.script).push_back(ScriptedReply::ToolCalls(calls.collect()));
        self
    }

    /// Appends a fault.
    pub fn fault(self, error: LlmError) -> Self {
        lock(&self.script).push_back(ScriptedReply::Fault(error));
        self
    }

    /// Appends a generation that fails after streaming `partial`.
    pub fn broken_stream(self, partial: &str, error: LlmError) -> Self {
        let partial = partial.to_owned();
        lock(&self.script).push_back(ScriptedReply::BrokenStream { partial, error });
        self
    }

    /// How many calls reached the provider.
    pub fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }

    /// The requests received, in order.
    pub fn requests(&self) -> Vec<LlmRequest> {
        lock(&self.requests).clone()
    }

    /// Takes the next reply; `Err` holds what was generated before a failure, if anything.
    fn next(&self, request: LlmRequest) -> Result<Completion, (Option<String>, LlmError)> {
        let call_number = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let usage = Usage {
            prompt_tokens: request.messages.iter().map(|m| words(&m.content)).sum(),
            completion_tokens: 0,
        };
        let model = request.model.clone();
        lock(&self.requests).push(request);
        let reply = lock(&self.script).pop_front().ok_or_else(|| {
            let message = "the scripted provider has no reply left for this call".into();
            (None, LlmError::Refused { status: 0, message })
        })?;
        match reply {
            ScriptedReply::Fault(error) => Err((None, error)),
            ScriptedReply::BrokenStream { partial, error } => Err((Some(partial), error)),
            ScriptedReply::Text(text) => Ok(Completion {
                usage: Usage {
                    completion_tokens: words(&text),
                    ..usage
                },
                text,
                provider_model: format!("{model}@scripted"),
                finish_reason: Some("stop".into()),
                tool_calls: Vec::new(),
            }),
            ScriptedReply::ToolCalls(calls) => {
                let tool_calls = numbered_calls(call_number, calls);
                let completion_tokens = tool_calls.iter().map(|c| words(&c.arguments)).sum();
                Ok(Completion {
                    usage: Usage {
                        completion_tokens,
                        ..usage
                    },
                    text: String::new(),
                    provider_model: format!("{model}@scripted"),
                    finish_reason: Some("tool_calls".into()),
                    tool_calls,
                })
            }
        }
    }
}

fn numbered_calls(call_number: u32, calls: Vec<(String, String)>) -> Vec<ToolCall> {
    let numbered = calls.into_iter().enumerate();
    let calls = numbered.map(|(i, (name, arguments))| ToolCall {
        id: format!("call-{call_number}-{}", i + 1),
        name,
        arguments,
    });
    calls.collect()
}

/// The text in word-sized chunks, each with its leading space, as a model would stream it.
fn word_chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices().skip(1) {
        if c == ' ' {
            chunks.push(&text[start..i]);
            start = i;
        }
    }
    if start < text.len() {
        chunks.push(&text[start..]);
    }
    chunks
}

/// A deterministic stand-in for a token count.
fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

impl LlmProvider for ScriptedProvider {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let reply = self.next(request).map_err(|(_, error)| error);
        futures::future::ready(reply).boxed()
    }

    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let reply = match self.next(request) {
            Ok(completion) => {
                word_chunks(&completion.text)
                    .into_iter()
                    .for_each(&mut chunks);
                Ok(completion)
            }
            Err((partial, error)) => {
                let partial = partial.unwrap_or_default();
                word_chunks(&partial).into_iter().for_each(&mut chunks);
                Err(error)
            }
        };
        futures::future::ready(reply).boxed()
    }
}
