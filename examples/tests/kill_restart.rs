//! A real crash: the `steps` example worker runs as a child process and is killed with SIGKILL
//! mid-workflow, several times, then restarted on the same data dir until it completes.
//!
//! After every kill the test reads the store (read-only, as the CLI would) and notes which
//! steps have a journaled completion and how often each step had run. A step journaled at some
//! kill must never run again afterwards: its execution count stays what it was at that kill.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use waymark::inspect::{DataDir, Entry};
use waymark_examples::steps::ledger_counts;

const STEPS: u64 = 30;
const STEP_MS: u64 = 60;
const KILLS: usize = 5;

fn spawn_worker(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_steps"))
        .arg(dir.join("data"))
        .arg(dir.join("ledger"))
        .arg(STEPS.to_string())
        .arg(STEP_MS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the steps binary starts")
}

/// Steps whose completion is journaled, read from the stopped worker's store.
fn journaled_steps(dir: &Path) -> Vec<u64> {
    let Ok(data) = DataDir::open(dir.join("data")) else {
        return Vec::new(); // killed before the store was created
    };
    let journal = data.journal("steps-run").unwrap_or_default();
    journal
        .iter()
        .filter_map(|entry| match entry {
            Entry::ActivityCompletedAt { seq, .. } => Some(u64::from(*seq)),
            _ => None,
        })
        .collect()
}

fn ledger_lines(ledger: &Path) -> usize {
    std::fs::read_to_string(ledger).map_or(0, |text| text.lines().count())
}

fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    condition()
}

#[test]
fn sigkill_mid_workflow_never_reruns_a_journaled_step() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    // For each step journaled at some kill: the execution count at that moment.
    let mut frozen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut kills = 0;
    for round in 0..KILLS {
        let before = ledger_lines(&ledger);
        let mut child = spawn_worker(dir.path());
        // Kill once this run has made progress, at a different point inside a step each round.
        let progressed = wait_until(Duration::from_secs(30), || ledger_lines(&ledger) > before);
        std::thread::sleep(Duration::from_millis((round as u64 * 37) % STEP_MS));
        if !progressed || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            child.wait().unwrap();
            break; // no progress, or finished before we could kill it
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        let counts = ledger_counts(&ledger, STEPS);
        for step in journaled_steps(dir.path()) {
            frozen.entry(step).or_insert(counts[step as usize]);
        }
    }
    assert_eq!(
        kills, KILLS,
        "the worker was killed mid-run only {kills} times"
    );
    assert!(!frozen.is_empty(), "no step was journaled before the kills");

    let started = Instant::now();
    let output = spawn_worker(dir.path()).wait_with_output().unwrap();
    assert!(output.status.success(), "the final run completes");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let expected: u64 = (0..STEPS).map(|i| i * i).sum();
    assert!(stdout.contains(&format!("result {expected}")), "{stdout}");

    let counts = ledger_counts(&ledger, STEPS);
    for (step, at_kill) in &frozen {
        assert_eq!(
            counts[*step as usize], *at_kill,
            "step {step} was journaled at a kill and ran again afterwards"
        );
    }
    assert!(counts.iter().all(|c| *c >= 1), "every step ran: {counts:?}");
    assert_eq!(journaled_steps(dir.path()).len() as u64, STEPS);
    eprintln!(
        "{kills} kills; steps frozen at a kill: {}; executions per step {counts:?}; final run {:?}",
        frozen.len(),
        started.elapsed()
    );
}
