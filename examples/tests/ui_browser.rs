//! The web UI end to end, in headless Chromium driven through WebDriver (Debian's `chromium`
//! and `chromium-driver`): log in, list, open the rebooking workflow, read the approval
//! request with the arguments of the calls it authorises, approve with the keyboard, watch the
//! page go to completed without a reload, find each step in the timeline. A reader sees no
//! Approve button, and a decision posted without the page's CSRF token changes nothing.
//!
//! Without `chromedriver` on the PATH (or `WAYMARK_CHROMEDRIVER`) the test says so and passes,
//! unless `WAYMARK_REQUIRE_BROWSER` is set (as `.ci/run` does): then it fails. Screenshots of
//! each page go to `WAYMARK_UI_SCREENSHOTS` (default: the test's target directory).

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::Worker;
use waymark_examples::rebook::model::{scripted, scripted_models};
use waymark_examples::rebook::{
    load_order, notify_warehouse, rebook_carrier, rebook_shipment, search_policy,
    update_customer_eta, ShipmentRequest,
};

const DANA: &str = "dana:read+write+approve+operate:dana-secret-0123456789";
const RITA: &str = "rita:read:rita-secret-0123456789";

fn secret(token: &str) -> &str {
    token.rsplit(':').next().unwrap()
}

/// The chromedriver to run, if this machine has one.
fn chromedriver() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WAYMARK_CHROMEDRIVER") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("chromedriver"))
        .find(|candidate| candidate.is_file())
}

fn screenshots() -> PathBuf {
    let dir = std::env::var_os("WAYMARK_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots"));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

