//! The OpenAI-compatible chat-completions provider: OpenAI, vLLM, Ollama, llama.cpp's server and
//! anything else that speaks `POST {base}/chat/completions`, plain or streamed over SSE.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};

use super::{
    ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, Message, ToolCall, ToolChoice, Usage,
};

/// Environment variable with the server's base URL (`http://localhost:11434/v1`).
pub const BASE_URL_VAR: &str = "WAYMARK_LLM_BASE_URL";
/// Environment variable with the API key (optional for local servers).
pub const API_KEY_VAR: &str = "WAYMARK_LLM_API_KEY";

/// A chat-completions client. Never retries: the runtime does, journaled. Its `Debug` does not
/// show the API key.
#[derive(Clone)]
pub struct OpenAiCompatible {
    /// Why the HTTP client could not be built, if it could not (calls then fail with it).
    client: Result<reqwest::Client, String>,
    base_url: String,
    api_key: Option<String>,
}

impl std::fmt::Debug for OpenAiCompatible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = self.api_key.as_ref().map(|_| "<redacted>");
        f.debug_struct("OpenAiCompatible")
            .field("base_url", &self.base_url)
            .field("api_key", &key)
            .field("client", &self.client.as_ref().map(|_| "reqwest::Client"))
            .finish()
    }
}

impl OpenAiCompatible {
    /// A client for `base_url` (up to and including `/v1`) with a 120 s request timeout.
    pub fn new(base_url: &str) -> Self {
        Self::with_timeout(base_url, Duration::from_secs(120))
    }

    /// A client whose calls time out after `timeout` (the whole request, streaming included).
    pub fn with_timeout(base_url: &str, timeout: Duration) -> Self {
        let client = reqwest::Client::builder().timeout(timeout).build();
        let client = client.map_err(|error| format!("the HTTP client could not be built: {error}"));
        Self {
            client,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key: None,
        }
    }

    /// Sends `key` as a bearer token.
    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = Some(key.to_owned());
        self
    }

    /// Configured from [`BASE_URL_VAR`] and [`API_KEY_VAR`]; `None` when no base URL is set.
    pub fn from_env() -> Option<Self> {
        let base_url = std::env::var(BASE_URL_VAR).ok()?;
        let provider = Self::new(&base_url);
        Some(match std::env::var(API_KEY_VAR) {
            Ok(key) => provider.api_key(&key),
            Err(_) => provider,
        })
    }

    fn post(&self, body: &Value) -> Result<reqwest::RequestBuilder, LlmError> {
        let client = self
            .client
            .as_ref()
            .map_err(|why| LlmError::Transport(why.clone()))?;
        let url = format!("{}/chat/completions", self.base_url);
        let request = client.post(url).json(body);
        Ok(match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        })
    }
}

impl LlmProvider for OpenAiCompatible {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.post(&request_body(&request, false));
        async move {
            let response = check_status(call?.send().await.map_err(transport)?).await?;
            let body: Value = response.json().await.map_err(|e| match e.is_timeout() {
                true => LlmError::Timeout,
                false => LlmError::Malformed(e.to_string()),
            })?;
            parse_completion(&body)
        }
        .boxed()
    }

    fn stream(
        &self,
        request: LlmRequest,
        chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.post(&request_body(&request, true));
        async move {
            let response = check_status(call?.send().await.map_err(transport)?).await?;
            read_sse(response, chunks).await
        }
        .boxed()
    }
}

