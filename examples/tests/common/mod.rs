//! What the tests that run the `worker` binary share.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};

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
