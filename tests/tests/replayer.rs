//! The Replayer: workflow code checked against an exported production journal kept as a
//! fixture (`tests/journals/`). The same code replays it; changed code is reported at the first
//! divergence, with the recorded and the issued command.

use waymark::inspect::{write_framed, DataDir, Entry, Payload};
use waymark::prelude::*;
use waymark::testing::{ReplayError, Replayer, TestEnv};
use waymark_tests::with_id;

use waymark_tests::quote_and_book::{book, quote, quote_and_book, FIXTURE};

/// A change that is not replay-safe: it asks the carriers in another order.
#[workflow(name = "quote_and_book")]
async fn quote_and_book_reordered(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let slow = ctx.activity(quote, "slowboat".to_owned()).await?;
    let fast = ctx.activity(quote, "fastship".to_owned()).await?;
    let booking = ctx.activity(book, "slowboat".to_owned()).await?;
    Ok(format!("{order_id}: {booking} ({fast}/{slow})"))
}

/// A change to what the workflow returns from the same steps.
#[workflow(name = "quote_and_book")]
async fn quote_and_book_reworded(
    ctx: WorkflowContext,
    order_id: String,
) -> Result<String, WorkflowError> {
    let fast = ctx.activity(quote, "fastship".to_owned()).await?;
    let _slow = ctx.activity(quote, "slowboat".to_owned()).await?;
    let carrier = if fast < 1000 { "fastship" } else { "slowboat" };
    let booking = ctx.activity(book, carrier.to_owned()).await?;
    Ok(format!("{order_id} -> {booking}"))
}

#[tokio::test]
async fn unchanged_code_replays_the_production_journal() {
    let report = Replayer::new()
        .register(quote_and_book)
        .register(quote)
        .register(book)
        .replay_file(FIXTURE)
        .unwrap();
    assert_eq!(report.workflow, "quote_and_book");
    assert_eq!(report.entries, 8);
    assert!(report.ended);
}

#[tokio::test]
async fn reordered_calls_are_reported_at_the_first_divergence() {
    let replayer = Replayer::new()
        .register(quote_and_book_reordered)
        .register(quote)
        .register(book);
    let error = replayer.replay_file(FIXTURE).unwrap_err();
    let ReplayError::Diverged(divergence) = &error else {
        panic!("expected a divergence, got {error}");
    };
    assert_eq!(divergence.seq, 0);
    insta::assert_snapshot!(error.to_string());
}

#[tokio::test]
async fn a_different_output_from_the_same_steps_is_reported() {
    let replayer = Replayer::new()
        .register(quote_and_book_reworded)
        .register(quote)
        .register(book);
    let error = replayer.replay_file(FIXTURE).unwrap_err().to_string();
    assert_eq!(
        error,
        r#"the code returns Ok("ORD-5 -> booked slowboat"), the journal recorded Ok("ORD-5: booked slowboat (1200/900)")"#
    );
}

#[tokio::test]
async fn a_missing_registration_or_a_corrupt_file_is_a_clear_error() {
    let missing = Replayer::new().register(quote_and_book).register(quote);
    let error = missing.replay_file(FIXTURE).unwrap_err().to_string();
    assert_eq!(error, "`book` is not registered with the replayer");
    let error = missing
        .replay_bytes(b"\x00\x00\x00\x05junk")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("record 0 of the journal does not decode"),
        "{error}"
    );
    let error = missing
        .replay_file("/nonexistent.journal")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("cannot read /nonexistent.journal"),
        "{error}"
    );
}