fn request_body(request: &LlmRequest, stream: bool) -> Value {
    let messages: Vec<Value> = request.messages.iter().map(message_json).collect();
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "stream": stream,
    });
    if let Some(temperature) = request.temperature {
        body["temperature"] = json!(temperature);
    }
    if let Some(max_tokens) = request.max_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name, "description": tool.description, "parameters": tool.parameters,
                }})
            })
            .collect();
        body["tools"] = Value::Array(tools);
        if let Some(parallel) = request.parallel_tool_calls {
            body["parallel_tool_calls"] = json!(parallel);
        }
    }
    if let Some(choice) = &request.tool_choice {
        body["tool_choice"] = tool_choice_json(choice);
    }
    if let Some(schema) = &request.response_schema {
        body["response_format"] = json!({"type": "json_schema", "json_schema": {
            "name": "response", "schema": schema, "strict": true,
        }});
    }
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// A message in the chat-completions shape: an assistant's tool calls under `tool_calls` (its
/// content `null` when it said nothing), a tool result with the `tool_call_id` it answers.
fn message_json(message: &Message) -> Value {
    let mut json = json!({"role": message.role, "content": message.content});
    if !message.tool_calls.is_empty() {
        let calls: Vec<Value> = message.tool_calls.iter().map(tool_call_json).collect();
        json["tool_calls"] = Value::Array(calls);
        if message.content.is_empty() {
            json["content"] = Value::Null;
        }
    }
    if let Some(call_id) = &message.tool_call_id {
        json["tool_call_id"] = json!(call_id);
    }
    json
}

fn tool_call_json(call: &ToolCall) -> Value {
    json!({"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}})
}

fn tool_choice_json(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
    }
}

fn transport(error: reqwest::Error) -> LlmError {
    if error.is_timeout() {
        LlmError::Timeout
    } else {
        LlmError::Transport(error.to_string())
    }
}

/// Turns an error status into its class; passes a success through.
async fn check_status(response: reqwest::Response) -> Result<reqwest::Response, LlmError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let message = response.text().await.unwrap_or_default();
    let status = status.as_u16();
    Err(match status {
        429 => LlmError::RateLimited { retry_after },
        400 | 413 if is_context_overflow(&message) => LlmError::ContextOverflow(message),
        500..=599 => LlmError::Server { status, message },
        _ => LlmError::Refused { status, message },
    })
}

/// OpenAI says `context_length_exceeded`; vLLM and llama.cpp say "maximum context length" or
/// "context size" in the message.
fn is_context_overflow(body: &str) -> bool {
    let body = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context size",
        "context length",
    ]
    .iter()
    .any(|needle| body.contains(needle))
}

fn parse_completion(body: &Value) -> Result<Completion, LlmError> {
    let choice = body["choices"]
        .get(0)
        .ok_or_else(|| LlmError::Malformed("no `choices[0]` in the response".into()))?;
    let message = &choice["message"];
    let text = message["content"].as_str().unwrap_or_default().to_owned();
    let tool_calls = parse_tool_calls(&message["tool_calls"])?;
    if message.is_null() || (text.is_empty() && tool_calls.is_empty()) {
        return Err(LlmError::Malformed(
            "`choices[0].message` has neither content nor tool calls".into(),
        ));
    }
    Ok(Completion {
        text,
        provider_model: body["model"].as_str().unwrap_or_default().to_owned(),
        usage: parse_usage(&body["usage"]),
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
        tool_calls,
    })
}

fn parse_usage(usage: &Value) -> Usage {
    Usage {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        completion_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
    }
}

fn parse_tool_calls(calls: &Value) -> Result<Vec<ToolCall>, LlmError> {
    let Some(calls) = calls.as_array() else {
        return Ok(Vec::new());
    };
    let parsed = calls.iter().enumerate().map(|(index, call)| {
        let field = |name: &str| {
            let value = call["function"][name].as_str();
            value.map(str::to_owned).ok_or_else(|| {
                LlmError::Malformed(format!("tool call {index} has no `function.{name}`"))
            })
        };
        Ok(ToolCall {
            id: call_id(call["id"].as_str().unwrap_or_default(), index),
            name: field("name")?,
            arguments: field("arguments")?,
        })
    });
    parsed.collect()
}

/// The provider's id for a call, or `call_{index}` from a server that gives none (some local
/// servers do not): results go back under the id recorded with the answer, whichever it is.
fn call_id(given: &str, index: usize) -> String {
    match given.is_empty() {
        true => format!("call_{index}"),
        false => given.to_owned(),
    }
}

