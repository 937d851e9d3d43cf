//! The stage cache: a `#[activity(cache)]` stage called again in one run with the same input is
//! answered with the first call's result, journaled as attempt 0 and counted; replay and a
//! restart answer the same way without calling it.

use waymark::inspect::Entry;
use waymark::prelude::*;
use waymark::store::{Entry as StoredEntry, Store};
use waymark::telemetry::names;
use waymark::testing::TestEnv;
use waymark::{Worker, WorkerBuilder};
use waymark_tests::store::WatchedStore;
use waymark_tests::{count, executions, with_id};

/// An expensive, pure stage: the same text always embeds the same way.
#[activity(cache)]
async fn embed(cx: ActivityContext, text: String) -> Result<Vec<usize>, ActivityError> {
    count(cx.workflow_id(), &format!("embed {text}"));
    Ok(text.bytes().map(usize::from).collect())
}

/// The same stage without the cache: every call runs.
#[activity]
async fn embed_uncached(cx: ActivityContext, text: String) -> Result<Vec<usize>, ActivityError> {
    count(cx.workflow_id(), &format!("uncached {text}"));
    Ok(text.bytes().map(usize::from).collect())
}

/// Embeds `a`, `b`, `a` with each stage, waits for a signal, then embeds `a` once more.
#[workflow]
async fn index(ctx: WorkflowContext, _input: ()) -> Result<usize, WorkflowError> {
    let mut total = 0;
    for text in ["a", "b", "a"] {
        total += ctx.activity(embed, text.to_owned()).await?.len();
        total += ctx.activity(embed_uncached, text.to_owned()).await?.len();
    }
    let _: Result<String, _> = ctx.signal("more").await;
    total += ctx.activity(embed, "a".to_owned()).await?.len();
    Ok(total)
}

fn setup(builder: WorkerBuilder) -> WorkerBuilder {
    builder
        .register(index)
        .register(embed)
        .register(embed_uncached)
}

#[tokio::test]
async fn a_cached_stage_runs_once_per_input_across_a_restart() {
    let mut env = TestEnv::start(setup).await.unwrap();
    let wf = "stage-cache";
    env.worker()
        .start_with(index, (), with_id(wf))
        .await
        .unwrap();
    // Stopped once the run waits for the signal, which it journals after the last uncached
    // call's completion (the second with `a`): stopped before that, the call would rightly run
    // again.
    let waiting = |env: &TestEnv| {
        let journal = env.worker().journal(wf).unwrap_or_default();
        journal.iter().any(|entry| {
            matches!(
                entry,
                Entry::SignalAwaited { .. } | Entry::SignalAwaitedAt { .. }
            )
        })
    };
    assert!(waymark_tests::eventually(400, || waiting(&env)).await);
    env.crash_and_restart().await.unwrap();
    env.worker()
        .signal(wf, "more", "more-1", &"go")
        .await
        .unwrap();
    assert_eq!(env.finish(index, wf, 20).await.unwrap().unwrap(), 7);
    assert_eq!(executions(wf, "embed a"), 1, "answered from the first call");
    assert_eq!(executions(wf, "embed b"), 1);
    assert_eq!(
        executions(wf, "uncached a"),
        2,
        "an uncached stage runs every time"
    );
    let hits = env
        .metrics()
        .value(names::STAGE_CACHE_HITS, &[("activity", "embed")]);
    assert_eq!(hits, 2.0, "counted once each, not again on replay");
    insta::assert_snapshot!(env.worker().render_journal(wf).unwrap());
}

/// The store of [`a_cached_answer_is_journaled_before_the_code_sees_it`]'s worker.
static STORE: std::sync::OnceLock<std::sync::Arc<WatchedStore>> = std::sync::OnceLock::new();

/// Whether the store held the cached answer (a completion of attempt 0) when it ran.
#[activity]
async fn saw_the_cached_answer(cx: ActivityContext, _step: u32) -> Result<bool, ActivityError> {
    let store = STORE.get().expect("the test's store");
    let journal = store.journal(cx.workflow_id()).unwrap();
    let cached = |e: &StoredEntry| {
        matches!(
            e,
            StoredEntry::ActivityCompleted { attempt: 0, .. }
                | StoredEntry::ActivityCompletedAt { attempt: 0, .. }
        )
    };
    Ok(journal.iter().any(cached))
}

#[workflow]
async fn cached_then_read(ctx: WorkflowContext, _input: ()) -> Result<bool, WorkflowError> {
    ctx.activity(embed, "a".to_owned()).await?;
    ctx.activity(embed, "a".to_owned()).await?;
    Ok(ctx.activity(saw_the_cached_answer, 0).await?)
}

/// A cached answer is journaled before the code that asked for it goes on, as an answer of a
/// call is: the read the code issues next finds it in the store.
#[tokio::test]
async fn a_cached_answer_is_journaled_before_the_code_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = WatchedStore::open(dir.path()).unwrap();
    assert!(STORE.set(store.clone()).is_ok());
    let builder = Worker::builder().store(store).register(cached_then_read);
    let builder = builder.register(embed).register(saw_the_cached_answer);
    let worker = builder.build().await.unwrap();
    let run = worker.start_with(cached_then_read, (), with_id("stage-cache-journaled"));
    assert!(run.await.unwrap().result().await.unwrap());
    worker.shutdown().await;
}
