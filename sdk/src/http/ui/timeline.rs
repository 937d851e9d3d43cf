//! What the workflow and approval pages show, read from the worker: the journal grouped into
//! steps (one per command, with its attempts and what failed them), the operation log, the
//! artifacts, the approvals and the stream's response versions.

use std::collections::{BTreeMap, HashSet};

use waymark_runtime::artifacts::ArtifactRecord;
use waymark_runtime::journal::{ApprovalDecision, Entry, Reconciliation, Seq};
use waymark_runtime::namespace;
use waymark_runtime::operations::OperationRecord;
use waymark_runtime::render::render_journal_from;
use waymark_runtime::store::{committed_artifacts, StoreError, WorkflowRecord};
use waymark_runtime::streams::StreamItem;

use crate::worker::PendingRequest;
use crate::Worker;

/// One command of the workflow code and everything the journal says about it.
pub(crate) struct Step {
    pub(crate) seq: Seq,
    /// `activity`, `timer`, `signal`, `approval`, …
    pub(crate) kind: String,
    pub(crate) name: String,
    /// Attempts made (for activities and effects).
    pub(crate) attempts: u32,
    /// Why attempts failed or ended without an outcome, oldest first.
    pub(crate) causes: Vec<String>,
    /// How it ended, or `waiting`.
    pub(crate) outcome: String,
    /// The journal's entries for it: index and rendered line.
    pub(crate) entries: Vec<(u64, String)>,
    /// How the run got its outcome: `executed`, or replayed from the run it was forked or
    /// reset from, or an effect's record inherited or imported from another workflow.
    pub(crate) origin: String,
    /// When it was issued, worker clock: an activity's or effect's scheduling time, a
    /// timer's start.
    pub(crate) issued_at_ms: Option<u64>,
    /// When it ended, worker clock: the time its end was journaled with, an approval's
    /// decision.
    pub(crate) ended_at_ms: Option<u64>,
    /// A timer's due time: its end once it fired, for a journal that does not say when it
    /// fired.
    pub(crate) fires_at_ms: Option<u64>,
    /// How long it took: from issue to end (a fired timer: its duration); for an effect
    /// whose outcome a reconciliation settled (or a journal from before ends carried their
    /// time), from its first prepared attempt to its outcome in its operation record.
    pub(crate) took_ms: Option<u64>,
}

/// One response version of a streamed step.
pub(crate) struct Version {
    pub(crate) step: u32,
    pub(crate) version: u32,
    pub(crate) text: String,
    pub(crate) superseded: bool,
    pub(crate) committed: bool,
}

/// A progress event: its number, name and detail.
pub(crate) type Progress = (u64, String, String);

/// Everything the workflow page shows.
pub(crate) struct View {
    pub(crate) record: WorkflowRecord,
    pub(crate) steps: Vec<Step>,
    /// Entries that belong to no command (start, end, fork, cancel), rendered.
    pub(crate) others: Vec<(u64, String)>,
    pub(crate) pending: Vec<PendingRequest>,
    pub(crate) operations: Vec<(String, OperationRecord)>,
    /// Artifacts the journal committed: hash and kind.
    pub(crate) artifacts: Vec<(String, String)>,
    pub(crate) versions: Vec<Version>,
    pub(crate) progress: Vec<Progress>,
}

impl View {
    /// The workflow `id` (stored form); `None` if there is no such workflow.
    pub(crate) fn read(worker: &Worker, id: &str) -> Result<Option<Self>, StoreError> {
        let Some(record) = worker.runtime().workflow(id)? else {
            return Ok(None);
        };
        let journal = worker.journal(id)?;
        let (mut steps, others) = steps(&journal);
        let (namespace, _) = namespace::split(id);
        let mut artifacts = Vec::new();
        for hash in committed_artifacts(&journal) {
            let hex = hash.hex();
            let kind = worker.artifact_in(namespace, &hex)?.map(|a| a.kind);
            artifacts.push((hex, kind.unwrap_or_else(|| "(deleted)".to_owned())));
        }
        let operations: Vec<(String, OperationRecord)> = worker
            .operations(id)?
            .into_iter()
            .map(|(key, record)| (namespace::split(&key).1.to_owned(), record))
            .collect();
        mark_origins(&mut steps, &journal, &operations);
        let (versions, progress) = stream(worker, id)?;
        Ok(Some(Self {
            record,
            steps,
            others,
            pending: worker.pending_approvals(id)?,
            operations,
            artifacts,
            versions,
            progress,
        }))
    }
}

