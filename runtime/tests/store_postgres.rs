//! What only a store shared by many workers can break: ownership by lease, fencing of a worker
//! that lost its lease, claims and starts raced by two workers, migrations run by workers
//! starting at once. Each test has a schema of its own in `WAYMARK_TEST_DATABASE_URL`.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{record, start, started};
use waymark_runtime::inbox::InboxMessage;
use waymark_runtime::journal::{Entry, Payload};
use waymark_runtime::store::{
    Leases, PgOptions, PgStore, Relayed, SignalTake, Store, StoreError, Transition,
};

/// The workflows' clock, for claims and parked timers.
const NOW_MS: u64 = 1_000_000;

fn options(schema: &str, lease: Duration) -> Option<PgOptions> {
    let mut options = PgOptions::new(common::database_url()?);
    options.schema = Some(schema.to_owned());
    options.lease = lease;
    Some(options)
}

fn connect(options: &PgOptions) -> (PgStore, Arc<dyn Leases>) {
    let store = PgStore::connect(options, None).unwrap();
    let leases = store.leases().expect("a shared store has leases");
    (store, leases)
}

/// A session of the test's own on the test database.
async fn session() -> tokio_postgres::Client {
    let url = common::database_url().unwrap();
    let (session, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    session
}

/// A session of its own, inside a transaction that holds `workflow_id`'s lease row locked
/// `FOR {strength}`, until it ends.
async fn lease_row_locked(
    schema: &str,
    workflow_id: &str,
    strength: &str,
) -> tokio_postgres::Client {
    let session = session().await;
    let sql = format!(
        "SET search_path TO {schema}; BEGIN; \
         SELECT 1 FROM waymark_leases WHERE workflow_id = '{workflow_id}' FOR {strength}"
    );
    session.batch_execute(&sql).await.unwrap();
    session
}

/// Moves every lease of `schema` to `worker` under a new epoch, as a take elsewhere (or one
/// whose answer was lost) leaves it, behind the workers' backs; how many it moved.
async fn move_leases(schema: &str, worker: &str) -> u64 {
    let sql = format!("UPDATE {schema}.waymark_leases SET owner = $1, epoch = epoch + 1");
    session().await.execute(&sql, &[&worker]).await.unwrap()
}

/// The entry appended after the start, as `worker` wrote it.
fn mark(worker: &str) -> Entry {
    Entry::SignalReceived {
        seq: 0,
        signal_id: worker.to_owned(),
        payload: Payload::unit(),
    }
}

fn second(id: &str, worker: &str) -> Transition {
    let mut after_start = record();
    after_start.journal_len = 1;
    Transition::append(id, &after_start, vec![mark(worker)])
}

fn is_fenced(result: &Result<(), StoreError>) -> bool {
    matches!(result, Err(StoreError::Fenced { .. }))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_without_the_lease_writes_nothing_and_a_lapsed_one_is_fenced_out() {
    let schema = common::fresh_schema();
    let Some(short) = options(&schema, Duration::from_millis(1500)) else {
        return;
    };
    let (a, a_leases) = connect(&short);
    a.commit(start("wf")).await.unwrap();
    assert!(a_leases.holds("wf"), "the starter owns what it started");

    let (b, b_leases) = connect(&options(&schema, Duration::from_secs(30)).unwrap());
    assert!(
        b_leases.claim(16, NOW_MS).unwrap().is_empty(),
        "a live owner's lease is not free"
    );
    assert!(
        is_fenced(&b.commit(second("wf", "b")).await),
        "b holds no lease"
    );
    assert_eq!(
        b.journal("wf").unwrap().len(),
        1,
        "the refused write left nothing"
    );

    // `a` stops heartbeating (a pause longer than its lease): `b` takes over under a new epoch.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(b_leases.claim(16, NOW_MS).unwrap(), vec!["wf".to_owned()]);
    assert_eq!(
        b_leases.owner("wf").unwrap().as_deref(),
        Some(b_leases.worker_id())
    );
    b.commit(second("wf", "b")).await.unwrap();

    // `a` wakes up and writes as if nothing happened: refused by the epoch, not by luck.
    let mut stale = second("wf", "a");
    stale.expected_journal_len = 2;
    stale.record.journal_len = 3;
    assert!(
        is_fenced(&a.commit(stale).await),
        "the old owner's write is fenced"
    );
    assert!(matches!(
        a_leases.heartbeat(),
        Err(StoreError::Fenced { .. })
    ));
    let journal = b.journal("wf").unwrap();
    assert_eq!(
        journal,
        vec![started(), mark("b")],
        "exactly the new owner's entry"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_heartbeat_keeps_the_leases_and_an_end_lets_go_of_one() {
    let schema = common::fresh_schema();
    let Some(short) = options(&schema, Duration::from_millis(1500)) else {
        return;
    };
    let (_b, b_leases) = connect(&options(&schema, Duration::from_secs(30)).unwrap());
    let (a, a_leases) = connect(&short);
    a.commit(start("kept")).await.unwrap();
    // Four heartbeats at a third of the lease: together twice as long as the lease.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        a_leases.heartbeat().unwrap();
        assert!(
            b_leases.claim(16, NOW_MS).unwrap().is_empty(),
            "a renewed lease stays"
        );
    }
    let mut end = second("kept", "a");
    end.record.status = waymark_runtime::store::WorkflowStatus::Completed;
    a.commit(end).await.unwrap();
    assert!(!a_leases.holds("kept"));
    assert_eq!(
        b_leases.owner("kept").unwrap(),
        None,
        "an ended workflow has no lease"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_claiming_at_once_take_each_workflow_once() {
    let schema = common::fresh_schema();
    let Some(short) = options(&schema, Duration::from_millis(400)) else {
        return;
    };
    let (gone, _) = connect(&short);
    for i in 0..200 {
        gone.commit(start(&format!("wf-{i}"))).await.unwrap();
    }
    // A crash: the store is never closed, so its leases lapse instead of being let go.
    std::mem::forget(gone);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let long = options(&schema, Duration::from_secs(30)).unwrap();
    let (x, y) = (connect(&long), connect(&long));
    let claim = |leases: Arc<dyn Leases>| {
        std::thread::spawn(move || {
            let mut mine = Vec::new();
            while let Ok(page) = leases.claim(16, NOW_MS) {
                if page.is_empty() {
                    break;
                }
                mine.extend(page);
            }
            mine
        })
    };
    let (from_x, from_y) = (claim(x.1.clone()), claim(y.1.clone()));
    let (from_x, from_y) = (from_x.join().unwrap(), from_y.join().unwrap());
    let mut all: Vec<String> = from_x.iter().chain(&from_y).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(
        from_x.len() + from_y.len(),
        200,
        "no workflow claimed twice"
    );
    assert_eq!(all.len(), 200, "every workflow claimed");
    eprintln!("claimed {} and {}", from_x.len(), from_y.len());
}

#[tokio::test(flavor = "multi_thread")]
async fn two_workers_starting_with_one_request_id_start_one_workflow() {
    let schema = common::fresh_schema();
    let Some(long) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (x, y) = (connect(&long).0, connect(&long).0);
    for round in 0..20 {
        let request = format!("order-{round}");
        let claiming = |id: String| {
            let mut t = start(&id);
            t.claim_request = Some(request.clone());
            t
        };
        let (a, b) = tokio::join!(
            x.commit(claiming(format!("x-{round}"))),
            y.commit(claiming(format!("y-{round}")))
        );
        assert!(
            a.is_ok() ^ b.is_ok(),
            "round {round}: exactly one start wins: {a:?} {b:?}"
        );
        let owner = x.request(&request).unwrap().unwrap();
        let winner = if a.is_ok() { "x" } else { "y" };
        assert_eq!(owner, format!("{winner}-{round}"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_from_any_worker_is_kept_once() {
    let schema = common::fresh_schema();
    let Some(long) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let ((owner, _), (other, _)) = (connect(&long), connect(&long));
    owner.commit(start("wf")).await.unwrap();
    let message = |id: &str| InboxMessage {
        name: "go".into(),
        signal_id: id.into(),
        payload: Payload::unit(),
        sent_at_ms: 0,
        sender: None,
    };
    let (a, b) = tokio::join!(
        owner.send_signal("wf", message("s-1")),
        other.send_signal("wf", message("s-1"))
    );
    assert!(
        a.is_ok() ^ b.is_ok(),
        "one of two senders with one id is told it was kept"
    );
    other.send_signal("wf", message("s-2")).await.unwrap();
    let inbox = owner.inbox("wf", 0).unwrap();
    let arrivals: Vec<u64> = inbox.iter().map(|(arrival, _)| *arrival).collect();
    assert_eq!(
        arrivals,
        vec![1, 2],
        "arrival numbers never repeat across workers"
    );
}

#[test]
fn workers_starting_at_once_migrate_once() {
    let schema = common::fresh_schema();
    let Some(long) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let options = long.clone();
            std::thread::spawn(move || PgStore::connect(&options, None).map(drop))
        })
        .collect();
    for started in starts {
        started.join().unwrap().unwrap();
    }
}

/// A connection lost inside a write fails that write alone: on PostgreSQL a transaction is
/// all or nothing and every check reads the database, so the store is not poisoned (as it is
/// on a failed fsync), the next write goes through on a new connection, and the lease the
/// worker holds is still its own.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_lost_inside_a_write_fails_that_write_alone() {
    let schema = common::fresh_schema();
    let Some(options) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (store, leases) = connect(&options);
    let store = Arc::new(store);
    store.commit(start("wf")).await.unwrap();

    // Another session holds the lease row, so the store's next write waits inside its
    // transaction (its fence share-locks that row); that session is then ended by the server.
    let blocker = lease_row_locked(&schema, "wf", "UPDATE").await;
    let writing = tokio::spawn({
        let store = store.clone();
        async move { store.commit(second("wf", "lost")).await }
    });
    let waiting = "SELECT pid FROM pg_stat_activity \
                   WHERE application_name = $1 AND wait_event_type = 'Lock'";
    let worker_id = leases.worker_id().to_owned();
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

    let failed = writing.await.unwrap();
    assert!(
        matches!(failed, Err(StoreError::Backend(_))),
        "the write on the lost connection fails: {failed:?}"
    );
    assert_eq!(store.journal("wf").unwrap().len(), 1, "it left nothing");
    assert!(leases.holds("wf"), "the lease is still this worker's");
    store
        .commit(second("wf", "after"))
        .await
        .expect("the next write goes through on a new connection");
    assert_eq!(store.journal("wf").unwrap().len(), 2);
}

/// A start refused because its request id is taken leaves no lease behind: the lease is taken
/// by the last check of the transition, once nothing can refuse it any more.
#[tokio::test(flavor = "multi_thread")]
async fn a_start_refused_for_a_taken_request_id_takes_no_lease() {
    let schema = common::fresh_schema();
    let Some(options) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (store, leases) = connect(&options);
    let claiming = |id: &str| {
        let mut t = start(id);
        t.claim_request = Some("order-1".into());
        t
    };
    store.commit(claiming("first")).await.unwrap();
    let refused = store.commit(claiming("second")).await;
    assert!(refused.is_err(), "the request id is taken: {refused:?}");
    assert_eq!(
        leases.owner("second").unwrap(),
        None,
        "no lease row was left"
    );
    assert!(!leases.holds("second"));
    assert_eq!(
        leases.owner("first").unwrap().as_deref(),
        Some(leases.worker_id())
    );
}

/// After the server ended every session of the store (a restart, say), a read goes through on
/// a new connection: a closed one waiting in the pool is not handed out.
#[tokio::test(flavor = "multi_thread")]
async fn a_read_after_the_server_ended_every_session_goes_through() {
    let schema = common::fresh_schema();
    let Some(options) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (store, leases) = connect(&options);
    store.commit(start("wf")).await.unwrap();
    assert_eq!(store.journal("wf").unwrap().len(), 1);

    let admin = session().await;
    let worker_id = leases.worker_id().to_owned();
    let ended = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1";
    let terminated = admin.query(ended, &[&worker_id]).await.unwrap();
    assert!(
        terminated.len() >= 2,
        "the writer's, the listener's and the reader's sessions"
    );
    // Long enough for the store's side to see its connections closed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.journal("wf").unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relayed_command_is_answered_withdrawn_or_given_up_with_its_lapsed_taker() {
    let schema = common::fresh_schema();
    let Some(owning) = options(&schema, Duration::from_secs(3)) else {
        return;
    };
    let (owner, owner_leases) = connect(&owning);
    let (_sender, sender_leases) = connect(&options(&schema, Duration::from_secs(30)).unwrap());
    owner.commit(start("wf")).await.unwrap();
    // The owner stays registered until the last case lets it lapse.
    let beating = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let (beat, leases) = (beating.clone(), owner_leases.clone());
    std::thread::spawn(move || {
        while beat.load(std::sync::atomic::Ordering::SeqCst) {
            leases.heartbeat().unwrap();
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    // A sender that never stops waiting fails the test rather than hang it.
    let relay = |patience: Duration| {
        let sending = sender_leases.relay("wf", b"decide".to_vec(), patience);
        let sending = tokio::time::timeout(Duration::from_secs(15), sending);
        let sent = tokio::spawn(sending);
        async move {
            sent.await
                .unwrap()
                .expect("the sender stops waiting")
                .unwrap()
        }
    };
    let taking = owner_leases.clone();
    let take = move || loop {
        let taken = taking.take_relayed(Some("wf")).unwrap();
        if let Some(command) = taken.into_iter().next() {
            return command;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let unknown = |outcome: Relayed, why: &str| match outcome {
        Relayed::OutcomeUnknown(reason) => assert!(reason.contains(why), "{reason}"),
        other => panic!("expected an unknown outcome ({why}), got {other:?}"),
    };

    let no_lease = sender_leases.relay("no-such", b"decide".to_vec(), Duration::from_secs(5));
    assert_eq!(
        no_lease.await.unwrap(),
        Relayed::NoLease,
        "a workflow without a lease is refused at once"
    );

    // Taken and answered: the sender hears the answer.
    let sending = relay(Duration::from_secs(10));
    let command = tokio::task::spawn_blocking(take.clone()).await.unwrap();
    assert_eq!(
        (command.workflow_id.as_str(), command.command.as_slice()),
        ("wf", &b"decide"[..])
    );
    owner_leases.answer_relayed(command.id, b"done").unwrap();
    assert_eq!(sending.await, Relayed::Answered(b"done".to_vec()));

    // Nobody takes it in time: withdrawn, so that no later take finds it.
    assert_eq!(relay(Duration::from_millis(300)).await, Relayed::NotTaken);
    assert_eq!(owner_leases.take_relayed(None).unwrap(), vec![]);

    // Taken by a live worker that never answers: the sender's wait is bounded all the same.
    let started = std::time::Instant::now();
    let sending = relay(Duration::from_millis(500));
    tokio::task::spawn_blocking(take.clone()).await.unwrap();
    unknown(sending.await, "did not answer");
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited for the answer too"
    );

    // Taken by a worker that then lapses (it stops heartbeating): the sender stops waiting.
    let sending = relay(Duration::from_secs(10));
    tokio::task::spawn_blocking(take.clone()).await.unwrap();
    beating.store(false, std::sync::atomic::Ordering::SeqCst);
    let taker = owner_leases.worker_id().to_owned();
    unknown(
        sending.await,
        &format!("worker `{taker}` took the command and lapsed"),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_are_taken_only_for_leases_the_worker_knows_it_holds() {
    let schema = common::fresh_schema();
    let Some(owning) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (owner, owner_leases) = connect(&owning);
    let (_sender, sender_leases) = connect(&owning);
    owner.commit(start("wf")).await.unwrap();
    // Its run stopped: the row still names this worker, and the worker knows better.
    let epoch = owner_leases.held_epoch("wf").unwrap();
    owner_leases.forget_at("wf", epoch);
    let sending = sender_leases.relay("wf", b"decide".to_vec(), Duration::from_millis(500));
    let sending = tokio::spawn(sending);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(owner_leases.take_relayed(None).unwrap(), vec![]);
    assert_eq!(owner_leases.take_relayed(Some("wf")).unwrap(), vec![]);
    assert_eq!(sending.await.unwrap().unwrap(), Relayed::NotTaken);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_accepts_and_never_answers_fails_the_connect_within_the_lease() {
    if common::database_url().is_none() {
        return;
    }
    // Accepts connections and says nothing: a host that is up while its database is not.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let mut options = PgOptions::new(format!("postgres://waymark:waymark@{address}/none"));
    options.lease = Duration::from_millis(1500);
    let (done, outcome) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    std::thread::spawn(move || done.send(PgStore::connect(&options, None).err()));
    let error = outcome
        .recv_timeout(Duration::from_secs(10))
        .expect("the connect gives up instead of waiting forever")
        .expect("nothing to connect to");
    assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    assert!(error.to_string().contains("did not answer"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parked_workflow_is_taken_by_one_worker_of_two_racing_for_its_timer() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (a, a_leases) = connect(&lease);
    let (_b, b_leases) = connect(&lease);
    let (_c, c_leases) = connect(&lease);
    for id in ["soon", "due", "raced"] {
        a.commit(start(id)).await.unwrap();
    }
    a_leases.park("soon", NOW_MS + 3_600_000, &[]).unwrap();
    a_leases.park("due", NOW_MS, &[]).unwrap();
    a_leases.park("raced", NOW_MS + 3_600_000, &[]).unwrap();
    assert!(!a_leases.holds("due"), "a parked workflow is let go");
    assert!(
        is_fenced(&a.commit(second("due", "a")).await),
        "and written no more"
    );

    // Claims take what is due, and not before.
    let racing = |leases: &Arc<dyn Leases>, work: fn(&dyn Leases) -> Vec<String>| {
        let leases = leases.clone();
        tokio::task::spawn_blocking(move || work(&*leases))
    };
    let claim = |leases: &dyn Leases| leases.claim(16, NOW_MS).unwrap();
    let (by_b, by_c) = tokio::join!(racing(&b_leases, claim), racing(&c_leases, claim));
    let mut claimed = [by_b.unwrap(), by_c.unwrap()].concat();
    claimed.sort();
    assert_eq!(
        claimed,
        vec!["due".to_owned()],
        "taken once, the others not due"
    );

    // An event takes a parked workflow before its timer: one taker of two.
    let take = |leases: &dyn Leases| {
        let taken = leases.take("raced").unwrap();
        if taken {
            vec!["raced".to_owned()]
        } else {
            Vec::new()
        }
    };
    let (by_b, by_c) = tokio::join!(racing(&b_leases, take), racing(&c_leases, take));
    assert_eq!([by_b.unwrap(), by_c.unwrap()].concat().len(), 1);
    assert!(b_leases.holds("raced") != c_leases.holds("raced"));
    let (holder, other) = match b_leases.holds("due") {
        true => (&b_leases, &c_leases),
        false => (&c_leases, &b_leases),
    };
    let not_taken = !other.take("due").unwrap();
    assert!(not_taken, "a live owner's workflow is not taken");
    assert!(holder.take("due").unwrap(), "its owner holds it already");
}

/// A signal takes a workflow nobody holds, but one parked with the signal names its waits
/// listen for is left parked and the names are returned. The names count only for the park
/// that wrote them: not for a later park by a build that writes none.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_leaves_a_workflow_parked_with_names_parked() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (parker, parker_leases) = connect(&lease);
    let (_taker, taker_leases) = connect(&lease);
    parker.commit(start("wf")).await.unwrap();
    let held = taker_leases.take_for_signal("wf").unwrap();
    assert_eq!(held, SignalTake::Held, "a live worker holds it");

    let listening = vec!["go".to_owned(), "stop".to_owned()];
    parker_leases
        .park("wf", NOW_MS + 3_600_000, &listening)
        .unwrap();
    for _ in 0..2 {
        let left = taker_leases.take_for_signal("wf").unwrap();
        assert_eq!(left, SignalTake::Parked(listening.clone()), "left parked");
    }
    assert!(!taker_leases.holds("wf"));
    assert!(taker_leases.take("wf").unwrap());
    let held = parker_leases.take_for_signal("wf").unwrap();
    assert_eq!(held, SignalTake::Held, "taken: the names count no more");

    // Parked again as a build before the names parks: the names left are not its run's.
    let older = session().await;
    let park = format!(
        "UPDATE {schema}.waymark_leases SET owner = NULL, parked_until_ms = $1 \
         WHERE workflow_id = 'wf'"
    );
    let due = i64::try_from(NOW_MS + 3_600_000).unwrap();
    assert_eq!(older.execute(&park, &[&due]).await.unwrap(), 1);
    let racing = |leases: &Arc<dyn Leases>| {
        let leases = leases.clone();
        tokio::task::spawn_blocking(move || leases.take_for_signal("wf").unwrap())
    };
    let (by_parker, by_taker) = tokio::join!(racing(&parker_leases), racing(&taker_leases));
    let mut outcomes = [by_parker.unwrap(), by_taker.unwrap()];
    outcomes.sort_by_key(|took| took != &SignalTake::Taken);
    let taken_once = [SignalTake::Taken, SignalTake::Held];
    assert_eq!(
        outcomes, taken_once,
        "parked without names: taken, by one of two"
    );
    let owner = parker_leases.owner("wf").unwrap().expect("held");
    let ids = [parker_leases.worker_id(), taker_leases.worker_id()];
    assert!(ids.contains(&owner.as_str()));
}

/// A write refused because the lease moved on forgets the lease there and then, at the epoch
/// it refused: the run that wrote it only stops, and does not forget it later, when this worker
/// may have taken it again under a new epoch.
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_write_forgets_the_lease_at_the_epoch_it_refused() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (a, a_leases) = connect(&lease);
    let (_b, b_leases) = connect(&lease);
    a.commit(start("wf")).await.unwrap();
    assert_eq!(a_leases.held_epoch("wf"), Some(1));
    assert_eq!(move_leases(&schema, b_leases.worker_id()).await, 1);

    assert!(is_fenced(&a.commit(second("wf", "a")).await));
    assert_eq!(
        a_leases.held_epoch("wf"),
        None,
        "forgotten as the write was refused"
    );
    assert!(!a_leases.holds("wf"));

    // Given back to `a` under a new epoch and taken: its writes go through at that epoch.
    assert_eq!(move_leases(&schema, a_leases.worker_id()).await, 1);
    assert!(a_leases.take("wf").unwrap());
    assert_eq!(a_leases.held_epoch("wf"), Some(3));
    a.commit(second("wf", "a")).await.unwrap();
    assert_eq!(a.journal("wf").unwrap(), vec![started(), mark("a")]);
}

/// A lease that names a worker unknown to it (the statement that took it committed, and its
/// answer was lost) is adopted by that worker's next take: left to its owner, a signal would
/// wake that worker, which would pass it on again.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_naming_a_worker_that_does_not_know_it_is_adopted_by_its_take() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (starter, starter_leases) = connect(&lease);
    let (_taker, taker_leases) = connect(&lease);
    for id in ["for-a-signal", "for-an-event"] {
        starter.commit(start(id)).await.unwrap();
    }
    assert_eq!(move_leases(&schema, taker_leases.worker_id()).await, 2);
    assert!(taker_leases.held().is_empty());

    let adopted = taker_leases.take_for_signal("for-a-signal").unwrap();
    assert_eq!(adopted, SignalTake::Taken);
    assert!(taker_leases.take("for-an-event").unwrap());
    for id in ["for-a-signal", "for-an-event"] {
        assert_eq!(
            taker_leases.held_epoch(id),
            Some(2),
            "{id} held at its epoch"
        );
    }
    let adopted = |leases: &Arc<dyn Leases>| (leases.stats().adopted, leases.stats().claimed);
    assert_eq!(adopted(&taker_leases), (2, 0), "adopted, not claimed");
    // Taken again, it is not counted again; its former holder takes nothing.
    assert!(taker_leases.take("for-an-event").unwrap());
    assert_eq!(adopted(&taker_leases), (2, 0));
    let held = starter_leases.take_for_signal("for-a-signal").unwrap();
    assert_eq!(held, SignalTake::Held);
    assert!(!starter_leases.take("for-an-event").unwrap());
}

/// A signal for a workflow a live worker holds waits for none of that worker's writes, which
/// share-lock the lease row until they commit.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_for_a_held_workflow_waits_for_none_of_its_owners_writes() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (owner, _owner_leases) = connect(&lease);
    let (_sender, sender_leases) = connect(&lease);
    owner.commit(start("wf")).await.unwrap();
    let writing = lease_row_locked(&schema, "wf", "SHARE").await;
    let taking = tokio::task::spawn_blocking(move || sender_leases.take_for_signal("wf"));
    let took = tokio::time::timeout(Duration::from_secs(5), taking).await;
    writing.batch_execute("ROLLBACK").await.unwrap();
    let took = took.expect("answered while the owner's write holds the row");
    assert_eq!(took.unwrap().unwrap(), SignalTake::Held);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_parked_workflow_with_a_command_waiting_is_claimed_before_its_timer() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (parker, parker_leases) = connect(&lease);
    let (_sender, sender_leases) = connect(&lease);
    parker.commit(start("asked")).await.unwrap();
    parker.commit(start("quiet")).await.unwrap();
    // A command sent as the owner let the workflow go: nobody holds it to take the command.
    parker_leases
        .park("asked", NOW_MS + 3_600_000, &[])
        .unwrap();
    parker_leases
        .park("quiet", NOW_MS + 3_600_000, &[])
        .unwrap();
    let sending = sender_leases.relay("asked", b"decide".to_vec(), Duration::from_secs(10));
    let sent = tokio::spawn(tokio::time::timeout(Duration::from_secs(15), sending));

    let claiming = sender_leases.clone();
    let claimed = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let claimed = claiming.claim(16, NOW_MS).unwrap();
            if !claimed.is_empty() || std::time::Instant::now() > deadline {
                return claimed;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert_eq!(
        claimed.await.unwrap(),
        vec!["asked".to_owned()],
        "the claim takes the workflow the command waits for, and only that one"
    );
    let command = sender_leases.take_relayed(Some("asked")).unwrap();
    assert_eq!(command.len(), 1);
    sender_leases
        .answer_relayed(command[0].id, b"done")
        .unwrap();
    let answered = sent.await.unwrap().expect("answered in time").unwrap();
    assert_eq!(answered, Relayed::Answered(b"done".to_vec()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sender_that_stops_waiting_withdraws_its_command() {
    let schema = common::fresh_schema();
    let Some(lease) = options(&schema, Duration::from_secs(30)) else {
        return;
    };
    let (owner, owner_leases) = connect(&lease);
    let (_sender, sender_leases) = connect(&lease);
    owner.commit(start("wf")).await.unwrap();
    // Its caller goes away before anyone takes the command.
    let sending = sender_leases.relay("wf", b"decide".to_vec(), Duration::from_secs(10));
    let gone = tokio::time::timeout(Duration::from_millis(300), sending).await;
    assert!(gone.is_err(), "still waiting when dropped");

    // The owner looks once the sender had time to withdraw it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let taking = owner_leases.clone();
    let left = tokio::task::spawn_blocking(move || taking.take_relayed(Some("wf")).unwrap());
    assert!(
        left.await.unwrap().is_empty(),
        "a command nobody waits for is not applied"
    );
}
