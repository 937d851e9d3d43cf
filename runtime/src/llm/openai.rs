//! The OpenAI-compatible chat-completions provider: OpenAI, vLLM, Ollama, llama.cpp's server and
//! anything else that speaks `POST {base}/chat/completions`, plain or streamed over SSE.

use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{json, Value};

use super::{ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, ToolCall, Usage};

/// Environment variable with the server's base URL (`http://localhost:11434/v1`).
pub const BASE_URL_VAR: &str = "WAYMARK_LLM_BASE_URL";
/// Environment variable with the API key (optional for local servers).
pub const API_KEY_VAR: &str = "WAYMARK_LLM_API_KEY";

/// A chat-completions client. Never retries: the runtime does, journaled.
#[derive(Debug, Clone)]
pub struct OpenAiCompatible {
    /// Why the HTTP client could not be built, if it could not (calls then fail with it).
    client: Result<reqwest::Client, String>,
    base_url: String,
    api_key: Option<String>,
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
    let mut body = json!({
        "model": request.model,
        "messages": request.messages,
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
            name: field("name")?,
            arguments: field("arguments")?,
        })
    });
    parsed.collect()
}

/// Reads a `text/event-stream` body: `data: {chunk}` events until `data: [DONE]`.
async fn read_sse(
    response: reqwest::Response,
    mut chunks: ChunkSink,
) -> Result<Completion, LlmError> {
    let mut body = response.bytes_stream();
    let mut pending = Vec::new();
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
                return Ok(completion);
            }
            apply_stream_chunk(data, &mut completion, &mut chunks)?;
        }
    }
    Err(LlmError::Transport(
        "the stream ended before `data: [DONE]`".into(),
    ))
}

fn apply_stream_chunk(
    data: &str,
    completion: &mut Completion,
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
    if let Some(reason) = choice["finish_reason"].as_str() {
        completion.finish_reason = Some(reason.to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(tool_call: Value) -> Value {
        serde_json::json!({
            "model": "m-1",
            "choices": [{"message": {"content": null, "tool_calls": [tool_call]}}],
        })
    }

    #[test]
    fn a_tool_call_is_read_with_its_name_and_arguments() {
        let call = serde_json::json!({"function": {"name": "rebook", "arguments": "{}"}});
        let completion = parse_completion(&body(call)).unwrap();
        assert_eq!(completion.tool_calls[0].name, "rebook");
        assert_eq!(completion.tool_calls[0].arguments, "{}");
    }

    /// A call without a name would dispatch nothing, or the wrong tool: the answer is malformed
    /// (retried as such), never a call named "".
    #[test]
    fn a_tool_call_without_a_name_is_a_malformed_answer() {
        let call = serde_json::json!({"function": {"arguments": "{}"}});
        let error = parse_completion(&body(call)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "malformed provider response: tool call 0 has no `function.name`"
        );
    }
}
