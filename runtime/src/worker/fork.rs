//! Forking a workflow from one of its journal's entries: a new workflow whose journal is the
//! source's first `at` entries, which replays them and goes on live from there.
//!
//! What the fork must never do is fire again an effect its source committed. It derives its
//! keys from its source's (see [`crate::lineage`]), and it gets, in its own operation log, a
//! copy of every operation the source committed, marked as inherited: a call the fork makes
//! with the same intent is answered from that copy; with other arguments under the same key it
//! is a key conflict, as in the source. An operator can name effects to fire again: those get
//! keys of the fork's own and no copy. An operation whose outcome is still unknown refuses the
//! fork, since neither firing it again nor not firing it is known to be right.

use super::*;

use super::commands::unknown_workflow;
use super::start::{check_id, check_not_kept_run};
use crate::artifacts::ArtifactRecord;
use crate::error::ForkError;
use crate::journal::{Digest, Forked};
use crate::lineage::{rebase, Lineage};
use crate::namespace;
use crate::store::committed_artifacts;

/// What a fork changes.
#[derive(Debug, Clone, Default)]
pub struct ForkOptions {
    /// How many of the source's entries the fork keeps (at least 1, the start; at most up to
    /// the source's end, which it does not keep).
    pub at: u64,
    /// The fork's id, in the source's namespace; a generated one when `None`.
    pub workflow_id: Option<String>,
    /// Another input for the fork: the code sees it from its first step on, so a prefix that
    /// read the input may diverge from it (the run is then stuck, saying where).
    pub input: Option<Payload>,
    /// Models replaced in the model calls the fork runs anew: (as the code names it, the one
    /// to run). The recorded calls of the prefix keep their answers.
    pub models: Vec<(String, String)>,
    /// Effects (activity names) that fire again in the fork, under keys of its own, rather
    /// than be answered from what the source committed.
    pub refire: Vec<String>,
    /// Who forks it (a caller's identity), journaled in the fork.
    pub forked_by: Option<String>,
}

/// What the fork is made of, read from the source in one go.
pub(super) struct Source {
    pub(super) record: WorkflowRecord,
    pub(super) journal: Vec<Entry>,
    operations: Vec<(String, OperationRecord)>,
    pub(super) artifacts: Vec<(Digest, ArtifactRecord)>,
}

impl WorkerState {
    pub(super) async fn fork(
        &self,
        source_id: &str,
        options: ForkOptions,
    ) -> Result<Started, ForkError> {
        if self.is_stopping() {
            return Err(StartError::ShutDown.into());
        }
        let source = self.read_source(source_id).await?;
        let fork_id = self.fork_id(source_id, &source, options.workflow_id.as_deref())?;
        let transition = self.fork_transition(source_id, &fork_id, source, &options)?;
        match self.store.commit(transition).await {
            Ok(()) => {}
            Err(StoreError::Conflict { .. }) => {
                return Err(StartError::IdInUse(fork_id).into());
            }
            Err(error) => return Err(StartError::Store(error).into()),
        }
        self.router.ensure_running(self, &fork_id, Wake::Started);
        Ok(Started {
            workflow_id: fork_id,
            existed: false,
        })
    }

    /// The source's record, its journal, the operations of the workflow its rows belong to
    /// (its own, or for a kept run the workflow it was kept from), and the artifacts its
    /// journal committed.
    pub(super) async fn read_source(&self, source_id: &str) -> Result<Source, ForkError> {
        let id = source_id.to_owned();
        let read = self.read(move |store| {
            let Some(record) = store.workflow(&id)? else {
                return Ok(None);
            };
            let journal = store.journal(&id)?;
            let owner = rows_owner(&id);
            let operations = store.operations(&key_prefix(owner))?;
            let (namespace, _) = namespace::split(&id);
            let mut artifacts = Vec::new();
            for hash in committed_artifacts(&journal) {
                if let Some(artifact) = store.artifact(namespace, &hash)? {
                    artifacts.push((hash, artifact));
                }
            }
            Ok(Some((record, journal, operations, artifacts)))
        });
        let Some((record, journal, operations, artifacts)) = read.await? else {
            return Err(unknown_workflow(source_id).into());
        };
        let mut decoded = Vec::with_capacity(operations.len());
        for (key, operation) in operations {
            decoded.push((key, operation?));
        }
        Ok(Source {
            record,
            journal,
            operations: decoded,
            artifacts,
        })
    }

