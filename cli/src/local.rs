//! The commands against a stopped worker's data dir: read-only, except `import`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use std::sync::Arc;

use anyhow::Context as _;
use waymark::codec::{Codec, Keyring};
use waymark::inspect::{import_workflow, rekey, render_journal, DataDir, WorkflowRecord};

use waymark::telemetry::{journal_stats, JournalStats};

use serde_json::{json, Value};

use crate::out::{pretty, printable, Out};
use crate::stats::Stats;
use crate::{usage, ArtifactAction, Command, ListArgs};

pub(crate) async fn run(
    dir: &Path,
    namespace: Option<&str>,
    command: Command,
    out: Out,
) -> anyhow::Result<i32> {
    let codec = keys_from_env()?;
    let stored = |id: &str| -> anyhow::Result<String> {
        let namespace = namespace.unwrap_or(waymark::namespace::DEFAULT);
        Ok(waymark::namespace::qualify(namespace, "workflow id", id)?)
    };
    match &command {
        Command::Import { file, workflow_id } => {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let done = import_workflow(dir, &stored(workflow_id)?, &bytes, codec).await?;
            out.either(
                || {
                    format!(
                        "imported {} entries, {} operations and {} artifacts as {workflow_id}",
                        done.entries, done.operations, done.artifacts
                    )
                },
                || {
                    json!({"workflow_id": workflow_id, "entries": done.entries,
                        "operations": done.operations, "artifacts": done.artifacts})
                },
            );
            return Ok(0);
        }
        Command::Rekey => {
            let codec = codec.context(
                "rekeying needs the keys: set WAYMARK_ENCRYPTION_KEYS or WAYMARK_ENCRYPTION_KEYS_FILE",
            )?;
            let done = rekey(dir, codec)?;
            out.either(
                || {
                    format!(
                        "{} values sealed anew, {} already under the current key",
                        done.rewritten, done.kept
                    )
                },
                || json!({"rewritten": done.rewritten, "kept": done.kept}),
            );
            return Ok(0);
        }
        _ => {}
    }
    let data = DataDir::open_with_codec(dir, codec.clone())
        .with_context(|| format!("opening {}", dir.display()))?;
    let record_of = |id: &str| -> anyhow::Result<WorkflowRecord> {
        let record = data.workflow(&stored(id)?)?;
        record.with_context(|| format!("no workflow `{id}`"))
    };
    match command {
        Command::List(wanted) => {
            if wanted.after.is_some() && namespace.is_none() {
                // Without one, ids are shown as `namespace/id`, which is not the listing's order.
                return Err(usage("--after pages one namespace: give --namespace too"));
            }
            let limit = wanted.limit.unwrap_or(usize::MAX);
            let filter = Filter { namespace, wanted };
            let listing = data.workflows()?;
            let mut rows = listing
                .into_iter()
                .filter_map(|(id, record)| filter.row(&id, record));
            let page: Vec<Value> = rows.by_ref().take(limit).collect();
            let next = match rows.next() {
                Some(_) => page.last().map(|row| row["workflow_id"].clone()),
                None => None,
            };
            let text = || {
                let mut lines: Vec<String> = page.iter().map(list_line).collect();
                if let Some(next) = next.as_ref().and_then(Value::as_str) {
                    lines.push(format!("(more: --after {next})"));
                }
                lines.join("\n")
            };
            out.either(text, || json!({"workflows": page, "next": next}));
        }
        Command::Show { id } => {
            let record = record_of(&id)?;
            let journal = render_journal(&data.journal(&stored(&id)?)?);
            out.either(
                || format!("{}\n{}", header(&id, &record), journal.trim_end()),
                || json!({"workflow": record_json(&id, &record), "journal": journal.lines().collect::<Vec<_>>()}),
            );
        }
        Command::Describe { id } => {
            let record = record_of(&id)?;
            out.either(|| header(&id, &record), || record_json(&id, &record));
        }
        Command::History { id, follow } => {
            if follow {
                return Err(usage("--follow needs the running worker (--url): a stopped one's journal does not grow"));
            }
            record_of(&id)?;
            let journal = render_journal(&data.journal(&stored(&id)?)?);
            out.either(
                || journal.trim_end().to_owned(),
                || json!({"workflow_id": id, "entries": journal.lines().collect::<Vec<_>>()}),
            );
        }
        Command::Operations { id: None, .. } => {
            if let Some(namespace) = namespace {
                waymark::namespace::check_name(namespace)?;
            }
            let listed = data.operations_awaiting_decision(namespace)?;
            let rows = listed.into_iter().map(|(key, record)| awaiting_row(namespace, &key, record));
            let operations = Value::Array(rows.collect());
            out.value(&operations, crate::api::awaiting_text);
        }
        Command::Operations { id: Some(id), .. } => {
            record_of(&id)?;
            let operations: Vec<Value> = data
                .operations(&stored(&id)?)?
                .into_iter()
                .map(|(key, record)| match record {
                    Ok(record) => json!({
                        "key": key,
                        "status": record.status.name(),
                        "attempt": record.attempt,
                        "revision": record.revision(),
                    }),
                    Err(error) => json!({"key": key, "status": "unreadable", "error": error.to_string()}),
                })
                .collect();
            let line = |op: &Value| {
                let key = op["key"].as_str().unwrap_or("?");
                let status = op["status"].as_str().unwrap_or("?");
                let (attempt, revision) = (&op["attempt"], &op["revision"]);
                format!("{key:<60} {status:<20} attempt {attempt} revision {revision}")
            };
            let text = || operations.iter().map(line).collect::<Vec<_>>().join("\n");
            out.either(text, || json!(operations));
        }
        Command::Export { id, plaintext } => {
            record_of(&id)?;
            let export = data.export(&stored(&id)?)?;
            let codec = codec.as_deref().filter(|_| !plaintext);
            let bytes = export.write(codec)?;
            std::io::stdout().write_all(&bytes)?;
        }
        Command::Stats => stats(&data)?.print(out.json),
        Command::Artifact {
            action: ArtifactAction::Show { hash },
        } => {
            let namespace = namespace.unwrap_or(waymark::namespace::DEFAULT);
            let record = data
                .artifact(namespace, &hash)?
                .with_context(|| format!("no artifact `{hash}`"))?;
            let record = serde_json::to_value(&record)?;
            out.value(&record, pretty);
        }
        Command::Start { .. } | Command::Result { .. } => {
            return Err(usage("this runs a workflow: it needs the running worker (--url)"))
        }
        Command::Approve { .. }
        | Command::Signal { .. }
        | Command::Resolve { .. }
        | Command::Cancel { .. }
        | Command::Fork { .. }
        | Command::Reset { .. }
        | Command::Delete { .. } => {
            return Err(usage("this changes a workflow: it needs the running worker (--url); a data dir is opened read-only"))
        }
        Command::Import { .. } | Command::Rekey => unreachable!("handled above"),
    }
    Ok(0)
}

