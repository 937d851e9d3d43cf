//! Compensations: the undo effect an effect registers, run in reverse order when the workflow
//! fails, is cancelled, or asks for it (`ctx.compensate()`).
//!
//! Nothing here is journaled apart from the commands it issues. The registrations are made by
//! the code when it issues an effect (`.compensate_with`), so every replay makes them again,
//! at the same points; the effect's outcome is taken from the delivery that settles it, which
//! replay repeats in journal order. Each undo is an ordinary effect command, with its own
//! idempotency key: one that completed is answered from the journal, one a crash interrupted
//! is reconciled through the operation log, so each runs once across crashes.

use crate::error::WorkflowError;
use crate::journal::{Failure, Payload, Seq};
use crate::machines::Resolution;
use crate::options::ActivityOptions;

/// Builds the undo's input from the effect's committed output.
pub type UndoInput = Box<dyn FnOnce(&Payload) -> Result<Payload, String> + Send>;

/// An undo the code registered for the effect at `effect_seq`.
pub struct Registration {
    /// The effect being compensated.
    pub effect_seq: Seq,
    /// Its name, for reports.
    pub effect: String,
    /// The undo effect's registered name.
    pub undo: String,
    /// The undo's options (its activity's own).
    pub options: ActivityOptions,
    /// Taken when the undo is issued.
    pub input: Option<UndoInput>,
}

enum Progress {
    /// The effect's outcome is not known yet.
    Registered,
    /// The effect committed with this output: it needs undoing.
    Committed(Payload),
    /// The undo runs as the command at this seq.
    Undoing(Seq),
    /// Nothing more to do: undone, failed to undo, or the effect never happened.
    Settled,
}

struct Compensation {
    registration: Registration,
    progress: Progress,
}

/// The compensations of one run, in registration order.
#[derive(Default)]
pub struct Compensations {
    registered: Vec<Compensation>,
}

/// What the compensating loop does next.
pub enum Step {
    /// Everything registered is settled.
    Done,
    /// The newest unsettled effect has no outcome yet: wait for it (reverse order is kept even
    /// when an earlier effect is already known).
    AwaitEffect,
    /// Issue the undo `undo` for registration `index`, with the input `build` makes of the
    /// effect's `output` (outside the core's lock: it is the workflow's code), then wait for it.
    Issue {
        /// The registration.
        index: usize,
        /// The undo's name.
        undo: String,
        /// Its options.
        options: ActivityOptions,
        /// Makes its input; `None` if a stopped run already took it.
        build: Option<UndoInput>,
        /// The effect's committed output.
        output: Payload,
    },
    /// Wait for the undo already running at `seq` (issued before a cancellation replaced the
    /// code that issued it).
    AwaitUndo {
        /// The registration.
        index: usize,
        /// The undo's command.
        seq: Seq,
    },
}

/// An undo that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoFailure {
    /// The effect that stays done.
    pub effect: String,
    /// The undo that failed.
    pub undo: String,
    /// Why.
    pub message: String,
}

/// How a run's failure message introduces an undo that failed after it.
pub const UNDO_FAILED: &str = "; compensation `";

impl std::fmt::Display for UndoFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            effect,
            undo,
            message,
        } = self;
        write!(f, "compensation `{undo}` of `{effect}` failed: {message}")
    }
}

/// `ctx.compensate()` ran every undo, and these did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct CompensationFailed(pub Vec<UndoFailure>);

impl From<CompensationFailed> for WorkflowError {
    fn from(failed: CompensationFailed) -> Self {
        WorkflowError::Failed(failed.to_string())
    }
}

impl Compensations {
    /// The code registered an undo for an effect it just issued.
    pub fn register(&mut self, registration: Registration) {
        self.registered.push(Compensation {
            registration,
            progress: Progress::Registered,
        });
    }

    /// The outcome of `seq` was delivered: if it is a registered effect, it now needs undoing
    /// (committed) or never will (failed for good: the operation log says it did not happen).
    /// Returns whether it was one, so that a compensating loop waiting for it is woken.
    pub fn delivered(&mut self, seq: Seq, resolution: &Resolution) -> bool {
        let mut registered = false;
        let waiting = self.registered.iter_mut().filter(|c| {
            c.registration.effect_seq == seq && matches!(c.progress, Progress::Registered)
        });
        for compensation in waiting {
            registered = true;
            compensation.progress = match resolution {
                Resolution::Completed(output) => Progress::Committed(output.clone()),
                _ => {
                    // The effect failed: it needs no undo, nor what would make its input.
                    compensation.registration.input = None;
                    Progress::Settled
                }
            };
        }
        if registered && !self.pending() {
            // Nothing left to undo: no loop holds an index into them.
            self.registered.clear();
        }
        registered
    }

    /// Whether anything registered may still need undoing.
    pub fn pending(&self) -> bool {
        self.registered
            .iter()
            .any(|c| !matches!(c.progress, Progress::Settled))
    }

