//! Workers on one PostgreSQL database. A worker whose write is lost with its connection: the
//! run stops, lets its lease go, and is claimed again and finished by replay; nothing is
//! poisoned. A decision, a cancellation or an operator's resolution sent to a worker that does
//! not run the workflow reaches the one that does, and its answer comes back.

use std::sync::Arc;
use std::time::Duration;

use waymark::approvals::{ApprovalOutcome, ApprovalVerdict};
use waymark::inspect::Entry;
use waymark::operations::{committed, OperatorDecision};
use waymark::prelude::*;
use waymark::store::{PgOptions, PgStore, Store};
use waymark::{ApprovalError, CancelError, ResolveError};
use waymark_tests::signalled::go_then_notes;
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

#[workflow]
async fn asks_first(ctx: WorkflowContext, order: String) -> Result<String, WorkflowError> {
    let plan = ctx.artifact(serde_json::json!({ "order": order }))?;
    Ok(match ctx.approval(&plan).await {
        ApprovalOutcome::Approved(_) => "approved".to_owned(),
        ApprovalOutcome::Rejected { reason, .. } => format!("rejected: {reason}"),
        ApprovalOutcome::Expired => "expired".to_owned(),
    })
}

#[workflow]
async fn sleeps_long(ctx: WorkflowContext, _input: ()) -> Result<(), WorkflowError> {
    ctx.sleep(Duration::from_secs(3600)).await;
    Ok(())
}

#[workflow]
async fn sleeps_for(ctx: WorkflowContext, millis: u64) -> Result<u64, WorkflowError> {
    ctx.sleep(Duration::from_millis(millis)).await;
    Ok(millis)
}

/// An effect whose request goes out and whose answer never comes back.
#[activity(effect, max_attempts = 1)]
async fn notify_once(_cx: ActivityContext, #[key] order: String) -> Result<String, ActivityError> {
    Err(ActivityError::uncertain(format!("no answer about {order}")))
}

#[workflow]
async fn notifies(ctx: WorkflowContext, order: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(notify_once, order).await?)
}

/// Calls its downstream, and hears nothing back while its gate is closed.
#[activity(effect)]
async fn notify_held(cx: ActivityContext, #[key] order: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "notify").await;
    Ok(format!("sent {order}"))
}

/// Gives its notification a tenth of a second, then ends without it.
#[workflow]
async fn notifies_briefly(ctx: WorkflowContext, order: String) -> Result<String, WorkflowError> {
    let mut call = ctx.effect(notify_held, order);
    let mut nap = ctx.sleep(Duration::from_millis(100));
    waymark::select! {
        done = call => Ok(done?),
        _ = nap => Ok("gave up".to_owned()),
    }
}

/// An effect whose call is held while its gate `notify` is closed, with a reconciler that
/// finds it sent: [`find_notice`].
#[activity(effect, reconcile = find_notice)]
async fn notify_found(cx: ActivityContext, #[key] order: String) -> Result<String, ActivityError> {
    pass_gate(cx.workflow_id(), "notify").await;
    Ok(format!("sent {order}"))
}

/// The gates of the reconciliation sweep's test.
const SWEPT: &str = "swept-by-one";

/// Counts each asking, and answers once the gate `answer` of [`SWEPT`] is open.
async fn find_notice(
    cx: ActivityContext,
    order: String,
) -> Result<Reconciled<String>, ActivityError> {
    count(cx.workflow_id(), "asked");
    pass_gate(SWEPT, "answer").await;
    Ok(Reconciled::Committed(format!("sent {order}")))
}

/// [`notifies_briefly`], with a notification whose reconciler can tell.
#[workflow]
async fn notifies_found_briefly(
    ctx: WorkflowContext,
    order: String,
) -> Result<String, WorkflowError> {
    let mut call = ctx.effect(notify_found, order);
    let mut nap = ctx.sleep(Duration::from_millis(100));
    waymark::select! {
        done = call => Ok(done?),
        _ = nap => Ok("gave up".to_owned()),
    }
}

async fn worker(options: PgOptions) -> Worker {
    worker_evicting_after(options, Duration::from_secs(60)).await
}

/// A worker whose runs leave memory when they wait only for timers due later than `after`.
async fn worker_evicting_after(options: PgOptions, after: Duration) -> Worker {
    builder(options)
        .await
        .evict_after(after)
        .build()
        .await
        .unwrap()
}

/// A worker on `schema` of the database at `url`, reaching it through a proxy of its own,
/// whose runs leave memory when they wait only for timers due later than `after`.
async fn behind_a_proxy_evicting_after(
    url: &str,
    schema: &str,
    after: Duration,
) -> (Worker, LosingProxy) {
    let proxy = LosingProxy::start(url).await;
    let worker = worker_evicting_after(shared_options(&proxy.url, schema), after).await;
    (worker, proxy)
}

