//! The compensating loop: the undos of a run's effects, newest first, one at a time, each an
//! effect command of its own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::WorkflowCore;
use crate::compensations::{Step, UndoFailure};
use crate::journal::{Failure, FailureKind, Payload, Seq};
use crate::machines::Resolution;

/// `WorkflowCore::compensate`: settles with the undos that did not succeed (an undo that fails
/// does not stop the ones before it: each leaves the world closer to where it was).
#[must_use = "compensations run only while this is awaited"]
pub struct Compensate {
    core: WorkflowCore,
    /// The undo in flight: its registration and its command.
    undoing: Option<(usize, Seq)>,
    failures: Vec<UndoFailure>,
}

impl Compensate {
    pub(super) fn new(core: WorkflowCore) -> Self {
        Self {
            core,
            undoing: None,
            failures: Vec::new(),
        }
    }

    fn settle(&mut self, index: usize, failure: Option<&Failure>) {
        let failed = self.core.lock().compensations.settle(index, failure);
        self.failures.extend(failed);
    }

    /// Issues the undo for registration `index`; `false` when the run is stopping.
    fn issue(&mut self, index: usize, step: IssueStep) -> bool {
        let IssueStep {
            undo,
            options,
            input,
        } = step;
        let input = match input {
            Ok(input) => input,
            Err(message) => {
                let why = format!("its input could not be made: {message}");
                self.settle(index, Some(&Failure::new(FailureKind::Terminal, why)));
                return true;
            }
        };
        let Some(seq) = self.core.schedule_activity(&undo, input, Some(options)) else {
            return false;
        };
        self.core.lock().compensations.undoing(index, seq);
        self.undoing = Some((index, seq));
        true
    }
}

struct IssueStep {
    undo: String,
    options: crate::options::ActivityOptions,
    input: Result<Payload, String>,
}

impl Future for Compensate {
    type Output = Vec<UndoFailure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            if let Some((index, seq)) = this.undoing {
                let resolution = std::task::ready!(this.core.poll_resolution(seq, cx));
                this.undoing = None;
                match resolution {
                    Resolution::Failed(failure) => this.settle(index, Some(&failure)),
                    _ => this.settle(index, None),
                }
                continue;
            }
            let step = this.core.lock().compensations.next_step();
            match step {
                Step::Done => return Poll::Ready(std::mem::take(&mut this.failures)),
                Step::AwaitEffect => {
                    this.core.lock().compensation_waker = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Step::AwaitUndo { index, seq } => this.undoing = Some((index, seq)),
                Step::Issue {
                    index,
                    undo,
                    options,
                    build,
                    output,
                } => {
                    // The input is made here, outside the core's lock: it is workflow code.
                    let input = match build {
                        Some(build) => build(&output),
                        None => Err("a stopped run already took it".to_owned()),
                    };
                    let step = IssueStep {
                        undo,
                        options,
                        input,
                    };
                    if !this.issue(index, step) {
                        return Poll::Pending;
                    }
                }
            }
        }
    }
}

/// `failure` with the undos that did not succeed after it, so the run's end says what the
/// world was left with.
pub fn with_undo_failures(mut failure: Failure, failures: &[UndoFailure]) -> Failure {
    for undo in failures {
        // `UndoFailure`'s text begins `compensation `: with the separator, the mark that
        // `failure_location` cuts the run's own failure at.
        failure.message = format!("{}; {undo}", failure.message);
    }
    failure
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_undo_failures_follow_the_mark_telemetry_cuts_at() {
        let undo = UndoFailure {
            effect: "book".into(),
            undo: "cancel".into(),
            message: "down".into(),
        };
        let failure = Failure::new(FailureKind::Workflow, "no car");
        let failed = with_undo_failures(failure, &[undo]);
        let (own, _) = failed
            .message
            .split_once(crate::compensations::UNDO_FAILED)
            .unwrap();
        assert_eq!(own, "no car");
    }
}
