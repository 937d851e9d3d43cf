//! Bad input, generated: a seeded mutator (bit flips, truncations, splices, random bytes) over a
//! corpus of valid records and exports, fed to every decoder of stored records, to the replay
//! of an exported journal, to the token parser, and to the HTTP API's bodies and headers. Each
//! must answer with an error, never a panic, and the API with a JSON 4xx, never a 5xx.
//!
//! This is the stable stand-in for coverage-guided fuzzing: it runs in every `cargo test`, the
//! same inputs every time (the seed is fixed), so a failure reproduces.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use waymark::http::{self, ApiToken, HttpConfig};
use waymark::inspect::{read_framed, write_framed, WorkflowRecord};
use waymark::prelude::*;
use waymark::store::{decode_record, encode_record, ArtifactRecord, Entry, InboxMessage};
use waymark::testing::Replayer;
use waymark::Worker;
use waymark_tests::quote_and_book::{book, quote, quote_and_book, FIXTURE};

/// A small deterministic generator (xorshift64*).
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound.max(1) as u64) as usize
    }

    /// `seed` changed in one of several ways, or random bytes.
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        let mut bytes = seed.to_vec();
        for _ in 0..=self.below(4) {
            match self.below(6) {
                0 if !bytes.is_empty() => {
                    let at = self.below(bytes.len());
                    bytes[at] ^= 1 << self.below(8);
                }
                1 => bytes.truncate(self.below(bytes.len() + 1)),
                2 => {
                    let at = self.below(bytes.len() + 1);
                    let byte = self.next() as u8;
                    bytes.insert(at, byte);
                }
                3 if !bytes.is_empty() => {
                    let at = self.below(bytes.len());
                    bytes[at] = [0x00, 0xff, 0x7f, 0x80][self.below(4)];
                }
                4 => {
                    let start = self.below(bytes.len() + 1);
                    let end = start + self.below(bytes.len() - start + 1);
                    let copied = bytes[start..end].to_vec();
                    let at = self.below(bytes.len() + 1);
                    bytes.splice(at..at, copied);
                }
                _ => bytes = (0..self.below(64)).map(|_| self.next() as u8).collect(),
            }
        }
        bytes
    }
}

fn no_panic<T>(what: &str, input: &[u8], run: impl FnOnce() -> T) {
    if catch_unwind(AssertUnwindSafe(run)).is_err() {
        panic!("{what} panicked on {input:02x?}");
    }
}

fn corpus() -> Vec<Vec<u8>> {
    let export = std::fs::read(FIXTURE).expect("the fixture journal");
    let entries = read_framed(&export).expect("the fixture decodes");
    let mut corpus: Vec<Vec<u8>> = entries.iter().map(encode_record).collect();
    corpus.push(export);
    let with_rows = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/corpus/records/export-v3.bin"
    );
    corpus.push(std::fs::read(with_rows).expect("the export with rows and artifacts"));
    corpus
}

#[test]
fn stored_records_and_exports_that_do_not_decode_are_errors() {
    let corpus = corpus();
    let mut mutator = Mutator(0x5eed_1234_abcd_ef01);
    let mut refused = 0;
    for round in 0..20_000 {
        let seed = &corpus[round % corpus.len()];
        let bytes = mutator.mutate(seed);
        no_panic("an entry", &bytes, || {
            refused += usize::from(decode_record::<Entry>(&bytes).is_err());
        });
        no_panic("a workflow record", &bytes, || {
            decode_record::<WorkflowRecord>(&bytes).ok()
        });
        no_panic("an operation record", &bytes, || {
            decode_record::<waymark::operations::OperationRecord>(&bytes).ok()
        });
        no_panic("an inbox message", &bytes, || {
            decode_record::<InboxMessage>(&bytes).ok()
        });
        no_panic("an artifact", &bytes, || {
            decode_record::<ArtifactRecord>(&bytes).ok()
        });
        no_panic("an export", &bytes, || read_framed(&bytes).ok());
        no_panic("an export", &bytes, || {
            waymark::inspect::Export::read(&bytes, None).ok()
        });
    }
    assert!(
        refused > 10_000,
        "the mutations mostly break records: {refused}"
    );
}

