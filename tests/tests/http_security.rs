//! The API is closed by default: no tokens, no server (unless asked for an unauthenticated one
//! on loopback, which then answers only to loopback host names); a token is checked before a
//! body is read; two tokens cannot share a secret. Every refusal is a JSON error that changes
//! nothing.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use waymark::http::{self, ApiToken, HttpConfig, HttpConfigError};
use waymark::prelude::*;
use waymark::Worker;

#[workflow]
async fn echo(_ctx: WorkflowContext, text: String) -> Result<String, WorkflowError> {
    Ok(text)
}

/// Waits for ten `go` signals.
#[workflow]
async fn waits(ctx: WorkflowContext, _input: ()) -> Result<(), WorkflowError> {
    for _ in 0..10 {
        let _: String = ctx.signal("go").await?;
    }
    Ok(())
}

async fn worker(dir: &tempfile::TempDir) -> Worker {
    Worker::builder()
        .data_dir(dir.path().join("data"))
        .register(echo)
        .register(waits)
        .build()
        .await
        .unwrap()
}

/// Serves `config` on `address`; the base URL, or the server's refusal.
async fn serve(
    dir: &tempfile::TempDir,
    address: &str,
    config: HttpConfig,
) -> Result<String, std::io::Error> {
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let worker = worker(dir).await;
    let serving = tokio::spawn(http::serve(
        worker,
        listener,
        config,
        std::future::pending(),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    if serving.is_finished() {
        return Err(serving.await.unwrap().unwrap_err());
    }
    Ok(base)
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no JSON error>")
}

#[tokio::test]
async fn without_tokens_the_api_does_not_start_and_says_how_to_configure_them() {
    let dir = tempfile::tempdir().unwrap();
    let refused = serve(&dir, "127.0.0.1:0", HttpConfig::default())
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("WAYMARK_TOKENS="), "{message}");
    assert!(message.contains("insecure_local"), "{message}");
}

#[tokio::test]
async fn an_unauthenticated_api_is_refused_off_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let refused = serve(&dir, "0.0.0.0:0", HttpConfig::insecure_local())
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("loopback"), "{refused}");
}

#[tokio::test]
async fn an_unauthenticated_local_api_answers_only_loopback_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let base = serve(&dir, "127.0.0.1:0", HttpConfig::insecure_local())
        .await
        .unwrap();
    let client = Client::new();
    let start = |host: &str| {
        client
            .post(format!("{base}/workflows/echo"))
            .header("host", host)
            .json(&json!({"input": "hi", "workflow_id": format!("wf-{host}")}))
            .send()
    };
    // A page served from another name that resolves to 127.0.0.1 sends its own name.
    let rebound = start("evil.example:8080").await.unwrap();
    assert_eq!(rebound.status(), StatusCode::FORBIDDEN);
    let body: Value = rebound.json().await.unwrap();
    assert_eq!(error_code(&body), "foreign_host");
    let local = start("localhost").await.unwrap();
    assert_eq!(local.status(), StatusCode::CREATED);
    let listed: Value = client
        .get(format!("{base}/workflows"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["workflows"].as_array().unwrap().len(),
        1,
        "the foreign request started nothing: {listed}"
    );
}

#[tokio::test]
async fn a_token_is_checked_before_the_body_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read+write:d-secret").unwrap()],
        max_body_bytes: 1024,
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config).await.unwrap();
    let client = Client::new();
    let oversized = format!("{{\"input\": \"{}\"}}", "x".repeat(64 * 1024));
    for token in [None, Some("wrong-secret")] {
        let mut request = client
            .post(format!("{base}/workflows/echo"))
            .header("content-type", "application/json")
            .body(oversized.clone());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let refused = request.send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(error_code(&body), "unauthorized");
        assert!(!body.to_string().contains("wrong-secret"), "{body}");
    }
    // A body that never arrives: the refusal does not wait for it.
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /workflows/echo HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: 100000\r\n\r\n{{\"input\": \""
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer)).await;
    let read = read
        .expect("answered without waiting for the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let health = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK, "the health check is open");
}

