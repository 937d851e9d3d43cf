//! What the tests that run the `worker` binary share.

// Not every test that shares this module calls every helper.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};

use serde_json::Value;

/// The `worker` binary on `dir`, listening on a free loopback port, with `tokens`
/// (`WAYMARK_TOKENS`) and its standard output piped, for [`listening_base`].
pub(crate) fn worker_command(dir: &Path, tokens: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_worker"));
    command
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .env("WAYMARK_TOKENS", tokens)
        .stdout(Stdio::piped());
    command
}

/// The base URL of a worker process, from the `listening on ADDRESS` line it prints first.
pub(crate) fn listening_base(stdout: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .expect("the address line");
    format!("http://{address}")
}

/// `POST base+path` with `body` as JSON and `token`: the status and the JSON answered
/// (`Null` if none).
pub(crate) async fn post(base: &str, token: &str, path: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `GET base+path` with `token`: the text answered.
pub(crate) async fn get_text(base: &str, token: &str, path: &str) -> String {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    response.text().await.unwrap()
}

/// `GET base+path` with `token`: the JSON answered.
pub(crate) async fn get(base: &str, token: &str, path: &str) -> Value {
    serde_json::from_str(&get_text(base, token, path).await).unwrap()
}
