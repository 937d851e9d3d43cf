//! Every failure the API answers is JSON: `{"error": {"code": "...", "message": "..."}}`, with
//! a 4xx status for the caller's mistakes. A refused request changes nothing.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use waymark_runtime::error::{Refusal, Refused};

/// A failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable machine-readable code.
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        // An id in the message is shown as the caller named it in its namespace's terms.
        let message = message
            .into()
            .replace(waymark_runtime::namespace::SEPARATOR, "/");
        Self {
            status,
            code,
            message,
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

/// Every refusal of the worker becomes the status of its class: the one mapping from the
/// runtime's errors to HTTP.
impl<E: Refused> From<E> for ApiError {
    fn from(error: E) -> Self {
        let message = error.to_string();
        match error.refusal() {
            Refusal::NotFound => ApiError::not_found(message),
            Refusal::BadRequest => ApiError::bad_request(message),
            Refusal::Conflict => ApiError::conflict(message),
            Refusal::Internal => ApiError::internal(message),
            Refusal::Unavailable => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", message)
            }
        }
    }
}