/// A stopped worker's journal, read from its data dir, replays as its export does: the same
/// code to its end, changed code to the first divergence.
#[tokio::test]
async fn a_journal_read_from_a_data_dir_replays_without_an_export() {
    let mut env = TestEnv::start(|b| b.register(quote_and_book).register(quote).register(book))
        .await
        .unwrap();
    if waymark_tests::beneath_rocksdb_only(&env) {
        return;
    }
    let id = "replayed-from-dir";
    let run = env
        .worker()
        .start_with(quote_and_book, "ORD-7".to_owned(), with_id(id));
    run.await.unwrap().result().await.unwrap();
    env.stop().await;
    let journal = DataDir::open(env.data_dir()).unwrap().journal(id).unwrap();

    let same = Replayer::new()
        .register(quote_and_book)
        .register(quote)
        .register(book);
    let report = same.replay_journal(journal.clone()).unwrap();
    assert_eq!(report.entries, journal.len());
    assert!(report.ended);
    let changed = Replayer::new()
        .register(quote_and_book_reordered)
        .register(quote)
        .register(book);
    let error = changed.replay_journal(journal).unwrap_err();
    assert!(matches!(error, ReplayError::Diverged(_)), "{error}");
}

/// Draws a uuid, then panics: what a replay of its journal reports.
#[workflow]
async fn draws_an_id(ctx: WorkflowContext, panic_after: bool) -> Result<String, WorkflowError> {
    let id = ctx.uuid();
    if panic_after {
        panic!("the code broke after drawing {id}");
    }
    Ok(id.to_string())
}

/// The journal of a finished `draws_an_id` run, with `edit` applied to its entries.
async fn journal_of_draws_an_id(panic_after: bool, edit: impl FnOnce(&mut Vec<Entry>)) -> Vec<u8> {
    let env = TestEnv::start(|b| b.register(draws_an_id)).await.unwrap();
    let id = format!("draws-{panic_after}");
    let run = env.worker().start_with(draws_an_id, false, with_id(&id));
    run.await.unwrap().result().await.unwrap();
    let mut journal = env.worker().journal(&id).unwrap();
    if let Some(Entry::WorkflowStarted(started)) = journal.first_mut() {
        started.input = Payload::encode(&panic_after).unwrap();
    }
    edit(&mut journal);
    write_framed(&journal)
}

/// A recorded uuid that is not a uuid stops the replay; the code never sees a placeholder.
#[tokio::test]
async fn a_recorded_value_that_does_not_decode_stops_the_replay() {
    let tampered = journal_of_draws_an_id(false, |journal| {
        for entry in journal.iter_mut() {
            if let Entry::ValueRecorded { value, .. } = entry {
                *value = Payload::encode("not-a-uuid").unwrap();
            }
        }
    })
    .await;
    let replayer = Replayer::new().register(draws_an_id);
    let error = replayer.replay_bytes(&tampered).unwrap_err();
    let ReplayError::Stopped(RunError::PayloadMismatch { .. }) = &error else {
        panic!("expected the replay to stop on the value, got {error}");
    };
    let shown = error.to_string();
    assert!(
        shown.contains("not-a-uuid") || shown.contains("UUID"),
        "{shown}"
    );
}

/// The replayer reports a panic with its message, as a worker does.
#[tokio::test]
async fn a_panic_is_reported_with_its_message() {
    let journal = journal_of_draws_an_id(true, |_| {}).await;
    let replayer = Replayer::new().register(draws_an_id);
    let error = replayer.replay_bytes(&journal).unwrap_err().to_string();
    assert!(error.contains("the code broke after drawing"), "{error}");
}

/// Records the fixture once, as production would (`waymark export`); never overwrites it.
#[tokio::test]
#[ignore = "writes tests/journals/quote-and-book-v1.journal if it is missing"]
async fn record_the_fixture() {
    let setup =
        |b: waymark::WorkerBuilder| b.register(quote_and_book).register(quote).register(book);
    let env = TestEnv::start(setup).await.unwrap();
    let run = env
        .worker()
        .start_with(quote_and_book, "ORD-5".into(), with_id("prod-1"))
        .await
        .unwrap();
    run.result().await.unwrap();
    let journal = env.worker().journal("prod-1").unwrap();
    if !std::path::Path::new(FIXTURE).exists() {
        std::fs::write(FIXTURE, write_framed(&journal)).unwrap();
    }
}
