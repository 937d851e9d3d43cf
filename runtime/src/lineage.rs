//! A workflow's lineage: whether it was forked, and what that decides for the code it runs.
//!
//! A fork replays a prefix of another workflow's journal, so everything the prefix computed
//! from the workflow's identity must come out the same: an approval scope lists its effects'
//! idempotency keys, and a key is derived from a workflow id. A fork therefore derives its
//! effects' keys from its source's *key root* (the source's own id, or its source's, up the
//! chain): the approval granted in the prefix covers exactly the calls the fork makes, and an
//! effect the source committed is the same intent under the same key. Its operation log stays
//! its own: the fork's rows are keyed by its own id ([`Lineage::business_key`] turns a row's
//! key into the one the downstream and the approval see), and the source's committed
//! operations are copied into them when the fork is made, marked as inherited.

use crate::journal::{Entry, Forked};
use crate::operations::key_prefix;

/// What a workflow's fork (if it is one) decides; the default for a workflow started afresh.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    key_root: Option<String>,
    key_roots: Vec<(String, String)>,
    models: Vec<(String, String)>,
}

impl Lineage {
    /// The lineage a journal records: its `Forked` entry's, or none.
    pub fn of(entries: &[Entry]) -> Self {
        let forked = entries.iter().rev().find_map(|entry| match entry {
            Entry::Forked(forked) => Some(forked),
            _ => None,
        });
        forked.map(Self::from_forked).unwrap_or_default()
    }

    /// The lineage `forked` records.
    pub fn from_forked(forked: &Forked) -> Self {
        Self {
            key_root: Some(forked.key_root.clone()),
            key_roots: forked.key_roots.clone(),
            models: forked.models.clone(),
        }
    }

    /// The workflow whose id `operation`'s keys derive from, for workflow `workflow_id`.
    pub fn key_root<'a>(&'a self, workflow_id: &'a str, operation: &str) -> &'a str {
        let named = self.key_roots.iter().find(|(name, _)| name == operation);
        match (named, &self.key_root) {
            (Some((_, root)), _) => root,
            (None, Some(root)) => root,
            (None, None) => workflow_id,
        }
    }

    /// The key roots of a fork of this workflow (`workflow_id`) made as `fork_id`: its
    /// default root, and the operations whose keys derive from another workflow, with those
    /// named in `refired` firing again under keys of the fork's own.
    pub fn fork_roots(
        &self,
        workflow_id: &str,
        fork_id: &str,
        refired: &[String],
    ) -> (String, Vec<(String, String)>) {
        let root = self
            .key_root
            .clone()
            .unwrap_or_else(|| workflow_id.to_owned());
        let inherited = self.key_roots.iter();
        let kept = inherited
            .filter(|(name, _)| !refired.contains(name))
            .cloned();
        let own = refired
            .iter()
            .map(|name| (name.clone(), fork_id.to_owned()));
        (root, kept.chain(own).collect())
    }

    /// The key the downstream is called with, and an approval's intent names, for the
    /// operation log row `row_key` of `operation` in workflow `workflow_id`.
    pub fn business_key(&self, workflow_id: &str, operation: &str, row_key: &str) -> String {
        let root = self.key_root(workflow_id, operation);
        if root == workflow_id {
            return row_key.to_owned();
        }
        rebase(row_key, workflow_id, root).unwrap_or_else(|| row_key.to_owned())
    }

    /// The model a model call naming `model` runs on.
    pub fn model<'a>(&'a self, model: &'a str) -> &'a str {
        let replaced = self.models.iter().find(|(from, _)| from == model);
        replaced.map_or(model, |(_, to)| to)
    }

    /// The models replaced in the model calls that run anew: (named, run).
    pub fn models(&self) -> &[(String, String)] {
        &self.models
    }

    /// Whether the workflow was forked.
    pub fn is_fork(&self) -> bool {
        self.key_root.is_some()
    }
}

/// `entry` with the idempotency key it records (an effect's schedule) rebased from workflow
/// `from` to workflow `to`; any other entry as it is.
pub fn rebase_entry(entry: Entry, from: &str, to: &str) -> Entry {
    match entry {
        Entry::ActivityScheduledAt {
            seq,
            identity,
            input,
            scheduled_at_ms,
            idempotency_key,
        } => Entry::ActivityScheduledAt {
            seq,
            identity,
            input,
            scheduled_at_ms,
            idempotency_key: idempotency_key.map(|key| rebase(&key, from, to).unwrap_or(key)),
        },
        entry => entry,
    }
}

/// `key` (one of `from`'s operation keys) as the same key of workflow `to`; `None` if `key` is
/// not `from`'s.
pub fn rebase(key: &str, from: &str, to: &str) -> Option<String> {
    let rest = key.strip_prefix(&key_prefix(from))?;
    Some(format!("{}{rest}", key_prefix(to)))
}