/// What `list` keeps of a data dir's workflows.
struct Filter<'a> {
    /// `None`: every namespace, ids shown as `namespace/id`.
    namespace: Option<&'a str>,
    wanted: ListArgs,
}

impl Filter<'_> {
    fn row(
        &self,
        stored: &str,
        record: Result<WorkflowRecord, waymark::StoreError>,
    ) -> Option<Value> {
        let id = match self.namespace {
            None => waymark::namespace::display(stored),
            Some(wanted) if waymark::namespace::split(stored).0 == wanted => {
                waymark::namespace::split(stored).1.to_owned()
            }
            Some(_) => return None,
        };
        if let Some(after) = &self.wanted.after {
            let key = |id: &str| waymark::store::keys::id_key(id);
            if key(stored)
                <= key(&waymark::namespace::qualify(
                    self.namespace.unwrap_or("default"),
                    "after",
                    after,
                )
                .ok()?)
            {
                return None;
            }
        }
        let record = match record {
            Ok(record) => record,
            Err(error) => {
                let unfiltered = self.wanted.status.is_none() && self.wanted.workflow.is_none();
                let row =
                    json!({"workflow_id": id, "status": "unreadable", "error": error.to_string()});
                return unfiltered.then_some(row);
            }
        };
        let status_kept = self
            .wanted
            .status
            .as_deref()
            .is_none_or(|s| s == record.status.name());
        let name_kept = self
            .wanted
            .workflow
            .as_ref()
            .is_none_or(|n| **n == *record.workflow_name);
        (status_kept && name_kept).then(|| record_json(&id, &record))
    }
}