/// Journals that decode but do not add up (entries dropped, repeated, swapped, seqs moved):
/// the replay reports them, it does not panic.
#[test]
fn replaying_a_mangled_journal_is_an_error_or_a_report_never_a_panic() {
    let export = std::fs::read(FIXTURE).expect("the fixture journal");
    let entries = read_framed(&export).expect("the fixture decodes");
    let replayer = Replayer::new()
        .register(quote_and_book)
        .register(quote)
        .register(book);
    let mut mutator = Mutator(0xfeed_0042_0042_0042);
    for _ in 0..500 {
        let mut mangled = entries.clone();
        for _ in 0..=mutator.below(3) {
            let at = mutator.below(mangled.len());
            match mutator.below(3) {
                0 => drop(mangled.remove(at)),
                1 => {
                    let repeated = mangled[at].clone();
                    mangled.insert(mutator.below(mangled.len() + 1), repeated);
                }
                _ => {
                    let other = mutator.below(mangled.len());
                    mangled.swap(at, other);
                }
            }
        }
        let bytes = write_framed(&mangled);
        no_panic("a replay", &bytes, || replayer.replay_bytes(&bytes).ok());
        let flipped = mutator.mutate(&bytes);
        no_panic("a replay of bytes", &flipped, || {
            replayer.replay_bytes(&flipped).ok()
        });
    }
}

#[test]
fn token_specs_that_do_not_parse_are_errors() {
    let mut mutator = Mutator(0x7011_7011_7011_7011);
    let seed = b"dana:read+approve:s3cret,ops:operate:o-secret\n# comment\n";
    for _ in 0..20_000 {
        let bytes = mutator.mutate(seed);
        let text = String::from_utf8_lossy(&bytes).into_owned();
        no_panic("a token spec", &bytes, || ApiToken::parse(&text).ok());
        no_panic("a token list", &bytes, || ApiToken::parse_list(&text).ok());
    }
}

#[workflow]
async fn echo(_ctx: WorkflowContext, text: String) -> Result<String, WorkflowError> {
    Ok(text)
}

/// Mangled bodies, `Last-Event-ID`s and approval decisions against a real server: every answer
/// is a JSON error or a success, never a 5xx, and the server keeps answering.
#[tokio::test(flavor = "multi_thread")]
async fn mangled_requests_get_json_4xx_answers_never_5xx() {
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::builder()
        .data_dir(dir.path().join("data"))
        .register(echo)
        .build()
        .await
        .unwrap();
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read+write+approve:d-secret").unwrap()],
        ..HttpConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(http::serve(
        worker,
        listener,
        config,
        std::future::pending(),
    ));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let started = client
        .post(format!("{base}/workflows/echo"))
        .bearer_auth("d-secret")
        .json(&serde_json::json!({"input": "hi", "workflow_id": "wf-fuzz"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), StatusCode::CREATED);
    let seeds: [(&str, &[u8]); 4] = [
        (
            "/workflows/echo",
            br#"{"input": "hello", "request_id": "r-1"}"#,
        ),
        (
            "/workflows/wf-fuzz/signals/go",
            br#"{"signal_id": "s-1", "payload": {"a": [1, 2]}}"#,
        ),
        (
            "/workflows/wf-fuzz/approvals/sha256:00",
            br#"{"decision": "reject", "reason": "no"}"#,
        ),
        (
            "/workflows/wf-fuzz/stream/ack",
            br#"{"event": 1, "channel": "web"}"#,
        ),
    ];
    let mut mutator = Mutator(0x4774_9000_0000_0001);
    for round in 0..400 {
        let (path, seed) = seeds[round % seeds.len()];
        let body = mutator.mutate(seed);
        let answer = client
            .post(format!("{base}{path}"))
            .bearer_auth("d-secret")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        check(answer, &format!("POST {path} {body:02x?}")).await;
        let header = mutator.mutate(b"12");
        let Ok(header) = reqwest::header::HeaderValue::from_bytes(&header) else {
            continue;
        };
        let answer = client
            .get(format!("{base}/workflows/wf-fuzz/stream"))
            .bearer_auth("d-secret")
            .header("last-event-id", header.clone())
            .send()
            .await
            .unwrap();
        let status = answer.status();
        assert!(
            !status.is_server_error(),
            "Last-Event-ID {header:?}: {status}"
        );
    }
}

async fn check(answer: reqwest::Response, what: &str) {
    let status = answer.status();
    let text = answer.text().await.unwrap();
    assert!(!status.is_server_error(), "{what}: {status} {text}");
    if status.is_client_error() {
        let body: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
        assert!(body["error"]["code"].is_string(), "{what}: {text}");
    }
}