/// A worker's builder on the database `options` name, with this file's workflows.
async fn builder(options: PgOptions) -> waymark::WorkerBuilder {
    let connect = move || PgStore::connect(&options, None);
    let store = tokio::task::spawn_blocking(connect).await.unwrap().unwrap();
    let store: Arc<dyn Store> = Arc::new(store);
    Worker::builder()
        .store(store)
        .register(one_step)
        .register(held_step)
        .register(asks_first)
        .register(sleeps_long)
        .register(sleeps_for)
        .register(go_then_step)
        .register(go_then_notes)
        .register(go_then_note_beside_a_step)
        .register(notifies)
        .register(notifies_briefly)
        .register(notify_held)
        .register(notify_once)
        .register(notifies_found_briefly)
        .register(notify_found)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_write_was_lost_with_its_connection_is_claimed_again_and_completes() {
    const ID: &str = "lost-write";
    let Some((url, schema)) = database() else {
        return;
    };
    let mut options = PgOptions::new(&url);
    options.schema = Some(schema.clone());
    options.lease = Duration::from_secs(3);
    let worker = worker(options).await;
    close_gate(ID, "held");
    let run = worker.start_with(one_step, 41, with_id(ID)).await.unwrap();
    assert!(eventually(400, || executions(ID, "held") == 1).await);

    // Another session holds the workflow's lease row: the step's completion waits inside its
    // transaction (the fence share-locks the row), and the server ends that session.
    let blocker = session(&url).await;
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
    let completions = completions.filter(|e| matches!(e, Entry::ActivityCompletedAt { .. }));
    assert_eq!(completions.count(), 1);
    worker.shutdown().await;
}

/// The test database's URL and a new schema's name in it; `None` (the test is skipped) when
/// no database is configured and none is required.
fn database() -> Option<(String, String)> {
    let url = waymark::testing::test_database_url()?;
    Some((url, format!("t{:016x}", rand::random::<u64>())))
}

fn shared_options(url: &str, schema: &str) -> PgOptions {
    let mut options = PgOptions::new(url);
    options.schema = Some(schema.to_owned());
    options.lease = Duration::from_secs(3);
    options
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_sent_to_a_worker_without_the_run_are_answered_by_its_owner() {
    let Some((url, schema)) = database() else {
        return;
    };
    let owner = worker(shared_options(&url, &schema)).await;
    let other = worker(shared_options(&url, &schema)).await;

    // An approval: the other worker's refusal is the owner's, typed; its decision applies.
    let asking = owner
        .start_with(asks_first, "ORD-1".into(), with_id("relay-approval"))
        .await
        .unwrap();
    let pending = || {
        !owner
            .pending_approvals("relay-approval")
            .unwrap()
            .is_empty()
    };
    assert!(eventually(400, pending).await);
    let hash = owner.pending_approvals("relay-approval").unwrap()[0]
        .artifact_hash
        .clone();
    let wrong = format!("sha256:{}", "0".repeat(64));
    let verdict = ApprovalVerdict::Approve;
    let refused = other
        .decide_approval("relay-approval", &wrong, "dana@ops", verdict.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ApprovalError::HashMismatch { .. }),
        "{refused}"
    );
    other
        .decide_approval("relay-approval", &hash, "dana@ops", verdict)
        .await
        .unwrap();
    assert_eq!(asking.result().await.unwrap(), "approved");

    // A cancellation of a run waiting on a timer the owner holds.
    let sleeping = owner
        .start_with(sleeps_long, (), with_id("relay-cancel"))
        .await
        .unwrap();
    other.cancel("relay-cancel", "not needed").await.unwrap();
    let cancelled = sleeping.result().await.unwrap_err();
    assert!(cancelled.to_string().contains("not needed"), "{cancelled}");
    let again = other.cancel("relay-cancel", "twice").await.unwrap_err();
    assert!(matches!(again, CancelError::Ended(_)), "{again}");

    // An operator's resolution of an effect whose outcome is unknown.
    let notifying = owner
        .start_with(notifies, "ORD-2".into(), with_id("relay-resolve"))
        .await
        .unwrap();
    let parked = || !owner.awaiting_operator("relay-resolve").unwrap().is_empty();
    assert!(eventually(400, parked).await);
    let (key, record) = owner.awaiting_operator("relay-resolve").unwrap().remove(0);
    let stale = other
        .resolve_operation_at(&key, 2, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    assert!(
        matches!(stale, ResolveError::StaleAttempt { current: 1, .. }),
        "{stale}"
    );
    let mut earlier = record.clone();
    earlier.history.pop();
    let stale = other
        .resolve_operation_as_read(&key, &earlier, OperatorDecision::NotFound, "ops@example")
        .await
        .unwrap_err();
    assert!(
        matches!(stale, ResolveError::StaleRevision { .. }),
        "{stale}"
    );
    // Made on the record as read, relayed with its revision, applied by the owner.
    let decision = committed(&"ref-1").unwrap();
    other
        .resolve_operation_as_read(&key, &record, decision, "ops@example")
        .await
        .unwrap();
    assert_eq!(notifying.result().await.unwrap(), "ref-1");

    // None of it moved a run: the owner ran all three.
    let resident_elsewhere = other.resident_workflows();
    assert_eq!(resident_elsewhere, 0);
    other.shutdown().await;
    owner.shutdown().await;
}

/// A workflow that ended with its effect's call in flight left the operation waiting for an
/// operator, and no worker runs it. Two workers' decisions about it at once: the store
/// applies one, and the other is told the operation is settled.
#[tokio::test(flavor = "multi_thread")]
async fn two_workers_deciding_about_an_ended_workflows_operation_settle_it_once() {
    let Some((url, schema)) = database() else {
        return;
    };
    let owner = worker(shared_options(&url, &schema)).await;
    let other = worker(shared_options(&url, &schema)).await;
    let wf = "ended-decision";
    close_gate(wf, "notify");
    let run = owner
        .start_with(notifies_briefly, "ORD-9".into(), with_id(wf))
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap(), "gave up");
    let waiting = other.awaiting_operator(wf).unwrap();
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let key = waiting[0].0.clone();

    let first = owner.resolve_operation(&key, committed(&"ref-A").unwrap(), "ops@example");
    let second = other.resolve_operation(&key, committed(&"ref-B").unwrap(), "ops@example");
    let (first, second) = tokio::join!(first, second);
    let (applied, refused) = match (first, second) {
        (Ok(()), Err(refused)) => ("ref-A", refused),
        (Err(refused), Ok(())) => ("ref-B", refused),
        both => panic!("not one applied: {both:?}"),
    };
    assert!(
        matches!(refused, ResolveError::NotAwaitingOperator { .. }),
        "{refused}"
    );
    let record = owner.operation(&key).unwrap().unwrap();
    let (waymark::operations::OperationStatus::Committed { result, .. }, Ok(decided)) =
        (&record.status, committed(&applied))
    else {
        panic!("{} after the decisions", record.status.name());
    };
    assert_eq!(OperatorDecision::Committed(result.clone()), decided);
    open_gate(wf, "notify");
    other.shutdown().await;
    owner.shutdown().await;
}

/// Workers on one database share the reconciliation sweep out: each operation awaiting a
/// decision is asked about by one of them, once, and settled by its answer.
#[tokio::test(flavor = "multi_thread")]
async fn workers_on_one_database_ask_about_each_operation_once() {
    let Some((url, schema)) = database() else {
        return;
    };
    let sweeping = |options| async {
        let every = Duration::from_millis(200);
        builder(options)
            .await
            .sweep_every(every)
            .build()
            .await
            .unwrap()
    };
    let first = sweeping(shared_options(&url, &schema)).await;
    let second = sweeping(shared_options(&url, &schema)).await;
    close_gate(SWEPT, "answer");
    let ids: Vec<String> = (0..6).map(|n| format!("{SWEPT}-{n}")).collect();
    for id in &ids {
        close_gate(id, "notify");
        let run = first
            .start_with(notifies_found_briefly, id.clone(), with_id(id))
            .await
            .unwrap();
        assert_eq!(run.result().await.unwrap(), "gave up");
    }
    let asked = |id: &String| executions(id, "asked");
    assert!(eventually(400, || ids.iter().any(|id| asked(id) > 0)).await);
    // Several passes of both workers, each held at its first answer.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let twice: Vec<&String> = ids.iter().filter(|id| asked(id) > 1).collect();
    assert!(twice.is_empty(), "asked by both: {twice:?}");

    open_gate(SWEPT, "answer");
    let settled = |id: &String| {
        let operations = first.operations(id).unwrap();
        operations
            .iter()
            .all(|(_, op)| op.status.name() == "committed")
    };
    assert!(eventually(800, || ids.iter().all(settled)).await);
    let asks: Vec<u32> = ids.iter().map(asked).collect();
    assert_eq!(asks, [1; 6], "each asked once");
    for id in &ids {
        open_gate(id, "notify");
    }
    second.shutdown().await;
    first.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_timers_of_workflows_taken_over_fire_at_their_new_owner() {
    let Some((url, schema)) = database() else {
        return;
    };
    let first = worker(shared_options(&url, &schema)).await;
    let successor = worker(shared_options(&url, &schema)).await;
    // One timer due before the successor's first look at the timers, one well after it (past
    // the horizon that look covers).
    let (soon, later) = (500, 4_000);
    for (id, millis) in [("timer-soon", soon), ("timer-later", later)] {
        first
            .start_with(sleeps_for, millis, with_id(id))
            .await
            .unwrap();
    }
    let started = std::time::Instant::now();
    first.shutdown().await;

    for (id, millis) in [("timer-soon", soon), ("timer-later", later)] {
        let completed = || {
            successor.workflow_status(id).unwrap()
                == Some(waymark::inspect::WorkflowStatus::Completed)
        };
        assert!(eventually(3_000, completed).await, "{id} completes");
        assert!(
            started.elapsed() >= Duration::from_millis(millis),
            "{id} did not fire early"
        );
    }
    assert_eq!(successor.pending_timers("timer-later").unwrap(), vec![]);
    // Counted after the heartbeat that claimed them, with no scrape of `/metrics` (a run the
    // successor parks and takes back when its timer is due counts again).
    let figures = successor.telemetry().snapshot();
    assert!(figures.value("waymark_leases_claimed_total", &[]) >= 2.0);
    successor.shutdown().await;
}

/// A TCP proxy in front of the database that, once armed, cuts the connection of the next
/// request that carries a pattern: after letting the request through and swallowing its answer
/// (a `COMMIT` commits, and its client cannot tell whether it did), or before the request goes
/// on (nothing of it happens).
struct LosingProxy {
    url: String,
    armed: Arc<std::sync::Mutex<Armed>>,
}

/// The cuts a proxy is armed with.
#[derive(Default)]
struct Armed {
    /// Each waits for the first request that carries its pattern.
    cuts: Vec<Cut>,
    /// Executions whose answers are to be lost, their statements' preparations seen.
    executions: usize,
}

/// What the proxy does to the next request that carries `pattern`.
#[derive(Clone, Copy)]
struct Cut {
    pattern: &'static [u8],
    how: CutKind,
}

#[derive(Clone, Copy, PartialEq)]
enum CutKind {
    /// Lets the request through and loses its answer with the connection.
    TheAnswer,
    /// Lets the request through (a statement's preparation, which carries its text) and the
    /// next (the statement's execution), and loses the answer to the latter: the statement
    /// ran, and its client cannot tell whether it did.
    TheExecutionsAnswer,
    /// Loses the request with the connection.
    TheRequest,
    /// Holds the request this long, then lets it through.
    Delay(Duration),
    /// Lets the request through and holds its answer this long.
    DelayTheAnswer(Duration),
}

impl LosingProxy {
    async fn start(url: &str) -> Self {
        let (credentials, rest) = url.split_once('@').expect("a URL with credentials");
        let (server, database) = rest.split_once('/').expect("a URL with a database");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_url = format!(
            "{credentials}@{}/{database}",
            listener.local_addr().unwrap()
        );
        let armed = Arc::new(std::sync::Mutex::new(Armed::default()));
        let (server, arming) = (server.to_owned(), armed.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = tokio::net::TcpStream::connect(&server).await.unwrap();
                tokio::spawn(forward(client, upstream, arming.clone()));
            }
        });
        Self {
            url: proxy_url,
            armed,
        }
    }

    /// Loses the answer to the next `COMMIT`.
    fn arm(&self) {
        self.arm_on(b"COMMIT");
    }

    /// Loses the answer to the next request that carries `pattern`.
    fn arm_on(&self, pattern: &'static [u8]) {
        let how = CutKind::TheAnswer;
        self.armed.lock().unwrap().cuts.push(Cut { pattern, how });
    }

    /// Loses the answer to the execution of the next statement whose text carries `pattern`.
    fn lose_execution_answer(&self, pattern: &'static [u8]) {
        let how = CutKind::TheExecutionsAnswer;
        self.armed.lock().unwrap().cuts.push(Cut { pattern, how });
    }

    /// Loses the next request that carries `pattern`.
    fn drop_next(&self, pattern: &'static [u8]) {
        let how = CutKind::TheRequest;
        self.armed.lock().unwrap().cuts.push(Cut { pattern, how });
    }

    /// Holds the next request that carries `pattern` for `delay`.
    fn delay_next(&self, pattern: &'static [u8], delay: Duration) {
        let how = CutKind::Delay(delay);
        self.armed.lock().unwrap().cuts.push(Cut { pattern, how });
    }

    /// Lets the next request that carries `pattern` through and holds its answer for `delay`.
    fn delay_answer_next(&self, pattern: &'static [u8], delay: Duration) {
        let how = CutKind::DelayTheAnswer(delay);
        self.armed.lock().unwrap().cuts.push(Cut { pattern, how });
    }

    /// Whether every armed cut happened.
    fn has_cut(&self) -> bool {
        let armed = self.armed.lock().unwrap();
        armed.cuts.is_empty() && armed.executions == 0
    }
}

