//! What every request passes before its handler reads anything, its body included: the `Host`
//! a loopback listener accepts, JSON for every `POST`, a valid token, a free slot, and a time
//! limit. A refused request is a JSON 4xx (or a 503) and changes nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::Api;

/// Routes anyone may call: a health check and the API's own description.
const OPEN_ROUTES: [&str; 2] = ["/healthz", "/openapi.json"];

pub(crate) async fn guard(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if let Err(refused) = admit(&api, &request) {
        return refused.into_response();
    }
    let Ok(_slot) = api.in_flight.clone().try_acquire_owned() else {
        let busy = "too many requests in flight: try again shortly";
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy", busy).into_response();
    };
    match tokio::time::timeout(api.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let late = "the request took longer than the server's limit";
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", late).into_response()
        }
    }
}

/// The checks made before anything of the request is read.
fn admit(api: &Api, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    if api.loopback_hosts_only && !names_loopback_host(headers) {
        // A page on another site that resolves its own name to 127.0.0.1 (DNS rebinding)
        // still sends its own name here.
        let message =
            "this API answers only requests to a loopback host (localhost, 127.0.0.1, [::1])";
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "foreign_host",
            message,
        ));
    }
    if is_ui(request.uri().path()) {
        // Without tokens the UI, like the API, answers only peers on this machine.
        if api.tokens.is_anonymous() && !from_loopback(request) {
            return Err(foreign_peer());
        }
        // The web UI authenticates by its session cookie and checks each form's CSRF token
        // itself (`ui::session`), rate-limited per token there; its forms are not JSON.
        return Ok(());
    }
    if request.method() == Method::POST && !is_json(headers) {
        // A browser sends `text/plain` or a form across origins without asking first; JSON
        // it must ask for, and no origin is allowed.
        let message = "a POST must be `Content-Type: application/json`";
        let status = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        return Err(ApiError::new(status, "unsupported_media_type", message));
    }
    if OPEN_ROUTES.contains(&request.uri().path()) {
        return Ok(());
    }
    if api.tokens.is_anonymous() && !from_loopback(request) {
        return Err(foreign_peer());
    }
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
    let peer = peer.map(|ConnectInfo(address)| address.ip().to_string());
    let peer = peer.unwrap_or_else(|| "unknown".to_owned());
    let guessing = "authentication failures from this address";
    if api.auth_failures.is_exhausted(&peer) {
        return Err(too_many_failures(guessing));
    }
    let caller = api.tokens.caller(headers).map_err(|refused| {
        let path = request.uri().path();
        tracing::warn!(%peer, %path, "request refused: missing or unknown bearer token");
        match api.auth_failures.take(&peer, guessing) {
            Ok(()) => refused,
            Err(limited) => limited,
        }
    })?;
    api.per_token.take(&caller.name, "requests for this token")
}

/// An unauthenticated API served by its caller (`router`) may be bound anywhere: only a peer
/// on this machine is let in, and one that cannot be told is not.
fn foreign_peer() -> ApiError {
    let message = "this API has no tokens and answers only peers on this machine (serve it \
                   with `into_make_service_with_connect_info::<SocketAddr>()`)";
    ApiError::new(StatusCode::FORBIDDEN, "foreign_peer", message)
}

fn is_ui(path: &str) -> bool {
    path == "/ui" || path.starts_with("/ui/")
}

fn too_many_failures(what: &str) -> ApiError {
    let message = format!("{what}: too many this minute; retry later");
    ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", message)
}

fn from_loopback(request: &Request) -> bool {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
    peer.is_some_and(|ConnectInfo(address)| address.ip().is_loopback())
}

fn is_json(headers: &HeaderMap) -> bool {
    let content_type = headers.get(header::CONTENT_TYPE);
    let content_type = content_type.and_then(|value| value.to_str().ok());
    let media_type = content_type.and_then(|value| value.split(';').next());
    media_type.is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
}

fn names_loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_loopback_names_pass_the_host_check() {
        for host in [
            "localhost:8080",
            "127.0.0.1:80",
            "[::1]:8080",
            "LOCALHOST",
            "127.0.0.1",
        ] {
            assert!(names_loopback_host(&with(header::HOST, host)), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1",
            "localhost.evil",
            "",
        ] {
            assert!(!names_loopback_host(&with(header::HOST, host)), "{host}");
        }
        assert!(!names_loopback_host(&HeaderMap::new()), "no Host");
    }

    #[test]
    fn json_is_json_with_or_without_parameters() {
        let json = |value| is_json(&with(header::CONTENT_TYPE, value));
        assert!(json("application/json"));
        assert!(json("application/json; charset=utf-8"));
        assert!(!json("text/plain"));
        assert!(!json("application/x-www-form-urlencoded"));
        assert!(!is_json(&HeaderMap::new()));
    }
}
