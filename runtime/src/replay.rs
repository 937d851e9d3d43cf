//! The replay cursor: seq allocation, identity comparison and divergence, free of I/O.
//!
//! The code issues commands; the cursor gives each the next seq and compares it with what the
//! journal recorded there: a recorded command is not executed again, a new one is, and one the
//! journal does not have at that seq stops the run as non-deterministic. It walks the recorded
//! entries into the commands' machines ([`crate::machines`]), which say what each entry
//! settles. Its failure state is sticky: after the first divergence every call reports the
//! same one.

use std::collections::VecDeque;
use std::fmt;

use crate::journal::{CommandIdentity, Entry, Payload, Seq, SeqMap};
use crate::machines::value::answered_when_issued;
use crate::machines::{Commands, Conflict, Resolution, Settled};

/// The code parts from the journal at a position.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Divergence {
    /// The position.
    pub seq: Seq,
    /// What the journal has there (`None`: nothing, the code issued a command the journal lacks).
    pub recorded: Option<CommandIdentity>,
    /// What the code issued there (`None`: nothing, the code skipped a recorded command).
    pub issued: Option<CommandIdentity>,
    /// How they part.
    pub mismatch: Mismatch,
}

/// How the code parts from the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mismatch {
    /// The code issued another command (or none) than the journal recorded.
    Command,
    /// The journal records that the code dropped its wait there (a `select!` it lost); the
    /// code still waits on it, and would wait forever.
    WaitKept,
}

/// Stable code of the non-determinism error, to search for in logs and docs.
pub const DIVERGENCE_CODE: &str = "WM0001";

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |c: &Option<CommandIdentity>| match c {
            Some(c) => c.to_string(),
            None => "nothing".to_owned(),
        };
        let seq = self.seq;
        match self.mismatch {
            Mismatch::Command => write!(
                f,
                "[{DIVERGENCE_CODE}] non-determinism at seq {seq}: the journal recorded {}, the \
                 workflow code issued {}.",
                show(&self.recorded),
                show(&self.issued)
            )?,
            Mismatch::WaitKept => write!(
                f,
                "[{DIVERGENCE_CODE}] non-determinism at seq {seq}: the journal recorded that the \
                 workflow code dropped its wait for {} here, the workflow code still waits.",
                show(&self.recorded)
            )?,
        }
        write!(
            f,
            " The workflow code changed in a way that is not replay-safe, or it reads the clock, \
             randomness or I/O directly. Guard the change with ctx.patched(\"change-id\") so old \
             journals keep their path, or let old runs finish on the old code."
        )
    }
}

impl std::error::Error for Divergence {}

/// Why the cursor cannot go on: the code no longer matches the journal, or the journal does
/// not add up (a number at the end of its range, found only in a corrupt or crafted journal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayFault {
    /// The code issued another command than the journal recorded.
    Diverged(Box<Divergence>),
    /// The journal cannot be followed at `seq`.
    Inconsistent {
        /// The command.
        seq: Seq,
        /// What is wrong.
        message: String,
    },
}

impl From<Box<Divergence>> for ReplayFault {
    fn from(divergence: Box<Divergence>) -> Self {
        ReplayFault::Diverged(divergence)
    }
}

/// Answer to a command the code issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issued {
    /// The journal has this command: do not execute it again. For a recorded value (`now`,
    /// `random`, …) the value is returned here.
    Recorded {
        /// The command's position.
        seq: Seq,
        /// The recorded value of a value command.
        value: Option<Payload>,
    },
    /// Not in the journal: the executor must record and execute it.
    New {
        /// The command's position.
        seq: Seq,
    },
}

/// What walking the journal produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayEvent {
    /// Deliver this to the command's future, then poll the workflow.
    Resolve {
        /// The command.
        seq: Seq,
        /// Its outcome.
        resolution: Resolution,
    },
    /// The journal records that the workflow ended, with this outcome.
    Ended(Result<Payload, crate::journal::Failure>),
    /// The run was cancelled here: the code is replaced by its undos, then poll.
    Cancelled(crate::journal::Failure),
}

/// Whether the cursor is still walking recorded history.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Replaying,
    Live,
    Diverged(Box<Divergence>),
}

