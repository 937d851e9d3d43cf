//! Workflow code replayed against arbitrary journals: every journal is replayed, diverges, or
//! is refused with an error; the replayer never panics. The first entry's workflow is renamed
//! to the one registered here, so that mutations reach the code.

#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use waymark::prelude::*;
use waymark::testing::Replayer;
use waymark_runtime::journal::{read_framed, write_framed, Entry};

#[activity]
async fn lookup(id: String) -> Result<String, ActivityError> {
    Ok(id)
}

#[activity(effect)]
async fn book(#[key] id: String) -> Result<String, ActivityError> {
    Ok(id)
}

#[workflow]
async fn sample(ctx: WorkflowContext, input: String) -> Result<String, WorkflowError> {
    let found = ctx.activity(lookup, input.clone()).await?;
    let now = ctx.now();
    let note: String = ctx.signal("go").await?;
    ctx.sleep(Duration::from_secs(5)).await;
    let booked = ctx.effect(book, found.clone()).await?;
    Ok(format!("{booked} {note} {now:?}"))
}

fuzz_target!(|bytes: &[u8]| {
    let export = match read_framed(bytes) {
        Ok(mut entries) => {
            if let Some(Entry::WorkflowStarted(started)) = entries.first_mut() {
                started.workflow_name = "sample".to_owned();
            }
            write_framed(&entries)
        }
        Err(_) => bytes.to_vec(),
    };
    let replayer = Replayer::new()
        .register(sample)
        .register(lookup)
        .register(book);
    let _ = replayer.replay_bytes(&export);
});