fn record_json(id: &str, record: &WorkflowRecord) -> Value {
    json!({
        "workflow_id": id,
        "workflow": record.workflow_name,
        "status": record.status.name(),
        "journal_len": record.journal_len,
        "stuck": record.stop.as_ref().map(|stop| json!({"code": stop.code.name(), "seq": stop.seq, "message": stop.message})),
    })
}

fn list_line(row: &Value) -> String {
    let id = row["workflow_id"].as_str().unwrap_or("?");
    let name = row["workflow"].as_str().unwrap_or("-");
    match row["error"].as_str() {
        Some(error) => format!("{id:<32} unreadable: {error}"),
        None => {
            let stuck = &row["stuck"];
            let status = row["status"].as_str().unwrap_or("?");
            let status = match (stuck["code"].as_str(), stuck["seq"].as_u64()) {
                (Some(code), Some(seq)) => format!("{status} ({code} at seq {seq})"),
                (Some(code), None) => format!("{status} ({code})"),
                (None, _) => status.to_owned(),
            };
            format!("{id:<32} {name:<24} {status}")
        }
    }
}

/// `id: status (name)`, and why a stuck run is stuck.
fn header(id: &str, record: &WorkflowRecord) -> String {
    let mut text = format!("{id}: {} ({})", status(record), record.workflow_name);
    if let Some(stop) = &record.stop {
        text += &format!("\nstuck: {}", stop.message);
    }
    text
}

/// The status, and for a stuck run its code and seq: `stuck (non_determinism at seq 3)`.
fn status(record: &WorkflowRecord) -> String {
    let name = record.status.name();
    match &record.stop {
        Some(stop) => match stop.seq {
            Some(seq) => format!("{name} ({} at seq {seq})", stop.code),
            None => format!("{name} ({})", stop.code),
        },
        None => name.to_owned(),
    }
}

/// Workflows and operations by status, and what every readable journal says.
fn stats(data: &DataDir) -> anyhow::Result<Stats> {
    let mut workflows = BTreeMap::<String, u64>::new();
    let mut journals = JournalStats::default();
    for (id, record) in data.workflows()? {
        let name = record.as_ref().map_or("unreadable", |r| r.status.name());
        *workflows.entry(name.to_owned()).or_default() += 1;
        match data.journal(&id) {
            Ok(journal) => journals.add(&journal_stats(&journal)),
            Err(error) => {
                let id = waymark::namespace::display(&id);
                eprintln!(
                    "{}",
                    printable(&format!("skipping the journal of {id}: {error}"))
                );
            }
        }
    }
    let mut operations = BTreeMap::<String, u64>::new();
    for (_, record) in data.all_operations()? {
        let name = record.map_or("unreadable", |r| r.status.name());
        *operations.entry(name.to_owned()).or_default() += 1;
    }
    Ok(Stats {
        source: "data_dir",
        workflows,
        operations: Some(operations),
        journals: Some(journals),
        metrics: None,
    })
}

/// The encryption keys the worker was given, from the same variables.
fn keys_from_env() -> anyhow::Result<Option<Arc<dyn Codec>>> {
    let keys = Keyring::from_env().context("reading the encryption keys")?;
    Ok(keys.map(|keys| Arc::new(keys) as Arc<dyn Codec>))
}

/// An operation awaiting a decision as the API shows it, its ids bare in `namespace` or, when
/// none is given, shown as `namespace/id`.
fn awaiting_row(
    namespace: Option<&str>,
    key: &str,
    record: waymark::operations::OperationRecord,
) -> Value {
    let shown = |stored: &str| match namespace {
        Some(_) => waymark::namespace::split(stored).1.to_owned(),
        None => waymark::namespace::display(stored),
    };
    json!({
        "key": shown(key),
        "workflow_id": shown(&record.workflow_id),
        "operation": record.operation,
        "version": record.version,
        "attempt": record.attempt,
        "revision": record.revision(),
        "status": record.status.name(),
        "reason": record.status.note(),
        "arguments": record.arguments.decode::<Value>().unwrap_or(Value::Null),
    })
}
