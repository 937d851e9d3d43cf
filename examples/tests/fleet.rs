//! Many worker processes on one PostgreSQL database (`WAYMARK_TEST_DATABASE_URL`, a schema of
//! its own per test): workers killed with SIGKILL at random have their workflows claimed by
//! the others once their leases lapse; a worker paused with SIGSTOP past its lease comes back
//! fenced out and exits while another has taken over. Every workflow completes, every effect
//! is applied once, and no worker calls the downstream for an effect already applied, but for
//! the paused worker's one call in flight when it froze.
//!
//! The seed comes from `WAYMARK_SEED` and is printed, so a failing schedule can be replayed.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use waymark_examples::fleet::read_lines;

struct Fleet {
    url: String,
    schema: String,
    dir: tempfile::TempDir,
    workflows: u32,
    steps: u64,
    lease_ms: u64,
}

impl Fleet {
    fn new(workflows: u32, steps: u64, lease_ms: u64) -> Option<Self> {
        Some(Self {
            url: waymark::testing::test_database_url()?,
            schema: format!("f{:016x}", rand::random::<u64>()),
            dir: tempfile::tempdir().unwrap(),
            workflows,
            steps,
            lease_ms,
        })
    }

    fn spawn(&self, start_from: u32, start_count: u32) -> Child {
        Command::new(env!("CARGO_BIN_EXE_fleet"))
            .args(["--database-url", &self.url, "--schema", &self.schema])
            .args(["--lease-ms", &self.lease_ms.to_string()])
            .args(["--workflows", &self.workflows.to_string()])
            .args(["--start-from", &start_from.to_string()])
            .args(["--start-count", &start_count.to_string()])
            .args(["--steps", &self.steps.to_string()])
            .arg("--log-dir")
            .arg(self.dir.path())
            .args(["--step-delay-ms", "20"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the fleet binary starts")
    }

    fn writes(&self) -> usize {
        (0..self.workflows)
            .map(|w| {
                self.lines(w)
                    .iter()
                    .filter(|l| l.starts_with("write "))
                    .count()
            })
            .sum()
    }

    fn lines(&self, workflow: u32) -> Vec<String> {
        read_lines(&self.dir.path().join(workflow.to_string()))
    }

    /// Checks every workflow's downstream file: each step written once, in order of steps,
    /// and no call for a step already written but from `zombie` (the pid allowed one late
    /// call per workflow). Returns how many calls there were.
    fn check_effects(&self, zombie: Option<u32>) -> usize {
        let mut calls = 0;
        for workflow in 0..self.workflows {
            let lines = self.lines(workflow);
            let mut written: HashMap<u64, usize> = HashMap::new();
            let mut late = 0;
            for line in &lines {
                let words: Vec<&str> = line.split(' ').collect();
                match words.as_slice() {
                    ["write", step] => *written.entry(step.parse().unwrap()).or_default() += 1,
                    ["call", step, pid] => {
                        calls += 1;
                        let step: u64 = step.parse().unwrap();
                        if written.contains_key(&step) {
                            let pid: u32 = pid.parse().unwrap();
                            assert_eq!(
                                Some(pid),
                                zombie,
                                "workflow {workflow}: step {step} called by {pid} after it was \
                                 applied: {lines:?}"
                            );
                            late += 1;
                        }
                    }
                    other => panic!("unexpected line {other:?}"),
                }
            }
            assert!(late <= 1, "workflow {workflow}: {late} late calls");
            for step in 0..self.steps {
                assert_eq!(
                    written.get(&step),
                    Some(&1),
                    "workflow {workflow}: step {step} applied {:?} times",
                    written.get(&step)
                );
            }
        }
        calls
    }
}

/// The exit status of a worker whose leases lapsed.
const LAPSED: i32 = 3;
/// Lapses a slot may have before the test gives up on it.
const MAX_LAPSES: usize = 5;

/// Says that the worker in `slot` exited with `status`, which must be a lapse.
fn respawn_lapsed(status: std::process::ExitStatus, slot: u32) {
    assert_eq!(
        status.code(),
        Some(LAPSED),
        "the worker in slot {slot} failed"
    );
    eprintln!("the worker in slot {slot} lapsed; starting another");
}

fn wait_success(child: Child, what: &str) -> String {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed: {:?}",
        output.status
    );
    stdout
}

fn await_writes(fleet: &Fleet, at_least: usize) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while fleet.writes() < at_least {
        assert!(Instant::now() < deadline, "the fleet made no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn seed(default: u64) -> u64 {
    std::env::var("WAYMARK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[test]
fn three_workers_killed_at_random_complete_every_workflow_with_each_effect_once() {
    const SLOTS: u32 = 3;
    const PER_SLOT: u32 = 3;
    const KILLS: usize = 6;
    let Some(fleet) = Fleet::new(SLOTS * PER_SLOT, 12, 1_000) else {
        return;
    };
    let seed = seed(0x5eed_f1ee);
    eprintln!("fleet seed {seed} (set WAYMARK_SEED to replay)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let spawn_slot = |slot: u32| fleet.spawn(slot * PER_SLOT, PER_SLOT);
    let mut workers: Vec<Child> = (0..SLOTS).map(spawn_slot).collect();
    let started = Instant::now();
    for kill in 0..KILLS {
        // Paced by progress: a kill lands after a few more effects, wherever they ran.
        await_writes(&fleet, fleet.writes() + rng.random_range(2..=6));
        let slot = rng.random_range(0..SLOTS);
        let victim = &mut workers[slot as usize];
        if let Some(status) = victim.try_wait().unwrap() {
            respawn_lapsed(status, slot);
            workers[slot as usize] = spawn_slot(slot);
            continue;
        }
        victim.kill().unwrap();
        victim.wait().unwrap();
        eprintln!(
            "kill {kill}: worker in slot {slot} after {} writes",
            fleet.writes()
        );
        workers[slot as usize] = spawn_slot(slot);
    }
    for (slot, mut worker) in (0..SLOTS).zip(workers) {
        // A worker that lapsed (starved past its lease on a busy machine) exits, and its
        // supervisor starts another, as one that was killed.
        for _ in 0..MAX_LAPSES {
            let status = worker.wait().unwrap();
            if status.code() != Some(LAPSED) {
                break;
            }
            respawn_lapsed(status, slot);
            worker = spawn_slot(slot);
        }
        let stdout = wait_success(worker, &format!("the worker in slot {slot}"));
        assert_eq!(stdout.trim(), format!("completed {}", fleet.workflows));
    }
    let calls = fleet.check_effects(None);
    eprintln!(
        "{KILLS} kills of 3 workers; {} effects applied once each, {calls} downstream calls, \
         in {:?}",
        fleet.writes(),
        started.elapsed()
    );
}

#[test]
fn a_worker_paused_past_its_lease_is_fenced_out_and_exits() {
    let Some(fleet) = Fleet::new(4, 40, 1_500) else {
        return;
    };
    let mut zombie = fleet.spawn(0, fleet.workflows);
    let zombie_pid = zombie.id();
    await_writes(&fleet, 8);
    signal(zombie_pid, "STOP");
    let frozen_at = fleet.writes();
    let successor = fleet.spawn(0, 0);
    // The successor claims once the lease lapsed, and goes on from where the zombie stopped.
    await_writes(&fleet, frozen_at + 12);
    signal(zombie_pid, "CONT");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = zombie.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the resumed worker did not stop");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(3), "the zombie exits as fenced out");
    let stdout = wait_success(successor, "the successor");
    assert_eq!(stdout.trim(), "completed 4");
    let calls = fleet.check_effects(Some(zombie_pid));
    eprintln!(
        "paused after {frozen_at} effects; {} applied once each, {calls} downstream calls",
        fleet.writes()
    );
}

fn signal(pid: u32, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{name} {pid}");
}
