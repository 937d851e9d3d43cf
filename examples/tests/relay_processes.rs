//! Two `worker` processes on one PostgreSQL database (`WAYMARK_TEST_DATABASE_URL`, a schema of
//! the test's own): a command sent to the worker that does not run the workflow (an approval
//! decision, a cancellation) is relayed to the one that does, which checks and applies it, and
//! the sender answers with what the owner answered. Once the owner is killed, the other takes
//! its waiting workflow over. Each worker's `/metrics` counts what it relayed and took.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

const TOKEN: &str = "t0k3n";

/// Short, so that the killed owner's workflow is taken over soon; long enough that a loaded
/// machine does not delay a worker's start or a heartbeat (one every third of it) past it.
const LEASE_SECS: u64 = 5;

struct WorkerProcess {
    child: Child,
    base: String,
}

impl WorkerProcess {
    fn start(dir: &Path, url: &str, schema: &str) -> Self {
        let tokens = format!("ops:read+write+approve:{TOKEN}");
        let mut child = common::worker_command(dir, &tokens)
            .args(["--database-url", url, "--schema", schema])
            .args(["--lease-secs", &LEASE_SECS.to_string()])
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("the worker binary starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let base = common::listening_base(&mut stdout);
        // Read to its end: the worker writes its log and its last words there.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Self { child, base }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        common::post(&self.base, TOKEN, path, body).await
    }

    async fn get(&self, path: &str) -> Value {
        common::get(&self.base, TOKEN, path).await
    }

    async fn metrics(&self) -> String {
        common::get_text(&self.base, TOKEN, "/metrics").await
    }

    /// `GET path` until `done` holds for its body (up to 20 s); the last body.
    async fn get_until(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = self.get(path).await;
            if done(&body) || Instant::now() > deadline {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl WorkerProcess {
    /// Kills the process at once, as a crash would: it lets go of nothing.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return; // killed already
        }
        // Stopped as an operator stops it; killed if it has not stopped within 20 s.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the unlabelled metric `name` in Prometheus text, if it is there.
fn figure(metrics: &str, name: &str) -> Option<f64> {
    let line = metrics.lines().find(|line| {
        line.strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
    })?;
    line.rsplit(' ').next()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_sent_to_the_worker_process_without_the_run_are_applied_by_its_owner() {
    let Some(url) = waymark::testing::test_database_url() else {
        return;
    };
    let schema = format!("r{:016x}", rand::random::<u64>());
    let dir = tempfile::tempdir().unwrap();
    let mut owner = WorkerProcess::start(&dir.path().join("owner"), &url, &schema);
    let other = WorkerProcess::start(&dir.path().join("other"), &url, &schema);

    // An approval: the other worker's refusal of another scope is the owner's; the decision
    // for the scope pending applies, and either worker reads the outcome.
    let refund = json!({"ticket": "TICKET-7", "amount_cents": 4_200});
    let start = json!({"input": refund, "workflow_id": "refund-7"});
    let (status, _) = owner.post("/workflows/approve_refund", start).await;
    assert_eq!(status, 201);
    let asks = |view: &Value| {
        view["pending_approvals"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    };
    let view = owner.get_until("/workflows/refund-7", asks).await;
    assert!(asks(&view), "the refund asks for an approval: {view}");
    let pending = &view["pending_approvals"][0];
    let (hash, request) = (
        pending["artifact_hash"].as_str().unwrap(),
        &pending["request"],
    );
    let approve = json!({"decision": "approve", "request": request});
    let other_scope = format!("/workflows/refund-7/approvals/sha256:{}", "0".repeat(64));
    let (status, refused) = other.post(&other_scope, approve.clone()).await;
    assert_eq!(status, 409, "{refused}");
    let (status, decided) = other
        .post(&format!("/workflows/refund-7/approvals/{hash}"), approve)
        .await;
    assert_eq!(status, 200, "{decided}");
    let ended = |result: &Value| result["status"] == "completed";
    let result = other.get_until("/workflows/refund-7/result", ended).await;
    assert_eq!(
        result["output"], "TICKET-7: refund approved (ops)",
        "{result}"
    );

    // A cancellation of a run waiting for a signal the owner holds.
    let start = json!({"input": "TICKET-8", "workflow_id": "ticket-8"});
    let (status, _) = owner.post("/workflows/await_confirmation", start).await;
    assert_eq!(status, 201);
    let waits = |view: &Value| view["status"] == "awaiting_signal";
    let view = owner.get_until("/workflows/ticket-8", waits).await;
    assert!(waits(&view), "the ticket waits for its signal: {view}");
    let cancel = json!({"reason": "not needed"});
    let (status, cancelled) = other
        .post("/workflows/ticket-8/cancel", cancel.clone())
        .await;
    assert_eq!(status, 200, "{cancelled}");
    let failed = |result: &Value| result["status"] == "failed";
    let result = owner.get_until("/workflows/ticket-8/result", failed).await;
    assert!(result.to_string().contains("not needed"), "{result}");
    let (status, again) = other.post("/workflows/ticket-8/cancel", cancel).await;
    assert_eq!(status, 409, "{again}");

    // The other relayed the three the owner answered (it refused the late cancellation
    // itself, from the store); the owner relayed none, and neither took a lease.
    let relayed = |metrics: &str| figure(metrics, "waymark_commands_relayed_total");
    let (at_owner, at_other) = (owner.metrics().await, other.metrics().await);
    assert_eq!(relayed(&at_other), Some(3.0), "{at_other}");
    assert_eq!(relayed(&at_owner).unwrap_or(0.0), 0.0, "{at_owner}");
    let claimed = |metrics: &str| figure(metrics, "waymark_leases_claimed_total");
    assert_eq!(claimed(&at_other), Some(0.0), "{at_other}");

    // The owner dies with a workflow waiting; the other takes it over and runs it to its end.
    let start = json!({"input": "TICKET-9", "workflow_id": "ticket-9"});
    let (status, _) = owner.post("/workflows/await_confirmation", start).await;
    assert_eq!(status, 201);
    let view = owner.get_until("/workflows/ticket-9", waits).await;
    assert!(waits(&view), "the ticket waits for its signal: {view}");
    owner.kill();
    let signal = json!({"signal_id": "c-9", "payload": {"by": "dana", "note": "resolved"}});
    let (status, sent) = other
        .post("/workflows/ticket-9/signals/confirm", signal)
        .await;
    assert_eq!(status, 202, "{sent}");
    let result = other.get_until("/workflows/ticket-9/result", ended).await;
    assert_eq!(result["output"], "TICKET-9: resolved (dana)", "{result}");
    let at_other = other.metrics().await;
    assert_eq!(claimed(&at_other), Some(1.0), "{at_other}");
}
