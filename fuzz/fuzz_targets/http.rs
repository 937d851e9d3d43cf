//! The worker's API on arbitrary requests: a route picked by the first byte, a `Last-Event-ID`
//! and a namespace from the next ones, the rest as the JSON body. Every answer is a 2xx or a
//! 4xx: no request makes the worker fail (5xx) or panic.

#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use waymark::http::{ApiToken, HttpConfig};
use waymark::prelude::*;
use waymark::store::{MemoryEngine, MemoryStore};
use waymark::Worker;

#[workflow]
async fn waits(ctx: WorkflowContext, _input: serde_json::Value) -> Result<String, WorkflowError> {
    let note: String = ctx.signal("go").await?;
    Ok(note)
}

const TOKEN: &str = "fuzz-token-secret";

const ROUTES: [(&str, &str); 14] = [
    ("POST", "/workflows/waits"),
    ("GET", "/workflows"),
    ("GET", "/workflows/wf-1"),
    ("GET", "/workflows/wf-1/result"),
    ("GET", "/workflows/wf-1/journal"),
    ("GET", "/workflows/wf-1/journal?format=binary"),
    ("POST", "/workflows/wf-1/signals/go"),
    ("POST", "/workflows/wf-1/approvals/sha256:0000000000000000000000000000000000000000000000000000000000000000"),
    ("POST", "/operations/wf-1%7Cbook%7C%5B%5D%7Cv1/resolve"),
    ("POST", "/operations/wf-1%7Cbook%7C%5B%5D%7Cv1/settle"),
    ("POST", "/workflows/wf-1/cancel"),
    ("POST", "/workflows/wf-1/stream/ack"),
    ("GET", "/workflows/wf-1/stream"),
    ("GET", "/artifacts/sha256:0000000000000000000000000000000000000000000000000000000000000000"),
];

struct Api {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
}

fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let router = runtime.block_on(async {
            let store = MemoryStore::on(MemoryEngine::new()).unwrap();
            let worker = Worker::builder()
                .store(Arc::new(store))
                .register(waits)
                .build()
                .await
                .unwrap();
            let spec = format!("fuzz:read+write+approve+operate+settle@default|other:{TOKEN}");
            let config = HttpConfig {
                tokens: ApiToken::parse_list(&spec).unwrap(),
                ..HttpConfig::default()
            };
            waymark::http::router(Arc::new(worker), &config).unwrap()
        });
        let api = Api { runtime, router };
        let start = serde_json::json!({"workflow_id": "wf-1"}).to_string();
        assert!(api.send("POST", "/workflows/waits", None, None, start.into_bytes()) < 300);
        api
    })
}

impl Api {
    fn send(
        &self,
        method: &str,
        path: &str,
        last_event_id: Option<&[u8]>,
        namespace: Option<&[u8]>,
        body: Vec<u8>,
    ) -> u16 {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json");
        if let Some(value) = last_event_id {
            request = request.header("last-event-id", value);
        }
        if let Some(value) = namespace {
            request = request.header("waymark-namespace", value);
        }
        // A header value the HTTP library itself refuses never reaches the worker.
        let Ok(request) = request.body(Body::from(body)) else {
            return 400;
        };
        let answer = self.runtime.block_on(self.router.clone().oneshot(request));
        answer.map(|a| a.status().as_u16()).unwrap_or(400)
    }
}

fuzz_target!(|bytes: &[u8]| {
    let Some((&route, rest)) = bytes.split_first() else {
        return;
    };
    let (method, path) = ROUTES[usize::from(route) % ROUTES.len()];
    // `\n`-separated: an optional Last-Event-ID, an optional namespace, then the body.
    let mut parts = rest.splitn(3, |b| *b == b'\n');
    let (first, second, body) = (parts.next(), parts.next(), parts.next());
    let (last_event_id, namespace, body) = match (first, second, body) {
        (Some(id), Some(ns), Some(body)) => (Some(id), Some(ns), body),
        (Some(id), Some(body), None) => (Some(id), None, body),
        _ => (None, None, rest),
    };
    let status = api().send(method, path, last_event_id, namespace, body.to_vec());
    assert!(status < 500, "{method} {path} answered {status}");
});
