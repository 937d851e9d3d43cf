//! The OpenAI-compatible provider speaks the whole tool protocol over real HTTP: tools offered
//! with `tool_choice` and `parallel_tool_calls`, assistant tool calls and `tool` results sent
//! back under their call ids, tool calls read from plain and streamed answers. The mock
//! server's bodies are shaped like the real API's.

use std::time::Duration;

use serde_json::{json, Value};
use waymark::llm::{
    LlmProvider, LlmRequest, Message, OpenAiCompatible, ToolCall, ToolChoice, ToolSpec,
};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn rebook_tool() -> ToolSpec {
    ToolSpec {
        name: "rebook".into(),
        description: "Rebooks an order with a carrier.".into(),
        parameters: json!({"type": "object", "properties": {
            "order_id": {"type": "string"}, "carrier": {"type": "string"}},
            "required": ["order_id", "carrier"], "additionalProperties": false}),
        version: "1".into(),
    }
}

/// A conversation that already went through one tool call and its result.
fn request_after_a_tool_call() -> LlmRequest {
    let call = ToolCall {
        id: "call_abc".into(),
        name: "rebook".into(),
        arguments: r#"{"order_id":"ORD-1","carrier":"fastship"}"#.into(),
    };
    LlmRequest {
        messages: vec![
            Message::system("You rebook delayed orders."),
            Message::user("ORD-1 is late"),
            Message::assistant("", vec![call]),
            Message::tool_result("call_abc", r#""ref-1""#),
        ],
        tools: vec![rebook_tool()],
        tool_choice: Some(ToolChoice::Tool("rebook".into())),
        parallel_tool_calls: Some(true),
        ..LlmRequest::new("planner")
    }
}

async fn serve(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(response)
        .up_to_n_times(1)
        .mount(server)
        .await;
}

fn provider(server: &MockServer) -> OpenAiCompatible {
    OpenAiCompatible::with_timeout(&format!("{}/v1", server.uri()), Duration::from_secs(10))
}

async fn sent_body(server: &MockServer) -> Value {
    let requests = server.received_requests().await.unwrap_or_default();
    serde_json::from_slice(&requests[0].body).unwrap()
}

#[tokio::test]
async fn tool_calls_and_results_go_out_with_their_ids_and_parallel_calls_come_back() {
    let server = MockServer::start().await;
    let answer = json!({
        "id": "chatcmpl-9", "object": "chat.completion", "model": "planner-2026-01",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null, "tool_calls": [
                {"id": "call_n1", "type": "function", "function": {
                    "name": "notify", "arguments": "{\"order_id\":\"ORD-1\"}"}},
                {"id": "call_e1", "type": "function", "function": {
                    "name": "update_eta", "arguments": "{\"order_id\":\"ORD-1\",\"days\":2}"}}]}}],
        "usage": {"prompt_tokens": 80, "completion_tokens": 30, "total_tokens": 110},
    });
    serve(&server, ResponseTemplate::new(200).set_body_json(answer)).await;
    let completion = provider(&server)
        .complete(request_after_a_tool_call())
        .await
        .unwrap();

    let body = sent_body(&server).await;
    assert_eq!(
        body["messages"][2],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_abc",
               "type": "function", "function": {"name": "rebook",
               "arguments": "{\"order_id\":\"ORD-1\",\"carrier\":\"fastship\"}"}}]})
    );
    assert_eq!(
        body["messages"][3],
        json!({"role": "tool", "tool_call_id": "call_abc", "content": "\"ref-1\""})
    );
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["name"], "rebook");
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "rebook"}})
    );
    assert_eq!(body["parallel_tool_calls"], true);

    let calls: Vec<_> = completion
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    assert_eq!(calls, [("call_n1", "notify"), ("call_e1", "update_eta")]);
    assert_eq!(
        completion.tool_calls[1].arguments,
        r#"{"order_id":"ORD-1","days":2}"#
    );
    assert_eq!(completion.finish_reason.as_deref(), Some("tool_calls"));
}

#[tokio::test]
async fn streamed_tool_call_deltas_are_assembled_into_calls() {
    let server = MockServer::start().await;
    // As the API streams them: the id and name in the first delta of each index, the
    // arguments in fragments, two calls interleaved, usage in a last chunk of its own.
    let events = [
        json!({"model": "planner-2026-01", "choices": [{"index": 0, "delta": {
            "role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_n1",
            "type": "function", "function": {"name": "notify", "arguments": ""}}]}}]}),
        json!({"model": "planner-2026-01", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{\"order_"}}]}}]}),
        json!({"model": "planner-2026-01", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "id": "call_e1", "type": "function",
             "function": {"name": "update_eta", "arguments": "{\"days\":"}}]}}]}),
        json!({"model": "planner-2026-01", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "id\":\"ORD-1\"}"}}]}}]}),
        json!({"model": "planner-2026-01", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 1, "function": {"arguments": "2}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"model": "planner-2026-01", "choices": [],
               "usage": {"prompt_tokens": 80, "completion_tokens": 31}}),
    ];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    serve(
        &server,
        ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"),
    )
    .await;
    let mut request = request_after_a_tool_call();
    request.stream = true;
    let completion = provider(&server)
        .stream(request, Box::new(|_: &str| {}))
        .await
        .unwrap();
    assert_eq!(sent_body(&server).await["stream"], true);
    let calls: Vec<_> = completion
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
        .collect();
    assert_eq!(
        calls,
        [
            ("call_n1", "notify", r#"{"order_id":"ORD-1"}"#),
            ("call_e1", "update_eta", r#"{"days":2}"#)
        ]
    );
    assert_eq!(completion.usage.completion_tokens, 31);
    assert_eq!(completion.finish_reason.as_deref(), Some("tool_calls"));
}
