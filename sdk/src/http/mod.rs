//! The worker's HTTP API: start, inspect, signal, approve, resolve and cancel workflows, read
//! their streams as Server-Sent Events, scrape metrics. JSON everywhere, bearer tokens with
//! roles, a body size limit, and a JSON 4xx for every malformed request (which changes
//! nothing). The routes are listed in the OpenAPI document at `/openapi.json`.

mod auth;
mod bodies;
mod connections;
mod error;
mod guard;
mod handlers;
mod limits;
mod metrics;
mod openapi;
mod paging;
mod serving;
mod stream;
mod tls;
mod ui;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::Router;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use auth::{ApiToken, HttpConfigError, Namespaces, Role};
pub use error::ApiError;
pub use openapi::{document as openapi_document, pretty as openapi_text};
pub use tls::TlsConfig;

use crate::Worker;

/// How the API is served. Without tokens it does not start, unless asked for an
/// unauthenticated worker on loopback ([`HttpConfig::insecure_local`]).
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Accepted bearer tokens.
    pub tokens: Vec<ApiToken>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Serve without tokens, every caller `anonymous` with every role: refused unless the
    /// listener is on a loopback address.
    pub insecure_local: bool,
    /// How long a request may take to be answered (an event stream's body is not counted).
    pub request_timeout: Duration,
    /// How long a request's head (its line and headers) may take to arrive; a connection that
    /// takes longer, or stays idle longer between requests, is closed.
    pub header_read_timeout: Duration,
    /// Requests handled at once; one more is answered 503 at once rather than queued.
    pub max_in_flight: usize,
    /// Serve over TLS with this certificate and key (`WAYMARK_TLS_CERT`, `WAYMARK_TLS_KEY`).
    pub tls: Option<TlsConfig>,
    /// Requests one token may make a minute (429 beyond, with when to retry).
    pub requests_per_minute: u32,
    /// Signals one workflow may be sent a minute, by every caller together.
    pub signals_per_minute: u32,
    /// Event-stream readers one workflow may have open at once.
    pub max_stream_readers: usize,
    /// Connections open at once; one more waits to be accepted until one closes.
    pub max_connections: usize,
    /// Failed authentications one peer address may make a minute; beyond, its requests are
    /// answered 429 without looking at the token, so secrets cannot be guessed at speed.
    pub auth_failures_per_minute: u32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            max_body_bytes: 1 << 20,
            insecure_local: false,
            request_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_in_flight: 512,
            tls: None,
            requests_per_minute: 6_000,
            signals_per_minute: 600,
            max_stream_readers: 64,
            auth_failures_per_minute: 60,
            max_connections: 1024,
        }
    }
}

impl HttpConfig {
    /// An API without authentication, for a worker only this machine can reach: every caller
    /// is `anonymous` with every role. Only on a loopback listener, and requests must name a
    /// loopback host (so a web page cannot reach it by DNS rebinding).
    pub fn insecure_local() -> Self {
        Self {
            insecure_local: true,
            ..Self::default()
        }
    }

    /// Tokens from `WAYMARK_TOKENS` (`name:role+role:secret`, comma-separated) and from the
    /// file `WAYMARK_TOKENS_FILE` names (one per line, `#` comments), and the body limit from
    /// `WAYMARK_MAX_BODY_BYTES`. No error quotes a secret.
    pub fn from_env() -> Result<Self, String> {
        let mut config = Self::default();
        if let Ok(tokens) = std::env::var("WAYMARK_TOKENS") {
            config.tokens = ApiToken::parse_list(&tokens)?;
        }
        if let Ok(path) = std::env::var("WAYMARK_TOKENS_FILE") {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("WAYMARK_TOKENS_FILE `{path}`: {e}"))?;
            let listed = ApiToken::parse_list(&text).map_err(|e| format!("`{path}`: {e}"))?;
            config.tokens.extend(listed);
        }
        config.tls = match (
            std::env::var_os("WAYMARK_TLS_CERT"),
            std::env::var_os("WAYMARK_TLS_KEY"),
        ) {
            (Some(certificate), Some(private_key)) => Some(TlsConfig {
                certificate: certificate.into(),
                private_key: private_key.into(),
            }),
            (None, None) => None,
            _ => return Err("set both WAYMARK_TLS_CERT and WAYMARK_TLS_KEY, or neither".into()),
        };
        if let Ok(limit) = std::env::var("WAYMARK_MAX_BODY_BYTES") {
            let parsed = limit.parse();
            config.max_body_bytes =
                parsed.map_err(|_| format!("bad WAYMARK_MAX_BODY_BYTES `{limit}`"))?;
        }
        Ok(config)
    }
}

/// What the handlers share.
pub(crate) struct Api {
    worker: Arc<Worker>,
    tokens: auth::Tokens,
    /// Requests must name a loopback host: the listener is on loopback.
    loopback_hosts_only: bool,
    /// Requests being handled.
    in_flight: Arc<tokio::sync::Semaphore>,
    request_timeout: Duration,
    /// Requests per token per minute.
    per_token: limits::PerMinute,
    /// Signals per workflow per minute.
    signals: limits::PerMinute,
    /// Failed authentications per peer address per minute.
    auth_failures: limits::PerMinute,
    /// The web UI's logged-in sessions.
    sessions: ui::Sessions,
    /// Session cookies are marked `Secure`: the API is served over TLS.
    secure_cookies: bool,
    /// Open stream readers per workflow, at most `max_stream_readers`.
    readers: limits::Readers,
    max_stream_readers: usize,
    /// `true` once the server is shutting down.
    shutdown: tokio::sync::watch::Receiver<bool>,
    /// Keeps `shutdown` open for a router served by the caller, which never says stop.
    _never: Option<tokio::sync::watch::Sender<bool>>,
}

