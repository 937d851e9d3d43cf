//! The worker's HTTP API: start, inspect, signal, approve, resolve and cancel workflows, read
//! their streams as Server-Sent Events, scrape metrics. JSON everywhere, bearer tokens with
//! roles, a body size limit, and a JSON 4xx for every malformed request (which changes
//! nothing). The routes are listed in the OpenAPI document at `/openapi.json`.

mod auth;
mod error;
mod handlers;
mod metrics;
mod openapi;
mod stream;

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

pub use auth::{ApiToken, Role};
pub use error::ApiError;
pub use openapi::document as openapi_document;

use crate::Worker;

/// How the API is served.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Accepted bearer tokens. Empty: every caller is `anonymous` with every role (local
    /// development only; the server logs a warning).
    pub tokens: Vec<ApiToken>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            tokens: Vec::new(),
            max_body_bytes: 1 << 20,
        }
    }
}

impl HttpConfig {
    /// Tokens from `WAYMARK_TOKENS` (`name:role+role:secret`, comma-separated) and the body
    /// limit from `WAYMARK_MAX_BODY_BYTES`.
    pub fn from_env() -> Result<Self, String> {
        let mut config = Self::default();
        if let Ok(tokens) = std::env::var("WAYMARK_TOKENS") {
            let specs = tokens.split(',').map(str::trim).filter(|s| !s.is_empty());
            config.tokens = specs.map(ApiToken::parse).collect::<Result<_, _>>()?;
        }
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

/// The API's routes over `worker`.
pub fn router(worker: Arc<Worker>, config: &HttpConfig) -> Router {
    let (never, shutdown) = tokio::sync::watch::channel(false);
    routes(worker, config, shutdown, Some(never))
}

fn routes(
    worker: Arc<Worker>,
    config: &HttpConfig,
    shutdown: tokio::sync::watch::Receiver<bool>,
    never: Option<tokio::sync::watch::Sender<bool>>,
) -> Router {
    if config.tokens.is_empty() {
        tracing::warn!("no API tokens configured: every caller has every role");
    }
    let api = Arc::new(Api {
        worker,
        tokens: auth::Tokens(config.tokens.clone()),
        shutdown,
        _never: never,
    });
    Router::new()
        .route("/whoami", get(handlers::whoami))
        .route("/workflows", get(handlers::list))
        .route("/workflows/{id}", post(handlers::start).get(handlers::show))
        .route("/workflows/{id}/result", get(handlers::result))
        .route("/workflows/{id}/journal", get(handlers::journal))
        .route("/workflows/{id}/stream", get(stream::stream))
        .route("/workflows/{id}/stream/ack", post(stream::acknowledge))
        .route("/workflows/{id}/signals/{name}", post(handlers::signal))
        .route("/workflows/{id}/approvals/{hash}", post(handlers::approve))
        .route("/workflows/{id}/cancel", post(handlers::cancel))
        .route("/operations/{key}/resolve", post(handlers::resolve))
        .route("/operations/{key}/settle", post(handlers::settle))
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/openapi.json", get(|| async { Json(openapi::document()) }))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            let status = axum::http::StatusCode::METHOD_NOT_ALLOWED;
            ApiError::new(
                status,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .with_state(api)
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
    let worker = Arc::new(worker);
    let (stopping, stop_streams) = tokio::sync::watch::channel(false);
    let app = routes(worker.clone(), &config, stop_streams, None);
    tracing::info!(address = ?listener.local_addr().ok(), "serving the worker API");
    let shutdown = async move {
        shutdown.await;
        // Open event streams would hold graceful shutdown open for as long as they last.
        let _ = stopping.send(true);
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
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
