//! The API's OpenAPI 3.1 document, served at `/openapi.json` and checked in as
//! `sdk/openapi.json`. Generated, not written: every route is registered through its
//! handler's `#[utoipa::path]` (see `super::api_routes`), so a route cannot be served without
//! being documented, and the schemas are derived from the bodies the handlers build
//! (`super::bodies`). What every route shares (the token, the namespace header, the guard's
//! refusals) is added here once.

use std::sync::LazyLock;

use axum::Json;
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use super::bodies::{ErrorBody, Health};

/// The document's root: what the routes do not say.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Waymark worker API",
        description = "Start, inspect, signal, approve, resolve, fork, reset and cancel durable workflows; read their streams as Server-Sent Events. Every refusal is a JSON `ErrorBody`: a 4xx for the caller's mistakes, which changes nothing, and a 5xx when the worker could not answer.",
    ),
    components(schemas(ErrorBody)),
    security(("bearer" = []))
)]
pub(crate) struct Root;

/// Routes served without a token and outside any namespace.
const UNSCOPED: [&str; 2] = ["/healthz", "/openapi.json"];

/// Routes that need a token but act in no namespace.
const NAMESPACE_FREE: [&str; 2] = ["/metrics", "/whoami"];

static DOCUMENT: LazyLock<Value> = LazyLock::new(|| {
    let generated = super::api_routes().into_openapi();
    let mut document = serde_json::to_value(generated).unwrap_or_else(|_| json!({}));
    add_shared_parts(&mut document);
    document
});

/// The document.
pub fn document() -> Value {
    DOCUMENT.clone()
}

/// This document; no token needed.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi_document",
    responses((status = 200, description = "OpenAPI 3.1.", body = Object)))]
pub(crate) async fn serve_document() -> Json<Value> {
    Json(DOCUMENT.clone())
}

/// Liveness; no token needed.
#[utoipa::path(get, path = "/healthz", operation_id = "health",
    responses((status = 200, description = "The worker answers.", body = Health)))]
pub(crate) async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
    })
}

fn add_shared_parts(document: &mut Value) {
    document["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    document["components"]["securitySchemes"] =
        json!({"bearer": {"type": "http", "scheme": "bearer"}});
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        for (method, operation) in operations.iter_mut() {
            add_guard_refusals(path, method, operation);
        }
    }
}

/// What the guard and the token check answer before a handler runs, on every route they
/// guard; a handler's own answers of the same status keep their description.
fn add_guard_refusals(path: &str, method: &str, operation: &mut Value) {
    let mut refusals = vec![
        (
            "429",
            "Too many requests from this token or peer; the message says when to retry.",
        ),
        (
            "500",
            "The worker could not answer: its store failed, or another worker holds the workflow.",
        ),
        (
            "503",
            "The worker is busy, shutting down, or took too long.",
        ),
    ];
    if method == "post" {
        refusals.push(("413", "The body is over the size limit."));
        refusals.push(("415", "A POST must be `Content-Type: application/json`."));
    }
    if UNSCOPED.contains(&path) {
        operation["security"] = json!([]);
        let foreign = "The request names a host this loopback worker does not serve.";
        refusals.push(("403", foreign));
    } else {
        refusals.push(("401", "No bearer token, or an unknown one."));
        refusals.push(("403", "The token lacks the role, or the request names a host this loopback worker does not serve."));
    }
    if !UNSCOPED.contains(&path) && !NAMESPACE_FREE.contains(&path) {
        refusals.push((
            "400",
            "Malformed: a bad id, or a malformed namespace header.",
        ));
        refusals.push(("404", "A namespace the token does not hold."));
        add_namespace_header(operation);
    }
    let Some(responses) = operation["responses"].as_object_mut() else {
        return;
    };
    for (status, description) in refusals {
        responses
            .entry(status)
            .or_insert_with(|| error_response(description));
    }
}

fn error_response(description: &str) -> Value {
    json!({"description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
}

/// Every operation that reads or changes workflows takes the namespace header.
fn add_namespace_header(operation: &mut Value) {
    let header = json!({"name": "Waymark-Namespace", "in": "header", "required": false,
        "description": "The namespace the request acts in (default: the token's first); one the token does not hold answers 404.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}});
    match operation["parameters"].as_array_mut() {
        Some(parameters) => parameters.push(header),
        None => operation["parameters"] = json!([header]),
    }
}

/// The document as checked in: sorted keys, two-space indents, a final newline.
pub fn pretty(document: &Value) -> String {
    let sorted: Value = sort_keys(document);
    let mut text = serde_json::to_string_pretty(&sorted).unwrap_or_default();
    text.push('\n');
    text
}

fn sort_keys(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let sorted: Map<String, Value> = entries
                .into_iter()
                .map(|(k, v)| (k.clone(), sort_keys(v)))
                .collect();
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}
