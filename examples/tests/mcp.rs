//! MCP tools as journaled agent steps, against the `mcp_carrier` server this package builds,
//! started over stdio. The server's ledger file is what the carrier did: one line per booking.

use std::path::{Path, PathBuf};
use std::time::Duration;

use waymark::inspect::Entry;
use waymark::llm::{Role, ScriptedProvider, LLM_ACTIVITY};
use waymark::mcp::{McpError, McpServer, McpTools, MCP_TOOLS_ACTIVITY};
use waymark::prelude::*;
use waymark::testing::{Boundary, Fault, PlannedFault, TestEnv};
use waymark::{StartOptions, WorkerBuilder};

#[workflow]
async fn carrier_agent(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let agent = Agent::new("planner")
        .system("You rebook late parcels.")
        .mcp("carrier");
    let answer = ctx
        .agent(&agent, vec![Message::user(format!("{order_id} is late"))])
        .await?;
    Ok(answer.text)
}

fn server(ledger: &Path) -> McpServer {
    let ledger = ledger.to_str().expect("a UTF-8 temp path");
    McpServer::stdio("carrier", env!("CARGO_BIN_EXE_mcp_carrier")).env("MCP_CARRIER_LEDGER", ledger)
}

async fn connected(ledger: &Path) -> McpTools {
    let server = server(ledger)
        .effect("book", &["order_id"])
        .reconcile_with("find_booking");
    server.connect().await.expect("the carrier server starts")
}

fn bookings(ledger: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(ledger).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

async fn env_with(
    tools: &McpTools,
    scripted: &ScriptedProvider,
    faults: Vec<PlannedFault>,
) -> TestEnv {
    let (tools, scripted) = (tools.clone(), scripted.clone());
    let setup = move |b: WorkerBuilder| {
        b.register(carrier_agent)
            .mcp(tools.clone())
            .llm(scripted.clone())
            .llm_options(ActivityOptions::default().initial_backoff(Duration::from_millis(10)))
    };
    TestEnv::with_faults(faults, setup).await.unwrap()
}

fn start_options(wf: &str) -> StartOptions {
    StartOptions {
        workflow_id: Some(wf.to_owned()),
        ..StartOptions::default()
    }
}

fn ledger_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("bookings.tsv")
}

const TRACK: (&str, &str) = ("carrier__track", r#"{"order_id":"ORD-9"}"#);
const BOOK: (&str, &str) = (
    "carrier__book",
    r#"{"order_id":"ORD-9","carrier":"rapidpost"}"#,
);
const FINAL: &str = "ORD-9 is booked with rapidpost.";

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_effect_is_called_once_across_a_crash_and_the_list_is_journaled_once() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let tools = connected(&ledger).await;
    book_through_a_crash(&tools, &ledger).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_same_holds_for_a_server_reached_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let (_server, url) = http_server(&ledger).await;
    let tools = McpServer::streamable_http("carrier", &url)
        .effect("book", &["order_id"])
        .reconcile_with("find_booking")
        .connect()
        .await
        .expect("the carrier answers over HTTP");
    book_through_a_crash(&tools, &ledger).await;
}

/// Starts `mcp_carrier --http` on a free port; the child is killed when dropped.
async fn http_server(ledger: &Path) -> (tokio::process::Child, String) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp_carrier"))
        .args(["--http", "127.0.0.1:0"])
        .env("MCP_CARRIER_LEDGER", ledger)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("mcp_carrier starts");
    let stdout = child.stdout.take().expect("its stdout is piped");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = lines.next_line().await.unwrap().expect("it prints its URL");
    (child, url)
}

