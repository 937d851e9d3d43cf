//! Effects survive SIGKILL: the `crashloop` worker is killed at seeded random moments (30 times,
//! some of them between the downstream's write and the journal's commit) and run again until it
//! completes. Every `write <i>` must be in the log exactly once.
//!
//! Kills are paced by progress, not by wall-clock time: each run is killed a random 0–30 ms after
//! it has appended one or two log lines. A run therefore advances at most about one and a half
//! iterations, so 30 kills cannot finish the 60 iterations however fast or slow the machine is.
//!
//! The seed comes from `WAYMARK_SEED` (default fixed) and is printed, so a failing schedule can
//! be replayed: `WAYMARK_SEED=<seed> cargo test -p waymark-examples --test crashloop_sigkill`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use waymark::inspect::{DataDir, Entry};
use waymark_examples::crashloop::read_lines;

const STEPS: u64 = 60;
const STEP_DELAY_MS: u64 = 10;
const KILLS: usize = 30;
const WORKFLOW_ID: &str = "crashloop-1";

fn spawn(dir: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_crashloop"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--workflow-id", WORKFLOW_ID])
        .args(["--steps", &STEPS.to_string()])
        .arg("--log")
        .arg(dir.join("log"))
        .args(["--step-delay-ms", &STEP_DELAY_MS.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the crashloop binary starts")
}

/// Whether the kill landed in the window between `write <i>` reaching the log and its
/// completion reaching the journal (read from the dead worker's store).
fn killed_between_write_and_commit(dir: &Path) -> bool {
    let lines = read_lines(&dir.join("log"));
    let Some(i) = lines
        .last()
        .and_then(|line| line.strip_prefix("write "))
        .and_then(|i| i.parse::<u32>().ok())
    else {
        return false;
    };
    let Ok(data) = DataDir::open(dir.join("data")) else {
        return false;
    };
    let effect_seq = 2 * i + 1;
    let journal = data.journal(WORKFLOW_ID).unwrap_or_default();
    !journal.iter().any(|entry| match entry {
        Entry::ActivityCompleted { seq, .. }
        | Entry::ActivityCompletedAt { seq, .. }
        | Entry::EffectReconciled { seq, .. } => *seq == effect_seq,
        _ => false,
    })
}

/// Waits until the log holds `lines` lines; false if the run exited first.
fn await_progress(child: &mut Child, log: &Path, lines: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_lines(log).len() < lines {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(
            Instant::now() < deadline,
            "the crashloop run made no progress"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

fn seed() -> u64 {
    std::env::var("WAYMARK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_0003)
}

#[test]
fn every_effect_happens_exactly_once_across_sigkills() {
    let seed = seed();
    eprintln!("crashloop seed {seed} (set WAYMARK_SEED to replay)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let (mut kills, mut in_window) = (0, 0);
    while kills < KILLS {
        let mut child = spawn(dir.path());
        let target = read_lines(&log).len() + rng.random_range(1..=2);
        let progressed = await_progress(&mut child, &log, target);
        assert!(progressed, "seed {seed}: a run exited before it was killed");
        std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
        child.kill().unwrap();
        child.wait().unwrap();
        kills += 1;
        in_window += usize::from(killed_between_write_and_commit(dir.path()));
    }
    let output = spawn(dir.path()).wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "seed {seed}: the last run fails");
    assert_eq!(stdout.trim(), format!("completed {STEPS}"), "seed {seed}");

    let lines = read_lines(&dir.path().join("log"));
    for i in 0..STEPS {
        let writes = lines.iter().filter(|l| **l == format!("write {i}")).count();
        assert_eq!(writes, 1, "seed {seed}: `write {i}` appears {writes} times");
    }
    let reads = lines.iter().filter(|l| l.starts_with("read ")).count();
    eprintln!(
        "{kills} kills, {in_window} between a write and its commit; {reads} reads for {STEPS} \
         iterations; every write once"
    );
    assert!(
        in_window >= 1,
        "seed {seed}: no kill landed between a write and its commit"
    );
}