async fn forward(
    client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    armed: Arc<std::sync::Mutex<Armed>>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answer_delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = upstream.into_split();
    let (cutting, delaying) = (cut.clone(), answer_delay_ms.clone());
    let requests = tokio::spawn(async move {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut cut_the_next = false;
        while let Ok(read) = from_client.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            let chunk = &buffer[..read];
            // The statement's execution begins with its Bind message; anything else leaves the
            // cut undone, and `has_cut` false.
            if std::mem::take(&mut cut_the_next) && chunk.first() == Some(&b'B') {
                armed.lock().unwrap().executions -= 1;
                cutting.store(true, SeqCst);
            }
            match armed_cut(&armed, chunk).map(|cut| cut.how) {
                Some(CutKind::TheRequest) => break,
                // Whatever the server answers from now on is lost.
                Some(CutKind::TheAnswer) => cutting.store(true, SeqCst),
                Some(CutKind::TheExecutionsAnswer) => cut_the_next = true,
                Some(CutKind::Delay(delay)) => tokio::time::sleep(delay).await,
                Some(CutKind::DelayTheAnswer(delay)) => {
                    delaying.store(delay.as_millis() as u64, SeqCst);
                }
                None => {}
            }
            if to_server.write_all(chunk).await.is_err() {
                break;
            }
        }
    });
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read) = from_server.read(&mut buffer).await {
        if read == 0 || cut.load(SeqCst) {
            break;
        }
        let delay = answer_delay_ms.swap(0, SeqCst);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        if to_client.write_all(&buffer[..read]).await.is_err() {
            break;
        }
    }
    requests.abort();
}

