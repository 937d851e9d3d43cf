//! A workflow's durable stream: what a reader (a UI, an SSE client) sees while the workflow runs.
//!
//! Events are numbered per workflow from 1, in the order the store wrote them, so a reader that
//! reconnects asks for the events after the last number it saw. A streamed step's chunks carry
//! a `response_version`: every attempt that starts streaming takes a new one, and an attempt that
//! ends without its result being journaled (a failure, a crash) has its version `Superseded`.
//! The version whose result was journaled is marked `Committed` in the same write as the
//! journal entry (for an answer validators judge, the write of the verdict that accepts it; a
//! rejecting verdict supersedes it), so a reader that keeps only committed (or still live)
//! versions shows exactly the response the workflow goes on with.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::attempt_cell::AttemptCell;
use crate::journal::Seq;

/// One event of a workflow's stream. Append-only: postcard encodes variant positions.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum StreamItem {
    /// Generated text of step `step`, from the attempt that took `response_version`.
    Chunk {
        /// The command that streams.
        step: Seq,
        /// Which attempt's generation this is.
        response_version: u32,
        /// The text.
        text: String,
    },
    /// That version's result was not journaled: readers drop its chunks.
    Superseded {
        /// The command.
        step: Seq,
        /// The abandoned version.
        response_version: u32,
        /// Why.
        reason: String,
    },
    /// That version is the journaled response of the step.
    Committed {
        /// The command.
        step: Seq,
        /// The committed version.
        response_version: u32,
    },
    /// A milestone readers show (`approval_required`, `retrieval_complete`, …).
    Progress {
        /// The command it concerns.
        step: Seq,
        /// The milestone.
        name: String,
        /// Its details.
        detail: crate::journal::Payload,
    },
}

impl crate::journal::Record for StreamItem {}

impl StreamItem {
    /// The command the event belongs to.
    pub fn step(&self) -> Seq {
        match self {
            StreamItem::Chunk { step, .. }
            | StreamItem::Superseded { step, .. }
            | StreamItem::Committed { step, .. }
            | StreamItem::Progress { step, .. } => *step,
        }
    }

    /// Whether the event is part of a streamed generation (not a progress event).
    pub fn is_generation(&self) -> bool {
        !matches!(self, StreamItem::Progress { .. })
    }

    /// The response version the event belongs to (0 for progress events).
    pub fn response_version(&self) -> u32 {
        match self {
            StreamItem::Progress { .. } => 0,
            StreamItem::Chunk {
                response_version, ..
            }
            | StreamItem::Superseded {
                response_version, ..
            }
            | StreamItem::Committed {
                response_version, ..
            } => *response_version,
        }
    }
}

/// A stream event with its number.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StreamEvent {
    /// 1-based, per workflow, gap-free, in write order.
    pub seq: u64,
    /// What happened.
    pub item: StreamItem,
}

/// The newest version of `step` that streamed and is neither committed nor superseded: the
/// answer still waiting for its validators' verdict.
pub fn unsettled_version(events: &[StreamEvent], step: Seq) -> Option<u32> {
    let of_step = events.iter().filter(|e| e.item.step() == step);
    let mut unsettled: Vec<u32> = Vec::new();
    for event in of_step {
        match event.item {
            StreamItem::Chunk {
                response_version, ..
            } if !unsettled.contains(&response_version) => unsettled.push(response_version),
            StreamItem::Superseded {
                response_version, ..
            }
            | StreamItem::Committed {
                response_version, ..
            } => unsettled.retain(|v| *v != response_version),
            _ => {}
        }
    }
    unsettled.last().copied()
}

/// The text a reader shows for `step`: the chunks of its committed version, or, before the
/// commit, of its newest version that was not superseded.
pub fn visible_text(events: &[StreamEvent], step: Seq) -> String {
    let of_step = || {
        let generation = events.iter().filter(|e| e.item.is_generation());
        generation.filter(move |e| e.item.step() == step)
    };
    let committed = of_step().find_map(|e| match e.item {
        StreamItem::Committed {
            response_version, ..
        } => Some(response_version),
        _ => None,
    });
    let superseded = |version: u32| {
        of_step().any(|e| {
            matches!(e.item, StreamItem::Superseded { response_version, .. }
                if response_version == version)
        })
    };
    let live = || {
        of_step()
            .map(|e| e.item.response_version())
            .filter(|v| !superseded(*v))
            .max()
    };
    let Some(version) = committed.or_else(live) else {
        return String::new();
    };
    let chunks = of_step().filter_map(|e| match &e.item {
        StreamItem::Chunk {
            response_version,
            text,
            ..
        } if *response_version == version => Some(text.as_str()),
        _ => None,
    });
    chunks.collect()
}

