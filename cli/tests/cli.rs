//! The `waymark` command against a running worker's API and against its data dir once it has
//! stopped: list, show, signal, approve (identity checked against the token), export, import,
//! stats; changes refused on a data dir, which is opened read-only.

use std::path::Path;
use std::process::{Command, Output};

use waymark::approvals::{ApprovalOutcome, ArtifactMeta};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::prelude::*;
use waymark::Worker;

#[workflow]
async fn confirm_plan(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    let plan = ctx.artifact_with(format!("refund {order_id}"), ArtifactMeta::new("plan"))?;
    let ApprovalOutcome::Approved(approval) = ctx.approval(&plan).await else {
        return Err(WorkflowError::new("not approved"));
    };
    let note: String = ctx.signal("note").await?;
    Ok(format!("{note} (approved by {})", approval.approver()))
}

/// Ends at once, with its input.
#[workflow]
async fn echo_order(_ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(order_id)
}

/// Never answers: without a reconciler, its call waits for an operator.
#[activity(effect)]
async fn unanswered(#[key] order_id: String) -> Result<String, ActivityError> {
    Err(ActivityError::uncertain(format!(
        "no answer about {order_id}"
    )))
}

#[workflow]
async fn notice(ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Ok(ctx.effect(unanswered, order_id).await?)
}

/// Fails at once.
#[workflow]
async fn refuses(_ctx: WorkflowContext, order_id: String) -> Result<String, WorkflowError> {
    Err(WorkflowError::new(format!("no refund for {order_id}")))
}

