//! A worker on PostgreSQL whose write is lost with its connection: the run stops, lets its
//! lease go, and is claimed again and finished by replay; nothing is poisoned.

use std::sync::Arc;
use std::time::Duration;

use waymark::inspect::Entry;
use waymark::prelude::*;
use waymark::store::{PgOptions, PgStore, Store};
use waymark_tests::{close_gate, count, eventually, executions, open_gate, pass_gate, with_id};

#[activity]
async fn held_step(cx: ActivityContext, i: u64) -> Result<u64, ActivityError> {
    count(cx.workflow_id(), "held");
    pass_gate(cx.workflow_id(), "held").await;
    Ok(i + 1)
}

#[workflow]
async fn one_step(ctx: WorkflowContext, i: u64) -> Result<u64, WorkflowError> {
    Ok(ctx.activity(held_step, i).await?)
}

async fn worker(options: PgOptions) -> Worker {
    let connect = move || PgStore::connect(&options, None);
    let store = tokio::task::spawn_blocking(connect).await.unwrap().unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    Worker::builder()
        .store(store)
        .register(one_step)
        .register(held_step)
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_write_was_lost_with_its_connection_is_claimed_again_and_completes() {
    const ID: &str = "lost-write";
    let Some(url) = waymark::testing::test_database_url() else {
        return;
    };
    let schema = format!("t{:016x}", rand::random::<u64>());
    let mut options = PgOptions::new(&url);
    options.schema = Some(schema.clone());
    options.lease = Duration::from_secs(3);
    let worker = worker(options).await;
    close_gate(ID, "held");
    let run = worker.start_with(one_step, 41, with_id(ID)).await.unwrap();
    assert!(eventually(400, || executions(ID, "held") == 1).await);

    // Another session holds the workflow's lease row: the step's completion waits inside its
    // transaction (the fence share-locks the row), and the server ends that session.
    let (blocker, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let hold = format!(
        "SET search_path TO {schema}; BEGIN; \
         SELECT 1 FROM waymark_leases WHERE workflow_id = '{ID}' FOR UPDATE"
    );
    blocker.batch_execute(&hold).await.unwrap();
    open_gate(ID, "held");
    let waiting = "SELECT pid FROM pg_stat_activity \
                   WHERE application_name = $1 AND wait_event_type = 'Lock'";
    let worker_id = worker.worker_id().unwrap();
    let pid: i32 = loop {
        let rows = blocker.query(waiting, &[&worker_id]).await.unwrap();
        if let Some(row) = rows.first() {
            break row.get(0);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    blocker
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    blocker.batch_execute("ROLLBACK").await.unwrap();

    let finished = tokio::time::timeout(Duration::from_secs(30), run.result()).await;
    let output = finished.expect("the workflow is claimed again and completes");
    assert_eq!(output.unwrap(), 42);
    // The step's completion was lost with the transaction: it ran again (a plain activity runs
    // at least once), and the journal holds one completion.
    assert_eq!(executions(ID, "held"), 2);
    let completions = worker.journal(ID).unwrap().into_iter();
    let completions = completions.filter(|e| matches!(e, Entry::ActivityCompleted { .. }));
    assert_eq!(completions.count(), 1);
    worker.shutdown().await;
}