    /// The next step of compensating, newest registration first.
    pub fn next_step(&mut self) -> Step {
        for (index, compensation) in self.registered.iter_mut().enumerate().rev() {
            let output = match &compensation.progress {
                Progress::Settled => continue,
                Progress::Registered => return Step::AwaitEffect,
                Progress::Undoing(seq) => return Step::AwaitUndo { index, seq: *seq },
                Progress::Committed(output) => output.clone(),
            };
            let registration = &mut compensation.registration;
            return Step::Issue {
                index,
                undo: registration.undo.clone(),
                options: registration.options.clone(),
                build: registration.input.take(),
                output,
            };
        }
        Step::Done
    }

    /// The undo of registration `index` runs as the command at `seq`.
    pub fn undoing(&mut self, index: usize, seq: Seq) {
        if let Some(compensation) = self.registered.get_mut(index) {
            compensation.progress = Progress::Undoing(seq);
        }
    }

    /// Registration `index` is settled; `failure` says why its undo did not succeed. Once all
    /// are, nothing of them is kept.
    pub fn settle(&mut self, index: usize, failure: Option<&Failure>) -> Option<UndoFailure> {
        let compensation = self.registered.get_mut(index)?;
        compensation.progress = Progress::Settled;
        let registration = &mut compensation.registration;
        registration.input = None;
        let failed = failure.map(|failure| UndoFailure {
            effect: registration.effect.clone(),
            undo: registration.undo.clone(),
            message: failure.message.clone(),
        });
        if !self.pending() {
            self.registered.clear();
        }
        failed
    }

    /// How many registrations are kept.
    pub fn footprint(&self) -> usize {
        self.registered.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::FailureKind;

    fn registration(effect_seq: Seq, undo: &str) -> Registration {
        let undo_input = format!("{undo}-input");
        Registration {
            effect_seq,
            effect: format!("effect-{effect_seq}"),
            undo: undo.to_owned(),
            options: ActivityOptions::default(),
            input: Some(Box::new(move |_| {
                Payload::encode(&undo_input).map_err(|e| e.to_string())
            })),
        }
    }

    fn committed() -> Resolution {
        Resolution::Completed(Payload::encode(&"ok").unwrap())
    }

    fn issued_undo(step: Step) -> (usize, String) {
        match step {
            Step::Issue {
                index, undo, build, ..
            } => {
                assert!(build.is_some(), "the undo's input is handed over once");
                (index, undo)
            }
            _ => panic!("expected an undo to issue"),
        }
    }

    #[test]
    fn undoes_committed_effects_newest_first_and_skips_failed_ones() {
        let mut compensations = Compensations::default();
        compensations.register(registration(1, "undo-a"));
        compensations.register(registration(2, "undo-b"));
        compensations.register(registration(3, "undo-c"));
        compensations.delivered(1, &committed());
        let refused = Failure::new(FailureKind::Terminal, "no");
        compensations.delivered(2, &Resolution::Failed(refused));
        compensations.delivered(3, &committed());

        let (index, undo) = issued_undo(compensations.next_step());
        assert_eq!((index, undo.as_str()), (2, "undo-c"));
        compensations.undoing(index, 10);
        assert!(matches!(
            compensations.next_step(),
            Step::AwaitUndo { index: 2, seq: 10 }
        ));
        assert_eq!(compensations.settle(index, None), None);

        let (index, undo) = issued_undo(compensations.next_step());
        assert_eq!((index, undo.as_str()), (0, "undo-a"));
        let failure = Failure::new(FailureKind::Terminal, "carrier down");
        let reported = compensations.settle(index, Some(&failure)).unwrap();
        assert_eq!(
            reported.to_string(),
            "compensation `undo-a` of `effect-1` failed: carrier down"
        );
        assert!(matches!(compensations.next_step(), Step::Done));
        assert!(!compensations.pending());
        assert_eq!(
            compensations.footprint(),
            0,
            "nothing is kept once all are settled"
        );
    }

    #[test]
    fn effects_that_all_failed_leave_nothing_to_keep() {
        let mut compensations = Compensations::default();
        compensations.register(registration(1, "undo-a"));
        let refused = Failure::new(FailureKind::Terminal, "no");
        compensations.delivered(1, &Resolution::Failed(refused));
        assert_eq!(compensations.footprint(), 0);
        assert!(matches!(compensations.next_step(), Step::Done));
    }

    #[test]
    fn waits_for_the_newest_effect_before_undoing_an_older_one() {
        let mut compensations = Compensations::default();
        compensations.register(registration(1, "undo-a"));
        compensations.register(registration(2, "undo-b"));
        compensations.delivered(1, &committed());
        assert!(matches!(compensations.next_step(), Step::AwaitEffect));
        compensations.delivered(2, &committed());
        assert_eq!(issued_undo(compensations.next_step()).1, "undo-b");
    }
}