/// A tool call as it arrives in stream chunks: the id and name in the first delta of its
/// `index`, the arguments' text spread over the following ones.
#[derive(Debug, Default)]
struct StreamedCall {
    id: String,
    name: String,
    arguments: String,
}

/// Adds one chunk's `delta.tool_calls` to the calls assembled so far.
fn apply_tool_call_deltas(deltas: &Value, calls: &mut Vec<StreamedCall>) -> Result<(), LlmError> {
    let Some(deltas) = deltas.as_array() else {
        return Ok(());
    };
    for delta in deltas {
        let index = delta["index"].as_u64().ok_or_else(|| {
            LlmError::Malformed("a streamed tool call delta has no `index`".into())
        })?;
        // A model calls a handful of tools per answer; a wild index is a broken stream, not a
        // reason to allocate.
        let index = usize::try_from(index)
            .ok()
            .filter(|i| *i <= calls.len() && *i < MAX_STREAMED_CALLS)
            .ok_or_else(|| {
                LlmError::Malformed(format!("streamed tool call index {index} is out of order"))
            })?;
        if index == calls.len() {
            calls.push(StreamedCall::default());
        }
        let call = &mut calls[index];
        // The id and the name come whole, in a call's first delta; a server that repeats them
        // in later deltas must not double them.
        if let Some(id) = delta["id"].as_str().filter(|_| call.id.is_empty()) {
            call.id = id.to_owned();
        }
        let function = &delta["function"];
        if let Some(name) = function["name"].as_str().filter(|_| call.name.is_empty()) {
            call.name = name.to_owned();
        }
        if let Some(arguments) = function["arguments"].as_str() {
            call.arguments.push_str(arguments);
        }
    }
    Ok(())
}

/// The most tool calls one streamed answer may carry.
const MAX_STREAMED_CALLS: usize = 128;

fn assembled_calls(calls: Vec<StreamedCall>) -> Result<Vec<ToolCall>, LlmError> {
    let checked = calls.into_iter().enumerate().map(|(index, call)| {
        let missing = |field: &str| {
            LlmError::Malformed(format!("streamed tool call {index} has no `{field}`"))
        };
        if call.name.is_empty() {
            return Err(missing("function.name"));
        }
        Ok(ToolCall {
            id: call_id(&call.id, index),
            name: call.name,
            arguments: call.arguments,
        })
    });
    checked.collect()
}

/// Reads a `text/event-stream` body: `data: {chunk}` events until `data: [DONE]`.
async fn read_sse(
    response: reqwest::Response,
    mut chunks: ChunkSink,
) -> Result<Completion, LlmError> {
    let mut body = response.bytes_stream();
    let mut pending = Vec::new();
    let mut calls = Vec::new();
    let mut completion = Completion {
        text: String::new(),
        provider_model: String::new(),
        usage: Usage::default(),
        finish_reason: None,
        tool_calls: Vec::new(),
    };
    while let Some(bytes) = body.next().await {
        pending.extend_from_slice(&bytes.map_err(transport)?);
        while let Some(end) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim_end().strip_prefix("data:") else {
                continue; // comments, `event:` and blank separator lines
            };
            let data = data.trim_start();
            if data == "[DONE]" {
                completion.tool_calls = assembled_calls(calls)?;
                return Ok(completion);
            }
            apply_stream_chunk(data, &mut completion, &mut calls, &mut chunks)?;
        }
    }
    Err(LlmError::Transport(
        "the stream ended before `data: [DONE]`".into(),
    ))
}