/// A track and a booking, with the worker killed after the carrier booked.
async fn book_through_a_crash(tools: &McpTools, ledger: &Path) {
    let scripted = ScriptedProvider::default()
        .tool_calls(&[TRACK])
        .tool_calls(&[BOOK])
        .reply(FINAL);
    // The carrier booked; the worker dies before the booking is journaled.
    let crash = PlannedFault::at("mcp.carrier.book", 1, Boundary::AfterCall, Fault::Crash);
    let mut env = env_with(tools, &scripted, vec![crash]).await;
    let wf = "mcp-agent";
    env.worker()
        .start_with(carrier_agent, "ORD-9".into(), start_options(wf))
        .await
        .unwrap();
    let outcome = env.finish(carrier_agent, wf, 20).await.unwrap();
    assert_eq!(outcome.unwrap(), FINAL);
    assert_eq!(env.faults().fired().len(), 1, "the crash fired");

    // One booking: after the crash the lookup tool found it under its key.
    let booked = bookings(ledger);
    assert_eq!(booked.len(), 1, "{booked:?}");
    let key = r#"mcp-agent|mcp.carrier.book|["ORD-9"]|v1"#;
    assert!(booked[0].contains(key), "{booked:?}");
    let journal = env.worker().journal(wf).unwrap();
    assert!(
        journal
            .iter()
            .any(|e| matches!(e, Entry::EffectReconciled { .. })),
        "reconciled, not called again"
    );
    // The list is a step: journaled once, replayed after the crash.
    let listings = journal
        .iter()
        .filter_map(|e| e.command())
        .filter(|(_, identity)| identity.name == MCP_TOOLS_ACTIVITY)
        .count();
    assert_eq!(listings, 1);
    // The model was offered the server's tools, with the server's descriptions and schemas.
    let first = &scripted.requests()[0];
    let offered: Vec<&str> = first.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        offered,
        ["carrier__book", "carrier__find_booking", "carrier__track"]
    );
    assert_eq!(
        first.tools[0].parameters["required"],
        serde_json::json!(["order_id", "carrier"])
    );
    let last = scripted.requests().pop().unwrap();
    let results: Vec<&str> = last
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        results,
        [r#""ORD-9 is at the depot, 2 days late""#, r#""MCP-BK-1""#]
    );
    let llm_calls = journal
        .iter()
        .filter_map(|e| e.command())
        .filter(|(_, identity)| identity.name == LLM_ACTIVITY)
        .count();
    assert_eq!(llm_calls, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn arguments_that_do_not_fit_the_servers_schema_never_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&dir);
    let tools = connected(&ledger).await;
    let scripted = ScriptedProvider::default()
        .tool_calls(&[("carrier__book", r#"{"order_id":9,"carrier":"rapidpost"}"#)])
        .reply("I could not book it.");
    let mut env = env_with(&tools, &scripted, vec![]).await;
    let wf = "mcp-misfit";
    env.worker()
        .start_with(carrier_agent, "ORD-9".into(), start_options(wf))
        .await
        .unwrap();
    let outcome = env.finish(carrier_agent, wf, 20).await.unwrap();
    assert_eq!(outcome.unwrap(), "I could not book it.");
    assert!(bookings(&ledger).is_empty());
    let told = scripted.requests()[1]
        .messages
        .last()
        .unwrap()
        .content
        .clone();
    assert_eq!(
        told,
        "refused: arguments.order_id must be string, not integer"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_that_may_change_the_world_must_be_declared_an_effect() {
    let dir = tempfile::tempdir().unwrap();
    let refused = server(&ledger_in(&dir)).connect().await.unwrap_err();
    assert_eq!(
        refused,
        McpError::Declaration {
            server: "carrier".into(),
            message: "the tool `book` may change the world (it is not annotated read-only): \
                      declare it with `.effect(\"book\", &[..])`, naming the arguments its \
                      idempotency key is built from, or with `.read(\"book\")` if it only reads"
                .into(),
        }
    );
    let unknown_key = server(&ledger_in(&dir)).effect("book", &["parcel"]);
    let refused = unknown_key.connect().await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "MCP server `carrier`: the effect `book` takes no argument `parcel` for its key"
    );
    let unknown_tool = server(&ledger_in(&dir))
        .effect("book", &["order_id"])
        .effect("cancel", &["order_id"]);
    let refused = unknown_tool.connect().await.unwrap_err();
    assert_eq!(
        refused.to_string(),
        "MCP server `carrier`: the server has no tool `cancel`"
    );
}