    /// The fork's stored id: the one asked for, or one generated from the source's, in the
    /// source's namespace.
    fn fork_id(
        &self,
        source_id: &str,
        source: &Source,
        asked: Option<&str>,
    ) -> Result<String, ForkError> {
        let (namespace, _) = namespace::split(source_id);
        let id = match asked {
            Some(id) => id.to_owned(),
            None => format!(
                "{}-fork-{:016x}",
                source.record.workflow_name,
                rand::random::<u64>()
            ),
        };
        let id = namespace::qualify(namespace, "workflow id", &id).map_err(StartError::from)?;
        check_id("workflow id", &id)?;
        check_not_kept_run(&id)?;
        Ok(id)
    }

    fn fork_transition(
        &self,
        source_id: &str,
        fork_id: &str,
        source: Source,
        options: &ForkOptions,
    ) -> Result<Transition, ForkError> {
        for name in &options.refire {
            let effect = self.registry.activity(name).and_then(|a| a.effect.as_ref());
            if effect.is_none() {
                return Err(ForkError::NotAnEffect(name.clone()));
            }
        }
        let prefix = kept_prefix(source_id, &source, options.at)?;
        let kept_artifacts = committed_artifacts(&prefix);
        let artifacts = source.artifacts.into_iter();
        let artifacts: Vec<_> = artifacts
            .filter(|(hash, _)| kept_artifacts.contains(hash))
            .collect();
        refuse_refire_of_approved(&artifacts, &options.refire)?;
        // The whole journal's lineage: a point before the source's own fork entry keeps its
        // keys all the same.
        let lineage = Lineage::of(&source.journal);
        let owner = rows_owner(source_id);
        let (key_root, key_roots) = lineage.fork_roots(owner, fork_id, &options.refire);
        let mut entries = self.forked_entries(owner, fork_id, prefix, options)?;
        let record = match entries.first() {
            Some(Entry::WorkflowStarted(started)) => {
                WorkflowRecord::new(&started.workflow_name, None, started.input.digest())
            }
            _ => unreachable_start(source_id)?,
        };
        entries.push(Entry::Forked(Forked {
            source: source_id.to_owned(),
            at: options.at,
            key_root,
            key_roots,
            models: options.models.clone(),
            by: options.forked_by.clone(),
            forked_at_ms: self.clock.now_ms(),
        }));
        let operations = self.inherited(source_id, fork_id, &source.operations, options)?;
        let mut transition = Transition::append(fork_id, &record, entries);
        transition.operations = operations;
        transition.artifacts = artifacts;
        Ok(transition)
    }

    /// The prefix as the fork's own: no request id (the source holds it), the input the
    /// fork was given, and each effect's operation log key (a row of `owner`'s) as the fork's.
    fn forked_entries(
        &self,
        owner: &str,
        fork_id: &str,
        prefix: Vec<Entry>,
        options: &ForkOptions,
    ) -> Result<Vec<Entry>, ForkError> {
        let mut entries = Vec::with_capacity(prefix.len() + 1);
        for entry in prefix {
            entries.push(match entry {
                Entry::WorkflowStarted(mut started) => {
                    started.request_id = None;
                    if let Some(input) = &options.input {
                        self.check_fork_input(&started.workflow_name, input)?;
                        started.input = input.clone();
                    }
                    Entry::WorkflowStarted(started)
                }
                entry => crate::lineage::rebase_entry(entry, owner, fork_id),
            });
        }
        Ok(entries)
    }

    fn check_fork_input(&self, name: &str, input: &Payload) -> Result<(), ForkError> {
        let workflow = self.registry.workflow(name);
        let workflow = workflow.ok_or_else(|| StartError::UnknownWorkflow(name.to_owned()))?;
        (workflow.check_input)(input).map_err(|message| StartError::InvalidInput {
            workflow: name.to_owned(),
            message,
        })?;
        let what = || format!("the input of workflow `{name}`");
        if let Some(message) = crate::journal::oversized(input, self.max_payload_bytes, what) {
            return Err(StartError::PayloadTooLarge(message).into());
        }
        Ok(())
    }