/// The cursor over one workflow run: seq allocation, the recorded identities, divergence.
///
/// It walks the recorded history and hands each entry to the commands' machines
/// ([`Commands::apply`]); it keeps an identity only until the code issued the command again
/// (or, for a command whose outcome is delivered, until that outcome is), so what it holds
/// does not grow with the length of the history.
#[derive(Debug)]
pub struct ReplayCursor {
    /// Where the identities of commands not yet issued again, or issued and not yet delivered
    /// (a replayed step's span names them), are recorded.
    recorded: SeqMap<Recorded>,
    /// Whether the journal recorded any command at all.
    had_commands: bool,
    unwalked: VecDeque<Entry>,
    /// How many entries were walked: the position, among the entries the cursor was given
    /// (those after `WorkflowStarted`), of the first unwalked one.
    walked: usize,
    next_seq: Seq,
    phase: Phase,
}

/// Where a command's recorded identity is. It is read in its entry while that is unwalked, and
/// taken from the entry when it is walked, so a replay copies no identity: a command is always
/// issued before its entry is walked, and kept after only until its outcome is delivered.
#[derive(Debug)]
enum Recorded {
    /// In the unwalked entry at this position among the cursor's entries.
    Unwalked(usize),
    /// Taken from its walked entry.
    Walked(CommandIdentity),
}

impl ReplayCursor {
    /// A cursor over a journal's entries after `WorkflowStarted`.
    pub fn new(entries: impl IntoIterator<Item = Entry>) -> Self {
        let unwalked: VecDeque<Entry> = entries.into_iter().collect();
        let recorded: SeqMap<Recorded> = unwalked
            .iter()
            .enumerate()
            .filter_map(|(position, entry)| {
                Some((entry.command()?.0, Recorded::Unwalked(position)))
            })
            .collect();
        let phase = if unwalked.is_empty() {
            Phase::Live
        } else {
            Phase::Replaying
        };
        Self {
            had_commands: !recorded.is_empty(),
            recorded,
            unwalked,
            walked: 0,
            next_seq: 0,
            phase,
        }
    }

    /// What the journal recorded at `seq`: what a replayed step's span shows. Known until the
    /// step is delivered.
    pub fn recorded_identity(&self, seq: Seq) -> Option<&CommandIdentity> {
        self.recorded_entry(seq).map(|(identity, _)| identity)
    }

    /// The identity recorded at `seq`, and the value if it is a recorded value's entry (unwalked:
    /// a value command is answered when issued, which is before its entry is walked).
    fn recorded_entry(&self, seq: Seq) -> Option<(&CommandIdentity, Option<&Payload>)> {
        match self.recorded.get(&seq)? {
            Recorded::Walked(identity) => Some((identity, None)),
            Recorded::Unwalked(position) => {
                // A position already walked is an entry a divergence stopped the walk at.
                let entry = self.unwalked.get(position.checked_sub(self.walked)?)?;
                let value = match entry {
                    Entry::ValueRecorded { value, .. } => Some(value),
                    _ => None,
                };
                Some((entry.command()?.1, value))
            }
        }
    }

    /// Whether the journal this cursor replays recorded any command (a run that got past its
    /// start).
    pub fn had_commands(&self) -> bool {
        self.had_commands
    }

    /// The outcome of `seq` was delivered, or the code dropped its wait: its identity is not
    /// needed any more.
    pub fn forget(&mut self, seq: Seq) {
        self.recorded.remove(&seq);
    }

    /// The code issued `identity`: takes the next seq and compares it with the journal. Read
    /// in place: only a divergence keeps a copy.
    pub fn issue(&mut self, identity: &CommandIdentity) -> Result<Issued, Box<Divergence>> {
        self.check_not_diverged()?;
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some((recorded, value)) = self.recorded_entry(seq) else {
            return Ok(Issued::New { seq });
        };
        if recorded != identity {
            let recorded = Some(recorded.clone());
            return Err(self.diverge(seq, recorded, Some(identity.clone())));
        }
        let value = value.cloned();
        if answered_when_issued(identity.kind) {
            // Nothing is delivered for it: its identity is not needed after this.
            self.recorded.remove(&seq);
        }
        Ok(Issued::Recorded { seq, value })
    }

    /// `ctx.patched(id)`: `None` while replaying a journal written before the patch existed (the
    /// old path: no seq is taken, so old journals keep lining up); otherwise the marker command,
    /// recorded or new, and the code takes the new path.
    pub fn patched(
        &mut self,
        identity: &CommandIdentity,
    ) -> Result<Option<Issued>, Box<Divergence>> {
        self.check_not_diverged()?;
        match self.recorded_identity(self.next_seq) {
            Some(recorded) if recorded == identity => self.issue(identity).map(Some),
            Some(_) => Ok(None),
            None if self.phase == Phase::Replaying => Ok(None),
            None => self.issue(identity).map(Some),
        }
    }