struct Driver {
    process: std::process::Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

async fn start_driver(binary: PathBuf) -> Driver {
    let port = free_port();
    let process = std::process::Command::new(binary)
        .arg(format!("--port={port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let url = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if reqwest::get(format!("{url}/status")).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Driver {
        process,
        url,
        _profile: tempfile::tempdir().unwrap(),
    }
}

async fn browser(driver: &Driver) -> Client {
    let profile = driver._profile.path().join(format!("p{}", free_port()));
    let args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1200,1400",
        &format!("--user-data-dir={}", profile.display()),
    ];
    let mut options = json!({"args": args});
    if let Some(binary) = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|b| std::path::Path::new(b).exists())
    {
        options["binary"] = json!(binary);
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".into(), options);
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a browser session")
}

struct Served {
    base: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::builder()
        .data_dir(dir.path().join("data"))
        .register(rebook_shipment)
        .register(load_order)
        .register(search_policy)
        .register(rebook_carrier)
        .register(notify_warehouse)
        .register(update_customer_eta)
        .llm(scripted(false))
        .build()
        .await
        .unwrap();
    let tokens = [DANA, RITA].map(|t| ApiToken::parse(t).unwrap());
    let config = HttpConfig {
        tokens: tokens.to_vec(),
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    tokio::spawn(http::serve(worker, listener, config, shutdown));
    Served {
        base,
        stop: Some(stop),
        _dir: dir,
    }
}

/// Starts a rebooking over the JSON API and waits until it asks for an approval.
async fn start_rebooking(served: &Served, id: &str, order: &str) {
    let request = ShipmentRequest {
        message: waymark_examples::rebook::demo::request_text(order),
        models: scripted_models(),
    };
    let client = reqwest::Client::new();
    let started = client
        .post(format!("{}/workflows/rebook_shipment", served.base))
        .bearer_auth(secret(DANA))
        .json(&json!({"input": request, "workflow_id": id}))
        .send()
        .await
        .unwrap();
    assert!(
        started.status().is_success(),
        "{}",
        started.text().await.unwrap()
    );
    for _ in 0..300 {
        if described(served, id).await["status"] == "awaiting_approval" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} never asked for an approval");
}

async fn shot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

async fn log_in(client: &Client, served: &Served, token: &str) {
    client
        .goto(&format!("{}/ui/login", served.base))
        .await
        .unwrap();
    let field = client.find(Locator::Id("secret")).await.unwrap();
    // Typed, then Enter: the form is sent from the keyboard.
    field
        .send_keys(&format!("{}\u{E007}", secret(token)))
        .await
        .unwrap();
    until_shown(client, "<h1>Workflows</h1>").await;
}

async fn source(client: &Client) -> String {
    client.source().await.unwrap()
}

/// Waits until the page (without a reload) shows `wanted`.
async fn until_shown(client: &Client, wanted: &str) -> String {
    for _ in 0..300 {
        let page = source(client).await;
        if page.contains(wanted) {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the page never showed `{wanted}`: {}", source(client).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_person_approves_exactly_what_runs_in_the_browser() {
    let Some(binary) = chromedriver() else {
        assert!(
            std::env::var_os("WAYMARK_REQUIRE_BROWSER").is_none(),
            "WAYMARK_REQUIRE_BROWSER is set and there is no chromedriver"
        );
        eprintln!("skipped: no chromedriver (install Debian's chromium and chromium-driver)");
        return;
    };
    let served = serve().await;
    start_rebooking(&served, "rebook-ui", "ORD-UI-1").await;
    let driver = start_driver(binary).await;
    let client = browser(&driver).await;

    log_in(&client, &served, DANA).await;
    let list = source(&client).await;
    assert!(
        list.contains("rebook-ui") && list.contains("awaiting approval"),
        "{list}"
    );
    shot(&client, "workflows").await;

    client
        .find(Locator::LinkText("rebook-ui"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let page = until_shown(&client, "Waiting for approval").await;
    assert!(
        page.contains("load_order"),
        "the timeline shows the steps so far"
    );
    shot(&client, "workflow").await;

    // Every approval the run asks for, decided on its own page, with the keyboard.
    let mut decided = 0;
    loop {
        let page = source(&client).await;
        if !page.contains("Approval request ") {
            break;
        }
        let link = client
            .find(Locator::Css("a[href*='/approvals/']"))
            .await
            .unwrap();
        link.click().await.unwrap();
        let approval = until_shown(&client, "What will run if approved").await;
        assert!(
            approval.contains("rebook_carrier"),
            "the call it authorises: {approval}"
        );
        assert!(
            approval.contains("ORD-UI-1"),
            "with its arguments: {approval}"
        );
        if decided == 0 {
            shot(&client, "approval").await;
        }
        press_approve_with_the_keyboard(&client).await;
        until_shown(&client, "Timeline").await;
        decided += 1;
        assert!(decided < 5, "too many approvals asked");
        // Another request is shown on a reload; the end comes by itself.
        if next_stop(&served, "rebook-ui").await == "awaiting_approval" {
            client.refresh().await.unwrap();
        }
    }
    assert!(decided >= 1);

    // The page follows the run to its end by itself (SSE), the stream included.
    let done = until_shown(
        &client,
        r#"<span class="status completed">completed</span>"#,
    )
    .await;
    for step in [
        "load_order",
        "search_policy",
        "rebook_carrier",
        "notify_warehouse",
        "update_customer_eta",
    ] {
        assert!(done.contains(step), "{step} is in the timeline");
        let summary = summary_of(&done, step);
        assert!(summary.contains("took "), "how long {step} took: {summary}");
    }
    assert!(done.contains("response version"), "the stream is shown");
    shot(&client, "workflow-completed").await;

    assert!(done.contains("executed"), "origins");

    // A fork just before the end: its steps are replayed, its effects inherited, and the
    // page says which.
    let len = described(&served, "rebook-ui").await["journal_len"]
        .as_u64()
        .unwrap();
    let fork = reqwest::Client::new()
        .post(format!("{}/workflows/rebook-ui/fork", served.base))
        .bearer_auth(secret(DANA))
        .json(&json!({"at": len - 1, "workflow_id": "rebook-ui-fork"}))
        .send()
        .await
        .unwrap();
    assert!(fork.status().is_success(), "{}", fork.text().await.unwrap());
    client
        .goto(&format!("{}/ui/workflows/rebook-ui-fork", served.base))
        .await
        .unwrap();
    let forked = until_shown(&client, r#"<span class="status completed">"#).await;
    assert!(forked.contains("replayed from rebook-ui"), "{forked}");
    assert!(forked.contains("inherited from rebook-ui"), "{forked}");

    client
        .goto(&format!("{}/ui/metrics", served.base))
        .await
        .unwrap();
    until_shown(&client, "Replay safety").await;
    shot(&client, "metrics").await;
    client.close().await.unwrap();

    a_reader_cannot_decide_and_a_forged_decision_changes_nothing(&served, &driver).await;
}

/// The timeline summary line of the first step named `step` on the page `html`.
fn summary_of<'a>(html: &'a str, step: &str) -> &'a str {
    let name = format!("<strong>{step}</strong>");
    let from = html.find(&name).unwrap_or_else(|| panic!("no step {step}"));
    let rest = &html[from..];
    &rest[..rest.find("</summary>").unwrap_or(rest.len())]
}

/// Where the workflow stops next after a decision: another approval, or its end.
async fn next_stop(served: &Served, id: &str) -> String {
    for _ in 0..300 {
        let status = described(served, id).await["status"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if status == "awaiting_approval" || status == "completed" {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{id} neither asked again nor ended");
}

/// Tabs from the top of the page to the Approve button, then presses Enter: the decision is
/// reachable and made with the keyboard alone.
async fn press_approve_with_the_keyboard(client: &Client) {
    client
        .execute(
            "document.activeElement && document.activeElement.blur()",
            vec![],
        )
        .await
        .unwrap();
    for _ in 0..80 {
        let focused = client.active_element().await.unwrap();
        if focused.attr("id").await.unwrap().as_deref() == Some("approve") {
            focused.send_keys("\u{E007}").await.unwrap();
            return;
        }
        focused.send_keys("\u{E004}").await.unwrap();
    }
    panic!("Tab never reached the Approve button");
}

async fn a_reader_cannot_decide_and_a_forged_decision_changes_nothing(
    served: &Served,
    driver: &Driver,
) {
    start_rebooking(served, "rebook-ui-2", "ORD-UI-2").await;
    let client = browser(driver).await;
    log_in(&client, served, RITA).await;
    client
        .goto(&format!("{}/ui/workflows/rebook-ui-2", served.base))
        .await
        .unwrap();
    let link = client
        .find(Locator::Css("a[href*='/approvals/']"))
        .await
        .unwrap();
    let approval_path = link.attr("href").await.unwrap().unwrap();
    link.click().await.unwrap();
    let page = until_shown(&client, "What will run if approved").await;
    assert!(page.contains("needs the approve role"), "{page}");
    assert!(
        client.find(Locator::Id("approve")).await.is_err(),
        "no Approve button"
    );
    shot(&client, "approval-reader").await;
    let rita = client.get_named_cookie("waymark_session").await.unwrap();
    let rita_csrf = csrf_of(&client).await;
    client.close().await.unwrap();

    // Dana's own session, but a form that did not come from her page: no CSRF token.
    let dana = browser(driver).await;
    log_in(&dana, served, DANA).await;
    let dana_cookie = dana.get_named_cookie("waymark_session").await.unwrap();
    let dana_csrf = csrf_of(&dana).await;
    dana.close().await.unwrap();
    let hash = pending_hash(served, "rebook-ui-2").await;
    let post = |cookie: &str, csrf: &str, hash: &str| {
        let form = [("csrf", csrf), ("decision", "approve"), ("hash", hash)];
        reqwest::Client::new()
            .post(format!("{}{approval_path}", served.base))
            .header("cookie", format!("waymark_session={cookie}"))
            .form(&form)
            .send()
    };
    let (dana_cookie, rita) = (dana_cookie.value(), rita.value());
    let forged = post(dana_cookie, "not-the-token", &hash).await.unwrap();
    assert_eq!(forged.status(), reqwest::StatusCode::FORBIDDEN);
    // The reader's own page's token, so it is the role that refuses her.
    let reader = post(rita, &rita_csrf, &hash).await.unwrap();
    assert_eq!(reader.status(), reqwest::StatusCode::FORBIDDEN);
    let said = reader.text().await.unwrap();
    assert!(said.contains("lacks the `approve` role"), "{said}");
    // Dana's own token, on a scope other than the one pending: refused as changed.
    let other = format!("sha256:{}", "0".repeat(64));
    let stale = post(dana_cookie, &dana_csrf, &other).await.unwrap();
    assert_eq!(stale.status(), reqwest::StatusCode::CONFLICT);
    assert_eq!(
        pending_hash(served, "rebook-ui-2").await,
        hash,
        "still pending"
    );
}

/// `GET /workflows/{id}` as Dana.
async fn described(served: &Served, id: &str) -> Value {
    let answer = reqwest::Client::new()
        .get(format!("{}/workflows/{id}", served.base))
        .bearer_auth(secret(DANA))
        .send()
        .await
        .unwrap();
    answer.json().await.unwrap()
}

/// The session's CSRF token, as the page's logout form carries it.
async fn csrf_of(client: &Client) -> String {
    let field = client.find(Locator::Css("input[name=csrf]")).await.unwrap();
    field.attr("value").await.unwrap().expect("a CSRF token")
}

/// The scope hash of the workflow's pending approval.
async fn pending_hash(served: &Served, id: &str) -> String {
    let shown = described(served, id).await;
    let pending = shown["pending_approvals"][0]["artifact_hash"].as_str();
    pending.expect("an approval is pending").to_owned()
}
