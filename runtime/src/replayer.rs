//! Replays workflow code against an exported journal, without a store or a worker: the check to
//! run in CI before deploying changed workflow code. It reports the first divergence (the seq,
//! the recorded command and the one the code issued), a recorded end the code does not reach,
//! or an output the code no longer produces.

use std::sync::Arc;

use crate::clock::ManualClock;
use crate::context::WorkflowCore;
use crate::error::RunError;
use crate::export::Export;
use crate::journal::{DecodeError, Entry};
use crate::machines::Resolution;
use crate::registry::Registry;
use crate::replay::{Divergence, ReplayCursor};
use crate::run::{Body, Output, Replayed};

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
        let entries = Export::read(export, None)
            .map_err(|(index, source)| ReplayError::Decode { index, source })?
            .entries;
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
        // The rest goes to the cursor as it is, where collecting it would shift every entry.
        let core = WorkflowCore::new(
            "replay",
            crate::lineage::Lineage::of(entries.as_slice()),
            ReplayCursor::new(entries),
            clock,
            // A replay records nothing: a draw is for code past the journal's end.
            Arc::new(crate::entropy::OsEntropy),
            self.registry.clone(),
            replay_telemetry(),
        );
        let future = (workflow.run)(core.clone(), started.input).map_err(stopped)?;
        let mut body = Body::new(core, future);
        let replayed = body.replay(|seq, resolution| match resolution {
            Resolution::Snapshot(hash) => Err(ReplayError::Unsupported(format!(
                "seq {seq} delivers retrieval snapshot {}, whose content is in the worker's \
                 artifacts, not in the journal",
                hash.hex()
            ))),
            resolution => Ok(resolution),
        })?;
        let ended = match replayed {
            Replayed::Ended { recorded, returned } => {
                compare(recorded, returned)?;
                true
            }
            Replayed::Live(_) => false,
        };
        Ok(ReplayReport {
            workflow: name,
            entries: count,
            ended,
        })
    }
}

impl From<RunError> for ReplayError {
    fn from(error: RunError) -> Self {
        match error {
            RunError::NonDeterminism(divergence) => ReplayError::Diverged(divergence),
            RunError::UnknownActivity(name) => ReplayError::NotRegistered(name),
            other => ReplayError::Stopped(other),
        }
    }
}

fn compare(recorded: Output, output: Option<Output>) -> Result<(), ReplayError> {
    // A cancellation ends the run from outside, wherever the code was.
    if let Err(failure) = &recorded {
        if failure.kind == crate::journal::FailureKind::Cancelled {
            return Ok(());
        }
    }
    let Some(output) = output else {
        return Err(ReplayError::EndNotReached);
    };
    let show = |o: &Output| match o {
        Ok(payload) => format!("Ok({})", String::from_utf8_lossy(payload.as_bytes())),
        Err(failure) => format!("Err({})", failure.message),
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

/// The figures every replay shares: a replay records nothing, and each new set would start a
/// thread to build its recorder.
fn replay_telemetry() -> crate::telemetry::Telemetry {
    static SHARED: std::sync::OnceLock<crate::telemetry::Telemetry> = std::sync::OnceLock::new();
    SHARED.get_or_init(crate::telemetry::Telemetry::new).clone()
}