    /// Walks the journal to the next thing to deliver, applying each entry to `commands`.
    /// `Ok(None)`: history is exhausted and the run is live from here.
    pub fn next_replay_event(
        &mut self,
        commands: &mut Commands,
    ) -> Result<Option<ReplayEvent>, ReplayFault> {
        self.check_not_diverged()?;
        while let Some(entry) = self.unwalked.pop_front() {
            let position = self.walked;
            self.walked += 1;
            if self.unwalked.is_empty() {
                self.phase = Phase::Live;
            }
            if let Some(event) = self.walk(position, entry, commands)? {
                return Ok(Some(event));
            }
        }
        self.phase = Phase::Live;
        Ok(None)
    }

    fn walk(
        &mut self,
        position: usize,
        entry: Entry,
        commands: &mut Commands,
    ) -> Result<Option<ReplayEvent>, ReplayFault> {
        if let Some((seq, identity)) = entry.command() {
            if seq >= self.next_seq {
                // By the time live execution journaled this command, the code had issued it.
                return Err(self.diverge(seq, Some(identity.clone()), None).into());
            }
        }
        match entry {
            Entry::WorkflowCompleted { output } => return Ok(Some(ReplayEvent::Ended(Ok(output)))),
            Entry::WorkflowFailed { failure } => return Ok(Some(ReplayEvent::Ended(Err(failure)))),
            Entry::CancelRequested { failure } => return Ok(Some(ReplayEvent::Cancelled(failure))),
            _ => {}
        }
        let applied = commands.apply(&entry);
        self.keep_walked_identity(position, entry);
        match applied {
            Ok(settled) => {
                Ok(settled
                    .map(|Settled { seq, resolution }| ReplayEvent::Resolve { seq, resolution }))
            }
            Err(Conflict::WaitKept { seq }) => {
                let recorded = self.recorded_identity(seq).cloned();
                Err(self
                    .diverge_as(Mismatch::WaitKept, seq, recorded, None)
                    .into())
            }
            Err(Conflict::Inconsistent { seq, message }) => {
                Err(ReplayFault::Inconsistent { seq, message })
            }
        }
    }

    /// Takes the identity out of `entry`, walked from `position`, if it is still needed (its
    /// outcome is not delivered yet): the entry is about to go.
    fn keep_walked_identity(&mut self, position: usize, entry: Entry) {
        let Some(seq) = entry.command().map(|(seq, _)| seq) else {
            return;
        };
        let Some(recorded) = self.recorded.get_mut(&seq) else {
            return;
        };
        // A crafted journal can record one seq twice: the position says which entry is meant.
        if matches!(recorded, Recorded::Unwalked(at) if *at == position) {
            if let Some(identity) = entry.into_identity() {
                *recorded = Recorded::Walked(identity);
            }
        }
    }

    /// How many commands the code has issued: the seq the next one will take.
    pub fn issued(&self) -> Seq {
        self.next_seq
    }

    /// Whether recorded history is still being walked.
    pub fn is_replaying(&self) -> bool {
        self.phase == Phase::Replaying
    }

    /// The first divergence, if any.
    pub fn divergence(&self) -> Option<&Divergence> {
        match &self.phase {
            Phase::Diverged(d) => Some(d),
            _ => None,
        }
    }

    /// How many commands' recorded identities are kept, in their entries or taken from them.
    pub fn footprint(&self) -> usize {
        self.recorded.len()
    }

    fn check_not_diverged(&self) -> Result<(), Box<Divergence>> {
        match &self.phase {
            Phase::Diverged(d) => Err(d.clone()),
            _ => Ok(()),
        }
    }

    fn diverge(
        &mut self,
        seq: Seq,
        recorded: Option<CommandIdentity>,
        issued: Option<CommandIdentity>,
    ) -> Box<Divergence> {
        self.diverge_as(Mismatch::Command, seq, recorded, issued)
    }

    fn diverge_as(
        &mut self,
        mismatch: Mismatch,
        seq: Seq,
        recorded: Option<CommandIdentity>,
        issued: Option<CommandIdentity>,
    ) -> Box<Divergence> {
        let divergence = Box::new(Divergence {
            seq,
            recorded,
            issued,
            mismatch,
        });
        self.phase = Phase::Diverged(divergence.clone());
        divergence
    }
}

#[cfg(test)]
mod tests;
