//! `waymark`: list, inspect and operate workflows. Against a running worker it uses the HTTP
//! API (`--url`, `--token`); against a stopped worker's data dir (`--data-dir`) it reads the
//! store directly and only reads, except `import`, which writes an exported journal into it,
//! and `rekey`. A data dir encrypted at rest opens with the keys in `WAYMARK_ENCRYPTION_KEYS`
//! (or the file `WAYMARK_ENCRYPTION_KEYS_FILE` names), as the worker's did.
//!
//! Exit codes: 0 done; 1 refused or failed (the message says why); 2 a usage error; 3 `result`
//! of a workflow that failed.
#![forbid(unsafe_code)]

mod api;
mod local;
mod out;
mod stats;

use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Inspect and operate Waymark workflows.
#[derive(Parser)]
#[command(
    name = "waymark",
    version,
    after_help = "Exit codes: 0 done; 1 refused or failed; 2 a usage error; 3 `result` of a workflow that failed."
)]
struct Cli {
    #[command(flatten)]
    target: Target,
    /// Print JSON (one document; `history --follow`: one per line) instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the workflows are: a running worker, or a stopped worker's data dir.
#[derive(Args, Clone)]
struct Target {
    /// The worker's API, e.g. http://127.0.0.1:8080. `--data-dir` given too overrides one from
    /// the environment.
    #[arg(long, env = "WAYMARK_URL", global = true)]
    url: Option<String>,
    /// The bearer token for the API.
    #[arg(long, env = "WAYMARK_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// A stopped worker's data dir, opened read-only.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// The namespace to act in (default: the token's first; in a data dir, `default`, and
    /// `list` and `operations --awaiting-decision` show every namespace's as `namespace/id`).
    #[arg(long, env = "WAYMARK_NAMESPACE", global = true)]
    namespace: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Start a workflow; prints its id.
    Start {
        /// The registered workflow name.
        name: String,
        /// Its input, JSON.
        #[arg(long, default_value = "null")]
        input: String,
        /// The workflow id (default: the request id, else a generated one).
        #[arg(long)]
        id: Option<String>,
        /// Deduplicates starts: a second start with it returns the first workflow.
        #[arg(long)]
        request_id: Option<String>,
    },
    /// Wait for a workflow's end and print its output (exit code 3 if it failed).
    Result {
        /// Workflow id.
        id: String,
        /// Answer at once: "running" if it has not ended.
        #[arg(long)]
        no_wait: bool,
    },
    /// Workflows with their name and status, a page at a time.
    List(ListArgs),
    /// A workflow's status and rendered journal.
    Show {
        /// Workflow id.
        id: String,
    },
    /// A workflow's status, pending approvals, operations and stream state.
    Describe {
        /// Workflow id.
        id: String,
    },
    /// A workflow's journal, rendered; with `--follow`, new entries as they are written, until
    /// it ends.
    History {
        /// Workflow id.
        id: String,
        /// Keep printing new entries until the workflow ends (a running worker only).
        #[arg(long)]
        follow: bool,
    },
    /// A workflow's operation log: each effect's key, status and attempt. With
    /// `--awaiting-decision` instead, every operation of the namespace an operator is asked
    /// to decide, whatever its workflow's status (but stuck), with its workflow.
    Operations {
        /// Workflow id.
        #[arg(required_unless_present = "awaiting_decision")]
        id: Option<String>,
        /// List what awaits an operator's decision (`resolve`), in every workflow of the
        /// namespace.
        #[arg(long, conflicts_with = "id")]
        awaiting_decision: bool,
    },
    /// Approve (or reject) the approval pending in a workflow, for scope HASH (`show` lists
    /// what it shows, authorises and rests on).
    Approve {
        /// Workflow id.
        id: String,
        /// The hash (`sha256:…`) of the approval scope you reviewed.
        hash: String,
        /// Who you are: must be the identity of your token.
        #[arg(long = "as")]
        approver: String,
        /// Reject, with this reason, instead of approving.
        #[arg(long)]
        reject: Option<String>,
        /// The pending request you reviewed (`show` lists each with its number): refused if
        /// the scope is pending under another request.
        #[arg(long)]
        request: Option<u32>,
    },
    /// An artifact's kind, version, metadata and content, by hash: what an approval scope
    /// shows, authorises and rests on.
    Artifact {
        /// `show`.
        #[command(subcommand)]
        action: ArtifactAction,
    },
    /// Send a signal.
    Signal {
        /// Workflow id.
        id: String,
        /// Signal name.
        name: String,
        /// The signal's id (a repeat with the same id is dropped).
        #[arg(long)]
        signal_id: String,
        /// JSON payload.
        #[arg(long, default_value = "null")]
        payload: String,
    },
    /// Settle an operation awaiting an operator.
    Resolve {
        /// The idempotency key.
        key: String,
        /// It happened, with this JSON result.
        #[arg(long, conflicts_with_all = ["not_found", "failed"])]
        committed: Option<String>,
        /// It did not happen: run the next attempt.
        #[arg(long)]
        not_found: bool,
        /// Fail it, with this reason.
        #[arg(long)]
        failed: Option<String>,
        /// Refuse if the operation moved past this attempt.
        #[arg(long)]
        attempt: Option<u32>,
        /// Refuse if the operation went through any transition since it showed this
        /// revision (as `operations` lists it): a later call of the key may be at the same
        /// attempt number.
        #[arg(long)]
        revision: Option<u32>,
    },
    /// Cancel a running workflow.
    Cancel {
        /// Workflow id.
        id: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Fork a workflow at entry `--at` into a new one: the first entries of its journal
    /// replayed, the rest run live. Effects it committed are not fired again (the fork
    /// inherits their records) unless named with `--refire`.
    Fork {
        /// Workflow id.
        id: String,
        /// How many of its journal's entries the fork keeps (see `history`).
        #[arg(long)]
        at: u64,
        /// The fork's id (generated when not given).
        #[arg(long = "id")]
        fork_id: Option<String>,
        /// Another JSON input.
        #[arg(long)]
        input: Option<String>,
        /// A model to replace in the model calls the fork runs anew: `FROM=TO` (repeatable).
        #[arg(long = "model", value_parser = model_pair)]
        models: Vec<(String, String)>,
        /// An effect to fire again rather than inherit (repeatable).
        #[arg(long)]
        refire: Vec<String>,
    },
    /// Reset a stuck run in place: it goes on as a new run, on the code deployed now, from
    /// the first `--at` entries of its journal; the old run is kept as `ID#run-N`.
    Reset {
        /// Workflow id.
        id: String,
        /// How many of its journal's entries the new run keeps.
        #[arg(long)]
        at: u64,
    },
    /// Delete an ended workflow with every row of its own (journal, stream, inbox,
    /// operations, request id) and the artifacts no other workflow committed.
    Delete {
        /// Workflow id.
        id: String,
    },
    /// Write a workflow's export to standard output (`> ID.export`): its journal, its operation
    /// log rows and the artifacts its journal committed. From a store encrypted at rest, each
    /// record stays sealed under the current key.
    Export {
        /// Workflow id.
        id: String,
        /// Write the records in clear even from an encrypted store (for a fixture: scrub it
        /// first, see the README).
        #[arg(long)]
        plaintext: bool,
    },
    /// Seal under the current key every value of a stopped worker's data dir that is plain or
    /// under an older key, so that the older key can be dropped.
    Rekey,
    /// Write an export into a stopped worker's data dir as workflow ID: the journal, the
    /// operation log rows (rebased to ID) and the artifacts, each checked first.
    Import {
        /// The export.
        file: PathBuf,
        /// The id it gets.
        #[arg(long)]
        workflow_id: String,
    },
    /// Replay-safety figures of a running worker (its metrics) or of a data dir (its journals).
    ///
    /// From a data dir: workflows and operations by status, and what the journals say (calls
    /// needed and attempts made, unknown outcomes, reconciliations, validator depths, model
    /// tokens and cost).
    Stats,
}

/// Which workflows `list` shows.
#[derive(Args)]
struct ListArgs {
    /// Only those in this status (`running`, `awaiting_approval`, `awaiting_signal`,
    /// `awaiting_operator`, `stuck`, `completed`, `failed`).
    #[arg(long)]
    status: Option<String>,
    /// Only those of this registered workflow name.
    #[arg(long)]
    workflow: Option<String>,
    /// At most this many (a running worker's default: 100).
    #[arg(long)]
    limit: Option<usize>,
    /// Only those after this id: the `next` a page ended with.
    #[arg(long)]
    after: Option<String>,
}

#[derive(Subcommand)]
enum ArtifactAction {
    /// Print the artifact as JSON.
    Show {
        /// `sha256:…` of the artifact.
        hash: String,
    },
}

#[tokio::main]
async fn main() {
    let matches = Cli::command().get_matches();
    let url_given = matches.value_source("url") == Some(ValueSource::CommandLine);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    match run(cli, url_given).await {
        Ok(code) => std::process::exit(code),
        Err(error) => {
            eprintln!("error: {}", out::printable(&format!("{error:#}")));
            let misused = error.downcast_ref::<Usage>().is_some();
            std::process::exit(if misused { 2 } else { 1 });
        }
    }
}

/// Runs the command; the process's exit code.
async fn run(cli: Cli, url_given: bool) -> anyhow::Result<i32> {
    let out = out::Out { json: cli.json };
    if cli.json && matches!(cli.command, Command::Export { .. }) {
        return Err(usage(
            "export writes the journal's framed bytes: --json does not apply",
        ));
    }
    let target = &cli.target;
    match (&target.url, &target.data_dir) {
        (Some(_), Some(_)) if url_given => Err(usage(
            "say where the workflows are once: --url or --data-dir, not both",
        )),
        // A data dir named on the command line wins over a URL from the environment.
        (_, Some(dir)) => local::run(dir, target.namespace.as_deref(), cli.command, out).await,
        (Some(url), None) => {
            let api = api::Api::new(url, target.token.clone(), target.namespace.clone());
            api::run(api, cli.command, out).await
        }
        (None, None) => Err(usage(
            "say where the workflows are: --url (a running worker) or --data-dir",
        )),
    }
}

/// Parses a JSON argument, naming it in the error.
fn json_arg(what: &str, text: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| usage(format!("{what} is not JSON ({e}): {text}")))
}

/// A mistake in how the command was called that parsing could not see: exit code 2, as for
/// clap's own.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(message.into()))
}

/// `FROM=TO`, as `--model` takes it.
fn model_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() => {
            Ok((from.to_owned(), to.to_owned()))
        }
        _ => Err(format!("`{text}` is not FROM=TO")),
    }
}
