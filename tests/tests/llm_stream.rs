//! Token streaming: a streamed model call writes its chunks to the workflow's durable stream
//! under a response version; a generation that fails or is cut off by a crash is superseded, and
//! the version marked committed is the journaled response. What a reader keeps equals what the
//! workflow got.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use waymark::llm::{
    ChunkSink, Completion, LlmError, LlmProvider, LlmRequest, ScriptedProvider, Usage,
};
use waymark::prelude::*;
use waymark::streams::{visible_text, StreamEvent, StreamItem};
use waymark::testing::TestEnv;
use waymark::WorkerBuilder;
use waymark_tests::{close_gate, eventually, open_gate, pass_gate, with_id};

#[workflow]
async fn explain_delay(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let request = Llm::new("writer")
        .prompt("customer_eta", "v2")
        .user(format!("Explain the delay of {order_id}"))
        .streamed();
    Ok(ctx.llm(request).await?.text)
}

async fn env_with(provider: impl LlmProvider) -> TestEnv {
    let provider = Arc::new(provider);
    let setup = move |b: WorkerBuilder| {
        let options = ActivityOptions::default().initial_backoff(std::time::Duration::ZERO);
        b.register(explain_delay)
            .llm(provider.clone())
            .llm_options(options)
    };
    TestEnv::start(setup).await.unwrap()
}

/// The stream is numbered 1, 2, 3, … without gaps.
fn assert_gap_free(events: &[StreamEvent]) {
    let numbers: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(numbers, expected);
}

#[tokio::test]
async fn a_generation_cut_off_mid_stream_is_superseded_by_the_retry() {
    let answer = "We rebooked your parcel; it ships today.";
    let scripted = ScriptedProvider::default()
        .broken_stream("We are checking", LlmError::Timeout)
        .reply(answer);
    let env = env_with(scripted).await;
    let wf = "stream-retried";
    let run = env
        .worker()
        .start_with(explain_delay, "ORD-20".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), answer);

    let events = env.worker().stream(wf, 0).unwrap();
    assert_gap_free(&events);
    assert_eq!(visible_text(&events, 0), answer, "stream == committed");
    let superseded = events.iter().any(|e| {
        matches!(
            e.item,
            StreamItem::Superseded {
                response_version: 1,
                ..
            }
        )
    });
    assert!(
        superseded,
        "the cut-off generation is marked for readers to drop"
    );

    // A reader that saw up to event 3 resumes with exactly the events after it.
    let resumed = env.worker().stream(wf, 3).unwrap();
    assert_eq!(resumed, events[3..]);
    insta::assert_snapshot!(env.worker().render_stream(wf).unwrap());
}

/// Streams one chunk, then waits at a gate the test holds (the first call only), so the test
/// can crash the worker mid-generation.
struct StallingProvider {
    calls: AtomicU32,
}

const WF_CRASH: &str = "stream-crashed";

impl LlmProvider for StallingProvider {
    fn complete(&self, request: LlmRequest) -> BoxFuture<'static, Result<Completion, LlmError>> {
        self.stream(request, Box::new(|_: &str| {}))
    }

    fn stream(
        &self,
        request: LlmRequest,
        mut chunks: ChunkSink,
    ) -> BoxFuture<'static, Result<Completion, LlmError>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move {
            chunks("Your parcel");
            if call == 1 {
                pass_gate(WF_CRASH, "mid-stream").await;
            }
            chunks(" ships today.");
            Ok(Completion {
                text: "Your parcel ships today.".into(),
                provider_model: format!("{}@stalling", request.model),
                usage: Usage::default(),
                finish_reason: Some("stop".into()),
                tool_calls: Vec::new(),
            })
        })
    }
}

#[tokio::test]
async fn a_crash_mid_stream_leaves_a_superseded_version_and_one_committed() {
    let mut env = env_with(StallingProvider {
        calls: AtomicU32::new(0),
    })
    .await;
    close_gate(WF_CRASH, "mid-stream");
    env.worker()
        .start_with(explain_delay, "ORD-21".into(), with_id(WF_CRASH))
        .await
        .unwrap();
    let streaming = |env: &TestEnv| !env.worker().stream(WF_CRASH, 0).unwrap().is_empty();
    assert!(eventually(400, || streaming(&env)).await);
    env.crash_and_restart().await.unwrap();
    let run = env.worker().handle(explain_delay, WF_CRASH);
    let text = run.result().await.unwrap();
    open_gate(WF_CRASH, "mid-stream");

    let events = env.worker().stream(WF_CRASH, 0).unwrap();
    assert_gap_free(&events);
    assert_eq!(visible_text(&events, 0), text);
    insta::assert_snapshot!(env.worker().render_stream(WF_CRASH).unwrap());
}

/// What a reader acknowledged is in the store, per channel: it survives a crash, never moves
/// back, and cannot pass what was generated.
#[tokio::test]
async fn delivery_status_survives_a_restart_and_stays_within_the_stream() {
    let mut env = env_with(ScriptedProvider::default().reply("Your parcel ships today.")).await;
    let wf = "delivery-status";
    let run = env
        .worker()
        .start_with(explain_delay, "ORD-22".into(), with_id(wf))
        .await
        .unwrap();
    run.result().await.unwrap();
    let last = env.worker().stream(wf, 0).unwrap().last().unwrap().seq;
    assert!(last > 2, "the answer was streamed in several events");
    let worker = env.worker();
    assert_eq!(worker.acknowledge_stream(wf, "web", 2).await.unwrap(), 2);
    assert_eq!(
        worker.acknowledge_stream(wf, "mobile", last).await.unwrap(),
        last
    );
    env.crash_and_restart().await.unwrap();
    let worker = env.worker();
    let mut acks = worker.stream_acks(wf).unwrap();
    acks.sort();
    assert_eq!(
        acks,
        vec![("mobile".to_owned(), last), ("web".to_owned(), 2)]
    );
    assert_eq!(
        worker.acknowledge_stream(wf, "web", 1).await.unwrap(),
        2,
        "never back"
    );
    let past = worker.acknowledge_stream(wf, "web", last + 1).await;
    assert!(
        matches!(past, Err(waymark::AckError::NotGenerated(_))),
        "{past:?}"
    );
    assert_eq!(
        worker.acknowledge_stream(wf, "web", last).await.unwrap(),
        last
    );
}