/// A short, stable summary of a stream for snapshots: per streamed step its versions (chunk
/// count, superseded or committed) and the text a reader keeps, then the progress events.
pub fn summarize_stream(events: &[StreamEvent]) -> String {
    let mut steps: Vec<Seq> = events
        .iter()
        .filter(|e| e.item.is_generation())
        .map(|e| e.item.step())
        .collect();
    steps.sort_unstable();
    steps.dedup();
    let mut out = String::new();
    for step in steps {
        out.push_str(&format!("step {step}:"));
        let of_step: Vec<&StreamItem> = events
            .iter()
            .map(|e| &e.item)
            .filter(|i| i.is_generation() && i.step() == step)
            .collect();
        let mut versions: Vec<u32> = of_step.iter().map(|i| i.response_version()).collect();
        versions.sort_unstable();
        versions.dedup();
        for version in versions {
            let of_version = || {
                of_step
                    .iter()
                    .filter(move |i| i.response_version() == version)
            };
            let chunks = of_version()
                .filter(|i| matches!(i, StreamItem::Chunk { .. }))
                .count();
            let fate = match of_version().find(|i| !matches!(i, StreamItem::Chunk { .. })) {
                Some(StreamItem::Committed { .. }) => "committed",
                Some(StreamItem::Superseded { .. }) => "superseded",
                _ => "open",
            };
            out.push_str(&format!(" v{version} {fate} ({chunks} chunks);"));
        }
        out.push_str(&format!(" shown {:?}\n", visible_text(events, step)));
    }
    for event in events {
        if let StreamItem::Progress { step, name, .. } = &event.item {
            out.push_str(&format!("progress {name} step={step}\n"));
        }
    }
    out
}

/// The stream in a stable text form, one event per line, for snapshots.
pub fn render_stream(events: &[StreamEvent]) -> String {
    let mut out = String::new();
    for event in events {
        let line = match &event.item {
            StreamItem::Chunk {
                step,
                response_version,
                text,
            } => format!("chunk      step={step} v{response_version} {text:?}"),
            StreamItem::Superseded {
                step,
                response_version,
                reason,
            } => format!("superseded step={step} v{response_version} {reason:?}"),
            StreamItem::Committed {
                step,
                response_version,
            } => format!("committed  step={step} v{response_version}"),
            StreamItem::Progress { step, name, detail } => {
                let detail = String::from_utf8_lossy(detail.as_bytes()).into_owned();
                format!("progress   step={step} {name} {detail}")
            }
        };
        out.push_str(&format!("{:>3} {line}\n", event.seq));
    }
    out
}

/// The response version of one attempt's generation. Empty until the store writes the
/// attempt's first chunk: the version is fixed there, on the writer thread, one above any the
/// step had, so an attempt never reads the stream to find it.
#[derive(Clone, Default, Debug)]
pub struct VersionSlot(Arc<AttemptCell>);

impl VersionSlot {
    pub(crate) fn of(cell: &Arc<AttemptCell>) -> Self {
        Self(cell.clone())
    }

    /// The version, once the first chunk was written.
    pub fn get(&self) -> Option<u32> {
        self.0.version.get().copied()
    }

    /// Fixes the version (the store does, when it writes the first chunk).
    pub fn claim(&self, version: u32) {
        let _ = self.0.version.set(version);
    }
}

/// What the store knows of one streamed step's response versions: the newest, and those that
/// have chunks but neither a `Superseded` nor a `Committed` marker. Append-only (postcard).
#[derive(Clone, Default, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct StepVersions {
    /// The highest version the step streamed under (0: none yet).
    pub newest: u32,
    /// Versions not closed by a marker, oldest first.
    pub open: Vec<u32>,
}

impl crate::journal::Record for StepVersions {}

