//! Shared fixtures for the integration tests: per-workflow execution counters and gates that
//! hold an activity until the test opens them, so a test can crash a worker at an exact step.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

pub mod conformance;
pub mod quote_and_book;
pub mod signalled;
pub mod store;
pub mod unanswered;

type Key = (String, String);

fn counters() -> &'static Mutex<HashMap<Key, u32>> {
    static COUNTERS: OnceLock<Mutex<HashMap<Key, u32>>> = OnceLock::new();
    COUNTERS.get_or_init(Default::default)
}

/// Records one execution of `step` in `workflow_id`; returns how many there have been.
pub fn count(workflow_id: &str, step: &str) -> u32 {
    let mut counters = counters().lock().unwrap_or_else(|e| e.into_inner());
    let slot = counters
        .entry((workflow_id.to_owned(), step.to_owned()))
        .or_default();
    *slot += 1;
    *slot
}

/// How many times `step` of `workflow_id` executed.
pub fn executions(workflow_id: &str, step: &str) -> u32 {
    let counters = counters().lock().unwrap_or_else(|e| e.into_inner());
    counters
        .get(&(workflow_id.to_owned(), step.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[derive(Default)]
struct Gate {
    open: bool,
    notify: Arc<Notify>,
}

fn gates() -> &'static Mutex<HashMap<Key, Gate>> {
    static GATES: OnceLock<Mutex<HashMap<Key, Gate>>> = OnceLock::new();
    GATES.get_or_init(Default::default)
}

/// Closes the gate `name` of `workflow_id`: activities that pass it wait until it opens.
pub fn close_gate(workflow_id: &str, name: &str) {
    let mut gates = gates().lock().unwrap_or_else(|e| e.into_inner());
    gates
        .entry((workflow_id.to_owned(), name.to_owned()))
        .or_default()
        .open = false;
}

/// Opens the gate, releasing every waiter.
pub fn open_gate(workflow_id: &str, name: &str) {
    let mut gates = gates().lock().unwrap_or_else(|e| e.into_inner());
    let gate = gates
        .entry((workflow_id.to_owned(), name.to_owned()))
        .or_default();
    gate.open = true;
    gate.notify.notify_waiters();
}

/// Waits until the gate is open (an unknown gate is open).
pub async fn pass_gate(workflow_id: &str, name: &str) {
    loop {
        let notify = {
            let gates = gates().lock().unwrap_or_else(|e| e.into_inner());
            match gates.get(&(workflow_id.to_owned(), name.to_owned())) {
                Some(gate) if !gate.open => gate.notify.clone(),
                _ => return,
            }
        };
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if is_open(workflow_id, name) {
            return;
        }
        notified.await;
    }
}

fn is_open(workflow_id: &str, name: &str) -> bool {
    let gates = gates().lock().unwrap_or_else(|e| e.into_inner());
    gates
        .get(&(workflow_id.to_owned(), name.to_owned()))
        .is_none_or(|gate| gate.open)
}

/// Workflows whose poll is held (see [`hold_poll_while_held`]).
static POLLS_HELD: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Holds the polls of `workflow_id` that call [`hold_poll_while_held`], until
/// [`release_polls`].
pub fn hold_polls(workflow_id: &str) {
    let mut held = POLLS_HELD.lock().unwrap_or_else(|e| e.into_inner());
    held.push(workflow_id.to_owned());
}

/// Lets the held polls of `workflow_id` go on.
pub fn release_polls(workflow_id: &str) {
    let mut held = POLLS_HELD.lock().unwrap_or_else(|e| e.into_inner());
    held.retain(|h| h != workflow_id);
}

/// Called from workflow code: blocks the poll of `workflow_id` while a test holds it (ten
/// seconds at most). Its executor stays in the poll, and mail sent to the workflow meanwhile
/// waits in its mailbox.
pub fn hold_poll_while_held(workflow_id: &str) {
    let is_held = || {
        let held = POLLS_HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().any(|h| h == workflow_id)
    };
    let started = std::time::Instant::now();
    while is_held() && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `workflow_id`'s status once it is `wanted`, or once [`eventually`] gives up waiting for it.
pub async fn status_once(
    env: &waymark::testing::TestEnv,
    workflow_id: &str,
    wanted: waymark::inspect::WorkflowStatus,
) -> Option<waymark::inspect::WorkflowStatus> {
    let status = || env.worker().workflow_status(workflow_id).unwrap();
    eventually(400, || status() == Some(wanted)).await;
    status()
}

/// The status of the operation `key` if an operator is asked to decide about it now (it is
/// in [`waymark::Worker::operations_awaiting_decision`]), `None` if not.
pub fn awaiting_decision(env: &waymark::testing::TestEnv, key: &str) -> Option<&'static str> {
    let listed = env.worker().operations_awaiting_decision(None).unwrap();
    listed
        .into_iter()
        .find(|(listed, _)| listed == key)
        .map(|(_, record)| record.status.name())
}

/// The passes of the reconciliation sweep `env`'s workers finished.
pub fn sweeps(env: &waymark::testing::TestEnv) -> f64 {
    let metrics = env.metrics();
    metrics.value(waymark::telemetry::names::RECONCILIATION_SWEEPS, &[])
}

/// Moves the clock a second at a time until the next sweep has finished, at most 200 times,
/// and waits up to 25 ms after each second: the clock all but stands still while a pass runs,
/// so what it finds stood still did so before it began. Whether the sweep came.
pub async fn advance_to_next_sweep(env: &waymark::testing::TestEnv) -> bool {
    let before = sweeps(env);
    for _ in 0..200 {
        env.advance(std::time::Duration::from_secs(1)).await;
        for _ in 0..5 {
            if sweeps(env) > before {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    false
}

/// Polls `condition` every 5 ms until it holds. It gives up after `tries` polls, but never
/// before ten seconds of real time: a loaded machine slows the runtime, it does not make a
/// condition that will hold any less true.
pub async fn eventually(tries: u32, mut condition: impl FnMut() -> bool) -> bool {
    let floor = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut polls = 0;
    while polls < tries || tokio::time::Instant::now() < floor {
        if condition() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        polls += 1;
    }
    condition()
}

/// A fault a test scripts for the next call of a fake downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The downstream applies the effect but the acknowledgement is lost.
    AckLost,
    /// The downstream refuses with a retriable error before doing anything.
    Unavailable,
    /// The downstream refuses for good.
    Rejected,
    /// The request is lost before the downstream sees it; the caller cannot tell.
    RequestLost,
    /// A reconciler asking the downstream gets no answer it can trust.
    Unclear,
}

fn faults() -> &'static Mutex<HashMap<String, Vec<Fault>>> {
    static FAULTS: OnceLock<Mutex<HashMap<String, Vec<Fault>>>> = OnceLock::new();
    FAULTS.get_or_init(Default::default)
}

/// Scripts `faults`, in order, for the next calls made within `workflow_id`.
pub fn script_faults(workflow_id: &str, script: &[Fault]) {
    let mut faults = faults().lock().unwrap_or_else(|e| e.into_inner());
    faults.insert(workflow_id.to_owned(), script.to_vec());
}

/// The next scripted fault for a call within `workflow_id`, if any.
pub fn next_fault(workflow_id: &str) -> Option<Fault> {
    let mut faults = faults().lock().unwrap_or_else(|e| e.into_inner());
    let script = faults.get_mut(workflow_id)?;
    (!script.is_empty()).then(|| script.remove(0))
}

fn ledger() -> &'static Mutex<HashMap<String, Vec<String>>> {
    static LEDGER: OnceLock<Mutex<HashMap<String, Vec<String>>>> = OnceLock::new();
    LEDGER.get_or_init(Default::default)
}

/// A downstream that is *not* idempotent: every call with `key` applies the effect again, so a
/// duplicate is visible. Returns the reference of this application.
pub fn apply_effect(key: &str, what: &str) -> String {
    let mut ledger = ledger().lock().unwrap_or_else(|e| e.into_inner());
    let applied = ledger.entry(key.to_owned()).or_default();
    applied.push(what.to_owned());
    format!("ref-{}", applied.len())
}

/// What the downstream applied for `key`, in order (more than one entry is a duplicate effect).
pub fn applied_effects(key: &str) -> Vec<String> {
    let ledger = ledger().lock().unwrap_or_else(|e| e.into_inner());
    ledger.get(key).cloned().unwrap_or_default()
}

/// Forgets what the downstream applied for `key`: a test that runs the same workflow id again,
/// on a fresh store, starts from a downstream that never saw it.
pub fn forget_effects(key: &str) {
    let mut ledger = ledger().lock().unwrap_or_else(|e| e.into_inner());
    ledger.remove(key);
}

/// Start options that pin the workflow id, so a test can find the run after a restart.
pub fn with_id(id: &str) -> waymark::StartOptions {
    waymark::StartOptions {
        workflow_id: Some(id.to_owned()),
        ..waymark::StartOptions::default()
    }
}

/// Applies `what` downstream under the attempt's idempotency key (see [`apply_effect`]).
pub fn apply_under_key(cx: &waymark::ActivityContext, what: &str) -> String {
    apply_effect(cx.idempotency_key().unwrap_or_default(), what)
}

/// What a reconciler learns from the downstream of [`apply_under_key`]: committed, with the
/// reference of its last application, if anything was applied under the attempt's key.
pub fn reconcile_by_key(cx: &waymark::ActivityContext) -> waymark::Reconciled<String> {
    match applied_effects(cx.idempotency_key().unwrap_or_default()).len() {
        0 => waymark::Reconciled::NotFound,
        n => waymark::Reconciled::Committed(format!("ref-{n}")),
    }
}

/// A model that answers with `answer(request)`, instantly; streamed calls hand the text over
/// word by word. Tests give it a function that answers by role, so retries get the same answers.
pub struct AnswersWith<F>(pub F);

impl<F> waymark::llm::LlmProvider for AnswersWith<F>
where
    F: Fn(&waymark::llm::LlmRequest) -> waymark::llm::Completion + Send + Sync + 'static,
{
    fn complete(
        &self,
        request: waymark::llm::LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<waymark::llm::Completion, waymark::llm::LlmError>>
    {
        Box::pin(futures::future::ready(Ok((self.0)(&request))))
    }

    fn stream(
        &self,
        request: waymark::llm::LlmRequest,
        mut chunks: waymark::llm::ChunkSink,
    ) -> futures::future::BoxFuture<'static, Result<waymark::llm::Completion, waymark::llm::LlmError>>
    {
        let completion = (self.0)(&request);
        for word in completion.text.split_inclusive(' ') {
            chunks(word);
        }
        Box::pin(futures::future::ready(Ok(completion)))
    }
}

/// [`AnswersWith`], answering after a wait, as a model behind a network does: a call is then
/// journaled as scheduled before it answers, so a crash after the call leaves it in flight.
pub struct AnswersAfterAWait<F>(pub F);

impl<F> waymark::llm::LlmProvider for AnswersAfterAWait<F>
where
    F: Fn(&waymark::llm::LlmRequest) -> waymark::llm::Completion + Send + Sync + 'static,
{
    fn complete(
        &self,
        request: waymark::llm::LlmRequest,
    ) -> futures::future::BoxFuture<'static, Result<waymark::llm::Completion, waymark::llm::LlmError>>
    {
        let completion = (self.0)(&request);
        Box::pin(async move {
            tokio::task::yield_now().await;
            Ok(completion)
        })
    }
}

/// Whether `env`'s store is anything but RocksDB, said on stderr: a test that reaches beneath
/// the store (to damage a record, or import a journal into the data dir) is RocksDB's alone.
pub fn beneath_rocksdb_only(env: &waymark::testing::TestEnv) -> bool {
    if env.on_rocksdb() {
        return false;
    }
    eprintln!("skipped on this backend: the test reaches beneath a RocksDB store");
    true
}