impl Api {
    /// Runs a read of the worker's store on the blocking pool: a handler never waits on disk
    /// on an async thread.
    async fn read<T, F>(&self, read: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Worker) -> T + Send + 'static,
    {
        let worker = self.worker.clone();
        let task = move || waymark_runtime::store::off_async_thread(|| read(&worker));
        tokio::task::spawn_blocking(task)
            .await
            .map_err(|e| ApiError::internal(format!("a store read failed to run: {e}")))
    }

    fn caller(&self, headers: &HeaderMap) -> Result<auth::Caller, ApiError> {
        self.tokens.caller(headers)
    }
}

/// The API's routes over `worker`, for a caller that serves them itself. Refused without
/// tokens, unless `config` opts in to an unauthenticated local API: then the caller must bind
/// a loopback address, and requests must name a loopback host.
pub fn router(worker: Arc<Worker>, config: &HttpConfig) -> Result<Router, HttpConfigError> {
    let (never, shutdown) = tokio::sync::watch::channel(false);
    let listener = Listener {
        loopback: config.insecure_local,
    };
    routes(worker, config, listener, shutdown, Some(never))
}

/// What the routes know of where they are served.
struct Listener {
    loopback: bool,
}

fn routes(
    worker: Arc<Worker>,
    config: &HttpConfig,
    listener: Listener,
    shutdown: tokio::sync::watch::Receiver<bool>,
    never: Option<tokio::sync::watch::Sender<bool>>,
) -> Result<Router, HttpConfigError> {
    let tokens = auth::Tokens::new(&config.tokens, config.insecure_local)?;
    if config.tokens.is_empty() {
        tracing::warn!("no API tokens: every caller on this machine has every role");
    }
    let api = Arc::new(Api {
        worker,
        tokens,
        loopback_hosts_only: listener.loopback,
        in_flight: Arc::new(tokio::sync::Semaphore::new(config.max_in_flight)),
        request_timeout: config.request_timeout,
        per_token: limits::PerMinute::new(config.requests_per_minute),
        signals: limits::PerMinute::new(config.signals_per_minute),
        auth_failures: limits::PerMinute::new(config.auth_failures_per_minute),
        readers: limits::Readers::default(),
        sessions: ui::Sessions::default(),
        secure_cookies: config.tls.is_some(),
        max_stream_readers: config.max_stream_readers,
        shutdown,
        _never: never,
    });
    let (router, _) = api_routes().split_for_parts();
    let router = router
        .merge(ui::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            let status = axum::http::StatusCode::METHOD_NOT_ALLOWED;
            ApiError::new(
                status,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            guard::guard,
        ))
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(api);
    Ok(router)
}

/// Every route, each registered with the operation its handler documents: the one list of
/// what the API serves, and the source of the OpenAPI document. A route added any other way
/// would be served undocumented (`tests/tests/openapi.rs` reads this function to refuse that).
fn api_routes() -> OpenApiRouter<Arc<Api>> {
    OpenApiRouter::with_openapi(openapi::Root::openapi())
        .routes(routes!(handlers::whoami))
        .routes(routes!(handlers::list))
        .routes(routes!(handlers::start, handlers::show, handlers::delete))
        .routes(routes!(handlers::result))
        .routes(routes!(handlers::journal))
        .routes(routes!(stream::stream))
        .routes(routes!(stream::acknowledge))
        .routes(routes!(handlers::signal))
        .routes(routes!(handlers::approve))
        .routes(routes!(handlers::cancel))
        .routes(routes!(handlers::fork))
        .routes(routes!(handlers::reset))
        .routes(routes!(handlers::awaiting_decision))
        .routes(routes!(handlers::resolve))
        .routes(routes!(handlers::settle))
        .routes(routes!(handlers::artifact))
        .routes(routes!(metrics::metrics))
        .routes(routes!(openapi::health))
        .routes(routes!(openapi::serve_document))
}

/// Serves the API on `listener` until `shutdown` resolves, then lets requests in flight finish
/// and shuts the worker down (every step is already durable; running ones resume on the next
/// start).
pub async fn serve(
    worker: Worker,
    listener: tokio::net::TcpListener,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    let loopback = address.ip().is_loopback();
    let invalid = |refused: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, refused);
    if config.insecure_local && !loopback {
        return Err(invalid(
            HttpConfigError::InsecureNotLoopback(address).to_string(),
        ));
    }
    let worker = Arc::new(worker);
    let (stopping, stop_streams) = tokio::sync::watch::channel(false);
    let served = Listener { loopback };
    let app = routes(worker.clone(), &config, served, stop_streams, None)
        .map_err(|refused| invalid(refused.to_string()))?;
    tracing::info!(%address, "serving the worker API");
    let shutdown = async move {
        shutdown.await;
        // Open event streams would hold graceful shutdown open for as long as they last.
        let _ = stopping.send(true);
    };
    let listener = connections::CappedListener::new(listener, config.max_connections);
    let head_within = config.header_read_timeout;
    match &config.tls {
        Some(tls) => {
            let acceptor = tls.acceptor().map_err(invalid)?;
            let listener = tls::TlsListener::new(listener, acceptor)?;
            serving::serve(listener, app, head_within, shutdown).await
        }
        None => serving::serve(listener, app, head_within, shutdown).await,
    }
    match Arc::try_unwrap(worker) {
        Ok(worker) => worker.shutdown().await,
        Err(_) => tracing::warn!("requests still hold the worker; it stops when they end"),
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C: stop taking work, finish what is in flight, exit.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested");
}