#[tokio::test]
async fn two_tokens_with_one_secret_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = ["dana:approve:s3cr3t-twin", "ops:operate:s3cr3t-twin"]
        .map(|t| ApiToken::parse(t).unwrap());
    let config = HttpConfig {
        tokens: tokens.to_vec(),
        ..HttpConfig::default()
    };
    let refused = serve(&dir, "127.0.0.1:0", config).await.unwrap_err();
    let expected = HttpConfigError::DuplicateSecret("dana".into(), "ops".into());
    assert_eq!(refused.to_string(), expected.to_string());
    assert!(
        !refused.to_string().contains("s3cr3t"),
        "the secret is not shown"
    );
}

/// TLS with a certificate made for the test: a client that trusts it is served, plain HTTP is
/// not, and a key that does not fit is refused at start, naming the file.
#[tokio::test]
async fn the_api_is_served_over_tls_with_the_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let certificate = dir.path().join("cert.pem");
    let private_key = dir.path().join("key.pem");
    std::fs::write(&certificate, certified.cert.pem()).unwrap();
    std::fs::write(&private_key, certified.key_pair.serialize_pem()).unwrap();
    let tls = http::TlsConfig {
        certificate: certificate.clone(),
        private_key,
    };
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read:d-secret").unwrap()],
        tls: Some(tls),
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config.clone()).await.unwrap();
    let port = base.rsplit(':').next().unwrap();
    let trusted = reqwest::Certificate::from_pem(certified.cert.pem().as_bytes()).unwrap();
    let client = Client::builder()
        .add_root_certificate(trusted)
        .build()
        .unwrap();
    let whoami = client
        .get(format!("https://localhost:{port}/whoami"))
        .bearer_auth("d-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(whoami.status(), StatusCode::OK);
    let me: Value = whoami.json().await.unwrap();
    assert_eq!(me["name"], "dana");
    let plain = Client::new()
        .get(format!("http://localhost:{port}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.map_or(true, |answer| !answer.status().is_success()),
        "plain HTTP is not served"
    );

    let other = tempfile::tempdir().unwrap();
    let mismatched = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let wrong_key = other.path().join("other-key.pem");
    std::fs::write(&wrong_key, mismatched.key_pair.serialize_pem()).unwrap();
    let mut wrong = config;
    wrong.tls = Some(http::TlsConfig {
        certificate,
        private_key: wrong_key,
    });
    let refused = serve(&other, "127.0.0.1:0", wrong).await.unwrap_err();
    assert!(refused.to_string().contains("do not fit"), "{refused}");
}

/// One token, one workflow's signals, one workflow's readers: each bounded, and what is refused
/// (429) changes nothing.
#[tokio::test]
async fn requests_signals_and_stream_readers_are_limited() {
    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig {
        tokens: ["dana:read+write:d-secret", "ops:read:o-secret"]
            .map(|t| ApiToken::parse(t).unwrap())
            .to_vec(),
        requests_per_minute: 8,
        signals_per_minute: 2,
        max_stream_readers: 1,
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config).await.unwrap();
    let client = Client::new();
    let started = client
        .post(format!("{base}/workflows/waits"))
        .bearer_auth("d-secret")
        .json(&json!({"input": null, "workflow_id": "wf-limits"}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), StatusCode::CREATED);
    let mut statuses = Vec::new();
    for n in 0..3 {
        let sent = client
            .post(format!("{base}/workflows/wf-limits/signals/go"))
            .bearer_auth("d-secret")
            .json(&json!({"signal_id": format!("go-{n}"), "payload": "go"}))
            .send()
            .await
            .unwrap();
        statuses.push(sent.status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::ACCEPTED,
            StatusCode::ACCEPTED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    let stream = |token: &'static str| {
        client
            .get(format!("{base}/workflows/wf-limits/stream"))
            .bearer_auth(token)
            .send()
    };
    let first = stream("o-secret").await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let second = stream("o-secret").await.unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = second.json().await.unwrap();
    assert_eq!(error_code(&body), "too_many_readers");
    drop(first);

    // dana has used 4 of 8: the rest go, then the token waits for its minute.
    let mut answers = Vec::new();
    for _ in 0..5 {
        let whoami = client
            .get(format!("{base}/whoami"))
            .bearer_auth("d-secret")
            .send()
            .await
            .unwrap();
        answers.push(whoami.status());
    }
    assert_eq!(answers[..4], [StatusCode::OK; 4]);
    assert_eq!(answers[4], StatusCode::TOO_MANY_REQUESTS);
    let other = client
        .get(format!("{base}/whoami"))
        .bearer_auth("o-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another token is not held back"
    );
}

/// The routes of an unauthenticated API, served by a caller that may bind them anywhere: only
/// a peer known to be on this machine is answered.
#[tokio::test]
async fn routes_without_tokens_answer_only_a_peer_known_to_be_local() {
    let dir = tempfile::tempdir().unwrap();
    let worker = std::sync::Arc::new(worker(&dir).await);
    let routes = http::router(worker, &HttpConfig::insecure_local()).unwrap();
    let client = Client::new();
    for with_peer in [false, true] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = routes.clone();
        tokio::spawn(async move {
            match with_peer {
                true => {
                    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
                    axum::serve(listener, app).await
                }
                false => axum::serve(listener, app).await,
            }
        });
        let expected = match with_peer {
            true => StatusCode::OK,
            false => StatusCode::FORBIDDEN,
        };
        // The web UI's login page too: without tokens anyone it lets in has every role.
        for path in ["/workflows", "/ui/login"] {
            let answer = client.get(format!("{base}{path}")).send().await.unwrap();
            assert_eq!(answer.status(), expected, "{path}, peer known: {with_peer}");
        }
    }
}

/// Guessing secrets is slowed: past its failures for the minute, a peer is answered 429
/// whatever token it shows, and the refusal happens before the token is looked at.
#[tokio::test]
async fn a_peer_that_keeps_failing_to_authenticate_is_held_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read:d-secret").unwrap()],
        auth_failures_per_minute: 3,
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config).await.unwrap();
    let client = Client::new();
    let whoami = |secret: &'static str| {
        client
            .get(format!("{base}/whoami"))
            .bearer_auth(secret)
            .send()
    };
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(whoami("guess").await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::UNAUTHORIZED,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let held = whoami("d-secret").await.unwrap();
    assert_eq!(
        held.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "even a good secret waits"
    );
}