fn apply_stream_chunk(
    data: &str,
    completion: &mut Completion,
    calls: &mut Vec<StreamedCall>,
    chunks: &mut ChunkSink,
) -> Result<(), LlmError> {
    let chunk: Value = serde_json::from_str(data)
        .map_err(|e| LlmError::Malformed(format!("stream chunk is not JSON: {e}")))?;
    if let Some(model) = chunk["model"].as_str() {
        completion.provider_model = model.to_owned();
    }
    if chunk["usage"].is_object() {
        completion.usage = parse_usage(&chunk["usage"]);
    }
    let Some(choice) = chunk["choices"].get(0) else {
        return Ok(()); // the usage-only final chunk
    };
    if let Some(text) = choice["delta"]["content"].as_str() {
        chunks(text);
        completion.text.push_str(text);
    }
    apply_tool_call_deltas(&choice["delta"]["tool_calls"], calls)?;
    if let Some(reason) = choice["finish_reason"].as_str() {
        completion.finish_reason = Some(reason.to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(tool_call: Value) -> Value {
        serde_json::json!({
            "model": "m-1",
            "choices": [{"message": {"content": null, "tool_calls": [tool_call]}}],
        })
    }

    #[test]
    fn debug_does_not_show_the_api_key() {
        let provider = OpenAiCompatible::new("http://127.0.0.1:9/v1").api_key("sk-canary-4711");
        let shown = format!("{provider:?}");
        assert!(!shown.contains("sk-canary-4711"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn a_tool_call_is_read_with_its_name_and_arguments() {
        let call = serde_json::json!({"id": "call_1", "type": "function",
                                      "function": {"name": "rebook", "arguments": "{}"}});
        let completion = parse_completion(&body(call)).unwrap();
        assert_eq!(completion.tool_calls[0].id, "call_1");
        assert_eq!(completion.tool_calls[0].name, "rebook");
        assert_eq!(completion.tool_calls[0].arguments, "{}");
    }

    /// A call without a name would dispatch nothing, or the wrong tool: the answer is malformed
    /// (retried as such), never a call named "".
    #[test]
    fn a_tool_call_without_a_name_is_a_malformed_answer() {
        let call = serde_json::json!({"id": "call_1", "function": {"arguments": "{}"}});
        let error = parse_completion(&body(call)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "malformed provider response: tool call 0 has no `function.name`"
        );
    }

    fn streamed(chunks: &[Value]) -> Result<Vec<ToolCall>, LlmError> {
        let mut calls = Vec::new();
        for chunk in chunks {
            apply_tool_call_deltas(chunk, &mut calls)?;
        }
        assembled_calls(calls)
    }

    #[test]
    fn streamed_tool_call_deltas_are_assembled_by_index() {
        let calls = streamed(&[
            json!([{"index": 0, "id": "call_a", "type": "function",
                    "function": {"name": "rebook", "arguments": ""}}]),
            json!([{"index": 0, "function": {"arguments": "{\"order_id\":"}}]),
            json!([{"index": 1, "function": {"name": "notify", "arguments": "{}"}}]),
            json!([{"index": 0, "id": "call_a", "function": {"name": "rebook",
                    "arguments": "\"ORD-1\"}"}}]),
        ])
        .unwrap();
        let summary: Vec<_> = calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                ("call_a", "rebook", r#"{"order_id":"ORD-1"}"#),
                ("call_1", "notify", "{}")
            ]
        );
    }

    #[test]
    fn a_broken_tool_call_stream_is_a_malformed_answer() {
        let cases = [
            (
                json!([{"id": "x"}]),
                "a streamed tool call delta has no `index`",
            ),
            (
                json!([{"index": 3, "id": "x"}]),
                "streamed tool call index 3 is out of order",
            ),
            (
                json!([{"index": 0, "id": "x"}]),
                "streamed tool call 0 has no `function.name`",
            ),
        ];
        for (chunk, expected) in cases {
            let error = streamed(&[chunk]).unwrap_err();
            assert_eq!(error, LlmError::Malformed(expected.into()));
        }
    }

    #[test]
    fn tool_messages_are_sent_in_the_chat_completions_shape() {
        let call = ToolCall {
            id: "call_a".into(),
            name: "rebook".into(),
            arguments: "{}".into(),
        };
        let asked = message_json(&Message::assistant("", vec![call]));
        assert_eq!(
            asked,
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_a",
                   "type": "function", "function": {"name": "rebook", "arguments": "{}"}}]})
        );
        let answered = message_json(&Message::tool_result("call_a", "ref-1"));
        assert_eq!(
            answered,
            json!({"role": "tool", "content": "ref-1", "tool_call_id": "call_a"})
        );
    }
}