/// The journal as steps, in the order the code issued them, and the entries of no step.
fn steps(journal: &[Entry]) -> (Vec<Step>, Vec<(u64, String)>) {
    let mut steps: BTreeMap<Seq, Step> = BTreeMap::new();
    let mut others = Vec::new();
    for (index, entry) in (0u64..).zip(journal) {
        let line = rendered(entry, index);
        if let Some((seq, identity)) = entry.command() {
            let kind = format!("{:?}", identity.kind).to_lowercase();
            // A recorded value or an artifact is whole in its one entry.
            let recorded = matches!(
                entry,
                Entry::ValueRecorded { .. } | Entry::ArtifactCommitted { .. }
            );
            let outcome = if recorded { "recorded" } else { "waiting" };
            steps.insert(
                seq,
                Step {
                    seq,
                    kind,
                    name: identity.name.clone(),
                    attempts: 0,
                    causes: Vec::new(),
                    outcome: outcome.to_owned(),
                    entries: vec![(index, line)],
                    origin: "executed".to_owned(),
                    issued_at_ms: issued_at(entry),
                    ended_at_ms: None,
                    fires_at_ms: match entry {
                        Entry::TimerStarted { fire_at_ms, .. } => Some(*fire_at_ms),
                        _ => None,
                    },
                    took_ms: None,
                },
            );
            continue;
        }
        match outcome_of(entry).and_then(|(seq, _)| steps.get_mut(&seq)) {
            Some(step) => {
                follow(step, entry);
                step.entries.push((index, line));
            }
            None => others.push((index, line)),
        }
    }
    let mut steps: Vec<Step> = steps.into_values().collect();
    for step in &mut steps {
        if let (Some(issued), Some(ended)) = (step.issued_at_ms, step.ended_at_ms) {
            // Times from two clocks (an import's) can run backwards: no duration, not zero.
            step.took_ms = ended.checked_sub(issued);
        }
    }
    (steps, others)
}

/// When the command of `entry` was issued, if the journal says.
fn issued_at(entry: &Entry) -> Option<u64> {
    match entry {
        Entry::ActivityScheduledAt {
            scheduled_at_ms, ..
        } => Some(*scheduled_at_ms),
        Entry::TimerStarted {
            duration_ms,
            fire_at_ms,
            ..
        } => Some(fire_at_ms.saturating_sub(*duration_ms)),
        other => other.journaled_at(),
    }
}

/// Where each step's outcome came from, and how long an effect took when its journal does
/// not say.
fn mark_origins(steps: &mut [Step], journal: &[Entry], operations: &[(String, OperationRecord)]) {
    let forked = journal
        .iter()
        .enumerate()
        .rev()
        .find_map(|(index, entry)| match entry {
            Entry::Forked(forked) => Some((index as u64, forked.source.clone())),
            _ => None,
        });
    for step in steps.iter_mut() {
        let issued_at = step.entries.first().map_or(0, |(index, _)| *index);
        let last_at = step.entries.last().map_or(0, |(index, _)| *index);
        let mut crosses_fork = false;
        if let Some((forked_at, source)) = &forked {
            let source = namespace::display(source);
            if last_at < *forked_at {
                step.origin = format!("replayed from {source}");
            } else if issued_at < *forked_at {
                // Issued by the source, ended here: its two times are the source's start and
                // this run's end, with the time before the fork in between.
                step.origin = format!("issued in {source}, ended here");
                step.took_ms = None;
                crosses_fork = true;
            }
        }
        let record = operations.iter().find(|(_, r)| r.seq == step.seq);
        let Some((_, record)) = record else {
            continue;
        };
        let events = record.history.iter().filter(|e| e.seq == step.seq);
        let from_elsewhere = events.clone().find_map(|e| {
            let by = e.by.as_deref()?;
            let (how, source) = by.split_once(':')?;
            matches!(how, "inherited" | "imported").then(|| format!("{how} from {source}"))
        });
        if let Some(origin) = from_elsewhere {
            step.origin = origin;
        }
        if step.took_ms.is_some() || crosses_fork {
            continue;
        }
        let started = events.clone().map(|e| e.at_ms).min();
        let settled = events
            .filter(|e| e.status == "committed" || e.status.starts_with("failed"))
            .map(|e| e.at_ms)
            .min();
        if let (Some(started), Some(settled)) = (started, settled) {
            step.took_ms = Some(settled.saturating_sub(started));
        }
    }
}

