//! The worker process stops gracefully on SIGTERM: it exits 0, and a workflow waiting when it
//! stopped resumes on the next start and completes when its signal arrives.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

const TOKEN: &str = "t0k3n";

/// Starts the worker; returns it and its base URL.
fn spawn_worker(dir: &Path) -> (Child, String, BufReader<std::process::ChildStdout>) {
    let tokens = format!("ops:read+write+approve+operate:{TOKEN}");
    let mut child = common::worker_command(dir, &tokens)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("the worker binary starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let base = common::listening_base(&mut stdout);
    (child, base, stdout)
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "the worker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    common::post(base, TOKEN, path, body).await
}

async fn get(base: &str, path: &str) -> Value {
    common::get(base, TOKEN, path).await
}

#[tokio::test]
async fn sigterm_stops_the_worker_cleanly_and_waiting_workflows_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (mut worker, base, mut stdout) = spawn_worker(dir.path());
    let start = json!({"input": "TICKET-9", "workflow_id": "ticket-9"});
    let (status, _) = post(&base, "/workflows/await_confirmation", start).await;
    assert_eq!(status, 201);
    let shown = get(&base, "/workflows/ticket-9").await;
    let waiting = ["running", "awaiting_signal"];
    assert!(
        waiting.contains(&shown["status"].as_str().unwrap()),
        "{shown}"
    );

    let exit = terminate(&mut worker);
    assert!(exit.success(), "exit status {exit}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");

    let (mut worker, base, _stdout) = spawn_worker(dir.path());
    let signal = json!({"signal_id": "c-1", "payload": {"by": "dana", "note": "refund approved"}});
    let (status, _) = post(&base, "/workflows/ticket-9/signals/confirm", signal).await;
    assert_eq!(status, 202);
    let mut result = Value::Null;
    for _ in 0..200 {
        result = get(&base, "/workflows/ticket-9/result").await;
        if result["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(result["output"], "TICKET-9: refund approved (dana)");
    assert!(terminate(&mut worker).success());
}
