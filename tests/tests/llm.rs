//! Model calls: journaled like activities, replayed without calling the provider again, retried
//! by error class. The OpenAI-compatible provider is tested over real HTTP against a local mock
//! server; the counts of requests that reached it are the assertions.

use std::time::Duration;

use serde_json::json;
use waymark::llm::{LlmError, LlmProvider, Message, OpenAiCompatible, Role, ScriptedProvider};
use waymark::llm::{LlmRequest, ModelPrice, PriceTable};
use waymark::prelude::*;
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, eventually, pass_gate, with_id};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn request(model: &str, prompt: &str) -> LlmRequest {
    LlmRequest {
        messages: vec![Message::new(Role::User, prompt)],
        temperature: Some(0.2),
        max_tokens: Some(64),
        ..LlmRequest::new(model)
    }
}

fn chat_reply(text: &str) -> serde_json::Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "planner-2026-01",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    })
}

async fn mock_once(server: &MockServer, response: ResponseTemplate) {
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(response)
        .up_to_n_times(1)
        .mount(server)
        .await;
}

/// A provider patient enough that only a deliberately delayed answer times out.
fn provider(server: &MockServer) -> OpenAiCompatible {
    provider_timing_out_after(server, Duration::from_secs(10))
}

fn provider_timing_out_after(server: &MockServer, timeout: Duration) -> OpenAiCompatible {
    OpenAiCompatible::with_timeout(&format!("{}/v1", server.uri()), timeout)
}

async fn requests_received(server: &MockServer) -> usize {
    server.received_requests().await.unwrap_or_default().len()
}

#[tokio::test]
async fn http_provider_parses_a_completion_and_sends_the_request() {
    let server = MockServer::start().await;
    mock_once(
        &server,
        ResponseTemplate::new(200).set_body_json(chat_reply("rebook with fastship")),
    )
    .await;
    let completion = provider(&server)
        .api_key("sk-test")
        .complete(request("planner", "plan"))
        .await
        .unwrap();
    assert_eq!(completion.text, "rebook with fastship");
    assert_eq!(completion.provider_model, "planner-2026-01");
    assert_eq!(completion.usage.prompt_tokens, 12);
    assert_eq!(completion.usage.completion_tokens, 5);
    let sent = &server.received_requests().await.unwrap()[0];
    let body: serde_json::Value = serde_json::from_slice(&sent.body).unwrap();
    assert_eq!(body["model"], "planner");
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(body["stream"], false);
    let auth = sent.headers.get("authorization").unwrap().to_str().unwrap();
    assert_eq!(auth, "Bearer sk-test");
}

#[tokio::test]
async fn http_provider_streams_server_sent_events() {
    let server = MockServer::start().await;
    let events = [
        r#"{"model":"writer-1","choices":[{"index":0,"delta":{"role":"assistant","content":"Your "}}]}"#,
        r#"{"model":"writer-1","choices":[{"index":0,"delta":{"content":"parcel ships "}}]}"#,
        r#"{"model":"writer-1","choices":[{"index":0,"delta":{"content":"today."},"finish_reason":"stop"}]}"#,
        r#"{"model":"writer-1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}"#,
    ];
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    let response = ResponseTemplate::new(200).set_body_raw(body, "text/event-stream");
    mock_once(&server, response).await;
    let chunks = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = {
        let chunks = chunks.clone();
        Box::new(move |chunk: &str| chunks.lock().unwrap().push(chunk.to_owned()))
    };
    let completion = provider(&server)
        .stream(request("writer", "eta"), sink)
        .await
        .unwrap();
    assert_eq!(
        *chunks.lock().unwrap(),
        ["Your ", "parcel ships ", "today."]
    );
    assert_eq!(completion.text, "Your parcel ships today.");
    assert_eq!(completion.usage.completion_tokens, 4);
    assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
}

#[tokio::test]
async fn http_provider_classifies_failures() {
    let server = MockServer::start().await;
    let cases = [
        ResponseTemplate::new(429).insert_header("Retry-After", "7"),
        ResponseTemplate::new(500).set_body_string("upstream crashed"),
        ResponseTemplate::new(200).set_delay(Duration::from_secs(2)),
        ResponseTemplate::new(200).set_body_string("{not json"),
        ResponseTemplate::new(400).set_body_json(json!({"error": {
            "code": "context_length_exceeded",
            "message": "This model's maximum context length is 8192 tokens"}})),
        ResponseTemplate::new(401).set_body_string("bad key"),
    ];
    for case in cases {
        mock_once(&server, case).await;
    }
    let patient = provider(&server);
    let hasty = provider_timing_out_after(&server, Duration::from_millis(500));
    let mut errors = Vec::new();
    for case in 0..6 {
        let provider = if case == 2 { &hasty } else { &patient };
        let error = provider.complete(request("planner", "plan")).await;
        errors.push(error.unwrap_err());
    }
    assert_eq!(
        errors[0],
        LlmError::RateLimited {
            retry_after: Some(Duration::from_secs(7))
        }
    );
    assert!(
        matches!(&errors[1], LlmError::Server { status: 500, message } if message == "upstream crashed")
    );
    assert_eq!(errors[2], LlmError::Timeout);
    assert!(
        matches!(errors[3], LlmError::Malformed(_)),
        "{:?}",
        errors[3]
    );
    assert!(
        matches!(errors[4], LlmError::ContextOverflow(_)),
        "{:?}",
        errors[4]
    );
    assert!(
        matches!(errors[5], LlmError::Refused { status: 401, .. }),
        "{:?}",
        errors[5]
    );
    let classes: Vec<String> = errors
        .into_iter()
        .map(|e| match e.into_activity_error() {
            ActivityError::Retriable { .. } => "retriable".to_owned(),
            ActivityError::Terminal { .. } => "terminal".to_owned(),
            ActivityError::Uncertain { .. } => "uncertain".to_owned(),
            other => format!("unexpected: {other}"),
        })
        .collect();
    assert_eq!(
        classes,
        [
            "retriable",
            "retriable",
            "retriable",
            "retriable",
            "terminal",
            "terminal"
        ]
    );
}