/// Connections are capped: with every place held by an idle client, one more is not served
/// until a place frees.
#[tokio::test]
async fn connections_beyond_the_cap_wait_for_a_free_place() {
    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read:d-secret").unwrap()],
        max_connections: 2,
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config).await.unwrap();
    let address = base.trim_start_matches("http://").to_owned();
    let idle = [
        tokio::net::TcpStream::connect(&address).await.unwrap(),
        tokio::net::TcpStream::connect(&address).await.unwrap(),
    ];
    let client = Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let health = || client.get(format!("{base}/healthz")).send();
    assert!(health().await.is_err(), "no place is free");
    drop(idle);
    let mut served = false;
    for _ in 0..40 {
        if health()
            .await
            .is_ok_and(|answer| answer.status() == StatusCode::OK)
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "served once a place freed");
}

#[tokio::test]
async fn a_request_head_that_does_not_arrive_in_time_loses_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig {
        tokens: vec![ApiToken::parse("dana:read:d-secret").unwrap()],
        header_read_timeout: Duration::from_millis(300),
        max_connections: 1,
        ..HttpConfig::default()
    };
    let base = serve(&dir, "127.0.0.1:0", config).await.unwrap();
    let address = base.trim_start_matches("http://").to_owned();
    // A client that sends its head a little at a time, never finishing it.
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let mut closed = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let trickle = slow.write_all(b"X-Slow: 1\r\n").await;
        let mut byte = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_millis(10), slow.read(&mut byte)).await;
        if trickle.is_err() || matches!(read, Ok(Ok(0)) | Ok(Err(_))) {
            closed = true;
            break;
        }
    }
    assert!(closed, "the trickling connection was still open after 2 s");
    // Its place (the only one) is free again for a client that sends its head at once.
    let client = Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let answer = client.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
}
