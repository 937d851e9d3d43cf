//! What the tests that run the `worker` binary share.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;

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
