//! `waymark`: list, inspect and operate workflows. Against a running worker it uses the HTTP
//! API (`--url`, `--token`); against a stopped worker's data dir (`--data-dir`) it reads the
//! store directly and only reads, except `import`, which writes an exported journal into it,
//! and `rekey`. A data dir encrypted at rest opens with the keys in `WAYMARK_ENCRYPTION_KEYS`
//! (or the file `WAYMARK_ENCRYPTION_KEYS_FILE` names), as the worker's did.

mod api;
mod local;
mod stats;

use std::path::PathBuf;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};

/// Inspect and operate Waymark workflows.
#[derive(Parser)]
#[command(name = "waymark", version)]
struct Cli {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: Command,
}

/// Where the workflows are: a running worker, or a stopped worker's data dir.
#[derive(Args, Clone)]
struct Target {
    /// The worker's API, e.g. http://127.0.0.1:8080.
    #[arg(long, env = "WAYMARK_URL", global = true, conflicts_with = "data_dir")]
    url: Option<String>,
    /// The bearer token for the API.
    #[arg(long, env = "WAYMARK_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// A stopped worker's data dir, opened read-only.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// The namespace to act in (default: the token's first; in a data dir, `default`, and
    /// `list` shows every namespace's workflows as `namespace/id`).
    #[arg(long, env = "WAYMARK_NAMESPACE", global = true)]
    namespace: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Every workflow, with its name and status.
    List {
        /// Only those in this status (`running`, `awaiting_approval`, `awaiting_signal`,
        /// `awaiting_operator`, `stuck`, `completed`, `failed`).
        #[arg(long)]
        status: Option<String>,
    },
    /// A workflow's status and rendered journal.
    Show {
        /// Workflow id.
        id: String,
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
    },
    /// Cancel a running workflow.
    Cancel {
        /// Workflow id.
        id: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Delete an ended workflow with every row of its own (journal, stream, inbox,
    /// operations, request id) and the artifacts no other workflow committed.
    Delete {
        /// Workflow id.
        id: String,
    },
    /// Write a workflow's journal, framed, to standard output (`> journal.bin`). From a store
    /// encrypted at rest, each record stays sealed under the current key.
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
    /// Write an exported journal into a stopped worker's data dir as workflow ID.
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
    Stats {
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
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
    let cli = Cli::parse();
    if let Err(error) = run(cli).await {
        eprintln!("error: {error:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match (&cli.target.url, &cli.target.data_dir) {
        (Some(url), _) => {
            let target = &cli.target;
            let api = api::Api::new(url, target.token.clone(), target.namespace.clone());
            api::run(api, cli.command).await
        }
        (None, Some(dir)) => local::run(dir, cli.target.namespace.as_deref(), cli.command).await,
        (None, None) => {
            bail!("say where the workflows are: --url (a running worker) or --data-dir")
        }
    }
}

/// Parses a JSON argument, naming it in the error.
fn json_arg(what: &str, text: &str) -> anyhow::Result<serde_json::Value> {
    serde_json::from_str(text).with_context(|| format!("{what} is not JSON: {text}"))
}