/// The step an entry reports on, and whether it ends it.
fn outcome_of(entry: &Entry) -> Option<(Seq, bool)> {
    Some(match entry {
        Entry::ActivityCompleted { seq, .. }
        | Entry::ActivityCompletedAt { seq, .. }
        | Entry::ActivityFailed { seq, .. }
        | Entry::ActivityFailedAt { seq, .. }
        | Entry::SnapshotCompletedAt { seq, .. }
        | Entry::TimerFired { seq }
        | Entry::TimerFiredAt { seq, .. }
        | Entry::SignalReceived { seq, .. }
        | Entry::SignalReceivedFrom { seq, .. }
        | Entry::SignalReceivedAt { seq, .. }
        | Entry::ApprovalDecided { seq, .. }
        | Entry::SnapshotCompleted { seq, .. }
        | Entry::WaitDropped { seq } => (*seq, true),
        Entry::ActivityAttemptFailed { seq, .. }
        | Entry::EffectUncertain { seq, .. }
        | Entry::EffectReconciled { seq, .. } => (*seq, false),
        _ => return None,
    })
}

/// What `entry` changes of its step's attempts, causes, outcome and end.
fn follow(step: &mut Step, entry: &Entry) {
    step.ended_at_ms = entry.journaled_at().or(step.ended_at_ms);
    match entry {
        Entry::ActivityCompleted { attempt, .. }
        | Entry::ActivityCompletedAt { attempt, .. }
        | Entry::SnapshotCompleted { attempt, .. }
        | Entry::SnapshotCompletedAt { attempt, .. } => {
            step.attempts = step.attempts.max(*attempt);
            step.outcome = "completed".to_owned();
        }
        Entry::ActivityFailed {
            attempt, failure, ..
        }
        | Entry::ActivityFailedAt {
            attempt, failure, ..
        } => {
            step.attempts = step.attempts.max(*attempt);
            step.causes.push(failure.message.clone());
            step.outcome = "failed".to_owned();
        }
        Entry::ActivityAttemptFailed {
            attempt, failure, ..
        }
        | Entry::EffectUncertain {
            attempt, failure, ..
        } => {
            step.attempts = step.attempts.max(*attempt);
            step.causes
                .push(format!("attempt {attempt}: {}", failure.message));
        }
        Entry::EffectReconciled { verdict, .. } => reconciled(step, verdict),
        // A timer journaled without its firing time ended when it was due, or later.
        Entry::TimerFired { .. } => {
            step.outcome = "fired".to_owned();
            step.ended_at_ms = step.fires_at_ms;
        }
        Entry::TimerFiredAt { .. } => step.outcome = "fired".to_owned(),
        Entry::SignalReceived { .. }
        | Entry::SignalReceivedFrom { .. }
        | Entry::SignalReceivedAt { .. } => {
            step.outcome = "received".to_owned();
        }
        Entry::ApprovalDecided { decision, .. } => {
            let (decided, at_ms) = match decision {
                ApprovalDecision::Approved { at_ms, .. } => ("approved", at_ms),
                ApprovalDecision::Rejected { at_ms, .. } => ("rejected", at_ms),
                ApprovalDecision::Expired { at_ms } => ("expired", at_ms),
            };
            step.outcome = decided.to_owned();
            step.ended_at_ms = Some(*at_ms);
        }
        Entry::WaitDropped { .. } => step.outcome = "dropped".to_owned(),
        _ => {}
    }
}