/// The first armed cut whose pattern `chunk` carries; a match disarms it.
fn armed_cut(armed: &std::sync::Mutex<Armed>, chunk: &[u8]) -> Option<Cut> {
    let mut armed = armed.lock().unwrap();
    let carries = |cut: &Cut| chunk.windows(cut.pattern.len()).any(|w| w == cut.pattern);
    let found = armed.cuts.iter().position(carries)?;
    let cut = armed.cuts.remove(found);
    if cut.how == CutKind::TheExecutionsAnswer {
        armed.executions += 1;
    }
    Some(cut)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_whose_commit_answer_was_lost_still_runs() {
    const ID: &str = "lost-commit-answer";
    let Some((url, schema)) = database() else {
        return;
    };
    let proxy = LosingProxy::start(&url).await;
    let worker = worker(shared_options(&proxy.url, &schema)).await;
    open_gate(ID, "held");
    proxy.arm();
    let refused = worker.start_with(one_step, 1, with_id(ID)).await;
    assert!(refused.is_err(), "the start cannot know it committed");

    // It did commit, under this worker's lease: the workflow must run, here or elsewhere.
    let completed =
        || worker.workflow_status(ID).unwrap() == Some(waymark::inspect::WorkflowStatus::Completed);
    assert!(
        eventually(3_000, completed).await,
        "the started workflow runs"
    );
    assert_eq!(executions(ID, "held"), 1);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_start_reusing_the_id_of_a_run_here_whose_answer_was_lost_leaves_that_run_alone() {
    const ID: &str = "lost-reused-start";
    let Some((url, schema)) = database() else {
        return;
    };
    let proxy = LosingProxy::start(&url).await;
    let worker = worker(shared_options(&proxy.url, &schema)).await;
    close_gate(ID, "held");
    let run = worker.start_with(one_step, 1, with_id(ID)).await.unwrap();
    assert!(eventually(400, || executions(ID, "held") == 1).await);
    // The step is journaled as scheduled once its first poll waits: only then is the run at
    // rest, with no write of its own that the proxy could lose.
    let is_schedule = |entry: &Entry| matches!(entry, Entry::ActivityScheduledAt { .. });
    let scheduled = || worker.journal(ID).is_ok_and(|j| j.iter().any(is_schedule));
    assert!(eventually(400, scheduled).await);

    // The second start's first request names the workflow; its answer is lost.
    proxy.arm_on(ID.as_bytes());
    let refused = worker.start_with(one_step, 1, with_id(ID)).await;
    assert!(refused.is_err(), "the id is in use");

    // The run already here keeps its lease: its step completes once, under it.
    open_gate(ID, "held");
    let finished = tokio::time::timeout(Duration::from_secs(30), run.result()).await;
    assert_eq!(finished.expect("the run completes").unwrap(), 2);
    assert_eq!(
        executions(ID, "held"),
        1,
        "the running step was not taken over"
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_decision_outlives_a_lost_read_of_its_sender_and_a_lost_answer_of_its_owner() {
    const ID: &str = "relay-lossy";
    let Some((url, schema)) = database() else {
        return;
    };
    let (owner_side, sender_side) = (
        LosingProxy::start(&url).await,
        LosingProxy::start(&url).await,
    );
    let owner = worker(shared_options(&owner_side.url, &schema)).await;
    let other = worker(shared_options(&sender_side.url, &schema)).await;
    let asking = owner
        .start_with(asks_first, "ORD-3".into(), with_id(ID))
        .await
        .unwrap();
    let hash = pending_hash(&owner, ID, 400).await;

    // The sender's first look at its command, and the owner's first answer, are lost.
    sender_side.drop_next(b"c.answer, c.taken_by");
    owner_side.drop_next(b"SET answer");
    let verdict = ApprovalVerdict::Approve;
    let decided = other.decide_approval(ID, &hash, "dana@ops", verdict).await;
    assert!(sender_side.has_cut() && owner_side.has_cut());
    decided.expect("the decision is answered all the same");
    assert_eq!(asking.result().await.unwrap(), "approved");
    other.shutdown().await;
    owner.shutdown().await;
}

/// The hash of the approval `id` asks for on `worker`, once it asks (within `tries` polls).
async fn pending_hash(worker: &Worker, id: &str, tries: u32) -> String {
    let pending = || !worker.pending_approvals(id).unwrap().is_empty();
    assert!(
        eventually(tries, pending).await,
        "{id} asks for an approval"
    );
    worker.pending_approvals(id).unwrap()[0]
        .artifact_hash
        .clone()
}

/// A session of the test's own on the database at `url`.
async fn session(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// How many workflows in `schema` are parked: nobody holds them until their timer is due.
async fn parked_count(url: &str, schema: &str) -> i64 {
    let client = session(url).await;
    let sql = format!(
        "SELECT count(*) FROM {schema}.waymark_leases \
         WHERE owner IS NULL AND parked_until_ms > 0"
    );
    client.query_one(&sql, &[]).await.unwrap().get(0)
}

/// Waits up to `patience` until `count` workflows in `schema` are parked.
async fn until_parked(url: &str, schema: &str, count: i64, patience: Duration) {
    let deadline = std::time::Instant::now() + patience;
    while parked_count(url, schema).await < count {
        assert!(std::time::Instant::now() < deadline, "{count} parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parked_workflow_runs_on_whichever_worker_is_free_when_its_timer_is_due() {
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(100);
    let first = worker_evicting_after(shared_options(&url, &schema), evict_soon).await;
    let started = std::time::Instant::now();
    first
        .start_with(sleeps_for, 2_500, with_id("parked-timer"))
        .await
        .unwrap();
    first
        .start_with(sleeps_long, (), with_id("parked-cancel"))
        .await
        .unwrap();
    // Both leave memory and let go of their leases, parked until their timers.
    until_parked(&url, &schema, 2, Duration::from_secs(5)).await;
    // The worker that parked them goes; a graceful stop leaves parked leases parked.
    first.shutdown().await;
    let successor = worker(shared_options(&url, &schema)).await;

    // Its claims pass a parked workflow by until its timer is due.
    tokio::time::sleep(Duration::from_millis(1_500).saturating_sub(started.elapsed())).await;
    assert_eq!(parked_count(&url, &schema).await, 2);
    assert_eq!(successor.resident_workflows(), 0);

    // A command for a parked workflow takes it at once, wherever it arrives.
    successor
        .cancel("parked-cancel", "no longer needed")
        .await
        .unwrap();
    let completed = || {
        successor.workflow_status("parked-timer").unwrap()
            == Some(waymark::inspect::WorkflowStatus::Completed)
    };
    assert!(eventually(3_000, completed).await, "the parked timer fires");
    assert!(started.elapsed() >= Duration::from_millis(2_500));
    assert_eq!(parked_count(&url, &schema).await, 0);
    successor.shutdown().await;
}

/// Waits for `go` (or an hour), then takes one gated step.
#[workflow]
async fn go_then_step(ctx: WorkflowContext, _input: ()) -> Result<u64, WorkflowError> {
    let go = {
        let mut go = ctx.signal::<u64>("go");
        let mut later = ctx.sleep(Duration::from_secs(3600));
        waymark::select! {
            go = go => Some(go?),
            () = later => None,
        }
    };
    match go {
        Some(i) => Ok(ctx.activity(held_step, i).await?),
        None => Ok(0),
    }
}

/// How many runs `worker` has started an executor for: rebuilds by replay, and new runs.
fn loads(worker: &Worker) -> f64 {
    let figures = worker.telemetry().snapshot();
    figures.value("waymark_workflow_loads_total", &[])
}

/// A run held out of memory is not rebuilt for a signal none of its waits listens for,
/// whether the signal is sent to its holder or to another worker, which wakes the holder: the
/// signals wait in the inbox, and the run reads them once a wait listens for their name.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_no_wait_listens_for_leaves_a_held_run_out_of_memory() {
    const ID: &str = "unlistened-on-a-shared-store";
    let Some((url, schema)) = database() else {
        return;
    };
    let holder = worker(shared_options(&url, &schema)).await;
    let other = worker(shared_options(&url, &schema)).await;
    holder
        .start_with(go_then_notes, 4, with_id(ID))
        .await
        .unwrap();
    let waiting = || holder.resident_workflows() == 0;
    assert!(
        eventually(3_000, waiting).await,
        "the run waits out of memory"
    );
    let before = loads(&holder);

    for (sender, name) in [(&holder, "here"), (&other, "there")] {
        for i in 0..2 {
            let id = format!("{name}-{i}");
            sender.signal(ID, "note", &id, &id).await.unwrap();
        }
    }
    // The other worker's wake-ups reach the holder within milliseconds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(loads(&holder), before, "no note rebuilt the run");
    assert_eq!(holder.resident_workflows(), 0);

    other.signal(ID, "go", "go-1", &"go").await.unwrap();
    let run = holder.handle(go_then_notes, ID);
    let outcome = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    let expected = ["go", "here-0", "here-1", "there-0", "there-1"];
    assert_eq!(outcome.unwrap().unwrap(), expected);
    assert_eq!(loads(&holder), before + 1.0, "one rebuild, for `go`");
    holder.shutdown().await;
    other.shutdown().await;
}

/// Waits for `go`, then for a `note` while a held step runs beside the wait.
#[workflow]
async fn go_then_note_beside_a_step(
    ctx: WorkflowContext,
    _input: (),
) -> Result<String, WorkflowError> {
    let go: String = ctx.signal("go").await?;
    let note = ctx.signal::<String>("note");
    let (note, step) = waymark::join!(note, ctx.activity(held_step, 1));
    Ok(format!("{go} {} {}", note?, step?))
}

/// A held run rebuilt by a signal is no longer taken for out of memory: a signal that comes
/// while it runs reaches it, whatever names it listened for when it left.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_rebuilt_by_a_signal_hears_the_signals_sent_while_it_runs() {
    const ID: &str = "rebuilt-then-signalled";
    let Some((url, schema)) = database() else {
        return;
    };
    close_gate(ID, "held");
    let holder = worker(shared_options(&url, &schema)).await;
    holder
        .start_with(go_then_note_beside_a_step, (), with_id(ID))
        .await
        .unwrap();
    let waiting = || holder.resident_workflows() == 0;
    assert!(
        eventually(3_000, waiting).await,
        "the run waits out of memory"
    );

    holder.signal(ID, "go", "go-1", &"go").await.unwrap();
    // Rebuilt: its step is held, and its wait for `note` has read the inbox already.
    assert!(eventually(3_000, || executions(ID, "held") == 1).await);
    holder.signal(ID, "note", "note-1", &"note").await.unwrap();
    open_gate(ID, "held");
    let run = holder.handle(go_then_note_beside_a_step, ID);
    let outcome = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
    assert_eq!(
        outcome.expect("the note reached the run").unwrap(),
        "go note 2"
    );
    holder.shutdown().await;
}

/// A parked workflow, its lease let go until its timer, is not taken for a signal none of its
/// waits listens for, whichever worker the signal is sent to; one it listens for takes it at
/// once.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_no_wait_listens_for_leaves_a_parked_workflow_parked() {
    const ID: &str = "unlistened-while-parked";
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(100);
    let parker = worker_evicting_after(shared_options(&url, &schema), evict_soon).await;
    let other = worker(shared_options(&url, &schema)).await;
    parker
        .start_with(go_then_step, (), with_id(ID))
        .await
        .unwrap();
    until_parked(&url, &schema, 1, Duration::from_secs(5)).await;
    let before = (loads(&parker), loads(&other));

    for (sender, name) in [(&parker, "here"), (&other, "there")] {
        for i in 0..2 {
            let id = format!("{name}-{i}");
            sender.signal(ID, "note", &id, &id).await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(parked_count(&url, &schema).await, 1, "still parked");
    assert_eq!(
        (loads(&parker), loads(&other)),
        before,
        "no note took the run"
    );

    other.signal(ID, "go", "go-1", &1_u64).await.unwrap();
    let completed =
        || other.workflow_status(ID).unwrap() == Some(waymark::inspect::WorkflowStatus::Completed);
    assert!(eventually(6_000, completed).await, "`go` takes it at once");
    assert_eq!(loads(&other), before.1 + 1.0, "one rebuild, for `go`");
    parker.shutdown().await;
    other.shutdown().await;
}

/// A worker that starts `go_then_step` as `id` and, as the run leaves memory to wait, parks
/// its lease `slowly`: the statement that lets it go is held back that long by the proxy.
async fn parking_slowly(
    id: &str,
    url: &str,
    schema: &str,
    slowly: Duration,
) -> (Worker, LosingProxy) {
    let evict_soon = Duration::from_millis(200);
    let (worker, proxy) = behind_a_proxy_evicting_after(url, schema, evict_soon).await;
    proxy.delay_next(b"parked_until_ms = $4", slowly);
    worker
        .start_with(go_then_step, (), with_id(id))
        .await
        .unwrap();
    assert!(eventually(3_000, || proxy.has_cut()).await, "the run parks");
    (worker, proxy)
}

/// The run `id` completes long before its hour-long timer, and is parked no more.
async fn completes_before_its_timer(worker: Worker, id: &str, url: &str, schema: &str) {
    let completed =
        || worker.workflow_status(id).unwrap() == Some(waymark::inspect::WorkflowStatus::Completed);
    assert!(
        eventually(6_000, completed).await,
        "the run goes on at once, not when its timer is due"
    );
    assert_eq!(parked_count(url, schema).await, 0);
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_that_comes_while_its_workflow_parks_takes_it_back() {
    const ID: &str = "signalled-while-parking";
    let Some((url, schema)) = database() else {
        return;
    };
    close_gate(ID, "held");
    // The lease is let go a second and a half after the run left memory.
    let (worker, _proxy) = parking_slowly(ID, &url, &schema, Duration::from_millis(1_500)).await;

    // The signal comes meanwhile; the step it leads to outlasts the parking.
    worker.signal(ID, "go", "go-1", &1_u64).await.unwrap();
    let parked = || async { parked_count(&url, &schema).await == 1 };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !parked().await && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    open_gate(ID, "held");

    completes_before_its_timer(worker, ID, &url, &schema).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_no_wait_listens_for_that_comes_while_its_workflow_parks_leaves_it_parked() {
    const ID: &str = "unlistened-while-parking";
    let Some((url, schema)) = database() else {
        return;
    };
    let (worker, _proxy) = parking_slowly(ID, &url, &schema, Duration::from_millis(1_000)).await;
    let before = loads(&worker);

    // Held back until the lease is let go, then passed on as to any parked workflow.
    worker.signal(ID, "note", "note-1", &"note").await.unwrap();
    until_parked(&url, &schema, 1, Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(parked_count(&url, &schema).await, 1, "still parked");
    assert_eq!(loads(&worker), before, "the note did not take the run back");

    worker.signal(ID, "go", "go-1", &1_u64).await.unwrap();
    completes_before_its_timer(worker, ID, &url, &schema).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_whose_wake_up_was_missed_takes_its_workflow_back_as_it_parks() {
    const ID: &str = "signal-unheard";
    let Some((url, schema)) = database() else {
        return;
    };
    let sender = bare_store(&url, &schema).await;
    let (worker, _proxy) = parking_slowly(ID, &url, &schema, Duration::from_millis(1_000)).await;

    // A signal kept as the lease is let go, whose owner is not woken for it: its sender found
    // the lease held, and its notification comes after the owner stopped listening for the
    // workflow.
    sender.send_signal(ID, go_message()).await.unwrap();

    completes_before_its_timer(worker, ID, &url, &schema).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_decision_whose_sending_went_unanswered_is_of_unknown_outcome_and_applies() {
    const ID: &str = "relay-send-lost";
    let Some((url, schema)) = database() else {
        return;
    };
    let proxy = LosingProxy::start(&url).await;
    let owner = worker(shared_options(&url, &schema)).await;
    let other = worker(shared_options(&proxy.url, &schema)).await;
    let asking = owner
        .start_with(asks_first, "ORD-9".into(), with_id(ID))
        .await
        .unwrap();
    let hash = pending_hash(&owner, ID, 2_000).await;

    // The command is written, and the answer to writing it is lost (the pattern is in the
    // statement's parameters, which go with its execution).
    proxy.arm_on(b"dana@ops");
    let lost = other
        .decide_approval(ID, &hash, "dana@ops", ApprovalVerdict::Approve)
        .await
        .unwrap_err();
    assert!(proxy.has_cut());
    assert!(
        matches!(
            lost,
            ApprovalError::Unreachable(waymark::Unreachable::OutcomeUnknown { .. })
        ),
        "not told that nothing applied: {lost}"
    );
    // Counted as relayed only once its owner's answer is heard.
    let relayed = other.telemetry().snapshot();
    assert_eq!(relayed.value("waymark_commands_relayed_total", &[]), 0.0);
    let applied = tokio::time::timeout(Duration::from_secs(10), asking.result()).await;
    assert_eq!(applied.expect("the decision applies").unwrap(), "approved");
    other.shutdown().await;
    owner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancellation_that_finds_its_run_parked_under_it_takes_it_back_and_applies() {
    const ID: &str = "cancel-while-parking";
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(200);
    let (worker, proxy) = behind_a_proxy_evicting_after(&url, &schema, evict_soon).await;
    // The park's answer is held back: the cancellation comes while the run is letting go of
    // its lease (a write of its own would be fenced), and must reach whichever run holds it.
    proxy.delay_answer_next(b"parked_until_ms = $4", Duration::from_millis(1_500));
    let sleeping = worker
        .start_with(sleeps_long, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(3_000, || proxy.has_cut()).await, "the run parks");
    until_parked(&url, &schema, 1, Duration::from_secs(3)).await;

    worker.cancel(ID, "not needed").await.unwrap();
    let cancelled = sleeping.result().await.unwrap_err();
    assert!(cancelled.to_string().contains("not needed"), "{cancelled}");
    worker.shutdown().await;
}

/// A store on the test database with no worker: what it writes wakes nobody.
async fn bare_store(url: &str, schema: &str) -> PgStore {
    let options = shared_options(url, schema);
    let connect = move || PgStore::connect(&options, None);
    tokio::task::spawn_blocking(connect).await.unwrap().unwrap()
}

/// The signal `go` (1) as a sender keeps it in a workflow's inbox.
fn go_message() -> waymark::store::InboxMessage {
    waymark::store::InboxMessage {
        name: "go".into(),
        signal_id: "go-1".into(),
        payload: waymark::inspect::Payload::encode(&1_u64).unwrap(),
        sent_at_ms: 0,
        sender: None,
    }
}

/// The epoch of `id`'s lease.
async fn lease_epoch(url: &str, schema: &str, id: &str) -> i64 {
    let client = session(url).await;
    let sql = format!("SELECT epoch FROM {schema}.waymark_leases WHERE workflow_id = $1");
    client.query_one(&sql, &[&id]).await.unwrap().get(0)
}

/// Runs `sql` on the test database, in `schema`, with a session of its own.
async fn run_sql(url: &str, schema: &str, sql: &str) {
    let client = session(url).await;
    let in_schema = format!("SET search_path TO {schema}; {sql}");
    client.batch_execute(&in_schema).await.unwrap();
}

/// Whether `worker` counts one lease adopted (found naming it after a lost answer), soon.
async fn adopts_once(worker: &Worker) -> bool {
    let figures = || worker.telemetry().snapshot();
    let adopted = || figures().value("waymark_leases_adopted_total", &[]);
    eventually(400, || adopted() == 1.0).await
}

/// Whether `worker` completed the run `id` within `tries` polls ([`eventually`]).
async fn completes_on(worker: &Worker, id: &str, tries: u32) -> bool {
    let completed =
        || worker.workflow_status(id).unwrap() == Some(waymark::inspect::WorkflowStatus::Completed);
    eventually(tries, completed).await
}

/// A take that committed and lost its answer with its connection is read back: the worker
/// that took the lease runs the workflow. Unread, the lease would name a live worker that
/// does not know it holds it, and the workflow would wait for nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_take_whose_answer_was_lost_is_read_back_and_its_workflow_runs() {
    take_losing_its_answer("take-answer-lost", false).await;
}

/// A take that committed and lost its answer, and whose read-back was lost too, is found by
/// the worker's next claim, which runs the workflow.
#[tokio::test(flavor = "multi_thread")]
async fn a_take_whose_answer_and_read_back_were_lost_is_found_by_the_next_claim() {
    take_losing_its_answer("take-read-back-lost", true).await;
}

/// A signal sent to a worker that does not hold `id`, parked and listening for it, whose take
/// loses its answer (and its read-back, if `read_back_lost`); the workflow must complete there.
/// Read back, the lease is held at the epoch the take wrote (2); found by a claim, it is taken
/// again under the next.
async fn take_losing_its_answer(id: &'static str, read_back_lost: bool) {
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(100);
    let parker = worker_evicting_after(shared_options(&url, &schema), evict_soon).await;
    let proxy = LosingProxy::start(&url).await;
    let taker = worker(shared_options(&proxy.url, &schema)).await;
    close_gate(id, "held");
    parker
        .start_with(go_then_step, (), with_id(id))
        .await
        .unwrap();
    until_parked(&url, &schema, 1, Duration::from_secs(5)).await;

    // `go` is a name the parked run listens for: the taker takes the lease.
    proxy.lose_execution_answer(b"AS taken_at");
    if read_back_lost {
        proxy.drop_next(b"/* read-back */");
    }
    taker.signal(id, "go", "go-1", &1_u64).await.unwrap();
    assert!(eventually(3_000, || proxy.has_cut()).await, "the take");
    assert!(eventually(2_000, || executions(id, "held") == 1).await);
    let epoch = if read_back_lost { 3 } else { 2 };
    assert_eq!(lease_epoch(&url, &schema, id).await, epoch);
    open_gate(id, "held");
    assert!(completes_on(&taker, id, 6_000).await, "the taker runs it");
    assert_eq!(executions(id, "held"), 1);
    // Read back, the take counts as one whose answer was lost; so does the claim's adoption.
    assert!(adopts_once(&taker).await, "adopted once");
    parker.shutdown().await;
    taker.shutdown().await;
}

/// A claim that committed and lost its answer is read back at the worker's next claim,
/// which runs the workflows it took.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_answer_was_lost_is_read_back_at_the_next_claim() {
    const ID: &str = "claim-answer-lost";
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(100);
    let parker = worker_evicting_after(shared_options(&url, &schema), evict_soon).await;
    open_gate(ID, "held");
    parker
        .start_with(go_then_step, (), with_id(ID))
        .await
        .unwrap();
    until_parked(&url, &schema, 1, Duration::from_secs(5)).await;
    // `go` waits in the inbox, and wakes nobody: whoever runs the workflow next reads it.
    let sender = bare_store(&url, &schema).await;
    sender.send_signal(ID, go_message()).await.unwrap();
    parker.shutdown().await;

    // The lease then names a worker that is gone: the first claim of a new worker takes it,
    // the one its start makes.
    let lapsed = format!(
        "UPDATE waymark_leases SET owner = 'gone', parked_until_ms = 0 WHERE workflow_id = '{ID}'"
    );
    run_sql(&url, &schema, &lapsed).await;
    let proxy = LosingProxy::start(&url).await;
    proxy.lose_execution_answer(b"WITH let_go AS");
    let claimer = worker(shared_options(&proxy.url, &schema)).await;
    assert!(proxy.has_cut(), "the claim");
    assert!(
        completes_on(&claimer, ID, 8_000).await,
        "the claimer runs it"
    );
    assert_eq!(executions(ID, "held"), 1);
    // Adopted by a later claim's look, not claimed again by it: the cut claim committed.
    assert!(adopts_once(&claimer).await, "adopted once");
    claimer.shutdown().await;
}

/// A park that committed and lost its answer is read back: the lease is let go, so a signal
/// sent to the worker that parked it takes the workflow at once. Unread, that worker would
/// think it held the lease still, and its run's writes would be refused until the timer.
#[tokio::test(flavor = "multi_thread")]
async fn a_park_whose_answer_was_lost_is_read_back_and_a_signal_takes_its_workflow() {
    const ID: &str = "park-answer-lost";
    let Some((url, schema)) = database() else {
        return;
    };
    let evict_soon = Duration::from_millis(100);
    let (parker, proxy) = behind_a_proxy_evicting_after(&url, &schema, evict_soon).await;
    open_gate(ID, "held");
    proxy.lose_execution_answer(b"parked_until_ms = $4");
    parker
        .start_with(go_then_step, (), with_id(ID))
        .await
        .unwrap();
    assert!(eventually(3_000, || proxy.has_cut()).await, "the park");
    until_parked(&url, &schema, 1, Duration::from_secs(3)).await;

    parker.signal(ID, "go", "go-1", &1_u64).await.unwrap();
    assert!(
        completes_on(&parker, ID, 6_000).await,
        "the signal takes it"
    );
    assert_eq!(executions(ID, "held"), 1);
    parker.shutdown().await;
}