impl StepVersions {
    /// Follows one generation event of the step; `true` if that changed anything.
    pub fn track(&mut self, item: &StreamItem) -> bool {
        let version = item.response_version();
        match item {
            StreamItem::Chunk { .. } if version > self.newest => {
                self.newest = version;
                self.open.push(version);
                true
            }
            StreamItem::Superseded { .. } | StreamItem::Committed { .. } => {
                let before = (self.newest, self.open.len());
                self.open.retain(|open| *open != version);
                self.newest = self.newest.max(version);
                before != (self.newest, self.open.len())
            }
            StreamItem::Chunk { .. } | StreamItem::Progress { .. } => false,
        }
    }
}

/// Where a step's chunks are written: the store, as the stream sees it.
pub trait ChunkWriter: Send + Sync + 'static {
    /// Queues one chunk of step `step`'s generation, in order with every other write of the
    /// workflow. The first chunk written for `version` fixes it: one above every response
    /// version the step had, after `Superseded` markers for the step's versions still open. A
    /// write that fails poisons the store, so the step's own write fails too; a chunk the store
    /// refuses while staging it (a corrupt index row) is dropped alone, since the journaled
    /// response, not the stream, is the step's result.
    fn append_chunk(&self, workflow_id: &str, step: Seq, version: VersionSlot, text: String);
}

/// Where one attempt of one step writes its chunks. The version is taken on the first chunk,
/// so an attempt that streams nothing leaves no trace.
#[derive(Clone)]
pub struct StepStream {
    writer: Arc<dyn ChunkWriter>,
    workflow_id: Arc<str>,
    step: Seq,
    version: VersionSlot,
}

impl std::fmt::Debug for StepStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepStream")
            .field("workflow_id", &self.workflow_id)
            .field("step", &self.step)
            .field("version", &self.version.get())
            .finish()
    }
}

impl StepStream {
    /// `version`: the attempt's slot, in its [`AttemptCell`].
    pub(crate) fn new(
        writer: Arc<dyn ChunkWriter>,
        workflow_id: Arc<str>,
        step: Seq,
        version: VersionSlot,
    ) -> Self {
        Self {
            writer,
            workflow_id,
            step,
            version,
        }
    }

    /// Appends a chunk, without waiting for it: the store's writer keeps submission order,
    /// which is all a chunk needs, and syncs it before any reader can see it.
    pub fn chunk(&self, text: &str) {
        let sent = &self.version.0.sent;
        sent.store(true, std::sync::atomic::Ordering::Release);
        let version = self.version.clone();
        let (workflow_id, step) = (&self.workflow_id, self.step);
        self.writer
            .append_chunk(workflow_id, step, version, text.to_owned());
    }

    /// Whether the attempt wrote any chunk.
    pub fn streamed(&self) -> bool {
        let sent = &self.version.0.sent;
        sent.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Where the attempt's version is fixed: read it once every chunk was written (after
    /// any later write of the same workflow was acknowledged).
    pub fn version_slot(&self) -> VersionSlot {
        self.version.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(items: Vec<StreamItem>) -> Vec<StreamEvent> {
        let numbers = 1..;
        numbers
            .zip(items)
            .map(|(seq, item)| StreamEvent { seq, item })
            .collect()
    }

    fn chunk(step: Seq, response_version: u32, text: &str) -> StreamItem {
        let text = text.to_owned();
        StreamItem::Chunk {
            step,
            response_version,
            text,
        }
    }

    #[test]
    fn readers_see_the_committed_version_or_the_newest_live_one() {
        let superseded = StreamItem::Superseded {
            step: 0,
            response_version: 1,
            reason: "timeout".into(),
        };
        let mut items = vec![
            chunk(0, 1, "Half"),
            superseded,
            chunk(0, 2, "Whole"),
            chunk(1, 1, "Other step"),
        ];
        assert_eq!(visible_text(&numbered(items.clone()), 0), "Whole");
        items.push(chunk(0, 3, "Retry in flight"));
        let committed = StreamItem::Committed {
            step: 0,
            response_version: 2,
        };
        items.push(committed);
        assert_eq!(visible_text(&numbered(items.clone()), 0), "Whole");
        assert_eq!(visible_text(&numbered(items), 1), "Other step");
        assert_eq!(visible_text(&[], 0), "");
    }
}