#[workflow]
async fn plan_and_explain(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let plan = ctx
        .llm(
            Llm::new("planner")
                .prompt("plan", "v3")
                .user(format!("Plan for {order_id}")),
        )
        .await?;
    ctx.activity(checkpoint, order_id.clone()).await?;
    let answer = ctx
        .llm(
            Llm::new("writer")
                .prompt("eta", "v1")
                .user(plan.text.clone()),
        )
        .await?;
    Ok(format!("{} / {}", plan.text, answer.text))
}

/// A step between the two model calls that a test can hold, to crash the worker there.
#[activity]
async fn checkpoint(cx: ActivityContext, order_id: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "checkpoint").await;
    Ok(order_id)
}

fn prices() -> PriceTable {
    let price = |p, c| ModelPrice {
        prompt_micros_per_mtok: p,
        completion_micros_per_mtok: c,
    };
    PriceTable::default()
        .with("planner", price(2_000_000, 8_000_000))
        .with("writer", price(500_000, 1_500_000))
}

async fn http_env(server: &MockServer, options: ActivityOptions) -> TestEnv {
    let base_url = format!("{}/v1", server.uri());
    let setup = move |b: WorkerBuilder| {
        b.register(plan_and_explain)
            .register(checkpoint)
            .llm(OpenAiCompatible::with_timeout(
                &base_url,
                Duration::from_secs(5),
            ))
            .llm_prices(prices())
            .llm_options(options.clone())
    };
    TestEnv::start(setup).await.unwrap()
}

/// Waits for the run while moving the manual clock, so that retries fire.
async fn finish(env: &TestEnv, id: &str) -> Result<String, RunError> {
    let run = env.worker().handle(plan_and_explain, id);
    for _ in 0..400 {
        if let Ok(result) = tokio::time::timeout(Duration::from_millis(10), run.result()).await {
            return result;
        }
        env.advance(Duration::from_millis(500)).await;
    }
    panic!("workflow {id} did not finish");
}

#[tokio::test]
async fn a_crash_between_two_model_calls_calls_the_provider_once_more_not_twice() {
    let server = MockServer::start().await;
    mock_once(
        &server,
        ResponseTemplate::new(200).set_body_json(chat_reply("rebook")),
    )
    .await;
    mock_once(
        &server,
        ResponseTemplate::new(200).set_body_json(chat_reply("ships today")),
    )
    .await;
    let mut env = http_env(&server, ActivityOptions::default()).await;
    let wf = "llm-crash";
    close_gate(wf, "checkpoint");
    env.worker()
        .start_with(plan_and_explain, "ORD-1".into(), with_id(wf))
        .await
        .unwrap();
    let journaled = |env: &TestEnv| env.worker().journal(wf).unwrap_or_default().len() >= 4;
    assert!(eventually(400, || journaled(&env)).await);
    assert_eq!(requests_received(&server).await, 1);
    env.crash_and_restart().await.unwrap();
    waymark_tests::open_gate(wf, "checkpoint");
    assert_eq!(finish(&env, wf).await.unwrap(), "rebook / ships today");
    assert_eq!(
        requests_received(&server).await,
        2,
        "the first call was replayed, not repeated"
    );
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn rate_limits_wait_for_retry_after_and_context_overflow_is_not_retried() {
    let server = MockServer::start().await;
    mock_once(
        &server,
        ResponseTemplate::new(429).insert_header("Retry-After", "30"),
    )
    .await;
    mock_once(
        &server,
        ResponseTemplate::new(200).set_body_json(chat_reply("rebook")),
    )
    .await;
    let overflow = json!({"error": {"code": "context_length_exceeded", "message": "too long"}});
    mock_once(&server, ResponseTemplate::new(400).set_body_json(overflow)).await;
    let options = ActivityOptions::default()
        .max_attempts(5)
        .initial_backoff(Duration::from_millis(100));
    let env = http_env(&server, options).await;
    let wf = "llm-rate-limited";
    env.worker()
        .start_with(plan_and_explain, "ORD-2".into(), with_id(wf))
        .await
        .unwrap();
    assert!(
        eventually(400, || env.worker().journal(wf).unwrap_or_default().len()
            >= 3)
        .await
    );
    // The backoff alone would retry after 100 ms; Retry-After says 30 s.
    env.advance(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(requests_received(&server).await, 1);
    let error = finish(&env, wf).await.unwrap_err().to_string();
    assert!(error.contains("context length exceeded"), "{error}");
    assert_eq!(
        requests_received(&server).await,
        3,
        "429, then 200, then one 400 not retried"
    );
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

#[tokio::test]
async fn the_scripted_provider_answers_in_order_and_records_cost() {
    let scripted = ScriptedProvider::default()
        .fault(LlmError::Timeout)
        .reply("rebook with fastship")
        .reply("it ships today");
    let counter = scripted.clone();
    let setup = move |b: WorkerBuilder| {
        b.register(plan_and_explain)
            .register(checkpoint)
            .llm(scripted.clone())
            .llm_prices(prices())
            .llm_options(ActivityOptions::default().initial_backoff(Duration::from_millis(10)))
    };
    let env = TestEnv::start(setup).await.unwrap();
    let wf = "llm-scripted";
    env.worker()
        .start_with(plan_and_explain, "ORD-3".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(
        finish(&env, wf).await.unwrap(),
        "rebook with fastship / it ships today"
    );
    assert_eq!(counter.calls(), 3);
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}
