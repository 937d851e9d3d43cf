//! Replays workflow code against an exported journal, without a store or a worker: the check to
//! run in CI before deploying changed workflow code. It reports the first divergence (the seq,
//! the recorded command and the one the code issued), a recorded end the code does not reach,
//! or an output the code no longer produces.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::clock::ManualClock;
use crate::context::WorkflowCore;
use crate::error::RunError;
use crate::journal::{read_framed, DecodeError, Entry, Failure, Payload};
use crate::registry::Registry;
use crate::replay::{Divergence, ReplayCursor, ReplayEvent, ReplayFault, Resolution};

type Body = futures::future::BoxFuture<'static, Result<Payload, Failure>>;

/// What a successful replay went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayReport {
    /// The workflow the journal belongs to.
    pub workflow: String,
    /// Journal entries replayed.
    pub entries: usize,
    /// Whether the journal records the workflow's end (and the code reached the same one).
    pub ended: bool,
}

/// Why the code does not replay its journal.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReplayError {
    /// The journal file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
    /// The bytes are not an exported journal.
    #[error("record {index} of the journal does not decode: {source}")]
    Decode {
        /// Which record.
        index: usize,
        /// Why.
        source: DecodeError,
    },
    /// The journal does not begin with `workflow_started`.
    #[error("the journal does not begin with workflow_started")]
    NotAJournal,
    /// The journal's workflow (or an activity it calls) is not registered with the replayer.
    #[error("`{0}` is not registered with the replayer")]
    NotRegistered(String),
    /// The code issued a different command than the journal recorded.
    #[error("{0}")]
    Diverged(Box<Divergence>),
    /// The journal records the end, but the code had not returned by then.
    #[error("the journal records the workflow's end, but the code had not returned: it waits for a command the journal does not have")]
    EndNotReached,
    /// The code returns something else than the journal recorded.
    #[error("the code returns {replayed}, the journal recorded {recorded}")]
    OutputDiffers {
        /// The recorded end.
        recorded: String,
        /// What the code returned.
        replayed: String,
    },
    /// The journal needs something a bare journal cannot give (a retrieval snapshot's content).
    #[error("{0}")]
    Unsupported(String),
    /// The run stopped for another reason (a recorded value that no longer decodes, a panic).
    #[error("{0}")]
    Stopped(RunError),
}

/// Replays journals against the workflows and activities in `registry`.
pub struct Replayer {
    registry: Arc<Registry>,
}

impl Replayer {
    /// A replayer over what `registry` holds.
    pub fn new(registry: Registry) -> Self {
        let registry = Arc::new(registry);
        Self { registry }
    }

    /// Replays an export (`waymark export`, `GET /workflows/{id}/journal?format=binary`).
    pub fn replay_bytes(&self, export: &[u8]) -> Result<ReplayReport, ReplayError> {
        let entries =
            read_framed(export).map_err(|(index, source)| ReplayError::Decode { index, source })?;
        self.replay(entries)
    }

    /// Replays `entries`, the whole journal of one workflow.
    pub fn replay(&self, entries: Vec<Entry>) -> Result<ReplayReport, ReplayError> {
        let count = entries.len();
        let mut entries = entries.into_iter();
        let Some(Entry::WorkflowStarted(started)) = entries.next() else {
            return Err(ReplayError::NotAJournal);
        };
        let name = started.workflow_name.clone();
        let workflow = self.registry.workflow(&name);
        let workflow = workflow.ok_or_else(|| ReplayError::NotRegistered(name.clone()))?;
        let clock = Arc::new(ManualClock::new(started.started_at_ms));
        let core = WorkflowCore::new(
            "replay",
            ReplayCursor::new(entries),
            clock,
            // A replay records nothing: a draw is for code past the journal's end.
            Arc::new(crate::entropy::OsEntropy),
            self.registry.clone(),
            crate::telemetry::Telemetry::new(),
        );
        let body = (workflow.run)(core.clone(), started.input).map_err(stopped)?;
        let mut run = Run {
            core,
            body: Some(body),
        };
        let ended = run.walk_to_end()?;
        Ok(ReplayReport {
            workflow: name,
            entries: count,
            ended,
        })
    }
}

struct Run {
    core: WorkflowCore,
    /// `None` once the code returned.
    body: Option<Body>,
}

impl Run {
    /// Walks the journal, delivering what it recorded; `true` if it records the end.
    fn walk_to_end(&mut self) -> Result<bool, ReplayError> {
        let mut output = self.poll()?;
        loop {
            let event = self.core.lock().cursor.next_replay_event();
            let event = event.map_err(|fault| match fault {
                ReplayFault::Diverged(divergence) => ReplayError::Diverged(divergence),
                inconsistent => stopped(inconsistent.into()),
            });
            match event? {
                Some(ReplayEvent::Resolve { seq, resolution }) => {
                    if let Resolution::Snapshot(hash) = resolution {
                        return Err(ReplayError::Unsupported(format!(
                            "seq {seq} delivers retrieval snapshot {}, whose content is in the \
                             worker's artifacts, not in the journal",
                            hash.hex()
                        )));
                    }
                    self.core.deliver(seq, resolution).map_err(stopped)?;
                    output = output.or(self.poll()?);
                }
                Some(ReplayEvent::Ended(entry)) => return compare(&entry, output).map(|()| true),
                None => return Ok(false),
            }
        }
    }

    fn poll(&mut self) -> Result<Option<Result<Payload, Failure>>, ReplayError> {
        // An outcome journaled after the code returned is taken like any other, one per poll,
        // though nothing is left to see it.
        self.core.begin_poll();
        let Some(body) = self.body.as_mut() else {
            return Ok(None);
        };
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let polled = std::panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(&mut cx)));
        let polled =
            polled.map_err(|_| stopped(RunError::Panicked("the workflow panicked".into())))?;
        if let Some(stop) = self.core.take_stop() {
            return Err(match stop {
                RunError::NonDeterminism(divergence) => ReplayError::Diverged(divergence),
                RunError::UnknownActivity(name) => ReplayError::NotRegistered(name),
                other => stopped(other),
            });
        }
        Ok(match polled {
            Poll::Ready(output) => {
                self.body = None;
                Some(output)
            }
            Poll::Pending => None,
        })
    }
}

fn compare(end: &Entry, output: Option<Result<Payload, Failure>>) -> Result<(), ReplayError> {
    // A cancellation ends the run from outside, wherever the code was.
    if let Entry::WorkflowFailed { failure } = end {
        if failure.kind == crate::journal::FailureKind::Cancelled {
            return Ok(());
        }
    }
    let Some(output) = output else {
        return Err(ReplayError::EndNotReached);
    };
    let show = |o: &Result<Payload, Failure>| match o {
        Ok(payload) => format!("Ok({})", String::from_utf8_lossy(payload.as_bytes())),
        Err(failure) => format!("Err({})", failure.message),
    };
    let recorded = match end {
        Entry::WorkflowCompleted { output } => Ok(output.clone()),
        Entry::WorkflowFailed { failure } => Err(failure.clone()),
        _ => return Err(ReplayError::NotAJournal),
    };
    let same = match (&recorded, &output) {
        (Ok(a), Ok(b)) => a == b,
        (Err(a), Err(b)) => a.message == b.message,
        _ => false,
    };
    match same {
        true => Ok(()),
        false => Err(ReplayError::OutputDiffers {
            recorded: show(&recorded),
            replayed: show(&output),
        }),
    }
}

fn stopped(error: RunError) -> ReplayError {
    ReplayError::Stopped(error)
}
