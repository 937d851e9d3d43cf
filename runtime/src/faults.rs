//! Fault injection for tests: a plan of faults at named boundaries of an activity attempt,
//! consulted by the executor. A worker without a plan pays one `Option` check per boundary.
//!
//! An injected crash makes the executor stop where it is without writing anything more, as a
//! killed process would; the test then drops the worker and starts a new one on the same store
//! (`TestEnv` does this), which recovers from what was synced.

use std::sync::Mutex;

use crate::journal::{Failure, FailureKind, Seq};
use crate::sync::lock;

/// Where in an activity attempt a fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Boundary {
    /// Before the attempt's `prepared` record (an effect) or start is written.
    BeforePrepared,
    /// After `prepared` is synced, before the downstream is called.
    BeforeCall,
    /// After the downstream answered, before the outcome is journaled.
    AfterCall,
}

/// What happens there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The process dies here.
    Crash,
    /// The call's answer is lost to a timeout (after the work was done, at `AfterCall`).
    Timeout,
    /// The acknowledgement is lost: the work was done, the caller hears `Uncertain`.
    AckLost,
    /// The downstream is unavailable (at `BeforeCall`): the attempt fails, retriable, without
    /// calling it.
    Unavailable,
}

/// One planned fault: at `boundary` of attempt `attempt` of activity `activity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFault {
    /// The activity (or `waymark.llm` for model calls).
    pub activity: String,
    /// The attempt (1-based); after a crash the restarted attempt keeps its number.
    pub attempt: u32,
    /// Where.
    pub boundary: Boundary,
    /// What.
    pub fault: Fault,
    /// Only at this command, if set (several commands may call the same activity).
    pub seq: Option<Seq>,
}

impl PlannedFault {
    /// `fault` at `boundary` of attempt `attempt` of `activity`, whichever command calls it.
    pub fn at(activity: &str, attempt: u32, boundary: Boundary, fault: Fault) -> Self {
        let activity = activity.to_owned();
        Self {
            activity,
            attempt,
            boundary,
            fault,
            seq: None,
        }
    }

    /// Only when command `seq` calls it.
    pub fn on_seq(mut self, seq: Seq) -> Self {
        self.seq = Some(seq);
        self
    }
}

/// A fault that fired, for the test's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredFault {
    /// The workflow.
    pub workflow_id: String,
    /// The command.
    pub seq: Seq,
    /// What was planned.
    pub planned: PlannedFault,
}

/// The faults to inject, each at most once.
#[derive(Debug, Default)]
pub struct FaultPlan {
    pending: Mutex<Vec<PlannedFault>>,
    fired: Mutex<Vec<FiredFault>>,
    crashes_reported: Mutex<usize>,
}

impl FaultPlan {
    /// A plan of `faults`.
    pub fn new(faults: impl IntoIterator<Item = PlannedFault>) -> Self {
        let pending = Mutex::new(faults.into_iter().collect());
        Self {
            pending,
            fired: Mutex::default(),
            crashes_reported: Mutex::default(),
        }
    }

    /// Adds a fault.
    pub fn add(&self, fault: PlannedFault) {
        lock(&self.pending).push(fault);
    }

    /// The fault planned here, if any; it fires once.
    pub fn strike(
        &self,
        workflow_id: &str,
        seq: Seq,
        activity: &str,
        attempt: u32,
        boundary: Boundary,
    ) -> Option<Fault> {
        let mut pending = lock(&self.pending);
        let position = pending.iter().position(|p| {
            p.activity == activity
                && p.attempt == attempt
                && p.boundary == boundary
                && p.seq.is_none_or(|s| s == seq)
        })?;
        let planned = pending.remove(position);
        let fault = planned.fault.clone();
        tracing::info!(
            workflow_id,
            seq,
            activity,
            attempt,
            ?boundary,
            ?fault,
            "injecting a fault"
        );
        let workflow_id = workflow_id.to_owned();
        lock(&self.fired).push(FiredFault {
            workflow_id,
            seq,
            planned,
        });
        Some(fault)
    }

    /// The faults that fired, in order.
    pub fn fired(&self) -> Vec<FiredFault> {
        lock(&self.fired).clone()
    }

    /// Faults planned that did not fire (yet).
    pub fn pending(&self) -> Vec<PlannedFault> {
        lock(&self.pending).clone()
    }

    /// The workflows a crash fired in since the last call, in firing order: the test restarts
    /// the worker then, once their runs have stopped at the crash.
    pub fn take_crashes(&self) -> Vec<String> {
        let fired = lock(&self.fired);
        let crashes = fired.iter().filter(|f| f.planned.fault == Fault::Crash);
        let mut reported = lock(&self.crashes_reported);
        let new: Vec<String> = crashes
            .skip(*reported)
            .map(|f| f.workflow_id.clone())
            .collect();
        *reported += new.len();
        new
    }
}

/// The failure an attempt reports in place of its answer, for faults that replace it.
pub(crate) fn replaced_answer(fault: &Fault) -> Option<Failure> {
    match fault {
        Fault::Timeout => Some(Failure::new(
            FailureKind::Timeout,
            "injected: the answer was lost to a timeout",
        )),
        Fault::AckLost => Some(Failure::new(
            FailureKind::Uncertain,
            "injected: the acknowledgement was lost",
        )),
        Fault::Unavailable => Some(Failure::new(
            FailureKind::Retriable,
            "injected: the downstream is unavailable",
        )),
        Fault::Crash => None,
    }
}
