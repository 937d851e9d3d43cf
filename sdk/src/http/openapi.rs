//! The API's OpenAPI 3.1 document, served at `/openapi.json`. Written out by hand next to the
//! routes it describes; `tests/tests/http.rs` checks that every route is in it.

use serde_json::{json, Value};

fn error_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn json_response(description: &str) -> Value {
    json!({"description": description, "content": {"application/json": {"schema": {"type": "object"}}}})
}

fn id_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description, "schema": {"type": "string"}})
}

fn body(schema: Value) -> Value {
    json!({"required": false, "content": {"application/json": {"schema": schema}}})
}

/// The document.
pub fn document() -> Value {
    let mut document = routes();
    add_namespace_header(&mut document);
    document
}

/// Every operation that reads or changes workflows takes the namespace header.
fn add_namespace_header(document: &mut Value) {
    let header = json!({"name": "Waymark-Namespace", "in": "header", "required": false,
        "description": "The namespace the request acts in (default: the token's first); one the token does not hold answers 404.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}});
    let unscoped = ["/healthz", "/openapi.json", "/metrics", "/whoami"];
    let Some(paths) = document["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(operations) = item.as_object_mut() else {
            continue;
        };
        if unscoped.contains(&path.as_str()) {
            continue;
        }
        for operation in operations.values_mut() {
            match operation["parameters"].as_array_mut() {
                Some(parameters) => parameters.push(header.clone()),
                None => operation["parameters"] = json!([header.clone()]),
            }
        }
    }
}

fn routes() -> Value {
    let id = id_param("id", "Workflow id.");
    let unauthorized = error_response("Missing or unknown bearer token.");
    let unauthorized = &unauthorized;
    let forbidden = error_response("The token lacks the role.");
    let not_found = error_response("No such workflow or operation.");
    let bad = error_response("Malformed request; nothing changed.");
    let conflict = error_response("Conflicts with the current state; nothing changed.");
    let too_large = error_response("Body over the size limit.");
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Waymark worker API", "version": env!("CARGO_PKG_VERSION")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}}
        },
        "security": [{"bearer": []}],
        "paths": {
            "/whoami": {"get": {"summary": "The identity and roles of the bearer token.",
                "responses": {"200": json_response("name and roles."), "401": unauthorized}}},
            "/workflows": {"get": {"summary": "A page of workflows, in id order (shorter ids first), with name and status; `next` is the `after` of the next page, null on the last (role read).",
                "parameters": [
                    {"name": "status", "in": "query", "schema": {"enum": ["running", "awaiting_approval", "awaiting_signal", "awaiting_operator", "stuck", "completed", "failed"]}},
                    {"name": "workflow", "in": "query", "description": "Only workflows of this registered name.", "schema": {"type": "string"}},
                    {"name": "limit", "in": "query", "description": "At most this many (default 100).", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                    {"name": "after", "in": "query", "description": "The `next` of the page before.", "schema": {"type": "string"}}],
                "responses": {"200": json_response("Workflows with name and status, and `next`."), "400": bad, "401": unauthorized}}},
            "/workflows/{name}": {"post": {"summary": "Start a workflow (role write). `request_id` (or the Idempotency-Key header) deduplicates starts.",
                "parameters": [id_param("name", "Registered workflow name.")],
                "requestBody": body(json!({"type": "object", "properties": {"input": {}, "request_id": {"type": "string"}, "workflow_id": {"type": "string"}}})),
                "responses": {"201": json_response("Started."), "200": json_response("The workflow this request id already started."),
                    "400": bad, "404": not_found, "409": conflict, "413": too_large, "401": unauthorized, "403": forbidden}}},
            "/workflows/{id}": {"get": {"summary": "Status, current step, pending approvals, operations, stream state: `stream.last_event` and `stream.delivered`, an object of reader channel to the last event it acknowledged (role read).",
                "parameters": [id], "responses": {"200": json_response("The workflow."), "404": not_found}},
                "delete": {"summary": "Delete an ended workflow with every row of its own: journal, stream, inbox, operations, request id, and the artifacts no other workflow committed (role operate).",
                    "parameters": [id], "responses": {"200": json_response("Deleted."), "404": not_found, "409": conflict}}},
            "/workflows/{id}/result": {"get": {"summary": "The output or failure (role read).", "parameters": [id],
                "responses": {"200": json_response("Ended."), "202": json_response("Still running."), "404": not_found}}},
            "/workflows/{id}/journal": {"get": {"summary": "The rendered journal, one entry a line, or a page of it (`from`, `limit`); `?format=binary` exports framed records (role read).",
                "parameters": [id, {"name": "format", "in": "query", "schema": {"enum": ["text", "binary"]}},
                    {"name": "from", "in": "query", "description": "Text only: the first entry's index.", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "limit", "in": "query", "description": "Text only: at most this many entries.", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "plaintext", "in": "query", "description": "With `binary` from a worker that encrypts at rest: records in clear instead of sealed.", "schema": {"type": "boolean"}}],
                "responses": {"200": {"description": "text/plain or application/octet-stream"}, "404": not_found}}},
            "/workflows/{id}/stream": {"get": {"summary": "Server-Sent Events: `id:` is the event number; reconnect with Last-Event-ID (role read).",
                "parameters": [id, {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}}, {"name": "channel", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "text/event-stream: chunk, superseded, committed, progress events (approval_required, retrieval_complete, ...), end"}, "404": not_found}}},
            "/workflows/{id}/stream/ack": {"post": {"summary": "Acknowledge, durably, that a reader on `channel` (default `default`) holds every event up to `event` (role read). Never moves back; an event never generated is a 409.",
                "parameters": [id],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["event"], "properties": {"event": {"type": "integer"}, "channel": {"type": "string"}}}}}},
                "responses": {"200": json_response("What the channel is known to have received (`delivered`)."), "400": bad, "404": not_found, "409": conflict}}},
            "/workflows/{id}/signals/{signal}": {"post": {"summary": "Send a signal (role write); a repeated signal_id is a duplicate.",
                "parameters": [id, id_param("signal", "Signal name.")],
                "requestBody": body(json!({"type": "object", "properties": {"signal_id": {"type": "string"}, "payload": {}}})),
                "responses": {"202": json_response("accepted or duplicate."), "400": bad, "404": not_found, "409": conflict}}},
            "/workflows/{id}/approvals/{hash}": {"post": {"summary": "Decide the pending approval of scope `hash` (role approve): the artifact shown, the intents it authorises and the evidence. The approver is the token's identity.",
                "parameters": [id, id_param("hash", "sha256:… of the approval scope.")],
                "requestBody": body(json!({"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["approve", "reject"]}, "reason": {"type": "string"}}})),
                "responses": {"200": json_response("Decided."), "400": bad, "404": not_found, "409": conflict, "403": forbidden}}},
            "/operations/{key}/resolve": {"post": {"summary": "Settle an operation awaiting an operator (role operate). The operator is the token's identity.",
                "parameters": [id_param("key", "Idempotency key, percent-encoded.")],
                "requestBody": body(json!({"type": "object", "required": ["decision"], "properties": {"decision": {"enum": ["committed", "not_found", "failed"]}, "result": {}, "reason": {"type": "string"}, "attempt": {"type": "integer"}}})),
                "responses": {"200": json_response("Resolved."), "400": bad, "404": not_found, "409": conflict, "403": forbidden}}},
            "/operations/{key}/settle": {"post": {"summary": "Report an operation's outcome as its downstream, a webhook (role settle). Applied while the outcome is unknown; a repeated delivery of the same committed result is a duplicate and changes nothing.",
                "parameters": [id_param("key", "Idempotency key, percent-encoded.")],
                "requestBody": body(json!({"type": "object", "required": ["outcome"], "properties": {"outcome": {"enum": ["committed", "not_found", "failed"]}, "result": {}, "reason": {"type": "string"}, "attempt": {"type": "integer"}}})),
                "responses": {"200": json_response("Settled, or a duplicate (`duplicate`)."), "400": bad, "404": not_found, "409": conflict, "403": forbidden}}},
            "/artifacts/{hash}": {"get": {"summary": "An artifact's kind, version, content and metadata: what an approval scope names (role read or approve).",
                "parameters": [id_param("hash", "sha256:… of the artifact.")],
                "responses": {"200": json_response("The artifact."), "400": bad, "404": not_found, "403": forbidden}}},
            "/workflows/{id}/cancel": {"post": {"summary": "Cancel a running workflow (role write).", "parameters": [id],
                "requestBody": body(json!({"type": "object", "properties": {"reason": {"type": "string"}}})),
                "responses": {"200": json_response("Cancelled."), "404": not_found, "409": conflict}}},
            "/workflows/{id}/fork": {"post": {"summary": "Fork a workflow at entry `at` (role operate): a new workflow whose journal is the first `at` entries of this one's, replayed, then run live. An effect this one committed is not fired again (the fork inherits its operation record) unless `refire` names it; `models` replaces models in the model calls the fork runs anew; `input` replaces the input.",
                "parameters": [id],
                "requestBody": body(json!({"type": "object", "required": ["at"], "properties": {"at": {"type": "integer", "minimum": 1}, "workflow_id": {"type": "string"}, "input": {},
                    "models": {"type": "object", "additionalProperties": {"type": "string"}}, "refire": {"type": "array", "items": {"type": "string"}}}})),
                "responses": {"200": json_response("The fork's `workflow_id`."), "400": bad, "404": not_found, "409": conflict, "403": forbidden}}},
            "/workflows/{id}/reset": {"post": {"summary": "Reset a stuck run in place (role operate): the workflow goes on as a new run of the code deployed now from the first `at` entries of its journal; the old run is kept, ended, as the workflow `kept_run` (`ID#run-N`). Effects keep their keys and records: one the old run committed is answered, not called again.",
                "parameters": [id],
                "requestBody": body(json!({"type": "object", "required": ["at"], "properties": {"at": {"type": "integer", "minimum": 1}}})),
                "responses": {"200": json_response("`kept_run`: the id of the old run."), "400": bad, "404": not_found, "409": conflict, "403": forbidden}}},
            "/metrics": {"get": {"summary": "Prometheus text (role read).", "responses": {"200": {"description": "text/plain"}}}},
            "/healthz": {"get": {"summary": "Liveness; no token needed.", "security": [], "responses": {"200": json_response("ok")}}},
            "/openapi.json": {"get": {"summary": "This document; no token needed.", "security": [], "responses": {"200": json_response("OpenAPI 3.1")}}}
        }
    })
}
