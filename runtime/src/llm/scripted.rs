//! A provider that answers from a script, for tests and demos: replies and faults in order.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;

use super::{Completion, LlmError, LlmProvider, LlmRequest, Usage};
use crate::sync::lock;

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptedReply {
    /// The model answers this text.
    Text(String),
    /// The call fails with this error.
    Fault(LlmError),
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

    /// Appends a fault.
    pub fn fault(self, error: LlmError) -> Self {
        lock(&self.script).push_back(ScriptedReply::Fault(error));
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

    fn next(&self, request: LlmRequest) -> Result<Completion, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let usage = Usage {
            prompt_tokens: request.messages.iter().map(|m| words(&m.content)).sum(),
            completion_tokens: 0,
        };
        let model = request.model.clone();
        lock(&self.requests).push(request);
        let reply = lock(&self.script)
            .pop_front()
            .ok_or_else(|| LlmError::Refused {
                status: 0,
                message: "the scripted provider has no reply left for this call".into(),
            })?;
        match reply {
            ScriptedReply::Fault(error) => Err(error),
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
        }
    }
}

/// A deterministic stand-in for a token count.
fn words(text: &str) -> u64 {
    text.split_whitespace().count() as u64
}

impl LlmProvider for ScriptedProvider {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        futures::future::ready(self.next(request)).boxed()
    }
}
