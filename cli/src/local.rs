//! The commands against a stopped worker's data dir: read-only, except `import`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use std::sync::Arc;

use anyhow::{bail, Context as _};
use waymark::codec::{Codec, Keyring};
use waymark::inspect::{
    import_journal, rekey, render_journal, write_framed, write_framed_sealed, DataDir,
    WorkflowRecord,
};

use waymark::telemetry::{journal_stats, JournalStats};

use crate::stats::Stats;
use crate::{ArtifactAction, Command};

pub(crate) async fn run(
    dir: &Path,
    namespace: Option<&str>,
    command: Command,
) -> anyhow::Result<()> {
    let codec = keys_from_env()?;
    let stored = |id: &str| -> anyhow::Result<String> {
        let namespace = namespace.unwrap_or(waymark::namespace::DEFAULT);
        Ok(waymark::namespace::qualify(namespace, "workflow id", id)?)
    };
    match &command {
        Command::Import { file, workflow_id } => {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let count = import_journal(dir, &stored(workflow_id)?, &bytes, codec).await?;
            println!("imported {count} entries as {workflow_id}");
            return Ok(());
        }
        Command::Rekey => {
            let codec = codec.context(
                "rekeying needs the keys: set WAYMARK_ENCRYPTION_KEYS or WAYMARK_ENCRYPTION_KEYS_FILE",
            )?;
            let done = rekey(dir, codec)?;
            println!(
                "{} values sealed anew, {} already under the current key",
                done.rewritten, done.kept
            );
            return Ok(());
        }
        _ => {}
    }
    let data = DataDir::open_with_codec(dir, codec.clone())
        .with_context(|| format!("opening {}", dir.display()))?;
    match command {
        Command::List { status: wanted } => {
            for (id, record) in data.workflows()? {
                let id = match namespace {
                    None => waymark::namespace::display(&id),
                    Some(wanted) if waymark::namespace::split(&id).0 == wanted => {
                        waymark::namespace::split(&id).1.to_owned()
                    }
                    Some(_) => continue,
                };
                match record {
                    Ok(record) if wanted.as_deref().is_none_or(|w| w == record.status.name()) => {
                        println!("{id:<32} {:<24} {}", record.workflow_name, status(&record))
                    }
                    Ok(_) => {}
                    Err(error) => println!("{id:<32} unreadable: {error}"),
                }
            }
            Ok(())
        }
        Command::Show { id } => {
            let record = data
                .workflow(&stored(&id)?)?
                .with_context(|| format!("no workflow `{id}`"))?;
            println!("{id}: {} ({})", status(&record), record.workflow_name);
            if let Some(stop) = &record.stop {
                println!("stuck: {}", stop.message);
            }
            print!("{}", render_journal(&data.journal(&stored(&id)?)?));
            Ok(())
        }
        Command::Export { id, plaintext } => {
            if data.workflow(&stored(&id)?)?.is_none() {
                bail!("no workflow `{id}`");
            }
            let journal = data.journal(&stored(&id)?)?;
            let bytes = match &codec {
                Some(codec) if !plaintext => write_framed_sealed(&journal, codec.as_ref())?,
                _ => write_framed(&journal),
            };
            std::io::stdout().write_all(&bytes)?;
            Ok(())
        }
        Command::Stats { json } => {
            stats(&data)?.print(json);
            Ok(())
        }
        Command::Artifact {
            action: ArtifactAction::Show { hash },
        } => {
            let namespace = namespace.unwrap_or(waymark::namespace::DEFAULT);
            let record = data
                .artifact(namespace, &hash)?
                .with_context(|| format!("no artifact `{hash}`"))?;
            println!("{}", serde_json::to_string_pretty(&record)?);
            Ok(())
        }
        Command::Approve { .. }
        | Command::Signal { .. }
        | Command::Resolve { .. }
        | Command::Cancel { .. }
        | Command::Delete { .. } => {
            bail!("this changes a workflow: it needs the running worker (--url); a data dir is opened read-only")
        }
        Command::Import { .. } | Command::Rekey => unreachable!("handled above"),
    }
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
            Err(error) => eprintln!("skipping the journal of {id}: {error}"),
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