/// What a reconciliation settled: the effect's outcome, and a cause without its result.
fn reconciled(step: &mut Step, verdict: &Reconciliation) {
    let (outcome, cause) = match verdict {
        Reconciliation::Committed(_) => (Some("completed"), "committed".to_owned()),
        Reconciliation::NotFound => (None, "not found: it may be called again".to_owned()),
        Reconciliation::StillUnknown { message, .. } => (Some("unknown outcome"), message.clone()),
        Reconciliation::AwaitingOperator { reason } => (Some("awaiting operator"), reason.clone()),
        Reconciliation::Failed { message } => (Some("failed"), message.clone()),
    };
    if let Some(outcome) = outcome {
        step.outcome = outcome.to_owned();
    }
    step.causes.push(format!("reconciled: {cause}"));
}

/// An entry as `waymark show` renders it, without its index.
fn rendered(entry: &Entry, index: u64) -> String {
    let line = render_journal_from(std::slice::from_ref(entry), index);
    let line = line.trim_end();
    line.trim_start()
        .split_once(' ')
        .map_or(line, |(_, rest)| rest)
        .to_owned()
}

/// The stream's response versions and its progress events.
fn stream(worker: &Worker, id: &str) -> Result<(Vec<Version>, Vec<Progress>), StoreError> {
    let mut versions: BTreeMap<(u32, u32), Version> = BTreeMap::new();
    let mut progress = Vec::new();
    let mut superseded = HashSet::new();
    let mut committed = HashSet::new();
    for event in worker.stream(id, 0)? {
        match event.item {
            StreamItem::Chunk {
                step,
                response_version,
                text,
            } => {
                let version = versions.entry((step, response_version)).or_insert(Version {
                    step,
                    version: response_version,
                    text: String::new(),
                    superseded: false,
                    committed: false,
                });
                version.text.push_str(&text);
            }
            StreamItem::Superseded {
                step,
                response_version,
                ..
            } => {
                superseded.insert((step, response_version));
            }
            StreamItem::Committed {
                step,
                response_version,
            } => {
                committed.insert((step, response_version));
            }
            StreamItem::Progress { name, detail, .. } => {
                let detail = String::from_utf8_lossy(detail.as_bytes()).into_owned();
                progress.push((event.seq, name, detail));
            }
        }
    }
    for (key, version) in versions.iter_mut() {
        version.superseded = superseded.contains(key);
        version.committed = committed.contains(key);
    }
    Ok((versions.into_values().collect(), progress))
}

/// What the approval page shows: the pending request, the artifact it shows, the evidence.
pub(crate) struct ApprovalView {
    pub(crate) pending: PendingRequest,
    /// The artifact the scope shows (a plan, a tool call), when stored.
    pub(crate) shown: Option<ArtifactRecord>,
    /// The evidence: hash and record, when stored.
    pub(crate) evidence: Vec<(String, Option<ArtifactRecord>)>,
}

impl ApprovalView {
    /// Request `request` of workflow `id`, if it is pending.
    pub(crate) fn read(
        worker: &Worker,
        id: &str,
        request: u32,
    ) -> Result<Option<Self>, StoreError> {
        let pending = worker.pending_approvals(id)?;
        let Some(pending) = pending.into_iter().find(|p| p.request == request) else {
            return Ok(None);
        };
        let (namespace, _) = namespace::split(id);
        let mut evidence = Vec::new();
        // A request made before scopes existed names the shown artifact itself.
        let shown_hash = pending
            .scope
            .as_ref()
            .map_or(&pending.artifact_hash, |s| &s.artifact);
        let shown = worker.artifact_in(namespace, shown_hash)?;
        if let Some(scope) = &pending.scope {
            for hash in &scope.evidence {
                evidence.push((hash.clone(), worker.artifact_in(namespace, hash)?));
            }
        }
        Ok(Some(Self {
            pending,
            shown,
            evidence,
        }))
    }
}

#[cfg(test)]
mod tests {
    use waymark_runtime::journal::{CommandIdentity, CommandKind, Failure, FailureKind, Payload};

    use super::*;

    fn issued(seq: Seq, kind: CommandKind, at_ms: u64) -> Entry {
        Entry::ActivityScheduledAt {
            seq,
            identity: CommandIdentity::new(kind, format!("step{seq}"), &Payload::unit()),
            input: Payload::unit(),
            scheduled_at_ms: at_ms,
            idempotency_key: None,
        }
    }