fn waymark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(args)
        .env_remove("WAYMARK_URL")
        .env_remove("WAYMARK_TOKEN")
        .output()
        .expect("the waymark binary runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    assert!(!output.status.success(), "expected a failure");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn serve(
    data: &Path,
) -> (
    String,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let worker = Worker::builder()
        .data_dir(data)
        .register(confirm_plan)
        .register(echo_order)
        .register(refuses)
        .register(notice)
        .register(unanswered)
        .build()
        .await
        .unwrap();
    let tokens = ["dana:read+write+approve+operate:d-secret"].map(|t| ApiToken::parse(t).unwrap());
    let config = HttpConfig {
        tokens: tokens.to_vec(),
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let server = tokio::spawn(async move {
        http::serve(worker, listener, config, shutdown)
            .await
            .unwrap();
    });
    (url, stop, server)
}

async fn start(url: &str, id: &str) {
    let body = serde_json::json!({"input": "ORD-9", "workflow_id": id});
    let response = reqwest::Client::new()
        .post(format!("{url}/workflows/confirm_plan"))
        .bearer_auth("d-secret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
}

async fn eventually(check: impl Fn() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never happened");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cli_operates_a_running_worker_and_reads_a_stopped_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (url, stop, server) = serve(&data).await;
    start(&url, "ticket-1").await;
    let api = ["--url", url.as_str(), "--token", "d-secret"];
    let run = |args: &[&str]| waymark(&[&api[..], args].concat());

    let pending = || stdout(&run(&["show", "ticket-1"])).contains("pending approval: sha256:");
    eventually(pending).await;
    let shown = stdout(&run(&["show", "ticket-1"]));
    let hash = shown
        .lines()
        .find_map(|l| l.strip_prefix("pending approval: "))
        .unwrap()
        .to_owned();
    assert!(shown.contains("\n  shows sha256:"), "{shown}");
    assert!(stdout(&run(&["list"])).contains("ticket-1"));

    let impostor = stderr(&run(&["approve", "ticket-1", &hash, "--as", "ceo"]));
    assert!(
        impostor.contains("your token identifies you as `dana`, not `ceo`"),
        "{impostor}"
    );
    // What the scope shows, read before deciding.
    let scope = stdout(&run(&["artifact", "show", &hash]));
    assert!(scope.contains("\"kind\": \"approval_scope\""), "{scope}");
    let wrong_request = stderr(&run(&[
        "approve",
        "ticket-1",
        &hash,
        "--as",
        "dana",
        "--request",
        "99",
    ]));
    assert!(
        wrong_request.contains("409 Conflict: approval request 99"),
        "another request is refused: {wrong_request}"
    );
    stdout(&run(&["approve", "ticket-1", &hash, "--as", "dana"]));
    let sent = stdout(&run(&[
        "signal",
        "ticket-1",
        "note",
        "--signal-id",
        "n-1",
        "--payload",
        "\"refund sent\"",
    ]));
    assert!(sent.contains("accepted"), "{sent}");
    let done = || stdout(&run(&["show", "ticket-1"])).contains("workflow_completed");
    eventually(done).await;
    let export = run(&["export", "ticket-1"]);
    let exported = export.stdout.clone();
    stdout(&export);
    let stats = stdout(&run(&["stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["source"], "worker");
    assert_eq!(stats["workflows"]["completed"], 1, "{stats}");
    let samples = stats["metrics"].as_array().unwrap();
    let names: Vec<&str> = samples.iter().filter_map(|s| s["name"].as_str()).collect();
    assert!(
        names.contains(&"waymark_approval_hash_mismatches_total"),
        "{names:?}"
    );

    let _ = stop.send(());
    server.await.unwrap();

    let data_dir = data.to_str().unwrap();
    let local = |args: &[&str]| waymark(&[&["--data-dir", data_dir][..], args].concat());
    let shown = stdout(&local(&["show", "ticket-1"]));
    assert!(shown.contains("refund sent (approved by dana)"), "{shown}");
    assert_eq!(
        local(&["export", "ticket-1"]).stdout,
        exported,
        "same bytes either way"
    );
    let refused = stderr(&local(&[
        "signal",
        "ticket-1",
        "note",
        "--signal-id",
        "n-2",
    ]));
    assert!(refused.contains("opened read-only"), "{refused}");

    let file = dir.path().join("journal.bin");
    std::fs::write(&file, &exported).unwrap();
    let imported = stdout(&local(&[
        "import",
        file.to_str().unwrap(),
        "--workflow-id",
        "ticket-copy",
    ]));
    assert!(imported.contains("imported"), "{imported}");
    let again = stderr(&local(&[
        "import",
        file.to_str().unwrap(),
        "--workflow-id",
        "ticket-copy",
    ]));
    assert!(again.contains("journal has"), "{again}");
    std::fs::write(&file, b"garbage").unwrap();
    let garbage = stderr(&local(&[
        "import",
        file.to_str().unwrap(),
        "--workflow-id",
        "x",
    ]));
    assert!(garbage.contains("does not decode"), "{garbage}");
    let stats = stdout(&local(&["stats"]));
    let completed = stats
        .lines()
        .find(|l| l.trim_start().starts_with("completed"));
    assert!(completed.is_some_and(|l| l.ends_with(" 2")), "{stats}");
    assert!(
        stats.contains("journals") && stats.contains("ideal_calls"),
        "{stats}"
    );
    let stats = stdout(&local(&["stats", "--json"]));
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert_eq!(stats["source"], "data_dir");
    assert_eq!(
        stats["journals"]["ideal_calls"], 0,
        "no activity ran: {stats}"
    );
    let awaiting = stdout(&local(&["operations", "--awaiting-decision", "--json"]));
    let awaiting: serde_json::Value = serde_json::from_str(&awaiting).unwrap();
    assert_eq!(awaiting, serde_json::json!([]), "no effect ran");
    let both = stderr(&local(&["operations", "ticket-1", "--awaiting-decision"]));
    assert!(both.contains("cannot be used with"), "{both}");
    let missing = stderr(&waymark(&["list"]));
    assert!(missing.contains("--url"), "{missing}");
}

const KEY_A: &str = "a:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY_B: &str = "b:ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// `waymark --data-dir DATA args…` with the encryption keys `keys` (none: unset).
fn sealed_cli(data: &Path, keys: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_waymark"));
    command.arg("--data-dir").arg(data).args(args);
    command.env_remove("WAYMARK_ENCRYPTION_KEYS_FILE");
    match keys {
        Some(keys) => command.env("WAYMARK_ENCRYPTION_KEYS", keys),
        None => command.env_remove("WAYMARK_ENCRYPTION_KEYS"),
    };
    command.output().expect("the waymark binary runs")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encrypted_data_dir_opens_with_its_keys_exports_sealed_and_rekeys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let worker = Worker::builder()
        .data_dir(&data)
        .encryption(waymark::codec::Keyring::parse(KEY_A).unwrap())
        .register(confirm_plan)
        .build()
        .await
        .unwrap();
    let options = waymark::StartOptions {
        workflow_id: Some("sealed-1".into()),
        ..waymark::StartOptions::default()
    };
    worker
        .start_with(confirm_plan, "ORD-SECRET-7".to_owned(), options)
        .await
        .unwrap();
    let asked = || {
        let journal = worker.journal("sealed-1").unwrap_or_default();
        format!("{journal:?}").contains("ApprovalRequested")
    };
    eventually(asked).await;
    worker.shutdown().await;

    let refused = stderr(&sealed_cli(&data, None, &["list"]));
    assert!(refused.contains("encrypted at rest"), "{refused}");
    let listed = stdout(&sealed_cli(&data, Some(KEY_A), &["list"]));
    assert!(listed.contains("sealed-1"), "{listed}");

    // The export stays sealed unless asked for in clear, and imports with the keys.
    let sealed = sealed_cli(&data, Some(KEY_A), &["export", "sealed-1"]).stdout;
    let holds = |bytes: &[u8]| bytes.windows(12).any(|w| w == b"ORD-SECRET-7");
    assert!(!sealed.is_empty() && !holds(&sealed));
    let plain = sealed_cli(&data, Some(KEY_A), &["export", "sealed-1", "--plaintext"]);
    assert!(plain.status.success() && holds(&plain.stdout));
    let file = dir.path().join("sealed.journal");
    std::fs::write(&file, &sealed).unwrap();
    let path = file.to_str().unwrap();
    let import = ["import", path, "--workflow-id", "sealed-copy"];
    let refused = stderr(&sealed_cli(&data, None, &import));
    assert!(refused.contains("no keys were given"), "{refused}");
    stdout(&sealed_cli(&data, Some(KEY_A), &import));

    // Rotated and rekeyed, the store no longer needs the old key.
    let rotated = format!("{KEY_B},{KEY_A}");
    let rekeyed = stdout(&sealed_cli(&data, Some(&rotated), &["rekey"]));
    assert!(rekeyed.contains("sealed anew"), "{rekeyed}");
    let shown = stdout(&sealed_cli(&data, Some(KEY_B), &["show", "sealed-copy"]));
    assert!(shown.contains("ORD-SECRET-7"), "{shown}");
    let old_key_only = stderr(&sealed_cli(&data, Some(KEY_A), &["show", "sealed-1"]));
    assert!(old_key_only.contains("key `b`"), "{old_key_only}");
}

/// Runs `args` and parses what it printed as JSON.
fn json_of(output: &Output) -> serde_json::Value {
    let text = stdout(output);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_answers_in_json_against_a_running_worker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (url, stop, server) = serve(&data).await;
    let api = ["--url", url.as_str(), "--token", "d-secret", "--json"];
    let run = |args: &[&str]| waymark(&[&api[..], args].concat());

    let started = json_of(&run(&[
        "start",
        "echo_order",
        "--input",
        "\"ORD-1\"",
        "--id",
        "e-1",
        "--request-id",
        "r-1",
    ]));
    assert_eq!(started["workflow_id"], "e-1");
    let again = json_of(&run(&[
        "start",
        "echo_order",
        "--input",
        "\"ORD-1\"",
        "--request-id",
        "r-1",
    ]));
    assert_eq!(
        (again["workflow_id"].as_str(), again["existed"].as_bool()),
        (Some("e-1"), Some(true))
    );
    let result = json_of(&run(&["result", "e-1"]));
    assert_eq!(result["output"], "ORD-1", "{result}");
    for i in 2..=4 {
        let id = format!("e-{i}");
        json_of(&run(&[
            "start",
            "echo_order",
            "--id",
            &id,
            "--input",
            "\"ORD\"",
        ]));
        json_of(&run(&["result", &id]));
    }
    json_of(&run(&[
        "start",
        "refuses",
        "--id",
        "f-1",
        "--input",
        "\"ORD-9\"",
    ]));
    let failed = run(&["result", "f-1"]);
    assert_eq!(
        failed.status.code(),
        Some(3),
        "a failed workflow's result exits 3"
    );

    // Filters and paging: two at a time, in id order, `next` to go on.
    let first = json_of(&run(&["list", "--workflow", "echo_order", "--limit", "2"]));
    let ids = |page: &serde_json::Value| -> Vec<String> {
        let rows = page["workflows"].as_array().unwrap();
        rows.iter()
            .map(|r| r["workflow_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ids(&first), ["e-1", "e-2"]);
    let next = first["next"].as_str().unwrap();
    let second = json_of(&run(&[
        "list",
        "--workflow",
        "echo_order",
        "--limit",
        "2",
        "--after",
        next,
    ]));
    assert_eq!(ids(&second), ["e-3", "e-4"]);
    assert!(second["next"].is_null(), "{second}");
    let failed = json_of(&run(&["list", "--status", "failed"]));
    assert_eq!(ids(&failed), ["f-1"]);

    let described = json_of(&run(&["describe", "e-1"]));
    assert_eq!(described["status"], "completed");
    let history = json_of(&run(&["history", "e-1"]));
    let entries = history["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e.as_str().unwrap().contains("workflow_completed")),
        "{history}"
    );
    let followed = run(&["history", "e-1", "--follow"]);
    let lines: Vec<serde_json::Value> = stdout(&followed)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        entries.len(),
        "one JSON object per entry, and done: it ended"
    );
    let operations = json_of(&run(&["operations", "e-1"]));
    assert!(
        operations.as_array().is_some_and(Vec::is_empty),
        "{operations}"
    );
    let awaiting = || json_of(&run(&["operations", "--awaiting-decision"]));
    assert_eq!(awaiting(), serde_json::json!([]), "no effect ran");
    let start = ["start", "notice", "--input", "\"ORD-2\"", "--id", "n-1"];
    json_of(&run(&start));
    // The call's record is first written `unknown_outcome`; with no reconciler, the run then
    // hands it to an operator. Both are listed, so wait for the second.
    let handed_to_operator = |rows: &serde_json::Value| {
        rows.as_array()
            .is_some_and(|rows| rows.len() == 1 && rows[0]["status"] == "awaiting_operator")
    };
    eventually(|| handed_to_operator(&awaiting())).await;
    let decide = awaiting();
    let row = &decide[0];
    assert_eq!(row["key"], r#"n-1|unanswered|["ORD-2"]|v1"#, "{decide}");
    assert_eq!(
        (&row["workflow_id"], &row["status"]),
        (&"n-1".into(), &"awaiting_operator".into())
    );
    // A decision made on an earlier revision of the operation than the one listed is
    // refused, and changes nothing.
    let key = row["key"].as_str().unwrap();
    let earlier = (row["revision"].as_u64().unwrap() - 1).to_string();
    let refused = stderr(&run(&[
        "resolve",
        key,
        "--not-found",
        "--revision",
        &earlier,
    ]));
    assert!(
        refused.contains("409") && refused.contains("changed since it was read"),
        "{refused}"
    );
    assert_eq!(awaiting(), decide);
    let stats = json_of(&run(&["stats"]));
    assert_eq!(stats["workflows"]["completed"], 4, "{stats}");

    // A fork after the start runs the rest anew and ends as its source did.
    let forked = json_of(&run(&["fork", "e-1", "--at", "1", "--id", "e-1-fork"]));
    assert_eq!(forked["workflow_id"], "e-1-fork");
    let (source, fork) = (run(&["result", "e-1"]), run(&["result", "e-1-fork"]));
    assert_eq!(json_of(&fork)["output"], json_of(&source)["output"]);
    let refused = stderr(&run(&["fork", "e-1", "--at", "0"]));
    assert!(
        refused.contains("400") && refused.contains("entry 0"),
        "{refused}"
    );
    // Only a stuck run is reset.
    let refused = stderr(&run(&["reset", "e-1", "--at", "1"]));
    assert!(
        refused.contains("409") && refused.contains("only a stuck run"),
        "{refused}"
    );

    let deleted = json_of(&run(&["delete", "e-4"]));
    assert_eq!(deleted["deleted"], true);
    let gone = stderr(&run(&["describe", "e-4"]));
    assert!(gone.contains("404"), "{gone}");
    json_of(&run(&[
        "start",
        "confirm_plan",
        "--id",
        "waits",
        "--input",
        "\"ORD-3\"",
    ]));
    let running = stderr(&run(&["delete", "waits"]));
    assert!(
        running.contains("409") && running.contains("has not ended"),
        "{running}"
    );

    // Text escapes what an id or a payload holds: no terminal control reaches the screen.
    let text = |args: &[&str]| waymark(&[&api[..4], args].concat());
    let odd = stdout(&text(&[
        "start",
        "echo_order",
        "--id",
        "e-5",
        "--input",
        "\"\\u001b[2J\"",
    ]));
    assert_eq!(odd.trim(), "e-5");
    let output = stdout(&text(&["result", "e-5"]));
    assert!(
        !output.contains('\u{1b}') && output.contains("\\u001b[2J"),
        "{output:?}"
    );

    let _ = stop.send(());
    server.await.unwrap();
    // A data dir on the command line wins over a worker's URL from the environment.
    let listed = Command::new(env!("CARGO_BIN_EXE_waymark"))
        .args(["--data-dir", data.to_str().unwrap(), "--json", "list"])
        .env("WAYMARK_URL", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let listed = json_of(&listed);
    assert!(ids(&listed).contains(&"e-1".to_owned()), "{listed}");
    // The same list of what awaits a decision, read from the data dir.
    let data_dir = data.to_str().unwrap();
    let local = [
        "--data-dir",
        data_dir,
        "--json",
        "operations",
        "--awaiting-decision",
    ];
    assert_eq!(json_of(&waymark(&local)), decide);
    let named = waymark(&[&local[..], &["--namespace", "no such!"]].concat());
    assert!(stderr(&named).contains("namespace"));

    // A misuse parsing cannot see is a usage error too: exit code 2.
    let both = waymark(&[
        "--url",
        "http://127.0.0.1:9",
        "--data-dir",
        data_dir,
        "list",
    ]);
    let binary = waymark(&["--data-dir", data_dir, "--json", "export", "e-1"]);
    let paging = waymark(&["--data-dir", data_dir, "list", "--after", "e-1"]);
    for misuse in [both, binary, paging] {
        assert_eq!(misuse.status.code(), Some(2), "{}", stderr(&misuse));
    }
    let page = waymark(&[
        "--data-dir",
        data_dir,
        "--namespace",
        "default",
        "--json",
        "list",
        "--limit",
        "1",
    ]);
    let page = json_of(&page);
    assert_eq!(page["next"], page["workflows"][0]["workflow_id"], "{page}");
}