    /// The source's committed operations, as the fork's rows, marked inherited; an operation
    /// still unsettled refuses the fork unless it is named to fire again.
    fn inherited(
        &self,
        source_id: &str,
        fork_id: &str,
        operations: &[(String, OperationRecord)],
        options: &ForkOptions,
    ) -> Result<Vec<(String, OperationRecord)>, ForkError> {
        let owner = rows_owner(source_id);
        let mut inherited = Vec::new();
        for (key, operation) in operations {
            if options.refire.contains(&operation.operation) || operation.workflow_id != owner {
                continue;
            }
            match &operation.status {
                OperationStatus::Committed { .. } => {}
                OperationStatus::Prepared
                | OperationStatus::UnknownOutcome { .. }
                | OperationStatus::AwaitingOperator { .. } => {
                    return Err(ForkError::Unsettled {
                        workflow_id: namespace::display(source_id),
                        key: key.clone(),
                        operation: operation.operation.clone(),
                        status: operation.status.name().to_owned(),
                    })
                }
                // It did not happen: the fork may call it.
                OperationStatus::FailedRetriable { .. }
                | OperationStatus::FailedTerminal { .. }
                | OperationStatus::NotAttempted { .. } => continue,
            }
            let Some(row) = rebase(key, owner, fork_id) else {
                continue;
            };
            inherited.push((
                row,
                self.inherited_record(source_id, fork_id, key, operation),
            ));
        }
        Ok(inherited)
    }

    fn inherited_record(
        &self,
        source_id: &str,
        fork_id: &str,
        key: &str,
        operation: &OperationRecord,
    ) -> OperationRecord {
        let mut record = operation.clone();
        record.workflow_id = fork_id.to_owned();
        record.history.push(crate::operations::OperationEvent {
            at_ms: self.clock.now_ms(),
            seq: operation.seq,
            attempt: operation.attempt,
            status: operation.status.name().to_owned(),
            by: Some(format!("{INHERITED_BY}{}", namespace::display(source_id))),
            note: format!("inherited from `{key}`"),
        });
        record
    }
}

/// How an inherited operation's last history event names who settled it: this, then the
/// source workflow's id.
pub const INHERITED_BY: &str = "inherited:";

/// The source's first `at` entries, if a run can go on from there: past the start, and
/// before the run ended.
pub(super) fn kept_prefix(
    source_id: &str,
    source: &Source,
    at: u64,
) -> Result<Vec<Entry>, ForkError> {
    let len = source.record.journal_len;
    if at == 0 || at > len {
        let reason = format!("the journal has {len} entries; a fork keeps 1..={len} of them");
        return Err(bad_point(source_id, at, reason));
    }
    if (source.journal.len() as u64) < at {
        let reason = format!(
            "the journal holds {} entries, its record {len}",
            source.journal.len()
        );
        return Err(Unreachable::Store(StoreError::Corrupt {
            table: crate::store::Table::Journal,
            key: source_id.to_owned(),
            source: crate::journal::DecodeError::Malformed(reason),
        })
        .into());
    }
    let kept = &source.journal[..at as usize];
    let ended = kept
        .iter()
        .position(|entry| entry.is_terminal() || matches!(entry, Entry::CancelRequested { .. }));
    if let Some(index) = ended {
        let reason = format!("entry {index} ends the run; keep {index} entries or fewer");
        return Err(bad_point(source_id, at, reason));
    }
    Ok(kept.to_vec())
}

fn bad_point(source_id: &str, at: u64, reason: String) -> ForkError {
    ForkError::BadPoint {
        workflow_id: namespace::display(source_id),
        at,
        reason,
    }
}

/// The workflow whose operation log rows a journal's keys name: the workflow's own, or, for a
/// kept run (`ID#run-N`), the workflow it was kept from.
pub(super) fn rows_owner(workflow_id: &str) -> &str {
    crate::executor::kept_run_owner(workflow_id).unwrap_or(workflow_id)
}

/// An effect an approval in the kept entries authorises cannot fire again under new keys: the
/// approval's scope names its keys, so the prefix would not replay.
fn refuse_refire_of_approved(
    artifacts: &[(Digest, ArtifactRecord)],
    refire: &[String],
) -> Result<(), ForkError> {
    let scopes = artifacts
        .iter()
        .filter(|(_, a)| a.kind == crate::approvals::SCOPE_KIND);
    for (hash, artifact) in scopes {
        let Ok(scope) = artifact.content.decode::<crate::approvals::ApprovalScope>() else {
            continue;
        };
        let named = scope
            .intents
            .iter()
            .find(|i| refire.contains(&i.intent.operation));
        if let Some(named) = named {
            return Err(ForkError::RefireApproved {
                operation: named.intent.operation.clone(),
                scope: hash.hex(),
            });
        }
    }
    Ok(())
}

fn unreachable_start<T>(source_id: &str) -> Result<T, ForkError> {
    Err(Unreachable::Store(StoreError::Corrupt {
        table: crate::store::Table::Journal,
        key: format!("{source_id}#0"),
        source: crate::journal::DecodeError::Malformed(
            "journal does not begin with WorkflowStarted".into(),
        ),
    })
    .into())
}