    /// The first attempt of `seq` completed at `at_ms`.
    fn completed(seq: Seq, at_ms: u64) -> Entry {
        Entry::ActivityCompletedAt {
            seq,
            attempt: 1,
            output: Payload::unit(),
            completed_at_ms: at_ms,
        }
    }

    /// A step the source issued before a fork and the fork ended spans two runs: the time
    /// between them is not its duration.
    #[test]
    fn a_step_ended_after_a_fork_shows_no_duration_across_it() {
        let forked = waymark_runtime::journal::Forked {
            source: "source".into(),
            at: 4,
            key_root: "source".into(),
            key_roots: Vec::new(),
            models: Vec::new(),
            by: None,
            forked_at_ms: 500_000,
        };
        let journal = vec![
            issued(0, CommandKind::Activity, 1_000),
            completed(0, 1_200),
            issued(1, CommandKind::Activity, 2_000),
            Entry::Forked(forked),
            completed(1, 500_300),
        ];
        let (mut steps, _) = steps(&journal);
        mark_origins(&mut steps, &journal, &[]);
        let shown: Vec<(&str, Option<u64>)> = steps
            .iter()
            .map(|step| (step.origin.as_str(), step.took_ms))
            .collect();
        assert_eq!(
            shown,
            [
                ("replayed from source", Some(200)),
                ("issued in source, ended here", None),
            ]
        );
    }

    /// Each kind of step shows how long it took from what its journal says; a step ended by
    /// an entry without its time (journals from before) shows none rather than a guess.
    #[test]
    fn each_step_takes_from_its_issue_to_its_journaled_end() {
        let sleep = Payload::from_value(&serde_json::json!(30_000));
        let journal = vec![
            issued(0, CommandKind::Activity, 1_000),
            completed(0, 1_750),
            issued(1, CommandKind::Activity, 2_000),
            Entry::ActivityFailedAt {
                seq: 1,
                attempt: 3,
                failure: Failure::new(FailureKind::Terminal, "refused"),
                failed_at_ms: 9_000,
            },
            Entry::TimerStarted {
                seq: 2,
                identity: CommandIdentity::new(CommandKind::Timer, "sleep", &sleep),
                duration_ms: 30_000,
                fire_at_ms: 40_000,
            },
            Entry::TimerFired { seq: 2 },
            issued(3, CommandKind::Retrieval, 41_000),
            Entry::SnapshotCompletedAt {
                seq: 3,
                attempt: 1,
                artifact: Payload::unit().digest(),
                completed_at_ms: 41_020,
            },
            Entry::SignalAwaitedAt {
                seq: 4,
                identity: CommandIdentity::new(CommandKind::Signal, "go", &Payload::unit()),
                awaited_at_ms: 42_000,
            },
            Entry::SignalReceivedAt {
                seq: 4,
                signal_id: "go-1".into(),
                payload: Payload::unit(),
                sender: Some("dana".into()),
                received_at_ms: 42_300,
            },
            Entry::ApprovalRequestedAt {
                seq: 5,
                identity: CommandIdentity::new(CommandKind::Approval, "plan", &Payload::unit()),
                artifact_hash: Payload::unit().digest(),
                risk: Payload::unit(),
                expires_at_ms: None,
                requested_at_ms: 43_000,
            },
            Entry::ApprovalDecided {
                seq: 5,
                decision: ApprovalDecision::Approved {
                    approver: "dana".into(),
                    at_ms: 103_000,
                    expires_at_ms: None,
                },
            },
            issued(6, CommandKind::Activity, 200_000),
            Entry::ActivityCompleted {
                seq: 6,
                attempt: 1,
                output: Payload::unit(),
            },
        ];
        let (steps, _) = steps(&journal);
        let took: Vec<(Seq, &str, Option<u64>)> = steps
            .iter()
            .map(|step| (step.seq, step.outcome.as_str(), step.took_ms))
            .collect();
        assert_eq!(
            took,
            [
                (0, "completed", Some(750)),
                (1, "failed", Some(7_000)),
                (2, "fired", Some(30_000)),
                (3, "completed", Some(20)),
                (4, "received", Some(300)),
                (5, "approved", Some(60_000)),
                (6, "completed", None),
            ]
        );
    }
}
